"""Offload of an int8 L2 normalisation over the last axis to ``c7x_int8_l2_normalize``.

``F.normalize(x, dim=-1)`` (Swin V2's cosine attention normalises its queries and keys) imports
as ``x / broadcast_to(clip(power(sum(power(x, 2), [-1], keepdims), 0.5), eps, inf))``. Pattern
(``docs/reference.md``, "L2 normalize"), with ``X = dq(x, s, zp)`` or ``X = take(dq(x), i, axis)``
(a select of one head of a fused projection, taken on the integers first)::

    q([permute_dims](divide(X, [broadcast_to](clip(power(sum(power(X, 2), [-1], keepdims), 0.5), eps, inf)))), s', zp')
        ->  [permute_dims](call_tir(c7x_int8_l2_normalize, x))

The input scale cancels (``s x / (s |x|) = x / |x|``) and ``eps`` only decides a row of zeros,
which gives 0 either way, so the kernel needs the input zero point and the output qparams
(:func:`pipeline.backend.kernels.reference.l2_normalize_gain`). Eligibility: int8 in and out,
constant scalar qparams, a sum over the last axis, exponents 2 and 0.5, ``eps`` below the
input's scale (so it only guards zero rows), ``n`` <= 4096, static shape, every float
intermediate used only inside the pattern. Anything else stays on the scalar path with the
reason in the offload log.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax

from ..kernels.catalog import find
from ..kernels.reference import LAYER_NORM_MAX_N, l2_normalize_gain
from ..refusal import Declined, declining
from .graph import Graph, const_array, const_scalar, dequantize_of, prim_number, quantize_of, static_shape, var_name
from .log import OffloadLog
from .primfunc import TensorArg, offload_primfunc
from .rewrite import Offload, run_pass

KERNEL = find("l2_normalize", "int8")


def _exponent(graph: Graph, expr, value: float):
    """The base of ``power(base, value)`` bound to ``expr``, else None."""
    call = graph.call(expr, "relax.power")
    return call.args[0] if call is not None and const_scalar(call.args[1]) == value else None


def norm_of(graph: Graph, expr):
    """``(X, sum call, eps, float intermediates)`` when ``expr`` is the clipped L2 norm of X over
    its last axis (optionally broadcast), else None."""
    chain = []
    bcast = graph.call(expr, "relax.broadcast_to")
    if bcast is not None:
        chain.append(expr)
        expr = bcast.args[0]
    clip = graph.call(expr, "relax.clip")
    if clip is None:
        return None
    chain.append(expr)
    root = _exponent(graph, clip.args[0], 0.5)
    total = graph.call(root, "relax.sum") if root is not None else None
    squared = _exponent(graph, total.args[0], 2.0) if total is not None else None
    if squared is None:
        return None
    chain += [clip.args[0], root, total.args[0]]
    return squared, total, prim_number(clip.args[1]), chain


def _source(graph: Graph, x):
    """``(dq, take call or None)`` of the normalised tensor ``X``."""
    dq = dequantize_of(graph, x)
    if dq is not None:
        return dq, None
    take = graph.call(x, "relax.take")
    dq = dequantize_of(graph, take.args[0]) if take is not None else None
    return (dq, take) if dq is not None else (None, None)


def _plan(graph: Graph, out, x, total, eps, chain, perm) -> Offload:
    dq, take = _source(graph, x)
    if dq is None:
        raise Declined("the normalised tensor is not a dequantize (or a select of one)")
    if str(dq.data.ty.dtype) != "int8" or out.out_dtype != "int8":
        raise Declined(f"{dq.data.ty.dtype} -> {out.out_dtype}: only int8 has an L2 normalize kernel")
    if not (dq.scalar and out.scalar):
        raise Declined("scales and zero points are not constant scalars")
    if const_array(dq.data) is not None:
        raise Declined("input is a compile-time constant")
    shape = static_shape(x)
    if not shape or static_shape(chain[-1]) != shape:
        raise Declined("dynamic or changing shape")
    axes = [int(a) for a in total.attrs.axis] if total.attrs.axis is not None else None
    if axes not in ([-1], [len(shape) - 1]) or not bool(total.attrs.keepdims):
        raise Declined(f"sums axes {axes}, not the last one")
    if eps is None or not 0 <= eps < dq.s:
        raise Declined(f"eps {eps} is not below the input scale {dq.s} (it would change nonzero rows)")
    rows, n = math.prod(shape[:-1]), shape[-1]
    if n > LAYER_NORM_MAX_N:
        raise Declined(f"rows of {n} elements (the kernel takes up to {LAYER_NORM_MAX_N})")
    for v in chain:
        if not graph.single_use(v):
            raise Declined(f"float intermediate {var_name(v)} has other users")
    try:
        gain = l2_normalize_gain(out.s)
    except ValueError as e:
        raise Declined(str(e)) from None
    prim = offload_primfunc(KERNEL, [TensorArg("data", shape, "int8"), TensorArg("out", shape, "int8")],
                            [rows, n, dq.z, gain, out.z])

    def build(ctx):
        src = ctx.remap(dq.data)
        if take is not None:   # the select on the integers (the take pass offloads it)
            src = ctx.emit(relax.op.take(src, take.args[1], axis=take.attrs.axis), f"{var_name(out.data)}_select")
        result = ctx.call_offload(prim, [src], shape, "int8")
        if perm is None:
            return result
        # Swin V2's keys are transposed after normalising: the transpose moves integers (the permute pass)
        return relax.op.permute_dims(ctx.emit(result, f"{var_name(out.data)}_rows"), perm.attrs.axes)

    return Offload(var_name(chain[-1]), "l2_normalize", "int8", KERNEL, build,   # anchored at the divide
                   note="F.normalize over the last axis, integer only (docs/reference.md, \"L2 normalize\")")


def _planner(graph: Graph, binding):
    out = quantize_of(graph, binding.value)
    if out is None or not isinstance(out.data, relax.Var):
        return None
    perm = graph.call(out.data, "relax.permute_dims")
    inner = perm.args[0] if perm is not None else out.data
    div = graph.call(inner, "relax.divide")
    norm = norm_of(graph, div.args[1]) if div is not None else None
    if norm is None or not norm[0].same_as(div.args[0]):
        return None
    x, total, eps, chain = norm
    chain = chain + ([out.data] if perm is not None else []) + [inner]
    with declining(var_name(inner), "l2_normalize", str(getattr(x.ty, "dtype", ""))):
        return _plan(graph, out, x, total, eps, chain, perm)


def offload_l2_normalize_i8(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """int8 ``q(x / clip(||x||_2, eps))`` over the last axis -> ``c7x_int8_l2_normalize(in, out,
    rows, n, in_zp, gain, out_zp)`` (module docstring)."""
    return run_pass(mod, log, "l2_normalize_i8", _planner)
