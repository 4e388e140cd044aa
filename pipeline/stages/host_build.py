"""Stage ``host_build``: gcc build of the generated C against the reference kernels."""

from __future__ import annotations

import shlex
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
    commands = {}
    for variant, (codegen_dir, exe) in builds.items():
        with atomic_path(exe) as tmp:
            build_host(codegen_dir, tmp)
        exe.chmod(0o755)
        commands[variant] = shlex.join(host_command(codegen_dir, exe))
    if record is not None:
        write_json(record, {"commands": commands,
                            "usage": "<exe> <weights.bin | -> <input.f32> <n_images> <output.f32>"})
