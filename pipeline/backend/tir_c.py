"""TIR rewrites that make TVM's C codegen complete and exact for float code.

Two problems of TVM 0.27's C target, each fixed by one rewrite of PrimFunc bodies:

- :func:`libm_calls`: float intrinsics (``tirx.fabs``, ``tirx.exp``,
  ``tirx.tanh``, ``prim.ceil``, ``tirx.pow``...) become
  ``call_pure_extern`` of the C99 libm function (``fabsf``, ``expf``... for
  float32, ``fabs``, ``exp``... for float64). Without it TVM's C codegen
  fails on some of them (``Unresolved call tirx.fabs``: abs, isinf, isfinite;
  ``tirx.exp10``), and others are lowered differently by the C and the LLVM
  target (LLVM expands ``tanh`` into exp arithmetic, C calls ``tanhf``), so
  the C and the interpreter's LLVM build would disagree. Applied by
  :mod:`.lower` to every scalar PrimFunc, so ``lowered.py`` (interpreter) and
  ``tvm_kernels.c`` call the same libm functions: bit-exact on the host, where
  both resolve to the same libm.
- :func:`exact_float_constants`: TVM prints a float immediate with 7
  significant digits (``std::scientific``: 0.014647187665 -> 1.464719e-02f,
  2.5 ulp away; two constants 1 ulp apart print alike) and infinities / NaN
  as ``inff`` / ``nanf`` (not C). Every float immediate whose printed form
  is not exactly its value becomes ``c7x_f32_bits(<uint32 bit pattern>)``
  (``c7x_f64_bits(<uint64>)`` for float64), inline helpers of
  ``c7x_tvm_shim.h`` that rebuild the value from its bits (a union, C99,
  folded to a constant by the compiler). Applied to the C build only, as the
  last pass before codegen; the LLVM build keeps the immediates, which LLVM
  encodes exactly.
"""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import tirx

F32_BITS = "c7x_f32_bits"
"""Shim helper ``float c7x_f32_bits(uint32_t)``: the float32 of that bit pattern."""
F64_BITS = "c7x_f64_bits"
"""Shim helper ``double c7x_f64_bits(uint64_t)``: the float64 of that bit pattern."""

_FLOATS = ("float32", "float64")

# TIR op -> C99 <math.h> function (double name; float32 adds the "f" suffix).
_LIBM = {
    **{f"tirx.{n}": n for n in (
        "fabs", "exp", "exp2", "log", "log10", "log1p", "sqrt", "sin", "cos", "tan", "asin",
        "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "floor",
        "trunc", "nearbyint", "pow", "fmod", "atan2", "hypot", "copysign", "nextafter",
        "ldexp", "fma")},
    "prim.ceil": "ceil",
    "prim.log2": "log2",
    # TVM's round is round-half-to-even (LLVM: llvm.nearbyint; C: nearbyintf).
    "tirx.round": "nearbyint",
}

LIBM_NAMES = frozenset(n + suffix for n in [*_LIBM.values(), "sqrt", "exp", "pow"] for suffix in ("", "f"))
"""Every libm function the rewritten code may call (float32 and float64 names)."""


def _libm(dtype: str, name: str, *args) -> tirx.PrimExpr:
    return tirx.call_pure_extern(dtype, name + ("f" if dtype == "float32" else ""), *args)


def _const(dtype: str, value: float):
    return tirx.FloatImm(dtype, value)


def _expanded(op: str, dtype: str, args):
    """Ops with no libm function, written as the arithmetic TVM's C target uses."""
    x = args[0]
    if op == "tirx.sigmoid":  # 1 / (1 + exp(0 - x))
        return _const(dtype, 1.0) / (_const(dtype, 1.0) + _libm(dtype, "exp", _const(dtype, 0.0) - x))
    if op == "tirx.rsqrt":  # 1 / sqrt(x)
        return _const(dtype, 1.0) / _libm(dtype, "sqrt", x)
    if op == "tirx.exp10":  # C99 has no exp10
        return _libm(dtype, "pow", _const(dtype, 10.0), x)
    return None


def _map_call(call):
    op = call.op.name if isinstance(call.op, tvm.ir.Op) else ""
    dtype = str(call.ty)
    if dtype not in _FLOATS:
        return call
    if op in _LIBM:
        return _libm(dtype, _LIBM[op], *call.args)
    new = _expanded(op, dtype, call.args)
    return call if new is None else new


def libm_calls(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every float32/float64 math intrinsic replaced by a call of
    its C99 libm function (table ``_LIBM``; sigmoid, rsqrt and exp10 as
    arithmetic on ``expf`` / ``sqrtf`` / ``powf``). Other dtypes and ops are
    left alone. The values are those of the libm the program links."""
    body = tvm_ffi.structural_map(func.body, [(tvm.ir.Call, _map_call)])
    return func if body.same_as(func.body) else func.with_body(body)


def prints_exactly(dtype: str, value: float) -> bool:
    """True if TVM's C literal of this immediate (``%e``: 7 significant
    digits) is its exact value: integers below 10^7 in magnitude."""
    return dtype in _FLOATS and value == value and abs(value) < 1e7 and float(value).is_integer()


def _bits_call(imm):
    dtype, value = str(imm.ty), float(imm.value)
    if dtype not in _FLOATS or prints_exactly(dtype, value):
        return imm
    if dtype == "float32":
        with np.errstate(over="ignore"):  # a double beyond float32 range is +-inf, as in LLVM
            bits = int(np.array(value, np.float64).astype(np.float32).view(np.uint32))
        return tirx.call_pure_extern(dtype, F32_BITS, tirx.IntImm("uint32", bits))
    bits = int(np.array(value, np.float64).view(np.uint64))
    return tirx.call_pure_extern(dtype, F64_BITS, tirx.IntImm("uint64", bits))


def exact_float_constants(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every float32/float64 immediate that TVM's C printer would
    not render exactly (see :func:`prints_exactly`) replaced by a
    ``c7x_f32_bits`` / ``c7x_f64_bits`` call on its bit pattern (NaN payloads
    and signed infinities included). A float32 immediate holds a double; its
    float32 is the round-to-nearest conversion, as LLVM's encoding."""
    body = tvm_ffi.structural_map(func.body, [(tirx.FloatImm, _bits_call)])
    return func if body.same_as(func.body) else func.with_body(body)


def module_pass(fn, name: str) -> tvm.transform.Pass:
    """``fn`` (PrimFunc -> PrimFunc) applied to every PrimFunc of a module."""
    def run(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        funcs = {gv: fn(f) if isinstance(f, tirx.PrimFunc) else f for gv, f in mod.functions.items()}
        return tvm.IRModule(funcs, attrs=mod.attrs)
    return tvm.transform.module_pass(run, opt_level=0, name=name)
