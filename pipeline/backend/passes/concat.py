"""Offload of concat and split: the channel joins and cuts of C2f / ELAN / CSP blocks.

PT2E leaves a concat, or one piece of a split, between the dequantize of each
input and a quantize; both only move values, so each becomes one C7x vector
kernel that requantizes as it copies (``docs/reference.md``, "Concat and split")::

    q(concat((e_0, ..., e_{K-1}), axis))  ->  call_tir(c7x_concat<K>_i8 | _i16, x_0, ..., x_{K-1})
    q(split(dq(x), ..., axis)[i])         ->  call_tir(c7x_concat1_i8 | _i16, x)

where each ``e_j`` is ``dq(x_j)`` (all of ``x_j``) or ``split(dq(x_j), ..., axis)[i]``
(a piece of ``x_j``). A tensor of shape S seen along axis a is ``outer =
prod(S[:a])`` blocks of ``size = prod(S[a:])`` elements, and a piece [b, e) of
that axis is the elements [b * inner, e * inner) of every block (``inner =
prod(S[a+1:])``): a *segment*. Consecutive pieces of one tensor with the same
quantization merge into one segment (a C2f block concatenates both halves of
the split it started with: one read of the tensor, not two).

Exact: the kernel computes torch's dequantize then quantize in float32 for each
element (:func:`.requantize.requantize_scalars`), which is what the PyTorch Q/DQ
model computes around a concat or split that copies floats unchanged.

Eligibility: one dtype, int8 or int16, in and out (an int8 / int16 mix is
declined), constant scalar scales and zero points, static shapes, no constant
input other than a float32 one of a concat (ViT's class token: quantized at compile time
with the output's parameters, exact since quantize is element-wise), a piece cut along the concat's own blocks, and at most
:data:`~pipeline.backend.kernels.reference.MAX_SEGMENTS` segments after merging.
Concat and split are data movement, not layers (:mod:`pipeline.backend.manifest`):
the log keeps the decision under the concat's (or the piece's) binding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from ..kernels.catalog import find
from ..kernels.reference import MAX_SEGMENTS, quantize_per_tensor
from ..refusal import Declined, declining
from .graph import QDQ, Graph, const, const_array, dequantize_of, quantize_of, static_shape, var_name
from .log import OffloadLog
from .primfunc import TensorArg, offload_primfunc
from .requantize import inverse_scale, requantize_scalars
from .rewrite import Offload, run_pass



@dataclass(frozen=True)
class Segment:
    """Elements ``[offset, offset + n)`` of each of the ``outer`` blocks of ``size``
    elements of the integer tensor ``dq.data``, dequantized by ``dq``."""

    dq: QDQ
    outer: int
    size: int
    offset: int
    n: int

    def follows(self, prev: "Segment") -> bool:
        """True when this segment continues ``prev`` in the same tensor and quantization."""
        return (self.dq.data.same_as(prev.dq.data) and self.dq.same_params(prev.dq) and self.outer == prev.outer
                and self.size == prev.size and prev.offset + prev.n == self.offset)


def _axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise Declined(f"axis {axis} out of range for rank {rank}")
    return axis % rank


def _piece(graph: Graph, expr) -> tuple[QDQ, int, int, int] | None:
    """``(dq, axis, begin, end)`` when ``expr`` is ``split(dq(x), ..., axis)[i]``, covering
    [begin, end) of x's ``axis``; None when it is no split piece."""
    item = graph.value.get(expr) if isinstance(expr, relax.Var) else expr
    if not isinstance(item, relax.TupleGetItem):
        return None
    split = graph.call(item.tuple_value, "relax.split")
    dq = dequantize_of(graph, split.args[0]) if split is not None else None
    if dq is None:
        return None
    shape = static_shape(dq.data)
    if shape is None:
        raise Declined("dynamic shape")
    axis = _axis(int(split.attrs.axis), len(shape))
    cuts = split.attrs.indices_or_sections
    if isinstance(cuts, tvm.tirx.IntImm):  # n equal sections
        step = shape[axis] // int(cuts.value)
        bounds = [step * j for j in range(int(cuts.value) + 1)]
    else:
        bounds = [0, *(int(c) for c in cuts), shape[axis]]
    return dq, axis, bounds[item.index], bounds[item.index + 1]


def _quantized_constant(graph: Graph, expr, q: QDQ) -> QDQ | None:
    """A float constant input of a concat as the integer constant ``q`` makes of it, behind a
    dequantize of ``q``'s parameters (ViT's class token): ``q(concat(c, dq(x))) = concat(q(c),
    q(dq(x)))`` since quantize is element-wise, and the kernel's requantize of ``q(c)`` at equal
    parameters gives ``q(c)`` back. Computed as torch's ``quantize_per_tensor``
    (:func:`~pipeline.backend.kernels.reference.quantize_per_tensor`). None when ``expr`` is no float constant (or
    ``broadcast_to`` of one)."""
    value = const_array(expr)
    bcast = graph.call(expr, "relax.broadcast_to") if value is None else None
    if bcast is not None and const_array(bcast.args[0]) is not None and static_shape(expr) is not None:
        value = np.broadcast_to(const_array(bcast.args[0]), static_shape(expr))   # the class token's expand
    if value is None or value.dtype != np.float32 or not q.scalar or find("concat", q.out_dtype, variant="1") is None:
        return None
    inv = np.float32(inverse_scale(float(np.float32(q.s))))
    ints = quantize_per_tensor(value, q.z, inv, np.dtype(q.out_dtype))
    return QDQ(const(ints), q.scale, q.zp, -1, "float32")


def _segment(graph: Graph, expr, axis: int | None, q: QDQ | None = None) -> Segment:
    """The segment ``expr`` is, seen as the blocks of ``axis`` (a concat's; None: a piece on
    its own, along its split axis); a float constant is quantized with ``q``'s parameters
    (:func:`_quantized_constant`). Raises Declined when it is none of these forms."""
    folded = _quantized_constant(graph, expr, q) if q is not None and axis is not None else None
    if folded is not None:
        shape = static_shape(folded.data)
        a = _axis(axis, len(shape))
        return Segment(folded, math.prod(shape[:a]), math.prod(shape[a:]), 0, math.prod(shape[a:]))
    piece = _piece(graph, expr)
    dq = piece[0] if piece is not None else dequantize_of(graph, expr)
    if dq is None:
        raise Declined(f"input {var_name(expr) if isinstance(expr, relax.Var) else expr} is not a dequantize "
                       f"or a split piece of one")
    if const_array(dq.data) is not None:
        raise Declined("an input is a compile-time constant")
    shape = static_shape(dq.data)
    if shape is None:
        raise Declined("dynamic shape")
    if piece is None:
        a = _axis(axis, len(shape))
        return Segment(dq, math.prod(shape[:a]), math.prod(shape[a:]), 0, math.prod(shape[a:]))
    _, a, begin, end = piece
    inner = math.prod(shape[a + 1:])
    seg = Segment(dq, math.prod(shape[:a]), math.prod(shape[a:]), begin * inner, (end - begin) * inner)
    if axis is not None:  # the piece must be whole blocks of the concat's axis, in order
        piece_shape = static_shape(expr)
        c = _axis(axis, len(piece_shape))
        if (seg.outer, seg.n) != (math.prod(piece_shape[:c]), math.prod(piece_shape[c:])):
            raise Declined(f"a piece split along axis {a} joined along axis {c}")
    return seg


def _merged(segments: list[Segment]) -> list[Segment]:
    out: list[Segment] = []
    for s in segments:
        if out and s.follows(out[-1]):
            p = out[-1]
            out[-1] = Segment(p.dq, p.outer, p.size, p.offset, p.n + s.n)
        else:
            out.append(s)
    return out


def _plan(binding, q: QDQ, segments: list[Segment]) -> Offload:
    dtype = q.out_dtype
    if find("concat", dtype, variant="1") is None:
        raise Declined(f"output dtype {dtype}: only int8 and int16 have a kernel")
    for s in segments:
        if str(s.dq.data.ty.dtype) != dtype:
            raise Declined(f"an input is {s.dq.data.ty.dtype} and the output {dtype} (a mixed-precision join)")
    segments = _merged(segments)
    if len(segments) > MAX_SEGMENTS:
        raise Declined(f"{len(segments)} segments: the kernels take at most {MAX_SEGMENTS}")
    out_shape = static_shape(binding.var)
    if out_shape is None:
        raise Declined("dynamic shape")
    kernel = find("concat", dtype, variant=str(len(segments)))
    tensors = [TensorArg(f"in{j}", static_shape(s.dq.data), dtype) for j, s in enumerate(segments)]
    tensors.append(TensorArg("out", out_shape, dtype))
    scalars: list = [segments[0].outer]
    for s in segments:
        in_zp, in_scale, out_zp, out_inv = requantize_scalars(s.dq, q)
        scalars += [s.size, s.offset, s.n, in_zp, in_scale]
    scalars += [out_zp, out_inv]
    prim = offload_primfunc(kernel, tensors, scalars)

    def build(ctx):
        return ctx.call_offload(prim, [s.dq.data for s in segments], out_shape, dtype)

    return Offload(var_name(q.data), "concat" if len(segments) > 1 else "split", dtype, kernel, build,
                   note=f"{len(segments)} segment(s): torch's dequantize + quantize in float32")


def _planner(graph: Graph, binding):
    q = quantize_of(graph, binding.value)
    if q is None:
        return None
    concat = graph.call(q.data, "relax.concat")
    if concat is not None:
        fields = concat.args[0].fields if isinstance(concat.args[0], relax.Tuple) else None
        with declining(var_name(q.data), "concat", q.out_dtype):
            if fields is None:
                raise Declined("the inputs are not a tuple literal")
            out_shape = static_shape(q.data)
            if out_shape is None:
                raise Declined("dynamic shape")
            if concat.attrs.axis is None:
                raise Declined("a concat of flattened inputs (axis None)")
            axis = _axis(int(concat.attrs.axis), len(out_shape))
            segments = [_segment(graph, f, axis, q) for f in fields]
            if len({s.outer for s in segments}) != 1:
                raise Declined("inputs of different outer extents")
            return _plan(binding, q, segments)
    if _piece(graph, q.data) is not None:
        with declining(var_name(q.data), "split", q.out_dtype):
            return _plan(binding, q, [_segment(graph, q.data, None)])
    return None


def offload_concat(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """``q(concat(...))`` of dequantized tensors and split pieces, and ``q`` of one split
    piece -> ``c7x_concat<K>_i8 | _i16(in_0, ..., in_{K-1}, out, outer, {size, offset, n, zp,
    scale} per segment, out_zp, out_inv_scale)`` (module docstring)."""
    return run_pass(mod, log, "concat", _planner)
