"""The ``summary`` task: print every model's numbers at the end of a run.

Reads the per-model JSON artifacts (report, manifest, verify), prints one
block per model and writes them together as ``artifacts/summary.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..fsutil import write_json


def _load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def model_lines(name: str, report: dict, verify: dict | None, manifests: dict[str, dict]) -> list[str]:
    """Human-readable lines for one model."""
    n = report["labeled"]
    lines = [f"{name} ({report['dtype']} activations, {report['weight_dtype']} weights):",
             f"  top-1 on {n} labeled images ({report['evaluation_set']}): float {report['float_top1']}/{n}, "
             f"quantized {report['quant_top1']}/{n}; float/quantized top-1 agreement "
             f"{report['top1_agreement']}/{report['images']}; mean |logit error| "
             f"{report['mean_abs_logit_error']:.4f}"]
    if report.get("note"):
        lines.append(f"  note: {report['note']}")
    for variant, m in manifests.items():
        s = m["summary"]
        lines.append(
            f"  codegen [{variant}]: {s['layers_offloaded']}/{s['layers']} layers and "
            f"{100 * s['macs_offloaded'] / max(s['macs_total'], 1):.1f}% of {s['macs_total'] / 1e6:.1f}M MACs "
            f"on MMALIB/C7x kernels; activation arena {s['arena_bytes']:,} B, workspace "
            f"{s['workspace_bytes']:,} B, weights {s['weights_bytes']:,} B")
    if verify:
        for line in verify.get("summary_lines", []):
            lines.append(f"  verify: {line}")
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
    print("\n".join(["", "== doit-c7x summary =="] + printed + [f"(details: {art}/<model>/*.json)"]))
    write_json(art / "summary.json", {"models": out, "skipped": payload["skipped"]})
    return out
