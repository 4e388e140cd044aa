"""The binding rewriter every offload / cleanup pass runs on.

A pass is a *planner*: for every binding of ``main`` (the root of a Q/DQ
pattern is its ``R.quantize``) it returns ``None`` (not its pattern), an
:class:`Offload` (a function that emits the replacement) or a
:class:`Simplify` (a Q/DQ cleanup), or raises
:class:`~pipeline.backend.refusal.Declined` (its pattern, but ineligible:
logged, left alone). :func:`run_pass` catches the refusals, applies the
offloads in graph order, so PrimFunc names are deterministic, and logs every
decision.

Patterns are matched by walking definitions backwards from the quantize over
the dataflow bindings (:mod:`.graph`), rather than with ``tvm.relax.dpl``, so
that every rejected candidate can be logged with a precise reason.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

import tvm
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from .. import fold
from ..refusal import Declined
from .graph import Activation, Graph
from .log import OffloadLog
from .primfunc import backend_of


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


def with_data(call: relax.Call, data) -> relax.Call:
    """``call`` (an op call: a dequantize, a reshape, a take...) applied to ``data`` in place of its
    first argument, its other arguments and attributes kept."""
    return relax.Call(call.op, [data, *call.args[1:]], call.attrs)


def emit_activation(ctx: RewriteContext, value, act: Activation | None, o_s: float, o_zp: int,
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


def act_scalars(act: Activation | None, o_s: float, o_zp: int, dtype: str) -> list[int]:
    """``[act_min, act_max]``, the saturation range an MMALIB conv / depthwise / FC
    applies after its requantize (c7x_kernels.h): the fused activation's integer bounds
    (ReLU ``[o_zp, max]``, ReLU6 / clip ``[q(lo), q(hi)]``), or the range of ``dtype``
    without one. The activation then costs no call of its own."""
    if act is None:
        return list(fold.dtype_range(dtype))
    return list(act.int_bounds(o_s, o_zp, dtype))


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


Planner = Callable[[Graph, object], "Offload | Simplify | None"]


def run_pass(mod: tvm.IRModule, log: OffloadLog | None, pass_name: str, planner: Planner) -> tvm.IRModule:
    """Apply ``planner`` to every binding of ``mod["main"]`` in graph order.

    The planner sees ``(graph, binding)`` and returns ``None``, an
    :class:`Offload` or a :class:`Simplify`, or raises a located
    :class:`~pipeline.backend.refusal.Declined` (see
    :func:`~pipeline.backend.refusal.declining`). Refusals are logged at
    once; offloads and simplifications are applied by a single mutation
    (then dead-code elimination) and logged in graph order with the PrimFunc
    each one called. Raises ``RuntimeError`` for a refusal that does not name
    its layer (a planner bug).
    """
    log = log if log is not None else OffloadLog()
    graph = Graph(mod["main"])
    plan: dict = {}
    for binding in graph.bindings:
        try:
            item = planner(graph, binding)
        except Declined as e:
            if not e.located:
                raise RuntimeError(f"{pass_name}: refusal {e.reason!r} outside declining()") from e
            log.declined(pass_name, e.anchor, e.op, e.dtype, e.reason)
            continue
        if isinstance(item, Offload) and binding.var not in graph.from_inputs:
            # FoldConstant would evaluate the kernel call at compile time with
            # LLVM, which has no extern kernels (a segfault); TVM's own ops fold.
            log.declined(pass_name, item.anchor, item.op, item.dtype,
                         "computed from constants only (folded at compile time)")
            continue
        if item is not None:
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
