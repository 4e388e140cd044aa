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


def test_letterbox_keeps_the_aspect_pads_with_114_and_maps_back():
    import torch

    from pipeline.config import PreprocessSpec
    from pipeline.data.images import input_to_original, letterbox_geometry, make_transform, masks_to_original
    pre = PreprocessSpec(resize=(320, 320), crop=320, mean=(0, 0, 0), std=(1, 1, 1), letterbox=True)
    assert letterbox_geometry((480, 640), 320) == (0.5, 240, 320, 40, 0)   # ultralytics' LetterBox numbers
    x = make_transform(pre)(torch.full((3, 480, 640), 200, dtype=torch.uint8))
    assert x.shape == (3, 320, 320)
    gray, photo = torch.tensor(114 / 255), torch.tensor(200 / 255)
    assert torch.allclose(x[:, :40], gray) and torch.allclose(x[:, 280:], gray)   # the bands
    assert torch.allclose(x[:, 40:280], photo)
    got = input_to_original(np.array([[10.0, 40.0, 320.0, 300.0]]), pre, (480, 640))
    assert got.tolist() == [[20.0, 0.0, 640.0, 480.0]]       # padding off, / 0.5, clamped
    masks = np.zeros((1, 320, 320), bool)
    masks[0, 40:160, :160] = True                            # the photo's top-left quarter
    back = masks_to_original(masks, pre, (480, 640))
    assert back.shape == (1, 480, 640) and back[0, :240, :320].all() and back.sum() == 240 * 320


def test_masks_go_back_through_a_stretch_and_a_crop():
    from pipeline.config import PreprocessSpec
    from pipeline.data.images import masks_to_original
    full = np.ones((1, 224, 224), bool)
    crop = masks_to_original(full, PreprocessSpec(resize=256, crop=224), (256, 256))
    assert crop[0, 16:240, 16:240].all() and crop.sum() == 224 * 224   # nothing outside the crop
    left = np.zeros((2, 224, 224), bool)
    left[:, :, :112] = True
    stretch = masks_to_original(left, PreprocessSpec(resize=(224, 224), crop=224), (100, 300))
    assert stretch.shape == (2, 100, 300) and stretch[:, :, :150].all() and not stretch[:, :, 150:].any()


def test_holdout_lines_per_task():
    base = {"method": "k-fold", "folds": 2, "evaluation_set": "scenes", "images": 17}
    det = {"confident": {"matched": 30, "reference_detections": 40, "matched_fraction": 0.75}, "map50": 0.8}
    seg = {**base, "c": {"variant": "mmalib", "detections_vs_float": det,
                         "instances_vs_float": {"matched": 9, "reference_instances": 10, "matched_fraction": 0.9,
                                                "mean_mask_iou": 0.95, "worst_mask_iou": 0.8}}}
    assert fidelity.holdout_lines(seg) == ["2-fold on scenes (17 images), C mmalib vs float",
                                           "detections matched (IoU >= 0.5): 30/40 (0.75), mAP@0.5 0.80",
                                           "instances after NMS matched: 9/10 (0.90), mask IoU mean 0.95, worst 0.80"]
    emb = {**base, "c": {"variant": "mmalib", "cosine_mean": 0.9, "cosine_min": 0.5, "worst_image": "a.jpg"}}
    assert fidelity.holdout_lines(emb)[1] == "cosine mean 0.9000, worst 0.5000 (a.jpg)"
    assert fidelity.holdout_lines({"method": "separate"}) == [] and fidelity.holdout_lines(None) == []
