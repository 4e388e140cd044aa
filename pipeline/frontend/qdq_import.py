"""Import a PT2E Q/DQ ExportedProgram into Relax.

Upstream ``from_exported_program`` rejects torchao's ``quantized_decomposed``
ops; ``custom_convert_map`` maps them onto ``R.quantize`` / ``R.dequantize``:

=========================================  =====================================================
torch op (args)                            Relax
=========================================  =====================================================
quantize_per_tensor(x, s, zp, lo, hi, dt)  ``R.quantize(x, const s:f32, const zp:dt)`` (+ ``R.clip``
                                           to [lo, hi] if narrower than dt's range)
dequantize_per_tensor(q, s, zp, ...)       ``R.dequantize(q, const s:f32, const zp:dt)`` -> f32
dequantize_per_channel(q, S, ZP, axis..)   ``R.dequantize(q, S:f32[C], ZP:dt[C], axis)``
quantize_per_channel(x, S, ZP, axis, ...)  ``R.quantize(x, S, ZP, axis)``
=========================================  =====================================================

Scales stay exactly the float32 values torch computed. Per-channel zero
points (int64 buffers in torch) become constants of the quantized dtype, so no
``astype`` node sits between a weight and its dequantize (patterns stay simple).
"""

from __future__ import annotations

import numpy as np
import torch
import tvm
from tvm import relax
from tvm.ir import GenericConst as Constant
from tvm.relax.expr_functor import PyExprMutator, mutator

_ASTYPE = tvm.ir.Op.get("relax.astype")

_DT = {torch.int8: "int8", torch.uint8: "uint8", torch.int16: "int16", torch.int32: "int32"}
_RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767),
          "int32": (-2**31, 2**31 - 1)}


def _dtype(dt) -> str:
    if dt not in _DT:
        raise NotImplementedError(f"quantized dtype {dt} is not supported (int8/int16 only)")
    return _DT[dt]


def _as_dtype(expr, dtype: str, bb):
    """``R.astype`` (torch buffers are still Vars here; :func:`fold_constant_casts`
    turns the cast into a constant once the importer has bound them)."""
    return bb.emit(relax.op.astype(expr, dtype))


@mutator
class _CastFolder(PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if (call.op == _ASTYPE and isinstance(call.args[0], Constant)):
            dtype = str(call.attrs.dtype)
            return relax.const(call.args[0].value.numpy().astype(dtype), dtype)
        return call


def fold_constant_casts(mod: tvm.IRModule) -> tvm.IRModule:
    """Replace ``R.astype(constant)`` by the cast constant in ``main``.

    Unlike ``FoldConstant`` this leaves ``dequantize(int8 weight)`` alone, so
    weights stay integer until the backend decides how to lower them."""
    folder = _CastFolder(mod)
    main = folder.visit_expr(mod["main"])
    mod = mod.__class__({gv: f for gv, f in mod.functions.items() if gv.name_hint != "main"})
    mod["main"] = main
    return relax.transform.DeadCodeElimination()(relax.transform.CanonicalizeBindings()(mod))


def _clip_to_range(bb, q, dtype: str, lo: int, hi: int):
    if (lo, hi) == _RANGE[dtype]:
        return q
    return bb.emit(relax.op.clip(q, lo, hi))


def _quantize_per_tensor(node, importer):
    x, scale, zp, lo, hi, dt = importer.retrieve_args(node)[:6]
    d = _dtype(dt)
    bb = importer.block_builder
    q = bb.emit(relax.op.quantize(x, relax.const(np.float32(scale), "float32"),
                                  relax.const(int(zp), d), axis=-1, out_dtype=d))
    return _clip_to_range(bb, q, d, lo, hi)


def _dequantize_per_tensor(node, importer):
    q, scale, zp, _lo, _hi, dt = importer.retrieve_args(node)[:6]
    return importer.block_builder.emit(relax.op.dequantize(
        q, relax.const(np.float32(scale), "float32"), relax.const(int(zp), _dtype(dt)),
        axis=-1, out_dtype="float32"))


def _dequantize_per_channel(node, importer):
    q, scales, zps, axis, _lo, _hi, dt = importer.retrieve_args(node)[:7]
    bb = importer.block_builder
    return bb.emit(relax.op.dequantize(q, _as_dtype(scales, "float32", bb), _as_dtype(zps, _dtype(dt), bb),
                                       axis=int(axis), out_dtype="float32"))


def _quantize_per_channel(node, importer):
    x, scales, zps, axis, lo, hi, dt = importer.retrieve_args(node)[:7]
    d = _dtype(dt)
    bb = importer.block_builder
    q = bb.emit(relax.op.quantize(x, _as_dtype(scales, "float32", bb), _as_dtype(zps, d, bb),
                                  axis=int(axis), out_dtype=d))
    return _clip_to_range(bb, q, d, lo, hi)


def _div_with_mode(node, importer):
    """``aten.div.Tensor_mode(x, y, rounding_mode)``: as TVM's ``_div``, but a Python
    number ``y`` becomes a constant of ``x``'s dtype. TVM makes it ``relax.const(y)``
    (int32), which ``floor_divide`` of YOLO26's int64 topk indices by the class
    count rejects ("Binary operators must have the same datatype")."""
    x, y = importer.retrieve_args(node)[:2]
    mode = node.args[2] if len(node.args) > 2 else node.kwargs.get("rounding_mode")
    if isinstance(y, (int, float)):
        y = relax.const(y, x.ty.dtype)
    bb = importer.block_builder
    if mode is None:
        return bb.emit(relax.op.divide(x, y))
    if mode == "floor":
        return bb.emit(relax.op.floor_divide(x, y))
    if mode == "trunc":
        return bb.emit(relax.op.trunc(bb.emit(relax.op.divide(x, y))))
    raise ValueError(f"div: unsupported rounding_mode {mode!r}")


QDQ_CONVERT_MAP = {
    "div.Tensor_mode": _div_with_mode,
    "quantize_per_tensor.default": _quantize_per_tensor,
    "dequantize_per_tensor.default": _dequantize_per_tensor,
    "dequantize_per_channel.default": _dequantize_per_channel,
    "quantize_per_channel.default": _quantize_per_channel,
}


def import_exported_program(ep: torch.export.ExportedProgram) -> tuple[tvm.IRModule, dict[str, np.ndarray]]:
    """Relax IRModule of ``ep`` and its parameters (see :func:`import_with_provenance`)."""
    mod, params, _ = import_with_provenance(ep)
    return mod, params


def import_with_provenance(ep: torch.export.ExportedProgram
                           ) -> tuple[tvm.IRModule, dict[str, np.ndarray], dict[str, dict]]:
    """Relax IRModule of ``ep``, its parameters, and each binding's provenance.

    Returns ``(mod, params, layers)``: ``mod["main"]`` takes the model input
    first, then one argument per entry of ``params`` (same order; the float
    biases torch keeps as parameters). Quantized weights and scales are
    constants in ``mod``. ``layers`` maps binding names of ``main`` to the
    PyTorch module path and source line of the FX node they came from
    (:func:`pipeline.frontend.provenance.attribute_bindings`).

    Same import as ``from_exported_program(ep, keep_params_as_input=True,
    custom_convert_map=...)``, run through its importer class so the FX node
    -> Relax value table stays readable. Raises
    :class:`~pipeline.errors.UnsupportedOpError` for an op the frontend lacks.
    """
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    from ..errors import UnsupportedOpError
    from .provenance import attribute_bindings, binding_names, rename_bindings

    importer = ExportedProgramImporter()
    try:
        mod = importer.from_exported_program(ep.run_decompositions(), True, False, False, QDQ_CONVERT_MAP)
    except (AssertionError, KeyError, NotImplementedError, ValueError) as e:
        raise UnsupportedOpError(f"TVM's torch frontend cannot import this program: {e}") from None
    layers = attribute_bindings(mod["main"], importer.env)
    mod, params = relax.frontend.detach_params(mod)
    mod = fold_constant_casts(mod)
    names = [p.name for p in mod["main"].params[1:]]
    values = params.get("main", [])
    kept = {b.var.name for block in mod["main"].body.blocks for b in block.bindings}
    layers = {k: v for k, v in layers.items() if k in kept}
    renamed = binding_names(mod["main"], layers)
    mod = rename_bindings(mod, renamed)
    layers = {renamed.get(k, k): v for k, v in layers.items()}
    return mod, {n: v.numpy() for n, v in zip(names, values)}, layers
