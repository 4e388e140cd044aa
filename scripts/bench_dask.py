"""Serial doit against the Dask executor: wall time of N MobileNetV2 variants.

    .venv/bin/python scripts/bench_dask.py [--variants 4] [--last verify]

Writes N MobileNetV2 entries (int8/int16 x percentile/minmax, then more
observers) into a temporary project that reads this repo's ``calib_data``,
builds every variant through ``--last`` cold, first with ``doit -n 1`` (serial,
stages in the doit process), then, in the same folder after moving the serial
artifacts aside, with ``DOIT_C7X_EXECUTOR=dask-local:2 doit -n 2 -P thread``
(cluster start-up included). Prints both wall times, the speed-up and whether
every artifact is byte-identical. The run-cache is off (``DOIT_C7X_CACHE=off``)
so both runs do all the work. Both runs use the same ``C7X_TORCH_THREADS``
(default 2; the artifacts depend on it): with 2 the serial run already keeps
2 cores busy inside torch, ``C7X_TORCH_THREADS=1`` shows the executor's own
parallelism. Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

DODO = f'''from pipeline.tasks import load_project
globals().update(load_project("models", artifacts_dir="artifacts", calib_root={str(REPO / "calib_data")!r}))
'''
OBSERVERS = ("percentile", "minmax", "moving_average", "histogram")
# Not compared: doit's database, and the stamps (they hold file mtimes).
SKIP = (".doit.db", ".stamps", "logs")


def variant_entries(n: int) -> dict[str, str]:
    """``name -> TOML`` of ``n`` MobileNetV2 variants of models/mobilenet_v2.toml."""
    base = (REPO / "models" / "mobilenet_v2.toml").read_text()
    out = {}
    for observer, dtype in itertools.islice(itertools.product(OBSERVERS, ("int8", "int16")), n):
        text = base.replace('dtype = "int8"', f'dtype = "{dtype}"')
        text = text.replace('observer = "percentile"', f'observer = "{observer}"')
        out[f"mnv2_{dtype}_{observer}"] = text
    return out


def run_doit(root: Path, args: list[str], env: dict) -> float:
    """Wall time of one doit run in ``root``; exits with doit's output if it fails."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "doit", *args], cwd=root, capture_output=True, text=True,
                          env=dict(os.environ, DOIT_C7X_CACHE="off", **env))
    wall = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"doit {' '.join(args)} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return wall


def artifact_files(art: Path) -> dict[str, bytes]:
    """Relative path -> bytes of every stage output under ``art``."""
    return {str(p.relative_to(art)): p.read_bytes() for p in sorted(art.rglob("*")) if p.is_file()
            and not any(part.startswith(s) for part in p.relative_to(art).parts for s in SKIP)}


def bench_dask(n_variants: int = 4, last: str = "verify", workers: int = 2) -> dict:
    """Print and return serial vs ``dask-local:<workers>`` wall times (s) and the speed-up."""
    entries = variant_entries(n_variants)
    with tempfile.TemporaryDirectory(prefix="bench-dask-") as tmp:
        root = Path(tmp)
        (root / "models").mkdir()
        (root / "dodo.py").write_text(DODO)
        for name, text in entries.items():
            (root / "models" / f"{name}.toml").write_text(text)
        tasks = [f"{last}:{name}" for name in entries]
        serial = run_doit(root, ["-n", "1", *tasks], {})
        (root / "artifacts").rename(root / "artifacts.serial")
        dask = run_doit(root, ["-n", str(workers), "-P", "thread", *tasks],
                        {"DOIT_C7X_EXECUTOR": f"dask-local:{workers}"})
        a, b = artifact_files(root / "artifacts.serial"), artifact_files(root / "artifacts")
        identical = a == b
        differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    threads = os.environ.get("C7X_TORCH_THREADS", "2")
    print(f"{n_variants} MobileNetV2 variants through {last} ({', '.join(entries)}), {os.cpu_count()} cores, "
          f"C7X_TORCH_THREADS={threads} in both runs:")
    print(f"  serial (doit -n 1)                                   {serial:7.1f} s")
    print(f"  dask   (DOIT_C7X_EXECUTOR=dask-local:{workers} doit -n {workers} -P thread) {dask:7.1f} s")
    print(f"  speed-up {serial / dask:.2f}x; artifacts byte-identical: {identical} ({len(a)} files)"
          + (f"; differ: {', '.join(differ[:8])}" if differ else ""))
    return {"serial_s": serial, "dask_s": dask, "speedup": serial / dask, "identical": identical}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", type=int, default=4)
    ap.add_argument("--last", default="verify", help="last stage to build (default verify)")
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    bench_dask(a.variants, a.last, a.workers)


if __name__ == "__main__":
    main()
