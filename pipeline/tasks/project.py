"""Project wiring: model entries x stage records -> doit tasks, in one loop.

Staleness is doit's own machinery (``docs/architecture.md``, "Staleness"):

- ``file_dep``: the record's inputs (upstream artifacts, images, checkpoint)
  plus the pipeline sources the stage runs, so a code change re-runs it.
  doit's MD5 checker ignores a ``touch`` and notices added or removed files.
- ``uptodate=[config_changed(...)]``: the record's tracked parameters and
  nothing else (a dtype change re-runs prepare onward, not export).
- ``uptodate=[StampCheck(...)]``: the stage's input stamp
  (:mod:`pipeline.stamps`) closes the kill-then-undo hole.
- Outputs are written atomically by the stages, and deterministic, so a
  byte-identical artifact stops the cascade (early cutoff).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from doit.tools import config_changed

from .. import runcache, stamps
from ..config import ModelSpec
from ..entries import InvalidModel, load_models
from ..errors import ConfigError, WeightsNotFoundError
from ..fsutil import sweep_leftovers
from ..layout import Layout, variants
from ..target import check_target_spec
from ..stages.context import StageContext
from ..stages.registry import PKG, STAGES, Stage
from ..weights import missing_weights_message, resolve_weights
from . import lock
from .actions import fail_config, run_cache_command, run_stage, run_summary

SKIPPED = " [skipped by default: weights not found]"
BY_NAME_ONLY = " [not in the default run (default_run = false): name the task to build it]"


def _with_target_checked(entry):
    """The entry, or an InvalidModel when its ``[target]`` names no target file or figure."""
    if isinstance(entry, InvalidModel):
        return entry
    try:
        check_target_spec(entry)
    except ConfigError as e:
        return InvalidModel(entry.name, entry.source, e)
    return entry


class Project:
    """Model entries of one project and the doit tasks that build them.

    Paths are relative to ``root`` (default: the folder holding ``models_dir``).
    """

    def __init__(self, models_dir="models", artifacts_dir="artifacts", calib_root="calib_data",
                 root: str | Path | None = None):
        self._contexts: dict[str, StageContext] = {}
        self.root = Path(root) if root else Path(models_dir).resolve().parent
        self.models_dir = self._abs(models_dir)
        self.artifacts = self._abs(artifacts_dir)
        self.calib_root = self._abs(calib_root)
        self.entries = [_with_target_checked(e) for e in load_models(self.models_dir)]
        self.cache_root = runcache.cache_root(self.artifacts)
        try:
            self.cache_limit = runcache.max_bytes()
        except ValueError as e:  # never pruned then; the cache task says so too
            print(f"run-cache: {runcache.MAX_ENV}: {e}; not pruning", file=sys.stderr)
            self.cache_limit = None
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
        """Models the default run builds (valid, not skipped, not ``default_run = false``;
        the tasks of the last still exist and run when named, e.g. ``doit verify:<model>``)."""
        return [s for s in self.valid() if s.name not in self.skipped and s.default_run]

    def context(self, spec: ModelSpec) -> StageContext:
        """What the stage records see for ``spec`` (made once per model: every stage asks)."""
        ctx = self._contexts.get(spec.name)
        if ctx is None or ctx.spec is not spec:
            ctx = StageContext(spec=spec, layout=Layout(self.artifacts, spec.name), root=self.root,
                               calib_root=self.calib_root, weights=self.weights.get(spec.name),
                               builder_sources=tuple(self._builder_sources(spec)))
            self._contexts[spec.name] = ctx
        return ctx

    def _builder_sources(self, spec: ModelSpec) -> list[Path]:
        """The project's own builder module (e.g. mynets.py next to dodo.py), found by
        path so nothing is imported; library builders (torchvision) are tracked by version."""
        parts = spec.builder.partition(":")[0].split(".")
        base = self.root.joinpath(*parts)
        if base.with_suffix(".py").is_file():
            return [base.with_suffix(".py")]
        if (base / "__init__.py").is_file():
            return sorted(base.rglob("*.py"))
        return []

    # ---- task dictionaries -------------------------------------------------

    def task(self, stage: Stage, spec: ModelSpec) -> dict:
        """The doit sub-task of ``stage`` for ``spec``."""
        ctx = self.context(spec)
        deps = [str(p) for p in stage.deps(ctx)] + stage.sources()
        config = stage.tracked(ctx)
        targets = stage.outs(ctx)
        stamp = {"path": str(ctx.layout.stamp(stage.name)), "digest": stamps.config_digest(config),
                 "deps": deps, "outs": [str(t) for t in targets]}
        action = (run_stage, [stage.name, spec.name, stage.args(ctx), stamp,
                              str(ctx.layout.traceback(stage.name)), self._cache(stage, ctx, targets)])
        return {
            "name": spec.name,
            "actions": [action],
            "file_dep": deps,
            "targets": [str(t) for t in targets],
            "uptodate": [config_changed(config), stamps.StampCheck(stamp["path"], stamp["digest"])],
            "clean": True,
            "doc": stage.describe(ctx) + (SKIPPED if spec.name in self.skipped else "")
            + ("" if spec.default_run else BY_NAME_ONLY),
        }

    def _cache(self, stage: Stage, ctx: StageContext, targets: list[Path]) -> dict | None:
        """The run-cache argument of ``run_stage`` (None: off, or an output outside
        the model's folder, which an entry could not hold)."""
        base = str(ctx.layout.dir) + os.sep   # string prefixes: Path.parents was slow here
        if self.cache_root is None or not all(str(t).startswith(base) for t in targets):
            return None
        return {"root": str(self.cache_root), "base": str(ctx.layout.dir), "shared": stage.shared,
                "outs": [str(t)[len(base):].replace(os.sep, "/") for t in targets],
                "max_bytes": self.cache_limit}

    def stage_tasks(self, stage: Stage):
        """Yield the doit sub-tasks of ``stage``, one per model entry."""
        for entry in self.entries:
            if isinstance(entry, InvalidModel):
                yield {"name": entry.name, "actions": [(fail_config, [str(entry.error)])],
                       "uptodate": [False], "doc": f"invalid entry {entry.source}"}
            elif stage.applies(self.context(entry)):
                yield self.task(stage, entry)

    def summary_task(self, specs: list[ModelSpec] | None = None, group: str | None = None) -> dict:
        """Write ``summary.json`` (a group's: ``<group>_summary.json`` after building its
        models) once any model's numbers changed (the reporter prints). ``specs``: a group's
        members (those skipped for missing weights are only named in the summary)."""
        payload = self.summary_payload(specs, group)
        specs = self.built() if specs is None else [s for s in specs if s.name not in self.skipped]
        deps = []
        for spec in specs:
            L = Layout(self.artifacts, spec.name)
            deps += [L.report, L.verify, L.layers_json, L.holdout, L.estimate, L.calibration_json]
            deps += [L.codegen_dir(v) / "manifest.json" for v in variants(spec)]
            deps += [L.mixed_precision] if spec.quantizer.mixed else []
            deps += [L.search] if spec.quantizer.target else []
        task = {"actions": [(run_summary, [payload])],
                "file_dep": [str(d) for d in deps] + [str(PKG / "stages" / "summary.py")],
                "targets": [str(self.artifacts / payload["summary_file"])],
                "uptodate": [config_changed({"models": payload["models"], "skipped": sorted(payload["skipped"])})],
                "clean": True, "doc": "accuracy, offload and verify numbers of every model (summary.json)"}
        if group:
            task["task_dep"] = self.default_stage_tasks(specs)
            task["doc"] = f"build every model of group {group!r} and print their summary ({group}_summary.json)"
        return task

    def groups(self) -> dict[str, list[ModelSpec]]:
        """Group name -> the valid models whose entry names it (``group = "zoo"``), skipped ones too
        (the group's summary says why: a group whose weights are all missing still answers)."""
        out: dict[str, list[ModelSpec]] = {}
        for spec in self.valid():
            if spec.group:
                out.setdefault(spec.group, []).append(spec)
        return out

    def cache_task(self) -> dict:
        """``doit cache``: the run-cache's size; ``doit cache --max-size 5G`` prunes it."""
        root = str(self.cache_root) if self.cache_root else None
        return {"actions": [(run_cache_command, [root])], "uptodate": [False], "verbosity": 2,
                "params": [{"name": "max_size", "long": "max-size", "type": str, "default": "",
                            "help": "prune to this size first, least recently used first (e.g. 5G)"}],
                "doc": "run-cache size (--max-size 5G: prune it, least recently used first)"}

    def summary_payload(self, specs: list[ModelSpec] | None = None, group: str | None = None) -> dict:
        """What the summary task and the reporter read (plain data) for ``specs`` (default: the
        default run's models) or a ``group``'s."""
        members = [s for s in self.valid() if s.default_run] if specs is None else specs
        built = [s for s in members if s.name not in self.skipped]
        # skipped: those of these models whose optional weights are missing (not the by-name-only ones)
        skipped = {s.name: self.skipped[s.name] for s in members if s.name in self.skipped}
        return {"models": [s.name for s in built], "artifacts": str(self.artifacts),
                "summary_file": f"{group}_summary.json" if group else "summary.json",
                "skipped": skipped, "variants": {s.name: variants(s) for s in built},
                # same network (for the mixed-precision memory comparison) and its kind
                "networks": {s.name: repr((s.builder, sorted(s.builder_kwargs.items()), s.weights.file,
                                           s.weights.path, s.input_shape)) for s in built},
                "kinds": {s.name: "mixed" if s.quantizer.mixed else s.dtype for s in built},
                "invalid": {} if group else {e.name: str(e.error) for e in self.entries if isinstance(e, InvalidModel)}}

    def default_stage_tasks(self, specs: list[ModelSpec]) -> list[str]:
        """``stage:model`` of every stage the default run builds, for each of ``specs``."""
        return [f"{stage.name}:{spec.name}" for spec in specs for stage in STAGES
                if stage.in_default_run() and stage.applies(self.context(spec))]

    def default_tasks(self) -> list[str]:
        """What a bare ``doit`` builds: every default stage of every built model, the
        summary, and the export of each invalid entry (so its error is shown)."""
        return self.default_stage_tasks(self.built()) + ["summary"] + [f"export:{e.name}" for e in self.entries if isinstance(e, InvalidModel)]

    def doit_config(self) -> dict:
        self.artifacts.mkdir(parents=True, exist_ok=True)  # doit keeps its state DB there
        if lock.needs_lock(sys.argv):  # before doit opens that DB (pipeline/tasks/lock.py)
            lock.acquire(self.artifacts)
            sweep_leftovers(self.artifacts)  # what killed runs left; no other run is writing now
        from ..console import C7xReporter
        payloads = {"summary": self.summary_payload(),
                    **{g: self.summary_payload(specs, g) for g, specs in self.groups().items()}}
        reporter = type("C7xReporter", (C7xReporter,), {"payloads": payloads})
        return {"default_tasks": self.default_tasks(), "continue": True, "reporter": reporter,
                "dep_file": str(self.artifacts / ".doit.db"), "action_string_formatting": "new"}

    def namespace(self) -> dict:
        """``task_*`` creators and ``DOIT_CONFIG`` for a dodo module's globals."""
        ns = {"DOIT_CONFIG": self.doit_config()}
        for stage in STAGES:
            ns[f"task_{stage.name}"] = _creator(self, stage)
        ns["task_summary"] = lambda: self.summary_task()
        ns["task_summary"].__doc__ = "accuracy / offload / verify numbers of every model"
        ns["task_cache"] = lambda: self.cache_task()
        ns["task_cache"].__doc__ = "run-cache size; --max-size prunes it"
        for group, specs in self.groups().items():
            if f"task_{group}" not in ns:   # a group named like a stage or command would shadow it
                ns[f"task_{group}"] = (lambda sp, g: lambda: self.summary_task(sp, g))(specs, group)
                ns[f"task_{group}"].__doc__ = f"build every model of group {group!r}, print their summary"
        return ns


def _creator(project: Project, stage: Stage):
    def create():
        yield {"basename": stage.name, "name": None, "doc": stage.doc}
        yield from project.stage_tasks(stage)
    create.__name__ = f"task_{stage.name}"
    create.__doc__ = stage.doc
    return create


def load_project(models_dir="models", artifacts_dir="artifacts", calib_root="calib_data",
                 root: str | Path | None = None) -> dict:
    """Everything a dodo file needs: ``globals().update(load_project("models"))``.

    Paths are relative to ``root`` (default: the folder holding ``models_dir``).
    Models the default run skips (optional weights missing) are named in the
    summary printed at the end of the run.
    """
    return Project(models_dir, artifacts_dir, calib_root, root).namespace()
