"""Offload of activation x activation matmuls (attention's Q.K^T and attention.V) to the MMA.

Pattern (``docs/reference.md``, "Attention matmul")::

    q([multiply(., c) | reshape]*(matmul(view_a(dq(a, s_a, z_a)), view_b(dq(b, s_b, z_b)))), s_o, z_o)
      ->  call_tir(mmalib_batch_matmul_i8 | _i16, a, b, params)

``view_a`` / ``view_b`` are chains of layout ops (``permute_dims``, ``reshape``,
``squeeze``, ``expand_dims``, ``broadcast_to``, a ``split`` piece, a ``take`` of one index), possibly through ``q(view(dq(x)))`` pairs with
the same parameters (the quantizer shares the producer's observer along a view,
``pipeline.quant.rules`` MATMUL). They are resolved at compile time into a strided view
of the producer's integer tensor (an offset and one stride per axis,
:func:`strided_view`), which the kernel reads directly: no copy, no transpose pass. The
scalar multiplies (attention's ``* scale``, moved behind the matmul by the quantizer)
join the rescale ``r = s_a s_b c / s_o`` of :func:`pipeline.backend.fold.batch_matmul_params`.

Eligibility: both operands int8 (zero points 0 or -128) or both int16 (zero points 0,
output zero point 0); constant scalar qparams; rank >= 2 with static shapes; K <= 2^14;
each operand a strided view with non-negative strides and a unit stride on one matrix
axis; neither operand a compile-time constant (that is a linear layer: ``fc.py``); the
float intermediates used only inside the pattern. Anything else stays on the scalar
path with the reason in the offload log.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax

from ..kernels.catalog import find
from .. import fold
from ..kernels.reference import BATCH_MATMUL_MAX_K, BATCH_MATMUL_ZERO_POINTS
from ..refusal import Declined, declining
from .graph import QDQ, Graph, const, const_array, const_scalar, dequantize_of, quantize_of, static_shape, var_name
from .log import OffloadLog
from .primfunc import TensorArg, offload_primfunc
from .rewrite import Offload, run_pass



def _layout_step(graph: Graph, expr):
    """``(input, apply)`` for a layout op bound to ``expr``: ``apply(idx)`` re-indexes a numpy
    array of ``input``'s shape as the op does; None for anything else."""
    call = graph.call(expr, "relax.permute_dims", "relax.reshape", "relax.broadcast_to", "relax.squeeze",
                      "relax.expand_dims", "relax.take")
    if call is not None:
        shape = static_shape(expr)
        if call.op.name == "relax.take":
            index = const_array(call.args[1])
            if index is None or index.ndim != 0 or call.attrs.axis is None:
                return None
            return call.args[0], lambda idx: np.take(idx, int(index), axis=int(call.attrs.axis))
        if call.op.name == "relax.permute_dims":
            axes = None if call.attrs.axes is None else [int(a) for a in call.attrs.axes]
            return call.args[0], lambda idx: np.transpose(idx, axes)
        if call.op.name in ("relax.reshape", "relax.squeeze", "relax.expand_dims"):
            return call.args[0], lambda idx: idx.reshape(shape)
        return call.args[0], lambda idx: np.broadcast_to(idx, shape)
    item = graph.value.get(expr) if isinstance(expr, relax.Var) else None
    if isinstance(item, relax.TupleGetItem):
        split = graph.call(item.tuple_value, "relax.split")
        if split is not None:
            sections, axis, index = split.attrs.indices_or_sections, int(split.attrs.axis), int(item.index)
            parts = (int(sections) if isinstance(sections, tvm.tirx.IntImm)
                     else [int(s) for s in sections])
            return split.args[0], lambda idx: np.split(idx, parts, axis=axis)[index]
    return None


def _trace(graph: Graph, expr, steps: list) -> list:
    """Every ``(dq, steps)`` that ``expr`` is a view of, nearest first: the dequantize reached
    through :func:`_layout_step` ops, then, through each same-parameter ``q(view(dq))`` pair
    below it, the deeper ones; ``steps`` are the re-indexings from that dequantize's data up to
    ``expr`` (last applied last). Empty when ``expr`` is no such view."""
    dq = dequantize_of(graph, expr)
    if dq is not None:
        found = [(dq, steps)]
        inner = quantize_of(graph, dq.data)
        if inner is not None and inner.same_params(dq) and inner.out_dtype == str(dq.data.ty.dtype):
            found += [t for t in _trace(graph, inner.data, steps) if t[0].same_params(dq)]
        return found
    step = _layout_step(graph, expr)
    if step is None or static_shape(expr) is None:
        return []
    return _trace(graph, step[0], [step[1]] + steps)


def strided_view(source_shape: tuple[int, ...], steps: list, batch: tuple[int, ...]) -> tuple[int, ...] | None:
    """``(offset, batch stride, row stride, column stride)`` in elements of the view that
    ``steps`` (re-indexings, applied in order) make of a C-contiguous tensor of
    ``source_shape``, broadcast to ``batch + (rows, cols)``; None when it is no such view
    (a batch that does not flatten to one stride, a negative stride)."""
    idx = np.arange(math.prod(source_shape), dtype=np.int64).reshape(source_shape)
    for step in steps:
        idx = step(idx)
    if idx.ndim < 2:
        return None
    idx = np.broadcast_to(idx, batch + idx.shape[-2:]).reshape((-1,) + idx.shape[-2:])
    b, r, c = idx.shape
    off = int(idx[0, 0, 0])
    sb = int(idx[1, 0, 0]) - off if b > 1 else 0
    sr = int(idx[0, 1, 0]) - off if r > 1 else 1
    sc = int(idx[0, 0, 1]) - off if c > 1 else 1
    grid = np.ix_(np.arange(b), np.arange(r), np.arange(c))
    expect = off + grid[0] * sb + grid[1] * sr + grid[2] * sc
    if min(sb, sr, sc) < 0 or not np.array_equal(idx, expect):
        return None
    return off, sb, sr, sc


def _scale_chain(graph: Graph, expr) -> tuple[object, float, list]:
    """Peel multiplies by constant scalars and reshapes (the kernel writes its output
    contiguous) off ``expr``: ``(what is left, product of the scalars, the peeled inputs)``."""
    factor, inner = 1.0, []
    while True:
        reshape = graph.call(expr, "relax.reshape")
        mul = graph.call(expr, "relax.multiply")
        scalars = [const_scalar(a) for a in mul.args] if mul is not None else [None, None]
        if reshape is not None:
            expr = reshape.args[0]
        elif mul is not None and (scalars[0] is None) != (scalars[1] is None):
            expr, c = (mul.args[0], scalars[1]) if scalars[0] is None else (mul.args[1], scalars[0])
            factor *= float(c)
        else:
            return expr, factor, inner
        inner.append(expr)


def _operand(graph: Graph, expr, batch: tuple[int, ...], name: str):
    """``(source var, dq, (size, *view))`` of one matmul operand: the deepest tensor it is a
    strided view of (:func:`_trace`), else a nearer one. None when it is a constant (a weight)."""
    traced = _trace(graph, expr, [])
    if not traced:
        raise Declined(f"operand {name} is not a view of a dequantized tensor")
    if const_array(traced[0][0].data) is not None:
        return None
    for dq, steps in reversed(traced):
        shape = static_shape(dq.data)
        view = strided_view(shape, steps, batch) if shape is not None and dq.scalar else None
        if view is not None:
            return dq.data, dq, (math.prod(shape),) + view
    if not traced[0][0].scalar:
        raise Declined(f"operand {name}: scale and zero point are not constant scalars")
    raise Declined(f"operand {name} is not a strided view of its source tensor")


def _check_params(dtype: str, a: QDQ, b: QDQ, out: QDQ) -> None:
    if str(a.data.ty.dtype) != dtype or str(b.data.ty.dtype) != dtype or out.out_dtype != dtype:
        raise Declined(f"operands {a.data.ty.dtype} x {b.data.ty.dtype} -> {out.out_dtype}: "
                       f"not all {dtype}")
    if not out.scalar:
        raise Declined("output scale and zero point are not constant scalars")
    allowed = BATCH_MATMUL_ZERO_POINTS[np.dtype(dtype)]
    if a.z not in allowed or b.z not in allowed or (dtype == "int16" and out.z != 0):
        raise Declined(f"zero points ({a.z}, {b.z} -> {out.z}): the MMA takes {allowed} on {dtype} operands"
                       + (" and 0 on the output" if dtype == "int16" else ""))


def _plan(graph: Graph, out: QDQ, dtype: str):
    mm, factor, inner = _scale_chain(graph, out.data)
    call = graph.call(mm, "relax.matmul")
    for x in inner:
        if not graph.single_use(x):
            raise Declined(f"{var_name(x)} (before a scale multiply) has other users")
    a_shape, b_shape, o_shape = (static_shape(e) for e in (call.args[0], call.args[1], mm))
    q_shape = static_shape(out.data)  # the root's: the reshapes peeled off are free
    if None in (a_shape, b_shape, o_shape, q_shape) or min(len(a_shape), len(b_shape)) < 2:
        raise Declined("dynamic shapes or a 1-D operand")
    batch, (m, k), n = o_shape[:-2], a_shape[-2:], b_shape[-1]
    a = _operand(graph, call.args[0], batch, "A")
    b = _operand(graph, call.args[1], batch, "B")
    if a is None or b is None:
        return None  # a linear layer's weight: fc.py's pattern
    _check_params(dtype, a[1], b[1], out)
    if k > BATCH_MATMUL_MAX_K:
        raise Declined(f"K={k} > {BATCH_MATMUL_MAX_K}")
    (a_size, *a_view), (b_size, *b_view) = a[2], b[2]
    for label, (_, _, s_row, s_col) in (("A", a_view), ("B", b_view)):
        if 1 not in (s_row, s_col):
            raise Declined(f"operand {label} has no unit stride (rows {s_row}, columns {s_col})")
    params = const(fold.batch_matmul_params(a[1].s, a[1].z, b[1].s, b[1].z, out.s, out.z, factor, dtype))
    kernel = find("batch_matmul", dtype)
    tensors = [TensorArg("a", static_shape(a[0]), dtype), TensorArg("b", static_shape(b[0]), dtype),
               TensorArg("params", (16,), "uint8"), TensorArg("out", q_shape, dtype)]
    scalars = [a_size, b_size, math.prod(batch), m, k, n, *a_view, *b_view]
    prim = offload_primfunc(kernel, tensors, scalars)
    note = f"scale {factor:g} folded into the rescale" if factor != 1.0 else None

    def build(ctx):
        return ctx.call_offload(prim, [a[0], b[0], params], q_shape, dtype)

    return Offload(var_name(mm), "matmul", dtype, kernel, build, note)


def _planner(dtype: str):
    def planner(graph: Graph, binding):
        out = quantize_of(graph, binding.value)
        if out is None or out.out_dtype != dtype:
            return None
        mm = _scale_chain(graph, out.data)[0]
        if graph.call(mm, "relax.matmul") is None:
            return None
        with declining(var_name(mm), "matmul", dtype):
            return _plan(graph, out, dtype)

    return planner


def offload_batch_matmul_i8(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """int8 activation x activation matmul -> ``mmalib_batch_matmul_i8(a, b, params, out, ...)``
    (module docstring)."""
    return run_pass(mod, log, "batch_matmul_i8", _planner("int8"))


def offload_batch_matmul_i16(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """int16 activation x activation matmul -> ``mmalib_batch_matmul_i16`` (module docstring)."""
    return run_pass(mod, log, "batch_matmul_i16", _planner("int16"))
