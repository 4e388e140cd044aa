"""End to end on the small nets of tests/qflow.py: the MMALIB build (compile_model, then the
Python integer reference; the host C where gcc exists) against torch's Q/DQ model, for two
rules of the offload passes:

- int16 activations with int8 weights: the widened weights are pre-scaled per channel
  (pipeline.backend.fold, "pre-scaling"), so the requantization multiplier has ~14 bits
  instead of 7. Measured (4 inputs, seed 6): max 2-8 / mean 0.16-1.24 LSB; without the
  pre-scale 39-289 / 5-60 LSB (the scalar build: <= 1).
- int8 affine activations (symmetric_activations=False): padded convs / depthwise convs are
  offloaded with the input zero point as the kernel's pad value (passes/conv.py,
  deviation (b)). Measured: max 1-3 / mean 0.05-0.4 LSB, the same as the symmetric int8
  MMALIB build of the same nets (the 7-bit scale); raw-0 padding is off by tens of LSB.

C == Python reference for every other (net, dtype) pair is in test_host.py.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from qflow import ConvReluPool, InvertedResidual, ResidualBlock, quantize, randomize_bn

from pipeline.backend.compile import compile_model
from pipeline.backend.interp import run_reference

NETS = {"crp": (ConvReluPool, (1, 3, 16, 16)), "res": (ResidualBlock, (1, 32, 8, 8)),
        "inv": (lambda: InvertedResidual(stride=2, cout=48), (1, 32, 8, 8))}
QUANT = {"i16": {"dtype": "int16"}, "i8asym": {"dtype": "int8", "symmetric_activations": False}}
WEIGHTED = ("conv2d", "depthwise_conv2d", "fc")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(net, quant) -> (flow, input shape, MMALIB codegen dir, manifest)."""
    cache = {}

    def get(net, quant):
        if (net, quant) not in cache:
            make, shape = NETS[net]
            torch.manual_seed(0)
            flow = quantize(randomize_bn(make()), torch.randn(*shape), **QUANT[quant])
            out = tmp_path_factory.mktemp(f"{net}_{quant}")
            compile_model(flow.mod, net, out, mmalib=True)
            cache[(net, quant)] = (flow, shape, out, json.loads((out / "manifest.json").read_text()))
        return cache[(net, quant)]
    return get


def _inputs(shape, n=4, seed=6):
    return (np.random.default_rng(seed).standard_normal((n, *shape[1:])) * 1.5).astype(np.float32)


def _lsb_vs_torch(flow, out, x):
    """|ours - torch| in output LSB, ours from the Python integer reference of the build."""
    ours = run_reference(out, x)
    with torch.no_grad():
        ref = np.concatenate([flow.qdq(torch.from_numpy(x[i:i + 1])).numpy() for i in range(len(x))])
    scale = [n.args[1] for n in flow.ep.graph.nodes if "dequantize_per_tensor" in str(n.target)][-1]
    return np.abs(np.rint(ours.astype(np.float64) / scale) - np.rint(ref.astype(np.float64) / scale))


@pytest.mark.parametrize("net", sorted(NETS))
def test_int16_mmalib_build_is_within_a_few_lsb_of_torch(built, net):
    flow, shape, out, manifest = built(net, "i16")
    weighted = [e for e in manifest["layers"] if e["op"] in WEIGHTED]
    assert weighted and all(e["backend"] == "mmalib" and "pre-scaled" in e["note"] for e in weighted)
    lsb = _lsb_vs_torch(flow, out, _inputs(shape))
    assert lsb.max() <= 10 and lsb.mean() <= 1.5, (lsb.max(), lsb.mean())


def _nonzero_input_zero_points(flow) -> int:
    gm = flow.ep.graph
    return sum(1 for n in gm.nodes if "dequantize_per_tensor" in str(n.target) and int(n.args[2]) != 0)


@pytest.mark.parametrize("net", ["inv", "res"])
def test_asymmetric_int8_padded_layers_are_offloaded_and_exact(built, net):
    flow, shape, out, manifest = built(net, "i8asym")
    assert _nonzero_input_zero_points(flow) > 0
    convs = [e for e in manifest["layers"] if e["op"] in ("conv2d", "depthwise_conv2d")]
    assert convs and all(e["backend"] == "mmalib" for e in convs), [e.get("reason") for e in convs]
    padded = [e for e in convs if "padding reads the input zero point" in (e.get("note") or "")]
    assert padded                                       # the layers that used to be declined
    lsb = _lsb_vs_torch(flow, out, _inputs(shape))
    assert lsb.max() <= 3 and lsb.mean() <= 0.5, (lsb.max(), lsb.mean())


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
@pytest.mark.parametrize("net,quant", [("inv", "i8asym"), ("inv", "i16")])
def test_c_equals_reference_bit_for_bit(built, net, quant, tmp_path):
    from pipeline.backend.host import build_host, run_host

    flow, shape, out, _ = built(net, quant)
    build_host(out, tmp_path / "model.exe")
    x = _inputs(shape, n=3, seed=5)
    c, ref = run_host(tmp_path / "model.exe", out, x), run_reference(out, x)
    np.testing.assert_array_equal(c.view(np.uint32), ref.view(np.uint32))
