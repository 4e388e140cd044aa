"""Offload of integer gathers along one axis to the ``c7x_take_i8`` / ``_i16`` kernels (data movement).

Pattern (``docs/reference.md``, "Take"): ``take(x, index, axis)`` on an int8 / int16 tensor with a
constant 1-D index (or a scalar one: a select, which drops the axis), what the Q/DQ cleanups leave of ``torch.roll`` (Swin's cyclic shift: one take
per rolled axis, the index ``(arange(n) - shift) mod n``, folded at compile time) ->
``call_tir(c7x_take_<t>, x, index)`` with ``x`` viewed as ``[outer, n_in, inner]`` around the
axis. Runs with the permute pass, after the cleanups. Eligibility: int8 / int16, static shapes,
a constant integer index of one axis with every entry in range, input not a compile-time constant
(those fold). Anything else stays on the scalar path with the reason in the offload log.
"""

from __future__ import annotations

import math

import numpy as np
import tvm

from ..kernels.catalog import find
from ..refusal import Declined, declining
from .graph import Graph, const, const_array, static_shape, var_name
from .log import OffloadLog
from .primfunc import TensorArg, offload_primfunc
from .rewrite import Offload, run_pass



def _planner(graph: Graph, binding):
    call = graph.call(binding.value, "relax.take")
    if call is None:
        return None
    x = call.args[0]
    dtype = str(x.ty.dtype) if hasattr(x.ty, "dtype") else ""
    if find("take", dtype) is None:
        return None  # a float gather: part of a scalar layer
    with declining(var_name(binding.var), "take", dtype):
        shape, out_shape = static_shape(x), static_shape(binding.var)
        if shape is None or out_shape is None:
            raise Declined("dynamic shape")
        if const_array(x) is not None:
            raise Declined("input is a compile-time constant")
        index = const_array(call.args[1])
        if index is None or index.ndim > 1 or not np.issubdtype(index.dtype, np.integer):
            raise Declined("the index is not a constant integer scalar or 1-D array")
        index = index.reshape(-1)   # a scalar index (a select) drops the axis: the same bytes as [outer, 1, inner]
        if call.attrs.axis is None:
            raise Declined("a take of the flattened tensor")
        axis = int(call.attrs.axis) % len(shape)
        n_in = shape[axis]
        if index.size and (index.min() < -n_in or index.max() >= n_in):
            raise Declined(f"an index outside [-{n_in}, {n_in})")
        index = np.where(index < 0, index + n_in, index).astype(np.int32)   # numpy's negative indices
        outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
        kernel = find("take", dtype)
        prim = offload_primfunc(kernel, [TensorArg("data", shape, dtype), TensorArg("index", index.shape, "int32"),
                                         TensorArg("out", out_shape, dtype)],
                                [outer, n_in, index.size, inner])
        index_const = const(index)

        def build(ctx):
            return ctx.call_offload(prim, [x, index_const], out_shape, dtype)

        return Offload(var_name(binding.var), "take", dtype, kernel, build)


def offload_take(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """int8 / int16 ``take`` of a constant index along one axis -> ``c7x_take_i8`` / ``_i16(in,
    index, out, outer, n_in, n_out, inner)`` (module docstring)."""
    return run_pass(mod, log, "take", _planner)
