"""Fold a per-channel layer scale into the linear before it (exact in real arithmetic).

CaiT / DINOv2 blocks end each branch with ``y = linear(x) * gamma`` (``gamma`` a learned vector
over the output features, "LayerScale", Touvron et al. 2021). Quantized as written, the multiply
is a layer of its own: the linear's output is quantized, multiplied in float and quantized again
(no MMALIB kernel scales a tensor by a vector along its last axis, so it would also run as a
scalar TVM call). Since ``(x W^T + b) * gamma = x (gamma W)^T + gamma b``, the scale belongs in the
linear's weight rows and bias, as inference compilers fold it (TensorRT, TIDL fold such affine
layers into the preceding linear). Done before annotation, on the exported FX graph.
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from .graph import attr_tensor, bias_arg

aten = torch.ops.aten
PREFIX = "c7x_layer_scale_"


def _scale_vector(gm: GraphModule, node, features: int) -> torch.Tensor | None:
    """The per-feature scale a ``get_attr`` ``node`` holds ([features], or [1, ..., features]), else None."""
    if not isinstance(node, Node) or node.op != "get_attr":
        return None
    t = attr_tensor(gm, node.target)
    if not t.is_floating_point() or t.numel() != features or (t.dim() > 1 and t.shape[-1] != features):
        return None
    return t.detach().reshape(features)


def _foldable(gm: GraphModule, mul: Node) -> tuple[Node, torch.Tensor] | None:
    """``(linear, gamma)`` when ``mul`` multiplies a linear's only use by a constant per-feature vector
    and the linear's weight and bias are constants read by it alone."""
    if mul.op != "call_function" or mul.target != aten.mul.Tensor or len(mul.args) != 2:
        return None
    for lin, other in (mul.args, mul.args[::-1]):
        if not (isinstance(lin, Node) and lin.op == "call_function" and lin.target == aten.linear.default):
            continue
        w, b = lin.args[1], bias_arg(lin)
        if len(lin.users) != 1 or not (isinstance(w, Node) and w.op == "get_attr" and len(w.users) == 1):
            continue
        if b is not None and not (isinstance(b, Node) and b.op == "get_attr" and len(b.users) == 1):
            continue
        gamma = _scale_vector(gm, other, attr_tensor(gm, w.target).shape[0])
        if gamma is not None:
            return lin, gamma
    return None


def fold_layer_scales(gm: GraphModule) -> GraphModule:
    """Rewrite every ``linear(x, W, b) * gamma`` of ``gm`` (module doc) as ``linear(x, gamma W, gamma b)``
    with new parameters ``c7x_layer_scale_<linear>_weight`` / ``_bias`` (deterministic names, the
    originals untouched); in place, also returned. Float32 ``W`` ``[out, in]``, ``gamma`` ``[out]``."""
    changed = False
    for mul in list(gm.graph.nodes):
        found = _foldable(gm, mul)
        if found is None:
            continue
        lin, gamma = found
        w_node, b_node = lin.args[1], bias_arg(lin)
        w = attr_tensor(gm, w_node.target).detach()
        new = {"weight": w * gamma.to(w.dtype)[:, None]}
        if b_node is not None:
            b = attr_tensor(gm, b_node.target).detach()
            new["bias"] = b * gamma.to(b.dtype)
        for kind, tensor in new.items():
            name = f"{PREFIX}{lin.name}_{kind}"
            gm.register_parameter(name, torch.nn.Parameter(tensor.clone(), requires_grad=False))
            with gm.graph.inserting_before(lin):
                attr = gm.graph.get_attr(name)
            if kind == "weight":
                lin.update_arg(1, attr)
            elif "bias" in lin.kwargs:
                lin.update_kwarg("bias", attr)
            else:
                lin.update_arg(2, attr)
        mul.replace_all_uses_with(lin)
        gm.graph.erase_node(mul)
        changed = True
    if changed:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return gm
