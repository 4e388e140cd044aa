"""Channel affine: c7x_int{8,16}_channel_affine (an unfolded BatchNorm + optional ReLU as a
per-channel scale/shift requantize; C == numpy twin == torch's Q/DQ ops bit for bit), the
exact float32 fused multiply-add it relies on, torch's batch_norm arithmetic, the offload
pass (both Q/DQ forms, concat parts, refusals) and DenseNet-like nets through codegen."""

from __future__ import annotations

import functools
import shutil
import subprocess
import zlib
from fractions import Fraction
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from c_check import compile_and_compare, inputs
from qflow import quantize, randomize_bn

from pipeline.backend.kernels import hostlib
from pipeline.backend.kernels import reference as ref
from pipeline.backend.kernels.catalog import KERNELS
from pipeline.backend.manifest import build_manifest
from pipeline.backend.passes.channel_affine import offload_channel_affine
from pipeline.backend.passes.log import OffloadLog
from pipeline.backend.passes.offload_calls import offload_calls
from pipeline.backend.passes.pipeline import run_offload

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the host kernels")
# torch's AVX2 / AVX512 batch_norm contracts x * alpha + beta into an FMA; its DEFAULT
# build (no AVX2) rounds twice, and the kernel then differs from it (module docstring of
# passes/channel_affine.py, docs/reference.md "Channel affine").
FUSED_TORCH = torch.backends.cpu.get_cpu_capability() != "DEFAULT"
needs_fused_torch = pytest.mark.skipif(not FUSED_TORCH, reason="torch's DEFAULT CPU build rounds "
                                       "batch_norm's multiply and add separately")
QD = torch.ops.quantized_decomposed
DTYPES = (np.int8, np.int16)
# (N, channels of each concat part, H, W): DenseNet sizes (64 + 32 at 56x56, a 7x7 plane of
# many parts), odd and tiny planes (hw < 8 and 1x1: torch's vector tail only), a batch of 2.
SHAPES = [(1, (1,), 1, 1), (1, (3,), 5, 7), (1, (5, 2), 3, 3), (2, (4, 3), 1, 9),
          (1, (64, 32), 56, 56), (1, (7, 5, 3, 2), 7, 7), (1, (13,), 2, 3)]


def _rng(*parts):
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


def _name(dtype) -> str:
    return np.dtype(dtype).name


def _inv(s: float) -> float:
    return float(np.float32(1.0 / np.float64(s)))


def _tdtype(dtype):
    return getattr(torch, _name(dtype))


def _dq(x, zp, s, dtype):
    info = np.iinfo(dtype)
    return QD.dequantize_per_tensor(torch.from_numpy(x), s, zp, info.min, info.max, _tdtype(dtype))


def _q(v, zp, s, dtype):
    info = np.iinfo(dtype)
    return QD.quantize_per_tensor(v, s, zp, info.min, info.max, _tdtype(dtype))


def _rand(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


def _bn_stats(rng, c):
    """float32 weight, bias, running mean, running var of one BatchNorm2d [c]."""
    f = lambda a: a.astype(np.float32)  # noqa: E731
    return (f(rng.uniform(0.2, 2.0, c) * rng.choice([-1, 1], c)), f(rng.standard_normal(c) * 0.5),
            f(rng.standard_normal(c) * 0.5), f(rng.uniform(0.01, 3.0, c)))


def _zs(rng, dtype):
    """A zero point and a float32 scale (int16: symmetric, the quantizer's)."""
    z = int(rng.integers(-20, 20)) if dtype == np.int8 else 0
    return z, float(np.float32(10 ** rng.uniform(-3, -1) * (1 if dtype == np.int8 else 1 / 256)))


def _case(rng, dtype, n, parts, h, w):
    """Integer parts with their own quantization, the batch_norm, the mid / out quantizations
    (scales fitted to the float range, as a calibration would, times 0.5..1.2)."""
    xs = [_rand(rng, dtype, (n, c, h, w)) for c in parts]
    qs = [_zs(rng, dtype) for _ in parts]
    stats = _bn_stats(rng, sum(parts))
    weight, bias, mean, var = (v.astype(np.float64)[:, None, None] for v in stats)
    d = np.concatenate([(x.astype(np.float64) - z) * s for x, (z, s) in zip(xs, qs)], axis=1)
    y = (d - mean) / np.sqrt(var + 1e-5) * weight + bias
    qmax = np.iinfo(dtype).max

    def fitted(r):
        z = int(rng.integers(-10, 10)) if dtype == np.int8 else 0
        return z, float(np.float32(max(r, 1e-3) / qmax * rng.uniform(0.5, 1.2)))

    return xs, qs, stats, fitted(np.abs(y).max()), fitted(y.max())


def _torch_qdq(xs, qs, stats, mid, out, dtype, form):
    """torch's Q/DQ ops: q(bn(cat(dq(parts)))) [form "q"], q(relu(bn(...))) ["relu"],
    q_o(relu(dq(q_m(bn(...))))) ["q_relu_q"]."""
    weight, bias, mean, var = (torch.from_numpy(a) for a in stats)
    cat = torch.cat([_dq(x, z, s, dtype) for x, (z, s) in zip(xs, qs)], 1)
    y = F.batch_norm(cat, mean, var, weight, bias, False, 0.1, 1e-5)
    if form == "q":
        return _q(y, *mid, dtype).numpy()
    if form == "relu":
        return _q(torch.relu(y), *mid, dtype).numpy()
    t = _q(y, *mid, dtype)
    return _q(torch.relu(_dq(t.numpy(), *mid, dtype)), *out, dtype).numpy()


def _kernel_args(xs, qs, stats, mid, out, dtype, form):
    """(in, params, out buffer, scalars) of the kernel call the pass emits for ``form``."""
    x = np.concatenate(xs, axis=1)
    n, c = x.shape[:2]
    zps = np.concatenate([[z] * xi.shape[1] for xi, (z, _) in zip(xs, qs)])
    scales = np.concatenate([[s] * xi.shape[1] for xi, (_, s) in zip(xs, qs)]).astype(np.float32)
    alpha, beta = ref.batch_norm_affine(*stats, 1e-5)
    params = ref.channel_affine_params(zps, scales, alpha, beta)
    o = out if form == "q_relu_q" else mid
    scalars = [n, c, x[0, 0].size, mid[0], mid[1], _inv(mid[1]), int(form != "q"), o[0], _inv(o[1])]
    return x, params, np.full(x.shape, 0x55, dtype), scalars


# --------------------------------------------------------------------------- kernels


@needs_gcc
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("form", ["q", "relu", "q_relu_q"])
def test_kernel_c_equals_numpy_equals_torch_qdq(dtype, shape, form):
    n, parts, h, w = shape
    rng = _rng("affine", _name(dtype), shape, form)
    inside = []
    for _ in range(2):
        xs, qs, stats, mid, out = _case(rng, dtype, n, parts, h, w)
        x, params, buf, scalars = _kernel_args(xs, qs, stats, mid, out, dtype, form)
        name = f"c7x_{_name(dtype)}_channel_affine"
        out_c, out_py = buf.copy(), buf.copy()
        assert hostlib.call_kernel(name, x, params, out_c, *scalars) == ref.C7X_OK
        assert KERNELS[name](x, params, out_py, *scalars) == ref.C7X_OK
        np.testing.assert_array_equal(out_c, out_py)
        if FUSED_TORCH:
            np.testing.assert_array_equal(out_c, _torch_qdq(xs, qs, stats, mid, out, dtype, form))
        info = np.iinfo(dtype)
        inside.append(((out_c > info.min) & (out_c < info.max)).mean())
    if n * sum(parts) * h * w > 20:
        assert np.mean(inside) > 0.3    # the values are not all saturated


def _exact_fma(x: float, a: float, b: float) -> np.float32:
    """float32(x * a + b) from exact rationals, rounded to nearest even by hand."""
    v = Fraction(x) * Fraction(a) + Fraction(b)
    lo = np.float32(float(v))                       # within one float32 step of v
    cands = sorted({np.nextafter(lo, np.float32(-np.inf)), lo, np.nextafter(lo, np.float32(np.inf))},
                   key=lambda c: (abs(Fraction(float(c)) - v), int(np.array(c).view(np.uint32)) & 1))
    return cands[0]


# float32 (x, a, b) where rounding the double sum to float32 is wrong: x * a + b lies just
# off a float32 midpoint, within half a double ulp of it.
_ONE_UP, _ONE_DOWN = float(np.float32(1 + 2**-23)), float(np.float32(1 - 2**-23))
HARD_FMA = [(_ONE_UP, _ONE_DOWN, 2.0**24 + 2), (_ONE_UP, _ONE_DOWN, -(2.0**24 + 2)),
            (-_ONE_UP, _ONE_DOWN, 2.0**24 + 2), (_ONE_UP, 2 * _ONE_DOWN, 2.0**25 + 4)]


def test_fma_f32_is_exactly_rounded():
    rng = _rng("fma")
    x, a, b = (np.float32(rng.standard_normal(3000) * 10.0 ** rng.uniform(-4, 4, 3000)) for _ in range(3))
    b[:1000] = np.float32(-(x[:1000].astype(np.float64) * a[:1000]))   # heavy cancellation
    hard = np.array(HARD_FMA, np.float32).T
    x, a, b = (np.concatenate([v, h]) for v, h in zip((x, a, b), hard))
    got = ref.fma_f32(x, a, b)
    expect = np.array([_exact_fma(float(u), float(v), float(w)) for u, v, w in zip(x, a, b)], np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), expect.view(np.uint32))
    # the hard cases defeat the plain double-then-float rounding, so this test can fail
    naive = (hard[0].astype(np.float64) * hard[1] + hard[2]).astype(np.float32)
    assert (naive != got[-len(HARD_FMA):]).all()


_FMA_HARNESS = r"""
#include <stdio.h>
#include <string.h>
#include "c7x_kernels_ref.c"
int main(void)
{
    float x, a, b, r;
    unsigned int u;
    while (scanf("%a %a %a", &x, &a, &b) == 3) {
        r = fma_f32(x, a, b);
        memcpy(&u, &r, sizeof u);
        printf("%08x\n", u);
    }
    return 0;
}
"""


@needs_gcc
def test_c_fma_f32_equals_the_twin(tmp_path):
    """The C's static fma_f32 (the harness includes c7x_kernels_ref.c) on the hard cases and
    on random triples, bit for bit with reference.fma_f32 (itself checked exactly above)."""
    src = tmp_path / "fma.c"
    src.write_text(_FMA_HARNESS)
    exe = tmp_path / "fma"
    done = subprocess.run(["gcc", *hostlib.WARNING_FLAGS[:1], "-O2", "-ffp-contract=off", "-I",
                           str(hostlib.kernel_source_dir()), str(src), "-o", str(exe)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rng = _rng("cfma")
    x, a, b = (np.float32(rng.standard_normal(2000) * 10.0 ** rng.uniform(-4, 4, 2000)) for _ in range(3))
    b[:700] = np.float32(-(x[:700].astype(np.float64) * a[:700]))
    hard = np.array(HARD_FMA, np.float32).T
    x, a, b = (np.concatenate([v, h]) for v, h in zip((x, a, b), hard))
    text = "".join(f"{float(u).hex()} {float(v).hex()} {float(w).hex()}\n" for u, v, w in zip(x, a, b))
    run = subprocess.run([str(exe)], input=text, capture_output=True, text=True, check=True)
    got = np.array([int(t, 16) for t in run.stdout.split()], np.uint32)
    np.testing.assert_array_equal(got, ref.fma_f32(x, a, b).view(np.uint32))


@needs_fused_torch
@pytest.mark.parametrize("shape", [(1, 5, 1, 1), (1, 12, 7, 9), (2, 64, 56, 56), (1, 256, 14, 14),
                                   (1, 3, 1, 3), (3, 7)], ids=str)
def test_batch_norm_affine_is_torchs_float32_batch_norm(shape):
    """alpha, beta and the fused x * alpha + beta reproduce torch's CPU batch_norm bit for
    bit on arbitrary floats (before any quantization), while the twice-rounded formula and
    TVM's (x - mean) / sqrt(var + eps) * gamma + beta do not."""
    rng = _rng("bn", shape)
    c = shape[1]
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    stats = _bn_stats(rng, c)
    weight, bias, mean, var = (torch.from_numpy(a) for a in stats)
    expect = F.batch_norm(torch.from_numpy(x), mean, var, weight, bias, False, 0.1, 1e-5).numpy()
    alpha, beta = ref.batch_norm_affine(*stats, 1e-5)
    per_c = (slice(None),) + (None,) * (len(shape) - 2)
    got = ref.fma_f32(x, alpha[per_c], beta[per_c])
    np.testing.assert_array_equal(got.view(np.uint32), expect.view(np.uint32))
    if x.size > 100:
        assert (x * alpha[per_c] + beta[per_c] != expect).any()


_PARAM_BAD = [("mid_zp", 128), ("out_zp", -129), ("mid_scale", 0.0), ("mid_inv_scale", float("inf")),
              ("out_inv_scale", float("nan"))]
_BLOB_BAD = [("zp", 300), ("scale", 0.0), ("scale", float("nan")), ("alpha", float("inf")),
             ("beta", 2.0**41), ("alpha", -(2.0**41))]


@needs_gcc
@pytest.mark.parametrize("key,value", _PARAM_BAD + _BLOB_BAD + [("C", 0), ("hw", -1), ("N", 0)], ids=str)
def test_bad_arguments_are_refused_alike_and_leave_out_untouched(key, value):
    x = np.ones((1, 2, 4), np.int8)
    blob = {"zp": np.array([0, 1]), "scale": np.float32([0.1, 0.2]), "alpha": np.float32([1, 2]),
            "beta": np.float32([0, 1])}
    scalars = {"N": 1, "C": 2, "hw": 4, "mid_zp": 0, "mid_scale": 0.1, "mid_inv_scale": 10.0,
               "has_relu": 1, "out_zp": 0, "out_inv_scale": 10.0}
    if key in blob:
        blob[key] = blob[key].copy()
        blob[key][1] = value
        status = ref.C7X_ERR_PARAM
    else:
        scalars[key] = value
        status = ref.C7X_ERR_SHAPE if key in ("N", "C", "hw") else ref.C7X_ERR_PARAM
    params = ref.channel_affine_params(blob["zp"], blob["scale"], blob["alpha"], blob["beta"])
    for call in (lambda *a: hostlib.call_kernel("c7x_int8_channel_affine", *a), ref.c7x_int8_channel_affine):
        out = np.full((1, 2, 4), 0x55, np.int8)
        assert call(x, params, out, *scalars.values()) == status
        assert (out == 0x55).all()


def test_params_blob_layout():
    blob = ref.channel_affine_params(np.array([-3, 7]), np.float32([0.5, 0.25]), np.float32([1.5, -2.0]),
                                     np.float32([0.125, 3.0]))
    assert blob.dtype == np.uint8 and blob.shape == (32,)
    assert blob[:4].view("<i4")[0] == -3 and blob[16:20].view("<i4")[0] == 7
    assert blob[4:16].view("<f4").tolist() == [0.5, 1.5, 0.125]
    assert blob[20:32].view("<f4").tolist() == [0.25, -2.0, 3.0]


# --------------------------------------------------------------------------- pass


class Dense(nn.Module):
    """DenseNet in miniature: a dense layer's BN -> ReLU on a one-part concat, then on a
    two-part concat of differently quantized features, each before a conv."""

    def __init__(self, inplace=True):
        super().__init__()
        self.c0, self.c1, self.c2 = nn.Conv2d(3, 8, 3, 1, 1), nn.Conv2d(8, 5, 3, 1, 1), nn.Conv2d(13, 6, 1)
        self.bn0, self.bn1 = nn.BatchNorm2d(8), nn.BatchNorm2d(13)
        self.inplace = inplace

    def forward(self, x):
        a = self.c0(x)
        b = self.c1(F.relu(self.bn0(torch.cat([a], 1)), inplace=self.inplace))
        return self.c2(F.relu(self.bn1(torch.cat([a, b], 1)), inplace=self.inplace))


class DenseOnly(nn.Module):
    """Only exact ops: two differently quantized parts (a max pool, sharing the input's
    quantization, and an average pool, with its own), concat, BN, ReLU; the compiled net
    must equal torch's Q/DQ model bit for bit."""

    def __init__(self, inplace=True):
        super().__init__()
        self.bn = nn.BatchNorm2d(6)
        self.inplace = inplace

    def forward(self, x):
        y = torch.cat([F.max_pool2d(x, 3, 1, 1), F.avg_pool2d(x, 3, 1, 1)], 1)
        return F.relu(self.bn(y), inplace=self.inplace)


class SharedBN(nn.Module):
    """The BN result feeds the ReLU and a second conv: the ReLU cannot be fused."""

    def __init__(self):
        super().__init__()
        self.c0, self.c1, self.c2 = nn.Conv2d(3, 8, 3, 1, 1), nn.Conv2d(8, 4, 1), nn.Conv2d(8, 4, 1)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        y = self.bn(torch.cat([self.c0(x)], 1))
        return self.c1(F.relu(y)) + self.c2(y)


def _flow(model, shape=(1, 3, 7, 9), randomize=True, **kw):
    """The Q/DQ flow of ``model`` (BN statistics randomized). convert_pt2e's QAT conv-BN
    fold is skipped: with a BatchNorm left in the graph it exports ~100 pattern graphs
    (a minute per net), and it can only rewrite a BN right after a conv, which these nets
    do not have (theirs follow a concat; a conv's BN is folded by prepare_pt2e already)."""
    torch.manual_seed(0)
    with mock.patch("torchao.quantization.pt2e.quantize_pt2e._fold_conv_bn_qat", lambda m: m):
        return quantize(randomize_bn(model) if randomize else model, torch.randn(*shape), **kw)


@functools.lru_cache(maxsize=None)
def _dense_flow(dtype: str, inplace: bool):
    """The Dense net's flow, shared by the pass and codegen tests (export is the slow part)."""
    return _flow(Dense(inplace), dtype=dtype)


@pytest.mark.parametrize("dtype", ["int8", "int16"])
@pytest.mark.parametrize("inplace", [True, False], ids=["one_quantize", "two_quantizes"])
def test_pass_offloads_both_forms_with_their_relu(dtype, inplace):
    flow = _dense_flow(dtype, inplace)
    log = OffloadLog()
    mod, _ = run_offload(flow.mod, log)
    calls = [c for c in offload_calls(mod) if "channel_affine" in c.kernel]
    assert [c.kernel for c in calls] == [f"c7x_{dtype}_channel_affine"] * 2
    # N, C, hw, then mid_zp, mid_scale, mid_inv_scale, has_relu (fused), out_zp, out_inv_scale
    assert [c.scalars[:3] + [c.scalars[6]] for c in calls] == [[1, 8, 63, 1], [1, 13, 63, 1]]
    assert [tuple(int(d) for d in p.shape) for p in calls[1].prim.params] == [(1, 13, 7, 9), (13 * 16,),
                                                                              (1, 13, 7, 9)]
    text = mod["main"].script()
    assert text.count("R.concat(") == 1 and "R.nn.batch_norm" not in text and "R.nn.relu" not in text
    layers = build_manifest(flow.mod, mod, log)["layers"]
    assert [(e["op"], e["backend"]) for e in layers if e["op"] in ("batch_norm", "relu")] == [
        ("batch_norm", "c7x"), ("relu", "c7x")] * 2
    relu = [e for e in layers if e["op"] == "relu"]
    bn = [e for e in layers if e["op"] == "batch_norm"]
    assert [r["func"] for r in relu] == [b["func"] for b in bn] and "fused into" in relu[0]["note"]
    assert "2 parts" in bn[1]["note"]


def test_a_shared_batch_norm_result_is_offloaded_without_its_relu():
    flow = _flow(SharedBN())
    log = OffloadLog()
    mod, _ = run_offload(flow.mod, log)
    (call,) = [c for c in offload_calls(mod) if "channel_affine" in c.kernel]
    assert call.scalars[6] == 0                                      # has_relu
    layers = build_manifest(flow.mod, mod, log)["layers"]
    (relu,) = [e for e in layers if e["op"] == "relu"]
    assert relu["kernel"] != "c7x_int8_channel_affine"               # left to the relu pass


def test_an_out_of_range_shift_is_declined_with_its_reason():
    model = randomize_bn(Dense())
    with torch.no_grad():                                            # alpha = 1e12 / sqrt(1e-5) > 2^40
        model.bn1.weight.fill_(1e12)
        model.bn1.running_var.zero_()
    flow = _flow(model, randomize=False)
    log = OffloadLog()
    mod = offload_channel_affine(flow.mod, log)
    (d,) = [d for d in log.decisions if d.status == "declined"]
    assert d.op == "batch_norm" and "2^40" in d.reason
    assert len([c for c in offload_calls(mod) if "channel_affine" in c.kernel]) == 1


def test_a_folded_batch_norm_is_not_matched():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    flow = _flow(model)
    log = OffloadLog()
    offload_channel_affine(flow.mod, log)
    assert len(log) == 0


@needs_gcc
@pytest.mark.parametrize("dtype", ["int8", "int16"])
@pytest.mark.parametrize("inplace", [True, False], ids=["one_quantize", "two_quantizes"])
def test_dense_only_net_compiles_to_torchs_qdq_model_exactly(tmp_path, dtype, inplace):
    flow = _flow(DenseOnly(inplace), shape=(1, 3, 9, 11), dtype=dtype)
    mod, _ = run_offload(flow.mod)
    assert [c.kernel for c in offload_calls(mod) if "affine" in c.kernel] == [f"c7x_{dtype}_channel_affine"]
    x = inputs((1, 3, 9, 11), n=3)
    summary, out = compile_and_compare(flow.mod, "dense_only", tmp_path / "c", x, mmalib=True)
    with torch.no_grad():
        expect = np.concatenate([flow.qdq(torch.from_numpy(x[i:i + 1])).numpy() for i in range(3)])
    if FUSED_TORCH:
        np.testing.assert_array_equal(out, expect)
    assert np.abs(out).max() > 0


@needs_gcc
@pytest.mark.parametrize("dtype", ["int8", "int16"])
def test_dense_net_c_equals_reference_and_is_near_torch_qdq(tmp_path, dtype):
    flow = _dense_flow(dtype, True)
    x = inputs((1, 3, 7, 9), n=3)
    summary, out = compile_and_compare(flow.mod, "dense", tmp_path / "c", x, mmalib=True)
    with torch.no_grad():
        expect = np.concatenate([flow.qdq(torch.from_numpy(x[i:i + 1])).numpy() for i in range(3)])
    span = float(np.abs(expect).max()) + 1e-6
    assert np.abs(out - expect).max() <= 0.05 * span


# ------------------------------------------------------------------ ConvNeXt's layer scale

class LayerScaled(nn.Module):
    """A conv, then ConvNeXt's layer scale (``gamma * x``, gamma [C, 1, 1]) and the residual."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.gamma = nn.Parameter(torch.linspace(-0.6, 0.9, c).reshape(c, 1, 1))

    def forward(self, x):
        return x + self.gamma * self.conv(x)


@needs_gcc
@pytest.mark.parametrize("dtype", [np.int8, np.int16])
def test_layer_scale_kernel_equals_torchs_float32_product(dtype):
    """alpha = gamma, beta = 0: the kernel's fma with a zero addend is torch's float32
    product, so ``q(gamma * dq(x))`` comes out to the last bit, in C and in the twin."""
    rng = _rng("layer_scale", dtype)
    x = _rand(rng, dtype, (1, 6, 35))
    gamma = rng.uniform(-2, 2, 6).astype(np.float32)
    zp = 3 if dtype == np.int8 else 0
    s_in, s_out = float(np.float32(0.0213)), float(np.float32(0.0177))
    expect = _q(torch.from_numpy(gamma).reshape(6, 1) * _dq(x, zp, s_in, dtype), -2 if dtype == np.int8 else 0,
                s_out, dtype).numpy()
    blob = ref.channel_affine_params(zp, np.float32(s_in), gamma, np.zeros_like(gamma))
    z_out = -2 if dtype == np.int8 else 0
    args = (1, 6, 35, z_out, s_out, _inv(s_out), 0, z_out, _inv(s_out))
    name = f"c7x_{_name(dtype)}_channel_affine"
    for call in (hostlib.call_kernel, lambda n, *a: KERNELS[n](*a)):
        out = np.zeros_like(x)
        assert call(name, x, blob, out, *args) == ref.C7X_OK
        np.testing.assert_array_equal(out, expect)


@needs_gcc
@pytest.mark.parametrize("dtype", ["int8", "int16"])
def test_layer_scale_runs_on_the_channel_affine_kernel(tmp_path, dtype):
    """ConvNeXt's layer scale on the kernel, bit-exact with the reference; within one (int16:
    two) output LSB of torch's Q/DQ model (the conv's and the residual add's integer rescales, not the
    layer scale, which the test above shows exact)."""
    torch.manual_seed(2)
    flow = quantize(LayerScaled().eval(), torch.randn(1, 8, 5, 5), dtype=dtype)
    log = OffloadLog()
    run_offload(flow.mod, log)
    scaled = [(d.status, d.kernel) for d in log.decisions if d.op == "multiply"]
    assert scaled == [("offloaded", f"c7x_{dtype}_channel_affine")]
    x = inputs((1, 8, 5, 5), n=2)
    summary, out = compile_and_compare(flow.mod, "ls", tmp_path / "c", x, mmalib=True)
    assert summary["calls_by_backend"]["tvm"] == 0
    with torch.no_grad():
        expect = np.concatenate([flow.qdq(torch.from_numpy(x[i:i + 1])).numpy() for i in range(2)])
    out_scale = max(abs(float(n.args[1])) for n in flow.qdq.graph.nodes
                    if n.op == "call_function" and "dequantize_per_tensor" in str(n.target)
                    and n.users and all(u.op == "output" for u in n.users))
    # int16: the conv's and add's rescales round twice, by an LSB 256 times finer
    assert np.abs(out - expect).max() <= (1.01 if dtype == "int8" else 2.01) * out_scale


def test_a_multiply_by_a_per_pixel_constant_is_not_a_layer_scale():
    class PerPixel(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 4, 1)
            self.register_buffer("w", torch.rand(1, 1, 3, 3))

        def forward(self, x):
            return self.conv(x) * self.w

    torch.manual_seed(2)
    flow = quantize(PerPixel().eval(), torch.randn(1, 4, 3, 3))
    log = OffloadLog()
    offload_channel_affine(flow.mod, log)
    assert [d for d in log.decisions if d.op == "multiply"] == []
