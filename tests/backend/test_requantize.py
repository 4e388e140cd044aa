"""The int8 <-> int16 requantize kernels and their pass.

Kernel level: the host C (gcc, via ``hostlib``) == the numpy twin
(``kernels.reference``) == torch's ``quantize_per_tensor(dequantize_per_tensor(x))``
bit for bit, both directions, odd sizes, nonzero int8 zero points, exact
rounding ties and saturation; bad parameters give the same status in C and
Python and leave the output untouched.

Pass level: a hand-built ``q(dq(x))`` at an int8 <-> int16 boundary, or within one
dtype with other parameters, becomes one call of the kernel with torch's
reciprocal; identity pairs and constant inputs are left alone / declined; a compiled model with boundaries gives the
same output bits with the kernel (MMALIB build) and with TVM's legalised
Q/DQ (scalar build).
"""

from __future__ import annotations

import shutil
import zlib

import numpy as np
import pytest
import torch
from tvm import relax

from pipeline import torchenv  # noqa: F401  (quantized_decomposed ops registered)
from pipeline.backend.kernels import hostlib
from pipeline.backend.kernels import reference as ref
from pipeline.backend.kernels.catalog import KERNELS
from pipeline.backend.passes.log import OffloadLog
from pipeline.backend.passes.offload_calls import offload_calls
from pipeline.backend.passes.requantize import inverse_scale, offload_requantize

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the host kernels")

DIRECTIONS = {"c7x_requantize_i8_i16": (np.int8, np.int16), "c7x_requantize_i16_i8": (np.int16, np.int8),
              "c7x_requantize_i8_i8": (np.int8, np.int8)}  # i8 -> i8: after a requantizing max pool
_TORCH = {np.dtype(np.int8): torch.int8, np.dtype(np.int16): torch.int16}


def seed(*parts) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


def torch_requantize(x: np.ndarray, s1: float, z1: int, s2: float, z2: int, dst) -> np.ndarray:
    """What the PyTorch Q/DQ model computes at the boundary (torchao's convert_pt2e ops)."""
    src, dst = np.iinfo(x.dtype), np.iinfo(dst)
    qd = torch.ops.quantized_decomposed
    d = qd.dequantize_per_tensor(torch.from_numpy(x), float(s1), z1, src.min, src.max, _TORCH[x.dtype])
    return qd.quantize_per_tensor(d, float(s2), z2, dst.min, dst.max, _TORCH[np.dtype(dst.dtype)]).numpy()


def run_three(name: str, x: np.ndarray, s1: float, z1: int, s2: float, z2: int):
    """(C output, numpy output, torch output) of one requantize."""
    dst = DIRECTIONS[name][1]
    args = [x.size, z1, float(np.float32(s1)), z2, inverse_scale(s2)]
    out_c, out_py = np.zeros(x.shape, dst), np.zeros(x.shape, dst)
    assert hostlib.call_kernel(name, x, out_c, *args) == ref.C7X_OK
    assert KERNELS[name](x, out_py, *args) == ref.C7X_OK
    return out_c, out_py, torch_requantize(x, s1, z1, s2, z2, dst)


def assert_all_equal(out_c, out_py, out_t):
    np.testing.assert_array_equal(out_c, out_py)
    np.testing.assert_array_equal(out_c, out_t)


@pytest.mark.parametrize("name", sorted(DIRECTIONS))
@pytest.mark.parametrize("n", [1, 7, 1023, 4097])
def test_c_equals_numpy_equals_torch_on_random_tensors(name, n):
    src, dst = DIRECTIONS[name]
    rng = seed(name, n)
    for trial in range(20):
        info = np.iinfo(src)
        x = rng.integers(info.min, info.max, n, endpoint=True).astype(src)
        # scales as observers give them: int16 ~ int8 / 256, spread over decades
        s1, s2 = (np.float32(np.exp(rng.uniform(-13, 1))) for _ in range(2))
        z_int8 = int(rng.integers(-128, 128))         # affine int8 (symmetric_activations=False)
        z1, z2 = (z_int8, 0) if src == np.int8 else (0, z_int8)
        assert_all_equal(*run_three(name, x, s1, z1, s2, z2))


@pytest.mark.parametrize("name", sorted(DIRECTIONS))
def test_every_int8_value_with_nonzero_zero_point(name):
    """All 256 int8 inputs (i8 -> i16) / outputs hit (i16 -> i8), int8 zero point -37."""
    src, dst = DIRECTIONS[name]
    if src == np.int8 and dst == np.int8:
        x = np.arange(-128, 128, dtype=np.int8)
        out_c, out_py, out_t = run_three(name, x, 0.0213, -37, 0.0213, -37)
        np.testing.assert_array_equal(out_c, x)        # equal parameters: the identity
        out_c2, out_py2, out_t2 = run_three(name, x, 0.0213, -37, 0.0213 * 1.7, 4)
        assert_all_equal(out_c2, out_py2, out_t2)
        assert len(np.unique(out_c2)) < 256 and out_c2[list(x).index(-37)] == 4
    elif src == np.int8:
        x = np.arange(-128, 128, dtype=np.int8)
        out_c, out_py, out_t = run_three(name, x, 0.0213, -37, 0.0213 / 128, 0)
        assert len(np.unique(out_c)) == 256            # int16 keeps every int8 step
    else:
        x = np.arange(-32768, 32768, 3, dtype=np.int16)
        out_c, out_py, out_t = run_three(name, x, 2e-4, 0, 0.0213, -37)
        assert len(np.unique(out_c)) == 256 and out_c[len(x) // 2] == -37   # x = 0 -> the zero point
    assert_all_equal(out_c, out_py, out_t)


@pytest.mark.parametrize("name", sorted(DIRECTIONS))
def test_rounding_ties_go_to_even(name):
    """in_scale 0.5, out scale 1: every odd input lands exactly on .5."""
    src, dst = DIRECTIONS[name]
    x = np.arange(-41, 42, dtype=src)
    out_c, out_py, out_t = run_three(name, x, 0.5, 0, 1.0, 0)
    assert_all_equal(out_c, out_py, out_t)
    expected = np.rint(x.astype(np.float64) / 2).astype(dst)   # half to even
    np.testing.assert_array_equal(out_c, expected)
    assert out_c[list(x).index(3)] == 2 and out_c[list(x).index(5)] == 2 and out_c[list(x).index(-3)] == -2


@pytest.mark.parametrize("name", sorted(DIRECTIONS))
def test_saturation(name):
    """Output scales far too small for the input range: both ends saturate,
    also with huge products (float32 overflow to inf)."""
    src, dst = DIRECTIONS[name]
    lo, hi = np.iinfo(dst).min, np.iinfo(dst).max
    x = np.array([np.iinfo(src).min, -3, -1, 0, 1, 2, np.iinfo(src).max], src)
    for s1, s2 in [(1.0, 1e-3), (3e38, 1e-30), (1.0, 1e-38)]:
        out_c, out_py, out_t = run_three(name, x, s1, 0, s2, 0)
        assert_all_equal(out_c, out_py, out_t)
        assert out_c[0] == lo and out_c[-1] == hi and out_c[3] == 0


def bad_cases() -> list[tuple[str, str, object]]:
    """(kernel, parameter, value outside what the header allows) for both directions."""
    cases = []
    for name, (src, dst) in DIRECTIONS.items():
        for param, t in (("in_zp", src), ("out_zp", dst)):
            cases += [(name, param, int(np.iinfo(t).max) + 1), (name, param, int(np.iinfo(t).min) - 1)]
        for param in ("in_scale", "out_inv_scale"):
            cases += [(name, param, v) for v in (0.0, -1.0, float("inf"), float("nan"), 1e39)]
    return cases


@pytest.mark.parametrize("name,param,value", bad_cases())
def test_bad_parameters_are_c7x_err_param_and_write_nothing(name, param, value):
    """1e39 is finite as a double but inf as the float32 the C receives."""
    src, dst = DIRECTIONS[name]
    names = [p.name for p in hostlib.kernel_signatures()[name]]
    args = [np.arange(5, dtype=src), None, 5, 0, 0.01, 0, 100.0]
    args[names.index(param)] = value
    outs = []
    for run in (lambda *a: hostlib.call_kernel(name, *a), KERNELS[name]):
        a = list(args)
        a[1] = np.full(5, 0x55, dst)
        assert run(*a) == ref.C7X_ERR_PARAM
        outs.append(a[1])
    assert all((o == 0x55).all() for o in outs)


def test_float_arguments_are_taken_as_float32():
    """The C receives float32: a double scale gives what its float32 gives."""
    x = np.arange(-128, 128, dtype=np.int8)
    s = 0.1 + 1e-12
    a, b = np.zeros(256, np.int16), np.zeros(256, np.int16)
    hostlib.call_kernel("c7x_requantize_i8_i16", x, a, 256, 3, s, 0, 251.3)
    hostlib.call_kernel("c7x_requantize_i8_i16", x, b, 256, 3, float(np.float32(s)), 0, 251.3)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="float"):
        hostlib.call_kernel("c7x_requantize_i8_i16", x, a, 256, 3, "0.1", 0, 251.3)


# --------------------------------------------------------------------------
# The pass
# --------------------------------------------------------------------------

def boundary_module(src: str, dst: str, s1=0.0213, z1=-5, s2=9.1e-5, z2=0, const_input=False):
    """main(x: f32[1, 3, 5, 7]) = dq(q2(dq(q1(x), s1, z1), s2, z2)): one boundary, like
    convert_pt2e writes between an int8 and an int16 layer."""
    f32 = lambda v: relax.const(np.float32(v), "float32")  # noqa: E731
    x = relax.Var("x", relax.TensorType((1, 3, 5, 7), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            if const_input:
                q1 = relax.const(np.arange(105, dtype=src).reshape(1, 3, 5, 7), src)
            else:
                q1 = bb.emit(relax.op.quantize(x, f32(s1), relax.const(z1, src), axis=-1, out_dtype=src))
            d1 = bb.emit(relax.op.dequantize(q1, f32(s1), relax.const(z1, src), axis=-1))
            q2 = bb.emit(relax.op.quantize(d1, f32(s2), relax.const(z2, dst), axis=-1, out_dtype=dst))
            out = bb.emit_output(relax.op.dequantize(q2, f32(s2), relax.const(z2, dst), axis=-1))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("src,dst,z1,z2", [("int8", "int16", -5, 0), ("int16", "int8", 0, 7),
                                           ("int8", "int8", -5, 3), ("int16", "int16", 0, 0)])
def test_boundary_becomes_one_kernel_call_with_torchs_reciprocal(src, dst, z1, z2):
    """Across dtypes, and within one with other parameters (Swin V2's crop between two observers)."""
    log = OffloadLog()
    mod = offload_requantize(boundary_module(src, dst, s1=0.0213, z1=z1, s2=9.1e-5, z2=z2), log)
    (call,) = offload_calls(mod)
    assert call.kernel == call.extern_name == f"c7x_requantize_i{src[3:]}_i{dst[3:]}"
    assert call.backend == "c7x" and [str(p.dtype) for p in call.prim.params] == [src, dst]
    n, in_zp, in_s, out_zp, inv = call.scalars
    assert (n, in_zp, out_zp) == (105, z1, z2)
    assert in_s == float(np.float32(0.0213))
    assert inv == float(np.float32(1.0 / np.float64(np.float32(9.1e-5))))
    (d,) = log.decisions
    assert (d.op, d.dtype, d.status, d.kernel) == ("requantize", src, "offloaded", call.kernel)


def test_identity_pair_and_constant_input_are_not_offloaded():
    log = OffloadLog()
    same = offload_requantize(boundary_module("int8", "int8", s1=0.5, z1=2, s2=0.5, z2=2), log)
    assert not offload_calls(same) and not log.decisions       # the identity: the pair cleanup's pattern
    const = offload_requantize(boundary_module("int8", "int16", const_input=True), log)
    assert not offload_calls(const)
    (d,) = log.decisions
    assert d.status == "declined" and "constant" in d.reason


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed for the host build")
@pytest.mark.parametrize("src,dst", [("int8", "int16"), ("int16", "int8"), ("int8", "int8")])
def test_kernel_build_equals_scalar_build_and_torch(tmp_path, src, dst):
    """The whole boundary compiled twice: the C7x kernel (MMALIB build) and TVM's
    legalised dequantize + quantize (scalar build) give the same bits, which are
    torch's; the manifest lists the requantize with its backend."""
    import json

    from c_check import compile_and_compare, inputs

    mod = boundary_module(src, dst, s1=0.0213 if src == "int8" else 9.1e-5, z1=-5 if src == "int8" else 0,
                          s2=9.1e-5 if dst == "int16" else 0.0213, z2=0 if dst == "int16" else 7)
    x = inputs((1, 3, 5, 7), n=3, scale=2.0)
    outs = {}
    for mmalib in (True, False):
        _, outs[mmalib] = compile_and_compare(mod, "rq", tmp_path / str(mmalib), x, mmalib=mmalib)
        manifest = json.loads((tmp_path / str(mmalib) / "manifest.json").read_text())
        if src != dst:   # a precision boundary is a layer; a same-dtype one is a Q/DQ pair (not a layer)
            (layer,) = manifest["layers"]
            assert (layer["op"], layer["dtype"], layer["out_dtype"]) == ("requantize", src, dst)
            assert layer["backend"] == ("c7x" if mmalib else "scalar")
        kernels = [c["kernel"] for c in manifest["calls"]]
        assert (f"c7x_requantize_i{src[3:]}_i{dst[3:]}" in kernels) == mmalib
    np.testing.assert_array_equal(outs[True].view(np.uint32), outs[False].view(np.uint32))
    qd = torch.ops.quantized_decomposed
    (s1, z1), (s2, z2) = [(float(np.float32(c.args[1].value.numpy())), int(c.args[2].value.numpy()))
                          for c in quantizes(mod)]
    r1, r2 = np.iinfo(src), np.iinfo(dst)
    q1 = qd.quantize_per_tensor(torch.from_numpy(x), s1, z1, r1.min, r1.max, _TORCH[np.dtype(src)])
    q2 = torch_requantize(q1.numpy(), s1, z1, s2, z2, np.dtype(dst))
    t = qd.dequantize_per_tensor(torch.from_numpy(q2), s2, z2, r2.min, r2.max, _TORCH[np.dtype(dst)]).numpy()
    np.testing.assert_array_equal(outs[True].view(np.uint32), t.view(np.uint32))


def quantizes(mod) -> list:
    """The R.quantize calls of ``main``, in order."""
    return [b.value for block in mod["main"].body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.quantize"]
