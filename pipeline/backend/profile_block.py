"""TI's per-layer profile block (``-profile-layers``): format, parse, match to a build.

The block, as TI's ``TVMPrintLayerProfile`` prints it and as ``model.c``
built with ``-D<M>_PROFILE_LAYERS`` prints it (``<m>_print_layer_profile``)::

    (empty line)
    ===== TVM Layer Profile =====
    [  0] __tvm_ffi_tiny_quantize                  1234 cycles
    [  1] __tvm_ffi_tiny_mmalib_conv2d_i8_0        56789 cycles
    -----------------------------
    Total: 58023 cycles (2 layers)
    =============================

One block per inference: in a log of several runs the first block includes
initialisation (cold caches, first touch of the arena), the last is steady
state. The counts are C7x cycles on the board and nanoseconds on the host
(the block says "cycles" either way, so one parser reads both).

:func:`parse_blocks` finds every block in a text (other printf lines around
and between the layer lines, ``\\r\\n`` line ends, line prefixes such as a
logger's timestamp, thousands separators in the counts); :func:`match_calls`
checks a block against the calls of a build (``manifest.json`` ``calls``).
Plain Python: no torch, no tvm.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import PipelineError

HEADER = "===== TVM Layer Profile ====="
RULE = "-" * 29
FOOTER = "=" * 29

_LAYER = re.compile(r"\[\s*(\d+)\]\s+(\S+)\s+(\d[\d,]*)\s+cycles\s*$")
_TOTAL = re.compile(r"Total:\s+(\d[\d,]*)\s+cycles\s+\((\d+)\s+layers?\)")


class ProfileLogError(PipelineError):
    """A profile log holds no block, a malformed one, or one of another build."""


@dataclass(frozen=True)
class ProfileBlock:
    """One ``===== TVM Layer Profile =====`` block: layer ``names`` and
    ``counts`` in index order; ``line``: 1-based line of its header in the text."""

    names: tuple[str, ...]
    counts: tuple[int, ...]
    line: int = field(default=0, compare=False)  # where it was found is not part of its value

    @property
    def total(self) -> int:
        return sum(self.counts)


def format_block(names, counts) -> str:
    """The text ``<m>_print_layer_profile()`` prints for these layers (byte for
    byte, with TI's printf formats: ``"[%3d] %-40s %llu cycles"``)."""
    names, counts = list(names), [int(c) for c in counts]
    if len(names) != len(counts):
        raise ValueError(f"{len(names)} names but {len(counts)} counts")
    lines = ["", HEADER]
    lines += [f"[{i:3d}] {n:<40s} {c} cycles" for i, (n, c) in enumerate(zip(names, counts))]
    lines += [RULE, f"Total: {sum(counts)} cycles ({len(counts)} layers)", FOOTER]
    return "\n".join(lines) + "\n"


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def parse_blocks(text: str, source: str = "<text>") -> list[ProfileBlock]:
    """Every profile block in ``text``, in order (empty list if there is none).

    Lines between a header and its ``Total:`` line that are not layer lines
    are skipped as log noise. Raises :class:`ProfileLogError` naming
    ``source`` and the line for a block that is cut off (no ``Total:`` line
    before the next header or the end), whose layer indices do not run 0, 1,
    2..., or whose ``Total:`` line disagrees with its layers.
    """
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    blocks: list[ProfileBlock] = []
    start = None  # 1-based line of the open block's header
    names: list[str] = []
    counts: list[int] = []
    for no, line in enumerate(lines, 1):
        if HEADER in line:
            if start is not None:
                raise ProfileLogError(f"{source}: line {start}: profile block cut off (a new block starts "
                                      f"at line {no} before its 'Total:' line); use a complete log")
            start, names, counts = no, [], []
            continue
        if start is None:
            continue
        total = _TOTAL.search(line)
        if total:
            n, layers = _int(total.group(1)), int(total.group(2))
            if layers != len(counts) or n != sum(counts):
                raise ProfileLogError(
                    f"{source}: line {no}: 'Total: {n} cycles ({layers} layers)' does not match the "
                    f"{len(counts)} layer lines above it (sum {sum(counts)}) of the block at line {start}; "
                    f"the log lost lines: use a complete log")
            blocks.append(ProfileBlock(tuple(names), tuple(counts), start))
            start = None
            continue
        layer = _LAYER.search(line)
        if layer:
            index = int(layer.group(1))
            if index != len(counts):
                raise ProfileLogError(f"{source}: line {no}: layer [{index}] where [{len(counts)}] was expected "
                                      f"(block at line {start}); the log lost or mixed lines: use a complete log")
            names.append(layer.group(2))
            counts.append(_int(layer.group(3)))
    if start is not None:
        raise ProfileLogError(f"{source}: line {start}: the last profile block has no 'Total:' line "
                              f"(the log is cut off); use a complete log")
    return blocks


def read_blocks(path: Path) -> list[ProfileBlock]:
    """The blocks of the log file ``path``; raises :class:`ProfileLogError` naming
    the file when it is unreadable or holds no block."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError as e:
        raise ProfileLogError(f"{path}: cannot read the profile log ({e.strerror})") from None
    blocks = parse_blocks(text, str(path))
    if not blocks:
        raise ProfileLogError(f"{path}: no '{HEADER}' block; paste the output of a run built with "
                              f"-D<M>_PROFILE_LAYERS that called <m>_print_layer_profile()")
    return blocks


def call_symbol(c_name: str, func: str) -> str:
    """The name a block gives a call: its C symbol ``__tvm_ffi_<c_name>_<func>``."""
    return f"__tvm_ffi_{c_name}_{func}"


def match_calls(block: ProfileBlock, calls: list[dict], c_name: str, source: str, fix: str) -> None:
    """Check that ``block`` times exactly ``calls`` (``manifest.json`` ``calls`` of
    the build whose C symbols start with ``c_name``): same count and, call by
    call, the C symbol (or TI's unprefixed ``__tvm_ffi_<func>``). Raises
    :class:`ProfileLogError` with one line naming ``source`` and ending in ``fix``."""
    if len(block.counts) != len(calls):
        raise ProfileLogError(f"{source}: line {block.line}: the block has {len(block.counts)} layers but the "
                              f"build makes {len(calls)} kernel calls; {fix}")
    for call, name in zip(calls, block.names):
        if name not in (call_symbol(c_name, call["func"]), f"__tvm_ffi_{call['func']}"):
            raise ProfileLogError(f"{source}: line {block.line}: layer [{call['index']}] is {name}, the build's "
                                  f"call {call['index']} is {call_symbol(c_name, call['func'])}; {fix}")
