"""Dispatch a doit action's plain-data payload to the stage function."""

from __future__ import annotations

from pathlib import Path

from ..config import ModelSpec


def run(stage: str, payload: dict) -> None:
    """Run ``stage`` for the model in ``payload`` (see pipeline.tasks for the keys)."""
    spec = ModelSpec.from_dict(payload["spec"])
    root = Path(payload["root"])
    p = {k: Path(v) if isinstance(v, str) and k not in ("root",) else v for k, v in payload.items()
         if k != "spec"}
    if stage == "export":
        from .export import export_model
        from ..weights import resolve_weights
        weights = p["weights"] if payload.get("weights") else resolve_weights(spec, root)
        export_model(spec, weights, p["out"], root, p["info"])
    elif stage == "prepare":
        from .prepare import prepare_model
        prepare_model(spec, p["float_pt2"], p["out"], p["table"])
    elif stage == "calibrate":
        from .calibrate import calibrate_model
        calibrate_model(spec, p["float_pt2"], p["prepared"], p["table"], p["calib_dir"], p["out"], p["info"])
    elif stage == "convert":
        from .convert import convert_model
        convert_model(spec, p["float_pt2"], p["calibrated"], p["out"])
    elif stage == "relax_import":
        from .relax_import import import_model
        import_model(p["quantized_pt2"], p["script"], p["params"])
    elif stage == "codegen":
        from .codegen import codegen_model
        codegen_model(spec, p["script"], p["params"], {k: Path(v) for k, v in payload["out_dirs"].items()})
    elif stage == "host_build":
        from .host_build import host_build_model
        host_build_model({k: (Path(a), Path(b)) for k, (a, b) in payload["builds"].items()}, p["record"])
    elif stage == "verify":
        from .verify import verify_model
        verify_model(spec, p["float_pt2"], p["quantized_pt2"], p["images_dir"],
                     {k: (Path(a), Path(b)) for k, (a, b) in payload["builds"].items()}, p["out"])
    elif stage == "evaluate":
        from .evaluate import evaluate_model
        evaluate_model(spec, p["float_pt2"], p["quantized_pt2"], p["calibration"], p["export_info"],
                       p["images_dir"], p["out"])
    elif stage == "cross_compile":
        from .cross_compile import cross_compile_model
        cross_compile_model(spec, p["codegen_dir"], p["out"])
    else:
        raise ValueError(f"unknown stage {stage!r}")
