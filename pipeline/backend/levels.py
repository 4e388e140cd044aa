"""The staged memory plan: which memory level of the C7x holds each buffer.

The flat plan (:mod:`.memory_plan`) keeps every activation in one DDR arena
and every kernel reads its weights from weights.bin in DDR. The user's
document measures what that costs: the same MMALIB conv takes 1.67M cycles
reading DDR and 477K once its operands are staged in L2 SRAM (docs/estimate.md).
:func:`place` re-places the plan on the target's levels (``[target]``
``l2_sram`` and ``msmc`` sizes, bytes):

- **Activations** (every arena tensor, reshape views with the tensor they
  view): each gets its lifetime (first to last kernel call that touches it)
  and is packed first-fit, shortest-lived first (a tensor written by one call
  and read by the next saves as much DDR traffic as a long-lived one and
  holds L2 for less time; then in order of first use), into the L2 arena,
  else the MSMC arena, else the DDR arena; tensors whose lifetimes overlap never share
  bytes. Offsets are 128-byte aligned (the MMA's activation rows), and the
  L2 arena ends with a 128-byte guard (the streaming engine reads ahead;
  both as docs/memory.md, "The plan", says). So an activation stays in L2 from the call
  that writes it to the last call that reads it, and spills only when it
  does not fit.
- **Weights** stream from weights.bin (DDR) into one of two L2 weight slots
  by DMA: the weights of the j-th staged call go to slot ``j % 2`` and are
  copied while call j-1 runs (double-buffered, so the copy overlaps
  compute). A slot holds the largest set of weights of one call that is at
  most a share of L2 (1/4, 1/8 or 1/16: :data:`SLOT_SHARES`, whichever plan
  reads the fewest bytes from DDR in place, what the document shows is
  slow); a call with more has its weight tensors staged in argument order
  while they fit, and the rest (MobileNetV2's 1280x1000 classifier matrix)
  read in place from DDR.
- **Workspace** (kernels' scratch, :mod:`.emit_c`) is in L2 when it is at
  most an eighth of L2, else in DDR.
- The input and the caller's output buffer are the caller's, in DDR.

- **Reads from DDR** (the model input, an activation that spilled): copied
  by DMA into a free L2 block just before the call that reads it, when one
  is free during that call (:func:`stage_reads`).
- **Tiling.** A conv or one-row FC whose weights exceed a slot is split over
  output channels (:mod:`.tiling`): its weights stream through the two slots
  tile by tile, each copy overlapping the previous tile's call.

- **Fusion.** A conv whose output would spill to DDR only to be streamed back
  by the depthwise conv reading it computes that output tile by tile into the
  L2 slots instead, fused with the depthwise call (:func:`fusable`); the plan
  is then placed again without that tensor, the conv's inputs live until the
  fused call.

Not done yet (docs/memory.md): row tiling of a layer whose *activations*
exceed L2 (they then live in DDR) when no such fusion applies (a depthwise
conv feeding a 1x1 conv needs all channels of a row band). Works on the
:class:`~.memory_plan.Plan` alone (no TVM IR).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .memory_plan import LEVELS, Plan, Tensor

#: byte alignment of activations in every arena (128-byte activation rows: docs/memory.md)
ALIGN = 128
#: bytes left free after the L2 arena: the streaming engine's read-ahead guard (docs/memory.md)
GUARD = 128
#: a weight slot is at most one of these shares of L2; :func:`place` keeps the one whose
#: plan reads the fewest bytes from DDR in place (two slots: half of L2 at most)
SLOT_SHARES = (4, 8, 16)
#: the workspace is placed in L2 when it is at most this share of L2
WORKSPACE_SHARE = 8


class L2TooSmall(ValueError):
    """The target's L2 cannot hold the smallest tile of a call: one output channel of
    its weights in a weight slot (a slot is at most a quarter of L2, :data:`SLOT_SHARES`).
    ``call``: the PrimFunc; ``tile_bytes``: one channel's weights; ``needs``: the smallest
    L2 that holds it, bytes; ``l2``: the size given."""

    def __init__(self, call: str, tile_bytes: int, needs: int, l2: int):
        self.call, self.tile_bytes, self.needs, self.l2 = call, tile_bytes, needs, l2
        super().__init__(f"L2 SRAM of {l2} bytes is too small for {call}: one output channel of its "
                         f"weights is {tile_bytes} bytes, so L2 must be at least {needs} bytes")


@dataclass(frozen=True)
class Budget:
    """Sizes of the on-chip levels, bytes: ``l2`` (L2 SRAM of one C7x core) and
    ``msmc`` (shared L3 SRAM; 0 = none). From the ``[target]`` figures
    ``l2_sram`` and ``msmc`` (pipeline/target/, docs/targets.md)."""

    l2: int
    msmc: int


def default_budget() -> Budget:
    """The default target's sizes (``pipeline.target.DEFAULT_TARGET``, AM67A)."""
    from ..target import load_target

    t = load_target()
    return Budget(l2=int(t.l2_sram_bytes), msmc=int(t.msmc_bytes))


@dataclass
class Levels:
    """Where :func:`place` put everything.

    ``arena``: bytes of the arena of each level (:data:`LEVELS`; 0 = unused);
    ``slot_bytes``: one L2 weight slot (0 = no weight is staged);
    ``workspace_level``: "l2" or "ddr"; ``workspace_bytes``;
    ``staged``: per call (plan order) the weight tensors copied into its slot
    before it runs (the slot is each tensor's ``staged[0]``);
    ``peak``: bytes used per level (L2: arena + guard + 2 slots + workspace
    when there); ``budget``: the :class:`Budget` placed against."""

    budget: Budget
    arena: dict[str, int]
    slot_bytes: int
    workspace_level: str
    workspace_bytes: int
    staged: list[list[Tensor]] = field(default_factory=list)
    tiled: dict[int, int] = field(default_factory=dict)  # call -> output channels per tile (.tiling)
    stage_in: dict[int, list] = field(default_factory=dict)  # call -> [(DDR tensor, its L2 copy)]
    tiled_input: set[int] = field(default_factory=set)  # tiled calls streaming their input (.tiling)
    l2_activations: int = 0  # bytes of L2 left for activations (after slots, guard, workspace)
    in_place_ddr: int = 0  # bytes the kernels read / write in DDR per inference (traffic()["ddr"])

    @property
    def peak(self) -> dict[str, int]:
        """Bytes this plan uses on each level (what must fit the target)."""
        l2 = self.arena["l2"] + (GUARD if self.arena["l2"] else 0) + 2 * self.slot_bytes
        ws = self.workspace_bytes
        return {"l2": l2 + (ws if self.workspace_level == "l2" else 0), "msmc": self.arena["msmc"],
                "ddr": self.arena["ddr"] + (ws if self.workspace_level == "ddr" else 0)}

    def streamed(self, k: int, plan: Plan) -> Tensor:
        """The tensor tiled call ``k`` copies into the slots: its input or its weights."""
        args = plan.calls[k][1]
        args = args[1:] if args[0].home == "slot" else args
        return args[0] if k in self.tiled_input else args[1]

    def dma_of(self, k: int, plan: Plan) -> int:
        """Bytes copied DDR -> L2 by DMA for call ``k`` (its staged weights, or the
        weights of a tiled call, tile by tile)."""
        staged_in = sum(copy.nbytes for _, copy in self.stage_in.get(k, []))
        if k in plan.fused:  # its input tiles are computed in L2, not copied
            return staged_in
        if k in self.tiled:
            return staged_in + self.streamed(k, plan).nbytes
        return staged_in + sum(t.nbytes for t in self.staged[k])


def _align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def _root(plan: Plan, t: Tensor) -> str:
    return plan.views.get(t.name, t.name)


def lifetimes(plan: Plan) -> dict[str, tuple[int, int]]:
    """Root arena tensor name -> (first, last) index of the kernel calls touching it or
    a view of it. A tensor copied into the output after the last call lives to the end."""
    spans: dict[str, list[int]] = {}
    for k, (_, args) in enumerate(plan.calls):
        for t in args:
            if t.home == "arena":
                s = spans.setdefault(_root(plan, t), [k, k])
                s[1] = k
    end = len(plan.calls)
    for _, t in plan.copies():
        if t.home == "arena":
            spans.setdefault(_root(plan, t), [end, end])[1] = end
    for k, j in plan.fused.items():  # a fused conv reads its inputs while call k runs
        for t in plan.calls[j][1]:
            if t.home == "arena" and _root(plan, t) in spans:
                spans[_root(plan, t)][1] = max(spans[_root(plan, t)][1], k)
    return {name: (a, b) for name, (a, b) in spans.items()}


def _first_fit(size: int, span: tuple[int, int], placed: list[tuple[int, int, int, int]],
               capacity: int | None) -> int | None:
    """Lowest aligned offset where ``size`` bytes fit beside the ``placed`` blocks
    ``(offset, size, first, last)`` whose lifetimes overlap ``span``; None if over ``capacity``."""
    busy = sorted((o, o + s) for o, s, a, b in placed if a <= span[1] and span[0] <= b)
    offset = 0
    for lo, hi in busy:
        if offset + size <= lo:
            break
        offset = max(offset, _align(hi))
    return offset if capacity is None or offset + size <= capacity else None


def _tile(plan: Plan, tileable: dict[int, int], wanted: list[int], slot: int) -> dict[int, int]:
    """Call -> output channels per tile, for the tileable calls whose weights exceed a slot
    and whose one output channel fits one; sets their weight tensor's ``tiled``."""
    from .tiling import tile_channels

    out = {}
    for k, (c_out, streams, *_) in tileable.items():
        w = plan.calls[k][1][1]  # the kernels' argument order: in, w, bias, scale, shift, out
        if streams != "weights":
            continue
        if wanted[k] <= slot or w.home != "weight":
            continue
        tc = tile_channels(c_out, w.nbytes // c_out, slot)
        if tc:
            w.tiled = out[k] = tc
    return out


def _stage_weights(plan: Plan, slot_cap: int, tileable: dict[int, int]):
    """Slot size, the weights staged per call, and the tiled calls (module docstring)."""
    wanted = [sum(_align(t.nbytes) for t in args if t.home == "weight") for _, args in plan.calls]
    slot = max([w for w in wanted if w <= slot_cap] + [0])
    if any(wanted[k] > slot for k in tileable):  # a call to tile: give it the largest slot allowed
        slot = slot_cap // ALIGN * ALIGN
    tiled = _tile(plan, tileable, wanted, slot)
    staged, j = [], 0
    for k, (_, args) in enumerate(plan.calls):
        mine, used = [], 0
        for t in args if k not in tiled else []:
            if t.home == "weight" and used + _align(t.nbytes) <= slot:
                t.staged = (j % 2, used)
                used += _align(t.nbytes)
                mine.append(t)
        staged.append(mine)
        j += bool(mine)
    return (slot if any(staged) or tiled else 0), staged, tiled


def place(plan: Plan, budget: Budget, workspace_bytes: int,
          tileable: dict[int, tuple[int, str]] | None = None) -> Levels:
    """:func:`place_with` the slot share of :data:`SLOT_SHARES` whose plan reads the fewest
    bytes from DDR in place (``traffic(plan)["ddr"]``; ties: the larger slot).

    Raises :class:`L2TooSmall` when L2 is not empty but cannot hold the smallest tile of a
    call whose weights must be tiled (:func:`check_smallest_tiles`); an L2 of 0 bytes places
    everything in MSMC / DDR."""
    tileable = tileable or {}
    check_smallest_tiles(plan, budget, tileable)
    plan.fused = {}
    calls, n_tensors = list(plan.calls), len(plan.tensors)
    best = min(SLOT_SHARES, key=lambda share: place_with(plan, budget, workspace_bytes, share,
                                                         tileable).in_place_ddr)
    levels = _place_share(plan, budget, workspace_bytes, best, tileable)
    from .tiling import tile_channels

    pairs = {k: j for k, j in fusable(plan, tileable).items()  # one channel tile must fit a slot
             if tile_channels(tileable[k][0], plan.calls[k][1][0].nbytes // tileable[k][0], levels.slot_bytes)}
    if pairs:  # again, with each fused tensor in the slots and its producer's inputs live longer
        plan.calls, plan.tensors[n_tensors:] = calls, []
        for k in pairs:
            x = plan.calls[k][1][0]
            x.home, x.level, x.offset = "tile", "l2", 0
        plan.fused = pairs
        levels = _place_share(plan, budget, workspace_bytes, best, tileable)
        _fuse(plan, pairs, tileable)
    return levels


def _place_share(plan: Plan, budget: Budget, workspace_bytes: int, share: int,
                 tileable: dict[int, tuple[int, str, str]]) -> Levels:
    """:func:`place_with` one slot share, then :func:`stage_reads` and :func:`tile_inputs`."""
    levels = place_with(plan, budget, workspace_bytes, share, tileable)
    stage_reads(plan)
    tile_inputs(plan, tileable)
    return levels


def check_smallest_tiles(plan: Plan, budget: Budget, tileable: dict[int, tuple[int, str]]) -> None:
    """Raise :class:`L2TooSmall` for the first tileable call (weights streamed) whose one
    output channel of weights exceeds the largest weight slot ``budget.l2 // SLOT_SHARES[0]``
    (rounded down to :data:`ALIGN`); nothing when ``budget.l2`` is 0 (no L2: nothing staged)."""
    if budget.l2 <= 0:
        return
    slot = budget.l2 // SLOT_SHARES[0] // ALIGN * ALIGN
    for k, (c_out, streams, *_) in sorted(tileable.items()):
        w = plan.calls[k][1][1]
        one = w.nbytes // c_out
        if streams == "weights" and w.home == "weight" and one > slot:
            raise L2TooSmall(plan.calls[k][0], one, SLOT_SHARES[0] * _align(one), budget.l2)


def tile_inputs(plan: Plan, tileable: dict[int, tuple[int, str]]) -> None:
    """A call that can stream its input (a depthwise conv, :mod:`.tiling`) and still reads
    it from DDR after :func:`stage_reads` (it did not fit L2 whole) streams it through the
    two L2 slots in channel tiles instead; its weights, if staged, go back to DDR (the
    slots are the input's now). Sets ``plan.levels.tiled[k]`` and ``tiled_input``."""
    from .tiling import tile_channels

    lv = plan.levels
    spans = lifetimes(plan)
    for k, (c_out, streams, *_) in sorted(tileable.items()):
        x = plan.calls[k][1][0]
        if streams != "input" or not lv.slot_bytes or not _reads_ddr(plan, x, spans, k):
            continue
        tc = tile_channels(c_out, x.nbytes // c_out, lv.slot_bytes)
        if not tc:
            continue
        for t in lv.staged[k]:
            t.staged = None
        lv.staged[k] = []
        lv.tiled[k] = tc
        lv.tiled_input.add(k)


def fusable(plan: Plan, tileable: dict[int, tuple[int, str, str]]) -> dict[int, int]:
    """Consumer call -> producer call of the pairs :func:`place` fuses: a conv whose output
    spilled to DDR only to be streamed back, channel tile by channel tile, by the depthwise
    conv that reads it (:func:`tile_inputs`). Fused, the conv computes each tile of output
    channels straight into an L2 slot, where the depthwise conv reads it
    (:func:`.tiling.fused_primfunc`): the tensor never exists whole. A conv's output
    channels are independent (one row of weights each), and so are a depthwise conv's, so
    the result is the same bit for bit. MobileNetV2's 1.2 MB expansion at 112x112 is such
    a tensor.

    A pair qualifies when call ``k`` streams its input ``x`` from DDR, ``x`` (no view of
    it) is written by call ``k - 1`` alone and read by call ``k`` alone, and call ``k - 1``
    is a conv (``tileable`` kind "conv") over the same channels whose weights are not
    tiled."""
    lv = plan.levels
    spans = lifetimes(plan)
    viewed = set(plan.views.values())
    out = {}
    for k in sorted(lv.tiled_input):
        x, j = plan.calls[k][1][0], k - 1
        producer = tileable.get(j)
        if (producer is not None and producer[2] == "conv" and producer[0] == tileable[k][0]
                and j not in lv.tiled and plan.calls[j][1][-1] is x and x.home == "arena"
                and not x.view and x.name not in viewed and spans.get(x.name) == (j, k)):
            out[k] = j
    return out


def _fuse(plan: Plan, pairs: dict[int, int], tileable: dict[int, tuple[int, str, str]]) -> None:
    """Record the fused ``pairs`` (``plan.fused``) on the placed plan: each consumer reads
    its input tiles from the slots (``tiled``, ``tiled_input``); the weights of both calls
    are read in place (the slots hold the tiles)."""
    from .tiling import tile_channels

    lv = plan.levels
    for k, j in sorted(pairs.items()):
        x = plan.calls[k][1][0]
        tc = tile_channels(tileable[k][0], x.nbytes // tileable[k][0], lv.slot_bytes)
        for c in (j, k):
            for t in lv.staged[c]:
                t.staged = None
            lv.staged[c] = []
        lv.tiled[k] = tc
        lv.tiled_input.add(k)
    lv.in_place_ddr = traffic(plan)["ddr"]


def stage_reads(plan: Plan) -> None:
    """Copy by DMA into L2, just before the call, every activation a call reads from DDR
    (the model input, or a tensor spilled to DDR) when an L2 block of its size is free
    during that call: the kernel then reads L2 instead of DDR in place (the document's
    3.5x). In place on ``plan``: a copy tensor (``home`` "arena", level "l2") replaces the
    source in the call's arguments, ``plan.levels.stage_in[k]`` lists (source, copy)
    pairs, and the L2 arena grows if needed (never past the L2 left for activations)."""
    lv = plan.levels
    spans = lifetimes(plan)
    capacity = lv.l2_activations
    placed = [(t.offset, _align(t.nbytes), *spans[t.name]) for t in plan.tensors
              if t.home == "arena" and not t.view and t.level == "l2" and t.name in spans]
    until = {j: k for k, j in plan.fused.items()}  # a fused conv runs inside call k
    for k, (name, args) in enumerate(plan.calls):
        reads = {id(a): a for a in args[:-1] if _reads_ddr(plan, a, spans, k)}  # each tensor once
        for src in reads.values():
            size = _align(src.nbytes)
            span = (k, until.get(k, k))
            offset = _first_fit(size, span, placed, capacity)
            if offset is None:
                continue
            copy = Tensor(f"t{len(plan.tensors)}", src.shape, src.dtype, "arena", offset, level="l2",
                          copy_of=src.name)
            plan.tensors.append(copy)
            placed.append((offset, size, *span))
            args = [copy if a is src else a for a in args]
            lv.stage_in.setdefault(k, []).append((src, copy))
        plan.calls[k] = (name, args)
    lv.arena["l2"] = max([o + n for o, n, _, _ in placed] + [lv.arena["l2"]])


def _reads_ddr(plan: Plan, t: Tensor, spans: dict, k: int) -> bool:
    """``t`` is an activation in DDR that call ``k`` reads: the model input, or an arena
    tensor written before ``k`` (a tensor first touched at ``k`` is its output)."""
    if t.home == "input":
        return True
    return t.home == "arena" and t.level == "ddr" and spans.get(_root(plan, t), (k, k))[0] < k


def place_with(plan: Plan, budget: Budget, workspace_bytes: int, slot_share: int = 4,
               tileable: dict[int, int] | None = None) -> Levels:
    """Place ``plan`` on the levels of ``budget`` (module docstring), in place: sets each
    arena tensor's ``level`` and ``offset`` (bytes into its level's arena), each staged
    weight's ``staged`` (or ``tiled``), and ``plan.levels``. ``workspace_bytes``: the static
    workspace the kernels need (:func:`.emit_c.emit`); ``tileable``: call index -> output
    channels of the calls :mod:`.tiling` can split (their weights are ``args[1]``).
    Returns the :class:`Levels`.

    Raises ValueError for a negative size. A level too small for a tensor is not an
    error: the tensor goes to the next level (DDR holds anything)."""
    if budget.l2 < 0 or budget.msmc < 0:
        raise ValueError(f"memory level sizes must be >= 0 bytes, got L2 {budget.l2}, MSMC {budget.msmc}")
    ws_level = "l2" if 0 < workspace_bytes <= budget.l2 // WORKSPACE_SHARE else "ddr"
    for t in plan.tensors:  # a fresh placement
        t.staged, t.tiled = None, 0
    slot, staged, tiled = _stage_weights(plan, budget.l2 // slot_share, tileable or {})
    l2_free = budget.l2 - 2 * slot - GUARD - (workspace_bytes if ws_level == "l2" else 0)
    capacity = {"l2": max(l2_free, 0), "msmc": budget.msmc, "ddr": None}
    roots = {t.name: t for t in plan.tensors if t.home == "arena" and not t.view}
    placed: dict[str, list] = {lvl: [] for lvl in LEVELS}
    spans = lifetimes(plan)
    for name in sorted(spans, key=lambda n: (spans[n][1] - spans[n][0], spans[n][0], n)):
        t, size = roots[name], _align(roots[name].nbytes)
        for lvl in LEVELS:
            offset = _first_fit(size, spans[name], placed[lvl], capacity[lvl])
            if offset is not None:
                t.level, t.offset = lvl, offset
                placed[lvl].append((offset, size, *spans[name]))
                break
    for t in plan.tensors:  # views follow the tensor they view
        if t.home == "arena" and t.view:
            root = roots[_root(plan, t)]
            t.level, t.offset = root.level, root.offset
    arena = {lvl: max([o + s for o, s, _, _ in placed[lvl]] + [0]) for lvl in LEVELS}
    plan.levels = Levels(budget, arena, slot, ws_level, workspace_bytes, staged, tiled)
    plan.levels.l2_activations = capacity["l2"]
    plan.levels.in_place_ddr = traffic(plan)["ddr"]
    return plan.levels


def traffic(plan: Plan) -> dict[str, int]:
    """Bytes per inference the plan's kernel calls touch at each level (every tensor
    argument whole, at :func:`.memory_plan.level_of`), and ``dma``: bytes copied DDR -> L2.
    DDR traffic = ``ddr + dma``. The instrumented build (``-D<M>_COUNT_TRAFFIC``) counts
    the same four numbers from the addresses model.c really uses."""
    from .memory_plan import level_of

    out = dict.fromkeys((*LEVELS, "dma"), 0)
    for k, (_, args) in enumerate(plan.calls):
        streamed = plan.levels.streamed(k, plan) if plan.levels is not None and k in plan.levels.tiled else None
        for t in args:
            if t.home != "slot":  # a tiled call's L2 slots: where its weights' DMA lands
                out["l2" if t is streamed else level_of(t, plan)] += t.nbytes
        if plan.levels is not None:
            out["dma"] += plan.levels.dma_of(k, plan)
    return out


def memory_map(plan: Plan) -> dict:
    """The build folder's ``memory_map.json``: ``plan`` ("staged" / "flat"), ``budget``
    (bytes of L2 / MSMC placed against, staged only), ``peak`` (bytes used per level),
    ``arena`` (bytes of each level's arena), ``slot_bytes``, ``workspace`` ({level, bytes}),
    ``traffic`` (:func:`traffic`), ``tensors`` (each activation: level, byte offset in its
    arena, bytes, first and last call), ``staged_weights`` (call, tensor, weights.bin
    entry, bytes, slot, offset in the slot), ``staged_reads`` (call, DDR tensor, its L2
    copy, bytes, offset) and ``tiled_calls`` (call, channels per tile, what it streams,
    the streamed tensor and its bytes)."""
    lv = plan.levels
    spans = lifetimes(plan)
    roots = [t for t in plan.tensors if t.home == "arena" and not t.view and t.name in spans]
    tensors = [{"tensor": t.name, "level": t.level if lv else "ddr", "offset": t.offset, "bytes": t.nbytes,
                "first_call": spans[t.name][0], "last_call": spans[t.name][1]} for t in roots]
    out = {"plan": "staged" if lv else "flat", "traffic": traffic(plan), "tensors": tensors}
    if lv is None:
        out.update(peak={"l2": 0, "msmc": 0, "ddr": plan.arena_bytes}, arena={"ddr": plan.arena_bytes},
                   slot_bytes=0, staged_weights=[], staged_reads=[], tiled_calls=[])
        return out
    out.update(budget={"l2": lv.budget.l2, "msmc": lv.budget.msmc}, peak=lv.peak, arena=lv.arena,
               slot_bytes=lv.slot_bytes, workspace={"level": lv.workspace_level, "bytes": lv.workspace_bytes},
               staged_weights=[{"call": k, "tensor": t.name, "entry": t.offset, "bytes": t.nbytes,
                                "slot": t.staged[0], "offset": t.staged[1]}
                               for k, ts in enumerate(lv.staged) for t in ts],
               staged_reads=[{"call": k, "tensor": src.name, "copy": copy.name, "bytes": copy.nbytes,
                              "offset": copy.offset} for k, pairs in sorted(lv.stage_in.items())
                             for src, copy in pairs],
               tiled_calls=[{"call": k, "channels_per_tile": tc, "streams": "input" if k in lv.tiled_input
                             else "weights", "tensor": lv.streamed(k, plan).name,
                             "bytes": lv.streamed(k, plan).nbytes,
                             **({"computed_by_call": plan.fused[k]} if k in plan.fused else {})}
                            for k, tc in sorted(lv.tiled.items())])
    return out
