"""Offload of quantized conv2d (groups = 1 and grouped) to MMALIB.

Pattern (NCHW data, OIHW weights)::

    q([relu|clip](add(conv2d(dq(x, d_s, d_zp), dq(W, w_s, 0)), bias)), o_s, o_zp)
      ->  call_tir(mmalib_conv2d_i8 | _i16 | _i8_grouped_loop, x, W, bias', scale, shift)
        (the relu / clip becomes the kernel's saturation range act_min, act_max)

Eligibility (``docs/reference.md``, "Eligibility"): data and weights int8 (i8) or int16 data
with int8/int16 weights (i16), weight zero point 0, dilation 1,
stride_h == stride_w, N = 1, static shapes; groups = 1 -> ``mmalib_conv2d_*``,
1 < groups < C_in with C_in and C_out divisible by groups ->
``mmalib_conv2d_i8_grouped_loop`` (int8 only); int16 needs zero points 0.
Constants: ``bias'`` int32 / int64, ``scale``/``shift`` uint8 per output
channel (:func:`~.weighted.fold_weighted`).

Deviations from the reference (documented in the offload log):
(a) a rescale that ``scale in [1,127], shift in [0,31]`` cannot represent
declines; (b) the kernels take ``pad_value``, what a padding pixel reads: the input
zero point ``d_zp``. The float model pads with 0.0, i.e. with ``d_zp`` in the integer
domain, and the bias folds ``- d_zp * sum W`` for every pixel
(``docs/reference.md``, "Folding"), so border pixels are exact too; the reference
pads with raw 0 and is off at the border when ``d_zp != 0`` (int8 affine activations);
(d) int16 activations with int8 weights widen the weights at compile time and
pre-scale them per channel (:mod:`pipeline.backend.fold`, "pre-scaling").
"""

from __future__ import annotations


import tvm

from ..kernels.catalog import find
from ..refusal import Declined, declining
from .graph import Graph, const, dequantize_of, static_shape
from .log import OffloadLog
from .primfunc import TensorArg, offload_primfunc
from .rewrite import Offload, act_scalars, run_pass
from .weighted import (WeightedChain, bias_vector, check_fused_users, check_quant, check_weight_dtype,
                       fold_weighted, match_chain, weights_of)

CONV_OPS = ("relax.nn.conv2d",)


class ConvGeometry:
    """Static geometry of an NCHW/OIHW conv2d: shapes, stride, padding (top, bottom, left, right)."""

    def __init__(self, x_shape, w_shape, out_shape, conv):
        a = conv.attrs
        self.x_shape, self.w_shape, self.out_shape = x_shape, w_shape, out_shape
        self.groups = int(a.groups)
        self.strides = [int(s) for s in a.strides]
        self.dilation = [int(d) for d in a.dilation]
        top, left, bottom, right = [int(p) for p in a.padding]
        self.pads = (top, bottom, left, right)
        self.layouts = (str(a.data_layout), str(a.kernel_layout), str(a.out_layout))

    @property
    def c_in(self) -> int:
        """Input channels (NCHW axis 1)."""
        return self.x_shape[1]

    @property
    def c_out(self) -> int:
        """Output channels (OIHW axis 0)."""
        return self.w_shape[0]

    @property
    def kernel(self) -> tuple[int, int]:
        """(KH, KW)."""
        return self.w_shape[2], self.w_shape[3]

    @property
    def pads_any(self) -> bool:
        """True if any side is padded."""
        return any(self.pads)



def conv_geometry(chain: WeightedChain) -> ConvGeometry:
    """Geometry of the chain's conv2d; raises :class:`Declined` if no offload
    kernel takes it at all (shapes, layouts, batch, dilation, stride)."""
    conv = chain.op
    shapes = [static_shape(e) for e in (conv.args[0], conv.args[1], chain.anchor)]
    if any(s is None or len(s) != 4 for s in shapes):
        raise Declined("dynamic or non-4-D shapes")
    g = ConvGeometry(*shapes, conv)
    if g.layouts != ("NCHW", "OIHW", "NCHW"):
        raise Declined(f"layouts {'/'.join(g.layouts)} (kernels take NCHW/OIHW)")
    if g.x_shape[0] != 1:
        raise Declined(f"batch {g.x_shape[0]} (kernels take N = 1)")
    if any(d != 1 for d in g.dilation):
        raise Declined(f"dilation {g.dilation} (kernels take dilation 1)")
    if g.strides[0] != g.strides[1]:
        raise Declined(f"stride {g.strides} is not square")
    return g


def fold_conv(graph: Graph, chain: WeightedChain, g: ConvGeometry, dtype: str):
    """Checks and folding shared by conv and depthwise: quantization, weights,
    bias and fused users checked, the rescale folded (:func:`fold_weighted`).
    Returns ``(data_dq, folded)``; raises :class:`Declined` if a check or the
    folding fails."""
    data, weights, bias = _operands(graph, chain, g, dtype)
    act = act_scalars(chain.act, chain.out.s, chain.out.z, dtype)
    return data, fold_weighted(weights, bias, data, chain.out, dtype, act)


def _operands(graph: Graph, chain: WeightedChain, g: ConvGeometry, dtype: str):
    """``(data_dq, weights, bias)`` of a conv-like chain; raises :class:`Declined`
    if it cannot be offloaded."""
    conv = chain.op
    data = dequantize_of(graph, conv.args[0])
    check_quant(data, chain.out, dtype)
    check_fused_users(graph, chain)
    weights = weights_of(dequantize_of(graph, conv.args[1]), g.c_out)
    check_weight_dtype(weights.q, dtype)
    bias = bias_vector(graph, chain.bias_operand, g.out_shape, axis=1)
    return data, weights, bias


def conv_offload(chain: WeightedChain, op: str, dtype: str, kernel: str, data, folded,
                 w_arg: TensorArg, scalars: list[int], g: ConvGeometry) -> Offload:
    """The :class:`Offload` of a conv-like layer: ``call_tir`` on ``[x, W, bias, scale,
    shift]`` (W reshaped to ``w_arg.shape``); ``scalars``: the extern's int32 args
    before ``pad_value, act_min, act_max``. Padding pixels read the input zero point
    (deviation (b)); the fused activation is the kernel's saturation range
    (:func:`.rewrite.act_scalars`)."""
    out_shape = static_shape(chain.anchor)
    tensors = [TensorArg("data", g.x_shape, dtype), w_arg,
               TensorArg("bias", folded.bias.shape, str(folded.bias.dtype)),
               TensorArg("scale", folded.scale.shape, "uint8"),
               TensorArg("shift", folded.shift.shape, "uint8"),
               TensorArg("out", out_shape, dtype)]
    out = chain.out
    pad_value = int(data.z) if g.pads_any else 0
    prim = offload_primfunc(kernel, tensors,
                            scalars + [pad_value] + act_scalars(chain.act, out.s, out.z, dtype))
    w_const = const(folded.w.reshape(w_arg.shape))
    consts = [w_const, const(folded.bias), const(folded.scale), const(folded.shift)]

    def build(ctx):
        return ctx.call_offload(prim, [data.data, *consts], out_shape, dtype)

    note = folded.note
    if pad_value:
        note = "; ".join(n for n in (note, f"padding reads the input zero point {pad_value}") if n)
    return Offload(chain.name, op, dtype, kernel, build, note)


def match_conv(graph: Graph, binding, dtype: str, depthwise: bool) -> WeightedChain | None:
    """The conv chain at ``binding`` if its data is a dequantize of ``dtype``
    and it is depthwise (groups > 1, weight ``[C, 1, KH, KW]``) exactly when
    ``depthwise``, else None: the one test that splits the convs between the
    conv passes and the depthwise passes."""
    chain = match_chain(graph, binding, CONV_OPS)
    if chain is None:
        return None
    data = dequantize_of(graph, chain.op.args[0])
    if data is None or str(data.data.ty.dtype) != dtype:
        return None  # not a Q/DQ conv of this pass's dtype
    w_shape = static_shape(chain.op.args[1])
    is_depthwise = int(chain.op.attrs.groups) > 1 and w_shape is not None and w_shape[1] == 1
    return chain if is_depthwise == depthwise else None


def _plan_conv(graph: Graph, chain: WeightedChain, op: str, dtype: str) -> Offload:
    """The :class:`Offload` of a matched (grouped) conv; raises :class:`Declined`
    if it is not eligible."""
    groups = int(chain.op.attrs.groups)
    g = conv_geometry(chain)
    if groups > 1:
        if dtype != "int8":
            raise Declined(f"grouped conv (groups={groups}) has no int16 kernel")
        if not (groups < g.c_in and g.c_in % groups == 0 and g.c_out % groups == 0):
            raise Declined(f"groups={groups} does not divide C_in={g.c_in} and C_out={g.c_out}")
    data, folded = fold_conv(graph, chain, g, dtype)
    kernel = find("conv2d", dtype, variant="" if groups == 1 else "grouped")
    kh, kw = g.kernel
    scalars = [g.c_in, g.x_shape[2], g.x_shape[3], g.c_out, kh, kw, *g.strides, *g.pads]
    if groups > 1:
        scalars.append(groups)
    w_arg = TensorArg("weight", tuple(folded.w.shape), dtype)
    return conv_offload(chain, op, dtype, kernel, data, folded, w_arg, scalars, g)


def _conv_planner(dtype: str):
    def planner(graph: Graph, binding):
        chain = match_conv(graph, binding, dtype, depthwise=False)
        if chain is None:
            return None  # not a Q/DQ conv of this dtype, or depthwise (the depthwise passes decide)
        op = "conv2d" if int(chain.op.attrs.groups) == 1 else "grouped_conv2d"
        with declining(chain.name, op, dtype):
            return _plan_conv(graph, chain, op, dtype)

    return planner


def offload_conv2d_i8(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """int8 conv2d, groups = 1 -> ``mmalib_conv2d_i8``; grouped -> ``mmalib_conv2d_i8_grouped_loop``.

    Args of the extern (c7x_kernels.h): in int8[1,C_in,H,W], w int8[C_out,C_in/g,KH,KW],
    bias int32[C_out], scale uint8[C_out], shift uint8[C_out], out int8[1,C_out,H_out,W_out],
    C_in, H_in, W_in, C_out, KH, KW, stride_h, stride_w, pad_top, pad_bottom, pad_left,
    pad_right[, groups], pad_value, act_min, act_max.
    """
    return run_pass(mod, log, "conv2d_i8", _conv_planner("int8"))


def offload_conv2d_i16(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """int16 conv2d, groups = 1, all zero points 0 -> ``mmalib_conv2d_i16``
    (in/w/out int16, bias int64; int8 weights are widened and pre-scaled per channel,
    :mod:`pipeline.backend.fold` "pre-scaling")."""
    return run_pass(mod, log, "conv2d_i16", _conv_planner("int16"))


__all__ = ["offload_conv2d_i8", "offload_conv2d_i16", "conv_geometry", "ConvGeometry"]
