"""The cost of the recipe search (``[quantizer] target``, stage ``search``) against one
calibration with AdaRound of the same model.

    .venv/bin/python scripts/bench_search.py [--model mobilenet_v2] [--target TOML] [--executor dask-local:4]

In a temporary one-entry project (run-cache off, so no candidate comes from a cache):
``doit export:<m>``, then ``doit search:<m>`` (timed), then ``doit calibrate:<m>``
(timed: prepare and calibrate with the recipe the search chose; for MobileNetV2 the
range search and AdaRound 200). Prints every candidate's held-out value and seconds,
both wall times and their ratio (issue 47's goal: at most 3x on 2 cores). The entry
must state a target; ``--target`` replaces it (for example
``'{ metric = "logit_error", max = 0.15, int16 = true, max_mcycles = 6 }'``: the int16
budgets' cost). ``--executor``: the search also runs on that Dask executor
(``DOIT_C7X_EXECUTOR``, :mod:`pipeline.executor`) in a second project, timed the same way.
The repo's artifacts are not touched.
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
GOAL = 3.0  # search / one calibration with AdaRound (issue 47)
#: issue 47's goal for MobileNetV2 with int16 allowed (``mobilenet_v2_mixed``'s target): the cost
#: of the int16 budgets (not met: the largest budget within the cap misses, so it alone is measured)
INT16_TARGET = '{ metric = "logit_error", max = 0.15, int16 = true, max_mcycles = 6 }'


def _doit(root: Path, task: str, executor: str | None = None) -> float:
    """Wall seconds of ``doit <task>`` in ``root`` (run-cache off; on ``executor`` when given,
    with doit's thread runner as docs/guide.md, "Scaling out", says); exits on failure."""
    t0 = time.perf_counter()
    env = dict(os.environ, DOIT_C7X_CACHE="off", **({"DOIT_C7X_EXECUTOR": executor} if executor else {}))
    runner = ["-n", "2", "-P", "thread"] if executor else []
    out = subprocess.run([sys.executable, "-m", "doit", *runner, task], cwd=root, capture_output=True, text=True,
                         env=env)
    if out.returncode:
        raise SystemExit(f"doit {task} failed in {root}:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return time.perf_counter() - t0


def _entry(model: str, target: str | None) -> str:
    """The shipped entry's text, its ``target = ...`` line replaced by ``target`` if given."""
    entry = (REPO / "models" / f"{model}.toml").read_text()
    line = re.compile(r"(?m)^target = .*$")
    if not line.search(entry):
        raise SystemExit(f"{model}: the entry states no [quantizer] target")
    return entry if target is None else line.sub(lambda _: f"target = {target}", entry)


def bench_search(model: str = "mobilenet_v2", target: str | None = None, executor: str | None = None) -> None:
    """Print the search of ``model`` (candidates, wall time) against its calibration, and
    with ``executor`` its wall time on that Dask executor."""
    entry = _entry(model, target)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _project(root, model, entry)
        _doit(root, f"export:{model}")
        search = _doit(root, f"search:{model}")
        calibrate = _doit(root, f"calibrate:{model}")
        rec = json.loads((root / "artifacts" / model / "search.json").read_text())
    on_dask = None
    if executor:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            _project(root, model, entry)
            _doit(root, f"export:{model}")
            on_dask = _doit(root, f"search:{model}", executor)
            dask_rec = json.loads((root / "artifacts" / model / "search.json").read_text())
    print(f"recipe search of {model} (run-cache off, {os.cpu_count()} cores), {rec['method']} on "
          f"{rec['evaluation_set']}:")
    for c in rec["candidates"]:
        cycles = "" if c["cycles"] is None else f", {c['cycles'] / 1e6:.2f}M est. cycles"
        print(f"  {c['name']:40s} {c['metric']} {c['value']:.4g}{cycles}  {c['seconds']:6.1f} s")
    print(f"  chosen: {rec['summary']}")
    ratio = search / calibrate
    print(f"  doit search {search:.1f} s, doit calibrate (prepare + calibrate, chosen recipe) {calibrate:.1f} s: "
          f"ratio {ratio:.2f} (goal: at most {GOAL}): {'met' if ratio <= GOAL else 'NOT met'}")
    if on_dask is not None:
        same = [c["name"] for c in dask_rec["candidates"]] == [c["name"] for c in rec["candidates"]]
        print(f"  on {executor} ({os.cpu_count()} cores): doit search {on_dask:.1f} s ({on_dask / search:.2f}x the "
              f"local search), chosen {dask_rec['chosen']['name']}; "
              f"{'the same candidates' if same else 'OTHER candidates than the local search'}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--target", help="an inline TOML table replacing the entry's target")
    ap.add_argument("--executor", help="also time the search on this Dask executor, e.g. dask-local:4")
    a = ap.parse_args()
    bench_search(a.model, a.target, a.executor)
