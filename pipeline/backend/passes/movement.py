"""Slices and zero pads of a dequantized tensor, rewritten so the kernels can take them (exact).

Swin's patch merging cuts its input into four strided slices and concatenates them; Swin V2 pads
each stage to a multiple of its window (8 does not divide 28 or 14) and crops the attention's
output back. PT2E leaves these between a dequantize and the next quantize, in float, where TVM
would run them as scalar calls. Two rewrites, both the identity on every float value, run before
the layer passes (``docs/reference.md``, "Slices and pads")::

    strided_slice(dq(x), axes, begin, end, strides)
        ->  dq(take(... take(x, arange(b_0, e_0, s_0), a_0) ..., arange(b_k, e_k, s_k), a_k))
    pad(dq(x), widths, 0.0)              (one padded axis a)
        ->  concat((zeros[before], dq(x), zeros[after]), a)
    pad(dq(x), widths, 0.0)              (axes a, b, ...)
        ->  concat_b(..., dq(q(concat_a(..., dq(x), ...), s, zp)), ...)

A zero pad whose quantized result feeds a conv is folded into the conv's padding instead (first):

    conv2d(dq(q(pad(y, widths on H and W, 0.0), s, zp)), W, padding=p)
        ->  conv2d(dq(q(y, s, zp)), W, padding=p + widths)

exact because ``q(0) = zp`` and the conv kernels pad with the input zero point; TensorFlow's
asymmetric "same" padding (EfficientNet-Lite) then runs inside the conv call, also when ``y`` is
the float model input.

The first of the two holds because dequantize is element-wise, so selecting elements before or after it is
the same; the takes then run on ``c7x_take_i8`` / ``_i16`` (:mod:`.take`). The second is the
definition of a zero pad; the concat pass (:mod:`.concat`) quantizes each float zero block at
compile time with its output's parameters (``q(0) = zp`` exactly) and copies the rest, so the
pad is a ``c7x_concat`` call. Between two padded axes the partial result is quantized with
``x``'s own ``(s, zp)`` and dequantized again, which gives back every value (each is ``dq(x)``
or 0, both on ``x``'s grid), so the second concat sees a dequantized integer tensor too.

Eligibility: ``x`` an int8 / int16 tensor that is no compile-time constant, with a constant
per-tensor scale and zero point; static shapes; slices with positive strides; pads of constant
mode and value 0. Anything else is left as it is (the scalar path, as before).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ...config import DTYPES
from .graph import (QDQ, Graph, const, const_array, dequantize_of, prim_number, quantize_of, static_shape,
                    var_name)
from .log import OffloadLog
from .rewrite import Simplify, run_pass, with_data

#: rounds of the slice rewrite: torch exports ``x[..., 0::2, 1::2, :]`` as one slice per axis
_MAX_CHAIN = 8


def _integer_source(graph: Graph, expr) -> QDQ | None:
    """``dq(x)`` when ``expr`` is a per-tensor dequantize of a non-constant int8 / int16 ``x``."""
    dq = dequantize_of(graph, expr)
    if dq is None or not dq.scalar or const_array(dq.data) is not None:
        return None
    if str(dq.data.ty.dtype) not in DTYPES or static_shape(dq.data) is None:
        return None
    return dq


def slice_indices(call, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> list[tuple[int, np.ndarray]] | None:
    """``[(axis, index int32 [n_out])]`` of a ``strided_slice`` with static shapes: the elements
    each sliced axis keeps, as Python's slicing picks them (Relax clamps out-of-range bounds the
    same way for positive strides). None for a negative or zero stride, or when the indices do
    not give ``out_shape``. Axes whose slice keeps everything in order are left out."""
    fields = [[prim_number(v) for v in arg.fields] for arg in call.args[1:5] if isinstance(arg, relax.Tuple)]
    if len(fields) < 3 or any(v is None for f in fields for v in f):
        return None
    axes, begin, end = fields[0], fields[1], fields[2]
    strides = fields[3] if len(fields) > 3 else [1.0] * len(axes)
    rank, picks = len(in_shape), []
    for a, b, e, s in zip(axes, begin, end, strides):
        if s <= 0:
            return None
        axis = int(a) % rank
        index = np.arange(in_shape[axis])[slice(int(min(b, 2**62)), int(min(e, 2**62)), int(s))]
        if index.size != out_shape[axis]:
            return None
        if index.size != in_shape[axis] or not np.array_equal(index, np.arange(in_shape[axis])):
            picks.append((axis, index.astype(np.int32)))
    return picks


def _slice_planner(graph: Graph, binding):
    call = graph.call(binding.value, "relax.strided_slice")
    if call is None:
        return None
    dq = _integer_source(graph, call.args[0])
    out_shape = static_shape(binding.var)
    if dq is None or out_shape is None:
        return None
    picks = slice_indices(call, static_shape(dq.data), out_shape)
    if picks is None:
        return None
    dq_call = graph.call(call.args[0], "relax.dequantize")
    name = var_name(binding.var)

    def build(ctx):
        x = ctx.remap(dq.data)
        for j, (axis, index) in enumerate(picks):
            x = ctx.emit(relax.op.take(x, const(index), axis=axis), f"{name}_take{j}")
        return with_data(dq_call, x)

    return Simplify(name, "strided_slice", str(dq.data.ty.dtype),
                    f"slice of {len(picks)} axis(es) on the integers: take per axis, then dequantize", build)


def pad_widths(call, rank: int) -> list[tuple[int, int, int]] | None:
    """``[(axis, before, after)]`` of the padded axes of a constant zero ``R.nn.pad`` of a
    rank-``rank`` tensor; None for another mode or value, or negative widths (a crop)."""
    attrs = call.attrs
    if str(getattr(attrs, "pad_mode", "constant")) != "constant":
        return None
    value = getattr(attrs, "pad_value", None)
    if value is None and len(call.args) > 1:
        value = prim_number(call.args[1])
    if value is None or float(value) != 0.0:
        return None
    widths = [int(w) for w in attrs.pad_width]
    if len(widths) != 2 * rank or min(widths) < 0:
        return None
    return [(a, widths[2 * a], widths[2 * a + 1]) for a in range(rank) if widths[2 * a] or widths[2 * a + 1]]


def _pad_planner(graph: Graph, binding):
    call = graph.call(binding.value, "relax.nn.pad")
    if call is None:
        return None
    dq = _integer_source(graph, call.args[0])
    if dq is None:
        return None
    shape = list(static_shape(dq.data))
    padded = pad_widths(call, len(shape))
    if not padded:
        return None
    dq_call = graph.call(call.args[0], "relax.dequantize")
    name = var_name(binding.var)

    def build(ctx):
        y = ctx.remap(call.args[0])
        for j, (axis, before, after) in enumerate(padded):
            if j:   # back onto x's grid: the identity on these values, and the concat pass sees a dq
                q = relax.op.quantize(y, dq_call.args[1], dq_call.args[2], int(dq_call.attrs.axis),
                                      str(dq.data.ty.dtype))
                y = with_data(dq_call, ctx.emit(q, f"{name}_q{j}"))
            parts = []
            for width in (before, after):
                block = list(shape)
                block[axis] = width
                parts.append(const(np.zeros(block, np.float32)) if width else None)
            fields = [p for p in (parts[0], y, parts[1]) if p is not None]
            shape[axis] += before + after
            y = relax.op.concat(fields, axis=axis)
            if j < len(padded) - 1:
                y = ctx.emit(y, f"{name}_pad{j}")
        return y

    return Simplify(name, "pad", str(dq.data.ty.dtype),
                    f"zero pad of {len(padded)} axis(es): a concat with zero blocks per axis", build)


def conv_pad_fold(graph: Graph, data) -> tuple | None:
    """``(y, [top, left, bottom, right], q_call, dq_call)`` when a conv's ``data`` is
    ``dq(q(pad(y)))``: a per-tensor
    quantize of a constant zero pad of only the height and width axes of an NCHW tensor ``y``
    (TensorFlow's "same" padding, exported as ``F.pad`` before an unpadded conv); else None."""
    dq, dq_call = dequantize_of(graph, data), graph.call(data, "relax.dequantize")
    q = quantize_of(graph, dq.data) if dq is not None else None
    if q is None or not (dq.scalar and q.scalar) or (float(q.scale), int(q.zp)) != (float(dq.scale), int(dq.zp)):
        return None   # the zero border must read back as 0.0: one (scale, zero point) for both
    pad = graph.call(q.data, "relax.nn.pad")
    shape = static_shape(pad.args[0]) if pad is not None else None
    padded = pad_widths(pad, len(shape)) if shape is not None and len(shape) == 4 else None
    if not padded or any(axis < 2 for axis, _, _ in padded) or dq_call is None:
        return None
    w = {axis: (before, after) for axis, before, after in padded}
    (top, bottom), (left, right) = w.get(2, (0, 0)), w.get(3, (0, 0))
    return pad.args[0], [top, left, bottom, right], graph.call(dq.data, "relax.quantize"), dq_call


def _conv_pad_planner(graph: Graph, binding):
    conv = graph.call(binding.value, "relax.nn.conv2d")
    fold = conv_pad_fold(graph, conv.args[0]) if conv is not None else None
    if fold is None:
        return None
    y, extra, q_call, dq_call = fold
    name = var_name(binding.var)

    def build(ctx):
        q = ctx.emit(with_data(q_call, ctx.remap(y)), f"{name}_q")
        x = ctx.emit(with_data(dq_call, q), f"{name}_dq")
        a = conv.attrs
        padding = [int(p) + e for p, e in zip(a.padding, extra)]
        return relax.op.nn.conv2d(x, ctx.remap(conv.args[1]), strides=a.strides, padding=padding,
                                  dilation=a.dilation, groups=a.groups, data_layout=a.data_layout,
                                  kernel_layout=a.kernel_layout, out_layout=a.out_layout, out_dtype=a.out_dtype)

    # logged on the pad's binding: the manifest's pad layer then says where it went
    return Simplify(var_name(q_call.args[0]), "pad", str(q_call.attrs.out_dtype),
                    f"zero pad {extra} (top, left, bottom, right) folded into the padding of conv {name}", build)


def integer_slices_and_pads(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """Rewrite ``strided_slice(dq(x))`` and the zero ``pad(dq(x))`` of int8 / int16 ``x`` into
    takes on ``x`` and concats with zero blocks (module docstring); values unchanged."""
    for _ in range(_MAX_CHAIN):   # a chain of slices (one per axis, as torch exports them) takes one round each
        new = run_pass(mod, log, "strided_slice", _slice_planner)
        if new is mod:
            break
        mod = new
    mod = run_pass(mod, log, "pad", _conv_pad_planner)   # before the concat rewrite sees those pads
    return run_pass(mod, log, "pad", _pad_planner)
