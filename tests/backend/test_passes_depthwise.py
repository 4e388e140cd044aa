"""Depthwise conv2d offload, int8 and int16: rewrite, flat weight, extern scalars, declines."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
from qflow import quantize, randomize_bn

from pipeline.backend.passes.graph import Graph, const_array
from pipeline.backend.passes.depthwise import offload_depthwise_conv2d_i8, offload_depthwise_conv2d_i16
from pipeline.backend.passes.log import OffloadLog
from pipeline.backend.passes.offload_calls import offload_calls


class DW(nn.Module):
    """Depthwise conv (+BN +ReLU6), ``mult`` output channels per input channel."""

    def __init__(self, c=16, k=3, stride=1, mult=1):
        super().__init__()
        self.conv = nn.Conv2d(c, c * mult, k, stride, k // 2, groups=c, bias=False)
        self.bn = nn.BatchNorm2d(c * mult)

    def forward(self, x):
        return nn.functional.relu6(self.bn(self.conv(x)))


def _flow(k=3, stride=1, mult=1, **kw):
    torch.manual_seed(0)
    return quantize(randomize_bn(DW(k=k, stride=stride, mult=mult)), torch.randn(1, 16, 12, 12), **kw)


def _weight(mod):
    g = Graph(mod["main"])
    conv = next(b.value for b in g.bindings if g.call(b.var, "relax.nn.conv2d") is not None)
    return const_array(g.call(conv.args[1], "relax.dequantize").args[0])


@pytest.mark.parametrize("k,stride", [(3, 1), (3, 2), (5, 2), (7, 1)])
def test_depthwise_i8(k, stride):
    flow = _flow(k, stride)
    log = OffloadLog()
    mod = offload_depthwise_conv2d_i8(flow.mod, log)
    (call,) = offload_calls(mod)
    assert call.kernel == call.extern_name == "mmalib_depthwise_conv2d_i8"
    assert call.buffer_args == [0, 1, 2, 3, 4, 5]
    assert [str(p.dtype) for p in call.prim.params] == ["int8", "int8", "int32", "uint8", "uint8", "int8"]
    # W [C*KH*KW] in natural (C, KH, KW) order.
    np.testing.assert_array_equal(call.const(1), _weight(flow.mod).reshape(-1))
    p = k // 2
    h_out = (12 + 2 * p - k) // stride + 1
    assert tuple(int(d) for d in call.prim.params[5].shape) == (1, 16, h_out, h_out)
    # C, H_in, W_in, KH, KW, sh, sw, pt, pb, pl, pr, num_groups = C
    assert call.scalars[:-2] == [16, 12, 12, k, k, stride, stride, p, p, p, p, 16, 0]   # pad value: zp 0
    assert [(d.op, d.status) for d in log.decisions] == [("depthwise_conv2d", "offloaded")]


@pytest.mark.parametrize("k,stride,mult,why", [
    (3, 3, 1, "stride 3"),
    (7, 2, 1, "stride 2 only for kernels <= 5"),
    (4, 1, 1, "kernel 4x4"),
    (3, 1, 2, "channel multiplier 2"),
])
def test_depthwise_i8_declines(k, stride, mult, why):
    flow = _flow(k, stride, mult)
    log = OffloadLog()
    mod = offload_depthwise_conv2d_i8(flow.mod, log)
    assert offload_calls(mod) == []
    (decision,) = log.decisions
    assert decision.status == "declined" and why in decision.reason


@pytest.mark.parametrize("weight_dtype", ["int16", None])
def test_depthwise_i16_3x3(weight_dtype):
    flow = _flow(3, 2, dtype="int16", weight_dtype=weight_dtype)
    mod = offload_depthwise_conv2d_i16(flow.mod)
    (call,) = offload_calls(mod)
    assert call.kernel == "mmalib_depthwise_conv2d_i16"
    assert [str(p.dtype) for p in call.prim.params] == ["int16", "int16", "int64", "uint8", "uint8", "int16"]
    w = _weight(flow.mod).astype(np.int64).reshape(16, 9)
    w2 = call.const(1).astype(np.int64).reshape(16, 9)
    k = np.array([w2[c][w[c] != 0][0] // w[c][w[c] != 0][0] for c in range(16)])
    # Full-range int16 weights pass as they are; int8 ones are widened and pre-scaled by k[c].
    assert (k.max() == 1) == (weight_dtype == "int16") and np.all((k >= 1) & (k <= 256))
    np.testing.assert_array_equal(w2, w * k[:, None])
    assert np.all(np.abs(w2) <= 32768)


def test_depthwise_i8_asymmetric_padded_input_pads_with_its_zero_point():
    flow = _flow(3, 2, symmetric_activations=False)
    log = OffloadLog()
    mod = offload_depthwise_conv2d_i8(flow.mod, log)
    (call,) = offload_calls(mod)
    g0 = Graph(flow.mod["main"])
    conv = next(b.value for b in g0.bindings if g0.call(b.var, "relax.nn.conv2d") is not None)
    d_zp = int(const_array(g0.call(conv.args[0], "relax.dequantize").args[2]))
    assert d_zp != 0
    assert Graph(mod["main"]).call(call.args[0], "relax.nn.pad") is None      # no pass of its own
    assert call.scalars[:-2] == [16, 12, 12, 3, 3, 2, 2, 1, 1, 1, 1, 16, d_zp]  # the kernel pads with d_zp
    assert tuple(int(d) for d in call.prim.params[5].shape) == (1, 16, 6, 6)
    (decision,) = log.decisions
    assert decision.status == "offloaded" and f"padding reads the input zero point {d_zp}" in decision.note


def test_depthwise_i16_declines_5x5():
    log = OffloadLog()
    mod = offload_depthwise_conv2d_i16(_flow(5, 1, dtype="int16").mod, log)
    assert offload_calls(mod) == []
    assert "supported: square 3" in log.decisions[0].reason
