"""Offload of int8 / int16 average pooling to the C7x average-pool kernels.

Patterns (``docs/reference.md``, "Average pools")::

    q(mean(dq(x), axis=[H, W]))              ->  call_tir(c7x_int{8,16}_global_avg_pool, x)
    q(adaptive_avg_pool2d(dq(x), [1, 1]))    ->  call_tir(c7x_int{8,16}_global_avg_pool, x)
    q(avg_pool2d(dq(x)))                     ->  call_tir(c7x_int{8,16}_avg_pool, x)

torchvision's classifiers write the global pool as ``adaptive_avg_pool2d(x, 1)``,
which ATen computes (and ``torch.export`` records) as ``mean(x, (-1, -2),
keepdim=True)``; DenseNet's transitions are ``avg_pool2d(2, 2)``, Inception's
branches ``avg_pool2d(3, 1, 1)`` with ``count_include_pad``. The quantizer gives
the pool an output quantization of its own, so the kernels requantize: they
compute torch's dequantize -> float32 pool -> quantize with torch's order of
float32 additions (``c7x_kernels.h``), bit-exact with the Q/DQ model.

Eligibility: input and output of one dtype (int8 or int16), constant scalar
scales (finite, > 0) and zero points, a computed (not constant) input, NCHW,
static shapes, a float pool result used only by the quantize. ``mean``: a 4-D
input reduced over exactly its last two axes (keepdims either way: the output
bytes are the same). ``avg_pool2d``: dilation 1, symmetric padding smaller than
the window, the floor- or ceil-mode output size (the max pool's geometry,
:mod:`.pool`), no divisor override (Relax has none).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..kernels.catalog import find
from ...config import DTYPES
from ..refusal import Declined, declining
from .graph import QDQ, Graph, const_array, dequantize_of, quantize_of, static_shape, var_name
from .log import OffloadLog
from .pool import window_geometry
from .primfunc import TensorArg, offload_primfunc
from .requantize import requantize_scalars
from .rewrite import Offload, run_pass
_GLOBAL_OPS = ("relax.mean", "relax.nn.adaptive_avg_pool2d")


def _quant_scalars(data: QDQ, out: QDQ, dtype: str) -> list:
    """``[in_zp, in_scale, out_zp, out_inv_scale]`` of the kernels (float32 scales,
    torch's reciprocal); raises :class:`Declined` if the quantization does not fit."""
    if out.out_dtype != dtype:
        raise Declined(f"input {dtype} and output {out.out_dtype} differ (no requantizing pool kernel)")
    if not (data.scalar and out.scalar):
        raise Declined("scales and zero points are not constant scalars")
    if const_array(data.data) is not None:
        raise Declined("input is a compile-time constant")
    return requantize_scalars(data, out)


def _common(graph: Graph, pool_var, data: QDQ, out: QDQ, dtype: str):
    """(input shape, output shape, quantization scalars) after the checks shared by both
    patterns; raises :class:`Declined`."""
    scalars = _quant_scalars(data, out, dtype)
    in_shape, out_shape = static_shape(data.data), static_shape(pool_var)
    if in_shape is None or out_shape is None or len(in_shape) != 4:
        raise Declined("dynamic or non-4-D shapes")
    if not graph.single_use(pool_var):
        raise Declined(f"float intermediate {var_name(pool_var)} has other users")
    return in_shape, out_shape, scalars


def _is_global(call, in_shape) -> bool:
    """``call`` averages each [H, W] plane of an NCHW tensor down to one value."""
    if call.op.name == "relax.mean":
        axes = call.attrs.axis
        return axes is not None and sorted(int(a) % 4 for a in axes) == [2, 3]
    a = call.attrs
    size = [int(d) for d in a.output_size] if a.output_size is not None else list(in_shape[2:])
    return str(a.layout) == "NCHW" and str(a.out_layout) == "NCHW" and size == [1, 1]


def _plan_global(graph: Graph, call, pool_var, data: QDQ, out: QDQ, dtype: str) -> Offload:
    in_shape, out_shape, scalars = _common(graph, pool_var, data, out, dtype)
    if not _is_global(call, in_shape):
        raise Declined("not an average over the last two axes of an NCHW tensor")
    kernel = find("global_avg_pool", dtype)
    planes, hw = in_shape[0] * in_shape[1], in_shape[2] * in_shape[3]
    prim = offload_primfunc(kernel, [TensorArg("data", in_shape, dtype),   # "in": a Python keyword
                                     TensorArg("out", out_shape, dtype)], [planes, hw, *scalars])

    def build(ctx):
        return ctx.call_offload(prim, [data.data], out_shape, dtype)

    op = "mean" if call.op.name == "relax.mean" else "adaptive_avg_pool2d"
    return Offload(var_name(pool_var), op, dtype, kernel, build,
                   note="torch's dequantize, mean (its summation order) and quantize in float32")


def _plan_window(graph: Graph, call, pool_var, data: QDQ, out: QDQ, dtype: str) -> Offload:
    in_shape, out_shape, scalars = _common(graph, pool_var, data, out, dtype)
    kernel = find("avg_pool", dtype)
    geometry = [*window_geometry(call.attrs, in_shape, out_shape), int(bool(call.attrs.count_include_pad))]
    prim = offload_primfunc(kernel, [TensorArg("data", in_shape, dtype),
                                     TensorArg("out", out_shape, dtype)], [*geometry, *scalars])

    def build(ctx):
        return ctx.call_offload(prim, [data.data], out_shape, dtype)

    return Offload(var_name(pool_var), "avg_pool2d", dtype, kernel, build,
                   note="torch's dequantize, avg_pool2d and quantize in float32")


def _through_identity_reshape(graph: Graph, var):
    """The input of ``var`` when ``var`` is a reshape to its input's own shape (ConvNeXt's
    ``as_strided`` after its global pool), else ``var``."""
    reshape = graph.call(var, "relax.reshape")
    if reshape is None or not isinstance(reshape.args[0], relax.Var):
        return var
    shape = static_shape(var)
    return reshape.args[0] if shape is not None and shape == static_shape(reshape.args[0]) else var


def _planner(ops: tuple[str, ...], plan):
    def planner(graph: Graph, binding):
        out = quantize_of(graph, binding.value)
        if out is None or not isinstance(out.data, relax.Var):
            return None
        pool_var = _through_identity_reshape(graph, out.data)
        call = graph.call(pool_var, *ops)
        data = dequantize_of(graph, call.args[0]) if call is not None else None
        if data is None:
            return None
        dtype = str(data.data.ty.dtype)
        if dtype not in DTYPES:
            return None
        op = call.op.name.split(".")[-1]
        with declining(var_name(out.data), op, dtype):
            if pool_var is not out.data and not graph.single_use(pool_var):
                raise Declined(f"float intermediate {var_name(pool_var)} has other users")
            return plan(graph, call, pool_var, data, out, dtype)

    return planner


def offload_global_avg_pool(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """int8 / int16 ``q(mean(dq(x), [H, W]))`` and ``q(adaptive_avg_pool2d(dq(x), 1))`` ->
    ``c7x_int{8,16}_global_avg_pool(in, out, planes = N*C, hw = H*W, in_zp, in_scale,
    out_zp, out_inv_scale)``; in [N, C, H, W], out [N, C, 1, 1] or [N, C]."""
    return run_pass(mod, log, "global_avg_pool", _planner(_GLOBAL_OPS, _plan_global))


def offload_avg_pool2d(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """int8 / int16 ``q(avg_pool2d(dq(x)))`` -> ``c7x_int{8,16}_avg_pool(in, out, N, C, H_in,
    W_in, H_out, W_out, kH, kW, sH, sW, pH, pW, count_include_pad, in_zp, in_scale, out_zp,
    out_inv_scale)``."""
    return run_pass(mod, log, "avg_pool2d", _planner(("relax.nn.avg_pool2d",), _plan_window))
