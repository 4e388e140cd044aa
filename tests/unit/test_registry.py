"""The stage registry is the one place a stage is declared (issue 8).

Each record must be runnable as declared: its function imports, accepts
exactly the keyword arguments the record hands it, its code paths exist, and
its tracked parameters name real model-entry fields. The package keeps its
import layers (``docs/architecture.md``, "Layering").
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from pipeline.entries import load_models
from pipeline.layout import Layout
from pipeline.stages import registry
from pipeline.stages.context import StageContext
from pipeline.stages.registry import PKG, STAGES

REPO = PKG.parent


@pytest.fixture(scope="module")
def ctx(tmp_path_factory) -> StageContext:
    spec = next(s for s in load_models(REPO / "models") if s.name == "mobilenet_v2")
    art = tmp_path_factory.mktemp("art")
    return StageContext(spec=spec, layout=Layout(art, spec.name), root=REPO,
                        calib_root=REPO / "calib_data", weights=None)


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.name)
def test_function_accepts_exactly_the_declared_arguments(stage, ctx):
    fn = stage.function()
    args = stage.args(ctx)
    sig = inspect.signature(fn)
    sig.bind(**args)  # raises TypeError on a missing or unknown argument
    required = {n for n, p in sig.parameters.items() if p.default is inspect.Parameter.empty}
    assert required <= set(args), (stage.name, required - set(args))


@pytest.mark.parametrize("stage", STAGES, ids=lambda s: s.name)
def test_code_params_and_paths_are_real(stage, ctx):
    assert stage.sources() and all(Path(p).is_file() for p in stage.sources())
    tracked = stage.tracked(ctx)  # an unknown field raises AttributeError
    assert set(stage.params) <= set(tracked)
    outs = stage.outs(ctx)
    assert outs and all(str(p).startswith(str(ctx.layout.dir)) for p in outs), stage.name
    assert stage.doc and "\n" not in stage.doc and stage.describe(ctx)


def test_stage_order_is_a_dataflow_order(ctx):
    """Every input a stage reads from artifacts/ is written by an earlier stage."""
    made: set[Path] = set()
    for stage in STAGES:
        for dep in stage.deps(ctx):
            if str(dep).startswith(str(ctx.layout.dir)):
                assert dep in made, (stage.name, dep)
        made |= set(stage.outs(ctx))


def test_unknown_stage_names_the_known_ones():
    with pytest.raises(KeyError, match="known: export, search, mixed_precision, prepare"):
        registry.get("exprt")


def test_no_stage_dispatch_on_names():
    """No ``if stage == ...`` chains: the registry is the only dispatch."""
    hits = [p for p in PKG.rglob("*.py") if "if stage ==" in p.read_text()]
    assert hits == []


# Import layers, lowest first. A module may import from its own layer or lower ones; a stage
# module imports no other stage module (what two stages share lives in a library below them).
LAYERS = [
    {"errors", "fsutil", "config", "stamps", "weights", "layout", "toolchain", "torchenv", "assets", "runcache",
     "tvmscript_guard", "tvm_print", "code_deps", "entries"},
    {"target", "data", "models"},          # the SoC description; images and outputs; builders
    {"frontend", "backend"},               # Relax import; offload passes, memory plan, static C
    {"perf", "visualize", "tools"},        # the performance model reads the backend's kernels and plan
    {"quant"},                             # the quantizer and calibration methods (mixed: the perf model)
    {"stages.registry"},                   # the stage records (they name stage functions as strings)
    {"stages"},                            # one module per stage
    {"console", "executor"},
    {"tasks", "predict"},
]


def _layer_key(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != "pipeline":
        return None
    if parts[1] == "stages" and (len(parts) == 2 or parts[2] in ("registry", "context", "folds")):
        return "stages.registry"   # the package's __init__, the records, what they see of a model, the folds
    return parts[1]


def _layer(module: str) -> int:
    key = _layer_key(module)
    for i, names in enumerate(LAYERS):
        if key in names:
            return i
    raise AssertionError(f"{module}: not placed in a layer (add it to LAYERS and docs/architecture.md)")


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module: str) -> set[str]:
    """Every ``pipeline`` module ``path`` imports, at any depth (lazy imports included);
    ``from pkg import name`` counts as ``pkg.name`` when that is a module."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.add(target)
            for a in node.names:
                sub = f"{target}.{a.name}"
                if (REPO / Path(*sub.split("."))).with_suffix(".py").is_file() or \
                        (REPO / Path(*sub.split(".")) / "__init__.py").is_file():
                    out.add(sub)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m.startswith("pipeline.")}


def _violations(modules: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in sorted(modules.items()):
        if module == "pipeline":
            continue
        for target in sorted(targets):
            if target in ("pipeline", module):
                continue
            if _layer(target) > _layer(module):
                bad.append(f"{module} -> {target} (a higher layer)")
            elif _layer_key(module) == _layer_key(target) == "stages":
                bad.append(f"{module} -> {target} (one stage module imports another)")
    return bad


def test_no_module_imports_from_a_higher_layer():
    found = {_module_name(p): _imports(p, _module_name(p)) for p in sorted(PKG.rglob("*.py"))}
    assert _violations(found) == []


def test_the_layer_check_sees_an_upward_lazy_import_and_a_stage_used_as_a_library():
    tree = {"pipeline.backend.levels": {"pipeline.perf.model"},           # backend below perf
            "pipeline.stages.convert": {"pipeline.stages.prepare"},       # a stage module as a library
            "pipeline.stages.holdout": {"pipeline.stages.registry"},      # fine: the records
            "pipeline.perf.model": {"pipeline.target"}}                   # fine: the target is lower
    assert _violations(tree) == ["pipeline.backend.levels -> pipeline.perf.model (a higher layer)",
                                 "pipeline.stages.convert -> pipeline.stages.prepare (one stage module imports "
                                 "another)"]


def test_quant_opts_cover_every_quantizer_field_but_the_int16_choice():
    """Stages after mixed_precision track [quantizer] minus the keys whose effect reaches
    them as int16_layers.json; a new QuantizerSpec field must be added to one of the two."""
    import dataclasses

    from pipeline.config import QuantizerSpec
    from pipeline.stages import registry
    # (target: the search's choice reaches them as search.json, a file dependency)
    choice = {"int16_layers", "mixed_precision", "int16_macs", "int16_cycles", "target"}
    tracked = {p.split(".", 1)[1] for p in registry.QUANT_OPTS if p.startswith("quantizer.")}
    assert tracked | choice == {f.name for f in dataclasses.fields(QuantizerSpec)}
    assert not tracked & choice


def test_the_architecture_documents_stage_table_is_the_registrys():
    """docs/architecture.md shows what each record reads, writes and tracks through a
    generated table; regenerate it with `python -m pipeline.tasks.stage_table --write
    docs/architecture.md` after changing a record."""
    from pipeline.tasks.stage_table import markdown, replace_in
    doc = (REPO / "docs" / "architecture.md").read_text()
    assert markdown() in doc and replace_in(doc) == doc


# The two long files by nature: the numpy twins of every kernel, and the page's script.
LONG_FILES = {"backend/kernels/reference.py", "visualize/page.js"}


def test_no_module_of_the_package_is_over_500_lines():
    long = {str(p.relative_to(PKG)): n for p in sorted(PKG.rglob("*")) if p.suffix in (".py", ".js")
            and (n := len(p.read_text().splitlines())) > 500}
    assert set(long) <= LONG_FILES, long


def test_every_stage_argument_is_named_once():
    """A record names each keyword argument in exactly one of inputs / outputs / options."""
    spec = next(s for s in load_models(REPO / "models") if s.name == "mobilenet_v2_mixed")
    c = StageContext(spec=spec, layout=Layout(REPO / "artifacts", spec.name), root=REPO,
                     calib_root=REPO / "calib_data", weights=None)
    for stage in STAGES:
        named = [list(f(c)) for f in (stage.inputs, stage.outputs, stage.options)]
        flat = [k for names in named for k in names]
        assert len(flat) == len(set(flat)), (stage.name, named)
