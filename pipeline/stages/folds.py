"""The folds of a k-fold held-out estimate: the calibration-dependent flow re-run on
part of the images, as a project of its own (the holdout and search stages).

Each fold links its training images and the float program into a work folder under
``artifacts/<model>/`` and runs the stage records of :data:`FOLD_STAGES` there with
their own functions and arguments (nothing of the flow restated here).
``search_folds.npz`` (:func:`write_fold_outputs`, :func:`read_fold_outputs`) carries the
search's finished folds of its choice to the holdout stage.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import torch

from .. import torchenv
from ..config import ModelSpec, list_images
from ..data.images import select_images
from ..errors import CalibrationDataError
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


def evaluation_images(spec: ModelSpec, calib_dir: Path, images_dir: Path) -> tuple[str, list[Path], list[Path]]:
    """(method, the evaluation images, the calibration images) of a held-out estimate:
    "k-fold" or "separate" (:func:`method_of`). Raises :class:`CalibrationDataError` when the
    evaluation folder holds no images."""
    eval_images = list_images(images_dir, strict=True)
    if not eval_images:
        raise CalibrationDataError(f"model {spec.name!r}: evaluation folder {images_dir} holds no images; "
                                   f"add images or set [evaluation] set in {spec.source}")
    calib_images = select_images(calib_dir, spec.calibration, spec.name) if spec.calibration.source == "images" else []
    return method_of(spec, calib_images, eval_images), eval_images, calib_images


def kfold_splits(spec: ModelSpec, calib_images: list[Path], eval_images: list[Path],
                 images_dir: Path) -> list[tuple[list[Path], list[int]]]:
    """Per fold of ``[evaluation] folds`` (:func:`folds_of`): (the calibration images it trains
    on: every one not held out, the rows of ``eval_images`` it holds out). Raises
    :class:`CalibrationDataError` when there are fewer evaluation images than folds."""
    k = spec.evaluation_folds
    if len(eval_images) < k:
        raise CalibrationDataError(f"model {spec.name!r}: {len(eval_images)} evaluation images in {images_dir} "
                                   f"cannot make {k} folds; add images or lower [evaluation] folds in {spec.source}")
    index = {p: i for i, p in enumerate(eval_images)}
    splits = []
    for test in folds_of(eval_images, k):
        held = {p.resolve() for p in test}
        splits.append(([p for p in calib_images if p.resolve() not in held], [index[p] for p in test]))
    return splits


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


#: The calibration-dependent part of the flow a fold re-runs, in record order: the holdout
#: record's ``runs`` (their code is that stage's code too). A fixed int16 choice and the
#: prepared model are the model's own (linked); an automatic int16 choice depends on the
#: images, so the fold makes its own.
FOLD_STAGES = BY_NAME["holdout"].runs


def _deployed_only(args: dict, variant: str) -> dict:
    """``args`` with every per-build dict (codegen's ``out_dirs``, host_build's ``builds``)
    narrowed to the deployed build: a fold needs one C build, not the scalar baseline too."""
    return {k: {variant: v[variant]} if isinstance(v, dict) and variant in v and set(v) <= {"mmalib", "scalar"}
            else v for k, v in args.items()}


def run_fold(spec: ModelSpec, float_pt2: Path, prepared: tuple[Path, Path] | None, train: list[Path],
             test: torch.Tensor, work: Path, int16_selection: Path | None, through: str = "host_build",
             cycles: bool = False, sensitivity: Path | None = None, after: str | None = None) -> dict:
    """Calibrate on ``train`` and run ``test`` [N, 3, H, W] float32 through the Q/DQ model
    and the deployed build's host C. Returns {"qdq": [...], "c": [...]}: one float32
    [N, ...] array per model output, in return order (output 0: the logits), and
    "outputs" (how many the model returns).

    The fold is a project of its own under ``work``: the stage records of
    :data:`FOLD_STAGES` run against a :class:`~pipeline.layout.Layout` there, with
    their own functions, arguments and file names (nothing of the flow restated here).
    ``prepared`` None: the fold prepares its own model (the search's candidates differ in
    it). ``through``: the last stage run ("convert": the Q/DQ model only, no "c");
    ``cycles``: also "cycles", the estimated C7x cycles of the fold's deployed build on
    the entry's target (:func:`pipeline.perf.report.estimate_build`; needs codegen).
    ``sensitivity``: the file where the fold's automatic int16 choice keeps its
    sensitivity pass for the next int16 budget (``mixed_precision_model``'s argument).
    ``after``: resume a fold an earlier call left in ``work`` (run through that stage): only
    the stages after it run (the search finishes its chosen candidate's folds so)."""
    from ..layout import Layout, variants

    fspec = _fold_spec(spec)
    ctx = StageContext(spec=fspec, layout=Layout(work, spec.name), root=work, calib_root=work / "calib_data")
    # an automatic int16 choice is data-driven: the fold redoes it (and so its own prepare)
    own = prepared is None or spec.quantizer.mixed_precision == "auto"
    if after is None:
        _link_inputs(ctx, train, float_pt2, None if own else prepared, int16_selection)
    variant = variants(spec)[0]
    first = 0 if after is None else FOLD_STAGES.index(after) + 1
    for name in FOLD_STAGES[first:FOLD_STAGES.index(through) + 1]:
        stage = BY_NAME[name]
        if stage.applies(ctx) and (own or name not in ("mixed_precision", "prepare")):
            args = _deployed_only(stage.args(ctx), variant)
            if name == "calibrate":   # the fold's calibration.json is thrown away: no per-layer SQNR
                args["diagnose"] = False
            if name == "mixed_precision" and sensitivity is not None:
                args["sensitivity"] = sensitivity
            stage.function()(**args)
    return _fold_outputs(spec, ctx, variant, test, through, cycles)


def _link_inputs(ctx: StageContext, train: list[Path], float_pt2: Path, prepared: tuple[Path, Path] | None,
                 int16_selection: Path | None) -> None:
    """Link a new fold's inputs into its work folder: its training images, the float program,
    and (``prepared`` not None) the model's own prepared model and int16 choice."""
    for p in train:
        _link(p, ctx.calib_root / ctx.spec.calibration.set / p.name)
    _link(float_pt2, ctx.layout.float_pt2)
    if prepared is not None:
        _link(prepared[0], ctx.layout.prepared)
        _link(prepared[1], ctx.layout.prepared_table)
        if int16_selection is not None:
            _link(int16_selection, ctx.layout.int16_selection)


def _fold_outputs(spec: ModelSpec, ctx: StageContext, variant: str, test: torch.Tensor, through: str,
                  cycles: bool) -> dict:
    """:func:`run_fold`'s result from the fold's built files."""
    from ..backend.host import model_info, run_host
    from ..data.torch_outputs import run_program_outputs
    qdq = [t.numpy().astype(np.float32) for t in run_program_outputs(ctx.layout.quantized_pt2, test, spec.name)]
    got = {"qdq": qdq, "outputs": len(qdq)}
    build = ctx.layout.codegen_dir(variant)
    if through == "host_build":
        c_out = run_host(ctx.layout.host_exe(variant), build, test.numpy().astype(np.float32))
        c_out = model_info(build).split(np.asarray(c_out, dtype=np.float32))
        got["c"] = [c.reshape(q.shape) for c, q in zip(c_out, qdq)]
    if cycles:
        import json
        from ..perf.report import estimate_build
        from ..target import spec_target
        got["cycles"] = estimate_build(json.loads((build / "manifest.json").read_text()), spec_target(spec))["total_cycles"]
    return got


#: a model whose float.pt2 is smaller than this runs its folds one after another in this
#: process: a loky process first imports torch and tvm (seconds), more than such a model's
#: fold costs (docs/measuring.md, "Figures behind the code")
SIDE_BY_SIDE_BYTES = 1 << 20


def run_folds(jobs: list[tuple]):
    """Yield (fold index, :func:`run_fold` result) for every argument tuple in ``jobs``.

    The folds are independent projects: with several cores (and a float.pt2 of at least
    :data:`SIDE_BY_SIDE_BYTES`) they run side by side in
    joblib's loky processes, ``min(folds, cores)`` at a time, each with its share of
    this process's torch threads (on 2 cores: two folds of one thread each, where one
    fold of two threads leaves the second core idle through the single-threaded
    relax import, codegen and gcc build; MobileNetV2's holdout, measured:
    scripts/benchmark.py --sections methods). A fold's numbers may then differ in
    float summation order from a one-process run, as they do across machines with
    other core counts. Inside a task on a Dask worker (the project's Dask executor) they
    are tasks of that cluster, side by side on its workers, through
    ``distributed.worker_client()`` as the calibrate stage's shards are
    (:mod:`pipeline.quant.shards`). Folds may finish in any order. A fold's exception
    is re-raised here."""
    from ..quant.shards import on_dask_worker
    if jobs and on_dask_worker():
        yield from _on_dask(jobs)
        return
    n_jobs = min(len(jobs), os.cpu_count() or 1)
    small = Path(jobs[0][1]).stat().st_size < SIDE_BY_SIDE_BYTES if jobs else True
    if n_jobs < 2 or small:
        for f, a in enumerate(jobs):
            yield f, run_fold(*a)
        return
    threads = max(1, torch.get_num_threads() // n_jobs)
    yield from torchenv.process_map(run_fold, dict(enumerate(jobs)), threads)


def _on_dask(jobs: list[tuple]):
    """Yield (fold index, result) as the folds finish as tasks of the cluster
    (:func:`pipeline.quant.shards.dask_map`, the calibrate stage's shards' way)."""
    from ..quant.shards import dask_map
    yield from dask_map(run_fold, dict(enumerate(jobs)), name="_fold_task")


def gather_folds(jobs: list[tuple], splits: list, images: int, on_done=None) -> dict[str, list[np.ndarray]]:
    """Run ``jobs`` (:func:`run_folds`; job ``f`` is fold ``f`` of ``splits``) and return
    {"qdq": [...], "c": [...]}: per model output a float32 ``[images, ...]`` array, each
    row from the fold that held that image out. ``on_done(f, result)`` is called as fold ``f``
    ends, with its :func:`run_fold` result."""
    outs: dict[str, list[np.ndarray]] = {}
    for f, got in run_folds(jobs):
        rows = splits[f][1]
        for kind in ("qdq", "c"):
            arrays = outs.setdefault(kind, [np.zeros((images, *a.shape[1:]), np.float32) for a in got[kind]])
            for whole, part in zip(arrays, got[kind]):
                whole[rows] = part
        if on_done is not None:
            on_done(f, got)
    return outs


def fold_meta(spec: ModelSpec, images: list[Path], splits: list) -> dict:
    """What ``search_folds.npz``'s outputs were made for: the build (``spec``'s calibration
    and quantizer fields, as JSON), the scored images' names in order, each fold's rows."""
    build = {f: dataclasses.asdict(getattr(spec, f)) for f in ("calibration", "quantizer")}
    return json.loads(json.dumps({"build": build, "images": [p.name for p in images],
                                  "rows": [rows for _, rows in splits]}, default=str))


def write_fold_outputs(path: Path, meta: dict | None, outs: dict[str, list[np.ndarray]] | None = None) -> None:
    """Write ``search_folds.npz`` atomically: ``meta`` (:func:`fold_meta`) and, per model output
    ``i``, ``qdq<i>`` / ``c<i>`` (float32 ``[N, ...]``, image ``n`` from the fold that held it
    out). ``meta`` None: an empty file (nothing to reuse)."""
    from ..fsutil import atomic_path
    arrays = {} if meta is None else {"meta": np.array(json.dumps(meta))}
    for kind, outputs in (outs or {}).items():
        arrays.update({f"{kind}{i}": a for i, a in enumerate(outputs)})
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)


def read_fold_outputs(path: Path | None, meta: dict) -> dict[str, list[np.ndarray]] | None:
    """The outputs of ``search_folds.npz`` (:func:`write_fold_outputs`) when they were made
    for ``meta`` (:func:`fold_meta`: this build, these images and folds); else None (no
    file, an empty one, or another build). Loads no pickle."""
    if path is None or not Path(path).exists():
        return None
    with np.load(path, allow_pickle=False) as z:
        if "meta" not in z.files:
            return None
        if json.loads(str(z["meta"])) != meta:
            return None
        outputs = sum(name.startswith("qdq") for name in z.files)
        return {kind: [z[f"{kind}{i}"] for i in range(outputs)] for kind in ("qdq", "c")}
