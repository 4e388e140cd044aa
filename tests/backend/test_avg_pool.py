"""Average pools: c7x_int{8,16}_global_avg_pool and c7x_int{8,16}_avg_pool (C == numpy
twin == torch's Q/DQ ops bit for bit), torch's float32 summation order, the offload
passes and a pools-only net through codegen equal to torch's Q/DQ model exactly."""

from __future__ import annotations

import json
import shutil
import zlib

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from c_check import compile_and_compare, inputs
from qflow import quantize

from pipeline.backend.kernels import hostlib
from pipeline.backend.kernels import reference as ref
from pipeline.backend.kernels.catalog import KERNELS
from pipeline.backend.manifest import build_manifest
from pipeline.backend.passes.log import OffloadLog
from pipeline.backend.passes.offload_calls import offload_calls
from pipeline.backend.passes.pipeline import run_offload

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the host kernels")
QD = torch.ops.quantized_decomposed
DTYPES = (np.int8, np.int16)
# (C, H, W): MobileNetV2's head (1280 x 7 x 7: more than torch's 32768-element grain,
# so torch splits it over threads), RegNet / MobileNetV3 SE sizes, odd and tiny planes
# (hw < 8 takes torch's scalar path), a plane of 112 x 112 (two cascade levels).
GLOBAL_SHAPES = [(1, 1, 1), (3, 2, 3), (5, 1, 9), (2, 5, 1), (7, 3, 5), (1280, 7, 7),
                 (48, 14, 14), (7, 28, 28), (3, 56, 56), (2, 112, 112), (5, 23, 29)]
# (C, H, W, k, stride, pad, ceil_mode, count_include_pad)
WINDOW_CASES = [(3, 8, 8, 2, 2, 0, False, True),      # DenseNet transition
                (64, 56, 56, 2, 2, 0, False, True),
                (5, 7, 9, 3, 1, 1, False, True),      # Inception branch pool
                (5, 7, 9, 3, 1, 1, False, False),
                (4, 9, 10, 3, 2, 1, True, True),      # ceil mode: last windows overhang
                (4, 9, 10, 3, 2, 1, True, False),
                (2, 5, 5, 2, 3, 1, True, True),
                (6, 13, 11, 5, 2, 2, False, True),
                (3, 4, 6, 4, 1, 0, False, True)]


def _rng(*parts):
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


def _name(dtype) -> str:
    return np.dtype(dtype).name


def _quant(rng, dtype):
    """(in_zp, in_scale, out_zp, out_scale): float32 scales, zero points for int8 only
    (the quantizer's int16 is symmetric), an output scale below and above the input's."""
    s_in = float(np.float32(10 ** rng.uniform(-4, -1)))
    s_out = float(np.float32(s_in * rng.uniform(0.05, 1.5)))
    if dtype == np.int8:
        return int(rng.integers(-30, 30)), s_in, int(rng.integers(-30, 30)), s_out
    return 0, s_in, 0, s_out


def _inv(s: float) -> float:
    return float(np.float32(1.0 / np.float64(s)))


def _torch_dq(x, zp, s, dtype):
    info = np.iinfo(dtype)
    return QD.dequantize_per_tensor(torch.from_numpy(x), s, zp, info.min, info.max, getattr(torch, _name(dtype)))


def _torch_q(v, zp, s, dtype):
    info = np.iinfo(dtype)
    return QD.quantize_per_tensor(v, s, zp, info.min, info.max, getattr(torch, _name(dtype))).numpy()


def _rand(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


def _both(name, x, out_shape, dtype, *args):
    """(C output, numpy output) of kernel ``name``; both must return C7X_OK."""
    outs = [np.full(out_shape, 0x55, dtype) for _ in range(2)]
    assert hostlib.call_kernel(name, x, outs[0], *args) == ref.C7X_OK
    assert KERNELS[name](x, outs[1], *args) == ref.C7X_OK
    return outs


# --------------------------------------------------------------------------- kernels


@needs_gcc
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", GLOBAL_SHAPES, ids=str)
def test_global_avg_pool_c_equals_numpy_equals_torch_qdq(dtype, shape):
    rng = _rng("gap", _name(dtype), shape)
    c, h, w = shape
    x = _rand(rng, dtype, (1, c, h, w))
    for _ in range(3):
        zi, si, zo, so = _quant(rng, dtype)
        out_c, out_py = _both(f"c7x_{_name(dtype)}_global_avg_pool", x, (c,), dtype,
                              c, h * w, zi, si, zo, _inv(so))
        expect = _torch_q(_torch_dq(x, zi, si, dtype).mean((-1, -2), keepdim=True), zo, so, dtype)
        np.testing.assert_array_equal(out_c, out_py)
        np.testing.assert_array_equal(out_c, expect.reshape(-1))


@needs_gcc
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", WINDOW_CASES, ids=str)
def test_avg_pool_c_equals_numpy_equals_torch_qdq(dtype, case):
    c, h, w, k, s, p, ceil_mode, include_pad = case
    rng = _rng("avg", _name(dtype), case)
    x = _rand(rng, dtype, (1, c, h, w))
    for _ in range(3):
        zi, si, zo, so = _quant(rng, dtype)
        pooled = F.avg_pool2d(_torch_dq(x, zi, si, dtype), k, s, p, ceil_mode=ceil_mode,
                              count_include_pad=include_pad)
        expect = _torch_q(pooled, zo, so, dtype)
        ho, wo = expect.shape[2:]
        out_c, out_py = _both(f"c7x_{_name(dtype)}_avg_pool", x, expect.shape, dtype,
                              1, c, h, w, ho, wo, k, k, s, s, p, p, int(include_pad),
                              zi, si, zo, _inv(so))
        np.testing.assert_array_equal(out_c, out_py)
        np.testing.assert_array_equal(out_c, expect)


def test_rectangular_windows_and_strides_equal_torch():
    rng = _rng("rect")
    x = _rand(rng, np.int8, (2, 3, 9, 12))
    pooled = F.avg_pool2d(_torch_dq(x, 4, 0.02, np.int8), (3, 2), (2, 3), (1, 0))
    expect = _torch_q(pooled, -3, 0.011, np.int8)
    out = np.zeros(expect.shape, np.int8)
    assert ref.c7x_int8_avg_pool(x, out, 2, 3, 9, 12, *expect.shape[2:], 3, 2, 2, 3, 1, 0, 1,
                                 4, 0.02, -3, _inv(0.011)) == ref.C7X_OK
    np.testing.assert_array_equal(out, expect)


@pytest.mark.parametrize("n", list(range(1, 80)) + [96, 127, 128, 129, 196, 511, 784, 3136, 12544])
def test_float_sum_order_is_torchs(n):
    """The float32 mean itself, on arbitrary floats of mixed magnitude, is torch's bit for
    bit: torch_order_sum reproduces the order of torch's CPU sum, not just its result
    after quantization."""
    rng = _rng("order", n)
    y = (rng.standard_normal((16, n)) * 10.0 ** rng.uniform(-3, 3, (16, n))).astype(np.float32)
    expect = torch.from_numpy(y.reshape(16, 1, 1, n)).mean((-1, -2)).numpy().reshape(-1)
    got = ref.torch_order_sum(y) / np.float32(n)
    np.testing.assert_array_equal(got.view(np.uint32), expect.view(np.uint32))


def test_order_matters_so_the_order_test_can_fail():
    """A left-to-right float32 sum differs from torch's on these rows: the test above
    distinguishes summation orders."""
    y = (_rng("seq").standard_normal((64, 49)) * 100).astype(np.float32)
    seq = np.zeros(64, np.float32)
    for k in range(49):
        seq = seq + y[:, k]
    assert (seq != ref.torch_order_sum(y)).any()


_PARAM_BAD = [("in_zp", 128), ("out_zp", -129), ("in_scale", 0.0), ("out_inv_scale", float("inf")),
              ("in_scale", float("nan"))]
_BAD = ([("global", k, v) for k, v in _PARAM_BAD + [("hw", 0), ("planes", -1)]]
        + [("window", k, v) for k, v in _PARAM_BAD + [("pH", 2), ("H_out", 9), ("C", 0)]])


@needs_gcc
@pytest.mark.parametrize("kernel,key,value", _BAD, ids=str)
def test_bad_arguments_are_refused_alike_and_leave_out_untouched(kernel, key, value):
    x = np.ones((1, 2, 4, 4), np.int8)
    params = {"in_zp": 0, "in_scale": 0.1, "out_zp": 0, "out_inv_scale": 10.0}
    if kernel == "global":
        name, geo, out_shape = "c7x_int8_global_avg_pool", {"planes": 2, "hw": 16}, (2,)
    else:
        name, out_shape = "c7x_int8_avg_pool", (1, 2, 2, 2)
        geo = dict(N=1, C=2, H_in=4, W_in=4, H_out=2, W_out=2, kH=2, kW=2, sH=2, sW=2, pH=0, pW=0,
                   count_include_pad=1)
    (params if key in params else geo)[key] = value
    status = ref.C7X_ERR_PARAM if key in params else ref.C7X_ERR_SHAPE
    args = [*geo.values(), *params.values()]
    for call in (lambda *a: hostlib.call_kernel(name, *a), KERNELS[name]):
        out = np.full(out_shape, 0x55, np.int8)
        assert call(x, out, *args) == status
        assert (out == 0x55).all()


@needs_gcc
def test_int16_extremes_saturate_alike():
    """Full-range int16 input with a tiny output scale: everything saturates, in C,
    numpy and torch alike; and an output scale so large everything rounds to the zero point."""
    x = np.array([[32767] * 9 + [-32768] * 9], np.int16).reshape(2, 9)
    for so, expect in ((1e-6, [32767, -32768]), (1e6, [0, 0])):
        out_c, out_py = _both("c7x_int16_global_avg_pool", x, (2,), np.int16, 2, 9, 0, 1.0, 0, _inv(so))
        torch_out = _torch_q(_torch_dq(x.reshape(1, 2, 3, 3), 0, 1.0, np.int16).mean((-1, -2)), 0, so, np.int16)
        assert out_c.tolist() == out_py.tolist() == torch_out.reshape(-1).tolist() == expect


# --------------------------------------------------------------------------- passes


class Pools(nn.Module):
    """conv -> relu -> DenseNet / Inception pools -> global pools in every exported form."""

    def __init__(self, include_pad=True, keepdim=True):
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3, 1, 1)
        self.fc = nn.Linear(8, 4)
        self.include_pad, self.keepdim = include_pad, keepdim

    def forward(self, x):
        y = F.relu(self.c(x))
        y = F.avg_pool2d(y, 2, 2)
        y = F.avg_pool2d(y, 3, 1, 1, count_include_pad=self.include_pad)
        y = F.avg_pool2d(y, 3, 2, 1, ceil_mode=True)
        y = y * F.adaptive_avg_pool2d(y, 1)          # SE-style global pool (exported as mean)
        return self.fc(y.mean((2, 3), keepdim=self.keepdim).flatten(1))


class PoolsOnly(nn.Module):
    def forward(self, x):
        y = F.avg_pool2d(x, 2, 2)
        y = F.avg_pool2d(y, 3, 1, 1)
        return F.adaptive_avg_pool2d(y, 1)


def _flow(model, shape=(1, 3, 13, 17), **kw):
    torch.manual_seed(0)
    return quantize(model, torch.randn(*shape), **kw)


@pytest.mark.parametrize("dtype", ["int8", "int16"])
@pytest.mark.parametrize("include_pad,keepdim", [(True, True), (False, False)])
def test_pass_offloads_every_pool_and_the_manifest_lists_them(dtype, include_pad, keepdim):
    flow = _flow(Pools(include_pad, keepdim), dtype=dtype)
    log = OffloadLog()
    mod, _ = run_offload(flow.mod, log)
    calls = [c for c in offload_calls(mod) if "avg_pool" in c.kernel]
    assert sorted(c.kernel for c in calls) == sorted(
        [f"c7x_{dtype}_avg_pool"] * 3 + [f"c7x_{dtype}_global_avg_pool"] * 2)
    windows = [c.scalars for c in calls if c.kernel == f"c7x_{dtype}_avg_pool"]
    # N, C, H_in, W_in, H_out, W_out, kH, kW, sH, sW, pH, pW, count_include_pad, then quantization
    assert sorted(s[:13] for s in windows) == sorted([
        [1, 8, 13, 17, 6, 8, 2, 2, 2, 2, 0, 0, 1],
        [1, 8, 6, 8, 6, 8, 3, 3, 1, 1, 1, 1, int(include_pad)],
        [1, 8, 6, 8, 4, 5, 3, 3, 2, 2, 1, 1, 1]])
    assert sorted(c.scalars[:2] for c in calls if "global" in c.kernel) == [[8, 20], [8, 20]]
    layers = build_manifest(flow.mod, mod, log)["layers"]
    pools = [(e["op"], e["backend"], e["kernel"]) for e in layers if "pool" in e["op"] or e["op"] == "mean"]
    assert [p[1] for p in pools] == ["c7x"] * 5, pools


def test_a_channel_mean_is_not_matched_and_stays_scalar_with_a_reason():
    class ChannelMean(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(3, 4, 1)

        def forward(self, x):
            return self.c(F.relu(x).mean(1, keepdim=True).expand(-1, 3, -1, -1))

    flow = _flow(ChannelMean(), (1, 3, 5, 6))
    log = OffloadLog()
    mod, _ = run_offload(flow.mod, log)
    assert not [c for c in offload_calls(mod) if "avg_pool" in c.kernel]
    (mean,) = [e for e in build_manifest(flow.mod, mod, log)["layers"] if e["op"] == "mean"]
    assert mean["backend"] == "scalar" and "last two axes" in mean["reason"], mean


# --------------------------------------------------------------------------- whole nets


@needs_gcc
@pytest.mark.parametrize("dtype", ["int8", "int16"])
def test_pools_only_net_c_equals_reference_and_torch_qdq_exactly(tmp_path, dtype):
    """Input quantize, three pools, output dequantize: host C == Python reference bit for
    bit, and both equal torch's Q/DQ model exactly (every step is torch's float32)."""
    flow = _flow(PoolsOnly(), (1, 5, 14, 18), dtype=dtype)
    x = inputs((1, 5, 14, 18), n=4, scale=2.0)
    _, out = compile_and_compare(flow.mod, "pools", tmp_path / "c", x, mmalib=True)
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    pools = [e["backend"] for e in manifest["layers"] if "pool" in e["op"] or e["op"] == "mean"]
    assert pools == ["c7x"] * 3, manifest["layers"]
    with torch.no_grad():
        expect = np.concatenate([flow.qdq(torch.from_numpy(x[i:i + 1])).numpy() for i in range(4)])
    np.testing.assert_array_equal(out, expect)


@needs_gcc
@pytest.mark.parametrize("dtype", ["int8", "int16"])
def test_pools_net_with_convs_c_equals_reference(tmp_path, dtype):
    flow = _flow(Pools(), dtype=dtype)
    x = inputs((1, 3, 13, 17), n=3)
    _, out = compile_and_compare(flow.mod, "poolnet", tmp_path / "c", x, mmalib=True)
    with torch.no_grad():
        expect = np.concatenate([flow.qdq(torch.from_numpy(x[i:i + 1])).numpy() for i in range(3)])
    span = float(np.abs(expect).max()) + 1e-6
    assert np.abs(out - expect).max() <= 0.05 * span


@needs_gcc
def test_convnext_head_pool_through_its_identity_reshape_and_layer_scales_leave_no_scalar_call(tmp_path):
    """torchvision's ConvNeXt (stem and first stage, a 10-class head): its global pool exports as
    ``mean`` then an ``as_strided`` to the same shape, which the pool pass looks through; with the
    layer scales on the channel-affine kernel nothing is left to TVM's scalar code."""
    import torchvision
    torch.manual_seed(0)
    model = torchvision.models.convnext_tiny()
    model.features = model.features[:2]
    model.classifier[0] = torchvision.models.convnext.LayerNorm2d(96)
    model.classifier[2] = nn.Linear(96, 10)
    flow = quantize(model.eval(), torch.randn(1, 3, 32, 32))
    log = OffloadLog()
    run_offload(flow.mod, log)
    assert [(d.op, d.status) for d in log.decisions if d.op == "mean"] == [("mean", "offloaded")]
    assert {d.kernel for d in log.decisions if d.op == "multiply"} == {"c7x_int8_channel_affine"}
    summary, _ = compile_and_compare(flow.mod, "cnx", tmp_path / "c", inputs((1, 3, 32, 32), n=1), mmalib=True)
    assert summary["calls_by_backend"]["tvm"] == 0
    assert summary["macs_offloaded"] == summary["macs_total"]
