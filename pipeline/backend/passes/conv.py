"""Offload of quantized conv2d (groups = 1 and grouped) to MMALIB.

Pattern (NCHW data, OIHW weights)::

    q([relu|clip](add(conv2d(dq(x, d_s, d_zp), dq(W, w_s, 0)), bias)), o_s, o_zp)
      ->  [int clip](call_tir(mmalib_conv2d_i8 | _i16 | _i8_grouped_loop, x, W, bias', scale, shift))

Eligibility (facts B, "Eligibility"): data and weights int8 (i8) or int16 data
with int8/int16 weights (i16), weight zero point 0, dilation 1,
stride_h == stride_w, N = 1, static shapes; groups = 1 -> ``mmalib_conv2d_*``,
1 < groups < C_in with C_in and C_out divisible by groups ->
``mmalib_conv2d_i8_grouped_loop`` (int8 only); int16 needs zero points 0.
Constants: ``bias'`` int32 / int64, ``scale``/``shift`` uint8 per output
channel (:func:`~.weighted.fold_weighted`).

Deviations from the reference (documented in the offload log):
(a) a rescale that ``scale in [1,127], shift in [0,31]`` cannot represent
declines; (b) a padded layer whose input zero point is not 0 declines (the
kernel pads with raw 0, not the zero point); (d) int16 activations with int8
weights widen the weights at compile time.
"""

from __future__ import annotations

import tvm

from .common import const, Decline, Graph, Offload, TensorArg, dequantize_of, emit_activation, offload_primfunc, run_pass, static_shape
from .log import OffloadLog
from .weighted import WeightedChain, bias_vector, fold_weighted, fused_users_reason, match_chain, quant_reason, weight_dtype_reason, weights_of

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


def conv_geometry(chain: WeightedChain) -> ConvGeometry | str:
    """Geometry of the chain's conv2d, or why it has no offload kernel at all."""
    conv = chain.op
    shapes = [static_shape(e) for e in (conv.args[0], conv.args[1], chain.anchor)]
    if any(s is None or len(s) != 4 for s in shapes):
        return "dynamic or non-4-D shapes"
    g = ConvGeometry(*shapes, conv)
    if g.layouts != ("NCHW", "OIHW", "NCHW"):
        return f"layouts {'/'.join(g.layouts)} (kernels take NCHW/OIHW)"
    if g.x_shape[0] != 1:
        return f"batch {g.x_shape[0]} (kernels take N = 1)"
    if any(d != 1 for d in g.dilation):
        return f"dilation {g.dilation} (kernels take dilation 1)"
    if g.strides[0] != g.strides[1]:
        return f"stride {g.strides} is not square"
    return g


def check_common(graph: Graph, chain: WeightedChain, g: ConvGeometry, dtype: str):
    """Checks shared by conv and depthwise: quantization, zero-point padding,
    weights, bias, fused users. Returns ``(data_dq, weights, bias)`` or a reason."""
    conv = chain.op
    data = dequantize_of(graph, conv.args[0])
    reason = quant_reason(data, chain.out, dtype) or fused_users_reason(graph, chain)
    if reason:
        return reason
    if data.z != 0 and g.pads_any:
        return (f"input zero point {data.z} with padding {list(g.pads)} "
                "(the kernel pads with raw 0, not the zero point)")
    weights = weights_of(dequantize_of(graph, conv.args[1]), g.c_out)
    if isinstance(weights, str):
        return weights
    reason = weight_dtype_reason(weights.q, dtype)
    if reason:
        return reason
    bias = bias_vector(graph, chain.bias_operand, g.out_shape, axis=1)
    if isinstance(bias, str):
        return bias
    return data, weights, bias


def conv_offload(chain: WeightedChain, op: str, dtype: str, kernel: str, data, folded,
                 w_arg: TensorArg, scalars: list[int]) -> Offload:
    """The :class:`Offload` of a conv-like layer: ``call_tir`` on
    ``[x, W, bias, scale, shift]`` (W reshaped to ``w_arg.shape``) plus the
    fused activation's integer clip; ``scalars`` are the extern's int32 args."""
    out_shape = static_shape(chain.anchor)
    tensors = [TensorArg("data", static_shape(data.data), dtype), w_arg,
               TensorArg("bias", folded.bias.shape, str(folded.bias.dtype)),
               TensorArg("scale", folded.scale.shape, "uint8"),
               TensorArg("shift", folded.shift.shape, "uint8"),
               TensorArg("out", out_shape, dtype)]
    prim = offload_primfunc(kernel, tensors, scalars)
    w_const = const(folded.w.reshape(w_arg.shape))
    consts = [w_const, const(folded.bias), const(folded.scale), const(folded.shift)]
    out = chain.out

    def build(ctx):
        res = ctx.call_offload(prim, [data.data, *consts], out_shape, dtype)
        return emit_activation(ctx, res, chain.act, out.s, out.z, dtype, f"{ctx.func_name}_out")

    return Offload(chain.name, op, dtype, kernel, build, folded.note)


def _conv_planner(dtype: str):
    suffix = "i8" if dtype == "int8" else "i16"

    def planner(graph: Graph, binding):
        chain = match_chain(graph, binding, CONV_OPS)
        if chain is None:
            return None
        data = dequantize_of(graph, chain.op.args[0])
        if data is None or str(data.data.ty.dtype) != dtype:
            return None  # not a Q/DQ conv of this pass's dtype
        w_shape = static_shape(chain.op.args[1])
        groups = int(chain.op.attrs.groups)
        if groups > 1 and w_shape is not None and w_shape[1] == 1:
            return None  # depthwise: the depthwise passes decide
        op = "conv2d" if groups == 1 else "grouped_conv2d"
        decline = lambda reason: Decline(chain.name, op, dtype, reason)  # noqa: E731
        g = conv_geometry(chain)
        if isinstance(g, str):
            return decline(g)
        if groups > 1:
            if dtype != "int8":
                return decline(f"grouped conv (groups={groups}) has no int16 kernel")
            if not (groups < g.c_in and g.c_in % groups == 0 and g.c_out % groups == 0):
                return decline(f"groups={groups} does not divide C_in={g.c_in} and C_out={g.c_out}")
        checked = check_common(graph, chain, g, dtype)
        if isinstance(checked, str):
            return decline(checked)
        data, weights, bias = checked
        folded = fold_weighted(weights, bias, data, chain.out, dtype)
        if isinstance(folded, str):
            return decline(folded)
        kernel = f"mmalib_conv2d_{suffix}" if groups == 1 else "mmalib_conv2d_i8_grouped_loop"
        kh, kw = g.kernel
        scalars = [g.c_in, g.x_shape[2], g.x_shape[3], g.c_out, kh, kw, *g.strides, *g.pads]
        if groups > 1:
            scalars.append(groups)
        w_arg = TensorArg("weight", tuple(folded.w.shape), dtype)
        return conv_offload(chain, op, dtype, kernel, data, folded, w_arg, scalars)

    return planner


def offload_conv2d_i8(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """int8 conv2d, groups = 1 -> ``mmalib_conv2d_i8``; grouped -> ``mmalib_conv2d_i8_grouped_loop``.

    Args of the extern (c7x_kernels.h): in int8[1,C_in,H,W], w int8[C_out,C_in/g,KH,KW],
    bias int32[C_out], scale uint8[C_out], shift uint8[C_out], out int8[1,C_out,H_out,W_out],
    C_in, H_in, W_in, C_out, KH, KW, stride_h, stride_w, pad_top, pad_bottom, pad_left,
    pad_right[, groups].
    """
    return run_pass(mod, log, "conv2d_i8", _conv_planner("int8"))


def offload_conv2d_i16(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """int16 conv2d, groups = 1, all zero points 0 -> ``mmalib_conv2d_i16``
    (in/w/out int16, bias int64; int8 weights are widened)."""
    return run_pass(mod, log, "conv2d_i16", _conv_planner("int16"))


__all__ = ["offload_conv2d_i8", "offload_conv2d_i16", "conv_geometry", "ConvGeometry"]
