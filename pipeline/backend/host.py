"""Host build and run of a generated model (gcc), for verification.

:func:`build_host` links the generated ``model.c`` + ``tvm_kernels.c``
(+ ``weights_data.c`` if present), the host reference kernels
(``kernels.hostlib.KERNEL_SOURCES``) and the harness ``kernels/host_main.c``
into one executable, with ``gcc -std=c99 -O2 -ffp-contract=off``: no FMA
contraction, so float results match the interpreter's LLVM build of the same
TIR (:mod:`.interp` checks that LLVM does not contract either).
:func:`run_host` feeds it a batch of images through files. With
:func:`profile_flags` the same build times every kernel call and prints TI's
per-layer profile block per image on stdout (:mod:`.profile_block` reads it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ToolchainError

KERNELS_DIR = Path(__file__).parent / "kernels"
HARNESS = KERNELS_DIR / "host_main.c"
CFLAGS = ("-std=c99", "-O2", "-ffp-contract=off")
_ROUNDING = {"half_up": "C7X_ROUND_HALF_UP", "floor": "C7X_ROUND_FLOOR"}


@dataclass(frozen=True)
class ModelInfo:
    """What model.h says: C name, float32 input/output shapes, weights size."""

    c_name: str
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    weights_bytes: int


def model_info(codegen_dir: Path) -> ModelInfo:
    """Parse ``codegen_dir/model.h`` (written by :mod:`.emit_c`).
    Raises FileNotFoundError / ValueError for a missing or foreign header."""
    text = (Path(codegen_dir) / "model.h").read_text()
    m = re.search(r"^int (\w+)_run\(const uint8_t\* weights", text, flags=re.M)
    if m is None:
        raise ValueError(f"{codegen_dir}/model.h declares no <model>_run entry")
    name, up = m.group(1), m.group(1).upper()

    def shape(role):
        s = re.search(rf"#define {up}_{role}_SHAPE \{{([^}}]*)\}}", text).group(1)
        return tuple(int(d) for d in s.split(","))

    wbytes = int(re.search(rf"#define {up}_WEIGHTS_BYTES (\d+)u", text).group(1))
    return ModelInfo(name, shape("INPUT"), shape("OUTPUT"), wbytes)


def _kernel_sources() -> list[Path]:
    from .kernels.hostlib import KERNEL_SOURCES

    return [Path(p) for p in KERNEL_SOURCES]


def profile_flags(codegen_dir: Path) -> tuple[str, ...]:
    """Extra gcc flags of the per-layer profile build: ``-D<M>_PROFILE_LAYERS``
    for model.c (its timers and ``<m>_print_layer_profile``) and
    ``-DC7X_PROFILE_LAYERS`` for the harness (print one block after every image)."""
    return (f"-D{model_info(codegen_dir).c_name.upper()}_PROFILE_LAYERS", "-DC7X_PROFILE_LAYERS")


def host_command(codegen_dir: Path, exe: Path, rounding: str = "half_up",
                 extra_flags: tuple[str, ...] = ()) -> list[str]:
    """The gcc command line :func:`build_host` runs (gcc resolved on PATH).
    Raises ToolchainError without gcc, ValueError for an unknown rounding."""
    if rounding not in _ROUNDING:
        raise ValueError(f"rounding must be one of {sorted(_ROUNDING)}, not {rounding!r}")
    gcc = shutil.which("gcc")
    if gcc is None:
        raise ToolchainError("gcc not found on PATH: install gcc to build the host verification executable")
    codegen_dir = Path(codegen_dir)
    info = model_info(codegen_dir)
    sources = [codegen_dir / "model.c", codegen_dir / "tvm_kernels.c", HARNESS, *_kernel_sources()]
    defines = [f"-DC7X_ROUNDING={_ROUNDING[rounding]}", f"-DC7X_MODEL={info.c_name}",
               f"-DC7X_MODEL_UC={info.c_name.upper()}"]
    if (codegen_dir / "weights_data.c").exists():
        sources.append(codegen_dir / "weights_data.c")
        defines.append("-DC7X_WEIGHTS_ARRAY")
    # Only the codegen folder on the include path: it holds its own copies of
    # c7x_kernels.h / c7x_tvm_shim.h (the harness and reference kernels find
    # theirs beside them).
    return [gcc, *CFLAGS, *extra_flags, *defines, "-I", str(codegen_dir),
            "-o", str(exe), *map(str, sources), "-lm"]


def build_host(codegen_dir: Path, exe: Path, rounding: str = "half_up",
               extra_flags: tuple[str, ...] = ()) -> None:
    """Compile the model in ``codegen_dir`` into the host executable ``exe``.

    ``rounding``: the kernels' right-shift rounding ("half_up" | "floor",
    ``C7X_ROUNDING`` of c7x_kernels.h). ``extra_flags`` go after CFLAGS (tests
    use them, e.g. ``-DM_WORKSPACE_LIMIT=64``). Raises ToolchainError with one
    line (plus gcc's first error) when gcc is missing or fails.
    """
    cmd = host_command(codegen_dir, exe, rounding, extra_flags)
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        first = next((ln for ln in done.stderr.splitlines() if "error" in ln), done.stderr.strip()[:300])
        raise ToolchainError(f"gcc failed building the host model from {codegen_dir}: {first}")


@dataclass
class HostRun:
    """Outputs of :func:`run_host_timed`: ``outputs`` [N, ...] float32, the
    harness's CPU time per image in ms, and its stdout (the per-layer profile
    blocks of a :func:`profile_flags` build; empty otherwise)."""

    outputs: np.ndarray
    ms_per_image: float
    wall_s: float
    stdout: str = ""


def run_host_timed(exe: Path, codegen_dir: Path, inputs: np.ndarray) -> HostRun:
    """Run ``exe`` on ``inputs`` (float32 [N, C, H, W]: N images of the model's
    [1, C, H, W] input). Returns the outputs stacked on axis 0 ([N, *out[1:]])
    and timings. Raises ToolchainError if the executable fails (its message)."""
    info = model_info(codegen_dir)
    x = np.ascontiguousarray(inputs, dtype=np.float32)
    if x.shape[1:] != info.input_shape[1:] or info.input_shape[0] != 1:
        raise ValueError(f"inputs {x.shape} do not fit the model input {info.input_shape}")
    with tempfile.TemporaryDirectory(prefix="c7x-host-") as tmp:
        src, dst = Path(tmp) / "input.f32", Path(tmp) / "output.f32"
        x.tofile(src)
        weights = "-" if (Path(codegen_dir) / "weights_data.c").exists() else str(Path(codegen_dir) / "weights.bin")
        t0 = time.perf_counter()
        done = subprocess.run([str(exe), weights, str(src), str(len(x)), str(dst)],
                              capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            raise ToolchainError(f"host model {exe} failed (exit {done.returncode}): {done.stderr.strip()}")
        out = np.fromfile(dst, dtype=np.float32)
    ms = float(re.search(r"([\d.]+) ms/image", done.stderr).group(1))
    return HostRun(out.reshape((len(x),) + info.output_shape[1:]), ms, wall, done.stdout)


def run_host(exe: Path, codegen_dir: Path, inputs: np.ndarray) -> np.ndarray:
    """Outputs of the host executable for ``inputs`` (see :func:`run_host_timed`)."""
    return run_host_timed(exe, codegen_dir, inputs).outputs
