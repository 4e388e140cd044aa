"""Offload of quantized depthwise conv2d (groups = C_in = C_out) to MMALIB.

Pattern: the conv pattern of :mod:`.conv` with ``groups == C_in`` and weight
``[C, 1, KH, KW]``::

    q([relu|clip](add(conv2d(dq(x), dq(W), groups=C), bias)), o_s, o_zp)
      ->  call_tir(mmalib_depthwise_conv2d_i8 | _i16, x, W[C*KH*KW], bias', scale, shift)
        (the relu / clip becomes the kernel's saturation range act_min, act_max)

Eligibility (``docs/reference.md``, "Eligibility"): square kernel 3, 5 or 7; stride 1 or 2 (square),
stride 2 only for kernels <= 5; dilation 1; N = 1; no channel multiplier;
int16: 3x3 only and all zero points 0. Folding and deviations (a), (b)
(padding reads the input zero point), (d) (int16 weight pre-scaling) as in
:mod:`.conv`. The weight is passed flat in natural
(C, KH, KW) order.
"""

from __future__ import annotations

import tvm

from ..kernels.catalog import find
from ..refusal import Declined, declining
from .conv import ConvGeometry, conv_geometry, conv_offload, fold_conv, match_conv
from .graph import Graph
from .log import OffloadLog
from .primfunc import TensorArg
from .rewrite import Offload, run_pass
from .weighted import WeightedChain

_KERNELS_I8 = (3, 5, 7)
_KERNELS_I16 = (3,)


def _check_shape(g: ConvGeometry, dtype: str) -> None:
    """Raises :class:`Declined` unless a depthwise kernel of ``dtype`` takes the
    channels, kernel size and stride of ``g``."""
    kh, kw = g.kernel
    if g.c_out != g.c_in:
        raise Declined(f"channel multiplier {g.c_out // g.c_in} (C_out={g.c_out} != C_in={g.c_in})")
    sizes = _KERNELS_I8 if dtype == "int8" else _KERNELS_I16
    if kh != kw or kh not in sizes:
        raise Declined(f"kernel {kh}x{kw} (supported: square {'/'.join(map(str, sizes))})")
    stride = g.strides[0]
    if stride not in (1, 2):
        raise Declined(f"stride {stride} (supported: 1, 2)")
    if stride == 2 and kh > 5:
        raise Declined(f"stride 2 with a {kh}x{kw} kernel (stride 2 only for kernels <= 5)")


def _plan_depthwise(graph: Graph, chain: WeightedChain, dtype: str) -> Offload:
    """The :class:`Offload` of a matched depthwise conv; raises :class:`Declined`
    if it is not eligible."""
    g = conv_geometry(chain)
    _check_shape(g, dtype)
    data, folded = fold_conv(graph, chain, g, dtype)
    kh, kw = g.kernel
    c = g.c_in
    scalars = [c, g.x_shape[2], g.x_shape[3], kh, kw, *g.strides, *g.pads, c]
    w_arg = TensorArg("weight", (c * kh * kw,), dtype)
    return conv_offload(chain, "depthwise_conv2d", dtype, find("depthwise_conv2d", dtype),
                        data, folded, w_arg, scalars, g)


def _dw_planner(dtype: str):
    def planner(graph: Graph, binding):
        chain = match_conv(graph, binding, dtype, depthwise=True)
        if chain is None:
            return None  # not a Q/DQ depthwise conv of this dtype (the conv passes decide the others)
        with declining(chain.name, "depthwise_conv2d", dtype):
            return _plan_depthwise(graph, chain, dtype)

    return planner


def offload_depthwise_conv2d_i8(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """int8 depthwise conv2d -> ``mmalib_depthwise_conv2d_i8``.

    Extern args (c7x_kernels.h): in int8[1,C,H,W], w int8[C*KH*KW], bias int32[C],
    scale uint8[C], shift uint8[C], out int8[1,C,H_out,W_out], C, H_in, W_in, KH, KW,
    stride_h, stride_w, pad_top, pad_bottom, pad_left, pad_right, num_groups = C, pad_value,
    act_min, act_max.
    """
    return run_pass(mod, log, "depthwise_conv2d_i8", _dw_planner("int8"))


def offload_depthwise_conv2d_i16(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """int16 depthwise 3x3 conv2d, zero points 0 -> ``mmalib_depthwise_conv2d_i16``
    (int16 data/weights, int64 bias; int8 weights are widened and pre-scaled per channel)."""
    return run_pass(mod, log, "depthwise_conv2d_i16", _dw_planner("int16"))
