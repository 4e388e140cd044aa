"""Offload of an int8 softmax over the last axis to the ``c7x_int8_softmax`` kernel.

Pattern (``docs/reference.md``, "Softmax")::

    q(nn.softmax(dq(x, s, zp), axis=-1), 1/256, -128)  ->  call_tir(c7x_int8_softmax, x, table)

``table`` = :func:`pipeline.backend.kernels.reference.softmax_table` of ``s`` (int32[256],
a weights.bin constant); the kernel works on ``rows = prod(shape[:-1])`` rows of
``n = shape[-1]`` codes. Eligibility: int8 in and out, constant scalar qparams, the
output at the quantizer's fixed softmax qparams (:func:`pipeline.quant.specs.softmax_output_spec`),
the last axis, static shape, input not a constant, the float softmax used only by the
quantize. Anything else stays on the scalar path with the reason in the offload log.
"""

from __future__ import annotations

import math

import tvm

from ..kernels.catalog import find
from ..kernels.reference import SOFTMAX_OUT_SCALE, SOFTMAX_OUT_ZERO_POINT, softmax_table
from ..refusal import Declined, declining
from .graph import QDQ, Graph, const, const_array, dequantize_of, quantize_of, static_shape, var_name
from .log import OffloadLog
from .primfunc import TensorArg, offload_primfunc
from .rewrite import Offload, run_pass

KERNEL = find("softmax", "int8")


def _plan(graph: Graph, root, call, data: QDQ, out: QDQ) -> Offload:
    dtype = str(data.data.ty.dtype)
    if dtype != "int8" or out.out_dtype != "int8":
        raise Declined(f"{dtype} -> {out.out_dtype}: only int8 has a softmax kernel")
    if not (data.scalar and out.scalar):
        raise Declined("scales and zero points are not constant scalars")
    if (out.s, out.z) != (SOFTMAX_OUT_SCALE, SOFTMAX_OUT_ZERO_POINT):
        raise Declined(f"output qparams ({out.s}, {out.z}) are not the fixed softmax ones "
                       f"({SOFTMAX_OUT_SCALE}, {SOFTMAX_OUT_ZERO_POINT})")
    if const_array(data.data) is not None:
        raise Declined("input is a compile-time constant")
    shape = static_shape(data.data)
    if not shape or static_shape(root) != shape:
        raise Declined("dynamic or changing shape")
    if int(call.attrs.axis) not in (-1, len(shape) - 1):
        raise Declined(f"axis {int(call.attrs.axis)} is not the last axis")
    if not graph.single_use(root):
        raise Declined(f"float softmax {var_name(root)} has other users")
    rows, n = math.prod(shape[:-1]), shape[-1]
    prim = offload_primfunc(KERNEL, [TensorArg("data", shape, "int8"), TensorArg("table", (256,), "int32"),
                                     TensorArg("out", shape, "int8")], [rows, n])
    table = const(softmax_table(data.s))

    def build(ctx):
        return ctx.call_offload(prim, [data.data, table], shape, "int8")

    return Offload(var_name(root), "softmax", "int8", KERNEL, build)


def _planner(graph: Graph, binding):
    out = quantize_of(graph, binding.value)
    call = graph.call(out.data, "relax.nn.softmax") if out is not None else None
    data = dequantize_of(graph, call.args[0]) if call is not None else None
    if data is None:
        return None
    with declining(var_name(out.data), "softmax", str(data.data.ty.dtype)):
        return _plan(graph, out.data, call, data, out)


def offload_softmax_i8(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """int8 ``q(softmax(dq(x)), 1/256, -128)`` over the last axis ->
    ``c7x_int8_softmax(in, table, out, rows, n)`` (module docstring)."""
    return run_pass(mod, log, "softmax_i8", _planner)
