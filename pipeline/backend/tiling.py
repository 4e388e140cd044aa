"""Output-channel tiling of an MMALIB call whose weights (or input) do not fit L2.

A conv (OIHW weights) or an FC with one row (``[N, K]`` weights, M = 1) whose
weights exceed the staged plan's weight slot (:mod:`.levels`) would read them
from DDR in place, measured 3.5x slower than from L2 (docs/memory.md). Such a layer is tiled over output channels, one weight DMA and one
sliced call per tile (docs/memory.md, "The plan"), the copy of tile t+1
overlapping the call on tile t.

:func:`tiled_primfunc` rewrites the call's offload PrimFunc: a first
parameter ``scratch`` (the two L2 weight slots, model.c's ``<m>_wslot``) and
a body of, per tile t of ``tc`` output channels::

    c7x_dma_wait();                                  # tile t is in slot t % 2
    c7x_dma_copy(&scratch[(t+1) % 2], &w[c0 + tc], bytes of tile t+1)   (if any)
    <kernel>(x, &scratch[t % 2], &bias[c0], &scale[c0], &shift[c0], &out[c0], ..., C_out = tc, ...)

after one ``c7x_dma_copy`` of tile 0. A depthwise conv whose *input* was
spilled to DDR streams that input the same way (its channels are
independent too), its small weights read in place; so does an elementwise
kernel (the requantize of a mixed-precision boundary), in runs of elements.
Output channels (and elements) are independent, so
the result equals the untiled call bit for bit: ``lowered.py`` (the Python
reference) keeps the untiled call, and every host build compares the tiled C
with it. :func:`fused_primfunc` goes one step further for a conv whose output
such a depthwise conv streams: the conv writes each tile straight into a slot
(no DMA, the tensor never exists whole). ``c7x_dma_copy`` / ``c7x_dma_wait`` are in ``c7x_memory.h``
(memcpy on the host; the SoC's DMA through the hook macros there).
"""

from __future__ import annotations

import math
import numpy as np
from tvm import tirx

from .kernels.catalog import CATALOG, Tileable
from .passes.primfunc import backend_of

DMA_COPY, DMA_WAIT = "c7x_dma_copy", "c7x_dma_wait"


#: kernels tiled over output channels: their catalog records' ``tiling``
TILEABLE: dict[str, Tileable] = {name: k.tiling for name, k in CATALOG.items() if k.tiling is not None}


def _extern(func: tirx.PrimFunc):
    call = func.body.value
    return str(call.args[0].value), list(call.args[1:])


def channels(func: tirx.PrimFunc) -> tuple[int, str, str] | None:
    """``(output channels, what the tiles stream: "weights" / "input", the kernel's
    :class:`Tileable` kind)`` of a tileable offload PrimFunc, or None when its kernel is not
    in :data:`TILEABLE` (or an FC with more than one row)."""
    kernel = str(func.attrs["c7x_kernel"]) if func.attrs and "c7x_kernel" in func.attrs else None
    spec = TILEABLE.get(kernel)
    if spec is None:
        return None
    scalars = _extern(func)[1][spec.pointers:]
    if spec.rows is not None and int(scalars[spec.rows].value) != 1:
        return None
    return int(scalars[spec.c_out[0]].value), spec.streams, spec.kind


def tile_channels(c_out: int, per_channel_bytes: int, slot_bytes: int) -> int:
    """Channels per tile: as many as one slot holds, rounded down to a multiple of 32
    (the MMA's width: docs/memory.md) when at least 32 fit; 0 when not even one fits."""
    tc = min(c_out, slot_bytes // max(per_channel_bytes, 1))
    return tc // 32 * 32 if tc >= 32 and tc < c_out else tc


def _addr(buf, index: list[int]):
    return tirx.address_of(tirx.BufferLoad(buf, [tirx.IntImm("int32", i) for i in index]))


def _at_channel(buf, c0: int, per_channel: int, kind: str) -> list[int]:
    """Index of output channel ``c0`` in a buffer of the call: a per-channel vector
    ``[C]`` (or a depthwise's flat weights, ``per_channel`` elements each), weights
    (OIHW or ``[N, K]``: channel first), an NCHW activation (axis 1), an FC output
    ``[..., N]`` with one row (the last axis)."""
    ndim = len(buf.shape)
    if ndim == 1:
        return [c0 * per_channel]
    if buf.name in ("out", "data"):
        return [0] * (ndim - 1) + [c0] if kind == "fc" else [0, c0, 0, 0]
    return [c0] + [0] * (ndim - 1)


def tiled_primfunc(func: tirx.PrimFunc, tc: int, slot_elems: int) -> tirx.PrimFunc:
    """``func`` (a tileable offload PrimFunc) over tiles of ``tc`` output channels, the
    streamed operand (weights, or a depthwise's input) copied into a ``scratch``
    parameter of ``2 * slot_elems`` elements (module docstring). Raises ValueError if a
    tile does not fit a slot."""
    kernel, args = _extern(func)
    spec = TILEABLE[kernel]
    scalars = args[spec.pointers:]
    count = int(scalars[spec.c_out[0]].value)

    def tile_scalars(n: int) -> list:
        return [tirx.IntImm("int32", n) if i in spec.c_out else a for i, a in enumerate(scalars)]

    if spec.kind == "elementwise":  # (in, out, n, ...): runs of elements, in -> the slots
        x, out = func.params

        def at_element(buf, e0):
            return _addr(buf, [int(i) for i in np.unravel_index(e0, [int(d) for d in buf.shape])])

        return _double_buffered(func, kernel, x, count, tc, slot_elems, 1, at_element,
                                lambda slot, e0, n: [slot, at_element(out, e0), *tile_scalars(n)])
    x, w, bias, scale, shift, out = func.params
    streamed = x if spec.streams == "input" else w
    per_channel = math.prod(int(d) for d in streamed.shape[1 if spec.streams == "weights" else 2:])
    w_per_channel = math.prod(int(d) for d in w.shape) // count

    def at(buf, c0):
        return _addr(buf, _at_channel(buf, c0, w_per_channel if buf is w else 1, spec.kind))

    def operands(slot, c0, n):
        first = (slot, at(w, c0)) if spec.streams == "input" else (x.data, slot)
        return [*first, *(at(b, c0) for b in (bias, scale, shift)), at(out, c0), *tile_scalars(n)]

    return _double_buffered(func, kernel, streamed, count, tc, slot_elems, per_channel, at, operands)


def _double_buffered(func: tirx.PrimFunc, kernel: str, streamed, count: int, tc: int, slot_elems: int,
                     unit: int, at, operands) -> tirx.PrimFunc:
    """``func`` over tiles of ``tc`` of its ``count`` units (channels, or elements), each
    ``unit`` elements of ``streamed``: tile t+1 is copied into slot (t+1) % 2 while the
    kernel runs on tile t (module docstring). ``at(buf, c0)``: the address of unit ``c0`` of
    ``buf``; ``operands(slot, c0, n)``: the kernel's arguments for the tile of ``n`` units at
    ``c0``. Raises ValueError if a tile does not fit a slot."""
    if tc * unit > slot_elems or tc < 1:
        raise ValueError(f"{kernel}: a tile of {tc} x {unit} elements does not fit {slot_elems} elements")
    scratch = tirx.decl_buffer((2 * slot_elems,), streamed.dtype, "scratch")
    itemsize = np.dtype(str(streamed.dtype)).itemsize
    tiles = [(c0, min(tc, count - c0)) for c0 in range(0, count, tc)]

    def slot(t: int):
        return _addr(scratch, [(t % 2) * slot_elems])

    def copy(t: int):
        c0, n = tiles[t]
        return tirx.Evaluate(tirx.call_extern("int32", DMA_COPY, slot(t), at(streamed, c0),
                                              tirx.IntImm("int32", n * unit * itemsize)))

    stmts = [copy(0)]
    for t, (c0, n) in enumerate(tiles):
        stmts.append(tirx.Evaluate(tirx.call_extern("int32", DMA_WAIT)))
        if t + 1 < len(tiles):
            stmts.append(copy(t + 1))
        stmts.append(tirx.Evaluate(tirx.call_extern("int32", kernel, *operands(slot(t), c0, n))))
    return tirx.PrimFunc([scratch, *func.params], tirx.SeqStmt(stmts)).with_attrs(
        {"c7x_kernel": kernel, "c7x_offload_backend": backend_of(kernel), "c7x_tiles": len(tiles)})


def fused_primfunc(producer: tirx.PrimFunc, consumer: tirx.PrimFunc, tc: int, slot_elems: int) -> tirx.PrimFunc:
    """A conv ``producer`` fused into the depthwise ``consumer`` that reads its output
    (:func:`.levels.fusable`): per tile t of ``tc`` channels, the producer computes
    output channels ``[c0, c0 + n)`` straight into L2 slot ``t % 2`` (its weights, bias,
    scale and shift at channel ``c0``, ``C_out = n``) and the consumer reads that slot as
    its input (``C = n``). No DMA: the tensor between them never leaves L2.

    Parameters: ``scratch`` (the two slots, ``2 * slot_elems`` elements of the tensor's
    dtype), the producer's ``x, w, bias, scale, shift``, then the consumer's ``w, bias,
    scale, shift, out``. Raises ValueError if a tile does not fit a slot."""
    a_kernel, a_args = _extern(producer)
    b_kernel, b_args = _extern(consumer)
    a_spec, b_spec = TILEABLE[a_kernel], TILEABLE[b_kernel]
    a_scalars, b_scalars = a_args[a_spec.pointers:], b_args[b_spec.pointers:]
    count = int(b_scalars[b_spec.c_out[0]].value)
    ax, aw, abias, ascale, ashift, aout = (_renamed(b, "p_" + b.name) for b in producer.params)
    _, bw, bbias, bscale, bshift, bout = consumer.params
    per_channel = math.prod(int(d) for d in aout.shape[2:])
    if tc * per_channel > slot_elems or tc < 1:
        raise ValueError(f"{a_kernel} -> {b_kernel}: a tile of {tc} x {per_channel} elements does not "
                         f"fit {slot_elems} elements")
    scratch = tirx.decl_buffer((2 * slot_elems,), aout.dtype, "scratch")
    aw_per = math.prod(int(d) for d in aw.shape) // count
    bw_per = math.prod(int(d) for d in bw.shape) // count

    def n_scalars(spec, scalars, n):
        return [tirx.IntImm("int32", n) if i in spec.c_out else a for i, a in enumerate(scalars)]

    stmts = []
    for t, c0 in enumerate(range(0, count, tc)):
        n = min(tc, count - c0)
        slot = _addr(scratch, [(t % 2) * slot_elems])
        stmts.append(tirx.Evaluate(tirx.call_extern(
            "int32", a_kernel, ax.data, _addr(aw, _at_channel(aw, c0, aw_per, "conv")),
            *(_addr(b, _at_channel(b, c0, 1, "conv")) for b in (abias, ascale, ashift)), slot, *n_scalars(a_spec, a_scalars, n))))
        stmts.append(tirx.Evaluate(tirx.call_extern(
            "int32", b_kernel, slot, _addr(bw, _at_channel(bw, c0, bw_per, b_spec.kind)),
            *(_addr(b, _at_channel(b, c0, 1, b_spec.kind)) for b in (bbias, bscale, bshift)), _addr(bout, _at_channel(bout, c0, 1, b_spec.kind)),
            *n_scalars(b_spec, b_scalars, n))))
    params = [scratch, ax, aw, abias, ascale, ashift, bw, bbias, bscale, bshift, bout]
    return tirx.PrimFunc(params, tirx.SeqStmt(stmts)).with_attrs(
        {"c7x_kernel": b_kernel, "c7x_offload_backend": backend_of(b_kernel),
         "c7x_fused_producer": a_kernel, "c7x_tiles": len(range(0, count, tc))})


def _renamed(buf, name: str):
    """A buffer like ``buf`` (shape, dtype) named ``name``: the fused PrimFunc's two sets of
    parameters must not share C names."""
    return tirx.decl_buffer(buf.shape, buf.dtype, name)
