"""Coverage on real architectures (issue 4, item 7), asserted on the offload manifest:
torchvision MobileNetV2 (int8, int16, int8 affine) and ResNet-18 (int8, int8 affine) with
random weights, randomized BatchNorm statistics and a few random calibration images,
input 1x3x224x224.

int8 affine (``symmetric_activations=False``): before the kernels padded with the input
zero point (passes/conv.py, deviation (b)) every padded layer with a nonzero one was
declined: ResNet-18 offloaded 3 of 20 convs (19.8 M of 1814 M MACs), MobileNetV2 34 of 35
convs and 0 of 17 depthwise convs (269 M of 301 M MACs). Now the coverage is that of the
symmetric build.

Marked ``slow`` (about 25 s for the five imports): deselect with ``-m 'not slow'``."""

from __future__ import annotations

import pytest
import torch
import torchvision
from qflow import quantize, randomize_bn

from pipeline.backend.manifest import build_manifest
from pipeline.backend.passes.pipeline import run_offload

pytestmark = pytest.mark.slow


def _manifest(builder, **kw):
    torch.manual_seed(0)
    model = randomize_bn(builder())
    gen = torch.Generator().manual_seed(0)
    calib = [torch.randn(1, 3, 224, 224, generator=gen) for _ in range(3)]
    flow = quantize(model, calib[0], calib=calib, **kw)
    mod, log = run_offload(flow.mod)
    return build_manifest(flow.mod, mod, log)


@pytest.fixture(scope="module")
def mobilenet_v2_int8():
    return _manifest(torchvision.models.mobilenet_v2)


@pytest.fixture(scope="module")
def mobilenet_v2_int16():
    return _manifest(torchvision.models.mobilenet_v2, dtype="int16")


@pytest.fixture(scope="module")
def resnet18_int8():
    return _manifest(torchvision.models.resnet18)


@pytest.fixture(scope="module")
def mobilenet_v2_int8_affine():
    return _manifest(torchvision.models.mobilenet_v2, symmetric_activations=False)


@pytest.fixture(scope="module")
def resnet18_int8_affine():
    return _manifest(torchvision.models.resnet18, symmetric_activations=False)


_ZP_PAD_NOTE = "padding reads the input zero point"


def _zero_point_padded(m):
    return [e for e in m["layers"] if _ZP_PAD_NOTE in (e.get("note") or "")]


def _by(manifest, op):
    return [e for e in manifest["layers"] if e["op"] == op]


def _check_mobilenet(m):
    s = m["summary"]
    assert s["by_op"]["conv2d"] == {"layers": 35, "offloaded": 35}
    assert s["by_op"]["depthwise_conv2d"] == {"layers": 17, "offloaded": 17}
    assert s["by_op"]["residual_add"] == {"layers": 10, "offloaded": 10}
    assert s["by_op"]["fc"] == {"layers": 1, "offloaded": 1}
    assert {e["backend"] for e in _by(m, "conv2d") + _by(m, "depthwise_conv2d") + _by(m, "fc")} == {"mmalib"}
    assert {e["backend"] for e in _by(m, "residual_add")} == {"c7x"}
    # The global average pool (imported as mean) is a C7x kernel too: no layer stays scalar.
    assert {e["kernel"] for e in _by(m, "mean")} == {f"c7x_{m['layers'][0]['dtype']}_global_avg_pool"}
    assert [e["op"] for e in m["layers"] if e["backend"] == "scalar"] == []
    assert s["macs_offloaded"] == s["macs_total"] == 300_774_272
    assert s["layers"] == 64 and s["layers_offloaded"] == 64


def test_mobilenet_v2_int8_coverage(mobilenet_v2_int8):
    m = mobilenet_v2_int8
    _check_mobilenet(m)
    (fc,) = _by(m, "fc")
    assert fc["kernel"] == "mmalib_matmul_bias_i8" and "N=1000 padded to 1024" in fc["note"]
    assert {e["kernel"] for e in _by(m, "depthwise_conv2d")} == {"mmalib_depthwise_conv2d_i8"}
    assert {e["dtype"] for e in m["layers"]} == {"int8"}


def test_mobilenet_v2_int16_coverage(mobilenet_v2_int16):
    m = mobilenet_v2_int16
    _check_mobilenet(m)                       # every depthwise of MobileNetV2 is 3x3: all fit i16
    (fc,) = _by(m, "fc")
    assert fc["kernel"] == "mmalib_matmul_bias_i16" and "N=1000 padded to 1008" in fc["note"]
    assert {e["kernel"] for e in _by(m, "conv2d")} == {"mmalib_conv2d_i16"}
    assert {e["kernel"] for e in _by(m, "residual_add")} == {"c7x_int16_residual_add_relu"}
    assert all("widened" in e["note"] for e in _by(m, "conv2d"))   # int8 weights by default
    weighted = _by(m, "conv2d") + _by(m, "depthwise_conv2d") + _by(m, "fc")
    assert all("pre-scaled" in e["note"] for e in weighted)        # ~14-bit requant multiplier


def test_mobilenet_v2_int8_affine_coverage(mobilenet_v2_int8_affine):
    m = mobilenet_v2_int8_affine
    _check_mobilenet(m)
    # The stem conv (input zp != 0 after quantizing the image) and all 17 depthwise convs
    # (input after ReLU6: zp -128) pad; the 1x1 convs do not.
    padded = _zero_point_padded(m)
    assert [e["op"] for e in padded] == ["conv2d"] + ["depthwise_conv2d"] * 17
    assert {e["backend"] for e in padded} == {"mmalib"}


def test_resnet18_int8_affine_coverage(resnet18_int8_affine):
    _check_resnet18(resnet18_int8_affine)
    padded = _zero_point_padded(resnet18_int8_affine)
    assert len(padded) == 17 and {e["op"] for e in padded} == {"conv2d"}   # stem + 16 3x3 convs


def test_resnet18_int8_coverage(resnet18_int8):
    _check_resnet18(resnet18_int8)
    assert _zero_point_padded(resnet18_int8) == []


def _check_resnet18(m):
    s = m["summary"]
    assert s["by_op"]["conv2d"] == {"layers": 20, "offloaded": 20}
    assert s["by_op"]["residual_add"] == {"layers": 8, "offloaded": 8}
    assert s["by_op"]["fc"] == {"layers": 1, "offloaded": 1}
    assert s["by_op"]["max_pool2d"] == {"layers": 1, "offloaded": 1}
    assert {e["activation"] for e in _by(m, "residual_add")} == {"relu"}
    assert {e["kernel"] for e in _by(m, "residual_add")} == {"c7x_int8_residual_add_relu"}
    assert s["macs_offloaded"] == s["macs_total"] == 1_814_073_344
    assert [e["op"] for e in m["layers"] if e["backend"] == "scalar"] == []
    assert {e["kernel"] for e in _by(m, "mean")} == {"c7x_int8_global_avg_pool"}
