"""Residual-add offload (int8 / int16, fused ReLU or not, both operand orders, declines)."""

from __future__ import annotations

import struct

import torch
import torch.nn as nn
from qflow import InvertedResidual, ResidualBlock, quantize, randomize_bn

from pipeline.backend.passes.graph import Graph, const_array
from pipeline.backend.passes.log import OffloadLog
from pipeline.backend.passes.offload_calls import offload_calls
from pipeline.backend.passes.residual import offload_residual_add_i8, offload_residual_add_i16


def _flow(model, **kw):
    torch.manual_seed(0)
    return quantize(randomize_bn(model), torch.randn(1, 32, 8, 8), **kw)


def _residual_add(mod):
    """(x int var, s_x, zp_x, skip int var, s_skip, zp_skip, s_o, zp_o) of the residual add."""
    g = Graph(mod["main"])
    for b in g.bindings:
        add = g.call(b.var, "relax.add")
        dqs = [g.call(a, "relax.dequantize") for a in add.args] if add is not None else [None]
        if all(d is not None for d in dqs):
            q = next(c.value for c in g.bindings if g.call(c.var, "relax.quantize") is not None
                     and any(c.value.args[0].same_as(v) for v in _users_chain(g, b.var)))
            num = lambda e: const_array(e).item()  # noqa: E731
            return (dqs[0].args[0], num(dqs[0].args[1]), num(dqs[0].args[2]),
                    dqs[1].args[0], num(dqs[1].args[1]), num(dqs[1].args[2]),
                    num(q.args[1]), num(q.args[2]))
    raise AssertionError("no residual add")


def _users_chain(g, var):
    """``var`` and a relu applied directly to it."""
    out = [var]
    out += [b.var for b in g.bindings if g.call(b.var, "relax.nn.relu") is not None
            and b.value.args[0].same_as(var)]
    return out


def _check_params(call, x_s, x_zp, s_s, s_zp, o_s, o_zp):
    m_x, m_s, shift, zx, zs, zo, _ = struct.unpack("<iiibbbB", call.const(2).tobytes())
    assert (m_x, m_s, shift) == (round(x_s / o_s * 2**15), round(s_s / o_s * 2**15), 15)
    assert (zx, zs, zo) == (x_zp, s_zp, o_zp)


def test_residual_i8_fused_relu_conv_operand_first():
    flow = _flow(ResidualBlock())                       # relu(b2(c2(y)) + x)
    x, xs, xz, skip, ss, sz, os_, oz = _residual_add(flow.mod)
    log = OffloadLog()
    mod = offload_residual_add_i8(flow.mod, log)
    (call,) = offload_calls(mod)
    assert call.kernel == call.extern_name == "c7x_int8_residual_add_relu" and call.backend == "c7x"
    assert call.buffer_args == [0, 1, 2, 3]
    assert [str(p.dtype) for p in call.prim.params] == ["int8", "int8", "uint8", "int8"]
    assert call.scalars == [32 * 8 * 8, 1]                 # n, has_relu
    assert call.args[0].same_as(x) and call.args[1].same_as(skip)   # first add operand is x
    _check_params(call, xs, xz, ss, sz, os_, oz)
    assert [(d.op, d.status) for d in log.decisions] == [("residual_add", "offloaded")]


def test_residual_i8_unfused_input_operand_first():
    flow = _flow(InvertedResidual(), fuse_activations=False)   # x + m(x), no relu
    x, xs, xz, skip, ss, sz, os_, oz = _residual_add(flow.mod)
    (call,) = offload_calls(offload_residual_add_i8(flow.mod))
    assert call.scalars == [2048, 0]
    assert call.args[0].same_as(x) and call.args[1].same_as(skip)
    _check_params(call, xs, xz, ss, sz, os_, oz)


def test_residual_i8_asymmetric_zero_points_go_into_the_blob():
    flow = _flow(ResidualBlock(), symmetric_activations=False)
    *_, oz = params = _residual_add(flow.mod)
    (call,) = offload_calls(offload_residual_add_i8(flow.mod))
    _check_params(call, *params[1:3], *params[4:])
    assert params[2] != 0 or oz != 0


def test_residual_i16():
    flow = _flow(ResidualBlock(), dtype="int16")
    assert offload_calls(offload_residual_add_i8(flow.mod)) == []
    (call,) = offload_calls(offload_residual_add_i16(flow.mod))
    assert call.kernel == "c7x_int16_residual_add_relu"
    assert [str(p.dtype) for p in call.prim.params] == ["int16", "int16", "uint8", "int16"]
    _, xs, xz, _, ss, sz, os_, oz = _residual_add(flow.mod)
    _check_params(call, xs, xz, ss, sz, os_, oz)


def test_residual_declines_broadcasting():
    class Broadcast(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(32, 32, 1)

        def forward(self, x):
            y = self.conv(x)
            return y + y.mean((2, 3), keepdim=True)

    log = OffloadLog()
    mod = offload_residual_add_i8(_flow(Broadcast()).mod, log)
    assert offload_calls(mod) == []
    (decision,) = log.decisions
    assert decision.status == "declined" and "the innermost unbroadcast" in decision.reason
