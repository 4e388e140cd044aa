"""The C7x estimate beside the user's document (issue 25): prints figures, asserts nothing.

    .venv/bin/python scripts/bench_estimate.py [--images 2] [--models resnet18,mobilenet_v2,mobilenet_v3_large]

1. The document's single conv (64 -> 64, 3x3, 56x56, int8, AM67A) three ways:
   model against measured (the three figures the constants are fitted on).
2. ResNet-18, MobileNetV2, MobileNetV3-Large (torchvision architectures, random
   weights: cycles depend on shapes, not values), built through codegen in a
   temporary project: the estimate of the MMALIB build, of the scalar build
   (every conv on TVM's scalar C), the MMA compute bound (MACs / MMA peak) and
   the document's measured cycles for TI's flow, side by side; plus the
   estimate stage's time against codegen's. The document's model figures are
   not used by the fit: they check it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

#: The user's document, AM67A at 1 GHz, TI's flow (which layers it offloaded is not stated)
DOCUMENT_MODELS = {"resnet18": 100e6, "mobilenet_v2": 2386e6, "mobilenet_v3_large": 2369e6}


def bench_document_conv() -> None:
    from pipeline.perf.model import DOCUMENT_CONV, conv_call, estimate_call, fitted
    from pipeline.target import load_target

    t, k = load_target("am67a"), fitted()
    print("the document's conv 64->64 3x3 56x56 int8 on am67a (fitted on these three):")
    for case, measured in DOCUMENT_CONV["cycles"].items():
        e = estimate_call(conv_call(case), t, k)
        print(f"  {case:<14} estimate {e['cycles'] / 1e6:8.3f}M cycles, document {measured / 1e6:8.3f}M "
              f"({100 * (e['cycles'] / measured - 1):+.1f}%), {e['bound']}-bound")
    print(f"  constants: mma_efficiency {k.mma_efficiency:.4f}, ddr_read_efficiency {k.ddr_read_efficiency:.6f}, "
          f"scalar_macs_per_cycle {k.scalar_macs_per_cycle:.4f}")


def _build(root: Path, name: str, n_images: int) -> dict:
    """Export..codegen of zoo model ``name`` (random weights), then the estimate; times."""
    from sweep import make_project

    from pipeline.stages.registry import STAGES
    from pipeline.tasks import Project

    make_project(root, name, n_images)
    project = Project(root / "models", root=root)
    ctx = project.context(project.valid()[0])
    names = [s.name for s in STAGES]
    times = {}
    for stage in STAGES[:names.index("estimate") + 1]:
        if stage.applies(ctx) and stage.in_default_run():
            t0 = time.perf_counter()
            out = stage.function()(**stage.args(ctx))
            times[stage.name] = time.perf_counter() - t0
    import json
    manifest = json.loads((ctx.layout.codegen_dir("mmalib") / "manifest.json").read_text())
    tvm_calls = sum(1 for c in manifest["calls"] if c["backend"] == "tvm")
    return {"estimate": out, "times": times, "tvm_calls": tvm_calls}


def bench_models(models: list[str], n_images: int) -> None:
    print(f"models on am67a, one core (random weights, {n_images} calibration images; cycles in millions):")
    print(f"  {'model':<20} {'MMALIB build':>13} {'all-scalar':>11} {'MMA bound':>10} {'document':>9}  "
          f"estimate stage / codegen")
    for name in models:
        root = Path(tempfile.mkdtemp(prefix=f"bench-estimate-{name}-"))
        try:
            r = _build(root, name, n_images)
        except Exception as e:  # one model's failure is a printed figure too
            print(f"  {name:<20} failed: {type(e).__name__}: {str(e).splitlines()[0]}")
            continue
        finally:
            pass
        v = r["estimate"]["variants"]
        mm, sc = v["mmalib"], v["scalar"]
        doc = DOCUMENT_MODELS.get(name)
        share = r["times"]["estimate"] / r["times"]["codegen"]
        print(f"  {name:<20} {mm['total_cycles'] / 1e6:13.2f} {sc['total_cycles'] / 1e6:11.2f} "
              f"{mm['compute_bound_cycles'] / 1e6:10.2f} {doc / 1e6 if doc else float('nan'):9.0f}  "
              f"{r['times']['estimate']:.2f} s / {r['times']['codegen']:.1f} s = {100 * share:.1f}%")
        top = mm["top"][0]
        engines = ", ".join(f"{k} {v / 1e6:.2f}M" for k, v in sorted(mm["by_engine"].items()))
        print(f"  {'':<20} by engine: {engines}; calls outside MMALIB/C7x kernels: {r['tvm_calls']}")
        print(f"  {'':<20} costliest: {top['module']} {100 * top['share']:.1f}%, {top['reason']}")
        shutil.rmtree(root, ignore_errors=True)


def bench_estimate(models: list[str] | None = None, n_images: int = 2) -> None:
    """Both parts (module docstring)."""
    bench_document_conv()
    bench_models(models or list(DOCUMENT_MODELS), n_images)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=2)
    ap.add_argument("--models", default=",".join(DOCUMENT_MODELS))
    args = ap.parse_args()
    bench_estimate(args.models.split(","), args.images)


if __name__ == "__main__":
    main()
