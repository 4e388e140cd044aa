"""Offload of standalone int8 ReLU / clip (ReLU6) to the C7x element-wise kernels.

Patterns (``docs/reference.md``, "ReLU pass"); these are the activations the quantizer did
*not* fuse into a conv (``fuse_activations=False``, or after a non-conv op)::

    q(relu(dq(x, s, zp)), s, zp)        ->  call_tir(c7x_int8_relu,  x)   out = max(x, zp)
    q(clip(dq(x, s, zp), a, b), s, zp)  ->  call_tir(c7x_int8_clamp, x)   out = clamp(x, q(a), q(b))

Eligibility: int8 in and out, equal zero points and scales (relative
tolerance 1e-5 like the reference; the reference's relu rule only compares
zero points, but with different scales relu is not a pure clamp), input not
a compile-time constant. The bounds ``q(v)`` use torch's quantize semantics
(:func:`pipeline.backend.fold.quantize_value`). Different scales would need
the reference's ``c7x_int8_requantize_clamp``, which ``c7x_kernels.h`` does
not declare: such layers decline.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax

from ..kernels.catalog import find
from ..refusal import Declined, declining
from .graph import (QDQ, Activation, Graph, activation_of, const_array, dequantize_of, quantize_of,
                    static_shape, var_name)
from .log import OffloadLog
from .primfunc import TensorArg, offload_primfunc
from .rewrite import Offload, run_pass

SCALE_RTOL = 1e-5


def _plan_relu(graph: Graph, act: Activation, data: QDQ, out: QDQ) -> Offload:
    """The :class:`Offload` of ``q(act(dq(x)))`` (``data`` / ``out``: the
    dequantize / quantize); raises :class:`Declined` if it is not eligible."""
    if str(data.data.ty.dtype) != "int8" or out.out_dtype != "int8":
        raise Declined(f"only int8 {act.kind} has a kernel")
    if const_array(data.data) is not None:
        raise Declined("input is a compile-time constant")
    if not data.same_params(out, rtol=SCALE_RTOL):
        raise Declined("input and output quantization differ (no requantize-clamp kernel in c7x_kernels.h)")
    shape = static_shape(data.data)
    if shape is None:
        raise Declined("dynamic shape")
    if not graph.single_use(out.data):
        raise Declined(f"float intermediate {var_name(out.data)} has other users")
    tensors = [TensorArg("data", shape, "int8"), TensorArg("out", shape, "int8")]
    n = math.prod(shape)
    if act.kind == "relu":
        kernel, scalars = find("relu", "int8"), [n, out.z]
    else:
        kernel = find("clamp", "int8")
        scalars = [n, *act.int_bounds(out.s, out.z, "int8")]
    prim = offload_primfunc(kernel, tensors, scalars)

    def build(ctx):
        return ctx.call_offload(prim, [data.data], shape, "int8")

    return Offload(var_name(out.data), act.kind, "int8", kernel, build)


def _relu_planner(graph: Graph, binding):
    out = quantize_of(graph, binding.value)
    if out is None:
        return None
    act, inner = activation_of(graph, out.data)
    data = dequantize_of(graph, inner) if act is not None else None
    if data is None or not isinstance(out.data, relax.Var):
        return None
    with declining(var_name(out.data), act.kind, str(data.data.ty.dtype)):
        return _plan_relu(graph, act, data, out)


def offload_relu_i8(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """int8 ``dq -> relu -> q`` -> ``c7x_int8_relu(in, out, n, zp)``;
    ``dq -> clip(a, b) -> q`` -> ``c7x_int8_clamp(in, out, n, lo, hi)``."""
    return run_pass(mod, log, "relu_i8", _relu_planner)
