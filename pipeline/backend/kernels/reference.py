"""The kernels of ``c7x_kernels.h`` in numpy / torch: exact integer references.

One function per extern name, with the C argument list (``in`` is spelled
``in_``): numpy arrays where C takes pointers (flat or shaped, exact dtype,
C-contiguous; None = NULL), Python ints for ``int32_t`` scalars and Python
floats for ``float`` ones (taken as float32, as the C call does). Each writes its
result into ``out`` in place and returns the C status code (``C7X_OK`` = 0, or
the ``C7X_ERR_*`` code the C returns for the same arguments, checked in the same
order: NULL, shape, parameter). Problems C cannot detect (a buffer of the wrong
size or dtype, a scalar outside int32) raise ``ValueError`` / ``TypeError``.
``catalog.KERNELS`` maps extern name -> function; every function also takes
``rounding`` ("half_up" | "floor", default :data:`ROUNDING`, the twin of the C
macro ``C7X_ROUNDING``; ignored by kernels that do not round).

Semantics: ``docs/reference.md`` ("Kernel math", "Kernel ABI") as pinned down in
``c7x_kernels.h``.
Arithmetic is exact: products and sums in int64, convolutions in float64 via
``torch.nn.functional.conv2d`` (float32 when that is exact too: see
:func:`conv_accumulate`), which is exact because every partial sum is an
integer of magnitude <= K * 2^30 <= 2^53 (int16 products are <= 2^30, int8 ones
<= 2^14, and the reduction length K is limited to ``MAX_REDUCTION`` = 2^23, the
header's ``C7X_MAX_REDUCTION``), and every such integer is a float64.
The exceptions are the int8 <-> int16 requantize, the average pools and the channel
affine, which are float32 by definition (torch's dequantize, pool / batch_norm, quantize) and computed with numpy
float32 operations in the C's order, each rounded like the C's.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, fields

import numpy as np

ROUNDINGS = ("half_up", "floor")
#: Default rounding of the right shift (the C default is C7X_ROUND_HALF_UP).
ROUNDING = "half_up"

# Status codes and limits: the #defines of c7x_kernels.h (a test compares them).
C7X_OK, C7X_ERR_NULL, C7X_ERR_SHAPE, C7X_ERR_PARAM = 0, 1, 2, 3
MAX_ELEMS = 2**31 - 1
MAX_REDUCTION = 2**23
MAX_SCALE = 127
MAX_SHIFT = 31
# Saturation points inside the requantization (c7x_kernels_ref.c, requantize()):
# they keep int64 from wrapping and cannot change a saturated int8/int16 result.
BIAS_LIMIT = 2**55
SUM_LIMIT = 2**54

_I8, _I16, _I32, _I64, _U8 = (np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64,
                                                     np.uint8))
_BIAS_DTYPE = {_I8: _I32, _I16: _I64}   # bias is int32 for int8 kernels, int64 for int16
# Below every int16 (and int8) value: marks max-pool padding, which must never win.
_POOL_PAD = -32769


# --------------------------------------------------------------------------
# Arithmetic (c7x_kernels.h, "Requantization")
# --------------------------------------------------------------------------

def _check_rounding(rounding: str | None) -> str:
    rounding = ROUNDING if rounding is None else rounding
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    return rounding


def rshift(v: np.ndarray, shift, rounding: str | None = None) -> np.ndarray:
    """The kernels' rounding right shift on int64 values.

    ``v``: int64 array, |v| < 2^62; ``shift``: int or int array in [0, 31],
    broadcast against ``v``. "half_up": floor((v + 2^(shift-1)) / 2^shift) for
    shift > 0; "floor": floor(v / 2^shift); shift 0 returns v. Exact: numpy's
    right shift of int64 is arithmetic, i.e. floor division by 2^shift (tested
    against floor_divide), the twin of ``rshift_round`` in c7x_kernels_ref.c.
    """
    rounding = _check_rounding(rounding)
    v = np.asarray(v, dtype=np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    if rounding == "half_up":
        v = v + np.where(shift > 0, np.left_shift(np.int64(1), np.maximum(shift - 1, 0)), 0)
    return np.right_shift(v, shift)


def saturate(v: np.ndarray, dtype) -> np.ndarray:
    """Clip int64 ``v`` to the range of ``dtype`` (int8 / int16) and cast."""
    info = np.iinfo(dtype)
    return np.clip(v, info.min, info.max).astype(dtype)


def requantize(acc: np.ndarray, bias, scale, shift, dtype,
               rounding: str | None = None, act: tuple[int, int] | None = None) -> np.ndarray:
    """out = clamp(rshift((acc + bias[c]) * scale[c], shift[c]), act) per channel c;
    ``act``: the saturation range ``(act_min, act_max)`` (a fused ReLU / clip), None =
    the range of ``dtype``.

    ``acc``: int64 [C, ...] exact accumulators (channel axis first), |acc| <= 2^53;
    ``bias`` int32/int64 [C], ``scale`` / ``shift`` uint8 [C], None = 0 / 1 / 0;
    ``dtype``: output int8 / int16. Bias is clamped to +-2^55 and the sum to
    +-2^54 exactly as the C does; neither can change the saturated result.
    """
    return _requantize_in_place(acc.astype(np.int64), bias, scale, shift, dtype, rounding, act)


def act_range_ok(act: tuple[int, int], dtype) -> bool:
    """``act_min <= act_max``, both in the range of ``dtype`` (the C's ``act_range_ok``)."""
    info = np.iinfo(dtype)
    return info.min <= act[0] <= act[1] <= info.max


def _requantize_in_place(total: np.ndarray, bias, scale, shift, dtype, rounding: str | None,
                         act: tuple[int, int] | None = None) -> np.ndarray:
    """:func:`requantize` of int64 accumulators ``total``, which it overwrites."""
    channels = total.shape[0]
    per_channel = (slice(None),) + (None,) * (total.ndim - 1)

    def channel_values(values, default):
        if values is None:
            return np.full(channels, default, dtype=np.int64)
        return np.asarray(values, dtype=np.int64).reshape(channels)

    b = np.clip(channel_values(bias, 0), -BIAS_LIMIT, BIAS_LIMIT)
    s = channel_values(scale, 1)
    sh = channel_values(shift, 0)
    # rshift and saturate, in place: the temporaries of the composed form
    # cost a third of MobileNetV2's reference run.
    total += b[per_channel]
    np.clip(total, -SUM_LIMIT, SUM_LIMIT, out=total)
    total *= s[per_channel]
    if _check_rounding(rounding) == "half_up":
        total += np.where(sh > 0, np.left_shift(np.int64(1), np.maximum(sh - 1, 0)), 0)[per_channel]
    total >>= sh[per_channel]
    info = np.iinfo(dtype)
    lo, hi = act if act is not None else (info.min, info.max)
    np.clip(total, max(lo, info.min), min(hi, info.max), out=total)
    return total.astype(dtype)


# --------------------------------------------------------------------------
# Argument checks shared by every kernel (twins of the C checks)
# --------------------------------------------------------------------------

def _elem_count(*dims: int) -> int:
    """Product of ``dims``, or -1 if a factor is <= 0 or it exceeds MAX_ELEMS."""
    count = 1
    for d in dims:
        if d <= 0:
            return -1
        count *= d
    return count if count <= MAX_ELEMS else -1


def _conv_out_size(size: int, k: int, stride: int, pad_a: int, pad_b: int) -> int:
    """(size + pad_a + pad_b - k) // stride + 1, or 0 if out of range / no window."""
    if size <= 0 or k <= 0 or stride <= 0 or pad_a < 0 or pad_b < 0:
        return 0
    span = size + pad_a + pad_b - k
    if span < 0 or span > MAX_ELEMS:
        return 0
    return span // stride + 1


def _int32(name: str, value) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value)}")
    if not -2**31 <= int(value) < 2**31:
        raise ValueError(f"{name}={value} does not fit int32")
    return int(value)


def _array(name: str, arr, shape: tuple[int, ...], dtype: np.dtype, output: bool = False):
    """``arr`` viewed as ``shape``; it must hold exactly that many ``dtype`` values
    (and be C-contiguous and writeable when the kernel writes it)."""
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(arr)}")
    if arr.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {arr.dtype}")
    if arr.size != int(np.prod(shape)):
        raise ValueError(f"{name} holds {arr.size} elements, the arguments imply {shape}")
    if output and not (arr.flags.c_contiguous and arr.flags.writeable):
        raise ValueError(f"{name} is written in place: it must be C-contiguous and writeable")
    return arr.reshape(shape)


def _requant_params_ok(scale, shift) -> bool:
    return ((scale is None or int(scale.max()) <= MAX_SCALE) and
            (shift is None or int(shift.max()) <= MAX_SHIFT))


# --------------------------------------------------------------------------
# Geometries: sizes implied by the scalar arguments (field names = C names)
# --------------------------------------------------------------------------

class _Geometry:
    """Field names are the C parameter names, so a geometry can be built from a
    kernel's bound arguments (``catalog.buffer_shapes``). Fields must be int32 values
    (like the C scalars); they are stored as Python ints so that size products
    never wrap around."""

    def __post_init__(self):
        for f in fields(self):
            object.__setattr__(self, f.name, _int32(f.name, getattr(self, f.name)))

    @classmethod
    def from_arguments(cls, arguments: dict):
        return cls(**{f.name: arguments[f.name] for f in fields(cls) if f.name in arguments})


@dataclass(frozen=True)
class ConvGeometry(_Geometry):
    """NCHW convolution, N = 1, OIHW weights [C_out, C_in / groups, KH, KW]."""

    C_in: int
    H_in: int
    W_in: int
    C_out: int
    KH: int
    KW: int
    stride_h: int
    stride_w: int
    pad_top: int
    pad_bottom: int
    pad_left: int
    pad_right: int
    groups: int = 1

    @property
    def H_out(self) -> int:
        return _conv_out_size(self.H_in, self.KH, self.stride_h, self.pad_top, self.pad_bottom)

    @property
    def W_out(self) -> int:
        return _conv_out_size(self.W_in, self.KW, self.stride_w, self.pad_left, self.pad_right)

    @property
    def reduction(self) -> int:
        """K = C_in / groups * KH * KW, the length of each dot product."""
        return _elem_count(self.C_in // self.groups, self.KH, self.KW)

    def status(self) -> int:
        """C7X_OK, or C7X_ERR_SHAPE exactly when ``conv_check`` in C says so."""
        if (self.C_in <= 0 or self.C_out <= 0 or self.groups <= 0 or
                self.C_in % self.groups or self.C_out % self.groups):
            return C7X_ERR_SHAPE
        k = self.reduction
        if (self.H_out <= 0 or self.W_out <= 0 or _elem_count(self.C_in, self.H_in, self.W_in) < 0
                or _elem_count(self.C_out, self.H_out, self.W_out) < 0 or k < 0
                or k > MAX_REDUCTION or _elem_count(self.C_out, k) < 0):
            return C7X_ERR_SHAPE
        return C7X_OK

    def shapes(self) -> dict[str, tuple[int, ...]]:
        ch = (self.C_out,)
        return {"in": (1, self.C_in, self.H_in, self.W_in),
                "w": (self.C_out, self.C_in // self.groups, self.KH, self.KW),
                "bias": ch, "scale": ch, "shift": ch,
                "out": (1, self.C_out, self.H_out, self.W_out)}


@dataclass(frozen=True)
class DepthwiseGeometry(_Geometry):
    """Depthwise convolution: groups = C_in = C_out = C, w [C * KH * KW]."""

    C: int
    H_in: int
    W_in: int
    KH: int
    KW: int
    stride_h: int
    stride_w: int
    pad_top: int
    pad_bottom: int
    pad_left: int
    pad_right: int
    num_groups: int

    def conv(self) -> ConvGeometry:
        return ConvGeometry(self.C, self.H_in, self.W_in, self.C, self.KH, self.KW,
                            self.stride_h, self.stride_w, self.pad_top, self.pad_bottom,
                            self.pad_left, self.pad_right, groups=self.C)

    def status(self) -> int:
        return C7X_ERR_SHAPE if self.num_groups != self.C else self.conv().status()

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return self.conv().shapes()


@dataclass(frozen=True)
class MatmulGeometry(_Geometry):
    """Fully connected: in [M, K], w [N, K], out [M, N]."""

    M: int
    K: int
    N: int

    def status(self) -> int:
        if (_elem_count(self.M, self.K) < 0 or _elem_count(self.N, self.K) < 0 or
                _elem_count(self.M, self.N) < 0 or self.K > MAX_REDUCTION):
            return C7X_ERR_SHAPE
        return C7X_OK

    def shapes(self) -> dict[str, tuple[int, ...]]:
        n = (self.N,)
        return {"in": (self.M, self.K), "w": (self.N, self.K), "bias": n, "scale": n,
                "shift": n, "out": (self.M, self.N)}


@dataclass(frozen=True)
class ElementwiseGeometry(_Geometry):
    """n elements (residual add, ReLU, clamp, table lookup, requantize); params is the
    16-byte blob, table the 256 entries of the lookup."""

    n: int

    def status(self) -> int:
        return C7X_OK if _elem_count(self.n) > 0 else C7X_ERR_SHAPE

    def shapes(self) -> dict[str, tuple[int, ...]]:
        v = (self.n,)
        return {"in": v, "x": v, "skip": v, "out": v, "params": (16,), "table": (256,)}


@dataclass(frozen=True)
class BroadcastAddGeometry(_Geometry):
    """Residual add with a broadcast skip: x, out [d0, d1, d2] contiguous; skip [skip_size]
    read at ``i0 s0 + i1 s1 + i2`` (element strides >= 0, 0 along a broadcast axis)."""

    skip_size: int
    d0: int
    d1: int
    d2: int
    s0: int
    s1: int

    def status(self) -> int:
        if _elem_count(self.d0, self.d1, self.d2) < 0 or self.skip_size <= 0 or min(self.s0, self.s1) < 0:
            return C7X_ERR_SHAPE
        end = self.s0 * (self.d0 - 1) + self.s1 * (self.d1 - 1) + self.d2
        return C7X_OK if end <= self.skip_size else C7X_ERR_SHAPE

    def shapes(self) -> dict[str, tuple[int, ...]]:
        v = (self.d0 * self.d1 * self.d2,)
        return {"x": v, "skip": (self.skip_size,), "out": v, "params": (16,)}

    def skip_index(self) -> np.ndarray:
        """Flat skip index of each output element, int64 [d0 d1 d2]."""
        i0 = np.arange(self.d0, dtype=np.int64)[:, None, None] * self.s0
        i1 = np.arange(self.d1, dtype=np.int64)[None, :, None] * self.s1
        return (i0 + i1 + np.arange(self.d2, dtype=np.int64)).ravel()


def _pool_size_ok(size: int, k: int, stride: int, pad: int, out: int) -> bool:
    """``out`` is the floor-mode or torch's ceil-mode size; pad < k."""
    floor_out = _conv_out_size(size, k, stride, pad, pad)
    if floor_out <= 0 or pad >= k:
        return False
    ceil_out = (size + 2 * pad - k + stride - 1) // stride + 1
    if (ceil_out - 1) * stride >= size + pad:
        ceil_out -= 1
    return out in (floor_out, ceil_out)


@dataclass(frozen=True)
class PoolGeometry(_Geometry):
    """Max pool: in [N, C, H_in, W_in], out [N, C, H_out, W_out]."""

    N: int
    C: int
    H_in: int
    W_in: int
    H_out: int
    W_out: int
    kH: int
    kW: int
    sH: int
    sW: int
    pH: int
    pW: int

    def status(self) -> int:
        if (_elem_count(self.N, self.C) < 0 or
                _elem_count(self.N, self.C, self.H_in, self.W_in) < 0 or
                _elem_count(self.N, self.C, self.H_out, self.W_out) < 0 or
                not _pool_size_ok(self.H_in, self.kH, self.sH, self.pH, self.H_out) or
                not _pool_size_ok(self.W_in, self.kW, self.sW, self.pW, self.W_out)):
            return C7X_ERR_SHAPE
        return C7X_OK

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {"in": (self.N, self.C, self.H_in, self.W_in),
                "out": (self.N, self.C, self.H_out, self.W_out)}


# --------------------------------------------------------------------------
# Kernel families
# --------------------------------------------------------------------------

FLOAT32_EXACT = 2**24   # every integer of magnitude <= 2^24 is a float32


def _max_abs(a: np.ndarray) -> int:
    """max |a| of an integer array, as a Python int (np.abs(int8 -128) wraps)."""
    return max(-int(a.min()), int(a.max())) if a.size else 0


def conv_accumulate(x: np.ndarray, w: np.ndarray, g: ConvGeometry, pad_value: int = 0) -> np.ndarray:
    """Exact integer accumulators int64 [C_out, H_out, W_out] of an NCHW conv.

    ``x`` [1, C_in, H_in, W_in] and ``w`` [C_out, C_in / groups, KH, KW] integer
    arrays. Padding pixels read ``pad_value`` (c7x_kernels.h: the input zero point).
    float64 conv2d is exact here,
    see the module docstring (K <= MAX_REDUCTION is checked by ``g.status()``).
    float32 is exact too, in any summation order, when every partial sum is an
    integer of at most 2^24 (the float32 significand, IEEE 754): guaranteed by
    K * max|x| * max|w| <= 2^24, which holds for int8 depthwise 3x3 (9 * 2^14)
    and most int8 pointwise layers; it is 4-5x faster on the CPU.
    """
    x_max = max(_max_abs(x), abs(int(pad_value)))
    dtype = np.float32 if x_max * _max_abs(w) * g.reduction <= FLOAT32_EXACT else np.float64
    import torch  # late: the catalog (and the performance model) read this module without torch
    import torch.nn.functional as F

    xt = torch.from_numpy(x.astype(dtype))
    wt = torch.from_numpy(w.astype(dtype))
    padding = (g.pad_top, g.pad_left)
    if padding != (g.pad_bottom, g.pad_right) or pad_value:   # conv2d pads with 0, symmetrically only
        xt = F.pad(xt, (g.pad_left, g.pad_right, g.pad_top, g.pad_bottom), value=float(pad_value))
        padding = (0, 0)
    acc = F.conv2d(xt, wt, stride=(g.stride_h, g.stride_w), padding=padding, groups=g.groups)
    return acc[0].numpy().astype(np.int64)


def _conv(in_, w, bias, scale, shift, out, g, dtype: np.dtype, rounding, act: tuple[int, int],
          pad_value: int) -> int:
    """Plain, grouped and depthwise convolution (``g``: Conv/DepthwiseGeometry); padding
    pixels read ``pad_value``, which must lie in ``dtype``'s range."""
    rounding = _check_rounding(rounding)
    if in_ is None or w is None or out is None:
        return C7X_ERR_NULL
    status = g.status()
    if status != C7X_OK:
        return status
    sh = g.shapes()
    x = _array("in", in_, sh["in"], dtype)
    wv = _array("w", w, sh["w"], dtype)
    y = _array("out", out, sh["out"], dtype, output=True)
    b = None if bias is None else _array("bias", bias, sh["bias"], _BIAS_DTYPE[dtype])
    s = None if scale is None else _array("scale", scale, sh["scale"], _U8)
    t = None if shift is None else _array("shift", shift, sh["shift"], _U8)
    pad_value, info = _int32("pad_value", pad_value), np.iinfo(dtype)
    if not _requant_params_ok(s, t) or not act_range_ok(act, dtype) or not info.min <= pad_value <= info.max:
        return C7X_ERR_PARAM
    geometry = g.conv() if isinstance(g, DepthwiseGeometry) else g
    y[0] = _requantize_in_place(conv_accumulate(x, wv, geometry, pad_value), b, s, t, dtype, rounding, act)
    return C7X_OK


def _matmul(in_, w, bias, scale, shift, out, g: MatmulGeometry, dtype: np.dtype, rounding,
            act: tuple[int, int]) -> int:
    """out[m, n] = requant(sum_k in[m, k] * w[n, k], channel n), exact in int64."""
    rounding = _check_rounding(rounding)
    if in_ is None or w is None or out is None:
        return C7X_ERR_NULL
    status = g.status()
    if status != C7X_OK:
        return status
    sh = g.shapes()
    x = _array("in", in_, sh["in"], dtype).astype(np.int64)
    wv = _array("w", w, sh["w"], dtype).astype(np.int64)
    y = _array("out", out, sh["out"], dtype, output=True)
    b = None if bias is None else _array("bias", bias, sh["bias"], _BIAS_DTYPE[dtype])
    s = None if scale is None else _array("scale", scale, sh["scale"], _U8)
    t = None if shift is None else _array("shift", shift, sh["shift"], _U8)
    if not _requant_params_ok(s, t) or not act_range_ok(act, dtype):
        return C7X_ERR_PARAM
    acc = (x @ wv.T).T                         # [N, M]: requantize wants channels first
    y[...] = requantize(acc, b, s, t, dtype, rounding, act).T
    return C7X_OK


def parse_residual_params(params: np.ndarray) -> dict[str, int]:
    """Decode the 16-byte little-endian residual-add blob (docs/reference.md,
    "Residual add"): int32 M_x, M_skip, shift at bytes 0-11; int8 zp_x, zp_skip,
    zp_out at 12-14."""
    raw = params.reshape(-1).tobytes()
    m_x, m_skip, shift = (int(v) for v in np.frombuffer(raw[:12], dtype="<i4"))
    zp_x, zp_skip, zp_out = (int(v) for v in np.frombuffer(raw[12:15], dtype=np.int8))
    return {"M_x": m_x, "M_skip": m_skip, "shift": shift, "zp_x": zp_x, "zp_skip": zp_skip,
            "zp_out": zp_out}


def _residual(x, skip, params, out, n, has_relu, dtype: np.dtype, rounding) -> int:
    """out = saturate([max(., zp_out)] rshift(dx * M_x + ds * M_skip, shift) + zp_out)."""
    rounding = _check_rounding(rounding)
    if x is None or skip is None or params is None or out is None:
        return C7X_ERR_NULL
    g = ElementwiseGeometry(_int32("n", n))
    if g.status() != C7X_OK:
        return g.status()
    _int32("has_relu", has_relu)
    sh = g.shapes()
    p = parse_residual_params(_array("params", params, sh["params"], _U8))
    xv = _array("x", x, sh["x"], dtype).astype(np.int64)
    sv = _array("skip", skip, sh["skip"], dtype).astype(np.int64)
    y = _array("out", out, sh["out"], dtype, output=True)
    if not 0 <= p["shift"] <= MAX_SHIFT:
        return C7X_ERR_PARAM
    # |dx * M_x + ds * M_skip| <= 2 * 2^16 * 2^31 = 2^48: exact in int64.
    total = (xv - p["zp_x"]) * p["M_x"] + (sv - p["zp_skip"]) * p["M_skip"]
    r = rshift(total, p["shift"], rounding) + p["zp_out"]
    if has_relu != 0:
        r = np.maximum(r, p["zp_out"])
    y[...] = saturate(r, dtype)
    return C7X_OK


def _max_pool(in_, out, g: PoolGeometry, dtype=_I8) -> int:
    """Windows clipped to the input: padding is filled with a value below every
    int16 (so every int8), which never wins because no window is all padding (``g.status()``)."""
    if in_ is None or out is None:
        return C7X_ERR_NULL
    if g.status() != C7X_OK:
        return g.status()
    sh = g.shapes()
    x = _array("in", in_, sh["in"], dtype)
    y = _array("out", out, sh["out"], dtype, output=True)
    bottom = max(0, (g.H_out - 1) * g.sH + g.kH - g.pH - g.H_in)
    right = max(0, (g.W_out - 1) * g.sW + g.kW - g.pW - g.W_in)
    padded = np.pad(x.astype(np.int32), ((0, 0), (0, 0), (g.pH, bottom), (g.pW, right)),
                    constant_values=_POOL_PAD)
    windows = np.lib.stride_tricks.sliding_window_view(padded, (g.kH, g.kW), axis=(2, 3))
    windows = windows[:, :, ::g.sH, ::g.sW][:, :, :g.H_out, :g.W_out]
    y[...] = windows.max(axis=(-2, -1)).astype(dtype)
    return C7X_OK


def _elementwise_status(in_, out, n) -> int:
    """NULL / size status of an int8 elementwise kernel (ReLU, clamp)."""
    if in_ is None or out is None:
        return C7X_ERR_NULL
    return ElementwiseGeometry(n).status()


def _elementwise(in_, out, n, fn) -> int:
    """out = saturate(fn(in)) for int8 in / out [n], after a passing status."""
    sh = ElementwiseGeometry(n).shapes()
    x = _array("in", in_, sh["in"], _I8).astype(np.int64)
    y = _array("out", out, sh["out"], _I8, output=True)
    y[...] = saturate(fn(x), np.int8)
    return C7X_OK


# --------------------------------------------------------------------------
# The extern names of c7x_kernels.h
# --------------------------------------------------------------------------

def mmalib_conv2d_i8(in_, w, bias, scale, shift, out, C_in, H_in, W_in, C_out, KH, KW,
                     stride_h, stride_w, pad_top, pad_bottom, pad_left, pad_right,
                     pad_value, act_min, act_max, rounding=None) -> int:
    """int8 conv2d, groups = 1: in int8 [1, C_in, H_in, W_in] (NCHW), w int8
    [C_out, C_in, KH, KW] (OIHW), bias int32 [C_out], scale / shift uint8 [C_out]
    (None = 0 / 1 / 0), out int8 [1, C_out, H_out, W_out] with
    H_out = (H_in + pad_top + pad_bottom - KH) // stride_h + 1 (W alike); padding
    pixels read ``pad_value`` (the input zero point, in the int8 range).
    out = clamp(rshift((acc + bias) * scale, shift), act_min, act_max), docs/reference.md,
    "Kernel math"; [act_min, act_max] is the int8 range or a fused activation's bounds."""
    g = ConvGeometry(C_in, H_in, W_in, C_out, KH, KW, stride_h, stride_w, pad_top, pad_bottom,
                     pad_left, pad_right)
    return _conv(in_, w, bias, scale, shift, out, g, _I8, rounding, (act_min, act_max), pad_value)


def mmalib_conv2d_i16(in_, w, bias, scale, shift, out, C_in, H_in, W_in, C_out, KH, KW,
                      stride_h, stride_w, pad_top, pad_bottom, pad_left, pad_right,
                      pad_value, act_min, act_max, rounding=None) -> int:
    """int16 conv2d: as :func:`mmalib_conv2d_i8` with int16 in / w / out and int64 bias."""
    g = ConvGeometry(C_in, H_in, W_in, C_out, KH, KW, stride_h, stride_w, pad_top, pad_bottom,
                     pad_left, pad_right)
    return _conv(in_, w, bias, scale, shift, out, g, _I16, rounding, (act_min, act_max), pad_value)


def mmalib_conv2d_i8_grouped_loop(in_, w, bias, scale, shift, out, C_in, H_in, W_in, C_out,
                                  KH, KW, stride_h, stride_w, pad_top, pad_bottom, pad_left,
                                  pad_right, groups, pad_value, act_min, act_max, rounding=None) -> int:
    """Grouped int8 conv2d: as :func:`mmalib_conv2d_i8` with w int8
    [C_out, C_in / groups, KH, KW]; groups must divide C_in and C_out."""
    g = ConvGeometry(C_in, H_in, W_in, C_out, KH, KW, stride_h, stride_w, pad_top, pad_bottom,
                     pad_left, pad_right, groups)
    return _conv(in_, w, bias, scale, shift, out, g, _I8, rounding, (act_min, act_max), pad_value)


def mmalib_depthwise_conv2d_i8(in_, w, bias, scale, shift, out, C, H_in, W_in, KH, KW,
                               stride_h, stride_w, pad_top, pad_bottom, pad_left, pad_right,
                               num_groups, pad_value, act_min, act_max, rounding=None) -> int:
    """Depthwise int8 conv2d (groups = C): in / out int8 [1, C, H, W], w int8
    [C * KH * KW] (natural order = OIHW with I = 1), bias int32 [C],
    scale / shift uint8 [C]; num_groups must equal C."""
    g = DepthwiseGeometry(C, H_in, W_in, KH, KW, stride_h, stride_w, pad_top, pad_bottom,
                          pad_left, pad_right, num_groups)
    return _conv(in_, w, bias, scale, shift, out, g, _I8, rounding, (act_min, act_max), pad_value)


def mmalib_depthwise_conv2d_i16(in_, w, bias, scale, shift, out, C, H_in, W_in, KH, KW,
                                stride_h, stride_w, pad_top, pad_bottom, pad_left, pad_right,
                                num_groups, pad_value, act_min, act_max, rounding=None) -> int:
    """Depthwise int16 conv2d: as the int8 one with int16 tensors and int64 bias."""
    g = DepthwiseGeometry(C, H_in, W_in, KH, KW, stride_h, stride_w, pad_top, pad_bottom,
                          pad_left, pad_right, num_groups)
    return _conv(in_, w, bias, scale, shift, out, g, _I16, rounding, (act_min, act_max), pad_value)


def mmalib_matmul_bias_i8(in_, w, bias, scale, shift, out, M, K, N, act_min, act_max,
                          rounding=None) -> int:
    """int8 fully connected: in int8 [M, K], w int8 [N, K], bias int32 [N],
    scale / shift uint8 [N], out int8 [M, N]; requantized per output column n."""
    return _matmul(in_, w, bias, scale, shift, out, MatmulGeometry(M, K, N), _I8, rounding,
                   (act_min, act_max))


def mmalib_matmul_bias_i16(in_, w, bias, scale, shift, out, M, K, N, act_min, act_max,
                           rounding=None) -> int:
    """int16 fully connected: as the int8 one with int16 tensors and int64 bias."""
    return _matmul(in_, w, bias, scale, shift, out, MatmulGeometry(M, K, N), _I16, rounding,
                   (act_min, act_max))


def c7x_int8_residual_add_relu(x, skip, params, out, n, has_relu, rounding=None) -> int:
    """int8 residual add (docs/reference.md, "Residual add"): x, skip, out int8 [n], params
    uint8 [16]; r = rshift((x - zp_x) M_x + (skip - zp_skip) M_skip, shift) + zp_out,
    then max(r, zp_out) if has_relu, then saturate."""
    return _residual(x, skip, params, out, n, has_relu, _I8, rounding)


def c7x_int16_residual_add_relu(x, skip, params, out, n, has_relu, rounding=None) -> int:
    """int16 residual add: as the int8 one with int16 tensors (same blob)."""
    return _residual(x, skip, params, out, n, has_relu, _I16, rounding)


def _broadcast_add(x, skip, params, out, dims: tuple, has_relu, dtype: np.dtype, rounding) -> int:
    """The residual add of x with the skip gathered at :meth:`BroadcastAddGeometry.skip_index`."""
    if x is None or skip is None or params is None or out is None:
        return C7X_ERR_NULL
    g = BroadcastAddGeometry(*(_int32(f.name, v) for f, v in zip(fields(BroadcastAddGeometry), dims)))
    if g.status() != C7X_OK:
        return g.status()
    full = _array("skip", skip, g.shapes()["skip"], dtype)[g.skip_index()]
    return _residual(x, np.ascontiguousarray(full), params, out, g.d0 * g.d1 * g.d2, has_relu, dtype, rounding)


def c7x_int8_broadcast_add(x, skip, params, out, skip_size, d0, d1, d2, s0, s1, has_relu,
                           rounding=None) -> int:
    """int8 residual add with a broadcast skip (docs/reference.md, "Broadcast add"): x, out int8
    [d0, d1, d2], skip int8 [skip_size] read at i0 s0 + i1 s1 + i2; params and formula as
    :func:`c7x_int8_residual_add_relu`."""
    return _broadcast_add(x, skip, params, out, (skip_size, d0, d1, d2, s0, s1), has_relu, _I8, rounding)


def c7x_int16_broadcast_add(x, skip, params, out, skip_size, d0, d1, d2, s0, s1, has_relu,
                            rounding=None) -> int:
    """int16 residual add with a broadcast skip: as the int8 one with int16 tensors."""
    return _broadcast_add(x, skip, params, out, (skip_size, d0, d1, d2, s0, s1), has_relu, _I16, rounding)


def c7x_int8_max_pool(in_, out, N, C, H_in, W_in, H_out, W_out, kH, kW, sH, sW, pH, pW,
                      rounding=None) -> int:
    """int8 max pool (docs/reference.md, "Max pool"): in int8 [N, C, H_in, W_in], out int8
    [N, C, H_out, W_out], symmetric padding pH / pW that never wins; H_out is the
    floor- or ceil-mode size, pH < kH. ``rounding`` is unused (no arithmetic)."""
    g = PoolGeometry(N, C, H_in, W_in, H_out, W_out, kH, kW, sH, sW, pH, pW)
    return _max_pool(in_, out, g)


def c7x_int8_max_pool_tidl(in_, out, N, C, H_in, W_in, H_out, W_out, kH, kW, sH, sW, pH, pW,
                           rounding=None) -> int:
    """The TIDL-library name of :func:`c7x_int8_max_pool`; same function."""
    g = PoolGeometry(N, C, H_in, W_in, H_out, W_out, kH, kW, sH, sW, pH, pW)
    return _max_pool(in_, out, g)


def c7x_int16_max_pool(in_, out, N, C, H_in, W_in, H_out, W_out, kH, kW, sH, sW, pH, pW,
                       rounding=None) -> int:
    """:func:`c7x_int8_max_pool` on int16 (ours: TI's library names no int16 max pool)."""
    g = PoolGeometry(N, C, H_in, W_in, H_out, W_out, kH, kW, sH, sW, pH, pW)
    return _max_pool(in_, out, g, _I16)


def c7x_int8_relu(in_, out, n, zp, rounding=None) -> int:
    """out = saturate(max(in, zp)); in / out int8 [n] (docs/reference.md, "ReLU pass")."""
    zp = _int32("zp", zp)
    status = _elementwise_status(in_, out, n)
    if status != C7X_OK:
        return status
    return _elementwise(in_, out, n, lambda x: np.maximum(x, zp))


def c7x_int8_clamp(in_, out, n, lo, hi, rounding=None) -> int:
    """out = saturate(min(max(in, lo), hi)); in / out int8 [n]; lo > hi is
    C7X_ERR_PARAM (docs/reference.md, "ReLU pass": clip with equal quantization)."""
    lo, hi = _int32("lo", lo), _int32("hi", hi)
    status = _elementwise_status(in_, out, n)
    if status != C7X_OK:
        return status
    if lo > hi:
        return C7X_ERR_PARAM
    return _elementwise(in_, out, n, lambda x: np.minimum(np.maximum(x, lo), hi))


CHANNEL_MUL_SHIFT_MAX = 62
_CHANNEL_MUL_M_LIMIT = {_I8: 2**31, _I16: 2**29}


@dataclass(frozen=True)
class ChannelMulGeometry(_Geometry):
    """Squeeze-excitation multiply: x / out [planes, hw], gate [planes]."""

    planes: int
    hw: int

    def status(self) -> int:
        return C7X_OK if _elem_count(self.planes, self.hw) > 0 else C7X_ERR_SHAPE

    def shapes(self) -> dict[str, tuple[int, ...]]:
        v = (self.planes, self.hw)
        return {"x": v, "out": v, "gate": (self.planes,), "params": (16,)}


def _channel_mul(x, gate, params, out, planes, hw, dtype: np.dtype, rounding) -> int:
    """out = saturate(rshift((x - zp_x) * (gate - zp_g) * M, shift) + zp_out) per plane."""
    rounding = _check_rounding(rounding)
    if x is None or gate is None or params is None or out is None:
        return C7X_ERR_NULL
    g = ChannelMulGeometry(planes, hw)
    if g.status() != C7X_OK:
        return g.status()
    sh = g.shapes()
    raw = _array("params", params, sh["params"], _U8).reshape(-1).tobytes()
    m, shift = (int(v) for v in np.frombuffer(raw[:8], dtype="<i4"))
    zp_x, zp_g, zp_out = (int(v) for v in np.frombuffer(raw[12:15], dtype=np.int8))
    xv = _array("x", x, sh["x"], dtype).astype(np.int64)
    gv = _array("gate", gate, sh["gate"], dtype).astype(np.int64)
    y = _array("out", out, sh["out"], dtype, output=True)
    if not (0 <= m < _CHANNEL_MUL_M_LIMIT[dtype] and 0 <= shift <= CHANNEL_MUL_SHIFT_MAX):
        return C7X_ERR_PARAM
    # |dx * dg * M| < 2^61 (header): exact in int64.
    total = (xv - zp_x) * ((gv - zp_g) * m)[:, None]
    y[...] = saturate(rshift(total, shift, rounding) + zp_out, dtype)
    return C7X_OK


def c7x_int8_channel_mul(x, gate, params, out, planes, hw, rounding=None) -> int:
    """int8 squeeze-excitation multiply (docs/reference.md, "Squeeze-excitation multiply"):
    x / out int8 [planes, hw], gate int8 [planes], params uint8 [16] (int32 M, shift at
    bytes 0-7, int8 zp_x, zp_g, zp_out at 12-14); M < 2^31, shift <= 62."""
    return _channel_mul(x, gate, params, out, planes, hw, _I8, rounding)


def c7x_int16_channel_mul(x, gate, params, out, planes, hw, rounding=None) -> int:
    """int16 squeeze-excitation multiply: as the int8 one with int16 tensors, M < 2^29."""
    return _channel_mul(x, gate, params, out, planes, hw, _I16, rounding)


#: activation x activation matmul: the longest reduction (keeps |acc * M| below 2^61) and the
#: multiplier width per dtype (|acc| < K 2^16 for int8 with zero points 0 / -128, K 2^30 for int16)
BATCH_MATMUL_MAX_K = 1 << 14
BATCH_MATMUL_M_BITS = {_I8: 31, _I16: 17}
#: zero points an MMA operand can carry: a signed (0) or an unsigned (-128) int8 operand; int16 is symmetric
BATCH_MATMUL_ZERO_POINTS = {_I8: (0, -128), _I16: (0,)}


def _operand_span(offset: int, strides: tuple[int, ...], dims: tuple[int, ...]) -> int:
    """One past the largest flat index of a strided view, or -1 for a negative offset or stride."""
    if offset < 0 or any(s < 0 for s in strides):
        return -1
    return offset + sum(s * (d - 1) for s, d in zip(strides, dims)) + 1


@dataclass(frozen=True)
class BatchMatmulGeometry(_Geometry):
    """Activation x activation matmul on strided views: ``a`` [a_size] and ``b`` [b_size]
    are whole source buffers; operand A[i, m, k] = a[a_offset + i a_sb + m a_sm + k a_sk],
    B[i, k, n] = b[b_offset + i b_sb + k b_sk + n b_sn] (element strides, >= 0); out
    [batch, M, N] contiguous; params the 16-byte blob. Each operand needs a unit stride on
    one of its two matrix axes (rows or columns: the streaming engine reads either, a
    transposed one by its transpose mode)."""

    a_size: int
    b_size: int
    batch: int
    M: int
    K: int
    N: int
    a_offset: int
    a_sb: int
    a_sm: int
    a_sk: int
    b_offset: int
    b_sb: int
    b_sk: int
    b_sn: int

    def status(self) -> int:
        if (_elem_count(self.batch, self.M, self.N) < 0 or _elem_count(self.a_size) < 0
                or _elem_count(self.b_size) < 0 or not 0 < self.K <= BATCH_MATMUL_MAX_K):
            return C7X_ERR_SHAPE
        dims = (self.batch, self.M, self.K)
        a_end = _operand_span(self.a_offset, (self.a_sb, self.a_sm, self.a_sk), dims)
        b_end = _operand_span(self.b_offset, (self.b_sb, self.b_sk, self.b_sn), (self.batch, self.K, self.N))
        if not (0 < a_end <= self.a_size and 0 < b_end <= self.b_size):
            return C7X_ERR_SHAPE
        if 1 not in (self.a_sk, self.a_sm) or 1 not in (self.b_sn, self.b_sk):
            return C7X_ERR_PARAM
        return C7X_OK

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {"a": (self.a_size,), "b": (self.b_size,), "params": (16,), "out": (self.batch, self.M, self.N)}

    def macs(self) -> int:
        """Multiply-accumulates of one call: batch * M * K * N."""
        return self.batch * self.M * self.K * self.N


def _batch_matmul(a, b, params, out, dims: tuple, dtype: np.dtype, rounding) -> int:
    """out[i, m, n] = saturate(rshift(sum_k (A[i,m,k] - za)(B[i,k,n] - zb) * M, shift) + zo)."""
    rounding = _check_rounding(rounding)
    if a is None or b is None or params is None or out is None:
        return C7X_ERR_NULL
    g = BatchMatmulGeometry(*(_int32(f.name, v) for f, v in zip(fields(BatchMatmulGeometry), dims)))
    if g.status() != C7X_OK:
        return g.status()
    sh = g.shapes()
    raw = _array("params", params, sh["params"], _U8).reshape(-1).tobytes()
    m, shift = (int(v) for v in np.frombuffer(raw[:8], dtype="<i4"))
    za, zb, zo = (int(v) for v in np.frombuffer(raw[12:15], dtype=np.int8))
    if not (0 <= m < 2 ** BATCH_MATMUL_M_BITS[dtype] and 0 <= shift <= CHANNEL_MUL_SHIFT_MAX
            and za in BATCH_MATMUL_ZERO_POINTS[dtype] and zb in BATCH_MATMUL_ZERO_POINTS[dtype]
            and (dtype == _I8 or zo == 0)):
        return C7X_ERR_PARAM
    av = _array("a", a, sh["a"], dtype).astype(np.int64)
    bv = _array("b", b, sh["b"], dtype).astype(np.int64)
    y = _array("out", out, sh["out"], dtype, output=True)
    i, r, k, n = (np.arange(d)[:, None, None] for d in (g.batch, g.M, g.K, g.N))
    A = av[g.a_offset + i * g.a_sb + r.reshape(1, -1, 1) * g.a_sm + k.reshape(1, 1, -1) * g.a_sk] - za
    B = bv[g.b_offset + i * g.b_sb + k.reshape(1, -1, 1) * g.b_sk + n.reshape(1, 1, -1) * g.b_sn] - zb
    acc = np.matmul(A, B)                      # exact: |acc| < K 2^30 <= 2^44
    y[...] = saturate(rshift(acc * m, shift, rounding) + zo, dtype)
    return C7X_OK


def mmalib_batch_matmul_i8(a, b, params, out, a_size, b_size, batch, M, K, N, a_offset, a_sb, a_sm, a_sk,
                           b_offset, b_sb, b_sk, b_sn, rounding=None) -> int:
    """int8 activation x activation matmul (attention's Q.K^T and attention.V; docs/reference.md,
    "Attention matmul"): a int8 [a_size], b int8 [b_size] read through the strided views of
    :class:`BatchMatmulGeometry`, params uint8 [16] (int32 M < 2^31, int32 shift <= 62 at bytes
    0-7, int8 za, zb, zo at 12-14; za, zb in {0, -128}), out int8 [batch, M, N]; K <= 2^14."""
    return _batch_matmul(a, b, params, out, (a_size, b_size, batch, M, K, N, a_offset, a_sb, a_sm, a_sk,
                                             b_offset, b_sb, b_sk, b_sn), _I8, rounding)


def mmalib_batch_matmul_i16(a, b, params, out, a_size, b_size, batch, M, K, N, a_offset, a_sb, a_sm, a_sk,
                            b_offset, b_sb, b_sk, b_sn, rounding=None) -> int:
    """int16 activation x activation matmul: as the int8 one with int16 tensors, zero points 0 and
    M < 2^17."""
    return _batch_matmul(a, b, params, out, (a_size, b_size, batch, M, K, N, a_offset, a_sb, a_sm, a_sk,
                                             b_offset, b_sb, b_sk, b_sn), _I16, rounding)


def c7x_int8_lut(in_, table, out, n, rounding=None) -> int:
    """out = table[in + 128]; in / out int8 [n], table int8 [256] (docs/reference.md,
    "Activation tables": table[v + 128] = q(f(dq(v))), built at compile time).
    ``rounding`` is unused (no arithmetic)."""
    if in_ is None or table is None or out is None:
        return C7X_ERR_NULL
    g = ElementwiseGeometry(_int32("n", n))
    if g.status() != C7X_OK:
        return g.status()
    sh = g.shapes()
    x = _array("in", in_, sh["in"], _I8)
    t = _array("table", table, sh["table"], _I8)
    y = _array("out", out, sh["out"], _I8, output=True)
    y[...] = t[x.astype(np.int64) + 128]
    return C7X_OK


#: softmax: exp table entries are Q16 (table[255] = 2^16 = exp(0)); the kernel accepts up to 2^24
SOFTMAX_ONE, SOFTMAX_TABLE_MAX = 1 << 16, 1 << 24
#: the fixed int8 qparams of a softmax output (scale 1/256, zero point -128: [0, 1) in 256 codes)
SOFTMAX_OUT_SCALE, SOFTMAX_OUT_ZERO_POINT = 1.0 / 256.0, -128


def softmax_table(s_in: float) -> np.ndarray:
    """int32[256] exp table of :func:`c7x_int8_softmax` for an int8 input of scale ``s_in``:
    ``table[k] = round(2^16 * exp(s_in * (k - 255)))``, ``k - 255`` the code distance to the
    row's max (docs/reference.md, "Softmax"; float64, computed once at compile time).
    The input zero point cancels (softmax is shift-invariant). Raises ValueError for a
    non-positive or non-finite scale."""
    if not (np.isfinite(s_in) and s_in > 0):
        raise ValueError(f"softmax input scale must be a positive number, got {s_in!r}")
    d = np.arange(256, dtype=np.float64) - 255.0
    return np.round(SOFTMAX_ONE * np.exp(float(s_in) * d)).astype(np.int32)


@dataclass(frozen=True)
class SoftmaxGeometry(_Geometry):
    """``rows`` rows of ``n`` int8 elements (the last axis), the 256-entry int32 table."""

    rows: int
    n: int

    def status(self) -> int:
        return C7X_OK if self.rows > 0 and self.n > 0 and _elem_count(self.rows, self.n) > 0 else C7X_ERR_SHAPE

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {"in": (self.rows, self.n), "table": (256,), "out": (self.rows, self.n)}


def c7x_int8_softmax(in_, table, out, rows, n, rounding=None) -> int:
    """Softmax over the last axis of int8 ``in`` [rows, n] into int8 ``out`` [rows, n] at the
    fixed output scale 1/256, zero point -128, with the int32 [256] exp ``table`` of
    :func:`softmax_table` (the C body's integer steps, int64; docs/reference.md,
    "Softmax"): ``inv = floor(2^40 / S)`` per row, ``out = min(127, ((e * inv + 2^31) >> 32) - 128)``.
    ``rounding`` is unused (the shift rounds half up by construction).
    C7X_ERR_PARAM unless 0 <= table[k] <= table[255] <= 2^24."""
    if in_ is None or table is None or out is None:
        return C7X_ERR_NULL
    g = SoftmaxGeometry(_int32("rows", rows), _int32("n", n))
    if g.status() != C7X_OK:
        return g.status()
    sh = g.shapes()
    t = _array("table", table, sh["table"], _I32).astype(np.int64)
    if not (0 < t[255] <= SOFTMAX_TABLE_MAX and (t >= 0).all() and (t <= t[255]).all()):
        return C7X_ERR_PARAM
    x = _array("in", in_, sh["in"], _I8).astype(np.int64)
    y = _array("out", out, sh["out"], _I8, output=True)
    e = t[x - x.max(axis=1, keepdims=True) + 255]
    total = e.sum(axis=1, keepdims=True)
    inv = (1 << 40) // total
    y[...] = np.minimum(((e * inv + (1 << 31)) >> 32) - 128, 127)
    return C7X_OK


#: LayerNorm: the longest normalised axis (keeps every product below 2^62) and the beta bound
LAYER_NORM_MAX_N, LAYER_NORM_MAX_BETA = 4096, 1 << 56


def layer_norm_constants(gamma: np.ndarray, beta: np.ndarray, eps: float, s_in: float, s_out: float,
                         zp_out: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The compile-time constants of :func:`c7x_int8_layer_norm` for float ``gamma``, ``beta``
    [n], ``eps``, the input scale ``s_in`` and the output qparams: ``gamma_q`` int32 [n] =
    round(2^16 g / s_out), ``beta_q`` int64 [n] = round(2^40 (b / s_out + zp_out)), ``eps_q``
    = round(eps n^2 / s_in^2) (docs/reference.md, "LayerNorm"; float64). Raises ValueError
    when one does not fit (|g / s_out| >= 2^15, |b / s_out| >= 2^16, eps_q >= 2^31)."""
    g = np.asarray(gamma, np.float64).reshape(-1)
    b = np.asarray(beta, np.float64).reshape(-1)
    n = g.size
    gq = np.round(g / s_out * 2.0 ** 16)
    bq = np.round((b / s_out + zp_out) * 2.0 ** 40)
    eq = round(float(eps) * n * n / (float(s_in) ** 2))
    if not (np.abs(gq) < 2.0 ** 31).all():
        raise ValueError(f"LayerNorm weight / output scale reaches {np.abs(g / s_out).max():.3g} (limit 2^15)")
    if not (np.abs(bq) < LAYER_NORM_MAX_BETA).all():
        raise ValueError(f"LayerNorm bias / output scale reaches {np.abs(b / s_out).max():.3g} (limit 2^16)")
    if not 0 <= eq < 2 ** 31:
        raise ValueError(f"LayerNorm epsilon is {eq} input steps squared times n^2 (limit 2^31)")
    return gq.astype(np.int32), bq.astype(np.int64), int(eq)


@dataclass(frozen=True)
class LayerNormGeometry(_Geometry):
    """``rows`` rows of ``n`` int8 elements (the normalised last axis), per-element gamma / beta."""

    rows: int
    n: int

    def status(self) -> int:
        ok = 0 < self.n <= LAYER_NORM_MAX_N and self.rows > 0 and _elem_count(self.rows, self.n) > 0
        return C7X_OK if ok else C7X_ERR_SHAPE

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {"in": (self.rows, self.n), "gamma": (self.n,), "beta": (self.n,), "out": (self.rows, self.n)}


def c7x_int8_layer_norm(in_, gamma, beta, out, rows, n, in_zp, eps_q, rounding=None) -> int:
    """LayerNorm over the last axis of int8 ``in`` [rows, n] into int8 ``out`` [rows, n], integer
    only, with :func:`layer_norm_constants`' ``gamma`` int32 [n], ``beta`` int64 [n] and
    ``eps_q`` (the C body's steps in int64: docs/reference.md, "LayerNorm"). ``rounding`` is
    unused (the kernel rounds half up by construction). C7X_ERR_SHAPE for n outside
    [1, 4096]; C7X_ERR_PARAM for eps_q < 0, |in_zp| > 128 or |beta| > 2^56."""
    if in_ is None or gamma is None or beta is None or out is None:
        return C7X_ERR_NULL
    g = LayerNormGeometry(_int32("rows", rows), _int32("n", n))
    if g.status() != C7X_OK:
        return g.status()
    in_zp, eps_q = _int32("in_zp", in_zp), _int32("eps_q", eps_q)
    sh = g.shapes()
    b = _array("beta", beta, sh["beta"], _I64)
    if eps_q < 0 or not -128 <= in_zp <= 128 or (np.abs(b) > LAYER_NORM_MAX_BETA).any():
        return C7X_ERR_PARAM
    x = _array("in", in_, sh["in"], _I8).astype(np.int64) - in_zp
    gm = _array("gamma", gamma, sh["gamma"], _I32).astype(np.int64)
    y = _array("out", out, sh["out"], _I8, output=True)
    s1 = x.sum(axis=1, keepdims=True)
    v = n * (x * x).sum(axis=1) - s1[:, 0] ** 2 + eps_q
    d = np.array([math.isqrt(int(t) << 16) for t in v], np.int64).reshape(-1, 1)   # 8 fraction bits
    inv = np.where(d > 0, (1 << 48) // np.maximum(d, 1), 0)
    z = ((n * x - s1) * inv + (1 << 15)) // (1 << 16)
    y[...] = np.clip((gm * z + b.astype(np.int64) + (1 << 39)) // (1 << 40), -128, 127)
    return C7X_OK


def l2_normalize_gain(s_out: float) -> int:
    """``gain`` of :func:`c7x_int8_l2_normalize`: round(2^16 / s_out) (float64). Raises
    ValueError when it does not fit an int32 (s_out below about 2^-15)."""
    gain = round(2.0 ** 16 / float(s_out))
    if not 0 < gain < 2 ** 31:
        raise ValueError(f"L2 normalize output scale {s_out:.3g} gives gain {gain} (limit 2^31)")
    return gain


def c7x_int8_l2_normalize(in_, out, rows, n, in_zp, gain, out_zp, rounding=None) -> int:
    """L2 normalisation over the last axis of int8 ``in`` [rows, n] into int8 ``out`` [rows, n]
    (torch's ``F.normalize(x, dim=-1)``; docs/reference.md, "L2 normalize"), integer only:
    ``x_i = in_i - in_zp``, ``D = isqrt(2^32 sum x^2)``, ``R = floor(2^56 / D)``, ``z_i =
    floor((x_i R + 2^15) / 2^16)``, ``out_i = clamp(floor((gain z_i + out_zp 2^40 + 2^39) /
    2^40))`` with ``gain`` from :func:`l2_normalize_gain`. ``rounding`` is unused.
    C7X_ERR_SHAPE for n outside [1, 4096]; C7X_ERR_PARAM for |in_zp| > 128, gain outside
    (0, 2^31) or out_zp outside int8."""
    if in_ is None or out is None:
        return C7X_ERR_NULL
    g = LayerNormGeometry(_int32("rows", rows), _int32("n", n))
    if g.status() != C7X_OK:
        return g.status()
    in_zp, gain, out_zp = _int32("in_zp", in_zp), _int32("gain", gain), _int32("out_zp", out_zp)
    if not -128 <= in_zp <= 128 or gain <= 0 or not -128 <= out_zp <= 127:
        return C7X_ERR_PARAM
    sh = g.shapes()
    x = _array("in", in_, sh["in"], _I8).astype(np.int64) - in_zp
    y = _array("out", out, sh["out"], _I8, output=True)
    d = np.array([math.isqrt(int(t) << 32) for t in (x * x).sum(axis=1)], np.int64).reshape(-1, 1)
    inv = np.where(d > 0, (1 << 56) // np.maximum(d, 1), 0)
    z = (x * inv + (1 << 15)) // (1 << 16)
    y[...] = np.clip((gain * z + (out_zp << 40) + (1 << 39)) // (1 << 40), -128, 127)
    return C7X_OK


def _float32(name: str, value) -> np.float32:
    """A ``float`` scalar argument as the C call receives it (float32)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a float, got {type(value)}")
    with np.errstate(over="ignore"):
        return np.float32(value)


def _requantize(in_, out, n, in_zp, in_scale, out_zp, out_inv_scale, src: np.dtype,
                dst: np.dtype) -> int:
    """torch's ``quantize_per_tensor(dequantize_per_tensor(in))`` in float32 (see
    :func:`c7x_requantize_i8_i16`); statuses in the order of the C."""
    in_zp, out_zp = _int32("in_zp", in_zp), _int32("out_zp", out_zp)
    in_scale, out_inv_scale = _float32("in_scale", in_scale), _float32("out_inv_scale", out_inv_scale)
    if in_ is None or out is None:
        return C7X_ERR_NULL
    status = ElementwiseGeometry(n).status()
    if status != C7X_OK:
        return status
    finite = lambda s: bool(np.isfinite(s) and s > 0)  # noqa: E731
    fits = lambda z, t: np.iinfo(t).min <= z <= np.iinfo(t).max  # noqa: E731
    if not (fits(in_zp, src) and fits(out_zp, dst) and finite(in_scale) and finite(out_inv_scale)):
        return C7X_ERR_PARAM
    sh = ElementwiseGeometry(n).shapes()
    x = _array("in", in_, sh["in"], src)
    y = _array("out", out, sh["out"], dst, output=True)
    with np.errstate(over="ignore"):  # a huge scale overflows to inf, which saturates as in C
        d = (x.astype(np.float32) - np.float32(in_zp)) * in_scale
        v = d * out_inv_scale
    # rint: half to even, like torch.round; the clip before the cast keeps inf finite
    r = np.clip(np.rint(v), -2.0**24, 2.0**24).astype(np.int64) + out_zp
    y[...] = saturate(r, dst)
    return C7X_OK


def c7x_requantize_i8_i16(in_, out, n, in_zp, in_scale, out_zp, out_inv_scale, rounding=None) -> int:
    """int8 -> int16 requantize (ours; docs/reference.md, "Requantize"): in int8 [n], out
    int16 [n], ``out = saturate(rint(float32(in - in_zp) * in_scale * out_inv_scale) + out_zp)``
    with both products rounded to float32, i.e. torch's
    ``quantize_per_tensor(dequantize_per_tensor(in, in_scale, in_zp), s, out_zp)`` for
    ``out_inv_scale = float32(1 / s)`` (docs/numerics.md, "torch's quantize"). Zero points
    outside the dtypes or a scale that is not a finite float32 > 0 give C7X_ERR_PARAM.
    ``rounding`` is unused (the rounding is torch's)."""
    return _requantize(in_, out, n, in_zp, in_scale, out_zp, out_inv_scale, _I8, _I16)


def c7x_requantize_i16_i8(in_, out, n, in_zp, in_scale, out_zp, out_inv_scale, rounding=None) -> int:
    """int16 -> int8 requantize: as :func:`c7x_requantize_i8_i16` with in int16, out int8."""
    return _requantize(in_, out, n, in_zp, in_scale, out_zp, out_inv_scale, _I16, _I8)


def c7x_requantize_i8_i8(in_, out, n, in_zp, in_scale, out_zp, out_inv_scale, rounding=None) -> int:
    """int8 -> int8 requantize: as :func:`c7x_requantize_i8_i16` with in and out int8
    (after a max pool whose input and output quantization differ, ``passes/pool.py``)."""
    return _requantize(in_, out, n, in_zp, in_scale, out_zp, out_inv_scale, _I8, _I8)


def c7x_requantize_i16_i16(in_, out, n, in_zp, in_scale, out_zp, out_inv_scale, rounding=None) -> int:
    """int16 -> int16 requantize: as :func:`c7x_requantize_i8_i16` with in and out int16
    (after an int16 max pool whose input and output quantization differ)."""
    return _requantize(in_, out, n, in_zp, in_scale, out_zp, out_inv_scale, _I16, _I16)


# --------------------------------------------------------------------------
# Average pools (float32, as torch's Q/DQ: dequantize, float pool, quantize)
# --------------------------------------------------------------------------

#: Lanes of torch's ``Vectorized<float>`` in its x86 CPU sum kernel (the DEFAULT, AVX2
#: and AVX512 builds all sum float32 in 8-lane vectors; measured, tests/backend/test_avg_pool.py).
SUM_LANES = 8
_SUM_ILP = 4        # torch's row_sum: 4 interleaved partial sums
_SUM_LEVELS = 4     # torch's multi_row_sum: 4 cascade levels


def _ceil_log2(x: int) -> int:
    """torch's ``utils::CeilLog2``: 1 for x <= 2, else the bit length of x - 1."""
    return 1 if x <= 2 else (x - 1).bit_length()


def _cascade(groups: list) -> list:
    """torch's ``multi_row_sum`` over ``groups`` (each a list of ``_SUM_ILP`` float32
    arrays, one per column): chunks of ``2^P`` groups (P = max(4, ceil_log2(G) / 4))
    go into level 0, a full chunk moves up the levels; returns the column sums."""
    power = max(4, _ceil_log2(len(groups)) // _SUM_LEVELS)
    step, mask = 1 << power, (1 << power) - 1
    zero = np.zeros_like(groups[0][0])
    acc = [[zero] * _SUM_ILP for _ in range(_SUM_LEVELS)]
    i = 0
    while i + step <= len(groups):
        for _ in range(step):
            acc[0] = [a + g for a, g in zip(acc[0], groups[i])]
            i += 1
        for j in range(1, _SUM_LEVELS):
            acc[j] = [a + b for a, b in zip(acc[j], acc[j - 1])]
            acc[j - 1] = [zero] * _SUM_ILP
            if i & (mask << (j * power)):
                break
    for g in groups[i:]:
        acc[0] = [a + b for a, b in zip(acc[0], g)]
    for j in range(1, _SUM_LEVELS):
        acc[0] = [a + b for a, b in zip(acc[0], acc[j])]
    return acc[0]


def _row_sum(items: list) -> np.ndarray:
    """torch's ``row_sum``: ``items`` (float32 arrays, added elementwise) read as rows of
    ``_SUM_ILP``; the column sums by :func:`_cascade`, the leftover items into column 0,
    then column 0 + column 1 + column 2 + column 3."""
    full = len(items) // _SUM_ILP
    if full:
        parts = _cascade([items[g * _SUM_ILP:(g + 1) * _SUM_ILP] for g in range(full)])
    else:
        parts = [np.zeros_like(items[0])] * _SUM_ILP
    first = parts[0]
    for item in items[full * _SUM_ILP:]:
        first = first + item
    for p in parts[1:]:
        first = first + p
    return first


def torch_order_sum(y: np.ndarray) -> np.ndarray:
    """Sum of float32 ``y`` [planes, n] over its last axis in the order of torch's CPU
    ``sum`` of a contiguous row (``cascade_sum`` of aten/src/ATen/native/cpu/SumKernel.cpp,
    :data:`SUM_LANES` lanes), every addition rounded to float32. n >= 8: ``_row_sum`` of the
    n // 8 vectors of 8 lanes, then ``0 + tail elements (in order) + lane 0 + ... + lane 7``;
    n < 8: ``_row_sum`` of the n elements. Returns float32 [planes]."""
    planes, n = y.shape
    if n < SUM_LANES:
        return _row_sum([y[:, k] for k in range(n)])
    vectors = n // SUM_LANES
    lanes = _row_sum([y[:, v * SUM_LANES:(v + 1) * SUM_LANES] for v in range(vectors)])
    total = np.zeros(planes, np.float32)
    for k in range(vectors * SUM_LANES, n):
        total = total + y[:, k]
    for k in range(SUM_LANES):
        total = total + lanes[:, k]
    return total


def _quant_floats_ok(in_zp, in_scale, out_zp, out_inv_scale, dtype) -> bool:
    info = np.iinfo(dtype)
    finite = lambda s: bool(np.isfinite(s) and s > 0)  # noqa: E731
    return (info.min <= in_zp <= info.max and info.min <= out_zp <= info.max
            and finite(in_scale) and finite(out_inv_scale))


def _dequantize(x: np.ndarray, zp: int, scale: np.float32) -> np.ndarray:
    """torch's ``dequantize_per_tensor``: ``(float32(x) - zp) * scale`` in float32."""
    with np.errstate(over="ignore"):
        return (x.astype(np.float32) - np.float32(zp)) * scale


def quantize_per_tensor(v: np.ndarray, zp: int, inv_scale: np.float32, dtype) -> np.ndarray:
    """torch's ``quantize_per_tensor`` of float32 ``v``: ``rint(v * inv_scale) + zp`` (half to
    even, ``inv_scale`` the float32 reciprocal torch multiplies by), saturated to ``dtype``."""
    with np.errstate(over="ignore", invalid="ignore"):
        r = np.clip(np.rint(v * inv_scale), -2.0**24, 2.0**24)
    return saturate(np.nan_to_num(r).astype(np.int64) + zp, dtype)


@dataclass(frozen=True)
class GlobalPoolGeometry(_Geometry):
    """Global average pool: in [planes, hw], out [planes]."""

    planes: int
    hw: int

    def status(self) -> int:
        return C7X_OK if _elem_count(self.planes, self.hw) > 0 else C7X_ERR_SHAPE

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {"in": (self.planes, self.hw), "out": (self.planes,)}


def _global_avg_pool(in_, out, planes, hw, in_zp, in_scale, out_zp, out_inv_scale,
                     dtype: np.dtype) -> int:
    in_zp, out_zp = _int32("in_zp", in_zp), _int32("out_zp", out_zp)
    in_scale, out_inv_scale = _float32("in_scale", in_scale), _float32("out_inv_scale", out_inv_scale)
    if in_ is None or out is None:
        return C7X_ERR_NULL
    g = GlobalPoolGeometry(planes, hw)
    if g.status() != C7X_OK:
        return g.status()
    if not _quant_floats_ok(in_zp, in_scale, out_zp, out_inv_scale, dtype):
        return C7X_ERR_PARAM
    sh = g.shapes()
    x = _array("in", in_, sh["in"], dtype)
    y = _array("out", out, sh["out"], dtype, output=True)
    with np.errstate(over="ignore", invalid="ignore"):
        mean = torch_order_sum(_dequantize(x, in_zp, in_scale)) / np.float32(g.hw)
    y[...] = quantize_per_tensor(mean, out_zp, out_inv_scale, dtype)
    return C7X_OK


def c7x_int8_global_avg_pool(in_, out, planes, hw, in_zp, in_scale, out_zp, out_inv_scale,
                             rounding=None) -> int:
    """int8 global average pool (ours; docs/reference.md, "Average pools"): in int8
    [planes, hw] (planes = N * C, hw = H * W), out int8 [planes]; torch's
    ``quantize(mean(dequantize(in), (H, W)))`` in float32: each plane's dequantized values
    summed by :func:`torch_order_sum`, divided by float32(hw), times ``out_inv_scale``
    (= float32(1 / s_out)), rounded half to even, plus ``out_zp``, saturated. Zero points
    outside int8 or a scale that is not a finite float32 > 0: C7X_ERR_PARAM.
    ``rounding`` is unused (the rounding is torch's)."""
    return _global_avg_pool(in_, out, planes, hw, in_zp, in_scale, out_zp, out_inv_scale, _I8)


def c7x_int16_global_avg_pool(in_, out, planes, hw, in_zp, in_scale, out_zp, out_inv_scale,
                              rounding=None) -> int:
    """int16 global average pool: as :func:`c7x_int8_global_avg_pool` with int16 tensors."""
    return _global_avg_pool(in_, out, planes, hw, in_zp, in_scale, out_zp, out_inv_scale, _I16)


@dataclass(frozen=True)
class AvgPoolGeometry(PoolGeometry):
    """Average pool: the max pool's geometry (pH < kH, floor or ceil-mode output size)
    plus the divisor flag."""

    count_include_pad: int = 1


def avg_pool_divisors(size: int, k: int, stride: int, pad: int, out: int,
                      count_include_pad: bool) -> np.ndarray:
    """Per output index along one axis: torch's divisor factor, the window length
    clipped to ``[-pad, size + pad)`` (count_include_pad) or to ``[0, size)``."""
    start = np.arange(out) * stride - pad
    if count_include_pad:
        return np.minimum(start + k, size + pad) - start
    return np.minimum(start + k, size) - np.maximum(start, 0)


def _avg_pool(in_, out, g: AvgPoolGeometry, in_zp, in_scale, out_zp, out_inv_scale,
              dtype: np.dtype) -> int:
    in_zp, out_zp = _int32("in_zp", in_zp), _int32("out_zp", out_zp)
    in_scale, out_inv_scale = _float32("in_scale", in_scale), _float32("out_inv_scale", out_inv_scale)
    if in_ is None or out is None:
        return C7X_ERR_NULL
    if g.status() != C7X_OK:
        return g.status()
    if not _quant_floats_ok(in_zp, in_scale, out_zp, out_inv_scale, dtype):
        return C7X_ERR_PARAM
    sh = g.shapes()
    x = _array("in", in_, sh["in"], dtype)
    y = _array("out", out, sh["out"], dtype, output=True)
    bottom = max(0, (g.H_out - 1) * g.sH + g.kH - g.pH - g.H_in)
    right = max(0, (g.W_out - 1) * g.sW + g.kW - g.pW - g.W_in)
    # Padding adds +0.0, which leaves every float32 sum as torch's (it skips padding).
    padded = np.pad(_dequantize(x, in_zp, in_scale), ((0, 0), (0, 0), (g.pH, bottom), (g.pW, right)))
    total = np.zeros(sh["out"], np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for dh in range(g.kH):          # torch's order: window rows, then columns
            for dw in range(g.kW):
                total = total + padded[:, :, dh:dh + (g.H_out - 1) * g.sH + 1:g.sH,
                                       dw:dw + (g.W_out - 1) * g.sW + 1:g.sW]
        div = np.outer(avg_pool_divisors(g.H_in, g.kH, g.sH, g.pH, g.H_out, g.count_include_pad),
                       avg_pool_divisors(g.W_in, g.kW, g.sW, g.pW, g.W_out, g.count_include_pad))
        mean = total / div.astype(np.float32)
    y[...] = quantize_per_tensor(mean, out_zp, out_inv_scale, dtype)
    return C7X_OK


def c7x_int8_avg_pool(in_, out, N, C, H_in, W_in, H_out, W_out, kH, kW, sH, sW, pH, pW,
                      count_include_pad, in_zp, in_scale, out_zp, out_inv_scale,
                      rounding=None) -> int:
    """int8 average pool (ours; docs/reference.md, "Average pools"): in int8
    [N, C, H_in, W_in], out int8 [N, C, H_out, W_out], the max pool's window geometry;
    torch's ``quantize(avg_pool2d(dequantize(in)))`` in float32: the window's
    dequantized input pixels summed row by row from 0.0 (padding skipped), divided by
    float32(divisor) (:func:`avg_pool_divisors`; ``count_include_pad`` nonzero counts the
    padding inside ``[-p, size + p)``), quantized as in :func:`c7x_int8_global_avg_pool`."""
    g = AvgPoolGeometry(N, C, H_in, W_in, H_out, W_out, kH, kW, sH, sW, pH, pW,
                        1 if _int32("count_include_pad", count_include_pad) else 0)
    return _avg_pool(in_, out, g, in_zp, in_scale, out_zp, out_inv_scale, _I8)


def c7x_int16_avg_pool(in_, out, N, C, H_in, W_in, H_out, W_out, kH, kW, sH, sW, pH, pW,
                       count_include_pad, in_zp, in_scale, out_zp, out_inv_scale,
                       rounding=None) -> int:
    """int16 average pool: as :func:`c7x_int8_avg_pool` with int16 tensors."""
    g = AvgPoolGeometry(N, C, H_in, W_in, H_out, W_out, kH, kW, sH, sW, pH, pW,
                        1 if _int32("count_include_pad", count_include_pad) else 0)
    return _avg_pool(in_, out, g, in_zp, in_scale, out_zp, out_inv_scale, _I16)


# --------------------------------------------------------------------------
# Per-channel affine requantize (float32, as torch's Q/DQ batch_norm [+ relu])
# --------------------------------------------------------------------------

#: Bound on |in_scale|, |alpha|, |beta| of the channel-affine kernels (c7x_kernels.h,
#: C7X_AFFINE_LIMIT = 2^40): |x * alpha + beta| < 2^97 then, so no float32 overflows
#: before the quantize.
AFFINE_LIMIT = 2.0**40
#: Bytes per channel of the channel-affine params blob: int32 in_zp, float32 in_scale,
#: float32 alpha, float32 beta (little-endian).
AFFINE_PARAM_BYTES = 16


def fma_f32(x, a, b) -> np.ndarray:
    """float32 ``x * a + b`` rounded once (round half to even), as a fused multiply-add.

    ``x``, ``a``, ``b``: float32 arrays (broadcast), finite, with |x * a + b| well inside
    float32 (the kernels' AFFINE_LIMIT ensures it). numpy has no fma: the product of two
    float32 is exact in float64 (24 + 24 bits), the sum ``s = p + b`` is rounded to
    float64 once and its error ``e`` is recovered exactly (Knuth's TwoSum). Rounding
    ``s`` to float32 can differ from rounding the exact ``s + e`` only when ``s`` is
    exactly halfway between two float32 values ``f`` (nearest, even) and ``g = s + (s - f)``
    and ``e != 0``; then the result is the one on ``e``'s side. The twin of
    ``fma_f32`` in c7x_kernels_ref.c, step for step."""
    p = np.asarray(x, np.float32).astype(np.float64) * np.asarray(a, np.float32).astype(np.float64)
    b64 = np.asarray(b, np.float32).astype(np.float64)
    s = p + b64
    bb = s - p
    e = (p - (s - bb)) + (b64 - bb)
    f = s.astype(np.float32)
    f64 = f.astype(np.float64)
    d = s - f64
    g = s + d
    with np.errstate(over="ignore"):
        g32 = g.astype(np.float32)
    midpoint = (d != 0) & (g32.astype(np.float64) == g)
    other = midpoint & (e != 0) & ((e > 0) == (g > f64))
    return np.where(other, g32, f)


def batch_norm_affine(weight, bias, mean, var, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel ``(alpha, beta)`` float32 [C] of torch's CPU inference batch_norm
    (ATen ``batch_norm_cpu_collect_linear_and_constant_terms``), which then computes
    ``y = x * alpha + beta``:

        invstd = 1 / sqrt(var + float32(eps)),  alpha = invstd * weight,
        beta = bias - mean * alpha

    every operation in float32, ``beta`` and ``y`` each rounded once: torch's AVX2 and
    AVX512 builds (every x86-64 CPU torch picks them for) contract both into fused
    multiply-adds (measured, tests/backend/test_channel_affine.py; its DEFAULT build
    rounds the product and the sum separately). ``weight`` / ``bias`` None mean 1 / 0
    (torch's defaults); all arrays float32-convertible [C]."""
    var = np.asarray(var, np.float32)
    invstd = np.float32(1.0) / np.sqrt(var + np.float32(eps))
    alpha = invstd * (np.float32(1.0) if weight is None else np.asarray(weight, np.float32))
    b = np.zeros_like(alpha) if bias is None else np.asarray(bias, np.float32)
    beta = fma_f32(-np.asarray(mean, np.float32), alpha, b)
    return alpha.astype(np.float32), beta.astype(np.float32)


def channel_affine_params(in_zp, in_scale, alpha, beta) -> np.ndarray:
    """The params blob of ``c7x_int{8,16}_channel_affine``: uint8 [C * 16], per channel c
    little-endian int32 ``in_zp[c]``, float32 ``in_scale[c]``, ``alpha[c]``, ``beta[c]``
    (each argument broadcast to [C]; C taken from the longest)."""
    c = max(np.size(v) for v in (in_zp, in_scale, alpha, beta))
    rec = np.zeros(c, dtype=[("zp", "<i4"), ("scale", "<f4"), ("alpha", "<f4"), ("beta", "<f4")])
    rec["zp"] = np.broadcast_to(np.asarray(in_zp, np.int64), c)
    rec["scale"] = np.broadcast_to(np.asarray(in_scale, np.float32), c)
    rec["alpha"] = np.broadcast_to(np.asarray(alpha, np.float32), c)
    rec["beta"] = np.broadcast_to(np.asarray(beta, np.float32), c)
    return np.frombuffer(rec.tobytes(), np.uint8).copy()


@dataclass(frozen=True)
class ChannelAffineGeometry(_Geometry):
    """Per-channel affine: in / out [N, C, hw], params [C * 16] bytes."""

    N: int
    C: int
    hw: int

    def status(self) -> int:
        ok = _elem_count(self.N, self.C, self.hw) > 0 and _elem_count(self.C, AFFINE_PARAM_BYTES) > 0
        return C7X_OK if ok else C7X_ERR_SHAPE

    def shapes(self) -> dict[str, tuple[int, ...]]:
        v = (self.N, self.C, self.hw)
        return {"in": v, "out": v, "params": (self.C * AFFINE_PARAM_BYTES,)}


def _channel_affine(in_, params, out, N, C, hw, mid_zp, mid_scale, mid_inv_scale, has_relu,
                    out_zp, out_inv_scale, dtype: np.dtype) -> int:
    mid_zp, out_zp, has_relu = _int32("mid_zp", mid_zp), _int32("out_zp", out_zp), _int32("has_relu", has_relu)
    mid_scale, mid_inv_scale, out_inv_scale = (_float32(n, v) for n, v in (
        ("mid_scale", mid_scale), ("mid_inv_scale", mid_inv_scale), ("out_inv_scale", out_inv_scale)))
    if in_ is None or params is None or out is None:
        return C7X_ERR_NULL
    g = ChannelAffineGeometry(N, C, hw)
    if g.status() != C7X_OK:
        return g.status()
    sh = g.shapes()
    raw = np.frombuffer(_array("params", params, sh["params"], _U8).tobytes(),
                        dtype=[("zp", "<i4"), ("scale", "<f4"), ("alpha", "<f4"), ("beta", "<f4")])
    info = np.iinfo(dtype)
    zp, scale, alpha, beta = (raw[k].astype(t) for k, t in (("zp", np.int64), ("scale", np.float32),
                                                              ("alpha", np.float32), ("beta", np.float32)))
    finite = lambda s: bool(np.isfinite(s) and s > 0)  # noqa: E731
    bounded = lambda v: bool(np.all(np.abs(v) <= AFFINE_LIMIT))  # NaN fails too  # noqa: E731
    if not (info.min <= mid_zp <= info.max and info.min <= out_zp <= info.max and finite(mid_scale)
            and finite(mid_inv_scale) and finite(out_inv_scale)
            and bool(np.all((zp >= info.min) & (zp <= info.max))) and bool(np.all(scale > 0))
            and bounded(scale) and bounded(alpha) and bounded(beta)):
        return C7X_ERR_PARAM
    x = _array("in", in_, sh["in"], dtype)
    y = _array("out", out, sh["out"], dtype, output=True)
    per_c = (None, slice(None), None)   # [N, C, hw]: broadcast over N and hw
    v = (x.astype(np.float32) - zp.astype(np.float32)[per_c]) * scale[per_c]   # torch's dequantize
    v = fma_f32(v, alpha[per_c], beta[per_c])                                   # torch's batch_norm
    t = quantize_per_tensor(v, mid_zp, mid_inv_scale, dtype)
    if has_relu:   # relu(dq(t)) = dq(max(t, mid_zp)) for mid_scale > 0, then requantize
        r = (np.maximum(t, mid_zp).astype(np.float32) - np.float32(mid_zp)) * mid_scale
        t = quantize_per_tensor(r, out_zp, out_inv_scale, dtype)
    y[...] = t
    return C7X_OK


def c7x_int8_channel_affine(in_, params, out, N, C, hw, mid_zp, mid_scale, mid_inv_scale,
                            has_relu, out_zp, out_inv_scale, rounding=None) -> int:
    """int8 per-channel affine requantize (ours; docs/reference.md, "Channel affine"):
    in / out int8 [N, C, hw], params uint8 [C * 16] (:func:`channel_affine_params`). Per
    element of channel c, in float32 as torch's Q/DQ ``q(batch_norm(cat(dq(parts))))``
    [``-> dq -> relu -> q``]:

        x = float32(in - in_zp[c]) * in_scale[c]
        y = x * alpha[c] + beta[c]                   (:func:`fma_f32`: rounded once)
        t = saturate(rint(y * mid_inv_scale) + mid_zp)
        has_relu == 0: out = t
        has_relu != 0: out = saturate(rint(float32(max(t, mid_zp) - mid_zp) * mid_scale
                                           * out_inv_scale) + out_zp)

    rint is half to even (torch's quantize), each float32 product rounded. Statuses as
    the C: NULL; a size <= 0 (shape); a zero point outside int8, a scale that is not a
    finite float32 > 0, or |in_scale|, |alpha|, |beta| above :data:`AFFINE_LIMIT`
    (param). ``rounding`` is unused (the rounding is torch's)."""
    return _channel_affine(in_, params, out, N, C, hw, mid_zp, mid_scale, mid_inv_scale, has_relu,
                           out_zp, out_inv_scale, _I8)


def c7x_int16_channel_affine(in_, params, out, N, C, hw, mid_zp, mid_scale, mid_inv_scale,
                             has_relu, out_zp, out_inv_scale, rounding=None) -> int:
    """int16 per-channel affine requantize: as :func:`c7x_int8_channel_affine` with int16
    tensors and zero points."""
    return _channel_affine(in_, params, out, N, C, hw, mid_zp, mid_scale, mid_inv_scale, has_relu,
                           out_zp, out_inv_scale, _I16)


# --------------------------------------------------------------------------
# Quantize / dequantize at the model's edges (float32 <-> int8 / int16)
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class DequantizeGeometry(_Geometry):
    """Dequantize: in [n_in] (the first n read), out [n]."""

    n_in: int
    n: int

    def status(self) -> int:
        ok = _elem_count(self.n) > 0 and _elem_count(self.n_in) >= self.n
        return C7X_OK if ok else C7X_ERR_SHAPE

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {"in": (self.n_in,), "out": (self.n,)}


def _zp_scale_ok(zp: int, scale: np.float32, dtype) -> bool:
    info = np.iinfo(dtype)
    return info.min <= zp <= info.max and bool(np.isfinite(scale) and scale > 0)


def _quantize_edge(in_, out, n, out_zp, out_inv_scale, dtype) -> int:
    out_zp, out_inv_scale = _int32("out_zp", out_zp), _float32("out_inv_scale", out_inv_scale)
    if in_ is None or out is None:
        return C7X_ERR_NULL
    g = ElementwiseGeometry(n)
    if g.status() != C7X_OK:
        return g.status()
    if not _zp_scale_ok(out_zp, out_inv_scale, dtype):
        return C7X_ERR_PARAM
    sh = g.shapes()
    x = _array("in", in_, sh["in"], np.dtype(np.float32))
    y = _array("out", out, sh["out"], dtype, output=True)
    with np.errstate(over="ignore", invalid="ignore"):
        v = x * out_inv_scale                    # rounded once, as the C's float product
    y[...] = quantize_per_tensor(v, out_zp, np.float32(1.0), dtype)
    return C7X_OK


def _dequantize_edge(in_, out, n_in, n, in_zp, in_scale, dtype) -> int:
    in_zp, in_scale = _int32("in_zp", in_zp), _float32("in_scale", in_scale)
    if in_ is None or out is None:
        return C7X_ERR_NULL
    g = DequantizeGeometry(n_in, n)
    if g.status() != C7X_OK:
        return g.status()
    if not _zp_scale_ok(in_zp, in_scale, dtype):
        return C7X_ERR_PARAM
    sh = g.shapes()
    x = _array("in", in_, sh["in"], dtype)
    y = _array("out", out, sh["out"], np.dtype(np.float32), output=True)
    y[...] = _dequantize(x[:g.n], in_zp, in_scale)
    return C7X_OK


def c7x_quantize_f32_i8(in_, out, n, out_zp, out_inv_scale, rounding=None) -> int:
    """torch's ``quantize_per_tensor`` of the model input (ours; docs/reference.md,
    "Quantize and dequantize"): in float32 [n], out int8 [n],
    ``out = saturate(rint(in * out_inv_scale) + out_zp)``, the product rounded once to
    float32, rint half to even, NaN -> out_zp (as the C). Statuses as the C: NULL; n <= 0
    (shape); out_zp outside int8 or out_inv_scale not a finite float32 > 0 (param).
    ``rounding`` is unused (the rounding is torch's)."""
    return _quantize_edge(in_, out, n, out_zp, out_inv_scale, _I8)


def c7x_quantize_f32_i16(in_, out, n, out_zp, out_inv_scale, rounding=None) -> int:
    """As :func:`c7x_quantize_f32_i8` into int16."""
    return _quantize_edge(in_, out, n, out_zp, out_inv_scale, _I16)


def c7x_dequantize_i8_f32(in_, out, n_in, n, in_zp, in_scale, rounding=None) -> int:
    """torch's ``dequantize_per_tensor`` of a model output (ours): in int8 [n_in], out
    float32 [n], ``out[i] = float32(in[i] - in_zp) * in_scale`` for the first n elements (a
    padded FC output's real channels), each rounded once. Statuses as the C: NULL; n <= 0
    or n > n_in (shape); in_zp outside int8 or in_scale not a finite float32 > 0 (param)."""
    return _dequantize_edge(in_, out, n_in, n, in_zp, in_scale, _I8)


def c7x_dequantize_i16_f32(in_, out, n_in, n, in_zp, in_scale, rounding=None) -> int:
    """As :func:`c7x_dequantize_i8_f32` from int16."""
    return _dequantize_edge(in_, out, n_in, n, in_zp, in_scale, _I16)


# --------------------------------------------------------------------------
# Concatenate / slice with requantize (float32, as torch's Q/DQ)
# --------------------------------------------------------------------------

#: most segments of one c7x_concat<K> call (c7x_kernels.h declares K = 1..4)
MAX_SEGMENTS = 4


@dataclass(frozen=True)
class ConcatGeometry(_Geometry):
    """c7x_concat<K>: ``outer`` blocks; segment j reads ``[offset<j>, offset<j> + n<j>)`` of
    every ``size<j>``-element block of in<j> (in<j>: outer * size<j> elements); out holds
    outer * (n0 + ... + n<K-1>). Segments 1..3 are absent (None) in a call with fewer."""

    outer: int
    size0: int
    offset0: int
    n0: int
    size1: int | None = None
    offset1: int | None = None
    n1: int | None = None
    size2: int | None = None
    offset2: int | None = None
    n2: int | None = None
    size3: int | None = None
    offset3: int | None = None
    n3: int | None = None

    def __post_init__(self):
        for f in fields(self):
            if getattr(self, f.name) is not None:
                object.__setattr__(self, f.name, _int32(f.name, getattr(self, f.name)))

    def segments(self) -> list[tuple[int, int, int]]:
        """``(size, offset, n)`` of each segment, in order."""
        return [(getattr(self, f"size{j}"), getattr(self, f"offset{j}"), getattr(self, f"n{j}"))
                for j in range(MAX_SEGMENTS) if getattr(self, f"size{j}") is not None]

    def status(self) -> int:
        total = 0
        for size, offset, n in self.segments():
            if n <= 0 or offset < 0 or offset + n > size or _elem_count(self.outer, size) < 0:
                return C7X_ERR_SHAPE
            total += n
        return C7X_OK if _elem_count(self.outer, total) > 0 else C7X_ERR_SHAPE

    def shapes(self) -> dict[str, tuple[int, ...]]:
        segs = self.segments()
        out = {f"in{j}": (self.outer * size,) for j, (size, _, _) in enumerate(segs)}
        out["out"] = (self.outer * sum(n for _, _, n in segs),)
        return out


def _concat(k: int, dtype: np.dtype, a: dict) -> int:
    """c7x_concat<k> on the bound arguments ``a`` (C names); statuses in the C's order."""
    outer, out_zp = _int32("outer", a["outer"]), _int32("out_zp", a["out_zp"])
    out_inv_scale = _float32("out_inv_scale", a["out_inv_scale"])
    zps = [_int32(f"zp{j}", a[f"zp{j}"]) for j in range(k)]
    scales = [_float32(f"scale{j}", a[f"scale{j}"]) for j in range(k)]
    if a["out"] is None or any(a[f"in{j}"] is None for j in range(k)):
        return C7X_ERR_NULL
    geo = ConcatGeometry(outer, **{f"{f}{j}": a[f"{f}{j}"] for j in range(k) for f in ("size", "offset", "n")})
    status = geo.status()
    if status != C7X_OK:
        return status
    if not (all(_zp_scale_ok(z, s, dtype) for z, s in zip(zps, scales)) and _zp_scale_ok(out_zp, out_inv_scale, dtype)):
        return C7X_ERR_PARAM
    sh = geo.shapes()
    parts = []
    for j, (size, offset, n) in enumerate(geo.segments()):
        x = _array(f"in{j}", a[f"in{j}"], sh[f"in{j}"], dtype).reshape(outer, size)[:, offset:offset + n]
        with np.errstate(over="ignore"):  # as _requantize: inf saturates as in C
            parts.append((x.astype(np.float32) - np.float32(zps[j])) * scales[j] * out_inv_scale)
    y = _array("out", a["out"], sh["out"], dtype, output=True)
    v = np.concatenate(parts, axis=1).reshape(-1)
    y[...] = saturate(np.clip(np.rint(v), -2.0**24, 2.0**24).astype(np.int64) + out_zp, dtype)
    return C7X_OK


def _concat_twin(k: int, dtype: np.dtype):
    """The twin of ``c7x_concat<k>_<i8|i16>``: the C argument list (pointers in0..in<k-1>,
    out; outer; size, offset, n, zp, scale of each segment; out_zp, out_inv_scale), plus
    ``rounding`` (unused: the rounding is torch's)."""
    names = [f"in{j}" for j in range(k)] + ["out", "outer"]
    names += [f"{f}{j}" for j in range(k) for f in ("size", "offset", "n", "zp", "scale")]
    names += ["out_zp", "out_inv_scale"]
    P = inspect.Parameter
    sig = inspect.Signature([P(n, P.POSITIONAL_OR_KEYWORD) for n in names]
                            + [P("rounding", P.POSITIONAL_OR_KEYWORD, default=None)])
    suffix = "i8" if dtype == _I8 else "i16"

    def twin(*args, **kwargs) -> int:
        bound = sig.bind(*args, **kwargs)
        return _concat(k, dtype, bound.arguments)

    twin.__name__ = twin.__qualname__ = f"c7x_concat{k}_{suffix}"
    twin.__signature__ = sig
    twin.__doc__ = (f"Concatenation of {k} requantized segment(s) in {suffix} (ours; docs/reference.md, "
                    f"\"Concat and split\"): out[o, pos_j + i] = saturate(rint(float32(in_j[o * size_j + "
                    f"offset_j + i] - zp_j) * scale_j * out_inv_scale) + out_zp), both products rounded to "
                    f"float32 (torch's dequantize + quantize), o < outer. Statuses as the C: NULL; a "
                    f"segment outside its block or an empty one (shape); a zero point outside {suffix} or a "
                    f"scale that is not a finite float32 > 0 (param). ``rounding`` is unused.")
    return twin


c7x_concat1_i8, c7x_concat1_i16 = _concat_twin(1, _I8), _concat_twin(1, _I16)
c7x_concat2_i8, c7x_concat2_i16 = _concat_twin(2, _I8), _concat_twin(2, _I16)
c7x_concat3_i8, c7x_concat3_i16 = _concat_twin(3, _I8), _concat_twin(3, _I16)
c7x_concat4_i8, c7x_concat4_i16 = _concat_twin(4, _I8), _concat_twin(4, _I16)


# --------------------------------------------------------------------------
# Permute (data movement; docs/reference.md, "Permute")
# --------------------------------------------------------------------------

#: the permute kernels take exactly this many axes (fewer are padded with leading axes of length 1)
PERMUTE_RANK = 6


@dataclass(frozen=True)
class PermuteGeometry(_Geometry):
    """in [d0, ..., d5] (C order), out = in transposed by (p0, ..., p5), C order."""

    d0: int
    d1: int
    d2: int
    d3: int
    d4: int
    d5: int
    p0: int
    p1: int
    p2: int
    p3: int
    p4: int
    p5: int

    @property
    def dims(self) -> tuple[int, ...]:
        return tuple(getattr(self, f"d{j}") for j in range(PERMUTE_RANK))

    @property
    def perm(self) -> tuple[int, ...]:
        return tuple(getattr(self, f"p{j}") for j in range(PERMUTE_RANK))

    def status(self) -> int:
        if _elem_count(*self.dims) < 0:
            return C7X_ERR_SHAPE
        return C7X_OK if sorted(self.perm) == list(range(PERMUTE_RANK)) else C7X_ERR_PARAM

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {"in": self.dims, "out": tuple(self.dims[p] for p in self.perm)}


def _permute(in_, out, args: tuple, dtype: np.dtype) -> int:
    if in_ is None or out is None:
        return C7X_ERR_NULL
    g = PermuteGeometry(*(_int32(f.name, v) for f, v in zip(fields(PermuteGeometry), args)))
    if g.status() != C7X_OK:
        return g.status()
    sh = g.shapes()
    x = _array("in", in_, sh["in"], dtype)
    y = _array("out", out, sh["out"], dtype, output=True)
    y[...] = np.transpose(x, g.perm)
    return C7X_OK


def c7x_permute_i8(in_, out, d0, d1, d2, d3, d4, d5, p0, p1, p2, p3, p4, p5, rounding=None) -> int:
    """int8 transpose (docs/reference.md, "Permute"): in int8 [d0..d5] (C order), out int8 = in
    transposed by the axes (p0..p5), C order; a permutation of 0..5 (else C7X_ERR_PARAM).
    ``rounding`` is unused (no arithmetic)."""
    return _permute(in_, out, (d0, d1, d2, d3, d4, d5, p0, p1, p2, p3, p4, p5), _I8)


def c7x_permute_i16(in_, out, d0, d1, d2, d3, d4, d5, p0, p1, p2, p3, p4, p5, rounding=None) -> int:
    """int16 transpose: as :func:`c7x_permute_i8` with int16 tensors."""
    return _permute(in_, out, (d0, d1, d2, d3, d4, d5, p0, p1, p2, p3, p4, p5), _I16)


# --------------------------------------------------------------------------
# Take (gather along one axis; data movement; docs/reference.md, "Take")
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class TakeGeometry(_Geometry):
    """in [outer, n_in, inner], index int32 [n_out], out [outer, n_out, inner]."""

    outer: int
    n_in: int
    n_out: int
    inner: int

    def status(self) -> int:
        ok = _elem_count(self.outer, self.n_in, self.inner) > 0 and _elem_count(self.outer, self.n_out, self.inner) > 0
        return C7X_OK if ok else C7X_ERR_SHAPE

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {"in": (self.outer, self.n_in, self.inner), "index": (self.n_out,),
                "out": (self.outer, self.n_out, self.inner)}


def _take(in_, index, out, args: tuple, dtype: np.dtype) -> int:
    if in_ is None or index is None or out is None:
        return C7X_ERR_NULL
    g = TakeGeometry(*(_int32(f.name, v) for f, v in zip(fields(TakeGeometry), args)))
    if g.status() != C7X_OK:
        return g.status()
    sh = g.shapes()
    idx = _array("index", index, sh["index"], _I32).astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= g.n_in):
        return C7X_ERR_PARAM
    x = _array("in", in_, sh["in"], dtype)
    y = _array("out", out, sh["out"], dtype, output=True)
    y[...] = x[:, idx, :]
    return C7X_OK


def c7x_take_i8(in_, index, out, outer, n_in, n_out, inner, rounding=None) -> int:
    """int8 gather along one axis (docs/reference.md, "Take"): in int8 [outer, n_in, inner],
    index int32 [n_out] in [0, n_in) (else C7X_ERR_PARAM, nothing written), out int8
    [outer, n_out, inner] = in[:, index, :]. ``rounding`` is unused (no arithmetic)."""
    return _take(in_, index, out, (outer, n_in, n_out, inner), _I8)


def c7x_take_i16(in_, index, out, outer, n_in, n_out, inner, rounding=None) -> int:
    """int16 gather: as :func:`c7x_take_i8` with int16 tensors."""
    return _take(in_, index, out, (outer, n_in, n_out, inner), _I16)
