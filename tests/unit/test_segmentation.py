"""Host post-processing of a segmentation model: NMS, masks, matching (pipeline/data/segmentation.py)."""

import numpy as np
import pytest

from pipeline.data import segmentation

SIZE = (32, 32)


def _logits(boxes, hm=8):
    """[k, hm, hm] logits: +4 inside each box (input pixels, 4 per mask pixel), -4 outside."""
    out = np.full((len(boxes), hm, hm), -4.0, np.float32)
    for i, (x1, y1, x2, y2) in enumerate(boxes):
        out[i, y1 // 4:y2 // 4, x1 // 4:x2 // 4] = 4.0
    return out


def test_nms_is_class_aware_and_drops_unconfident_rows():
    det = np.array([[0, 0, 16, 16, 0.9, 1], [0, 0, 16, 15, 0.8, 1],     # overlaps the first, same class
                    [0, 0, 16, 16, 0.7, 2],                            # same box, another class: kept
                    [16, 16, 32, 32, 0.2, 1]], np.float32)             # below 0.25
    rows, masks = segmentation.instances(det, _logits([(0, 0, 16, 16)] * 3 + [(16, 16, 32, 32)]), SIZE)
    assert rows[:, 4].tolist() == pytest.approx([0.9, 0.7]) and masks.shape == (2, 32, 32)


def test_masks_are_cropped_to_their_box():
    det = np.array([[0, 0, 8, 32, 0.9, 0]], np.float32)
    logits = np.full((1, 8, 8), 4.0, np.float32)        # everywhere positive
    masks = segmentation.masks_of(det, logits, SIZE)
    assert masks[0, :, :8].all() and not masks[0, :, 8:].any()


def test_compare_counts_matches_and_mask_iou():
    det = np.array([[[0, 0, 16, 16, 0.9, 1], [16, 16, 32, 32, 0.8, 3]]], np.float32)
    logits = _logits([(0, 0, 16, 16), (16, 16, 32, 32)])[None]
    same = segmentation.compare((det, logits), (det, logits), SIZE)
    assert (same["matched"], same["reference_instances"], same["mean_mask_iou"]) == (2, 2, 1.0)
    half = logits.copy()
    half[0, 0, :, :2] = -4.0       # the first mask loses its left half
    other = segmentation.compare((det, logits), (det, half), SIZE)
    assert other["matched"] == 2 and other["worst_mask_iou"] == pytest.approx(0.5, abs=0.05)
    assert other["per_image"][0][:2] == [2, 2]
    none = segmentation.compare((det, logits), (det[:, :0], logits[:, :0]), SIZE)
    assert none["matched"] == 0 and none["matched_fraction"] == 0.0 and none["mean_mask_iou"] is None
