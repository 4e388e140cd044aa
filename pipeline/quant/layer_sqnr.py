"""Per-layer SQNR of a calibrated prepared model: its Q/DQ simulation against its float model.

The calibrate stage measures it before and after its method (range search, exact
requantize, AdaRound, bias correction: :func:`pipeline.quant.recipe.refine`) on the
calibration images, and the summary shows the worst layers both ways.

At every activation observer of the prepared graph (a layer's output point: after a
fused ReLU / ReLU6, conv-BN folded) the Q/DQ value is compared with the float value,
each model running on its own upstream values (propagation, as the layers stage and
PT2E's numeric debugger do), so the error is cumulative. The Q/DQ model fake-quantizes
each observed tensor with its observer's qparams (``torch.fake_quantize_per_tensor_affine``'s values;
weights per channel), which is what ``convert_pt2e`` makes of the observers, without
the int8 <-> int16 boundary requantizes of a mixed model (one dtype per tensor: the
observer's).

``sqnr_db`` = :func:`pipeline.quant.sqnr.sqnr_db` of ``sum x^2`` and ``sum (x - ref)^2`` over
every element of every image, x = Q/DQ, ref = float, as in ``layers.json``.
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from .graph import PER_CHANNEL, FloatPass, fake_quantize, observer_of
from .sqnr import sqnr_db


class _QDQPass(FloatPass):
    """The Q/DQ model of a prepared graph: every observer fake-quantizes its input."""

    def run_node(self, n: Node):
        obs = observer_of(self.module, n)
        if obs is not None:
            return fake_quantize(obs, self.env[n.args[0]])
        return super().run_node(n)


class _Recorder:
    """The values at the activation observers of one pass (``{observed node name: tensor}``)."""

    def __init__(self, gm: GraphModule, cls):
        self.points = {n.name: n.args[0].name for n in gm.graph.nodes
                       if (o := observer_of(gm, n)) is not None and o.qscheme not in PER_CHANNEL}
        recorder = self

        class Pass(cls):
            def run_node(self, n: Node):
                out = super().run_node(n)
                if n.name in recorder.points:
                    recorder.values[recorder.points[n.name]] = out
                return out

        self.interpreter = Pass(gm)
        self.values: dict[str, torch.Tensor] = {}

    def run(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        self.values = {}
        self.interpreter.run(x)
        return self.values


def layer_sqnr(gm: GraphModule, images: list[torch.Tensor]) -> dict[str, float | None]:
    """``{observed node name: sqnr_db}`` of the calibrated prepared ``gm`` over ``images``
    (float32 NCHW, batch 1 each), graph order; None where Q/DQ equals float exactly.
    ``gm`` is not modified (its observers only compute qparams here)."""
    ref, qdq = _Recorder(gm, FloatPass), _Recorder(gm, _QDQPass)
    signal: dict[str, float] = {}
    noise: dict[str, float] = {}
    with torch.no_grad():
        for x in images:
            f, q = ref.run(x), qdq.run(x)
            for name, v in q.items():
                v = v.double()
                signal[name] = signal.get(name, 0.0) + float((v ** 2).sum())
                noise[name] = noise.get(name, 0.0) + float(((v - f[name].double()) ** 2).sum())
    return {k: None if (db := sqnr_db(signal[k], noise[k])) is None else round(db, 3) for k in signal}
