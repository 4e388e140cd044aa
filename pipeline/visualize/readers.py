"""The page's optional inputs: ``profile.json`` and ``layers.json``, read into one shape.

Both files come from other stages (``profile:<model>``, ``layers:<model>``);
the page works without them. Each has one reader here, so a renamed key is a
one-line change; unknown extra keys are ignored, a missing value becomes None.

- :func:`read_profile`: ``{"variants" | "builds": {variant: {"unit", "label",
  "statistic", "total", "calls": [{"index", "time" | "median", "share"}],
  "layers": [{"layer" | "id", "time" | "median", "share"}]}}}`` ->
  ``{variant: {"unit", "label", "statistic", "total", "calls": {index: {"median", "share"}},
  "layers": {id: {"median", "share"}}}}``. ``share`` is a fraction of the
  build's total (computed from ``total`` when absent; a file giving percent
  is scaled down). A board measurement's nested ``"host"`` numbers are not
  shown.
- :func:`read_numerics`: ``{"layers": [{"id", "module", "op", "<a>_vs_<b>": {metric: value},
  "notes"}], "worst": [ids], "build", "builds", "measures"}`` -> ``{variant or "*":
  {"groups": [{"name", "metrics"}], "layers": [...worst first], "worst": [ids], "measures"}}``
  (groups and metrics in reading order: ``qdq_vs_float``, ``c_vs_qdq``, others;
  ``sqnr_db``, ``cosine``, ``max_abs``, ``max_lsb``, others).
  A comparison group is any key named ``*_vs_*`` holding a dict. With
  ``"build": "mmalib", "builds": ["mmalib", "scalar"]``, ``c_vs_qdq`` belongs to
  ``build`` and ``c_vs_qdq_<variant>`` to the others; each build's table then
  shows its own as ``c_vs_qdq``. Without them the one table (``"*"``) is every
  build's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..config import AccuracyTarget

_TIME_KEYS = ("median", "time", "median_ns", "median_cycles", "value", "mean")


def _number(record: dict, *keys):
    for k in keys:
        v = record.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return v
    return None


def _load(path) -> dict | None:
    if path is None or not Path(path).is_file():
        return None
    raw = json.loads(Path(path).read_text())
    return raw if isinstance(raw, dict) else None


def _timings(rows, keys: tuple[str, ...], total) -> dict:
    out = {}
    for row in rows if isinstance(rows, list) else []:
        key = next((row[k] for k in keys if isinstance(row, dict) and row.get(k) is not None), None)
        if key is None:  # e.g. the input quantize's row: no layer (its call has the time)
            continue
        median = _number(row, *_TIME_KEYS)
        share = _number(row, "share", "fraction")
        if share is None and median is not None and total:
            share = median / total
        out[str(key)] = {"median": median, "share": share}
        if isinstance(row, dict) and row.get("timed_in") is not None:  # a conv fused into a later call
            out[str(key)]["timed_in"] = row["timed_in"]
    shares = [t["share"] for t in out.values() if t["share"] is not None]
    if shares and max(shares) > 1.0:  # percent, not a fraction
        for t in out.values():
            t["share"] = None if t["share"] is None else t["share"] / 100.0
    return out


def read_profile(path) -> dict | None:
    """``profile.json`` -> {variant: timings}, or None when the file is absent or names no build."""
    raw = _load(path)
    if not raw:
        return None
    builds = raw.get("variants", raw.get("builds"))
    out = {}
    for variant, b in (builds or {}).items():
        if not isinstance(b, dict):
            continue
        total = _number(b, "total", "total_median", "sum")
        out[variant] = {
            "unit": b.get("unit", "ns"),
            "label": b.get("label") or raw.get("label") or "",
            "statistic": b.get("statistic") or "",
            "total": total,
            "calls": _timings(b.get("calls"), ("index",), total),
            "layers": _timings(b.get("layers"), ("id", "layer"), total),
        }
    return out or None


_LAYER_KEYS = ("id", "module", "op")
_GROUP_ORDER = ("qdq_vs_float", "c_vs_qdq")
_METRIC_ORDER = ("sqnr_db", "cosine", "max_abs", "max_lsb")


def _ordered(names, first: tuple[str, ...]) -> list[str]:
    return sorted(names, key=lambda n: (first.index(n) if n in first else len(first), n))


def _ranked(layers: list[dict], worst: list[str], measures: dict, rename: dict[str, str]) -> dict:
    """One build's table: comparison groups (``rename``: file key -> shown key), worst first."""
    groups: dict[str, list[str]] = {}
    rows = []
    for lay in layers:
        row = {k: lay.get(k) for k in _LAYER_KEYS}
        notes = lay.get("notes")
        row["notes"] = [str(n) for n in notes] if isinstance(notes, list) else []
        for key, metrics in lay.items():
            shown = rename.get(key, key)
            if shown is None or "_vs_" not in shown or key in _LAYER_KEYS:
                continue
            known = groups.setdefault(shown, [])
            if isinstance(metrics, dict):
                known += [m for m in metrics if m not in known]
                row[shown] = metrics
        rows.append(row)
    groups = {g: ms for g, ms in groups.items() if ms}
    for row in rows:  # every row has every group (None: not measured)
        for g in [k for k in row if "_vs_" in k and k not in groups]:
            del row[g]
        for g, ms in groups.items():
            values = row.get(g) if isinstance(row.get(g), dict) else {}
            row[g] = {m: values.get(m) for m in ms}
    first = {lid: i for i, lid in enumerate(worst)}
    rows = [r for _, r in sorted(enumerate(rows), key=lambda ir: (first.get(ir[1]["id"], len(first)), ir[0]))]
    shown = [{"name": g, "metrics": _ordered(groups[g], _METRIC_ORDER)} for g in _ordered(groups, _GROUP_ORDER)]
    return {"groups": shown, "layers": rows, "worst": worst, "measures": measures}


def read_numerics(path) -> dict | None:
    """``layers.json`` -> {variant or "*": table}, or None when absent or empty.

    Rows are worst first: the ``worst`` ids, then the file's own order (the
    layers stage writes them worst first already).
    """
    raw = _load(path)
    if not raw:
        return None
    layers = [lay for lay in raw.get("layers", []) if isinstance(lay, dict) and "id" in lay]
    worst = [w for w in raw.get("worst", []) if isinstance(w, str)]
    measures = {k: v for k, v in (raw.get("measures") or {}).items() if isinstance(v, str)}
    main, builds = raw.get("build"), raw.get("builds")
    if isinstance(main, str) and isinstance(builds, list) and main in builds:
        out = {}
        for v in builds:
            own = "c_vs_qdq" if v == main else f"c_vs_qdq_{v}"
            others = {("c_vs_qdq" if o == main else f"c_vs_qdq_{o}"): None for o in builds if o != v}
            out[v] = _ranked(layers, worst, measures, {**others, own: "c_vs_qdq"})
    else:
        out = {"*": _ranked(layers, worst, measures, {})}
    return out if layers else None


_ESTIMATE_ROW = ("cycles", "share", "bound", "reason", "engine", "measured_cycles", "ratio")


def read_estimate(path) -> dict | None:
    """``estimate.json`` -> {variant: {"label", "target", "total_cycles", "ms", "fps",
    "calls": {index: row}, "layers": {id: row}, "top", "board", "memory"}}, or None when absent
    (``memory``: the build's memory plan figures, :func:`pipeline.stages.estimate.memory_figures`).
    A row: cycles, share, bound, reason, engine (+ measured_cycles, ratio with a board log)."""
    raw = _load(path)
    if not raw or not isinstance(raw.get("variants"), dict):
        return None
    target = raw.get("target", {})
    out = {}
    for variant, b in raw["variants"].items():
        out[variant] = {
            "label": raw.get("label", ""), "target": target.get("name", ""),
            "clock_hz": (target.get("figures") or {}).get("clock_hz"),
            "total_cycles": b.get("total_cycles"), "ms": b.get("ms"), "fps": b.get("fps"),
            "calls": {str(c["index"]): {k: c.get(k) for k in _ESTIMATE_ROW} for c in b.get("calls", [])},
            "layers": {str(r["layer"]): {k: r.get(k) for k in _ESTIMATE_ROW} for r in b.get("layers", [])
                       if r.get("layer") is not None},
            "top": b.get("top", []), "board": b.get("board"), "memory": b.get("memory"),
        }
    return out


def read_search(path) -> dict | None:
    """What the page plots of ``search.json`` (None when ``path`` is None or missing): the
    ``target`` text, the ``metric``, the ``notice``, and per candidate its ``name``, held-out
    ``value``, estimated ``cycles``, whether it ``met`` the target, is ``int16`` (int16
    layers) and is the ``chosen`` one."""
    if not path or not Path(path).is_file():
        return None
    rec = json.loads(Path(path).read_text())
    t = AccuracyTarget.from_record(rec["target"])
    chosen = rec["chosen"]["name"]
    return {"target": t.text(), "bound": t.bound, "max_cycles": None if t.max_mcycles is None else t.max_mcycles * 1e6,
            "metric": t.metric, "notice": rec.get("notice"), "summary": rec.get("summary", ""),
            "candidates": [{"name": c["name"], "value": c["value"], "cycles": c["cycles"], "met": c["met"],
                            "int16": "int16" in c["name"], "chosen": c["name"] == chosen}
                           for c in rec["candidates"]]}
