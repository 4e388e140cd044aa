"""Offload of the squeeze-excitation multiply to the C7x channel-multiply kernel.

Pattern (``docs/reference.md``, "Squeeze-excitation multiply"; either operand order)::

    q(multiply(dq(x, s_x, zp_x), dq(gate, s_g, zp_g)), s_o, zp_o)
      ->  call_tir(c7x_int8_channel_mul | c7x_int16_channel_mul, x, gate, params)

with x ``[N, C, H, W]`` and gate ``[N, C, 1, 1]`` (the SE block's per-channel
scale, broadcast over H and W). Eligibility: constant scalar scales and zero
points, x / gate / output of one dtype (int8 or int16), static shapes, both
operands computed tensors; int16: all zero points 0. ``params`` is the blob of
:func:`pipeline.backend.fold.channel_mul_params` (one multiplier of 31 / 29
bits). A gate from a sigmoid is quantized only with the quantizer's SE-gate
extension (``pipeline/quant/rules.py``); a hardsigmoid gate always is.
"""

from __future__ import annotations


import tvm
from tvm import relax

from ..kernels.catalog import find
from .. import fold
from ..refusal import Declined, declining
from .graph import QDQ, Graph, const, const_array, dequantize_of, quantize_of, static_shape, var_name
from .log import OffloadLog
from .primfunc import TensorArg, offload_primfunc
from .rewrite import Offload, run_pass


def _operands(a: QDQ, b: QDQ):
    """``(x, gate)`` of the two dequantized operands if one is [N, C, H, W] and the other
    [N, C, 1, 1], else ``None``."""
    for x, g in ((a, b), (b, a)):
        xs, gs = static_shape(x.data), static_shape(g.data)
        if (xs is not None and gs is not None and len(xs) == len(gs) == 4
                and gs[:2] == xs[:2] and gs[2:] == (1, 1) and xs[2:] != (1, 1)):
            return x, g
    return None


def _plan(graph: Graph, mul_var, x: QDQ, gate: QDQ, out: QDQ, dtype: str) -> Offload:
    if not (x.scalar and gate.scalar and out.scalar):
        raise Declined("scales and zero points are not constant scalars")
    if str(gate.data.ty.dtype) != dtype or out.out_dtype != dtype:
        raise Declined(f"operands {dtype}/{gate.data.ty.dtype} and output {out.out_dtype} "
                       f"are not all {dtype}")
    if const_array(x.data) is not None or const_array(gate.data) is not None:
        raise Declined("an operand is a compile-time constant")
    if dtype == "int16" and (x.z or gate.z or out.z):
        raise Declined("int16 kernel needs zero points 0")
    if not graph.single_use(mul_var):
        raise Declined(f"float intermediate {var_name(mul_var)} has other users")
    params = fold.channel_mul_params(x.s, x.z, gate.s, gate.z, out.s, out.z, dtype)
    shape = static_shape(x.data)
    planes, hw = shape[0] * shape[1], shape[2] * shape[3]
    kernel = find("channel_mul", dtype)
    tensors = [TensorArg("x", shape, dtype), TensorArg("gate", static_shape(gate.data), dtype),
               TensorArg("params", (16,), "uint8"), TensorArg("out", shape, dtype)]
    prim = offload_primfunc(kernel, tensors, [planes, hw])
    params_const = const(params)

    def build(ctx):
        return ctx.call_offload(prim, [x.data, gate.data, params_const], shape, dtype)

    return Offload(var_name(mul_var), "multiply", dtype, kernel, build)


def _planner(graph: Graph, binding):
    out = quantize_of(graph, binding.value)
    if out is None or not isinstance(out.data, relax.Var):
        return None
    mul = graph.call(out.data, "relax.multiply")
    if mul is None:
        return None
    a, b = (dequantize_of(graph, v) for v in mul.args)
    pair = _operands(a, b) if a is not None and b is not None else None
    if pair is None:
        return None  # not a Q/DQ channel-broadcast multiply
    x, gate = pair
    dtype = str(x.data.ty.dtype)
    if dtype not in ("int8", "int16"):
        return None
    with declining(var_name(out.data), "multiply", dtype):
        return _plan(graph, out.data, x, gate, out, dtype)


def offload_channel_mul(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """int8 / int16 ``q(dq(x[N,C,H,W]) * dq(gate[N,C,1,1]))`` ->
    ``c7x_int{8,16}_channel_mul(x, gate, params, out, planes = N*C, hw = H*W)``."""
    return run_pass(mod, log, "channel_mul", _planner)
