"""conv2d offload (groups = 1 and grouped), int8 and int16: rewrite, extern ABI, folded
constants, declines. Numerics are in test_passes_numerics.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import tvm
from qflow import ConvReluPool, quantize, randomize_bn
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from pipeline.backend.passes.graph import Graph, const_array
from pipeline.backend.passes.conv import offload_conv2d_i8, offload_conv2d_i16
from pipeline.backend.passes.log import OffloadLog
from pipeline.backend.passes.offload_calls import offload_calls


class Conv(nn.Module):
    """One conv2d (+BN) (+ReLU/ReLU6)."""

    def __init__(self, cin=8, cout=16, k=3, stride=1, padding=1, dilation=1, groups=1, bias=True,
                 bn=True, act="relu"):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride, padding, dilation, groups, bias=bias)
        self.bn = nn.BatchNorm2d(cout) if bn else nn.Identity()
        self.act = {"relu": nn.ReLU(), "relu6": nn.ReLU6(), None: nn.Identity()}[act]

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


def _flow(model, shape=(1, 8, 10, 10), **kw):
    torch.manual_seed(0)
    return quantize(randomize_bn(model), torch.randn(*shape), **kw)


def _ops(mod):
    return [b.value.op.name for b in Graph(mod["main"]).bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]


def _conv_consts(mod):
    """(data dq, weight dq, output q) constants of the single conv chain of an imported module."""
    g = Graph(mod["main"])
    conv = next(b.value for b in g.bindings if g.call(b.var, "relax.nn.conv2d") is not None)
    dq_x, dq_w = (g.call(a, "relax.dequantize") for a in conv.args)
    q_out = [b.value for b in g.bindings if g.call(b.var, "relax.quantize") is not None][-1]
    num = lambda e: const_array(e).item()  # noqa: E731
    return (num(dq_x.args[1]), num(dq_x.args[2]), const_array(dq_w.args[0]), const_array(dq_w.args[1]),
            num(q_out.args[1]), num(q_out.args[2]))


def _bias_of(mod):
    g = Graph(mod["main"])
    for b in g.bindings:
        r = g.call(b.var, "relax.reshape")
        if r is not None and const_array(r.args[0]) is not None:
            return const_array(r.args[0]).astype(np.float64)
    return None


def test_conv_i8_is_replaced_with_the_header_abi():
    flow = _flow(Conv(k=(3, 1), padding=(1, 0), act="relu"))
    log = OffloadLog()
    mod = offload_conv2d_i8(flow.mod, log)
    assert "relax.nn.conv2d" in _ops(flow.mod) and "relax.nn.conv2d" not in _ops(mod)
    (call,) = offload_calls(mod)
    assert call.func == "mmalib_conv2d_i8_0" and call.kernel == call.extern_name == "mmalib_conv2d_i8"
    assert dict(call.prim.attrs) == {"c7x_kernel": "mmalib_conv2d_i8", "c7x_offload_backend": "mmalib"}
    # in, W, bias, scale, shift, out: the buffers in parameter order, output last.
    assert call.buffer_args == [0, 1, 2, 3, 4, 5]
    assert [str(p.dtype) for p in call.prim.params] == ["int8", "int8", "int32", "uint8", "uint8", "int8"]
    assert [tuple(int(d) for d in p.shape) for p in call.prim.params][5] == (1, 16, 10, 10)
    # C_in, H, W, C_out, KH, KW, sh, sw, pad_top, pad_bottom, pad_left, pad_right (Relax: t, l, b, r),
    # then the saturation range: the fused ReLU's [o_zp, 127].
    o_zp = _conv_consts(flow.mod)[-1]
    assert call.scalars == [8, 10, 10, 16, 3, 1, 1, 1, 1, 1, 0, 0, 0, o_zp, 127]   # pad value 0: no padding
    assert "relax.clip" not in _ops(mod)
    assert [d.status for d in log.decisions] == ["offloaded"]


def test_conv_i8_folded_constants_equal_the_formula():
    flow = _flow(Conv(act="relu"))
    mod = offload_conv2d_i8(flow.mod)
    (call,) = offload_calls(mod)
    d_s, d_zp, w, w_s, o_s, o_zp = _conv_consts(flow.mod)
    b = _bias_of(flow.mod)
    np.testing.assert_array_equal(call.const(1), w)                       # weights stay int8 OIHW
    unit = d_s * w_s.astype(np.float64)
    expected_bias = np.rint(b / unit) - d_zp * w.reshape(16, -1).sum(1)   # docs/reference.md, "Folding"; o_zp = 0 here
    assert o_zp == 0 and d_zp == 0
    np.testing.assert_array_equal(call.const(2), expected_bias.astype(np.int32))
    scale, shift = call.const(3).astype(np.float64), call.const(4).astype(np.float64)
    r = unit / o_s
    assert np.all((scale >= 1) & (scale <= 127) & (shift <= 31))
    assert np.all(np.abs(scale / 2**shift - r) / r < 1 / 128)             # s >= 64 once normalised


def test_conv_relu_and_relu6_become_the_kernels_saturation_range():
    for act, hi in (("relu", None), ("relu6", 6.0), (None, None)):
        flow = _flow(Conv(act=act))
        mod = offload_conv2d_i8(flow.mod)
        (call,) = offload_calls(mod)
        *_, o_s, o_zp = _conv_consts(flow.mod)
        q = torch.ops.quantized_decomposed.quantize_per_tensor.default
        lo_exp = -128 if act is None else int(q(torch.tensor([0.0]), o_s, o_zp, -128, 127, torch.int8)[0])
        hi_exp = 127 if hi is None else int(q(torch.tensor([hi]), o_s, o_zp, -128, 127, torch.int8)[0])
        assert call.scalars[-2:] == [lo_exp, hi_exp]
        assert "relax.clip" not in _ops(mod)  # no pass of its own


def test_grouped_conv_i8_uses_the_grouped_loop():
    flow = _flow(Conv(cin=8, cout=16, groups=2))
    mod = offload_conv2d_i8(flow.mod)
    (call,) = offload_calls(mod)
    assert call.kernel == call.extern_name == "mmalib_conv2d_i8_grouped_loop"
    assert tuple(int(d) for d in call.prim.params[1].shape) == (16, 4, 3, 3)
    assert call.scalars[:13] == [8, 10, 10, 16, 3, 3, 1, 1, 1, 1, 1, 1, 2] and len(call.scalars) == 16


@pytest.mark.parametrize("weight_dtype", ["int16", None])
def test_conv_i16(weight_dtype):
    flow = _flow(Conv(act="relu"), dtype="int16", weight_dtype=weight_dtype)
    log = OffloadLog()
    assert offload_conv2d_i8(flow.mod, log).same_as(flow.mod)             # not the i8 pass's business
    mod = offload_conv2d_i16(flow.mod, log)
    (call,) = offload_calls(mod)
    assert call.kernel == "mmalib_conv2d_i16"
    assert [str(p.dtype) for p in call.prim.params] == ["int16", "int16", "int64", "uint8", "uint8", "int16"]
    d_s, _, w, w_s, o_s, _ = _conv_consts(flow.mod)
    k, scale, shift = _prescale_of(call, w)
    if weight_dtype == "int16":
        assert str(w.dtype) == "int16" and k.tolist() == [1] * 16                # full range: no pre-scale
    else:                                                                    # widened int8, pre-scaled
        assert str(w.dtype) == "int8" and np.all((k >= 1) & (k <= 256)) and k.max() > 1
    np.testing.assert_array_equal(call.const(1), w.astype(np.int16) * k.reshape(-1, 1, 1, 1))
    expected = np.rint(_bias_of(flow.mod) / (d_s * w_s.astype(np.float64))) * k
    np.testing.assert_array_equal(call.const(2), expected.astype(np.int64))
    r = d_s * w_s.astype(np.float64) / o_s
    rel = np.abs(k * scale / 2.0**shift - r) / r
    assert rel.max() < (1 / 128 if weight_dtype == "int16" else 1e-3)
    (decision,) = log.decisions
    assert (decision.note is not None) == (weight_dtype is None)
    assert weight_dtype is not None or "pre-scaled" in decision.note
    assert call.scalars[-2:] == [0, 32767] and "relax.clip" not in _ops(mod)  # the ReLU: saturation range


def _prescale_of(call, w):
    """``(k int64[C], scale, shift)`` of an int16 conv call: ``k = W' / W`` per channel."""
    w2 = call.const(1).astype(np.int64).reshape(w.shape[0], -1)
    w1 = w.astype(np.int64).reshape(w.shape[0], -1)
    k = np.array([w2[c][w1[c] != 0][0] // w1[c][w1[c] != 0][0] for c in range(w.shape[0])])
    return k, call.const(3).astype(np.int64), call.const(4).astype(np.int64)


def _declined(flow, pass_fn=offload_conv2d_i8):
    log = OffloadLog()
    mod = pass_fn(flow.mod, log)
    assert offload_calls(mod) == [] and "relax.nn.conv2d" in _ops(mod)
    (decision,) = log.decisions
    assert decision.status == "declined"
    return decision.reason


def test_decline_dilated_conv():
    assert "dilation [2, 2]" in _declined(_flow(Conv(k=2, padding=1, dilation=2)))


def test_decline_non_square_stride():
    assert "not square" in _declined(_flow(Conv(stride=(2, 1))))


def test_asymmetric_padded_input_pads_with_its_zero_point():
    flow = _flow(Conv(k=(3, 5), padding=(1, 2), act=None), symmetric_activations=False)
    d_zp = _conv_consts(flow.mod)[1]
    assert d_zp != 0
    log = OffloadLog()
    mod = offload_conv2d_i8(flow.mod, log)
    (call,) = offload_calls(mod)
    assert "relax.nn.pad" not in _ops(mod)                     # no pass of its own
    # C_in, H, W, C_out, KH, KW, strides, the conv's padding, pad value = d_zp.
    assert call.scalars == [8, 10, 10, 16, 3, 5, 1, 1, 1, 1, 2, 2, d_zp, -128, 127]
    assert tuple(int(d) for d in call.prim.params[0].shape) == (1, 8, 10, 10)
    (decision,) = log.decisions
    assert decision.status == "offloaded" and f"padding reads the input zero point {d_zp}" in decision.note
    # Symmetric (zp 0) and unpadded asymmetric layers pad with 0 (nothing to pad).
    for model, kw in ((Conv(act=None), {}), (Conv(k=1, padding=0, act=None), dict(symmetric_activations=False))):
        (call,) = offload_calls(offload_conv2d_i8(_flow(model, **kw).mod))
        assert call.scalars[-3] == 0


def test_decline_grouped_int16():
    assert "no int16 kernel" in _declined(_flow(Conv(groups=2), dtype="int16"), offload_conv2d_i16)


@mutator
class _SwapConst(PyExprMutator):
    def __init__(self, mod, old, new):
        super().__init__(mod)
        self.old, self.new = old, new

    def visit_generic_const_(self, op):
        return self.new if op.same_as(self.old) else op


def _with_weight_scale(mod, factor):
    """``mod`` with the conv's weight scale multiplied by ``factor``."""
    g = Graph(mod["main"])
    conv = next(b.value for b in g.bindings if g.call(b.var, "relax.nn.conv2d") is not None)
    old = g.call(conv.args[1], "relax.dequantize").args[1]
    new = relax.const((const_array(old) * factor).astype(np.float32), "float32")
    out = tvm.IRModule()
    out["main"] = _SwapConst(mod, old, new).visit_expr(mod["main"])
    return out


def test_decline_unrepresentable_rescale():
    flow = _flow(Conv())
    reason = _declined(type(flow)(flow.qdq, flow.ep, _with_weight_scale(flow.mod, 1e6), flow.params))
    assert "does not fit scale in [1,127]" in reason


def _handmade_conv_module(extra_user: bool):
    """dq -> conv2d(dq W) -> relu -> q built by hand; with ``extra_user`` the float conv
    output also feeds the function's output (the quantizer never produces that)."""
    rng = np.random.default_rng(0)
    c = lambda a: relax.const(a, str(a.dtype))  # noqa: E731
    x = relax.Var("x", relax.TensorType((1, 4, 6, 6), "int8"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            xf = bb.emit(relax.op.dequantize(x, c(np.array(0.05, np.float32)), c(np.array(0, np.int8))))
            w = c(rng.integers(-127, 128, (8, 4, 3, 3)).astype(np.int8))
            wf = bb.emit(relax.op.dequantize(w, c(np.full(8, 0.01, np.float32)), c(np.zeros(8, np.int8)), axis=0))
            y = bb.emit(relax.op.nn.conv2d(xf, wf, padding=1))
            r = bb.emit(relax.op.nn.relu(y))
            q = bb.emit(relax.op.quantize(r, c(np.array(0.1, np.float32)), c(np.array(0, np.int8))))
            out = bb.emit_output(relax.Tuple([q, y]) if extra_user else q)
        bb.emit_func_output(out)
    return bb.get()


def test_decline_when_a_fused_intermediate_has_other_users():
    log = OffloadLog()
    assert offload_calls(offload_conv2d_i8(_handmade_conv_module(True), log)) == []
    (decision,) = log.decisions
    assert decision.status == "declined" and "has other users" in decision.reason
    # The same graph without the extra user is offloaded (the check is what declines).
    assert len(offload_calls(offload_conv2d_i8(_handmade_conv_module(False)))) == 1


def test_convrelupool_offloads_both_convs_in_graph_order():
    flow = _flow(ConvReluPool(), shape=(1, 3, 16, 16))
    log = OffloadLog()
    mod = offload_conv2d_i8(flow.mod, log)
    assert [c.func for c in offload_calls(mod)] == ["mmalib_conv2d_i8_0", "mmalib_conv2d_i8_1"]
    assert [d.func for d in log.decisions] == ["mmalib_conv2d_i8_0", "mmalib_conv2d_i8_1"]
