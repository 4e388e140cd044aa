"""What a stage record sees of one model: its :class:`StageContext`, and the values its
records compute from it (image sets, the builds, the board log, library versions).

Plain Python: loading it imports neither torch nor tvm.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ..config import ModelSpec, list_images
from ..fsutil import portable_path
from ..layout import Layout, variants
from ..toolchain import cross_outputs


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

def files(value) -> list[Path]:
    """The files of an argument value: a Path, None (no file), or a list / tuple / dict of them."""
    if value is None:
        return []
    if isinstance(value, Path):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [f for v in value for f in files(v)]

def field_value(spec: ModelSpec, path: str):
    """The value of the model-entry field ``path`` ("calibration", "quantizer.weight_dtype"),
    a dataclass as a dict (a tracked parameter). Read only: computed once per entry and
    path, since every stage of every model asks (the entry is frozen)."""
    key = (id(spec), path)
    if key not in _FIELDS or _FIELDS[key][0] is not spec:
        value = spec
        for part in path.split("."):
            value = getattr(value, part)
        _FIELDS[key] = (spec, dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value)
    return _FIELDS[key][1]


_FIELDS: dict[tuple[int, str], tuple[ModelSpec, object]] = {}


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

def versions(*dists: str) -> dict[str, str]:
    """Installed version of each distribution ("missing" if absent)."""
    return {d: _version(d) for d in dists}

@functools.lru_cache(maxsize=None)
def _version(dist: str) -> str:
    # once per process (every model's tasks ask again); the version in a wheel's
    # ``<name>-<version>.dist-info`` folder name, else the metadata (an egg, an odd layout)
    name = re.sub(r"[-_.]+", "_", dist).lower()
    for folder in _dist_infos():
        stem = folder[:-len(".dist-info")]
        found, _, version = stem.partition("-")
        if re.sub(r"[-_.]+", "_", found).lower() == name and version:
            return version
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


@functools.lru_cache(maxsize=1)
def _dist_infos() -> tuple[str, ...]:
    """The ``*.dist-info`` folder names on ``sys.path``, in path order."""
    out = []
    for entry in sys.path:
        try:
            out += sorted(n for n in os.listdir(entry or ".") if n.endswith(".dist-info"))
        except OSError:
            continue
    return tuple(out)

def realistic(spec: ModelSpec) -> bool:
    """Export reads the calibration images: a random init made realistic on them."""
    return spec.weights.reestimate_batchnorm or spec.weights.logit_std is not None

def batchnorm_inputs(ctx: StageContext) -> dict:
    """What making a random init realistic reads besides the image files (none without it)."""
    if not realistic(ctx.spec):
        return {}
    w = ctx.spec.weights
    return {"batchnorm_images": [p.name for p in ctx.calibration_images],
            "calibration": field_value(ctx.spec, "calibration"), "preprocess": field_value(ctx.spec, "preprocess"),
            "reestimate_batchnorm": w.reestimate_batchnorm, "batchnorm_batch": w.batchnorm_batch,
            "logit_std": w.logit_std}

def mixed(ctx: StageContext) -> bool:
    return ctx.spec.quantizer.mixed

def recipe(ctx: StageContext) -> Path | None:
    """``search.json`` of an entry with ``[quantizer] target`` (None otherwise): a file dep
    of every stage that builds the model with the recipe chosen there."""
    return ctx.layout.search if ctx.spec.quantizer.target is not None else None

def search_folds(ctx: StageContext) -> Path | None:
    """``search_folds.npz`` of an entry with ``[quantizer] target`` (None otherwise): the
    chosen recipe's held-out outputs, which the holdout stage reuses."""
    return ctx.layout.search_folds if ctx.spec.quantizer.target is not None else None

def selection(ctx: StageContext) -> Path | None:
    """``int16_layers.json`` of a mixed-precision model (None otherwise): a file dep
    of every stage that rebuilds the prepared model."""
    return ctx.layout.int16_selection if mixed(ctx) else None

def task_param(ctx: StageContext) -> dict:
    """``{"task": "detection"}`` for a detection model, else nothing (so the tracked
    parameters of classification models stay what they were)."""
    return {"task": ctx.spec.task} if ctx.spec.task != "classification" else {}

def builds(ctx: StageContext) -> dict:
    return ctx.layout.builds(ctx.spec)

def mmalib_files(ctx: StageContext) -> list[Path]:
    """Codegen files of the first build (MMALIB if enabled): what cross_compile compiles."""
    first = ctx.layout.codegen_dir(variants(ctx.spec)[0])
    return [f for f in ctx.layout.codegen_files(ctx.spec) if f.parent == first]

def board_log(ctx: StageContext) -> Path | None:
    """The C7x profile log of a model: ``[profile] board_log`` (relative to the
    project root), else ``artifacts/<model>/board_profile.txt`` if it exists."""
    if ctx.spec.profile.board_log:
        return ctx.root / ctx.spec.profile.board_log  # an absolute path stays as it is
    return ctx.layout.board_profile if ctx.layout.board_profile.is_file() else None

def board_log_name(ctx: StageContext) -> str:
    """:func:`board_log` relative to the project (a tracked value: no machine path in keys)."""
    log = board_log(ctx)
    return portable_path(log, ctx.root) if log else ""

def board_log_deps(ctx: StageContext) -> list[Path]:
    log = board_log(ctx)
    return [log] if log is not None and log.is_file() else []  # a missing one fails in the stage

def memory_budget(ctx: StageContext) -> list[int] | None:
    """[L2, MSMC] bytes of the entry's target for the staged plan (None: flat)."""
    if ctx.spec.codegen.memory == "flat":
        return None
    from ..target import load_target  # light: tomllib, no torch/tvm

    t = load_target(ctx.spec.target.name, ctx.spec.target.figures)
    return [int(t.l2_sram_bytes), int(t.msmc_bytes)]

def cross_compile_outputs(ctx: StageContext) -> list[Path]:
    c_sources = [f.name for f in mmalib_files(ctx) if f.suffix == ".c"]
    return [ctx.layout.cross / f for f in cross_outputs(ctx.spec.name, c_sources)]

def manifests(ctx: StageContext) -> dict[str, Path]:
    return {v: ctx.layout.codegen_dir(v) / "manifest.json" for v in variants(ctx.spec)}

def first_variant(ctx: StageContext) -> str:
    """The deployed build: the first variant (MMALIB when enabled)."""
    return variants(ctx.spec)[0]

def calib_dir(ctx: StageContext) -> Path:
    return ctx.calib_root / ctx.spec.calibration.set

def eval_dir(ctx: StageContext) -> Path:
    return ctx.calib_root / ctx.spec.evaluation_set

def image_names(images: list[Path]) -> list[str]:
    return [p.name for p in images]
