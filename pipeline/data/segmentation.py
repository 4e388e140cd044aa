"""Instance masks of a ranked segmentation export: NMS, masks, and matching against float.

A segmentation model (``task = "segmentation"``, e.g. ``pipeline.models.yolo:yolo11n_seg``)
returns two outputs per image: candidates float32 ``[D, 6]`` in the detection form
(:mod:`pipeline.data.detections`: ``x1, y1, x2, y2`` input pixels, ``score``, ``class``)
and mask logits float32 ``[D, Hm, Wm]`` (coefficients x prototypes, one map per
candidate, at 1/4 of the input). The candidates are not NMS-free, so the host finishes as
ultralytics' predictor does (``ops.non_max_suppression``, ``ops.process_mask`` with
``upsample=True``), in float:

1. candidates with score >= :data:`~pipeline.data.detections.CONF` (0.25);
2. class-aware NMS at IoU :data:`NMS_IOU` (0.7, ultralytics' default), by
   ``torchvision.ops.batched_nms``;
3. each kept mask: logits resized bilinearly to the input size (``align_corners=False``),
   > 0 (sigmoid > 0.5), then cropped to its box (columns ``x1 <= c < x2``, rows likewise).

Two builds of one image are compared as detectors are (same class, box IoU >= 0.5,
greedy by the reference's score) and, for each matched pair, by the IoU of their masks.
"""

from __future__ import annotations

import numpy as np
import torch

from . import detections

#: ultralytics' default IoU threshold of ``non_max_suppression`` (``iou=0.7``)
NMS_IOU = 0.7


def instances(det: np.ndarray, logits: np.ndarray, size: tuple[int, int],
              conf: float = detections.CONF, iou: float = NMS_IOU) -> tuple[np.ndarray, np.ndarray]:
    """One image's instances after the steps of the module docstring.

    ``det``: float32 ``[D, 6]``; ``logits``: float32 ``[D, Hm, Wm]``; ``size``: the input's
    ``(H, W)`` in pixels. Returns ``(rows [k, 6], masks bool [k, H, W])``, rows in
    descending score."""
    from torchvision.ops import batched_nms

    keep = np.flatnonzero(det[:, 4] >= conf)
    if len(keep):
        t = torch.from_numpy(np.ascontiguousarray(det[keep], dtype=np.float32))
        kept = batched_nms(t[:, :4], t[:, 4], t[:, 5].round().long(), iou).numpy()
        keep = keep[kept]
    rows = det[keep]
    return rows, masks_of(rows, logits[keep], size)


def masks_of(rows: np.ndarray, logits: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """bool ``[k, H, W]`` masks of ``rows`` [k, 6] from their ``logits`` [k, Hm, Wm] at the
    input ``size`` (step 3 of the module docstring)."""
    h, w = size
    if len(rows) == 0:
        return np.zeros((0, h, w), dtype=bool)
    up = torch.nn.functional.interpolate(torch.from_numpy(np.ascontiguousarray(logits, dtype=np.float32))[None],
                                         size=(h, w), mode="bilinear", align_corners=False)[0].numpy() > 0
    cols, lines = np.arange(w)[None, None, :], np.arange(h)[None, :, None]
    x1, y1, x2, y2 = (rows[:, i][:, None, None] for i in range(4))
    return up & (cols >= x1) & (cols < x2) & (lines >= y1) & (lines < y2)


def mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    """IoU of two bool masks of one shape (1.0 when both are empty)."""
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0


def compare(ref: tuple[np.ndarray, np.ndarray], cand: tuple[np.ndarray, np.ndarray],
            size: tuple[int, int]) -> dict:
    """Match ``cand``'s instances against ``ref``'s, image by image.

    ``ref``, ``cand``: ``(candidates [N, D, 6], mask logits [N, D, Hm, Wm])``; ``size``: the
    input ``(H, W)``. Returns the reference instance count, matched count and fraction
    (None without reference instances), the mean mask IoU of the matched pairs and its
    worst pair, and ``per_image``: ``[reference instances, matched, mean mask IoU or None]``.
    """
    n_ref = n_match = 0
    ious, per_image = [], []
    for rd, rl, cd, cl in zip(ref[0], ref[1], cand[0], cand[1]):
        r_rows, r_masks = instances(rd, rl, size)
        c_rows, c_masks = instances(cd, cl, size)
        pairs = detections.match(r_rows, c_rows)
        image = [mask_iou(r_masks[i], c_masks[j]) for i, j, _ in pairs]
        n_ref, n_match, ious = n_ref + len(r_rows), n_match + len(pairs), ious + image
        per_image.append([len(r_rows), len(pairs), round(float(np.mean(image)), 4) if image else None])
    return {"selection": f"score >= {detections.CONF}, class-aware NMS at IoU {NMS_IOU}",
            "iou_threshold": detections.IOU, "reference_instances": n_ref, "matched": n_match,
            "matched_fraction": round(n_match / n_ref, 4) if n_ref else None,
            "mean_mask_iou": round(float(np.mean(ious)), 4) if ious else None,
            "worst_mask_iou": round(float(np.min(ious)), 4) if ious else None,
            "per_image": per_image}
