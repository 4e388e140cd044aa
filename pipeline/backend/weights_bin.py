"""``weights.bin``: the constant tensors of one compiled model, in one blob.

Format (version 1, all integers little-endian)::

    offset  size  field
    0       8     magic  b"C7XWGT\\0\\1"
    8       4     u32 version (= 1)
    12      4     u32 count: number of tensor entries
    16      8     u64 total_size: bytes of the whole file
    24      4     u32 checksum: CRC-32 (IEEE 802.3 / zlib) of bytes [64, total_size)
    28      4     zero
    32      4     u32 table_offset (= 64)
    36      4     u32 entry_size (= 64)
    40      24    zero
    64      64*count  entry table, entry i:
                  0  u64 offset of the data from the file start (multiple of 64)
                  8  u64 nbytes
                  16 u8  DLPack type code (0 int, 1 uint, 2 float)
                  17 u8  bits
                  18 u8  ndim (<= 5)
                  19 5   zero
                  24 i64 shape[5] (unused dims 0)
    ...     data  each tensor C-contiguous at its offset; zero padding up to
                  the next multiple of 64 bytes (DMA / MMALIB alignment).

Integer weights are stored in their own dtype (int8/int16/int32 biases,
uint8 scale/shift): no float copy. The checksum covers the table and the
data, so a truncated or foreign blob is caught (``<model>_check_weights`` in
the generated C). CRC-32 because Python has it at C speed (``zlib.crc32``)
and its bitwise form is a 6-line loop in C99 with no table; it detects
corruption, it is not a cryptographic hash.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np

MAGIC = b"C7XWGT\x00\x01"
VERSION = 1
HEADER_SIZE = 64
ENTRY_SIZE = 64
ALIGN = 64
MAX_NDIM = 5

_DL_CODE = {"i": 0, "u": 1, "f": 2}


def crc32(data: bytes) -> int:
    """CRC-32 of ``data`` as zlib computes it (reflected polynomial 0xEDB88320,
    initial and final XOR 0xFFFFFFFF); the C twin is in the generated model.c."""
    return zlib.crc32(data) & 0xFFFFFFFF


@dataclass(frozen=True)
class Entry:
    """One tensor of the blob: byte ``offset`` from the file start, ``nbytes``,
    numpy ``dtype`` name and ``shape``."""

    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def pack(tensors: list[np.ndarray]) -> tuple[bytes, list[Entry], int]:
    """Serialize ``tensors`` (in order) to the format above.

    Returns ``(blob, entries, checksum)``. Raises ValueError for a tensor
    with more than 5 dimensions or a dtype outside int/uint/float.
    """
    data_start = _align(HEADER_SIZE + ENTRY_SIZE * len(tensors))
    entries, table, offset = [], bytearray(), data_start
    for t in tensors:
        t = np.asarray(t, order="C")
        if t.ndim > MAX_NDIM or t.dtype.kind not in _DL_CODE:
            raise ValueError(f"weights.bin cannot hold a {t.dtype} tensor of shape {t.shape}")
        e = Entry(offset, t.nbytes, str(t.dtype), tuple(int(d) for d in t.shape))
        entries.append(e)
        shape = list(e.shape) + [0] * (MAX_NDIM - t.ndim)
        table += struct.pack("<QQBBB5x5q", e.offset, e.nbytes, _DL_CODE[t.dtype.kind],
                             t.dtype.itemsize * 8, t.ndim, *shape)
        offset = _align(offset + t.nbytes)
    body = bytearray(table)
    body += b"\0" * (data_start - HEADER_SIZE - len(table))
    for t, e in zip(tensors, entries):
        body += np.asarray(t, order="C").tobytes()
        body += b"\0" * (_align(len(body) + HEADER_SIZE) - len(body) - HEADER_SIZE)
    total = HEADER_SIZE + len(body)
    checksum = crc32(bytes(body))
    header = struct.pack("<8sIIQI4xII24x", MAGIC, VERSION, len(tensors), total, checksum,
                         HEADER_SIZE, ENTRY_SIZE)
    return header + bytes(body), entries, checksum


def unpack(blob: bytes, verify: bool = True) -> list[np.ndarray]:
    """Read back the tensors of a blob written by :func:`pack` (read-only views).

    Raises ValueError on a bad magic/version/size, or (``verify``) checksum.
    """
    if len(blob) < HEADER_SIZE:
        raise ValueError("weights.bin: shorter than its header")
    magic, version, count, total, checksum, table_off, entry_size = struct.unpack_from(
        "<8sIIQI4xII", blob, 0)
    if magic != MAGIC or version != VERSION or entry_size != ENTRY_SIZE:
        raise ValueError("weights.bin: bad magic or version")
    if total != len(blob):
        raise ValueError(f"weights.bin: header says {total} bytes, file has {len(blob)}")
    if verify and crc32(blob[HEADER_SIZE:]) != checksum:
        raise ValueError("weights.bin: checksum mismatch")
    out = []
    for i in range(count):
        offset, nbytes, code, bits, ndim, *shape = struct.unpack_from(
            "<QQBBB5x5q", blob, table_off + i * entry_size)
        kind = {v: k for k, v in _DL_CODE.items()}[code]
        dtype = np.dtype(f"{kind}{bits // 8}")
        arr = np.frombuffer(blob, dtype, nbytes // dtype.itemsize, offset)
        out.append(arr.reshape(shape[:ndim]))
    return out
