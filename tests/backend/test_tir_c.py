"""tir_c: float intrinsics become libm calls (valid C, same values in the C and
the interpreter's LLVM build) and float constants are exact in the C (no
7-digit printing, infinities and NaN included, no collision of constants
that print alike)."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from c_check import compile_and_compare, libc_symbols, strict_compile, undefined_symbols

from pipeline.backend import tir_c
from pipeline.backend.kernel_source import _tir_to_c

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("nm") is None,
                               reason="gcc and binutils nm are needed")


def _store(expr, dtype="float32") -> tirx.PrimFunc:
    a = tirx.decl_buffer((4,), dtype, "a")
    d = tirx.decl_buffer((4,), dtype, "d")
    body = tirx.BufferStore(d, expr(a), [tirx.IntImm("int32", 0)])
    return tirx.PrimFunc([a, d], body).with_attr("global_symbol", "probe")


def _bits(v: float) -> int:
    return int(np.float32(v).view(np.uint32))


def _externs(func) -> list[tuple[str, list]]:
    """(callee, args) of every call_pure_extern in ``func``, in script order."""
    found = []

    def visit(call):
        if getattr(call.op, "name", "") == "tirx.call_pure_extern":
            found.append((str(call.args[0].value), list(call.args[1:])))
        return call
    import tvm_ffi
    tvm_ffi.structural_map(func.body, [(tvm.ir.Call, visit)])
    return found


# ---------------------------------------------------------------------------
# units
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("op,name", [("tirx.fabs", "fabsf"), ("tirx.exp", "expf"), ("tirx.tanh", "tanhf"),
                                     ("tirx.erf", "erff"), ("prim.ceil", "ceilf"), ("prim.log2", "log2f"),
                                     ("tirx.round", "nearbyintf"), ("tirx.sqrt", "sqrtf")])
def test_intrinsic_becomes_libm_call(op, name):
    func = tir_c.libm_calls(_store(lambda a: tirx.call_intrin("float32", op, a[1])))
    assert [n for n, _ in _externs(func)] == [name]
    f64 = tir_c.libm_calls(_store(lambda a: tirx.call_intrin("float64", op, a[1]), "float64"))
    assert [n for n, _ in _externs(f64)] == [name[:-1]]


def test_every_mapped_intrinsic_compiles_to_c():
    """Unresolved intrinsics (tirx.fabs, tirx.exp10...) made TVM's C codegen fail."""
    ops = [op for op in tir_c._LIBM if op not in ("tirx.ldexp", "tirx.fma")]
    ops += ["tirx.sigmoid", "tirx.rsqrt", "tirx.exp10"]
    for op in ops:
        n = tvm.ir.Op.get(op).num_inputs
        func = _store(lambda a: tirx.call_intrin("float32", op, *[a[i] for i in range(n)]))
        src = _tir_to_c(tvm.IRModule({"probe": tir_c.libm_calls(func)}))
        assert "probe" in src, op


def test_float_constants_become_bit_patterns():
    values = [0.1, float("inf"), float("-inf"), 3.4e38, 42.11383, 3.0, -128.0, 1e7 + 1]
    consts = [tirx.FloatImm("float32", v) for v in values]

    def expr(a):
        e = a[0]
        for c in consts:
            e = e + c
        return e
    externs = _externs(tir_c.exact_float_constants(_store(expr)))
    bits = [int(args[0].value) for name, args in externs if name == tir_c.F32_BITS]
    want = [0x3DCCCCCD, 0x7F800000, 0xFF800000] + [_bits(v) for v in (3.4e38, 42.11383, 1e7 + 1)]
    assert sorted(bits) == sorted(want)  # 3.0 and -128.0 print exactly and stay literals
    nan = tir_c.exact_float_constants(_store(lambda a: a[0] + tirx.FloatImm("float32", float("nan"))))
    assert [int(args[0].value) for _, args in _externs(nan)] == [0x7FC00000]
    f64 = tir_c.exact_float_constants(_store(lambda a: a[0] * tirx.FloatImm("float64", 0.1), "float64"))
    assert [(n, int(args[0].value)) for n, args in _externs(f64)] == [(tir_c.F64_BITS, 0x3FB999999999999A)]


def test_prints_exactly_is_conservative():
    for v in (0.0, -0.0, 1.0, 127.0, -32768.0, 9999999.0):
        assert tir_c.prints_exactly("float32", v) and f"{v:e}" == f"{float(f'{v:e}'):e}"
    for v in (0.5, 0.1, 1e7, 16777217.0, float("inf"), float("nan")):
        assert not tir_c.prints_exactly("float32", v)


# ---------------------------------------------------------------------------
# whole models (hand-built Relax, float only)
# ---------------------------------------------------------------------------

_UNARY = ["abs", "exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "sin", "cos", "tan", "asin",
          "acos", "atan", "sinh", "cosh", "asinh", "atanh", "floor", "ceil", "round", "trunc", "sign",
          "square", "negative"]


def _c(v):
    return relax.const(np.float32(v))


def _terms(bb, x):
    """Every float op legalization can turn into a math intrinsic, applied to x in (0, 1)."""
    op, nn = relax.op, relax.op.nn
    terms = [bb.emit(getattr(op, n)(x)) for n in _UNARY]
    terms += [bb.emit(op.acosh(bb.emit(op.add(x, _c(1.0))))), bb.emit(op.power(x, _c(1.7))),
              bb.emit(op.atan2(x, _c(0.3))), bb.emit(op.mod(x, _c(0.3))), bb.emit(op.floor_mod(x, _c(0.3)))]
    terms += [bb.emit(f(x)) for f in (nn.gelu, nn.gelu_tanh, nn.silu, nn.softplus, nn.softmax, nn.log_softmax)]
    terms += [bb.emit(op.astype(op.isinf(bb.emit(op.divide(_c(1.0), x))), "float32")),
              bb.emit(op.astype(op.isfinite(x), "float32")), bb.emit(op.astype(op.isnan(x), "float32"))]
    return terms


def _sum_module(make_terms, n=256) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, n], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            terms = make_terms(bb, x)
            acc = terms[0]
            for t in terms[1:]:
                acc = bb.emit(relax.op.add(acc, t))
            out = bb.emit_output(acc)
        bb.emit_func_output(out)
    return bb.get()


@needs_gcc
def test_all_float_intrinsics_compile_and_match_the_reference(tmp_path):
    """abs, exp, log, tanh, erf, trig, rounding, pow, fmod, gelu, softmax...:
    valid C99, bit-exact with the LLVM reference, only libm names undefined."""
    x = np.random.default_rng(0).uniform(0.02, 0.98, (4, 256)).astype(np.float32)
    x[0, :3] = [0.05, 0.25, 0.5]
    _, out = compile_and_compare(_sum_module(_terms), "allmath", tmp_path / "c", x, mmalib=False)
    assert np.isfinite(out).all()
    src = (tmp_path / "c" / "tvm_kernels.c").read_text()
    assert "fabsf(" in src and "tanhf(" in src and "erff(" in src
    objs = strict_compile(tmp_path / "c", tmp_path)
    undefined = undefined_symbols(objs, tmp_path)
    assert {"expf", "tanhf", "erff"} <= undefined and undefined <= libc_symbols(), undefined - libc_symbols()


def _adjacent_pair() -> tuple[float, float]:
    """Two float32 values 1 ulp apart that TVM prints alike (4.211383e+01f)."""
    a = np.float32(42.11383)
    b = np.nextafter(a, np.float32(100))
    assert f"{float(a):e}" == f"{float(b):e}" and a != b
    return float(a), float(b)


@needs_gcc
def test_constants_that_print_alike_and_infinities_stay_exact(tmp_path):
    """Used to fail: 'two float constants both print as 4.211383e+01f' and
    float('"inf"') in the literal fix-up."""
    a, b = _adjacent_pair()

    def terms(bb, x):
        f32 = lambda v: tirx.FloatImm("float32", v)  # noqa: E731
        return [bb.emit(relax.op.clip(x, f32(a), f32(b))),
                bb.emit(relax.op.clip(x, f32(-a), f32(float("inf")))),
                bb.emit(relax.op.clip(x, f32(float("-inf")), f32(0.1)))]
    x = np.linspace(-50, 50, 3 * 64, dtype=np.float32).reshape(3, 64)
    x[0, :4] = [a, b, 42.0, 43.0]
    _, out = compile_and_compare(_sum_module(terms, 64), "collide", tmp_path, x, mmalib=False)
    f32 = np.float32
    want = np.clip(x, f32(a), f32(b)) + np.maximum(x, f32(-a)) + np.minimum(x, f32(0.1))
    np.testing.assert_array_equal(out, want)
    src = (tmp_path / "tvm_kernels.c").read_text()
    for v in (a, b, float("inf"), float("-inf")):
        assert f"c7x_f32_bits((uint32_t){_bits(v)})" in src
    assert not re.search(r"\binff\b|\bnanf\b", src)
