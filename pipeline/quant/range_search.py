"""Activation ranges chosen by the error they cause in the layers that read them.

The percentile observer clips every tensor at the same percentile of |x|. What
a clip costs depends on the reader: a channel with large weights in the next
conv amplifies its clipped outliers, an add passes them on unchanged. This
pass picks, per int8 activation observer, the percentile whose quantized
tensor gives the least error *at the output of the layers that read it*
(range setting by layer-output error, the "MSE range setting" of the
post-training quantization literature taken one layer further; Nagel et al.,
"A White Paper on Neural Network Quantization", 2021, sec. 3.4.1, and the
local output-error criterion of AdaRound, Nagel et al. 2020, eq. 21-22):

    for each observer o and candidate percentile p:
        E[o, p] = sum over readers r of o, over images:
                  ||r(.., qdq_p(x_o), ..) - r(.., x_o, ..)||^2 / ||r(.., x_o, ..)||^2

with the reader's other inputs and its weights float (only ``o`` is quantized),
``qdq_p`` the observer's own quantize/dequantize at percentile ``p``
(``calculate_qparams`` with that percentile: exactly what convert will use).
The chosen percentile is written into the observer (its ``percentile``
buffer), so convert builds the Q/DQ model with it and the choice is in the
calibrated state. One float pass over the calibration images; each reader is
evaluated once more per candidate, so the cost is about ``len(candidates)``
times one float inference per image.

With ``criterion="output"`` (:func:`search_ranges_at_output`) the error is
measured at the model's outputs instead, with every other tensor and weight
quantized too: the observers are visited in graph order and each keeps the
candidate that gives the least relative squared error of the outputs against
the float model, given the choices made upstream (a greedy coordinate descent
on the end-to-end error, the "loss-aware" range setting of Nahshan et al.,
"Loss Aware Post-training Quantization", 2021, with the Q/DQ model's output
error as the loss: no labels needed). A clip whose error the following layers
amplify (the late residual stream of MobileNetV2) is then seen as such, and one
the network absorbs is not over-weighted. The candidates of one observer are
tried by a line search from its current percentile (both neighbours, then on
while the error falls), and the images run as stacked batches when the graph
allows it; cost: about 2-3 forward passes of the part of the model after each
observer, per image (MobileNetV2, 20 images, 2 cores: measured in
``docs/measuring.md``).

Only :class:`~pipeline.quant.observers.PercentileObserver` observers with fewer
int levels than histogram bins (int8) are searched; int16 ones use the
observed range anyway. Observers without a reader in the graph (the model's
output) keep their percentile. A shared observer (one module at several
nodes) sums the errors of all its readers.
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from torch.utils._pytree import tree_leaves
from tqdm import tqdm

from .graph import FloatPass, fake_quantize, fake_quantize_per_tensor, observer_of, out_of_place
from .observers import PercentileObserver

#: default candidate percentiles (percent of |x| kept); 100 = the observed max
CANDIDATES = (99.9, 99.95, 99.99, 99.995, 99.999, 100.0)

#: the criteria of ``[calibration] range_search`` (True means "readers")
CRITERIA = ("readers", "output")


def searchable(obs) -> bool:
    """An int8 percentile observer with statistics (see module doc)."""
    return (isinstance(obs, PercentileObserver) and obs.quant_max - obs.quant_min + 1 <= obs.bins
            and float(obs.hist_max) > 0)


class _Errors(FloatPass):
    """Float pass (observers skipped) that scores every candidate at each reader."""

    def __init__(self, gm: GraphModule, candidates: dict[str, list[tuple]]):
        super().__init__(gm)
        self.candidates = candidates            # observer target -> [(percentile, scale, zp, qmin, qmax)]
        self.errors = {t: torch.zeros(len(c), dtype=torch.float64) for t, c in candidates.items()}

    def run_node(self, n: Node):
        observed = [] if n.op != "call_function" else [
            (i, a.target) for i, a in enumerate(n.args)
            if observer_of(self.module, a) is not None and a.target in self.candidates]
        if observed:
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            fn = out_of_place(n.target)   # in-place readers (relu_, add_) would overwrite their inputs
            ref = fn(*args, **kwargs)
            if isinstance(ref, torch.Tensor) and ref.is_floating_point():
                for i, target in observed:
                    self._score(fn, args, kwargs, i, target, ref)
        return super().run_node(n)

    def _score(self, fn, args, kwargs, i: int, target: str, ref: torch.Tensor) -> None:
        energy = float(ref.double().pow(2).sum()) or 1.0
        for k, (_, scale, zp, qmin, qmax) in enumerate(self.candidates[target]):
            q = fake_quantize_per_tensor(args[i], scale, zp, qmin, qmax)
            y = fn(*args[:i], q, *args[i + 1:], **kwargs)
            self.errors[target][k] += float((y.double() - ref.double()).pow(2).sum()) / energy


def _qparams(obs: PercentileObserver, p: float) -> tuple:
    saved = obs.percentile.clone()
    obs.percentile.fill_(p)
    try:
        scale, zp = obs.calculate_qparams()
    finally:
        obs.percentile.copy_(saved)
    return p, float(scale), int(zp), obs.quant_min, obs.quant_max


def search_ranges(gm: GraphModule, images: list[torch.Tensor],
                  candidates: tuple[float, ...] = CANDIDATES) -> list[dict]:
    """Choose each searchable observer's percentile of the calibrated prepared ``gm``
    by the error at its readers' outputs on ``images`` (batch-1 float32 tensors of the
    model's input shape; module doc); in place. Returns one record per observer:
    ``observer``, ``percentile`` (chosen), ``was`` (before), ``gain`` (error at the
    chosen percentile / error at the old one, <= 1). Raises ValueError without images
    or candidates."""
    if not images or not candidates:
        raise ValueError("range search needs calibration images and candidate percentiles")
    observers = {name: m for name, m in gm.named_modules() if searchable(m)}
    # the current percentile first: ties keep it
    table = {name: [_qparams(m, p) for p in (float(m.percentile), *candidates)] for name, m in observers.items()}
    run = _Errors(gm, table)
    with torch.no_grad():
        for x in images:
            run.run(x)
    records = []
    for name, obs in observers.items():
        err = run.errors[name]
        if not bool((err > 0).any()):
            continue  # no reader scored (the model output): keep it
        best = int(torch.argmin(err))
        was = float(obs.percentile)
        obs.percentile.fill_(table[name][best][0])
        records.append({"observer": name, "percentile": table[name][best][0], "was": was,
                        "gain": round(float(err[best] / err[0]) if err[0] > 0 else 1.0, 4)})
    return records


def _is_guard(n: Node) -> bool:
    """torch.export's input guard (``_guards_fn``: the batch of 1 it was traced at, among
    others). Stacked batches skip it; :func:`_stack` checks their outputs image by image."""
    return n.op == "call_module" and n.target == "_guards_fn"


class _Stacked(FloatPass):
    """The float pass with the export guards skipped (see :func:`_is_guard`)."""

    def run_node(self, n: Node):
        return None if _is_guard(n) else super().run_node(n)


class _Resumable(FloatPass):
    """The Q/DQ model of a prepared graph (every observer fake-quantizes, ``override``
    replacing an observer's qparams), run node range by node range on a live
    environment: values are dropped after their last reader, so only the tensors
    crossing the current point are held. In-place aten ops run out of place (a value
    in the live environment is re-read by every candidate)."""

    def __init__(self, gm: GraphModule):
        super().__init__(gm, garbage_collect_values=False)
        self.nodes = list(gm.graph.nodes)
        index = {n: i for i, n in enumerate(self.nodes)}
        self.dies_at: list[list[Node]] = [[] for _ in self.nodes]
        for n in self.nodes:
            if n.users:
                self.dies_at[max(index[u] for u in n.users)].append(n)
        self.override: dict[str, tuple[float, int]] = {}

    def run_node(self, n: Node):
        if _is_guard(n):
            return None
        obs = observer_of(self.module, n)
        if obs is None:
            return super().run_node(n)
        x = self.env[n.args[0]]
        if n.target in self.override:
            scale, zp = self.override[n.target]
            return fake_quantize_per_tensor(x, scale, zp, obs.quant_min, obs.quant_max)
        return fake_quantize(obs, x)

    def call_function(self, target, args, kwargs):
        return out_of_place(target)(*args, **kwargs)

    def advance(self, env: dict, start: int, stop: int, inputs=()):
        """Run nodes ``[start, stop)`` on ``env`` (updated in place; the model's
        ``inputs`` feed its placeholders); the output node's value if reached, else None."""
        self.env, self.args_iter = env, iter(inputs)
        for i in range(start, stop):
            n = self.nodes[i]
            value = self.run_node(n)
            if n.op == "output":
                return value
            env[n] = value
            for dead in self.dies_at[i]:
                env.pop(dead, None)
        return None


#: images per stacked batch of the output search (bounds the live tensors' memory)
BATCH = 10


def _floats(out) -> list[torch.Tensor]:
    return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _relative_error(out, ref: list[torch.Tensor]) -> float:
    """Sum over the float outputs and over their rows (axis 0: the images of a stacked
    batch) of ||out - ref||^2 / ||ref||^2, each row normalised by its own energy."""
    def rows(t: torch.Tensor) -> torch.Tensor:
        return t.double().flatten(1) if t.dim() > 1 else t.double()[None]
    total = 0.0
    for g, r in zip(_floats(out), ref):
        g, r = rows(g), rows(r)
        energy = r.pow(2).sum(1)
        total += float(((g - r).pow(2).sum(1) / torch.where(energy > 0, energy, 1.0)).sum())
    return total


def _channels_last(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x


@torch.no_grad()
def _stack(gm: GraphModule, images: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """The images as stacked batches of up to :data:`BATCH`, with their float outputs, if
    the graph runs on a batch and gives every image the outputs it gives it alone
    (an exported graph may fix the batch at 1 in a view); else one batch per image.
    Stacking runs the interpreter once per batch, not per image: the same search,
    several times faster."""
    single = [_floats(FloatPass(gm).run(x)) for x in images]
    if len(images) > 1 and all(x.dim() >= 1 and x.shape[0] == 1 for x in images):
        # channels-last: PyTorch's CPU convs (depthwise above all) run faster on it; the
        # search over MobileNetV2 on 20 images: 42 -> 34 s on 2 cores
        groups = [_channels_last(torch.cat(images[i:i + BATCH])) for i in range(0, len(images), BATCH)]
        try:
            stacked = [_floats(_Stacked(gm).run(g)) for g in groups]
        except Exception:  # noqa: BLE001 - any failure on a batch means: run per image
            return list(images), single
        # each batch's outputs against its images' own outputs, concatenated
        expected = [[torch.cat([o[k] for o in single[i:i + BATCH]]) for k in range(len(single[0]))]
                    for i in range(0, len(images), BATCH)]
        if all(len(got) == len(want) and all(
                a.shape == b.shape and torch.allclose(a, b, rtol=1e-3, atol=1e-3 * float(b.abs().max() or 1))
                for a, b in zip(got, want)) for got, want in zip(stacked, expected)):
            return groups, stacked
    return list(images), single


def search_ranges_at_output(gm: GraphModule, images: list[torch.Tensor],
                            candidates: tuple[float, ...] = CANDIDATES) -> list[dict]:
    """Choose each searchable observer's percentile of the calibrated prepared ``gm`` by
    the error of the whole Q/DQ model's outputs against its float model on ``images``
    (batch-1 float32 tensors of the model's input shape), observers in
    graph order, each given the choices before it, candidates by a line search
    (module doc); in place. Returns one record per observer: ``observer``,
    ``percentile`` (chosen), ``was`` (before), ``tried`` (candidates evaluated),
    ``gain`` (output error at the chosen percentile / at the old one, given the choices
    upstream; <= 1). Raises ValueError without images or candidates."""
    if not images or not candidates:
        raise ValueError("range search needs calibration images and candidate percentiles")
    with torch.no_grad():
        batches, refs = _stack(gm, images)
        run = _Resumable(gm)
        starts: dict[str, int] = {}
        for i, n in enumerate(run.nodes):
            if (obs := observer_of(gm, n)) is not None and searchable(obs):
                starts.setdefault(n.target, i)
        envs: list[dict] = [{} for _ in batches]   # one live environment per batch
        done, carried = 0, None   # carried: the output error of the choices so far
        records = []
        # disable=None: a live bar on a terminal, nothing in logs
        for name, start in tqdm(sorted(starts.items(), key=lambda kv: kv[1]), desc="range search", unit="tensor",
                                leave=False, disable=None):
            for x, env in zip(batches, envs):
                run.advance(env, done, start, (x,))
            done = start
            obs = gm.get_submodule(name)
            was = float(obs.percentile)
            table = [_qparams(obs, p) for p in sorted(set((was, *candidates)))]
            here = [row[0] for row in table].index(was)

            def error(k: int) -> float:
                if k == here and carried is not None:   # unchanged state: the last tensor's chosen error
                    return carried
                run.override = {name: table[k][1:3]}
                return sum(_relative_error(run.advance(dict(env), start, len(run.nodes), (x,)), ref)
                           for x, env, ref in zip(batches, envs, refs))

            errors = _line_search(error, here, len(table))
            run.override = {}
            best = min(errors, key=lambda k: (errors[k], k != here))   # ties keep the current one
            obs.percentile.fill_(table[best][0])
            carried = errors[best]
            records.append({"observer": name, "percentile": table[best][0], "was": was, "tried": len(errors),
                            "gain": round(errors[best] / errors[here], 4) if errors[here] > 0 else 1.0})
    return records


def _line_search(error, here: int, count: int) -> dict[int, float]:
    """Errors of candidates ``0 .. count-1`` (ordered by percentile) evaluated by a line
    search from ``here``: both neighbours, then on in the direction that lowers the error
    while it keeps falling (the error of a clip is taken to be unimodal in the
    percentile: clipping more trades rounding error for clipping error). Returns
    {index: error} of the candidates evaluated."""
    errors = {here: error(here)}
    for step in (-1, 1):
        k = here + step
        while 0 <= k < count:
            errors[k] = error(k)
            if errors[k] >= errors[k - step]:
                break
            k += step
    return errors
