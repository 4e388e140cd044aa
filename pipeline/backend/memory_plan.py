"""The static memory plan of the lowered ``main``, in C terms.

:func:`plan_main` flattens the lowered ``main`` (after TVM's
``StaticPlanBlockMemory``) into a :class:`Plan`: one :class:`Tensor` per
DLTensor of the entry point (model input, a slot of the caller's output
buffer, a slice of the one activation arena, each storage at a 64-byte
aligned offset, or a weights.bin entry), the kernel calls in ``main``'s
order, and the distinct constants (equal contents share one weights.bin
entry, :func:`const_key`).
:func:`call_counts` counts the calls by backend. The emitter (:mod:`.emit_c`)
prints the plan as model.c; the writer of ``lowered.py`` (:mod:`.interp`)
names the constants after the plan's weights.bin entries.

Several outputs (a tuple return) are packed back to back in the caller's
buffer in return order: output ``i`` starts at float element
``Plan.output_offsets[i]``. A returned tensor TVM left unplanned
(``builtin.alloc_tensor``) is written by its kernel straight into its slot,
and a later call reading it reads it there; any other returned tensor (the
same tensor returned twice, the model input, a weight, a tensor of the
arena) is copied into its slot after the last call (:meth:`Plan.copies`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax
from tvm.ir import GenericConst

from ..errors import UnsupportedOpError
from .lower import is_offload

ARENA_ALIGN = 64


@dataclass
class Tensor:
    """A DLTensor of the entry point. ``home``: "input", "output" (``offset`` =
    float32 element offset in the caller's packed output buffer), "arena"
    (``offset`` = byte offset in the arena) or "weight" (``offset`` = entry
    index). ``view``: True for a reshape view of another tensor. ``level``: the
    memory holding it on the C7x (:data:`LEVELS`; "arena" tensors: which
    level's arena ``offset`` is in). ``staged``: for a weight copied by DMA
    into an L2 weight slot before its call, ``(slot, byte offset in the slot)``
    (:mod:`.levels`). ``tiled``: for the weights of a call tiled over output
    channels, the channels per tile (:mod:`.tiling`); ``home`` "slot" is the two
    L2 weight slots handed to such a call."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    home: str
    offset: int
    view: bool = False
    level: str = "ddr"
    staged: tuple[int, int] | None = None
    tiled: int = 0  # weights copied into L2 tile by tile: output channels per tile (.tiling)
    copy_of: str | None = None  # an L2 copy, made by DMA before its call, of this DDR tensor (.levels)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor: shape x dtype size."""
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass
class Plan:
    """The lowered ``main`` flattened: tensors, kernel calls, weights.
    ``outputs``: the returned tensors in return order, ``output_offsets``:
    where each starts in the packed output buffer (float32 elements);
    ``output`` is ``outputs[0]``."""

    input: Tensor
    output: Tensor
    arena_bytes: int
    outputs: list[Tensor] = field(default_factory=list)
    output_offsets: list[int] = field(default_factory=list)
    tensors: list[Tensor] = field(default_factory=list)
    calls: list[tuple[str, list[Tensor]]] = field(default_factory=list)
    weights: list[np.ndarray] = field(default_factory=list)
    weight_keys: dict = field(default_factory=dict)  # content key -> weights.bin entry
    # For the call graph (not the emitter): binding names given to each tensor,
    # and the tensor a reshape view reads.
    aliases: dict[str, list[str]] = field(default_factory=dict)
    views: dict[str, str] = field(default_factory=dict)
    # The placement on the C7x's memory levels (:func:`.levels.place`); None = flat
    # (everything in DDR, one arena laid out by TVM).
    levels: "object | None" = None
    # consumer call -> the conv fused into it (:func:`.levels.place`): that conv runs tile by
    # tile inside the consumer call, so its inputs live until then
    fused: dict[int, int] = field(default_factory=dict)

    def copies(self) -> list[tuple[int, Tensor]]:
        """``(i, tensor)`` of the outputs not written in place: their slot is filled by a
        copy after the last call (see the module docstring)."""
        return [(i, t) for i, (t, off) in enumerate(zip(self.outputs, self.output_offsets))
                if not (t.home == "output" and t.offset == off)]

    def output_size(self, i: int) -> int:
        """Float32 elements of output ``i``."""
        return int(np.prod(self.outputs[i].shape))


#: Memory levels of the C7x, fastest first (``[target]`` sizes: pipeline/target/).
LEVELS = ("l2", "msmc", "ddr")


def level_of(t: Tensor, plan: Plan) -> str:
    """Memory level a kernel reads or writes ``t`` at on the C7x: one of :data:`LEVELS`.

    The flat plan (``plan.levels`` None) keeps everything in DDR. The staged plan
    (:func:`.levels.place`) puts activations in the L2 / MSMC / DDR arena it chose
    and a staged weight in its L2 slot (copied there from weights.bin in DDR by
    DMA: :meth:`.levels.Levels.dma_of`). The input and the caller's output buffer
    are in DDR. The performance estimate (:mod:`pipeline.perf`) reads each call's
    bytes per level from here, and the instrumented build counts the same."""
    if t.home == "weight":
        return "l2" if t.staged is not None or t.tiled else "ddr"
    return t.level


def const_key(const: GenericConst) -> tuple[np.ndarray, tuple]:
    """``(value, key)`` of a constant; equal contents give equal keys, so one
    weights.bin entry serves every copy of a constant."""
    value = np.asarray(const.value.numpy(), order="C")
    return value, (str(value.dtype), value.shape, value.tobytes())


def _static_shape(ty) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in ty.shape.values)
    except (TypeError, AttributeError):
        raise UnsupportedOpError(f"dynamic or unknown shape {ty}: only static shapes are supported") from None


def _int(v) -> int:
    return int(v.value) if hasattr(v, "value") else int(v)


class _Planner:
    def __init__(self, main):
        self.main = main
        self.plan = None
        self.env: dict = {}  # relax.Var -> Tensor | list[Tensor] | ("storage", offset)
        self.arena = 0

    def tensor(self, ty, home: str, offset: int, view: bool = False) -> Tensor:
        t = Tensor(f"t{len(self.plan.tensors)}", _static_shape(ty), str(ty.dtype), home, offset, view)
        self.plan.tensors.append(t)
        return t

    def arena_alloc(self, nbytes: int) -> int:
        off = self.arena
        self.arena = (off + nbytes + ARENA_ALIGN - 1) // ARENA_ALIGN * ARENA_ALIGN
        return off

    def weight(self, const: GenericConst) -> Tensor:
        value, key = const_key(const)
        keys = self.plan.weight_keys
        if key not in keys:
            keys[key] = len(self.plan.weights)
            self.plan.weights.append(value)
        return self.tensor(const.ty, "weight", keys[key])

    def arg(self, expr):
        if isinstance(expr, GenericConst):
            return self.weight(expr)
        if isinstance(expr, relax.Var) and expr in self.env:
            return self.env[expr]
        raise UnsupportedOpError(f"kernel argument {expr} is neither a tensor nor a constant")

    def run(self) -> Plan:
        self.plan = Plan(input=None, output=None, arena_bytes=0)
        self.plan.input = self.input()
        for block in self.main.body.blocks:
            for b in block.bindings:
                self.bind(b.var, b.value)
        self.plan.outputs = self.outputs()
        self.plan.output = self.plan.outputs[0]
        self.place_outputs()
        self.plan.arena_bytes = max(self.arena, ARENA_ALIGN)
        return self.plan

    def input(self) -> Tensor:
        """The one float32 parameter of main."""
        params = self.main.params
        if len(params) != 1:
            raise UnsupportedOpError(f"main takes {len(params)} parameters; expected only the model input")
        x = params[0]
        if str(x.ty.dtype) != "float32":
            raise UnsupportedOpError(f"model input is {x.ty.dtype}; expected float32")
        self.env[x] = self.tensor(x.ty, "input", 0)
        return self.env[x]

    def outputs(self) -> list[Tensor]:
        """The float32 tensors main returns (one, or a flat tuple of them)."""
        ret = self.main.body.body
        out = self.env.get(ret) if isinstance(ret, relax.Var) else None
        out = out if isinstance(out, list) else [out]
        if not out or not all(isinstance(t, Tensor) and t.dtype == "float32" for t in out):
            raise UnsupportedOpError("the model must return float32 tensors (one, or a flat tuple)")
        return out

    def place_outputs(self) -> None:
        """Give each output its slot: ``output_offsets`` back to back; the unplanned
        tensor behind output ``i`` (and every view of it) moves to that offset unless
        an earlier output already holds it (then :meth:`Plan.copies` copies it)."""
        plan, off, placed = self.plan, 0, set()
        for t in plan.outputs:
            plan.output_offsets.append(off)
            root = plan.views.get(t.name, t.name)
            if t.home == "output" and root not in placed:
                placed.add(root)
                for other in plan.tensors:
                    if other.home == "output" and plan.views.get(other.name, other.name) == root:
                        other.offset = off
            off += int(np.prod(t.shape))

    def bind(self, var, value):
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
            self.builtin(var, value)
        elif isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar):
            self.plan.calls.append((value.op.name_hint, [self.arg(a) for a in value.args]))
        elif isinstance(value, relax.Var):
            self.env[var] = self.env[value]
            if isinstance(self.env[var], Tensor):
                self.plan.aliases.setdefault(self.env[var].name, []).append(var.name)
        elif isinstance(value, relax.Tuple):
            self.env[var] = [self.arg(v) for v in value.fields]
        elif isinstance(value, relax.TupleGetItem):
            self.env[var] = self.env[value.tuple_value][value.index]
        else:
            raise UnsupportedOpError(f"unexpected binding in lowered main: {type(value).__name__}")

    def builtin(self, var, call):
        op = call.op.name
        if op == "relax.memory.alloc_storage":
            nbytes = _int(call.args[0].values[0])
            self.env[var] = ("storage", self.arena_alloc(nbytes))
        elif op == "relax.memory.alloc_tensor":
            _, base = self.env[call.args[0]]
            self.env[var] = self.tensor(var.ty, "arena", base + _int(call.args[1]))
        elif op == "relax.builtin.alloc_tensor":
            # Not planned by TVM: the graph output. Written straight into the
            # caller's buffer if it is what main returns (decided at the end).
            self.env[var] = self.tensor(var.ty, "output", 0)
        elif op == "relax.reshape":
            src = self.arg(call.args[0])
            self.env[var] = self.tensor(var.ty, src.home, src.offset, view=True)
            self.plan.views[self.env[var].name] = self.plan.views.get(src.name, src.name)
            self.plan.aliases.setdefault(self.env[var].name, []).append(var.name)
        else:
            raise UnsupportedOpError(f"op {op} left in the lowered main; the static emitter cannot run it")


def plan_main(mod: tvm.IRModule) -> Plan:
    """Flatten the lowered ``main`` (after StaticPlanBlockMemory) into a :class:`Plan`.

    Raises UnsupportedOpError for a construct the emitter cannot express
    (dynamic shapes, more than one input, a non-float32 output, an op other
    than allocation / kernel call / reshape view).
    """
    plan = _Planner(mod["main"]).run()
    # builtin.alloc_tensor is left by StaticPlanBlockMemory for the returned
    # tensors only; they become slots of the caller's buffer. Any other one
    # would have no home.
    returned = {plan.views.get(t.name, t.name) for t in plan.outputs if t.home == "output"}
    if any(t.name not in returned for t in plan.tensors if t.home == "output" and not t.view):
        raise UnsupportedOpError("unplanned intermediate tensor in the lowered main")
    return plan



def call_counts(mod: tvm.IRModule, plan: Plan) -> tuple[dict[str, int], list[str]]:
    """Kernel calls of the lowered ``main`` by backend: ``({"mmalib": n, "c7x":
    n, "tvm": n}, sorted names of the distinct scalar PrimFuncs called)``.
    An offload PrimFunc counts for its ``c7x_offload_backend``, any other for "tvm"."""
    counts = {"mmalib": 0, "c7x": 0, "tvm": 0}
    scalar = set()
    for name, _ in plan.calls:
        func = mod[name]
        backend = str(func.attrs["c7x_offload_backend"]) if is_offload(func) else "tvm"
        counts[backend] = counts.get(backend, 0) + 1
        if backend == "tvm":
            scalar.add(name)
    return counts, sorted(scalar)
