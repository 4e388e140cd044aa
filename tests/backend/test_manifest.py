"""Offload manifest: one entry per layer in graph order, backends, shapes, MACs,
reasons and notes, summary, JSON determinism, consistency with the module."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
from qflow import ConvReluPool, quantize, randomize_bn

from pipeline.backend.manifest import build_manifest
from pipeline.backend.passes.log import OffloadLog
from pipeline.backend.passes.pipeline import run_offload


def _compile(model, shape, **kw):
    torch.manual_seed(0)
    flow = quantize(randomize_bn(model), torch.randn(*shape), **kw)
    mod, log = run_offload(flow.mod)
    return flow, mod, log


@pytest.fixture(scope="module")
def crp_int8():
    return _compile(ConvReluPool(), (1, 3, 16, 16))


# ConvReluPool at 1x3x16x16: conv3x3 3->32 (+BN+ReLU), maxpool 2, conv1x1 32->32 (+ReLU6),
# global average pool (mean), linear 32->64.
MACS = {"conv1": 32 * 16 * 16 * 3 * 3 * 3, "conv2": 32 * 8 * 8 * 32, "fc": 64 * 32}


def test_layers_in_graph_order_with_shapes_and_macs(crp_int8):
    flow, mod, log = crp_int8
    m = build_manifest(flow.mod, mod, log)
    rows = [(e["op"], e["backend"], e["kernel"], e["activation"], e["macs"]) for e in m["layers"]]
    assert rows == [
        ("conv2d", "mmalib", "mmalib_conv2d_i8", "relu", MACS["conv1"]),
        ("max_pool2d", "c7x", "c7x_int8_max_pool_tidl", None, 0),
        ("conv2d", "mmalib", "mmalib_conv2d_i8", "clip(0, 6)", MACS["conv2"]),
        ("mean", "c7x", "c7x_int8_global_avg_pool", None, 0),
        ("fc", "mmalib", "mmalib_matmul_bias_i8", None, MACS["fc"]),
    ]
    conv1, pool, conv2, mean, fc = m["layers"]
    assert (conv1["input_shape"], conv1["weight_shape"], conv1["output_shape"]) == (
        [1, 3, 16, 16], [32, 3, 3, 3], [1, 32, 16, 16])
    assert (pool["input_shape"], pool["output_shape"]) == ([1, 32, 16, 16], [1, 32, 8, 8])
    assert conv2["weight_shape"] == [32, 32, 1, 1]
    assert (fc["input_shape"], fc["weight_shape"], fc["output_shape"]) == ([1, 32], [64, 32], [1, 64])
    assert "reason" not in mean and "reason" not in conv1 and "float32" in mean["note"]
    assert {e["dtype"] for e in m["layers"]} == {"int8"}
    assert [e["func"] for e in m["layers"] if e["func"]] == [
        "mmalib_conv2d_i8_0", "c7x_int8_max_pool_tidl_0", "mmalib_conv2d_i8_1",
        "c7x_int8_global_avg_pool_0", "mmalib_matmul_bias_i8_0"]


def test_summary(crp_int8):
    flow, mod, log = crp_int8
    s = build_manifest(flow.mod, mod, log)["summary"]
    total = sum(MACS.values())
    assert (s["layers"], s["layers_offloaded"], s["macs_total"], s["macs_offloaded"]) == (5, 5, total, total)
    assert s["by_backend"] == {"mmalib": {"layers": 3, "macs": total}, "c7x": {"layers": 2, "macs": 0},
                               "scalar": {"layers": 0, "macs": 0}}
    assert s["by_op"]["conv2d"] == {"layers": 2, "offloaded": 2}
    assert s["offload_funcs"] == 7 and s["cleanups"] == 1       # the 5 layers + input quantize, output dequantize


def test_json_serialisable_and_deterministic(crp_int8):
    flow, mod, log = crp_int8
    first = json.dumps(build_manifest(flow.mod, mod, log))
    mod2, log2 = run_offload(flow.mod)                 # an independent second run
    assert json.dumps(build_manifest(flow.mod, mod2, log2)) == first


def test_unfused_activations_are_their_own_layers():
    flow, mod, log = _compile(ConvReluPool(), (1, 3, 16, 16), fuse_activations=False)
    m = build_manifest(flow.mod, mod, log)
    assert [(e["op"], e["kernel"]) for e in m["layers"] if e["op"] in ("relu", "clip")] == [
        ("relu", "c7x_int8_relu"), ("clip", "c7x_int8_clamp")]
    assert m["summary"]["layers"] == 7


def test_int16_declines_carry_reasons():
    flow, mod, log = _compile(ConvReluPool(), (1, 3, 16, 16), dtype="int16", fuse_activations=False)
    m = build_manifest(flow.mod, mod, log)
    reasons = {e["op"]: e.get("reason") for e in m["layers"] if e["backend"] == "scalar"}
    assert reasons == {"relu": "only int8 relu has a kernel", "clip": "only int8 clip has a kernel"}
    (pool,) = [e for e in m["layers"] if e["op"] == "max_pool2d"]      # int16 has its max-pool kernel
    assert (pool["backend"], pool["kernel"], pool["dtype"]) == ("c7x", "c7x_int16_max_pool", "int16")
    assert all("widened" in e["note"] for e in m["layers"] if e["op"] in ("conv2d", "fc"))


def test_declined_conv_counts_its_macs_as_scalar():
    class Dilated(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 8, 2, padding=1, dilation=2)

        def forward(self, x):
            return self.conv(x)

    flow, mod, log = _compile(Dilated(), (1, 4, 6, 6))
    (e,) = build_manifest(flow.mod, mod, log)["layers"]
    assert e["backend"] == "scalar" and "dilation [2, 2]" in e["reason"]
    assert e["macs"] == 8 * 6 * 6 * 4 * 2 * 2                 # H_out = (6 + 2 - 3) // 1 + 1 = 6


def test_padded_fc_note():
    flow, mod, log = _compile(nn.Linear(32, 40), (1, 32))
    (e,) = build_manifest(flow.mod, mod, log)["layers"]
    assert e["op"] == "fc" and e["backend"] == "mmalib" and "N=40 padded to 64" in e["note"]
    assert e["output_shape"] == [1, 40] and e["macs"] == 40 * 32


def test_log_and_module_must_agree(crp_int8):
    flow, mod, log = crp_int8
    with pytest.raises(ValueError, match="not an offload PrimFunc"):
        build_manifest(flow.mod, flow.mod, log)          # mod_after without the PrimFuncs
    # Without a log every layer is scalar, with a reason.
    m = build_manifest(flow.mod, flow.mod, OffloadLog())
    assert {e["backend"] for e in m["layers"]} == {"scalar"} and all(e["reason"] for e in m["layers"])
