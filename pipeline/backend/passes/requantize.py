"""Offload of int8 <-> int16 requantization at mixed-precision boundaries.

Where an int8 layer feeds an int16 one (or the reverse), ``convert_pt2e``
writes ``quantize_per_tensor(dequantize_per_tensor(x, s1, z1, int8), s2, z2,
int16)``, imported as::

    q(dq(x, s1, z1), s2, z2)  ->  call_tir(c7x_requantize_i8_i16 | c7x_requantize_i16_i8, x)

The kernels are ours (TI names none; docs/reference.md, "Requantize"), in the
style of the reference's float-scale ``c7x_int8_requantize_clamp`` /
``c7x_int8_rescale``: ``(in, out, n, in_zp, in_scale, out_zp, out_inv_scale)``
with float32 scales. They compute torch's dequantize then quantize in float32,
``rint(float32(x - z1) * s1 * float32(1 / s2)) + z2`` saturated
(docs/numerics.md, "torch's quantize"), so the result is bit-exact with the
PyTorch Q/DQ model and with the scalar path's legalisation of the same pair.

Ours beyond the boundaries: a same-dtype pair whose parameters differ
(``c7x_requantize_i8_i8`` / ``_i16_i16``, the max pool's kernels), what a
data-movement op observed on each side leaves: Swin V2's crop after its
attention (:mod:`.movement`) reads the projection's parameters and writes the
LayerNorm's. A same-dtype pair of equal parameters is the identity, the
cleanups' business (:mod:`.cleanup`).

Eligibility: int8 / int16 operands, constant scalar scales and zero
points, a non-constant input of static shape, scales finite and > 0.
"""

from __future__ import annotations

import math

import numpy as np
import tvm

from ..kernels.catalog import find
from ..refusal import Declined, declining
from .graph import QDQ, Graph, const_array, dequantize_of, quantize_of, static_shape, var_name
from .log import OffloadLog
from .primfunc import TensorArg, offload_primfunc
from .rewrite import Offload, run_pass


"""(input dtype, output dtype) -> extern name (a same-dtype pair only when the parameters differ)."""


def inverse_scale(scale: float) -> float:
    """``float32(1.0 / float64(scale))``: the reciprocal torch's ``quantize_per_tensor``
    multiplies by (``inv_scale = 1.0 / scale`` in Python, applied to a float32
    tensor), as a Python float holding a float32 value."""
    return float(np.float32(1.0 / np.float64(scale)))


def requantize_scalars(dq: QDQ, q: QDQ) -> list:
    """(in_zp, in_scale, out_zp, out_inv_scale) of the requantize kernels for
    ``q(dq(x))``: float32 scales and torch's reciprocal (:func:`inverse_scale`).
    Raises Declined unless both are constant scalars with finite scales > 0."""
    if not (dq.scalar and q.scalar):
        raise Declined("scales and zero points are not constant scalars")
    s_in, s_out = np.float32(dq.s), np.float32(q.s)
    if not (np.isfinite(s_in) and np.isfinite(s_out) and s_in > 0 and s_out > 0):
        raise Declined(f"scales {dq.s}, {q.s} are not finite and positive")
    return [dq.z, float(s_in), q.z, inverse_scale(float(s_out))]


def _plan_requantize(binding, dq: QDQ, q: QDQ, kernel: str) -> Offload:
    """The :class:`Offload` of ``q(dq(x))`` bound to ``binding``; raises
    :class:`Declined` if it is not eligible."""
    if not (dq.scalar and q.scalar):
        raise Declined("scales and zero points are not constant scalars")
    if const_array(dq.data) is not None:
        raise Declined("input is a compile-time constant")
    shape = static_shape(dq.data)
    if shape is None:
        raise Declined("dynamic shape")
    src, dst = str(dq.data.ty.dtype), q.out_dtype
    tensors = [TensorArg("data", shape, src), TensorArg("out", shape, dst)]  # "in": a Python keyword in lowered.py
    scalars = [math.prod(shape), *requantize_scalars(dq, q)]
    prim = offload_primfunc(kernel, tensors, scalars)

    def build(ctx):
        return ctx.call_offload(prim, [dq.data], shape, dst)

    return Offload(var_name(binding.var), "requantize", src, kernel, build,
                   note=f"{src} -> {dst}: torch's dequantize + quantize in float32")


def _requantize_planner(graph: Graph, binding):
    q = quantize_of(graph, binding.value)
    dq = dequantize_of(graph, q.data) if q is not None else None
    if dq is None:
        return None
    kernel = find("requantize", str(dq.data.ty.dtype), q.out_dtype)
    if kernel is None or (str(dq.data.ty.dtype) == q.out_dtype and dq.same_params(q)):
        return None  # a dtype pair without a kernel, or the identity (a cleanup's pattern)
    with declining(var_name(binding.var), "requantize", str(dq.data.ty.dtype)):
        return _plan_requantize(binding, dq, q, kernel)


def offload_requantize(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """int8 / int16 ``q(dq(x))`` across dtypes, or within one dtype with other parameters ->
    ``c7x_requantize_<in>_<out>(in, out, n, in_zp, in_scale, out_zp, out_inv_scale)``; in / out of
    one shape, n elements."""
    return run_pass(mod, log, "requantize", _requantize_planner)
