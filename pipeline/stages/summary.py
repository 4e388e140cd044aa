"""The ``summary`` task: print every model's numbers at the end of a run.

Reads the per-model JSON artifacts (``report.json``, ``c/<variant>/manifest.json``,
``verify.json``, ``layers.json``), prints one block per model and writes them
together as ``artifacts/summary.json``. A missing file leaves out its lines.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

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


def worst_layers(layers: dict, n: int = 3) -> list[dict]:
    """The ``n`` layers of ``layers.json`` with the lowest Q/DQ-vs-float SQNR
    (the file lists them worst first): ``{"id", "module", "sqnr_db"}``."""
    out = []
    for lay in layers.get("layers", [])[:n]:
        a = lay.get("qdq_vs_float") or {}
        out.append({"id": lay["id"], "module": lay.get("module") or lay["id"], "sqnr_db": a.get("sqnr_db")})
    return out


def _worst_line(layers: dict) -> str:
    def db(v):
        return "identical" if v is None else f"{v:.1f} dB"
    shown = ", ".join(f"{w['module']} ({db(w['sqnr_db'])})" for w in worst_layers(layers))
    return (f"  worst layers   {shown} (PyTorch Q/DQ vs float SQNR at the layer output, "
            f"{layers['images']} images; layers.json)")


def model_lines(name: str, report: dict, verify: dict | None, manifests: dict[str, dict],
                layers: dict | None = None) -> list[str]:
    """Human-readable block for one model (see the README for how to read it)."""
    n = report["labeled"]
    lines = [f"{name}: {report['dtype']} activations, {report['weight_dtype']} weights; "
             f"{n} labeled images ({report['evaluation_set']})"]
    for note in report.get("notes", []):
        lines.append(f"  note           {note}")
    builds = {r["variant"]: r for r in (verify or {}).get("variants", [])}
    acc = [f"float {report['float_top1']}/{n}", f"PyTorch Q/DQ {report['quant_top1']}/{n}"]
    acc += [f"C {v} {r['accuracy']['top1']}/{n}" for v, r in builds.items()]
    lines.append("  top-1          " + " | ".join(acc))
    err = [f"Q/DQ {report['top1_agreement']}/{report['images']}, {report['mean_abs_logit_error']:.3f}"]
    err += [f"C {v} {r['accuracy']['top1_agreement_with_float']}/{r['images']}, "
            f"{r['accuracy']['mean_abs_logit_error_vs_float']:.3f}" for v, r in builds.items()]
    lines.append("  vs float       (top-1 agreement, mean |logit error|) " + " | ".join(err))
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
        lines.append(f"  bit-exact      host C == Python integer reference on every image: {exact}")
        noise = verify["pytorch_qdq"]["self_noise_1_thread_no_mkldnn"]
        diffs = [f"{v} max {r['vs_pytorch_qdq']['max_lsb']:g}, mean {r['vs_pytorch_qdq']['mean_lsb']:.2f}"
                 for v, r in builds.items()]
        unit = f"{report['dtype']} LSB" if verify.get("output_lsb") else "output units"
        lines.append(f"  vs Q/DQ ({unit}) " + " | ".join(diffs)
                     + f" | PyTorch vs itself max {noise['max_lsb']:g}, mean {noise['mean_lsb']:.2f}")
    if layers and layers.get("layers"):
        lines.append(_worst_line(layers))
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
                     "layers": _load(d / "layers.json")}
    return out


def render(payload: dict, failed: dict[str, str] | None = None) -> str:
    """The text block printed at the end of a run.

    ``failed``: model -> "<stage>: <error>" for models whose task failed in
    this run (their possibly stale numbers are not shown)."""
    failed = failed or {}
    art = Path(payload["artifacts"])
    lines = ["", "== doit-c7x summary =="]
    for name, d in collect(payload).items():
        if name in failed:
            lines.append(f"{name}: FAILED at {failed[name]}")
        elif d["report"] is None:
            lines.append(f"{name}: not built yet")
        else:
            lines += model_lines(name, d["report"], d["verify"], d["manifests"], d["layers"])
            lines.append(f"  page           {art / name / 'offload.html'} (offload graph, per-layer "
                         f"profile and numerics: open it in a browser)")
            lines.append(f"  files          {art / name}/ (C: c/<build>/, numbers: report.json, verify.json, "
                         f"layers.json, c/<build>/manifest.json)")
    lines += [f"{name}: FAILED ({why})" for name, why in payload.get("invalid", {}).items()]
    lines += [f"{name}: skipped ({why})" for name, why in payload["skipped"].items()]
    return "\n".join(lines)


def summarize(payload: dict) -> dict:
    """The summary task: write ``artifacts/summary.json`` (the reporter prints)."""
    data = collect(payload)
    out = {name: {"report": d["report"], "verify": d["verify"],
                  "codegen": {k: v["summary"] for k, v in d["manifests"].items()},
                  "worst_layers": worst_layers(d["layers"]) if d["layers"] else None}
           for name, d in data.items()}
    write_json(Path(payload["artifacts"]) / "summary.json", {"models": out, "skipped": payload["skipped"]})
    return out
