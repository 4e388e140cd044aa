"""Mixed int8/int16 precision: the layers of a float program, ``int16_layers`` patterns,
and the budgeted choice of int16 layers from measured tensor sensitivities.

**Layers.** The candidates for int16 are the conv2d, linear and add nodes of
the float program (the ops with an MMALIB/C7x kernel in either dtype), named by
their layer id and PyTorch module path (``node.meta["custom"]["c7x_layer"]``,
:mod:`pipeline.frontend.provenance`). MACs are per image, from the node's
``meta["val"]`` shapes: conv2d ``C_out*H_out*W_out * (C_in/groups)*kH*kW``,
linear ``prod(out[1:]) * K``, add 0. The budget ``int16_macs`` is a share of the
conv/linear MACs.

**Patterns.** ``[quantizer] int16_layers`` are ``fnmatch`` globs over module
paths (``"features.1.*"``, ``"classifier.1"``); a pattern matching no layer is
a one-line :class:`~pipeline.errors.ConfigError` naming the three closest paths.

**Why tensors, not layers, are measured.** In the quantizer's mixed graph
(:mod:`pipeline.quant.quantizer`) every node observes its inputs in its own
dtype, so a tensor is int16 only where its producer *and* its consumer are
int16: a lone int16 layer between int8 neighbours gets an int8 input
requantized up and hands an int16 output that is requantized down, and gains
nothing: one layer int16 in an int8 model barely changes the error, and not
at all for most layers (docs/measuring.md, "Figures behind the code").
So the unit of measurement is a tensor edge (producer -> consumer), and its
gain is what it costs in int8 inside an otherwise int16 model (the "reverse"
measure: error with that edge int8 minus the all-int16 error). At the same
budget the same greedy choice does best with it (per-edge forward gains are
dominated by noise; per-layer choices rarely neighbour each other;
docs/measuring.md, "Figures behind the code").

**Weights.** With ``weight_dtype = "int16"`` an int16 layer's weights are int16
too (the i16 kernels read int16 weights either way, so it costs no cycle), and
each such weight is a candidate of its own: its ``layers`` are the one layer, its
gain what int8 weights cost that layer in the all-int16 model. A lone int16
layer then gains its weight error back (docs/measuring.md, "Figures behind the code").

**Choice** (:func:`choose`). Greedy by gain per added MAC: an edge needs the
layers that make it int16 (:class:`TensorCandidate` ``layers``); its cost is
the MACs of those not chosen yet, so edges next to chosen layers become cheap
and chains form. Adds cost 0 MACs: an edge whose missing layers are only adds
(or nothing) ranks first, by gain, but like every edge only if its gain is at
least ``min_gain`` (a share of the all-int8 -> all-int16 gap, default 1 %),
which keeps measurement noise and int16 islands that buy nothing (each adds
two requantize kernels) out. Manual patterns are int16 from the start and
count against the budget. Ties break on the candidate order, so the choice is
deterministic.
"""

from __future__ import annotations

import difflib
import fnmatch
import math
from dataclasses import dataclass

from ..errors import ConfigError
from ..frontend.provenance import KEY, node_provenance

#: aten op (str of the FX target) -> layer kind.
LAYER_OPS = {"aten.conv2d.default": "conv2d", "aten.linear.default": "linear",
             "aten.add.Tensor": "add", "aten.add_.Tensor": "add"}

#: default smallest gain an edge needs, as a share of (all-int8 error - all-int16 error).
MIN_GAIN = 0.01


@dataclass(frozen=True)
class Layer:
    """One int16 candidate layer: id (float FX node name), module path, op kind, MACs per
    image, and (when a target was given) its estimated C7x cycles as int8 and as int16."""

    id: str
    module: str
    op: str
    macs: int
    cycles: tuple[float, float] | None = None

    def to_dict(self) -> dict:
        out = {"id": self.id, "module": self.module, "op": self.op, "macs": self.macs}
        if self.cycles is not None:
            out["cycles_int8"], out["cycles_int16"] = (round(c) for c in self.cycles)
        return out


def layer_id(node) -> str:
    """A node's layer id: its provenance id (float-program name), else its own name."""
    prov = node.meta.get("custom", {}).get(KEY)
    return prov["id"] if prov else node.name


def module_path(node) -> str:
    """A node's PyTorch module path from its provenance ("" when it has none)."""
    prov = node.meta.get("custom", {}).get(KEY) or node_provenance(node)
    return prov["module"] if prov else ""


def _shape(node) -> tuple[int, ...]:
    return tuple(node.meta["val"].shape)


def macs(node) -> int:
    """MACs per image of a conv2d / linear node (0 for add); dim 0 is the batch."""
    kind = LAYER_OPS.get(str(node.target))
    if kind == "add":
        return 0
    out, weight = _shape(node)[1:], _shape(node.args[1])
    if kind == "conv2d":  # weight OIHW: I is C_in / groups
        return int(math.prod(out) * math.prod(weight[1:]))
    return int(math.prod(out) * weight[1])  # linear: weight [N, K]


def layer_cycles(node, kind: str, target) -> tuple[float, float]:
    """Estimated C7x cycles of a conv2d / linear / add node as int8 and as int16
    (:func:`pipeline.perf.model.layer_call` on ``target``, the flat DDR plan)."""
    from ..perf.model import estimate_call, layer_call

    out = _shape(node)[1:]
    geometry = {"macs": macs(node), "in_elems": math.prod(_shape(node.args[0])[1:]), "out_elems": math.prod(out)}
    if kind != "add":
        w = _shape(node.args[1])
        groups = node.args[6] if kind == "conv2d" and len(node.args) > 6 else 1
        geometry.update(w_elems=math.prod(w), c_out=w[0],
                        depthwise=kind == "conv2d" and groups > 1 and w[1] == 1)
    return tuple(estimate_call(layer_call(kind, dt, **geometry), target)["cycles"] for dt in ("int8", "int16"))


def program_layers(graph, target=None) -> list[Layer]:
    """The conv2d / linear / add layers of a float program's FX ``graph``, in graph order;
    with ``target`` (a :class:`pipeline.target.Target`), each with its estimated cycles.

    An add of a tensor and a constant (``x + 1.0``) is not a layer (the quantizer
    leaves it float)."""
    out = []
    for node in graph.nodes:
        kind = LAYER_OPS.get(str(node.target)) if node.op == "call_function" else None
        if kind == "add" and not all(hasattr(a, "meta") for a in node.args[:2]):
            continue
        if kind:
            cycles = layer_cycles(node, kind, target) if target is not None else None
            out.append(Layer(layer_id(node), module_path(node), kind, macs(node), cycles))
    return out


def resolve_patterns(patterns, layers: list[Layer], entry: str) -> list[str]:
    """Layer ids (graph order) whose module path matches one of the glob ``patterns``.

    Raises :class:`ConfigError` (one line: ``entry``, the pattern, the three
    closest module paths) for a pattern that matches no layer."""
    chosen = set()
    modules = list(dict.fromkeys(layer.module for layer in layers))
    for pattern in patterns:
        hits = {layer.id for layer in layers if fnmatch.fnmatchcase(layer.module, pattern)}
        if not hits:
            close = difflib.get_close_matches(pattern, modules, n=3, cutoff=0.0)
            raise ConfigError(f"{entry}: quantizer.int16_layers pattern {pattern!r} matches no conv2d/linear/add "
                              f"layer; closest module paths: {', '.join(close) or '(none)'}")
        chosen |= hits
    return [layer.id for layer in layers if layer.id in chosen]


def total_macs(layers: list[Layer]) -> int:
    """Conv/linear MACs per image of the model: the budget's denominator."""
    return sum(layer.macs for layer in layers)


def mac_share(ids, layers: list[Layer]) -> float:
    """Share of the model's MACs in the layers ``ids``."""
    total = total_macs(layers)
    return sum(layer.macs for layer in layers if layer.id in set(ids)) / total if total else 0.0


def costs(layers: list[Layer], unit: str) -> tuple[dict[str, float], float]:
    """``({layer id: cost of making it int16}, the budget's denominator)`` in ``unit``:
    "macs" (its MACs; of all conv/linear MACs) or "cycles" (its estimated int16
    cycles; of the all-int8 model's estimated cycles, ``Layer.cycles``)."""
    if unit == "macs":
        return {layer.id: layer.macs for layer in layers}, total_macs(layers)
    if any(layer.cycles is None for layer in layers):
        raise ValueError("a budget in cycles needs layers with estimated cycles (program_layers(graph, target))")
    return {layer.id: layer.cycles[1] for layer in layers}, sum(layer.cycles[0] for layer in layers)


def cost_share(ids, layers: list[Layer], unit: str) -> float:
    """Share of the budget's denominator that the layers ``ids`` cost in int16 (:func:`costs`)."""
    cost, total = costs(layers, unit)
    return sum(cost[i] for i in set(ids)) / total if total else 0.0


@dataclass(frozen=True)
class TensorCandidate:
    """A tensor edge ``producer -> consumer`` that becomes int16 when all of ``layers`` are.

    ``error``: the metric with this edge int8 in an otherwise int16 model;
    ``gain``: ``error`` minus the all-int16 error."""

    producer: str
    consumer: str
    layers: tuple[str, ...]
    error: float
    gain: float


def choose(candidates: list[TensorCandidate], layers: list[Layer], budget: float,
           fixed=(), min_gain: float = 0.0, unit: str = "macs") -> list[str]:
    """Greedy choice of int16 layers (ids, graph order) within ``budget``, a share of
    the model's MACs (``unit="macs"``) or of its estimated cycles (``"cycles"``:
    each layer costs its estimated int16 cycles, :func:`costs`).

    Starts from ``fixed`` (manual patterns; they count against the budget) and
    repeatedly takes the candidate with the largest gain per added cost (cost 0
    ranks first, by gain) among those with ``gain >= min_gain`` that fit; see
    the module docstring. Raises ValueError when ``fixed`` alone exceeds the budget."""
    cost, total = costs(layers, unit)
    limit = budget * total
    chosen = set(fixed)
    used = sum(cost[i] for i in chosen)
    if used > limit + 1e-9:
        raise ValueError(f"the int16_layers patterns alone take {used / total:.1%} of the {unit}, "
                         f"over the int16_{unit} budget of {budget:.1%}")
    while True:
        best, best_key = None, None
        for k, c in enumerate(candidates):
            missing = set(c.layers) - chosen
            if c.gain < min_gain or c.gain <= 0 or not missing:
                continue
            extra = sum(cost[i] for i in missing)
            if used + extra > limit + 1e-9:
                continue
            key = (math.inf if extra == 0 else c.gain / extra, c.gain, -k)
            if best_key is None or key > best_key:
                best, best_key = c, key
        if best is None:
            return [layer.id for layer in layers if layer.id in chosen]
        chosen |= set(best.layers)
        used = sum(cost[i] for i in chosen)
