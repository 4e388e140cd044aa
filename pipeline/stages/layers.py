"""Stage ``layers``: per-layer numerics of the quantized model (``layers.json``).

For every layer of the deployed build's manifest (conv, depthwise, FC,
residual add, pool, mean ...) and over the evaluation images, two
comparisons at the layer's *output point*: the tensor its output quantize
makes, i.e. in the Q/DQ program the dequantize of the quantize that ends the
layer (after a fused ReLU/ReLU6; conv-BN folded):

(a) ``qdq_vs_float``: the PyTorch Q/DQ model (that dequantize's value) against
    the float model (the value of the float node the quantize reads, e.g.
    ``hardtanh_`` for a conv + ReLU6 layer, ``conv2d_2`` for a conv without
    activation). Measured with PT2E's own numeric debugger
    (``prepare_for_propagation_comparison``, ``extract_results_from_loggers``,
    ``compare_results``): both models are built from ONE in-memory float
    program in this process, because the debugger matches nodes by their
    ``from_node`` ancestry (``NodeSourceDebugInfo``: float node name + graph
    id), and its key, the float node's name, is our layer id scheme
    (:mod:`pipeline.frontend.provenance`). The float side gets the conv-BN
    fold PT2E's ``prepare_pt2e`` applies (same torchao functions), otherwise
    a conv's float output would be the pre-BN value. Each model runs on its
    own upstream values (propagation), so the error is cumulative: it
    includes what every earlier layer added.
(b) ``c_vs_qdq``: the Python integer reference of the deployed C
    (:mod:`pipeline.backend.interp`, bit-exact with the host C, which verify
    proves) against the Q/DQ model, at the same point: the output of the
    layer's last kernel call (the manifest's ``calls``; its output is the
    layer's quantized result: the clip after an MMALIB conv, the residual-add
    kernel, ...), dequantized with that tensor's quantization, i.e. the
    ``(scale, zero_point)`` of the layer's output quantize in the Q/DQ
    program (which the importer passed to ``R.quantize`` unchanged and codegen
    folded into the kernels), against the Q/DQ model's dequantize above.
    Also cumulative. ``max_lsb``: the largest difference in integer steps of
    that scale. Where a fused kernel already dequantized (a clip feeding a
    float mean, the model's final slice + dequantize), its float output is
    compared as it is. Where the last call is a TVM function that fused the
    layer's end with ops mixing or reordering tensors (ShuffleNetV2: the
    branch conv's clip + concat + channel shuffle + the next split, returning
    a split half), an earlier call of the layer computing all of it (the
    scalar build's fused conv ... quantize) is compared instead; with none
    (an MMALIB conv whose clip is inside that function), or when the layer has
    no call of its own, the layer's tensor does not exist in the C program: the
    row gets no number and the note "<build>: not comparable: ..." naming the
    function (:func:`layer_calls`).

Numbers per comparison, over every element of every image, for a value x
against its reference ref (x = Q/DQ, ref = float for (a); x = C, ref = Q/DQ
for (b)): ``sqnr_db`` = ``10 log10(sum x^2 / sum (x - ref)^2)``, the
debugger's own ``sqnr`` (torchao's ``compute_sqnr(x, ref)``) with the
images taken together, so for one image it is exactly what
``compare_results`` reports (null when x == ref everywhere); ``cosine``
similarity; ``max_abs`` = max |x - ref| in the tensor's units.

Every evaluation image is used for both (one at a time; the Python
reference costs about 0.15 s per MobileNetV2 image). The PyTorch models run
with the stages' torch threads (``C7X_TORCH_THREADS``), as verify and
evaluate run them, because PyTorch's Q/DQ values move with the thread count
(``docs/numerics.md``); so at the model output ``c_vs_qdq.max_lsb`` is
verify's LSB distance of the build. Everything else runs on one thread:
it is exact or Python-bound, and two threads per task only fight under
``doit -n 2``.

Layers are listed worst first by the Q/DQ-vs-float SQNR: that is the
quantization error a model owner can act on (observer, int16, a layer left
in float), and it is the same for every build; (b) is the implementation's
own error, bounded by design (verify and docs/guide.md, "vs Q/DQ").
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import torchenv
from ..config import ModelSpec, list_images
from ..data.images import load_images
from ..errors import CalibrationDataError
from ..frontend.provenance import KEY
from ..fsutil import write_json
from .convert import load_converted
from .prepare import read_int16_selection
from .prepare import load_program

import torch  # noqa: E402

_QUANTIZE = ("quantize_per_tensor",)
_DEQUANTIZE = ("dequantize_per_tensor",)

MEASURES = {
    "qdq_vs_float": "PyTorch Q/DQ model vs float model at the layer's output (its output quantize's "
                    "dequantize vs the float node it quantizes; conv-BN folded as PT2E does); PT2E "
                    "numeric debugger, propagated (each model on its own upstream values)",
    "c_vs_qdq": "Python integer reference of the C build (bit-exact with the host C) vs the PyTorch "
                "Q/DQ model at the same point: the layer's last kernel call, dequantized with the "
                "output quantize's scale and zero point; propagated",
    "sqnr_db": "10 log10(sum x^2 / sum (x - ref)^2) over all elements of all images, x the first-named "
               "side: torchao's compute_sqnr as the debugger reports it (null: identical)",
    "max_lsb": "largest difference in integer steps of the output tensor's scale",
}


def _op_name(node) -> str:
    return str(getattr(node, "target", ""))


def _is(node, names) -> bool:
    return node.op == "call_function" and any(f"quantized_decomposed.{n}." in _op_name(node) for n in names)


def _layer_id(node) -> str | None:
    return (node.meta.get("custom") or {}).get(KEY, {}).get("id")


@dataclass
class Point:
    """Where a layer's output is compared: ``node`` is the float node name the
    output quantize reads (the debugger's key), ``q`` that quantize's node
    name in the Q/DQ module and ``dq`` the names of its dequantize users,
    ``qparams`` the dequantize's (scale, zero_point, quant_min, quant_max,
    dtype)."""

    node: str
    q: str
    dq: tuple[str, ...]
    qparams: tuple

    @property
    def scale(self) -> float:
        return float(self.qparams[0])

    @property
    def zero_point(self) -> int:
        return int(self.qparams[1])


def _walk_to_quantize(node):
    """From a layer's main op forward through single-user float ops (the fused
    activation) to the quantize that ends the layer, or None."""
    for _ in range(8):
        users = list(node.users)
        if len(users) != 1:
            return None
        node = users[0]
        if _is(node, _QUANTIZE):
            return node
    return None


def _requantize_of(qnode, dtype: str):
    """The quantize into ``dtype`` reading a dequantize of ``qnode`` (an int8 <->
    int16 boundary of a mixed-precision program), or None."""
    for dq in (u for u in qnode.users if _is(u, _DEQUANTIZE)):
        for w in dq.users:
            if _is(w, _QUANTIZE) and str(w.args[5]).removeprefix("torch.") == dtype:
                return w
    return None


def output_points(q: torch.fx.GraphModule, layer_ids: list[str],
                  named: dict[str, str] | None = None,
                  requantize: dict[str, str] | None = None) -> dict[str, Point]:
    """Output point of each layer id in the converted Q/DQ module ``q``.

    The quantize ending the layer is found from the main op (the node whose
    provenance id is the layer id) by :func:`_walk_to_quantize`; ``named``
    (layer id -> the float node id the C's last call is named after, from
    ``relax/layers.json``) overrides it where the C names its output.
    ``requantize`` (layer id -> output dtype of the manifest's requantize
    layers): such a layer is compared at the quantize into that dtype that
    re-quantizes its named node's output. Layers without a point (nothing
    quantizes them) are left out."""
    quantizes: dict[str, list] = {}
    main_op: dict[str, object] = {}
    for n in q.graph.nodes:
        if _is(n, _QUANTIZE) and hasattr(n.args[0], "op"):
            src = _layer_id(n.args[0])
            if src is not None:
                quantizes.setdefault(src, []).append(n)
        elif n.op == "call_function" and _layer_id(n) is not None:
            main_op.setdefault(_layer_id(n), n)
    out = {}
    for lid in layer_ids:
        qnode = base = None
        if named and named.get(lid) in quantizes:
            qnode = base = quantizes[named[lid]][0]
            if lid in (requantize or {}):  # compared with the float value it re-quantizes
                qnode = _requantize_of(base, requantize[lid])
        elif lid in main_op:
            qnode = quantizes[lid][0] if lid in quantizes else _walk_to_quantize(main_op[lid])
        if qnode is None:
            continue
        dq = [u for u in qnode.users if _is(u, _DEQUANTIZE)]
        if not dq:
            continue
        out[lid] = Point(node=_layer_id((base or qnode).args[0]), q=qnode.name, dq=tuple(u.name for u in dq),
                         qparams=tuple(dq[0].args[1:6]))
    return out


class Stats:
    """Running SQNR / cosine / max |error| of ``x`` against ``ref``, and the
    largest integer-step difference when integers are given; per-image sums
    in float32 (BLAS), accumulated over images in float64."""

    def __init__(self):
        self.ref2 = self.x2 = self.err2 = self.dot = 0.0
        self.max_abs = 0.0
        self.max_lsb: int | None = None
        self.n = 0

    def add(self, ref, x, ref_int=None, x_int=None) -> None:
        r = torch.as_tensor(ref, dtype=torch.float32).reshape(-1)
        a = torch.as_tensor(x, dtype=torch.float32).reshape(-1)
        if r.shape != a.shape:
            raise ValueError(f"sizes differ: {tuple(np.shape(ref))} vs {tuple(np.shape(x))}")
        e = r - a
        self.ref2 += float(torch.dot(r, r))
        self.x2 += float(torch.dot(a, a))
        self.err2 += float(torch.dot(e, e))
        self.dot += float(torch.dot(r, a))
        self.max_abs = max(self.max_abs, float(e.abs().max()) if e.numel() else 0.0)
        if ref_int is not None:
            d = np.abs(np.asarray(ref_int, np.int32).ravel() - np.asarray(x_int, np.int32).ravel())
            self.max_lsb = max(self.max_lsb or 0, int(d.max(initial=0)))
        self.n += 1

    def sqnr_db(self) -> float | None:
        """``10 log10(sum x^2 / sum (x - ref)^2)``: torchao's ``compute_sqnr(x, ref)``
        (what the debugger's ``QuantizationComparisonResult.sqnr`` reports for one
        image: the compared value's power over the error's) on all images
        together. None when ``x`` equals ``ref`` exactly."""
        if self.err2 == 0.0:
            return None
        return 10.0 * math.log10(max(self.x2, 1e-300) / self.err2)

    def result(self) -> dict:
        sqnr = self.sqnr_db()
        den = math.sqrt(self.ref2 * self.x2)
        cos = self.dot / den if den > 0 else (1.0 if self.ref2 == self.x2 else 0.0)
        out = {"sqnr_db": None if sqnr is None else round(sqnr, 3), "cosine": round(min(cos, 1.0), 6),
               "max_abs": float(f"{self.max_abs:.6g}")}
        if self.max_lsb is not None:
            out["max_lsb"] = self.max_lsb
        return out


def _not_comparable(ref, x) -> str | None:
    """Why the debugger's float value ``ref`` cannot be compared with the Q/DQ tensor ``x``
    (a tuple of tensors, another element count), else None."""
    if not isinstance(ref, torch.Tensor):
        return f"the float node returns {type(ref).__name__} of {len(ref)} tensors" \
            if isinstance(ref, (tuple, list)) else f"the float node returns {type(ref).__name__}"
    if ref.numel() != torch.as_tensor(x).numel():
        return f"float {list(ref.shape)} vs Q/DQ {list(torch.as_tensor(x).shape)}"
    return None


def float_reference(ep) -> torch.fx.GraphModule:
    """A copy of ``ep.module()`` with conv-BN (and linear-BN) folded by the
    functions ``prepare_pt2e`` uses, so each float node computes what the Q/DQ
    node of the same name computes before quantization. Deep-copied (node
    metadata included), so it shares no tensor with ``ep``."""
    import copy

    from torchao.quantization.pt2e.utils import _fuse_conv_bn_, _fuse_linear_bn_
    m = copy.deepcopy(ep.module())
    _fuse_conv_bn_(m)
    _fuse_linear_bn_(m)
    torchenv.release_torchao_modules()
    m.recompile()
    return m


def out_of_place(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Replace in-place aten ops (``hardtanh_`` of ``ReLU6(inplace=True)``...)
    by their out-of-place twins, in place; node names and metadata stay.

    The debugger's loggers keep the tensor a node returned, not a copy, so an
    in-place op after a logged node would overwrite the logged value."""
    from ..quant.graph import out_of_place as twin
    for n in gm.graph.nodes:
        if n.op == "call_function":
            n.target = twin(n.target)
    gm.recompile()
    return gm


def _loggers(model) -> dict:
    from torchao.quantization.pt2e._numeric_debugger import OutputLogger
    return {m.node_name: m for _, m in model.named_children() if isinstance(m, OutputLogger)}


def dequantize(c_out: np.ndarray, point: Point) -> tuple[np.ndarray, np.ndarray]:
    """(float value, integer) of a C output tensor at ``point``.

    An integer tensor is dequantized as torch's ``dequantize_per_tensor``
    computes it, ``(float32(q) - zero_point) * float32(scale)``; a float
    tensor (a fused kernel already dequantized it) is kept, and its integer
    recovered as ``rint(x / scale) + zero_point`` (exact: x is (q - zp) * scale
    rounded to float32)."""
    scale, zp = point.scale, point.zero_point
    if c_out.dtype.kind == "f":
        return c_out, np.rint(c_out.astype(np.float64) / scale).astype(np.int32) + zp
    return (c_out.astype(np.float32) - np.float32(zp)) * np.float32(scale), c_out


# Ops of a TVM function after which its output is no longer one layer's tensor:
# they mix several tensors, reorder or select elements (ShuffleNetV2's concat +
# channel shuffle + split). Element-wise ops, casts, (de)quantize, a reshape that
# keeps the element order (a mean's [1, C, 1, 1] -> [1, C]) and the strided slice
# that drops an FC's padding leave it the layer's value.
_MIXING = re.compile(r"(?:^|_)(concatenate|split|transpose|stack|take|gather|layout_transform|tile|repeat|flip)"
                     r"\d*(?=_|$)")


def _not_layer_output(call: dict | None, relax_layers: dict) -> str | None:
    """Why the output of ``call`` (a layer's last kernel call in ``manifest.json``,
    None: the layer has none) is not that layer's output tensor, else None.

    A call whose output binding is named in ``relax/layers.json`` is that
    binding's tensor. An unnamed TVM call's ops are read from its PrimFunc
    name, which TVM's FuseOps makes ``fused_`` + the names of the primitive
    functions it fused, in order, each with its dedup digits (``fused_tir_clip1_
    dequantize_concatenate_quantize1_reshape_transpose_reshape1_dequantize2_split``):
    one of :data:`_MIXING` there means the layer's own result (the clip after
    its MMALIB conv, say) exists only inside that function, and the function
    returns something else (a split half of the shuffled concat)."""
    if call is None:
        return "no kernel call of this build is tied to the layer (manifest.json calls)"
    if any(relax_layers.get(v, {}).get("id") for v in call["vars"]) or call["backend"] != "tvm":
        return None
    ops = list(dict.fromkeys(m.group(1) for m in _MIXING.finditer(call["func"])))
    outs = call.get("outputs") or [call["output"]]
    if not ops and len(outs) == 1:
        return None
    what = f"fused with {', '.join(ops)}" if ops else f"a call writing {len(outs)} tensors"
    return (f"{what} in one TVM function ({call['func']}, call {call['index']}); its output is not this "
            f"layer's tensor")


# The main op of a layer kind as TVM's scalar path names it in a PrimFunc.
_MAIN_OP = {"conv2d": "conv2d", "depthwise_conv2d": "conv2d", "fc": "matmul"}


def _named(call: dict, relax_layers: dict) -> bool:
    """``call`` is a kernel (not TVM) whose output binding is named in ``relax/layers.json``:
    the layer's tensor, before a TVM function that moves it (a channel shuffle)."""
    return call["backend"] != "tvm" and any(relax_layers.get(v, {}).get("id") for v in call["vars"])


def _whole_layer(call: dict, op: str) -> bool:
    """``call`` is one TVM function computing a layer of kind ``op`` from its
    input to its output quantize (TVM's scalar path: ``fused_conv2d2_cast1_
    multiply1_add1_relu1_quantize6``): its name holds the main op, ends in the
    quantize, and it mixes no tensors and writes one."""
    main, f = _MAIN_OP.get(op), call["func"]
    return (call["backend"] == "tvm" and main is not None and len(call.get("outputs") or [call["output"]]) == 1
            and not _MIXING.search(f) and bool(re.search(rf"(?:^|_){main}\d*_", f))
            and bool(re.search(r"_quantize\d*$", f)))


def layer_calls(manifest: dict, relax_layers: dict) -> tuple[dict[str, dict], dict[str, str]]:
    """(layer id -> the kernel call whose output is the layer's tensor, layer id
    -> why no call's is) for the layers of ``manifest``.

    The layer's last call (``calls``, tied to layers by :mod:`pipeline.backend.
    call_graph`), unless :func:`_not_layer_output` says its output is something
    else; then an earlier call of the layer that computes the whole layer
    (:func:`_whole_layer`: the scalar build's conv whose clip TVM did not fuse
    into the next concat; :func:`_named`: a kernel whose output is the layer's
    binding, before TVM's channel shuffle) if there is one. An MMALIB kernel's output before its
    fused clip is not the layer's tensor (negative values a ReLU clips), so
    there the layer is not comparable."""
    by_layer: dict[str, list[dict]] = {}
    for c in manifest["calls"]:
        if c["layer"] is not None:
            by_layer.setdefault(c["layer"], []).append(c)
    chosen, why = {}, {}
    for lay in manifest["layers"]:
        lid, calls = lay["id"], by_layer.get(lay["id"], [])
        reason = _not_layer_output(calls[-1] if calls else None, relax_layers)
        pick = calls[-1] if reason is None else next((c for c in reversed(calls[:-1])
                                                       if _whole_layer(c, lay["op"]) or _named(c, relax_layers)),
                                                      None)
        if pick is not None:
            chosen[lid] = pick
        else:
            why[lid] = reason
    return chosen, why


def _named_points(last: dict[str, dict], relax_layers: dict) -> dict[str, str]:
    """Layer id -> float node id the last call's output binding was named after
    (``relax/layers.json``), where it has a name there."""
    out = {}
    for lid, c in last.items():
        ids = {relax_layers[v]["id"] for v in c["vars"] if relax_layers.get(v, {}).get("id")}
        if len(ids) == 1:
            out[lid] = ids.pop()
    return out


def keep_loggers(model: torch.fx.GraphModule, names: set[str]) -> torch.fx.GraphModule:
    """Remove the debugger's loggers except those whose source node is in
    ``names`` (in place): only the compared points are kept, which keeps the
    logged tensors of one image small and the runs fast."""
    from torchao.quantization.pt2e._numeric_debugger import OutputLogger
    for n in list(model.graph.nodes):
        if n.op != "call_module":
            continue
        mod = getattr(model, n.target, None)
        if isinstance(mod, OutputLogger) and mod.debug_info.name not in names:
            n.replace_all_uses_with(n.args[0])
            model.graph.erase_node(n)
            delattr(model, n.target)
    model.recompile()
    return model


def _same_layout(c_out: np.ndarray, shape: tuple) -> bool:
    """A C tensor holds the Q/DQ tensor's elements in the same order (equal
    shapes, or equal up to size-1 axes, e.g. a mean's [1, C] vs [1, C, 1, 1])."""
    squeeze = lambda s: tuple(d for d in s if d != 1)  # noqa: E731
    return tuple(c_out.shape) == tuple(shape) or (c_out.size == int(np.prod(shape))
                                                 and squeeze(c_out.shape) == squeeze(shape))


@dataclass
class _Models:
    """The float and Q/DQ models with numeric-debugger loggers where layers are compared."""

    ref: torch.fx.GraphModule
    qdq: torch.fx.GraphModule
    qdq_loggers: dict
    points: dict[str, Point]

    def clear(self) -> None:
        """Forget the logged values of the last image."""
        for lg in list(_loggers(self.ref).values()) + list(self.qdq_loggers.values()):
            lg.stats.clear()


def _equalization(calibration_info: Path | None) -> list[dict]:
    """The equalized groups recorded in ``calibration.json`` (none without the file or the option)."""
    if calibration_info is None or not Path(calibration_info).exists():
        return []
    eq = json.loads(Path(calibration_info).read_text()).get("equalization") or {}
    return eq.get("groups", [])


def replay_equalization(ref: torch.fx.GraphModule, groups: list[dict]) -> None:
    """Apply the recorded channel scales of ``groups`` (calibration.json) to the float
    reference ``ref`` in place. Raises RuntimeError when a recorded group is not in ``ref``."""
    from ..quant.equalize import apply_scales, find_groups
    found = {(g.producers, g.consumers): g for g in find_groups(ref)}
    for rec in groups:
        g = found.get((tuple(rec["producers"]), tuple(rec["consumers"])))
        if g is None:
            raise RuntimeError(f"equalized group {rec['producers']} -> {rec['consumers']} of calibration.json "
                               f"is not in the float program; re-run calibrate")
        apply_scales(ref, g, torch.tensor(rec["scales"], dtype=torch.float64))


def _debug_models(spec: ModelSpec, float_pt2: Path, calibrated_state: Path, int16_selection: Path | None,
                  layers: list[dict], named: dict[str, str], equalized: list[dict] = ()) -> _Models:
    """Float and Q/DQ models from ONE in-memory program (the debugger matches nodes by
    ``from_node``), instrumented only at the layers' output points. ``equalized``: the
    groups whose channel scales the float reference replays (:func:`replay_equalization`)."""
    from torchao.quantization.pt2e._numeric_debugger import prepare_for_propagation_comparison

    ep = load_program(float_pt2)
    q = load_converted(spec, ep, calibrated_state, read_int16_selection(int16_selection))
    requantize = {lay["id"]: lay["out_dtype"] for lay in layers if lay["op"] == "requantize"}
    points = output_points(q, [lay["id"] for lay in layers], named, requantize)
    keep = {p.node for p in points.values()}
    ref = float_reference(ep)
    replay_equalization(ref, list(equalized))
    ref_model = keep_loggers(prepare_for_propagation_comparison(out_of_place(ref)), keep)
    qdq_model = prepare_for_propagation_comparison(out_of_place(q))
    # a requantize's Q/DQ nodes log under their own debug name (no float node of their own)
    read = {p.q for p in points.values()} | {d for p in points.values() for d in p.dq}
    keep_qdq = keep | {lg.debug_info.name for name, lg in _loggers(qdq_model).items() if name in read}
    qdq_model = keep_loggers(qdq_model, keep_qdq)
    return _Models(ref_model, qdq_model, _loggers(qdq_model), points)


@dataclass
class _Tally:
    """What the images add up to: Q/DQ vs float per layer, C vs Q/DQ per build and layer, notes."""

    qdq: dict[str, Stats]
    c: dict[str, dict[str, Stats]]
    notes: dict[str, list[str]] = field(default_factory=dict)
    unmatched: set[str] = field(default_factory=set)  # float and Q/DQ values not comparable

    def note(self, lid: str, text: str) -> None:
        if text not in self.notes.setdefault(lid, []):  # once, not once per image
            self.notes[lid].append(text)


def _qdq_vs_float(models: _Models, tally: _Tally) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Add one image's Q/DQ-vs-float values to ``tally``; returns layer id -> (Q/DQ value,
    its integers) for the C comparison."""
    from torchao.quantization.pt2e._numeric_debugger import compare_results, extract_results_from_loggers

    compared = {info.name: s for info, s in compare_results(extract_results_from_loggers(models.ref),
                                                            extract_results_from_loggers(models.qdq)).items()}
    qdq_at = {}
    for lid, p in models.points.items():
        s = compared.get(p.node)
        if s is None:
            continue
        res = s.results[0]
        # the debugger keys a float node's value to the last Q/DQ node of the same
        # source, which is the output quantize's dequantize; read that one if not
        qdq = res.actual if s.actual_node_name in p.dq else models.qdq_loggers[p.dq[0]].stats[0]
        skip = _not_comparable(res.ref, qdq)
        if skip:  # e.g. a split's tuple of tensors in YOLO26's head: one line, not a crash
            if lid not in tally.unmatched:
                tally.unmatched.add(lid)
                tally.notes.setdefault(lid, []).append(f"Q/DQ vs float not compared: {skip}")
            continue
        tally.qdq[lid].add(res.ref, qdq)
        qdq_at[lid] = (qdq.numpy(), models.qdq_loggers[p.q].stats[0].numpy())
    return qdq_at


def _c_vs_qdq(variant: str, captured: dict[str, np.ndarray], qdq_at: dict, points: dict[str, Point],
              tally: _Tally) -> None:
    """Add one image's C-vs-Q/DQ values of build ``variant`` to ``tally``."""
    for lid, c_out in captured.items():
        if lid not in qdq_at or lid in tally.unmatched:
            continue
        value, ints = qdq_at[lid]
        if not _same_layout(c_out, value.shape):
            tally.note(lid, f"{variant}: not compared, C shape {list(c_out.shape)} vs Q/DQ {list(value.shape)}")
            continue
        c_value, c_ints = dequantize(c_out, points[lid])
        tally.c[variant][lid].add(value, c_value, ints, c_ints)


def _layer_entry(lay: dict, p: Point | None, variants: list[str], last: dict, tally: _Tally) -> dict:
    """One layer of ``layers.json``."""
    lid = lay["id"]
    entry = {"id": lid, "module": lay.get("module"), "op": lay["op"], "backend": lay["backend"],
             "qdq_vs_float": None, "c_vs_qdq": None}
    if p is not None:
        entry["compared_at"] = {"float_node": p.node, "qdq_node": p.dq[0], "scale": p.scale,
                                "zero_point": p.zero_point,
                                "c_call": last[variants[0]].get(lid, {}).get("index")}
        if tally.qdq[lid].n:
            entry["qdq_vs_float"] = tally.qdq[lid].result()
        for v in variants:
            st = tally.c[v].get(lid)
            entry["c_vs_qdq" if v == variants[0] else f"c_vs_qdq_{v}"] = st.result() if st and st.n else None
    if lid in tally.notes:
        entry["notes"] = tally.notes[lid]
    return entry


def layers_model(spec: ModelSpec, float_pt2: Path, calibrated_state: Path, relax_layers: Path,
                 builds: dict[str, Path], images_dir: Path, out: Path,
                 int16_selection: Path | None = None, calibration_info: Path | None = None) -> dict:
    """Per-layer numerics on the evaluation images; write ``layers.json``.
    ``int16_selection``: ``int16_layers.json`` of a mixed-precision model.
    ``calibration_info``: the calibrate stage's ``calibration.json``; when it records
    a channel equalization, the float reference replays it (the same function, in the
    equalized channel units the Q/DQ model has).

    ``builds``: variant -> codegen folder, the deployed build first (its
    manifest gives the layers; another build adds ``c_vs_qdq_<variant>``).
    Raises :class:`CalibrationDataError` when the evaluation folder holds no
    images."""
    from ..backend.interp import Program

    paths = list_images(images_dir, strict=True)
    if not paths:
        raise CalibrationDataError(f"model {spec.name!r}: evaluation folder {images_dir} holds no images "
                                   f"for the per-layer numerics; add images or set [evaluation] set in "
                                   f"{spec.source}")
    variants = list(builds)
    manifests = {v: json.loads((Path(d) / "manifest.json").read_text()) for v, d in builds.items()}
    layers = manifests[variants[0]]["layers"]
    relax_names = json.loads(Path(relax_layers).read_text())
    # per variant: layer id -> the call compared, and layer id -> why none is (never a wrong number)
    last, fused = {}, {}
    for v in variants:
        last[v], fused[v] = layer_calls(manifests[v], relax_names)
    models = _debug_models(spec, float_pt2, calibrated_state, int16_selection, layers,
                           _named_points(last[variants[0]], relax_names), _equalization(calibration_info))
    points = models.points
    programs = {v: Program(d) for v, d in builds.items()}
    wanted = {v: {last[v][lid]["index"]: lid for lid in points if lid in last[v]} for v in variants}
    tally = _Tally(qdq={lid: Stats() for lid in points},
                   c={v: {lid: Stats() for lid in wanted[v].values()} for v in variants})
    for v in variants:
        for lid, why in fused[v].items():
            if lid in points:
                tally.notes.setdefault(lid, []).append(f"{v}: not comparable: {why}")

    x = load_images(paths, spec.preprocess, desc=f"layers {spec.name}", model=spec.name)
    threads = torch.get_num_threads()
    for i in range(len(x)):
        image = x[i:i + 1]
        with torch.no_grad():  # the PyTorch models with the stages' threads, as verify and evaluate run them
            models.ref(image)
            models.qdq(image)
        # the rest is exact or Python-bound: 2 torch threads per task only fight under doit -n 2
        torch.set_num_threads(1)
        try:
            qdq_at = _qdq_vs_float(models, tally)
            for v, prog in programs.items():
                _c_vs_qdq(v, _capture(prog, image.numpy(), manifests[v]["calls"], wanted[v]), qdq_at, points, tally)
            models.clear()
        finally:
            torch.set_num_threads(threads)

    report = {"model": spec.name, "dtype": spec.dtype, "images": len(x),
              "evaluation_set": spec.evaluation_set, "build": variants[0], "builds": variants,
              "measures": MEASURES,
              "layers": [_layer_entry(lay, points.get(lay["id"]), variants, last, tally) for lay in layers]}
    report["layers"] = sort_worst_first(report["layers"])
    report["worst"] = [lay["id"] for lay in report["layers"][:3]]
    write_json(out, report)
    return report


def _sqnr_key(entry: dict) -> float:
    a = entry.get("qdq_vs_float")
    if a is None:
        return math.inf  # not measured: last
    return math.inf if a["sqnr_db"] is None else a["sqnr_db"]


def sort_worst_first(entries: list[dict]) -> list[dict]:
    """Lowest Q/DQ-vs-float SQNR first (identical or unmeasured last); ties keep
    the manifest's (flow) order."""
    return sorted(entries, key=_sqnr_key)


def _capture(prog, image: np.ndarray, calls: list[dict], wanted: dict[int, str]) -> dict[str, np.ndarray]:
    """Run the Python reference on one image; the outputs of the ``wanted``
    calls (index -> layer id). Checks that the program's calls are the
    manifest's, in order."""
    from ..backend.tile_names import reference_name

    got, seen = {}, []

    def observe(index, func, output):
        seen.append(func)
        if index < len(calls) and reference_name(calls[index]["func"]) != func:  # a tiled call: the untiled
            raise RuntimeError(f"lowered.py call {index} is {func}, the manifest says {calls[index]['func']}")
        if index in wanted:
            got[wanted[index]] = np.array(output)

    prog.run(image, observer=observe)
    if len(seen) != len(calls):
        raise RuntimeError(f"lowered.py makes {len(seen)} kernel calls, the manifest lists {len(calls)}")
    return got
