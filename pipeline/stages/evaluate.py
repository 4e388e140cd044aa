"""Stage ``evaluate``: float vs quantized accuracy on labeled images (``report.json``).

A model with several outputs (a tuple return) is scored on output 0 (top-1,
logit error, detections); every output's float-vs-Q/DQ error is listed under
``outputs`` and a note says so."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ..config import ModelSpec, list_images
from ..data.images import label_of, load_images
from ..errors import CalibrationDataError
from ..fsutil import write_json
from ..data import fidelity, torch_outputs
from ..data.torch_outputs import outputs_note
from ..quant.search import resolved


def output_errors(float_outs: list[torch.Tensor], quant_outs: list[torch.Tensor]) -> list[dict]:
    """Per output: shape (one image) and mean / max |float - Q/DQ|, in output units."""
    out = []
    for i, (f, q) in enumerate(zip(float_outs, quant_outs)):
        err = (f - q).abs()
        out.append({"index": i, "shape": [1, *f.shape[1:]], "mean_abs_error": round(float(err.mean()), 6),
                    "max_abs_error": round(float(err.max()), 6)})
    return out


def compare_logits(float_logits: torch.Tensor, quant_logits: torch.Tensor,
                   labels: list[int | None]) -> dict:
    """Decision counts of both models (top-1, or a single logit's sign), their agreement and the
    logit error, absolute and relative to float's spread (:mod:`pipeline.data.fidelity`).

    ``labels`` may hold None for unlabeled images (counted in agreement only).
    """
    f, q = float_logits.numpy(), quant_logits.numpy()
    got = fidelity.classifier_scores(q, f, labels)
    f1 = fidelity.decisions(f)
    return {
        "images": len(labels),
        "labeled": got["labeled"],
        "float_top1": sum(int(f1[i]) == y for i, y in fidelity.labeled(labels, f.shape[1])),
        "quant_top1": got["top1"],
        "top1_agreement": got["top1_agreement_with_float"],
        "mean_abs_logit_error": got["mean_abs_logit_error_vs_float"],
        "relative_logit_error": got["relative_logit_error_vs_float"],
        "max_abs_logit_error": round(float(np.abs(f.astype(np.float64) - q).max()), 6),
    }


def report_notes(calib: dict, export: dict, eval_images: list[str], labels: list[int | None],
                 classes: int) -> list[str]:
    """Caveats a reader of the numbers must know, one sentence each."""
    notes = []
    if calib["source"] != "images":
        notes.append("NOT FOR DEPLOYMENT: calibrated on random noise, not on real images")
    if not export["pretrained"]:
        notes.append("NOT FOR DEPLOYMENT: random-init weights (pretrained = false); accuracy is meaningless")
    shared = len(set(calib["images"]) & set(eval_images)) if calib["source"] == "images" else 0
    if shared:
        notes.append(f"{shared} of the {len(eval_images)} evaluation images were also calibration images: "
                     f"their numbers (in-sample) measure quantization fidelity, not held-out accuracy; "
                     f"holdout.json has the k-fold estimate")
    outside = sum(1 for y in labels if y is not None) - len(fidelity.labeled(labels, classes))
    if outside:
        notes.append(f"{outside} labels are outside the model's {max(classes, 2)} classes: those images count "
                     f"for agreement with float only")
    return notes


def evaluate_model(spec: ModelSpec, float_pt2: Path, quantized_pt2: Path, calibration_json: Path,
                   export_json: Path, images_dir: Path, out: Path, outputs: Path,
                   recipe: Path | None = None) -> dict:
    """Run float.pt2 and quantized.pt2 on the evaluation set; write ``report.json``
    and the outputs themselves to ``outputs`` (``torch_outputs.npz``, which verify reads).

    Classification: top-1 of both against the labels, agreement, logit error
    (on output 0 of a model with several; ``outputs``: every output's error). A
    detection model (``task = "detection"``): the Q/DQ model's detections matched
    to float's at IoU >= 0.5 (:func:`pipeline.data.detections.compare_all`); a segmentation
    model also its instances after NMS with each match's mask IoU
    (:func:`pipeline.data.segmentation.compare`).

    Raises :class:`CalibrationDataError` when the evaluation folder is empty.
    """
    spec = resolved(spec, recipe)   # [quantizer] target: the recipe the search chose (report.json records it)
    calib = json.loads(calibration_json.read_text())
    export = json.loads(export_json.read_text())
    paths = list_images(images_dir, strict=True)
    if not paths:
        raise CalibrationDataError(f"model {spec.name!r}: evaluation folder {images_dir} holds no images; "
                                   f"add images or set [evaluation] set in {spec.source}")
    x = load_images(paths, spec.preprocess, desc=f"evaluate {spec.name}", model=spec.name)
    kept = torch_outputs.compute(float_pt2, quantized_pt2, x, [p.name for p in paths], spec.name)
    torch_outputs.write(outputs, kept)
    float_outs = [torch.from_numpy(a) for a in kept.float_outs]
    quant_outs = [torch.from_numpy(a) for a in kept.qdq_outs]
    float_logits, quant_out = float_outs[0], quant_outs[0]
    labels = [label_of(p) for p in paths]
    if spec.detects:  # [N, D, 6] detections: IoU-matched against float, no labels
        from ..data import detections
        result = {"images": len(paths), "detections_qdq_vs_float":
                  detections.compare_all(float_logits.numpy(), quant_out.numpy())}
        if spec.task == "segmentation":   # instances after NMS, and the mask IoU of each match
            from ..data import segmentation
            result["instances_qdq_vs_float"] = segmentation.compare(
                (kept.float_outs[0], kept.float_outs[1]), (kept.qdq_outs[0], kept.qdq_outs[1]),
                tuple(spec.input_shape[2:]))
        labels, classes = [None] * len(paths), 0
    elif spec.task == "embedding":  # [N, D] vectors: cosine to float's, no labels
        result = {"images": len(paths), **fidelity.embedding_scores(
            quant_out.numpy(), float_logits.numpy(), [p.name for p in paths])}
        labels, classes = [None] * len(paths), 0
    else:
        result, classes = compare_logits(float_logits, quant_out, labels), float_logits.shape[1]
    notes = report_notes(calib, export, [p.name for p in paths], labels, classes)
    if outputs_note(len(quant_outs)):
        notes.append(outputs_note(len(quant_outs)))
        result["outputs"] = output_errors(float_outs, quant_outs)
    report = {
        "model": spec.name,
        "dtype": spec.dtype,
        "weight_dtype": spec.quantizer.weight_dtype or "int8",
        "evaluation_set": spec.evaluation_set,
        "weights": {k: export[k] for k in ("weights", "sha256", "pretrained")},
        "calibration": {k: calib[k] for k in ("source", "set", "num_images", "observer", "batch_size")},
        "for_deployment": calib["source"] == "images" and export["pretrained"],
        **result,
        "notes": notes,
    }
    write_json(out, report)
    return report
