"""Detections of an end-to-end (NMS-free) detector: IoU matching and pictures.

A detection output is float32 ``[N, D, 6]``, one row per detection ranked by
score: ``x1, y1, x2, y2`` (input pixels, xyxy), ``score``, ``class`` (index
as float): ultralytics' end-to-end export form (YOLO26). Two outputs of the
same image are compared by greedy IoU matching, the way detection accuracy is
measured (COCO-style greedy assignment, Padilla et al. 2020): reference
detections in descending score, each matched to the not yet matched candidate
of the same class with the highest IoU, if that IoU is >= ``iou`` (0.5).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

#: ultralytics' default confidence threshold for predictions (``conf=0.25``).
CONF = 0.25
#: rows compared regardless of score (random-weight models have no confident detection).
TOP = 100
IOU = 0.5
#: bright, distinct mask shades (the first ten of ultralytics' ``Colors`` palette)
MASK_COLORS = ("#FF3838", "#FF9D97", "#FF701F", "#FFB21D", "#CFD231", "#48F90A", "#92CC17", "#3DDB86",
               "#1A9334", "#00D4BB")


def coco80() -> list[str]:
    """The 80 COCO class names in the order YOLO models number them (torchvision's 91-entry
    detection list without its background and N/A entries; no download)."""
    from torchvision.models.detection import FasterRCNN_ResNet50_FPN_Weights

    return [c for c in FasterRCNN_ResNet50_FPN_Weights.DEFAULT.meta["categories"] if c not in ("__background__", "N/A")]


def is_detection_output(shape) -> bool:
    """True for an ``[N, D, 6]`` output (the end-to-end detection form above)."""
    return len(shape) == 3 and shape[-1] == 6


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU matrix ``[len(a), len(b)]`` of xyxy boxes ``[*, 4]`` (float64; 0 for empty boxes)."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=2)
    area = lambda x: np.prod(np.clip(x[:, 2:] - x[:, :2], 0, None), axis=1)  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def select(det: np.ndarray, conf: float | None = CONF, top: int | None = None) -> np.ndarray:
    """Rows ``[D, 6]`` of one image with score >= ``conf`` (None: any), the first ``top``
    (None: all), less the tie group at a cut.

    Quantized scores tie often (an int8 logit has 256 values), and which of
    several equal scores a top-k keeps first is the implementation's choice
    (torch's and our C's differ). So when the selection is cut by ``top``, or
    reaches the output's last row (the model's own top-``D`` cut), the rows
    whose score equals the score at the cut are dropped: what remains is the
    same set for any tie order. (A two-stage top-k, as YOLO26's, keeps it so:
    a score above the final cut is above the first stage's cut.)
    """
    rows = det if conf is None else det[det[:, 4] >= conf]
    if top and len(rows) > top:
        cut, rows = rows[top, 4], rows[:top]
    elif len(rows) and len(rows) == len(det):
        cut = det[-1, 4]
    else:
        return rows
    return rows[rows[:, 4] > cut]


def match(ref: np.ndarray, cand: np.ndarray, iou: float = IOU) -> list[tuple[int, int, float]]:
    """Greedy same-class matches ``(ref row, cand row, IoU)`` of two ``[*, 6]`` detection sets."""
    if len(ref) == 0 or len(cand) == 0:
        return []
    ious = box_iou(ref[:, :4], cand[:, :4])
    ious[ref[:, 5][:, None] != cand[:, 5][None, :]] = -1.0
    taken, out = set(), []
    for i in np.argsort(-ref[:, 4], kind="stable"):
        order = [j for j in np.argsort(-ious[i], kind="stable") if j not in taken]
        if order and ious[i, order[0]] >= iou:
            taken.add(order[0])
            out.append((int(i), int(order[0]), float(ious[i, order[0]])))
    return out


def compare(ref: np.ndarray, cand: np.ndarray, conf: float | None = CONF, top: int | None = None,
            iou: float = IOU) -> dict:
    """Match ``cand`` against ``ref`` (both ``[N, D, 6]``) image by image.

    Returns the reference detection count, the matched count and fraction
    (None without reference detections), mean IoU and mean / max |score
    difference| of the matched pairs (score units, 0..1), and ``per_image``:
    ``[reference detections, matched]`` of each image, in order.
    """
    n_ref = n_match = 0
    ious, dscore, per_image = [], [], []
    for r, c in zip(ref, cand):
        r, c = select(r, conf, top), select(c, conf, top)
        pairs = match(r, c, iou)
        n_ref += len(r)
        n_match += len(pairs)
        per_image.append([len(r), len(pairs)])
        ious += [p[2] for p in pairs]
        dscore += [abs(float(r[i, 4]) - float(c[j, 4])) for i, j, _ in pairs]
    kind = f"score >= {conf}" if conf is not None else f"first {top} rows"
    return {"selection": f"{kind}, ties at the cut dropped",
            "iou_threshold": iou, "reference_detections": n_ref, "matched": n_match,
            "matched_fraction": round(n_match / n_ref, 4) if n_ref else None,
            "mean_iou": round(float(np.mean(ious)), 4) if ious else None,
            "mean_abs_score_diff": round(float(np.mean(dscore)), 6) if dscore else None,
            "max_abs_score_diff": round(float(np.max(dscore)), 6) if dscore else None,
            "per_image": per_image}


def map50(ref: np.ndarray, cand: np.ndarray, iou: float = IOU) -> float | None:
    """mAP at IoU ``iou`` of ``cand``'s detections against ``ref``'s as pseudo-labels.

    ``ref``, ``cand``: float32 ``[N, D, 6]``. The pseudo-labels are ``ref``'s
    confident rows (score >= :data:`CONF`, as a user would see them); the
    predictions are ``cand``'s first :data:`TOP` rows with their scores (COCO
    evaluates up to 100 detections per image, at any score). The metric is
    COCO's (101-point interpolated AP per class, averaged over the classes that
    have pseudo-labels), computed by torchmetrics' ``MeanAveragePrecision`` on
    the pycocotools backend. Unlike the matched fraction it also charges false
    positives: a detection float does not make lowers it. Returns None when
    ``ref`` has no confident detection.
    """
    from torchmetrics.detection import MeanAveragePrecision

    def one(rows: np.ndarray, scores: bool) -> dict:
        t = torch.from_numpy(rows.astype(np.float32)).reshape(-1, 6)
        d = {"boxes": t[:, :4], "labels": t[:, 5].round().long()}
        return {**d, "scores": t[:, 4]} if scores else d

    targets = [one(select(r), False) for r in ref]
    if not sum(len(t["labels"]) for t in targets):
        return None
    metric = MeanAveragePrecision(iou_thresholds=[iou], backend="pycocotools")
    metric.update([one(select(c, None, TOP), True) for c in cand], targets)
    return round(float(metric.compute()["map"]), 4)


def compare_all(ref: np.ndarray, cand: np.ndarray) -> dict:
    """:func:`compare` at ultralytics' confidence threshold and on the first :data:`TOP` rows,
    and :func:`map50` of ``cand`` against ``ref``'s confident detections."""
    return {"confident": compare(ref, cand, conf=CONF), "top": compare(ref, cand, conf=None, top=TOP),
            "map50": map50(ref, cand)}


def per_image(names: list[str], matched: dict[str, dict]) -> list[dict]:
    """One row per image: the reference's confident detections and, per candidate ``kind``
    (e.g. ``qdq``, ``c``), how many of them it matches and the fraction (None without any).

    ``matched``: kind -> the candidate's :func:`compare` against one reference at
    :data:`CONF` (or its :func:`compare_all`, whose ``confident`` part is used), at least
    one; ``names``: the N image file names. TI's pass bar for a detector is a matched
    fraction of at least 0.40 (see ``docs/yolo.md``).
    """
    per = {k: m.get("confident", m)["per_image"] for k, m in matched.items()}
    rows = []
    for i, name in enumerate(names):
        n = next(iter(per.values()))[i][0]  # the same reference for every candidate
        row = {"image": name, "float_detections": n}
        for k, counts in per.items():
            row[f"{k}_matched"] = counts[i][1]
            row[f"{k}_fraction"] = round(counts[i][1] / n, 4) if n else None
        rows.append(row)
    return rows


def draw(image: torch.Tensor, det: np.ndarray, out: Path, conf: float = CONF,
         fallback_top: int = 10, names: list[str] | None = None, font: str | None = None,
         masks: np.ndarray | None = None, selected: bool = False) -> int:
    """Draw one image's detections on it and write a JPEG (atomically).

    ``image``: float32 ``[3, H, W]`` RGB in [0, 1] (the preprocessed input, so
    boxes in input pixels land where they belong). Draws the rows with score
    >= ``conf``, or the first ``fallback_top`` rows when none is that
    confident (a random-weight model), labelled ``class:score`` (``name score``
    with ``names``, the class names by index). ``font``: a TrueType file for the labels, sized
    to the image (a photo at its own size); else PIL's small bitmap font. ``masks``: bool
    ``[D, H, W]``, one per row of ``det``, shaded under the boxes. ``selected``: ``det`` holds
    only the rows to draw (a predict's confident rows or instances): all are drawn. Returns how
    many boxes it drew.
    """
    from torchvision.io import encode_jpeg
    from torchvision.utils import draw_bounding_boxes

    from torchvision.utils import draw_segmentation_masks

    from ..fsutil import atomic_path
    rows = det if selected else select(det, conf)
    if len(rows) == 0 and not selected:
        rows = det[:fallback_top]
    h, w = image.shape[1:]
    boxes = torch.from_numpy(rows[:, :4].astype(np.float32)).reshape(-1, 4)
    boxes = torch.stack([boxes[:, 0].clamp(0, w - 1), boxes[:, 1].clamp(0, h - 1),
                         boxes[:, 2].clamp(0, w - 1), boxes[:, 3].clamp(0, h - 1)], 1)
    boxes = torch.stack([torch.minimum(boxes[:, 0], boxes[:, 2]), torch.minimum(boxes[:, 1], boxes[:, 3]),
                         torch.maximum(boxes[:, 0], boxes[:, 2]), torch.maximum(boxes[:, 1], boxes[:, 3])], 1)
    labels = [f"{names[int(c)]} {s:.2f}" if names and 0 <= int(c) < len(names) else f"{int(c)}:{s:.2f}"
              for s, c in rows[:, 4:6]]
    img = (image.clamp(0, 1) * 255).round().to(torch.uint8)
    if masks is not None and len(masks):
        colors = [MASK_COLORS[i % len(MASK_COLORS)] for i in range(len(masks))]
        img = draw_segmentation_masks(img, torch.from_numpy(np.ascontiguousarray(masks)), alpha=0.45, colors=colors)
    size = max(14, min(h, w) // 30)   # readable on a 320-pixel input and on a 4000-pixel photo
    style = {"font": font, "font_size": size} if font else {}
    drawn = (draw_bounding_boxes(img, boxes, labels=labels, colors="red", width=max(2, size // 7), **style)
             if len(rows) else img)
    with atomic_path(out) as tmp:
        Path(tmp).write_bytes(encode_jpeg(drawn, quality=90).numpy().tobytes())
    return len(rows)
