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

Fold artifacts live in a temporary folder under ``artifacts/<model>/`` and are
removed afterwards, whatever happens; only ``holdout.json`` is kept.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from .. import torchenv
from ..config import ModelSpec, list_images
from ..data import fidelity
from ..data.images import label_of, load_images, select_images
from ..errors import CalibrationDataError
from ..fsutil import write_json
from .context import StageContext
from .registry import BY_NAME


def folds_of(images: list[Path], k: int) -> list[list[Path]]:
    """``images`` split into ``k`` folds by position: image ``i`` goes to fold ``i % k``.

    Raises ValueError when there are fewer images than folds."""
    if len(images) < k:
        raise ValueError(f"{len(images)} images cannot make {k} folds")
    return [images[f::k] for f in range(k)]


def method_of(spec: ModelSpec, calib_images: list[Path], eval_images: list[Path]) -> str:
    """"k-fold" when some evaluation image is also a calibration image, else "separate"."""
    if spec.calibration.source != "images":
        return "separate"
    shared = {p.resolve() for p in calib_images} & {p.resolve() for p in eval_images}
    return "k-fold" if shared else "separate"


def _link(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(Path(src).resolve(), dst)


#: the folder under a fold's own ``calib_data/`` that holds links to its training images: a
#: fixed name, so whatever the entry's ``calibration.set`` says (an absolute path, ``..``), the
#: fold writes only inside its work folder under ``artifacts/<model>/``
FOLD_SET = "fold"


def _fold_spec(spec: ModelSpec) -> ModelSpec:
    """The entry as a fold calibrates it: every image of the fold's training part (linked
    under :data:`FOLD_SET`), in the entry's order (``num_images`` was applied when the pool
    was chosen)."""
    return dataclasses.replace(spec, calibration=dataclasses.replace(spec.calibration, num_images=0, set=FOLD_SET))


#: The calibration-dependent part of the flow a fold re-runs, in record order. A
#: fixed int16 choice and the prepared model are the model's own (linked); an
#: automatic int16 choice depends on the images, so the fold makes its own.
#: the stages a fold runs, in order: the holdout record's ``runs`` (its code is this stage's code too)
FOLD_STAGES = BY_NAME["holdout"].runs


def _deployed_only(args: dict, variant: str) -> dict:
    """``args`` with every per-build dict (codegen's ``out_dirs``, host_build's ``builds``)
    narrowed to the deployed build: a fold needs one C build, not the scalar baseline too."""
    return {k: {variant: v[variant]} if isinstance(v, dict) and variant in v and set(v) <= {"mmalib", "scalar"}
            else v for k, v in args.items()}


def run_fold(spec: ModelSpec, float_pt2: Path, prepared: tuple[Path, Path], train: list[Path],
             test: torch.Tensor, work: Path, int16_selection: Path | None) -> dict[str, np.ndarray]:
    """Calibrate on ``train`` and run ``test`` [N, 3, H, W] float32 through the Q/DQ model
    and the deployed build's host C. Returns {"qdq": [...], "c": [...]}: one float32
    [N, ...] array per model output, in return order (output 0: the logits), and
    "outputs" (how many the model returns).

    The fold is a project of its own under ``work``: the stage records of
    :data:`FOLD_STAGES` run against a :class:`~pipeline.layout.Layout` there, with
    their own functions, arguments and file names (nothing of the flow restated here)."""
    from ..backend.host import model_info, run_host
    from ..layout import Layout, variants
    from ..data.torch_outputs import run_program_outputs

    fspec = _fold_spec(spec)
    ctx = StageContext(spec=fspec, layout=Layout(work, spec.name), root=work, calib_root=work / "calib_data")
    for p in train:
        _link(p, ctx.calib_root / fspec.calibration.set / p.name)
    _link(float_pt2, ctx.layout.float_pt2)
    auto = spec.quantizer.mixed_precision == "auto"  # the choice is data-driven: redo it on the fold
    if not auto:
        _link(prepared[0], ctx.layout.prepared)
        _link(prepared[1], ctx.layout.prepared_table)
        if int16_selection is not None:
            _link(int16_selection, ctx.layout.int16_selection)
    variant = variants(spec)[0]
    for name in FOLD_STAGES:
        stage = BY_NAME[name]
        if stage.applies(ctx) and (auto or name not in ("mixed_precision", "prepare")):
            args = _deployed_only(stage.args(ctx), variant)
            if name == "calibrate":   # the fold's calibration.json is thrown away: no per-layer SQNR
                args["diagnose"] = False
            stage.function()(**args)
    qdq = [t.numpy().astype(np.float32) for t in run_program_outputs(ctx.layout.quantized_pt2, test, spec.name)]
    build = ctx.layout.codegen_dir(variant)
    c_out = run_host(ctx.layout.host_exe(variant), build, test.numpy().astype(np.float32))
    c_out = model_info(build).split(np.asarray(c_out, dtype=np.float32))
    return {"qdq": qdq, "c": [c.reshape(q.shape) for c, q in zip(c_out, qdq)], "outputs": len(qdq)}


#: a model whose float.pt2 is smaller than this runs its folds one after another in this
#: process: a loky process first imports torch and tvm (seconds), more than such a model's
#: fold costs (docs/measuring.md, "Figures behind the code")
SIDE_BY_SIDE_BYTES = 1 << 20


def _run_folds(jobs: list[tuple]):
    """Yield (fold index, :func:`run_fold` result) for every argument tuple in ``jobs``.

    The folds are independent projects: with several cores (and a float.pt2 of at least
    :data:`SIDE_BY_SIDE_BYTES`) they run side by side in
    joblib's loky processes, ``min(folds, cores)`` at a time, each with its share of
    this process's torch threads (on 2 cores: two folds of one thread each, where one
    fold of two threads leaves the second core idle through the single-threaded
    relax import, codegen and gcc build; MobileNetV2's holdout, measured:
    scripts/benchmark.py --sections methods). A fold's numbers may then differ in
    float summation order from a one-process run, as they do across machines with
    other core counts. Inside a task on a Dask worker they run one after another,
    in the slot the cluster gave the stage. A fold's exception is re-raised here."""
    from ..quant.shards import on_dask_worker
    n_jobs = min(len(jobs), os.cpu_count() or 1)
    small = Path(jobs[0][1]).stat().st_size < SIDE_BY_SIDE_BYTES if jobs else True
    if n_jobs < 2 or small or on_dask_worker():
        for f, a in enumerate(jobs):
            yield f, run_fold(*a)
        return
    threads = max(1, torch.get_num_threads() // n_jobs)
    yield from torchenv.process_map(run_fold, dict(enumerate(jobs)), threads)


def scores(logits: np.ndarray, float_logits: np.ndarray, labels: list[int | None]) -> dict:
    """Decision against labels and the float model, mean |logit - float logit| (logit units) and
    relative to float's spread (:func:`pipeline.data.fidelity.classifier_scores`)."""
    got = fidelity.classifier_scores(logits, float_logits, labels)
    return {k: got[k] for k in ("top1", "top1_agreement_with_float", "mean_abs_logit_error_vs_float",
                                "relative_logit_error_vs_float")}


def holdout_model(spec: ModelSpec, float_pt2: Path, prepared_state: Path, prepared_table: Path,
                  calib_dir: Path, images_dir: Path, out: Path, int16_selection: Path | None = None) -> dict:
    """Write ``holdout.json``: the held-out accuracy of the Q/DQ model and of the
    deployed build's C, by k-fold cross-validation or from a separate set (module doc).

    Raises :class:`CalibrationDataError` when the evaluation folder is empty or holds
    fewer images than ``[evaluation] folds``."""
    from ..layout import variants
    from ..data.torch_outputs import outputs_note, run_program_outputs

    eval_images = list_images(images_dir, strict=True)
    if not eval_images:
        raise CalibrationDataError(f"model {spec.name!r}: evaluation folder {images_dir} holds no images; "
                                   f"add images or set [evaluation] set in {spec.source}")
    calib_images = select_images(calib_dir, spec.calibration, spec.name) if spec.calibration.source == "images" else []
    method = method_of(spec, calib_images, eval_images)
    record = {"model": spec.name, "method": method, "evaluation_set": spec.evaluation_set,
              "calibration_set": spec.calibration.set if spec.calibration.source == "images" else None}
    if method == "separate":
        record["note"] = ("the evaluation images are not calibration images: the deployed build's "
                          "numbers (report.json, verify.json) are held out")
        write_json(out, record)
        return record
    k = spec.evaluation_folds
    if len(eval_images) < k:
        raise CalibrationDataError(f"model {spec.name!r}: {len(eval_images)} evaluation images in {images_dir} "
                                   f"cannot make {k} folds; add images or lower [evaluation] folds in {spec.source}")
    t0 = time.perf_counter()
    x = load_images(eval_images, spec.preprocess, desc=f"holdout {spec.name}", model=spec.name)
    float_outs = [t.numpy() for t in run_program_outputs(float_pt2, x, spec.name)]
    float_logits = float_outs[0]
    index = {p: i for i, p in enumerate(eval_images)}
    qdq_outs = [np.zeros_like(a) for a in float_outs]
    c_outs = [np.zeros_like(a) for a in float_outs]
    folds = folds_of(eval_images, k)
    fold_records, outputs = [], 1
    work_root = Path(tempfile.mkdtemp(prefix=".holdout-", dir=out.parent))
    jobs = []
    for f, test_paths in enumerate(folds):
        held = {p.resolve() for p in test_paths}
        train = [p for p in calib_images if p.resolve() not in held]
        rows = [index[p] for p in test_paths]
        jobs.append((rows, (spec, float_pt2, (prepared_state, prepared_table), train, x[rows],
                            work_root / f"fold{f}", int16_selection)))
        fold_records.append({"fold": f, "calibrated_on": len(train), "held_out": [p.name for p in test_paths]})
    try:
        for f, got in _run_folds([a for _, a in jobs]):
            rows = jobs[f][0]
            for i, (q, c) in enumerate(zip(got["qdq"], got["c"])):
                qdq_outs[i][rows], c_outs[i][rows] = q, c
            outputs = got["outputs"]
            shutil.rmtree(work_root / f"fold{f}", ignore_errors=True)   # done: free its disk now
            print(f"holdout {spec.name}: fold {f + 1}/{k} done (calibrated on {fold_records[f]['calibrated_on']}, "
                  f"held out {len(rows)})", file=sys.stderr)
    finally:
        shutil.rmtree(work_root, ignore_errors=True)
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
