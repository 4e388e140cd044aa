"""Kernel-exact requantization: weight scales chosen so the kernel's multiplier is exact.

The C7x kernels requantize an int8 conv / linear output with a 7-bit
multiplier, ``r[c] ~= scale / 2**shift`` with ``scale`` in [1, 127]
(docs/numerics.md, "The 7-bit multiplier"), where the Q/DQ model uses
``r[c] = s_in * s_w[c] / s_out`` in float. The relative gap (median 2.7e-3,
up to 7.6e-3) is a per-channel gain error that the deployed C adds on top of
the quantization itself.

But ``s_w[c]`` is ours to choose: any scale at least the observed one keeps
every weight inside the int8 range. :func:`snap_weight_scales` raises each
per-channel weight scale by the least amount (at most 1/64 relative, median
about 0.4 %) that makes ``s_in * s_w[c] / s_out`` exactly ``m / 2**k`` with
``m`` in [1, 127], ``k`` in [0, 31] (:func:`next_multiplier`). The Q/DQ model
then computes with the very multiplier the kernel applies, so the deployed
build loses nothing to it; the price is a weight step up to 1.6 % coarser
(relative weight error of an int8 weight is about 0.4 % of the channel's
range either way).

It applies to layers whose input, per-channel weights and output share one
dtype: int8 -> int8 with int8 weights, and int16 -> int16 with int16 weights
(``weight_dtype="int16"``: the same 7-bit multiplier, and an int16 weight step
1.6 % coarser is still 1/2000 of the channel's range). int16 layers with int8
weights already have a ~14-bit multiplier (docs/numerics.md, "int16
per-channel weight pre-scaling"). The scales are
read from ``convert_pt2e`` of a copy (the Q/DQ model the convert stage
builds), the same dequantize / quantize parameters codegen folds, and
written back into the prepared model's weight observers (``min_val`` /
``max_val``), so convert quantizes the float weights with the new scales.
"""

from __future__ import annotations

import copy
import math

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

from ..backend.fold import SCALE_MAX, SHIFT_MAX   # the kernel's multiplier limits
from .bias_correction import weighted_nodes
from .graph import attr_tensor, observer_of

_qd = torch.ops.quantized_decomposed
_ACTIVATIONS = {torch.ops.aten.relu.default, torch.ops.aten.relu_.default, torch.ops.aten.hardtanh.default,
                torch.ops.aten.hardtanh_.default, torch.ops.aten.clamp.default}


def next_multiplier(r: float) -> tuple[int, int] | None:
    """The least kernel multiplier ``m / 2**k >= r`` (``m`` in [1, 127], ``k`` in [0, 31]).

    Returns ``(m, k)``, or None when ``r`` is not positive and finite, above
    127, or below 2**-31 (no multiplier the kernel can hold; codegen then
    declines the layer as before). The smallest candidate over all ``k`` is
    ``ceil(r * 2**k) / 2**k`` at the largest ``k`` with ``ceil(r * 2**k) <= 127``.
    """
    if not (math.isfinite(r) and 0.0 < r <= SCALE_MAX):
        return None
    best = None
    for k in range(SHIFT_MAX + 1):
        m = math.ceil(r * 2.0**k)
        if m > SCALE_MAX:
            break
        if m >= 1 and (best is None or m / 2.0**k < best[0] / 2.0**best[1]):
            best = (m, k)
    return best


def _dq_scale(node) -> tuple[float, torch.dtype] | None:
    """(scale, dtype) of a per-tensor dequantize node, else None."""
    if isinstance(node, Node) and node.target == _qd.dequantize_per_tensor.default:
        return float(node.args[1]), node.args[5]
    return None


def _output_scale(node: Node, dtype: torch.dtype) -> float | None:
    """The scale of the ``dtype`` quantize a conv/linear output reaches through at most one
    ReLU / ReLU6 / clamp (the kernel's fused activation), else None."""
    cur = node
    for _ in range(2):
        if len(cur.users) != 1:
            return None
        (user,) = cur.users
        if user.target == _qd.quantize_per_tensor.default:
            return float(user.args[1]) if user.args[5] == dtype else None
        if user.target not in _ACTIVATIONS:
            return None
        cur = user
    return None


def _weight_observer(gm: GraphModule, node: Node, dtype: torch.dtype):
    """The per-channel ``dtype`` weight observer feeding ``node``'s weight in the prepared ``gm``, or None."""
    mod = observer_of(gm, node.args[1])
    return mod if mod is not None and getattr(mod, "ch_axis", None) == 0 and mod.dtype == dtype else None


def snap_weight_scales(gm: GraphModule) -> list[dict]:
    """Raise the weight scales of every int8 -> int8 (int16 -> int16 with int16 weights) conv2d / linear of the calibrated
    prepared ``gm`` (in place, its weight observers) so each channel's rescale
    ``s_in * s_w[c] / s_out`` is exactly a kernel multiplier (module doc).

    Returns one record per changed layer: ``node``, ``channels``, and the relative
    scale increase ``max_raise`` / ``mean_raise`` (unitless). Layers whose input,
    weights and output dtypes differ, with no observed weight, or a channel with no
    kernel multiplier are left alone. Raises RuntimeError if ``convert_pt2e`` renamed the conv/linear nodes.
    """
    qdq = convert_pt2e(copy.deepcopy(gm))
    q_nodes = {n.name: n for n in weighted_nodes(qdq)}
    records = []
    for node in weighted_nodes(gm):
        q = q_nodes.get(node.name)
        if q is None:
            raise RuntimeError(f"convert_pt2e renamed {node.name}; cannot match the Q/DQ layer")
        w_dq, data = q.args[1], _dq_scale(q.args[0])
        if data is None or w_dq.target != _qd.dequantize_per_channel.default:
            continue
        (s_in, dtype), obs = data, _weight_observer(gm, node, data[1])
        s_out = _output_scale(q, dtype)
        if obs is None or s_out is None:
            continue
        s_w = attr_tensor(qdq, w_dq.args[1].target).double()
        new = s_w.clone()
        for c, s in enumerate(s_w.tolist()):
            fit = next_multiplier(s_in * s / s_out)
            if fit is not None and s > float(obs.eps):
                new[c] = fit[0] / 2.0**fit[1] * s_out / s_in
        half = (obs.quant_max - obs.quant_min) / 2.0
        # torchao: scale = max(-min_val, max_val) / ((quant_max - quant_min) / 2)
        obs.max_val.copy_((new * half).to(obs.max_val.dtype))
        obs.min_val.copy_(-obs.max_val)
        raise_ = new / s_w - 1.0
        records.append({"node": node.name, "channels": int(new.numel()),
                        "max_raise": float(raise_.max()), "mean_raise": float(raise_.mean())})
    return records
