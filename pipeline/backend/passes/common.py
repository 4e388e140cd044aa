"""Shared machinery of the offload passes: graph queries, constants, offload
PrimFuncs, fused-activation clips and the binding rewriter.

A pass is a *planner*: for every ``R.quantize`` binding of ``main`` (the root
of every Q/DQ pattern) it returns nothing (not its pattern), a
:class:`Decline` (its pattern, but ineligible: logged, left alone) or an
:class:`Offload` (a function that emits the replacement). :func:`run_pass`
applies the offloads in graph order, so PrimFunc names are deterministic, and
logs every decision.

Patterns are matched by walking definitions backwards from the quantize over
the dataflow bindings, rather than with ``tvm.relax.dpl``, so that every
rejected candidate can be logged with a precise reason.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.ir import GenericConst
from tvm.relax.expr_functor import PyExprMutator, mutator

from .. import fold
from .log import OffloadLog

MMALIB = "mmalib"
C7X = "c7x"


def backend_of(kernel: str) -> str:
    """``"mmalib"`` for ``mmalib_*`` kernels, ``"c7x"`` for ``c7x_*`` kernels."""
    return MMALIB if kernel.startswith("mmalib_") else C7X


# ----------------------------------------------------------------------------- graph queries


class Graph:
    """Bindings of a Relax function in order, with definitions and use counts
    (``uses[v]``: how many bindings, plus the function result, refer to ``v``)."""

    def __init__(self, func: relax.Function):
        self.bindings: list = [b for block in func.body.blocks for b in block.bindings]
        self.value: dict = {b.var: b.value for b in self.bindings}
        self.uses: Counter = Counter()
        for b in self.bindings:
            for v in relax.analysis.free_vars(b.value):
                self.uses[v] += 1
        for v in relax.analysis.free_vars(func.body.body):
            self.uses[v] += 1

    def call(self, expr, *ops: str):
        """The ``Call`` bound to ``expr`` if its op is one of ``ops`` (``"relax.nn.conv2d"``...)."""
        value = self.value.get(expr, expr) if isinstance(expr, relax.Var) else expr
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in ops:
            return value
        return None

    def single_use(self, var) -> bool:
        """True if ``var`` is used exactly once (so a fused chain may swallow it)."""
        return self.uses[var] == 1


def const_array(expr) -> np.ndarray | None:
    """numpy value of a Relax constant, else ``None``."""
    return expr.value.numpy() if isinstance(expr, GenericConst) else None


def const(a: np.ndarray):
    """Relax constant of exactly ``a``'s dtype (``relax.const`` alone narrows int64 to int32)."""
    return relax.const(a, str(a.dtype))


def const_scalar(expr) -> float | None:
    """Python number of a one-element Relax constant, else ``None``."""
    a = const_array(expr)
    return a.reshape(-1)[0].item() if a is not None and a.size == 1 else None


def prim_number(expr) -> float | None:
    """Value of a ``R.prim_value`` / constant scalar (the bounds of ``R.clip``)."""
    if isinstance(expr, (tirx.IntImm, tirx.FloatImm)):  # R.prim_value is a bare Imm in TVM 0.27
        return float(expr.value)
    v = const_scalar(expr)
    return None if v is None else float(v)


def static_shape(expr) -> tuple[int, ...] | None:
    """Static tensor shape of ``expr`` or ``None`` (unknown rank or a symbolic dim)."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    dims = getattr(ty.shape, "values", None)
    if dims is None or not all(isinstance(d, tirx.IntImm) for d in dims):
        return None
    return tuple(int(d) for d in dims)


def dtype_of(expr) -> str:
    """Element dtype name of a tensor-typed expression."""
    return str(expr.ty.dtype)


def var_name(var) -> str:
    """Name of a binding variable (the anchor key of :class:`~.log.Decision`)."""
    return var.name


@dataclass
class QDQ:
    """A per-tensor or per-channel ``R.quantize`` / ``R.dequantize`` call, unpacked.

    ``scale`` / ``zp`` are numpy arrays (0-d for per-tensor) or ``None`` when
    not constant; ``data`` is the first argument.
    """

    data: object
    scale: np.ndarray | None
    zp: np.ndarray | None
    axis: int
    out_dtype: str

    @property
    def scalar(self) -> bool:
        """Constant single-element scale and zero point."""
        return (self.scale is not None and self.zp is not None
                and self.scale.size == 1 and self.zp.size == 1)

    @property
    def s(self) -> float:
        """The scalar scale (first element)."""
        return float(self.scale.reshape(-1)[0])

    @property
    def z(self) -> int:
        """The scalar zero point (first element)."""
        return int(self.zp.reshape(-1)[0])

    def same_params(self, other: "QDQ", rtol: float = 0.0) -> bool:
        """Same constant scalar scale (within ``rtol``) and zero point."""
        if not (self.scalar and other.scalar) or self.z != other.z:
            return False
        return self.s == other.s if rtol == 0.0 else bool(np.isclose(self.s, other.s, rtol=rtol, atol=0))


def as_qdq(call) -> QDQ | None:
    """Unpack a quantize/dequantize ``Call`` (``None`` passes through)."""
    if call is None:
        return None
    return QDQ(call.args[0], const_array(call.args[1]), const_array(call.args[2]),
               int(call.attrs.axis), str(call.attrs.out_dtype))


def dequantize_of(graph: Graph, expr) -> QDQ | None:
    """``expr`` as ``R.dequantize(...)`` (``None`` if it is something else)."""
    return as_qdq(graph.call(expr, "relax.dequantize"))


def quantize_of(graph: Graph, expr) -> QDQ | None:
    """``expr`` as ``R.quantize(...)`` (``None`` if it is something else)."""
    return as_qdq(graph.call(expr, "relax.quantize"))


# ----------------------------------------------------------------------------- fused activations


@dataclass(frozen=True)
class Activation:
    """A float activation fused between an op and its output quantize.

    ``kind`` is ``"relu"`` or ``"clip"`` (ReLU6 and hardtanh import as
    ``R.clip(x, a, b)``)."""

    kind: str
    lo: float = 0.0
    hi: float = float("inf")

    def int_bounds(self, o_s: float, o_zp: int, dtype: str) -> tuple[int, int]:
        """Integer clip bounds on the quantized output: ``[q(lo), q(hi)]`` with
        torch's quantize semantics (exact because quantize is monotone);
        ReLU gives ``[o_zp, max]``."""
        qmin, qmax = fold.dtype_range(dtype)
        lo = fold.quantize_value(self.lo, o_s, o_zp, dtype)
        hi = qmax if np.isinf(self.hi) else fold.quantize_value(self.hi, o_s, o_zp, dtype)
        return max(lo, qmin), min(hi, qmax)


def activation_of(graph: Graph, expr) -> tuple[Activation | None, object]:
    """Peel a fused ``relu`` / ``clip`` off ``expr``: ``(activation or None, its input)``."""
    relu = graph.call(expr, "relax.nn.relu")
    if relu is not None:
        return Activation("relu"), relu.args[0]
    clip = graph.call(expr, "relax.clip")
    if clip is not None:
        lo, hi = prim_number(clip.args[1]), prim_number(clip.args[2])
        if lo is not None and hi is not None:
            return Activation("clip", lo, hi), clip.args[0]
    return None, expr


def emit_activation(ctx: "RewriteContext", value, act: Activation | None, o_s: float, o_zp: int,
                    dtype: str, name: str):
    """Apply ``act`` to the integer kernel output ``value`` (an un-emitted call)
    as an integer ``R.clip``: ``value`` is bound to ``name`` and the clip is
    returned un-emitted (it becomes the root binding). Without an activation,
    or when the bounds cover the whole dtype range, ``value`` is returned as is."""
    if act is None:
        return value
    lo, hi = act.int_bounds(o_s, o_zp, dtype)
    if (lo, hi) == fold.dtype_range(dtype):
        return value
    return relax.op.clip(ctx.emit(value, name), relax.prim_value(tirx.IntImm("int64", lo)),
                         relax.prim_value(tirx.IntImm("int64", hi)))


# ----------------------------------------------------------------------------- offload PrimFuncs


@dataclass(frozen=True)
class TensorArg:
    """One buffer parameter of an offload PrimFunc."""

    name: str
    shape: tuple[int, ...]
    dtype: str


def offload_primfunc(kernel: str, tensors: list[TensorArg], scalars: list[int]) -> tirx.PrimFunc:
    """The offload PrimFunc of the contract in :mod:`pipeline.backend`.

    Parameters are ``tensors`` in extern-call order, the output buffer last;
    the body is exactly ``T.call_extern("int32", kernel, <buf>.data..., <int32 scalars>...)``;
    attributes ``{"c7x_kernel": kernel, "c7x_offload_backend": "mmalib" | "c7x"}``.
    """
    bufs = [tirx.decl_buffer(t.shape, t.dtype, t.name) for t in tensors]
    args = [b.data for b in bufs] + [tirx.IntImm("int32", int(v)) for v in scalars]
    body = tirx.Evaluate(tirx.call_extern("int32", kernel, *args))
    return tirx.PrimFunc(bufs, body).with_attrs({"c7x_kernel": kernel,
                                                 "c7x_offload_backend": backend_of(kernel)})


# ----------------------------------------------------------------------------- rewriting


@dataclass
class Decline:
    """A matched pattern that stays on the scalar path."""

    anchor: str
    op: str
    dtype: str
    reason: str


@dataclass
class Offload:
    """A matched, eligible pattern and how to replace it.

    ``build(ctx)`` emits the replacement through ``ctx`` and returns the new
    value of the root binding (same type as the original quantize)."""

    anchor: str
    op: str
    dtype: str
    kernel: str
    build: Callable[["RewriteContext"], object]
    note: str | None = None


@dataclass
class Simplify:
    """A Q/DQ cleanup: ``build(ctx)`` returns the new value of the root binding."""

    anchor: str
    op: str
    dtype: str
    note: str
    build: Callable[["RewriteContext"], object]


class RewriteContext:
    """What a replacement builder may do: remap old expressions, emit bindings,
    add offload PrimFuncs (named ``<kernel>_<n>`` in graph order)."""

    def __init__(self, mutator, counters: Counter, produced: list):
        self._m = mutator
        self._counters = counters
        self._produced = produced

    def remap(self, expr):
        """``expr`` with the variables of earlier rewritten bindings substituted."""
        return self._m.visit_expr(expr)

    def emit(self, expr, name: str):
        """Bind ``expr`` to a new variable called ``name`` in the current block."""
        return self._m.builder_.emit(expr, name_hint=name)

    def call_offload(self, prim: tirx.PrimFunc, args: list, out_shape, out_dtype: str):
        """Add ``prim`` (deduplicated against identical PrimFuncs) and return the
        un-emitted ``R.call_tir`` of it on the remapped ``args``."""
        kernel = str(prim.attrs["c7x_kernel"])
        name = f"{kernel}_{self._counters[kernel]}"
        gv = self._m.builder_.add_func(prim, name)
        if gv.name_hint == name:
            self._counters[kernel] += 1
        self._produced.append(gv.name_hint)
        return relax.call_tir(gv, [self.remap(a) for a in args],
                              relax.TensorType([int(d) for d in out_shape], out_dtype))

    @property
    def func_name(self) -> str:
        """Name of the PrimFunc added last (for naming emitted bindings)."""
        return self._produced[-1]


@mutator
class _BindingRewriter(PyExprMutator):
    """Re-emits ``main``, replacing the value of each planned root binding."""

    def __init__(self, mod, plan: dict, counters: Counter):
        super().__init__(mod)
        self.plan = plan
        self.counters = counters
        self.produced: dict = {}

    def visit_var_binding_(self, binding):
        item = self.plan.get(binding.var)
        if item is None:
            return super().visit_var_binding_(binding)
        funcs: list = []
        value = item.build(RewriteContext(self, self.counters, funcs))
        self.produced[binding.var] = funcs
        value = self.builder_.normalize(self.visit_expr(value))
        # Keep the root's original variable: later bindings (and the log's
        # anchors) keep referring to it.
        self.builder_.emit_normalized(relax.VarBinding(binding.var, value))


def _kernel_counters(mod: tvm.IRModule) -> Counter:
    """Number of offload PrimFuncs per kernel already in ``mod`` (names continue from there)."""
    counters: Counter = Counter()
    for func in mod.functions.values():
        if isinstance(func, tirx.PrimFunc) and func.attrs is not None and "c7x_kernel" in func.attrs:
            counters[str(func.attrs["c7x_kernel"])] += 1
    return counters


Planner = Callable[[Graph, object], "Decline | Offload | Simplify | None"]


def run_pass(mod: tvm.IRModule, log: OffloadLog | None, pass_name: str, planner: Planner) -> tvm.IRModule:
    """Apply ``planner`` to every binding of ``mod["main"]`` in graph order.

    The planner sees ``(graph, binding)`` and returns ``None``, a
    :class:`Decline`, an :class:`Offload` or a :class:`Simplify`. Declines are
    logged at once; offloads and simplifications are applied by a single
    mutation (then dead-code elimination) and logged in graph order with the
    PrimFunc each one called.
    """
    log = log if log is not None else OffloadLog()
    graph = Graph(mod["main"])
    plan: dict = {}
    for binding in graph.bindings:
        item = planner(graph, binding)
        if isinstance(item, Decline):
            log.declined(pass_name, item.anchor, item.op, item.dtype, item.reason)
        elif item is not None:
            plan[binding.var] = item
    if not plan:
        return mod
    rewriter = _BindingRewriter(mod, plan, _kernel_counters(mod))
    main_gv = mod.get_global_var("main")
    new_main = rewriter.visit_expr(mod["main"])
    rewriter.builder_.update_func(main_gv, new_main)
    # The replaced chains (float conv, dequantized weights...) are dead now.
    new_mod = relax.transform.DeadCodeElimination()(rewriter.builder_.get())
    for var, item in plan.items():
        if isinstance(item, Offload):
            funcs = rewriter.produced[var]
            log.offloaded(pass_name, item.anchor, item.op, item.dtype, item.kernel,
                          backend_of(item.kernel), funcs[0], item.note)
        else:
            log.simplified(pass_name, item.anchor, item.op, item.dtype, item.note)
    return new_mod
