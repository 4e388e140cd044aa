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
reference's cost per image is in docs/measuring.md, "Figures behind the code"). The PyTorch models run
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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..backend.layer_calls import capture_calls, layer_calls, named_points, same_layout
from ..config import ModelSpec, list_images
from ..data.images import load_images
from ..errors import CalibrationDataError
from ..fsutil import write_json
from ..quant.debugger import DebugModels, debug_models, not_comparable
from ..quant.output_points import Point, dequantize
from ..quant.sqnr import Stats
from ..quant.search import resolved


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

def _equalization(calibration_info: Path | None) -> list[dict]:
    """The equalized groups recorded in ``calibration.json`` (none without the file or the option)."""
    if calibration_info is None or not Path(calibration_info).exists():
        return []
    eq = json.loads(Path(calibration_info).read_text()).get("equalization") or {}
    return eq.get("groups", [])

def _qdq_vs_float(models: DebugModels, tally: _Tally) -> dict[str, tuple[np.ndarray, np.ndarray]]:
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
        skip = not_comparable(res.ref, qdq)
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
        if not same_layout(c_out, value.shape):
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
                 int16_selection: Path | None = None, calibration_info: Path | None = None,
                 recipe: Path | None = None) -> dict:
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
    spec = resolved(spec, recipe)   # [quantizer] target: the recipe the search chose

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
    models = debug_models(spec, float_pt2, calibrated_state, int16_selection, layers,
                           named_points(last[variants[0]], relax_names), _equalization(calibration_info))
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
                _c_vs_qdq(v, capture_calls(prog, image.numpy(), manifests[v]["calls"], wanted[v]), qdq_at, points, tally)
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
