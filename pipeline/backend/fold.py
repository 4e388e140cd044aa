"""Compile-time requantization math for the offloaded kernels (pure numpy).

Everything here follows ``docs/reference.md``, "Folding", "Scale and shift"
and "Residual add", and the kernel ABI in ``kernels/c7x_kernels.h``:

- conv / depthwise / FC kernels compute, per output channel ``c``::

      out = saturate(rshift((acc + bias[c]) * scale[c], shift[c]))

  where ``acc`` is the raw integer dot product (no zero points), so all zero
  point terms and the float bias are folded into ``bias``;
- the residual-add kernel takes two Q15 multipliers in a 16-byte blob.

Rounding is numpy's half-to-even (``np.rint``), like Python's ``round`` in the
reference. Float arithmetic is float64 on the float32 scales torch stored.

Two deliberate deviations from the reference, both "decline instead of
silently computing something else" (the functions raise
:class:`~pipeline.backend.refusal.Declined`; the offload pass keeps the layer
on the scalar path and logs the reason):

- :func:`float_to_scale_shift` returns ``None`` where the reference silently
  returns ``(1, 0)`` (a rescale that no ``scale in [1,127], shift in [0,31]``
  can represent), and :func:`requant_params` declines on it;
- :func:`fold_bias_i8` / :func:`residual_add_params` range-check their int32
  results where the reference wraps.

One deliberate extension (int16 activations with int8 weights, "pre-scaling"):
the 7-bit kernel ``scale`` (``docs/reference.md``, "Scale and shift") limits
the requantization multiplier to a relative precision of ~2^-8 (median
2.7e-3, max 7.6e-3 over log-uniform rescales), which with int16 outputs is tens of LSB (MobileNetV2, int16: 84
LSB mean / 673 max vs torch's Q/DQ model). When the int16 kernels get int8
weights widened to int16, the top 8 bits of every weight are unused, so each
output channel's weights are multiplied by an integer ``k[c]`` in [1, 256]
(``|W8| <= 128`` so ``|k*W8| <= 32768``; checked per channel on its actual
min/max) and :func:`prescale_requant_params` picks ``(k, scale, shift)`` with
``k*scale / 2**shift ~= r[c]``. The kernel then computes, exactly::

    acc' = sum(x * k*W8) = k * acc,   bias' = k * round(b / (d_s*w_s[c]))
    out  = saturate(rshift((acc' + bias') * scale, shift))
         = saturate(rshift((acc + round(b/(d_s*w_s))) * (k*scale), shift))

i.e. the formula of ``docs/reference.md``, "int16 folding" and "Kernel math",
with a multiplier ``k*scale`` of up to 15 bits instead of 7.
Because not every integer below 2^15 is a product ``k*scale`` with
``k <= 256, scale <= 127``, the realized precision is about 13-14 bits
(docs/measuring.md, "Figures behind the code"). The accumulator never exceeds what full-range int16
weights (``weight_dtype="int16"``) give, so the i16 kernels' accumulators are
as safe as in that mode, and the MMALIB build is as close to torch's Q/DQ
model as the scalar build (docs/measuring.md, "Figures behind the code"). With ``weight_dtype="int16"``
the weights already use the full range and are not pre-scaled.
"""

from __future__ import annotations

import struct

import numpy as np

from .refusal import Declined

#: The FC kernel reads ``scale`` as a signed byte (``docs/reference.md``, "Scale and
#: shift"), so every kernel gets a scale in [1, 127]; shifts are 0..31.
SCALE_MAX = 127
SHIFT_MAX = 31
#: Residual-add multipliers are Q15 (``docs/reference.md``, "Residual add": shift = 15).
RESIDUAL_SHIFT = 15
#: Largest per-channel weight pre-scale of widened int8 weights: 128 * 256 = 2^15.
PRESCALE_MAX = 256

_INT_RANGE = {"int8": (-128, 127), "int16": (-32768, 32767),
              "int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1)}


def dtype_range(dtype: str) -> tuple[int, int]:
    """``(min, max)`` of an integer dtype name (int8, int16, int32, int64)."""
    return _INT_RANGE[str(dtype)]


def float_to_scale_shift(r: float) -> tuple[int, int] | None:
    """Best ``(scale, shift)`` with ``scale / 2**shift ~= r`` (``docs/reference.md``, "Scale and shift").

    For ``shift`` = 0..31: ``s = round_half_even(r * 2**shift)``; candidates
    with ``s < 1`` are skipped and the search stops at the first ``s > 127``.
    The candidate with the strictly smallest relative error ``|s/2**shift - r| / r``
    wins, so ties go to the smaller shift. ``r <= 0`` gives ``(0, 0)``.

    Returns ``None`` when no candidate exists (``r >= 127.5`` or
    ``r * 2**31 < 0.5``); the reference returns ``(1, 0)`` there, a silently
    wrong rescale.
    """
    r = float(r)
    if not np.isfinite(r):
        return None
    if r <= 0.0:
        return (0, 0)
    best, best_err = None, np.inf
    for shift in range(SHIFT_MAX + 1):
        s = int(np.rint(r * 2.0**shift))
        if s < 1:
            continue
        if s > SCALE_MAX:
            break
        err = abs(s / 2.0**shift - r) / r
        if err < best_err:  # strictly smaller: ties keep the smaller shift
            best, best_err = (s, shift), err
    return best


def _best_triple(r: float, k_max: int) -> tuple[int, int, int] | None:
    """Best ``(k, scale, shift)``: ``k in [1, k_max]``, ``scale in [1, 127]``,
    ``shift in [0, 31]``, minimizing ``|k*scale/2**shift - r| / r`` for ``r > 0``.

    For each ``(k, shift)`` the candidate is ``scale = round_half_even(r * 2**shift / k)``,
    kept only if it lies in [1, 127] (as in :func:`float_to_scale_shift`); the
    error is convex in ``scale``, so this is the optimum over every such triple.
    Ties go to the smallest ``k``, then the smallest ``shift`` (``argmin`` of the
    k-major grid). ``None`` if no candidate exists.
    """
    k = np.arange(1, k_max + 1, dtype=np.float64)[:, None]
    p = 2.0 ** np.arange(SHIFT_MAX + 1, dtype=np.float64)[None, :]
    s = np.rint(r * p / k)
    ok = (s >= 1) & (s <= SCALE_MAX)
    if not ok.any():
        return None
    err = np.where(ok, np.abs(k * s / p - r), np.inf)   # k*s/p is exact in float64
    kk, sh = np.unravel_index(int(np.argmin(err)), err.shape)
    return int(kk) + 1, int(s[kk, sh]), int(sh)


def float_to_prescale_scale_shift(r: float, k_max: int = 256) -> tuple[int, int, int] | None:
    """Best ``(k, scale, shift)`` with ``k*scale / 2**shift ~= r`` (module docstring, "pre-scaling").

    ``k in [1, k_max]`` (``k_max <= PRESCALE_MAX``), ``scale in [1, 127]``,
    ``shift in [0, 31]``; minimal relative error, ties to the smallest ``k``
    then the smallest ``shift``. ``r <= 0`` gives ``(1, 0, 0)``; ``None`` when
    nothing fits (``r * 2**31 < 0.5`` or ``r >= k_max * 127.5``) or ``r`` is
    not finite. With ``k_max = 1`` this is :func:`float_to_scale_shift` with
    ``k = 1`` prepended.
    """
    r = float(r)
    if not np.isfinite(r):
        return None
    if r <= 0.0:
        return (1, 0, 0)
    if not 1 <= int(k_max) <= PRESCALE_MAX:
        raise ValueError(f"k_max={k_max} is outside [1, {PRESCALE_MAX}]")
    return _best_triple(r, int(k_max))


def prescale_limit(w: np.ndarray) -> np.ndarray:
    """Largest ``k[c] in [1, 256]`` with ``k * W[c, ...]`` inside int16, int64[C].

    ``w``: int8 weights with the output channel first (OIHW or ``[N, K]``). Uses
    each channel's actual max / min: ``k <= 32767 // max`` (max > 0) and
    ``k <= 32768 // -min`` (min < 0); int8 values always allow 256.
    """
    flat = np.asarray(w).reshape(np.asarray(w).shape[0], -1).astype(np.int64)
    hi, lo = flat.max(axis=1, initial=0), flat.min(axis=1, initial=0)
    k = np.full(flat.shape[0], PRESCALE_MAX, np.int64)
    k = np.where(hi > 0, np.minimum(k, _INT_RANGE["int16"][1] // np.maximum(hi, 1)), k)
    k = np.where(lo < 0, np.minimum(k, -_INT_RANGE["int16"][0] // np.maximum(-lo, 1)), k)
    return np.maximum(k, 1)


def prescale_requant_params(d_s: float, w_s: np.ndarray, o_s: float,
                            k_max: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-channel ``(k int64[C], scale uint8[C], shift uint8[C])`` for ``r[c] = d_s*w_s[c]/o_s``
    with ``k[c] <= k_max[c]`` (:func:`prescale_limit`), by :func:`float_to_prescale_scale_shift`.

    Raises :class:`Declined` when a channel's rescale is not positive or
    nothing fits (as :func:`requant_params`).
    """
    r = rescale(d_s, w_s, o_s)
    k_max = np.broadcast_to(np.asarray(k_max, np.int64).reshape(-1), r.shape)
    k = np.ones(r.shape, np.int64)
    scale = np.zeros(r.shape, np.uint8)
    shift = np.zeros(r.shape, np.uint8)
    for c, rc in enumerate(r):
        if not (np.isfinite(rc) and rc > 0.0):
            raise Declined(f"rescale {rc:.6g} of channel {c} is not a positive number")
        fit = float_to_prescale_scale_shift(rc, int(k_max[c]))
        if fit is None:
            raise Declined(f"rescale {rc:.6g} of channel {c} does not fit k*scale/2^shift with k in "
                    f"[1,{int(k_max[c])}], scale in [1,{SCALE_MAX}], shift in [0,{SHIFT_MAX}]")
        k[c], scale[c], shift[c] = fit
    return k, scale, shift


def prescale_weights(w: np.ndarray, k: np.ndarray) -> np.ndarray:
    """int16 ``k[c] * W[c, ...]`` of int8 weights ``w`` (output channel first).

    Raises ValueError if a product leaves int16 (``k`` not from :func:`prescale_limit`).
    """
    w = np.asarray(w)
    k = np.asarray(k, np.int64).reshape((-1,) + (1,) * (w.ndim - 1))
    scaled = w.astype(np.int64) * k
    lo, hi = _INT_RANGE["int16"]
    if scaled.size and (scaled.min() < lo or scaled.max() > hi):
        raise ValueError("pre-scaled weights leave the int16 range")
    return scaled.astype(np.int16)


def rescale(d_s: float, w_s: np.ndarray, o_s: float) -> np.ndarray:
    """Per-channel rescale ``r[c] = d_s * w_s[c] / o_s`` (``docs/reference.md``, "Folding"), float64[C]."""
    return float(d_s) * np.asarray(w_s, dtype=np.float64).reshape(-1) / float(o_s)


def requant_params(d_s: float, w_s: np.ndarray, o_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Kernel ``(scale uint8[C], shift uint8[C])`` for ``r[c] = d_s * w_s[c] / o_s``.

    ``w_s`` is the per-output-channel weight scale float32[C] (a scalar is a
    single channel). Raises :class:`Declined` when some channel's rescale is
    not positive or does not fit ``scale in [1,127], shift in [0,31]``
    (deviation (a): the layer then stays on the scalar path).
    """
    r = rescale(d_s, w_s, o_s)
    scale = np.zeros(r.shape, np.uint8)
    shift = np.zeros(r.shape, np.uint8)
    for c, rc in enumerate(r):
        if not (np.isfinite(rc) and rc > 0.0):
            raise Declined(f"rescale {rc:.6g} of channel {c} is not a positive number")
        fit = float_to_scale_shift(rc)
        if fit is None:
            raise Declined(f"rescale {rc:.6g} of channel {c} does not fit scale in [1,{SCALE_MAX}], "
                           f"shift in [0,{SHIFT_MAX}]")
        scale[c], shift[c] = fit
    return scale, shift


def _checked(values: np.ndarray, dtype: str, what: str) -> np.ndarray:
    """``values`` cast to ``dtype``; raises :class:`Declined` naming the first channel outside it."""
    lo, hi = _INT_RANGE[dtype]
    bad = np.flatnonzero((values < lo) | (values > hi))
    if bad.size:
        c = int(bad[0])
        raise Declined(f"{what} of channel {c} ({int(values[c])}) is outside the {dtype} range")
    return values.astype(dtype)


def saturating_bias(folded: np.ndarray, w: np.ndarray, scale: np.ndarray, shift: np.ndarray,
                    out_range: tuple[int, int] = (-128, 127)) -> np.ndarray:
    """``folded`` (float64[C], int8 layer) with each channel outside int32 clipped to int32's end
    (less the accumulator's reach, so no sum wraps), when the clip changes no output: the channel
    saturates at the same end of ``out_range`` (the kernel's ``act_min, act_max``: int8's range, or
    a fused ReLU's) for every accumulator its int8 weights ``w`` ``[C, ...]`` can give (|x| <= 128
    per input), before and after the clip (the requantization ``rshift((acc + bias) * scale,
    shift)`` is monotonic in the bias, :func:`pipeline.backend.kernels.reference.requantize`). A
    trained net has such channels: BatchNorm folded into a near-zero weight leaves a bias worth
    billions of accumulator steps (EfficientNet-Lite0's stem, under its ReLU6). Others are returned
    unchanged (and declined by the range check)."""
    from .kernels.reference import rshift
    lo, hi = _INT_RANGE["int32"]
    out = folded.copy()
    reach = np.abs(w.reshape(w.shape[0], -1).astype(np.int64)).sum(axis=1) * 128
    for c in np.flatnonzero((folded < lo) | (folded > hi)):
        # inside int32 by the reach too, so acc + bias never wraps on an int32 accumulator either
        clipped = lo + reach[c] if folded[c] < 0 else hi - reach[c]
        worst = clipped + (reach[c] if folded[c] < 0 else -reach[c])   # the accumulator pulling back most
        v = int(rshift(np.array([worst * int(scale[c])], np.int64), int(shift[c]))[0])
        if (folded[c] < 0 and v <= out_range[0]) or (folded[c] > 0 and v >= out_range[1]):
            out[c] = clipped
    return out


def fold_bias_i8(bias: np.ndarray | None, d_s: float, d_zp: int, w: np.ndarray, w_s: np.ndarray,
                 o_s: float, o_zp: int, requant: tuple | None = None) -> np.ndarray:
    """int32 kernel bias of an int8 conv / depthwise / FC layer (``docs/reference.md``, "Folding").

    ``w`` is the int8 weight with the output channel first (OIHW, ``[C, C/g, KH, KW]``
    or FC ``[N, K]``); ``bias`` float[C] or ``None`` (zero); ``w_s`` float32[C].
    With ``K`` ranging over everything but the output channel::

        bias_i32[c] = round(b[c] / (d_s*w_s[c])) - d_zp * sum_K W[c, K]
                      + round(o_zp * o_s / (d_s*w_s[c]))      (only if o_zp != 0)

    ``requant``: the layer's ``(scale, shift, (act_min, act_max))``; with it a channel outside int32 whose output
    saturates either way is clipped (:func:`saturating_bias`). Raises :class:`Declined` instead
    of wrapping when a value still leaves int32 (the reference casts without a check).
    """
    w = np.asarray(w)
    channels = w.shape[0]
    unit = float(d_s) * np.broadcast_to(np.asarray(w_s, np.float64).reshape(-1), (channels,))
    b = np.zeros(channels) if bias is None else np.asarray(bias, np.float64).reshape(-1)
    folded = np.rint(b / unit)
    folded -= float(d_zp) * w.reshape(channels, -1).astype(np.int64).sum(axis=1)
    if int(o_zp) != 0:
        folded += np.rint(float(o_zp) * float(o_s) / unit)
    if not np.all(np.isfinite(folded)):
        raise Declined("folded bias is not finite")
    if requant is not None:
        folded = saturating_bias(folded, w, *requant)
    return _checked(folded, "int32", "folded bias")


def fold_bias_i16(bias: np.ndarray | None, d_s: float, w_s: np.ndarray, channels: int,
                  k: np.ndarray | None = None) -> np.ndarray:
    """int64 kernel bias of an int16 layer: ``bias_i64[c] = round(b[c] / (d_s*w_s[c])) * k[c]``.

    No zero-point terms: the int16 kernels are only used with all zero points 0
    (``docs/reference.md``, "int16 folding"). ``k`` int[C]: the weight pre-scale
    (module docstring; ``None`` = 1), so the bias is in the units of the
    k-scaled accumulator; the product is exact integer arithmetic. Raises
    :class:`Declined` if a value leaves int64.
    """
    unit = float(d_s) * np.broadcast_to(np.asarray(w_s, np.float64).reshape(-1), (channels,))
    b = np.zeros(channels) if bias is None else np.asarray(bias, np.float64).reshape(-1)
    folded = np.rint(b / unit)
    k = np.ones(channels, np.int64) if k is None else np.asarray(k, np.int64).reshape(-1)
    if not np.all(np.isfinite(folded)) or np.any(np.abs(folded) * k >= 2.0**63):
        raise Declined("folded int16-path bias is outside the int64 range")
    return folded.astype(np.int64) * k


def residual_multiplier(s_in: float, s_out: float) -> int:
    """Q15 multiplier ``M = round(s_in / s_out * 2**15)`` (``docs/reference.md``, "Residual add").

    Raises :class:`Declined` if ``M`` is not in ``[0, 2**31)``.
    """
    m = np.rint(float(s_in) / float(s_out) * 2.0**RESIDUAL_SHIFT)
    if not np.isfinite(m) or m < 0 or m > _INT_RANGE["int32"][1]:
        raise Declined(f"residual-add multiplier {s_in:.6g}/{s_out:.6g}*2^15 is outside [0, 2^31)")
    return int(m)


def residual_add_params(s_x: float, zp_x: int, s_skip: float, zp_skip: int,
                        s_out: float, zp_out: int) -> np.ndarray:
    """16-byte parameter blob of ``c7x_int{8,16}_residual_add_relu`` (``docs/reference.md``,
    "Residual add").

    Layout (little-endian): int32 ``M_x``, int32 ``M_skip``, int32 shift (=15),
    int8 ``zp_x``, int8 ``zp_skip``, int8 ``zp_out``, one pad byte; with
    ``M_x = round(s_x/s_out * 2**15)``, ``M_skip = round(s_skip/s_out * 2**15)``.
    Returns uint8[16]. Raises :class:`Declined` if a multiplier leaves int32
    or a zero point leaves int8.
    """
    m_x, m_skip = residual_multiplier(s_x, s_out), residual_multiplier(s_skip, s_out)
    for name, zp in (("zp_x", zp_x), ("zp_skip", zp_skip), ("zp_out", zp_out)):
        if not -128 <= int(zp) <= 127:
            raise Declined(f"{name}={int(zp)} does not fit the int8 field of the residual-add params")
    blob = struct.pack("<iiibbbx", m_x, m_skip, RESIDUAL_SHIFT, int(zp_x), int(zp_skip), int(zp_out))
    return np.frombuffer(blob, dtype=np.uint8).copy()


#: Bits of the channel-multiply multiplier M (``M < 2**bits``): |dx * dg| is below
#: 2^16 for int8 and 2^32 for int16, so the product dx * dg * M stays below 2^62.
CHANNEL_MUL_BITS = {"int8": 31, "int16": 29}
CHANNEL_MUL_SHIFT_MAX = 62


def product_params(r: float, zp_x: int, zp_g: int, zp_out: int, bits: int, what: str) -> np.ndarray:
    """16-byte blob ``<int32 M, int32 shift, int32 0, int8 zp_x, int8 zp_g, int8 zp_out, pad>``
    of a kernel that rescales a product of two operands by ``r``: ``M = round_half_even(r *
    2**shift)`` with the largest ``shift <= 62`` keeping ``M < 2**bits``. Returns uint8[16].
    Raises :class:`Declined` (``what`` names the kernel) if ``r`` is not a positive number,
    needs ``M >= 2**bits`` at shift 0, or a zero point leaves int8."""
    if not (np.isfinite(r) and r > 0.0):
        raise Declined(f"{what} rescale {r:.6g} is not a positive number")
    shift = int(np.clip(np.floor(np.log2(2.0**bits / r)), 0, CHANNEL_MUL_SHIFT_MAX))
    m = int(np.rint(r * 2.0**shift))
    while m >= 2**bits and shift > 0:
        shift -= 1
        m = int(np.rint(r * 2.0**shift))
    if m >= 2**bits:
        raise Declined(f"{what} rescale {r:.6g} does not fit M < 2^{bits}")
    for name, zp in (("zp_x", zp_x), ("zp_g", zp_g), ("zp_out", zp_out)):
        if not -128 <= int(zp) <= 127:
            raise Declined(f"{name}={int(zp)} does not fit the int8 field of the {what} params")
    blob = struct.pack("<iiibbbx", m, shift, 0, int(zp_x), int(zp_g), int(zp_out))
    return np.frombuffer(blob, dtype=np.uint8).copy()


def channel_mul_params(s_x: float, zp_x: int, s_g: float, zp_g: int, s_out: float, zp_out: int,
                       dtype: str) -> np.ndarray:
    """16-byte parameter blob of ``c7x_int{8,16}_channel_mul`` (``docs/reference.md``,
    "Squeeze-excitation multiply"), the residual add's layout with one multiplier.

    ``out = rshift((x - zp_x) * (g - zp_g) * M, shift) + zp_out`` approximates
    ``(x - zp_x) s_x * (g - zp_g) s_g / s_out + zp_out`` with
    ``M = round_half_even(r * 2**shift)``, ``r = s_x * s_g / s_out`` (float64 of the
    float32 scales) and the largest ``shift <= 62`` keeping ``M < 2**bits``
    (:data:`CHANNEL_MUL_BITS`: 31 for int8, 29 for int16), i.e. a relative
    precision of 2^-30 / 2^-28 instead of the residual add's Q15.
    Layout: :func:`product_params`. Returns uint8[16]. Raises :class:`Declined` if ``r`` is not
    a positive number, needs ``M >= 2**bits`` at shift 0, or a zero point leaves int8.
    """
    r = float(s_x) * float(s_g) / float(s_out)
    return product_params(r, zp_x, zp_g, zp_out, CHANNEL_MUL_BITS[str(dtype)], "channel-multiply")


def batch_matmul_params(s_a: float, zp_a: int, s_b: float, zp_b: int, s_out: float, zp_out: int,
                        factor: float, dtype: str) -> np.ndarray:
    """16-byte parameter blob of ``mmalib_batch_matmul_i8`` / ``_i16`` (``docs/reference.md``,
    "Attention matmul"): :func:`product_params` of ``r = s_a * s_b * factor / s_out`` (float64;
    ``factor``: the product of the scalar multiplies folded after the matmul) with
    ``M < 2**bits``, bits = ``reference.BATCH_MATMUL_M_BITS`` (31 for int8, 17 for int16).
    Raises :class:`Declined` as :func:`product_params`."""
    from .kernels.reference import BATCH_MATMUL_M_BITS
    r = float(s_a) * float(s_b) * float(factor) / float(s_out)
    return product_params(r, zp_a, zp_b, zp_out, BATCH_MATMUL_M_BITS[np.dtype(dtype)], "batch-matmul")


def quantize_value(v: float, scale: float, zp: int, dtype: str) -> int:
    """torch's ``quantize_per_tensor`` of one value: ``clamp(round(v * float32(1/scale)) + zp)``.

    torch multiplies a float32 tensor by ``1.0 / scale`` (computed in double,
    applied in float32) and rounds half-to-even. Used for the integer bounds of
    fused ReLU6 / clip: quantize is monotone, so ``q(clip(y, a, b)) ==
    clip(q(y), q(a), q(b))`` exactly.
    """
    prod = np.float32(v) * np.float32(1.0 / float(scale))
    lo, hi = _INT_RANGE[dtype]
    return int(np.clip(np.rint(prod) + int(zp), lo, hi))
