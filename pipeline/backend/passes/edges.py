"""Offload of the model's edges: the input quantize and the output dequantize.

Once every layer runs on MMALIB / C7x kernels, two passes over a tensor are left
to TVM's scalar code: the quantize of the float32 input and the dequantize of
each float32 output (often of a ``strided_slice`` that drops the output channels
the FC pass padded to the MMA's width). Each becomes one C7x vector kernel
(``docs/reference.md``, "Quantize and dequantize")::

    q(x), x a parameter of main                   ->  call_tir(c7x_quantize_f32_i8 | _i16, x)
    dq(y) returned by main (or in its tuple)      ->  call_tir(c7x_dequantize_i8_f32 | _i16_f32, y)
    dq(strided_slice(y)) returned, the slice a    ->  call_tir(c7x_dequantize_..._f32, y)
      prefix of y: every axis but the last of         reading the first n of y's n_in elements
      size 1, the last from 0 with step 1

Both compute torch's op in float32 (the quantize multiplies by torch's
reciprocal, :func:`.requantize.inverse_scale`), so the result equals the
PyTorch Q/DQ model's bit for bit. Eligibility: a per-tensor constant scale and
zero point, the scale finite and > 0, static shapes, int8 or int16. A quantize
or dequantize between scalar float ops inside the model stays with TVM, fused
into its neighbours (a kernel there would add a pass over memory, not remove one).
"""

from __future__ import annotations

import math

import numpy as np
import tvm

from ..kernels.catalog import find
from ..refusal import Declined, declining
from .graph import QDQ, Graph, dequantize_of, prim_number, quantize_of, static_shape, var_name
from .log import OffloadLog
from .primfunc import TensorArg, offload_primfunc
from .requantize import inverse_scale
from .rewrite import Offload, run_pass



def _scale_zp(q: QDQ) -> tuple[int, float]:
    """(zero point, float32 scale) of a per-tensor Q/DQ; raises Declined otherwise."""
    if not q.scalar:
        raise Declined("scale and zero point are not constant scalars")
    s = np.float32(q.s)
    if not (np.isfinite(s) and s > 0):
        raise Declined(f"scale {q.s} is not finite and positive")
    return q.z, float(s)


def _input_quantize(graph: Graph, binding):
    q = quantize_of(graph, binding.value)
    if q is None or q.data not in graph.params or find("quantize", "float32", q.out_dtype) is None:
        return None
    with declining(var_name(binding.var), "quantize", q.out_dtype):
        shape = static_shape(q.data)
        if shape is None:
            raise Declined("dynamic shape")
        zp, s = _scale_zp(q)
        kernel = find("quantize", "float32", q.out_dtype)
        prim = offload_primfunc(kernel, [TensorArg("data", shape, "float32"), TensorArg("out", shape, q.out_dtype)],
                                [math.prod(shape), zp, inverse_scale(s)])

        def build(ctx):
            return ctx.call_offload(prim, [q.data], shape, q.out_dtype)

        return Offload(var_name(binding.var), "quantize", q.out_dtype, kernel, build,
                       note="the model input: torch's quantize in float32")


def _prefix_source(graph: Graph, expr):
    """``(y, note)`` when ``expr`` is ``strided_slice(y)`` taking a contiguous prefix of
    ``y`` (module docstring), else ``(expr, None)``."""
    call = graph.call(expr, "relax.strided_slice")
    if call is None:
        return expr, None
    y, shape = call.args[0], static_shape(call.args[0])
    fields = [[prim_number(v) for v in a.fields] for a in call.args[1:]]
    axes, begin = fields[0], fields[1]
    strides = fields[3] if len(fields) > 3 else [1.0] * len(axes)
    if shape is None or len(axes) != 1 or int(axes[0]) % len(shape) != len(shape) - 1:
        raise Declined("the slice is not of the last axis")
    if begin != [0.0] or strides != [1.0] or any(d != 1 for d in shape[:-1]):
        raise Declined("the slice is not a contiguous prefix")
    return y, "a prefix of the padded FC output, read in place"


def _output_dequantize(graph: Graph, binding):
    dq = dequantize_of(graph, binding.value)
    if dq is None or binding.var not in graph.returned or dq.out_dtype != "float32":
        return None
    dtype = str(dq.data.ty.dtype)
    if find("dequantize", dtype, "float32") is None:
        return None
    with declining(var_name(binding.var), "dequantize", dtype):
        out_shape = static_shape(binding.var)
        src, note = _prefix_source(graph, dq.data)
        in_shape = static_shape(src)
        if out_shape is None or in_shape is None:
            raise Declined("dynamic shape")
        zp, s = _scale_zp(dq)
        kernel = find("dequantize", dtype, "float32")
        prim = offload_primfunc(kernel, [TensorArg("data", in_shape, dtype), TensorArg("out", out_shape, "float32")],
                                [math.prod(in_shape), math.prod(out_shape), zp, s])

        def build(ctx):
            return ctx.call_offload(prim, [src], out_shape, "float32")

        return Offload(var_name(binding.var), "dequantize", dtype, kernel, build,
                       note="; ".join(x for x in ("a model output: torch's dequantize in float32", note) if x))


def offload_input_quantize(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """``q(x)`` of a float32 parameter of ``main`` -> ``c7x_quantize_f32_i8 | _i16(in, out, n,
    out_zp, out_inv_scale)``; in / out of one shape, n elements."""
    return run_pass(mod, log, "quantize", _input_quantize)


def offload_output_dequantize(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """``dq(y)`` (or ``dq(strided_slice(y))``, a prefix) that ``main`` returns ->
    ``c7x_dequantize_i8_f32 | _i16_f32(in, out, n_in, n, in_zp, in_scale)``."""
    return run_pass(mod, log, "dequantize", _output_dequantize)
