"""The cost of the recipe search (``[quantizer] target``, stage ``search``) against one
calibration with AdaRound of the same model.

    .venv/bin/python scripts/bench_search.py [--model mobilenet_v2]

In a temporary one-entry project (run-cache off, so no candidate comes from a cache):
``doit export:<m>``, then ``doit search:<m>`` (timed), then ``doit calibrate:<m>``
(timed: prepare and calibrate with the recipe the search chose; for MobileNetV2 the
range search and AdaRound 200). Prints every candidate's held-out value and seconds,
both wall times and their ratio (issue 47's goal: at most 3x on 2 cores). The entry
must state a target. The repo's artifacts are not touched.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_runcache import _project

REPO = Path(__file__).resolve().parent.parent
GOAL = 3.0  # search / one calibration with AdaRound (issue 47)


def _doit(root: Path, task: str) -> float:
    """Wall seconds of ``doit <task>`` in ``root`` (run-cache off); exits on failure."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "doit", task], cwd=root, capture_output=True, text=True,
                         env=dict(os.environ, DOIT_C7X_CACHE="off"))
    if out.returncode:
        raise SystemExit(f"doit {task} failed in {root}:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return time.perf_counter() - t0


def bench_search(model: str = "mobilenet_v2") -> None:
    """Print the search of ``model`` (candidates, wall time) against its calibration."""
    entry = (REPO / "models" / f"{model}.toml").read_text()
    if "target" not in entry:
        raise SystemExit(f"{model}: the entry states no [quantizer] target")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _project(root, model, entry)
        _doit(root, f"export:{model}")
        search = _doit(root, f"search:{model}")
        calibrate = _doit(root, f"calibrate:{model}")
        rec = json.loads((root / "artifacts" / model / "search.json").read_text())
    print(f"recipe search of {model} (run-cache off, {os.cpu_count()} cores), {rec['method']} on "
          f"{rec['evaluation_set']}:")
    for c in rec["candidates"]:
        cycles = "" if c["cycles"] is None else f", {c['cycles'] / 1e6:.2f}M est. cycles"
        print(f"  {c['name']:40s} {c['metric']} {c['value']:.4g}{cycles}  {c['seconds']:6.1f} s")
    print(f"  chosen: {rec['summary']}")
    ratio = search / calibrate
    print(f"  doit search {search:.1f} s, doit calibrate (prepare + calibrate, chosen recipe) {calibrate:.1f} s: "
          f"ratio {ratio:.2f} (goal: at most {GOAL}): {'met' if ratio <= GOAL else 'NOT met'}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mobilenet_v2")
    bench_search(ap.parse_args().model)
