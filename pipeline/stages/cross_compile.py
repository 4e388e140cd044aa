"""Stage ``cross_compile``: the generated C -> C7x objects and a static library.

Output folder ``c7x/``: one ``.obj`` per generated C file, ``lib<model>.lib``
(link it into the DSP firmware together with TI's MMALIB wrappers), the
portable reference kernels as ``c7x_kernels_ref.obj`` (a slow fallback for
firmware without the wrappers), ``c7x_memory.cmd`` (codegen's linker command
file placing the model's ``.l2sram`` / ``.msmc`` / ``.ddr`` sections), and
``build.json`` with every command line and, under ``link``, the firmware link
line to use (``<app objects>`` and ``<app linker.cmd>`` are the application's).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from ..config import ModelSpec
from ..errors import ToolchainError
from ..fsutil import atomic_dir, portable, write_json
from ..toolchain import MEMORY_CMD, archive_command, compile_command, find_cgt, link_command

KERNELS_DIR = Path(__file__).resolve().parent.parent / "backend" / "kernels"
DATA_FILES = ("../backend/kernels/*.c", "../backend/kernels/*.h")  # read at run time (code_deps.py)


def _run(cmd: list[str], model: str, cwd: Path, what: str) -> None:
    tool = Path(cmd[0]).name
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    except OSError as e:
        raise ToolchainError(f"model {model!r}: cannot run {cmd[0]} ({e.strerror})") from None
    if proc.returncode != 0:
        lines = [line.strip() for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
        first_error = next((line for line in lines if "error" in line.lower()), lines[-1] if lines else "")
        raise ToolchainError(f"model {model!r}: {tool} failed on {what} (exit {proc.returncode}): "
                             f"{first_error or 'no output'}")


def cross_compile_model(spec: ModelSpec, codegen_dir: Path, out: Path) -> dict:
    """Compile ``codegen_dir``'s C sources with cl7x and archive them with ar7x.

    Raises :class:`ToolchainError` when ``TI_CGT_C7000_PATH`` is unset or a tool fails.
    """
    cgt = find_cgt()
    sources = sorted(p for p in codegen_dir.glob("*.c"))
    includes = [codegen_dir]  # the codegen folder carries its headers
    with atomic_dir(out) as tmp:
        commands = []
        objects = []
        for src in sources + [KERNELS_DIR / "c7x_kernels_ref.c"]:
            obj = Path(src.stem + ".obj")  # relative: tools run inside the output folder
            cmd = compile_command(cgt, src, obj, includes)
            commands.append(cmd)
            _run(cmd, spec.name, tmp, src.name)
            if src.parent == codegen_dir:
                objects.append(obj)
        lib = Path(f"lib{spec.name}.lib")
        cmd = archive_command(cgt, lib, objects)
        commands.append(cmd)
        _run(cmd, spec.name, tmp, lib.name)
        (tmp / MEMORY_CMD).write_bytes((codegen_dir / MEMORY_CMD).read_bytes())
        link = link_command(cgt, ["<app objects>", lib.name, MEMORY_CMD, "<app linker.cmd>"], "<firmware>.out")
        # commands with the project's paths taken out (relocatable artifacts); the
        # compiler's own path is the machine's, as the cgt path tracked in the key
        info = {"model": spec.name, "cgt": str(cgt), "commands": [[portable(a) for a in c] for c in commands],
                "library": lib.name, "objects": [o.name for o in objects], "memory_cmd": MEMORY_CMD,
                "link": link}
        write_json(tmp / "build.json", info)
    return info
