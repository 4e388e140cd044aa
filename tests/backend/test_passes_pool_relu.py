"""int8 / int16 max-pool and standalone ReLU / clip offload to the C7x element-wise kernels."""

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
from pipeline.backend.passes.pool import offload_max_pool2d_i8, offload_max_pool2d_i16
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


#: dtype -> (pass, pool kernel, requantize kernel)
POOL_PASS = {"int8": (offload_max_pool2d_i8, "c7x_int8_max_pool_tidl", "c7x_requantize_i8_i8"),
             "int16": (offload_max_pool2d_i16, "c7x_int16_max_pool", "c7x_requantize_i16_i16")}


def test_maxpool_i16_is_the_int16_pass_s_alone():
    mod = _flow(ConvPool(), dtype="int16").mod
    log = OffloadLog()
    assert offload_calls(offload_max_pool2d_i8(mod, log)) == [] and log.decisions == []
    (call,) = offload_calls(offload_max_pool2d_i16(mod, log))
    assert (call.kernel, call.backend) == ("c7x_int16_max_pool", "c7x")
    assert [str(p.dtype) for p in call.prim.params] == ["int16", "int16"]
    assert call.scalars == [1, 8, 9, 9, 5, 5, 3, 3, 2, 2, 1, 1]
    assert [(d.op, d.status, d.dtype) for d in log.decisions] == [("max_pool2d", "offloaded", "int16")]


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


class CatPool(nn.Module):
    """GoogLeNet's inception branch 4: a concat (left float by the quantizer) of two
    branches, then a max pool whose output gets its own observer, then a conv."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(3, 5, 1)
        self.pool = nn.MaxPool2d(3, 1, 1, ceil_mode=True)
        self.head = nn.Conv2d(13, 4, 1)

    def forward(self, x):
        return self.head(self.pool(torch.cat([torch.relu(self.a(x)), self.b(x)], 1)))


def _requantized_pool_calls(mod, dtype="int8"):
    pass_fn, _, requantize = POOL_PASS[dtype]
    log = OffloadLog()
    calls = offload_calls(pass_fn(mod, log))
    (decision,) = log.decisions
    assert decision.status == "offloaded" and requantize in decision.note
    return calls


def _rescaled_pool_quantize(mod):
    """``mod`` with the scale of its max pool's quantize doubled (a pool whose input and
    output quantization differ), and that quantize's (original) call."""
    g = Graph(mod["main"])
    (q,) = [b.value for b in g.bindings if g.call(b.var, "relax.quantize") is not None
            and g.call(b.value.args[0], "relax.nn.max_pool2d") is not None]
    return tvm.IRModule({"main": _Rescale(mod, q.args[1]).visit_expr(mod["main"])}), q


@pytest.mark.parametrize("dtype", sorted(POOL_PASS))
def test_maxpool_with_different_quantization_pools_then_requantizes(dtype):
    """Input and output quantization differ: the pool on the input's integers,
    then c7x_requantize_i8_i8 (i16_i16) with torch's float32 scales and reciprocal."""
    edited, q = _rescaled_pool_quantize(_flow(ConvPool(), dtype=dtype).mod)
    dq = [b.value for b in Graph(edited["main"]).bindings if Graph(edited["main"]).call(b.var, "relax.dequantize")
          is not None][-1]
    pool, req = _requantized_pool_calls(edited, dtype)
    assert (pool.kernel, req.kernel) == POOL_PASS[dtype][1:]
    s_in = float(const_array(dq.args[1]).reshape(-1)[0])
    s_out = float(const_array(q.args[1]).reshape(-1)[0]) * 2
    n, z_in, scale_in, z_out, inv = req.scalars
    assert n == 8 * 5 * 5 and scale_in == pytest.approx(s_in, rel=1e-7)
    assert inv == float(np.float32(1.0 / np.float64(np.float32(s_out))))
    assert (z_in, z_out) == (int(const_array(dq.args[2]).reshape(-1)[0]), int(const_array(q.args[2]).reshape(-1)[0]))


@pytest.mark.parametrize("dtype", sorted(POOL_PASS))
def test_maxpool_after_concat_is_offloaded_and_exact(tmp_path, dtype):
    """The GoogLeNet pattern through codegen and gcc: pool + requantize on the
    C7x kernels, host C == Python reference bit for bit (every output and every
    intermediate of the first image), and the requantized pool equals torch's
    ``quantize(max_pool2d(dequantize(x)))`` on the integers the C was given (max
    commutes with the monotone requantize). Fails if the requantize is left out or
    uses other parameters than the pool's quantize."""
    from c_check import compile_and_compare, inputs

    from pipeline.backend.interp import Program

    _, pool_kernel, requantize = POOL_PASS[dtype]
    info = np.iinfo(dtype)
    torch.manual_seed(0)    # the model's initial weights, whatever ran before
    # Whether calibration gives the pool's output the concat's scale depends on the weights:
    # double the output scale so the requantize is always exercised.
    mod, _ = _rescaled_pool_quantize(_flow(CatPool(), shape=(1, 3, 12, 12), dtype=dtype).mod)
    pool, req = _requantized_pool_calls(mod, dtype)
    assert (pool.kernel, req.kernel) == (pool_kernel, requantize)
    n, z_in, s_in, z_out, inv = req.scalars
    x = inputs((1, 3, 12, 12), n=3)
    compile_and_compare(mod, "catpool", tmp_path / "c", x, mmalib=True)
    seen = []
    Program(tmp_path / "c").run(x[:1], observer=lambda i, func, a: seen.append((func, a.copy())))
    k = next(i for i, (func, _) in enumerate(seen) if func.startswith(pool_kernel))
    assert seen[k + 1][0].startswith(requantize)
    pooled_in, result = seen[k - 1][1], seen[k + 1][1]
    assert pooled_in.shape == (1, 13, 12, 12) and pooled_in.dtype == dtype
    qd, tdtype = torch.ops.quantized_decomposed, getattr(torch, dtype)
    d = qd.dequantize_per_tensor(torch.from_numpy(pooled_in), s_in, z_in, int(info.min), int(info.max), tdtype)
    m = torch.nn.functional.max_pool2d(d, 3, 1, 1, ceil_mode=True)
    g = Graph(mod["main"])
    (q,) = [b.value for b in g.bindings if g.call(b.var, "relax.quantize") is not None
            and g.call(b.value.args[0], "relax.nn.max_pool2d") is not None]
    s_out = float(const_array(q.args[1]).reshape(-1)[0])
    assert s_out != s_in and z_out == int(const_array(q.args[2]).reshape(-1)[0])  # the case: the scales differ
    expect = qd.quantize_per_tensor(m, s_out, z_out, int(info.min), int(info.max), tdtype)
    np.testing.assert_array_equal(result, expect.numpy())


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
