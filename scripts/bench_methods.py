"""The cost of the calibration methods: a cold build with them against one without.

    .venv/bin/python scripts/bench_methods.py [--model mobilenet_v2]

Builds the model entry cold (run-cache off) in two temporary projects: as
shipped, and with the steps after observing that cost time switched off
(``range_search = false``, ``adaround_iterations = 0``: the calibration before
issue 30; exact requantize and affine activations stay, they cost nothing).
Prints both wall times, their ratio (issue 30's goal: under 2.0 on 2 cores)
and where the difference goes: the range search and AdaRound seconds of the
calibrate stage, and the holdout stage (which re-runs the calibration once per
fold). The repo's artifacts are not touched.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_runcache import _project

REPO = Path(__file__).resolve().parent.parent
GOAL = 2.0  # cold build with the methods / without them (issue 30, "Cost stays sane")


def _as_recipe(entry: str) -> str:
    """An entry stating ``[quantizer] target`` with the target replaced by the recipe at the
    top of the search's int8 ladder (affine, output range search, AdaRound 200: what
    MobileNetV2's search chooses), so both builds below are the same flow but the methods."""
    from pipeline.quant.search import INT8_RECIPES
    if not re.search(r"(?m)^target\s*=", entry):
        return entry
    entry = re.sub(r"(?m)^target\s*=.*$", "target = false", entry)
    o = INT8_RECIPES[-1][2]
    lines = {"quantizer": "symmetric_activations = false",
             "calibration": '\n'.join(f"{k} = {json.dumps(v)}" for k, v in o["calibration"].items())}
    for table, text in lines.items():
        if f"[{table}]" not in entry:
            entry += f"\n[{table}]\n"
        entry = entry.replace(f"[{table}]", f"[{table}]\n{text}", 1)
    return entry


def _without_methods(entry: str) -> str:
    """The entry text with the range search and AdaRound off (keys set or added)."""
    entry = re.sub(r"(?m)^(range_search|adaround_iterations)\s*=.*$\n?", "", entry)
    if "[calibration]" not in entry:
        entry += "\n[calibration]\n"
    return entry.replace("[calibration]", "[calibration]\nrange_search = false\nadaround_iterations = 0", 1)


def _cold_build(root: Path, model: str, entry: str) -> dict:
    """Wall time of a cold ``doit`` of a one-entry project at ``root`` and the seconds
    its calibration.json and holdout.json record."""
    _project(root, model, entry)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "doit"], cwd=root, capture_output=True, text=True,
                         env=dict(os.environ, DOIT_C7X_CACHE="off"))
    wall = time.perf_counter() - t0
    if out.returncode:
        raise SystemExit(f"doit failed in {root}:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    art = root / "artifacts" / model
    cal = json.loads((art / "calibration.json").read_text())
    holdout = art / "holdout.json"
    return {"wall": wall,
            "range_search": (cal.get("range_search") or {}).get("seconds", 0.0),
            "adaround": (cal.get("adaround") or {}).get("seconds", 0.0),
            "holdout": json.loads(holdout.read_text()).get("seconds", 0.0) if holdout.exists() else 0.0}


def bench_method_cost(model: str = "mobilenet_v2") -> None:
    """Print the cold build of ``model`` with and without its calibration methods."""
    entry = _as_recipe((REPO / "models" / f"{model}.toml").read_text())
    if re.search(r"(?m)^extends\s*=", entry):
        raise SystemExit(f"{model}: pick an entry without 'extends' (the project holds one entry)")
    with tempfile.TemporaryDirectory() as tmp:
        off = _cold_build(Path(tmp) / "off", model, _without_methods(entry))
        on = _cold_build(Path(tmp) / "on", model, entry)
    print(f"cold build of {model} (run-cache off, {os.cpu_count()} cores):")
    for name, r in (("without range search / AdaRound", off), ("as shipped", on)):
        print(f"  {name:32s} {r['wall']:6.1f} s  (calibrate: range search {r['range_search']:.1f} s, "
              f"AdaRound {r['adaround']:.1f} s; holdout stage {r['holdout']:.1f} s)")
    ratio = on["wall"] / off["wall"]
    print(f"  ratio {ratio:.2f} (goal: under {GOAL}): {'met' if ratio < GOAL else 'NOT met'}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mobilenet_v2")
    bench_method_cost(ap.parse_args().model)
