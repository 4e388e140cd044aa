"""How close a quantized model's outputs are to the float model's, per task.

Classifiers ([N, K] logits): the decision (top-1, or for one logit its sign: a binary
classifier's ``sigmoid(logit) > 0.5``) against the labels and against float's, and the mean
|logit error| in logit units and as a share of the float logits' standard deviation (over every
image and class), so models with different logit scales compare. Embeddings and backbones ([N, D]
vectors): the cosine similarity of each image's vector to float's, its mean and worst image.
"""

from __future__ import annotations

import numpy as np


def decisions(logits: np.ndarray) -> np.ndarray:
    """Class index per image of ``[N, K]`` logits: argmax, or ``logit > 0`` (0/1) when K = 1."""
    logits = np.asarray(logits)
    return (logits[:, 0] > 0).astype(np.int64) if logits.shape[1] == 1 else logits.argmax(1)


def relative_error(mean_abs_error: float, float_logits: np.ndarray) -> float | None:
    """``mean_abs_error`` / the standard deviation of all of ``float_logits`` (None when it is 0)."""
    spread = float(np.std(np.asarray(float_logits, dtype=np.float64)))
    return round(mean_abs_error / spread, 6) if spread > 0 else None


def labeled(labels: list[int | None], classes: int) -> list[tuple[int, int]]:
    """``(image index, label)`` of the images whose label is one of the model's classes
    (``classes`` logits; a single logit has the two classes 0 and 1)."""
    n = max(classes, 2)
    return [(i, y) for i, y in enumerate(labels) if y is not None and 0 <= y < n]


def classifier_scores(logits: np.ndarray, float_logits: np.ndarray, labels: list[int | None]) -> dict:
    """Scores of ``[N, K]`` float32 ``logits`` against ``float_logits`` (same shape) and ``labels``
    (class index or None per image; a label outside the model's classes, e.g. an ImageNet label
    for a binary classifier, counts as none): ``top1`` (of the labeled images), ``labeled``,
    ``top1_agreement_with_float`` (images), ``mean_abs_logit_error_vs_float`` (logit units),
    ``relative_logit_error_vs_float`` (:func:`relative_error`)."""
    top1, ref = decisions(logits), decisions(float_logits)
    lab = labeled(labels, np.asarray(logits).shape[1])
    err = float(np.abs(np.asarray(logits, np.float64) - np.asarray(float_logits, np.float64)).mean())
    return {"top1": sum(int(top1[i]) == y for i, y in lab), "labeled": len(lab),
            "top1_agreement_with_float": int((top1 == ref).sum()),
            "mean_abs_logit_error_vs_float": round(err, 6),
            "relative_logit_error_vs_float": relative_error(err, float_logits)}


def cosines(out: np.ndarray, float_out: np.ndarray) -> np.ndarray:
    """Cosine similarity per image of ``[N, ...]`` outputs (flattened per image), float64 ``[N]``;
    1.0 for two zero vectors, 0.0 when only one is zero."""
    a = np.asarray(out, np.float64).reshape(len(out), -1)
    b = np.asarray(float_out, np.float64).reshape(len(float_out), -1)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    dot = (a * b).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where(na * nb > 0, dot / (na * nb), np.where((na == 0) & (nb == 0), 1.0, 0.0))
    return cos


def embedding_scores(out: np.ndarray, float_out: np.ndarray, names: list[str],
                     cos: np.ndarray | None = None) -> dict:
    """Cosine of each image's output vector to float's (``cos``, else :func:`cosines`): ``cosine_mean``,
    ``cosine_min`` and the image it belongs to (``worst_image``), and the mean |error| in
    output units."""
    cos = cosines(out, float_out) if cos is None else cos
    worst = int(cos.argmin())
    return {"cosine_mean": round(float(cos.mean()), 6), "cosine_min": round(float(cos[worst]), 6),
            "worst_image": names[worst],
            "mean_abs_error_vs_float": round(float(np.abs(np.asarray(out, np.float64) - float_out).mean()), 6)}


def instances_text(d: dict) -> str:
    """``40/45 (0.89), mask IoU mean 0.87, worst 0.41`` of a
    :func:`pipeline.data.segmentation.compare` record."""
    frac = "" if d["matched_fraction"] is None else f" ({d['matched_fraction']:.2f})"
    ious = (f", mask IoU mean {d['mean_mask_iou']:.2f}, worst {d['worst_mask_iou']:.2f}"
            if d["mean_mask_iou"] is not None else "")
    return f"{d['matched']}/{d['reference_instances']}{frac}{ious}"


def holdout_lines(holdout: dict | None) -> list[str]:
    """Short lines of a ``holdout.json`` for people (offload.html's sidebar): what it measured
    and the deployed C build's held-out fidelity for the model's task; [] without a k-fold
    record. Classifier: agreement with float and the logit error (also as a share of float's
    spread); embedding: cosine mean and worst; detector: matched fraction and mAP@0.5;
    segmentation also its instances after NMS and their mask IoU."""
    if not holdout or holdout.get("method") != "k-fold":
        return []
    c = holdout["c"]
    lines = [f"{holdout['folds']}-fold on {holdout['evaluation_set']} ({holdout['images']} images), "
             f"C {c['variant']} vs float"]
    if "detections_vs_float" in c:
        d = c["detections_vs_float"]["confident"]
        frac = "" if d["matched_fraction"] is None else f" ({d['matched_fraction']:.2f})"
        m50 = c["detections_vs_float"].get("map50")
        lines.append(f"detections matched (IoU >= 0.5): {d['matched']}/{d['reference_detections']}{frac}"
                     + (f", mAP@0.5 {m50:.2f}" if m50 is not None else ""))
        if "instances_vs_float" in c:
            lines.append(f"instances after NMS matched: {instances_text(c['instances_vs_float'])}")
    elif "cosine_mean" in c:
        lines.append(f"cosine mean {c['cosine_mean']:.4f}, worst {c['cosine_min']:.4f} ({c['worst_image']})")
    else:
        share = c.get("relative_logit_error_vs_float")
        lines.append(f"top-1 agreement {c['top1_agreement_with_float']}/{holdout['images']}, mean |logit error| "
                     f"{c['mean_abs_logit_error_vs_float']:.3f}"
                     + (f" = {100 * share:.0f}% of float's spread" if share is not None else ""))
    return lines
