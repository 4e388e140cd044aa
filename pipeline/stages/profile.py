"""Stage ``profile``: time of every kernel call and layer (TI's ``-profile-layers``).

For every build variant the generated C is built once more with the per-layer
profile switched on (``-D<M>_PROFILE_LAYERS``, ``host/profile/<variant>.exe``;
the normal ``host/<variant>.exe`` is untouched), run on the preprocessed
evaluation images (one run each), and its ``===== TVM Layer Profile =====``
blocks, one per image, are parsed (:mod:`pipeline.backend.profile_block`).
Per call the median over the images is kept; these are nanoseconds of the host
build, i.e. of the host reference kernels on x86, not DSP cycles, and every
host number carries that label.

A board log (the block(s) the C7x printed for the build that
``cross_compile`` compiles, MMALIB when enabled) replaces the host time of that
build: its last block is steady state, its first includes initialisation, and
the difference per call and layer is reported as ``init_delta``. The log is
``[profile] board_log`` of the model entry, else
``artifacts/<model>/board_profile.txt`` when that file exists.

``profile.json``, per variant: every call (index, C symbol, backend, layer id,
PyTorch module, time, share of the total) in model.c order, every layer (the
summed time of its calls, share) sorted by time, the total, the unit and the
label, and ``traffic``: the bytes per inference the instrumented build counted
at each memory level (the same executable, built with ``-D<M>_COUNT_TRAFFIC``)
beside what the memory plan says (:func:`counted_traffic`).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import numpy as np

from ..backend.profile_block import ProfileLogError, match_calls, parse_blocks
from ..config import ModelSpec, list_images
from ..errors import CalibrationDataError
from ..fsutil import portable, write_json
from ..perf.measured import board_measurement, build_calls, measurement

HOST_LABEL = "host x86 time of the reference kernels, not DSP cycles"
#: Images profiled (the first of the sorted evaluation set): kernel times hardly
#: depend on the pixels, and profiling every image kept the default run over its
#: time budget (docs/measuring.md, "Figures behind the code").
PROFILE_IMAGES = 5


def _host_variant(codegen_dir: Path, exe: Path, images: np.ndarray) -> dict:
    """Run the profile executable ``exe`` (built in :func:`profile_model`) on ``images``."""
    from ..backend.host import host_command, profile_flags, run_host_timed

    flags = profile_flags(codegen_dir)
    c_name, calls = build_calls(codegen_dir)
    run = run_host_timed(exe, codegen_dir, images)
    source = f"stdout of {exe}"
    blocks = parse_blocks(run.stdout, source)
    fix = "the profile build does not match its codegen folder; re-run codegen (please report it)"
    if len(blocks) != len(images):
        raise ProfileLogError(f"{source}: {len(blocks)} profile blocks for {len(images)} images; {fix}")
    for b in blocks:
        match_calls(b, calls, c_name, source, fix)
    m = measurement(calls, blocks, source="host", unit="ns", label=HOST_LABEL, steady="median")
    m["build"] = portable(shlex.join(host_command(codegen_dir, exe, extra_flags=flags)))
    m["traffic"] = counted_traffic(codegen_dir, run.stdout, len(images), source)
    return m


def counted_traffic(codegen_dir: Path, stdout: str, n_images: int, source: str) -> dict:
    """Bytes per inference at each memory level counted by the instrumented build
    (``c7x-traffic`` lines, :func:`pipeline.backend.host.parse_traffic`) beside what the
    plan says (manifest ``summary.memory.traffic``): ``{"counted", "plan", "matches_plan"}``.
    Raises ProfileLogError when a run printed no count or the images disagree (the
    traffic of a static plan cannot depend on the pixels)."""
    from ..backend.host import parse_traffic

    runs = parse_traffic(stdout)
    if len(runs) != n_images or any(r != runs[0] for r in runs):
        raise ProfileLogError(f"{source}: {len(runs)} traffic counts for {n_images} images, or counts that differ "
                              f"between images; re-run codegen (please report it)")
    manifest = json.loads((Path(codegen_dir) / "manifest.json").read_text())
    plan = manifest["summary"].get("memory", {}).get("traffic")
    return {"counted": runs[0], "plan": plan, "matches_plan": runs[0] == plan}


def _summary_line(spec: ModelSpec, variant: str, m: dict) -> str:
    top = m["layers"][:3]
    tops = ", ".join(f"{r['module'] or r['layer'] or 'input'} {100 * r['share']:.1f}%" for r in top)
    total = f"{m['total'] / 1e6:.3f} ms" if m["unit"] == "ns" else f"{m['total']:,} cycles"
    return f"profile {spec.name} [{variant}]: {total} per image, {m['label']}; top layers: {tops}"


def profile_model(spec: ModelSpec, images_dir: Path, builds: dict[str, tuple[Path, Path]],
                  board_log: Path | None, out: Path) -> dict:
    """Profile every build; write ``profile.json`` (see the module docstring).

    ``builds``: {variant: (codegen folder, profile executable)}, the first being
    the build a board log belongs to. ``board_log``: the C7x log to use for
    that build, or None. Raises :class:`~pipeline.backend.profile_block.ProfileLogError`
    with one line for a missing, empty or foreign board log,
    :class:`~pipeline.errors.CalibrationDataError` without images,
    :class:`~pipeline.errors.ToolchainError` when gcc or the run fails.
    """
    from ..data.images import load_images

    paths = list_images(images_dir, strict=True)[:PROFILE_IMAGES]
    if not paths:
        raise CalibrationDataError(f"model {spec.name!r}: no images in {images_dir} to profile on")
    exes = [exe for _, exe in builds.values()]
    for parent in {e.parent for e in exes}:  # drop executables of variants no longer built
        for old in parent.glob("*.exe") if parent.is_dir() else []:
            if old not in exes:
                old.unlink()
    board = None
    if board_log is not None:  # read it first: a bad log fails before the host builds and runs
        first_dir = next(iter(builds.values()))[0]
        board = (next(iter(builds)), board_measurement(spec, first_dir, Path(board_log)))
    images = load_images(paths, spec.preprocess, desc=f"profile {spec.name}", model=spec.name).numpy()
    images = images.astype(np.float32)
    variants = {}
    from ..backend.host import build_hosts, profile_flags
    build_hosts([(c, e, tuple(profile_flags(c))) for c, e in builds.values()])  # the timed runs stay serial
    for variant, (codegen_dir, exe) in builds.items():
        host = _host_variant(codegen_dir, exe, images)
        if board and board[0] == variant:
            variants[variant] = {**board[1], "host": host, "traffic": host["traffic"]}
        else:
            variants[variant] = host
    report = {"model": spec.name, "images": [p.name for p in paths],
              "board_log": str(board_log) if board_log is not None else None,
              "note": (f"host numbers: {HOST_LABEL} (nanoseconds of the host build, median over the images); "
                       f"board numbers: C7x cycles of the last block of the board log (steady state)"),
              "variants": variants,
              "summary_lines": [_summary_line(spec, v, m) for v, m in variants.items()]}
    write_json(out, report)
    for line in report["summary_lines"]:
        print(line, file=sys.stderr)  # stderr: doit shows it (as calibrate's line)
    return report
