"""Adaptive rounding of the int8 weights (AdaRound, Nagel et al., ICML 2020).

Rounding every weight to the nearest integer minimises the error of each
weight, not of the layer's output. AdaRound learns, per weight, whether to
round down or up so that the layer's output on calibration data is closest to
the float output. Per conv2d / linear with per-channel int8 weights
``W`` [O, I, kh, kw] (OIHW) or [O, I], scale ``s`` [O]:

    W~(V) = s * clamp(floor(W / s) + h(V), qmin, qmax)
    h(V)  = clamp(sigmoid(V) * (zeta - gamma) + gamma, 0, 1)      (eq. 23, zeta 1.1, gamma -0.1)
    loss  = mean ||f(x~, W~(V)) - f(x, W)||^2 + lambda * sum(1 - |2 h(V) - 1|^beta)   (eq. 21, 24)

``f`` the layer (its stride, padding, groups), ``x`` its float input, ``x~``
that input quantized with the layer's own input qparams (the quantized
model's view, so the rounding also absorbs some input error), ``beta``
annealed from 20 to 2 after a warm-up of 20% of the iterations, ``lambda``
0.01, Adam with learning rate 1e-2 (:data:`LR`: ten times Adam's default, for the
200-odd steps per layer run here where the paper runs thousands) on ``V`` (initialised so that ``h(V)`` is
the fractional part), one calibration image per step. After the last step
``h`` is rounded to 0 or 1 and the float weight of the prepared model is
replaced by ``s * integer``, which convert quantizes back to exactly those
integers (the scales are the weight observers', left unchanged: run after
:mod:`pipeline.quant.exact_rescale`).

The float inputs of every layer come from one float pass (observers skipped)
over the images, held in memory (about 15 MB per 224x224 MobileNetV2 image).
Cost: ``iterations`` forward/backward passes of each layer on one image; the
layers run side by side, one torch thread each.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import torch
import torch.nn.functional as F
from torch.fx import GraphModule, Node
from tqdm import tqdm

from ..torchenv import torch_threads
from .bias_correction import weighted_nodes
from .graph import FloatPass, attr_tensor, fake_quantize_per_tensor, observer_of

REFERENCE = "Nagel et al. 2020, Up or Down? Adaptive Rounding for Post-Training Quantization, eq. 21-25"
ZETA, GAMMA = 1.1, -0.1
LAMBDA = 0.01
LR = 1e-2
WARMUP = 0.2
BETA = (20.0, 2.0)


class _Inputs(FloatPass):
    """Float pass (observers skipped) keeping each layer's data input."""

    def __init__(self, gm: GraphModule, layers: set[str]):
        super().__init__(gm)
        self.layers = layers
        self.inputs: dict[str, list[torch.Tensor]] = {n: [] for n in layers}

    def run_node(self, n: Node):
        if n.name in self.layers:
            self.inputs[n.name].append(self.env[n.args[0]].detach().clone())
        return super().run_node(n)


def _layer_fn(node: Node):
    """``f(x, w)`` of a conv2d / linear node, bias left out (it cancels in the loss)."""
    if node.target == torch.ops.aten.conv2d.default:
        a = list(node.args) + [None] * (7 - len(node.args))
        stride, padding, dilation, groups = a[3] or 1, a[4] or 0, a[5] or 1, a[6] or 1
        return lambda x, w: F.conv2d(x, w, None, stride, padding, dilation, groups)
    return lambda x, w: F.linear(x, w)


def _h(v: torch.Tensor) -> torch.Tensor:
    return torch.clamp(torch.sigmoid(v) * (ZETA - GAMMA) + GAMMA, 0.0, 1.0)


def _beta(it: int, iterations: int) -> float | None:
    """The regularizer's annealed exponent at step ``it``, None during the warm-up."""
    warm = int(WARMUP * iterations)
    if it < warm:
        return None
    frac = (it - warm) / max(iterations - warm, 1)
    return BETA[1] + 0.5 * (BETA[0] - BETA[1]) * (1 + math.cos(math.pi * frac))


class _Rounding:
    """``W~(V)`` of the module doc and the gradient of the loss with respect to ``V``,
    derived by hand, in preallocated buffers. Autograd runs about 35 weight-sized
    passes per step, two float powers among them, each into a fresh tensor (a fresh
    5 MB tensor costs more in page faults than the arithmetic); this runs about 20 in
    place, with ``|a|^(beta-1)`` as ``exp((beta-1) log|a|)`` (half a power's time).
    That is what a step of a large layer costs (MobileNetV2's classifier: 1.28 M
    weights, a [1, 1280] input). ``test_adaround.py`` checks it against autograd."""

    def __init__(self, base: torch.Tensor, s: torch.Tensor, qmin: int, qmax: int):
        self.base, self.s, self.qmin, self.qmax = base, s, qmin, qmax
        # base + h, h in [0, 1], leaves [qmin, qmax] only where base is qmax or outside
        self.edge = ((base < qmin) | (base >= qmax)).nonzero(as_tuple=True)
        self.sig, self.hu, self.h, self.bq, self.tmp, self.pw = (torch.empty_like(base) for _ in range(6))
        self.wq = torch.empty_like(base).requires_grad_(True)

    @torch.no_grad()
    def weight(self, v: torch.Tensor) -> torch.Tensor:
        """``s * clamp(base + h(V), qmin, qmax)`` (a leaf that requires grad, reused)."""
        torch.sigmoid(v, out=self.sig)
        torch.mul(self.sig, ZETA - GAMMA, out=self.hu).add_(GAMMA)
        torch.clamp(self.hu, 0.0, 1.0, out=self.h)
        torch.add(self.base, self.h, out=self.bq)
        torch.clamp(self.bq, self.qmin, self.qmax, out=self.wq).mul_(self.s)
        return self.wq

    @torch.no_grad()
    def grad(self, g_w: torch.Tensor, beta: float | None) -> torch.Tensor:
        """dLoss/dV from ``g_w`` = dLoss/dW~ (overwritten) and the regularizer at
        ``beta`` (None: off)."""
        g = g_w.mul_(self.s)                               # through s * clamp(...)
        if self.edge[0].numel():                           # clamp's gradient: x in [min, max]
            b = self.bq[self.edge]
            g[self.edge] *= ((b >= self.qmin) & (b <= self.qmax)).to(g.dtype)
        if beta is not None:   # d/dh LAMBDA * mean(1 - |2h - 1|^beta)
            a = torch.mul(self.h, 2, out=self.tmp).sub_(1)
            p = torch.abs(a, out=self.pw).log_().mul_(beta - 1).exp_().mul_(a.sign_())   # sign(a) |a|^(beta-1)
            g.add_(p, alpha=-2 * beta * LAMBDA / g.numel())
        g.masked_fill_(self.hu != self.h, 0.0)             # clamp to [0, 1]: passes inside
        torch.mul(self.sig, self.sig, out=self.tmp)
        return g.mul_(torch.sub(self.sig, self.tmp, out=self.tmp)).mul_(ZETA - GAMMA)   # sigmoid'


def round_layer(fn, w: torch.Tensor, scale: torch.Tensor, qmin: int, qmax: int,
                x: list[torch.Tensor], x_q: list[torch.Tensor], iterations: int,
                seed: int = 0) -> tuple[torch.Tensor, dict]:
    """AdaRound one layer (module doc). ``w`` float weight (axis 0 = output channels),
    ``scale`` [O] its per-channel scale, ``x`` / ``x_q`` the float / quantized inputs
    (one tensor per image). Returns the integer weights (float tensor of integers, the
    shape of ``w``) and a record: output MSE with nearest rounding and after, and the
    share of weights rounded the other way. Deterministic for a ``seed``."""
    s = scale.view(-1, *([1] * (w.dim() - 1))).to(w.dtype)
    base = torch.floor(w / s)
    rest = (w / s - base).clamp(1e-4, 1 - 1e-4)
    v = -torch.log((ZETA - GAMMA) / (rest - GAMMA) - 1.0)
    target = [fn(xi, w).detach() for xi in x]
    nearest = torch.clamp(torch.round(w / s), qmin, qmax)
    mse = lambda q: sum(float((fn(xq, s * q) - t).pow(2).mean()) for xq, t in zip(x_q, target)) / len(x)
    before = mse(nearest)
    opt = torch.optim.Adam([v], lr=LR, fused=True)
    gen = torch.Generator().manual_seed(seed)
    rounding = _Rounding(base, s, qmin, qmax)
    for it in range(iterations):
        i = int(torch.randint(len(x), (1,), generator=gen))
        wq = rounding.weight(v)
        loss = (fn(x_q[i], wq) - target[i]).pow(2).mean()
        g_w, = torch.autograd.grad(loss, wq)
        v.grad = rounding.grad(g_w, _beta(it, iterations))
        opt.step()
    with torch.no_grad():
        q = torch.clamp(base + (_h(v) >= 0.5).to(w.dtype), qmin, qmax)
        after = mse(q)
        if after > before:   # never worse than nearest on the calibration images
            q, after = nearest, before
        flipped = float((q != nearest).double().mean())
    return q, {"mse_nearest": before, "mse": after, "flipped": round(flipped, 4)}


def adaround(gm: GraphModule, images: list[torch.Tensor], iterations: int = 200) -> list[dict]:
    """AdaRound every conv2d / linear of the calibrated prepared ``gm`` with a per-channel
    int8 weight observer, in place (its float weights become ``scale * integer``).
    ``images``: batch-1 float32 inputs (the model's input shape). Returns one record per
    layer (``node`` and :func:`round_layer`'s). Raises ValueError without images or with
    ``iterations`` < 1."""
    if not images or iterations < 1:
        raise ValueError("adaptive rounding needs calibration images and iterations >= 1")
    layers = [n for n in weighted_nodes(gm)
              if (o := observer_of(gm, n.args[1])) is not None and getattr(o, "ch_axis", None) == 0
              and o.dtype == torch.int8 and n.args[1].args[0].op == "get_attr"]
    run = _Inputs(gm, {n.name for n in layers})
    with torch.no_grad():
        for x in images:
            run.run(x)
    jobs = []
    for k, node in enumerate(layers):
        wobs = observer_of(gm, node.args[1])
        scale, _ = wobs.calculate_qparams()
        w = attr_tensor(gm, node.args[1].args[0].target)
        x = run.inputs.pop(node.name)
        iobs = observer_of(gm, node.args[0])
        if iobs is not None:
            s_in, zp = iobs.calculate_qparams()
            x_q = [fake_quantize_per_tensor(t, float(s_in), int(zp), iobs.quant_min, iobs.quant_max)
                   for t in x]
        else:
            x_q = x
        jobs.append((node, w, scale, partial(round_layer, _layer_fn(node), w.detach(), scale, wobs.quant_min,
                                             wobs.quant_max, x, x_q, iterations, k)))
    # The layers are independent (float inputs, their own input qparams): they run side by
    # side, one torch thread each, so the per-step small ops of one layer do not wait for a
    # second thread to wake (OpenMP's passive wait, pipeline/torchenv.py; docs/measuring.md,
    # "Figures behind the code").
    # Each layer's result does not depend on the scheduling.
    workers = max(1, torch.get_num_threads())
    with torch_threads(1), ThreadPoolExecutor(workers) as pool:
        # disable=None: a live bar on a terminal, nothing in logs
        results = list(tqdm(pool.map(lambda job: job[3](), jobs), total=len(jobs),
                            desc="adaround", unit="layer", leave=False, disable=None))
    records = []
    for (node, w, scale, _), (q, rec) in zip(jobs, results):
        with torch.no_grad():
            w.copy_(scale.view(-1, *([1] * (w.dim() - 1))).to(w.dtype) * q)
        records.append({"node": node.name, **{k2: (round(v, 9) if isinstance(v, float) else v)
                                               for k2, v in rec.items()}})
    return records
