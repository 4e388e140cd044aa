"""Per-layer offload manifest: which layer runs where, and why.

:func:`build_manifest` lists the layers of the imported module (``mod_before``)
in graph order and attaches each one's backend from the
:class:`~pipeline.backend.passes.log.OffloadLog`, cross-checked against the
offload PrimFuncs that really are in ``mod_after``.

Layers are the bindings of these ops (the bias add and a fused ReLU / clip
belong to the conv / FC / residual add they follow):

==================  ===========================================================
op                  Relax binding
==================  ===========================================================
conv2d              ``nn.conv2d`` with groups = 1
grouped_conv2d      ``nn.conv2d`` with 1 < groups, weight ``[C_out, C_in/g > 1, ...]``
depthwise_conv2d    ``nn.conv2d`` with weight ``[C, 1, KH, KW]``, groups > 1
fc / matmul         ``matmul`` (fc: right operand ``permute_dims(dq(W))`` or a constant)
residual_add        ``add`` of two computed tensors
max_pool2d, avg_pool2d, adaptive_avg_pool2d, mean
relu, clip          only when not fused into one of the above
hardswish, hardsigmoid, silu, sigmoid, gelu, gelu_tanh
                    the whole float chain the Relax import decomposes the
                    activation into (``passes.activation.match_activation``:
                    add / clip / multiply / divide / sigmoid), one layer named
                    by the chain's last binding; its inner bindings are not layers
batch_norm          ``nn.batch_norm`` (an unfolded one: DenseNet's pre-activation BN);
                    a ReLU the channel-affine kernel fuses stays a layer of its
                    own, offloaded to the same PrimFunc (passes.channel_affine)
requantize          ``quantize(dequantize(x))`` changing the dtype (an int8 <->
                    int16 boundary of a mixed-precision graph); ``dtype`` is
                    x's, ``out_dtype`` the quantize's
(other)             any other computing op, by its short name (``sigmoid``...)
==================  ===========================================================

Not layers: other quantize / dequantize, data movement (reshape, permute_dims,
squeeze, expand_dims, flatten, concat, split, strided_slice, astype...), tuples.

``macs`` counts multiply-accumulates of conv and matmul layers
(``prod(out_shape) * C_in/groups * KH * KW`` and ``prod(out_shape) * K``);
every other layer counts 0. The result is plain JSON data, deterministic for a
given input (graph order, no sets, no addresses).
"""

from __future__ import annotations

import math

import tvm
from tvm import relax, tirx

from .passes.activation import match_activation
from .passes.graph import Graph, const_array, prim_number, static_shape
from .passes.l2_normalize import norm_of
from .passes.matmul import _scale_chain
from .passes.log import OFFLOADED, SIMPLIFIED, OffloadLog

SCALAR = "scalar"
BACKENDS = ("mmalib", "c7x", SCALAR)

_MOVEMENT = {"relax.quantize", "relax.dequantize", "relax.reshape", "relax.permute_dims",
             "relax.squeeze", "relax.expand_dims", "relax.flatten", "relax.astype",
             "relax.concat", "relax.split", "relax.strided_slice", "relax.broadcast_to",
             "relax.layout_transform", "relax.take"}
_POOLS = {"relax.nn.max_pool2d": "max_pool2d", "relax.nn.avg_pool2d": "avg_pool2d",
          "relax.nn.adaptive_avg_pool2d": "adaptive_avg_pool2d", "relax.mean": "mean"}
_WRAPPERS = ("relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.astype",
             "relax.permute_dims", "relax.dequantize")
_KERNEL_OPS = {"conv2d", "grouped_conv2d", "depthwise_conv2d", "fc", "residual_add", "max_pool2d",
               "avg_pool2d", "adaptive_avg_pool2d", "mean", "relu", "clip", "requantize",
               "hardswish", "hardsigmoid", "silu", "sigmoid", "gelu", "gelu_tanh", "batch_norm"}


def _is_constant_derived(graph: Graph, expr) -> bool:
    """A constant, possibly behind reshape / astype / permute / dequantize wrappers."""
    while const_array(expr) is None:
        call = graph.call(expr, *_WRAPPERS)
        if call is None:
            return False
        expr = call.args[0]
    return True


def _op_name(call) -> str:
    return call.op.name if isinstance(call.op, tvm.ir.Op) else ""


def _conv_kind(call) -> str:
    groups = int(call.attrs.groups)
    w_shape = static_shape(call.args[1])
    if groups == 1:
        return "conv2d"
    return "depthwise_conv2d" if w_shape is not None and w_shape[1] == 1 else "grouped_conv2d"


def _macs(op: str, call, out_shape) -> int:
    if out_shape is None:
        return 0
    if op.endswith("conv2d"):
        w = static_shape(call.args[1])
        return math.prod(out_shape) * math.prod(w[1:]) if w else 0
    if op in ("fc", "matmul"):
        lhs = static_shape(call.args[0])
        return math.prod(out_shape) * lhs[-1] if lhs else 0
    return 0


def _layer_dtype(graph: Graph, expr) -> str:
    """The quantized dtype feeding a layer (through its dequantize), else the tensor dtype."""
    dq = graph.call(expr, "relax.reshape")
    dq = graph.call(dq.args[0] if dq is not None else expr, "relax.dequantize")
    source = dq.args[0] if dq is not None else expr
    return str(source.ty.dtype) if isinstance(source.ty, relax.TensorType) else "unknown"


def _is_requantize(graph: Graph, call) -> bool:
    """``call`` is ``quantize(dequantize(x))`` of a computed ``x`` into another dtype."""
    dq = graph.call(call.args[0], "relax.dequantize")
    if dq is None or const_array(dq.args[0]) is not None:
        return False
    return str(dq.args[0].ty.dtype) != str(call.attrs.out_dtype)


def _classify(graph: Graph, var, call) -> str | None:
    """Layer kind of one binding, or ``None`` if it is not a layer on its own."""
    name = _op_name(call)
    if name == "relax.quantize" and _is_requantize(graph, call):
        return "requantize"
    if name == "relax.nn.conv2d":
        return _conv_kind(call)
    if name == "relax.matmul":
        rhs = call.args[1]
        perm = graph.call(rhs, "relax.permute_dims")
        weight = perm.args[0] if perm is not None else rhs
        return "fc" if _is_constant_derived(graph, weight) else "matmul"
    if name == "relax.add":
        consts = [_is_constant_derived(graph, a) for a in call.args]
        if not any(consts):
            return "residual_add"
        other = call.args[consts.index(False)] if not all(consts) else None
        if other is not None and graph.call(other, "relax.nn.conv2d", "relax.matmul") is not None:
            return None  # bias add: part of the conv / FC
        return "add"
    if name == "relax.multiply" and _scales_matmul(graph, call):
        return None  # attention's scale: part of the matmul (its kernel folds the factor)
    if name in _POOLS:
        return _POOLS[name]
    if name in ("relax.nn.relu", "relax.clip"):
        return "relu" if name == "relax.nn.relu" else "clip"
    if name in _MOVEMENT or not name:
        return None
    return name.split(".")[-1]


def _scales_matmul(graph: Graph, call) -> bool:
    """``call`` multiplies an activation matmul's output (through other such multiplies and
    reshapes) by a constant scalar: the matmul pass's own peeling (``passes.matmul._scale_chain``)."""
    mm = _scale_chain(graph, call)[0]
    inner = graph.call(mm, "relax.matmul")
    return mm is not call and inner is not None and _classify(graph, mm, inner) == "matmul"


def _fused_into(graph: Graph, call, layers: dict):
    """The layer variable a relu / clip is fused into (its input comes straight
    from a conv / FC / residual add, through a bias add or reshape), else ``None``."""
    expr = call.args[0]
    for _ in range(3):
        if expr in layers:
            return expr
        inner = graph.call(expr, "relax.add", "relax.reshape")
        if inner is None:
            return None
        if _op_name(inner) == "relax.add":
            expr = next((a for a in inner.args if a in layers), None)
        else:
            expr = inner.args[0]
        if expr is None:
            return None
    return expr if expr in layers else None


def _activation_text(call) -> str:
    if _op_name(call) == "relax.nn.relu":
        return "relu"
    return f"clip({prim_number(call.args[1]):g}, {prim_number(call.args[2]):g})"


def _activation_chains(graph: Graph) -> tuple[dict, set]:
    """Activation kind of each binding that ends a decomposed activation, and the
    set of the chains' inner bindings (not layers on their own). Walked from the
    last binding back so that an enclosing chain (hardswish) claims the shorter
    one inside it (hardsigmoid)."""
    kinds: dict = {}
    inner: set = set()
    for b in reversed(graph.bindings):
        if b.var in inner:
            continue
        m = match_activation(graph, b.var)
        if m is not None:
            kinds[b.var] = m.kind
            inner.update(m.chain[1:])
    return kinds, inner


def _l2_normalize_chains(graph: Graph) -> tuple[dict, set]:
    """``F.normalize``'s divides (``"l2_normalize"``) and the bindings of their norms (power,
    sum, power, clip, broadcast: part of the layer, not layers of their own), matched as the
    L2-normalize pass matches them (:func:`.passes.l2_normalize.norm_of`)."""
    kinds: dict = {}
    inner: set = set()
    for b in graph.bindings:
        div = graph.call(b.var, "relax.divide")
        norm = norm_of(graph, div.args[1]) if div is not None else None
        if norm is not None and norm[0].same_as(div.args[0]):
            kinds[b.var] = "l2_normalize"
            inner.update(norm[3])
    return kinds, inner


def _offload_funcs(mod_after: tvm.IRModule) -> dict[str, dict]:
    """Offload PrimFuncs of ``mod_after``: name -> {kernel, backend}."""
    funcs = {}
    for gv, func in mod_after.functions.items():
        if isinstance(func, tirx.PrimFunc) and func.attrs is not None and "c7x_kernel" in func.attrs:
            funcs[gv.name_hint] = {"kernel": str(func.attrs["c7x_kernel"]),
                                   "backend": str(func.attrs["c7x_offload_backend"])}
    return funcs


#: the ranking ops of an NMS-free detection head (YOLO26: topk, gather, the index
#: arithmetic of anchor x class); kept float by the quantizer's detection rule.
_RANKING_OPS = {"topk", "gather_elements", "floor_mod", "floor_divide"}


def _no_decision_reason(op: str) -> str:
    if op in _RANKING_OPS:
        return (f"float detection head: {op} ranks the scores in float32 (quantizer detection rule, "
                f"docs/reference.md); static C on the host/DSP core, no MMALIB kernel ranks")
    if op in _KERNEL_OPS:
        return "not in a Q/DQ pattern that an offload pass matches"
    return f"no MMALIB/C7x kernel for {op}"


def _entry(graph: Graph, var, call, op: str, log: OffloadLog, funcs: dict) -> dict:
    out_shape = static_shape(var)
    w_shape = None
    if op.endswith("conv2d"):
        w_shape = static_shape(call.args[1])
    elif op == "fc":
        perm = graph.call(call.args[1], "relax.permute_dims")
        w_shape = static_shape(perm.args[0]) if perm is not None else static_shape(call.args[1])
    in_shape = static_shape(call.args[0]) if call.args else None
    entry = {"name": var.name, "op": op, "dtype": _layer_dtype(graph, call.args[0]),
             "input_shape": list(in_shape) if in_shape else None,
             "weight_shape": list(w_shape) if w_shape else None,
             "output_shape": list(out_shape) if out_shape else None,
             "activation": None, "macs": _macs(op, call, out_shape),
             "backend": SCALAR, "kernel": None, "func": None}
    if op == "requantize":
        entry["out_dtype"] = str(call.attrs.out_dtype)
    decision = log.for_anchor(var.name)
    if decision is not None and decision.status == OFFLOADED:
        if decision.func not in funcs:
            raise ValueError(f"offload log says {var.name} calls {decision.func}, "
                             "which is not an offload PrimFunc of mod_after")
        entry.update(backend=funcs[decision.func]["backend"], kernel=funcs[decision.func]["kernel"],
                     func=decision.func)
        if decision.note:
            entry["note"] = decision.note
    elif decision is None and (folded := [d for d in log.with_status(SIMPLIFIED) if d.anchor == var.name and d.note]):
        entry["reason"] = f"no call of its own: {folded[-1].note}"   # e.g. a pad folded into its conv
    else:
        entry["reason"] = decision.reason if decision is not None else _no_decision_reason(op)
    return entry


def _summary(entries: list[dict], log: OffloadLog, funcs: dict) -> dict:
    by_backend = {b: {"layers": 0, "macs": 0} for b in BACKENDS}
    by_op: dict[str, dict] = {}
    for e in entries:
        by_backend.setdefault(e["backend"], {"layers": 0, "macs": 0})
        by_backend[e["backend"]]["layers"] += 1
        by_backend[e["backend"]]["macs"] += e["macs"]
        op = by_op.setdefault(e["op"], {"layers": 0, "offloaded": 0})
        op["layers"] += 1
        op["offloaded"] += e["backend"] != SCALAR
    offloaded = [e for e in entries if e["backend"] != SCALAR]
    return {"layers": len(entries), "layers_offloaded": len(offloaded),
            "macs_total": sum(e["macs"] for e in entries),
            "macs_offloaded": sum(e["macs"] for e in offloaded),
            "by_backend": by_backend, "by_op": by_op,
            "offload_funcs": len(funcs), "cleanups": len(log.with_status(SIMPLIFIED))}


def build_manifest(mod_before: tvm.IRModule, mod_after: tvm.IRModule, log: OffloadLog) -> dict:
    """Offload manifest of one compilation.

    ``mod_before``: the module given to ``run_offload``; ``mod_after`` and
    ``log``: what it returned. Returns ``{"layers": [entry, ...], "summary": {...}}``:
    one entry per layer of ``mod_before["main"]`` in graph order with ``name``
    (binding), ``op``, ``dtype`` (quantized dtype of its input), ``input_shape``,
    ``weight_shape`` (OIHW conv / ``[N, K]`` FC / None), ``output_shape``
    (NCHW for conv), ``activation`` (fused relu / clip), ``macs``, ``backend``
    ("mmalib" | "c7x" | "scalar"), ``kernel``, ``func`` (offload PrimFunc),
    ``reason`` when on the scalar path, ``note`` when the pass left one
    (e.g. a padded FC width) and, for a requantize, ``out_dtype``. The summary has ``layers``, ``layers_offloaded``,
    ``macs_total``, ``macs_offloaded``, ``by_backend`` {layers, macs}, ``by_op``
    {layers, offloaded}, ``offload_funcs`` and ``cleanups``.
    Raises ValueError if the log names a PrimFunc that ``mod_after`` lacks.
    """
    graph = Graph(mod_before["main"])
    funcs = _offload_funcs(mod_after)
    activations, inner = _activation_chains(graph)
    norms, norm_inner = _l2_normalize_chains(graph)
    activations, inner = {**activations, **norms}, inner | norm_inner
    layers: dict = {}
    entries: list[dict] = []
    for binding in graph.bindings:
        call = binding.value
        if not isinstance(call, relax.Call) or binding.var in inner:
            continue
        op = activations.get(binding.var) or _classify(graph, binding.var, call)
        if op is None:
            continue
        if op in ("relu", "clip"):
            host = _fused_into(graph, call, layers)
            if host is not None:
                layers[host]["activation"] = _activation_text(call)
                continue
        entry = _entry(graph, binding.var, call, op, log, funcs)
        if any(e["name"] == entry["name"] for e in entries):
            raise ValueError(f"two layers are named {entry['name']}: log anchors would be ambiguous")
        layers[binding.var] = entry
        entries.append(entry)
    return {"layers": entries, "summary": _summary(entries, log, funcs)}
