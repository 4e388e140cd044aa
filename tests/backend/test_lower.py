"""Scalar-path rewrites and lowering: integer weights, torch-exact quantize, int8
activations between kernels, a lowered main the emitter can walk, offload
PrimFuncs left alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from tvm import relax, tirx
from tvm.ir import GenericConst

from qflow import ConvReluPool, InvertedResidual, ResidualBlock, quantize, randomize_bn

from pipeline.backend.compile import compile_model
from pipeline.backend.interp import llvm_target, run_reference
from pipeline.backend.lower import compact_schedule, is_offload, lower_module
from pipeline.backend.passes.scalar import LEGALIZE_MAP, rewrite_scalar, torch_quantize_np

ALLOWED_MAIN_OPS = {"relax.memory.alloc_storage", "relax.memory.alloc_tensor",
                    "relax.builtin.alloc_tensor", "relax.reshape"}


@pytest.fixture(scope="module")
def crp_int8():
    torch.manual_seed(0)
    return quantize(randomize_bn(ConvReluPool()), torch.randn(1, 3, 16, 16), dtype="int8")


@pytest.fixture(scope="module")
def inv_int16():
    torch.manual_seed(0)
    return quantize(randomize_bn(InvertedResidual(stride=2, cout=48)), torch.randn(1, 32, 8, 8),
                    dtype="int16")


def _bindings(func):
    for block in func.body.blocks:
        yield from block.bindings


def _tensor_consts(func):
    found = []
    relax.analysis.post_order_visit(func.body, lambda e: found.append(e) if isinstance(
        e, GenericConst) and isinstance(e.ty, relax.TensorType) else None)
    return found


def _op(call):
    return call.op.name if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) else None


@pytest.mark.parametrize("flow", ["crp_int8", "inv_int16"])
def test_conv_and_matmul_run_on_integer_weights(flow, request):
    f = request.getfixturevalue(flow)
    mod, log = rewrite_scalar(f.mod)
    rewrites = [e for e in log if e["rewrite"] in ("int_conv2d", "int_matmul")]
    assert rewrites and all(e["done"] for e in rewrites), log
    for b in _bindings(mod["main"]):
        if _op(b.value) in ("relax.nn.conv2d", "relax.matmul"):
            x, w = b.value.args
            assert str(x.ty.dtype) in ("int8", "int16")
            assert isinstance(w, GenericConst) and str(w.value.dtype) in ("int8", "int16")
            assert str(b.value.attrs.out_dtype) in ("int32", "int64")
        if _op(b.value) == "relax.dequantize":
            assert not isinstance(b.value.args[0], GenericConst), "a weight is still dequantized"


def test_lowered_main_is_static_and_weights_stay_integer(crp_int8):
    low = lower_module(crp_int8.mod, mmalib=False).mod
    main = low["main"]
    for b in _bindings(main):
        v = b.value
        if isinstance(v, relax.Call):
            assert isinstance(v.op, tvm.ir.GlobalVar) or _op(v) in ALLOWED_MAIN_OPS, _op(v)
        else:
            assert isinstance(v, (relax.Var, relax.Tuple)), type(v)
    weights = [c.value.numpy() for c in _tensor_consts(main)]
    conv_like = [w for w in weights if w.ndim >= 2 and w.shape[0] * w.shape[1] > 64]
    assert conv_like and all(w.dtype == np.int8 for w in conv_like), [(w.dtype, w.shape) for w in conv_like]
    # Float constants are per-channel vectors (multipliers, biases), never a weight matrix.
    floats = [w.shape for w in weights if w.dtype.kind == "f"]
    assert floats and all(sum(d > 1 for d in shape) <= 1 for shape in floats), floats


def test_conv_outputs_stay_quantized(crp_int8):
    """The dequantize is fused forward, so every conv/matmul kernel writes int8."""
    low = lower_module(crp_int8.mod, mmalib=False).mod
    outs = {}
    for b in _bindings(low["main"]):
        v = b.value
        if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.GlobalVar):
            outs[v.op.name_hint] = str(v.args[-1].ty.dtype)
    convs = {k: d for k, d in outs.items() if "conv2d" in k or "matmul" in k}
    assert convs and set(convs.values()) == {"int8"}, outs


def _quantize_module(scale: float, zp: int, dtype: str, n: int) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([n], "float32"))
    with bb.function("main", [x]):
        q = bb.emit(relax.op.quantize(x, relax.const(np.float32(scale)), relax.const(zp, dtype),
                                      axis=-1, out_dtype=dtype))
        bb.emit_func_output(q)
    return bb.get()


def _run_llvm(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    ex = tvm.compile(mod, target=llvm_target())
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


@pytest.mark.parametrize("dtype,zp", [("int8", 0), ("int8", -17), ("int16", 0)])
def test_quantize_legalization_is_torch_exact(dtype, zp):
    """Values at and next to every rounding midpoint: ours equals torch, TVM's
    default legalization (divide by scale) does not."""
    rng = np.random.default_rng(1)
    scale = float(np.float32(0.0137))
    lo, hi = (-128, 127) if dtype == "int8" else (-32768, 32767)
    k = rng.integers(lo // 2, hi // 2, 4000).astype(np.float64) + 0.5
    x = (k * scale).astype(np.float32)
    x = np.concatenate([x, np.nextafter(x, np.float32(np.inf)), np.nextafter(x, np.float32(-np.inf))])
    torch_q = torch.ops.quantized_decomposed.quantize_per_tensor(
        torch.from_numpy(x), scale, zp, lo, hi, getattr(torch, dtype)).numpy()
    mod = _quantize_module(scale, zp, dtype, len(x))
    ours = _run_llvm(relax.transform.LegalizeOps(customize_legalize_map=LEGALIZE_MAP)(mod), x)
    default = _run_llvm(relax.transform.LegalizeOps()(mod), x)
    np.testing.assert_array_equal(ours, torch_q)
    np.testing.assert_array_equal(torch_quantize_np(x, scale, zp, dtype), torch_q)
    assert (default != torch_q).sum() > 0  # the test can tell the two formulas apart


def test_asymmetric_input_zero_point_is_exact(tmp_path):
    """int8 affine activations (zp != 0): padding with zp and the sum(W) correction."""
    torch.manual_seed(0)
    f = quantize(randomize_bn(ResidualBlock()), torch.randn(1, 32, 8, 8), dtype="int8",
                 symmetric_activations=False)
    zps = [int(b.value.args[2].value.numpy()) for b in _bindings(f.mod["main"])
           if _op(b.value) == "relax.dequantize" and not isinstance(b.value.args[0], GenericConst)]
    assert any(z != 0 for z in zps), "the quantizer gave no nonzero zero point"
    mod, log = rewrite_scalar(f.mod)
    ops = [_op(b.value) for b in _bindings(mod["main"])]
    assert "relax.nn.pad" in ops and "relax.subtract" in ops
    # Numbers: the whole model against torch, element by element.
    compile_model(f.mod, "asym", tmp_path, mmalib=False)
    x = np.random.default_rng(2).standard_normal((2, 32, 8, 8)).astype(np.float32)
    ours = run_reference(tmp_path, x)
    with torch.no_grad():
        ref = np.concatenate([f.qdq(torch.from_numpy(x[i:i + 1])).numpy() for i in range(2)])
    scale = [n.args[1] for n in f.ep.graph.nodes if "dequantize_per_tensor" in str(n.target)][-1]
    assert np.abs(np.rint(ours / scale) - np.rint(ref / scale)).max() <= 1


def _uncompacted_fused_conv(flow) -> tirx.PrimFunc:
    """The first fused conv PrimFunc of ``flow`` lowered with compact_schedule disabled."""
    from pipeline.backend import lower as lower_mod

    original = lower_mod.compact_schedule
    lower_mod.compact_schedule = lambda f: f
    try:
        low = lower_module(flow.mod, mmalib=False).mod
    finally:
        lower_mod.compact_schedule = original
    return next(f for gv, f in low.functions.items() if gv.name_hint.startswith("fused_conv2d"))


def _run_primfunc(func: tirx.PrimFunc, seed: int) -> np.ndarray:
    """Build ``func`` with the interpreter's LLVM target, run it on seeded random
    inputs (small floats, full-range integers) and return its last (output) buffer."""
    from pipeline.backend.interp import _aligned_zeros

    rng = np.random.default_rng(seed)
    lib = tvm.tirx.build(tvm.IRModule({"f": func.with_attr("global_symbol", "f")}), target=llvm_target())
    arrays = []
    for p in func.params:
        shape, dtype = tuple(int(d) for d in p.shape), str(p.dtype)
        a = _aligned_zeros(shape, dtype)
        if np.dtype(dtype).kind == "f":
            a[...] = rng.standard_normal(shape) * 0.01
        else:
            info = np.iinfo(dtype)
            a[...] = rng.integers(info.min, info.max, shape, endpoint=True)
        arrays.append(a)
    lib["f"](*[tvm.runtime.from_dlpack(a) for a in arrays])
    return arrays[-1]


def test_compact_schedule_keeps_arithmetic_and_drops_scratch(crp_int8):
    """Same bits out of the scheduled kernel, far less workspace in its C."""
    from pipeline.backend.kernel_source import kernel_source

    raw = _uncompacted_fused_conv(crp_int8)
    compacted = compact_schedule(raw)
    tvm.ir.assert_structural_equal(compact_schedule(compacted), compacted)  # idempotent
    ws_raw = kernel_source(tvm.IRModule({"f": raw}), "a_").workspace["f"]
    ws_new = kernel_source(tvm.IRModule({"f": compacted}), "a_").workspace["f"]
    assert ws_new < ws_raw / 4, (ws_raw, ws_new)
    np.testing.assert_array_equal(_run_primfunc(raw, 3), _run_primfunc(compacted, 3))


def test_offload_primfuncs_survive_untouched(crp_int8):
    from pipeline.backend.passes.pipeline import run_offload

    offloaded, _ = run_offload(crp_int8.mod)
    low = lower_module(crp_int8.mod, mmalib=True).mod
    before = {gv.name_hint: f for gv, f in offloaded.functions.items() if is_offload(f)}
    after = {gv.name_hint: f for gv, f in low.functions.items() if is_offload(f)}
    assert before and set(before) == set(after)
    for name, f in after.items():
        assert int(f.attrs["op_pattern"]) == 8  # kOpaque: never fused
        tvm.ir.assert_structural_equal(f.without_attr("op_pattern"), before[name])


_INIT_IN_LOOP = r"if \(\w+ == 0\) \{\s+\w+\[[^\]]+\] = 0;"


def test_reduction_init_is_hoisted_out_of_the_mac_loop(crp_int8):
    """TVM's LowerInitBlock writes ``if (rc == 0) acc = 0;`` inside the MAC
    loop; after compact_schedule the C zeroes the accumulator before the loop."""
    import re

    from pipeline.backend.kernel_source import kernel_source

    raw = _uncompacted_fused_conv(crp_int8)
    src_raw = kernel_source(tvm.IRModule({"f": raw}), "a_").source
    src_new = kernel_source(tvm.IRModule({"f": compact_schedule(raw)}), "a_").source
    assert re.search(_INIT_IN_LOOP, src_raw)
    assert not re.search(_INIT_IN_LOOP, src_new)
    assert re.search(r"\w+\[0\] = 0;\s+(int32_t \w+ = [^;]+;\s+)*for \(", src_new)
