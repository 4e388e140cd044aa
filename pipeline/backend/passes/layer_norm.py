"""Offload of an int8 LayerNorm over the last axis to the ``c7x_int8_layer_norm`` kernel.

Pattern (``docs/reference.md``, "LayerNorm")::

    q(nn.layer_norm(dq(x, s, zp), gamma, beta, axes=[-1], eps), s', zp')
        ->  call_tir(c7x_int8_layer_norm, x, gamma_q, beta_q)

``gamma_q`` int32 [n], ``beta_q`` int64 [n] and ``eps_q`` come from
:func:`pipeline.backend.kernels.reference.layer_norm_constants` (weights.bin constants
and a scalar); the kernel works on ``rows = prod(shape[:-1])`` rows of ``n = shape[-1]``
codes. Eligibility: int8 in and out, constant scalar qparams, constant gamma / beta of
``n`` elements, one normalised axis (the last), ``n`` <= 4096, static shape, input not a
constant, the float result used only by the quantize, constants that fit the kernel.
Anything else stays on the scalar path with the reason in the offload log.
"""

from __future__ import annotations

import math

import numpy as np
import tvm

from ..kernels.catalog import find
from ..kernels.reference import LAYER_NORM_MAX_N, layer_norm_constants
from ..refusal import Declined, declining
from .graph import QDQ, Graph, const, const_array, dequantize_of, quantize_of, static_shape, var_name
from .log import OffloadLog
from .primfunc import TensorArg, offload_primfunc
from .rewrite import Offload, run_pass

KERNEL = find("layer_norm", "int8")


def _affine(call, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The constant gamma and beta [n] of a layer_norm call (ones / zeros when not applied)."""
    gamma, beta = const_array(call.args[1]), const_array(call.args[2])
    if gamma is None or beta is None:
        raise Declined("weight or bias is not a compile-time constant")
    gamma = gamma if bool(call.attrs.scale) else np.ones(n)
    beta = beta if bool(call.attrs.center) else np.zeros(n)
    if gamma.size != n or beta.size != n:
        raise Declined(f"weight / bias of {gamma.size} / {beta.size} elements, not {n}")
    return gamma, beta


def _plan(graph: Graph, root, call, data: QDQ, out: QDQ) -> Offload:
    dtype = str(data.data.ty.dtype)
    if dtype != "int8" or out.out_dtype != "int8":
        raise Declined(f"{dtype} -> {out.out_dtype}: only int8 has a LayerNorm kernel")
    if not (data.scalar and out.scalar):
        raise Declined("scales and zero points are not constant scalars")
    if const_array(data.data) is not None:
        raise Declined("input is a compile-time constant")
    shape = static_shape(data.data)
    if not shape or static_shape(root) != shape:
        raise Declined("dynamic or changing shape")
    axes = [int(a) for a in call.attrs.axes]
    if axes not in ([-1], [len(shape) - 1]):
        raise Declined(f"normalises axes {axes}, not the last one")
    rows, n = math.prod(shape[:-1]), shape[-1]
    if n > LAYER_NORM_MAX_N:
        raise Declined(f"normalised axis of {n} elements (the kernel takes up to {LAYER_NORM_MAX_N})")
    if not graph.single_use(root):
        raise Declined(f"float layer_norm {var_name(root)} has other users")
    gamma, beta = _affine(call, n)
    try:
        gamma_q, beta_q, eps_q = layer_norm_constants(gamma, beta, float(call.attrs.epsilon), data.s, out.s, out.z)
    except ValueError as e:
        raise Declined(str(e)) from None
    prim = offload_primfunc(KERNEL, [TensorArg("data", shape, "int8"), TensorArg("gamma", (n,), "int32"),
                                     TensorArg("beta", (n,), "int64"), TensorArg("out", shape, "int8")],
                            [rows, n, data.z, eps_q])
    consts = [const(gamma_q), const(beta_q)]

    def build(ctx):
        return ctx.call_offload(prim, [data.data, *consts], shape, "int8")

    return Offload(var_name(root), "layer_norm", "int8", KERNEL, build)


def _planner(graph: Graph, binding):
    out = quantize_of(graph, binding.value)
    call = graph.call(out.data, "relax.nn.layer_norm") if out is not None else None
    data = dequantize_of(graph, call.args[0]) if call is not None else None
    if data is None:
        return None
    with declining(var_name(out.data), "layer_norm", str(data.data.ty.dtype)):
        return _plan(graph, out.data, call, data, out)


def offload_layer_norm_i8(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """int8 ``q(layer_norm(dq(x)))`` over the last axis ->
    ``c7x_int8_layer_norm(in, gamma, beta, out, rows, n, in_zp, eps_q)`` (module docstring)."""
    return run_pass(mod, log, "layer_norm_i8", _planner)
