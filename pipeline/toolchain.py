"""The compilers we run: TI's C7000 code generation tools (locating them and
their command lines), and which CPU the host gcc builds for (:func:`host_cpu`).

Flags are TI's documented ones for the C7x on J722S / AM67A
(docs/reference.md, "TI toolchain"): ``-mv7524`` selects the C7524 core with its
MMA (``--silicon_version`` is for C66x only), release builds use
``-O3 --auto_inline=500``. No torch, no tvm.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
from pathlib import Path

from .errors import ToolchainError

CGT_ENV = "TI_CGT_C7000_PATH"
MMALIB_ENV = "MMALIB_PATH"


def common_flags(cgt: Path | None) -> list[str]:
    """Flags shared by every C7x compile (docs/reference.md, "TI toolchain": common flags);
    ``cgt`` None: without the CGT's include folder (a Makefile that adds its own)."""
    include = [f"-I{cgt / 'include'}"] if cgt is not None else []
    return ["-mv7524", "--abi=eabi", "--endian=little", "--display_error_number",
            "--diag_suppress=496,1311,303", *include, "--fp_mode=relaxed", "-DNULL=0", "-DSOC_J722S"]


RELEASE_FLAGS = ["-O3", "--auto_inline=500"]
C_FLAGS = ["--c99"]


def find_cgt() -> Path:
    """The TI CGT root from ``$TI_CGT_C7000_PATH``, with ``bin/cl7x`` in it.

    Raises :class:`ToolchainError` (one line, naming the variable) otherwise.
    """
    root = os.environ.get(CGT_ENV)
    if not root:
        raise ToolchainError(f"{CGT_ENV} is not set: point it at TI's C7000 code generation tools "
                             f"(e.g. /opt/ti/ti-cgt-c7000_5.0.1.LTS) to cross-compile for the C7x")
    cgt = Path(root)
    for tool in ("cl7x", "ar7x"):
        exe = cgt / "bin" / tool
        if not (exe.is_file() and os.access(exe, os.X_OK)):
            raise ToolchainError(f"{CGT_ENV}={root} has no executable bin/{tool}: point it at the root of "
                                 f"TI's C7000 code generation tools")
    return cgt


def compile_command(cgt: Path, source: Path, obj: Path, include_dirs: list[Path]) -> list[str]:
    """``cl7x`` command compiling one C99 file to an object (docs/reference.md, "TI toolchain")."""
    return ([str(cgt / "bin" / "cl7x")] + common_flags(cgt) + C_FLAGS + RELEASE_FLAGS
            + [f"-I{d}" for d in include_dirs]
            + ["--compile_only", f"--output_file={obj}", str(source)])


def archive_command(cgt: Path, library: Path, objects: list[Path]) -> list[str]:
    """``ar7x`` command packing objects into a static library for the firmware link."""
    return [str(cgt / "bin" / "ar7x"), "rq", str(library)] + [str(o) for o in objects]


def link_command(cgt: Path, inputs: list[str], output: str) -> list[str]:
    """``cl7x --run_linker`` command linking ``inputs`` (objects, libraries and linker
    command files, in order: the model's ``c7x_memory.cmd`` before the application's own
    .cmd, which defines the L2SRAM / MSMC / DDR ranges) into the firmware ``output``."""
    return ([str(cgt / "bin" / "cl7x")] + common_flags(cgt) + ["--run_linker", f"--output_file={output}",
                                                              "--reread_libs", "--warn_sections"]
            + [str(i) for i in inputs])


@functools.lru_cache(maxsize=1)
def host_cpu() -> str:
    """Which CPU kind the host executables are built for (``gcc -march=native``,
    :mod:`pipeline.backend.host`): the machine, the CPU model and its feature
    flags (Linux ``/proc/cpuinfo``; elsewhere ``platform.processor()``), as a
    16-hex digest. host_build tracks it, so a run-cache shared by machines of
    different kinds never hands one an executable built for another."""
    parts = [platform.machine()]
    try:
        info = Path("/proc/cpuinfo").read_text()
        first = info.split("\n\n", 1)[0].splitlines()
        parts += [ln.split(":", 1)[1].strip() for ln in first if ln.split(":")[0].strip() in ("model name", "flags")]
    except OSError:
        parts.append(platform.processor())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


MEMORY_CMD = "c7x_memory.cmd"


def cross_outputs(model: str, c_sources: list[str]) -> list[str]:
    """File names the cross_compile stage writes into its folder (doit targets), for
    the C sources ``c_sources`` (file names) of model ``model``."""
    objs = [Path(c).stem + ".obj" for c in c_sources] + ["c7x_kernels_ref.obj"]
    return ["build.json", f"lib{model}.lib", MEMORY_CMD] + objs
