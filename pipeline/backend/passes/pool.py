"""Offload of int8 and int16 max pooling to the C7x max-pool kernels.

Pattern (``docs/reference.md``, "Max pool")::

    q(max_pool2d(dq(x, s, zp)), s, zp)  ->  call_tir(c7x_int8_max_pool_tidl | c7x_int8_max_pool, x)
                                            call_tir(c7x_int16_max_pool, x)          (int16, ours)

Max commutes with a monotone dequantize/quantize pair of *equal* parameters,
so the pool runs on the integers. Eligibility: int8, NCHW, static shapes,
dilation 1, symmetric padding smaller than the window (the kernel takes one
pH < kH, pW < kW; the output size, floor or ceil mode, comes from the
Relax type, which the header accepts either way), and constant scalar
input/output quantization. The reference requires equal zero points (and
skips the requantization when the scales differ); where the
input and output quantization differ (a pool after a concat, whose parts
torch's quantizer leaves float: GoogLeNet, Inception, SqueezeNet) we pool on
the input's integers and requantize with ``c7x_requantize_i8_i8``, torch's
dequantize + quantize in float32: max commutes with that monotone
(non-decreasing) map, so the pair equals ``q(max_pool2d(dq(x)))`` bit for bit.
The extern is ``c7x_int8_max_pool_tidl`` by default (reference target
default ``tidl-kernels=1``), ``c7x_int8_max_pool`` with ``tidl_kernels=False``.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax

from ..kernels.catalog import find
from ...config import DTYPES
from ..refusal import Declined, declining
from .graph import QDQ, Graph, dequantize_of, quantize_of, static_shape, var_name
from .log import OffloadLog
from .primfunc import TensorArg, offload_primfunc
from .requantize import requantize_scalars
from .rewrite import Offload, run_pass

REQUANTIZE = {dtype: find("requantize", dtype, dtype) for dtype in DTYPES}


def pooled_sizes(size: int, k: int, s: int, p: int) -> tuple[int, int]:
    """(floor-mode, torch ceil-mode) output sizes of one pooled axis (torch's rule:
    a ceil-mode window must start inside the input or its left padding)."""
    floor = (size + 2 * p - k) // s + 1
    ceil = -(-(size + 2 * p - k) // s) + 1
    if (ceil - 1) * s >= size + p:
        ceil -= 1
    return floor, ceil


def window_geometry(a, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> list[int]:
    """The pool kernels' geometry ``[N, C, H_in, W_in, H_out, W_out, kH, kW, sH, sW,
    pH, pW]`` of a relax max/avg pool with attrs ``a`` on NCHW ``in_shape`` ->
    ``out_shape``. Raises Declined (the reason) for a layout, dilation, padding
    or output size the kernels do not take."""
    if str(a.layout) != "NCHW" or str(a.out_layout) != "NCHW":
        raise Declined(f"layout {a.layout} (kernel takes NCHW)")
    if any(int(d) != 1 for d in a.dilation):
        raise Declined("dilation is not 1")
    top, left, bottom, right = [int(p) for p in a.padding]
    kh, kw = [int(k) for k in a.pool_size]
    if top != bottom or left != right:
        raise Declined(f"asymmetric padding {[top, left, bottom, right]}")
    if top >= kh or left >= kw:
        raise Declined(f"padding {[top, left]} not smaller than the window {[kh, kw]}")
    n, c, h, w = in_shape
    sh, sw = [int(s) for s in a.strides]
    if (out_shape[2] not in pooled_sizes(h, kh, sh, top)
            or out_shape[3] not in pooled_sizes(w, kw, sw, left)):
        raise Declined(f"output size {list(out_shape[2:])} is neither the floor- nor the ceil-mode size")
    return [n, c, h, w, out_shape[2], out_shape[3], kh, kw, sh, sw, top, left]


def _plan_pool(graph: Graph, pool, data: QDQ, out: QDQ, kernel: str, dtype: str) -> Offload:
    """The :class:`Offload` of ``q(max_pool2d(dq(x)))`` in ``dtype`` (``pool``: the pool
    call, ``data`` / ``out``: its dequantize / quantize); raises :class:`Declined`
    if it is not eligible."""
    if str(data.data.ty.dtype) != dtype or out.out_dtype != dtype:
        raise Declined(f"input {data.data.ty.dtype} and output {out.out_dtype}: this kernel pools {dtype}")
    requant = None if data.same_params(out) else requantize_scalars(data, out)
    in_shape, out_shape = static_shape(data.data), static_shape(out.data)
    if in_shape is None or out_shape is None or len(in_shape) != 4:
        raise Declined("dynamic or non-4-D shapes")
    scalars = window_geometry(pool.attrs, in_shape, out_shape)
    if not graph.single_use(out.data):
        raise Declined(f"float intermediate {var_name(out.data)} has other users")
    prim = offload_primfunc(kernel, [TensorArg("data", in_shape, dtype),
                                     TensorArg("out", out_shape, dtype)], scalars)

    if requant is None:
        def build(ctx):
            return ctx.call_offload(prim, [data.data], out_shape, dtype)

        return Offload(var_name(out.data), "max_pool2d", dtype, kernel, build)

    n = math.prod(out_shape)
    req = offload_primfunc(REQUANTIZE[dtype], [TensorArg("data", out_shape, dtype),
                                               TensorArg("out", out_shape, dtype)], [n, *requant])

    def build_requantized(ctx):
        pooled = ctx.emit(ctx.call_offload(prim, [data.data], out_shape, dtype), var_name(out.data) + "_pooled")
        return ctx.call_offload(req, [pooled], out_shape, dtype)

    return Offload(var_name(out.data), "max_pool2d", dtype, kernel, build_requantized,
                   note=f"pooled on the input's quantization, then {REQUANTIZE[dtype]} to the output's")


def _pool_planner(kernel: str, dtype: str):
    def planner(graph: Graph, binding):
        out = quantize_of(graph, binding.value)
        if out is None:
            return None
        pool = graph.call(out.data, "relax.nn.max_pool2d")
        data = dequantize_of(graph, pool.args[0]) if pool is not None else None
        if data is None or not isinstance(out.data, relax.Var):
            return None
        if dtype == "int8" and str(data.data.ty.dtype) == "int16":
            return None  # the int16 pass's
        with declining(var_name(out.data), "max_pool2d", str(data.data.ty.dtype)):
            return _plan_pool(graph, pool, data, out, kernel, dtype)

    return planner


def offload_max_pool2d_i8(mod: tvm.IRModule, log: OffloadLog | None = None,
                          tidl_kernels: bool = True) -> tvm.IRModule:
    """int8 max_pool2d -> ``c7x_int8_max_pool_tidl``
    (or ``c7x_int8_max_pool`` if ``tidl_kernels`` is False).

    Extern args: in int8[N,C,H,W], out int8[N,C,H_out,W_out], N, C, H_in, W_in, H_out,
    W_out, kH, kW, sH, sW, pH, pW.
    """
    kernel = find("max_pool", "int8", variant="tidl" if tidl_kernels else "")
    return run_pass(mod, log, "max_pool2d_i8", _pool_planner(kernel, "int8"))


def offload_max_pool2d_i16(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """int16 max_pool2d -> ``c7x_int16_max_pool`` (ours), the extern args of
    :func:`offload_max_pool2d_i8` on int16 (then ``c7x_requantize_i16_i16`` when the
    input and output quantization differ)."""
    return run_pass(mod, log, "max_pool2d_i16", _pool_planner(find("max_pool", "int16"), "int16"))
