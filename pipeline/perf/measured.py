"""Measured time of every kernel call and layer: a profile log's blocks turned into per-call
and per-layer numbers (host nanoseconds or board cycles), and a board log read for a build.

The ``profile`` stage uses it for its host runs and a board log; the ``estimate``
stage puts a board log's cycles beside the estimate.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..backend.profile_block import ProfileBlock, ProfileLogError, call_symbol, match_calls, read_blocks
from .report import no_layer_note


def board_label(path: Path) -> str:
    """Label of numbers read from a board log."""
    return f"C7x cycles (board log {path})"


def _layer_table(calls: list[dict], times: list, first: list[int]) -> list[dict]:
    """Per layer: summed time of its calls, share, init_delta, sorted by time (largest first)."""
    total = sum(times) or 1
    rows: dict = {}
    for call, t, f in zip(calls, times, first):
        row = rows.setdefault(call["layer"], {"layer": call["layer"], "module": call.get("module"),
                                              "calls": [], "backends": [], "time": 0, "init_delta": 0})
        row["calls"].append(call["index"])
        if call["backend"] not in row["backends"]:
            row["backends"].append(call["backend"])
        row["time"] += t
        row["init_delta"] += f - t
        if "computed_in" in call:  # a conv fused into the next call (levels.fusable): timed there
            row["note"] = f"fused into call {call['computed_in']}: its time is counted with that call's layer"
    out = sorted(rows.values(), key=lambda r: (-r["time"], r["calls"][0]))
    for r in out:
        r["time"], r["init_delta"] = _num(r["time"]), _num(r["init_delta"])
        r["share"] = round(r["time"] / total, 6)
        if r["layer"] is None:
            r["note"] = no_layer_note([c["kernel"] for c in calls if c["layer"] is None])
    return out


def _num(v) -> int | float:
    """An int when whole, else rounded to 0.1 (JSON-stable)."""
    v = float(v)
    return int(v) if v.is_integer() else round(v, 1)


def measurement(calls: list[dict], runs: list[ProfileBlock], *, source: str, unit: str, label: str,
                steady: str) -> dict:
    """Per-call and per-layer numbers of ``runs`` (blocks matching ``calls``, in
    order). ``steady``: "median" (host: median over the runs) or "last" (board:
    the last block). ``init_delta`` = first run - steady value."""
    counts = np.array([b.counts for b in runs], dtype=np.int64)  # [runs, calls]
    if steady == "median":  # a median of an even count may end in .5
        values = [_num(v) for v in np.median(counts, axis=0)]
        statistic = f"median over {len(runs)} images (one run each)"
    else:
        values = [int(v) for v in counts[-1]]
        statistic = (f"last of {len(runs)} block(s) (steady state); init_delta = first block (with "
                     f"initialisation) - last")
    first = [int(v) for v in counts[0]]
    total = sum(values)
    out_calls = []
    for call, v, f in zip(calls, values, first):
        out_calls.append({"index": call["index"], "func": call["func"], "symbol": call["symbol"],
                          "kernel": call["kernel"], "backend": call["backend"], "layer": call["layer"],
                          "module": call.get("module"), "time": v, "share": round(v / (total or 1), 6),
                          "first": f, "init_delta": _num(f - v),
                          **({"timed_in": call["computed_in"]} if "computed_in" in call else {})})
    return {"source": source, "unit": unit, "label": label, "statistic": statistic, "runs": len(runs),
            "total": _num(total), "total_first": sum(first),
            "calls": out_calls, "layers": _layer_table(calls, values, first)}


def build_calls(codegen_dir: Path) -> tuple[str, list[dict]]:
    """(C name, the manifest's calls with each call's C symbol and PyTorch module)."""
    from ..backend.host import model_info

    c_name = model_info(codegen_dir).c_name
    manifest = json.loads((codegen_dir / "manifest.json").read_text())
    modules = {lay["id"]: lay.get("module") for lay in manifest["layers"]}
    calls = [{**c, "symbol": call_symbol(c_name, c["func"]), "module": modules.get(c["layer"])}
             for c in manifest["calls"]]
    return c_name, calls


def board_measurement(spec, codegen_dir: Path, board_log: Path) -> dict:
    """The board log's cycles of the build in ``codegen_dir`` (:func:`measurement`
    of its blocks, the last one steady). Raises ProfileLogError with one line for
    a missing log or one that is not from this build. ``spec``: the model entry
    (:class:`pipeline.config.ModelSpec`)."""
    c_name, calls = build_calls(codegen_dir)
    where = f"model {spec.name!r}, build {codegen_dir.name}"
    if not board_log.is_file():
        raise ProfileLogError(f"{board_log}: board log not found ({where}); fix [profile] board_log in "
                              f"{spec.source} or remove the key")
    blocks = read_blocks(board_log)
    fix = (f"the log is not from this build ({where}, {len(calls)} calls): run the current "
           f"{codegen_dir}/model.c built with -D{c_name.upper()}_PROFILE_LAYERS on the board and "
           f"replace the log")
    for b in blocks:
        match_calls(b, calls, c_name, str(board_log), fix)
    return measurement(calls, blocks, source="board", unit="cycles", label=board_label(board_log),
                       steady="last")
