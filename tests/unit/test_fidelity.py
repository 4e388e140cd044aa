"""Per-task fidelity scores (pipeline/data/fidelity.py): decisions, relative logit error, cosine."""

import numpy as np
import pytest

from pipeline.data import fidelity


def test_single_logit_decides_by_sign():
    logits = np.array([[-2.0], [0.5], [3.0], [-0.1]], np.float32)
    assert fidelity.decisions(logits).tolist() == [0, 1, 1, 0]


def test_several_logits_decide_by_argmax():
    logits = np.array([[0.1, 0.9, 0.0], [2.0, -1.0, 1.9]], np.float32)
    assert fidelity.decisions(logits).tolist() == [1, 0]


def test_classifier_scores_binary_model_counts_sign_flips_and_relative_error():
    ref = np.array([[-1.0], [1.0], [3.0], [-3.0]], np.float32)   # std 2.236
    got = np.array([[-0.5], [-0.5], [3.0], [-3.0]], np.float32)  # one sign flips
    s = fidelity.classifier_scores(got, ref, [0, 1, None, 0])
    assert s["top1_agreement_with_float"] == 3
    assert s["top1"] == 2 and s["labeled"] == 3                  # image 1 is labeled 1 but reads 0
    assert s["mean_abs_logit_error_vs_float"] == pytest.approx(0.5)
    assert s["relative_logit_error_vs_float"] == pytest.approx(0.5 / np.std(ref), rel=1e-5)


def test_relative_error_is_none_for_constant_float_logits():
    assert fidelity.relative_error(0.3, np.ones((4, 3))) is None


def test_cosines_and_embedding_scores_name_the_worst_image():
    ref = np.array([[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]])
    got = np.array([[2.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    cos = fidelity.cosines(got, ref)
    assert cos.tolist() == pytest.approx([1.0, np.sqrt(0.5), 1.0])
    s = fidelity.embedding_scores(got, ref, ["a.jpg", "b.jpg", "c.jpg"])
    assert s["worst_image"] == "b.jpg" and s["cosine_min"] == pytest.approx(np.sqrt(0.5), abs=1e-6)
    assert s["cosine_mean"] == pytest.approx((2 + np.sqrt(0.5)) / 3, abs=1e-6)


def test_cosine_of_a_zero_vector_against_a_nonzero_one_is_zero():
    assert fidelity.cosines(np.zeros((1, 3)), np.ones((1, 3))).tolist() == [0.0]


def test_boxes_go_back_to_the_photos_pixels_through_a_stretch_or_a_crop():
    from pipeline.config import PreprocessSpec
    from pipeline.data.images import input_to_original
    stretch = PreprocessSpec(resize=(320, 320), crop=320)
    got = input_to_original(np.array([[0.0, -3.0, 320.0, 160.0]]), stretch, (300, 400))
    assert got.tolist() == [[0.0, 0.0, 400.0, 150.0]] and not np.signbit(got).any()   # clamped, no -0
    crop = PreprocessSpec(resize=256, crop=224)   # 300 x 400 -> 256 x 341, cut 16 rows and 58 columns
    got = input_to_original(np.array([0.0, 0.0, 224.0, 224.0]), crop, (300, 400))
    np.testing.assert_allclose(got, [58 * 400 / 341, 16 * 300 / 256, 282 * 400 / 341, 240 * 300 / 256])
