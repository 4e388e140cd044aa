"""Simulate any int8/int16 activation assignment of a model from two calibrated prepared models.

A real mixed-precision model costs one ``prepare_pt2e`` + calibration +
``convert_pt2e`` per assignment. A sensitivity pass needs dozens of
assignments, so :class:`MixedSimulator` builds them from two prepared models
calibrated once: all-int8 and all-int16 (every annotated node int16: the same
observer placement, checked). Prepared-model observers are identities, so
both saw exactly the float tensors, and an observer of a real mixed model at
the same place would compute the same qparams as one of the two.

The simulation replaces every observer of the all-int8 model by Q/DQ per
(observer, consumer) edge (``torch.fake_quantize_per_tensor_affine``'s values,
:func:`~pipeline.quant.graph.fake_quantize_per_tensor`: the rounding and clamping
of ``convert_pt2e``'s ``quantize_per_tensor`` + ``dequantize_per_tensor``), with the rule the
real mixed graph follows (:mod:`pipeline.quant.quantizer`, "Mixed precision"):

* the producer's output is quantized in the producer's dtype, when its
  annotation has an output spec (shared specs follow their source);
* the consumer's input is quantized in the consumer's dtype when the consumer
  observes that input and the dtype differs from the producer's:
  ``q(dq(x, int8), int16)`` or the reverse, the requantize of an int8<->int16
  boundary.

So a tensor is effectively int16 only where its producer and its consumer are
both int16. The dtype of every node for an assignment comes from the
quantizer itself: it annotates a scratch copy of the float program (conv-BN
folded as ``prepare_pt2e`` does) with that assignment's ``int16_layers``.
Weights are per-channel and quantized once per dtype. Each weight is an
edge too (:class:`_WeightQDQ`): int8, or int16 where the consumer's annotation
gives it int16 weights (``weight_dtype="int16"``: the int16 layers' weights, from
the all-int16 model's observer). With int8 weights only, both models' weight
qparams must agree (checked, unless the int8 model's weights were refined).

:meth:`MixedSimulator.run_variants` measures many one-edge changes in one pass
(it forks the run at each changed edge), which is what makes a sensitivity pass
over every tensor of MobileNetV2 take seconds, not minutes.

Shapes: inputs float32 NCHW batches (any batch size the program allows);
outputs the program's first output (logits [N, classes] for classifiers).
tests/quant/test_mixed_precision.py compares the simulation with a real
``convert_pt2e`` of several mixed assignments (equal to 1e-5 of the output
range) and, on MobileNetV2, the simulated logit error of the chosen layers
with the real model's (minmax, no method: 0.298 vs 0.304; the shipped entry, whose
method the simulation tunes in the all-int8 model and the real build around its
int16 layers: 0.055 vs 0.065 logit MSE).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e import ObserverBase
from torchao.quantization.pt2e.quantizer import SharedQuantizationSpec
from torchao.quantization.pt2e.quantizer.quantizer import Q_ANNOTATION_KEY
from torchao.quantization.pt2e.utils import _fuse_conv_bn_, _fuse_linear_bn_

from .. import torchenv
from .graph import PER_CHANNEL, attr_tensor, fake_quantize, fake_quantize_per_tensor, observer_of

_DTYPE_NAMES = {torch.int8: "int8", torch.int16: "int16"}


@dataclass(frozen=True)
class QParams:
    """Per-tensor qparams of one observer: ``q = clamp(round(x / scale) + zero_point, qmin, qmax)``."""

    scale: float
    zero_point: int
    qmin: int
    qmax: int
    dtype: torch.dtype

    @classmethod
    def of(cls, obs: ObserverBase) -> "QParams":
        scale, zp = obs.calculate_qparams()
        return cls(float(scale), int(zp), obs.quant_min, obs.quant_max, obs.dtype)

    def qdq(self, x: torch.Tensor) -> torch.Tensor:
        """``dequantize(quantize(x))``, as ``torch.fake_quantize_per_tensor_affine`` (no gradient)."""
        return fake_quantize_per_tensor(x, self.scale, self.zero_point, self.qmin, self.qmax)


class _EdgeQDQ(torch.nn.Module):
    """The Q/DQ steps on one (observer, consumer) edge; ``steps`` is set per assignment."""

    def __init__(self, qparams: dict[str, QParams]):
        super().__init__()
        self.qparams = qparams  # "int8" / "int16" -> QParams of this observer
        self.steps: tuple[QParams, ...] = (qparams["int8"],)

    def forward(self, x):
        for qp in self.steps:
            x = qp.qdq(x)
        return x


class _WeightQDQ(torch.nn.Module):
    """A weight's dequantized per-channel values (a constant); ``qparams`` maps "int8" /
    "int16" to them (the same tensor when the weight is never int16), ``steps`` holds
    the one in use, set per assignment like :class:`_EdgeQDQ`'s."""

    def __init__(self, values: dict[str, torch.Tensor]):
        super().__init__()
        self.qparams = values
        self.steps: tuple[torch.Tensor, ...] = (values["int8"],)

    def forward(self):
        return self.steps[-1]


@dataclass(frozen=True)
class Edge:
    """One observed tensor edge: ``producer`` (node name) feeds ``consumer`` through
    ``observer``; ``weight``: the producer is a per-channel weight (module :class:`_WeightQDQ`)."""

    observer: str
    producer: str
    consumer: str
    node: str
    module: _EdgeQDQ | _WeightQDQ
    weight: bool = False


class MixedSimulator:
    """Run a model under any int16 layer selection without prepare/convert per selection.

    Args:
        program: the float ExportedProgram (not modified).
        prepared8: prepared + calibrated module, all activations int8.
        prepared16: prepared + calibrated module of the same program with every
            annotated node int16 (``int16_layers`` = all layer ids).
        quantizer_for: layer-id set -> the quantizer a real build would use
            (``make_quantizer(spec, int16_layers=...)``); only annotates.
        refined: ``prepared8``'s weights were refined after calibration (the
            calibrate stage's method: snapped scales, AdaRound): they stand for
            every layer's and are not checked against ``prepared16``'s.

    ``prepared8`` is turned into the simulation module (its observers are
    replaced); do not use it afterwards. Raises RuntimeError when the two
    models' observers differ in place (not in kind: an int8 softmax output's qparams are
    fixed, its int16 twin's observed) or in dtype (or their weight qparams, unless ``refined``), or the edge rule finds an
    observer with no side to quantize (a quantizer this simulation does not model).
    """

    def __init__(self, program: torch.export.ExportedProgram, prepared8: GraphModule,
                 prepared16: GraphModule, quantizer_for: Callable[[frozenset], object],
                 refined: bool = False):
        self._quantizer_for = quantizer_for
        self._scratch = copy.deepcopy(program.module())
        _fuse_conv_bn_(self._scratch)
        _fuse_linear_bn_(self._scratch)
        torchenv.release_torchao_modules()
        _check_same_placement(prepared8, prepared16)
        self.module = prepared8
        self.refined = refined
        self.edges: list[Edge] = []
        self._replace_observers(prepared8, prepared16)
        if sum(n.op == "placeholder" for n in prepared8.graph.nodes) != 1:
            raise RuntimeError("the simulation runs programs with exactly one input tensor")
        self.selection: frozenset[str] | None = None
        self._cached_order = None

    # ------------------------------------------------------------------ building
    def _replace_observers(self, gm8: GraphModule, gm16: GraphModule) -> None:
        graph = gm8.graph
        for node in list(graph.nodes):
            obs = observer_of(gm8, node)
            if obs is None:
                continue
            if obs.qscheme in PER_CHANNEL:
                self._weight_edge(gm8, gm16, node, obs)
                continue
            qparams = {"int8": QParams.of(obs), "int16": QParams.of(observer_of(gm16, node))}
            producer = node.args[0]
            for k, user in enumerate(list(node.users)):
                name = f"{node.target}_edge{k}"
                mod = _EdgeQDQ(qparams)
                gm8.add_submodule(name, mod)
                with graph.inserting_before(user):
                    new = graph.call_module(name, (producer,))
                user.replace_input_with(node, new)
                self.edges.append(Edge(node.target, producer.name, user.name, new.name, mod))
            graph.erase_node(node)
        graph.lint()
        gm8.recompile()

    def _weight_edge(self, gm8: GraphModule, gm16: GraphModule, node: Node, obs) -> None:
        """Replace a weight observer by a :class:`_WeightQDQ` of its dequantized int8
        per-channel weight and, when the all-int16 model's weight is int16, that one."""
        obs16 = observer_of(gm16, node)
        values = {"int8": fake_quantize(obs, _value(gm8, node.args[0]))}
        if _DTYPE_NAMES.get(obs16.dtype) == "int16":
            values["int16"] = fake_quantize(obs16, _value(gm16, node.args[0]))
        else:
            if not self.refined:  # refined int8 weights stand for every layer's on purpose
                s8, s16 = obs.calculate_qparams(), obs16.calculate_qparams()
                if obs16.dtype != obs.dtype or not all(torch.equal(a, b) for a, b in zip(s8, s16)):
                    raise RuntimeError(f"{node.name}: weight qparams differ between the int8 and int16 models")
            values["int16"] = values["int8"]
        name = f"{node.target}_weight"
        mod = _WeightQDQ(values)
        gm8.add_submodule(name, mod)
        with gm8.graph.inserting_before(node):
            new = gm8.graph.call_module(name, ())
        (user,) = node.users
        self.edges.append(Edge(node.target, node.args[0].name, user.name, new.name, mod, weight=True))
        node.replace_all_uses_with(new)
        gm8.graph.erase_node(node)

    # ------------------------------------------------------------------ assignments
    def dtypes(self, int16_layers: frozenset[str]) -> dict[tuple[str, str], tuple[str, ...]]:
        """(producer, consumer) -> the dtypes the tensor is quantized in on that edge,
        in order (one, or two at an int8<->int16 boundary), for ``int16_layers``."""
        for n in self._scratch.graph.nodes:
            n.meta.pop(Q_ANNOTATION_KEY, None)
        q = self._quantizer_for(frozenset(int16_layers))
        q.annotate(q.transform_for_annotation(self._scratch))
        # the transform may add nodes (an attention's matmuls and softmax): look names up after it
        nodes = {n.name: n for n in self._scratch.graph.nodes}
        out = {}
        for e in self.edges:
            if e.weight:
                out[(e.producer, e.consumer)] = (_weight_dtype(nodes.get(e.consumer)),)
                continue
            steps = []
            produced = _output_dtype(nodes.get(e.producer))
            if produced:
                steps.append(produced)
            consumed = _input_dtype(nodes.get(e.consumer), e.producer)
            if consumed and consumed != produced:
                steps.append(consumed)
            if not steps:
                raise RuntimeError(f"observer {e.observer} ({e.producer} -> {e.consumer}): neither side is "
                                   f"annotated; the simulation does not model this quantizer")
            out[(e.producer, e.consumer)] = tuple(steps)
        return out

    def select(self, int16_layers) -> None:
        """Set every edge's Q/DQ steps for ``int16_layers`` (layer ids)."""
        int16_layers = frozenset(int16_layers)
        if int16_layers == self.selection:
            return
        table = self.dtypes(int16_layers)
        for e in self.edges:
            e.module.steps = tuple(e.module.qparams[d] for d in table[(e.producer, e.consumer)])
        self.selection = int16_layers

    def requirements(self, candidates) -> dict[int, tuple[str, ...]]:
        """Edge index -> the candidate layer ids (sorted) that make that edge int16,
        for every edge some selection of ``candidates`` makes int16 (an edge
        next to a layer that is never int16, e.g. an average pool, has none)."""
        needs: dict[int, set[str]] = {}
        for layer in candidates:
            for k, steps in enumerate(self._steps_of(frozenset({layer}))):
                if "int16" in steps:
                    needs.setdefault(k, set()).add(layer)
        out = {}
        for k, layers in needs.items():
            if self._steps_of(frozenset(layers))[k] == ("int16",):
                out[k] = tuple(sorted(layers))
        return out

    def _steps_of(self, int16_layers: frozenset[str]) -> list[tuple[str, ...]]:
        table = self.dtypes(int16_layers)
        return [table[(e.producer, e.consumer)] for e in self.edges]

    @torch.no_grad()
    def run(self, x: torch.Tensor):
        """The simulated quantized model's output for the current selection."""
        return self.module(x)

    @torch.no_grad()
    def run_variants(self, x: torch.Tensor, variants: list[tuple[int, tuple[str, ...]]],
                     score: Callable[[torch.Tensor], float]) -> tuple[float, list[float]]:
        """``score(output)`` of the current selection, and of it with one edge
        changed per variant ``(edge index, dtypes)``, in one pass: the graph runs
        once and forks at each variant's edge, so only the nodes from that edge
        on run again (everything before it is the same)."""
        forks: dict[str, list] = {}
        for k, (index, dtypes) in enumerate(variants):
            edge = self.edges[index]
            forks.setdefault(edge.node, []).append((k, edge.module, dtypes))
        out = [0.0] * len(variants)

        def fork(i, node, env):
            for k, mod, dtypes in forks.get(node.name, ()):
                saved = mod.steps
                mod.steps = tuple(mod.qparams[d] for d in dtypes)
                try:
                    out[k] = score(self._run_from(i, dict(env), x, shared=set(env)))
                finally:
                    mod.steps = saved

        base = score(self._run_from(0, {}, x, before=fork))
        return base, out

    def _run_from(self, start: int, env: dict, x: torch.Tensor, shared=frozenset(), before=None):
        """Run graph nodes ``start:`` on ``env`` (node -> value), freeing each value
        after its last use; return the first output. ``before(i, node, env)`` is
        called before each node; an in-place op on a value of ``shared`` (a
        forked-from run's) works on a copy."""
        nodes, last = self._order()
        for i in range(start, len(nodes)):
            node = nodes[i]
            if before is not None:
                before(i, node, env)
            if shared and _mutates(node):
                for a in node.all_input_nodes:
                    if a in shared:
                        env[a] = env[a].clone()
            result = self._eval(node, env, x)
            if node.op == "output":
                return result
            env[node] = result
            for dead in last.get(i, ()):
                env.pop(dead, None)
        raise RuntimeError("graph has no output node")

    def _order(self):
        if getattr(self, "_cached_order", None) is None:
            nodes = list(self.module.graph.nodes)
            self._cached_order = (nodes, _last_uses(nodes))
        return self._cached_order

    def _eval(self, node: Node, env: dict, x: torch.Tensor):
        args = torch.fx.node.map_arg(node.args, env.__getitem__)
        kwargs = torch.fx.node.map_arg(node.kwargs, env.__getitem__)
        if node.op == "placeholder":
            return x
        if node.op == "get_attr":
            return attr_tensor(self.module, node.target)
        if node.op == "call_function":
            return node.target(*args, **kwargs)
        if node.op == "call_module":
            return self.module.get_submodule(node.target)(*args, **kwargs)
        if node.op == "call_method":
            obj, *rest = args
            return getattr(obj, node.target)(*rest, **kwargs)
        if node.op == "output":
            out = args[0]
            while isinstance(out, (tuple, list)):
                out = out[0]
            return out
        raise RuntimeError(f"cannot evaluate node {node.name} ({node.op})")


def _value(gm: GraphModule, node: Node) -> torch.Tensor:
    if node.op != "get_attr":
        raise RuntimeError(f"weight observer input {node.name} is a {node.op}, not a get_attr")
    return attr_tensor(gm, node.target).detach()


def _mutates(node: Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return node.op == "call_function" and schema is not None and schema.is_mutable


def _last_uses(nodes: list[Node]) -> dict[int, list[Node]]:
    """Position -> the nodes whose value is last read there (freed after it runs)."""
    pos = {n: i for i, n in enumerate(nodes)}
    out: dict[int, list[Node]] = {}
    for n in nodes:
        end = max((pos[u] for u in n.users), default=pos[n])
        out.setdefault(end, []).append(n)
    return out


def _placement(gm: GraphModule) -> list[tuple]:
    """Observers in graph order with what they observe and feed, and whether per channel. Not
    their class: an int8 softmax output has fixed qparams (FixedQParamsObserver), while in int16
    the softmax stays float and its reader observes that tensor."""
    out = []
    for node in gm.graph.nodes:
        obs = observer_of(gm, node)
        if obs is not None:
            out.append((node.name, node.target, node.args[0].name, tuple(u.name for u in node.users),
                        obs.qscheme in PER_CHANNEL))
    return out


def _check_same_placement(gm8: GraphModule, gm16: GraphModule) -> None:
    a, b = _placement(gm8), _placement(gm16)
    if a != b:
        diff = next((x, y) for x, y in zip(a + [None], b + [None]) if x != y)
        raise RuntimeError(f"all-int8 and all-int16 prepared models place observers differently: {diff}")
    for node in gm8.graph.nodes:
        obs8, obs16 = observer_of(gm8, node), observer_of(gm16, node)
        if obs8 is not None and obs8.qscheme not in PER_CHANNEL:
            if (_DTYPE_NAMES.get(obs8.dtype), _DTYPE_NAMES.get(obs16.dtype)) != ("int8", "int16"):
                raise RuntimeError(f"{node.name}: expected an int8 and an int16 activation observer, got "
                                   f"{obs8.dtype} and {obs16.dtype}")


def _resolve(spec, seen: int = 0):
    """The QuantizationSpec behind ``spec`` (shared specs followed to their source)."""
    while isinstance(spec, SharedQuantizationSpec) and seen < 64:
        src = spec.edge_or_node
        if isinstance(src, Node):
            spec = src.meta[Q_ANNOTATION_KEY].output_qspec
        else:  # an (input node, consumer) edge
            spec = src[1].meta[Q_ANNOTATION_KEY].input_qspec_map[src[0]]
        seen += 1
    return spec


def _output_dtype(node: Node | None) -> str | None:
    ann = node.meta.get(Q_ANNOTATION_KEY) if node is not None else None
    if ann is None or ann.output_qspec is None:
        return None
    return _DTYPE_NAMES[_resolve(ann.output_qspec).dtype]


def _weight_dtype(node: Node | None) -> str:
    """The dtype of ``node``'s per-channel weight spec ("int8" when none is found)."""
    ann = node.meta.get(Q_ANNOTATION_KEY) if node is not None else None
    for spec in (ann.input_qspec_map.values() if ann is not None else ()):
        spec = _resolve(spec)
        if getattr(spec, "qscheme", None) in PER_CHANNEL:
            return _DTYPE_NAMES[spec.dtype]
    return "int8"


def _input_dtype(node: Node | None, producer: str) -> str | None:
    ann = node.meta.get(Q_ANNOTATION_KEY) if node is not None else None
    if ann is None:
        return None
    for arg, spec in ann.input_qspec_map.items():
        if arg.name == producer:
            return _DTYPE_NAMES[_resolve(spec).dtype]
    return None
