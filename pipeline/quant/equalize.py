"""Channel equalization across linear edges, residual streams included (exact in float).

Per-tensor int8 activations lose most where a few channels of a tensor span
far more than the rest: MobileNetV2's residual streams (the projection convs'
outputs and the adds between them) are such tensors. A tensor that is
produced by convs with no activation after them and read only by convs
(``groups = 1``) or linears can be rescaled per channel for free: divide
output channel ``j`` of every producer (weight row and bias) by ``s[j]`` and
multiply input channel ``j`` of every consumer (weight column) by ``s[j]``.
Adds are linear, so a whole residual stream (every tensor joined by adds)
takes one vector ``s``. The float model computes the same function (up to
float rounding); only the quantization changes. This is cross-layer
equalization (Nagel et al., "Data-Free Quantization Through Weight
Equalization and Bias Correction", ICCV 2019, sec. 4.1) extended to the
residual stream, with the data-aware choice of SmoothQuant (Xiao et al.,
ICML 2023, eq. 4):

    s[j] = max|X[:, j]|^alpha / max|W[:, j]|^(1 - alpha)

``max|X[:, j]|`` over every tensor of the group on the calibration images,
``max|W[:, j]|`` over every consumer's input column ``j``; ``alpha`` = 0
equalizes the consumers' weight columns (data-free), 1 the activation
channels, 0.5 splits the range between them. ``s`` is normalised to a
geometric mean of 1. Producers are conv2d (depthwise included: a weight row
per output channel) or linear; groups with any other producer or reader
(pooling, ReLU, concat, the graph output...) are left alone, as are convs
whose ReLU6 makes the scaling inexact (the issue of the DFQ paper's sec. 5
with ReLU6; we do not rewrite clip bounds per channel).

Works on a prepared graph (observer modules are transparent) or a plain float
graph with the same node names; weights and biases are changed in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.fx import GraphModule, Node

from .graph import FloatPass, attr_tensor, bias_arg, observer_of
from .rules import WEIGHTED

aten = torch.ops.aten
REFERENCE = ("Nagel et al. 2019, Data-Free Quantization (cross-layer equalization, sec. 4.1), with the "
             "scales of Xiao et al. 2023, SmoothQuant, eq. 4")
_ADD = {aten.add.Tensor, aten.add_.Tensor}


@dataclass(frozen=True)
class Group:
    """One rescalable tensor group: ``members`` (node names: producer convs/linears and
    the adds joining them), ``producers`` and ``consumers`` (conv2d / linear node names,
    graph order). Output channels of producers are input channels of consumers."""

    members: tuple[str, ...]
    producers: tuple[str, ...]
    consumers: tuple[str, ...]


def _source(gm: GraphModule, n):
    """``n`` with observer modules stripped (the node whose value it carries)."""
    while observer_of(gm, n) is not None:
        n = n.args[0]
    return n


def _readers(gm: GraphModule, n: Node) -> list[Node]:
    """The nodes reading ``n``'s value, looking through observer modules."""
    out = []
    for u in n.users:
        out += _readers(gm, u) if observer_of(gm, u) is not None else [u]
    return out


def _is_consumer(gm: GraphModule, reader: Node, member: Node) -> bool:
    """``reader`` takes ``member`` as its data input and can scale that input's channels
    in its weight (conv2d with groups = 1, or linear)."""
    if reader.target not in WEIGHTED or _source(gm, reader.args[0]) is not member:
        return False
    if reader.target == aten.conv2d.default:
        groups = reader.args[6] if len(reader.args) > 6 else reader.kwargs.get("groups", 1)
        return groups == 1
    return True


def find_groups(gm: GraphModule) -> list[Group]:
    """Every rescalable group of ``gm`` (module doc), in graph order of the first member."""
    parent: dict[Node, Node] = {}

    def find(n):
        while parent[n] is not n:
            n = parent[n]
        return n

    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in WEIGHTED:
            parent[n] = n
        elif n.op == "call_function" and n.target in _ADD:
            srcs = [_source(gm, a) for a in n.args[:2]]
            parent[n] = n
            for s in srcs:
                if isinstance(s, Node) and s in parent:
                    parent[find(s)] = find(n)
    by_root: dict[Node, list[Node]] = {}
    for n in parent:
        by_root.setdefault(find(n), []).append(n)
    return [g for g in (_group(gm, members) for members in by_root.values()) if g is not None]


def _group(gm: GraphModule, members: list[Node]) -> Group | None:
    """The group of ``members`` if it can be rescaled exactly, else None."""
    mset = set(members)
    consumers = []
    for m in members:
        if m.target in _ADD and not all(_source(gm, a) in mset for a in m.args[:2]):
            return None  # an add with an outside operand (or a scalar)
        for r in _readers(gm, m):
            if r in mset and r.target in _ADD:
                continue
            if not _is_consumer(gm, r, m):
                return None
            consumers.append(r)
    producers = [m for m in members if m.target in WEIGHTED]
    if not consumers or not producers:
        return None
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    name = lambda ns: tuple(n.name for n in sorted(set(ns), key=order.get))
    return Group(members=name(members), producers=name(producers), consumers=name(consumers))


def _param(gm: GraphModule, n) -> torch.Tensor | None:
    """The tensor a (possibly observed) get_attr argument reads, or None."""
    n = _source(gm, n)
    return attr_tensor(gm, n.target) if isinstance(n, Node) and n.op == "get_attr" else None


class _AbsMax(FloatPass):
    """Float pass (observers skipped) recording the per-channel max |x| of chosen nodes."""

    def __init__(self, gm: GraphModule, names: set[str]):
        super().__init__(gm)
        self.names = names
        self.absmax: dict[str, torch.Tensor] = {}

    def run_node(self, n: Node):
        out = super().run_node(n)
        if n.name in self.names:
            axis = 1 if out.dim() == 4 else -1
            m = out.detach().abs().movedim(axis, 0).reshape(out.shape[axis], -1).amax(1).double()
            self.absmax[n.name] = torch.maximum(self.absmax.get(n.name, m), m)
        return out


def channel_absmax(gm: GraphModule, groups: list[Group], images: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per group member: max |x| per channel [C] float64 over ``images`` (batch-1 float32,
    the model's input shape), from the float model (observers skipped)."""
    rec = _AbsMax(gm, {m for g in groups for m in g.members})
    with torch.no_grad():
        for x in images:
            rec.run(x)
    return rec.absmax


def scales_for(gm: GraphModule, group: Group, absmax: dict[str, torch.Tensor], alpha: float) -> torch.Tensor:
    """SmoothQuant's ``s`` [C] float64 for ``group`` (module doc); channels with a zero
    activation or weight range keep 1. Geometric mean 1."""
    nodes = {n.name: n for n in gm.graph.nodes}
    x = torch.stack([absmax[m] for m in group.members]).amax(0)
    w = torch.stack([_param(gm, nodes[c].args[1]).detach().abs().double().transpose(0, 1)
                     .reshape(x.numel(), -1).amax(1) for c in group.consumers]).amax(0)
    ok = (x > 0) & (w > 0)
    s = torch.ones_like(x)
    s[ok] = x[ok] ** alpha / w[ok] ** (1.0 - alpha)
    return s / torch.exp(torch.log(s).mean())


def apply_scales(gm: GraphModule, group: Group, s: torch.Tensor) -> None:
    """Divide the producers' output channels (weight rows, bias) by ``s`` [C] and
    multiply the consumers' input channels (weight columns) by it, in place."""
    nodes = {n.name: n for n in gm.graph.nodes}
    with torch.no_grad():
        for p in group.producers:
            w = _param(gm, nodes[p].args[1])
            w.div_(s.to(w.dtype).view(-1, *([1] * (w.dim() - 1))))
            b = _param(gm, bias_arg(nodes[p])) if bias_arg(nodes[p]) is not None else None
            if b is not None:
                b.div_(s.to(b.dtype))
        for c in group.consumers:
            w = _param(gm, nodes[c].args[1])
            w.mul_(s.to(w.dtype).view(1, -1, *([1] * (w.dim() - 2))))


def equalize(gm: GraphModule, images: list[torch.Tensor], alpha: float = 0.5) -> list[dict]:
    """Equalize every group of ``gm`` in place (module doc) on ``images``; returns one
    record per group: ``producers``, ``consumers``, ``channels``, ``alpha``, the
    activation range ratio max/min over channels before and after (``spread_before``,
    ``spread_after``) and ``scales`` (the vector ``s``, for the float reference to
    replay with :func:`apply_scales`). Raises ValueError for alpha outside [0, 1]
    or no images."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"equalization alpha must be in [0, 1], got {alpha}")
    if not images:
        raise ValueError("equalization needs at least one calibration image")
    groups = find_groups(gm)
    absmax = channel_absmax(gm, groups, images)
    records = []
    for g in groups:
        s = scales_for(gm, g, absmax, alpha)
        apply_scales(gm, g, s)
        x = torch.stack([absmax[m] for m in g.members]).amax(0)
        spread = lambda v: float(v.max() / v[v > 0].min()) if (v > 0).any() else 1.0
        records.append({"producers": list(g.producers), "consumers": list(g.consumers),
                        "channels": int(s.numel()), "alpha": alpha, "spread_before": round(spread(x), 2),
                        "spread_after": round(spread(x / s), 2), "scales": [float(v) for v in s]})
    return records
