"""Stage ``host_build``: gcc build of the generated C against the reference kernels."""

from __future__ import annotations

from pathlib import Path

from ..fsutil import atomic_path


def host_build_model(builds: dict[str, tuple[Path, Path]]) -> None:
    """Build one host executable per variant: {variant: (codegen_dir, exe)}.

    Raises :class:`~pipeline.errors.ToolchainError` if gcc is missing or fails.
    """
    from ..backend.host import build_host

    for codegen_dir, exe in builds.values():
        with atomic_path(exe) as tmp:
            build_host(codegen_dir, tmp)
        exe.chmod(0o755)
