"""C7xMMAQuantizer: the PT2E quantizer that shapes graphs for the C7x MMALIB backend.

It reproduces the reference quantizer's behaviour (docs/reference.md,
"Quantizer rules"; the op rules are listed in :mod:`pipeline.quant.rules`, the
specs in :mod:`pipeline.quant.specs`) with two documented deviations:

* **Weight dtype in int16 mode.** By default (``weight_dtype=None``) weights
  are int8 for both activation dtypes, as the user's examples say (int16 mode:
  int8 per-channel weights; docs/reference.md, "The user's examples"). The
  reference *code* uses int16 weights in int16 mode, and its int16 MMALIB passes
  need them: ``weight_dtype="int16"`` gives that.
* **Activation fusion** (``fuse_activations=True``, the default). When a
  conv2d / linear / add.Tensor / add_.Tensor has exactly one user and that user
  is relu / relu_ / hardtanh / hardtanh_ / relu6, the producer's output is not
  observed and the activation's output gets an independent activation spec
  (the standard PT2E conv-relu pattern; the C7x kernels apply relu/clip after
  the accumulator anyway, docs/reference.md, "Kernel math"). The observer then
  sees the post-activation range, which matters for ReLU6: the reference
  observes the conv output and lets relu share its scale, wasting int8 codes
  on values the clip removes.
  It scores higher on real images (docs/measuring.md, "Figures behind the code"). With ``fuse_activations=False``
  the reference table is followed exactly (producer output observed, the
  activation shares it). An activation that reaches ``topk`` is never fused
  (the detection-head rule keeps it float).
"""

from __future__ import annotations

import warnings

import torch
from torch.fx import Node
from torchao.quantization.pt2e.quantizer import (FixedQParamsQuantizationSpec, QuantizationAnnotation,
                                                 QuantizationSpec, Quantizer, SharedQuantizationSpec)
from torchao.quantization.pt2e.quantizer.quantizer import Q_ANNOTATION_KEY

from . import rules, saturation, specs
from .layer_scale import fold_layer_scales

_PER_TENSOR = (torch.per_tensor_affine, torch.per_tensor_symmetric)

#: aten op -> the name of the :class:`C7xMMAQuantizer` method that annotates it, filled by
#: :func:`annotates` where each method is defined (torchao's ``OP_TO_ANNOTATOR`` pattern);
#: the op sets themselves are :mod:`.rules`' tables.
OP_TO_ANNOTATOR: dict = {}


def annotates(*op_sets: frozenset):
    """Register the decorated method as the annotator of every op in ``op_sets``.
    Raises ValueError when an op already has an annotator."""
    def register(method):
        for ops in op_sets:
            for op in ops:
                if op in OP_TO_ANNOTATOR:
                    raise ValueError(f"{op} has two annotators: {OP_TO_ANNOTATOR[op]} and {method.__name__}")
                OP_TO_ANNOTATOR[op] = method.__name__
        return method
    return register


class C7xMMAQuantizer(Quantizer):
    """PT2E quantizer for the TI C7x MMA: which ops get Q/DQ, with which specs.

    Args:
        dtype: "int8" (default) or "int16" activations. Anything else: ValueError.
        symmetric_activations: int8 only; False gives ``per_tensor_affine``
            activations. For int16 a False emits a UserWarning and is ignored.
        weight_dtype: the weights of int16-activation layers: None / "int8" (int8
            weights, the user's examples) or "int16" (the reference code; with
            ``dtype="int8"`` it reaches ``int16_layers`` only, int8 layers keep int8
            weights); else ValueError.
        observer: activation observer, "minmax" (torchao MinMaxObserver, the
            reference's), "histogram" (the MSE-optimal range), "moving_average",
            "percentile" or "entropy" (:mod:`pipeline.quant.observers`); else ValueError.
        observer_kwargs: the observer's options, e.g. ``{"percentile": 99.9}``
            for "percentile" (:data:`pipeline.quant.specs.OBSERVER_OPTIONS`);
            an option the observer does not take: ValueError.
        fuse_activations: observe conv/linear/add outputs after a following
            relu/ReLU6 instead of before it (see module docstring).
        int16_layers: layer ids (float FX node names, ``conv2d_3``; see
            :mod:`pipeline.frontend.provenance`) that get int16 activations in an
            int8 model (mixed precision). Only with ``dtype="int8"``, else ValueError.

    Mixed precision: every annotated node has one activation dtype, int16 if
    its layer id is listed (a fused activation takes its producer's), else
    int8; a transparent op takes its source's, so no boundary falls inside a
    shared-observer group; an average pool of an int16 producer is int16 too.
    All inputs of a node are observed in the node's own dtype, so PT2E puts a
    second observer where an int8 output feeds an int16 input (or the reverse)
    and ``convert_pt2e`` writes ``q(dq(x, int8), int16)``: the requantize the
    backend turns into one kernel.

    Attributes ``activation_spec`` and ``weight_spec`` hold the two
    QuantizationSpecs (see :mod:`pipeline.quant.specs` for ranges and schemes).

    What gets annotated (full table and reasons in :mod:`pipeline.quant.rules`,
    docs/reference.md, "Quantizer rules"): conv2d (NCHW input, OIHW weight) and
    linear ([..., K] input, [N, K] weight) with per-channel axis-0 weights and
    float bias; mm / addmm ([M, K] x [K, N], both operands per-tensor);
    add.Tensor / add_.Tensor of two float tensors (residuals); gelu, silu, hardsigmoid, hardswish and the
    average pools (own output observer); layer_norm; relu-like, max_pool2d and
    shape ops sharing their input's observer; *ours*: a sigmoid that is a
    squeeze-excitation gate (own output observer, :func:`rules.is_se_gate`) and an int8
    softmax over the last axis (input observed, output fixed at scale 1/256, zero point -128);
    in an affine int8 model, a tensor an activation matmul reads is observed symmetric, the
    zero point the MMA takes (:meth:`_matmul_operand`).
    cat, mul, any other sigmoid and group_norm stay float. A tensor that only tanh, an SE
    gate or hardsigmoid reads is observed within the input bound past which their output
    saturates (:mod:`pipeline.quant.saturation`). Everything observed is a float32
    tensor; the Q/DQ dtype is int8 or int16 as configured.
    """

    def __init__(self, dtype: str = "int8", symmetric_activations: bool = True,
                 weight_dtype: str | None = None, observer: str = "minmax",
                 fuse_activations: bool = True, int16_layers=frozenset(),
                 observer_kwargs: dict | None = None):
        super().__init__()
        self.dtype = specs.check_dtype(dtype)
        self.int16_layers = frozenset(int16_layers)
        if self.int16_layers and self.dtype != "int8":
            raise ValueError(f"int16_layers (mixed precision) needs dtype='int8', got {dtype!r}")
        observer_cls = specs.check_observer(observer)
        self.observer_kwargs = specs.check_observer_kwargs(observer, observer_kwargs)
        self.weight_dtype = specs.resolve_weight_dtype(weight_dtype)
        self.symmetric_activations = specs.resolve_symmetric(dtype, symmetric_activations)
        self.observer = observer
        self.fuse_activations = bool(fuse_activations)
        self.activation_spec = specs.activation_spec(dtype, self.symmetric_activations, observer_cls,
                                                     self.observer_kwargs)
        # int16 is always symmetric (specs.resolve_symmetric)
        self._act_specs = {dtype: self.activation_spec,
                           "int16": (self.activation_spec if dtype == "int16"
                                     else specs.activation_spec("int16", True, observer_cls,
                                                                self.observer_kwargs))}
        self._observer_cls, self._bounded_specs = observer_cls, {}
        # affine int8: a matmul operand is observed symmetric, the zero point the MMA takes
        self._operand_spec = (specs.activation_spec("int8", True, observer_cls, self.observer_kwargs)
                              if dtype == "int8" and not self.symmetric_activations else None)
        self._node_dtype: dict[Node, str] = {}
        # int8 layers always take int8 weights; weight_dtype is the int16 layers'
        self._weight_specs = {"int8": specs.weight_spec("int8"), "int16": specs.weight_spec(self.weight_dtype)}
        self.weight_spec = self._weight_specs[self.dtype]
        self._handlers = {op: getattr(self, name) for op, name in OP_TO_ANNOTATOR.items()}

    def __repr__(self) -> str:
        return (f"C7xMMAQuantizer(dtype={self.dtype!r}, symmetric_activations="
                f"{self.symmetric_activations}, weight_dtype={self.weight_dtype!r}, "
                f"observer={self.observer!r}, "
                + (f"observer_kwargs={self.observer_kwargs}, " if self.observer_kwargs else "")
                + f"fuse_activations={self.fuse_activations}"
                + (f", int16_layers={sorted(self.int16_layers)}" if self.int16_layers else "") + ")")

    # ------------------------------------------------------------------ annotate
    def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        """Before annotating: a plain ``scaled_dot_product_attention`` becomes its two matmuls and
        softmax (:func:`rules.decompose_attention`), an einsum that is a batched matmul becomes
        permutes around a matmul (:func:`rules.einsum_as_matmul`), and a scalar multiply on an
        activation matmul's operand moves behind the matmul (:func:`rules.hoist_scalar_multiplies`),
        so the operand is a view of its producer (rules.MATMUL); a pad of zero width is dropped
        (:func:`rules.drop_empty_pads`); a per-feature layer scale after a linear goes into its
        weights (:func:`pipeline.quant.layer_scale.fold_layer_scales`)."""
        model = fold_layer_scales(rules.drop_empty_pads(model))
        return rules.hoist_scalar_multiplies(rules.einsum_as_matmul(rules.decompose_attention(model)))

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        """Attach ``meta["quantization_annotation"]`` to the supported call_function
        nodes of ``model`` (in place; also returned), in graph order.

        A node that already carries an annotation is left exactly as it is, so a
        second call changes nothing (docs/reference.md, "Quantizer rules")."""
        for node in model.graph.nodes:
            if node.op != "call_function" or Q_ANNOTATION_KEY in node.meta:
                continue
            handler = self._handlers.get(node.target)
            if handler is not None:
                handler(node)
        return model

    def _set(self, node: Node, inputs: dict, output) -> None:
        node.meta[Q_ANNOTATION_KEY] = QuantizationAnnotation(
            input_qspec_map=inputs, output_qspec=output, _annotated=True)

    def _act(self, node: Node):
        """The activation spec of ``node``'s own dtype (mixed precision: int16 when
        its layer id is in ``int16_layers``)."""
        return self._act_specs[self._dtype_of(node)]

    def _out_act(self, node: Node):
        """The output spec of ``node`` when observed: the act spec of its dtype, bounded
        (:mod:`pipeline.quant.saturation`) when only saturating activations read it, symmetric
        when an activation matmul reads it (:meth:`_matmul_operand`)."""
        if self._matmul_operand(node):
            return self._operand_spec
        bounds = []
        for user in node.users:
            kind = self._saturating(user)
            if kind is None or user.args[0] is not node:
                return self._act(node)
            bounds.append(saturation.input_bound(kind, self._dtype_of(user)))
        return self._bounded(self._dtype_of(node), max(bounds)) if bounds else self._act(node)

    def _matmul_operand(self, node: Node) -> bool:
        """An affine int8 model's ``node`` is int8 and an activation matmul reads its output,
        through view ops: observed symmetric (zero point 0), as the batched-matmul MMA takes
        int8 operands of zero point 0 or -128 only (:mod:`pipeline.backend.passes.matmul`).
        Its other readers read it so too (:meth:`_in`): one observer, no requantize."""
        return self._operand_spec_of(self._dtype_of(node)) is not None and rules.read_by_activation_matmul(node)

    def _operand_spec_of(self, dtype: str):
        """The symmetric operand spec when ``dtype`` is int8 in an affine model, else None."""
        return self._operand_spec if dtype == "int8" else None

    def _in(self, node: Node, src: Node):
        """The spec ``node`` reads ``src`` with: the act spec of its dtype, or the symmetric
        operand spec when ``src`` is (a view of) a tensor observed so (:meth:`_matmul_operand`)."""
        operand = self._operand_spec_of(self._dtype_of(node))
        if operand is not None and self._root_output_spec(rules.view_source(src)) is operand:
            return operand
        return self._act(node)

    @staticmethod
    def _root_output_spec(node: Node):
        """``node``'s output spec, following shared specs to the node that owns the observer."""
        while True:
            ann = node.meta.get(Q_ANNOTATION_KEY)
            spec = ann.output_qspec if ann is not None else None
            if not (isinstance(spec, SharedQuantizationSpec) and isinstance(spec.edge_or_node, Node)):
                return spec
            node = spec.edge_or_node

    def _saturating(self, node: Node) -> str | None:
        """The saturating kind of ``node`` when this quantizer annotates it as one, else None."""
        kind = saturation.SATURATING.get(node.target) if node.op == "call_function" else None
        if kind == "sigmoid" and not rules.is_se_gate(node):
            return None
        return kind

    def _bounded(self, dtype: str, bound: float):
        """The act spec of ``dtype`` with a saturation bound: one object per (dtype, bound),
        so a producer's output and its reader's input compare equal and share one observer."""
        if (dtype, bound) not in self._bounded_specs:
            kwargs = {**self.observer_kwargs, "bound": bound}
            self._bounded_specs[dtype, bound] = specs.activation_spec(
                dtype, self._act_specs[dtype].qscheme == torch.per_tensor_symmetric,
                saturation.BOUNDED[self._observer_cls], kwargs)
        return self._bounded_specs[dtype, bound]

    def _input_act(self, node: Node, src: Node):
        """The spec of ``node``'s input ``src``: the act spec (:meth:`_in`: a matmul operand's
        symmetric one), bounded when ``node`` saturates and the bound costs no requantize
        (``src`` unobserved, observed in another dtype anyway, or already bounded the same way
        by :meth:`_out_act`)."""
        kind, dtype, read = self._saturating(node), self._dtype_of(node), self._in(node, src)
        if kind is None or read is self._operand_spec:
            return read
        bounded = self._bounded(dtype, saturation.input_bound(kind, dtype))
        ann = src.meta.get(Q_ANNOTATION_KEY)
        produced = ann.output_qspec if ann is not None else None
        if produced is None or produced is bounded or self._output_dtype(src, dtype) != dtype:
            return bounded
        return read

    def _dtype_of(self, node: Node) -> str:
        if node not in self._node_dtype:
            dtype = "int16" if _layer_id(node) in self.int16_layers else self.dtype
            if node.target in rules.AVERAGE_POOLS and self._output_dtype(node.args[0], dtype) == "int16":
                dtype = "int16"   # mixed precision: no requantize of an int16 layer's output before a pool
            self._node_dtype[node] = dtype
        return self._node_dtype[node]

    @annotates(rules.WEIGHTED)
    def _annotate_weighted(self, node: Node) -> None:
        # No float gating here (docs/reference.md, "Quantizer rules"): conv/linear
        # always take a tensor input.
        inputs = {node.args[0]: self._in(node, node.args[0]), node.args[1]: self._weight_specs[self._dtype_of(node)]}
        self._set(node, inputs, self._output_spec(node))

    @annotates(rules.BINARY)
    def _annotate_binary(self, node: Node) -> None:
        a, b = node.args[:2]
        if node.target != rules.aten.mm.default and rules.reaches_topk(node):
            return  # the box decode of a detection head (detection rule) stays float
        if rules.is_float_tensor(a) and rules.is_float_tensor(b):
            self._set(node, {a: self._in(node, a), b: self._in(node, b)}, self._output_spec(node))

    @annotates(rules.ADDMM)
    def _annotate_addmm(self, node: Node) -> None:
        # args[0] (bias) stays float; the weight operand is per-tensor like an activation.
        _, mat1, mat2 = node.args[:3]
        self._set(node, {mat1: self._in(node, mat1), mat2: self._in(node, mat2)}, self._out_act(node))

    @annotates(rules.INDEPENDENT, rules.LAYER_NORM)
    def _annotate_independent(self, node: Node) -> None:
        src = node.args[0]
        if rules.is_float_tensor(src):
            self._set(node, {src: self._input_act(node, src)}, self._out_act(node))

    @annotates(rules.SE_GATE)
    def _annotate_se_gate(self, node: Node) -> None:
        # ours (rules.SE_GATE): only a squeeze-excitation gate; other sigmoids stay float
        if rules.is_se_gate(node):
            self._annotate_independent(node)

    @annotates(rules.SOFTMAX)
    def _annotate_softmax(self, node: Node) -> None:
        # ours (rules.SOFTMAX): int8 in, fixed int8 out, for the c7x_int8_softmax kernel
        src = node.args[0]
        if (rules.is_float_tensor(src) and rules.is_last_axis_softmax(node) and self._dtype_of(node) == "int8"
                and not rules.reaches_topk(node)):
            self._set(node, {src: self._in(node, src)}, specs.softmax_output_spec())

    @annotates(rules.MATMUL)
    def _annotate_matmul(self, node: Node) -> None:
        # ours (rules.MATMUL): each operand shares its producer's observer when it is a view of an
        # observed tensor; the output observer goes after a chain of scalar multiplies
        if not rules.is_activation_matmul(node) or rules.reaches_topk(node):
            return
        # an operand nothing observes (a float softmax's output, in int16) is read in the matmul's dtype
        inputs = {a: self._shared_with(rules.view_source(a), self._dtype_of(node), operand=True)
                  for a in node.args}
        last = node
        while len(last.users) == 1 and rules.scalar_factor(next(iter(last.users))) is not None:
            last = next(iter(last.users))
        self._node_dtype[last] = self._dtype_of(node)
        output = self._operand_spec if self._matmul_operand(last) else self._act(node)
        if last is node:
            self._set(node, inputs, output)
            return
        self._set(node, inputs, None)
        self._set(last, {}, output)

    @annotates(rules.TRANSPARENT)
    def _annotate_transparent(self, node: Node) -> None:
        src = node.args[0]
        if not rules.is_float_tensor(src) or rules.reaches_topk(node):
            return
        self._node_dtype[node] = self._output_dtype(src, default=self._dtype_of(node))
        base = rules.view_source(src)
        ann = src.meta.get(Q_ANNOTATION_KEY)
        if ann is not None and isinstance(ann.output_qspec, FixedQParamsQuantizationSpec):
            # after a softmax (fixed qparams): an act observer on the input would requantize
            # the probabilities for nothing (Swin's eval-mode dropout before attention . V)
            self._set(node, {src: SharedQuantizationSpec(src)}, SharedQuantizationSpec(src))
            return
        if base is not src and self._observed(base):
            # a view of a view of an observed tensor (the q, k, v of a fused attention projection):
            # the same qparams all the way, so no requantize between the views
            self._set(node, {src: self._shared_with(base)}, SharedQuantizationSpec(base))
            return
        if self._matmul_operand(node) and not self._observed(src):
            # a view of a float tensor (a cat) on its way to a matmul: observed as its operand
            self._set(node, {src: self._operand_spec}, self._operand_spec)
            return
        self._set(node, {src: self._in(node, src)}, self._shared_with(src))

    @annotates(rules.PAD)
    def _annotate_pad(self, node: Node) -> None:
        """A zero pad shares its input's qparams (:func:`rules.is_zero_pad`): the padded tensor
        stays on the input's grid, and the backend folds a pad that feeds a conv into the conv's
        padding (TF "same" padding, :mod:`pipeline.backend.passes.movement`). Other pads: none."""
        if rules.is_zero_pad(node):
            self._annotate_transparent(node)

    @staticmethod
    def _observed(node: Node) -> bool:
        ann = node.meta.get(Q_ANNOTATION_KEY)
        return ann is not None and ann.output_qspec is not None

    def _output_dtype(self, src: Node, default: str) -> str:
        """The dtype ``src``'s output is observed in (its own, when annotated)."""
        ann = src.meta.get(Q_ANNOTATION_KEY)
        return self._node_dtype.get(src, default) if ann is not None else default

    def _shared_with(self, src: Node, dtype: str | None = None, operand: bool = False):
        """Share ``src``'s output observer if it has one; otherwise an independent spec
        of ``src``'s dtype, else ``dtype`` (the reader's), else the model's (sharing with an
        unobserved output would reference no observer); for an activation matmul's ``operand``
        in int8 of an affine model, the symmetric spec (:meth:`_matmul_operand`)."""
        if self._observed(src):
            return SharedQuantizationSpec(src)
        dtype = self._output_dtype(src, dtype or self.dtype)
        return (operand and self._operand_spec_of(dtype)) or self._act_specs[dtype]

    def _output_spec(self, node: Node):
        """The output spec of a conv/linear/add/mm: None when fused with its activation
        (which is then annotated here, with an independent spec of the producer's
        dtype), else the act spec."""
        act = self._fusable_activation(node)
        if act is None:
            return self._out_act(node)
        self._node_dtype[act] = self._dtype_of(node)
        self._set(act, {}, self._out_act(act))
        return None

    def _fusable_activation(self, node: Node) -> Node | None:
        if not self.fuse_activations or node.target not in rules.FUSABLE_PRODUCERS:
            return None
        users = list(node.users)
        if len(users) != 1:
            return None
        act = users[0]
        if (act.op != "call_function" or act.target not in rules.FUSABLE_ACTIVATIONS
                or act.args[0] is not node or Q_ANNOTATION_KEY in act.meta
                or rules.reaches_topk(act)):
            return None
        return act

    def layer_dtypes(self) -> dict[str, str]:
        """Layer id -> activation dtype of every node :meth:`annotate` annotated."""
        return {_layer_id(n): d for n, d in self._node_dtype.items()}

    # ------------------------------------------------------------------ validate
    def validate(self, model: torch.fx.GraphModule) -> None:
        """Warn (UserWarning) for every conv2d/linear whose weight ended up with a
        per-tensor spec: MMALIB expects per-channel weights (docs/reference.md,
        "Quantizer rules", ``validate()``; the reference only logs). Raises nothing."""
        for node in model.graph.nodes:
            if node.op != "call_function" or node.target not in rules.WEIGHTED:
                continue
            ann = node.meta.get(Q_ANNOTATION_KEY)
            spec = ann.input_qspec_map.get(node.args[1]) if ann is not None else None
            if isinstance(spec, QuantizationSpec) and spec.qscheme in _PER_TENSOR:
                warnings.warn(f"{node.name} ({node.target}): weight is quantized per-tensor "
                              f"({spec.qscheme}); the C7x backend expects per-channel weights",
                              UserWarning, stacklevel=2)



def _layer_id(node: Node) -> str:
    """A node's layer id: its float-program name, kept in the provenance tag
    (pipeline.frontend.provenance), else the node's own name."""
    prov = node.meta.get("custom", {}).get("c7x_layer")
    return prov["id"] if prov else node.name
