"""FX graph helpers shared by the quantization passes (prepared and converted PT2E graphs).

A prepared graph (``prepare_pt2e``) carries observer modules as ``call_module``
nodes: activation observers after tensors, per-channel weight observers
between a weight's ``get_attr`` and its conv2d / linear. These helpers find
them, read the tensors behind ``get_attr`` nodes, and map in-place aten ops
to their out-of-place twins, and run a prepared graph as its float model.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.fx import GraphModule, Interpreter, Node
from torchao.quantization.pt2e import ObserverBase


def observer_of(gm: GraphModule, node) -> ObserverBase | None:
    """The observer module a ``call_module`` node runs, else None."""
    if isinstance(node, Node) and node.op == "call_module":
        mod = gm.get_submodule(node.target)
        if isinstance(mod, ObserverBase):
            return mod
    return None


PER_CHANNEL = (torch.per_channel_symmetric, torch.per_channel_affine)


def fake_quantize_per_tensor(x: torch.Tensor, scale: float, zero_point: int, quant_min: int,
                             quant_max: int) -> torch.Tensor:
    """``torch.fake_quantize_per_tensor_affine(x, scale, zero_point, quant_min, quant_max)``
    bit for bit (float32 in, float32 out, same shape and memory format), about 4x
    faster on CPU: ATen's kernel (QuantizedOpKernels.cpp, ``_fake_quantize_tensor_helper``)
    computes ``(clamp(zp + nearbyint(x * (1.0f / (float)scale)), qmin, qmax) - zp) * scale``
    per element without vectorizing; the same steps as whole-tensor float32 ops here
    (``torch.round`` is nearbyint, half to even; ``(q - zp) * scale`` is one rounding of
    an exact product either way). The range search and the mixed-precision simulation
    fake-quantize every activation of every candidate pass: most of their time.
    ``tests/quant/test_fake_quantize.py`` checks equality on ties, saturation, int8 and int16."""
    sc = np.float32(scale)
    inv = float(np.float32(1.0) / sc)
    q = (x * inv).round_().add_(zero_point).clamp_(quant_min, quant_max)
    return q.sub_(zero_point).mul_(float(sc))


def fake_quantize(obs: ObserverBase, x: torch.Tensor) -> torch.Tensor:
    """``dequantize(quantize(x))`` with ``obs``'s qparams, as ``convert_pt2e`` makes of the
    observer: per channel along ``obs.ch_axis`` for a weight observer, per tensor otherwise
    (float32 in, float32 out, same shape)."""
    scale, zp = obs.calculate_qparams()
    if obs.qscheme in PER_CHANNEL:
        return torch.fake_quantize_per_channel_affine(x, scale.float(), zp.to(torch.int32), obs.ch_axis,
                                                      obs.quant_min, obs.quant_max)
    return fake_quantize_per_tensor(x, float(scale), int(zp), obs.quant_min, obs.quant_max)


def attr_tensor(gm: GraphModule, target: str) -> torch.Tensor:
    """The tensor (parameter or buffer) at the dotted ``target`` of a ``get_attr`` node."""
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def bias_arg(node: Node):
    """The bias argument of a conv2d / linear node (a Node, or None)."""
    if "bias" in node.kwargs:
        return node.kwargs["bias"]
    return node.args[2] if len(node.args) > 2 else None


def out_of_place(op):
    """The out-of-place twin of an in-place aten op (``hardtanh_`` -> ``hardtanh``), else ``op``."""
    if isinstance(op, torch._ops.OpOverload):
        name = op._schema.name.split("::")[-1]
        if name.endswith("_") and not name.startswith("_"):
            twin = getattr(getattr(torch.ops.aten, name[:-1], None), op._overloadname, None)
            if twin is not None:
                return twin
    return op


class FloatPass(Interpreter):
    """The float model of a prepared graph: every observer module passes its input
    through (conv-BN folded, float weights). Subclasses extend :meth:`run_node`."""

    def run_node(self, n: Node):
        if observer_of(self.module, n) is not None:
            return self.env[n.args[0]]
        return super().run_node(n)
