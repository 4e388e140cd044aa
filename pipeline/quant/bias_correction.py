"""Empirical bias correction of a calibrated PT2E model (Nagel et al. 2019).

Quantizing weights and activations shifts the mean of a layer's output: the
error E[y_qdq - y_float] per output channel is not zero ("biased error",
Nagel, van Baalen, Blankevoort, Welling, "Data-Free Quantization Through
Weight Equalization and Bias Correction", ICCV 2019, sec. 4.2). The empirical
variant measures it on data and subtracts it from the layer's bias:

1. run the calibration images through the float model (the prepared graph
   with every observer skipped: conv-BN folded, float weights) and keep, for
   every conv2d / linear, the per-output-channel mean of its output;
2. run them through the Q/DQ model (``convert_pt2e`` of a copy of the
   calibrated prepared model: what the convert stage builds) node by node,
   all images in lock-step; at each conv2d / linear, in graph order, take
   delta = mean(y_qdq) - mean(y_float) per channel, subtract it from that
   layer's output before later nodes read it (so later layers see the
   corrected earlier ones, as in the paper's sequential procedure), and
   record it;
3. subtract each delta from the float bias of the *prepared* model, whose
   state the calibrate stage saves; convert then builds the same Q/DQ model
   with corrected biases (PT2E keeps conv/linear biases float).

The outputs are taken before any fused ReLU/ReLU6 (the pre-activations, as in
the paper). Cost: one float and one Q/DQ pass over the images, no per-layer
re-runs. Memory: every live tensor of the graph is held for all images at
once (MobileNetV2: roughly 15 MB per 224x224 image), so this suits
calibration sets of tens to a few hundred images.

Held out, it helps with min/max ranges and hurts with clipping observers
(docs/measuring.md, "Figures behind the code"). With clipping, the error is concentrated on the
few clipped positions; a per-channel mean shift moves every position, and
in-sample the conv-output error grows from the last blocks on even though
each layer's mean error is removed. Per-channel weights leave little weight
bias to correct (first conv: 1e-4).

A conv/linear without a bias gets one: :func:`add_bias_slots` adds a zero
bias parameter (name ``c7x_bias_slot_<node>``); the stages call it whenever
``[calibration] bias_correction`` is on, so the calibrated state and the
rebuilt model of the convert stage have the same keys.
"""

from __future__ import annotations

import copy

import torch
from torch.fx import GraphModule, Interpreter, Node
from torch.fx.node import map_aggregate
from torchao.quantization.pt2e import ObserverBase
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

from .graph import bias_arg
from .rules import WEIGHTED

#: name prefix of the zero biases :func:`add_bias_slots` creates
SLOT_PREFIX = "c7x_bias_slot_"

REFERENCE = ("Nagel et al. 2019, Data-Free Quantization Through Weight Equalization and "
             "Bias Correction, sec. 4.2 (empirical)")


def weighted_nodes(gm: GraphModule) -> list[Node]:
    """The conv2d / linear call_function nodes of ``gm``, in graph order."""
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in WEIGHTED]


def _out_channels(node: Node) -> int:
    """Output channels of a conv2d (NCHW output, axis 1) or linear ([..., N], last axis)."""
    val = node.meta["val"]
    return int(val.shape[1] if node.target == torch.ops.aten.conv2d.default else val.shape[-1])


def add_bias_slots(gm: GraphModule) -> list[str]:
    """Give every conv2d / linear of ``gm`` without a bias a zero float32 bias
    [out_channels] (parameter ``c7x_bias_slot_<node name>``, a get_attr node
    before the layer). Deterministic, in place (``gm`` recompiled); returns the
    new parameter names. The output is unchanged (the bias is zero)."""
    added = []
    for node in weighted_nodes(gm):
        if bias_arg(node) is not None:
            continue
        name = SLOT_PREFIX + node.name
        gm.register_parameter(name, torch.nn.Parameter(torch.zeros(_out_channels(node)), requires_grad=False))
        with gm.graph.inserting_before(node):
            attr = gm.graph.get_attr(name)
        if "bias" in node.kwargs:
            node.update_kwarg("bias", attr)
        elif len(node.args) > 2:
            node.update_arg(2, attr)
        else:
            node.args = (*node.args, attr)
        added.append(name)
    if added:
        gm.recompile()
    return added


class _PerImage:
    """The values of one node for every image (batch-1 tensors, in image order)."""

    __slots__ = ("items",)

    def __init__(self, items: list):
        self.items = items


class _Lockstep(Interpreter):
    """Runs a batch-1 graph on N images node by node: each node's value is a
    :class:`_PerImage`, so a hook sees one layer's outputs for all images before
    any later node runs. ``skip_observers``: observer modules pass their input
    through (the float model of a prepared graph)."""

    def __init__(self, gm: GraphModule, hooks: dict, skip_observers: bool = False):
        super().__init__(gm)
        self.hooks = hooks
        self.skip_observers = skip_observers

    def run_node(self, n: Node):
        if n.op in ("placeholder", "get_attr", "output"):
            return super().run_node(n)
        with self._set_current_node(n):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            if (self.skip_observers and n.op == "call_module"
                    and isinstance(self.module.get_submodule(n.target), ObserverBase)):
                return args[0]
            count = _count(args, kwargs)
            if count is None:
                return getattr(self, n.op)(n.target, args, kwargs)
            pick = lambda i: map_aggregate((args, kwargs), lambda a: a.items[i] if isinstance(a, _PerImage) else a)
            outs = [getattr(self, n.op)(n.target, *pick(i)) for i in range(count)]
            hook = self.hooks.get(n.name)
            return _PerImage(hook(outs) if hook else outs)


def _count(args, kwargs) -> int | None:
    found = []
    map_aggregate((args, kwargs), lambda a: found.append(len(a.items)) if isinstance(a, _PerImage) else None)
    return found[0] if found else None


def _channel_mean(node: Node, outs: list[torch.Tensor]) -> torch.Tensor:
    """Per-output-channel mean [C] float64 of ``outs`` (one tensor per image)."""
    axis = 1 if node.target == torch.ops.aten.conv2d.default else -1
    total = sum(o.double().movedim(axis, 0).reshape(o.shape[axis], -1).sum(1) for o in outs)
    return total / (len(outs) * outs[0].numel() / outs[0].shape[axis])


def _channel_shape(node: Node, outs: list[torch.Tensor]) -> list[int]:
    shape = [1] * outs[0].dim()
    shape[1 if node.target == torch.ops.aten.conv2d.default else -1] = -1
    return shape


def _layer_id(node: Node) -> str:
    prov = node.meta.get("custom", {}).get("c7x_layer")
    return prov["id"] if prov else node.name


def correct_biases(gm: GraphModule, images: list[torch.Tensor]) -> list[dict]:
    """Empirical bias correction of a calibrated prepared model, in place (module doc).

    Args:
        gm: ``prepare_pt2e`` output whose observers are filled; every conv2d /
            linear must have a bias (:func:`add_bias_slots`), else ValueError.
        images: the calibration inputs, batch-1 float32 tensors of the model's
            input shape (NCHW for image models).

    Returns one record per conv2d / linear in graph order: ``layer`` (layer id,
    :mod:`pipeline.frontend.provenance`), ``node``, ``bias`` (parameter name),
    ``created`` (a slot of :func:`add_bias_slots`), ``channels``, and the
    correction subtracted from the bias, in the layer's output units:
    ``mean_abs`` / ``max_abs`` over channels. Observers are not changed.
    """
    if not images:
        raise ValueError("bias correction needs at least one calibration image")
    layers = weighted_nodes(gm)
    missing = [n.name for n in layers if not isinstance(bias_arg(n), Node)]
    if missing:
        raise ValueError(f"conv/linear without a bias parameter: {missing}; call add_bias_slots first")
    targets = [bias_arg(n).target for n in layers]
    if len(set(targets)) != len(targets):
        raise ValueError("a bias parameter is shared by several conv/linear layers; cannot correct each")
    float_mean: dict[str, torch.Tensor] = {}

    def record(node):
        def hook(outs):
            float_mean[node.name] = _channel_mean(node, outs)
            return outs
        return hook

    with torch.no_grad():
        _Lockstep(gm, {n.name: record(n) for n in layers}, skip_observers=True).run(_PerImage(list(images)))
        qdq = convert_pt2e(copy.deepcopy(gm))
        q_nodes = {n.name: n for n in weighted_nodes(qdq)}
        if set(q_nodes) != set(float_mean):
            raise RuntimeError("convert_pt2e renamed conv/linear nodes; cannot match the Q/DQ and float layers")
        delta: dict[str, torch.Tensor] = {}

        def correct(node):
            def hook(outs):
                d = (_channel_mean(node, outs) - float_mean[node.name]).float()
                delta[node.name] = d
                shift = d.view(_channel_shape(node, outs))
                return [o - shift for o in outs]
            return hook

        _Lockstep(qdq, {name: correct(n) for name, n in q_nodes.items()}).run(_PerImage(list(images)))
        params = dict(gm.named_parameters())
        records = []
        for node in layers:
            target = bias_arg(node).target
            bias = params[target] if target in params else gm.get_buffer(target)
            d = delta[node.name]
            bias.sub_(d.to(bias.dtype))
            records.append({"layer": _layer_id(node), "node": node.name, "bias": target,
                            "created": target.startswith(SLOT_PREFIX), "channels": int(d.numel()),
                            "mean_abs": float(d.abs().mean()), "max_abs": float(d.abs().max())})
    return records
