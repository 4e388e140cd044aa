"""Declarative model entries: one TOML file per model under ``models/``.

Loading the entries imports neither torch nor tvm, so ``doit list`` stays fast.
A file may ``extends = "<other model>"`` to reuse an entry and override a few
keys (e.g. ``mobilenet_v2_int16`` = ``mobilenet_v2`` with ``dtype = "int16"``).

Schema (every key but ``builder`` and ``input_shape`` has a default)::

    builder = "torchvision.models:mobilenet_v2"   # "module:callable" returning an nn.Module
    builder_kwargs = {}                            # passed to the builder
    input_shape = [1, 3, 224, 224]                 # NCHW, float32; batch must be 1
    dtype = "int8"                                 # "int8" | "int16" (activations)
    preprocess = "imagenet"                        # preset ("imagenet", "yolo"), or a table (see PreprocessSpec)
    default_run = true                             # false: built only when named (doit verify:<model>)
    task = "classification"                        # or "detection": [1, D, 6] output (x1 y1 x2 y2 score class)
    [weights]      see WeightsSpec
    [calibration]  see CalibrationSpec
    [quantizer]    see QuantizerSpec
    [codegen]      see CodegenSpec
    [evaluation]   set = "<calibration set>"       # labeled images for the accuracy report
    [profile]      see ProfileSpec
    [target]       see TargetSpec
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .errors import CalibrationDataError, ConfigError

DTYPES = ("int8", "int16")
OBSERVERS = ("minmax", "histogram", "moving_average", "percentile", "entropy")
MIXED_PRECISION = ("off", "auto")
ORDERS = ("sorted", "shuffled")
CALIB_SOURCES = ("images", "random")
QUANTIZER_IMPLS = ("c7x", "tvm")
WEIGHT_FORMATS = ("bin", "c_array")
MEMORY_PLANS = ("staged", "flat")  # codegen's memory plans (backend/emit_c.py reads this)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
#: A model name (the entry's file name without ``.toml``): it names ``artifacts/<model>/``,
#: so no path separator, no leading dot (``..``, hidden folders), nothing a shell must quote.
MODEL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")


def check_model_name(name: str, source: Path | str) -> None:
    """Raise :class:`ConfigError` (one line) unless ``name`` matches :data:`MODEL_NAME`."""
    if not MODEL_NAME.fullmatch(name):
        raise ConfigError(f"{source}: model name {name!r} (the file name) must be letters, digits, '_', '-' "
                          f"or '.', not start with a dot, and be at most 100 characters; rename the file")
# "detection": the output is [1, D, 6] end-to-end detections (pipeline/data/detections.py);
# verify and evaluate compare IoU-matched detections instead of top-1, verify draws them.
TASKS = ("classification", "detection")

# torchvision's ImageNet classification transform (its weights' `transforms()`).
IMAGENET_PREPROCESS = {
    "resize": 256,
    "crop": 224,
    "mean": [0.485, 0.456, 0.406],
    "std": [0.229, 0.224, 0.225],
}
# Ultralytics' detection input (the user's YOLO26 example): plain resize to
# 320x320 (no aspect-preserving letterbox), RGB / 255, NCHW, no mean/std.
YOLO_PREPROCESS = {"resize": [320, 320], "crop": 320, "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0]}
PREPROCESS_PRESETS = {"imagenet": IMAGENET_PREPROCESS, "yolo": YOLO_PREPROCESS}


@dataclass(frozen=True)
class WeightsSpec:
    """Where a model's checkpoint comes from (torch hub conventions).

    Lookup order: ``path`` (explicit, relative to the project root), then
    ``$TORCH_HOME/hub/checkpoints/<file>``, then ``<package>/<package_path>``
    of an installed registry package. ``file`` is torchvision's checkpoint name
    (``<arch>-<sha256 prefix>.pth``); its hash prefix is checked on load.
    ``pretrained = false`` builds the architecture with its random init (tests).
    ``optional = true``: when no file is found the default run skips the model
    with a one-line notice instead of failing.
    ``reestimate_batchnorm = true`` (with ``pretrained = false``): after the
    random init, every BatchNorm's running statistics are re-estimated on the
    model's calibration images (:mod:`pipeline.models.random_weights`), so a
    random network's outputs vary with the input; ``batchnorm_batch`` images
    per forward pass (0 = all in one pass: exactly their statistics).
    ``logit_std`` (with ``pretrained = false``): then the final classifier is
    centred and scaled so that the logits' standard deviation over the
    calibration images is this (the model-zoo sweep's realistic random weights).
    ``format``: "state_dict" (a plain ``torch.save`` of tensors, loaded with
    ``weights_only=True``) or "ultralytics" (an ultralytics ``.pt``, a pickle of
    whole modules: loaded only when its sha256 equals ``sha256``, by torch's
    weights-only unpickler with an explicit allow-list of the module classes it
    names, :mod:`pipeline.tools.yolo_state_dict`).
    """

    file: str | None = None
    path: str | None = None
    package: str | None = None
    package_path: str | None = None
    install_hint: str | None = None
    optional: bool = False
    pretrained: bool = True
    reestimate_batchnorm: bool = False
    batchnorm_batch: int = 8
    logit_std: float | None = None
    format: str = "state_dict"
    sha256: str | None = None


#: what a checkpoint file may be (WeightsSpec.format)
WEIGHT_FILE_FORMATS = ("state_dict", "ultralytics")


@dataclass(frozen=True)
class PreprocessSpec:
    """Image -> NCHW float32 tensor: resize, center-crop, normalize.

    ``resize``/``crop`` are pixels: ``resize`` an int scales the shorter side
    to it (aspect kept, torchvision's ``Resize(int)``), a pair ``(H, W)``
    scales to exactly that size (``Resize([H, W])``, the "yolo" preset);
    ``mean``/``std`` apply to RGB in [0, 1].
    """

    resize: int | tuple[int, int] = 256
    crop: int = 224
    mean: tuple[float, ...] = tuple(IMAGENET_PREPROCESS["mean"])
    std: tuple[float, ...] = tuple(IMAGENET_PREPROCESS["std"])


@dataclass(frozen=True)
class CalibrationSpec:
    """How the prepared model is calibrated.

    ``set``: folder name under ``calib_data/``. ``num_images``: 0 = all.
    ``order``: "sorted" (by file name) or "shuffled" (with ``seed``); either is
    deterministic. ``observer``: activation observer, "percentile" (our default:
    the lowest held-out logit error on MobileNetV2, docs/guide.md "Calibration
    methods"), "minmax" (the reference default), "histogram" (torchao's HistogramObserver: the range that
    minimises the L2 / mean-squared quantization error), "moving_average",
    "percentile" (clip the range at the ``percentile``-th percentile of
    |x|, in percent) or "entropy" (the KL-divergence-optimal threshold,
    TensorRT's entropy calibration). ``bias_correction``: after calibration,
    shift each conv/linear bias by the mean per-channel error its quantized
    weights and input cause on the calibration images (empirical bias
    correction, Nagel et al. 2019). ``source = "random"`` calibrates on
    Gaussian noise: for plumbing tests only, the report then says "not for
    deployment". ``shards``: split the images into this many contiguous
    slices, calibrated in parallel (local processes, or Dask tasks when
    calibrate runs on a Dask worker) and merged (:mod:`pipeline.quant.merge`):
    minmax is bit for bit a single-process run, the histogram observers within
    the bound of docs/numerics.md "Sharded calibration"; "moving_average"
    needs ``shards = 1`` (its average depends on the order of all batches).

    ``equalize``: before observing, rescale the channels of every tensor that
    only convs/linears produce and read (residual streams included) by
    SmoothQuant's ``max|x|^alpha / max|w|^(1 - alpha)`` with ``alpha =
    equalize_alpha`` in [0, 1] (:mod:`pipeline.quant.equalize`; exact in float).
    ``range_search`` (percentile observer): after observing, choose each int8
    activation's percentile among :data:`pipeline.quant.range_search.CANDIDATES`
    by the error it causes at the outputs of the layers reading it (``true`` or
    "readers"), or at the model's outputs with every tensor quantized ("output":
    observers in graph order, each given the choices upstream)
    (:mod:`pipeline.quant.range_search`). false: the observer's percentile.
    ``adaround_iterations`` > 0: after ``exact_requantize``, learn each int8
    weight's rounding (up or down) for that many steps per layer so the layer's
    output on the calibration images is closest to float (AdaRound,
    :mod:`pipeline.quant.adaround`); 0 = round to nearest.
    ``exact_requantize``: after observing (and the range search), raise each int8 layer's per-channel
    weight scales (by at most 1/64) so its rescale is exactly a 7-bit kernel
    multiplier (:mod:`pipeline.quant.exact_rescale`, docs/numerics.md "The 7-bit
    multiplier"): the deployed C then requantizes as the Q/DQ model does. On by
    default: on MobileNetV2 int8 it lowered the deployed C's held-out mean |logit
    error| from 0.398 to 0.368 (5-fold on imagenet20) and from 0.403 to 0.343 on
    calib_data/scenes, never calibrated on (scripts/calibration_study.py --deployed).
    """

    set: str = "imagenet20"
    num_images: int = 0
    order: str = "sorted"
    seed: int = 0
    observer: str = "percentile"
    batch_size: int = 1
    source: str = "images"
    percentile: float = 99.99
    bias_correction: bool = False
    shards: int = 1
    equalize: bool = False
    equalize_alpha: float = 0.5
    range_search: bool | str = dataclasses.field(default=False, metadata={"types": (bool, str)})
    adaround_iterations: int = 0
    exact_requantize: bool = True


@dataclass(frozen=True)
class QuantizerSpec:
    """Options handed to the quantizer (see ``pipeline.quant.C7xMMAQuantizer``).

    ``implementation``: "c7x" (ours) or "tvm" (the vendor fork's
    ``tvm.relax.frontend.torch.C7xMMAQuantizer`` when that tvm is installed).
    ``weight_dtype``: the weights of int16 layers. None = int8 weights for both
    activation dtypes (the user's examples, docs/reference.md); "int16" = int16
    weights in int16 mode (the reference code) and, in a mixed int8 model, for
    its int16 layers (int8 layers always have int8 weights: the int8 kernels'
    only form). The i16 kernels read int16 weights either way (int8 ones are
    widened, :mod:`pipeline.backend.fold`), so this costs no cycle.
    ``fuse_activations``: observe conv/linear/add outputs after a following
    relu/relu6 instead of before it.

    Mixed precision (int8 models only): ``int16_layers`` are glob patterns
    over PyTorch module paths (``"features.1.*"``, ``"classifier.1"``) whose
    layers run with int16 activations, as TIDL's 16-bit layer lists;
    ``mixed_precision = "auto"`` adds the layers a measured sensitivity pass
    picks, within ``int16_macs`` (the largest share of the model's MACs, in
    (0, 1], allowed in int16), or within ``int16_cycles`` instead (the largest
    share of the model's estimated C7x cycles on its ``[target]``; int16
    costs more than its MACs on the MMA, docs/estimate.md). One budget only.
    """

    implementation: str = "c7x"
    symmetric_activations: bool = True
    weight_dtype: str | None = None
    fuse_activations: bool = True
    int16_layers: tuple[str, ...] = ()
    mixed_precision: str = "off"
    int16_macs: float = 0.10
    int16_cycles: float | None = None

    @property
    def mixed(self) -> bool:
        """Whether some layers are int16 in an int8 model."""
        return bool(self.int16_layers) or self.mixed_precision == "auto"


@dataclass(frozen=True)
class CodegenSpec:
    """Code generation options. ``mmalib``: offload eligible layers to
    MMALIB/C7x kernels (off = everything on TVM's scalar path, the baseline).
    ``weights_format``: "bin" (``weights.bin`` loaded at run time) or
    "c_array" (also emit ``weights_data.c`` with the blob as a C array).
    ``memory``: "staged" (buffers placed on the C7x's L2 SRAM / MSMC / DDR
    within the ``[target]`` sizes, weights copied into L2 by DMA:
    pipeline/backend/levels.py) or "flat" (one DDR arena, weights read in
    place: the plan before staging, for comparison and debugging)."""

    mmalib: bool = True
    weights_format: str = "bin"
    memory: str = "staged"


@dataclass(frozen=True)
class ProfileSpec:
    """The per-layer profile stage. ``board_log``: a text file (relative to the
    project root) holding the ``===== TVM Layer Profile =====`` block(s) the C7x
    printed; None = ``artifacts/<model>/board_profile.txt`` when that file exists,
    else host timings only. A variant (``extends``) does not inherit it: the
    log belongs to the build that printed it."""

    board_log: str | None = None


@dataclass(frozen=True)
class TargetSpec:
    """The SoC the performance estimate is for: ``name`` selects
    ``pipeline/target/<name>.toml`` (am67a, am62a, tda4vm...);
    ``figures``: the entry's overrides of that file's figures
    (``[target] l2_sram_bytes = 229376``), checked when the entry is loaded.
    Inherited by ``extends`` variants."""

    name: str = "am67a"
    figures: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ModelSpec:
    """One validated model entry."""

    name: str
    source: Path
    builder: str
    input_shape: tuple[int, ...]
    dtype: str = "int8"
    builder_kwargs: dict = field(default_factory=dict)
    weights: WeightsSpec = WeightsSpec()
    preprocess: PreprocessSpec = PreprocessSpec()
    calibration: CalibrationSpec = CalibrationSpec()
    quantizer: QuantizerSpec = QuantizerSpec()
    codegen: CodegenSpec = CodegenSpec()
    evaluation_set: str = "imagenet20"
    evaluation_folds: int = 2
    profile: ProfileSpec = ProfileSpec()
    target: TargetSpec = TargetSpec()
    default_run: bool = True
    task: str = "classification"
    #: one line for people (``doit list`` shows it on the model's export task); tracks nothing
    description: str = ""


@dataclass(frozen=True)
class InvalidModel:
    """A model entry that failed validation; its tasks fail with ``error``."""

    name: str
    source: Path
    error: ConfigError


def load_models(models_dir: str | Path) -> list[ModelSpec | InvalidModel]:
    """Read every ``*.toml`` under ``models_dir``, sorted by name.

    Invalid entries come back as :class:`InvalidModel` (so one broken file does
    not stop the other models from building). Raises :class:`ConfigError` only
    when ``models_dir`` itself is missing.
    """
    models_dir = Path(models_dir)
    if not models_dir.is_dir():
        raise ConfigError(f"models folder {models_dir} not found: create it and add one .toml file per model")
    raw: dict[str, tuple[Path, dict | ConfigError]] = {}
    for path in sorted(models_dir.glob("*.toml")):
        try:
            check_model_name(path.stem, path)
        except ConfigError as e:
            raw[path.stem] = (path, e)
            continue
        try:
            raw[path.stem] = (path, tomllib.loads(path.read_text()))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raw[path.stem] = (path, ConfigError(f"{path}: not valid TOML ({e}); fix the syntax"))
    out: list[ModelSpec | InvalidModel] = []
    for name, (path, data) in raw.items():
        try:
            if isinstance(data, ConfigError):
                raise data
            out.append(parse_model(name, path, _resolve_extends(name, raw)))
        except ConfigError as e:
            out.append(InvalidModel(name, path, e))
        except (TypeError, ValueError, KeyError, AttributeError) as e:  # a value of the wrong kind
            out.append(InvalidModel(name, path, ConfigError(
                f"{path} (model {name!r}): invalid value ({type(e).__name__}: {e}); check the types "
                f"against docs/guide.md, 'Model entries'")))
    return out


def _resolve_extends(name: str, raw: dict, seen: tuple = ()) -> dict:
    path, data = raw[name]
    if isinstance(data, ConfigError):
        raise data
    base_name = data.get("extends")
    if base_name is None:
        return data
    if not isinstance(base_name, str):
        raise ConfigError(f"{path}: 'extends' must be the name of another model entry (a string)")
    if base_name in seen or base_name == name:
        raise ConfigError(f"{path}: 'extends' forms a cycle through {base_name!r}")
    if base_name not in raw:
        raise ConfigError(f"{path}: extends unknown model {base_name!r}; "
                          f"known: {', '.join(sorted(raw))}")
    base = _resolve_extends(base_name, raw, seen + (name,))
    return _deep_merge({k: v for k, v in base.items() if k not in ("extends", _NOT_INHERITED)},
                       {k: v for k, v in data.items() if k != "extends"})


# Tables an extending entry replaces as a whole: a new checkpoint must not
# inherit the base's file name, hash prefix or registry package.
_REPLACED_TABLES = {"weights"}
# A table a variant never inherits: the base's board log was printed by the base's build.
_NOT_INHERITED = "profile"


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        mergeable = isinstance(v, dict) and isinstance(out.get(k), dict) and k not in _REPLACED_TABLES
        out[k] = _deep_merge(out[k], v) if mergeable else v
    return out


_TOP_KEYS = {"builder", "builder_kwargs", "input_shape", "dtype", "preprocess", "weights",
             "calibration", "quantizer", "codegen", "evaluation", "profile", "description", "extends",
             "default_run", "task", "target"}


def parse_model(name: str, path: Path, data: dict) -> ModelSpec:
    """Validate one entry's TOML table; raise :class:`ConfigError` naming the file."""
    def fail(msg: str):
        raise ConfigError(f"{path} (model {name!r}): {msg}")

    unknown = set(data) - _TOP_KEYS  # ("extends" is resolved before parsing)
    if unknown:
        fail(f"unknown key(s) {sorted(unknown)}; allowed: {sorted(_TOP_KEYS)}")
    builder = data.get("builder")
    if not isinstance(builder, str) or not re.fullmatch(r"[\w.]+:\w+", builder):
        fail(f"'builder' must be 'module:callable' (e.g. 'torchvision.models:mobilenet_v2'), got {builder!r}")
    shape = data.get("input_shape")
    if (not isinstance(shape, list) or len(shape) != 4
            or not all(isinstance(s, int) and s > 0 for s in shape)):
        fail(f"'input_shape' must be [N, C, H, W] positive integers, got {shape!r}")
    if shape[0] != 1:
        fail(f"'input_shape' batch must be 1 (the C7x entry point runs one image), got {shape[0]}")
    dtype = data.get("dtype", "int8")
    if dtype not in DTYPES:
        fail(f"dtype {dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    default_run = data.get("default_run", True)
    if not isinstance(default_run, bool):
        fail(f"'default_run' must be true or false, got {default_run!r}")
    task = data.get("task", "classification")
    _check_choice(fail, "task", task, TASKS)
    description = data.get("description", "")
    if not isinstance(description, str):
        fail(f"'description' must be a string, got {description!r}")
    kwargs = data.get("builder_kwargs", {})
    if not isinstance(kwargs, dict):
        fail(f"'builder_kwargs' must be a table, e.g. {{ num_classes = 10 }}, got {kwargs!r}")

    weights = _section(fail, data, "weights", WeightsSpec)
    calibration = _section(fail, data, "calibration", CalibrationSpec)
    quantizer = _quantizer(fail, data, dtype)
    codegen = _section(fail, data, "codegen", CodegenSpec)
    profile = _section(fail, data, "profile", ProfileSpec)
    if profile.board_log is not None and (not isinstance(profile.board_log, str) or not profile.board_log.strip()):
        fail(f"profile.board_log must be the path of a text file (relative to the project), "
             f"got {profile.board_log!r}")
    _check_choice(fail, "calibration.observer", calibration.observer, OBSERVERS)
    _check_choice(fail, "calibration.order", calibration.order, ORDERS)
    _check_choice(fail, "calibration.source", calibration.source, CALIB_SOURCES)
    _check_choice(fail, "quantizer.implementation", quantizer.implementation, QUANTIZER_IMPLS)
    _check_choice(fail, "codegen.weights_format", codegen.weights_format, WEIGHT_FORMATS)
    _check_choice(fail, "codegen.memory", codegen.memory, MEMORY_PLANS)
    if quantizer.weight_dtype not in (None,) + DTYPES:
        fail(f"quantizer.weight_dtype {quantizer.weight_dtype!r} is not supported; use int8 or int16")
    if quantizer.weight_dtype == "int16" and dtype == "int8" and not quantizer.mixed:
        fail("quantizer.weight_dtype = 'int16' sets the weights of int16 layers: it needs dtype = 'int16' "
             "or int16 layers (quantizer.int16_layers or mixed_precision = \"auto\")")
    if quantizer.weight_dtype == "int8":  # the default, spelled out: same model, same tasks
        quantizer = dataclasses.replace(quantizer, weight_dtype=None)
    if calibration.num_images < 0 or calibration.batch_size < 1:
        fail("calibration.num_images must be >= 0 (0 = all) and calibration.batch_size >= 1")
    if weights.reestimate_batchnorm and (weights.pretrained or calibration.source != "images"):
        fail("weights.reestimate_batchnorm needs 'pretrained = false' and calibration images "
             "(it replaces a random init's BatchNorm statistics with those of the calibration set)")
    if weights.batchnorm_batch < 0:
        fail(f"weights.batchnorm_batch must be >= 0 (0 = all images in one pass), got {weights.batchnorm_batch}")
    if weights.logit_std is not None:
        if isinstance(weights.logit_std, bool) or not isinstance(weights.logit_std, (int, float)) \
                or not weights.logit_std > 0:
            fail(f"weights.logit_std must be a positive number, got {weights.logit_std!r}")
        if weights.pretrained or calibration.source != "images":
            fail("weights.logit_std needs 'pretrained = false' and calibration images "
                 "(it scales a random init's classifier on the calibration set)")
        weights = dataclasses.replace(weights, logit_std=float(weights.logit_std))
    _check_choice(fail, "weights.format", weights.format, WEIGHT_FILE_FORMATS)
    if weights.format == "ultralytics" and not (isinstance(weights.sha256, str)
                                                and re.fullmatch(r"[0-9a-f]{64}", weights.sha256)):
        fail("weights.format = 'ultralytics' needs weights.sha256, the 64 hex digits of the one checkpoint "
             "trusted to be unpickled")
    if weights.pretrained and not (weights.file or weights.path):
        fail("[weights] needs 'file' (torchvision checkpoint name) or 'path', "
             "or 'pretrained = false' for a randomly initialised model")

    if isinstance(calibration.shards, bool) or calibration.shards < 1:
        fail(f"calibration.shards must be an integer >= 1 (1 = one process), got {calibration.shards!r}")
    if calibration.shards > 1 and calibration.observer == "moving_average":
        fail("calibration.shards > 1 cannot be used with observer 'moving_average': its running average "
             "depends on the order of all batches; set shards = 1 or use observer 'minmax'")
    if not (0 < calibration.percentile <= 100):
        fail(f"calibration.percentile must be in (0, 100] (percent of |x| kept), got {calibration.percentile!r}")
    if calibration.shards > 1 and calibration.equalize:
        fail("calibration.shards > 1 cannot be used with equalize = true: the shard workers observe the "
             "model before equalization; set shards = 1")
    if isinstance(calibration.adaround_iterations, bool) or calibration.adaround_iterations < 0:
        fail(f"calibration.adaround_iterations must be an integer >= 0 (0 = round to nearest), "
             f"got {calibration.adaround_iterations!r}")
    if calibration.range_search not in (False, True, "readers", "output"):
        fail(f"calibration.range_search must be false, true (= 'readers') or one of 'readers', 'output', "
             f"got {calibration.range_search!r}")
    if calibration.range_search and calibration.observer != "percentile":
        fail(f"calibration.range_search chooses among percentiles: it needs observer = 'percentile', "
             f"got {calibration.observer!r}")
    if not (0.0 <= calibration.equalize_alpha <= 1.0):
        fail(f"calibration.equalize_alpha must be in [0, 1] (0: weights only, 1: activations only), "
             f"got {calibration.equalize_alpha!r}")

    evaluation = data.get("evaluation", {})
    if not isinstance(evaluation, dict) or set(evaluation) - {"set", "folds"}:
        fail("[evaluation] accepts only 'set' and 'folds'")
    evaluation_set = evaluation.get("set", calibration.set)
    if not isinstance(evaluation_set, str):
        fail(f"evaluation.set must be a folder name under calib_data/, got {evaluation_set!r}")
    folds = evaluation.get("folds", 2)
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        fail(f"evaluation.folds must be an integer >= 2 (k of the k-fold held-out estimate), got {folds!r}")
    preprocess = _preprocess(fail, data.get("preprocess", "imagenet"))
    if shape[1] != 3 or shape[2] != preprocess.crop or shape[3] != preprocess.crop:
        fail(f"input_shape {shape} does not match the preprocessing, which gives RGB images of "
             f"[1, 3, {preprocess.crop}, {preprocess.crop}]: set input_shape or preprocess.crop to agree")
    target = _target(fail, data.get("target", {}))
    return ModelSpec(
        name=name, source=path, builder=builder, input_shape=tuple(shape), dtype=dtype,
        builder_kwargs=dict(kwargs), weights=weights, preprocess=preprocess,
        calibration=calibration, quantizer=quantizer, codegen=codegen, evaluation_set=evaluation_set,
        evaluation_folds=folds, profile=profile, default_run=default_run, task=task, target=target,
        description=description,
    )


def _target(fail, table) -> TargetSpec:
    """[target]: ``name`` plus figure overrides. Only the form is checked here; the
    names against the target files by :func:`pipeline.target.check_target_spec`
    when the project loads (an unknown name lists the known targets)."""
    if not isinstance(table, dict):
        fail("[target] must be a table, e.g. { name = \"am67a\" }")
    table = dict(table)
    name = table.pop("name", "am67a")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]+", name):
        fail(f"target.name must be a target name such as \"am67a\", got {name!r}")
    bad = [k for k, v in table.items() if isinstance(v, bool) or not isinstance(v, (int, float))]
    if bad:
        fail(f"target.{bad[0]} must be a number (a figure of the target table), got {table[bad[0]]!r}")
    return TargetSpec(name=name, figures=table)


def _quantizer(fail, data: dict, dtype: str) -> QuantizerSpec:
    """[quantizer] with the mixed-precision keys checked (one line per mistake)."""
    table = dict(data.get("quantizer", {})) if isinstance(data.get("quantizer", {}), dict) else None
    if table is None:
        fail("[quantizer] must be a table")
    patterns = table.pop("int16_layers", [])
    if (not isinstance(patterns, list) or not all(isinstance(p, str) and p.strip() for p in patterns)):
        fail(f"quantizer.int16_layers must be a list of module-path patterns such as "
             f"[\"features.1.*\"], got {patterns!r}")
    q = _section(fail, {"quantizer": table}, "quantizer", QuantizerSpec)
    q = dataclasses.replace(q, int16_layers=tuple(patterns))
    _check_choice(fail, "quantizer.mixed_precision", q.mixed_precision, MIXED_PRECISION)
    if not (0 < q.int16_macs <= 1):
        fail(f"quantizer.int16_macs must be in (0, 1] (the share of MACs allowed in int16), got {q.int16_macs!r}")
    if "int16_macs" in table and q.mixed_precision != "auto":
        fail("quantizer.int16_macs is the budget of mixed_precision = \"auto\"; set that too, or drop it")
    if q.int16_cycles is not None:
        if isinstance(q.int16_cycles, bool) or not isinstance(q.int16_cycles, (int, float)) \
                or not (0 < q.int16_cycles <= 1):
            fail(f"quantizer.int16_cycles must be in (0, 1] (the share of estimated cycles allowed in int16), "
                 f"got {q.int16_cycles!r}")
        if q.mixed_precision != "auto":
            fail("quantizer.int16_cycles is a budget of mixed_precision = \"auto\"; set that too, or drop it")
        if "int16_macs" in table:
            fail("set one budget: quantizer.int16_macs (share of MACs) or quantizer.int16_cycles "
                 "(share of estimated cycles), not both")
    if q.mixed and dtype != "int8":
        fail(f"mixed precision (int16_layers / mixed_precision) needs dtype = \"int8\"; "
             f"dtype = {dtype!r} already makes every layer {dtype}")
    return q


def _section(fail, data: dict, key: str, cls):
    table = data.get(key, {})
    if not isinstance(table, dict):
        fail(f"[{key}] must be a table")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(table) - set(fields)
    if unknown:
        fail(f"unknown key(s) {sorted(unknown)} in [{key}]; allowed: {sorted(fields)}")
    for k, v in table.items():
        default = fields[k].default
        if isinstance(default, float) and isinstance(v, int) and not isinstance(v, bool):
            table = {**table, k: float(v)}  # `percentile = 99` means 99.0
            continue
        types = fields[k].metadata.get("types", (type(default),))
        if default is not None and not isinstance(v, types):
            fail(f"{key}.{k} must be {' or '.join(t.__name__ for t in types)}, got {v!r}")
    return cls(**table)


def _check_choice(fail, key: str, value, allowed):
    if value not in allowed:
        fail(f"{key} {value!r} is not supported; use one of {', '.join(allowed)}")


def _preprocess(fail, value) -> PreprocessSpec:
    if isinstance(value, str) and value in PREPROCESS_PRESETS:
        value = PREPROCESS_PRESETS[value]
    if not isinstance(value, dict):
        fail(f"preprocess must be one of {', '.join(map(repr, PREPROCESS_PRESETS))} or a table "
             f"{{resize, crop, mean, std}}, got {value!r}")
    unknown = set(value) - {"resize", "crop", "mean", "std"}
    if unknown:
        fail(f"unknown key(s) {sorted(unknown)} in preprocess")
    merged = {**IMAGENET_PREPROCESS, **value}
    if not _pixels(merged["crop"]):
        fail(f"preprocess.crop must be a positive number of pixels, got {merged['crop']!r}")
    resize = merged["resize"]
    if isinstance(resize, list) and len(resize) == 2 and all(_pixels(v) for v in resize):
        resize = (resize[0], resize[1])
        if merged["crop"] > min(resize):
            fail(f"preprocess.crop ({merged['crop']}) cannot exceed the resized size {list(resize)}")
    elif not _pixels(resize):
        fail(f"preprocess.resize must be a positive number of pixels (shorter side) or [H, W], got {resize!r}")
    elif merged["crop"] > resize:
        fail(f"preprocess.crop ({merged['crop']}) cannot exceed preprocess.resize ({resize})")
    for key in ("mean", "std"):
        v = merged[key]
        if not (isinstance(v, list) and len(v) == 3 and all(isinstance(x, (int, float)) for x in v)):
            fail(f"preprocess.{key} needs 3 numbers (R, G, B), got {v!r}")
    if any(x <= 0 for x in merged["std"]):
        fail(f"preprocess.std must be positive, got {merged['std']}")
    return PreprocessSpec(resize=resize, crop=int(merged["crop"]),
                          mean=tuple(float(v) for v in merged["mean"]),
                          std=tuple(float(v) for v in merged["std"]))


def _pixels(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def list_images(folder: str | Path, strict: bool = False) -> list[Path]:
    """Image files of a calibration/evaluation set, sorted by name.

    ``strict`` (what a stage uses when it runs): an entry with an image suffix
    that is not a readable file (a folder named ``x.jpg``, a dangling link)
    raises :class:`~pipeline.errors.CalibrationDataError` naming it, instead of
    being skipped without a word. Loading the task list is never strict."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    named = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if strict:
        for p in named:
            if not p.is_file():
                what = "a folder" if p.is_dir() else "a link to a missing file" if p.is_symlink() else "not a file"
                raise CalibrationDataError(f"{p}: {what}, not an image; rename or remove it")
    return [p for p in named if p.is_file()]
