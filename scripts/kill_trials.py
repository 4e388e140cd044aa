"""kill -9 trials: a tiny project killed at random moments, then built again.

    .venv/bin/python scripts/kill_trials.py [--trials 30] [--seed 7]

Each trial makes a fresh copy of a tiny project (tests/tinynets.py, 3 noise
JPEGs), starts its default `doit` 1 to 3 times and SIGKILLs the whole process
group after 0.5 to 20 s each time (half the trials share one run-cache, half
have their own), then runs `doit` to completion. Prints, per trial, whether
that run succeeded, which deterministic artifacts differ from a clean build
made once without the cache, how many temporaries remain, and whether a last
`doit` still runs anything. Issue 27's targets: 0 corrupt-but-trusted, 0
leftovers after the next run. Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from doitproj import Project  # noqa: E402  (the tests' throw-away project helper)

DETERMINISTIC = ("float.pt2", "calibrated.pt", "quantized.pt2", "relax/module.py", "c/mmalib/model.c",
                 "c/mmalib/weights.bin", "report.json", "verify.json", "layers.json", "estimate.json")


def _project(root: Path) -> Project:
    p = Project(root)
    p.add_images("setA", 3)
    p.add_model("tiny", "setA")
    return p


def _doit(p: Project, env: dict, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "doit"], cwd=p.root, env=env, capture_output=True, text=True, **kw)


def trials(n: int, seed: int) -> None:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base = dict(os.environ, DOIT_C7X_CACHE_SECRET=str(root / "secret"))
        ref = _project(root / "reference")
        made = _doit(ref, dict(base, PYTHONPATH=f"{REPO}:{ref.root}", DOIT_C7X_CACHE="off"))
        if made.returncode:
            raise SystemExit(f"the reference build failed:\n{made.stdout[-2000:]}{made.stderr[-2000:]}")
        bad = left_after = 0
        for t in range(n):
            p = _project(root / f"trial{t}")
            env = dict(base, PYTHONPATH=f"{REPO}:{p.root}",
                       DOIT_C7X_CACHE=str(root / ("shared-cache" if t % 2 else f"cache{t}")))
            for _ in range(rng.randint(1, 3)):
                proc = subprocess.Popen([sys.executable, "-m", "doit"], cwd=p.root, env=env, start_new_session=True,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(rng.uniform(0.5, 20))
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            run = _doit(p, env)
            left = [f for f in (p.root / "artifacts").rglob("*")
                    if f.name.startswith((".tmp-", ".holdout-")) and ".cache" not in f.parts]
            differs = [d for d in DETERMINISTIC if (p.root / "artifacts" / "tiny" / d).read_bytes()
                       != (ref.root / "artifacts" / "tiny" / d).read_bytes()]
            again = [line for line in _doit(p, env).stdout.splitlines() if line.startswith(".  ")]
            bad += bool(run.returncode or differs or again)
            left_after += bool(left)
            print(f"trial {t:2d}: next run rc={run.returncode}, differing artifacts {differs or 'none'}, "
                  f"leftovers {len(left)}, a further run ran {len(again)} tasks", flush=True)
            shutil.rmtree(p.root, ignore_errors=True)
        print(f"kill -9 trials: {bad}/{n} ended corrupt, failed or stale; {left_after}/{n} left temporaries "
              f"after the next run")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    trials(args.trials, args.seed)
