"""Stage ``host_build``: gcc build of the generated C against the reference kernels."""

from __future__ import annotations

import shlex
from pathlib import Path

from ..fsutil import portable, write_json


def host_build_model(builds: dict[str, tuple[Path, Path]], record: Path | None = None) -> None:
    """Build one host executable per variant: {variant: (codegen_dir, exe)};
    write the gcc command lines to ``record`` (JSON) so users can repeat them.

    Raises :class:`~pipeline.errors.ToolchainError` if gcc is missing or fails.
    """
    from ..backend.host import build_hosts, host_command

    exes = [exe for _, exe in builds.values()]
    for parent in {e.parent for e in exes}:  # drop executables of variants no longer built
        for old in parent.glob("*.exe") if parent.is_dir() else []:
            if old not in exes:
                old.unlink()
    build_hosts([(c, e, ()) for c, e in builds.values()])
    # paths relative to the project (relocatable artifacts): run them from its folder
    commands = {v: portable(shlex.join(host_command(c, e))) for v, (c, e) in builds.items()}
    if record is not None:
        write_json(record, {"commands": commands,
                            "usage": "<exe> <weights.bin | -> <input.f32> <n_images> <output.f32>"})
