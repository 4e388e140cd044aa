"""Stage ``host_build``: gcc build of the generated C against the reference kernels."""

from __future__ import annotations

import os
import shlex
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..fsutil import atomic_path, write_json


def host_build_model(builds: dict[str, tuple[Path, Path]], record: Path | None = None) -> None:
    """Build one host executable per variant: {variant: (codegen_dir, exe)};
    write the gcc command lines to ``record`` (JSON) so users can repeat them.

    Raises :class:`~pipeline.errors.ToolchainError` if gcc is missing or fails.
    """
    from ..backend.host import build_host, host_command

    exes = [exe for _, exe in builds.values()]
    for parent in {e.parent for e in exes}:  # drop executables of variants no longer built
        for old in parent.glob("*.exe") if parent.is_dir() else []:
            if old not in exes:
                old.unlink()
    def build(codegen_dir: Path, exe: Path) -> None:
        with atomic_path(exe) as tmp:
            build_host(codegen_dir, tmp)
        exe.chmod(0o755)

    # One gcc per variant at once (2 cores: MobileNetV2's two builds 6.8 -> 4.4 s);
    # the first failure is raised, after the others finish.
    with ThreadPoolExecutor(max_workers=max(1, min(len(builds), os.cpu_count() or 1))) as pool:
        done = [pool.submit(build, c, e) for c, e in builds.values()]
    for f in done:
        f.result()
    commands = {v: shlex.join(host_command(c, e)) for v, (c, e) in builds.items()}
    if record is not None:
        write_json(record, {"commands": commands,
                            "usage": "<exe> <weights.bin | -> <input.f32> <n_images> <output.f32>"})
