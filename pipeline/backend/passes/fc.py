"""Offload of quantized fully connected layers (torch ``linear``) to MMALIB.

Pattern (torch's linear imports as a matmul with the transposed weight;
the bias may be either operand of the add; a 3-D input shows up as
``reshape -> matmul -> add -> reshape``)::

    q([relu|clip]([reshape](add(matmul([reshape](dq(x, d_s, d_zp)),
                                       permute_dims(dq(W[N,K], w_s, 0))), bias))), o_s, o_zp)
      ->  [strided_slice](call_tir(mmalib_matmul_bias_i8 | _i16,
                                   [call_tir(fc_k_pad, x)], W', bias', scale, shift))

``x`` is ``[..., K]`` with ``M`` = product of the leading dims (the kernel
sees it as ``[M, K]`` memory). Eligibility (``docs/reference.md``,
"Eligibility" and "FC width"): int8 data and weights with K % 32 == 0 and
N % 32 == 0 (i8), int16 data with zero points 0 and K % 16, N % 16 (i16),
both widths reached by padding (c), (e); constant weight, scales and bias;
weight zero point 0.

Deviations from the reference: (a) unrepresentable rescale declines;
(c) N not a multiple of the MMA width is padded: W, bias, scale and shift
get zero rows (the padded outputs are exactly 0; the header allows scale 0),
the kernel writes ``[..., N_pad]`` and
``R.strided_slice`` takes the first N (recorded as a note).
(e) K not a multiple of the MMA width is padded: W gets zero columns up to
K_pad and the input is copied into ``[..., K_pad]`` with 0 after each row
(:func:`k_pad_primfunc`, a scalar-path copy of M*K_pad elements). Each padded
position adds ``x_pad * 0 = 0`` to the accumulator, whatever it holds, so the
result is the unpadded dot product; the bias is folded from the unpadded W, so
``-d_zp * sum W`` is unchanged (recorded as a note). The copy is not a layer of
the manifest (it is not in the imported module); it is kept out of
``FuseOps`` (``op_pattern`` opaque), so it stays a call of its own, which the
call graph ties to the FC layer that reads it, and the layer before keeps its
own last call (fused into a flatten, the copy would have become that layer's
last call, with ``K_pad`` elements).
(d) int16 with int8 weights widens W and pre-scales each row by
``k[n]`` in [1, 256] (``k*scale/2^shift`` multiplier, :mod:`pipeline.backend.fold`). The reference has no
ReLU variant for FC; a fused ReLU / clip here becomes the kernel's saturation
range as for conv (``act_min, act_max``; exact, see :class:`~.graph.Activation`).
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax, te, topi
from tvm.relax.expr_functor import PyExprMutator, mutator

from ..kernels.catalog import find
from ..refusal import Declined, declining
from .graph import Graph, const, dequantize_of, static_shape
from .log import OffloadLog
from .primfunc import TensorArg, offload_primfunc
from .rewrite import Offload, act_scalars, run_pass
from .weighted import (Folded, bias_vector, check_fused_users, check_quant, check_weight_dtype,
                       fold_weighted, match_chain, weights_of)

#: MMA width in elements: 32 bytes on the C7504 (``docs/reference.md``, "FC width").
MMA_MULTIPLE = {"int8": 32, "int16": 16}

_K_OPAQUE = 8  # tvm::relax::OpPatternKind::kOpaque: FuseOps leaves the call alone
#: suffix of the ``R.nn.pad`` bindings :func:`_fc_offload` emits (then made opaque calls)
_K_PAD = "_k_pad"
_PAD_OP = tvm.ir.Op.get("relax.nn.pad")


def k_pad_primfunc(shape, k_pad: int, dtype: str) -> tvm.tirx.PrimFunc:
    """PrimFunc ``(x [..., K] dtype, y [..., k_pad] dtype)``: ``y[..., :K] = x``,
    ``y[..., K:] = 0`` (deviation (e)); ``shape`` is x's static shape, ``k_pad > K``.
    Tagged ``op_pattern = kOpaque`` so that ``FuseOps`` fuses it with nothing."""
    x = te.placeholder(tuple(int(d) for d in shape), dtype, "x")
    after = [0] * (len(shape) - 1) + [k_pad - int(shape[-1])]
    y = topi.nn.pad(x, [0] * len(shape), after, pad_value=0, name="k_padded")
    return te.create_prim_func([x, y]).with_attr("op_pattern", _K_OPAQUE)


@mutator
class _OpaqueKPads(PyExprMutator):
    """Re-emits ``main`` with each ``R.nn.pad`` bound to ``*_k_pad`` replaced by a
    ``call_tir`` of :func:`k_pad_primfunc` (the same values)."""

    def visit_var_binding_(self, binding):
        pad = binding.value
        if not (binding.var.name.endswith(_K_PAD) and isinstance(pad, relax.Call) and pad.op == _PAD_OP):
            return super().visit_var_binding_(binding)
        x = self.visit_expr(pad.args[0])
        out_shape, dtype = static_shape(binding.var), str(binding.var.ty.dtype)
        gv = self.builder_.add_func(k_pad_primfunc(static_shape(x), out_shape[-1], dtype), "fc_k_pad")
        call = relax.call_tir(gv, [x], relax.TensorType(list(out_shape), dtype))
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(call)))


def _opaque_k_pads(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with the K pads of this pass as opaque copy calls (see :class:`_OpaqueKPads`)."""
    g = Graph(mod["main"])
    if not any(b.var.name.endswith(_K_PAD) and g.call(b.var, "relax.nn.pad") is not None
               for b in g.bindings):
        return mod
    rewriter = _OpaqueKPads(mod)
    main_gv = mod.get_global_var("main")
    rewriter.builder_.update_func(main_gv, rewriter.visit_expr(mod["main"]))
    return rewriter.builder_.get()


def _input_of(graph: Graph, lhs):
    """``(dq of x, lhs if it is a reshape of that dq else None)`` for the matmul's left operand."""
    reshape = graph.call(lhs, "relax.reshape")
    if reshape is not None:
        return dequantize_of(graph, reshape.args[0]), lhs
    return dequantize_of(graph, lhs), None


def _weight_dq(graph: Graph, rhs):
    """The ``dq(W)`` under ``permute_dims`` that transposes a 2-D weight, else ``None``."""
    perm = graph.call(rhs, "relax.permute_dims")
    if perm is None:
        return None
    axes = perm.attrs.axes
    if axes is not None and [int(a) for a in axes] != [1, 0]:
        return None
    return graph.call(perm.args[0], "relax.dequantize")


def _pad_rows(a: np.ndarray, rows: int, value) -> np.ndarray:
    pad = np.full((rows - a.shape[0],) + a.shape[1:], value, dtype=a.dtype)
    return np.concatenate([a, pad]) if pad.shape[0] else a


def _pad_columns(a: np.ndarray, cols: int) -> np.ndarray:
    """``a`` [N, K] with zero columns appended up to [N, ``cols``] (same dtype)."""
    return np.pad(a, [(0, 0), (0, cols - a.shape[1])]) if cols != a.shape[1] else a


def _round_up(v: int, multiple: int) -> int:
    return math.ceil(v / multiple) * multiple


def _fc_shapes(graph: Graph, chain, binding, data, w_call, in_reshape):
    """``(x_shape, q_shape, M, K, N)`` of a matched linear; raises :class:`Declined`
    if the kernel cannot take it (dynamic shapes, no ``[M, K] x [K, N]`` view).
    K and N need not be multiples of the MMA width (padded, deviations (c), (e))."""
    x_shape, q_shape = static_shape(data.data), static_shape(binding.var)
    w_shape = static_shape(w_call.args[0])
    if None in (x_shape, static_shape(chain.anchor), q_shape, w_shape) or len(w_shape) != 2:
        raise Declined("dynamic shapes or a weight that is not 2-D")
    n, k = w_shape
    m = math.prod(x_shape[:-1])
    if x_shape[-1] != k or q_shape[-1] != n or math.prod(q_shape) != m * n:
        raise Declined(f"input {list(x_shape)} / output {list(q_shape)} do not flatten to "
                       f"[M, K={k}] x [K, N={n}]")
    if in_reshape is not None and static_shape(in_reshape) != (m, k):
        raise Declined(f"input reshape to {list(static_shape(in_reshape))} is not [M={m}, K={k}]")
    return x_shape, q_shape, m, k, n


def _fc_constants(graph: Graph, chain, data, w_call, n: int, dtype: str) -> Folded:
    """Folded weights / bias / scale / shift of a linear (:func:`~.weighted.fold_weighted`);
    raises :class:`Declined` if a check or the folding fails."""
    check_quant(data, chain.out, dtype)
    check_fused_users(graph, chain)
    weights = weights_of(dequantize_of(graph, w_call), n)
    check_weight_dtype(weights.q, dtype)
    bias = bias_vector(graph, chain.bias_operand, static_shape(chain.anchor), axis=-1)
    return fold_weighted(weights, bias, data, chain.out, dtype,
                         act_scalars(chain.act, chain.out.s, chain.out.z, dtype))


def _fc_offload(chain, data, folded, shapes, dtype: str) -> Offload:
    """Pad N (deviation (c)) and K (deviation (e)) to the MMA width and build the
    ``[R.nn.pad] + call_tir [+ slice]`` (a fused ReLU / clip is the kernel's saturation range).

    Kernel operands: x ``[..., K]`` (``[..., K_pad]`` after the pad), W ``[N_pad, K_pad]``,
    bias ``[N_pad]`` (int32 / int64), scale, shift uint8 ``[N_pad]``, out ``[..., N_pad]``;
    scalars ``M, K_pad, N_pad, act_min, act_max``."""
    x_shape, q_shape, m, k, n = shapes
    n_pad, k_pad = _round_up(n, MMA_MULTIPLE[dtype]), _round_up(k, MMA_MULTIPLE[dtype])
    notes = [folded.note] if folded.note else []
    if n_pad != n:
        notes.append(f"N={n} padded to {n_pad} (zero weight rows), output sliced back to {n}")
    if k_pad != k:
        notes.append(f"K={k} padded to {k_pad} (zero weight columns, input padded with 0)")
    w = _pad_columns(_pad_rows(folded.w, n_pad, 0), k_pad)
    consts = [const(w)] + [const(_pad_rows(a, n_pad, 0)) for a in (folded.bias, folded.scale, folded.shift)]
    kernel = find("matmul_bias", dtype)
    in_shape = x_shape[:-1] + (k_pad,)
    out_shape = q_shape[:-1] + (n_pad,)
    tensors = [TensorArg("data", in_shape, dtype), TensorArg("weight", (n_pad, k_pad), dtype),
               TensorArg("bias", (n_pad,), str(folded.bias.dtype)),
               TensorArg("scale", (n_pad,), "uint8"), TensorArg("shift", (n_pad,), "uint8"),
               TensorArg("out", out_shape, dtype)]
    out = chain.out
    prim = offload_primfunc(kernel, tensors, [m, k_pad, n_pad, *act_scalars(chain.act, out.s, out.z, dtype)])

    def build(ctx):
        x = data.data
        if k_pad != k:  # pad value 0 (any would do: zero weight columns); made opaque by _opaque_k_pads
            widths = [0] * (2 * len(x_shape) - 1) + [k_pad - k]
            x = ctx.emit(relax.op.nn.pad(ctx.remap(x), widths, pad_value=0.0), f"{chain.name}{_K_PAD}")
        res = ctx.call_offload(prim, [x, *consts], out_shape, dtype)
        if n_pad != n:
            res = relax.op.strided_slice(ctx.emit(res, f"{ctx.func_name}_padded"),
                                         axes=[len(out_shape) - 1], begin=[0], end=[n])
        return res

    return Offload(chain.name, "fc", dtype, kernel, build, "; ".join(notes) or None)


def _fc_planner(dtype: str):
    def planner(graph: Graph, binding):
        chain = match_chain(graph, binding, ("relax.matmul",), allow_reshape=True)
        if chain is None:
            return None
        data, in_reshape = _input_of(graph, chain.op.args[0])
        w_call = _weight_dq(graph, chain.op.args[1])
        if data is None or w_call is None or str(data.data.ty.dtype) != dtype:
            return None  # not a Q/DQ linear of this pass's dtype
        with declining(chain.name, "fc", dtype):
            shapes = _fc_shapes(graph, chain, binding, data, w_call, in_reshape)
            folded = _fc_constants(graph, chain, data, w_call, shapes[4], dtype)
            return _fc_offload(chain, data, folded, shapes, dtype)

    return planner


def offload_fc_i8(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """int8 fully connected -> ``mmalib_matmul_bias_i8``.

    Extern args (c7x_kernels.h): in int8[M,K], w int8[N,K] (torch layout, transposed
    inside the kernel), bias int32[N], scale uint8[N], shift uint8[N], out int8[M,N], M, K, N
    (K and N padded to multiples of 32 if needed, deviations (c), (e)).
    """
    return _opaque_k_pads(run_pass(mod, log, "fc_i8", _fc_planner("int8")))


def offload_fc_i16(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """int16 fully connected, zero points 0 -> ``mmalib_matmul_bias_i16``
    (int16 in/w/out, int64 bias; K and N padded to multiples of 16; int8 weights are widened and pre-scaled
    per channel, :mod:`pipeline.backend.fold` "pre-scaling")."""
    return _opaque_k_pads(run_pass(mod, log, "fc_i16", _fc_planner("int16")))
