"""Q/DQ cleanups that keep tensors integer between offloaded layers.

Three rewrites, all exact:

- ``eliminate_qdq_transparent``: ``q(op(dq(x, s, zp)), s, zp) -> op(x)`` for
  a data-movement op (reshape, permute_dims, squeeze, expand_dims, take) or a chain
  of them whose inner float results have no other user, with equal
  constant scalar parameters and ``q``'s dtype equal to ``x``'s: moving
  elements commutes with an element-wise dequantize/quantize round trip,
  which is the identity on ``x``'s integers (torch's flatten / view / permute
  / dropout-free classifier paths). A permute that moves only axes of length 1
  (``[1, T, E] -> [T, 1, E]``, nn.MultiheadAttention's batch-first transposes at
  batch 1) becomes a reshape: the same element order, a view instead of a call.
- ``eliminate_qdq_pairs``: ``q(dq(x, s, zp), s, zp) -> x`` (same dtype and
  parameters; e.g. what an eval-mode dropout or identity leaves behind).
  Exact for the full-range quantize TVM imports: ``round((x - zp) * s / s) + zp == x``.
- ``collapse_reshapes``: ``reshape(reshape(x)) -> reshape(x)``, one view (TVM fuses a pair of
  reshapes into a copy call).
"""

from __future__ import annotations

import tvm
from tvm import relax

from .graph import QDQ, Graph, dequantize_of, quantize_of, static_shape, var_name
from .log import OffloadLog
from .rewrite import Simplify, run_pass, with_data

TRANSPARENT_OPS = ("relax.reshape", "relax.permute_dims", "relax.squeeze", "relax.expand_dims", "relax.take")


def _same(dq: QDQ, q: QDQ) -> bool:
    return dq.same_params(q) and str(dq.data.ty.dtype) == q.out_dtype


def _transparent_chain(graph: Graph, expr) -> tuple[list, QDQ | None]:
    """The data-movement ops from ``expr`` down to a dequantize (outermost first) and that
    dequantize; ``([], None)`` when ``expr`` is no such chain or an inner float result has other
    users. Swin's cyclic shift (``torch.roll``) imports as two chained ``take``."""
    ops = []
    while (op := graph.call(expr, *TRANSPARENT_OPS)) is not None:
        ops.append(op)
        expr = op.args[0]
        dq = dequantize_of(graph, expr)
        if dq is not None:
            return ops, dq
        if not graph.single_use(expr):
            break
    return [], None


def _transparent_planner(graph: Graph, binding):
    q = quantize_of(graph, binding.value)
    if q is None:
        return None
    ops, dq = _transparent_chain(graph, q.data)
    if dq is None or not _same(dq, q):
        return None
    name = "_".join(op.op.name.split(".")[-1] for op in reversed(ops))
    shape = static_shape(q.data)
    as_reshape = name == "permute_dims" and shape is not None and _moves_only_unit_axes(ops[0])

    def build(ctx):
        if as_reshape:  # same element order: a view, not a transpose call
            return relax.op.reshape(ctx.remap(dq.data), shape)
        x = ctx.remap(dq.data)
        for op in reversed(ops[1:]):
            x = ctx.emit(with_data(op, x), f"{var_name(q.data)}_{len(ops)}")
        return with_data(ops[0], x)

    return Simplify(var_name(q.data), name, q.out_dtype, f"{name} on {q.out_dtype} without Q/DQ", build)


def _moves_only_unit_axes(permute) -> bool:
    """``permute_dims`` keeps the axes longer than 1 in their order (``[1, T, E] -> [T, 1, E]``): it
    moves no element, so it is a reshape."""
    shape = static_shape(permute.args[0])
    if shape is None:
        return False
    axes = list(range(len(shape)))[::-1] if permute.attrs.axes is None else [int(a) for a in permute.attrs.axes]
    kept = [a for a in axes if shape[a] != 1]
    return kept == sorted(kept)


def _pair_planner(graph: Graph, binding):
    q = quantize_of(graph, binding.value)
    dq = dequantize_of(graph, q.data) if q is not None else None
    if dq is None or not _same(dq, q):
        return None

    def build(ctx):
        return ctx.remap(dq.data)

    return Simplify(var_name(binding.var), "qdq_pair", q.out_dtype, "q(dq(x)) -> x", build)


def _reshape_chain_planner(graph: Graph, binding):
    outer = graph.call(binding.value, "relax.reshape")
    inner = graph.call(outer.args[0], "relax.reshape") if outer is not None else None
    shape = static_shape(binding.var)
    if inner is None or shape is None:
        return None
    x = inner.args[0]
    while (deeper := graph.call(x, "relax.reshape")) is not None:
        x = deeper.args[0]

    def build(ctx):
        return relax.op.reshape(ctx.remap(x), shape)

    return Simplify(var_name(binding.var), "reshape", str(binding.var.ty.dtype), "reshape of a reshape: one view",
                    build)


def collapse_reshapes(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """``reshape(reshape(x))`` -> ``reshape(x)``: one view, where TVM would fuse the pair into a
    copy."""
    return run_pass(mod, log, "reshape_chain", _reshape_chain_planner)


def eliminate_qdq_transparent(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """``dq -> reshape | permute_dims | squeeze | expand_dims | take (chained) -> q`` with equal parameters ->
    the ops on the integers."""
    return run_pass(mod, log, "qdq_transparent", _transparent_planner)


def eliminate_qdq_pairs(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """``q(dq(x, s, zp), s, zp) -> x`` for equal constant scalar parameters and dtype."""
    return run_pass(mod, log, "qdq_pair", _pair_planner)
