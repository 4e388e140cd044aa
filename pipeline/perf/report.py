"""A whole build's estimate: every call, every layer, totals, the costliest layers.

:func:`estimate_build` applies :func:`pipeline.perf.model.estimate_call` to the
calls of one ``manifest.json`` and sums them per layer (PyTorch module path);
:func:`compare_board` sets a board log's cycles beside the estimate. Pure
Python over JSON data.
"""

from __future__ import annotations

import math

from .model import Constants, estimate_call, fitted
from ..target import Target

LABEL = "ESTIMATE of C7x cycles from a static performance model (not a measurement)"
TOP = 5


def _fmt_bytes(n: float) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 100_000 else f"{n / 1e3:.1f} KB" if n >= 1000 else f"{n:.0f} B"


def reason(call: dict, est: dict, target: Target, k: Constants) -> str:
    """Why a call costs what it does, in one phrase."""
    b = est["bytes"]
    if est["bound"] == "overhead":
        return f"overhead-bound: the fixed cost of one {call['backend']} call ({est['overhead']:,} cycles)"
    if est["bound"] == "memory":
        lvl = est["bound_level"]
        if lvl == "ddr":
            return (f"memory-bound: {_fmt_bytes(b['ddr_read'])} read from DDR in place "
                    f"(no L2 staging) + {_fmt_bytes(b['ddr_write'])} written")
        if lvl == "dma":
            return f"memory-bound: {_fmt_bytes(b['dma_overlapped'])} staged into L2 by DMA"
        return f"memory-bound: {_fmt_bytes(b[lvl])} moved in {lvl.upper()}"
    work = call["work"]
    if est["engine"] == "scalar":
        return f"compute-bound: {work['iterations'] / 1e6:.2f}M scalar loop iterations (TVM C, no MMA)"
    if est["engine"] == "vector":
        return f"compute-bound: {work['elements'] / 1e6:.2f}M elements on the C7x vector unit"
    share = f"{100 * k.mma_efficiency:.0f}% of peak" + (", one diagonal of the lanes (depthwise)"
                                                        if est["engine"] == "mma_depthwise" else "")
    return f"compute-bound: {work['macs'] / 1e6:.2f}M MACs on the MMA at {share}"


def as_flat(manifest: dict) -> dict:
    """``manifest`` as the flat memory plan would have it: every tensor of every call in
    DDR, read in place (no L2 arena, no DMA staging). The calls and their work are those
    of the build, so :func:`estimate_build` of the result is the flat plan's estimate
    of the same program (what ``[codegen] memory = "flat"`` builds)."""
    def ddr(rw: dict) -> dict:
        return {k: v for k, v in rw.items() if k not in ("staged_from", "dma")} | {"level": "ddr"}
    calls = [{**c, "reads": [ddr(r) for r in c["reads"]], "writes": [ddr(w) for w in c["writes"]]}
             for c in manifest["calls"]]
    return {**manifest, "calls": calls}


def _call_row(call: dict, target: Target, k: Constants, modules: dict) -> dict:
    est = estimate_call(call, target, k)
    return {"index": call["index"], "func": call["func"], "kernel": call["kernel"], "backend": call["backend"],
            "layer": call["layer"], "module": modules.get(call["layer"]), "engine": est["engine"],
            "macs": call["work"].get("macs", 0), "cycles": round(est["cycles"]),
            "compute_cycles": round(est["compute"]),
            "memory_cycles": {lvl: round(v) for lvl, v in est["memory"].items()},
            "dma_serial_cycles": round(est["dma_serial"]), "overhead_cycles": est["overhead"],
            "bound": est["bound"], "bound_level": est["bound_level"],
            "bytes": {lvl: int(v) for lvl, v in est["bytes"].items()},
            "reason": reason(call, est, target, k)}


def no_layer_note(kernels: list[str]) -> str:
    """The note of the row that gathers the calls tied to no layer (the input quantize, and
    calls ``call_graph`` could not tie to one, e.g. a detection head's tuple-output topk):
    ``kernels``, their kernel names in call order, once each."""
    return f"(calls of no layer: {', '.join(dict.fromkeys(kernels))})"


def _layers(calls: list[dict], total: float, op_of: dict) -> list[dict]:
    rows: dict = {}
    for c in calls:
        row = rows.setdefault(c["layer"], {"layer": c["layer"], "module": c["module"], "op": op_of.get(c["layer"]),
                                           "calls": [], "engines": [], "cycles": 0, "macs": 0, "_worst": c})
        row["calls"].append(c["index"])
        if c["engine"] not in row["engines"]:
            row["engines"].append(c["engine"])
        row["cycles"] += c["cycles"]
        row["macs"] += c["macs"]
        if c["cycles"] > row["_worst"]["cycles"]:
            row["_worst"] = c
    out = sorted(rows.values(), key=lambda r: (-r["cycles"], r["calls"][0]))
    for r in out:
        worst = r.pop("_worst")
        r.update(share=round(r["cycles"] / (total or 1), 6), bound=worst["bound"], reason=worst["reason"])
        if r["layer"] is None:
            r["note"] = no_layer_note([c["kernel"] for c in calls if c["layer"] is None])
    return out


def estimate_build(manifest: dict, target: Target, k: Constants | None = None) -> dict:
    """Estimate one build (its ``manifest.json``) on ``target``.

    Returns ``{"label", "total_cycles", "ms", "fps", "macs", "compute_bound_cycles"
    (MACs / MMA int8-or-int16 peak: no model can go below it), "by_engine",
    "by_bound" (cycles), "ddr_bytes", "calls": [...], "layers": [...], "top": [...]}``,
    ``ms`` / ``fps`` at the target clock for one core. Raises KeyError for a
    manifest without per-call ``work`` (written before the estimate existed:
    re-run codegen)."""
    k = k or fitted()
    modules = {lay["id"]: lay.get("module") for lay in manifest["layers"]}
    op_of = {lay["id"]: lay.get("op") for lay in manifest["layers"]}
    calls = [_call_row(c, target, k, modules) for c in manifest["calls"]]
    total = sum(c["cycles"] for c in calls)
    for c in calls:
        c["share"] = round(c["cycles"] / (total or 1), 6)
    by_engine = {e: sum(c["cycles"] for c in calls if c["engine"] == e) for e in sorted({c["engine"] for c in calls})}
    by_bound = {b: sum(c["cycles"] for c in calls if c["bound"] == b) for b in ("compute", "memory", "overhead")}
    layers = _layers(calls, total, op_of)
    macs = sum(c["macs"] for c in calls)
    peak = max((target.mma_macs_per_cycle(c.get("dtype", "int8")) for c in manifest["calls"]), default=1)
    seconds = total / target.clock_hz
    return {"label": LABEL, "total_cycles": total, "ms": round(1e3 * seconds, 4),
            "fps": round(1 / seconds, 2) if total else None, "macs": macs,
            "compute_bound_cycles": math.ceil(macs / peak),
            "by_engine": by_engine, "by_bound": by_bound,
            "ddr_bytes": sum(c["bytes"]["ddr_read"] + c["bytes"]["ddr_write"] for c in calls),
            "dma_bytes": sum(c["bytes"]["dma_serial"] + c["bytes"]["dma_overlapped"] for c in calls),
            "calls": calls, "layers": layers,
            "top": [{k2: r[k2] for k2 in ("layer", "module", "op", "cycles", "share", "bound", "reason", "note")
                     if k2 in r} for r in layers[:TOP]]}


def compare_board(build: dict, board: dict) -> dict:
    """A board log's measured cycles (``profile.json``'s board measurement of the
    same build: ``calls`` with ``time`` in cycles) beside the estimate ``build``.

    Sets ``measured_cycles`` and ``ratio`` (measured / estimated) on every call and
    layer of ``build`` in place and returns the model's overall numbers:
    ``{"measured_cycles", "estimated_cycles", "ratio", "error" (ratio - 1),
    "median_abs_log2_ratio" over layers, "source"}``."""
    measured = {c["index"]: c["time"] for c in board["calls"]}
    for c in build["calls"]:
        c["measured_cycles"] = measured.get(c["index"])
        c["ratio"] = round(c["measured_cycles"] / c["cycles"], 4) if c["cycles"] and c["measured_cycles"] is not None else None
    for lay in build["layers"]:
        m = sum(measured.get(i, 0) for i in lay["calls"])
        lay["measured_cycles"] = m
        lay["ratio"] = round(m / lay["cycles"], 4) if lay["cycles"] else None
    total = sum(measured.values())
    logs = sorted(abs(math.log2(lay["ratio"])) for lay in build["layers"] if lay["ratio"])
    med = logs[len(logs) // 2] if logs else None
    ratio = total / build["total_cycles"] if build["total_cycles"] else None
    return {"source": board.get("label"), "measured_cycles": total, "estimated_cycles": build["total_cycles"],
            "ratio": round(ratio, 4) if ratio else None, "error": round(ratio - 1, 4) if ratio else None,
            "median_abs_log2_ratio": round(med, 4) if med is not None else None}
