"""Fully connected (torch linear) offload: 2-D and 3-D inputs, bias first or absent,
N padding, int16, declines."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
from qflow import quantize

from pipeline.backend.passes.graph import Graph, const_array
from pipeline.backend.passes.fc import offload_fc_i8, offload_fc_i16
from pipeline.backend.passes.log import OffloadLog
from pipeline.backend.passes.offload_calls import offload_calls


class FC(nn.Module):
    def __init__(self, k, n, bias=True, relu=False):
        super().__init__()
        self.fc = nn.Linear(k, n, bias=bias)
        self.relu = relu

    def forward(self, x):
        y = self.fc(x)
        return torch.relu(y) if self.relu else y


def _flow(k, n, shape=None, **kw):
    torch.manual_seed(0)
    model = FC(k, n, bias=kw.pop("bias", True), relu=kw.pop("relu", False))
    return quantize(model, torch.randn(*(shape or (1, k))), **kw)


def _params(mod):
    """(d_s, d_zp, W, w_s, bias or None, o_s, o_zp) of the single linear of an imported module."""
    g = Graph(mod["main"])
    mm = next(b.value for b in g.bindings if g.call(b.var, "relax.matmul") is not None)
    lhs = g.call(mm.args[0], "relax.reshape")
    dq_x = g.call(lhs.args[0] if lhs is not None else mm.args[0], "relax.dequantize")
    dq_w = g.call(g.call(mm.args[1], "relax.permute_dims").args[0], "relax.dequantize")
    add = next((b.value for b in g.bindings if g.call(b.var, "relax.add") is not None), None)
    bias = None if add is None else next(const_array(a) for a in add.args if const_array(a) is not None)
    q = [b.value for b in g.bindings if g.call(b.var, "relax.quantize") is not None][-1]
    num = lambda e: const_array(e).item()  # noqa: E731
    return (num(dq_x.args[1]), num(dq_x.args[2]), const_array(dq_w.args[0]), const_array(dq_w.args[1]),
            bias, num(q.args[1]), num(q.args[2]))


def _ops(mod):
    g = Graph(mod["main"])
    return [b.value.op.name for b in g.bindings if g.call(b.var, *_ALL) is not None]


_ALL = ("relax.matmul", "relax.strided_slice", "relax.clip", "relax.reshape", "relax.call_tir")


def test_fc_i8_2d():
    flow = _flow(64, 32)
    log = OffloadLog()
    mod = offload_fc_i8(flow.mod, log)
    (call,) = offload_calls(mod)
    assert call.kernel == call.extern_name == "mmalib_matmul_bias_i8" and call.backend == "mmalib"
    assert call.buffer_args == [0, 1, 2, 3, 4, 5]
    assert [str(p.dtype) for p in call.prim.params] == ["int8", "int8", "int32", "uint8", "uint8", "int8"]
    assert call.scalars == [1, 64, 32]                                    # M, K, N
    d_s, d_zp, w, w_s, b, o_s, o_zp = _params(flow.mod)
    np.testing.assert_array_equal(call.const(1), w)                      # [N, K] torch layout
    unit = d_s * w_s.astype(np.float64)
    np.testing.assert_array_equal(call.const(2), np.rint(b / unit).astype(np.int32))
    assert "relax.matmul" not in _ops(mod) and "relax.strided_slice" not in _ops(mod)
    assert log.decisions[0].note is None


def test_fc_asymmetric_folds_both_zero_points():
    flow = _flow(32, 32, symmetric_activations=False)
    d_s, d_zp, w, w_s, b, o_s, o_zp = _params(flow.mod)
    assert d_zp != 0 and o_zp != 0
    (call,) = offload_calls(offload_fc_i8(flow.mod))
    unit = d_s * w_s.astype(np.float64)
    expected = np.rint(b / unit) - d_zp * w.astype(np.int64).sum(1) + np.rint(o_zp * o_s / unit)
    np.testing.assert_array_equal(call.const(2), expected.astype(np.int32))


def test_fc_pads_n_to_the_mma_width_and_slices_back():
    flow = _flow(32, 40)
    log = OffloadLog()
    mod = offload_fc_i8(flow.mod, log)
    (call,) = offload_calls(mod)
    assert call.scalars == [1, 32, 64]
    w = call.const(1)
    assert w.shape == (64, 32)
    np.testing.assert_array_equal(w[:40], _params(flow.mod)[2])
    for i in (1, 2, 3, 4):                                                # W, bias, scale, shift
        assert not call.const(i)[40:].any()
    assert tuple(int(d) for d in call.prim.params[5].shape) == (1, 64)
    g = Graph(mod["main"])
    (sl,) = [g.call(b.var, "relax.strided_slice") for b in g.bindings
             if g.call(b.var, "relax.strided_slice") is not None]
    axes, begin, end = ([int(v.value) for v in t.fields] for t in sl.args[1:4])
    assert (axes, begin, end) == ([1], [0], [40])
    assert tuple(int(d) for d in sl.ty.shape.values) == (1, 40)
    assert "N=40 padded to 64" in log.decisions[0].note


def test_fc_3d_input_reshape_form_with_relu():
    flow = _flow(32, 64, shape=(1, 4, 32), relu=True)
    assert "relax.reshape" in _ops(flow.mod)                            # reshape -> matmul -> reshape
    mod = offload_fc_i8(flow.mod)
    (call,) = offload_calls(mod)
    assert call.scalars == [4, 32, 64]                                    # M = 1 * 4
    assert [tuple(int(d) for d in p.shape) for p in call.prim.params][0] == (1, 4, 32)
    assert [tuple(int(d) for d in p.shape) for p in call.prim.params][5] == (1, 4, 64)
    g = Graph(mod["main"])
    clips = [g.call(b.var, "relax.clip") for b in g.bindings if g.call(b.var, "relax.clip") is not None]
    assert [(int(c.args[1].value), int(c.args[2].value)) for c in clips] == [(_params(flow.mod)[6], 127)]
    assert "relax.matmul" not in _ops(mod)


def test_fc_without_bias():
    flow = _flow(32, 32, bias=False)
    (call,) = offload_calls(offload_fc_i8(flow.mod))
    assert not call.const(2).any()                                       # symmetric: zero bias


def test_fc_declines_k_not_multiple():
    log = OffloadLog()
    mod = offload_fc_i8(_flow(24, 32).mod, log)
    assert offload_calls(mod) == []
    (decision,) = log.decisions
    assert decision.status == "declined" and "K=24 is not a multiple of 32" in decision.reason


def test_fc_i16_pads_to_16():
    flow = _flow(32, 24, dtype="int16", weight_dtype="int16")
    log = OffloadLog()
    assert offload_calls(offload_fc_i8(flow.mod)) == []
    mod = offload_fc_i16(flow.mod, log)
    (call,) = offload_calls(mod)
    assert call.kernel == "mmalib_matmul_bias_i16" and call.scalars == [1, 32, 32]
    assert [str(p.dtype) for p in call.prim.params] == ["int16", "int16", "int64", "uint8", "uint8", "int16"]
    assert "N=24 padded to 32" in log.decisions[0].note


def test_fc_i16_widened_int8_weights_are_prescaled():
    flow = _flow(32, 24, dtype="int16")                                 # int8 weights (default)
    log = OffloadLog()
    (call,) = offload_calls(offload_fc_i16(flow.mod, log))
    d_s, _, w, w_s, b, o_s, _ = _params(flow.mod)
    assert str(w.dtype) == "int8"
    w2, bias = call.const(1).astype(np.int64), call.const(2)
    k = np.array([w2[n][w[n] != 0][0] // int(w[n][w[n] != 0][0]) for n in range(24)])
    np.testing.assert_array_equal(w2[:24], w.astype(np.int64) * k[:, None])
    assert np.all((k >= 1) & (k <= 256)) and k.max() > 1
    unit = d_s * w_s.astype(np.float64)
    np.testing.assert_array_equal(bias[:24], np.rint(b / unit).astype(np.int64) * k)
    r = unit / o_s
    approx = k * call.const(3)[:24] / 2.0 ** call.const(4)[:24].astype(np.int64)
    assert np.all(np.abs(approx - r) / r < 1e-3)
    assert not w2[24:].any() and not call.const(3)[24:].any()           # padded rows stay 0
    assert "pre-scaled" in log.decisions[0].note and "N=24 padded to 32" in log.decisions[0].note
