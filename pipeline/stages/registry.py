"""The stage registry: one declarative record per stage.

A record says what a stage is, not how doit runs it: its name and one-line
doc, the function it runs (``"module:function"``, imported only when the task
runs), the pipeline sources that function executes, its tracked parameters
(model-entry fields, library versions, extra values), its inputs and outputs
as :class:`~pipeline.layout.Layout` paths, the keyword arguments of the
function, and whether the default run builds it. This is DVC's stage model
(deps + params + outs, declared, not coded); :mod:`pipeline.tasks` turns
every record into one doit task per model in a single loop.

Adding a stage is one record here plus one module under ``pipeline/stages/``
(``docs/architecture.md``, "Adding a stage"). Loading this module imports
neither torch nor tvm.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..fsutil import portable_path
from ..code_deps import closure
from ..config import ModelSpec, list_images
from ..layout import Layout, variants
from ..toolchain import cross_outputs, host_cpu

PKG = Path(__file__).resolve().parent.parent
_TORCHENV = PKG / "torchenv.py"


@dataclass(frozen=True)
class StageContext:
    """What a record's ``deps`` / ``outs`` / ``args`` / ``extra`` see for one model.

    ``weights`` is the checkpoint found when the task list was loaded (None
    for random init, or when it was not found: export then raises the
    one-line error); ``builder_sources`` the project's own builder files.
    """

    spec: ModelSpec
    layout: Layout
    root: Path
    calib_root: Path
    weights: Path | None = None
    builder_sources: tuple[Path, ...] = ()
    #: folder listings read once per context (every stage's deps ask again)
    _listings: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def images(self, set_name: str) -> list[Path]:
        """Image files of ``calib_data/<set_name>/``, sorted."""
        if set_name not in self._listings:
            self._listings[set_name] = list_images(self.calib_root / set_name)
        return list(self._listings[set_name])

    @property
    def calibration_images(self) -> list[Path]:
        """Calibration images (none for ``source = "random"``)."""
        cal = self.spec.calibration
        return self.images(cal.set) if cal.source == "images" else []

    @property
    def evaluation_images(self) -> list[Path]:
        """Labeled images of the evaluation set."""
        return self.images(self.spec.evaluation_set)


Paths = Callable[[StageContext], list[Path]]


def _none(ctx: StageContext) -> dict:
    return {}


@dataclass(frozen=True)
class Stage:
    """One stage of the flow, declared.

    - ``func``: ``"module:function"`` run as ``function(**args(ctx))``; a plain
      function from input files to output files, testable without doit.
    - its code dependencies are derived: the import closure of ``func``'s
      module inside ``pipeline/`` plus the data files those modules declare
      (:mod:`pipeline.code_deps`); editing one re-runs the stage.
    - ``params``: tracked ``ModelSpec`` fields (``"dtype"``, ``"quantizer"``,
      ``"calibration.observer"``...); ``versions``: tracked distributions;
      ``extra(ctx)``: other tracked values (image names, environment).
      Changing any of them re-runs the stage.
    - ``deps(ctx)`` / ``outs(ctx)``: input and output files (doit
      ``file_dep`` / ``targets``).
    - ``default``: whether the default run builds it (a callable is asked
      when the task list is loaded).
    - ``task_doc(ctx)``: the per-model line of ``doit list``.
    - ``applies(ctx)``: whether the model has this stage at all (e.g.
      ``mixed_precision`` only for mixed-precision entries).
    - ``shared``: the outputs never depend on the model's name, so models with
      identical inputs share run-cache entries (:mod:`pipeline.runcache`).
    - ``runs``: other stages whose functions this one calls through their records
      (holdout's folds): their code is this stage's code too.
    """

    name: str
    doc: str
    func: str
    deps: Paths
    outs: Paths
    args: Callable[[StageContext], dict]
    params: tuple[str, ...] = ()
    versions: tuple[str, ...] = ()
    extra: Callable[[StageContext], dict] = _none
    default: bool | Callable[[], bool] = True
    task_doc: Callable[[StageContext], str] | None = None
    applies: Callable[[StageContext], bool] = lambda ctx: True
    shared: bool = False
    runs: tuple[str, ...] = ()

    def function(self) -> Callable:
        """Import and return the stage function (this imports torch/tvm). A stage whose
        code uses torch (:mod:`pipeline.torchenv` in its sources) gets the process set
        up first (:func:`pipeline.torchenv.setup`), before its module imports torch."""
        module, _, attr = self.func.partition(":")
        if any(Path(p) == _TORCHENV for p in self.sources()):
            from .. import torchenv
            torchenv.setup()
        return getattr(importlib.import_module(module), attr)

    def sources(self) -> list[str]:
        """Absolute paths of the pipeline files the stage runs (sorted): derived
        from its module's imports, never listed by hand (:mod:`pipeline.code_deps`)."""
        modules = [self.func.partition(":")[0]] + [BY_NAME[n].func.partition(":")[0] for n in self.runs]
        return sorted({str(p) for m in modules for p in closure(m)})

    def tracked(self, ctx: StageContext) -> dict:
        """Tracked parameters of one model: what doit's ``config_changed`` compares."""
        out = {p: _field(ctx.spec, p) for p in self.params}
        out.update(versions(*self.versions))
        out.update(self.extra(ctx))
        return out

    def in_default_run(self) -> bool:
        """Whether the default run builds this stage (for every built model)."""
        return self.default() if callable(self.default) else bool(self.default)

    def describe(self, ctx: StageContext) -> str:
        """Per-model doc line."""
        return self.task_doc(ctx) if self.task_doc else self.doc


def _field(spec: ModelSpec, path: str):
    value = spec
    for part in path.split("."):
        value = getattr(value, part)
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


#: distributions a builder module of this package runs, beyond torch / torchvision
#: (their version changes the network, so export re-runs when it changes)
BUILDER_DISTRIBUTIONS = {"pipeline.models.yolo": ("ultralytics",)}


def builder_versions(builder: str) -> dict[str, str]:
    """Installed versions of what ``builder`` ("module:callable") is built from:
    :data:`BUILDER_DISTRIBUTIONS` for our own builders, else the distribution of
    the distribution named like the module's top-level package (``timm``,
    ``ultralytics``) if one is installed; {} otherwise: torch / torchvision are
    tracked already, and a project's own module is a file_dep instead. Reads
    package metadata only (no import, no scan of every distribution)."""
    module = builder.partition(":")[0]
    if module in BUILDER_DISTRIBUTIONS:
        return versions(*BUILDER_DISTRIBUTIONS[module])
    top = module.split(".")[0]
    if top in ("torch", "torchvision", "pipeline"):
        return {}
    found = versions(top)
    return found if found[top] != "missing" else {}


def _realistic(spec: ModelSpec) -> bool:
    """Export reads the calibration images: a random init made realistic on them."""
    return spec.weights.reestimate_batchnorm or spec.weights.logit_std is not None


def _batchnorm_inputs(ctx: StageContext) -> dict:
    """What making a random init realistic reads besides the image files (none without it)."""
    if not _realistic(ctx.spec):
        return {}
    w = ctx.spec.weights
    return {"batchnorm_images": [p.name for p in ctx.calibration_images],
            "calibration": _field(ctx.spec, "calibration"), "preprocess": _field(ctx.spec, "preprocess"),
            "reestimate_batchnorm": w.reestimate_batchnorm, "batchnorm_batch": w.batchnorm_batch,
            "logit_std": w.logit_std}


def versions(*dists: str) -> dict[str, str]:
    """Installed version of each distribution ("missing" if absent)."""
    return {d: _version(d) for d in dists}


@functools.lru_cache(maxsize=None)
def _version(dist: str) -> str:
    # read once per process: every model's tasks ask again (75 metadata parses per task list)
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


# ----------------------------------------------------------------------------- the stages

QUANT = ("dtype", "quantizer")
# What the stages after mixed_precision track of [quantizer]: the int16 choice reaches
# them as int16_layers.json, so a budget or pattern change that picks the same layers
# stops at that byte-identical file.
QUANT_OPTS = ("dtype", "quantizer.implementation", "quantizer.symmetric_activations",
              "quantizer.weight_dtype", "quantizer.fuse_activations")


def _mixed(ctx: StageContext) -> bool:
    return ctx.spec.quantizer.mixed


def _selection(ctx: StageContext) -> Path | None:
    """``int16_layers.json`` of a mixed-precision model (None otherwise): a file dep
    of every stage that rebuilds the prepared model."""
    return ctx.layout.int16_selection if _mixed(ctx) else None


def _selection_deps(ctx: StageContext) -> list[Path]:
    return [ctx.layout.int16_selection] if _mixed(ctx) else []


def _mixed_doc(ctx: StageContext) -> str:
    q = ctx.spec.quantizer
    parts = [f"{len(q.int16_layers)} int16_layers pattern(s)"] if q.int16_layers else []
    if q.mixed_precision == "auto":
        parts.append(f"auto, budget {q.int16_cycles:.0%} of estimated cycles" if q.int16_cycles
                     else f"auto, budget {q.int16_macs:.0%} of MACs")
    return "int8/int16 mixed precision: " + ", ".join(parts) + " -> mixed_precision.json"


def _task(ctx: StageContext) -> dict:
    """``{"task": "detection"}`` for a detection model, else nothing (so the tracked
    parameters of classification models stay what they were)."""
    return {"task": ctx.spec.task} if ctx.spec.task != "classification" else {}


def _builds(ctx: StageContext) -> dict:
    return ctx.layout.builds(ctx.spec)


def _mmalib_files(ctx: StageContext) -> list[Path]:
    """Codegen files of the first build (MMALIB if enabled): what cross_compile compiles."""
    first = ctx.layout.codegen_dir(variants(ctx.spec)[0])
    return [f for f in ctx.layout.codegen_files(ctx.spec) if f.parent == first]


def _board_log(ctx: StageContext) -> Path | None:
    """The C7x profile log of a model: ``[profile] board_log`` (relative to the
    project root), else ``artifacts/<model>/board_profile.txt`` if it exists."""
    if ctx.spec.profile.board_log:
        return ctx.root / ctx.spec.profile.board_log  # an absolute path stays as it is
    return ctx.layout.board_profile if ctx.layout.board_profile.is_file() else None


def _board_log_name(ctx: StageContext) -> str:
    """:func:`_board_log` relative to the project (a tracked value: no machine path in keys)."""
    log = _board_log(ctx)
    return portable_path(log, ctx.root) if log else ""


def _board_log_deps(ctx: StageContext) -> list[Path]:
    log = _board_log(ctx)
    return [log] if log is not None and log.is_file() else []  # a missing one fails in the stage


def _memory_budget(ctx: StageContext) -> list[int] | None:
    """[L2, MSMC] bytes of the entry's target for the staged plan (None: flat)."""
    if ctx.spec.codegen.memory == "flat":
        return None
    from ..target import load_target  # light: tomllib, no torch/tvm

    t = load_target(ctx.spec.target.name, ctx.spec.target.figures)
    return [int(t.l2_sram_bytes), int(t.msmc_bytes)]


def _cross_outputs(ctx: StageContext) -> list[Path]:
    c_sources = [f.name for f in _mmalib_files(ctx) if f.suffix == ".c"]
    return [ctx.layout.cross / f for f in cross_outputs(ctx.spec.name, c_sources)]




STAGES: tuple[Stage, ...] = (
    Stage(
        name="export", doc="torch.export the float model (float.pt2)",
        func="pipeline.stages.export:export_model",
        params=("builder", "builder_kwargs", "input_shape", "weights.pretrained"),
        versions=("torch", "torchvision"),
        extra=lambda c: {**builder_versions(c.spec.builder), **_batchnorm_inputs(c)},
        deps=lambda c: (([c.weights] if c.weights else []) + list(c.builder_sources)
                        + (c.calibration_images if _realistic(c.spec) else [])),
        outs=lambda c: [c.layout.float_pt2, c.layout.export_json],
        args=lambda c: {"spec": c.spec, "weights": c.weights, "root": c.root,
                        "out": c.layout.float_pt2, "out_info": c.layout.export_json,
                        "calib_dir": c.calib_root / c.spec.calibration.set},
        task_doc=lambda c: f"export {c.spec.description or c.spec.builder} -> float.pt2",
        shared=True,  # export.json does not name the model: variants of one network share it
    ),
    Stage(
        # Only for mixed-precision entries. The choice alone goes to int16_layers.json, so
        # new measurements with the same choice stop the cascade here.
        name="mixed_precision", doc="choose the int16 layers of an int8 model (patterns, sensitivity pass)",
        func="pipeline.stages.mixed_precision:mixed_precision_model",
        params=QUANT + ("calibration", "preprocess"), versions=("torchao",),
        # a budget in cycles depends on the target (and on the performance model: code)
        extra=lambda c: {"images": [p.name for p in c.calibration_images],
                         **({"target": _field(c.spec, "target")} if c.spec.quantizer.int16_cycles else {})},
        deps=lambda c: [c.layout.float_pt2, *c.calibration_images],
        outs=lambda c: [c.layout.mixed_precision, c.layout.int16_selection],
        args=lambda c: {"spec": c.spec, "float_pt2": c.layout.float_pt2,
                        "calib_dir": c.calib_root / c.spec.calibration.set,
                        "out": c.layout.mixed_precision, "out_selection": c.layout.int16_selection},
        applies=_mixed, task_doc=_mixed_doc,
    ),
    Stage(
        name="prepare", doc="prepare_pt2e with the C7x quantizer (observer placement)",
        func="pipeline.stages.prepare:prepare_model",
        params=QUANT_OPTS, versions=("torchao",),
        deps=lambda c: [c.layout.float_pt2, *_selection_deps(c)],
        outs=lambda c: [c.layout.prepared, c.layout.prepared_table],
        args=lambda c: {"spec": c.spec, "float_pt2": c.layout.float_pt2,
                        "out_state": c.layout.prepared, "out_table": c.layout.prepared_table,
                        "int16_selection": _selection(c)},
        task_doc=lambda c: f"prepare_pt2e with C7xMMAQuantizer({c.spec.dtype})",
    ),
    Stage(
        name="calibrate", doc="run the calibration JPEGs through the observers",
        func="pipeline.stages.calibrate:calibrate_model",
        params=QUANT_OPTS + ("calibration", "preprocess"), versions=("torchao",),
        extra=lambda c: {"images": [p.name for p in c.calibration_images]},
        deps=lambda c: [c.layout.float_pt2, c.layout.prepared, c.layout.prepared_table,
                        *_selection_deps(c), *c.calibration_images],
        outs=lambda c: [c.layout.calibrated, c.layout.calibration_json],
        args=lambda c: {"spec": c.spec, "float_pt2": c.layout.float_pt2,
                        "prepared_state": c.layout.prepared, "prepared_table": c.layout.prepared_table,
                        "calib_dir": c.calib_root / c.spec.calibration.set,
                        "out_state": c.layout.calibrated, "out_info": c.layout.calibration_json,
                        "int16_selection": _selection(c)},
        task_doc=lambda c: f"calibrate on calib_data/{c.spec.calibration.set} ({c.spec.calibration.observer})",
    ),
    Stage(
        name="convert", doc="convert_pt2e to the Q/DQ program (quantized.pt2)",
        func="pipeline.stages.convert:convert_model",
        params=QUANT_OPTS + ("calibration.observer",), versions=("torchao",),
        deps=lambda c: [c.layout.float_pt2, c.layout.calibrated, *_selection_deps(c)],
        outs=lambda c: [c.layout.quantized_pt2],
        args=lambda c: {"spec": c.spec, "float_pt2": c.layout.float_pt2,
                        "calibrated_state": c.layout.calibrated, "out": c.layout.quantized_pt2,
                        "int16_selection": _selection(c)},
        task_doc=lambda c: "convert_pt2e + re-export -> quantized.pt2",
    ),
    Stage(
        name="relax_import", doc="import the Q/DQ program into TVM Relax",
        func="pipeline.stages.relax_import:import_model",
        versions=("torch", "apache-tvm"),
        deps=lambda c: [c.layout.quantized_pt2],
        outs=lambda c: [c.layout.relax_script, c.layout.relax_params, c.layout.relax_layers],
        args=lambda c: {"quantized_pt2": c.layout.quantized_pt2, "out_script": c.layout.relax_script,
                        "out_params": c.layout.relax_params, "out_layers": c.layout.relax_layers},
        task_doc=lambda c: "from_exported_program -> relax/module.py + params.bin",
    ),
    Stage(
        # The backend's modules share helpers; a change anywhere in it re-runs
        # codegen, and byte-identical output stops the cascade there.
        name="codegen", doc="MMALIB offload + static C + weights.bin",
        func="pipeline.stages.codegen:codegen_model",
        params=("codegen", "name"), versions=("apache-tvm",),
        # the staged memory plan depends on the target's L2 / MSMC sizes only
        extra=lambda c: {"memory_budget": _memory_budget(c)},
        deps=lambda c: [c.layout.relax_script, c.layout.relax_params, c.layout.relax_layers],
        outs=lambda c: c.layout.codegen_files(c.spec),
        args=lambda c: {"spec": c.spec, "script": c.layout.relax_script, "params": c.layout.relax_params,
                        "layers": c.layout.relax_layers,
                        "out_dirs": {v: c.layout.codegen_dir(v) for v in variants(c.spec)}},
        task_doc=lambda c: "MMALIB offload + static C + weights.bin (+ scalar baseline)",
    ),
    Stage(
        # Pure Python over the manifests: the target's figures and the fitted constants
        # (pipeline/perf/) decide it; a board log is a file dep while it exists.
        name="estimate", doc="estimated C7x cycles per call and layer, ms and FPS on the target",
        func="pipeline.stages.estimate:estimate_model",
        params=("target",),
        extra=lambda c: {"board_log": _board_log_name(c), "board_log_present": bool(_board_log_deps(c))},
        deps=lambda c: ([c.layout.codegen_dir(v) / "manifest.json" for v in variants(c.spec)]
                        + [c.layout.codegen_dir(variants(c.spec)[0]) / "model.h"] + _board_log_deps(c)),
        outs=lambda c: [c.layout.estimate],
        args=lambda c: {"spec": c.spec, "out": c.layout.estimate, "board_log": _board_log(c),
                        "manifests": {v: c.layout.codegen_dir(v) / "manifest.json" for v in variants(c.spec)}},
        task_doc=lambda c: f"estimated C7x cycles, ms and FPS on {c.spec.target.name} per call and layer "
                           f"-> estimate.json",
    ),
    Stage(
        name="host_build", doc="build the generated C on the host with gcc",
        func="pipeline.stages.host_build:host_build_model",
        # host_cpu: the executables are built with -march=native (backend/host.py)
        extra=lambda c: {"variants": variants(c.spec), "host_cpu": host_cpu()},
        deps=lambda c: c.layout.codegen_files(c.spec),
        outs=lambda c: [c.layout.host_exe(v) for v in variants(c.spec)] + [c.layout.host_record],
        args=lambda c: {"builds": _builds(c), "record": c.layout.host_record},
        task_doc=lambda c: "gcc host build against the reference kernels",
    ),
    Stage(
        name="evaluate", doc="float vs quantized accuracy report",
        func="pipeline.stages.evaluate:evaluate_model",
        # dtype, weight_dtype, evaluation_set: report.json records them
        params=("preprocess", "calibration.set", "calibration.source", "dtype", "quantizer.weight_dtype",
                "evaluation_set"),
        extra=lambda c: {"images": [p.name for p in c.evaluation_images], **_task(c)},
        deps=lambda c: [c.layout.float_pt2, c.layout.quantized_pt2, c.layout.calibration_json,
                        c.layout.export_json, *c.evaluation_images],
        outs=lambda c: [c.layout.report, c.layout.torch_outputs],
        args=lambda c: {"spec": c.spec, "float_pt2": c.layout.float_pt2,
                        "quantized_pt2": c.layout.quantized_pt2,
                        "calibration_json": c.layout.calibration_json, "export_json": c.layout.export_json,
                        "images_dir": c.calib_root / c.spec.evaluation_set, "out": c.layout.report,
                        "outputs": c.layout.torch_outputs},
        task_doc=lambda c: "float vs quantized top-1 on the labeled images",
    ),
    Stage(
        name="verify", doc="bit-exactness and accuracy of the host build",
        func="pipeline.stages.verify:verify_model",
        params=("preprocess", "dtype"),  # verify.json records dtype
        extra=lambda c: {"images": [p.name for p in c.evaluation_images], **_task(c)},
        # the PyTorch side comes from evaluate's torch_outputs.npz, not from the .pt2 files again
        deps=lambda c: [c.layout.torch_outputs, *c.layout.codegen_files(c.spec),
                        *[c.layout.host_exe(v) for v in variants(c.spec)], *c.evaluation_images],
        outs=lambda c: [c.layout.verify, *c.layout.detection_pictures(c.spec, c.evaluation_images)],
        args=lambda c: {"spec": c.spec, "torch_outputs": c.layout.torch_outputs,
                        "images_dir": c.calib_root / c.spec.evaluation_set, "builds": _builds(c),
                        "out": c.layout.verify},
        task_doc=lambda c: "host C vs Python integer reference vs PyTorch Q/DQ",
    ),
    Stage(
        # Re-runs the calibration-dependent flow per fold (module doc), so it tracks what
        # every stage from mixed_precision to host_build tracks, and their code.
        name="holdout", doc="held-out accuracy: k-fold re-calibration, Q/DQ and C on unseen images",
        func="pipeline.stages.holdout:holdout_model",
        runs=("mixed_precision", "prepare", "calibrate", "convert", "relax_import", "codegen", "host_build"),
        params=QUANT + ("calibration", "preprocess", "codegen", "evaluation_set", "evaluation_folds", "name"),
        versions=("torch", "torchao", "apache-tvm"),
        extra=lambda c: {"images": [p.name for p in c.calibration_images],
                         "evaluation_images": [p.name for p in c.evaluation_images],
                         **({"target": _field(c.spec, "target")} if c.spec.quantizer.int16_cycles else {})},
        deps=lambda c: [c.layout.float_pt2, c.layout.prepared, c.layout.prepared_table, *_selection_deps(c),
                        *c.calibration_images, *c.evaluation_images],
        outs=lambda c: [c.layout.holdout],
        args=lambda c: {"spec": c.spec, "float_pt2": c.layout.float_pt2, "prepared_state": c.layout.prepared,
                        "prepared_table": c.layout.prepared_table,
                        "calib_dir": c.calib_root / c.spec.calibration.set,
                        "images_dir": c.calib_root / c.spec.evaluation_set, "out": c.layout.holdout,
                        "int16_selection": _selection(c)},
        task_doc=lambda c: f"held-out top-1: {c.spec.evaluation_folds}-fold on calib_data/{c.spec.evaluation_set} "
                           f"(or the separate evaluation set), Q/DQ and C",
    ),
    Stage(
        # A board log is a file dep while it exists; whether there is one (and where) is
        # tracked too, so removing it re-runs the stage, which falls back to host time.
        name="profile", doc="per-layer time of every kernel call (TI's -profile-layers)",
        func="pipeline.stages.profile:profile_model",
        params=("preprocess",),
        # host_cpu: its times are of this CPU, its executables -march=native (as host_build)
        extra=lambda c: {"images": [p.name for p in c.evaluation_images], "host_cpu": host_cpu(),
                         "board_log": _board_log_name(c), "board_log_present": bool(_board_log_deps(c))},
        deps=lambda c: [*c.layout.codegen_files(c.spec), *c.evaluation_images, *_board_log_deps(c)],
        outs=lambda c: [c.layout.profile_exe(v) for v in variants(c.spec)] + [c.layout.profile],
        args=lambda c: {"spec": c.spec, "images_dir": c.calib_root / c.spec.evaluation_set,
                        "builds": {v: (c.layout.codegen_dir(v), c.layout.profile_exe(v)) for v in variants(c.spec)},
                        "board_log": _board_log(c), "out": c.layout.profile},
        task_doc=lambda c: "profile build on the images: time per kernel call and layer (+ board log)",
    ),
    Stage(
        # Float and Q/DQ models are rebuilt from float.pt2 + calibrated.pt in one process
        # (PT2E's numeric debugger matches their nodes by in-memory provenance), so the
        # record reads what convert reads, plus the deployed build's lowered program.
        name="layers", doc="per-layer numerics: Q/DQ vs float and C vs Q/DQ (layers.json)",
        func="pipeline.stages.layers:layers_model",
        params=QUANT_OPTS + ("calibration.observer", "preprocess", "evaluation_set"), versions=("torchao",),
        extra=lambda c: {"images": [p.name for p in c.evaluation_images]},  # layers.json records the set
        deps=lambda c: [c.layout.float_pt2, c.layout.calibrated, c.layout.calibration_json, c.layout.relax_layers,
                        *_selection_deps(c), *[c.layout.codegen_dir(variants(c.spec)[0]) / f
                          for f in ("manifest.json", "lowered.py", "weights.bin")],
                        *c.evaluation_images],
        outs=lambda c: [c.layout.layers_json],
        args=lambda c: {"spec": c.spec, "float_pt2": c.layout.float_pt2, "calibrated_state": c.layout.calibrated,
                        "relax_layers": c.layout.relax_layers,
                        "builds": {variants(c.spec)[0]: c.layout.codegen_dir(variants(c.spec)[0])},
                        "images_dir": c.calib_root / c.spec.evaluation_set, "out": c.layout.layers_json,
                        "int16_selection": _selection(c), "calibration_info": c.layout.calibration_json},
        task_doc=lambda c: f"SQNR, cosine, max error per layer on calib_data/{c.spec.evaluation_set} "
                           f"({variants(c.spec)[0]} build)",
    ),
    Stage(
        # The page's assets (HTML, CSS, JS, the vendored layout library) are code too:
        # visualize/page.py declares them (DATA_FILES), so editing one re-runs the stage.
        name="visualize", doc="offload graph of every build as one self-contained HTML page",
        func="pipeline.stages.visualize:visualize_model",
        params=("name",),
        deps=lambda c: [c.layout.codegen_dir(v) / "manifest.json" for v in variants(c.spec)]
        + [c.layout.profile, c.layout.layers_json, c.layout.estimate],
        outs=lambda c: [c.layout.offload_html],
        args=lambda c: {"model": c.spec.name, "out": c.layout.offload_html, "estimate": c.layout.estimate,
                        "manifests": {v: c.layout.codegen_dir(v) / "manifest.json" for v in variants(c.spec)},
                        "profile": c.layout.profile, "numerics": c.layout.layers_json,
                        "detections": c.layout.detections / "index.html" if c.spec.task == "detection" else None},
        task_doc=lambda c: "offload.html: kernel-call graph, layer table, details on click (no network)",
    ),
    Stage(
        # the deployed build (the first variant), its host executable for the example's
        # expected output, and the first evaluation image as the example's input
        name="bundle", doc="a self-contained folder + tarball to deploy: C, weights, example, Makefile",
        func="pipeline.stages.bundle:bundle_model",
        params=("preprocess", "task"),
        extra=lambda c: {"image": [p.name for p in c.evaluation_images[:1]]},
        deps=lambda c: _mmalib_files(c) + [c.layout.host_exe(variants(c.spec)[0]), *c.evaluation_images[:1]],
        outs=lambda c: c.layout.bundle_files(c.spec) + [c.layout.bundle_tar],
        args=lambda c: {"spec": c.spec, "codegen_dir": c.layout.codegen_dir(variants(c.spec)[0]),
                        "exe": c.layout.host_exe(variants(c.spec)[0]),
                        "image": next(iter(c.evaluation_images), None),
                        "out": c.layout.bundle, "tarball": c.layout.bundle_tar},
        task_doc=lambda c: f"bundle/ and {c.spec.name}_bundle.tar.gz: model.c/.h, weights.bin, kernels, "
                           "main.c example, Makefile (gcc, cl7x)",
    ),
    Stage(
        name="cross_compile", doc="TI cl7x cross-compile (needs TI_CGT_C7000_PATH)",
        func="pipeline.stages.cross_compile:cross_compile_model",
        extra=lambda c: {"cgt": os.environ.get("TI_CGT_C7000_PATH", ""),
                         "mmalib": os.environ.get("MMALIB_PATH", "")},
        deps=_mmalib_files, outs=_cross_outputs,
        args=lambda c: {"spec": c.spec, "codegen_dir": c.layout.codegen_dir(variants(c.spec)[0]),
                        "out": c.layout.cross},
        default=lambda: bool(os.environ.get("TI_CGT_C7000_PATH")),
        task_doc=lambda c: "TI cl7x compile of the generated C (needs TI_CGT_C7000_PATH)",
    ),
)

BY_NAME: dict[str, Stage] = {s.name: s for s in STAGES}


def get(name: str) -> Stage:
    """The record of stage ``name``; raises KeyError naming the known stages."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown stage {name!r} (known: {', '.join(BY_NAME)})") from None
