"""Numerical check of the folding: the kernel semantics of c7x_kernels.h, evaluated here
from the offload PrimFunc's constants, reproduce the torch Q/DQ layer within 1-2 LSB.

Kernel semantics (header, default rounding C7X_ROUND_HALF_UP):
  conv / depthwise / FC: out = saturate(((acc + bias[c]) * scale[c] + 2^(shift-1)) >> shift)
                         (no rounding term when shift = 0), acc the raw integer dot product
                         (computed here with a float64 torch conv2d / numpy int64 matmul; exact)
                         on the kernel's input: the layer input, or its explicit zero-point
                         ``R.nn.pad`` (asymmetric padded layers), then the kernel's raw-0 padding;
  residual add:          r = (dx*M_x + ds*M_skip + 2^14) >> 15 + zp_out, relu: max(r, zp_out).
The torch side is the converted Q/DQ GraphModule itself: the layer's input and output
integers are the values of the quantize nodes around it.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from qflow import ResidualBlock, quantize, randomize_bn

from pipeline.backend import fold
from pipeline.backend.passes.graph import Graph, const_array
from pipeline.backend.passes.offload_calls import layer_calls, offload_calls
from pipeline.backend.passes.pipeline import run_offload

QD = torch.ops.quantized_decomposed
_Q_OPS = {QD.quantize_per_tensor.default}
_DQ_OPS = {QD.dequantize_per_tensor.default}


class _Capture(torch.fx.Interpreter):
    def __init__(self, gm):
        super().__init__(gm)
        self.values = {}

    def run_node(self, n):
        out = super().run_node(n)
        self.values[n] = out
        return out


def _torch_layer_ints(gm, x, target):
    """Integer inputs (one per dequantized arg) and output of the single ``target`` node."""
    cap = _Capture(gm)
    with torch.no_grad():
        cap.run(x)
    (node,) = [n for n in gm.graph.nodes if n.target == target]
    ins = [cap.values[a.args[0]].numpy().astype(np.int64) for a in node.args
           if isinstance(a, torch.fx.Node) and a.target in _DQ_OPS]
    out = node
    while out.target not in _Q_OPS:
        (out,) = out.users
    return ins, cap.values[out].numpy().astype(np.int64)


def _rshift_round(v, shift):
    """floor((v + 2^(shift-1)) / 2^shift), no rounding term for shift 0 (header, HALF_UP)."""
    shift = shift.astype(np.int64)
    rnd = np.where(shift > 0, np.left_shift(np.int64(1), np.maximum(shift - 1, 0)), 0)
    return np.right_shift(v + rnd, shift)


def _requant(acc, bias, scale, shift, dtype, axis):
    shape = [1] * acc.ndim
    shape[axis] = -1
    b, s, sh = (a.astype(np.int64).reshape(shape) for a in (bias, scale, shift))
    lo, hi = fold.dtype_range(dtype)
    return np.clip(_rshift_round((acc + b) * s, sh), lo, hi)


def _saturation(call):
    """``(act_min, act_max)``: the kernel's saturation range, its last two scalars (the
    fused activation, c7x_kernels.h)."""
    return tuple(call.scalars[-2:])


def _conv_kernel(mod, call, x_int):
    w = call.const(1).astype(np.float64)
    *sc, pad_value = call.scalars[:-2]
    if call.kernel.startswith("mmalib_depthwise"):
        c, _, _, kh, kw, sh, sw, pt, pb, pl, pr, groups = sc
        w = w.reshape(c, 1, kh, kw)
    else:
        _, _, _, _, kh, kw, sh, sw, pt, pb, pl, pr, *g = sc
        groups = g[0] if g else 1
    xp = F.pad(torch.from_numpy(x_int.astype(np.float64)), (pl, pr, pt, pb), value=float(pad_value))
    acc = F.conv2d(xp, torch.from_numpy(w), stride=(sh, sw), groups=groups).numpy().astype(np.int64)
    dtype = str(call.prim.params[5].dtype)
    out = _requant(acc, call.const(2), call.const(3), call.const(4), dtype, axis=1)
    return np.clip(out, *_saturation(call))


def _conv_of(mod):
    g = Graph(mod["main"])
    return next(b.value for b in g.bindings if g.call(b.var, "relax.nn.conv2d") is not None)


class Conv(nn.Module):
    def __init__(self, cin=8, cout=16, k=3, stride=1, padding=1, groups=1, act="relu"):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride, padding, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = {"relu": nn.ReLU(), "relu6": nn.ReLU6(), None: nn.Identity()}[act]

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


CONV_CASES = {
    "3x3_relu": dict(model=dict(), kw=dict()),
    "1x1_asymmetric": dict(model=dict(k=1, padding=0, act=None), kw=dict(symmetric_activations=False)),
    "3x3_asymmetric_padded": dict(model=dict(act=None), kw=dict(symmetric_activations=False, offset=3.0)),
    "3x3_stride2_asymmetric_padded_relu": dict(model=dict(stride=2),
                                               kw=dict(symmetric_activations=False, offset=3.0)),
    "depthwise_asymmetric_padded": dict(model=dict(cin=16, groups=16, act="relu6"),
                                        kw=dict(symmetric_activations=False, offset=3.0)),
    "3x3_stride2_relu6": dict(model=dict(stride=2, act="relu6"), kw=dict()),
    "grouped": dict(model=dict(groups=4), kw=dict()),
    "depthwise_stride2": dict(model=dict(cin=16, groups=16, stride=2, act="relu6"), kw=dict()),
}


def _run(model, shape, offset=0.0, **kw):
    """Quantize (calibration: 4 seeded Gaussian batches + ``offset``), offload, and a test input.
    An ``offset`` of 3 makes the input mostly positive, so an asymmetric input zero point is
    near -128 (as after a ReLU) and raw-0 padding would be off by many LSB at the border."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    calib = [torch.randn(shape, generator=gen) + offset for _ in range(4)]
    flow = quantize(randomize_bn(model), calib[0], calib=calib, **kw)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(5)) * 1.2 + offset
    mod, _ = run_offload(flow.mod)
    return flow, mod, x


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv_int8_matches_torch(case):
    spec = CONV_CASES[case]
    model = Conv(**spec["model"])
    flow, mod, x = _run(model, (1, model.conv.in_channels, 12, 12), **spec["kw"])
    (call,) = layer_calls(mod)
    (x_int,), torch_out = _torch_layer_ints(flow.qdq, x, torch.ops.aten.conv2d.default)
    ours = _conv_kernel(mod, call, x_int)
    diff = np.abs(ours - torch_out)
    assert diff.max() <= 2, (case, diff.max())
    # Share of exact elements: 7-bit scale precision (measured 0.85 on an asymmetric case).
    assert (diff == 0).mean() > (0.8 if "asymmetric_padded" in case else 0.9), (case, (diff == 0).mean())
    if "asymmetric_padded" in case:                    # the border is where raw-0 padding would fail
        d_zp = int(const_array(Graph(flow.mod["main"]).call(
            _conv_of(flow.mod).args[0], "relax.dequantize").args[2]))
        assert d_zp < -64 and call.scalars[-3] == d_zp   # zp far from 0, the kernel's pad value


@pytest.mark.parametrize("weight_dtype", ["int16", None])
def test_conv_int16_matches_torch_within_the_scale_precision(weight_dtype):
    flow, mod, x = _run(Conv(), (1, 8, 12, 12), dtype="int16", weight_dtype=weight_dtype)
    (call,) = layer_calls(mod)
    (x_int,), torch_out = _torch_layer_ints(flow.qdq, x, torch.ops.aten.conv2d.default)
    ours = _conv_kernel(mod, call, x_int)
    # A 7-bit scale carries a relative error of up to 1/128 of the rescale: with int16
    # outputs that is many LSB. Bound each element by its own channel's scale error.
    g = Graph(flow.mod["main"])
    conv = next(b.value for b in g.bindings if g.call(b.var, "relax.nn.conv2d") is not None)
    d_s = float(g.call(conv.args[0], "relax.dequantize").args[1].value.numpy())
    w_s = g.call(conv.args[1], "relax.dequantize").args[1].value.numpy().astype(np.float64)
    o_s = float([b.value for b in g.bindings if g.call(b.var, "relax.quantize") is not None][-1]
                .args[1].value.numpy())
    r = d_s * w_s / o_s
    w = call.const(1).astype(np.int64).reshape(len(r), -1)
    w8 = const_array(g.call(conv.args[1], "relax.dequantize").args[0]).astype(np.int64).reshape(len(r), -1)
    k = np.array([w[c][w8[c] != 0][0] // w8[c][w8[c] != 0][0] for c in range(len(r))])   # pre-scale
    rel = np.abs(k * call.const(3) / 2.0 ** call.const(4) - r) / r
    bound = 2 + np.abs(torch_out) * rel.reshape(1, -1, 1, 1) * 1.01
    diff = np.abs(ours - torch_out)
    assert np.all(diff <= bound)
    assert np.abs(torch_out).max() > 1000                    # a real int16 range was exercised
    if weight_dtype is None:                                 # widened int8: ~14-bit multiplier
        assert k.max() > 1 and rel.max() < 1e-3 and diff.max() <= 4 and diff.mean() < 0.5


def test_fc_padded_matches_torch():
    torch.manual_seed(0)
    model = nn.Linear(64, 40)
    flow = quantize(model, torch.randn(16, 64))           # M = 16 rows, N = 40 padded to 64
    mod, _ = run_offload(flow.mod)
    (call,) = layer_calls(mod)
    assert call.scalars == [16, 64, 64, -128, 127]
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(5))
    (x_int,), torch_out = _torch_layer_ints(flow.qdq, x, torch.ops.aten.linear.default)
    acc = x_int @ call.const(1).astype(np.int64).T
    ours = _requant(acc, call.const(2), call.const(3), call.const(4), "int8", axis=1)
    assert not ours[:, 40:].any()                            # padded rows are exactly 0
    diff = np.abs(ours[:, :40] - torch_out)
    assert diff.max() <= 2 and (diff == 0).mean() > 0.9


def test_residual_add_matches_torch():
    flow, mod, x = _run(ResidualBlock(), (1, 32, 8, 8))
    (call,) = [c for c in offload_calls(mod) if c.kernel == "c7x_int8_residual_add_relu"]
    (a, b), torch_out = _torch_layer_ints(flow.qdq, x, torch.ops.aten.add.Tensor)
    m_x, m_s, shift, zx, zs, zo, _ = struct.unpack("<iiibbbB", call.const(2).tobytes())
    r = _rshift_round((a - zx) * m_x + (b - zs) * m_s, np.array(shift)) + zo
    if call.scalars[1]:
        r = np.maximum(r, zo)
    ours = np.clip(r, -128, 127)
    diff = np.abs(ours - torch_out)
    assert call.scalars[1] == 1 and diff.max() <= 1 and (diff == 0).mean() > 0.9
