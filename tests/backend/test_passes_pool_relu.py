"""int8 max-pool and standalone ReLU / clip offload to the C7x element-wise kernels."""

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
from pipeline.backend.passes.log import OffloadLog
from pipeline.backend.passes.offload_calls import offload_calls
from pipeline.backend.passes.pool import offload_max_pool2d_i8
from pipeline.backend.passes.relu import offload_relu_i8


class ConvPool(nn.Module):
    def __init__(self, k=3, s=2, p=1, ceil_mode=False):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(k, s, p, ceil_mode=ceil_mode)

    def forward(self, x):
        return self.pool(torch.relu(self.conv(x)))


class ConvAct(nn.Module):
    """conv followed by a standalone activation (quantized separately with fuse_activations=False)."""

    def __init__(self, act):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.act = act

    def forward(self, x):
        return self.act(self.conv(x))


def _flow(model, shape=(1, 4, 9, 9), **kw):
    torch.manual_seed(0)
    return quantize(randomize_bn(model), torch.randn(*shape), **kw)


def _pool_scalars(flow, **kw):
    log = OffloadLog()
    (call,) = offload_calls(offload_max_pool2d_i8(flow.mod, log, **kw))
    assert call.buffer_args == [0, 1] and [str(p.dtype) for p in call.prim.params] == ["int8", "int8"]
    assert [(d.op, d.status) for d in log.decisions] == [("max_pool2d", "offloaded")]
    return call


def test_maxpool_i8_tidl_and_plain():
    flow = _flow(ConvReluPool(), shape=(1, 3, 16, 16))
    call = _pool_scalars(flow)
    assert call.kernel == call.extern_name == "c7x_int8_max_pool_tidl" and call.backend == "c7x"
    # N, C, H_in, W_in, H_out, W_out, kH, kW, sH, sW, pH, pW
    assert call.scalars == [1, 32, 16, 16, 8, 8, 2, 2, 2, 2, 0, 0]
    assert _pool_scalars(flow, tidl_kernels=False).kernel == "c7x_int8_max_pool"


@pytest.mark.parametrize("ceil_mode,h_out", [(False, 4), (True, 5)])
def test_maxpool_padded_floor_and_ceil(ceil_mode, h_out):
    call = _pool_scalars(_flow(ConvPool(ceil_mode=ceil_mode), shape=(1, 4, 8, 8)))
    assert call.scalars == [1, 8, 8, 8, h_out, h_out, 3, 3, 2, 2, 1, 1]


def _declined(pass_fn, mod):
    log = OffloadLog()
    assert offload_calls(pass_fn(mod, log)) == []
    (decision,) = log.decisions
    assert decision.status == "declined"
    return decision.reason


def test_maxpool_declines_int16():
    reason = _declined(offload_max_pool2d_i8, _flow(ConvPool(), dtype="int16").mod)
    assert "only int8" in reason


@mutator
class _Rescale(PyExprMutator):
    """Multiply the scale constant of the last quantize by 2."""

    def __init__(self, mod, old):
        super().__init__(mod)
        self.old = old

    def visit_generic_const_(self, op):
        if op.same_as(self.old):
            return relax.const((const_array(op) * 2).astype(np.float32), "float32")
        return op


def test_maxpool_declines_different_quantization():
    mod = _flow(ConvPool()).mod
    g = Graph(mod["main"])
    q = [b.value for b in g.bindings if g.call(b.var, "relax.quantize") is not None][-1]
    edited = tvm.IRModule({"main": _Rescale(mod, q.args[1]).visit_expr(mod["main"])})
    assert "quantization differ" in _declined(offload_max_pool2d_i8, edited)


def test_relu_i8_standalone():
    flow = _flow(ConvAct(nn.ReLU()), fuse_activations=False, symmetric_activations=False)
    g = Graph(flow.mod["main"])
    relu = next(b.value for b in g.bindings if g.call(b.var, "relax.nn.relu") is not None)
    zp = int(const_array(g.call(relu.args[0], "relax.dequantize").args[2]))
    assert zp != 0
    log = OffloadLog()
    (call,) = offload_calls(offload_relu_i8(flow.mod, log))
    assert call.kernel == call.extern_name == "c7x_int8_relu" and call.buffer_args == [0, 1]
    assert call.scalars == [8 * 9 * 9, zp]
    assert [(d.op, d.status) for d in log.decisions] == [("relu", "offloaded")]


def test_clip_i8_standalone_bounds_are_torch_quantized():
    flow = _flow(ConvAct(nn.ReLU6()), fuse_activations=False)
    g = Graph(flow.mod["main"])
    clip = next(b.value for b in g.bindings if g.call(b.var, "relax.clip") is not None)
    dq = g.call(clip.args[0], "relax.dequantize")
    s, zp = float(const_array(dq.args[1])), int(const_array(dq.args[2]))
    q = torch.ops.quantized_decomposed.quantize_per_tensor.default
    lo, hi = (int(q(torch.tensor([v]), s, zp, -128, 127, torch.int8)[0]) for v in (0.0, 6.0))
    (call,) = offload_calls(offload_relu_i8(flow.mod))
    assert call.kernel == "c7x_int8_clamp" and call.scalars == [8 * 9 * 9, lo, hi]


def test_relu_declines_int16():
    mod = _flow(ConvAct(nn.ReLU()), fuse_activations=False, dtype="int16").mod
    assert "only int8 relu" in _declined(offload_relu_i8, mod)
