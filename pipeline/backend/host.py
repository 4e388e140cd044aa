"""Host build and run of a generated model (gcc), for verification.

:func:`build_host` links the generated ``model.c`` + ``tvm_kernels.c``
(+ ``weights_data.c`` if present), the host reference kernels
(``kernels.hostlib.KERNEL_SOURCES``) and the harness ``kernels/host_main.c``
into one executable, with ``gcc -std=c99 -O3 -march=native -ffp-contract=off``: no FMA
contraction, so float results match the interpreter's LLVM build of the same
TIR (:mod:`.interp` checks that LLVM does not contract either).
:func:`run_host` feeds it a batch of images through files. With
:func:`profile_flags` the same build times every kernel call and prints TI's
per-layer profile block per image on stdout (:mod:`.profile_block` reads it).
:func:`start_host` runs an executable in the background (verify overlaps the
host C with its Python work). Every build can dump each kernel call's output
tensor of the first image(s) to a file (``C7X_DUMP``, :func:`read_dump`), for
verify's intermediate-tensor compare: :func:`dump_flags` routes model.c's
calls through wrappers in the harness with ld's ``--wrap`` (GNU ld, gold,
lld), so model.c and the kernels compile exactly as they would without.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ToolchainError

KERNELS_DIR = Path(__file__).parent / "kernels"
HARNESS = KERNELS_DIR / "host_main.c"
DATA_FILES = ("kernels/*.c", "kernels/*.h")  # compiled into every host build (code_deps.py)
# -O3: gcc 12 vectorises the integer conv loops only there; no -ffast-math, so
# float stays IEEE. -march=native: this machine's vector width (both: docs/measuring.md,
# "Figures behind the code"); with
# -ffp-contract=off the FMA units are not used for a*b+c, so every result is
# the one without it. The executable then runs only on a CPU like this one:
# host_build tracks toolchain.host_cpu(), and a SIGILL says to rebuild.
CFLAGS = ("-std=c99", "-O3", "-march=native", "-ffp-contract=off")
_ROUNDING = {"half_up": "C7X_ROUND_HALF_UP", "floor": "C7X_ROUND_FLOOR"}


@dataclass(frozen=True)
class ModelInfo:
    """What model.h says: C name, float32 input/output shapes, weights size.
    ``output_shapes``: every output in return order; ``output_shape`` is the
    one output's shape, or ``(1, <M>_OUTPUT_SIZE)`` (the packed buffer of one
    image) for a model with several outputs."""

    c_name: str
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    weights_bytes: int
    output_shapes: tuple[tuple[int, ...], ...] = ()

    def split(self, packed: np.ndarray) -> list[np.ndarray]:
        """Host outputs [N, ...] (packed per image) -> one [N, *shape[1:]] array per output."""
        from .interp import split_outputs

        return split_outputs(packed, list(self.output_shapes or (self.output_shape,)))


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
    count = re.search(rf"#define {up}_OUTPUT_COUNT (\d+)", text)
    if count is None:
        return ModelInfo(name, shape("INPUT"), shape("OUTPUT"), wbytes, (shape("OUTPUT"),))
    total = int(re.search(rf"#define {up}_OUTPUT_SIZE (\d+)", text).group(1))
    shapes = tuple(shape(f"OUTPUT{i}") for i in range(int(count.group(1))))
    return ModelInfo(name, shape("INPUT"), (1, total), wbytes, shapes)


def _kernel_sources() -> list[Path]:
    from .kernels.hostlib import KERNEL_SOURCES

    return [Path(p) for p in KERNEL_SOURCES]


def profile_flags(codegen_dir: Path) -> tuple[str, ...]:
    """Extra gcc flags of the per-layer profile build: ``-D<M>_PROFILE_LAYERS``
    for model.c (its timers and ``<m>_print_layer_profile``) and
    ``-DC7X_PROFILE_LAYERS`` for the harness (print one block after every image),
    and the traffic count (:func:`traffic_flags`)."""
    return (f"-D{model_info(codegen_dir).c_name.upper()}_PROFILE_LAYERS", "-DC7X_PROFILE_LAYERS",
            *traffic_flags(codegen_dir))


def traffic_flags(codegen_dir: Path) -> tuple[str, ...]:
    """Extra gcc flags of the instrumented build that counts the bytes every kernel call
    touches at each memory level (model.c ``-D<M>_COUNT_TRAFFIC``, harness
    ``-DC7X_COUNT_TRAFFIC``): one ``c7x-traffic`` line per image on stdout (:func:`parse_traffic`)."""
    return (f"-D{model_info(codegen_dir).c_name.upper()}_COUNT_TRAFFIC", "-DC7X_COUNT_TRAFFIC", "-DC7X_COUNT_DMA")


_TRAFFIC = re.compile(r"^c7x-traffic l2=(\d+) msmc=(\d+) ddr=(\d+) dma=(\d+)$", re.M)


def parse_traffic(stdout: str) -> list[dict[str, int]]:
    """The ``c7x-traffic`` lines of an instrumented run, one ``{"l2", "msmc", "ddr", "dma"}``
    (bytes per inference) per image, in order."""
    return [dict(zip(("l2", "msmc", "ddr", "dma"), map(int, m))) for m in _TRAFFIC.findall(stdout)]


def dump_flags(codegen_dir: Path) -> list[str]:
    """gcc flags that make the harness wrap every kernel symbol of model.c
    (:func:`kernel_symbols`): ``-DC7X_DUMP_CALLS``, ``-DC7X_DUMP_SYMBOLS=C7X_WRAP(<sym>) ...``
    and ``-Wl,--wrap=<sym>`` per symbol (host_main.c). None for a model without kernel calls."""
    symbols = kernel_symbols(codegen_dir)
    if not symbols:
        return []
    return ["-DC7X_DUMP_CALLS", "-DC7X_DUMP_SYMBOLS=" + " ".join(f"C7X_WRAP({s})" for s in symbols),
            *(f"-Wl,--wrap={s}" for s in symbols)]


def host_command(codegen_dir: Path, exe: Path, rounding: str = "half_up",
                 extra_flags: tuple[str, ...] = ()) -> list[str]:
    """The gcc command line :func:`build_host` runs (gcc resolved on PATH),
    with :func:`dump_flags`. Raises ToolchainError without gcc, ValueError for
    an unknown rounding."""
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
    return [gcc, *CFLAGS, *extra_flags, *defines, *dump_flags(codegen_dir), "-I", str(codegen_dir),
            "-o", str(exe), *map(str, sources), "-lm"]


def kernel_flags(cmd: list[str]) -> list[str]:
    """The flags of :func:`host_command`'s ``cmd`` that reach the reference kernels: every
    compiler option but the include folders, the link options and the macros, except
    ``C7X_ROUNDING``, the one macro ``c7x_kernels_ref.c`` and ``c7x_kernels.h`` read (they
    include nothing from the codegen folder: their own header is found beside them). So
    one object serves every model (``tests/backend/test_host.py`` checks the executable
    is the one the plain command makes)."""
    out, skip = [], False
    for f in cmd[1:cmd.index("-o")]:
        if skip:
            skip = False
        elif f == "-I":
            skip = True
        elif not f.startswith(("-I", "-Wl,", "-D")) or f.startswith("-DC7X_ROUNDING="):
            out.append(f)
    return out


def _with_kernel_object(cmd: list[str]) -> list[str]:
    """``cmd`` (:func:`host_command`) with the reference kernels' source replaced by
    their object compiled with the same compile flags (:func:`.kernels.hostlib.kernel_object`,
    cached): the same executable, without recompiling the kernels for every build."""
    from .kernels.hostlib import kernel_object
    sources = {str(p) for p in _kernel_sources()}
    obj = str(kernel_object(kernel_flags(cmd)))
    return [obj if a in sources else a for a in cmd]


def build_host(codegen_dir: Path, exe: Path, rounding: str = "half_up",
               extra_flags: tuple[str, ...] = ()) -> None:
    """Compile the model in ``codegen_dir`` into the host executable ``exe``.

    ``rounding``: the kernels' right-shift rounding ("half_up" | "floor",
    ``C7X_ROUNDING`` of c7x_kernels.h). ``extra_flags`` go after CFLAGS (tests
    use them, e.g. ``-DM_WORKSPACE_LIMIT=64``). Raises ToolchainError with one
    line (plus gcc's first error) when gcc is missing or fails.
    """
    cmd = _with_kernel_object(host_command(codegen_dir, exe, rounding, extra_flags))
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        first = next((ln for ln in done.stderr.splitlines() if "error" in ln), done.stderr.strip()[:300])
        raise ToolchainError(f"gcc failed building the host model from {codegen_dir}: {first}")


def build_hosts(jobs: list[tuple[Path, Path, tuple[str, ...]]]) -> None:
    """:func:`build_host` of every (codegen_dir, exe, extra_flags), one gcc per
    job at once (docs/measuring.md, "Figures behind the code"), each exe written
    atomically and made executable. The first failure is raised after the others finish."""
    from concurrent.futures import ThreadPoolExecutor

    from ..fsutil import atomic_path

    def build(codegen_dir: Path, exe: Path, extra: tuple[str, ...]) -> None:
        with atomic_path(exe) as tmp:
            build_host(codegen_dir, tmp, extra_flags=extra)
        exe.chmod(0o755)

    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        done = [pool.submit(build, *job) for job in jobs]
    for f in done:
        f.result()


@dataclass
class HostRun:
    """Outputs of :func:`run_host_timed`: ``outputs`` [N, ...] float32, the
    harness's CPU time per image in ms, and its stdout (the per-layer profile
    blocks of a :func:`profile_flags` build; empty otherwise)."""

    outputs: np.ndarray
    ms_per_image: float
    wall_s: float
    stdout: str = ""


class HostJob:
    """A host executable running in the background on a batch of images
    (:func:`start_host`); :meth:`wait` collects its :class:`HostRun`."""

    def __init__(self, exe: Path, codegen_dir: Path, inputs: np.ndarray, env: dict | None = None):
        info = model_info(codegen_dir)
        x = np.ascontiguousarray(inputs, dtype=np.float32)
        if x.shape[1:] != info.input_shape[1:] or info.input_shape[0] != 1:
            raise ValueError(f"inputs {x.shape} do not fit the model input {info.input_shape}")
        self.exe, self.shape = exe, (len(x),) + info.output_shape[1:]
        self._tmp = tempfile.TemporaryDirectory(prefix="c7x-host-")
        src, self._dst = Path(self._tmp.name) / "input.f32", Path(self._tmp.name) / "output.f32"
        x.tofile(src)
        weights = "-" if (Path(codegen_dir) / "weights_data.c").exists() else str(Path(codegen_dir) / "weights.bin")
        self._t0 = time.perf_counter()
        self._proc = subprocess.Popen([str(exe), weights, str(src), str(len(x)), str(self._dst)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=None if env is None else {**os.environ, **env})

    def wait(self) -> "HostRun":
        """Wait for the run; raises ToolchainError if the executable failed (its message)."""
        try:
            stdout, stderr = self._proc.communicate()
            wall = time.perf_counter() - self._t0
            if self._proc.returncode == -signal.SIGILL:
                raise ToolchainError(f"host model {self.exe} was built for another CPU (gcc -march=native) "
                                     f"and cannot run on this one: re-run its host_build task here")
            if self._proc.returncode != 0:
                raise ToolchainError(f"host model {self.exe} failed (exit {self._proc.returncode}): "
                                     f"{stderr.strip()}")
            out = np.fromfile(self._dst, dtype=np.float32)
        finally:
            self._tmp.cleanup()
        ms = float(re.search(r"([\d.]+) ms/image", stderr).group(1))
        return HostRun(out.reshape(self.shape), ms, wall, stdout)


def start_host(exe: Path, codegen_dir: Path, inputs: np.ndarray, env: dict | None = None) -> HostJob:
    """Start ``exe`` on ``inputs`` (float32 [N, C, H, W]: N images of the model's
    [1, C, H, W] input) in one process and return at once; ``env``: extra
    environment variables (e.g. ``C7X_DUMP`` of a :func:`build_dump_host` build).
    Raises ValueError if the inputs do not fit the model."""
    return HostJob(exe, codegen_dir, inputs, env)


def run_host_timed(exe: Path, codegen_dir: Path, inputs: np.ndarray) -> HostRun:
    """Run ``exe`` on ``inputs`` (float32 [N, C, H, W]: N images of the model's
    [1, C, H, W] input). Returns the outputs stacked on axis 0 ([N, *out[1:]])
    and timings. Raises ToolchainError if the executable fails (its message)."""
    return start_host(exe, codegen_dir, inputs).wait()


def run_host(exe: Path, codegen_dir: Path, inputs: np.ndarray) -> np.ndarray:
    """Outputs of the host executable for ``inputs`` (see :func:`run_host_timed`)."""
    return run_host_timed(exe, codegen_dir, inputs).outputs


# ---------------------------------------------------------------------------
# intermediate tensors: every kernel call's output (C7X_DUMP)
# ---------------------------------------------------------------------------

def kernel_symbols(codegen_dir: Path) -> list[str]:
    """The kernel entry symbols ``__tvm_ffi_<prefix><name>`` model.c declares (sorted)."""
    text = (Path(codegen_dir) / "model.c").read_text()
    return sorted(set(re.findall(r"^int32_t (__tvm_ffi_\w+)\(void\* self", text, flags=re.M)))


def read_dump(path: Path) -> list[tuple[str, bytes]]:
    """The records of a dump file in call order: (kernel symbol, output tensor
    bytes). Raises ValueError for a truncated file."""
    raw, out, i = Path(path).read_bytes(), [], 0
    while i < len(raw):
        if i + 4 > len(raw):
            raise ValueError(f"{path}: truncated dump record at byte {i}")
        (n,) = np.frombuffer(raw, np.int32, 1, i)
        name = raw[i + 4:i + 4 + int(n)].decode()
        i += 4 + int(n)
        (nbytes,) = np.frombuffer(raw, np.int64, 1, i) if i + 8 <= len(raw) else (-1,)
        if nbytes < 0 or i + 8 + int(nbytes) > len(raw):
            raise ValueError(f"{path}: truncated dump record of {name}")
        out.append((name, raw[i + 8:i + 8 + int(nbytes)]))
        i += 8 + int(nbytes)
    return out
