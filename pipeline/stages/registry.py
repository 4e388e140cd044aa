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

import functools
import importlib
import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..code_deps import closure
from ..layout import variants
from ..toolchain import host_cpu
from .context import (StageContext, batchnorm_inputs, board_log, board_log_deps, board_log_name, builder_versions,
                      builds, calib_dir, cross_compile_outputs, eval_dir, field_value, files, first_variant, image_names,
                      manifests, memory_budget, mixed, mmalib_files, realistic, recipe, search_folds, selection, task_param,
                      versions)

PKG = Path(__file__).resolve().parent.parent
_TORCHENV = str(PKG / "torchenv.py")


Paths = Callable[[StageContext], list[Path]]
Named = Callable[[StageContext], dict]


def _none(ctx: StageContext) -> dict:
    return {}


def _no_paths(ctx: StageContext) -> list[Path]:
    return []


@dataclass(frozen=True)
class Stage:
    """One stage of the flow, declared.

    - ``func``: ``"module:function"`` run as ``function(**args(ctx))``; a plain
      function from input files to output files, testable without doit.
    - its keyword arguments, each named once: ``inputs(ctx)`` (files it reads:
      file dependencies too), ``outputs(ctx)`` (files it writes: doit targets
      too) and ``options(ctx)`` (the model entry, folders, other values). A value
      of ``inputs`` / ``outputs`` is a Path, None, or a list or dict of Paths.
      ``reads(ctx)`` / ``writes(ctx)``: files it reads or writes that no argument
      names one by one (the images of a folder argument, a build folder's files).
    - its code dependencies are derived: the import closure of ``func``'s
      module inside ``pipeline/`` plus the data files those modules declare
      (:mod:`pipeline.code_deps`); editing one re-runs the stage.
    - ``params``: tracked ``ModelSpec`` fields (``"dtype"``, ``"quantizer"``,
      ``"calibration.observer"``...); ``versions``: tracked distributions;
      ``extra(ctx)``: other tracked values (image names, environment).
      Changing any of them re-runs the stage.
    - :meth:`deps` / :meth:`outs`: input and output files (doit ``file_dep`` /
      ``targets``), derived from the above.
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
    inputs: Named = _none
    outputs: Named = _none
    options: Named = _none
    reads: Paths = _no_paths
    writes: Paths = _no_paths
    params: tuple[str, ...] = ()
    versions: tuple[str, ...] = ()
    extra: Callable[[StageContext], dict] = _none
    default: bool | Callable[[], bool] = True
    task_doc: Callable[[StageContext], str] | None = None
    applies: Callable[[StageContext], bool] = lambda ctx: True
    shared: bool = False
    runs: tuple[str, ...] = ()

    def deps(self, ctx: StageContext) -> list[Path]:
        """Input files (doit ``file_dep``): the ``inputs`` arguments' files, then ``reads``."""
        return files(self.inputs(ctx)) + list(self.reads(ctx))

    def outs(self, ctx: StageContext) -> list[Path]:
        """Output files (doit ``targets``): the ``outputs`` arguments' files, then ``writes``."""
        return files(self.outputs(ctx)) + list(self.writes(ctx))

    def args(self, ctx: StageContext) -> dict:
        """The function's keyword arguments."""
        return {**self.inputs(ctx), **self.outputs(ctx), **self.options(ctx)}

    def function(self) -> Callable:
        """Import and return the stage function (this imports torch/tvm). A stage whose
        code uses torch (:mod:`pipeline.torchenv` in its sources) gets the process set
        up first (:func:`pipeline.torchenv.setup`), before its module imports torch."""
        module, _, attr = self.func.partition(":")
        if _TORCHENV in self.sources():
            from .. import torchenv
            torchenv.setup()
        return getattr(importlib.import_module(module), attr)

    def sources(self) -> list[str]:
        """Absolute paths of the pipeline files the stage runs (sorted): derived
        from its module's imports, never listed by hand (:mod:`pipeline.code_deps`)."""
        return list(_sources(self.func, self.runs))

    def tracked(self, ctx: StageContext) -> dict:
        """Tracked parameters of one model: what doit's ``config_changed`` compares."""
        out = {p: field_value(ctx.spec, p) for p in self.params}
        out.update(versions(*self.versions))
        out.update(self.extra(ctx))
        return out

    def in_default_run(self) -> bool:
        """Whether the default run builds this stage (for every built model)."""
        return self.default() if callable(self.default) else bool(self.default)

    def describe(self, ctx: StageContext) -> str:
        """Per-model doc line."""
        return self.task_doc(ctx) if self.task_doc else self.doc


# ----------------------------------------------------------------------------- the stages

QUANT = ("dtype", "quantizer")
# What the stages after mixed_precision track of [quantizer]: the int16 choice reaches
# them as int16_layers.json, so a budget or pattern change that picks the same layers
# stops at that byte-identical file.
QUANT_OPTS = ("dtype", "quantizer.implementation", "quantizer.symmetric_activations",
              "quantizer.weight_dtype", "quantizer.fuse_activations")


def _mixed_doc(ctx: StageContext) -> str:
    q = ctx.spec.quantizer
    parts = [f"{len(q.int16_layers)} int16_layers pattern(s)"] if q.int16_layers else []
    if q.mixed_precision == "auto":
        parts.append(f"auto, budget {q.int16_cycles:.0%} of estimated cycles" if q.int16_cycles
                     else f"auto, budget {q.int16_macs:.0%} of MACs")
    return "int8/int16 mixed precision: " + ", ".join(parts) + " -> mixed_precision.json"


def _search_doc(ctx: StageContext) -> str:
    t = ctx.spec.quantizer.target
    if t is None:
        return "recipe search: no [quantizer] target"
    cycles = ", est. cycles" if t.int16 or t.max_mcycles is not None else ""   # int8-only: the same for all
    return f"recipe search for {t.text()} ({ctx.spec.evaluation_folds}-fold held out{cycles}) -> search.json"


STAGES: tuple[Stage, ...] = (
    Stage(
        name="export", doc="torch.export the float model (float.pt2)",
        func="pipeline.stages.export:export_model",
        params=("builder", "builder_kwargs", "input_shape", "weights.pretrained", "weights.strip_prefix"),
        versions=("torch", "torchvision"),
        extra=lambda c: {**builder_versions(c.spec.builder), **batchnorm_inputs(c)},
        inputs=lambda c: {"weights": c.weights},
        reads=lambda c: list(c.builder_sources) + (c.calibration_images if realistic(c.spec) else []),
        outputs=lambda c: {"out": c.layout.float_pt2, "out_info": c.layout.export_json},
        options=lambda c: {"spec": c.spec, "root": c.root, "calib_dir": calib_dir(c)},
        task_doc=lambda c: f"export {c.spec.description or c.spec.builder} -> float.pt2",
        shared=True,  # export.json does not name the model: variants of one network share it
    ),
    Stage(
        # Only for entries with [quantizer] target: scores candidates through the fold flow
        # (its records' code is this stage's code too) and writes the choice.
        name="search", doc="the cheapest recipe / int16 layers that meet [quantizer] target (held out)",
        func="pipeline.stages.search:search_model",
        runs=("mixed_precision", "prepare", "calibrate", "convert", "relax_import", "codegen", "host_build"),
        params=QUANT + ("calibration", "preprocess", "codegen", "evaluation_set", "evaluation_folds", "target"),
        versions=("torch", "torchao", "apache-tvm"),
        extra=lambda c: {"images": image_names(c.calibration_images),
                         "evaluation_images": image_names(c.evaluation_images)},
        inputs=lambda c: {"float_pt2": c.layout.float_pt2},
        reads=lambda c: [*c.calibration_images, *c.evaluation_images],
        outputs=lambda c: {"out": c.layout.search, "folds_out": c.layout.search_folds},
        options=lambda c: {"spec": c.spec, "calib_dir": calib_dir(c), "images_dir": eval_dir(c)},
        applies=lambda c: c.spec.quantizer.target is not None,
        task_doc=_search_doc,
    ),
    Stage(
        # Only for mixed-precision entries. The choice alone goes to int16_layers.json, so
        # new measurements with the same choice stop the cascade here.
        name="mixed_precision", doc="choose the int16 layers of an int8 model (patterns, sensitivity pass)",
        func="pipeline.stages.mixed_precision:mixed_precision_model",
        params=QUANT + ("calibration", "preprocess"), versions=("torchao",),
        # a budget in cycles depends on the target (and on the performance model: code)
        extra=lambda c: {"images": image_names(c.calibration_images),
                         **({"target": field_value(c.spec, "target")} if c.spec.quantizer.int16_cycles else {})},
        inputs=lambda c: {"float_pt2": c.layout.float_pt2, "recipe": recipe(c)},
        reads=lambda c: c.calibration_images,
        outputs=lambda c: {"out": c.layout.mixed_precision, "out_selection": c.layout.int16_selection},
        options=lambda c: {"spec": c.spec, "calib_dir": calib_dir(c)},
        applies=mixed, task_doc=_mixed_doc,
    ),
    Stage(
        name="prepare", doc="prepare_pt2e with the C7x quantizer (observer placement)",
        func="pipeline.stages.prepare:prepare_model",
        params=QUANT_OPTS, versions=("torchao",),
        inputs=lambda c: {"float_pt2": c.layout.float_pt2, "int16_selection": selection(c),
                          "recipe": recipe(c)},
        outputs=lambda c: {"out_state": c.layout.prepared, "out_table": c.layout.prepared_table},
        options=lambda c: {"spec": c.spec},
        task_doc=lambda c: f"prepare_pt2e with C7xMMAQuantizer({c.spec.dtype})",
    ),
    Stage(
        name="calibrate", doc="run the calibration JPEGs through the observers",
        func="pipeline.stages.calibrate:calibrate_model",
        params=QUANT_OPTS + ("calibration", "preprocess"), versions=("torchao",),
        extra=lambda c: {"images": image_names(c.calibration_images)},
        inputs=lambda c: {"float_pt2": c.layout.float_pt2, "prepared_state": c.layout.prepared,
                          "prepared_table": c.layout.prepared_table, "int16_selection": selection(c),
                          "recipe": recipe(c)},
        reads=lambda c: c.calibration_images,
        outputs=lambda c: {"out_state": c.layout.calibrated, "out_info": c.layout.calibration_json},
        options=lambda c: {"spec": c.spec, "calib_dir": calib_dir(c)},
        task_doc=lambda c: f"calibrate on calib_data/{c.spec.calibration.set} ({c.spec.calibration.observer})",
    ),
    Stage(
        name="convert", doc="convert_pt2e to the Q/DQ program (quantized.pt2)",
        func="pipeline.stages.convert:convert_model",
        params=QUANT_OPTS + ("calibration.observer",), versions=("torchao",),
        inputs=lambda c: {"float_pt2": c.layout.float_pt2, "calibrated_state": c.layout.calibrated,
                          "int16_selection": selection(c), "recipe": recipe(c)},
        outputs=lambda c: {"out": c.layout.quantized_pt2},
        options=lambda c: {"spec": c.spec},
        task_doc=lambda c: "convert_pt2e + re-export -> quantized.pt2",
    ),
    Stage(
        name="relax_import", doc="import the Q/DQ program into TVM Relax",
        func="pipeline.stages.relax_import:import_model",
        versions=("torch", "apache-tvm"),
        inputs=lambda c: {"quantized_pt2": c.layout.quantized_pt2},
        outputs=lambda c: {"out_script": c.layout.relax_script, "out_params": c.layout.relax_params,
                           "out_layers": c.layout.relax_layers},
        task_doc=lambda c: "from_exported_program -> relax/module.py + params.bin",
    ),
    Stage(
        # The backend's modules share helpers; a change anywhere in it re-runs
        # codegen, and byte-identical output stops the cascade there.
        name="codegen", doc="MMALIB offload + static C + weights.bin",
        func="pipeline.stages.codegen:codegen_model",
        params=("codegen", "name"), versions=("apache-tvm",),
        # the staged memory plan depends on the target's L2 / MSMC sizes only
        extra=lambda c: {"memory_budget": memory_budget(c)},
        inputs=lambda c: {"script": c.layout.relax_script, "params": c.layout.relax_params,
                          "layers": c.layout.relax_layers},
        writes=lambda c: c.layout.codegen_files(c.spec),
        options=lambda c: {"spec": c.spec, "out_dirs": {v: c.layout.codegen_dir(v) for v in variants(c.spec)}},
        task_doc=lambda c: "MMALIB offload + static C + weights.bin (+ scalar baseline)",
    ),
    Stage(
        # Pure Python over the manifests: the target's figures and the fitted constants
        # (pipeline/perf/) decide it; a board log is a file dep while it exists.
        name="estimate", doc="estimated C7x cycles per call and layer, ms and FPS on the target",
        func="pipeline.stages.estimate:estimate_model",
        params=("target",),
        extra=lambda c: {"board_log": board_log_name(c), "board_log_present": bool(board_log_deps(c))},
        inputs=lambda c: {"manifests": manifests(c)},
        reads=lambda c: [c.layout.codegen_dir(first_variant(c)) / "model.h", *board_log_deps(c)],
        outputs=lambda c: {"out": c.layout.estimate},
        options=lambda c: {"spec": c.spec, "board_log": board_log(c)},
        task_doc=lambda c: f"estimated C7x cycles, ms and FPS on {c.spec.target.name} per call and layer "
                           f"-> estimate.json",
    ),
    Stage(
        name="host_build", doc="build the generated C on the host with gcc",
        func="pipeline.stages.host_build:host_build_model",
        # host_cpu: the executables are built with -march=native (backend/host.py)
        extra=lambda c: {"variants": variants(c.spec), "host_cpu": host_cpu()},
        reads=lambda c: c.layout.codegen_files(c.spec),
        outputs=lambda c: {"record": c.layout.host_record},
        writes=lambda c: [c.layout.host_exe(v) for v in variants(c.spec)],
        options=lambda c: {"builds": builds(c)},
        task_doc=lambda c: "gcc host build against the reference kernels",
    ),
    Stage(
        name="evaluate", doc="float vs quantized accuracy report",
        func="pipeline.stages.evaluate:evaluate_model",
        # dtype, weight_dtype, evaluation_set: report.json records them
        params=("preprocess", "calibration.set", "calibration.source", "dtype", "quantizer.weight_dtype",
                "evaluation_set"),
        extra=lambda c: {"images": image_names(c.evaluation_images), **task_param(c)},
        inputs=lambda c: {"float_pt2": c.layout.float_pt2, "quantized_pt2": c.layout.quantized_pt2,
                          "calibration_json": c.layout.calibration_json, "export_json": c.layout.export_json,
                          "recipe": recipe(c)},
        reads=lambda c: c.evaluation_images,
        outputs=lambda c: {"out": c.layout.report, "outputs": c.layout.torch_outputs},
        options=lambda c: {"spec": c.spec, "images_dir": eval_dir(c)},
        task_doc=lambda c: "float vs quantized top-1 on the labeled images",
    ),
    Stage(
        name="verify", doc="bit-exactness and accuracy of the host build",
        func="pipeline.stages.verify:verify_model",
        params=("preprocess", "dtype"),  # verify.json records dtype
        extra=lambda c: {"images": image_names(c.evaluation_images), **task_param(c)},
        # the PyTorch side comes from evaluate's torch_outputs.npz, not from the .pt2 files again
        inputs=lambda c: {"torch_outputs": c.layout.torch_outputs},
        reads=lambda c: [*c.layout.codegen_files(c.spec), *[c.layout.host_exe(v) for v in variants(c.spec)],
                         *c.evaluation_images],
        outputs=lambda c: {"out": c.layout.verify},
        writes=lambda c: c.layout.detection_pictures(c.spec, c.evaluation_images),
        options=lambda c: {"spec": c.spec, "images_dir": eval_dir(c), "builds": builds(c)},
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
        extra=lambda c: {"images": image_names(c.calibration_images),
                         "evaluation_images": image_names(c.evaluation_images),
                         **({"target": field_value(c.spec, "target")} if c.spec.quantizer.int16_cycles else {})},
        inputs=lambda c: {"float_pt2": c.layout.float_pt2, "prepared_state": c.layout.prepared,
                          "prepared_table": c.layout.prepared_table, "int16_selection": selection(c),
                          "recipe": recipe(c), "search_folds": search_folds(c)},
        reads=lambda c: [*c.calibration_images, *c.evaluation_images],
        outputs=lambda c: {"out": c.layout.holdout},
        options=lambda c: {"spec": c.spec, "calib_dir": calib_dir(c), "images_dir": eval_dir(c)},
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
        extra=lambda c: {"images": image_names(c.evaluation_images), "host_cpu": host_cpu(),
                         "board_log": board_log_name(c), "board_log_present": bool(board_log_deps(c))},
        reads=lambda c: [*c.layout.codegen_files(c.spec), *c.evaluation_images, *board_log_deps(c)],
        outputs=lambda c: {"out": c.layout.profile},
        writes=lambda c: [c.layout.profile_exe(v) for v in variants(c.spec)],
        options=lambda c: {"spec": c.spec, "images_dir": eval_dir(c), "board_log": board_log(c),
                           "builds": {v: (c.layout.codegen_dir(v), c.layout.profile_exe(v))
                                      for v in variants(c.spec)}},
        task_doc=lambda c: "profile build on the images: time per kernel call and layer (+ board log)",
    ),
    Stage(
        # Float and Q/DQ models are rebuilt from float.pt2 + calibrated.pt in one process
        # (PT2E's numeric debugger matches their nodes by in-memory provenance), so the
        # record reads what convert reads, plus the deployed build's lowered program.
        name="layers", doc="per-layer numerics: Q/DQ vs float and C vs Q/DQ (layers.json)",
        func="pipeline.stages.layers:layers_model",
        params=QUANT_OPTS + ("calibration.observer", "preprocess", "evaluation_set"), versions=("torchao",),
        extra=lambda c: {"images": image_names(c.evaluation_images)},  # layers.json records the set
        inputs=lambda c: {"float_pt2": c.layout.float_pt2, "calibrated_state": c.layout.calibrated,
                          "calibration_info": c.layout.calibration_json, "relax_layers": c.layout.relax_layers,
                          "int16_selection": selection(c), "recipe": recipe(c)},
        reads=lambda c: [*[c.layout.codegen_dir(first_variant(c)) / f for f in ("manifest.json", "lowered.py", "weights.bin")],
                         *c.evaluation_images],
        outputs=lambda c: {"out": c.layout.layers_json},
        options=lambda c: {"spec": c.spec, "images_dir": eval_dir(c),
                           "builds": {first_variant(c): c.layout.codegen_dir(first_variant(c))}},
        task_doc=lambda c: f"SQNR, cosine, max error per layer on calib_data/{c.spec.evaluation_set} "
                           f"({first_variant(c)} build)",
    ),
    Stage(
        # The page's assets (HTML, CSS, JS, the vendored layout library) are code too:
        # visualize/page.py declares them (DATA_FILES), so editing one re-runs the stage.
        name="visualize", doc="offload graph of every build as one self-contained HTML page",
        func="pipeline.stages.visualize:visualize_model",
        params=("name",),
        inputs=lambda c: {"manifests": manifests(c), "profile": c.layout.profile, "numerics": c.layout.layers_json,
                          "estimate": c.layout.estimate, "fidelity": c.layout.holdout, "search": recipe(c)},
        outputs=lambda c: {"out": c.layout.offload_html},
        options=lambda c: {"model": c.spec.name,
                           "detections": c.layout.detections / "index.html" if c.spec.detects else None},
        task_doc=lambda c: "offload.html: kernel-call graph, layer table, details on click (no network)",
    ),
    Stage(
        # the deployed build (the first variant), its host executable for the example's
        # expected output, and the first evaluation image as the example's input
        name="bundle", doc="a self-contained folder + tarball to deploy: C, weights, example, Makefile",
        func="pipeline.stages.bundle:bundle_model",
        params=("preprocess", "task"),
        extra=lambda c: {"image": image_names(c.evaluation_images[:1])},
        inputs=lambda c: {"exe": c.layout.host_exe(first_variant(c)), "image": next(iter(c.evaluation_images), None)},
        reads=mmalib_files,
        outputs=lambda c: {"tarball": c.layout.bundle_tar},
        writes=lambda c: c.layout.bundle_files(c.spec),
        options=lambda c: {"spec": c.spec, "codegen_dir": c.layout.codegen_dir(first_variant(c)), "out": c.layout.bundle},
        task_doc=lambda c: f"bundle/ and {c.spec.name}_bundle.tar.gz: model.c/.h, weights.bin, kernels, "
                           "main.c example, Makefile (gcc, cl7x)",
    ),
    Stage(
        name="cross_compile", doc="TI cl7x cross-compile (needs TI_CGT_C7000_PATH)",
        func="pipeline.stages.cross_compile:cross_compile_model",
        extra=lambda c: {"cgt": os.environ.get("TI_CGT_C7000_PATH", ""),
                         "mmalib": os.environ.get("MMALIB_PATH", "")},
        reads=mmalib_files, writes=cross_compile_outputs,
        options=lambda c: {"spec": c.spec, "codegen_dir": c.layout.codegen_dir(first_variant(c)), "out": c.layout.cross},
        default=lambda: bool(os.environ.get("TI_CGT_C7000_PATH")),
        task_doc=lambda c: "TI cl7x compile of the generated C (needs TI_CGT_C7000_PATH)",
    ),
)

BY_NAME: dict[str, Stage] = {s.name: s for s in STAGES}


@functools.lru_cache(maxsize=None)
def _sources(func: str, runs: tuple[str, ...]) -> tuple[str, ...]:
    """:meth:`Stage.sources`, once per process (every model's task asks again)."""
    modules = [func.partition(":")[0]] + [BY_NAME[n].func.partition(":")[0] for n in runs]
    return tuple(sorted({str(p) for m in modules for p in closure(m)}))


def get(name: str) -> Stage:
    """The record of stage ``name``; raises KeyError naming the known stages."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown stage {name!r} (known: {', '.join(BY_NAME)})") from None
