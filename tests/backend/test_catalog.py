"""The kernel catalog is the one declaration of a kernel: its pieces exist and agree.

Each record names a C entry point, an offload pass, a numpy twin, a geometry, an
engine and a tiling rule; this checks them against the header, the built host
library, the pass order and the tables derived from the catalog.
"""

import ast
import dataclasses
import importlib
import inspect
from pathlib import Path

import pytest

from pipeline.backend import tiling
from pipeline.backend.kernels import catalog, hostlib
from pipeline.backend.kernels import reference as ref
from pipeline.backend.passes.pipeline import PASS_ORDER
from pipeline.backend.passes.primfunc import backend_of
from pipeline.perf import model

# passes that rewrite the graph but call no kernel themselves (integer_slices_and_pads: exact
# re-expressions the take and concat passes then offload)
CLEANUPS = {"eliminate_qdq_transparent", "eliminate_qdq_pairs", "collapse_reshapes", "integer_slices_and_pads"}


def _passes(record: catalog.Kernel) -> list:
    out = []
    for name in record.offload:
        module, func = name.split(".")
        out.append(getattr(importlib.import_module(f"pipeline.backend.passes.{module}"), func))
    return out


def test_the_catalog_and_the_header_declare_the_same_kernels():
    assert list(catalog.CATALOG) == list(hostlib.kernel_signatures())


@pytest.mark.parametrize("name", list(catalog.CATALOG))
def test_a_record_agrees_with_its_c_twin_and_pass(name):
    rec = catalog.CATALOG[name]
    # the C entry point exists in the host build (the macros made it) with the header's arguments
    assert hasattr(hostlib.load_kernels("half_up"), name)
    params = [p.name for p in hostlib.kernel_signatures()[name]]
    twin = list(inspect.signature(rec.reference).parameters)
    assert rec.reference.__name__ == name and [p.rstrip("_") for p in twin[:-1]] == params
    # the geometry's required fields are scalars of this kernel's signature
    assert issubclass(rec.geometry, ref._Geometry)
    required = {f.name for f in dataclasses.fields(rec.geometry) if f.default is dataclasses.MISSING}
    assert required <= set(params)
    # the pass that emits it runs in the pass order
    assert all(p in PASS_ORDER for p in _passes(rec))
    assert rec.engine in catalog.ENGINES
    if rec.tiling is not None:  # MAC kernels over output channels; elementwise ones over runs of elements
        t = rec.tiling
        assert rec.macs or (t.kind == "elementwise" and rec.geometry is ref.ElementwiseGeometry), name
        # the tiled count is the scalar the record names, after the pointer arguments
        sig = hostlib.kernel_signatures()[name]
        assert [q.pointer for q in sig[:t.pointers]] == [True] * t.pointers and not sig[t.pointers].pointer, name
        if t.kind == "elementwise":
            assert sig[t.pointers + t.c_out[0]].name == "n", name
    assert backend_of(name) == rec.backend == ("mmalib" if name.startswith("mmalib_") else "c7x")


def test_every_offload_pass_emits_a_catalog_kernel():
    emitting = {p for r in catalog.CATALOG.values() for p in _passes(r)}
    for p in PASS_ORDER:
        assert p in emitting or p.__name__ in CLEANUPS, p.__name__
    assert len(PASS_ORDER) == len(set(PASS_ORDER)), "a pass listed twice"


def test_derived_tables_follow_the_catalog():
    assert set(catalog.KERNELS) == set(catalog.CATALOG)
    assert set(tiling.TILEABLE) == {n for n, r in catalog.CATALOG.items() if r.tiling is not None}
    call = {"backend": "mmalib", "kernel": "mmalib_depthwise_conv2d_i16", "work": {"macs": 9}}
    assert model.engine(call) == "mma_depthwise"
    assert model.engine({**call, "backend": "c7x", "kernel": "c7x_int8_lut"}) == "vector"


def test_an_unknown_kernel_is_refused_by_name():
    with pytest.raises(KeyError, match="c7x_int8_group_norm.*catalog.py"):
        backend_of("c7x_int8_group_norm")
    with pytest.raises(KeyError, match="c7x_int8_group_norm"):
        catalog.buffer_shapes("c7x_int8_group_norm", 1)


def test_buffer_shapes_come_from_the_records_geometry():
    # conv 3x16x16 -> 8 channels, 3x3, stride 1, pad 1: out 8x16x16
    args = [None] * 6 + [3, 16, 16, 8, 3, 3, 1, 1, 1, 1, 1, 1, 0, -128, 127]
    shapes = catalog.buffer_shapes("mmalib_conv2d_i8", *args)
    assert shapes["in"] == (1, 3, 16, 16) and shapes["w"] == (8, 3, 3, 3) and shapes["out"] == (1, 8, 16, 16)
    bad = list(args)
    bad[6] = 0   # C_in = 0: the kernel returns a shape error before touching a buffer
    assert catalog.buffer_shapes("mmalib_conv2d_i8", *bad) == {}


PIPELINE = Path(catalog.__file__).resolve().parents[2]
# the catalog declares the names; reference.py defines the numpy twins named after them
NAMING = {PIPELINE / "backend" / "kernels" / "catalog.py", PIPELINE / "backend" / "kernels" / "reference.py"}


def _kernel_name_strings(tree: ast.AST) -> list[str]:
    """String literals equal to a kernel name, and f-strings that start like one."""
    names = set(catalog.CATALOG)
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            hits.append(node.value)
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            head = str(node.values[0].value)
            if head.startswith(("c7x_", "mmalib_")) and any(n.startswith(head) for n in names):
                hits.append(head + "{...}")
    return hits


def test_kernel_names_are_written_in_the_catalog_only():
    """Passes and the performance model ask ``catalog.find(op, dtype)``: no second name table."""
    found = {}
    for path in sorted(PIPELINE.rglob("*.py")):
        if path not in NAMING:
            hits = _kernel_name_strings(ast.parse(path.read_text()))
            if hits:
                found[str(path.relative_to(PIPELINE))] = hits
    assert found == {}


def test_the_check_sees_a_name_table_and_a_built_name():
    tree = ast.parse('K = {"int8": "c7x_take_i8"}\nk = f"c7x_{dtype}_relu"\nf = f"c7x_kernels_ref-{x}.so"')
    assert sorted(_kernel_name_strings(tree)) == ["c7x_take_i8", "c7x_{...}"]


def _found_ops(module: str) -> set[str]:
    """The ops a pass module asks :func:`catalog.find` for (literal first arguments)."""
    tree = ast.parse(Path(importlib.import_module(f"pipeline.backend.passes.{module}").__file__).read_text())
    return {c.args[0].value for c in ast.walk(tree)
            if isinstance(c, ast.Call) and getattr(c.func, "id", getattr(c.func, "attr", None)) == "find"
            and c.args and isinstance(c.args[0], ast.Constant)}


def test_each_record_names_exactly_the_passes_that_emit_it():
    """A record's ``offload`` modules ask for its op, and every module asking for an op is
    named by a record of that op (so a second emitter cannot go unrecorded)."""
    modules = {m.split(".")[0] for r in catalog.CATALOG.values() for m in r.offload}
    asks = {m: _found_ops(m) for m in modules | {p.__module__.rsplit(".", 1)[1] for p in PASS_ORDER}}
    for rec in catalog.CATALOG.values():
        for m in rec.offload:
            assert rec.op in asks[m.split(".")[0]], (rec.name, m)
    for m, ops in asks.items():
        for op in ops:
            assert any(m in {o.split(".")[0] for o in r.offload} for r in catalog.of_op(op)), (m, op)


def test_find_looks_kernels_up_by_op_dtype_and_variant():
    assert catalog.find("conv2d", "int8") == "mmalib_conv2d_i8"
    assert catalog.find("conv2d", "int8", variant="grouped") == "mmalib_conv2d_i8_grouped_loop"
    assert catalog.find("requantize", "int16", "int8") == "c7x_requantize_i16_i8"
    assert catalog.find("concat", "int16", variant="3") == "c7x_concat3_i16"
    assert catalog.find("softmax", "int16") is None      # no int16 softmax: the pass declines
    keys = [(r.op, r.dtypes, r.variant) for r in catalog.CATALOG.values()]
    assert len(keys) == len(set(keys)), "two records with one lookup key"
