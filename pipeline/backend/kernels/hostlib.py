"""Build the host C reference kernels with gcc and call them from Python.

``c7x_kernels_ref.c`` (the host stand-in for TI's MMALIB / C7x kernels, ABI in
``c7x_kernels.h``) is compiled into a shared library once per (source, flags,
compiler) and cached on disk; ctypes then calls each kernel on numpy arrays, so
tests can prove it bit-exact against :mod:`pipeline.backend.kernels.reference`.

The argument lists are read from ``c7x_kernels.h`` itself (:func:`kernel_signatures`),
so the header stays the single source of truth for names, order and types.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.errors import ToolchainError
from pipeline.fsutil import atomic_path

HEADER_NAME = "c7x_kernels.h"
ROUNDINGS = ("half_up", "floor")

# Host flags: C99, no FMA contraction (the requantize kernels and the
# generated code linked with the kernels use float32, and must match numpy).
HOST_CFLAGS = ("-std=c99", "-O3", "-fPIC", "-shared", "-ffp-contract=off")
# What the "compiles cleanly" test and a strict host build add.
WARNING_FLAGS = ("-std=c99", "-Wall", "-Wextra", "-Wpedantic", "-Werror")

_ROUNDING_MACROS = {"half_up": "C7X_ROUND_HALF_UP", "floor": "C7X_ROUND_FLOOR"}

# C element type of a pointer argument -> numpy dtype.
_POINTER_DTYPES = {
    "int8_t": np.dtype(np.int8),
    "uint8_t": np.dtype(np.uint8),
    "int16_t": np.dtype(np.int16),
    "int32_t": np.dtype(np.int32),
    "float": np.dtype(np.float32),
    "int64_t": np.dtype(np.int64),
}


# C type of a scalar argument -> ctypes type (the requantize kernels take float scales).
_SCALAR_CTYPES = {"int32_t": ctypes.c_int32, "float": ctypes.c_float}
DATA_FILES = ("*.c", "*.h")  # the reference kernels it compiles (code_deps.py)


def kernel_source_dir() -> Path:
    """Folder holding ``c7x_kernels.h`` and the host reference ``.c`` files
    (the include directory for a host build of generated code)."""
    return Path(__file__).resolve().parent


KERNEL_SOURCES: list[Path] = [kernel_source_dir() / "c7x_kernels_ref.c"]


def rounding_define(rounding: str = "half_up") -> str:
    """The ``-D`` flag selecting ``C7X_ROUNDING`` (c7x_kernels.h) for ``rounding``
    ("half_up" | "floor"). Raises ``ValueError`` for any other name."""
    if rounding not in _ROUNDING_MACROS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    return f"-DC7X_ROUNDING={_ROUNDING_MACROS[rounding]}"


# --------------------------------------------------------------------------
# The ABI, parsed from the header
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class Param:
    """One kernel parameter: its C name, element type (``int8_t`` ...), whether
    it is a pointer and, for pointers, whether the kernel only reads it."""

    name: str
    ctype: str
    pointer: bool
    const: bool

    @property
    def dtype(self) -> np.dtype:
        """numpy dtype of the pointed-to elements (pointers only)."""
        return _POINTER_DTYPES[self.ctype]


_PROTO = re.compile(r"\bint32_t\s+(\w+)\s*\(([^;{}]*)\)\s*;")
_PARAM = re.compile(r"^(const\s+)?(\w+)\s*(\*)?\s*(\w+)$")


def _parse_param(text: str) -> Param:
    m = _PARAM.match(" ".join(text.split()))
    if m is None:
        raise ValueError(f"cannot parse kernel parameter {text!r} in {HEADER_NAME}")
    const, ctype, star, name = m.groups()
    return Param(name=name, ctype=ctype, pointer=star is not None, const=const is not None)


@functools.lru_cache(maxsize=1)
def kernel_signatures() -> dict[str, tuple[Param, ...]]:
    """Every kernel prototype of ``c7x_kernels.h``: extern name -> parameters in
    order. All kernels return ``int32_t`` (``C7X_OK`` or a ``C7X_ERR_*`` code)."""
    text = (kernel_source_dir() / HEADER_NAME).read_text()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return {name: tuple(_parse_param(p) for p in params.split(","))
            for name, params in _PROTO.findall(text)}


@functools.lru_cache(maxsize=1)
def header_constants() -> dict[str, int]:
    """Integer ``#define``s of ``c7x_kernels.h`` (``C7X_OK``, ``C7X_ERR_*``,
    ``C7X_MAX_*``, rounding ids), for checking the Python twin against them."""
    text = (kernel_source_dir() / HEADER_NAME).read_text()
    pattern = re.compile(r"^#define\s+(C7X_\w+)\s+(?:INT64_C\((-?\d+)\)|(-?\d+))\s*$", re.M)
    return {m.group(1): int(m.group(2) or m.group(3)) for m in pattern.finditer(text)}


# --------------------------------------------------------------------------
# Building the shared library
# --------------------------------------------------------------------------

def _compiler() -> str:
    cc = shutil.which("gcc")
    if cc is None:
        raise ToolchainError("gcc not found on PATH: it is needed to build the host "
                             "reference kernels (install gcc)")
    return cc


@functools.lru_cache(maxsize=None)
def _compiler_id(cc: str) -> str:
    """First line of ``cc --version``: part of the cache key, so a compiler
    upgrade rebuilds the library."""
    out = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0] if out.stdout else cc


def default_cache_dir() -> Path:
    """``$C7X_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/doit-c7x/kernels`` (default
    ``~/.cache``), else a per-user folder in the system temp dir when those are
    not writable."""
    if os.environ.get("C7X_KERNEL_CACHE"):
        return Path(os.environ["C7X_KERNEL_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    preferred = base / "doit-c7x" / "kernels"
    try:
        preferred.mkdir(parents=True, exist_ok=True)
        if os.access(preferred, os.W_OK):
            return preferred
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / f"doit-c7x-kernels-{os.getuid()}"


def _cache_key(cc: str, flags: list[str]) -> str:
    h = hashlib.sha256()
    for path in [kernel_source_dir() / HEADER_NAME, *KERNEL_SOURCES]:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    h.update("\0".join([_compiler_id(cc), *flags]).encode())
    return h.hexdigest()[:20]


def build_library(rounding: str = "half_up", cache_dir: str | os.PathLike | None = None) -> Path:
    """Compile ``KERNEL_SOURCES`` into a shared library and return its path.

    Flags: ``HOST_CFLAGS`` plus ``rounding_define(rounding)``. The file is named
    by a hash of the sources, header, flags and compiler version, so an existing
    file is reused as is; a new one is written atomically (temp file, then
    ``os.replace``), so concurrent builds never see a half-written library.
    Raises ``ToolchainError`` when gcc is missing or fails (its stderr included).
    """
    cc = _compiler()
    flags = [*HOST_CFLAGS, rounding_define(rounding)]
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = folder / f"c7x_kernels_ref-{rounding}-{_cache_key(cc, flags)}.so"
    if target.exists():
        return target
    with atomic_path(target) as tmp:
        cmd = [cc, *flags, "-I", str(kernel_source_dir()), "-o", str(tmp),
               *map(str, KERNEL_SOURCES)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ToolchainError(f"building the host reference kernels failed:\n"
                                 f"{' '.join(cmd)}\n{done.stderr}")
    return target


def kernel_object(flags: list[str] | tuple[str, ...], cache_dir: str | os.PathLike | None = None) -> Path:
    """``KERNEL_SOURCES`` compiled with ``gcc -c`` and ``flags`` into one object file,
    and its path: what every host executable links (:func:`pipeline.backend.host.build_host`).

    Compiling the reference kernels is most of a host build (about 3 s at -O3); the
    object is named, like :func:`build_library`'s file, by a hash of the sources,
    header, flags and compiler version, so it is compiled once per set of flags and
    reused after. Linking it gives the executable one gcc command over the sources
    gives (same flags, same link order). Written atomically. Raises ``ToolchainError``
    when gcc is missing or fails (its stderr included)."""
    if len(KERNEL_SOURCES) != 1:
        raise ValueError("kernel_object compiles one source file")
    cc = _compiler()
    flags = list(flags)
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = folder / f"c7x_kernels_ref-{_cache_key(cc, flags)}.o"
    if target.exists():
        return target
    with atomic_path(target) as tmp:
        cmd = [cc, *flags, "-c", "-o", str(tmp), str(KERNEL_SOURCES[0])]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ToolchainError(f"building the host reference kernels failed:\n{' '.join(cmd)}\n{done.stderr}")
    return target


_LIBS: dict[str, ctypes.CDLL] = {}


def load_kernels(rounding: str = "half_up") -> ctypes.CDLL:
    """The host reference kernels built with ``rounding``, loaded once per process,
    with ``restype`` / ``argtypes`` of every kernel set from ``c7x_kernels.h``."""
    if rounding not in _LIBS:
        lib = ctypes.CDLL(str(build_library(rounding)))
        for name, params in kernel_signatures().items():
            fn = getattr(lib, name)
            fn.restype = ctypes.c_int32
            fn.argtypes = [ctypes.c_void_p if p.pointer else _SCALAR_CTYPES[p.ctype] for p in params]
        _LIBS[rounding] = lib
    return _LIBS[rounding]


# --------------------------------------------------------------------------
# Calling a kernel on numpy arrays
# --------------------------------------------------------------------------

def _pointer_arg(kernel: str, p: Param, value):
    """A C pointer for ``value``: None -> NULL, else a C-contiguous array of the
    parameter's dtype (writeable if the kernel writes it)."""
    if value is None:
        return None
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{kernel}: {p.name} must be a numpy array or None, got {type(value)}")
    if value.dtype != p.dtype:
        raise TypeError(f"{kernel}: {p.name} must have dtype {p.dtype}, got {value.dtype}")
    if not value.flags.c_contiguous:
        raise ValueError(f"{kernel}: {p.name} must be C-contiguous")
    if not p.const and not value.flags.writeable:
        raise ValueError(f"{kernel}: {p.name} is written by the kernel but is read-only")
    return value.ctypes.data


def _int32_arg(kernel: str, p: Param, value) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{kernel}: {p.name} must be an int, got {type(value)}")
    if not -2**31 <= int(value) < 2**31:
        raise ValueError(f"{kernel}: {p.name}={value} does not fit int32")
    return int(value)


def _float_arg(kernel: str, p: Param, value) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{kernel}: {p.name} must be a float, got {type(value)}")
    return float(value)


def _scalar_arg(kernel: str, p: Param, value):
    return _float_arg(kernel, p, value) if p.ctype == "float" else _int32_arg(kernel, p, value)


def call_kernel(name: str, *args, rounding: str = "half_up") -> int:
    """Call host kernel ``name`` exactly like ``catalog.KERNELS[name](*args)``.

    ``args`` follow the C argument list of ``c7x_kernels.h``: numpy arrays (any
    shape, C-contiguous, exact dtype) or None (= NULL) for pointers, Python ints
    for ``int32_t`` scalars, Python floats for ``float`` ones (passed as float32). Output arrays are written in place. Returns the
    kernel's status (``C7X_OK`` = 0 or a ``C7X_ERR_*`` code). Raises ``KeyError``
    for an unknown kernel and ``TypeError`` / ``ValueError`` for arguments the C
    call could not take safely (wrong count, dtype, layout, int32 range).
    """
    params = kernel_signatures()[name]
    if len(args) != len(params):
        raise TypeError(f"{name} takes {len(params)} arguments, got {len(args)}")
    c_args = [_pointer_arg(name, p, v) if p.pointer else _scalar_arg(name, p, v)
              for p, v in zip(params, args)]
    _check_buffer_sizes(name, params, args)
    return int(getattr(load_kernels(rounding), name)(*c_args))


def _check_buffer_sizes(name: str, params: tuple[Param, ...], args) -> None:
    """C cannot check buffer lengths: refuse arrays whose size differs from the
    one the scalar arguments imply, instead of letting the kernel read or write
    out of bounds. (Invalid scalars make the kernel return before any access.)"""
    from pipeline.backend.kernels.catalog import buffer_shapes  # numpy: import late

    shapes = buffer_shapes(name, *args)
    for p, value in zip(params, args):
        if p.pointer and value is not None and p.name in shapes:
            expected = int(np.prod(shapes[p.name]))
            if value.size != expected:
                raise ValueError(f"{name}: {p.name} holds {value.size} elements, the "
                                 f"arguments imply {shapes[p.name]}")
