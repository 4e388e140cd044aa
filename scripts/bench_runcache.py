"""Run-cache figures: a cold build, a dtype flip, and the flip back (restored).

    .venv/bin/python scripts/bench_runcache.py [--model mobilenet_v2]

Runs `doit` in a temporary project holding one model entry of this repo
(calib_data is linked, the repo's artifacts are not touched) and prints wall
times; the goal for the flip back is 2 s or less with no stage run. Then a
second copy of the project at another path, sharing the run-cache folder and
its secret (as a colleague's checkout would), builds from the cache and flips
the dtype there too: the same goal holds.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DODO = 'from pipeline.tasks import load_project\nglobals().update(load_project("models"))\n'


def _doit(root: Path, shared: Path) -> tuple[float, str]:
    env = dict(os.environ, DOIT_C7X_CACHE=str(shared / "cache"), DOIT_C7X_CACHE_SECRET=str(shared / "secret"))
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "doit"], cwd=root, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode:
        raise SystemExit(f"doit failed in {root}:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return wall, out.stdout + out.stderr


def _ran(out: str) -> int:
    return len(re.findall(r"^\.  \S+:\S+$", out, re.M))


def _project(root: Path, model: str, entry: str) -> Path:
    """A project folder holding the one entry; returns its toml."""
    (root / "models").mkdir(parents=True)
    (root / "models" / f"{model}.toml").write_text(entry)
    (root / "dodo.py").write_text(DODO)
    (root / "calib_data").symlink_to(REPO / "calib_data")
    return root / "models" / f"{model}.toml"


def _restored(out: str) -> int:
    m = re.search(r"run-cache: restored (\d+) stage", out)
    return int(m.group(1)) if m else 0


def bench_runcache(model: str = "mobilenet_v2") -> None:
    """Print the cold build, the int8 -> int16 flip and the flip back of ``model``,
    then the same from a second checkout at another path sharing the cache."""
    with tempfile.TemporaryDirectory() as tmp:
        shared = Path(tmp)
        entry = (REPO / "models" / f"{model}.toml").read_text()
        if "extends" in entry:
            raise SystemExit(f"{model}: pick an entry without 'extends' (it is copied alone)")
        root = shared / "first"
        toml = _project(root, model, entry)
        dtype = re.search(r'^dtype = "(\w+)"', entry, re.M).group(1)
        other = "int16" if dtype == "int8" else "int8"
        cold, out = _doit(root, shared)
        print(f"run-cache ({model}, every default stage, 2 cores):")
        print(f"  cold build ({dtype})            {cold:8.1f} s, {_ran(out)} stages")
        toml.write_text(entry.replace(f'dtype = "{dtype}"', f'dtype = "{other}"'))
        flip, out = _doit(root, shared)
        print(f"  flip to {other} (cache miss)     {flip:8.1f} s, {_ran(out)} stages")
        toml.write_text(entry)
        back, out = _doit(root, shared)
        n = _restored(out)
        print(f"  flip back to {dtype} (restored)  {back:8.1f} s, {n} stages restored, {_ran(out) - n} run "
              f"(goal: at most 2 s, none run)")
        for line in out.splitlines():
            if line.startswith("run-cache:"):
                print("    " + line)
        noop, _ = _doit(root, shared)
        print(f"  nothing changed              {noop:8.1f} s (doit's own check, for comparison)")
        clone = shared / "elsewhere" / "second"
        ctoml = _project(clone, model, entry)
        print("  a second checkout at another path, same cache and secret:")
        for label, text in ((f"first build ({dtype})", entry),
                            (f"flip to {other}", entry.replace(f'dtype = "{dtype}"', f'dtype = "{other}"')),
                            (f"flip back to {dtype}", entry)):
            ctoml.write_text(text)
            wall, out = _doit(clone, shared)
            n = _restored(out)
            print(f"    {label:26s} {wall:8.1f} s, {n} stages restored, {_ran(out) - n} run")
        size = subprocess.run([sys.executable, "-m", "doit", "cache"], cwd=root, capture_output=True, text=True,
                              env=dict(os.environ, DOIT_C7X_CACHE=str(shared / "cache")))
        print("  " + (size.stdout.strip().splitlines() or ["?"])[-1])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mobilenet_v2")
    bench_runcache(ap.parse_args().model)
