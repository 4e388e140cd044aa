"""What each kernel call of a compiled model does: its work and its memory traffic.

The facts the performance model (:mod:`pipeline.perf`) needs, recorded by
codegen beside each call of ``manifest.json`` (:func:`call_work`):

- ``work``: ``{"macs": n}`` for a multiply-accumulate kernel (MMALIB conv,
  depthwise conv, matmul: ``out_elems * w_elems / C_out``, the MACs the
  kernel executes, a padded FC's zero columns included), ``{"elements": n}``
  for a C7x vector kernel (elements of every tensor it reads or writes), and
  ``{"iterations": n, "macs": m}`` for a TVM scalar PrimFunc (``iterations``:
  buffer stores executed, from the loop extents of its TIR; ``macs``: those of
  them that accumulate a product, i.e. the conv / matmul inner loop).
- ``reads`` / ``writes``: ``[{"tensor", "bytes", "level", "kind"}]`` per
  tensor argument, ``kind`` "activation" or "weight" (a weights.bin entry),
  ``level`` the memory the static plan puts it in
  (:func:`.memory_plan.level_of`); a weight the staged plan copies into L2 by
  DMA also has ``staged_from: "ddr"`` and ``dma: "overlapped"``.

Counts are static (shapes are static); an ``IfThenElse`` counts its larger
branch, an upper bound.
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx

from .kernels import catalog
from .lower import is_offload
from .memory_plan import Plan, Tensor, level_of

#: kernels whose work is multiply-accumulates (the MMA), by symbol prefix


def _traffic(t: Tensor, plan: Plan, streamed: bool = False) -> dict:
    """``streamed``: ``t`` is the tensor a tiled call copies into L2 tile by tile (.tiling)."""
    rec = {"tensor": t.name, "bytes": t.nbytes, "dtype": t.dtype,
           "level": "l2" if streamed else level_of(t, plan), "kind": "weight" if t.home == "weight" else "activation"}
    if t.staged is not None or t.tiled or streamed:  # copied from weights.bin by DMA, overlapped (.levels, .tiling)
        rec.update(staged_from="ddr", dma="overlapped")
    elif t.copy_of is not None:  # an activation copied DDR -> L2 just before the call (.levels)
        rec.update(staged_from="ddr", dma="serial")
    return rec


def _extent(loop) -> int:
    ext = loop.extent
    return int(ext.value) if hasattr(ext, "value") else 1


def _is_mac(store) -> bool:
    """``acc[...] = acc[...] + a * b`` (possibly through casts)."""
    v = store.value
    if not isinstance(v, tirx.Add):
        return False

    def has_mul(e) -> bool:
        while isinstance(e, tirx.Cast):
            e = e.value
        return isinstance(e, tirx.Mul)
    return has_mul(v.a) or has_mul(v.b)


def stmt_work(stmt) -> tuple[int, int]:
    """(stores, MAC stores) executed by ``stmt``: loop extents multiply, sequences add."""
    if isinstance(stmt, tirx.For):
        s, m = stmt_work(stmt.body)
        n = _extent(stmt)
        return s * n, m * n
    if isinstance(stmt, tirx.SeqStmt):
        parts = [stmt_work(s) for s in stmt.seq]
        return sum(p[0] for p in parts), sum(p[1] for p in parts)
    if isinstance(stmt, tirx.BufferStore):
        return 1, int(_is_mac(stmt))
    if isinstance(stmt, tirx.IfThenElse):
        a = stmt_work(stmt.then_case)
        b = stmt_work(stmt.else_case) if stmt.else_case is not None else (0, 0)
        return max(a, b)
    if isinstance(stmt, tirx.Evaluate):
        return 1, 0
    if isinstance(stmt, s_tir.SBlockRealize):
        return stmt_work(stmt.block)
    if isinstance(stmt, s_tir.SBlock):
        s, m = stmt_work(stmt.body)
        if stmt.init is not None:
            i = stmt_work(stmt.init)
            s, m = s + i[0], m + i[1]
        return s, m
    body = getattr(stmt, "body", None)  # LetStmt, AttrStmt, DeclBuffer, AllocBuffer...
    return stmt_work(body) if body is not None else (0, 0)


def _extern_scalars(func) -> list[int]:
    """The scalar arguments of an offload PrimFunc's extern call (after the buffer pointers)."""
    call = func.body.value
    return [int(a.value) for a in call.args[1 + len(func.params):]]


def _offload_work(kernel: str, args: list[Tensor], out: Tensor, func) -> dict:
    if hasattr(catalog.kernel(kernel).geometry, "macs"):  # activation x activation: no weight gives K
        return {"macs": catalog.geometry(kernel, *([None] * len(func.params)), *_extern_scalars(func)).macs()}
    rec = catalog.kernel(kernel)
    if rec.macs:
        w = next(a for a in args if a.home == "weight")
        # an FC's output channels are its last axis whatever the rank (Swin's and ConvNeXt's
        # [1, H, W, C] tokens); a conv's are axis 1 of NCHW
        fc = rec.tiling is not None and rec.tiling.kind == "fc"
        c_out = out.shape[-1] if fc or len(out.shape) != 4 else out.shape[1]
        return {"macs": int(math.prod(out.shape)) * int(math.prod(w.shape)) // max(int(c_out), 1)}
    return {"elements": sum(int(math.prod(a.shape)) for a in args if a.home != "weight")}


def call_work(mod, plan: Plan, n_outputs: list[int]) -> list[dict]:
    """``{"work", "reads", "writes"}`` of each call of ``plan.calls`` (module docstring).

    ``mod``: the lowered module the plan was made from; ``n_outputs``: how many
    trailing arguments of each call are its outputs (``call_records``' split).
    """
    out = []
    lv = plan.levels
    for k, ((name, args), n_out) in enumerate(zip(plan.calls, n_outputs)):
        # a fused call's input tiles are computed in L2 (.levels.fusable), not copied
        streamed = lv.streamed(k, plan) if lv is not None and k in lv.tiled and k not in plan.fused else None
        func = mod[name]
        ins, outs = args[:-n_out], args[-n_out:]
        if is_offload(func):
            work = _offload_work(str(func.attrs["c7x_kernel"]), args, outs[-1], func)
        else:
            stores, macs = stmt_work(func.body)
            work = {"iterations": stores, "macs": macs}
        out.append({"work": work, "reads": [_traffic(a, plan, a is streamed) for a in ins if a.home != "slot"],
                    "writes": [_traffic(a, plan) for a in outs]})
    return out
