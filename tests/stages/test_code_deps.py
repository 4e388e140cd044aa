"""Derived code dependencies (pipeline/code_deps.py, issue 29): every
pipeline module a stage loads when it runs is in its closure, and every data
file of the package is declared by the module that reads it."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import pytest

from doitproj import Project, build_through
from pipeline import code_deps
from pipeline.stages.registry import STAGES

PKG = code_deps.PKG
REPO = PKG.parent

CHILD = r'''
import importlib, json, pickle, sys
func, args = pickle.load(open(sys.argv[1], "rb"))  # loads pipeline.config (the spec) too
module, _, name = func.partition(":")
getattr(importlib.import_module(module), name)(**args)  # as Stage.function(), without the registry
print("MODULES=" + json.dumps(sorted(m.__file__ for n, m in list(sys.modules.items())
                                     if n.startswith("pipeline") and getattr(m, "__file__", None))))
'''


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("code-deps")
    p = Project(root)
    p.add_images("s", 2)
    p.add_model("tiny", "s")
    return build_through(root, "visualize")


def test_every_data_file_of_the_package_is_declared():
    declared = set()
    for f in PKG.rglob("*.py"):
        module = ".".join(("pipeline",) + f.relative_to(PKG).with_suffix("").parts).removesuffix(".__init__")
        declared |= set(code_deps.data_files(module))
    data = {f.resolve() for f in PKG.rglob("*") if f.is_file() and f.suffix not in (".py", ".pyc")
            and "__pycache__" not in f.parts}
    assert data and sorted(data - declared) == []


def test_relative_and_absolute_imports_resolve():
    imports = code_deps.imports("pipeline.stages.export")
    assert {"pipeline.torchenv", "pipeline.frontend.provenance", "pipeline.fsutil"} <= imports
    assert all(code_deps.module_file(m) for m in imports)
    assert PKG / "__init__.py" in code_deps.closure("pipeline.stages.export")


def test_an_import_in_a_docstring_adds_no_dependency():
    # pipeline/__init__.py's usage example names pipeline.tasks: read as an import it
    # made every stage depend on the task layer and the C kernels (an edit of
    # c7x_kernels_ref.c re-ran export)
    assert "from pipeline.tasks import" in (PKG / "__init__.py").read_text()
    export = code_deps.closure("pipeline.stages.export")
    assert not [p for p in export if "tasks" in p.parts or p.suffix in (".c", ".h")]
    # codegen copies the kernels' header; the host builds compile their C
    assert PKG / "backend" / "kernels" / "c7x_kernels.h" in code_deps.closure("pipeline.stages.codegen")
    assert PKG / "backend" / "kernels" / "c7x_kernels_ref.c" in code_deps.closure("pipeline.stages.host_build")


# what unpickling the arguments loads (the ModelSpec) before the stage runs
_UNPICKLE = {"pipeline", "pipeline.config", "pipeline.errors"}


@pytest.mark.parametrize("stage", [s for s in STAGES if s.name != "cross_compile"], ids=lambda s: s.name)
def test_every_module_a_stage_loads_is_in_its_closure(built, stage, tmp_path):
    """Runs the stage function in a fresh interpreter and lists the pipeline modules
    it loaded: each must be a code dependency (else editing it would not re-run it)."""
    ctx = built
    if not stage.applies(ctx):
        pytest.skip(f"{stage.name} does not apply to the tiny int8 model")
    job = tmp_path / "job.pkl"
    job.write_bytes(pickle.dumps((stage.func, stage.args(ctx))))
    run = subprocess.run([sys.executable, "-c", CHILD, str(job)], cwd=REPO, capture_output=True, text=True,
                         timeout=600, env={**__import__("os").environ, "PYTHONPATH": f"{REPO}:{ctx.root}"})
    assert run.returncode == 0, run.stderr[-3000:]
    loaded = json.loads(run.stdout.split("MODULES=")[-1])
    unpickled = {str(code_deps.module_file(m)) for m in _UNPICKLE}
    closure = set(stage.sources())
    missing = sorted(f for f in loaded if f not in closure and f not in unpickled)
    assert missing == [], f"{stage.name} loads modules outside its closure"


def test_holdout_depends_on_the_code_of_every_stage_its_folds_run():
    from pipeline.stages.folds import FOLD_STAGES
    from pipeline.stages.registry import BY_NAME
    holdout = set(BY_NAME["holdout"].sources())
    for name in FOLD_STAGES:
        assert set(BY_NAME[name].sources()) <= holdout, name


def test_closures_kept_between_runs_follow_every_edit(tmp_path, monkeypatch):
    """The closures stored in the user's cache folder are used only for the exact sources
    they were computed from; a broken store is ignored."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for f in (code_deps._store, code_deps.closure):
        f.cache_clear()
    first = code_deps.closure("pipeline.stages.estimate")
    stored = json.loads(code_deps._store_path().read_text())
    assert stored["closures"]["pipeline.stages.estimate"] == [str(p) for p in first]
    # a store of other sources (another digest) is not used
    stored["closures"]["pipeline.stages.estimate"] = ["/nowhere.py"]
    stored["digest"] = "0" * 64
    code_deps._store_path().write_text(json.dumps(stored))
    for f in (code_deps._store, code_deps.closure):
        f.cache_clear()
    assert code_deps.closure("pipeline.stages.estimate") == first
    code_deps._store_path().write_text("{not json")
    for f in (code_deps._store, code_deps.closure):
        f.cache_clear()
    assert code_deps.closure("pipeline.stages.estimate") == first
    for f in (code_deps._store, code_deps.closure):
        f.cache_clear()
