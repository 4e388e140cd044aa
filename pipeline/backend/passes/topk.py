"""``relax.topk`` as a static-C PrimFunc (TVM's own lowering calls its runtime's sort).

TVM legalizes topk through ``topi.topk``, which on CPU is an ``extern`` call
of the packed function ``tvm.contrib.sort.topk``: a TVM runtime the static C
has not got, so ``LegalizeOps`` leaves ``relax.topk`` as it is. YOLO26's
end-to-end head ranks with three of them (``max.dim`` -> topk k=1 over the
classes, topk 300 over the anchors, topk 300 over anchor x class).

Ours, in plain loops with fixed extents (so the static work count of
``call_work`` is the work done), in one of two ways per row, whichever does
fewer steps (:func:`uses_radix_select`):

- **selection**: for each of the ``k`` outputs, one pass over the row picks the
  largest value that comes after the previous pick in the order: ``k * n``
  comparisons (YOLO26n at 320: 7.2 M for the 300-of-24000 pass);
- **radix select** (float32): each value's bits as an unsigned key that orders
  like the float (+0 and -0 one key; NaN above +inf, as torch.topk ranks it);
  four passes over the row, each a histogram of the next 8 bits of the keys
  that share the prefix found so far, find the k-th largest key T; one pass
  takes every index whose key is above T and the first ones (by index) equal
  to it, in index order; a stable bubble sort of those k by value, largest
  first. About ``5 n + k^2 / 2`` comparisons (0.51 M buffer stores counted by
  ``call_work``, an upper bound, for the 300-of-24000 pass).

Both give the order value descending, index ascending for equal values,
deterministically; ``torch.topk`` leaves the order of equal values
unspecified, which is why verify compares detections and not raw rows with
PyTorch. The C (TVM's C codegen of this TIR) and the Python reference (TVM's
LLVM build of the same TIR) compute it alike.
"""

from __future__ import annotations

from tvm import relax
from tvm.script import tirx as T

_K_OPAQUE = 8  # tvm::relax::OpPatternKind::kOpaque: FuseOps leaves it alone


def topk_primfunc(rows: int, n: int, k: int, dtype: str, index_dtype: str):
    """PrimFunc ``(x [rows, n] dtype, values [rows, k] dtype, indices [rows, k] index_dtype)``:
    the ``k`` largest of every row, largest first, ties by ascending index; by radix select
    where :func:`uses_radix_select` says it is cheaper, else by selection."""
    if uses_radix_select(n, k, dtype):
        return _radix_topk(rows, n, k, index_dtype)

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


def uses_radix_select(n: int, k: int, dtype: str) -> bool:
    """True when :func:`topk_primfunc` ranks a row of ``n`` ``dtype`` values by radix select:
    float32, and its steps (``5 n + 1024 + k^2 / 2``: four histogram passes of 256 bins,
    the collecting pass, the sort) fewer than the selection's ``k * n``."""
    return dtype == "float32" and 5 * n + 1024 + k * k // 2 < k * n


def _radix_topk(rows: int, n: int, k: int, index_dtype: str):
    """The radix-select PrimFunc of :func:`topk_primfunc` (float32; module docstring)."""

    @T.prim_func(private=True)
    def topk(x: T.Buffer((rows, n), "float32"), v: T.Buffer((rows, k), "float32"),
             ix: T.Buffer((rows, k), index_dtype)):
        T.func_attr({"tir.noalias": True})
        hist = T.alloc_buffer((256,), "int32")
        sel = T.alloc_buffer((k,), "int32")      # the k indices taken
        # st: 0 = how many to take at the threshold key, 1 = a running count,
        # 2 = bin found, 3 = taken so far; pre: the threshold key, 8 bits per pass
        st = T.alloc_buffer((4,), "int32")
        pre = T.alloc_buffer((1,), "uint32")
        for r in range(rows):
            pre[0] = T.uint32(0)
            st[0] = k
            for p in range(4):
                for b in range(256):
                    hist[b] = 0
                for i in range(n):
                    u = T.reinterpret("uint32", x[r, i])
                    key = T.Select(x[r, i] == T.float32(0), T.uint32(0x80000000),
                                   T.Select(u >> T.uint32(31) == T.uint32(1), ~u, u | T.uint32(0x80000000)))
                    if key & ~(T.uint32(0xFFFFFFFF) >> T.Cast("uint32", 8 * p)) == pre[0]:
                        d = T.Cast("int32", (key >> T.Cast("uint32", 24 - 8 * p)) & T.uint32(255))
                        hist[d] = hist[d] + 1
                st[1] = 0
                st[2] = 0
                for b in range(256):  # from the top bin down, to the one holding the k-th key
                    if st[2] == 0:
                        if st[1] + hist[255 - b] >= st[0]:
                            pre[0] = pre[0] | (T.Cast("uint32", 255 - b) << T.Cast("uint32", 24 - 8 * p))
                            st[0] = st[0] - st[1]
                            st[2] = 1
                        else:
                            st[1] = st[1] + hist[255 - b]
            st[1] = 0
            st[3] = 0
            for i in range(n):
                u = T.reinterpret("uint32", x[r, i])
                key = T.Select(x[r, i] == T.float32(0), T.uint32(0x80000000),
                               T.Select(u >> T.uint32(31) == T.uint32(1), ~u, u | T.uint32(0x80000000)))
                if key > pre[0] or (key == pre[0] and st[1] < st[0]):
                    sel[st[3]] = i
                    st[3] = st[3] + 1
                    if key == pre[0]:
                        st[1] = st[1] + 1
            for a in range(k):  # stable: equal values keep their index order
                for b in range(k - 1 - a):
                    if x[r, sel[b]] < x[r, sel[b + 1]]:
                        st[1] = sel[b]
                        sel[b] = sel[b + 1]
                        sel[b + 1] = st[1]
            for j in range(k):
                v[r, j] = x[r, sel[j]]
                ix[r, j] = T.Cast(index_dtype, sel[j])

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
