"""Q/DQ cleanups that keep tensors integer between offloaded layers.

Two rewrites, both exact:

- ``eliminate_qdq_transparent``: ``q(op(dq(x, s, zp)), s, zp) -> op(x)`` for
  a data-movement op (reshape, permute_dims, squeeze, expand_dims) with equal
  constant scalar parameters and ``q``'s dtype equal to ``x``'s: moving
  elements commutes with an element-wise dequantize/quantize round trip,
  which is the identity on ``x``'s integers (torch's flatten / view / permute
  / dropout-free classifier paths).
- ``eliminate_qdq_pairs``: ``q(dq(x, s, zp), s, zp) -> x`` (same dtype and
  parameters; e.g. what an eval-mode dropout or identity leaves behind).
  Exact for the full-range quantize TVM imports: ``round((x - zp) * s / s) + zp == x``.
"""

from __future__ import annotations

import tvm
from tvm import relax

from .graph import QDQ, Graph, dequantize_of, quantize_of, var_name
from .log import OffloadLog
from .rewrite import Simplify, run_pass

TRANSPARENT_OPS = ("relax.reshape", "relax.permute_dims", "relax.squeeze", "relax.expand_dims")


def _same(dq: QDQ, q: QDQ) -> bool:
    return dq.same_params(q) and str(dq.data.ty.dtype) == q.out_dtype


def _transparent_planner(graph: Graph, binding):
    q = quantize_of(graph, binding.value)
    if q is None:
        return None
    op = graph.call(q.data, *TRANSPARENT_OPS)
    dq = dequantize_of(graph, op.args[0]) if op is not None else None
    if dq is None or not _same(dq, q):
        return None
    name = op.op.name.split(".")[-1]

    def build(ctx):
        return relax.Call(op.op, [ctx.remap(dq.data), *op.args[1:]], op.attrs)

    return Simplify(var_name(q.data), name, q.out_dtype, f"{name} on {q.out_dtype} without Q/DQ", build)


def _pair_planner(graph: Graph, binding):
    q = quantize_of(graph, binding.value)
    dq = dequantize_of(graph, q.data) if q is not None else None
    if dq is None or not _same(dq, q):
        return None

    def build(ctx):
        return ctx.remap(dq.data)

    return Simplify(var_name(binding.var), "qdq_pair", q.out_dtype, "q(dq(x)) -> x", build)


def eliminate_qdq_transparent(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """``dq -> reshape | permute_dims | squeeze | expand_dims -> q`` with equal parameters -> the op on the integers."""
    return run_pass(mod, log, "qdq_transparent", _transparent_planner)


def eliminate_qdq_pairs(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """``q(dq(x, s, zp), s, zp) -> x`` for equal constant scalar parameters and dtype."""
    return run_pass(mod, log, "qdq_pair", _pair_planner)
