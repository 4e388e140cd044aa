"""Stage ``holdout``: accuracy on images the calibration did not see (``holdout.json``).

The deployed build is calibrated on the whole calibration set, so when the
evaluation set is that same set its numbers (``report.json``, ``verify.json``)
are in-sample: they measure fidelity on data the observers saw. This stage
gives the held-out estimate a user will see on new photos:

* **k-fold** (evaluation set == calibration set): the images are split into
  ``[evaluation] folds`` folds by position in file-name order (image ``i`` in
  fold ``i % k``). For each fold the whole calibration-dependent flow is
  re-run on the other folds with the entry's own options (automatic
  int16-layer choice, calibrate, bias correction, convert), then the fold's
  images go through the PyTorch Q/DQ model and through the deployed build's
  generated C (relax import, codegen, gcc host build), and are compared with
  the float model. Every image is held out exactly once.
* **separate set** (the evaluation set shares no image with the calibration
  images, or calibration uses random tensors): the deployed build's own
  numbers are already held out; the stage records that and measures nothing.

A model with several outputs is scored on output 0, as evaluate and verify
score it (``note`` says so); a segmentation model's masks (output 1) are scored too.

For an entry with ``[quantizer] target`` the search stage has already calibrated the
chosen recipe on these folds: it runs them on through the C build and leaves their
outputs in ``search_folds.npz``, which this stage scores instead of running the folds
again (``folds_from`` says so). When the choice came from the run-cache there are no
such outputs, and the folds run here.

Fold artifacts live in a temporary folder under ``artifacts/<model>/`` and are
removed afterwards, whatever happens; only ``holdout.json`` is kept.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ..config import ModelSpec
from ..data import fidelity
from ..data.images import label_of, load_images
from ..fsutil import write_json
from ..quant.search import resolved
from .folds import evaluation_images, fold_meta, gather_folds, kfold_splits, read_fold_outputs


def scores(logits: np.ndarray, float_logits: np.ndarray, labels: list[int | None]) -> dict:
    """Decision against labels and the float model, mean |logit - float logit| (logit units) and
    relative to float's spread (:func:`pipeline.data.fidelity.classifier_scores`)."""
    got = fidelity.classifier_scores(logits, float_logits, labels)
    return {k: got[k] for k in ("top1", "top1_agreement_with_float", "mean_abs_logit_error_vs_float",
                                "relative_logit_error_vs_float")}


def holdout_model(spec: ModelSpec, float_pt2: Path, prepared_state: Path, prepared_table: Path,
                  calib_dir: Path, images_dir: Path, out: Path, int16_selection: Path | None = None,
                  recipe: Path | None = None, search_folds: Path | None = None) -> dict:
    """Write ``holdout.json``: the held-out accuracy of the Q/DQ model and of the
    deployed build's C, by k-fold cross-validation or from a separate set (module doc).
    ``search_folds``: the search's outputs of the chosen recipe's folds
    (:func:`pipeline.stages.folds.read_fold_outputs`), used instead of running the folds
    again when they were made for this choice and these folds.

    Raises :class:`CalibrationDataError` when the evaluation folder is empty or holds
    fewer images than ``[evaluation] folds``."""
    from ..layout import variants
    from ..data.torch_outputs import outputs_note, run_program_outputs
    spec = resolved(spec, recipe)   # [quantizer] target: the recipe the search chose

    method, eval_images, calib_images = evaluation_images(spec, calib_dir, images_dir)
    record = {"model": spec.name, "method": method, "evaluation_set": spec.evaluation_set,
              "calibration_set": spec.calibration.set if spec.calibration.source == "images" else None}
    if method == "separate":
        record["note"] = ("the evaluation images are not calibration images: the deployed build's "
                          "numbers (report.json, verify.json) are held out")
        write_json(out, record)
        return record
    splits = kfold_splits(spec, calib_images, eval_images, images_dir)
    k = len(splits)
    t0 = time.perf_counter()
    x = load_images(eval_images, spec.preprocess, desc=f"holdout {spec.name}", model=spec.name)
    float_outs = [t.numpy() for t in run_program_outputs(float_pt2, x, spec.name)]
    float_logits = float_outs[0]
    fold_records = [{"fold": f, "calibrated_on": len(train), "held_out": [eval_images[r].name for r in rows]}
                    for f, (train, rows) in enumerate(splits)]
    got = read_fold_outputs(search_folds, fold_meta(spec, eval_images, splits)) if recipe else None
    if got is not None:
        record["folds_from"] = "search (search_folds.npz: the chosen recipe's folds, run on through the C build)"
    else:
        got = _run_folds(spec, float_pt2, (prepared_state, prepared_table), int16_selection, splits, x,
                         fold_records, out.parent)
    qdq_outs, c_outs = got["qdq"], got["c"]
    outputs = len(qdq_outs)
    record.update({"folds": k, "images": len(eval_images), "folds_detail": fold_records})
    if outputs_note(outputs) and spec.task != "segmentation":   # its masks are scored too
        record["note"] = outputs_note(outputs)
    variant = variants(spec)[0]  # the deployed build, the one run_fold compiles
    qdq, c_out = qdq_outs[0], c_outs[0]
    if spec.task == "segmentation":
        record.update(segmentation_scores(variant, eval_images, float_outs, qdq_outs, c_outs,
                                          tuple(spec.input_shape[2:])))
    elif spec.detects:
        record.update(detection_scores(variant, eval_images, float_logits, qdq, c_out))
    elif spec.task == "embedding":
        record.update(embedding_scores(variant, eval_images, float_logits, qdq, c_out))
    else:
        record.update(classification_scores(variant, eval_images, float_logits, qdq, c_out))
    record["seconds"] = round(time.perf_counter() - t0, 1)
    write_json(out, record)
    return record


def _run_folds(spec: ModelSpec, float_pt2: Path, prepared: tuple[Path, Path], int16_selection: Path | None,
               splits: list, x, fold_records: list[dict], where: Path) -> dict:
    """Every fold's held-out outputs (:func:`pipeline.stages.folds.gather_folds`), run in a
    temporary folder under ``where``, removed afterwards."""
    work_root = Path(tempfile.mkdtemp(prefix=".holdout-", dir=where))
    jobs = [(spec, float_pt2, prepared, train, x[rows], work_root / f"fold{f}", int16_selection)
            for f, (train, rows) in enumerate(splits)]

    def done(f: int, _result: dict) -> None:
        shutil.rmtree(work_root / f"fold{f}", ignore_errors=True)   # free its disk now
        print(f"holdout {spec.name}: fold {f + 1}/{len(splits)} done (calibrated on "
              f"{fold_records[f]['calibrated_on']}, held out {len(splits[f][1])})", file=sys.stderr)
    try:
        return gather_folds(jobs, splits, len(x), done)
    finally:
        shutil.rmtree(work_root, ignore_errors=True)


def detection_scores(variant: str, eval_images: list[Path], float_out: np.ndarray, qdq: np.ndarray,
                     c_out: np.ndarray) -> dict:
    """Held-out detections ``[N, D, 6]`` of the Q/DQ model and the C build ``variant``, IoU-matched
    to float's (:func:`pipeline.data.detections.compare_all`), also image by image
    (:func:`pipeline.data.detections.per_image`)."""
    from ..data import detections
    matched = {"qdq": detections.compare_all(float_out, qdq), "c": detections.compare_all(float_out, c_out)}
    return {"qdq": {"detections_vs_float": matched["qdq"]},
            "c": {"variant": variant, "detections_vs_float": matched["c"]},
            "per_image": detections.per_image([p.name for p in eval_images], matched)}


def segmentation_scores(variant: str, eval_images: list[Path], float_outs: list[np.ndarray],
                        qdq_outs: list[np.ndarray], c_outs: list[np.ndarray], size: tuple[int, int]) -> dict:
    """:func:`detection_scores` of output 0 (the candidates, before NMS) and, after the host's
    NMS, the instances matched to float's with the mask IoU of each match
    (:func:`pipeline.data.segmentation.compare` on outputs 0 and 1 at the input ``size``
    (H, W)), per image too."""
    from ..data import segmentation
    record = detection_scores(variant, eval_images, float_outs[0], qdq_outs[0], c_outs[0])
    ref = (float_outs[0], float_outs[1])
    for kind, outs in (("qdq", qdq_outs), ("c", c_outs)):
        masks = segmentation.compare(ref, (outs[0], outs[1]), size)
        record[kind]["instances_vs_float"] = masks
        for row, (n, matched, iou) in zip(record["per_image"], masks["per_image"]):
            row.update({"float_instances": n, f"{kind}_instances_matched": matched, f"{kind}_mask_iou": iou})
    return record


def embedding_scores(variant: str, eval_images: list[Path], float_out: np.ndarray, qdq: np.ndarray,
                     c_out: np.ndarray) -> dict:
    """Held-out cosine of each image's ``[D]`` output vector to float's, for the Q/DQ model and the
    C build ``variant`` (:func:`pipeline.data.fidelity.embedding_scores`), per image too."""
    names = [p.name for p in eval_images]
    q, c = fidelity.cosines(qdq, float_out), fidelity.cosines(c_out, float_out)
    return {"qdq": fidelity.embedding_scores(qdq, float_out, names, q),
            "c": {"variant": variant, **fidelity.embedding_scores(c_out, float_out, names, c)},
            "per_image": [{"image": n, "qdq_cosine": round(float(q[i]), 6), "c_cosine": round(float(c[i]), 6)}
                          for i, n in enumerate(names)]}


def classification_scores(variant: str, eval_images: list[Path], float_logits: np.ndarray,
                          qdq: np.ndarray, c_out: np.ndarray) -> dict:
    """Held-out top-1 of float, the Q/DQ model and the C build ``variant`` ([N, K] logits), per image too."""
    labels = [label_of(p) for p in eval_images]
    lab = fidelity.labeled(labels, float_logits.shape[1])
    f, q, c = (fidelity.decisions(a) for a in (float_logits, qdq, c_out))
    return {
        "labeled": len(lab),
        "float_top1": sum(int(f[i]) == y for i, y in lab),
        "qdq": scores(qdq, float_logits, labels),
        "c": {"variant": variant, **scores(c_out, float_logits, labels)},
        "per_image": [{"image": p.name, "label": labels[i], "float": int(f[i]), "qdq": int(q[i]), "c": int(c[i])}
                      for i, p in enumerate(eval_images)],
    }
