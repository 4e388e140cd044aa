"""Stage ``host_build``: gcc build of the generated C against the reference kernels."""

from __future__ import annotations

from pathlib import Path

from ..fsutil import atomic_path


def host_build_model(builds: dict[str, tuple[Path, Path]]) -> None:
    """Build one host executable per variant: {variant: (codegen_dir, exe)}.

    Raises :class:`~pipeline.errors.ToolchainError` if gcc is missing or fails.
    """
    from ..backend.host import build_host

    exes = [exe for _, exe in builds.values()]
    for parent in {e.parent for e in exes}:  # drop executables of variants no longer built
        for old in parent.glob("*.exe") if parent.is_dir() else []:
            if old not in exes:
                old.unlink()
    for codegen_dir, exe in builds.values():
        with atomic_path(exe) as tmp:
            build_host(codegen_dir, tmp)
        exe.chmod(0o755)
