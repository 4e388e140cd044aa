"""The doit layer: model entries -> one sub-task per model and stage.

Only wiring lives here. Each task's action is ``(run_stage, [stage, payload])``:
a module-level function with plain-data arguments (picklable, so ``doit -n``
with processes works everywhere), which imports the stage module only when the
task runs. Loading the task list imports neither torch nor tvm.

Staleness is doit's own machinery:

- ``file_dep``: the upstream artifact(s), the calibration images, the
  checkpoint, and the pipeline source files the stage runs (so a code change
  re-runs that stage; DVC/Bazel behaviour). doit's MD5 checker ignores a
  ``touch`` and notices added or removed files.
- ``uptodate=[config_changed(...)]``: the model-entry options and library
  versions the stage depends on, and nothing else (a dtype change re-runs
  prepare onward, not export; a calibration option re-runs calibrate onward).
- Outputs are written atomically by the stages, and doit records a task only
  after it succeeded, so a failed or killed stage is re-run next time.
- ``uptodate=[StampCheck(...)]``: doit forgets a killed run; each stage's
  input stamp (``pipeline.stamps``) remembers which inputs made the outputs
  on disk, so undoing a change after a kill cannot pass them off as current.
- Deterministic outputs give early cutoff: a byte-identical artifact does not
  invalidate the stages after it.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

from doit.exceptions import TaskFailed
from doit.tools import config_changed

from . import stamps
from .config import InvalidModel, ModelSpec, list_images, load_models
from .errors import PipelineError, WeightsNotFoundError
from .weights import missing_weights_message, resolve_weights

PKG = Path(__file__).resolve().parent
STAGES = ("export", "prepare", "calibrate", "convert", "relax_import", "codegen",
          "host_build", "verify", "evaluate", "cross_compile")

# Pipeline sources each stage executes (files or folders, relative to pipeline/).
STAGE_CODE = {
    "export": ["stages/export.py", "torchenv.py", "weights.py"],
    "prepare": ["stages/prepare.py", "torchenv.py", "quant"],
    "calibrate": ["stages/calibrate.py", "stages/prepare.py", "torchenv.py", "quant", "data"],
    "convert": ["stages/convert.py", "stages/prepare.py", "torchenv.py", "quant"],
    "relax_import": ["stages/relax_import.py", "torchenv.py", "frontend"],
    # The backend's modules share helpers; a change anywhere in it re-runs
    # codegen, and byte-identical output stops the cascade there.
    "codegen": ["stages/codegen.py", "frontend/irmodule_io.py", "backend"],
    "host_build": ["stages/host_build.py", "backend/host.py", "backend/kernels"],
    "verify": ["stages/verify.py", "backend", "data", "torchenv.py"],
    "evaluate": ["stages/evaluate.py", "stages/convert.py", "data", "torchenv.py"],
    "cross_compile": ["stages/cross_compile.py", "toolchain.py", "backend/kernels"],
}
_CODE_SUFFIXES = (".py", ".c", ".h")


def stage_sources(stage: str) -> list[str]:
    """Absolute paths of the pipeline files ``stage`` runs (sorted)."""
    out = []
    for rel in STAGE_CODE[stage]:
        p = PKG / rel
        if p.is_dir():
            out += [str(f) for f in sorted(p.rglob("*")) if f.suffix in _CODE_SUFFIXES
                    and "__pycache__" not in f.parts]
        elif p.exists():
            out.append(str(p))
    return out


def _versions(*dists: str) -> dict[str, str]:
    out = {}
    for d in dists:
        try:
            out[d] = importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            out[d] = "missing"
    return out


class Layout:
    """Artifact paths of one model: everything under ``artifacts/<model>/``."""

    def __init__(self, artifacts: Path, name: str):
        self.dir = artifacts / name
        self.float_pt2 = self.dir / "float.pt2"
        self.export_json = self.dir / "export.json"
        self.prepared = self.dir / "prepared.pt"
        self.prepared_table = self.dir / "prepared_observers.txt"
        self.calibrated = self.dir / "calibrated.pt"
        self.calibration_json = self.dir / "calibration.json"
        self.quantized_pt2 = self.dir / "quantized.pt2"
        self.relax_script = self.dir / "relax" / "module.py"
        self.relax_params = self.dir / "relax" / "params.bin"
        self.report = self.dir / "report.json"
        self.verify = self.dir / "verify.json"
        self.cross = self.dir / "c7x"

    def stamp(self, stage: str) -> Path:
        """Input stamp of ``stage`` (see pipeline.stamps)."""
        return self.dir / ".stamps" / f"{stage}.json"

    def codegen_dir(self, variant: str) -> Path:
        """Generated C of one build variant ("mmalib" or "scalar")."""
        return self.dir / "c" / variant

    def host_exe(self, variant: str) -> Path:
        return self.dir / "host" / f"{variant}.exe"


def variants(spec: ModelSpec) -> list[str]:
    """Builds made for a model: the MMALIB build (if enabled) and the scalar baseline."""
    return ["mmalib", "scalar"] if spec.codegen.mmalib else ["scalar"]


CODEGEN_FILES = ("model.c", "model.h", "tvm_kernels.c", "weights.bin", "manifest.json", "lowered.py",
                 "c7x_kernels.h", "c7x_tvm_shim.h")


def run_stage(stage: str, payload: dict, stamp: dict | None = None):
    """doit action: run one stage; user-facing errors become a one-line failure.

    ``stamp`` ({"path", "digest", "deps"}): the stage's input stamp is removed
    first and rewritten after success (see :mod:`pipeline.stamps`)."""
    from .stages import runner
    if stamp:
        stamps.invalidate(stamp["path"])
    try:
        runner.run(stage, payload)
    except PipelineError as e:
        return TaskFailed(f"{stage}: {e}")
    except Exception as e:  # a bug, or bad input we do not recognise yet: keep the traceback
        log = _save_traceback(stage, payload, stamp)
        return TaskFailed(f"{stage}: model {payload['spec']['name']!r}: unexpected {type(e).__name__}: "
                          f"{str(e).strip().splitlines()[0][:200] if str(e).strip() else ''} "
                          f"(traceback in {log}; please report it)")
    if stamp:
        stamps.write_stamp(stamp["path"], stamp["digest"], stamp["deps"])
    return None


def _save_traceback(stage: str, payload: dict, stamp: dict | None) -> Path:
    import traceback
    base = Path(stamp["path"]).parent.parent if stamp else Path(payload["root"])
    log = base / "logs" / f"{stage}.traceback.txt"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(traceback.format_exc())
    return log


def _fail_config(message: str):
    """doit action of an invalid model entry: fail with the validation message."""
    return TaskFailed(message)


class Project:
    """Model entries of one project and the doit tasks that build them."""

    def __init__(self, models_dir="models", artifacts_dir="artifacts", calib_root="calib_data",
                 root: str | Path | None = None):
        self.root = Path(root) if root else Path(models_dir).resolve().parent
        self.models_dir = self._abs(models_dir)
        self.artifacts = self._abs(artifacts_dir)
        self.calib_root = self._abs(calib_root)
        self.entries = load_models(self.models_dir)
        self.weights: dict[str, Path | None] = {}
        self.skipped: dict[str, str] = {}
        for spec in self.valid():
            try:
                self.weights[spec.name] = resolve_weights(spec, self.root)
            except WeightsNotFoundError:
                if spec.weights.optional:
                    self.skipped[spec.name] = missing_weights_message(spec, self.root)

    def _abs(self, p) -> Path:
        p = Path(p)
        return p if p.is_absolute() else self.root / p

    def valid(self) -> list[ModelSpec]:
        return [e for e in self.entries if isinstance(e, ModelSpec)]

    def built(self) -> list[ModelSpec]:
        """Models the default run builds (valid and not skipped)."""
        return [s for s in self.valid() if s.name not in self.skipped]

    # ---- task dictionaries -------------------------------------------------

    def _task(self, stage, spec, file_dep, targets, config, payload, doc):
        deps = [str(p) for p in file_dep] + stage_sources(stage)
        stamp = {"path": str(Layout(self.artifacts, spec.name).stamp(stage)),
                 "digest": stamps.config_digest(config), "deps": deps}
        return {
            "name": spec.name,
            "actions": [(run_stage, [stage, payload, stamp])],
            "file_dep": deps,
            "targets": [str(t) for t in targets],
            "uptodate": [config_changed(config), stamps.StampCheck(stamp["path"], stamp["digest"])],
            "clean": True,
            "doc": doc + (" [skipped by default: weights not found]" if spec.name in self.skipped else ""),
        }

    def _payload(self, spec: ModelSpec, **paths) -> dict:
        return {"spec": spec.to_dict(), "root": str(self.root),
                **{k: (str(v) if isinstance(v, Path) else v) for k, v in paths.items()}}

    def _images(self, set_name: str) -> list[Path]:
        return list_images(self.calib_root / set_name)

    def stage_tasks(self, stage: str):
        """Yield the doit sub-tasks of ``stage``, one per model entry."""
        for entry in self.entries:
            if isinstance(entry, InvalidModel):
                yield {"name": entry.name, "actions": [(_fail_config, [str(entry.error)])],
                       "uptodate": [False], "doc": f"invalid entry {entry.source}"}
                continue
            task = getattr(self, f"_{stage}")(entry, Layout(self.artifacts, entry.name))
            if task is not None:
                yield task

    def _builder_sources(self, spec) -> list[Path]:
        """The project's own builder module (e.g. mynets.py next to dodo.py), found by
        path so nothing is imported; library builders (torchvision) are tracked by version."""
        parts = spec.builder.partition(":")[0].split(".")
        base = self.root.joinpath(*parts)
        if base.with_suffix(".py").is_file():
            return [base.with_suffix(".py")]
        if (base / "__init__.py").is_file():
            return sorted(base.rglob("*.py"))
        return []

    def _export(self, spec, L):
        w = self.weights.get(spec.name)
        cfg = {"builder": spec.builder, "kwargs": spec.builder_kwargs, "shape": spec.input_shape,
               "pretrained": spec.weights.pretrained, **_versions("torch", "torchvision")}
        deps = ([w] if w else []) + self._builder_sources(spec)
        return self._task("export", spec, deps, [L.float_pt2, L.export_json], cfg,
                          self._payload(spec, weights=w, out=L.float_pt2, info=L.export_json),
                          f"export {spec.builder} -> {L.float_pt2.name}")

    def _quant_cfg(self, spec):
        return {"dtype": spec.dtype, "quantizer": spec.quantizer.__dict__, **_versions("torchao")}

    def _prepare(self, spec, L):
        return self._task("prepare", spec, [L.float_pt2], [L.prepared, L.prepared_table],
                          self._quant_cfg(spec),
                          self._payload(spec, float_pt2=L.float_pt2, out=L.prepared, table=L.prepared_table),
                          f"prepare_pt2e with C7xMMAQuantizer({spec.dtype})")

    def _calibrate(self, spec, L):
        cal = spec.calibration
        images = self._images(cal.set) if cal.source == "images" else []
        cfg = {**self._quant_cfg(spec), "calibration": cal.__dict__, "preprocess": spec.preprocess.__dict__,
               "images": [p.name for p in images]}
        return self._task("calibrate", spec, [L.float_pt2, L.prepared, L.prepared_table, *images],
                          [L.calibrated, L.calibration_json], cfg,
                          self._payload(spec, float_pt2=L.float_pt2, prepared=L.prepared,
                                        table=L.prepared_table, calib_dir=self.calib_root / cal.set,
                                        out=L.calibrated, info=L.calibration_json),
                          f"calibrate on calib_data/{cal.set} ({cal.observer})")

    def _convert(self, spec, L):
        cfg = {**self._quant_cfg(spec), "observer": spec.calibration.observer}
        return self._task("convert", spec, [L.float_pt2, L.calibrated], [L.quantized_pt2], cfg,
                          self._payload(spec, float_pt2=L.float_pt2, calibrated=L.calibrated,
                                        out=L.quantized_pt2),
                          "convert_pt2e + re-export -> quantized.pt2")

    def _relax_import(self, spec, L):
        return self._task("relax_import", spec, [L.quantized_pt2], [L.relax_script, L.relax_params],
                          _versions("torch", "apache-tvm"),
                          self._payload(spec, quantized_pt2=L.quantized_pt2, script=L.relax_script,
                                        params=L.relax_params),
                          "from_exported_program -> relax/module.py + params.bin")

    def _codegen_targets(self, spec, L):
        extra = ("weights_data.c",) if spec.codegen.weights_format == "c_array" else ()
        return [L.codegen_dir(v) / f for v in variants(spec) for f in CODEGEN_FILES + extra]

    def _codegen(self, spec, L):
        cfg = {"codegen": spec.codegen.__dict__, "name": spec.name, **_versions("apache-tvm")}
        return self._task("codegen", spec, [L.relax_script, L.relax_params],
                          self._codegen_targets(spec, L), cfg,
                          self._payload(spec, script=L.relax_script, params=L.relax_params,
                                        out_dirs={v: str(L.codegen_dir(v)) for v in variants(spec)}),
                          "MMALIB offload + static C + weights.bin (+ scalar baseline)")

    def _host_build(self, spec, L):
        record = L.dir / "host" / "build.json"
        return self._task("host_build", spec, self._codegen_targets(spec, L),
                          [L.host_exe(v) for v in variants(spec)] + [record], {"variants": variants(spec)},
                          self._payload(spec, builds={v: [str(L.codegen_dir(v)), str(L.host_exe(v))]
                                                      for v in variants(spec)}, record=record),
                          "gcc host build against the reference kernels")

    def _verify(self, spec, L):
        images = self._images(spec.evaluation_set)
        cfg = {"preprocess": spec.preprocess.__dict__, "images": [p.name for p in images]}
        deps = [L.float_pt2, L.quantized_pt2] + self._codegen_targets(spec, L) + \
            [L.host_exe(v) for v in variants(spec)] + images
        return self._task("verify", spec, deps, [L.verify], cfg,
                          self._payload(spec, float_pt2=L.float_pt2, quantized_pt2=L.quantized_pt2,
                                        images_dir=self.calib_root / spec.evaluation_set,
                                        builds={v: [str(L.codegen_dir(v)), str(L.host_exe(v))]
                                                for v in variants(spec)}, out=L.verify),
                          "host C vs Python integer reference vs PyTorch Q/DQ")

    def _evaluate(self, spec, L):
        images = self._images(spec.evaluation_set)
        cfg = {"preprocess": spec.preprocess.__dict__, "images": [p.name for p in images],
               "calibration_set": spec.calibration.set, "source": spec.calibration.source}
        return self._task("evaluate", spec, [L.float_pt2, L.quantized_pt2, L.calibration_json, L.export_json,
                                             *images],
                          [L.report], cfg,
                          self._payload(spec, float_pt2=L.float_pt2, quantized_pt2=L.quantized_pt2,
                                        export_info=L.export_json,
                                        calibration=L.calibration_json,
                                        images_dir=self.calib_root / spec.evaluation_set,
                                        out=L.report),
                          "float vs quantized top-1 on the labeled images")

    def _cross_compile(self, spec, L):
        mm = variants(spec)[0]
        cgt = os.environ.get("TI_CGT_C7000_PATH", "")
        files = self._codegen_targets(spec, L)
        files = [f for f in files if f.parent == L.codegen_dir(mm)]
        c_sources = [f.name for f in files if f.suffix == ".c"]
        from .stages.cross_compile import outputs  # light: no torch/tvm
        return self._task("cross_compile", spec, files, [L.cross / f for f in outputs(spec.name, c_sources)],
                          {"cgt": cgt, "mmalib": os.environ.get("MMALIB_PATH", "")},
                          self._payload(spec, codegen_dir=L.codegen_dir(mm), out=L.cross),
                          "TI cl7x compile of the generated C (needs TI_CGT_C7000_PATH)")

    def summary_task(self):
        """Write ``summary.json`` once any model's numbers changed (the reporter prints)."""
        built = self.built()
        deps = []
        for spec in built:
            L = Layout(self.artifacts, spec.name)
            deps += [L.report, L.verify] + [L.codegen_dir(v) / "manifest.json" for v in variants(spec)]
        payload = self.summary_payload()
        return {"actions": [(run_summary, [payload])], "file_dep": [str(d) for d in deps]
                + stage_sources_summary(), "targets": [str(self.artifacts / "summary.json")],
                "uptodate": [config_changed({"models": payload["models"], "skipped": sorted(self.skipped)})],
                "clean": True, "doc": "accuracy, offload and verify numbers of every model (summary.json)"}

    def summary_payload(self) -> dict:
        """What the summary task and the reporter read (plain data)."""
        built = self.built()
        return {"models": [s.name for s in built], "artifacts": str(self.artifacts),
                "skipped": self.skipped, "variants": {s.name: variants(s) for s in built},
                "invalid": {e.name: str(e.error) for e in self.entries if isinstance(e, InvalidModel)}}

    def doit_config(self) -> dict:
        self.artifacts.mkdir(parents=True, exist_ok=True)  # doit keeps its state DB there
        default = ["summary"] + [f"export:{e.name}" for e in self.entries if isinstance(e, InvalidModel)]
        if os.environ.get("TI_CGT_C7000_PATH"):
            default += [f"cross_compile:{s.name}" for s in self.built()]
        from .console import C7xReporter
        reporter = type("C7xReporter", (C7xReporter,), {"payload": self.summary_payload()})
        return {"default_tasks": default, "continue": True, "reporter": reporter,
                "dep_file": str(self.artifacts / ".doit.db"), "action_string_formatting": "new"}

    def namespace(self) -> dict:
        """``task_*`` creators and ``DOIT_CONFIG`` for a dodo module's globals."""
        ns = {"DOIT_CONFIG": self.doit_config()}
        for stage in STAGES:
            ns[f"task_{stage}"] = _creator(self, stage)
        ns["task_summary"] = lambda: self.summary_task()
        ns["task_summary"].__doc__ = "accuracy / offload / verify numbers of every model"
        return ns


_STAGE_DOCS = {
    "export": "torch.export the float model (float.pt2)",
    "prepare": "prepare_pt2e with the C7x quantizer (observer placement)",
    "calibrate": "run the calibration JPEGs through the observers",
    "convert": "convert_pt2e to the Q/DQ program (quantized.pt2)",
    "relax_import": "import the Q/DQ program into TVM Relax",
    "codegen": "MMALIB offload + static C + weights.bin",
    "host_build": "build the generated C on the host with gcc",
    "verify": "bit-exactness and accuracy of the host build",
    "evaluate": "float vs quantized accuracy report",
    "cross_compile": "TI cl7x cross-compile (needs TI_CGT_C7000_PATH)",
}


def _creator(project: Project, stage: str):
    def create():
        yield {"basename": stage, "name": None, "doc": _STAGE_DOCS[stage]}
        yield from project.stage_tasks(stage)
    create.__name__ = f"task_{stage}"
    create.__doc__ = _STAGE_DOCS[stage]
    return create


def stage_sources_summary() -> list[str]:
    return [str(PKG / "stages" / "summary.py")]


def run_summary(payload: dict):
    """doit action of the summary task."""
    from .stages import summary
    try:
        summary.summarize(payload)
    except PipelineError as e:
        return TaskFailed(f"summary: {e}")
    return None


def load_project(models_dir="models", artifacts_dir="artifacts", calib_root="calib_data",
                 root: str | Path | None = None) -> dict:
    """Everything a dodo file needs: ``globals().update(load_project("models"))``.

    Paths are relative to ``root`` (default: the folder holding ``models_dir``).
    Models the default run skips (optional weights missing) are named in the
    summary printed at the end of the run.
    """
    return Project(models_dir, artifacts_dir, calib_root, root).namespace()
