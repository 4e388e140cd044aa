"""The ``summary`` task: print every model's numbers at the end of a run.

Reads the per-model JSON artifacts (``report.json``, ``c/<variant>/manifest.json``,
``verify.json``), prints one block per model and writes them together as
``artifacts/summary.json``.
"""

from __future__ import annotations

import json
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


def model_lines(name: str, report: dict, verify: dict | None, manifests: dict[str, dict]) -> list[str]:
    """Human-readable block for one model (see the README for how to read it)."""
    n = report["labeled"]
    lines = [f"{name}: {report['dtype']} activations, {report['weight_dtype']} weights; "
             f"{n} labeled images ({report['evaluation_set']})"]
    if report.get("note"):
        lines.append(f"  note           {report['note']}")
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
    mem = [f"{v}: arena {_mb(m['summary']['arena_bytes'])}, workspace {_mb(m['summary']['workspace_bytes'])}, "
           f"weights {_mb(m['summary']['weights_bytes'])}" for v, m in manifests.items()]
    lines.append("  memory         " + " | ".join(mem))
    if builds:
        exact = ", ".join(f"{v} {r['vs_python_reference']['bit_exact_images']}/{r['images']}"
                          for v, r in builds.items())
        lines.append(f"  bit-exact      host C == Python integer reference on every image: {exact}")
        noise = verify["pytorch_qdq"]["self_noise_1_thread_no_mkldnn"]
        diffs = [f"{v} max {r['vs_pytorch_qdq']['max_lsb']:g}, mean {r['vs_pytorch_qdq']['mean_lsb']:.2f}"
                 for v, r in builds.items()]
        lines.append(f"  vs Q/DQ ({report['dtype']} LSB) " + " | ".join(diffs)
                     + f" | PyTorch vs itself max {noise['max_lsb']:g}, mean {noise['mean_lsb']:.2f}")
    return lines


def summarize(payload: dict) -> dict:
    """Print the summary of ``payload['models']`` and write ``summary.json``."""
    art = Path(payload["artifacts"])
    out, printed = {}, []
    for name in payload["models"]:
        d = art / name
        report = _load(d / "report.json")
        verify = _load(d / "verify.json")
        manifests = {v: _load(d / "c" / v / "manifest.json") for v in payload["variants"][name]}
        manifests = {k: v for k, v in manifests.items() if v}
        out[name] = {"report": report, "verify": verify,
                     "codegen": {k: v["summary"] for k, v in manifests.items()}}
        printed += model_lines(name, report, verify, manifests)
    for name, why in payload["skipped"].items():
        printed.append(f"{name}: skipped ({why})")
    print("\n".join(["", "== doit-c7x summary =="] + printed
                    + [f"(per-model details: {art}/<model>/report.json, verify.json, c/<build>/manifest.json)"]))
    write_json(art / "summary.json", {"models": out, "skipped": payload["skipped"]})
    return out
