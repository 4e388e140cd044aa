"""Stage ``export``: model builder + checkpoint -> float ExportedProgram (``float.pt2``)."""

from __future__ import annotations

import importlib
import pickle
import re
import sys
from pathlib import Path

import torch
from torch.export import Dim

from .. import torchenv
from ..config import ModelSpec
from ..errors import CalibrationDataError, ConfigError, UnsupportedOpError, WeightsNotFoundError, brief
from ..frontend.provenance import tag_program
from ..fsutil import portable_path, write_json, write_text
from ..weights import check_weights_hash, resolve_weights


# Calibration may batch images, so the float program keeps the batch dim
# dynamic; convert re-exports with the static batch-1 shape of the entry point.
MAX_BATCH = 1024


def build_model(spec: ModelSpec, weights: Path | None, root: Path) -> tuple[torch.nn.Module, str | None]:
    """Instantiate ``spec.builder`` and load ``weights`` (``weights_only=True``).

    Returns the module in eval mode and the checkpoint's sha256 (None for a
    random init). Raises :class:`ConfigError` for an unknown builder,
    :class:`WeightsNotFoundError` for a checkpoint that does not fit.
    """
    module_name, _, attr = spec.builder.partition(":")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))  # builders may live in the project's models/ folder
    try:
        builder = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{spec.source} (model {spec.name!r}): builder {spec.builder!r} not found "
                          f"({e}); use 'module:callable', e.g. 'torchvision.models:mobilenet_v2'") from None
    model = _instantiate(spec, builder)
    digest = None
    if weights is not None:
        digest = check_weights_hash(spec, weights)
        _check_pinned(spec, weights, digest)
        if spec.weights.format == "ultralytics":
            _load_ultralytics(spec, model, weights, digest)
        elif spec.weights.format == "onnx":
            _load_onnx(spec, model, weights)
        else:
            _load_checkpoint(spec, model, weights)
    return model.eval(), digest


def _instantiate(spec: ModelSpec, builder) -> torch.nn.Module:
    fix = f"check 'builder' and 'builder_kwargs' in {spec.source}"
    torch.manual_seed(0)  # random-init models (tests) are reproducible
    try:
        model = builder(**spec.builder_kwargs)
    except TypeError as e:
        raise ConfigError(f"model {spec.name!r}: builder {spec.builder!r} cannot be called with "
                          f"builder_kwargs {spec.builder_kwargs} ({e}); {fix}") from None
    except Exception as e:  # the user's builder failed: its own error, in one line
        raise ConfigError(f"model {spec.name!r}: builder {spec.builder!r} raised {brief(e)}; fix the "
                          f"builder or {fix}") from None
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"model {spec.name!r}: builder {spec.builder!r} returned a "
                          f"{type(model).__name__}, not a torch.nn.Module; {fix}")
    return model


#: the one-time conversion of a checkpoint that pickles whole objects (ultralytics' .pt)
CONVERT_HINT = ("save it with torch.save(model.state_dict(), path); for an ultralytics checkpoint "
                "you trust run once: python -m pipeline.tools.yolo_state_dict {file}")


def _load_checkpoint(spec: ModelSpec, model: torch.nn.Module, weights: Path) -> None:
    """Load a plain state_dict file with ``weights_only=True`` (never unpickle objects).

    Raises :class:`WeightsNotFoundError` in one line: a pickle of objects
    (torch's weights-only unpickler refuses its globals) says how to convert
    it; a state dict of another architecture names the first mismatched key.
    """
    hint = CONVERT_HINT.format(file=weights)
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # "Weights only load failed ... Unsupported global: GLOBAL ..."
        glob = re.search(r"GLOBAL ([\w.]+)", str(e))
        what = f"it pickles Python objects ({glob.group(1)})" if glob else "it pickles Python objects"
        raise WeightsNotFoundError(f"model {spec.name!r}: {weights} is not a plain state_dict: {what}, "
                                   f"which is never unpickled; {hint}") from None
    except Exception as e:  # EOFError (an empty file), zip errors: all "not a checkpoint"
        raise WeightsNotFoundError(
            f"model {spec.name!r}: {weights} is not a loadable state_dict checkpoint "
            f"({brief(e)}); {hint}") from None
    if not isinstance(state, dict):
        raise WeightsNotFoundError(f"model {spec.name!r}: {weights} holds a {type(state).__name__}, "
                                   f"not a state_dict; {hint}")
    _load_state(spec, model, weights, state)


def _load_state(spec: ModelSpec, model: torch.nn.Module, weights: Path, state: dict) -> None:
    """Load ``state`` (the keys under ``weights.strip_prefix``, without it) into ``model``;
    :class:`WeightsNotFoundError` naming the first key that does not fit."""
    prefix = spec.weights.strip_prefix
    if prefix:
        state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    mismatch = first_mismatch(model.state_dict(), state)
    if mismatch:
        raise WeightsNotFoundError(f"model {spec.name!r}: {weights} does not fit builder "
                                   f"{spec.builder}: {mismatch}; use a checkpoint of this architecture")
    model.load_state_dict(state)


def _load_onnx(spec: ModelSpec, model: torch.nn.Module, weights: Path) -> None:
    """Load the initializers of the ONNX file ``weights`` (``[weights] format = "onnx"``,
    :func:`pipeline.tools.onnx_weights.read_state_dict`: parsed, never run)."""
    from ..errors import PipelineError
    from ..tools.onnx_weights import read_state_dict

    try:
        state = read_state_dict(weights)
    except PipelineError as e:
        raise WeightsNotFoundError(f"model {spec.name!r}: {e}") from None
    _load_state(spec, model, weights, state)


def _check_pinned(spec: ModelSpec, weights: Path, digest: str) -> None:
    """Refuse (one line) a checkpoint whose sha256 is not the entry's pinned ``weights.sha256``,
    before a byte of it is unpickled."""
    if spec.weights.sha256 is None or digest == spec.weights.sha256:
        return
    own = (f"{CONVERT_HINT.format(file=weights)}, then set weights.path and format = \"state_dict\""
           if spec.weights.format == "ultralytics" else "set weights.path and remove weights.sha256")
    raise WeightsNotFoundError(
        f"model {spec.name!r}: {weights} has sha256 {digest[:16]}..., not the pinned "
        f"{spec.weights.sha256[:16]}... of {spec.source}; it is not loaded. For a checkpoint of your own: {own}")


def _load_ultralytics(spec: ModelSpec, model: torch.nn.Module, weights: Path, digest: str) -> None:
    """Load the pinned ultralytics checkpoint ``weights`` (``[weights] format = "ultralytics"``):
    only when its sha256 is ``weights.sha256``, and then by the allow-listed weights-only
    unpickler (:func:`pipeline.tools.yolo_state_dict.load_checkpoint`). Raises
    :class:`WeightsNotFoundError` in one line otherwise."""
    from ..errors import PipelineError
    from ..tools.yolo_state_dict import load_checkpoint

    try:
        state = load_checkpoint(weights)
    except PipelineError as e:
        raise WeightsNotFoundError(f"model {spec.name!r}: {e}") from None
    _load_state(spec, model, weights, state)


def first_mismatch(expected: dict, state: dict) -> str | None:
    """The first key (in the model's order) that is missing from ``state`` or has another
    shape, else the first key ``state`` has and the model lacks; None when they fit."""
    for key, value in expected.items():
        if key not in state:
            return f"first mismatched key {key!r} (missing from the checkpoint)"
        got = getattr(state[key], "shape", None)
        if got != value.shape:
            return (f"first mismatched key {key!r} (checkpoint {list(got) if got is not None else type(state[key]).__name__}, "
                    f"model {list(value.shape)})")
    extra = [k for k in state if k not in expected]
    return f"first mismatched key {extra[0]!r} (not in the model)" if extra else None


def export_model(spec: ModelSpec, weights: Path | None, out: Path, root: Path,
                 out_info: Path | None = None, calib_dir: Path | None = None) -> dict:
    """Export the float model to ``out`` with ``torch.export.save``; record the
    checkpoint actually loaded (path, sha256) in ``out_info`` (JSON).

    Input: float32 NCHW ``spec.input_shape``, batch dim dynamic (1..1024).
    ``weights`` None means "look it up now" (random init when the entry says
    ``pretrained = false``); raises :class:`WeightsNotFoundError` when none is found.
    ``calib_dir``: the calibration set, read only with ``[weights]
    reestimate_batchnorm = true`` or ``logit_std`` (the calibration selection,
    preprocessed as the entry says; raises :class:`CalibrationDataError` when it
    selects fewer than 2 images).
    """
    if weights is None:
        weights = resolve_weights(spec, root)
    model, digest = build_model(spec, weights, root)
    # no model name: variants of one network share this output (run-cache, Stage.shared)
    info = {"builder": spec.builder, "pretrained": weights is not None,
            "weights": portable_path(weights, root) if weights else None, "sha256": digest}
    if spec.weights.reestimate_batchnorm or spec.weights.logit_std is not None:
        info["batchnorm_reestimated_on"] = _make_realistic(spec, model, calib_dir)
    ep = _export(spec, model, out)
    info["layers_tagged"] = tag_program(ep, str(Path(root).resolve()))  # module paths survive PT2E and re-export
    torchenv.save_program(ep, out)
    if out_info is not None:
        write_json(out_info, info)
    return info


def _export(spec: ModelSpec, model: torch.nn.Module, out: Path) -> torch.export.ExportedProgram:
    """torch.export of ``model`` with a dynamic batch (1..MAX_BATCH). What torch prints meanwhile
    is held back; when export fails it goes to ``export-error.log`` beside ``out`` and the
    :class:`UnsupportedOpError` (one line) names that file; on success it is printed as usual."""
    example = torch.randn(2, *spec.input_shape[1:])
    report: list[str] = []
    try:
        with torch.no_grad(), torchenv.quiet_output(report):
            ep = torch.export.export(model, (example,), dynamic_shapes=({0: Dim("batch", min=1, max=MAX_BATCH)},))
    except Exception as e:  # data-dependent control flow, unsupported Python: torch's long report
        log = Path(out).parent / "export-error.log"
        write_text(log, "".join(report) + f"\n{type(e).__name__}: {e}\n")
        raise UnsupportedOpError(
            f"model {spec.name!r}: torch.export cannot trace {spec.builder!r} with input "
            f"{list(spec.input_shape)} and a dynamic batch ({brief(e)}); make forward() traceable "
            f"(no Python branch on tensor values; see torch.export's documentation; torch's full "
            f"report: {log})") from None
    (Path(out).parent / "export-error.log").unlink(missing_ok=True)   # a past failure's report
    sys.stderr.write("".join(report))
    return ep


def _make_realistic(spec: ModelSpec, model: torch.nn.Module, calib_dir: Path | None) -> dict:
    """A random-weight model made realistic on the calibration selection: BatchNorm
    statistics re-estimated and / or the classifier scaled (``[weights]``,
    :func:`pipeline.models.random_weights.make_realistic`). Raises
    :class:`CalibrationDataError` naming the folder when it selects fewer than 2 images
    (the statistics of one image are degenerate after global pooling)."""
    from ..data.images import load_images, select_images
    from ..models.random_weights import make_realistic
    paths = select_images(calib_dir, spec.calibration, spec.name)
    if len(paths) < 2:
        raise CalibrationDataError(
            f"model {spec.name!r}: {calib_dir} selects {len(paths)} image; re-estimating BatchNorm or "
            f"scaling the classifier needs at least 2: add images or raise calibration.num_images")
    x = load_images(paths, spec.preprocess, desc=f"batchnorm {spec.name}", model=spec.name)
    w = spec.weights
    done = make_realistic(model, x, reestimate=w.reestimate_batchnorm, batch=w.batchnorm_batch,
                          logit_std=w.logit_std)
    return {"set": spec.calibration.set, "images": len(paths), **done}
