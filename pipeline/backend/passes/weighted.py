"""Matching and folding shared by the weighted-op families (conv, depthwise, FC).

Pattern (``docs/reference.md``, "Matched pattern"), walked backwards from the quantize::

    q( [relu | clip(a, b)] ( [reshape] ( [add(bias)] ( OP(dq(x, d_s, d_zp), dq(W, w_s, w_zp)) ))), o_s, o_zp)

where OP is ``conv2d`` or ``matmul(·, permute_dims(·))``, the bias is a
constant, possibly wrapped in reshape / expand_dims / squeeze / astype, that
broadcasts along the output-channel axis, and ``reshape`` (FC only) restores
the leading dims of a 3-D input. The fused values between OP and the quantize
must have no other users.

:func:`fold_weighted` turns a matched chain into the kernel's constants
(``docs/reference.md``, "Folding" and "int16 folding"; :mod:`pipeline.backend.fold`).
The ``check_*`` functions and the constant extractors raise
:class:`~pipeline.backend.refusal.Declined` when a matched chain is not
eligible.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from tvm import relax

from .. import fold
from ..refusal import Declined
from .graph import QDQ, Activation, Graph, activation_of, const_array, quantize_of, static_shape, var_name

_BIAS_WRAPPERS = ("relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.astype")


@dataclass
class WeightedChain:
    """A matched ``dq -> OP(dq W) -> [bias] -> [act] -> q`` chain (not yet checked for eligibility).

    ``op`` is the OP call, ``anchor`` its binding variable; ``out`` is the root
    quantize; ``bias_operand`` the non-OP operand of the bias add (or ``None``);
    ``out_reshape`` whether a reshape sits between OP/bias and the quantize.
    """

    anchor: object
    op: object
    act: Activation | None
    bias_operand: object
    out: QDQ
    out_reshape: bool
    fused: list

    @property
    def name(self) -> str:
        """Anchor name (the OP's binding) used in the offload log."""
        return var_name(self.anchor)


def match_chain(graph: Graph, binding, ops: tuple[str, ...], allow_reshape: bool = False) -> WeightedChain | None:
    """The chain ending at ``binding`` (a quantize) whose OP is one of ``ops``, or ``None``."""
    out = quantize_of(graph, binding.value)
    if out is None:
        return None
    fused = []
    act, expr = activation_of(graph, out.data)
    if act is not None:
        fused.append(out.data)
    out_reshape = False
    if allow_reshape and graph.call(expr, "relax.reshape") is not None:
        fused.append(expr)
        expr, out_reshape = graph.call(expr, "relax.reshape").args[0], True
    bias_operand = None
    add = graph.call(expr, "relax.add")
    if add is not None:
        lhs, rhs = add.args
        if graph.call(lhs, *ops) is not None:
            fused.append(expr)
            expr, bias_operand = lhs, rhs
        elif graph.call(rhs, *ops) is not None:
            fused.append(expr)
            expr, bias_operand = rhs, lhs
        else:
            return None
    op = graph.call(expr, *ops)
    if op is None or not isinstance(expr, relax.Var):
        return None
    fused.append(expr)
    return WeightedChain(expr, op, act, bias_operand, out, out_reshape, fused)


def check_fused_users(graph: Graph, chain: WeightedChain) -> None:
    """Raises :class:`Declined` if a float intermediate of the chain has other
    users (fusing would drop the value they read)."""
    for v in chain.fused:
        if not graph.single_use(v):
            raise Declined(f"float intermediate {var_name(v)} has other users")


def bias_vector(graph: Graph, operand, out_shape: tuple[int, ...], axis: int) -> np.ndarray | None:
    """Float bias[C] of the bias add, ``None`` without a bias.

    The operand must be a constant (possibly wrapped in reshape / expand_dims /
    squeeze / astype) whose shape, right-aligned against ``out_shape``, is 1
    everywhere except the channel ``axis`` (so it really is a per-channel
    bias); raises :class:`Declined` otherwise.
    """
    if operand is None:
        return None
    shape = static_shape(operand)
    if shape is None:
        raise Declined("bias has a dynamic shape")
    aligned = (1,) * (len(out_shape) - len(shape)) + shape
    channels = out_shape[axis]
    if len(aligned) != len(out_shape) or any(d != 1 for i, d in enumerate(aligned) if i != axis % len(out_shape)):
        raise Declined(f"bias of shape {list(shape)} is not a per-channel vector of the output {list(out_shape)}")
    expr = operand
    while const_array(expr) is None:
        wrapper = graph.call(expr, *_BIAS_WRAPPERS)
        if wrapper is None:
            raise Declined("bias is not a compile-time constant")
        expr = wrapper.args[0]
    values = const_array(expr).astype(np.float64).reshape(-1)
    if values.size not in (1, channels):
        raise Declined(f"bias has {values.size} values for {channels} channels")
    return np.broadcast_to(values, (channels,)).copy()


@dataclass
class Weights:
    """A constant per-channel dequantized weight: ``q`` int[C, ...], ``scale`` f32[C], ``zp`` int[C]."""

    q: np.ndarray
    scale: np.ndarray
    zp: np.ndarray


def weights_of(dq: QDQ | None, channels: int) -> Weights:
    """Constant weight of a ``dq(W, w_s, w_zp, axis=0)`` with ``channels`` output
    channels and zero point 0; raises :class:`Declined` for anything else."""
    if dq is None:
        raise Declined("weight is not a dequantize")
    w = const_array(dq.data)
    if w is None or dq.scale is None or dq.zp is None:
        raise Declined("weight, weight scale or weight zero point is not a compile-time constant")
    if dq.scale.size != 1 and dq.axis != 0:
        raise Declined(f"weight is quantized along axis {dq.axis}, not the output channel")
    if w.shape[0] != channels:
        raise Declined(f"weight has {w.shape[0]} output channels, expected {channels}")
    scale = np.broadcast_to(dq.scale.astype(np.float32).reshape(-1), (channels,)).copy()
    zp = np.broadcast_to(dq.zp.reshape(-1), (channels,)).copy()
    if np.any(zp != 0):
        raise Declined("weight zero point is not 0")
    return Weights(w, scale, zp)


def check_quant(data: QDQ | None, out: QDQ, dtype: str) -> None:
    """Checks on the activation Q/DQ of a weighted layer of ``dtype`` (int8 / int16):
    constant scalar parameters, output of ``dtype``, int16 zero points 0.
    Raises :class:`Declined` on the first that fails."""
    if data is None:
        raise Declined("input is not a dequantize")
    if not data.scalar or not out.scalar:
        raise Declined("input/output scale and zero point are not constant scalars")
    if out.out_dtype != dtype:
        raise Declined(f"output is quantized to {out.out_dtype}, input to {dtype}")
    if dtype == "int16" and (data.z != 0 or out.z != 0):
        raise Declined("int16 kernels need zero points 0")


def check_weight_dtype(w: np.ndarray, dtype: str) -> None:
    """int8 layers need int8 weights; int16 layers take int16 or (widened) int8
    weights. Raises :class:`Declined` otherwise."""
    wd = str(w.dtype)
    if dtype == "int8" and wd != "int8":
        raise Declined(f"{wd} weights with int8 activations")
    if dtype == "int16" and wd not in ("int8", "int16"):
        raise Declined(f"{wd} weights with int16 activations")


@dataclass
class Folded:
    """Kernel constants of a weighted layer: weights (widened, and for int8 weights
    pre-scaled, for int16), bias, scale, shift."""

    w: np.ndarray
    bias: np.ndarray
    scale: np.ndarray
    shift: np.ndarray
    note: str | None = None


#: Manifest note of an int16 layer whose int8 weights were widened and pre-scaled.
PRESCALE_NOTE = ("int8 weights widened to int16 and pre-scaled per output channel by k in [1,256] "
                 "(bias scaled by k too): requant multiplier k*scale/2^shift instead of scale/2^shift")


#: when an int8 layer's fold leaves int32, its channels whose weight scale is below this share of
#: the layer's largest are re-quantized at that floor and the fold tried again (``docs/reference.md``,
#: "Folding"): a dead channel (BatchNorm variance 0, weights about 0) gets a tiny scale, and
#: ``b / (d_s w_s)`` then leaves int32 once the output has a zero point. Measured: EfficientNet-Lite0's
#: stem, a channel of max |w| 2.4e-6 (2.4e-7 of the largest), bias -5.9, always 0 after ReLU6.
DEAD_CHANNEL_FLOOR = 2.0 ** -16


def _fold_i8(weights: Weights, bias, data: QDQ, out: QDQ, act_range: tuple[int, int] | None = None) -> Folded:
    """int8 (``docs/reference.md``, "Folding"):
    ``bias_i32 = round(b/(d_s w_s)) - d_zp sum W + round(o_zp o_s/(d_s w_s))``; when a value
    leaves int32, once more with the near-dead channels at :data:`DEAD_CHANNEL_FLOOR` (noted)."""
    try:
        return _fold_i8_at(weights, bias, data, out, act_range)
    except Declined:
        floored, channels = _floored(weights)
        if not channels:
            raise
        folded = _fold_i8_at(floored, bias, data, out, act_range)
        return replace(folded, note=(
            f"{len(channels)} near-dead channel(s) {channels[:8]} re-quantized at {DEAD_CHANNEL_FLOOR:g} of the "
            f"largest weight scale: their folded bias left int32"))


def _fold_i8_at(weights: Weights, bias, data: QDQ, out: QDQ, act_range) -> Folded:
    scale, shift = fold.requant_params(data.s, weights.scale, out.s)
    b = fold.fold_bias_i8(bias, data.s, data.z, weights.q, weights.scale, out.s, out.z,
                          requant=(scale, shift, act_range or fold.dtype_range("int8")))
    return Folded(weights.q, b, scale, shift)


def _floored(weights: Weights) -> tuple[Weights, list[int]]:
    """``weights`` with every channel whose scale is below :data:`DEAD_CHANNEL_FLOOR` of the
    largest re-quantized at that floor (``q' = round(q s / s')``, in int8), and those channels."""
    s = weights.scale.astype(np.float64).reshape(-1)
    floor = float(s.max()) * DEAD_CHANNEL_FLOOR
    low = np.flatnonzero(s < floor)
    if not low.size:
        return weights, []
    new = s.copy()
    new[low] = floor
    ratio = (s / new).reshape(-1, *([1] * (weights.q.ndim - 1)))
    q = np.clip(np.rint(weights.q.astype(np.float64) * ratio), -128, 127).astype(weights.q.dtype)
    return Weights(q, new.astype(np.float32), weights.zp), [int(c) for c in low]


def _fold_i16_full(weights: Weights, bias, data: QDQ, out: QDQ) -> Folded:
    """int16 with int16 weights (``docs/reference.md``, "int16 folding"): ``bias_i64 = round(b/(d_s w_s))``."""
    scale, shift = fold.requant_params(data.s, weights.scale, out.s)
    b = fold.fold_bias_i16(bias, data.s, weights.scale, weights.q.shape[0])
    return Folded(weights.q.astype(np.int16), b, scale, shift)


def _fold_i16_prescaled(weights: Weights, bias, data: QDQ, out: QDQ) -> Folded:
    """int16 with int8 weights: widen and pre-scale by ``k[c]`` (fold module docstring):
    ``W' = k W``, ``bias_i64 = round(b/(d_s w_s)) * k``, ``k*scale/2^shift ~= d_s w_s / o_s``."""
    k, scale, shift = fold.prescale_requant_params(data.s, weights.scale, out.s,
                                                   fold.prescale_limit(weights.q))
    b = fold.fold_bias_i16(bias, data.s, weights.scale, weights.q.shape[0], k)
    return Folded(fold.prescale_weights(weights.q, k), b, scale, shift, PRESCALE_NOTE)


def fold_weighted(weights: Weights, bias: np.ndarray | None, data: QDQ, out: QDQ, dtype: str,
                  act_range: tuple[int, int] | None = None) -> Folded:
    """Fold a matched layer into kernel constants; raises :class:`Declined` if it cannot be.

    int8: :func:`_fold_i8` (``docs/reference.md``, "Folding"). int16 with int16 weights:
    :func:`_fold_i16_full` ("int16 folding"). int16 with int8 weights:
    :func:`_fold_i16_prescaled`: widened to int16 (deviation (d): exact,
    doubles the weight memory) and pre-scaled per channel for a ~14-bit
    requantization multiplier (:mod:`pipeline.backend.fold`, "pre-scaling").
    Scale/shift never silently fall back to 1/0 (deviation (a)). ``act_range``: the kernel's
    saturation range (:func:`.rewrite.act_scalars`), which decides whether an int8 bias beyond
    int32 may be clipped (:func:`pipeline.backend.fold.saturating_bias`).
    """
    if dtype == "int8":
        return _fold_i8(weights, bias, data, out, act_range)
    if weights.q.dtype == np.int8:
        return _fold_i16_prescaled(weights, bias, data, out)
    return _fold_i16_full(weights, bias, data, out)
