"""The staged memory plan against issue 26's targets: prints figures, asserts nothing.

    .venv/bin/python scripts/bench_memory.py [--images 2] [--models mobilenet_v2,resnet18]

Per model (torchvision architecture, random weights: traffic and cycles depend on
shapes, not values; int8, AM67A), built through codegen in a temporary project with
``[codegen] memory = "staged"`` and once more with ``"flat"``:

- calls per inference outside MMALIB / C7x kernels (TVM scalar code);
- DDR traffic per inference (bytes read or written in place + copied by DMA) as the
  instrumented host build counts it (``-D<M>_COUNT_TRAFFIC``, checked equal to the
  plan), against 1.2 x (weights + input + output bytes), the target;
- estimated cycles of the staged plan and of the flat plan (the gain; target 2.5x),
  and of the staged plan against 10M (the target; TI's flow in the document: ResNet-18
  100M, MobileNetV2 2,386M);
- peak L2 against the target's L2 SRAM;
- host time per image of the staged and the flat build (the staging runs as memcpy).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))


def _build(root: Path, name: str, n_images: int):
    """Export..codegen of zoo model ``name`` (random weights); the codegen folder and spec."""
    from sweep import make_project

    from pipeline.stages.registry import STAGES
    from pipeline.tasks import Project

    make_project(root, name, n_images)
    project = Project(root / "models", root=root)
    ctx = project.context(project.valid()[0])
    for stage in STAGES:
        if stage.applies(ctx) and stage.in_default_run():
            stage.function()(**stage.args(ctx))
        if stage.name == "codegen":
            break
    return ctx


def _host_ms(codegen: Path, x, flags=()) -> tuple[float, dict | None]:
    from pipeline.backend.host import build_host, parse_traffic, run_host_timed

    exe = codegen / ("traffic.exe" if flags else "host.exe")
    build_host(codegen, exe, extra_flags=tuple(flags))
    t0 = time.perf_counter()
    run = run_host_timed(exe, codegen, x)
    ms = 1e3 * (time.perf_counter() - t0) / len(x)
    counts = parse_traffic(run.stdout)
    return ms, counts[0] if counts else None


def bench_model(name: str, n_images: int) -> None:
    import numpy as np

    from pipeline.backend.compile import compile_model
    from pipeline.backend.host import traffic_flags
    from pipeline.frontend.irmodule_io import load_irmodule
    from pipeline.perf.report import estimate_build
    from pipeline.target import spec_target

    root = Path(tempfile.mkdtemp(prefix=f"bench-memory-{name}-"))
    try:
        ctx = _build(root, name, n_images)
        staged = ctx.layout.codegen_dir("mmalib")
        flat = root / "flat"
        flat.mkdir()
        mod = load_irmodule(ctx.layout.relax_script, ctx.layout.relax_params)
        compile_model(mod, ctx.spec.name, flat, memory="flat")
        target = spec_target(ctx.spec)
        man = {k: json.loads((d / "manifest.json").read_text()) for k, d in (("staged", staged), ("flat", flat))}
        mm = json.loads((staged / "memory_map.json").read_text())
        x = np.random.default_rng(0).standard_normal((2, *ctx.spec.input_shape[1:])).astype(np.float32)
        ms_staged, counted = _host_ms(staged, x, traffic_flags(staged))
        ms_staged, _ = _host_ms(staged, x)
        ms_flat, _ = _host_ms(flat, x)
        est = {k: estimate_build(m, target)["total_cycles"] for k, m in man.items()}
        s = man["staged"]["summary"]
        io = 4 * (int(np.prod(ctx.spec.input_shape)) + sum(int(np.prod(c["shape"])) for c in man["staged"]["calls"]
                                                          if c["output"].startswith("output")))
        floor = s["weights_bytes"] + io
        ddr = counted["ddr"] + counted["dma"]
        print(f"  {name} (int8, {target.name}):")
        print(f"    calls outside MMALIB/C7x kernels: {s['calls']['tvm']} "
              f"({', '.join(s['tvm_kernels']) or 'none'})")
        print(f"    DDR traffic per inference: {ddr / 1e6:.2f} MB counted (= plan: {counted == mm['traffic']}); "
              f"weights + input + output {floor / 1e6:.2f} MB: ratio {ddr / floor:.2f} (target <= 1.2)")
        print(f"    estimated cycles: staged {est['staged'] / 1e6:.2f}M, flat {est['flat'] / 1e6:.2f}M, "
              f"gain {est['flat'] / est['staged']:.2f}x (target >= 2.5x; staged target <= 10M)")
        print(f"    peak L2 {mm['peak']['l2']:,} B of {int(target.l2_sram_bytes):,} "
              f"({'fits' if mm['peak']['l2'] <= target.l2_sram_bytes else 'OVER'}); "
              f"{len(mm['tiled_calls'])} tiled calls, {len(mm['staged_reads'])} staged reads, "
              f"{sum(t['level'] == 'ddr' for t in mm['tensors'])} of {len(mm['tensors'])} activations in DDR")
        print(f"    host time per image: staged {ms_staged:.1f} ms, flat {ms_flat:.1f} ms")
    except Exception as e:  # one model's failure is a printed figure too
        print(f"  {name}: failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def bench_memory(models: list[str] | None = None, n_images: int = 2) -> None:
    """Every model of ``models`` (module docstring)."""
    print("staged memory plan (issue 26 targets; random weights):")
    for name in models or ["mobilenet_v2", "resnet18"]:
        bench_model(name, n_images)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=2)
    ap.add_argument("--models", default="mobilenet_v2,resnet18")
    args = ap.parse_args()
    bench_memory(args.models.split(","), args.images)


if __name__ == "__main__":
    main()
