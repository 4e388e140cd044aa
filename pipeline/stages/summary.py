"""The ``summary`` task: print every model's numbers at the end of a run.

Reads the per-model JSON artifacts (``report.json``, ``c/<variant>/manifest.json``,
``verify.json``, ``layers.json``), prints one block per model and writes them
together as ``artifacts/summary.json``. A missing file leaves out its lines.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from ..config import PER_IMAGE_MIN_DETECTIONS
from ..fsutil import write_json


def _load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n:,} B"


def _offload_line(m: dict) -> str:
    s = m["summary"]
    on = ", ".join(f"{v['offloaded']} {op}" for op, v in sorted(s["by_op"].items()) if v["offloaded"])
    off = ", ".join(f"{v['layers'] - v['offloaded']} {op}" for op, v in sorted(s["by_op"].items())
                    if v["layers"] > v["offloaded"])
    return (f"{s['layers_offloaded']}/{s['layers']} layers, "
            f"{100 * s['macs_offloaded'] / max(s['macs_total'], 1):.1f}% of {s['macs_total'] / 1e6:.1f}M MACs "
            f"on MMALIB/C7x kernels ({on or 'none'}; scalar: {off or 'none'})")


def _calls_line(m: dict) -> str:
    """Kernel calls of one build's entry point, by backend, and what the scalar ones are."""
    s = m["summary"]
    calls = s.get("calls", {})
    kinds = sorted({re.sub(r"\d+", "", k).replace("fused_", "") for k in s.get("tvm_kernels", [])},
                   key=lambda k: (len(k), k))
    shown = ", ".join(kinds[:4]) + (f", ... ({len(kinds)} kinds, see manifest.json)" if len(kinds) > 4 else "")
    return (f"{calls.get('mmalib', 0)} MMALIB + {calls.get('c7x', 0)} C7x + {calls.get('tvm', 0)} TVM scalar "
            f"per inference (scalar: {shown or 'none'})")


def worst_layers(layers: dict, n: int = 5) -> list[dict]:
    """The ``n`` layers of ``layers.json`` with the lowest Q/DQ-vs-float SQNR
    (the file lists them worst first): ``{"id", "module", "sqnr_db"}``."""
    out = []
    for lay in layers.get("layers", [])[:n]:
        a = lay.get("qdq_vs_float") or {}
        out.append({"id": lay["id"], "module": lay.get("module") or lay["id"], "sqnr_db": a.get("sqnr_db"),
                    "op": lay.get("op")})
    return out


def _worst_line(layers: dict) -> str:
    def db(v):
        return "identical" if v is None else f"{v:.1f} dB"
    def name(w):  # a requantize boundary carries its producer's module path
        return f"{w['module']} requantize" if w.get("op") == "requantize" else w["module"]
    shown = ", ".join(f"{name(w)} ({db(w['sqnr_db'])})" for w in worst_layers(layers))
    return (f"  worst layers   {shown} (PyTorch Q/DQ vs float SQNR at the layer output, "
            f"{layers['images']} images; layers.json)")


def method_name(calibration: dict) -> str:
    """The steps after observing that ``calibration.json`` records, e.g. "exact requantize +
    AdaRound 200" ("" for none)."""
    rs = calibration.get("range_search")
    parts = [("output " if rs.get("criterion") == "output" else "") + "range search"] if rs else []
    snapped = calibration.get("exact_requantize")
    parts += ["exact requantize"] if snapped and snapped.get("layers") else []   # 0 layers: int16, a no-op
    ada = calibration.get("adaround")
    parts += [f"AdaRound {ada['iterations']}"] if ada else []
    parts += ["bias correction"] if calibration.get("bias_correction") else []
    return " + ".join(parts)


def _method_lines(calibration: dict) -> list[str]:
    """The five layers worst by Q/DQ-vs-float SQNR before and after the calibrate method
    (``calibration.json``, ``layer_sqnr``), each with its other value."""
    rec = calibration.get("layer_sqnr")
    method = method_name(calibration)
    if not rec or not rec["layers"] or not method:
        return []

    def worst(key: str, other: str) -> str:   # the five lowest by ``key``_db, with ``other``_db beside
        db = lambda v: math.inf if v is None else v
        rows = sorted(rec["layers"], key=lambda r: db(r[f"{key}_db"]))[:5]
        fmt = lambda v: "identical" if v is None else f"{v:.1f}"
        return ", ".join(f"{r['module']} {fmt(r[f'{key}_db'])} ({other} {fmt(r[f'{other}_db'])})" for r in rows)
    note = f"dB, Q/DQ vs float SQNR at the layer output, {rec['images']} calibration images; calibration.json"
    return [f"  method         {method} (steps after observing)",
            f"  worst before   {worst('before', 'after')} ({note})",
            f"  worst after    {worst('after', 'before')}"]


def _holdout_lines(h: dict) -> list[str]:
    """The k-fold held-out numbers (``holdout.json``): the headline accuracy."""
    n, k = h["labeled"], h["folds"]
    c = h["c"]
    top1 = (f"top-1 float {h['float_top1']}/{n} | PyTorch Q/DQ {h['qdq']['top1']}/{n} | C {c['variant']} "
            f"{c['top1']}/{n}" if n else "no image labeled with one of the model's classes")
    return [f"  held-out       {k}-fold on {h['evaluation_set']} (calibrate on {k - 1} of {k} parts, evaluate "
            f"on the part left out, rotate): {top1}",
            f"  vs float       (held-out top-1 agreement, mean |logit error|) Q/DQ "
            f"{h['qdq']['top1_agreement_with_float']}/{h['images']}, {h['qdq']['mean_abs_logit_error_vs_float']:.3f}"
            f"{_share(h['qdq'])} | C {c['variant']} {c['top1_agreement_with_float']}/{h['images']}, "
            f"{c['mean_abs_logit_error_vs_float']:.3f}{_share(c)}"]


def _share(scores: dict) -> str:
    """`` (12% of float's spread)``: a logit error relative to the float logits' standard deviation."""
    rel = scores.get("relative_logit_error_vs_float")
    return "" if rel is None else f" ({rel:.0%} of float's spread)"


def _embedding_lines(report: dict, builds: dict, holdout: dict | None) -> list[str]:
    """An embedding's fidelity: cosine of each image's vector to float's, held out first."""
    def cos(d: dict) -> str:
        return f"mean {d['cosine_mean']:.4f}, worst {d['cosine_min']:.4f}"
    lines = []
    if holdout and holdout.get("method") == "k-fold":
        c = holdout["c"]
        lines.append(f"  held-out       {holdout['folds']}-fold on {holdout['evaluation_set']}, cosine to float: "
                     f"Q/DQ {cos(holdout['qdq'])} | C {c['variant']} {cos(c)} ({c['worst_image']})")
    lead = "  in-sample      " if holdout and holdout.get("method") == "k-fold" else "  cosine         "
    lines.append(lead + "cosine to float: Q/DQ " + cos(report)
                 + "".join(f" | C {v} {cos(r['accuracy'])}" for v, r in builds.items()))
    return lines


def _accuracy_lines(report: dict, builds: dict, holdout: dict | None) -> list[str]:
    """Held-out numbers first; the deployed build's own numbers after them, as the
    secondary "in-sample" line when its evaluation images were calibration images."""
    n = report["labeled"]
    acc = [f"float {report['float_top1']}/{n}", f"PyTorch Q/DQ {report['quant_top1']}/{n}"]
    acc += [f"C {v} {r['accuracy']['top1']}/{n}" for v, r in builds.items()]
    err = [f"Q/DQ {report['top1_agreement']}/{report['images']}, {report['mean_abs_logit_error']:.3f}"
           + _share({"relative_logit_error_vs_float": report.get("relative_logit_error")})]
    err += [f"C {v} {r['accuracy']['top1_agreement_with_float']}/{r['images']}, "
            f"{r['accuracy']['mean_abs_logit_error_vs_float']:.3f}{_share(r['accuracy'])}" for v, r in builds.items()]
    top1 = "top-1 " + " | ".join(acc) + "; " if n else ""   # no label among the model's classes: none
    if holdout and holdout.get("method") == "k-fold":
        return _holdout_lines(holdout) + [
            "  in-sample      (deployed build, calibrated on these images: fidelity, not accuracy) "
            + top1 + "vs float " + " | ".join(err)]
    if holdout:  # method "separate": the deployed build's numbers are the held-out ones
        lead = "  held-out       (evaluation images not used for calibration) top-1 "
    else:  # holdout.json not written yet
        lead = "  top-1          "
    return [lead + " | ".join(acc), "  vs float       (top-1 agreement, mean |logit error|) " + " | ".join(err)]


def _matched(d: dict) -> str:
    """``12/20 (0.60) score >= 0.25, 95/100 top rows, mAP@0.5 0.81`` of a
    :func:`pipeline.data.detections.compare_all`."""
    parts = []
    for key, label in (("confident", "score >= 0.25"), ("top", "top rows")):
        c = d[key]
        frac = "" if c["matched_fraction"] is None else f" ({c['matched_fraction']:.2f})"
        parts.append(f"{c['matched']}/{c['reference_detections']}{frac} {label}")
    if d.get("map50") is not None:
        parts.append(f"mAP@0.5 {d['map50']:.2f}")
    return ", ".join(parts)


def per_image_line(rows: list[dict], kind: str, label: str) -> str | None:
    """``per image ...``: the mean and lowest matched fraction of ``kind`` over the images
    with float detections (held-out rows of :func:`pipeline.data.detections.per_image`),
    and how many fall below TI's 0.40 pass bar. None when no image has a float detection."""
    got = [(r[f"{kind}_fraction"], r["image"], r["float_detections"]) for r in rows
           if r.get(f"{kind}_fraction") is not None]
    if not got:
        return None
    low = min(got)
    many = [f for f, _, n in got if n >= PER_IMAGE_MIN_DETECTIONS]   # the images a target's per_image floor holds
    busy = f"; lowest with >= {PER_IMAGE_MIN_DETECTIONS} detections {min(many):.2f}" if many else ""
    return (f"  per image      {label} matched fraction: mean {sum(f for f, _, _ in got) / len(got):.2f} over "
            f"{len(got)} images with float detections, lowest {low[0]:.2f} ({low[1]}, {low[2]} detection"
            f"{'s' if low[2] != 1 else ''})"
            f"{busy}; {sum(f < 0.40 for f, _, _ in got)} below TI's 0.40 bar")


def _detection_lines(report: dict, builds: dict, holdout: dict | None) -> list[str]:
    """A detection model's accuracy: detections IoU-matched (>= 0.5) to float's, held out first."""
    lines = []
    if holdout and holdout.get("method") == "k-fold":
        k, c = holdout["folds"], holdout["c"]
        lines.append(f"  held-out       {k}-fold on {holdout['evaluation_set']}, detections matched to float "
                     f"(IoU >= 0.5): Q/DQ {_matched(holdout['qdq']['detections_vs_float'])} | C {c['variant']} "
                     f"{_matched(c['detections_vs_float'])}")
        line = per_image_line(holdout.get("per_image", []), "c", f"held-out C {c['variant']}")
        lines += [line] if line else []
        if "instances_vs_float" in c:   # a segmentation model: its instances after NMS, and their masks
            from ..data.fidelity import instances_text as describe
            lines.append(f"  held-out       instances after NMS matched to float, mask IoU of the matches: "
                         f"Q/DQ {describe(holdout['qdq']['instances_vs_float'])} | C {c['variant']} "
                         f"{describe(c['instances_vs_float'])}")
    lead = "  in-sample      " if lines else "  vs float       "
    acc = [f"Q/DQ {_matched(report['detections_qdq_vs_float'])}"]
    acc += [f"C {v} {_matched(r['accuracy']['detections_vs_float'])}" for v, r in builds.items()]
    lines.append(lead + "detections matched to float (IoU >= 0.5): " + " | ".join(acc))
    return lines


def mixed_summary(mixed: dict | None) -> dict | None:
    """The summary fields of ``mixed_precision.json`` (None without one)."""
    if not mixed or mixed.get("method") == "none":   # none: the recipe search chose all-int8
        return None
    return {k: mixed[k] for k in ("int16_layer_count", "layer_count", "int16_macs", "total_macs",
                                  "budget", "method")}


def _error(stats: dict) -> str:
    """``max 12 (0.976), mean 1.73 (0.141)``: a verify comparison in LSB (or output units)
    and, in brackets, in float output units (logits), when verify recorded them."""
    def one(kind: str, fmt: str) -> str:
        text = format(stats[f"{kind}_lsb"], fmt)
        return text + (f" ({stats[f'{kind}_abs']:.3g})" if f"{kind}_abs" in stats else "")
    return f"max {one('max', 'g')}, mean {one('mean', '.2f')}"


def _mixed_line(mixed: dict, manifests: dict, siblings: dict[str, dict]) -> str:
    """int16 share of a mixed-precision model and its memory against the int8/int16 builds
    of the same network (``siblings``: dtype -> MMALIB manifest summary)."""
    share = 100 * mixed["int16_macs"] / max(mixed["total_macs"], 1)
    how = (f"auto, budget {100 * mixed['budget']:.0f}%" if mixed.get("method") == "auto" else "int16_layers")
    line = (f"  mixed          {mixed['int16_layer_count']}/{mixed['layer_count']} layers int16, "
            f"{share:.1f}% of MACs ({how}; mixed_precision.json)")
    own = manifests.get("mmalib", {}).get("summary")
    if own:
        mem = [f"this {_mb(own['arena_bytes'])} arena, {_mb(own['weights_bytes'])} weights"]
        mem += [f"{dt} {_mb(s['arena_bytes'])}, {_mb(s['weights_bytes'])}" for dt, s in sorted(siblings.items())]
        line += "; memory " + " | ".join(mem)
    return line


#: the share by which the deployed build's estimated cycles may differ from what the search
#: costed its recipe at (fold 0's build, calibrated on part of the images) before the summary says so
RECIPE_CYCLES_TOLERANCE = 0.01


def recipe_check(search: dict, estimate: dict | None) -> list[str]:
    """A line when the deployed build's estimated cycles (``estimate.json``, mmalib) differ
    from those ``search.json`` costed the chosen recipe at by more than
    :data:`RECIPE_CYCLES_TOLERANCE`, with the likely cause: the search ranks int8 recipes on
    the premise that they run the same kernel calls, which a recipe can break (a layer its
    scales push off the kernels), and an int16 budget's layers are chosen again on all the
    calibration images. Nothing when they agree or either is missing."""
    chosen = search["chosen"]
    build = (estimate or {}).get("variants", {}).get("mmalib")
    if chosen.get("cycles") is None or not build:
        return []
    costed, got = chosen["cycles"], build["total_cycles"]
    if abs(got - costed) <= RECIPE_CYCLES_TOLERANCE * costed:
        return []
    why = ("the deployed build chose its int16 layers again, on every calibration image (mixed_precision.json)"
           if chosen.get("overrides", {}).get("quantizer", {}).get("mixed_precision") == "auto"
           else "the search took every int8 recipe to run the same kernel calls; see offload.html for layers "
                "off the kernels")
    return [f"  recipe check   the search costed {chosen['name']} at {costed / 1e6:.2f}M est. cycles (fold 0's "
            f"build); the deployed build estimates {got / 1e6:.2f}M ({(got - costed) / costed:+.1%}): {why}"]


def estimate_lines(estimate: dict) -> list[str]:
    """The model's estimated C7x latency per build, its five costliest layers with
    the reason, and the board log's error when there is one (``estimate.json``)."""
    t = estimate["target"]
    fig = t["figures"]
    builds = [f"{v} {b['ms']:,.2f} ms = {b['fps']:,.1f} FPS ({b['total_cycles'] / 1e6:,.2f}M cycles)"
              for v, b in estimate["variants"].items()]
    lines = [f"  C7x estimate   {t['name']}, one core at {fig['clock_hz'] / 1e9:g} GHz (an ESTIMATE from a "
             f"static model, not a measurement; estimate.json): " + " | ".join(builds)]
    first, b = next(iter(estimate["variants"].items()))
    bound = ", ".join(f"{k} {100 * v / max(b['total_cycles'], 1):.0f}%" for k, v in b["by_bound"].items() if v)
    lines.append(f"  {first} costliest  (of {b['total_cycles'] / 1e6:,.2f}M cycles: {bound}; MMA compute bound "
                 f"{b['compute_bound_cycles'] / 1e6:.2f}M; DDR {(b['ddr_bytes'] + b.get('dma_bytes', 0)) / 1e6:.1f} MB "
                 f"per inference)")
    for i, r in enumerate(b["top"], 1):
        lines.append(f"    {i}. {r['module'] or r['layer'] or 'no layer'} ({r['op'] or r.get('note', '(calls of no layer)').strip('()')}) "
                     f"{100 * r['share']:.1f}%: {r['reason']}")
    lines += memory_lines(b, fig)
    board = b.get("board")
    if board:
        lines.append(f"  vs board       measured {board['measured_cycles'] / 1e6:,.2f}M cycles, estimated "
                     f"{board['estimated_cycles'] / 1e6:,.2f}M: error {100 * board['error']:+.1f}% "
                     f"(median per-layer |log2 ratio| {board['median_abs_log2_ratio']})")
    return lines


def memory_lines(b: dict, figures: dict) -> list[str]:
    """The first build's memory plan: peak bytes per level against the target's sizes,
    DDR traffic per inference, and the estimate beside the flat plan's (estimate.json)."""
    m = b.get("memory")
    if not m:
        return []
    peak, t = m["peak"], m["traffic"]
    msmc = (f"MSMC {_mb(peak.get('msmc', 0))} of {_mb(figures['msmc_bytes'])}" if figures["msmc_bytes"]
            else "no MSMC")
    where = (f"peak L2 {_mb(peak.get('l2', 0))} of {_mb(figures['l2_sram_bytes'])}, {msmc}, "
             f"DDR {_mb(peak.get('ddr', 0))}")
    ddr = (f"DDR traffic {m['ddr_traffic_bytes'] / 1e6:.2f} MB per inference "
           f"({t.get('ddr', 0) / 1e6:.2f} MB read/written in place + {t.get('dma', 0) / 1e6:.2f} MB by DMA)")
    gain = (f"est. {b['total_cycles'] / 1e6:,.2f}M cycles vs {m['flat_cycles'] / 1e6:,.2f}M with the flat plan "
            f"({m['gain']:.2f}x)" if m["plan"] == "staged" else "")
    return [f"  memory plan    {m['plan']}: {where}; {ddr}" + (f"; {gain}" if gain else "")]


def estimate_table(data: dict, payload: dict) -> list[str]:
    """Every model's estimated latency side by side (first build: MMALIB when on)."""
    rows = []
    for name, d in data.items():
        e = d.get("estimate")
        if not e:
            continue
        v, b = next(iter(e["variants"].items()))
        kind = payload.get("kinds", {}).get(name, "")
        m = b.get("memory") or {}
        gain = f"{m['gain']:.2f}x" if m.get("plan") == "staged" and m.get("gain") else "-"
        ddr = f"{m['ddr_traffic_bytes'] / 1e6:.1f}" if m else "-"
        rows.append(f"  {name:<24} {kind:<6} {v:<7} {e['target']['name']:<7} {b['total_cycles'] / 1e6:>9,.2f} "
                    f"{b['ms']:>9,.2f} {b['fps']:>8,.1f} {m.get('plan', '-'):>7} {ddr:>7} {gain:>8}")
    if not rows:
        return []
    head = (f"  {'model':<24} {'kind':<6} {'build':<7} {'target':<7} {'Mcycles':>9} {'ms':>9} {'FPS':>8} "
            f"{'memory':>7} {'DDR MB':>7} {'vs flat':>8}")
    return ["", "== estimated C7x latency (one core, batch 1; an estimate, see estimate.json) ==", head] + rows


def model_lines(name: str, report: dict, verify: dict | None, manifests: dict[str, dict],
                layers: dict | None = None, holdout: dict | None = None, mixed: dict | None = None,
                siblings: dict[str, dict] | None = None, estimate: dict | None = None,
                calibration: dict | None = None, search: dict | None = None) -> list[str]:
    """Human-readable block for one model (docs/guide.md, "Reading the summary", says how to read it).

    ``holdout``: ``holdout.json``; ``mixed``: the summary of ``mixed_precision.json``
    (int16_layer_count, layer_count, int16_macs, total_macs, budget, method);
    ``siblings``: dtype -> MMALIB manifest summary of the same network's int8/int16 builds;
    ``estimate``: ``estimate.json``; ``calibration``: ``calibration.json``; ``search``:
    ``search.json`` of an entry with ``[quantizer] target`` (the recipe chosen and why)."""
    detecting = "detections_qdq_vs_float" in report
    embedding = "cosine_mean" in report
    images = (f"{report['images']} images, detection" if detecting
              else f"{report['images']} images, embedding" if embedding else f"{report['labeled']} labeled images")
    if mixed:  # weight_dtype is then the int16 layers' weights; int8 layers always have int8 ones
        what = ("int8 activations and weights (both int16 in the int16 layers)" if report["weight_dtype"] == "int16"
                else "int8 activations (int16 in the int16 layers), int8 weights")
    else:
        what = f"{report['dtype']} activations, {report['weight_dtype']} weights"
    lines = [f"{name}: {what}; {images} ({report['evaluation_set']})"]
    for note in report.get("notes", []):
        lines.append(f"  note           {note}")
    builds = {r["variant"]: r for r in (verify or {}).get("variants", [])}
    lines += (_detection_lines if detecting else _embedding_lines if embedding else _accuracy_lines)(
        report, builds, holdout)
    if search:   # after the held-out numbers, which lead every model's block
        lines.append(f"  recipe         {search['summary']} (search.json)")
        lines += recipe_check(search, estimate)
    if mixed:
        lines.append(_mixed_line(mixed, manifests, siblings or {}))
    if "mmalib" in manifests:
        lines.append("  offload        " + _offload_line(manifests["mmalib"]))
        lines.append("  kernel calls   " + _calls_line(manifests["mmalib"]))
    mem = [f"{v}: arena {_mb(m['summary']['arena_bytes'])}, workspace {_mb(m['summary']['workspace_bytes'])}, "
           f"weights {_mb(m['summary']['weights_bytes'])}" for v, m in manifests.items()]
    if report["dtype"] == "int16" and report["weight_dtype"] == "int8" and "mmalib" in manifests:
        mem[0] += " (int8 weights stored as int16 for the i16 kernels)"
    lines.append("  memory         " + " | ".join(mem))
    if builds:
        exact = ", ".join(f"{v} {r['vs_python_reference']['bit_exact_images']}/{r['images']}"
                          for v, r in builds.items())
        several = max(len(r.get("outputs", [])) for r in builds.values())
        every = f" (all {several} outputs)" if several > 1 else ""
        lines.append(f"  bit-exact      host C == Python integer reference on every image{every}: {exact}")
        if detecting:
            lines.append("  vs Q/DQ        detections matched (IoU >= 0.5): " + " | ".join(
                f"C {v} {_matched(r['vs_pytorch_qdq']['detections'])}" for v, r in builds.items()))
            builds = {}
    if builds:
        noise = verify["pytorch_qdq"]["self_noise_1_thread_no_mkldnn"]
        diffs = [f"{v} {_error(r['vs_pytorch_qdq'])}" for v, r in builds.items()]
        # a mixed model's output may be int16 (its classifier chosen int16): say "output LSB"
        unit = ((f"{report['dtype']} LSB" if not mixed else "output LSB") if verify.get("output_lsb")
                else "output units")
        lines.append(f"  vs Q/DQ        (in {unit}, and in logits) " + " | ".join(diffs)
                     + f" | PyTorch vs itself {_error(noise)}")
    if layers and layers.get("layers"):
        lines.append(_worst_line(layers))
    if calibration:
        lines += _method_lines(calibration)
    if estimate:
        lines += estimate_lines(estimate)
    return lines


def collect(payload: dict) -> dict:
    """Per-model JSON artifacts of ``payload['models']`` (None where missing)."""
    art = Path(payload["artifacts"])
    out = {}
    for name in payload["models"]:
        d = art / name
        manifests = {v: _load(d / "c" / v / "manifest.json") for v in payload["variants"][name]}
        out[name] = {"report": _load(d / "report.json"), "verify": _load(d / "verify.json"),
                     "manifests": {k: v for k, v in manifests.items() if v},
                     "layers": _load(d / "layers.json"), "holdout": _load(d / "holdout.json"),
                     "mixed": _load(d / "mixed_precision.json"), "estimate": _load(d / "estimate.json"),
                     "calibration": _load(d / "calibration.json"), "search": _load(d / "search.json")}
    return out


def siblings(payload: dict, data: dict, name: str) -> dict[str, dict]:
    """dtype -> MMALIB manifest summary of the plain int8/int16 builds of ``name``'s network
    (same ``payload['networks']`` key), for the mixed-precision memory comparison."""
    nets, kinds = payload.get("networks", {}), payload.get("kinds", {})
    out = {}
    for other, d in data.items():
        m = d["manifests"].get("mmalib")
        if other != name and m and nets.get(other) == nets.get(name) and kinds.get(other) in ("int8", "int16"):
            out.setdefault(kinds[other], m["summary"])
    return out


def render(payload: dict, failed: dict[str, str] | None = None,
           restored: list[str] | None = None) -> str:
    """The text block printed at the end of a run.

    ``failed``: model -> "<stage>: <error>" for models whose task failed in
    this run (their possibly stale numbers are not shown). ``restored``: tasks
    (``stage:model``) whose outputs came from the run-cache in this run."""
    failed = failed or {}
    art = Path(payload["artifacts"])
    lines = ["", "== doit-c7x summary =="]
    data = collect(payload)
    for name, d in data.items():
        if name in failed:
            lines.append(f"{name}: FAILED at {failed[name]}")
        elif d["report"] is None:
            lines.append(f"{name}: not built yet")
        else:
            lines += model_lines(name, d["report"], d["verify"], d["manifests"], d["layers"], d["holdout"],
                                 mixed_summary(d["mixed"]), siblings(payload, data, name), d["estimate"],
                                 d["calibration"], d["search"])
            lines.append(f"  page           {art / name / 'offload.html'} (offload graph, per-layer "
                         f"profile and numerics: open it in a browser)")
            lines.append(f"  files          {art / name}/ (C: c/<build>/, numbers: report.json, verify.json, "
                         f"layers.json, c/<build>/manifest.json)")
    lines += [f"{name}: FAILED ({why})" for name, why in payload.get("invalid", {}).items()]
    lines += [f"{name}: skipped ({why})" for name, why in payload["skipped"].items()]
    lines += estimate_table({n: d for n, d in data.items() if n not in failed}, payload)
    return "\n".join(lines + restored_lines(restored or []))


def restored_lines(tasks: list[str]) -> list[str]:
    """One line per model naming the stages the run-cache restored (in run order)."""
    by_model: dict[str, list[str]] = {}
    for task in tasks:
        stage, _, model = task.partition(":")
        by_model.setdefault(model, []).append(stage)
    return [f"run-cache: restored {len(stages)} stage{'s' if len(stages) > 1 else ''} of {model} "
            f"without running {'them' if len(stages) > 1 else 'it'} ({', '.join(stages)})"
            for model, stages in by_model.items()]


def _estimate_summary(e: dict | None) -> dict | None:
    """Per build: cycles, ms, FPS, the top layers and the board comparison (no per-call rows)."""
    if not e:
        return None
    keep = ("total_cycles", "ms", "fps", "compute_bound_cycles", "by_bound", "ddr_bytes", "top", "board")
    return {"target": e["target"]["name"], "label": e["label"],
            "variants": {v: {k: b[k] for k in keep if k in b} for v, b in e["variants"].items()}}


def summarize(payload: dict) -> dict:
    """The summary task: write ``artifacts/summary.json`` (a group's: ``<group>_summary.json``,
    ``payload["summary_file"]``); the reporter prints."""
    data = collect(payload)
    out = {name: {"report": d["report"], "verify": d["verify"],
                  "codegen": {k: v["summary"] for k, v in d["manifests"].items()},
                  "worst_layers": worst_layers(d["layers"]) if d["layers"] else None,
                  "calibration_method": method_name(d["calibration"]) if d["calibration"] else None,
                  "layer_sqnr": (d["calibration"] or {}).get("layer_sqnr"),
                  "holdout": d["holdout"], "mixed_precision": mixed_summary(d["mixed"]),
                  "search": ({k: d["search"][k] for k in ("target", "chosen", "notice", "summary")}
                             if d["search"] else None),
                  "estimate": _estimate_summary(d["estimate"])}
           for name, d in data.items()}
    write_json(Path(payload["artifacts"]) / payload.get("summary_file", "summary.json"),
               {"models": out, "skipped": payload["skipped"]})
    return out
