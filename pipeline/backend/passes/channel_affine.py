"""Offload of an unfolded BatchNorm (+ ReLU) to the C7x channel-affine kernels.

A BatchNorm that follows a conv is folded into it before quantization; one that
does not (DenseNet's pre-activation ``BN -> ReLU`` before each conv, fed by a
``torch.cat`` of earlier int8 features, which the quantizer leaves unannotated
like the reference's, ``pipeline/quant/rules.py``) stays a float
``R.nn.batch_norm`` between dequantizes and a quantize. Patterns
(``docs/reference.md``, "Channel affine"); ``src`` is ``dq(x)`` or
``concat((dq(x_1), ..., dq(x_k)), axis=1)``, ``bn`` is ``batch_norm(src)[0]``::

    q(relu(bn))                        (torchvision's inplace ReLU: one quantize)
    q_r(relu(dq(q_b(bn), s_b, z_b)))   (ReLU observed on its own: two quantizes)
    q_b(bn)                            (no ReLU, or one the pass cannot fuse)
      ->  call_tir(c7x_int{8,16}_channel_affine, cat_int(x_1, ..., x_k), params)

The kernel dequantizes each channel with its own part's zero point and scale,
so the concat is moved onto the integers (``R.concat`` of the int8 / int16
parts: data movement, left to the scalar path, 1 / 4 of the float copy it
replaces) and the float dequantize + concat + batch_norm + quantize (+ ReLU +
requantize) run in one kernel, in float32 exactly as torch computes them
(:func:`pipeline.backend.kernels.reference.batch_norm_affine`, ``fma_f32``).

Eligibility: inference batch_norm (``training=False``) over axis 1 of a tensor
of rank >= 2 with static shape, constant float32 gamma / beta / mean / var;
every part a computed tensor dequantized with constant scalar parameters, of
the output's dtype (int8 or int16); a concat over axis 1; constant scalar
quantize parameters with finite scales > 0; the batch_norm tuple and its
element used only by the next op of the pattern; ``|alpha|, |beta|,
in_scale <= 2^40`` (the kernel's bound). A ReLU is fused when every
intermediate has that single use and (two-quantize form) the dequantize has
the quantize's parameters and both quantizes one dtype; otherwise the
batch_norm is offloaded alone and the ReLU left to :mod:`.relu`.

The same kernel takes a per-channel layer scale (ConvNeXt's ``gamma * x``, gamma a float32
``[C, 1, 1]`` constant): ``q(multiply(dq(x), gamma))`` -> ``c7x_*_channel_affine`` with alpha
= gamma, beta = 0, no ReLU (:func:`_plan_layer_scale`).

The fused ReLU gets its own offload decision in the log (same PrimFunc, note
"fused into ..."), so the manifest shows it on the C7x kernel that runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from ...config import DTYPES
from ..kernels.catalog import find
from ..kernels.reference import AFFINE_LIMIT, batch_norm_affine, channel_affine_params
from ..refusal import Declined, declining
from .graph import QDQ, Graph, const, const_array, dequantize_of, quantize_of, static_shape, var_name
from .log import OFFLOADED, OffloadLog
from .primfunc import TensorArg, backend_of, offload_primfunc
from .requantize import inverse_scale
from .rewrite import Offload, run_pass

PASS_NAME = "channel_affine"


@dataclass
class _BatchNorm:
    """A matched ``batch_norm(src)[0]``: the tuple binding (the layer's anchor), its
    call, and the dequantized parts of ``src`` in channel order."""

    var: object
    call: object
    parts: list


def _batch_norm_of(graph: Graph, expr) -> _BatchNorm | None:
    """``expr`` as element 0 of an ``R.nn.batch_norm`` of ``dq(x)`` or of a concat
    of dequantizes; ``None`` if it is not a batch_norm result at all. Raises
    :class:`Declined` (outside a ``declining`` block: the caller locates it) if the
    batch_norm's input is not of that form."""
    item = graph.value.get(expr) if isinstance(expr, relax.Var) else None
    if not isinstance(item, relax.TupleGetItem) or int(item.index) != 0:
        return None
    call = graph.call(item.tuple_value, "relax.nn.batch_norm")
    if call is None:
        return None
    return _BatchNorm(item.tuple_value, call, _parts(graph, call.args[0]))


def _parts(graph: Graph, src) -> list:
    """The dequantized parts of a batch_norm input (``dq(x)`` or ``concat((dq...), 1)``)
    or an empty list if it is neither (the caller declines)."""
    single = dequantize_of(graph, src)
    if single is not None:
        return [single]
    cat = graph.call(src, "relax.concat")
    if cat is None or not isinstance(cat.args[0], relax.Tuple):
        return []
    rank = len(static_shape(src) or ())
    if cat.attrs.axis is None or rank < 2 or int(cat.attrs.axis) % rank != 1:
        return []
    parts = [dequantize_of(graph, f) for f in cat.args[0].fields]
    return parts if all(p is not None for p in parts) else []


def _check_quantize(q: QDQ, dtype: str, what: str) -> None:
    if q.out_dtype != dtype:
        raise Declined(f"{what} quantize is {q.out_dtype}, the input {dtype}")
    if not q.scalar:
        raise Declined(f"{what} quantize has non-constant or per-channel parameters")
    s = np.float32(q.s)
    if not (np.isfinite(s) and s > 0):
        raise Declined(f"{what} scale {q.s} is not finite and positive")


def _params(graph: Graph, bn: _BatchNorm, dtype: str):
    """(shape, params blob) of an eligible batch_norm; raises :class:`Declined`."""
    a = bn.call.attrs
    shape = static_shape(bn.call.args[0])
    if bool(a.training):
        raise Declined("training-mode batch_norm")
    if shape is None or len(shape) < 2 or int(a.axis) % len(shape) != 1:
        raise Declined("not a static-shape batch_norm over axis 1")
    if not bn.parts:
        raise Declined("input is neither a dequantize nor a channel concat of dequantizes")
    c = shape[1]
    consts = [const_array(v) for v in bn.call.args[1:5]]
    if any(v is None or v.dtype != np.float32 or v.size != c for v in consts):
        raise Declined("gamma / beta / mean / var are not float32 constants of one per channel")
    gamma, beta, mean, var = (v.reshape(c) for v in consts)
    zps, scales = [], []
    for p in bn.parts:
        if str(p.data.ty.dtype) != dtype:
            raise Declined(f"concat parts of dtypes {dtype} and {p.data.ty.dtype}")
        if not p.scalar:
            raise Declined("a part's dequantize has non-constant or per-channel parameters")
        if const_array(p.data) is not None:
            raise Declined("a part is a compile-time constant")
        part_c = static_shape(p.data)[1]
        zps += [p.z] * part_c
        scales += [np.float32(p.s)] * part_c
    if not graph.single_use(bn.var):
        raise Declined(f"batch_norm tuple {var_name(bn.var)} has other users")
    alpha, shift = batch_norm_affine(gamma if a.scale else None, beta if a.center else None,
                                     mean, var, float(a.epsilon))
    scales = np.asarray(scales, np.float32)
    if not all(np.all(np.abs(v) <= AFFINE_LIMIT) for v in (alpha, shift, scales)) or not np.all(scales > 0):
        raise Declined("a scale, gamma / sqrt(var + eps) or shift exceeds the kernel's 2^40 bound")
    return shape, channel_affine_params(np.asarray(zps), scales, alpha, shift)


@dataclass
class _Match:
    bn: _BatchNorm
    mid: QDQ                 # the quantize right after the batch_norm (the relu's in the 1-q form)
    out: QDQ                 # the root quantize
    relu: object | None      # the relu binding var when fused
    dtype: str
    floats: tuple = ()       # float intermediates the rewrite swallows (each must have one use)


def _users(graph: Graph) -> dict:
    users: dict = {}
    for b in graph.bindings:
        for v in relax.analysis.free_vars(b.value):
            users.setdefault(v, []).append(b)
    return users


def _fusable_tail(graph: Graph, users: dict, q_var, q: QDQ) -> bool:
    """``q_var`` (a batch_norm's quantize) feeds only ``q_r(relu(dq(q_var)))`` with the
    dequantize's parameters equal to ``q``'s and ``q_r`` of ``q``'s dtype."""
    chain = []
    v = q_var
    for op in ("relax.dequantize", "relax.nn.relu", "relax.quantize"):
        us = users.get(v, [])
        if len(us) != 1 or not graph.single_use(v) or graph.call(us[0].value, op) is None:
            return False
        chain.append(us[0])
        v = us[0].var
    dq = dequantize_of(graph, chain[0].value)
    q_r = quantize_of(graph, chain[2].value)
    return (dq.same_params(q) and q_r.out_dtype == q.out_dtype and q_r.scalar
            and bool(np.isfinite(np.float32(q_r.s)) and np.float32(q_r.s) > 0))


def _match(graph: Graph, users: dict, binding) -> _Match | None:
    """The pattern rooted at ``binding`` (a quantize), or ``None``."""
    out = quantize_of(graph, binding.value)
    if out is None or not isinstance(out.data, relax.Var):
        return None
    relu = graph.call(out.data, "relax.nn.relu")
    if relu is None:
        bn = _batch_norm_of(graph, out.data)
        if bn is None or _fusable_tail(graph, users, binding.var, out):
            return None   # not ours, or the relu's quantize will take it
        return _Match(bn, out, out, None, out.out_dtype, (out.data,))
    inner = relu.args[0]
    bn = _batch_norm_of(graph, inner)
    if bn is not None:                                   # q(relu(bn))
        return _Match(bn, out, out, out.data, out.out_dtype, (inner, out.data))
    dq = dequantize_of(graph, inner)
    mid = quantize_of(graph, dq.data) if dq is not None else None
    if mid is None or not _fusable_tail(graph, users, dq.data, mid):
        return None
    bn = _batch_norm_of(graph, mid.data)
    return _Match(bn, mid, out, out.data, mid.out_dtype, (mid.data,)) if bn is not None else None


def _plan(graph: Graph, m: _Match) -> Offload:
    dtype = m.dtype
    _check_quantize(m.mid, dtype, "batch_norm output")
    _check_quantize(m.out, dtype, "relu output")
    for v in m.floats:
        if not graph.single_use(v):
            raise Declined(f"float intermediate {var_name(v)} has other users")
    shape, blob = _params(graph, m.bn, dtype)
    n, c, hw = shape[0], shape[1], int(np.prod(shape[2:], dtype=np.int64))
    kernel = find("channel_affine", dtype)
    mid_s = float(np.float32(m.mid.s))
    scalars = [n, c, hw, m.mid.z, mid_s, inverse_scale(mid_s), int(m.relu is not None), m.out.z,
               inverse_scale(float(np.float32(m.out.s)))]
    prim = offload_primfunc(kernel, [TensorArg("data", shape, dtype), TensorArg("params", blob.shape, "uint8"),
                                     TensorArg("out", shape, dtype)], scalars)
    params = const(blob)
    sources = [p.data for p in m.bn.parts]
    anchor = var_name(m.bn.var)

    def build(ctx):
        src = sources[0]
        if len(sources) > 1:   # the concat, moved onto the integer parts
            src = ctx.emit(relax.op.concat([ctx.remap(s) for s in sources], axis=1), f"{anchor}_cat")
        return ctx.call_offload(prim, [src, params], shape, dtype)

    parts = f"{len(sources)} parts" if len(sources) > 1 else "1 input"
    relu = ", relu" if m.relu is not None else ""
    return Offload(anchor, "batch_norm", dtype, kernel, build,
                   note=f"torch's dequantize ({parts}), batch_norm (fused multiply-add){relu} and "
                        f"quantize in float32")


def _layer_scale_gamma(mul) -> tuple[object, np.ndarray] | None:
    """``(the other operand, gamma float32 [C])`` when ``mul`` multiplies a tensor of rank >= 2
    by a float32 constant of one value per channel of axis 1 (ConvNeXt's layer scale, a
    ``[C, 1, 1]`` parameter on NCHW), else None."""
    for k in (0, 1):
        gamma, other = const_array(mul.args[k]), mul.args[1 - k]
        shape = static_shape(other)
        if gamma is None or gamma.dtype != np.float32 or shape is None or len(shape) < 2 or gamma.ndim > len(shape):
            continue
        padded = (1,) * (len(shape) - gamma.ndim) + gamma.shape
        if padded[1] == shape[1] and all(d == 1 for i, d in enumerate(padded) if i != 1):
            return other, gamma.reshape(shape[1])
    return None


def _plan_layer_scale(graph: Graph, out: QDQ) -> Offload | None:
    """``q(multiply(dq(x), gamma))`` with gamma one float32 per channel of axis 1 ->
    ``c7x_*_channel_affine`` with alpha = gamma, beta = 0 and no ReLU: the kernel's
    ``fma(x, gamma, 0)`` is torch's float32 product, rounded once, so it equals the Q/DQ
    model. None when ``out`` quantizes no such product; raises :class:`Declined` when it is one
    the kernel cannot take."""
    mul = graph.call(out.data, "relax.multiply") if isinstance(out.data, relax.Var) else None
    found = _layer_scale_gamma(mul) if mul is not None else None
    dq = dequantize_of(graph, found[0]) if found is not None else None
    if dq is None or str(dq.data.ty.dtype) not in DTYPES:
        return None
    dtype, gamma = str(dq.data.ty.dtype), found[1]
    with declining(var_name(out.data), "multiply", dtype):
        _check_quantize(out, dtype, "layer scale output")
        if not dq.scalar or const_array(dq.data) is not None:
            raise Declined("input is a constant or its dequantize has non-constant or per-channel parameters")
        if not graph.single_use(out.data):
            raise Declined(f"float intermediate {var_name(out.data)} has other users")
        if not np.all(np.abs(gamma) <= AFFINE_LIMIT) or abs(np.float32(dq.s)) > AFFINE_LIMIT:
            raise Declined("a scale or gamma exceeds the kernel's 2^40 bound")
        shape = static_shape(dq.data)
        n, c, hw = shape[0], shape[1], int(np.prod(shape[2:], dtype=np.int64))
        blob = channel_affine_params(dq.z, np.float32(dq.s), gamma, np.zeros_like(gamma))
        kernel = find("channel_affine", dtype)
        out_s = float(np.float32(out.s))
        out_inv = inverse_scale(out_s)
        # no ReLU: the mid quantize is the output's (the kernel's requantize after it is unused)
        scalars = [n, c, hw, out.z, out_s, out_inv, 0, out.z, out_inv]
        prim = offload_primfunc(kernel, [TensorArg("data", shape, dtype), TensorArg("params", blob.shape, "uint8"),
                                         TensorArg("out", shape, dtype)], scalars)
        params, src = const(blob), dq.data
        return Offload(var_name(out.data), "multiply", dtype, kernel,
                       lambda ctx: ctx.call_offload(prim, [src, params], shape, dtype),
                       note="a per-channel layer scale: torch's dequantize, multiply and quantize in float32")


def offload_channel_affine(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """int8 / int16 ``q(batch_norm(dq | concat(dq...)))`` with an optional ReLU (both
    forms of the module docstring) -> ``c7x_int{8,16}_channel_affine(in, params, out, N,
    C, hw, mid_zp, mid_scale, mid_inv_scale, has_relu, out_zp, out_inv_scale)``, in
    [N, C, prod(rest)] (the parts concatenated as integers), params uint8 [C * 16]. Each
    fused ReLU is logged as offloaded to the same PrimFunc."""
    log = log if log is not None else OffloadLog()
    fused: list = []
    cache: dict = {}

    def planner(graph: Graph, binding):
        if id(graph) not in cache:
            cache.clear()
            cache[id(graph)] = _users(graph)
        m = _match(graph, cache[id(graph)], binding)
        if m is None:
            out = quantize_of(graph, binding.value)
            return _plan_layer_scale(graph, out) if out is not None else None
        if m.dtype not in DTYPES:
            return None
        with declining(var_name(m.bn.var), "batch_norm", m.dtype):
            item = _plan(graph, m)
        if m.relu is not None:
            fused.append((item.anchor, var_name(m.relu), m.dtype, item.kernel))
        return item

    mod = run_pass(mod, log, PASS_NAME, planner)
    for anchor, relu, dtype, kernel in fused:
        d = log.for_anchor(anchor)
        if d is not None and d.status == OFFLOADED:
            log.offloaded(PASS_NAME, relu, "relu", dtype, kernel, backend_of(kernel), d.func,
                          note=f"fused into {anchor}'s {kernel} call")
    return mod
