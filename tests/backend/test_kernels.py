"""Kernel level: the host C reference kernels == the Python reference, bit for bit.

Two layers of evidence:
- parity: every kernel of ``c7x_kernels.h`` runs in C (gcc, via ``hostlib``) and
  in Python (``reference``) on seeded random tensors with odd shapes, strides,
  asymmetric padding, int8 and int16, extreme requantization parameters and both
  rounding modes, and must give identical outputs and status codes;
- anchors: results checked against independent formulations (numpy int64
  convolution and matmul, torch max_pool2d, exact Python-int requantization,
  float residual add), which would catch both implementations being wrong the
  same way.
"""

from __future__ import annotations

import inspect
import shutil
import struct
import subprocess
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipeline.backend.kernels import hostlib
from pipeline.backend.kernels import reference as ref
from pipeline.backend.kernels.catalog import KERNELS
from pipeline.errors import ToolchainError

ROUNDINGS = ("half_up", "floor")
DTYPES = (np.int8, np.int16)
SIGS = hostlib.kernel_signatures()
OPTIONAL = {"bias", "scale", "shift"}        # NULL allowed: defaults 0 / 1 / 0
# Scalars that are sizes / strides / group counts: 0 is invalid for each.
SIZE_SCALARS = {"planes", "hw", "n_in", "C_in", "H_in", "W_in", "C_out", "KH", "KW", "stride_h", "stride_w", "groups",
                "C", "num_groups", "M", "K", "N", "n", "rows", "H_out", "W_out", "kH", "kW", "sH", "sW", "outer",
                *(f"{s}{j}" for s in ("size", "n") for j in range(ref.MAX_SEGMENTS))}
PAD_SCALARS = {"pad_top", "pad_bottom", "pad_left", "pad_right", "pH", "pW",
               *(f"offset{j}" for j in range(ref.MAX_SEGMENTS))}  # -1 is invalid too


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------

def seed(*parts) -> np.random.Generator:
    """A generator seeded from the test parameters (stable across runs, unlike hash())."""
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


def rand(rng, dtype, shape, lo=None, hi=None) -> np.ndarray:
    info = np.iinfo(dtype)
    lo = info.min if lo is None else lo
    hi = info.max if hi is None else hi
    return rng.integers(lo, hi, size=shape, dtype=dtype, endpoint=True)


def full_range(dtype) -> list[int]:
    """``[act_min, act_max]`` of an MMALIB kernel without a fused activation: the dtype's range."""
    info = np.iinfo(dtype)
    return [int(info.min), int(info.max)]


def bias_dtype(dtype):
    return np.int32 if np.dtype(dtype) == np.int8 else np.int64


def out_index(name: str) -> int:
    """Position of the (single) buffer the kernel writes."""
    (idx,) = [i for i, p in enumerate(SIGS[name]) if p.pointer and not p.const]
    return idx


def run_both(name: str, args: list, rounding: str, fill: int = 0):
    """Run ``name`` in C and in Python, each on its own copy of the output
    (pre-filled with ``fill``); return (status_c, out_c, status_py, out_py)."""
    k = out_index(name)
    outs = []
    for _ in range(2):
        a = list(args)
        a[k] = np.full_like(args[k], fill)
        outs.append(a)
    status_c = hostlib.call_kernel(name, *outs[0], rounding=rounding)
    status_py = KERNELS[name](*outs[1], rounding=rounding)
    return status_c, outs[0][k], status_py, outs[1][k]


def assert_same(name, args, rounding):
    status_c, out_c, status_py, out_py = run_both(name, args, rounding)
    assert status_c == status_py == ref.C7X_OK
    np.testing.assert_array_equal(out_c, out_py)
    return out_c


def requant_params(rng, kind: str, channels: int, dtype, reduction: int, in_hi: int | None = None):
    """(bias, scale, shift) per channel.

    moderate: random scale and a shift that puts typical outputs mid-range
      (accumulator std ~ sqrt(K) * sigma_x * sigma_w for uniform data);
    extreme: scale in {1, 127}, shift in {0, 31}, biases at the int32 / int64
      limits and around the 2^54 / 2^55 clamps of the C (channel 0 always
      saturates: max bias, shift 0);
    defaults: NULL bias / scale / shift;
    zero_scale: scale 0 (the fold's r <= 0 case) with random bias.
    """
    info = np.iinfo(dtype)
    bdt = bias_dtype(dtype)
    if kind == "defaults":
        return None, None, None
    if kind == "zero_scale":
        return (rand(rng, bdt, channels, -2**20, 2**20), np.zeros(channels, np.uint8),
                rand(rng, np.uint8, channels, 0, 31))
    if kind == "extreme":
        bi = np.iinfo(bdt)
        pool = [bi.min, bi.max, 0, -2**20, 2**20]
        if bdt == np.int64:
            pool += [2**55, -2**55, 2**55 + 1, -2**55 - 1, 2**54 - 1, -2**54 + 1, 2**40]
        bias = rng.choice(np.array(pool, dtype=bdt), channels)
        scale = rng.choice(np.array([1, 127], np.uint8), channels)
        shift = rng.choice(np.array([0, 31], np.uint8), channels)
        bias[0], shift[0] = bi.max, 0
        return bias, scale, shift
    assert kind == "moderate"
    hi = info.max if in_hi is None else in_hi
    sigma = hi / np.sqrt(3.0)                 # std of uniform [-hi, hi]
    scale = rand(rng, np.uint8, channels, 1, 127)
    acc_std = np.sqrt(reduction) * sigma * sigma * scale
    target = (info.max + 1) / 4
    shift = np.clip(np.round(np.log2(acc_std / target)), 0, 31).astype(np.uint8)
    shift = np.clip(shift.astype(int) + rng.integers(-1, 2, channels), 0, 31).astype(np.uint8)
    bias_std = int(np.sqrt(reduction) * sigma * sigma)      # bias is added before the scale
    bias = rand(rng, bdt, channels, -bias_std, bias_std)
    return bias, scale, shift


def check_coverage(out, kind, dtype):
    """The comparison must be meaningful: moderate parameters give mostly
    unsaturated outputs; extreme ones do saturate."""
    info = np.iinfo(dtype)
    inside = (out > info.min) & (out < info.max)
    if kind == "moderate":
        assert inside.mean() >= 0.5, f"only {inside.mean():.0%} of outputs unsaturated"
        assert np.unique(out).size >= min(out.size // 2, 8)
    if kind == "extreme":
        assert not inside.all()


def naive_conv(x, w, stride, pads, groups=1) -> np.ndarray:
    """Independent NCHW int64 convolution [C_out, H_out, W_out]: zero-pad with
    numpy, then sum shifted strided slices times weights (no torch, no float)."""
    _, c_in, _, _ = x.shape
    c_out, cin_g, kh, kw = w.shape
    pt, pb, pl, pr = pads
    sh, sw = stride
    xp = np.pad(x[0].astype(np.int64), ((0, 0), (pt, pb), (pl, pr)))
    h_out = (xp.shape[1] - kh) // sh + 1
    w_out = (xp.shape[2] - kw) // sw + 1
    out = np.zeros((c_out, h_out, w_out), np.int64)
    cout_g = c_out // groups
    for co in range(c_out):
        g = co // cout_g
        for ci in range(cin_g):
            plane = xp[g * cin_g + ci]
            for i in range(kh):
                for j in range(kw):
                    window = plane[i:i + sh * (h_out - 1) + 1:sh, j:j + sw * (w_out - 1) + 1:sw]
                    out[co] += int(w[co, ci, i, j]) * window
    return out


def exact_requant(acc: int, bias: int, scale: int, shift: int, rounding: str, dtype) -> int:
    """c7x_kernels.h requantization with unbounded Python ints (no clamps)."""
    v = (acc + bias) * scale
    if rounding == "half_up" and shift > 0:
        v += 1 << (shift - 1)
    info = np.iinfo(dtype)
    return min(max(v >> shift, info.min), info.max)     # Python >> floors exactly


def residual_blob(m_x, m_skip, shift, zp_x, zp_skip, zp_out) -> np.ndarray:
    return np.frombuffer(struct.pack("<iiibbbx", m_x, m_skip, shift, zp_x, zp_skip, zp_out),
                         np.uint8).copy()


# --------------------------------------------------------------------------
# The C file, the header and the ABI
# --------------------------------------------------------------------------

@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_c_compiles_cleanly_as_strict_c99(tmp_path, rounding):
    cmd = ["gcc", *hostlib.WARNING_FLAGS, hostlib.rounding_define(rounding),
           "-I", str(hostlib.kernel_source_dir()), "-c", str(hostlib.KERNEL_SOURCES[0]),
           "-o", str(tmp_path / "k.o")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == ""


def test_unknown_rounding_macro_is_a_compile_error(tmp_path):
    src = hostlib.KERNEL_SOURCES[0]
    done = subprocess.run(["gcc", "-std=c99", "-DC7X_ROUNDING=7", "-I",
                           str(hostlib.kernel_source_dir()), "-c", str(src), "-o",
                           str(tmp_path / "k.o")], capture_output=True, text=True)
    assert done.returncode != 0 and "C7X_ROUNDING" in done.stderr


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed: the header's C++ "
                    "view (TI compiles generated code as C++) cannot be checked")
def test_header_is_clean_cpp(tmp_path):
    src = tmp_path / "use.cpp"
    src.write_text('#include "c7x_kernels.h"\nint main() { return C7X_OK; }\n')
    done = subprocess.run(["g++", "-std=c++14", "-Wall", "-Wextra", "-Wpedantic", "-Werror",
                           "-I", str(hostlib.kernel_source_dir()), "-fsyntax-only", str(src)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_every_header_kernel_has_a_python_twin_with_the_same_arguments():
    assert set(KERNELS) == set(SIGS)
    # the 13 of docs/reference.md, "Kernel ABI", our 4 requantize kernels, c7x_int8_lut, c7x_int8_softmax, c7x_int8_layer_norm, the
    # two channel multiplies, the four average pools, the two channel affines, the four
    # quantize / dequantize kernels of the model's edges, the int16 max pool and the eight
    # concat / split kernels (1 to 4 segments, int8 and int16), the two activation x activation matmuls
    # , the two permutes, the two broadcast adds, the two takes and the L2 normalize
    assert len(SIGS) == 50
    for name, params in SIGS.items():
        py = list(inspect.signature(KERNELS[name]).parameters)
        assert py[-1] == "rounding"
        assert [p.rstrip("_") for p in py[:-1]] == [p.name for p in params], name


def test_status_codes_and_limits_match_the_header():
    h = hostlib.header_constants()
    assert (h["C7X_OK"], h["C7X_ERR_NULL"], h["C7X_ERR_SHAPE"], h["C7X_ERR_PARAM"]) == (
        ref.C7X_OK, ref.C7X_ERR_NULL, ref.C7X_ERR_SHAPE, ref.C7X_ERR_PARAM)
    assert h["C7X_MAX_ELEMS"] == ref.MAX_ELEMS
    assert h["C7X_MAX_REDUCTION"] == ref.MAX_REDUCTION
    assert h["C7X_MAX_SCALE"] == ref.MAX_SCALE and h["C7X_MAX_SHIFT"] == ref.MAX_SHIFT
    # float64 conv exactness (reference docstring): every partial sum <= 2^53.
    assert ref.MAX_REDUCTION * 2**30 <= 2**53


# --------------------------------------------------------------------------
# Parity C == Python: convolutions
# --------------------------------------------------------------------------

# (C_in, H_in, W_in, C_out, KH, KW, stride_h, stride_w, pad_top, pad_bottom, pad_left, pad_right)
CONV_CASES = {
    "3x3_s2_asym_pad": (3, 7, 5, 13, 3, 3, 2, 2, 1, 0, 2, 1),
    "pointwise": (13, 7, 5, 3, 1, 1, 1, 1, 0, 0, 0, 0),
    "5x3_strides_2_1": (3, 9, 6, 5, 5, 3, 2, 1, 2, 1, 0, 3),
    "stride3": (3, 11, 10, 4, 3, 3, 3, 3, 1, 1, 1, 1),
    "pad_beyond_kernel": (2, 3, 4, 3, 3, 3, 1, 1, 4, 3, 3, 5),
    "wide_row_over_tile": (1, 2, 300, 2, 1, 3, 1, 1, 0, 0, 1, 1),
    "kernel_as_tall_as_image": (4, 7, 5, 3, 7, 5, 1, 2, 0, 0, 0, 0),
    # pointwise fast path: the flattened 20 x 17 plane spans two row tiles
    "pointwise_plane_over_tile": (5, 20, 17, 3, 1, 1, 1, 1, 0, 0, 0, 0),
}
QUANT_KINDS = ("moderate", "extreme", "defaults", "zero_scale")


def conv_args(rng, dtype, case, kind, groups=None, pad_value=0):
    c_in, h, w, c_out, kh, kw = case[:6]
    g = 1 if groups is None else groups
    x = rand(rng, dtype, (1, c_in, h, w))
    wt = rand(rng, dtype, (c_out, c_in // g, kh, kw))
    geo = ref.ConvGeometry(*case, g)
    bias, scale, shift = requant_params(rng, kind, c_out, dtype, geo.reduction)
    out = np.zeros(geo.shapes()["out"], dtype)
    args = [x, wt, bias, scale, shift, out, *case]
    return args + ([groups] if groups is not None else []) + [pad_value] + full_range(dtype)


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("kind", QUANT_KINDS)
@pytest.mark.parametrize("case", CONV_CASES.values(), ids=CONV_CASES.keys())
@pytest.mark.parametrize("dtype", DTYPES, ids=["i8", "i16"])
def test_conv2d_c_equals_python(dtype, case, kind, rounding):
    rng = seed(case, kind, dtype)
    name = "mmalib_conv2d_i8" if dtype == np.int8 else "mmalib_conv2d_i16"
    out = assert_same(name, conv_args(rng, dtype, case, kind), rounding)
    if case is not CONV_CASES["pad_beyond_kernel"]:   # mostly all-padding windows: few values
        check_coverage(out, kind, dtype)


@pytest.mark.parametrize("c_in,kh", [(131071, 1), (131072, 1), (14564, 3)],
                         ids=["pointwise_int32_bound", "pointwise_over_bound", "3x3_over_bound"])
def test_int8_accumulation_is_exact_at_the_int32_bound(c_in, kh):
    """The int8 conv sums in int32 up to a reduction of 131071 (131071 * 128^2 <
    2^31) and in int64 beyond. All -128 makes every product +2^14: 131072 of them
    (or 14564 * 9 = 131076 in a 3x3 window) pass 2^31, where an int32 sum would wrap
    to a negative output."""
    x = np.full((1, c_in, kh, kh), -128, np.int8)
    w = np.full((2, c_in, kh, kh), -128, np.int8)
    scale, shift = np.ones(2, np.uint8), np.full(2, 25, np.uint8)
    args = [x, w, np.zeros(2, np.int32), scale, shift, np.zeros((1, 2, 1, 1), np.int8),
            c_in, kh, kh, 2, kh, kh, 1, 1, 0, 0, 0, 0, 0, -128, 127]
    out = assert_same("mmalib_conv2d_i8", args, "half_up")
    expected = int(np.floor(c_in * kh * kh * 2**14 / 2**25 + 0.5))
    assert (out == expected).all() and expected == 64


@pytest.mark.parametrize("c_in", [1024, 1025], ids=["float32_at_2^24", "float64_past_it"])
def test_python_conv_accumulators_are_exact_across_the_float32_bound(c_in):
    """The Python twin sums in float32 when K * max|x| * max|w| <= 2^24, else in
    float64. 1024 products of -128 * -128 sum to exactly 2^24 (float32 path);
    with a 1025th product of 1 the sum is 2^24 + 1, which float32 cannot hold
    (float64 path). A second output channel mixes random signs."""
    rng = np.random.default_rng(c_in)
    x = np.full((1, c_in, 2, 3), -128, np.int8)
    w = np.full((2, c_in, 1, 1), -128, np.int8)
    x[0, 1024:], w[0, 1024:] = 1, 1
    w[1] = rng.integers(-128, 128, (c_in, 1, 1))
    g = ref.ConvGeometry(c_in, 2, 3, 2, 1, 1, 1, 1, 0, 0, 0, 0, 1)
    acc = ref.conv_accumulate(x, w, g)
    np.testing.assert_array_equal(acc, naive_conv(x, w, (1, 1), (0, 0, 0, 0)))
    assert (acc[0] == 2**24 + (c_in - 1024)).all()


# (C_in, H_in, W_in, C_out, KH, KW, sh, sw, pt, pb, pl, pr, groups)
GROUPED_CASES = {
    "g3_s2": (6, 7, 5, 9, 3, 3, 2, 2, 1, 0, 0, 1, 3),
    "g4_cout_per_group_1": (12, 5, 7, 4, 3, 1, 1, 2, 0, 2, 1, 0, 4),
    "g2": (4, 5, 5, 8, 3, 3, 1, 1, 1, 1, 1, 1, 2),
    "g1_equals_plain": (3, 7, 5, 13, 3, 3, 2, 2, 1, 0, 2, 1, 1),
}


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("kind", ("moderate", "extreme"))
@pytest.mark.parametrize("case", GROUPED_CASES.values(), ids=GROUPED_CASES.keys())
def test_grouped_conv2d_c_equals_python(case, kind, rounding):
    rng = np.random.default_rng(7)
    args = conv_args(rng, np.int8, case[:12], kind, groups=case[12])
    out = assert_same("mmalib_conv2d_i8_grouped_loop", args, rounding)
    check_coverage(out, kind, np.int8)


# (C, H_in, W_in, KH, KW, sh, sw, pt, pb, pl, pr)
DW_CASES = {
    "3x3_s1": (3, 7, 5, 3, 3, 1, 1, 1, 1, 1, 1),
    "3x3_s2_asym": (13, 7, 5, 3, 3, 2, 2, 0, 1, 1, 0),
    "5x5_s2": (13, 9, 8, 5, 5, 2, 2, 2, 2, 2, 2),
    "7x7_s1": (3, 11, 9, 7, 7, 1, 1, 3, 3, 3, 3),
    "3x5_strides_1_2": (5, 6, 7, 3, 5, 1, 2, 1, 0, 2, 1),
}


def dw_args(rng, dtype, case, kind, flat_weights=True, pad_value=0):
    c, h, w, kh, kw = case[:5]
    x = rand(rng, dtype, (1, c, h, w))
    wt = rand(rng, dtype, (c * kh * kw,) if flat_weights else (c, 1, kh, kw))
    geo = ref.DepthwiseGeometry(*case, c)
    bias, scale, shift = requant_params(rng, kind, c, dtype, kh * kw)
    out = np.zeros(geo.shapes()["out"], dtype)
    return [x, wt, bias, scale, shift, out, *case, c, pad_value, *full_range(dtype)]


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("kind", QUANT_KINDS)
@pytest.mark.parametrize("case", DW_CASES.values(), ids=DW_CASES.keys())
@pytest.mark.parametrize("dtype", DTYPES, ids=["i8", "i16"])
def test_depthwise_c_equals_python(dtype, case, kind, rounding):
    rng = seed(case, kind, dtype)
    name = "mmalib_depthwise_conv2d_i8" if dtype == np.int8 else "mmalib_depthwise_conv2d_i16"
    out = assert_same(name, dw_args(rng, dtype, case, kind), rounding)
    check_coverage(out, kind, dtype)


# --------------------------------------------------------------------------
# Parity: fully connected, residual add, max pool, ReLU, clamp
# --------------------------------------------------------------------------

FC_CASES = {"1x13x7": (1, 13, 7), "3x37x5": (3, 37, 5), "5x1x3": (5, 1, 3),
            "2x1280x10": (2, 1280, 10)}


def fc_args(rng, dtype, case, kind):
    m, k, n = case
    bias, scale, shift = requant_params(rng, kind, n, dtype, k)
    return [rand(rng, dtype, (m, k)), rand(rng, dtype, (n, k)), bias, scale, shift,
            np.zeros((m, n), dtype), m, k, n, *full_range(dtype)]


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("kind", QUANT_KINDS)
@pytest.mark.parametrize("case", FC_CASES.values(), ids=FC_CASES.keys())
@pytest.mark.parametrize("dtype", DTYPES, ids=["i8", "i16"])
def test_matmul_bias_c_equals_python(dtype, case, kind, rounding):
    rng = seed(case, kind, dtype)
    name = "mmalib_matmul_bias_i8" if dtype == np.int8 else "mmalib_matmul_bias_i16"
    out = assert_same(name, fc_args(rng, dtype, case, kind), rounding)
    if out.size >= 15:                          # too few outputs for a statistic otherwise
        check_coverage(out, kind, dtype)


RESIDUAL_PARAMS = {
    # (M_x, M_skip, shift, zp_x, zp_skip, zp_out): the pass uses shift 15
    # (docs/reference.md, "Residual add")
    "typical": (21000, 13000, 15, 3, -7, 5),
    "zero_points_0": (40000, 9000, 15, 0, 0, 0),
    "negative_M": (-30000, 50000, 15, -128, 127, -3),
    "int32_limits_shift0": (2**31 - 1, -2**31, 0, 1, -1, 0),
    "int32_limits_shift31": (2**31 - 1, -2**31, 31, 0, 0, 127),
    "shift_1": (1, 1, 1, 0, 0, -128),
}


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("has_relu", (0, 1))
@pytest.mark.parametrize("params", RESIDUAL_PARAMS.values(), ids=RESIDUAL_PARAMS.keys())
@pytest.mark.parametrize("dtype", DTYPES, ids=["i8", "i16"])
def test_residual_add_c_equals_python(dtype, params, has_relu, rounding):
    rng = np.random.default_rng(3)
    name = "c7x_int8_residual_add_relu" if dtype == np.int8 else "c7x_int16_residual_add_relu"
    n = 7 * 5 * 13
    args = [rand(rng, dtype, (1, 13, 7, 5)), rand(rng, dtype, (1, 13, 7, 5)),
            residual_blob(*params), np.zeros((1, 13, 7, 5), dtype), n, has_relu]
    out = assert_same(name, args, rounding)
    if has_relu:
        assert (out >= min(max(params[5], np.iinfo(dtype).min), np.iinfo(dtype).max)).all()


# (N, C, H_in, W_in, H_out, W_out, kH, kW, sH, sW, pH, pW)
POOL_CASES = {
    "3x3_s2_p1": (1, 3, 7, 5, 4, 3, 3, 3, 2, 2, 1, 1),
    "3x3_s2_p1_ceil": (2, 13, 8, 6, 5, 4, 3, 3, 2, 2, 1, 1),
    "2x2_s2_floor": (1, 3, 7, 5, 3, 2, 2, 2, 2, 2, 0, 0),
    "2x2_s2_ceil": (1, 3, 7, 5, 4, 3, 2, 2, 2, 2, 0, 0),
    "3x2_s1_2": (2, 3, 7, 5, 5, 2, 3, 2, 1, 2, 0, 0),
    "pad_beyond_half_kernel": (1, 3, 7, 5, 9, 7, 3, 3, 1, 1, 2, 2),
}


@pytest.mark.parametrize("name", ["c7x_int8_max_pool", "c7x_int8_max_pool_tidl", "c7x_int16_max_pool"])
@pytest.mark.parametrize("case", POOL_CASES.values(), ids=POOL_CASES.keys())
def test_max_pool_c_equals_python(name, case):
    rng = np.random.default_rng(5)
    n, c, h, w, ho, wo = case[:6]
    dtype = np.int16 if "int16" in name else np.int8
    low = int(np.iinfo(dtype).min)
    x = rand(rng, dtype, (n, c, h, w), low, low + 28)   # all near the minimum: padding as 0 would win
    out = assert_same(name, [x, np.zeros((n, c, ho, wo), dtype), *case], "half_up")
    assert (out <= low + 28).all()


@pytest.mark.parametrize("zp", [-300, -128, -5, 0, 127, 200])
def test_relu_c_equals_python(zp):
    rng = np.random.default_rng(11)
    x = rand(rng, np.int8, (3, 7, 5))
    out = assert_same("c7x_int8_relu", [x, np.zeros_like(x), x.size, zp], "half_up")
    np.testing.assert_array_equal(out, np.clip(np.maximum(x.astype(int), zp), -128, 127))


@pytest.mark.parametrize("lo,hi", [(-128, 127), (0, 6), (-300, 300), (200, 300), (-400, -200),
                                   (5, 5), (-7, 100)])
def test_clamp_c_equals_python(lo, hi):
    rng = np.random.default_rng(13)
    x = rand(rng, np.int8, (13, 7, 5))
    out = assert_same("c7x_int8_clamp", [x, np.zeros_like(x), x.size, lo, hi], "half_up")
    expected = torch.clamp(torch.from_numpy(x.astype(np.int64)), lo, hi).clamp(-128, 127)
    np.testing.assert_array_equal(out, expected.numpy())


# --------------------------------------------------------------------------
# Anchors: independent formulations
# --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,hi", [(np.int8, 6), (np.int16, 40)], ids=["i8", "i16"])
@pytest.mark.parametrize("case", list(CONV_CASES.values())[:5], ids=list(CONV_CASES)[:5])
def test_conv_with_identity_requant_is_the_saturated_integer_conv(dtype, hi, case):
    rng = np.random.default_rng(17)
    c_in, _, _, c_out, kh, kw, sh, sw, pt, pb, pl, pr = case
    x = rand(rng, dtype, (1, c_in, case[1], case[2]), -hi, hi)
    w = rand(rng, dtype, (c_out, c_in, kh, kw), -hi, hi)
    expected = ref.saturate(naive_conv(x, w, (sh, sw), (pt, pb, pl, pr)), dtype)
    name = "mmalib_conv2d_i8" if dtype == np.int8 else "mmalib_conv2d_i16"
    ch = c_out
    explicit = (np.zeros(ch, bias_dtype(dtype)), np.ones(ch, np.uint8), np.zeros(ch, np.uint8))
    for bss in [(None, None, None), explicit]:
        out = np.zeros((1, *expected.shape), dtype)
        _, out_c, _, out_py = run_both(name, [x, w, *bss, out, *case, 0, *full_range(dtype)], "half_up")
        np.testing.assert_array_equal(out_c[0], expected)
        np.testing.assert_array_equal(out_py[0], expected)
    info = np.iinfo(dtype)
    assert ((expected > info.min) & (expected < info.max)).any()


def test_grouped_conv_is_the_naive_grouped_conv():
    rng = np.random.default_rng(19)
    case = (6, 7, 5, 9, 3, 3, 2, 2, 1, 0, 0, 1)
    x = rand(rng, np.int8, (1, 6, 7, 5), -6, 6)
    w = rand(rng, np.int8, (9, 2, 3, 3), -6, 6)
    expected = ref.saturate(naive_conv(x, w, (2, 2), (1, 0, 0, 1), groups=3), np.int8)
    _, out_c, _, out_py = run_both("mmalib_conv2d_i8_grouped_loop",
                                   [x, w, None, None, None, np.zeros((1, *expected.shape), np.int8),
                                    *case, 3, 0, -128, 127], "half_up")
    np.testing.assert_array_equal(out_c[0], expected)
    np.testing.assert_array_equal(out_py[0], expected)


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("case", DW_CASES.values(), ids=DW_CASES.keys())
def test_depthwise_equals_grouped_conv_and_naive_conv(case, rounding):
    rng = np.random.default_rng(23)
    args = dw_args(rng, np.int8, case, "moderate", flat_weights=True)
    c, h, w, kh, kw, sh, sw, pt, pb, pl, pr = case
    _, dw_c, _, _ = run_both("mmalib_depthwise_conv2d_i8", args, rounding)
    grouped = [args[0], args[1].reshape(c, 1, kh, kw), *args[2:6],
               c, h, w, c, kh, kw, sh, sw, pt, pb, pl, pr, c, 0, -128, 127]
    _, gr_c, _, gr_py = run_both("mmalib_conv2d_i8_grouped_loop", grouped, rounding)
    np.testing.assert_array_equal(dw_c, gr_c)
    np.testing.assert_array_equal(dw_c, gr_py)
    # and with identity requantization, the naive depthwise (groups = C) conv
    ident = [args[0], args[1], None, None, None, np.zeros_like(args[5]), *case, c, 0, -128, 127]
    _, out_c, _, _ = run_both("mmalib_depthwise_conv2d_i8", ident, rounding)
    acc = naive_conv(args[0], args[1].reshape(c, 1, kh, kw), (sh, sw), (pt, pb, pl, pr), groups=c)
    np.testing.assert_array_equal(out_c[0], ref.saturate(acc, np.int8))


PAD_VALUES = (-128, -37, 1, 127)   # int8 zero points at the range's ends and in between


@pytest.mark.parametrize("pad_value", PAD_VALUES)
@pytest.mark.parametrize("case", CONV_CASES.values(), ids=CONV_CASES.keys())
@pytest.mark.parametrize("dtype", DTYPES, ids=["i8", "i16"])
def test_conv_padding_reads_pad_value(dtype, case, pad_value):
    """A padding pixel reads ``pad_value``: the conv equals the zero-padded conv of the
    input explicitly padded with ``pad_value`` (C and Python), for every geometry,
    including windows made of padding only."""
    rng = seed(case, "moderate", dtype, pad_value)
    args = conv_args(rng, dtype, case, "moderate", pad_value=pad_value)
    name = "mmalib_conv2d_i8" if dtype == np.int8 else "mmalib_conv2d_i16"
    out = assert_same(name, args, "half_up")
    c_in, h, w, c_out, kh, kw, sh, sw, pt, pb, pl, pr = case
    padded = np.pad(args[0], ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=pad_value)
    explicit = [padded, *args[1:5], np.zeros_like(args[5]), c_in, h + pt + pb, w + pl + pr, c_out, kh, kw,
                sh, sw, 0, 0, 0, 0, 0, *full_range(dtype)]
    np.testing.assert_array_equal(out, assert_same(name, explicit, "half_up"))
    if any(case[8:]):   # a padded case: pad_value changes the result
        zero_pad = assert_same(name, args[:-3] + [0] + args[-2:], "half_up")
        assert (zero_pad != out).any()


@pytest.mark.parametrize("pad_value", PAD_VALUES)
@pytest.mark.parametrize("case", DW_CASES.values(), ids=DW_CASES.keys())
def test_depthwise_and_grouped_padding_reads_pad_value(case, pad_value):
    """Depthwise and grouped int8 kernels read ``pad_value`` in padding like the plain conv:
    equal to the grouped conv of the explicitly padded input."""
    rng = seed(case, "moderate", np.int8, pad_value)
    args = dw_args(rng, np.int8, case, "moderate", pad_value=pad_value)
    out = assert_same("mmalib_depthwise_conv2d_i8", args, "half_up")
    c, h, w, kh, kw, sh, sw, pt, pb, pl, pr = case
    padded = np.pad(args[0], ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=pad_value)
    grouped = [padded, args[1].reshape(c, 1, kh, kw), *args[2:5], np.zeros_like(args[5]),
               c, h + pt + pb, w + pl + pr, c, kh, kw, sh, sw, 0, 0, 0, 0, c, 0, -128, 127]
    np.testing.assert_array_equal(out, assert_same("mmalib_conv2d_i8_grouped_loop", grouped, "half_up"))


@pytest.mark.parametrize("dtype", DTYPES, ids=["i8", "i16"])
def test_matmul_is_numpy_matmul_then_exact_requant(dtype):
    rng = np.random.default_rng(29)
    m, k, n = 4, 37, 6
    x, w = rand(rng, dtype, (m, k)), rand(rng, dtype, (n, k))
    bias, scale, shift = requant_params(rng, "moderate", n, dtype, k)
    acc = x.astype(np.int64) @ w.astype(np.int64).T
    for rounding in ROUNDINGS:
        expected = np.array([[exact_requant(int(acc[i, j]), int(bias[j]), int(scale[j]),
                                            int(shift[j]), rounding, dtype) for j in range(n)]
                             for i in range(m)], dtype)
        _, out_c, _, out_py = run_both(f"mmalib_matmul_bias_i{np.iinfo(dtype).bits}",
                                       [x, w, bias, scale, shift, np.zeros((m, n), dtype), m, k, n,
                                        *full_range(dtype)],
                                       rounding)
        np.testing.assert_array_equal(out_c, expected)
        np.testing.assert_array_equal(out_py, expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=["i8", "i16"])
@pytest.mark.parametrize("kind", ["conv", "depthwise", "fc"])
def test_saturation_range_is_the_fused_activation(kind, dtype):
    """act_min / act_max (a folded ReLU6 / clip) give exactly the full-range result
    clipped to them, in C and in Python: the clip pass it replaces, bit for bit."""
    rng = np.random.default_rng(37)
    bits = np.iinfo(dtype).bits
    if kind == "conv":
        name, args = f"mmalib_conv2d_i{bits}", conv_args(rng, dtype, CONV_CASES["3x3_s2_asym_pad"], "moderate")
    elif kind == "depthwise":
        name = f"mmalib_depthwise_conv2d_i{bits}"
        args = dw_args(rng, dtype, (3, 7, 6, 3, 3, 1, 1, 1, 1, 1, 1), "moderate")
    else:
        name, args = f"mmalib_matmul_bias_i{bits}", fc_args(rng, dtype, (3, 37, 5), "moderate")
    full = assert_same(name, args, "half_up")
    lo, hi = int(np.percentile(full, 25)), int(np.percentile(full, 75))  # ReLU6-like: inside the range
    clipped = assert_same(name, args[:-2] + [lo, hi], "half_up")
    np.testing.assert_array_equal(clipped, np.clip(full, lo, hi))
    assert (full < lo).any() and (full > hi).any()  # both bounds bite


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_requant_clamps_never_change_the_exact_result(rounding):
    """Biases at and around the int64 limits and the +-2^54 / 2^55 clamps, with
    accumulators of both signs: the C and Python outputs equal the unbounded
    Python-int formula of c7x_kernels.h."""
    rng = np.random.default_rng(31)
    edges = [2**63 - 1, -2**63, 2**55, 2**55 + 1, 2**55 - 1, 2**54, 2**54 + 1, 2**54 - 1,
             2**46, 2**46 - 1, 0]
    biases = np.array(edges + [-e for e in edges[2:]], dtype=np.int64)
    n = biases.size
    m, k = 8, 300
    x = rand(rng, np.int16, (m, k))
    x[0], x[1] = 2**15 - 1, -2**15                  # |acc| = K * 2^30 extremes
    w = rand(rng, np.int16, (n, k))
    w[:, :] = np.where(np.arange(n)[:, None] % 2 == 0, -2**15, w)
    scale = rng.choice(np.array([1, 127], np.uint8), n)
    shift = rng.choice(np.array([0, 1, 30, 31], np.uint8), n)
    acc = x.astype(np.int64) @ w.astype(np.int64).T
    expected = np.array([[exact_requant(int(acc[i, j]), int(biases[j]), int(scale[j]),
                                        int(shift[j]), rounding, np.int16) for j in range(n)]
                         for i in range(m)], np.int16)
    args = [x, w, biases, scale, shift, np.zeros((m, n), np.int16), m, k, n, -2**15, 2**15 - 1]
    _, out_c, _, out_py = run_both("mmalib_matmul_bias_i16", args, rounding)
    np.testing.assert_array_equal(out_c, expected)
    np.testing.assert_array_equal(out_py, expected)
    assert ((expected > -2**15) & (expected < 2**15 - 1)).any()   # not only saturation


@pytest.mark.parametrize("shift", [1, 2, 5, 15])
def test_half_up_and_floor_differ_exactly_on_the_upper_half(shift):
    """FC with K = 1, w = 1, scale 1, bias 0 gives rshift(x, shift) for every
    int16 x: half_up - floor is 1 exactly where x mod 2^shift >= 2^(shift-1)."""
    x = np.arange(-2**15, 2**15, dtype=np.int16).reshape(-1, 1)
    m = x.shape[0]
    args = [x, np.ones((1, 1), np.int16), None, np.ones(1, np.uint8),
            np.full(1, shift, np.uint8), np.zeros((m, 1), np.int16), m, 1, 1, -2**15, 2**15 - 1]
    results = {}
    for rounding in ROUNDINGS:
        _, out_c, _, out_py = run_both("mmalib_matmul_bias_i16", args, rounding)
        np.testing.assert_array_equal(out_c, out_py)
        results[rounding] = out_c[:, 0].astype(np.int64)
    xi = x[:, 0].astype(np.int64)
    np.testing.assert_array_equal(results["floor"], xi // 2**shift)
    upper = (xi % 2**shift) >= 2**(shift - 1)
    np.testing.assert_array_equal(results["half_up"] - results["floor"], upper.astype(np.int64))


def test_rounding_known_answers():
    """Values worked out by hand from the header's formulas (shift 1)."""
    x = np.array([[-3], [-1], [1], [3], [5]], np.int16)
    args = [x, np.ones((1, 1), np.int16), None, None, np.ones(1, np.uint8),
            np.zeros((5, 1), np.int16), 5, 1, 1, -2**15, 2**15 - 1]
    expected = {"half_up": [-1, 0, 1, 2, 3], "floor": [-2, -1, 0, 1, 2]}
    for rounding, want in expected.items():
        _, out_c, _, out_py = run_both("mmalib_matmul_bias_i16", args, rounding)
        assert out_c[:, 0].tolist() == want and out_py[:, 0].tolist() == want


@pytest.mark.parametrize("has_relu", (0, 1))
@pytest.mark.parametrize("dtype", DTYPES, ids=["i8", "i16"])
def test_residual_add_is_within_one_lsb_of_the_float_formula(dtype, has_relu):
    """Real scales s_x, s_skip, s_out; M = round(s / s_out * 2^15), shift 15
    (docs/reference.md, "Residual add").
    Against v = s_x/s_o (x - zx) + s_s/s_o (skip - zs) + zo (then relu, clip):
    half_up is within 0.5 LSB and floor within (-1, 0] LSB, each widened by the
    multipliers' own rounding error |dx| |M_x / 2^15 - s_x / s_o| + (skip alike),
    which is < 0.01 LSB for int8 and up to ~1 LSB for int16."""
    rng = np.random.default_rng(37)
    s_x, s_skip, s_out = 0.021, 0.034, 0.047
    zps = (0, 0, 0) if dtype == np.int16 else (4, -9, -3)
    m_x, m_skip = (round(s / s_out * 2**15) for s in (s_x, s_skip))
    n = 4096
    x, skip = rand(rng, dtype, n), rand(rng, dtype, n)
    dx, ds = x.astype(np.float64) - zps[0], skip.astype(np.float64) - zps[1]
    v = (s_x * dx + s_skip * ds) / s_out + zps[2]
    if has_relu:
        v = np.maximum(v, zps[2])
    info = np.iinfo(dtype)
    v = np.clip(v, info.min, info.max)       # relu and clip are 1-Lipschitz: errors carry over
    m_err = (np.abs(dx) * abs(m_x / 2**15 - s_x / s_out) +
             np.abs(ds) * abs(m_skip / 2**15 - s_skip / s_out) + 1e-9)
    if dtype == np.int8:
        assert m_err.max() < 0.01
    for rounding in ROUNDINGS:
        args = [x, skip, residual_blob(m_x, m_skip, 15, *zps), np.zeros(n, dtype), n, has_relu]
        _, out_c, _, out_py = run_both(f"c7x_int{info.bits}_residual_add_relu", args, rounding)
        np.testing.assert_array_equal(out_c, out_py)
        diff = out_c.astype(np.float64) - v
        if rounding == "half_up":
            assert (np.abs(diff) <= 0.5 + m_err).all()
        else:
            assert ((diff > -1 - m_err) & (diff <= m_err)).all()
        inside = (out_c > info.min) & (out_c < info.max)
        assert inside.mean() > 0.5


@pytest.mark.parametrize("ceil_mode", (False, True))
@pytest.mark.parametrize("k,s,p", [(3, 2, 1), (2, 2, 0), (3, 1, 1), (3, 2, 0)])
@pytest.mark.parametrize("dtype", [np.int8, np.int16])
def test_max_pool_equals_torch_max_pool2d(k, s, p, ceil_mode, dtype):
    rng = np.random.default_rng(41)
    x = rand(rng, dtype, (2, 3, 7, 5))
    expected = F.max_pool2d(torch.from_numpy(x.astype(np.float32)), k, s, p,
                            ceil_mode=ceil_mode).numpy().astype(dtype)
    _, _, ho, wo = expected.shape
    args = [x, np.zeros_like(expected), 2, 3, 7, 5, ho, wo, k, k, s, s, p, p]
    names = ("c7x_int16_max_pool",) if dtype == np.int16 else ("c7x_int8_max_pool", "c7x_int8_max_pool_tidl")
    for name in names:
        _, out_c, _, out_py = run_both(name, args, "half_up")
        np.testing.assert_array_equal(out_c, expected)
        np.testing.assert_array_equal(out_py, expected)


# --------------------------------------------------------------------------
# Argument validation: same status in C and Python, output untouched
# --------------------------------------------------------------------------

def valid_args(name: str, rng) -> list:
    """A small valid call of ``name``."""
    dtype = np.int16 if "i16" in name or "int16" in name else np.int8
    if name.startswith("mmalib_conv2d_i8_grouped"):
        return conv_args(rng, dtype, (4, 5, 5, 6, 3, 3, 1, 1, 1, 1, 1, 1), "moderate", groups=2)
    if name.startswith("mmalib_conv2d"):
        return conv_args(rng, dtype, (3, 5, 5, 4, 3, 3, 1, 1, 1, 1, 1, 1), "moderate")
    if name.startswith("mmalib_depthwise"):
        return dw_args(rng, dtype, (3, 5, 5, 3, 3, 1, 1, 1, 1, 1, 1), "moderate")
    if name.startswith("mmalib_matmul"):
        return fc_args(rng, dtype, (2, 8, 3), "moderate")
    if name.startswith("mmalib_batch_matmul"):           # tests/backend/test_batch_matmul.py
        # A = rows of a [2, 3, 4]; B = b [2, 5, 4] transposed (unit stride on k)
        blob = np.frombuffer(struct.pack("<iiibbbx", 2**14, 20, 0, 0, 0, 0), np.uint8).copy()
        return [rand(rng, dtype, (2, 3, 4)), rand(rng, dtype, (2, 5, 4)), blob, np.zeros((2, 3, 5), dtype),
                24, 40, 2, 3, 4, 5, 0, 12, 4, 1, 0, 20, 1, 4]
    if "broadcast_add" in name:                           # tests/backend/test_broadcast_add.py
        # x [2, 3, 4] + skip [2, 1, 4] (broadcast over the middle axis)
        return [rand(rng, dtype, (2, 3, 4)), rand(rng, dtype, (2, 4)),
                residual_blob(20000, 10000, 15, 0, 0, 0), np.zeros((2, 3, 4), dtype), 8, 2, 3, 4, 4, 0, 1]
    if "residual" in name:
        return [rand(rng, dtype, 10), rand(rng, dtype, 10),
                residual_blob(20000, 10000, 15, 0, 0, 0), np.zeros(10, dtype), 10, 1]
    if "max_pool" in name:
        return [rand(rng, dtype, (1, 2, 5, 5)), np.zeros((1, 2, 3, 3), dtype),
                1, 2, 5, 5, 3, 3, 3, 3, 2, 2, 1, 1]
    if name == "c7x_int8_relu":
        return [rand(rng, np.int8, 10), np.zeros(10, np.int8), 10, 0]
    if "channel_affine" in name:                         # tests/backend/test_channel_affine.py
        blob = ref.channel_affine_params(0, 0.01, np.float32([0.5, 2.0, -1.0]), np.float32([0, 0.1, 0]))
        return [rand(rng, dtype, (1, 3, 5)), blob, np.zeros((1, 3, 5), dtype), 1, 3, 5, 0, 0.02, 50.0,
                1, 0, 50.0]
    if name.startswith("c7x_requantize_"):                # tests/backend/test_requantize.py
        src, dst = {"i8_i16": (np.int8, np.int16), "i16_i8": (np.int16, np.int8),
                    "i8_i8": (np.int8, np.int8), "i16_i16": (np.int16, np.int16)}[name.removeprefix("c7x_requantize_")]
        return [rand(rng, src, 10), np.zeros(10, dst), 10, 0, 0.01, 0, 50.0]
    if "channel_mul" in name:                            # tests/backend/test_channel_mul.py
        blob = np.frombuffer(struct.pack("<iiibbbx", 2**20, 24, 0, 0, 0, 0), np.uint8).copy()
        return [rand(rng, dtype, (3, 5)), rand(rng, dtype, 3), blob, np.zeros((3, 5), dtype), 3, 5]
    if "global_avg_pool" in name:                        # tests/backend/test_avg_pool.py
        return [rand(rng, dtype, (3, 10)), np.zeros(3, dtype), 3, 10, 0, 0.01, 0, 50.0]
    if "avg_pool" in name:
        return [rand(rng, dtype, (1, 2, 5, 5)), np.zeros((1, 2, 3, 3), dtype),
                1, 2, 5, 5, 3, 3, 3, 3, 2, 2, 1, 1, 1, 0, 0.01, 0, 50.0]
    if name.startswith("c7x_quantize_f32_"):             # tests/backend/test_edges.py
        return [rng.standard_normal(10).astype(np.float32), np.zeros(10, dtype), 10, 3, 20.0]
    if name.startswith("c7x_dequantize_"):
        return [rand(rng, dtype, 12), np.zeros(10, np.float32), 12, 10, -3, 0.05]
    if name == "c7x_int8_layer_norm":                     # tests/backend/test_layer_norm.py
        return [rand(rng, np.int8, (2, 5)), np.full(5, 1 << 16, np.int32), np.zeros(5, np.int64),
                np.zeros((2, 5), np.int8), 2, 5, 0, 10]
    if name == "c7x_int8_l2_normalize":                   # tests/backend/test_l2_normalize.py
        return [rand(rng, np.int8, (2, 5)), np.zeros((2, 5), np.int8), 2, 5, 3, 1 << 23, -4]
    if name == "c7x_int8_softmax":                        # tests/backend/test_softmax.py
        return [rand(rng, np.int8, (2, 5)), ref.softmax_table(0.1), np.zeros((2, 5), np.int8), 2, 5]
    if name == "c7x_int8_lut":                            # tests/backend/test_activation_lut.py
        return [rand(rng, np.int8, 10), rand(rng, np.int8, 256), np.zeros(10, np.int8), 10]
    if name.startswith("c7x_permute"):                    # tests/backend/test_permute.py
        return [rand(rng, dtype, (2, 3, 4)), np.zeros((4, 2, 3), dtype), 1, 1, 1, 2, 3, 4, 0, 1, 2, 5, 3, 4]
    if name.startswith("c7x_take"):                       # tests/backend/test_take.py
        return [rand(rng, dtype, (2, 4, 3)), np.array([3, 0, 1, 2, 2], np.int32), np.zeros((2, 5, 3), dtype),
                2, 4, 5, 3]
    if name.startswith("c7x_concat"):                     # tests/backend/test_concat.py
        k = int(name[len("c7x_concat")])
        segs = [[6, 1, 4, -2, 0.03 + 0.01 * j] for j in range(k)]
        return ([rand(rng, dtype, 12) for _ in range(k)] + [np.zeros(2 * 4 * k, dtype), 2]
                + [v for s in segs for v in s] + [1, 25.0])
    assert name == "c7x_int8_clamp"
    return [rand(rng, np.int8, 10), np.zeros(10, np.int8), 10, -5, 6]


def with_arg(name: str, args: list, param: str, value) -> list:
    a = list(args)
    a[[p.name for p in SIGS[name]].index(param)] = value
    return a


def bad_calls():
    """(kernel, argument, bad value, expected status) for every kernel."""
    cases = []
    for name, params in SIGS.items():
        for p in params:
            if p.pointer and p.name not in OPTIONAL:
                cases.append((name, p.name, None, ref.C7X_ERR_NULL))
            if not p.pointer and p.name in SIZE_SCALARS:
                cases.append((name, p.name, 0, ref.C7X_ERR_SHAPE))
                cases.append((name, p.name, -3, ref.C7X_ERR_SHAPE))
            if not p.pointer and p.name in PAD_SCALARS:
                cases.append((name, p.name, -1, ref.C7X_ERR_SHAPE))
        if any(p.name == "scale" for p in params):
            cases.append((name, "scale", "128", ref.C7X_ERR_PARAM))
            cases.append((name, "shift", "32", ref.C7X_ERR_PARAM))
    cases += [
        ("mmalib_conv2d_i8_grouped_loop", "groups", 3, ref.C7X_ERR_SHAPE),     # 3 !| 4
        ("mmalib_conv2d_i8", "KH", 8, ref.C7X_ERR_SHAPE),                      # no window fits
        ("mmalib_conv2d_i16", "C_in", 2**22, ref.C7X_ERR_SHAPE),               # K > 2^23
        ("mmalib_matmul_bias_i8", "K", 2**23 + 1, ref.C7X_ERR_SHAPE),
        ("mmalib_matmul_bias_i16", "M", 2**30, ref.C7X_ERR_SHAPE),             # M*K > 2^31-1
        ("mmalib_depthwise_conv2d_i8", "num_groups", 2, ref.C7X_ERR_SHAPE),
        ("mmalib_depthwise_conv2d_i16", "num_groups", 4, ref.C7X_ERR_SHAPE),
        ("c7x_int8_max_pool", "H_out", 4, ref.C7X_ERR_SHAPE),                  # beyond ceil mode
        ("c7x_int8_max_pool", "W_out", 2, ref.C7X_ERR_SHAPE),
        ("c7x_int8_max_pool_tidl", "pH", 3, ref.C7X_ERR_SHAPE),               # pad >= kernel
        ("c7x_int8_clamp", "lo", 7, ref.C7X_ERR_PARAM),                        # lo > hi
        ("c7x_int8_layer_norm", "n", ref.LAYER_NORM_MAX_N + 1, ref.C7X_ERR_SHAPE),
        ("c7x_int8_layer_norm", "eps_q", -1, ref.C7X_ERR_PARAM),
        ("c7x_int8_layer_norm", "in_zp", 129, ref.C7X_ERR_PARAM),
        ("mmalib_conv2d_i8", "act_min", 128, ref.C7X_ERR_PARAM),               # beyond int8, > act_max
        ("mmalib_conv2d_i8", "pad_value", 128, ref.C7X_ERR_PARAM),             # beyond int8
        ("mmalib_conv2d_i8_grouped_loop", "pad_value", -129, ref.C7X_ERR_PARAM),
        ("mmalib_depthwise_conv2d_i16", "pad_value", 2**15, ref.C7X_ERR_PARAM),
        ("mmalib_depthwise_conv2d_i16", "act_max", -2**15 - 1, ref.C7X_ERR_PARAM),
        ("mmalib_matmul_bias_i8", "act_max", -129, ref.C7X_ERR_PARAM),
        ("c7x_int8_residual_add_relu", "params", "shift32", ref.C7X_ERR_PARAM),
        ("c7x_int16_residual_add_relu", "params", "shift-1", ref.C7X_ERR_PARAM),
        ("c7x_dequantize_i8_f32", "n", 13, ref.C7X_ERR_SHAPE),                 # n > n_in
        ("c7x_dequantize_i8_f32", "in_zp", 128, ref.C7X_ERR_PARAM),
        ("c7x_dequantize_i16_f32", "in_scale", 0.0, ref.C7X_ERR_PARAM),
        ("c7x_quantize_f32_i8", "out_zp", -129, ref.C7X_ERR_PARAM),
        ("c7x_quantize_f32_i16", "out_inv_scale", float("inf"), ref.C7X_ERR_PARAM),
    ]
    return cases


def apply_bad(name, args, param, value):
    if value in ("128", "32"):                         # one channel out of range
        arr = args[[p.name for p in SIGS[name]].index(param)].copy()
        arr[-1] = int(value)
        return with_arg(name, args, param, arr)
    if value in ("shift32", "shift-1"):
        blob = residual_blob(20000, 10000, 32 if value == "shift32" else -1, 0, 0, 0)
        return with_arg(name, args, param, blob)
    return with_arg(name, args, param, value)


@pytest.mark.parametrize("name,param,value,status", bad_calls(),
                         ids=[f"{n}-{p}-{v}" for n, p, v, _ in bad_calls()])
def test_bad_arguments_give_the_same_status_and_leave_out_untouched(name, param, value, status):
    rng = np.random.default_rng(43)
    args = apply_bad(name, valid_args(name, rng), param, value)
    k = out_index(name)
    if args[k] is None:                                 # NULL output: nothing to inspect
        assert hostlib.call_kernel(name, *args) == status
        assert KERNELS[name](*args) == status
        return
    status_c, out_c, status_py, out_py = run_both(name, args, "half_up", fill=0x55)
    assert status_c == status_py == status
    assert (out_c == 0x55).all() and (out_py == 0x55).all()


@pytest.mark.parametrize("name", sorted(SIGS))
def test_valid_calls_succeed(name):
    """The base of the bad-argument cases is itself valid (so each bad case
    fails for the one argument it changes)."""
    args = valid_args(name, np.random.default_rng(43))
    status_c, out_c, status_py, out_py = run_both(name, args, "half_up", fill=0x55)
    assert status_c == status_py == ref.C7X_OK
    np.testing.assert_array_equal(out_c, out_py)


def test_max_pool_ceil_mode_drops_a_last_window_starting_in_padding():
    """H_in 4, k 2, s 3, p 1: the ceil formula gives 3 windows, but the third
    would start in the bottom padding, so torch's ceil_mode (and the kernels)
    allow 2 only; 3 is a shape error in both implementations."""
    x = rand(np.random.default_rng(61), np.int8, (1, 2, 4, 4))
    expected = F.max_pool2d(torch.from_numpy(x.astype(np.float32)), 2, 3, 1, ceil_mode=True)
    assert expected.shape[2:] == (2, 2)
    ok = [x, np.zeros((1, 2, 2, 2), np.int8), 1, 2, 4, 4, 2, 2, 2, 2, 3, 3, 1, 1]
    _, out_c, _, out_py = run_both("c7x_int8_max_pool", ok, "half_up")
    np.testing.assert_array_equal(out_c, expected.numpy().astype(np.int8))
    np.testing.assert_array_equal(out_py, out_c)
    bad = [x, np.zeros((1, 2, 3, 3), np.int8), 1, 2, 4, 4, 3, 3, 2, 2, 3, 3, 1, 1]
    status_c, _, status_py, _ = run_both("c7x_int8_max_pool", bad, "half_up")
    assert status_c == status_py == ref.C7X_ERR_SHAPE


@pytest.mark.parametrize("call", ["c", "python"])
def test_buffers_c_cannot_check_are_refused_before_the_call(call):
    rng = np.random.default_rng(47)
    name = "mmalib_conv2d_i8"
    args = valid_args(name, rng)
    run = (lambda *a: hostlib.call_kernel(name, *a)) if call == "c" else KERNELS[name]
    with pytest.raises(ValueError, match="elements"):
        run(*with_arg(name, args, "out", np.zeros(3, np.int8)))            # too small
    with pytest.raises(TypeError, match="dtype"):
        run(*with_arg(name, args, "bias", args[2].astype(np.int64)))        # int32 expected
    with pytest.raises(ValueError, match="int32"):
        run(*with_arg(name, args, "pad_top", 2**31))
    with pytest.raises(ValueError, match="contiguous"):
        run(*with_arg(name, args, "out", np.zeros((1, 4, 5, 10), np.int8)[..., ::2]))


# --------------------------------------------------------------------------
# Calling conventions and the build cache
# --------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(SIGS))
def test_flat_and_shaped_arrays_give_the_same_result(name):
    args = valid_args(name, np.random.default_rng(53))
    flat = [a.reshape(-1) if isinstance(a, np.ndarray) else a for a in args]
    _, shaped_c, _, shaped_py = run_both(name, args, "floor")
    _, flat_c, _, flat_py = run_both(name, flat, "floor")
    for out in (shaped_py, flat_c, flat_py):
        np.testing.assert_array_equal(out.reshape(-1), shaped_c.reshape(-1))


def test_module_rounding_switch_is_the_python_default(monkeypatch):
    args = fc_args(np.random.default_rng(59), np.int8, (3, 37, 5), "moderate")
    outs = {}
    for rounding in ROUNDINGS:
        monkeypatch.setattr(ref, "ROUNDING", rounding)
        a = list(args)
        a[5] = np.zeros_like(args[5])
        assert ref.mmalib_matmul_bias_i8(*a) == ref.C7X_OK
        outs[rounding] = a[5]
        _, out_c, _, _ = run_both("mmalib_matmul_bias_i8", args, rounding)
        np.testing.assert_array_equal(a[5], out_c)
    assert (outs["half_up"] != outs["floor"]).any()
    with pytest.raises(ValueError, match="rounding"):
        ref.mmalib_matmul_bias_i8(*args, rounding="nearest_even")


def test_library_is_built_once_per_source_and_flags(tmp_path):
    first = hostlib.build_library("half_up", cache_dir=tmp_path)
    mtime = first.stat().st_mtime_ns
    again = hostlib.build_library("half_up", cache_dir=tmp_path)
    floor = hostlib.build_library("floor", cache_dir=tmp_path)
    assert again == first and first.stat().st_mtime_ns == mtime
    assert floor != first and floor.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, floor.name])


def test_missing_gcc_is_a_toolchain_error(tmp_path, monkeypatch):
    monkeypatch.setattr(hostlib.shutil, "which", lambda _: None)
    with pytest.raises(ToolchainError, match="gcc"):
        hostlib.build_library("half_up", cache_dir=tmp_path)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_python_rshift_is_floor_division(rounding):
    """reference.rshift shifts int64 right (numpy's shift is arithmetic); it must
    equal floor division by 2^shift after the rounding half, over the whole
    |v| < 2^62 range, negative values, and every shift 0..31."""
    rng = np.random.default_rng(7)
    v = np.concatenate([rng.integers(-2**62 + 2**31, 2**62 - 2**31, 4000, dtype=np.int64),
                        np.arange(-70, 70, dtype=np.int64)])
    shift = rng.integers(0, 32, v.size, dtype=np.int64)
    shift[:32] = np.arange(32)
    half = np.where(shift > 0, np.left_shift(np.int64(1), np.maximum(shift - 1, 0)), 0)
    expected = np.floor_divide(v + (half if rounding == "half_up" else 0), np.left_shift(np.int64(1), shift))
    np.testing.assert_array_equal(ref.rshift(v, shift, rounding), expected)
    assert [int(ref.rshift(np.int64(x), 1, rounding)) for x in (-3, -2, -1)] == \
        ([-1, -1, 0] if rounding == "half_up" else [-2, -1, -1])
