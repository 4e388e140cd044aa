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

Only :class:`~pipeline.quant.observers.PercentileObserver` observers with fewer
int levels than histogram bins (int8) are searched; int16 ones use the
observed range anyway. Observers without a reader in the graph (the model's
output) keep their percentile. A shared observer (one module at several
nodes) sums the errors of all its readers.
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from .graph import FloatPass, observer_of, out_of_place
from .observers import PercentileObserver

#: default candidate percentiles (percent of |x| kept); 100 = the observed max
CANDIDATES = (99.9, 99.95, 99.99, 99.995, 99.999, 100.0)


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
            q = torch.fake_quantize_per_tensor_affine(args[i], scale, zp, qmin, qmax)
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
