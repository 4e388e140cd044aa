"""Helpers for the quantizer tests: run PT2E on a small net and read its Q/DQ graph.

The tests assert on the *converted* graph (``convert_pt2e`` output), where
every observed tensor became ``quantize_per_tensor -> dequantize_per_tensor``
(activations; scale/zero point are Python literals) or a folded int weight
feeding ``dequantize_per_channel`` (scales/zero points are get_attr buffers).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline import torchenv  # noqa: F401  (quiet torch, Q/DQ ops registered)

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from pipeline.quant import C7xMMAQuantizer

qd = torch.ops.quantized_decomposed
Q = qd.quantize_per_tensor.default
DQ = qd.dequantize_per_tensor.default
DQ_CHANNEL = qd.dequantize_per_channel.default
QDQ_OPS = {Q, DQ, DQ_CHANNEL, qd.quantize_per_channel.default}


@dataclass(frozen=True)
class TensorQParams:
    """Per-tensor parameters of one quantize/dequantize node."""

    scale: float
    zero_point: int
    quant_min: int
    quant_max: int
    dtype: torch.dtype


def calibration(shape, n: int = 4, seed: int = 0) -> list[torch.Tensor]:
    """``n`` seeded Gaussian batches of ``shape``."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen) for _ in range(n)]


def prepare(model: torch.nn.Module, example: torch.Tensor, quantizer=None, **kwargs) -> GraphModule:
    """export -> prepare_pt2e with ``quantizer`` (default: C7xMMAQuantizer(**kwargs))."""
    ep = torch.export.export(model.eval(), (example,))
    return prepare_pt2e(ep.module(), quantizer or C7xMMAQuantizer(**kwargs))


def convert(model: torch.nn.Module, example: torch.Tensor, calib: list[torch.Tensor] | None = None,
            quantizer=None, **kwargs) -> GraphModule:
    """export -> prepare -> calibrate on ``calib`` (default 4 Gaussian batches) -> convert."""
    prepared = prepare(model, example, quantizer, **kwargs)
    with torch.no_grad():
        for x in calib if calib is not None else calibration(example.shape):
            prepared(x)
    return convert_pt2e(prepared)


def nodes(gm: GraphModule, *targets) -> list[Node]:
    """call_function nodes of ``gm`` whose target is one of ``targets``."""
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in targets]


def one(gm: GraphModule, target) -> Node:
    """The single call_function node with ``target`` (asserts there is exactly one)."""
    found = nodes(gm, target)
    assert len(found) == 1, f"expected one {target}, found {[n.name for n in found]}"
    return found[0]


def qparams(node: Node) -> TensorQParams:
    """Parameters of a quantize_per_tensor / dequantize_per_tensor node."""
    assert node.target in (Q, DQ), node.format_node()
    _, scale, zp, lo, hi, dtype = node.args[:6]
    return TensorQParams(float(scale), int(zp), lo, hi, dtype)


def input_dq(node: Node, index: int = 0) -> TensorQParams | None:
    """Params of the dequantize feeding ``node.args[index]``; None if that input is float."""
    arg = node.args[index]
    if isinstance(arg, Node) and arg.target == DQ:
        return qparams(arg)
    return None


def output_q(node: Node) -> TensorQParams | None:
    """Params of the quantize applied to ``node``'s output; None if it stays float."""
    qs = [u for u in node.users if u.target == Q]
    assert len(qs) <= 1, f"{node.name} has several quantize users"
    return qparams(qs[0]) if qs else None


@dataclass(frozen=True)
class ChannelQParams:
    """Parameters of one dequantize_per_channel node (a weight)."""

    scales: torch.Tensor
    zero_points: torch.Tensor
    axis: int
    quant_min: int
    quant_max: int
    dtype: torch.dtype
    int_weight: torch.Tensor


def weight_dq(gm: GraphModule, node: Node, index: int = 1) -> ChannelQParams | None:
    """Params of the per-channel dequantize feeding ``node.args[index]`` (None if not
    per-channel dequantized)."""
    arg = node.args[index]
    if not (isinstance(arg, Node) and arg.target == DQ_CHANNEL):
        return None
    w, scales, zps, axis, lo, hi, dtype = arg.args[:7]
    attr = lambda n: getattr(gm, n.target)  # noqa: E731  (get_attr buffers)
    return ChannelQParams(attr(scales), attr(zps), axis, lo, hi, dtype, attr(w))

