"""run_offload: pass order, determinism, input left alone, what remains in main."""

from __future__ import annotations

import torch
import tvm
from qflow import ConvReluPool, InvertedResidual, ResidualBlock, quantize, randomize_bn
from tvm import relax

from pipeline.backend.passes.graph import Graph, const_array
from pipeline.backend.passes.log import OffloadLog
from pipeline.backend.passes.offload_calls import layer_calls, offload_calls
from pipeline.backend.passes.pipeline import run_offload

ORDER = ["conv2d_i8", "depthwise_conv2d_i8", "fc_i8", "residual_add_i8", "conv2d_i16", "fc_i16",
         "residual_add_i16", "depthwise_conv2d_i16", "max_pool2d_i8", "relu_i8", "global_avg_pool",
         "avg_pool2d", "qdq_transparent", "qdq_pair", "quantize", "dequantize"]


def _flow(model, shape, **kw):
    torch.manual_seed(0)
    return quantize(randomize_bn(model), torch.randn(*shape), **kw)


def _ops(mod):
    g = Graph(mod["main"])
    return [b.value.op.name for b in g.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]


def test_passes_run_in_the_reference_order():
    flow = _flow(ConvReluPool(), (1, 3, 16, 16), fuse_activations=False)
    log = OffloadLog()
    _, returned = run_offload(flow.mod, log)
    assert returned is log
    seen = [d.pass_name for d in log.decisions]
    assert set(seen) == {"conv2d_i8", "fc_i8", "max_pool2d_i8", "relu_i8", "global_avg_pool",
                         "qdq_transparent", "quantize", "dequantize"}
    assert seen == sorted(seen, key=ORDER.index)


def test_deterministic_and_input_untouched():
    flow = _flow(InvertedResidual(), (1, 32, 8, 8))
    before = flow.mod.script(show_meta=False)
    a, log_a = run_offload(flow.mod)
    b, log_b = run_offload(flow.mod)
    tvm.ir.assert_structural_equal(a, b)
    assert a.script(show_meta=False) == b.script(show_meta=False)
    assert log_a.to_json() == log_b.to_json()
    assert flow.mod.script(show_meta=False) == before


def test_fully_offloaded_block_keeps_only_integer_glue():
    flow = _flow(ResidualBlock(), (1, 32, 8, 8))
    mod, _ = run_offload(flow.mod)
    # Input quantize, kernels (fused ReLUs are their saturation range), output dequantize, all
    # C7x kernels: no float conv, no clip, no dequantized weight, no scalar pass left (the int8
    # constants live only in the call_tir arguments).
    assert set(_ops(mod)) == {"relax.call_tir"}
    every = offload_calls(mod)
    assert (every[0].kernel, every[-1].kernel) == ("c7x_quantize_f32_i8", "c7x_dequantize_i8_f32")
    calls = layer_calls(mod)
    assert [c.kernel for c in calls] == ["mmalib_conv2d_i8", "mmalib_conv2d_i8", "c7x_int8_residual_add_relu",
                                         "mmalib_conv2d_i8"]
    # The two stride-1 3x3 convs differ only in their saturation range (the first has the
    # block's inner ReLU, the second none: the ReLU after the add is the residual kernel's),
    # so each gets its PrimFunc; identical PrimFuncs would be shared.
    assert [c.func for c in calls] == ["mmalib_conv2d_i8_0", "mmalib_conv2d_i8_1",
                                       "c7x_int8_residual_add_relu_0", "mmalib_conv2d_i8_2"]
    assert calls[0].scalars[:-2] == calls[1].scalars[:-2] and calls[0].scalars[-2:] != calls[1].scalars[-2:]
    weights = [c.const(1) for c in calls if c.kernel.startswith("mmalib")]
    assert all(str(w.dtype) == "int8" for w in weights)
    assert sorted(gv.name_hint for gv in mod.functions) == [
        "c7x_dequantize_i8_f32_0", "c7x_int8_residual_add_relu_0", "c7x_quantize_f32_i8_0", "main",
        "mmalib_conv2d_i8_0", "mmalib_conv2d_i8_1", "mmalib_conv2d_i8_2"]
    assert const_array(calls[0].args[1]) is not None and const_array(calls[0].args[0]) is None
