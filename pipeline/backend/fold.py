"""Compile-time requantization math for the offloaded kernels (pure numpy).

Everything here follows ``c7x-backend-facts.md`` section B ("Folding",
"``_float_to_scale_shift``", "Residual add") and the kernel ABI in
``kernels/c7x_kernels.h``:

- conv / depthwise / FC kernels compute, per output channel ``c``::

      out = saturate(rshift((acc + bias[c]) * scale[c], shift[c]))

  where ``acc`` is the raw integer dot product (no zero points), so all zero
  point terms and the float bias are folded into ``bias``;
- the residual-add kernel takes two Q15 multipliers in a 16-byte blob.

Rounding is numpy's half-to-even (``np.rint``), like Python's ``round`` in the
reference. Float arithmetic is float64 on the float32 scales torch stored.

Two deliberate deviations from the reference, both "decline instead of
silently computing something else" (the caller keeps the layer on the scalar
path and logs the returned reason):

- :func:`float_to_scale_shift` returns ``None`` where the reference silently
  returns ``(1, 0)`` (a rescale that no ``scale in [1,127], shift in [0,31]``
  can represent);
- :func:`fold_bias_i8` / :func:`residual_add_params` range-check their int32
  results where the reference wraps.
"""

from __future__ import annotations

import struct

import numpy as np

#: The kernels declare ``scale`` as a signed byte on the FC path (facts B), so
#: every kernel gets a scale in [1, 127]; shifts are 0..31.
SCALE_MAX = 127
SHIFT_MAX = 31
#: Residual-add multipliers are Q15 (facts B: shift = 15).
RESIDUAL_SHIFT = 15

_INT_RANGE = {"int8": (-128, 127), "int16": (-32768, 32767),
              "int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1)}


def dtype_range(dtype: str) -> tuple[int, int]:
    """``(min, max)`` of an integer dtype name (int8, int16, int32, int64)."""
    return _INT_RANGE[str(dtype)]


def float_to_scale_shift(r: float) -> tuple[int, int] | None:
    """Best ``(scale, shift)`` with ``scale / 2**shift ~= r`` (facts B, ``_float_to_scale_shift``).

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


def rescale(d_s: float, w_s: np.ndarray, o_s: float) -> np.ndarray:
    """Per-channel rescale ``r[c] = d_s * w_s[c] / o_s`` (facts B), float64[C]."""
    return float(d_s) * np.asarray(w_s, dtype=np.float64).reshape(-1) / float(o_s)


def requant_params(d_s: float, w_s: np.ndarray, o_s: float) -> tuple[np.ndarray, np.ndarray] | str:
    """Kernel ``(scale uint8[C], shift uint8[C])`` for ``r[c] = d_s * w_s[c] / o_s``.

    ``w_s`` is the per-output-channel weight scale float32[C] (a scalar is a
    single channel). Returns a reason string instead when some channel's
    rescale is not positive or does not fit ``scale in [1,127], shift in [0,31]``
    (deviation (a): the layer then stays on the scalar path).
    """
    r = rescale(d_s, w_s, o_s)
    scale = np.zeros(r.shape, np.uint8)
    shift = np.zeros(r.shape, np.uint8)
    for c, rc in enumerate(r):
        if not (np.isfinite(rc) and rc > 0.0):
            return f"rescale {rc:.6g} of channel {c} is not a positive number"
        fit = float_to_scale_shift(rc)
        if fit is None:
            return (f"rescale {rc:.6g} of channel {c} does not fit scale in [1,{SCALE_MAX}], "
                    f"shift in [0,{SHIFT_MAX}]")
        scale[c], shift[c] = fit
    return scale, shift


def _checked(values: np.ndarray, dtype: str, what: str) -> np.ndarray | str:
    lo, hi = _INT_RANGE[dtype]
    bad = np.flatnonzero((values < lo) | (values > hi))
    if bad.size:
        c = int(bad[0])
        return f"{what} of channel {c} ({int(values[c])}) is outside the {dtype} range"
    return values.astype(dtype)


def fold_bias_i8(bias: np.ndarray | None, d_s: float, d_zp: int, w: np.ndarray, w_s: np.ndarray,
                 o_s: float, o_zp: int) -> np.ndarray | str:
    """int32 kernel bias of an int8 conv / depthwise / FC layer (facts B, "Folding").

    ``w`` is the int8 weight with the output channel first (OIHW, ``[C, C/g, KH, KW]``
    or FC ``[N, K]``); ``bias`` float[C] or ``None`` (zero); ``w_s`` float32[C].
    With ``K`` ranging over everything but the output channel::

        bias_i32[c] = round(b[c] / (d_s*w_s[c])) - d_zp * sum_K W[c, K]
                      + round(o_zp * o_s / (d_s*w_s[c]))      (only if o_zp != 0)

    Returns a reason string instead of wrapping when a value leaves int32
    (the reference casts without a check).
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
        return "folded bias is not finite"
    return _checked(folded, "int32", "folded bias")


def fold_bias_i16(bias: np.ndarray | None, d_s: float, w_s: np.ndarray, channels: int) -> np.ndarray | str:
    """int64 kernel bias of an int16 layer: ``bias_i64[c] = round(b[c] / (d_s*w_s[c]))``.

    No zero-point terms: the int16 kernels are only used with all zero points 0
    (facts B, "int16 folding"). Returns a reason string if a value leaves int64.
    """
    unit = float(d_s) * np.broadcast_to(np.asarray(w_s, np.float64).reshape(-1), (channels,))
    b = np.zeros(channels) if bias is None else np.asarray(bias, np.float64).reshape(-1)
    folded = np.rint(b / unit)
    if not np.all(np.isfinite(folded)) or np.any(np.abs(folded) >= 2.0**63):
        return "folded int16-path bias is outside the int64 range"
    return folded.astype(np.int64)


def residual_multiplier(s_in: float, s_out: float) -> int | str:
    """Q15 multiplier ``M = round(s_in / s_out * 2**15)`` (facts B, residual add); int32-checked."""
    m = np.rint(float(s_in) / float(s_out) * 2.0**RESIDUAL_SHIFT)
    if not np.isfinite(m) or m < 0 or m > _INT_RANGE["int32"][1]:
        return f"residual-add multiplier {s_in:.6g}/{s_out:.6g}*2^15 is outside [0, 2^31)"
    return int(m)


def residual_add_params(s_x: float, zp_x: int, s_skip: float, zp_skip: int,
                        s_out: float, zp_out: int) -> np.ndarray | str:
    """16-byte parameter blob of ``c7x_int{8,16}_residual_add_relu`` (facts B, header).

    Layout (little-endian): int32 ``M_x``, int32 ``M_skip``, int32 shift (=15),
    int8 ``zp_x``, int8 ``zp_skip``, int8 ``zp_out``, one pad byte; with
    ``M_x = round(s_x/s_out * 2**15)``, ``M_skip = round(s_skip/s_out * 2**15)``.
    Returns uint8[16], or a reason string if a multiplier leaves int32 or a
    zero point leaves int8.
    """
    m_x, m_skip = residual_multiplier(s_x, s_out), residual_multiplier(s_skip, s_out)
    for m in (m_x, m_skip):
        if isinstance(m, str):
            return m
    for name, zp in (("zp_x", zp_x), ("zp_skip", zp_skip), ("zp_out", zp_out)):
        if not -128 <= int(zp) <= 127:
            return f"{name}={int(zp)} does not fit the int8 field of the residual-add params"
    blob = struct.pack("<iiibbbx", m_x, m_skip, RESIDUAL_SHIFT, int(zp_x), int(zp_skip), int(zp_out))
    return np.frombuffer(blob, dtype=np.uint8).copy()


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
