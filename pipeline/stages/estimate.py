"""Stage ``estimate``: how fast each build would run on the C7x target.

For every build variant, the static performance model (:mod:`pipeline.perf`)
estimates the cycles of every kernel call of ``manifest.json`` from the
call's work and its bytes per memory level (codegen's memory plan), for the
model entry's ``[target]``; calls are summed per layer (PyTorch module path),
and the total gives ms and FPS at the target clock, for one C7x core. With a
board log (``[profile] board_log``, or ``board_profile.txt``), the first build's
measured cycles are set beside the estimate, per call and layer, with the
ratio and the model's overall error.

``estimate.json``: ``label`` (an estimate, not a measurement), ``rests_on``
(what it assumes), ``target`` (figures with their status), ``constants`` (the
fitted ones), ``variants`` {variant: :func:`pipeline.perf.report.estimate_build`
(+ ``board``)}, ``summary_lines``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from ..config import ModelSpec
from ..errors import StaleArtifactError
from ..fsutil import write_json
from ..perf.model import fitted
from ..perf.report import LABEL, as_flat, compare_board, estimate_build
from ..target import Target, spec_target


PLAN_WORDS = {
    "flat": "codegen's flat memory plan: every buffer (input, activations, weights, output) in DDR, read and "
            "written there by each kernel, no DMA staging into L2 SRAM",
    "staged": "codegen's staged memory plan (memory_map.json): activations in the L2 / MSMC / DDR arena codegen "
              "placed them in, weights copied into L2 by DMA during the previous call (overlapped), what does "
              "not fit read from DDR in place; a layer too large for L2 split over output channels into "
              "double-buffered tiles (docs/memory.md)",
}


def rests_on(target: Target, plan: str = "staged") -> list[str]:
    """What every estimate assumes, in words (shown with it); ``plan``: the memory plan
    of the builds ("staged" / "flat", ``[codegen] memory``)."""
    n_assumed = len([f for f in target.assumed if f not in target.overridden])
    return [
        PLAN_WORDS[plan],
        f"target figures of {target.source} ({n_assumed} assumed, {len(target.conflicting)} chosen among "
        f"conflicting sources, {len(target.overridden)} overridden by the entry; sources: docs/targets.md)",
        "3 constants fitted on one measured conv (scalar 45.2M, MMALIB 1.67M, MMALIB + L2 DMA 477K cycles) "
        "and nothing else (docs/estimate.md)",
        "one C7x core, batch 1, steady state (no cold caches, no first-call initialisation)",
    ]


def memory_figures(manifest: dict, target: Target, est: dict) -> dict:
    """The build's memory plan in figures: ``plan``, ``peak`` bytes per level, ``traffic``
    (bytes per inference per level and DMA, from the plan), ``ddr_traffic_bytes`` (DDR
    read or written in place + copied by DMA), ``flat_cycles`` (the same calls with every
    tensor in DDR, :func:`pipeline.perf.report.as_flat`) and ``gain`` (flat / this)."""
    mem = manifest["summary"].get("memory", {"plan": "flat", "peak": {}, "traffic": {}})
    flat = estimate_build(as_flat(manifest), target)["total_cycles"]
    t = mem["traffic"]
    return {"plan": mem["plan"], "peak": mem["peak"], "traffic": t,
            "ddr_traffic_bytes": t.get("ddr", 0) + t.get("dma", 0), "flat_cycles": flat,
            "gain": round(flat / est["total_cycles"], 3) if est["total_cycles"] else None}


def _line(spec: ModelSpec, target: Target, variants: dict) -> str:
    parts = []
    for v, b in variants.items():
        board = b.get("board")
        extra = f", board {board['measured_cycles'] / 1e6:.2f}M ({100 * board['error']:+.0f}%)" if board else ""
        parts.append(f"{v} {b['total_cycles'] / 1e6:.2f}M cycles = {b['ms']:.2f} ms ({b['fps']:.1f} FPS){extra}")
    return f"estimate {spec.name} on {target.name}: " + " | ".join(parts)


def estimate_model(spec: ModelSpec, manifests: dict[str, Path], board_log: Path | None, out: Path) -> dict:
    """Estimate every build; write ``estimate.json`` (module docstring).

    ``manifests``: {variant: its codegen ``manifest.json``}, the first being the
    build a board log belongs to. ``board_log``: that build's C7x log, or None.
    Raises ConfigError for a bad ``[target]`` (unknown name, missing or
    unknown figure), ProfileLogError for a missing or foreign board log."""
    target = spec_target(spec)
    variants = {}
    for variant, path in manifests.items():
        manifest = json.loads(Path(path).read_text())
        if not manifest["calls"] or "work" not in manifest["calls"][0]:
            raise StaleArtifactError(f"{path}: the manifest has no per-call work (written by an older "
                                     f"codegen); re-run codegen:{spec.name}")
        variants[variant] = estimate_build(manifest, target)
        variants[variant]["memory"] = memory_figures(manifest, target, variants[variant])
    if board_log is not None:
        from ..perf.measured import board_measurement

        first = next(iter(manifests))
        board = board_measurement(spec, Path(manifests[first]).parent, Path(board_log))
        variants[first]["board"] = compare_board(variants[first], board)
    report = {"model": spec.name, "label": LABEL, "rests_on": rests_on(target, spec.codegen.memory), "target": target.to_json(),
              "constants": dataclasses.asdict(fitted()), "variants": variants,
              "summary_lines": [_line(spec, target, variants)]}
    write_json(out, report)
    for line in report["summary_lines"]:
        print(line, file=sys.stderr)
    return report
