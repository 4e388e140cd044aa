"""Helpers shared by the codegen tests: compile a module, build it with gcc,
and prove the C equal to the Python reference bit for bit; strict C99
compilation of a codegen folder on its own; the symbols it leaves undefined."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np

from pipeline.backend.compile import compile_model
from pipeline.backend.host import build_host, run_host
from pipeline.backend.interp import run_reference

GCC = shutil.which("gcc")
STRICT = ["-std=c99", "-Wall", "-Wextra", "-Wpedantic", "-Werror"]
# The only warnings TVM's generated tvm_kernels.c may trigger (see test_emit_c).
TVM_SUPPRESS = ["-Wno-unused-variable", "-Wno-unused-parameter"]


def inputs(shape, n: int = 3, seed: int = 5, scale: float = 1.5) -> np.ndarray:
    """``n`` float32 images of the model input ``shape`` ([1, ...]): [n, *shape[1:]]."""
    return (np.random.default_rng(seed).standard_normal((n, *shape[1:])) * scale).astype(np.float32)


def compile_and_compare(mod, name: str, out: Path, x: np.ndarray, *, mmalib: bool, **kw):
    """compile_model -> gcc host build -> host outputs == run_reference bit for bit.
    Returns (compile summary, host outputs [N, ...] float32)."""
    summary = compile_model(mod, name, out, mmalib=mmalib, **kw)
    build_host(out, out / "model.exe")
    c = run_host(out / "model.exe", out, x)
    ref = run_reference(out, x)
    assert c.shape == ref.shape
    np.testing.assert_array_equal(c.view(np.uint32), ref.view(np.uint32))
    return summary, c


def gcc(args, cwd=None) -> tuple[int, str]:
    done = subprocess.run([GCC, *args], capture_output=True, text=True, cwd=cwd)
    return done.returncode, done.stderr


def strict_compile(out: Path, tmp: Path) -> list[Path]:
    """Compile every .c of the codegen folder ``out`` with only ``-I out``:
    model.c / weights_data.c with STRICT, tvm_kernels.c with STRICT +
    TVM_SUPPRESS. Asserts success; returns the object files."""
    objs = []
    for src in sorted(out.glob("*.c")):
        flags = STRICT + (TVM_SUPPRESS if src.name == "tvm_kernels.c" else [])
        obj = tmp / (src.stem + ".o")
        rc, err = gcc([*flags, "-fno-pie", "-I", str(out), "-c", str(src), "-o", str(obj)])
        assert rc == 0, f"{src.name}: {err}"
        objs.append(obj)
    return objs


def libc_symbols() -> set[str]:
    """Names defined by the C library and libm (dynamic symbols)."""
    names = set()
    for lib in ("libc.so.6", "libm.so.6"):
        path = subprocess.run([GCC, f"-print-file-name={lib}"], capture_output=True, text=True).stdout.strip()
        listing = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True).stdout
        names |= {ln.split()[-1].split("@")[0] for ln in listing.splitlines() if ln.strip()}
    return names


def undefined_symbols(objs: list[Path], tmp: Path) -> set[str]:
    """Symbols left undefined by the objects linked together (``ld -r``)."""
    merged = tmp / "merged.o"
    rc, err = gcc(["-r", "-nostdlib", "-o", str(merged), *map(str, objs)])
    assert rc == 0, err
    listing = subprocess.run(["nm", "-u", str(merged)], capture_output=True, text=True).stdout
    return set(listing.split()) - {"U"}
