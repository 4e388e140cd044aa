"""Run-cache figures: a cold build, a dtype flip, and the flip back (restored).

    .venv/bin/python scripts/bench_runcache.py [--model mobilenet_v2]

Runs `doit` in a temporary project holding one model entry of this repo
(calib_data is linked, the repo's artifacts are not touched) and prints wall
times; the goal for the flip back is 2 s or less with no stage run.
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


def _doit(root: Path) -> tuple[float, str]:
    env = dict(os.environ)
    env.pop("DOIT_C7X_CACHE", None)  # the default cache: <artifacts>/.cache
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "doit"], cwd=root, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode:
        raise SystemExit(f"doit failed in {root}:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return wall, out.stdout + out.stderr


def _ran(out: str) -> int:
    return len(re.findall(r"^\.  \S+:\S+$", out, re.M))


def bench_runcache(model: str = "mobilenet_v2") -> None:
    """Print the cold build, the int8 -> int16 flip and the flip back of ``model``."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "models").mkdir()
        entry = (REPO / "models" / f"{model}.toml").read_text()
        if "extends" in entry:
            raise SystemExit(f"{model}: pick an entry without 'extends' (it is copied alone)")
        (root / "models" / f"{model}.toml").write_text(entry)
        (root / "dodo.py").write_text(DODO)
        (root / "calib_data").symlink_to(REPO / "calib_data")
        toml = root / "models" / f"{model}.toml"
        dtype = re.search(r'^dtype = "(\w+)"', entry, re.M).group(1)
        other = "int16" if dtype == "int8" else "int8"
        cold, out = _doit(root)
        print(f"run-cache ({model}, every default stage, 2 cores):")
        print(f"  cold build ({dtype})            {cold:8.1f} s, {_ran(out)} stages")
        toml.write_text(entry.replace(f'dtype = "{dtype}"', f'dtype = "{other}"'))
        flip, out = _doit(root)
        print(f"  flip to {other} (cache miss)     {flip:8.1f} s, {_ran(out)} stages")
        toml.write_text(entry)
        back, out = _doit(root)
        restored = re.search(r"run-cache: restored (\d+) stage", out)
        n = int(restored.group(1)) if restored else 0
        print(f"  flip back to {dtype} (restored)  {back:8.1f} s, {n} stages restored, {_ran(out) - n} run "
              f"(goal: at most 2 s, none run)")
        for line in out.splitlines():
            if line.startswith("run-cache:"):
                print("    " + line)
        noop, _ = _doit(root)
        print(f"  nothing changed              {noop:8.1f} s (doit's own check, for comparison)")
        size = subprocess.run([sys.executable, "-m", "doit", "cache"], cwd=root, capture_output=True, text=True)
        print("  " + (size.stdout.strip().splitlines() or ["?"])[-1])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mobilenet_v2")
    bench_runcache(ap.parse_args().model)
