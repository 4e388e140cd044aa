"""Merge the states of observers filled on separate shards of the calibration set.

Sharded calibration (``[calibration] shards``, :mod:`pipeline.quant.shards`)
runs contiguous slices of the images through separate copies of the prepared
model; the head then merges each observer's per-shard states, in shard order,
into one state as if a single process had seen every batch. One function per
observer type (:data:`MERGES`), each taking the shard states of one observer
(its ``state_dict()``: buffer name -> tensor, no module prefix) and returning
the merged state:

* :func:`merge_minmax` / :func:`merge_per_channel_minmax` (torchao's
  ``MinMaxObserver`` / ``PerChannelMinMaxObserver``, weights included): the
  elementwise min of ``min_val`` and max of ``max_val``. min/max are exact and
  associative, so the result equals a single-process run bit for bit.
* :func:`merge_histogram` (torchao's ``HistogramObserver``): the histograms
  are re-binned onto the union range with the observer's own
  ``_upscale_histogram`` / ``_combine_histograms``, exactly what it does when
  a batch widens its range. Not exact (a single process re-bins at other
  points); bound in docs/numerics.md, "Sharded calibration".
* :func:`merge_abs_histogram` (:class:`~pipeline.quant.observers.PercentileObserver`,
  :class:`~pipeline.quant.observers.EntropyObserver`): the merged ``hist_max``
  is the one a single process reaches (the first shard's, doubled until it
  covers the largest |x| of all shards). Shards seeded with the head's grid
  (:func:`grid_seeds`) lie on it already, so their counts add exactly (bin
  pairs merged, as the observer does when its range doubles); the only
  difference from one process is a value exactly on a doubled grid edge, one
  bin apart. A shard on another grid (its observer saw only zeros in the
  first batch) is re-binned assuming a uniform density inside each of its
  bins, exact zeros kept in bin 0. Bound: docs/numerics.md.
* ``MovingAverageMinMaxObserver``: refused (:class:`NotMergeable`); its
  average weights each batch by its position in the whole sequence.

A shard that observed nothing (empty slice) is skipped by every merge.
"""

from __future__ import annotations

import numpy as np
import torch
from torchao.quantization.pt2e import (HistogramObserver, MinMaxObserver, MovingAverageMinMaxObserver,
                                       ObserverBase, PerChannelMinMaxObserver)

from .observers import AbsHistogramObserver

State = dict[str, torch.Tensor]


class NotMergeable(ValueError):
    """An observer whose shard states cannot be merged into a single-process state."""


def _observed(s: State) -> bool:
    return s["min_val"].numel() > 0 and bool((s["min_val"] <= s["max_val"]).all())


def merge_minmax(obs: MinMaxObserver, states: list[State]) -> State:
    """MinMaxObserver: elementwise min/max of the scalar ``min_val`` / ``max_val``
    (float32). Bit-exact: min and max neither round nor depend on order."""
    out = dict(states[0])
    for s in states[1:]:
        out["min_val"] = torch.minimum(out["min_val"], s["min_val"])
        out["max_val"] = torch.maximum(out["max_val"], s["max_val"])
    return out


def merge_per_channel_minmax(obs: PerChannelMinMaxObserver, states: list[State]) -> State:
    """PerChannelMinMaxObserver: elementwise min/max of ``min_val`` / ``max_val``
    [channels] float32; an unobserved state (shape [0]) is skipped. Bit-exact.
    For weight observers every shard saw the same weights: the merge returns them."""
    seen = [s for s in states if s["min_val"].numel() > 0]
    return merge_minmax(obs, seen) if seen else dict(states[0])


def merge_histogram(obs: HistogramObserver, states: list[State]) -> State:
    """torchao HistogramObserver: ``histogram`` [bins] float32 over [min_val, max_val].

    Folds the shards in order like ``HistogramObserver.forward`` folds a batch:
    the next shard's histogram is first brought onto the union range
    (``_upscale_histogram``: each bin split into ``upsample_rate`` sub-bins whose
    mid-points are re-bucketed; a single-valued one with ``histc``), then
    ``_combine_histograms`` brings the running one there too and adds them."""
    seen = [s for s in states if _observed(s)]
    if not seen:
        return dict(states[0])
    acc = dict(seen[0])
    for s in seen[1:]:
        lo, hi = torch.minimum(acc["min_val"], s["min_val"]), torch.maximum(acc["max_val"], s["max_val"])
        if bool(s["min_val"] == lo) and bool(s["max_val"] == hi):
            update = s["histogram"]
        elif bool(s["min_val"] == s["max_val"]):
            update = torch.histc(s["min_val"], bins=obs.bins, min=lo, max=hi) * s["histogram"].sum()
        else:
            update = obs._upscale_histogram(s["histogram"], s["min_val"], s["max_val"], lo, hi)
        acc["histogram"] = obs._combine_histograms(acc["histogram"], acc["min_val"], acc["max_val"],
                                                   update.to(acc["histogram"].dtype), lo, hi)
        acc["min_val"], acc["max_val"] = lo, hi
    return acc


def merge_abs_histogram(obs: AbsHistogramObserver, states: list[State]) -> State:
    """PercentileObserver / EntropyObserver: ``histogram`` [bins] float64 counts of
    |x| over [0, ``hist_max``], ``zeros``, ``min_val`` / ``max_val`` (module doc).

    The merged ``hist_max`` is the first shard's (first with a non-zero value)
    doubled while the largest |x| of all shards exceeds it: the same float32
    value a single process reaches. Counts, zeros and min/max add up exactly;
    only the bin positions of the later shards' counts are approximate."""
    seen = [s for s in states if _observed(s)]
    if not seen:
        return dict(states[0])
    out = dict(seen[0])
    out["min_val"] = torch.stack([s["min_val"] for s in seen]).min()
    out["max_val"] = torch.stack([s["max_val"] for s in seen]).max()
    out["zeros"] = torch.stack([s["zeros"] for s in seen]).sum()
    base = next((s for s in seen if float(s["hist_max"]) > 0.0), None)
    if base is None:  # only zeros anywhere: all counts sit in bin 0
        out["histogram"] = torch.stack([s["histogram"] for s in seen]).sum(0)
        return out
    amax = max(float(s["max_val"].abs().maximum(s["min_val"].abs())) for s in seen)
    hist_max = base["hist_max"].clone()
    while amax > float(hist_max):
        hist_max.mul_(2.0)  # float32, as AbsHistogramObserver._double_range
    out["hist_max"] = hist_max
    hist = torch.zeros(obs.bins, dtype=torch.float64)
    for s in seen:
        hist += _rebin_abs(s["histogram"].double(), float(s["zeros"]), s["hist_max"], hist_max)
    out["histogram"] = hist
    return out


def _rebin_abs(hist: torch.Tensor, zeros: float, src_max: torch.Tensor, dst_max: torch.Tensor) -> torch.Tensor:
    """``hist`` (over [0, src_max]) on the grid [0, dst_max], same bin count.
    Exact when dst_max = src_max * 2^j (bin pairs merged j times, as the observer
    does); otherwise the counts of each source bin are spread uniformly over it
    (linear interpolation of the cumulative counts) with the exact zeros kept in
    bin 0 and any mass past dst_max in the last bin."""
    bins = hist.numel()
    if float(src_max) == 0.0:  # only zeros seen: they are all in bin 0
        out = torch.zeros_like(hist)
        out[0] = hist.sum()
        return out
    h, m = hist.clone(), src_max.clone()
    while float(m) < float(dst_max):
        h, m = torch.cat([h.view(-1, 2).sum(1), torch.zeros(bins // 2, dtype=h.dtype)]), m * 2.0
    if float(m) == float(dst_max):
        return h
    nonzero = hist.clone()
    nonzero[0] = max(float(nonzero[0]) - zeros, 0.0)
    cum = np.concatenate([[0.0], np.cumsum(nonzero.numpy())])
    src_edges = np.linspace(0.0, float(src_max), bins + 1)
    dst_edges = np.linspace(0.0, float(dst_max), bins + 1)
    out = np.diff(np.interp(dst_edges, src_edges, cum))
    out[-1] += cum[-1] - out.sum()
    out[0] += float(hist[0]) - float(nonzero[0])
    return torch.from_numpy(out)


#: observer type -> (merge function, how it merges: the ``merge`` record of calibration.json).
#: Looked up by exact type first, then by isinstance in this order.
MERGES = {
    MovingAverageMinMaxObserver: (None, "refused: the moving average depends on the order of all batches"),
    MinMaxObserver: (merge_minmax, "elementwise min/max (exact)"),
    PerChannelMinMaxObserver: (merge_per_channel_minmax, "elementwise per-channel min/max (exact)"),
    HistogramObserver: (merge_histogram, "histograms re-binned onto the union range "
                                         "(torchao's own upscale/combine; approximate)"),
    AbsHistogramObserver: (merge_abs_histogram, "|x| histograms on the single-process range "
                                                "(first shard exact, others re-binned; approximate)"),
}


def merge_entry(obs: ObserverBase):
    """(merge function, description) for ``obs``; raises :class:`NotMergeable`
    for an observer type without an exact or bounded merge."""
    entry = MERGES.get(type(obs)) or next((v for k, v in MERGES.items() if isinstance(obs, k)), None)
    if entry is None or entry[0] is None:
        why = entry[1] if entry else "no merge is defined for it"
        raise NotMergeable(f"{type(obs).__name__} cannot be calibrated in shards ({why}); use shards = 1")
    return entry


def observers(gm: torch.nn.Module) -> dict[str, ObserverBase]:
    """The observer modules of a prepared model by name (each once: a shared
    observer under its first name), in module order."""
    return {n: m for n, m in gm.named_modules() if isinstance(m, ObserverBase)}


def observer_states(gm: torch.nn.Module) -> dict[str, State]:
    """{observer name: its state_dict (buffers, cloned)} of a prepared model."""
    return {n: {k: v.clone() for k, v in m.state_dict().items()} for n, m in observers(gm).items()}


def load_observer_states(gm: torch.nn.Module, states: dict[str, State]) -> None:
    """Overwrite the listed buffers of ``gm``'s observers ({observer name: {buffer:
    tensor}}, a subset is fine); a per-channel observer's ``min_val``/``max_val``
    may change shape (its ``_load_from_state_dict`` resizes)."""
    obs = observers(gm)
    for name, part in states.items():
        obs[name].load_state_dict({**obs[name].state_dict(), **part})


def grid_seeds(gm: torch.nn.Module) -> dict[str, State]:
    """{name: {"hist_max": ...}} of the |x|-histogram observers of ``gm`` that saw a
    non-zero value: a shard starting from it bins on this process's grid (the
    first batch's max |x| doubled as needed), so its histogram merges exactly."""
    return {n: {"hist_max": m.hist_max.clone()} for n, m in observers(gm).items()
            if isinstance(m, AbsHistogramObserver) and float(m.hist_max) > 0.0}


def merge_into(gm: torch.nn.Module, shard_states: list[dict[str, State]]) -> dict[str, str]:
    """Load into ``gm``'s observers the merge of ``shard_states`` (one
    :func:`observer_states` per shard, in shard order). Returns the merge record
    {observer class name: method}. Raises :class:`NotMergeable` (nothing loaded)
    or KeyError when a shard's observers differ from ``gm``'s."""
    obs = observers(gm)
    plan = {n: merge_entry(m) for n, m in obs.items()}
    merged = {n: plan[n][0](m, [s[n] for s in shard_states]) for n, m in obs.items()}
    for n, m in obs.items():
        m.load_state_dict(merged[n])
    return {type(m).__name__: plan[n][1] for n, m in obs.items()}
