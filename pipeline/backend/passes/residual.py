"""Offload of quantized residual adds to the C7x residual-add kernel.

Pattern (both operands dequantized activations; either operand order, the
first becomes ``x``, the second ``skip``)::

    q([relu|clip](add(dq(x, s_x, zp_x), dq(skip, s_skip, zp_skip))), s_o, zp_o)
      ->  [int clip](call_tir(c7x_int8_residual_add_relu | c7x_int16_..., x, skip, params))

Eligibility (``docs/reference.md``, "Residual add"): constant scalar scales and zero points,
x / skip / output of one dtype (int8 or int16) and one static shape; int16: all zero points 0.
When one operand is broadcast to the other's shape (an attention bias or mask on the scores),
it becomes the skip of ``c7x_int8_broadcast_add`` / ``c7x_int16_...``, which reads it by strides
(:func:`broadcast_strides`; "Broadcast add"). ``params`` is the 16-byte blob of
:func:`pipeline.backend.fold.residual_add_params` (Q15 multipliers
``M = round(s_in / s_o * 2**15)``, range-checked). A fused ReLU sets
``has_relu`` (the kernel applies ``max(r, zp_o)``); a fused clip(a, b)
(an extension) becomes an integer clip to ``[q(a), q(b)]`` after the call.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax

from ..kernels.catalog import find
from .. import fold
from ..refusal import Declined, declining
from .graph import QDQ, Activation, Graph, activation_of, const, dequantize_of, quantize_of, static_shape, var_name
from .log import OffloadLog
from .primfunc import TensorArg, offload_primfunc
from .rewrite import Offload, emit_activation, run_pass


def _plan_residual(graph: Graph, binding, act: Activation | None, add_var, x: QDQ, skip: QDQ,
                   out: QDQ, dtype: str) -> Offload:
    """The :class:`Offload` of ``q([act](add(dq(x), dq(skip))))`` bound to
    ``binding`` (``add_var``: the add's binding variable); raises
    :class:`Declined` if it is not eligible."""
    if not (x.scalar and skip.scalar and out.scalar):
        raise Declined("scales and zero points are not constant scalars")
    if str(skip.data.ty.dtype) != dtype or out.out_dtype != dtype:
        raise Declined(f"operands {x.data.ty.dtype}/{skip.data.ty.dtype} and output "
                       f"{out.out_dtype} are not all {dtype}")
    shapes = [static_shape(e) for e in (x.data, skip.data, binding.var)]
    if None in shapes:
        raise Declined(f"shapes {shapes} are not static")
    broadcast = None
    if len(set(shapes)) != 1:
        if shapes[0] != shapes[2]:   # the broadcast operand becomes the skip (the add commutes)
            x, skip, shapes = skip, x, [shapes[1], shapes[0], shapes[2]]
        broadcast = broadcast_strides(shapes[2], shapes[1]) if shapes[0] == shapes[2] else None
        if broadcast is None:
            raise Declined(f"shapes {shapes}: no operand is the output's shape with the other read by "
                           "strides along at most three axis groups, the innermost unbroadcast")
    if dtype == "int16" and (x.z or skip.z or out.z):
        raise Declined("int16 kernel needs zero points 0")
    for v in ([out.data] if act is not None else []) + [add_var]:
        if not graph.single_use(v):
            raise Declined(f"float intermediate {var_name(v)} has other users")
    params = fold.residual_add_params(x.s, x.z, skip.s, skip.z, out.s, out.z)
    relu = act is not None and act.kind == "relu"
    shape = shapes[2]
    if broadcast is None:
        kernel, scalars = find("residual_add", dtype), [math.prod(shape), int(relu)]
    else:
        kernel, scalars = find("broadcast_add", dtype), [math.prod(shapes[1]), *broadcast, int(relu)]
    tensors = [TensorArg("x", shape, dtype), TensorArg("skip", shapes[1], dtype),
               TensorArg("params", (16,), "uint8"), TensorArg("out", shape, dtype)]
    prim = offload_primfunc(kernel, tensors, scalars)
    params_const = const(params)
    post = None if relu else act

    def build(ctx):
        res = ctx.call_offload(prim, [x.data, skip.data, params_const], shape, dtype)
        return emit_activation(ctx, res, post, out.s, out.z, dtype, f"{ctx.func_name}_out")

    return Offload(var_name(add_var), "residual_add", dtype, kernel, build)


def broadcast_strides(out_shape: tuple, skip_shape: tuple) -> tuple[int, int, int, int, int] | None:
    """``(d0, d1, d2, s0, s1)`` of ``c7x_*_broadcast_add`` for a skip of ``skip_shape`` broadcast
    (numpy's rules) to ``out_shape``, or None when that is no such read.

    Axes of length 1 are dropped and neighbours that are both broadcast or both not are merged;
    at most three groups may remain, the innermost not broadcast (it is the kernel's contiguous
    row d2). A broadcast group reads with stride 0, the others contiguously in the skip: MaxViT's
    position bias [1, 1, H, P, Q] on scores [1, G, H, P, Q] is (G, 1, HPQ, 0, 0); Swin's mask
    [1, nW, 1, N, N] on [1, nW, H, N, N] is (nW, H, NN, NN, 0)."""
    rank = len(out_shape)
    if len(skip_shape) > rank:
        return None
    padded = (1,) * (rank - len(skip_shape)) + tuple(skip_shape)
    groups: list[list] = []          # [size, broadcast]
    for o, k in zip(out_shape, padded):
        if k not in (1, o):
            return None
        if o == 1:
            continue
        if groups and groups[-1][1] == (k == 1):
            groups[-1][0] *= o
        else:
            groups.append([o, k == 1])
    if not groups or groups[-1][1] or len(groups) > 3:
        return None
    groups = [[1, True]] * (3 - len(groups)) + groups
    strides, stride = [], 1
    for size, broadcast in reversed(groups):
        strides.append(0 if broadcast else stride)
        stride *= 1 if broadcast else size
    (d0, _), (d1, _), (d2, _) = groups
    return d0, d1, d2, strides[2], strides[1]


def _residual_planner(dtype: str):
    def planner(graph: Graph, binding):
        out = quantize_of(graph, binding.value)
        if out is None:
            return None
        act, expr = activation_of(graph, out.data)
        add = graph.call(expr, "relax.add")
        if add is None or not isinstance(expr, relax.Var):
            return None
        x, skip = (dequantize_of(graph, a) for a in add.args)
        if x is None or skip is None or str(x.data.ty.dtype) != dtype:
            return None  # not a Q/DQ residual add of this pass's dtype
        with declining(var_name(expr), "residual_add", dtype):
            return _plan_residual(graph, binding, act, expr, x, skip, out, dtype)

    return planner


def offload_residual_add_i8(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """int8 residual add (+ReLU) -> ``c7x_int8_residual_add_relu(x, skip, params, out, n, has_relu)``
    with x/skip/out int8 of one shape, params uint8[16], n = element count."""
    return run_pass(mod, log, "residual_add_i8", _residual_planner("int8"))


def offload_residual_add_i16(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """int16 residual add (+ReLU), zero points 0 -> ``c7x_int16_residual_add_relu`` (same arguments)."""
    return run_pass(mod, log, "residual_add_i16", _residual_planner("int16"))
