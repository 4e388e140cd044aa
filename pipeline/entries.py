"""Loading and validating the model entries (``models/*.toml``) into :class:`~pipeline.config.ModelSpec`.

:func:`load_models` reads every entry, resolves ``extends`` and validates each one
(:func:`parse_model`): a field's allowed values and ranges are declared on the
field itself (``pipeline/config.py``: :func:`~pipeline.config.choice`,
:func:`~pipeline.config.interval`, :func:`~pipeline.config.at_least`) and checked
by one function here (:func:`_check_field`); what remains here are the rules that
relate several keys. Plain Python: loading imports neither torch nor tvm.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .config import (ACCURACY_METRICS, DTYPES, IMAGENET_PREPROCESS, PER_IMAGE_MIN_DETECTIONS, PREPROCESS_PRESETS,
                     SEARCHED_FIELDS, SEARCHED_INT16_FIELDS,
                     TASKS, AccuracyTarget, CalibrationSpec, CodegenSpec, ModelSpec, PreprocessSpec, ProfileSpec,
                     QuantizerSpec, TargetSpec, WeightsSpec, check_model_name)
from .errors import ConfigError


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
             "default_run", "task", "target", "group"}

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
    group = data.get("group")
    if group is not None and not (isinstance(group, str) and re.fullmatch(r"[a-z][a-z0-9_]*", group)):
        fail(f"'group' must be a lower-case task name such as \"zoo\" (letters, digits, '_'), got {group!r}")
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
    if quantizer.weight_dtype == "int16" and dtype == "int8" and not quantizer.mixed:
        fail("quantizer.weight_dtype = 'int16' sets the weights of int16 layers: it needs dtype = 'int16' "
             "or int16 layers (quantizer.int16_layers or mixed_precision = \"auto\")")
    if quantizer.weight_dtype == "int8":  # the default, spelled out: same model, same tasks
        quantizer = dataclasses.replace(quantizer, weight_dtype=None)
    if weights.reestimate_batchnorm and (weights.pretrained or calibration.source != "images"):
        fail("weights.reestimate_batchnorm needs 'pretrained = false' and calibration images "
             "(it replaces a random init's BatchNorm statistics with those of the calibration set)")
    if weights.logit_std is not None:
        if isinstance(weights.logit_std, bool) or not isinstance(weights.logit_std, (int, float)) \
                or not weights.logit_std > 0:
            fail(f"weights.logit_std must be a positive number, got {weights.logit_std!r}")
        if weights.pretrained or calibration.source != "images":
            fail("weights.logit_std needs 'pretrained = false' and calibration images "
                 "(it scales a random init's classifier on the calibration set)")
        weights = dataclasses.replace(weights, logit_std=float(weights.logit_std))
    if weights.format == "ultralytics" and weights.sha256 is None:
        fail("weights.format = 'ultralytics' needs weights.sha256, the 64 hex digits of the one checkpoint "
             "trusted to be unpickled")
    if weights.sha256 is not None and not (isinstance(weights.sha256, str)
                                           and re.fullmatch(r"[0-9a-f]{64}", weights.sha256)):
        fail(f"weights.sha256 must be 64 lower-case hex digits (sha256sum's output), got {weights.sha256!r}")
    if weights.strip_prefix is not None and not (isinstance(weights.strip_prefix, str) and weights.strip_prefix):
        fail(f"weights.strip_prefix must be a non-empty string such as \"module.\", got {weights.strip_prefix!r}")
    if weights.pretrained and not (weights.file or weights.path):
        fail("[weights] needs 'file' (torchvision checkpoint name) or 'path', "
             "or 'pretrained = false' for a randomly initialised model")

    if calibration.shards > 1 and calibration.observer == "moving_average":
        fail("calibration.shards > 1 cannot be used with observer 'moving_average': its running average "
             "depends on the order of all batches; set shards = 1 or use observer 'minmax'")
    if calibration.shards > 1 and calibration.equalize:
        fail("calibration.shards > 1 cannot be used with equalize = true: the shard workers observe the "
             "model before equalization; set shards = 1")
    if calibration.range_search and calibration.observer != "percentile":
        fail(f"calibration.range_search chooses among percentiles: it needs observer = 'percentile', "
             f"got {calibration.observer!r}")

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
    spec = ModelSpec(
        name=name, source=path, builder=builder, input_shape=tuple(shape), dtype=dtype,
        builder_kwargs=dict(kwargs), weights=weights, preprocess=preprocess,
        calibration=calibration, quantizer=quantizer, codegen=codegen, evaluation_set=evaluation_set,
        evaluation_folds=folds, profile=profile, default_run=default_run, group=group, task=task, target=target,
        description=description,
    )
    if quantizer.target is not None:
        _check_searched(fail, spec)
    return spec


def _check_searched(fail, spec: ModelSpec) -> None:
    """An entry with a target leaves the fields the search sets (:data:`SEARCHED_FIELDS`) at
    their defaults: no candidate would keep its value."""
    fields = SEARCHED_FIELDS + (SEARCHED_INT16_FIELDS if spec.quantizer.target.int16 else ())
    defaults = {"calibration": CalibrationSpec(), "quantizer": QuantizerSpec()}
    own = [f"{section}.{key}" for section, key in (f.split(".") for f in fields)
           if getattr(getattr(spec, section), key) != getattr(defaults[section], key)]
    if own:
        fail(f"{', '.join(own)} {'is' if len(own) == 1 else 'are'} chosen by the recipe search "
             f"(quantizer.target): remove {'it' if len(own) == 1 else 'them'}, or set target = false "
             f"to build the entry's own settings")


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
    target = _accuracy_target(fail, table.pop("target", None), data.get("task", "classification"))
    patterns = table.pop("int16_layers", [])
    if (not isinstance(patterns, list) or not all(isinstance(p, str) and p.strip() for p in patterns)):
        fail(f"quantizer.int16_layers must be a list of module-path patterns such as "
             f"[\"features.1.*\"], got {patterns!r}")
    q = _section(fail, {"quantizer": table}, "quantizer", QuantizerSpec)
    q = dataclasses.replace(q, int16_layers=tuple(patterns), target=target)
    if "int16_macs" in table and q.mixed_precision != "auto":
        fail("quantizer.int16_macs is the budget of mixed_precision = \"auto\"; set that too, or drop it")
    if q.int16_cycles is not None:
        if q.mixed_precision != "auto":
            fail("quantizer.int16_cycles is a budget of mixed_precision = \"auto\"; set that too, or drop it")
        if "int16_macs" in table:
            fail("set one budget: quantizer.int16_macs (share of MACs) or quantizer.int16_cycles "
                 "(share of estimated cycles), not both")
    if target is not None and q.implementation != "c7x":
        fail("quantizer.target searches our quantizer's recipes: it needs implementation = \"c7x\"")
    if q.mixed and dtype != "int8":
        fail(f"mixed precision (int16_layers / mixed_precision) needs dtype = \"int8\"; "
             f"dtype = {dtype!r} already makes every layer {dtype}")
    return q

def _accuracy_target(fail, table, task: str) -> AccuracyTarget | None:
    """``[quantizer] target = { metric = "...", max | min = number, int16 = bool, max_mcycles =
    number, per_image = share }`` checked against the entry's task (:data:`pipeline.config.ACCURACY_METRICS`);
    ``target = false``: none (a variant's way out of the target its ``extends`` base states)."""
    if table is None or table is False:
        return None
    usage = "quantizer.target must be a table such as { metric = \"logit_error\", max = 0.2 }"
    if not isinstance(table, dict):
        fail(f"{usage}, got {table!r}")
    table = dict(table)
    metric = table.pop("metric", None)
    fits = [m for m, (tasks, _, _) in ACCURACY_METRICS.items() if task in tasks]
    if metric not in ACCURACY_METRICS or task not in ACCURACY_METRICS[metric][0]:
        fail(f"quantizer.target.metric {metric!r} does not score a {task} model; use one of {', '.join(fits)}")
    sense = ACCURACY_METRICS[metric][1]
    bound = table.pop(sense, None)
    if isinstance(bound, bool) or not isinstance(bound, (int, float)) or bound < 0:
        fail(f"quantizer.target needs {sense} = a number >= 0 for metric {metric!r} "
             f"({ACCURACY_METRICS[metric][2]}), got {bound!r}")
    int16 = table.pop("int16", False)
    if not isinstance(int16, bool):
        fail(f"quantizer.target.int16 must be true or false (whether int16 layers may be chosen), got {int16!r}")
    cap = table.pop("max_mcycles", None)
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0):
        fail(f"quantizer.target.max_mcycles must be a positive number (millions of estimated C7x cycles), got {cap!r}")
    floor = table.pop("per_image", None)
    if floor is not None and metric != "detections_matched":
        fail(f"quantizer.target.per_image is a floor of detections_matched on every image; "
             f"metric {metric!r} has none")
    if floor is not None and (isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0 <= floor <= 1):
        fail(f"quantizer.target.per_image must be a share in [0, 1] (of float's detections matched on every "
             f"image with >= {PER_IMAGE_MIN_DETECTIONS}), got {floor!r}")
    if table:
        fail(f"unknown key(s) {sorted(table)} in quantizer.target; allowed: metric, {sense}, int16, max_mcycles"
             + (", per_image" if metric == "detections_matched" else ""))
    return AccuracyTarget(metric=metric, bound=float(bound), int16=int16,
                          max_mcycles=None if cap is None else float(cap),
                          per_image=None if floor is None else float(floor))

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
        _check_field(fail, f"{key}.{k}", fields[k].metadata, v)
    return cls(**table)

def _check_field(fail, key: str, meta, v) -> None:
    """The field's declared rule (:func:`choice`, :func:`interval`, :func:`at_least`)."""
    if "choices" in meta and not any(v == c and type(v) is type(c) for c in meta["choices"]):
        shown = meta["text"] or ", ".join(str(c) for c in meta["choices"] if c is not None)
        fail(f"{key} must be {shown}, got {v!r}" if meta["text"] else f"{key} {v!r} is not supported; use one of {shown}")
    if "interval" in meta and v is not None:
        low, high, low_open = meta["interval"]
        number = isinstance(v, (int, float)) and not isinstance(v, bool)
        if not number or not ((low < v) if low_open else (low <= v)) or not v <= high:
            fail(f"{key} must be in {'(' if low_open else '['}{low}, {high}] ({meta['meaning']}), got {v!r}")
    if "at_least" in meta and (isinstance(v, bool) or not isinstance(v, int) or v < meta["at_least"]):
        fail(f"{key} must be an integer >= {meta['at_least']} ({meta['meaning']}), got {v!r}")

def _check_choice(fail, key: str, value, allowed):
    if value not in allowed:
        fail(f"{key} {value!r} is not supported; use one of {', '.join(allowed)}")

def _preprocess(fail, value) -> PreprocessSpec:
    if isinstance(value, str) and value in PREPROCESS_PRESETS:
        value = PREPROCESS_PRESETS[value]
    if not isinstance(value, dict):
        fail(f"preprocess must be one of {', '.join(map(repr, PREPROCESS_PRESETS))} or a table "
             f"{{resize, crop, mean, std}}, got {value!r}")
    unknown = set(value) - {"resize", "crop", "mean", "std", "letterbox"}
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
    letterbox = merged.get("letterbox", False)
    if not isinstance(letterbox, bool):
        fail(f"preprocess.letterbox must be true or false, got {letterbox!r}")
    if letterbox and not (isinstance(resize, tuple) and resize[0] == resize[1] == merged["crop"]):
        fail(f"preprocess.letterbox needs resize = [S, S] and crop = S (the padded square), "
             f"got resize {resize!r}, crop {merged['crop']!r}")
    return PreprocessSpec(resize=resize, crop=int(merged["crop"]),
                          mean=tuple(float(v) for v in merged["mean"]),
                          std=tuple(float(v) for v in merged["std"]), letterbox=letterbox)

def _pixels(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0
