"""Lower an imported Q/DQ Relax module to the form the static-C emitter walks.

Order (each step says why it is there):

0. :func:`check_interface`: one float32 input, one float32 output, static
   shapes (the C entry's signature), or one UnsupportedOpError line.
1. ``run_offload`` (only with MMALIB on): eligible Q/DQ patterns become
   ``call_tir`` to offload PrimFuncs. Must run before ``FoldConstant``, or the
   int8 weights are folded back into float32.
2. ``rewrite_scalar``: the rest of conv/matmul on integers, int8 weights kept
   (passes/scalar.py).
3. ``LegalizeOps`` with the torch-exact quantize and the forward-fusing
   dequantize (passes/scalar.py): every Relax op -> PrimFunc. An op TVM
   cannot legalize, or one left as a Relax op (``relax.topk``), is reported
   by name (:func:`check_legalized`); a failing TVM pass by its name.
4. Offload PrimFuncs get ``op_pattern = kOpaque`` so ``FuseOps`` never fuses
   anything into or around them (``AnnotateTIROpPattern`` keeps an existing
   non-zero pattern).
5. ``AnnotateTIROpPattern``, ``FoldConstant`` (transposes/reshapes of
   constants), ``FuseOps``, ``FuseTIR``: one kernel per fused group.
6. reshape kernels become ``R.reshape`` views (no copy kernel), as TVM's
   ``RewriteDataflowReshape`` does; that pass cannot run here because it
   asserts every ``call_tir`` callee has a block body, which offload
   PrimFuncs (one ``T.call_extern``) do not.
7. :func:`compact_schedule` on every scalar PrimFunc: elementwise blocks
   inlined into their consumer, a reduction (conv / matmul accumulator)
   computed inside its consumer's innermost loop, so the int32 accumulator
   and the float epilogue need no full-size scratch buffer. Same arithmetic,
   in the same order: a much smaller workspace (what is left is the padded
   input of the largest depthwise conv), outputs unchanged (docs/measuring.md,
   "Figures behind the code").
8. :func:`.tir_c.libm_calls` on every scalar PrimFunc: float intrinsics
   (abs, exp, tanh...) become calls of the libm function, so TVM's C and the
   interpreter's LLVM build compute them alike (and C codegen knows them all).
   ``DeadCodeElimination``: drop PrimFuncs no longer called.
9. ``ToNonDataflow``, ``RemovePurityChecking``, ``CallTIRRewrite``
   (destination-passing calls with explicit ``alloc_tensor``),
   ``StaticPlanBlockMemory`` (storages with offsets; the static arena).

The result's ``main`` holds only ``R.memory.alloc_storage`` /
``R.memory.alloc_tensor`` / ``R.builtin.alloc_tensor`` (outputs), calls of
PrimFuncs, ``R.reshape`` views, tuples and the return; the emitter rejects
anything else. The VM-only passes of TVM's default pipeline
(``LowerAllocTensor``, ``KillAfterLastUse``, ``VMShapeLower`` ...) are not
run: nothing executes this ``main`` but our emitter and interpreter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import tvm
from tvm import relax, s_tir, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator
from tvm.s_tir.schedule import ScheduleError

from ..errors import PipelineError, UnsupportedOpError
from . import tir_c
from .passes.scalar import LEGALIZE_MAP, rewrite_scalar

OFFLOAD_ATTR = "c7x_kernel"
"""PrimFunc attribute naming the extern kernel of an offload PrimFunc."""

_K_OPAQUE = 8  # tvm::relax::OpPatternKind::kOpaque


@dataclass
class Lowered:
    """Result of :func:`lower_module`.

    ``mod``: lowered module (Relax ``main`` + PrimFuncs). ``offloaded``: the
    module right after the offload passes (before scalar rewrites), for the
    manifest. ``offload_log``: the passes' OffloadLog (None with MMALIB off).
    ``scalar_log``: :func:`rewrite_scalar`'s decisions. ``fused``: fused
    function name -> names of the bindings FuseOps moved into it (which
    layers a fused scalar kernel computes, :mod:`.call_graph`).
    """

    mod: tvm.IRModule
    offloaded: tvm.IRModule
    offload_log: object = None
    scalar_log: list = field(default_factory=list)
    fused: dict = field(default_factory=dict)


def fused_bindings(mod: tvm.IRModule) -> dict[str, list[str]]:
    """Binding names inside each fused (``Primitive``) Relax function of ``mod``."""
    out = {}
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function) and func.attrs is not None and "Primitive" in func.attrs:
            out[gv.name_hint] = [b.var.name for block in func.body.blocks for b in block.bindings]
    return out


def is_offload(func) -> bool:
    """True for an offload PrimFunc (carries the ``c7x_kernel`` attribute)."""
    return isinstance(func, tirx.PrimFunc) and func.attrs is not None and OFFLOAD_ATTR in func.attrs


def _mark_offload_opaque(mod: tvm.IRModule) -> tvm.IRModule:
    funcs = {gv: f.with_attr("op_pattern", _K_OPAQUE) if is_offload(f) else f
             for gv, f in mod.functions.items()}
    return tvm.IRModule(funcs, attrs=mod.attrs)


_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def _numel(expr) -> int | None:
    shape = getattr(expr.ty, "shape", None)
    values = getattr(shape, "values", None)
    if values is None or not all(isinstance(d, tirx.IntImm) for d in values):
        return None
    return math.prod(int(d) for d in values)


@mutator
class _ReshapeToView(PyExprMutator):
    """``call_tir(<reshape PrimFunc>, x)`` -> ``R.reshape(x, shape)`` for
    dataflow-internal values (the same scope as TVM's RewriteDataflowReshape)."""

    def __init__(self, mod):
        super().__init__(mod)
        self.mod = mod

    def _reshape_input(self, value):
        if not (isinstance(value, relax.Call) and value.op == _CALL_TIR):
            return None
        func = self.mod[value.args[0]]
        args = value.args[1].fields
        if (is_offload(func) or len(args) != 1 or not isinstance(func.body, s_tir.SBlockRealize)
                or not relax.analysis.has_reshape_pattern(func)):  # (it asserts a block body; topk has none)
            return None
        # a prefix slice ([1, 32] -> [1, 10]) also has the reshape pattern, but R.reshape keeps the size
        if _numel(args[0]) != _numel(value):
            return None
        return args[0]

    def visit_var_binding_(self, binding):
        src = self._reshape_input(binding.value)
        if src is None or not isinstance(binding.var, relax.DataflowVar):
            return super().visit_var_binding_(binding)
        shape = [int(d) for d in binding.var.ty.shape.values]
        view = self.builder_.emit(relax.op.reshape(self.visit_expr(src), shape), name_hint=binding.var.name)
        self.set_var_remap(binding.var, view)


def reshape_to_view(mod: tvm.IRModule) -> tvm.IRModule:
    """Apply :class:`_ReshapeToView` to ``main`` (module pass helper)."""
    main = _ReshapeToView(mod).visit_expr(mod["main"])
    out = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs)
    out["main"] = main
    return out


def _is_reduction(sch: s_tir.Schedule, block) -> bool:
    return any(iv.iter_type == tirx.IterVar.CommReduce for iv in sch.get(block).iter_vars)


def compact_schedule(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """Shrink the scratch buffers of one scalar PrimFunc without changing its arithmetic.

    1. Every spatial block but the last (the output) is inlined into its
       consumers, except one read by a reduction (the conv's padded input:
       inlining it would put a bounds test in the innermost MAC loop).
    2. A reduction block with a single spatial consumer is computed at that
       consumer's innermost loop: each accumulator is finished right before
       its epilogue uses it, and its buffer shrinks to one element.
    3. Each reduction's init (``acc = 0``) is split off and put right before
       its outermost reduction loop (:func:`hoist_reduction_init`).
    Inlining substitutes expressions and ``compute_at`` moves whole blocks
    (reduction loop order kept), so every value is computed by the same float
    and integer operations as before. Steps that the schedule rejects are
    skipped. A PrimFunc without a root block is returned unchanged.
    """
    if not isinstance(func.body, s_tir.SBlockRealize):
        return func
    sch = s_tir.Schedule(func)
    root = sch.get_sblock(func.body.block.name_hint)
    for block in sch.get_child_blocks(root)[:-1]:
        if _is_reduction(sch, block) or any(_is_reduction(sch, c) for c in sch.get_consumers(block)):
            continue
        try:
            sch.compute_inline(block)
        except ScheduleError:
            pass
    for block in sch.get_child_blocks(root):
        consumers = sch.get_consumers(block) if _is_reduction(sch, block) else []
        if len(consumers) == 1 and not _is_reduction(sch, consumers[0]):
            try:
                sch.compute_at(block, sch.get_loops(consumers[0])[-1])
            except ScheduleError:
                pass
    for block in sch.get_child_blocks(root):
        if _is_reduction(sch, block):
            hoist_reduction_init(sch, block)
    return sch.mod["main"]


def hoist_reduction_init(sch: s_tir.Schedule, block) -> None:
    """Split ``block``'s init statement into its own block, placed right before
    the outermost loop of the reduction (``s_tir.Schedule.decompose_reduction``
    on the innermost loop it accepts).

    Why: TVM's default pipeline otherwise lowers the init to ``if (k == 0)
    acc = 0;`` inside the reduction loop (``LowerInitBlock``), and gcc 12 -O2
    keeps that test in the MAC loop, which made scalar convs several times
    slower (docs/measuring.md, "Figures behind the code"). The same stores happen in
    the same order, so results are unchanged. A block the primitive rejects at
    every loop (no loop carries a reduction variable) is left as it is.
    """
    for loop in reversed(sch.get_loops(block)):
        try:
            sch.decompose_reduction(block, loop)
            return
        except ScheduleError:
            continue


def _compact_all(mod: tvm.IRModule) -> tvm.IRModule:
    funcs = {gv: compact_schedule(f) if isinstance(f, tirx.PrimFunc) and not is_offload(f) else f
             for gv, f in mod.functions.items()}
    return tvm.IRModule(funcs, attrs=mod.attrs)


def _run_offload(mod: tvm.IRModule):
    # Imported lazily: the passes package is written by another owner.
    from .passes.pipeline import run_offload

    return run_offload(mod)


def _static_shape(ty) -> list[int] | None:
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    dims = list(ty.shape.values)
    return [int(d) for d in dims] if all(isinstance(d, tirx.IntImm) for d in dims) else None


def _bound(main) -> dict:
    return {b.var: b.value for block in main.body.blocks for b in block.bindings}


def _producer(main, expr) -> str:
    """Name of the Relax op whose binding is ``expr`` (through tuples / aliases), else "main"."""
    bound = _bound(main)
    for _ in range(len(bound) + 1):
        if isinstance(expr, relax.Tuple) and len(expr.fields) == 1:
            expr = expr.fields[0]
        elif isinstance(expr, relax.Var) and expr in bound:
            expr = bound[expr]
        else:
            break
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name
    return "main"


def returned_fields(main) -> list:
    """The expressions ``main`` returns, one per output: the fields of the
    returned tuple (followed through variable bindings), else ``[body]``."""
    bound, expr = _bound(main), main.body.body
    for _ in range(len(bound) + 1):
        if isinstance(expr, relax.Var) and expr in bound and isinstance(bound[expr], (relax.Var, relax.Tuple)):
            expr = bound[expr]
        else:
            break
    return list(expr.fields) if isinstance(expr, relax.Tuple) else [expr]


def output_types(ret) -> list:
    """The Relax types of the model outputs: the fields of a tuple return
    (a tuple of one tensor is one output, as a plain tensor), else ``[ret]``."""
    return list(ret.fields) if isinstance(ret, relax.TupleType) else [ret]


def check_interface(mod: tvm.IRModule) -> None:
    """Reject a ``main`` the static C entry cannot express, before lowering.

    The entry is ``<m>_run(weights, const float* input, float* output)``:
    exactly one float32 input, one or more float32 outputs (a tuple return,
    packed back to back in ``output`` in return order, :mod:`.emit_c`), all
    shapes static. Raises UnsupportedOpError (one line: what, and what to do)
    otherwise.
    """
    main = mod["main"]
    if len(main.params) != 1:
        raise UnsupportedOpError(f"main takes {len(main.params)} inputs; the static C entry takes one "
                                 "float32 tensor: export the model with a single input")
    x = main.params[0]
    if str(x.ty.dtype) != "float32" or _static_shape(x.ty) is None:
        raise UnsupportedOpError(f"model input {x.ty} is not a float32 tensor of static shape: export "
                                 "it with a fixed input shape (batch 1)")
    types = output_types(main.ret_ty)
    fields = returned_fields(main) if len(types) > 1 else [main.body.body]
    for i, ret in enumerate(types):
        what = "the model output" if len(types) == 1 else f"model output {i}"
        op = _producer(main, fields[i] if i < len(fields) else main.body.body)
        if isinstance(ret, relax.TupleType):
            raise UnsupportedOpError(f"{what} is a nested tuple of {len(ret.fields)} tensors (from {op}); the "
                                     "static C entry packs plain tensors: return a flat tuple of tensors")
        if not isinstance(ret, relax.TensorType) or str(ret.dtype) != "float32":
            dtype = getattr(ret, "dtype", type(ret).__name__)
            raise UnsupportedOpError(f"{what} is {dtype} (from {op}); the static C entry returns "
                                     f"float32 tensors: cut the model before {op} and run it on the host")
        if _static_shape(ret) is None:
            raise UnsupportedOpError(f"{what} {ret} (from {op}) has no static shape: export "
                                     "the model with a fixed input shape")


_ALLOWED_AFTER_LEGALIZE = {"relax.call_tir"}


def check_legalized(mod: tvm.IRModule) -> None:
    """After LegalizeOps every op of ``main`` must be a ``call_tir``; an op
    TVM has no TIR lowering for (``relax.topk``, ``relax.nonzero``...) is
    rejected by name. Raises UnsupportedOpError."""
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and v.op.name not in _ALLOWED_AFTER_LEGALIZE:
                short = v.op.name.split(".")[-1]
                raise UnsupportedOpError(f"{v.op.name} has no static-C lowering: cut the model before "
                                         f"{short} and run it on the host")


def _alone(call: relax.Call) -> tvm.IRModule:
    """A module whose main is just ``call`` (its free variables as parameters)."""
    bb = relax.BlockBuilder()
    with bb.function("main", list(relax.analysis.free_vars(call))):
        bb.emit_func_output(bb.emit(call))
    return bb.get()


def _legalize(mod: tvm.IRModule) -> tvm.IRModule:
    """LegalizeOps with our quantize/dequantize; a failure is reported for the
    first op of ``main`` (graph order) that fails to legalize on its own."""
    legalize = relax.transform.LegalizeOps(customize_legalize_map=LEGALIZE_MAP)
    try:
        return legalize(mod)
    except PipelineError:
        raise
    except Exception as e:  # TVM raises builtin exception types too
        op, why = _failing_op(mod, legalize) or ("", e)
        what = op or "main"
        raise UnsupportedOpError(f"TVM cannot lower {what} to TIR ({first_line(why)}): cut the "
                                 "model before it and run it on the host") from None


def _failing_op(mod: tvm.IRModule, legalize) -> tuple[str, Exception] | None:
    """``(op name, its error)`` of the first op call of ``main`` that ``legalize``
    rejects when it is alone in a module; None if each passes alone."""
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            call = b.value
            if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)):
                continue
            try:
                alone = _alone(call)
            except Exception:  # noqa: BLE001 - cannot isolate it: try the next one
                continue
            try:
                legalize(alone)
            except Exception as e:  # noqa: BLE001 - any failure names this op
                return call.op.name, e
    return None


def first_line(e: BaseException) -> str:
    """First non-empty line of an exception's message (TVM's run to pages)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def _tvm_step(name: str, step, mod: tvm.IRModule) -> tvm.IRModule:
    """Run one TVM pass; its failure becomes one UnsupportedOpError line."""
    try:
        return step(mod)
    except PipelineError:
        raise
    except Exception as e:  # TVM raises builtin exception types too
        raise UnsupportedOpError(f"TVM's {name} failed on this model: {first_line(e)}") from None


def _libm_all(mod: tvm.IRModule) -> tvm.IRModule:
    funcs = {gv: tir_c.libm_calls(f) if isinstance(f, tirx.PrimFunc) and not is_offload(f) else f
             for gv, f in mod.functions.items()}
    return tvm.IRModule(funcs, attrs=mod.attrs)


def lower_module(mod: tvm.IRModule, *, mmalib: bool = True) -> Lowered:
    """Lower ``mod`` (imported Q/DQ module, params bound as constants).

    ``mmalib=True`` runs the MMALIB/C7x offload passes first (ImportError if
    ``pipeline.backend.passes.pipeline`` is missing). ``main`` must take one
    float32 tensor and return float32 tensors (one, or a tuple), static shapes
    (:func:`check_interface`).
    Returns :class:`Lowered`. Raises UnsupportedOpError (one line naming the
    op or TVM pass) for a graph that cannot be lowered to static C.
    """
    check_interface(mod)
    log = None
    if mmalib:
        mod, log = _run_offload(mod)
    offloaded = mod
    mod, scalar_log = rewrite_scalar(mod)
    mod = _legalize(mod)
    check_legalized(mod)
    mod = _mark_offload_opaque(mod)
    t = relax.transform
    with tvm.target.Target("c"):
        for name in ("AnnotateTIROpPattern", "FoldConstant", "FuseOps", "FuseTIR"):
            mod = _tvm_step(name, getattr(t, name)(), mod)
            if name == "FuseOps":
                fused = fused_bindings(mod)
        # Ours (not wrapped: a failure here is a bug, its traceback is wanted).
        mod = _libm_all(_compact_all(reshape_to_view(mod)))
        mod = _tvm_step("DeadCodeElimination", t.DeadCodeElimination(["main"]), mod)
        for name in ("ToNonDataflow", "RemovePurityChecking", "CallTIRRewrite", "StaticPlanBlockMemory"):
            mod = _tvm_step(name, getattr(t, name)(), mod)
    return Lowered(mod=mod, offloaded=offloaded, offload_log=log, scalar_log=scalar_log, fused=fused)
