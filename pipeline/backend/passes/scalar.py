"""Scalar path: integer-domain rewrites for what MMALIB does not take, and a
torch-exact ``R.quantize`` legalization.

Why this exists. Left alone, ``FoldConstant`` turns every ``dq(W)`` into a
float32 weight (4x ``weights.bin``), and without ``FoldConstant`` ``FuseOps``
keeps a run-time float copy of every weight (the dequantize of a weight is
not fused into the conv). So every remaining

    dq(x, d_s, d_zp) -> conv2d(., dq(W, w_s, 0))          (also grouped / depthwise)
    dq(x, d_s, d_zp) -> matmul(., permute_dims(dq(W, w_s, 0)))   (torch linear)

becomes an integer op on the quantized tensors, with the int8/int16 weight
kept as it is:

    acc = conv2d(x_q, W_q, out_dtype=int32 (int64 when 16-bit))   [exact]
    acc = acc - d_zp * sum(W_q[c])            (only if d_zp != 0; the input is
                                               then padded with d_zp explicitly,
                                               so every window is full and the
                                               correction is one per-channel term)
    y   = float32(acc) * (float32(d_s) * w_s[c])

``y`` replaces the float conv output; the bias add, activation and quantize
that follow stay as torch wrote them. What stays float and why: the bias add,
ReLU/clip and the requantize (torch does them in float32 on ``y``; an integer
requantize would not reproduce torch's rounding), and ``mean``/avg-pool and
residual adds (torch divides/adds in float). ``y`` differs from torch's float
conv only by float32 summation-order rounding (torch sums rounded float
products), so results agree with torch within 1 LSB.

"Transparent" ops whose output is requantized with exactly the input's scale
and zero point run directly on the integers (exact, see each rule):
max_pool2d / reshape / permute_dims / squeeze / expand_dims / flatten
(``q(op(dq(v))) == op(v)`` because dq is monotonic and ``q(dq(v)) == v``),
ReLU (``max(v, zp)``) and clip(a, b) (``clamp(v, q(a), q(b))``). This keeps the
activation between two kernels int8 instead of float32 (4x arena).

``R.quantize`` is legalized as torch's ``quantize_per_tensor`` computes it
(torch/ao/quantization/fx/_decomposed.py)::

    clamp(round_half_even(x * float32(1.0 / scale)) + zp, qmin, qmax)

TVM's default legalization divides by ``scale`` instead, which differs from
torch on about 0.1 % of values, those near a rounding midpoint (docs/measuring.md). ``tirx.round`` is ``nearbyintf`` (half-to-even
under the default rounding mode) in both the C and the LLVM code.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te, tirx
from tvm.ir import GenericConst
from tvm.relax.expr_functor import PyExprMutator, mutator

from .topk import legalize_topk

_RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767)}

_OP = tvm.ir.Op.get
_CONV2D = _OP("relax.nn.conv2d")
_MATMUL = _OP("relax.matmul")
_PERMUTE = _OP("relax.permute_dims")
_QUANTIZE = _OP("relax.quantize")
_DEQUANTIZE = _OP("relax.dequantize")
_RELU = _OP("relax.nn.relu")
_CLIP = _OP("relax.clip")
# Ops that only move or select elements: exact on the integers when the
# requantize uses the same scale and zero point.
_TRANSPARENT = {_OP(n) for n in ("relax.nn.max_pool2d", "relax.reshape", "relax.permute_dims",
                                 "relax.squeeze", "relax.expand_dims", "relax.flatten")}


def torch_quantize_np(x: np.ndarray, scale: float, zp: int, dtype: str) -> np.ndarray:
    """numpy twin of torch ``quantize_per_tensor`` (float32 ``x`` -> ``dtype``).

    ``clamp(rint(x * float32(1/scale)) + zp, qmin, qmax)``; ``np.rint`` rounds
    half to even like ``torch.round``. Raises KeyError for a dtype other than
    int8/uint8/int16.
    """
    lo, hi = _RANGE[dtype]
    inv = np.float32(1.0 / np.float64(scale))
    y = np.rint(np.asarray(x, np.float32) * inv) + np.float32(zp)
    return np.clip(y, lo, hi).astype(dtype)


def _const(expr) -> np.ndarray | None:
    return expr.value.numpy() if isinstance(expr, GenericConst) else None


def _scalar(arr: np.ndarray | None):
    """The single value of a size-1 constant, else None."""
    return None if arr is None or arr.size != 1 else arr.reshape(()).item()


def _dtype(expr) -> str:
    return str(expr.ty.dtype)


def _shape(expr) -> list[int]:
    return [int(d) for d in expr.ty.shape.values]


def _acc_dtype(reduction: int, *dtypes: str) -> str:
    """int32 accumulator when both operands are 8-bit and the reduction length
    is at most 2^16 (|product| <= 2^15 with a zero point, so |acc| < 2^31);
    int64 otherwise (16-bit operands, or a longer reduction)."""
    small = all(d in ("int8", "uint8") for d in dtypes) and reduction <= 2 ** 16
    return "int32" if small else "int64"


@mutator
class _ScalarRewriter(PyExprMutator):
    """Rewrites one Relax function; ``log`` gets one entry per decision."""

    def __init__(self, mod):
        super().__init__(mod)
        self.log: list[dict] = []

    # -- helpers ---------------------------------------------------------
    def _value(self, expr):
        """Follow variable bindings to the bound expression."""
        while isinstance(expr, relax.Var):
            bound = self.lookup_binding(expr)
            if bound is None:
                return expr
            expr = bound
        return expr

    def _dq(self, expr):
        """``(q, scale, zp, axis)`` if ``expr`` is a dequantize with constant
        scale and zero point, else None."""
        call = self._value(expr)
        if not (isinstance(call, relax.Call) and call.op == _DEQUANTIZE):
            return None
        scale, zp = _const(call.args[1]), _const(call.args[2])
        if scale is None or zp is None:
            return None
        return call.args[0], scale.astype(np.float32), zp.astype(np.int64), int(call.attrs.axis)

    def _per_tensor_dq(self, expr):
        """``(q, scale: float, zp: int)`` for a per-tensor dequantize of a non-constant."""
        dq = self._dq(expr)
        if dq is None or dq[1].size != 1 or isinstance(dq[0], GenericConst):
            return None
        return dq[0], float(dq[1].reshape(())), int(dq[2].reshape(()))

    def _weight_dq(self, expr, channels: int):
        """``(W_q, w_scale[channels])`` for a constant weight dequantized per
        output channel (axis 0) or per tensor; None otherwise (with a reason)."""
        dq = self._dq(expr)
        if dq is None or _const(dq[0]) is None:
            return None, "weight is not a dequantized constant"
        w_q, scale, zp, axis = dq
        if np.any(zp != 0):
            return None, "weight zero point != 0"
        if scale.size == 1:
            scale = np.full(channels, scale.reshape(()), np.float32)
        elif axis != 0 or scale.size != channels:
            return None, f"weight quantized along axis {axis}, not the output channel"
        return w_q, scale

    def _note(self, call, kind: str, done: bool, reason: str = ""):
        self.log.append({"op": call.op.name, "rewrite": kind, "done": done, "reason": reason})

    # -- rewrites ----------------------------------------------------------
    def visit_call_(self, op):
        call = super().visit_call_(op)
        rule = {_CONV2D: self._conv2d, _MATMUL: self._matmul, _QUANTIZE: self._transparent}.get(call.op)
        new = rule(call) if rule is not None else None
        return call if new is None else new

    def _conv2d(self, call):
        a = call.attrs
        data = self._per_tensor_dq(call.args[0])
        if data is None:
            return None
        if (str(a.data_layout), str(a.kernel_layout), str(a.out_layout or "NCHW")) != ("NCHW", "OIHW", "NCHW"):
            return self._note(call, "int_conv2d", False, "layout is not NCHW/OIHW")
        x_q, d_s, d_zp = data
        c_out = _shape(call.args[1])[0]
        w_q, w_s = self._weight_dq(call.args[1], c_out)
        if w_q is None:
            return self._note(call, "int_conv2d", False, w_s)
        w = _const(w_q)
        acc_t = _acc_dtype(int(np.prod(w.shape[1:])), _dtype(x_q), str(w.dtype))
        padding = [int(p) for p in a.padding]
        if d_zp != 0 and any(padding):
            # Zero in the float domain is d_zp in the integer one: pad explicitly.
            pt, pl, pb, pr = padding
            x_q = self.builder_.emit(relax.op.nn.pad(x_q, [0, 0, 0, 0, pt, pb, pl, pr],
                                                     pad_value=float(d_zp)))
            padding = [0, 0, 0, 0]
        acc = self.builder_.emit(relax.op.nn.conv2d(
            x_q, w_q, strides=[int(s) for s in a.strides], padding=padding,
            dilation=[int(d) for d in a.dilation], groups=int(a.groups), out_dtype=acc_t))
        per_channel = (1, c_out, 1, 1)
        if d_zp != 0:
            corr = d_zp * w.astype(np.int64).reshape(c_out, -1).sum(axis=1)
            acc = self.builder_.emit(relax.op.subtract(acc, relax.const(corr.reshape(per_channel).astype(acc_t))))
        self._note(call, "int_conv2d", True)
        return self._rescale(acc, d_s, w_s, per_channel)

    def _matmul(self, call):
        data = self._per_tensor_dq(call.args[0])
        rhs = self._value(call.args[1])
        if data is None or not (isinstance(rhs, relax.Call) and rhs.op == _PERMUTE):
            return None
        axes = rhs.attrs.axes
        if len(_shape(rhs)) != 2 or (axes is not None and [int(x) for x in axes] != [1, 0]):
            return self._note(call, "int_matmul", False, "weight is not a transposed 2-D matrix")
        x_q, d_s, d_zp = data
        n_out = _shape(rhs)[1]
        w_q, w_s = self._weight_dq(rhs.args[0], n_out)
        if w_q is None:
            return self._note(call, "int_matmul", False, w_s)
        w = _const(w_q)
        acc_t = _acc_dtype(w.shape[1], _dtype(x_q), str(w.dtype))
        w_t = relax.const(np.ascontiguousarray(w.T))  # [K, N], still the integer dtype
        acc = self.builder_.emit(relax.op.matmul(x_q, w_t, out_dtype=acc_t))
        if d_zp != 0:
            corr = d_zp * w.astype(np.int64).sum(axis=1)
            acc = self.builder_.emit(relax.op.subtract(acc, relax.const(corr.astype(acc_t))))
        self._note(call, "int_matmul", True)
        return self._rescale(acc, d_s, w_s, (n_out,))

    def _rescale(self, acc, d_s: float, w_s: np.ndarray, shape):
        """float32(acc) * (d_s * w_s[c]), the product taken in float32."""
        mult = (np.float32(d_s) * w_s.astype(np.float32)).reshape(shape)
        y = self.builder_.emit(relax.op.astype(acc, "float32"))
        return relax.op.multiply(y, relax.const(mult.astype(np.float32)))

    def _transparent(self, call):
        """q(op(dq(v))) with equal quantization in and out -> integer op on v."""
        o_s, o_zp = _scalar(_const(call.args[1])), _scalar(_const(call.args[2]))
        inner = self._value(call.args[0])
        if o_s is None or o_zp is None or not isinstance(inner, relax.Call):
            return None
        if inner.op not in _TRANSPARENT and inner.op not in (_RELU, _CLIP):
            return None
        data = self._per_tensor_dq(inner.args[0])
        out_dtype = str(call.attrs.out_dtype)
        if data is None or _dtype(data[0]) != out_dtype:
            return None
        v, d_s, d_zp = data
        if np.float32(d_s) != np.float32(o_s) or d_zp != int(o_zp):
            return None
        self._note(inner, "int_" + inner.op.name.split(".")[-1], True)
        if inner.op == _RELU:
            return relax.op.maximum(v, relax.const(d_zp, out_dtype))
        if inner.op == _CLIP:
            lo, hi = (int(torch_quantize_np(np.float32(float(b.value)), d_s, d_zp, out_dtype))
                      for b in inner.args[1:3])
            return relax.op.clip(v, relax.prim_value(tirx.IntImm("int64", lo)),
                                 relax.prim_value(tirx.IntImm("int64", hi)))
        return relax.Call(inner.op, [v, *inner.args[1:]], inner.attrs)


def rewrite_scalar(mod: tvm.IRModule) -> tuple[tvm.IRModule, list[dict]]:
    """Integer-domain rewrite of ``mod["main"]`` (see the module docstring).

    ``mod``: Relax module with params bound as constants (weights int8/int16
    constants under ``R.dequantize``), NCHW/OIHW. Returns the rewritten module
    (dead float weights removed) and a log: one dict per considered op,
    ``{"op", "rewrite", "done": bool, "reason"}``. Ops not matched keep their
    float semantics (they are still correct, only heavier).
    """
    rewriter = _ScalarRewriter(mod)
    main = rewriter.visit_expr(mod["main"])
    out = tvm.IRModule({gv: f for gv, f in mod.functions.items() if gv.name_hint != "main"},
                       attrs=mod.attrs)
    out["main"] = main
    out = relax.transform.DeadCodeElimination(["main"])(out)
    return out, rewriter.log


# ---------------------------------------------------------------------------
# torch-exact quantize legalization
# ---------------------------------------------------------------------------

def _f32(v) -> tirx.FloatImm:
    return tirx.FloatImm("float32", float(np.float32(v)))


def _te_quantize(data, inv, zp, axis: int, out_dtype: str):
    """te compute: clamp(round(data * inv) + zp, qmin, qmax) -> out_dtype.
    ``inv``/``zp`` are FloatImm (per tensor) or 1-D te tensors along ``axis``."""
    lo, hi = _RANGE[out_dtype]
    axis = axis % len(data.shape)

    def at(q, idx):
        return q[idx[axis]] if isinstance(q, te.Tensor) else q

    def compute(*idx):
        x = data(*idx).astype("float32")
        z = at(zp, idx)
        v = te.round(x * at(inv, idx)) + z
        return te.max(te.min(v, _f32(hi)), _f32(lo)).astype(out_dtype)

    return te.compute(data.shape, compute, name="quantized")


def legalize_quantize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Legalize ``R.quantize(x, scale, zp, axis, out_dtype)`` as torch computes it.

    ``x`` float32 (any shape); ``scale`` float32 and ``zp`` integer, scalars
    or 1-D along ``axis``. With a constant scale the reciprocal is taken at
    compile time exactly as torch does (``float32(1.0 / float64(scale))``);
    a non-constant scale falls back to ``1.0f / scale`` in float32 (may differ
    from torch by a double rounding; never produced by our frontend).
    Output dtype int8/uint8/int16 (KeyError otherwise).
    """
    x, scale, zp = call.args
    out_dtype = str(call.attrs.out_dtype)
    axis = int(call.attrs.axis)
    s, z = _const(scale), _const(zp)
    if s is not None:
        inv = (1.0 / s.astype(np.float64)).astype(np.float32)
        inv_arg = _f32(inv.reshape(())) if inv.size == 1 else relax.const(inv.reshape(-1))
    else:
        inv_arg = bb.emit(relax.op.divide(relax.const(np.float32(1.0)), scale))
    if z is not None and z.size == 1:
        zp_arg = _f32(z.reshape(()))
    else:
        zp_arg = zp if z is None else relax.const(z.reshape(-1).astype(np.float32))
    return bb.call_te(lambda d, i, q: _te_quantize(d, i, q, axis, out_dtype), x, inv_arg, zp_arg,
                      primfunc_name_hint="quantize")


_K_BROADCAST = 1  # tvm::relax::OpPatternKind::kBroadcast


def _te_dequantize(data, scale, zp, axis: int):
    """te compute: (float32(data) - zp) * scale, as torch's dequantize_per_tensor."""
    axis = axis % len(data.shape)

    def at(q, idx):
        return q[idx[axis]] if isinstance(q, te.Tensor) else q

    return te.compute(data.shape, lambda *i: (data(*i).astype("float32") - at(zp, i)) * at(scale, i),
                      name="dequantized")


def legalize_dequantize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Legalize ``R.dequantize(q, scale, zp, axis)`` -> float32 ``(q - zp) * scale``.

    Values equal TVM's default legalization and torch (``q - zp`` is exact in
    float32 for 8/16-bit ``q``). The PrimFunc is tagged ``op_pattern =
    kBroadcast`` instead of the kElemWise that ``AnnotateTIROpPattern`` would
    find: ``FuseOps`` then fuses the dequantize forward into its consumer
    (pool, mean, residual add) instead of backward into the producer, so the
    tensor handed from one kernel to the next stays int8 (measured: the float
    copy otherwise makes that arena slot 4x larger). Only float32 output.
    """
    q, scale, zp = call.args
    if str(call.attrs.out_dtype) != "float32":
        raise NotImplementedError(f"dequantize to {call.attrs.out_dtype}: only float32 is supported")
    axis = int(call.attrs.axis)
    s, z = _const(scale), _const(zp)
    s_arg = scale if s is None else (_f32(s.reshape(())) if s.size == 1 else relax.const(s.reshape(-1).astype(np.float32)))
    z_arg = zp if z is None else (_f32(z.reshape(())) if z.size == 1 else relax.const(z.reshape(-1).astype(np.float32)))
    return bb.call_te(lambda d, a, b: _te_dequantize(d, a, b, axis), q, s_arg, z_arg,
                      primfunc_name_hint="dequantize", primfunc_attrs={"op_pattern": _K_BROADCAST})


LEGALIZE_MAP = {"relax.quantize": legalize_quantize, "relax.dequantize": legalize_dequantize,
                "relax.topk": legalize_topk}
"""``customize_legalize_map`` for ``relax.transform.LegalizeOps``."""
