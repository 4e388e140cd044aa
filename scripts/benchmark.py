"""Measure the pipeline: prints figures, asserts nothing (targets live here, not in tests).

    .venv/bin/python scripts/benchmark.py [--model mobilenet_v2] [--images 5]

Reports: `doit list` wall time and whether it imported torch/tvm; wall time of
every default stage function for one model, the share that profile, layers and
visualize add, and verify + evaluate against codegen (median of 3 runs; in a
temporary artifacts folder, the repo's own artifacts are not touched); host C
time per image for each build variant; Python reference time per image; peak
resident memory of this process. Then (issue 12) the run-cache restore
against the cold build (scripts/bench_runcache.py), 4 model variants under
``dask-local:2`` against a serial run (scripts/bench_dask.py) and 200-image
calibration sharded against one process (scripts/bench_calibration.py).
Issue 25: the C7x estimate beside the document's figures (scripts/bench_estimate.py).
Issue 26: the staged memory plan against its targets (scripts/bench_memory.py).
Issue 27: 30 kill -9 trials of a tiny project (scripts/kill_trials.py).
Issue 30: a cold build with the calibration methods against one without
(scripts/bench_methods.py). Issue 47: the recipe search against one calibration
(``search``), and with int16 layers allowed under a cycle cap (``search-int16``;
scripts/bench_search.py).
``--sections`` picks some of: list, stages, estimate, memory, runcache, dask, calibration, methods, search,
search-int16, kill.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

LIST_PROBE = """
import sys, time
t = time.perf_counter()
from doit.doit_cmd import DoitMain
import io, contextlib
with contextlib.redirect_stdout(io.StringIO()):
    DoitMain().run(["list", "--all"])
heavy = any(m.split(".")[0] in ("torch", "tvm") for m in sys.modules)
print(f"{time.perf_counter() - t:.3f} {heavy}")
"""


#: a dodo file with the same tasks as ours (basenames and sub-task names) and nothing else:
#: the floor that doit itself costs to list them (issue 29: ours within 1.5x of it)
BARE_DODO = """
TASKS = {tasks!r}

def _group(base, names):
    def task():
        for n in names:
            yield {{"name": n, "actions": None, "doc": base}}
    return task

for _base, _names in TASKS.items():
    globals()["task_" + _base] = _group(_base, _names)
"""


def _list_times(cwd: Path, repeat: int) -> tuple[float, float, bool]:
    times, heavy = [], False
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", LIST_PROBE], cwd=cwd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        inner, h = out.stdout.split()
        times.append((wall, float(inner)))
        heavy |= h == "True"
    return statistics.median(w for w, _ in times), statistics.median(i for _, i in times), heavy


def bench_list(repeat: int = 7) -> None:
    wall, inner, heavy = _list_times(REPO, repeat)
    listed = subprocess.run([str(REPO / ".venv/bin/doit"), "list", "--all", "--quiet"], cwd=REPO,
                            capture_output=True, text=True).stdout.split()
    tasks: dict[str, list[str]] = {}
    for t in listed:
        base, _, name = t.partition(":")
        tasks.setdefault(base, []).append(name or "all")
    with tempfile.TemporaryDirectory() as bare:
        (Path(bare) / "dodo.py").write_text(BARE_DODO.format(tasks=tasks))
        bare_wall, bare_inner, _ = _list_times(Path(bare), repeat)
    print(f"doit list --all: {wall:.3f} s wall including Python start-up, {inner:.3f} s in doit; "
          f"imports torch/tvm: {heavy}")
    print(f"  a bare dodo with the same {len(listed)} tasks: {bare_wall:.3f} s wall, {bare_inner:.3f} s in doit; "
          f"ours is {wall / bare_wall:.2f}x its wall time (median of {repeat})")


def timed(label: str, fn, *args, **kwargs):
    t0 = time.perf_counter()
    c0 = os.times()
    out = fn(*args, **kwargs)
    c1 = os.times()
    cpu = sum(getattr(c1, k) - getattr(c0, k) for k in ("user", "system", "children_user", "children_system"))
    print(f"  {label:<28} {time.perf_counter() - t0:8.2f} s  (CPU {cpu:6.1f} s, this process and its children)")
    return out


def bench_stages(model: str, n_images: int) -> None:
    """Time each default stage function of the registry, in a temp artifacts folder."""
    from pipeline.backend import interp
    from pipeline.data.images import load_images
    from pipeline.stages.registry import STAGES
    from pipeline.tasks import Project

    project = Project(REPO / "models")
    spec = next(s for s in project.valid() if s.name == model)
    with tempfile.TemporaryDirectory() as tmp:
        project.artifacts = Path(tmp)
        ctx = project.context(spec)
        print(f"stages of {model} ({spec.dtype}, {len(ctx.calibration_images)} calibration images):")
        results, times = {}, {}
        for stage in STAGES:  # every default stage in registry order (the cold build, serial)
            if not stage.in_default_run() or not stage.applies(ctx):
                continue
            t0 = time.perf_counter()
            results[stage.name] = timed(stage.name, stage.function(), **stage.args(ctx))
            times[stage.name] = time.perf_counter() - t0
        cold = sum(times.values())
        print(f"  estimate: {times['estimate']:.2f} s = {100 * times['estimate'] / cold:.2f}% of the cold build "
              f"({cold:.1f} s; goal: under 5%)")
        seeing = sum(times[n] for n in ("profile", "layers", "visualize"))
        rest = sum(times.values()) - seeing
        print(f"  profile + layers + visualize: {seeing:.1f} s = {100 * seeing / rest:.0f}% on top of the "
              f"other stages ({rest:.1f} s; goal: at most 25%)")
        ratios = [_verify_ratio(times, len(ctx.evaluation_images))]
        for _ in range(VERIFY_REPEATS - 1):  # this VM's run-to-run spread is +-15%: repeat the three
            interp._COMPILED.clear()  # as cold as the first: codegen seeds the parse, verify builds LLVM
            again = {n: _timed_quiet(STAGES, n, ctx) for n in ("codegen", "evaluate", "verify")}
            ratios.append(_verify_ratio(again, len(ctx.evaluation_images)))
        print(f"  verify + evaluate / codegen, median of {len(ratios)} runs: {statistics.median(ratios):.2f}x "
              f"(runs: {', '.join(f'{r:.2f}' for r in ratios)}; goal: at most {VERIFY_GOAL:g}x)")
        x = load_images(ctx.calibration_images[:n_images], spec.preprocess, desc="load").numpy()
        bench_runs(spec, ctx.layout, x, results["codegen"])


def _timed_quiet(stages, name: str, ctx) -> float:
    """Wall time (s) of one more run of stage ``name`` (its outputs are rewritten with the same bytes)."""
    stage = next(s for s in stages if s.name == name)
    t0 = time.perf_counter()
    stage.function()(**stage.args(ctx))
    return time.perf_counter() - t0


def _verify_ratio(times: dict, n_images: int) -> float:
    """Print and return (verify + evaluate) / codegen of one run."""
    vv = times["verify"] + times["evaluate"]
    ratio = vv / times["codegen"]
    print(f"  verify + evaluate: {times['verify']:.1f} + {times['evaluate']:.1f} = {vv:.1f} s = "
          f"{ratio:.2f}x codegen ({times['codegen']:.1f} s; goal: at most {VERIFY_GOAL:g}x, issue 13, "
          f"on {n_images} images)")
    return ratio


def bench_runs(spec, L, x, summaries) -> None:
    from pipeline.backend.host import run_host_timed
    from pipeline.backend.interp import _COMPILED, Program
    from pipeline.layout import variants

    print(f"per image ({len(x)} images):")
    for v in variants(spec):
        host = run_host_timed(L.host_exe(v), L.codegen_dir(v), x)
        for entry in _COMPILED.values():  # time the LLVM build too (verify paid it, it is cached now)
            entry.lib = entry.externs = None
        t0 = time.perf_counter()
        prog = Program(L.codegen_dir(v))
        load = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(len(x)):
            prog.run(x[i:i + 1])
        ref = (time.perf_counter() - t0) / len(x)
        s = summaries[v]
        print(f"  [{v}] host C {host.ms_per_image:8.1f} ms/image (reference kernels on x86, not the DSP), "
              f"Python reference {ref:6.3f} s/image + {load:.1f} s to build its LLVM code once; "
              f"arena {s['arena_bytes']:,} B, "
              f"workspace {s['workspace_bytes']:,} B, weights {s['weights_bytes']:,} B")


VERIFY_GOAL = 1.5  # (verify + evaluate) / codegen, MobileNetV2 int8, 20 images, 2 cores (issue 13)
VERIFY_REPEATS = 3  # codegen, evaluate and verify are timed this many times; the median ratio is the figure

SECTIONS = ("list", "stages", "estimate", "memory", "runcache", "dask", "calibration", "methods", "search",
            "search-int16", "kill")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--images", type=int, default=5, help="images for the per-image timings")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    args = ap.parse_args()
    sections = args.sections.split(",")
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown section(s) {', '.join(sorted(unknown))} (known: {', '.join(SECTIONS)})")
    sys.path.insert(0, str(REPO / "scripts"))
    if "list" in sections:
        bench_list()
    if "stages" in sections:
        bench_stages(args.model, args.images)
    if "estimate" in sections:
        from bench_estimate import bench_estimate
        bench_estimate()
    if "memory" in sections:
        from bench_memory import bench_memory
        bench_memory()
    if "runcache" in sections:
        from bench_runcache import bench_runcache
        bench_runcache(args.model)
    if "dask" in sections:
        from bench_dask import bench_dask
        bench_dask(n_variants=4)
    if "calibration" in sections:
        from bench_calibration import bench_sharded_calibration
        bench_sharded_calibration(n_images=200, shards=2)
    if "methods" in sections:
        from bench_methods import bench_method_cost
        bench_method_cost(args.model)
    if "search" in sections:
        from bench_search import bench_search
        bench_search(args.model)
    if "search-int16" in sections:
        from bench_search import INT16_TARGET, bench_search
        bench_search(args.model, INT16_TARGET)
    if "kill" in sections:
        from kill_trials import trials
        trials(30, seed=7)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak resident memory of this process: {peak:,.0f} MiB")


if __name__ == "__main__":
    main()
