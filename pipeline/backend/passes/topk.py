"""``relax.topk`` as a static-C PrimFunc (TVM's own lowering calls its runtime's sort).

TVM legalizes topk through ``topi.topk``, which on CPU is an ``extern`` call
of the packed function ``tvm.contrib.sort.topk``: a TVM runtime the static C
has not got, so ``LegalizeOps`` leaves ``relax.topk`` as it is. YOLO26's
end-to-end head ranks with three of them (``max.dim`` -> topk k=1 over the
classes, topk 300 over the anchors, topk 300 over anchor x class).

Ours is a selection in plain loops, no scratch memory: for each of the ``k``
outputs, one pass over the row picks the largest value that comes after the
previous pick in the order (value descending, index ascending). Equal values
therefore come out in ascending index order, deterministically; ``torch.topk``
leaves that order unspecified, which is why verify compares detections and
not raw rows with PyTorch. Cost ``k * n`` comparisons per row (YOLO26n at
320: 7.2 M for the 300-of-24000 pass). The C (TVM's C codegen of this TIR)
and the Python reference (TVM's LLVM build of the same TIR) compute it alike.
"""

from __future__ import annotations

from tvm import relax
from tvm.script import tirx as T

_K_OPAQUE = 8  # tvm::relax::OpPatternKind::kOpaque: FuseOps leaves it alone


def topk_primfunc(rows: int, n: int, k: int, dtype: str, index_dtype: str):
    """PrimFunc ``(x [rows, n] dtype, values [rows, k] dtype, indices [rows, k] index_dtype)``:
    the ``k`` largest of every row, largest first, ties by ascending index."""

    @T.prim_func(private=True)
    def topk(x: T.Buffer((rows, n), dtype), v: T.Buffer((rows, k), dtype),
             ix: T.Buffer((rows, k), index_dtype)):
        T.func_attr({"tir.noalias": True})
        for r, j in T.grid(rows, k):
            v[r, j] = x[r, 0]
            ix[r, j] = T.Cast(index_dtype, -1)
            p = T.max(j - 1, 0)  # the previous pick (unused when j == 0)
            for i in range(n):
                if j == 0 or x[r, i] < v[r, p] or (x[r, i] == v[r, p] and T.Cast(index_dtype, i) > ix[r, p]):
                    if ix[r, j] < T.Cast(index_dtype, 0) or x[r, i] > v[r, j]:
                        v[r, j] = x[r, i]
                        ix[r, j] = T.Cast(index_dtype, i)

    return topk.with_attr("op_pattern", _K_OPAQUE)


def legalize_topk(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Legalize ``R.topk(x, k, axis=-1, ret_type="both", largest=True)`` of a static-shape tensor.

    ``x``: any rank, topk along its last axis (YOLO26's are all last-axis); the
    leading dimensions are flattened into rows with ``R.reshape`` (a view, no
    copy). Returns the tuple (values ``[..., k]`` x.dtype, indices ``[..., k]``
    ``call.attrs.dtype``, int64 from torch). Raises NotImplementedError for
    another axis, ``largest=False`` or another ``ret_type``, which the lowering
    then reports as ``relax.topk`` without a static-C lowering.
    """
    x = call.args[0]
    shape = [int(s) for s in x.ty.shape]
    a = call.attrs
    axis, k = int(a.axis) % len(shape), int(a.k)
    if axis != len(shape) - 1 or not bool(a.largest) or str(a.ret_type) != "both":
        raise NotImplementedError(f"topk axis={int(a.axis)} largest={bool(a.largest)} ret_type={a.ret_type}: "
                                  "only the last axis, largest, values and indices")
    n = shape[-1]
    rows = 1
    for s in shape[:-1]:
        rows *= s
    dtype, index_dtype = str(x.ty.dtype), str(a.dtype)
    gv = bb.add_func(topk_primfunc(rows, n, k, dtype, index_dtype), "topk")
    flat = bb.emit(relax.op.reshape(x, (rows, n)))
    out = bb.emit(relax.call_tir(gv, [flat], [relax.TensorType([rows, k], dtype),
                                             relax.TensorType([rows, k], index_dtype)]))
    lead = shape[:-1] + [k]
    values = bb.emit(relax.op.reshape(relax.TupleGetItem(out, 0), lead))
    indices = bb.emit(relax.op.reshape(relax.TupleGetItem(out, 1), lead))
    return relax.Tuple([values, indices])
