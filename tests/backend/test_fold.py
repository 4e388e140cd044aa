"""Folding math (pipeline.backend.fold) against hand-computed values and the rules of
docs/reference.md ("Scale and shift", "Folding", "int16 folding", "Residual add"):
scale/shift search, bias folding, residual-add blob."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from pipeline import torchenv  # noqa: F401  (registers quantized_decomposed ops)
from pipeline.backend import fold
from pipeline.backend.refusal import Declined


# ----------------------------------------------------------------------------- float_to_scale_shift


def test_scale_shift_hand_value():
    # 0.3 * 2^8 = 76.8 -> 77 (error 0.26 %); 0.3 * 2^9 = 153.6 -> 154 > 127 stops the search.
    assert fold.float_to_scale_shift(0.3) == (77, 8)
    # 0.0004 * 2^18 = 104.86 -> 105; 2^19 gives 210 > 127.
    assert fold.float_to_scale_shift(0.0004) == (105, 18)


def test_scale_shift_exact_ties_keep_the_smaller_shift():
    # 1.0 is exact as 1/2^0, 2/2^1, ..., 64/2^6: the first (smallest shift) wins.
    assert fold.float_to_scale_shift(1.0) == (1, 0)
    assert fold.float_to_scale_shift(96.0) == (96, 0)
    # 0.75: (1,0) and (2,1) tie at 33 % error, (3,2) is exact.
    assert fold.float_to_scale_shift(0.75) == (3, 2)


def test_scale_shift_rounds_half_to_even():
    # 0.5 * 2^0 = 0.5 rounds to 0 (half-to-even) and is skipped; half-up would give (1, 0).
    assert fold.float_to_scale_shift(0.5) == (1, 1)
    # 126.5 -> 126 (even); half-up would give 127. 2 * 126.5 = 253 > 127 stops.
    assert fold.float_to_scale_shift(126.5) == (126, 0)


@pytest.mark.parametrize("r", [127.5, 200.0, 1e6, 2.0**-33, 0.4 * 2.0**-31])
def test_scale_shift_unrepresentable_is_none(r):
    # The reference silently returns (1, 0) here; we return None so the pass can decline.
    assert fold.float_to_scale_shift(r) is None


def test_scale_shift_edges_of_the_range():
    assert fold.float_to_scale_shift(127.4) == (127, 0)
    assert fold.float_to_scale_shift(0.6 * 2.0**-31) == (1, 31)


@pytest.mark.parametrize("r", [0.0, -0.25])
def test_scale_shift_non_positive_is_zero(r):
    assert fold.float_to_scale_shift(r) == (0, 0)


@pytest.mark.parametrize("r", [float("nan"), float("inf")])
def test_scale_shift_not_finite_is_none(r):
    assert fold.float_to_scale_shift(r) is None


def test_scale_shift_is_the_best_pair_by_brute_force():
    """Independent formulation: over every (s, sh) with s in [1,127], sh in [0,31],
    the minimum relative error, ties to the smaller shift then the smaller error."""
    rng = np.random.default_rng(7)
    s_all = np.arange(1, 128, dtype=np.float64)
    for r in np.exp(rng.uniform(np.log(1e-9), np.log(127.0), 300)):
        best = None
        for sh in range(32):
            err = np.abs(s_all / 2.0**sh - r) / r
            i = int(np.argmin(err))
            if best is None or err[i] < best[0]:
                best = (err[i], int(s_all[i]), sh)
        assert fold.float_to_scale_shift(r) == (best[1], best[2]), r


# ----------------------------------------------------------------------------- requant_params


def test_requant_params_per_channel():
    scale, shift = fold.requant_params(0.02, np.array([0.001, 0.003], np.float32), 0.05)
    # r = 0.02 * w_s / 0.05 = [0.0004, 0.0012]; 0.0012 * 2^16 = 78.64 -> 79.
    assert scale.dtype == np.uint8 and shift.dtype == np.uint8
    assert scale.tolist() == [105, 79] and shift.tolist() == [18, 16]


def test_requant_params_declines_with_the_channel():
    with pytest.raises(Declined) as e:
        fold.requant_params(1.0, np.array([0.01, 200.0], np.float32), 1.0)
    assert "channel 1" in e.value.reason and "does not fit" in e.value.reason
    with pytest.raises(Declined) as e:
        fold.requant_params(1.0, np.array([1e-12], np.float32), 1.0)
    assert "channel 0" in e.value.reason
    with pytest.raises(Declined) as e:
        fold.requant_params(1.0, np.array([0.5, 0.0], np.float32), 1.0)
    assert "not a positive number" in e.value.reason


# ----------------------------------------------------------------------------- bias folding


def test_fold_bias_i8_hand_value():
    w = np.array([[1, 2, 3], [-4, 5, -6]], np.int8)         # sum_k W = [6, -5]
    b = np.array([0.5, -1.0])
    out = fold.fold_bias_i8(b, d_s=0.1, d_zp=3, w=w, w_s=np.array([0.01, 0.02], np.float32),
                            o_s=0.2, o_zp=-5)
    unit = 0.1 * np.array([0.01, 0.02], np.float32).astype(np.float64)
    # round(b/unit) - 3 * [6, -5] + round(-5 * 0.2 / unit) = [500-18-1000, -500+15-500]
    expected = np.rint(b / unit) - 3 * np.array([6, -5]) + np.rint(-1.0 / unit)
    assert expected.tolist() == [-518, -985]
    assert out.dtype == np.int32 and out.tolist() == [-518, -985]


def test_fold_bias_i8_conv_weight_sums_all_but_the_output_channel():
    w = np.ones((2, 3, 3, 3), np.int8)
    w[1] = -2
    out = fold.fold_bias_i8(None, d_s=1.0, d_zp=-2, w=w, w_s=np.ones(2, np.float32), o_s=1.0, o_zp=0)
    assert out.tolist() == [2 * 27, -2 * 2 * 27]            # -d_zp * sum W, no bias, no o_zp term


def test_fold_bias_i8_rounds_half_to_even():
    out = fold.fold_bias_i8(np.array([2.5, 3.5, -2.5]), 1.0, 0, np.zeros((3, 1), np.int8),
                            np.ones(3, np.float32), 1.0, 0)
    assert out.tolist() == [2, 4, -2]


def test_fold_bias_i8_range_check():
    w = np.zeros((1, 1), np.int8)
    ok = fold.fold_bias_i8(np.array([2.0**31 - 1]), 1.0, 0, w, np.ones(1, np.float32), 1.0, 0)
    assert ok.tolist() == [2**31 - 1]
    with pytest.raises(Declined) as e:
        fold.fold_bias_i8(np.array([2.0**31]), 1.0, 0, w, np.ones(1, np.float32), 1.0, 0)
    assert "int32" in e.value.reason
    with pytest.raises(Declined):
        fold.fold_bias_i8(np.array([-2.0**31 - 1]), 1.0, 0, w, np.ones(1, np.float32), 1.0, 0)


def test_fold_bias_i16():
    out = fold.fold_bias_i16(np.array([0.25, 0.75, 1e12]), 0.5, np.ones(3, np.float32), 3)
    assert out.dtype == np.int64 and out.tolist() == [0, 2, 2 * 10**12]   # 0.5 -> 0, 1.5 -> 2
    assert fold.fold_bias_i16(None, 0.5, np.ones(2, np.float32), 2).tolist() == [0, 0]
    with pytest.raises(Declined):
        fold.fold_bias_i16(np.array([1e30]), 1.0, np.ones(1, np.float32), 1)


# ----------------------------------------------------------------------------- residual add


def test_residual_params_blob_layout():
    blob = fold.residual_add_params(0.02, 1, 0.01, -2, 0.04, 3)
    assert blob.dtype == np.uint8 and blob.shape == (16,)
    m_x, m_skip, shift, zx, zs, zo, pad = struct.unpack("<iiibbbB", blob.tobytes())
    assert (m_x, m_skip, shift) == (16384, 8192, 15)          # 0.5 * 2^15, 0.25 * 2^15
    assert (zx, zs, zo, pad) == (1, -2, 3, 0)


def test_residual_multiplier_half_to_even_and_range():
    assert fold.residual_multiplier(2.5 / 2**15, 1.0) == 2
    assert fold.residual_multiplier(3.5 / 2**15, 1.0) == 4
    assert fold.residual_multiplier(2.0**16 - 2.0**-15, 1.0) == 2**31 - 1
    with pytest.raises(Declined):
        fold.residual_multiplier(2.0**16, 1.0)                          # 2^31 leaves int32
    with pytest.raises(Declined):
        fold.residual_add_params(2.0**16, 0, 1.0, 0, 1.0, 0)
    with pytest.raises(Declined):
        fold.residual_add_params(1.0, 200, 1.0, 0, 1.0, 0)


# ----------------------------------------------------------------------------- quantize_value


def test_quantize_value_matches_torch():
    rng = np.random.default_rng(3)
    q = torch.ops.quantized_decomposed.quantize_per_tensor.default
    for _ in range(300):
        v = float(np.float32(rng.uniform(-8, 8)))
        s = float(np.float32(rng.uniform(1e-3, 0.2)))
        zp = int(rng.integers(-20, 20))
        for dtype, tdt, lo, hi in (("int8", torch.int8, -128, 127), ("int16", torch.int16, -32768, 32767)):
            expected = int(q(torch.tensor([v]), s, zp, lo, hi, tdt)[0])
            assert fold.quantize_value(v, s, zp, dtype) == expected


# ----------------------------------------------------------------------------- int16 weight pre-scaling


def _rel_err(triple, r):
    k, s, sh = triple
    return abs(k * s / 2.0**sh - r) / r


def test_prescale_hand_value_and_tie_rule():
    # r = 7400 / 2^20 = 925 / 2^17 exactly. Exact triples need k*s = 925 * 2^(sh-17):
    # sh=17: 925 = 25*37 (k >= 925/127 -> smallest divisor k = 25), sh=18: 1850 = 25*74,
    # sh=19: 3700 = 37*100, sh=20: 7400 = 74*100. Smallest k (25), then smallest shift (17).
    assert fold.float_to_prescale_scale_shift(7400 / 2**20) == (25, 37, 17)
    # 1.0 is exact with k=1 at every shift 0..6: smallest k, then smallest shift.
    assert fold.float_to_prescale_scale_shift(1.0) == (1, 1, 0)
    # Above the 7-bit range: 200 = 2 * 100 (k = 1 cannot represent it).
    assert fold.float_to_prescale_scale_shift(200.0) == (2, 100, 0)


def test_prescale_with_k_max_1_is_float_to_scale_shift():
    rng = np.random.default_rng(7)
    for r in list(np.exp(rng.uniform(np.log(1e-10), np.log(130.0), 1000))) + [0.5, 126.5, 127.5, 2.0**-33]:
        base = fold.float_to_scale_shift(r)
        assert fold.float_to_prescale_scale_shift(r, 1) == (None if base is None else (1, *base)), r


def test_prescale_edges():
    assert fold.float_to_prescale_scale_shift(0.0) == (1, 0, 0)
    assert fold.float_to_prescale_scale_shift(-1.0) == (1, 0, 0)
    assert fold.float_to_prescale_scale_shift(float("nan")) is None
    assert fold.float_to_prescale_scale_shift(0.4 * 2.0**-31) is None       # nothing rounds to >= 1
    assert fold.float_to_prescale_scale_shift(256 * 127.0) == (256, 127, 0)
    assert fold.float_to_prescale_scale_shift(256 * 127.5 + 1) is None
    with pytest.raises(ValueError):
        fold.float_to_prescale_scale_shift(0.1, 257)


def test_prescale_is_the_best_triple_by_brute_force():
    """Independent formulation: every product k*s (k <= 256, s <= 127) at every shift;
    the minimum relative error, ties to the smallest k then the smallest shift."""
    rng = np.random.default_rng(11)
    ks = np.repeat(np.arange(1, 257), 127)
    ss = np.tile(np.arange(1, 128), 256)
    prods = (ks * ss).astype(np.float64)
    for r in np.exp(rng.uniform(np.log(1e-7), np.log(50.0), 60)):
        best = None
        for sh in range(32):
            err = np.abs(prods / 2.0**sh - r) / r
            i = int(np.argmin(err))                      # first = smallest k at this shift
            cand = (err[i], int(ks[i]), sh, int(ss[i]))
            if best is None or cand[:2] < best[:2]:      # smaller error, else smaller k
                best = cand
        got = fold.float_to_prescale_scale_shift(r)
        assert got == (best[1], best[3], best[2]), (r, got, best)


def test_prescale_precision_typical_rescales():
    """~14-bit multiplier: median relative error < 1e-4 (vs ~2.7e-3 with the 7-bit scale alone)."""
    rng = np.random.default_rng(0)
    rs = np.exp(rng.uniform(np.log(1e-6), np.log(10.0), 500))
    pre = np.array([_rel_err(fold.float_to_prescale_scale_shift(r), r) for r in rs])
    base = np.array([_rel_err((1, *fold.float_to_scale_shift(r)), r) for r in rs])
    assert np.median(pre) < 1e-4 and np.percentile(pre, 90) < 2e-4 and pre.max() < 1e-3
    assert np.median(base) > 20 * np.median(pre)
    assert np.all(pre <= base)                            # k = 1 is always a candidate


def test_prescale_limit_uses_each_channels_min_and_max():
    w = np.array([[127, -128, 0], [0, 0, 0], [1, -1, 0]], np.int8)
    assert fold.prescale_limit(w).tolist() == [256, 256, 256]           # int8 always allows 256
    wide = np.array([[200, 0], [0, -300], [200, -100], [-32768, 1]], np.int16)
    # 32767 // 200 = 163; 32768 // 300 = 109; min(163, 327); 32768 // 32768 = 1
    assert fold.prescale_limit(wide).tolist() == [163, 109, 163, 1]
    k = fold.prescale_limit(wide)
    assert np.all(np.abs(wide.astype(np.int64) * k[:, None]) <= 32768)


def test_prescale_weights_are_exact_int16():
    w = np.array([[[[127]], [[-128]]], [[[5]], [[-3]]]], np.int8)        # OIHW [2, 2, 1, 1]
    out = fold.prescale_weights(w, np.array([256, 7]))
    assert out.dtype == np.int16 and out.reshape(2, 2).tolist() == [[32512, -32768], [35, -21]]
    with pytest.raises(ValueError):
        fold.prescale_weights(np.array([[-128]], np.int8), np.array([257]))


def test_fold_bias_i16_prescaled():
    out = fold.fold_bias_i16(np.array([0.25, 0.75, -1.5]), 0.5, np.ones(3, np.float32), 3,
                             k=np.array([3, 5, 256]))
    assert out.dtype == np.int64 and out.tolist() == [0, 2 * 5, -3 * 256]   # round first, then * k
    with pytest.raises(Declined):
        fold.fold_bias_i16(np.array([2.0**56]), 1.0, np.ones(1, np.float32), 1, k=np.array([256]))


def test_prescale_requant_params_per_channel_and_reasons():
    w_s = np.array([0.001, 0.003], np.float32)
    k, scale, shift = fold.prescale_requant_params(0.02, w_s, 0.05, np.array([256, 256]))
    assert k.dtype == np.int64 and scale.dtype == np.uint8 and shift.dtype == np.uint8
    r = fold.rescale(0.02, w_s, 0.05)
    assert np.all(np.abs(k * scale / 2.0**shift - r) / r < 2e-4)             # 1.3e-4 here
    assert np.all((k >= 1) & (k <= 256) & (scale >= 1) & (scale <= 127) & (shift <= 31))
    k1, s1, sh1 = fold.prescale_requant_params(0.02, w_s, 0.05, np.array([1, 1]))
    assert k1.tolist() == [1, 1] and (s1.tolist(), sh1.tolist()) == ([105, 79], [18, 16])
    with pytest.raises(Declined) as e:
        fold.prescale_requant_params(1.0, np.array([0.5, 0.0], np.float32), 1.0, np.array([256, 256]))
    assert "channel 1" in e.value.reason


def test_prescaled_requantization_is_the_direct_formula_exactly():
    """Integer identity behind the pre-scaling, with the kernels' numpy twin:
    requant(acc(x, k*W), k*B, s, sh) == rshift((acc(x, W) + B) * (k*s), sh) exactly, and
    that is within 0.5 + |acc + B| * |k*s/2^sh - r| (+ half-up vs exact rounding) of (acc + B) * r."""
    from pipeline.backend.kernels import reference

    rng = np.random.default_rng(3)
    c, kdim, m = 24, 288, 50
    w8 = rng.integers(-128, 128, (c, kdim)).astype(np.int8)
    x = rng.integers(-32768, 32768, (kdim, m)).astype(np.int64)
    w_s = np.exp(rng.uniform(np.log(1e-4), np.log(1e-2), c)).astype(np.float32)
    d_s, o_s = 3e-4, 2e-2
    bias_f = rng.normal(0, 0.5, c)
    k, s, sh = fold.prescale_requant_params(d_s, w_s, o_s, fold.prescale_limit(w8))
    w16 = fold.prescale_weights(w8, k)
    b16 = fold.fold_bias_i16(bias_f, d_s, w_s, c, k)
    acc = w8.astype(np.int64) @ x                                   # [C, M]
    acc_k = w16.astype(np.int64) @ x
    np.testing.assert_array_equal(acc_k, acc * k[:, None])          # acc' = k * acc, exact
    out = reference.requantize(acc_k, b16, s, sh, np.int16).astype(np.int64)
    b = np.rint(bias_f / (d_s * w_s.astype(np.float64))).astype(np.int64)
    total = acc + b[:, None]
    direct = reference.rshift(total * (k * s.astype(np.int64))[:, None], sh.astype(np.int64)[:, None])
    np.testing.assert_array_equal(out, np.clip(direct, -32768, 32767))
    r = fold.rescale(d_s, w_s, o_s)[:, None]
    unsat = np.abs(direct) < 32767
    approx = np.abs(total * (k * s / 2.0**sh)[:, None] - total * r)
    assert np.all((np.abs(out - total * r) <= 0.5 + approx + 1e-9)[unsat])
    assert unsat.mean() > 0.5 and np.abs(out[unsat]).max() > 5000   # a real int16 range


def test_a_bias_beyond_int32_is_clipped_only_where_the_channel_saturates_either_way():
    """EfficientNet-Lite0's stem: BatchNorm folded into near-zero weights leaves a bias of billions
    of accumulator steps; the output is the int8 minimum whatever the input, before and after."""
    from pipeline.backend.kernels.reference import requantize
    w = np.array([[1, -2, 3], [1, -2, 3]], np.int8)
    scale, shift = np.array([64, 64], np.uint8), np.array([20, 20], np.uint8)   # rescale 2^-14
    folded = np.array([-6.3e9, 5.0e9])
    out = fold.saturating_bias(folded, w, scale, shift)
    assert out[0] == -(2**31) + 6 * 128 and out[1] == 2**31 - 1 - 6 * 128
    accs = np.array([[-6 * 128, 0, 6 * 128]] * 2, np.int64)   # [C, pixels]: both reachable extremes
    clipped = requantize(accs, out.astype(np.int64), scale, shift, "int8")
    exact = requantize(accs, folded.astype(np.int64), scale, shift, "int8")
    np.testing.assert_array_equal(clipped, exact)
    assert clipped[0].tolist() == [-128] * 3 and clipped[1].tolist() == [127] * 3


def test_a_bias_beyond_int32_that_the_input_could_still_move_is_declined():
    w = np.array([[100] * 64], np.int8)                                  # reach 64 * 100 * 128
    scale, shift = np.array([1], np.uint8), np.array([31], np.uint8)     # rescale 2^-31: nothing saturates
    assert fold.saturating_bias(np.array([-3.0e9]), w, scale, shift)[0] == -3.0e9
    with pytest.raises(Declined, match="outside the int32 range"):
        fold.fold_bias_i8(np.array([-3.0e9]), d_s=1.0, d_zp=0, w=w, w_s=np.ones(1, np.float32),
                          o_s=1.0, o_zp=0, requant=(scale, shift))


def test_a_bias_beyond_int32_under_a_relu_is_clipped_when_the_relu_zeroes_it_either_way():
    """A tiny rescale: the channel's value is a few steps below zero, not int8's end, and the fused
    ReLU6 (act range [0, 127]) makes it 0 whatever the input and whichever bias."""
    from pipeline.backend.kernels.reference import requantize
    w = np.array([[1, 0, -1]], np.int8)
    scale, shift = np.array([1], np.uint8), np.array([31], np.uint8)      # rescale 2^-31
    folded = np.array([-6.29e9])
    assert fold.saturating_bias(folded, w, scale, shift)[0] == -6.29e9    # int8's end is not reached
    out = fold.saturating_bias(folded, w, scale, shift, out_range=(0, 127))
    assert out[0] == -(2**31) + 2 * 128
    accs = np.array([[-256, 0, 256]], np.int64)
    np.testing.assert_array_equal(requantize(accs, out.astype(np.int64), scale, shift, "int8", act=(0, 127)),
                                  requantize(accs, folded.astype(np.int64), scale, shift, "int8", act=(0, 127)))


def test_a_near_dead_channel_is_requantized_at_a_floor_instead_of_declining_the_layer():
    """EfficientNet-Lite0's stem (measured): a channel of weights about 2e-6 and bias -5.9 is always
    0 after ReLU6; with an affine output (zero point -128) its folded bias left int32 and the conv
    fell back to the scalar path. Floored, it folds, and the kernel gives that channel's 0 (-128)
    for every input, as float does; the live channel is untouched."""
    from pipeline.backend.kernels.reference import requantize
    from pipeline.backend.passes.graph import QDQ
    from pipeline.backend.passes.weighted import DEAD_CHANNEL_FLOOR, Weights, _fold_i8_at, fold_weighted
    from pipeline.backend.refusal import Declined
    rng = np.random.default_rng(0)
    q = rng.integers(-127, 128, size=(2, 3, 3, 3)).astype(np.int8)
    scale = np.array([0.05, 2.4e-6 / 127], np.float32)
    data = QDQ(None, np.array(0.016, np.float32), np.array(-10), 0, "int8")
    out = QDQ(None, np.array(6 / 255, np.float32), np.array(-128), 0, "int8")
    relu6 = (-128, 127)
    with pytest.raises(Declined, match="folded bias of channel 1 .* is outside the int32 range"):
        _fold_i8_at(Weights(q, scale, np.zeros(2, np.int64)), np.array([0.3, -5.9]), data, out, relu6)
    folded = fold_weighted(Weights(q, scale, np.zeros(2, np.int64)), np.array([0.3, -5.9]), data, out, "int8", relu6)
    assert folded.note and "1 near-dead channel(s) [1]" in folded.note
    assert folded.bias.dtype == np.int32 and np.array_equal(folded.w[0], q[0])   # the live channel as it was
    assert np.abs(folded.w[1]).max() <= round(127 * scale[1] / (scale[0] * DEAD_CHANNEL_FLOOR)) + 1
    x = rng.integers(-128, 128, size=(200, 27)).astype(np.int64)
    acc = folded.w.reshape(2, -1).astype(np.int64) @ x.T             # [C, images]
    got = requantize(acc, folded.bias, folded.scale, folded.shift, np.int8, act=relu6)
    assert (got[1] == -128).all()
