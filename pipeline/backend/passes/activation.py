"""Offload of int8 element-wise activations to a 256-entry table lookup.

The Relax import decomposes torch's activations; :func:`match_activation`
recognises these float forms over one tensor ``d`` (``R6(e)`` is the clip of
``e`` to [0, 6], one ``clip`` or two chained ones)::

    hardsigmoid  divide(R6(add(d, 3)), 6)
    hardswish    divide(multiply(d, R6(add(d, 3))), 6)  |  multiply(d, hardsigmoid(d))
    silu         multiply(d, sigmoid(d))                 |  nn.silu(d)
    sigmoid      sigmoid(d)
    gelu         nn.gelu(d)  (gelu_tanh: nn.gelu_tanh(d))
    tanh         tanh(d)  (MaxViT's classifier)

Pattern (``docs/reference.md``, "Activation tables")::

    q(f(dq(x, s, zp)), s_o, zp_o)  ->  call_tir(c7x_int8_lut, x, table)

with ``table = q(f(dq(v)))`` for every int8 ``v``, computed by
:func:`pipeline.backend.activation_table.activation_table` with torch's own
ops, so the layer equals the Q/DQ model exactly. Eligibility: int8 in and
out, constant scalar scales and zero points, static shape, input not a
constant, the chain's float intermediates used only inside it. int16 stays
on the scalar path: its table would be 65536 entries (128 KiB) per layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
from tvm import relax

from ..kernels.catalog import find
from ..refusal import Declined, declining
from .graph import QDQ, Graph, const, const_array, const_scalar, dequantize_of, prim_number, \
    quantize_of, static_shape, var_name
from .log import OffloadLog
from .primfunc import TensorArg, offload_primfunc
from .rewrite import Offload, run_pass

KERNEL = find("lut", "int8")
TABLE_SIZE = 256


@dataclass(frozen=True)
class ActivationMatch:
    """A recognised activation: ``kind`` (a key of ``activation_table.ACTIVATIONS``),
    its input ``source`` and the binding variables of the chain (root first)."""

    kind: str
    source: object
    chain: tuple


def _arg_const(graph: Graph, call, value: float):
    """The non-constant operand of a binary ``call`` whose other operand is the scalar
    constant ``value``, else ``None``."""
    a, b = call.args
    for x, c in ((a, b), (b, a)):
        if const_array(c) is not None and const_scalar(c) == value and const_array(x) is None:
            return x
    return None


def _relu6(graph: Graph, expr, chain: list):
    """The input of a clip (or two chained clips) of ``expr`` to exactly [0, 6], else ``None``."""
    lo, hi = -math.inf, math.inf
    for _ in range(2):
        clip = graph.call(expr, "relax.clip")
        if clip is None:
            break
        a, b = prim_number(clip.args[1]), prim_number(clip.args[2])
        if a is None or b is None:
            return None
        lo, hi = max(lo, a), min(hi, b)
        chain.append(expr)
        expr = clip.args[0]
    return expr if (lo, hi) == (0.0, 6.0) else None


def _hardsigmoid(graph: Graph, expr, chain: list):
    """``d`` if ``expr`` is ``divide(R6(add(d, 3)), 6)``, else ``None``."""
    div = graph.call(expr, "relax.divide")
    if div is None or const_scalar(div.args[1]) != 6.0:
        return None
    chain.append(expr)
    inner = _relu6(graph, div.args[0], chain)
    add = graph.call(inner, "relax.add") if inner is not None else None
    if add is None:
        return None
    chain.append(inner)
    return _arg_const(graph, add, 3.0)


def _times_self(graph: Graph, expr, chain: list, inner_of):
    """``d`` if ``expr`` is ``multiply(d, g)`` (either order) with ``inner_of(g) == d``."""
    mul = graph.call(expr, "relax.multiply")
    if mul is None:
        return None
    for d, g in (mul.args, mul.args[::-1]):
        sub: list = []
        src = inner_of(graph, g, sub)
        if src is not None and src.same_as(d):
            chain.append(expr)
            chain.extend(sub)
            return d
    return None


def _sigmoid(graph: Graph, expr, chain: list):
    call = graph.call(expr, "relax.sigmoid")
    if call is None:
        return None
    chain.append(expr)
    return call.args[0]


def _hardswish(graph: Graph, expr, chain: list):
    div = graph.call(expr, "relax.divide")
    if div is not None and const_scalar(div.args[1]) == 6.0:
        sub = [expr]
        d = _times_self(graph, div.args[0], sub, _relu6_add3)
        if d is not None:
            chain.extend(sub)
            return d
    return _times_self(graph, expr, chain, _hardsigmoid)


def _relu6_add3(graph: Graph, expr, chain: list):
    inner = _relu6(graph, expr, chain)
    add = graph.call(inner, "relax.add") if inner is not None else None
    if add is None:
        return None
    chain.append(inner)
    return _arg_const(graph, add, 3.0)


def _single_op(op: str):
    def match(graph: Graph, expr, chain: list):
        call = graph.call(expr, op)
        if call is None:
            return None
        chain.append(expr)
        return call.args[0]
    return match


# Longest forms first: silu contains a sigmoid, hardswish a hardsigmoid.
_FORMS = (("hardswish", _hardswish), ("hardsigmoid", _hardsigmoid),
          ("silu", lambda g, e, c: _times_self(g, e, c, _sigmoid)),
          ("silu", _single_op("relax.nn.silu")), ("sigmoid", _sigmoid),
          ("gelu", _single_op("relax.nn.gelu")), ("gelu_tanh", _single_op("relax.nn.gelu_tanh")),
          ("tanh", _single_op("relax.tanh")))


def match_activation(graph: Graph, expr) -> ActivationMatch | None:
    """The activation whose result is the variable ``expr`` (module docstring), else ``None``."""
    if not isinstance(expr, relax.Var):
        return None
    for kind, form in _FORMS:
        chain: list = []
        source = form(graph, expr, chain)
        if source is not None and all(isinstance(v, relax.Var) for v in chain):
            return ActivationMatch(kind, source, tuple(chain))
    return None


def _plan(graph: Graph, m: ActivationMatch, data: QDQ, out: QDQ) -> Offload:
    from ..activation_table import activation_table   # torch: only when a table is built

    dtype = str(data.data.ty.dtype)
    if dtype != "int8" or out.out_dtype != "int8":
        raise Declined(f"{dtype} -> {out.out_dtype}: only int8 has a table kernel (an int16 table "
                       f"would be 65536 entries, 128 KiB per layer)")
    if not (data.scalar and out.scalar):
        raise Declined("scales and zero points are not constant scalars")
    if const_array(data.data) is not None:
        raise Declined("input is a compile-time constant")
    shape = static_shape(data.data)
    if shape is None or static_shape(m.chain[0]) != shape:
        raise Declined("dynamic or changing shape")
    for v in m.chain:
        if not graph.single_use(v):
            raise Declined(f"float intermediate {var_name(v)} has other users")
    table = activation_table(m.kind, data.s, data.z, out.s, out.z)
    prim = offload_primfunc(KERNEL, [TensorArg("data", shape, "int8"),
                                     TensorArg("table", (TABLE_SIZE,), "int8"),
                                     TensorArg("out", shape, "int8")], [math.prod(shape)])
    table_const = const(table)

    def build(ctx):
        return ctx.call_offload(prim, [data.data, table_const], shape, "int8")

    return Offload(var_name(m.chain[0]), m.kind, "int8", KERNEL, build)


def _planner(graph: Graph, binding):
    out = quantize_of(graph, binding.value)
    if out is None:
        return None
    m = match_activation(graph, out.data)
    data = dequantize_of(graph, m.source) if m is not None else None
    if data is None:
        return None
    with declining(var_name(m.chain[0]), m.kind, str(data.data.ty.dtype)):
        return _plan(graph, m, data, out)


def offload_activation_lut_i8(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """int8 ``q(f(dq(x)))`` for f in hardswish, hardsigmoid, silu, sigmoid, gelu, tanh ->
    ``c7x_int8_lut(in, table, out, n)`` with table int8[256] (module docstring)."""
    return run_pass(mod, log, "activation_lut_i8", _planner)
