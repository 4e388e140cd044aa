"""The model's edges on C7x kernels (``passes/edges.py``): the input quantize and the
output dequantize.

Kernel level: the C, its numpy twin and torch's ``quantized_decomposed`` ops agree bit for
bit, ties, saturation, infinities and NaN included. Net level: a compiled net keeps no TVM
scalar call, its host C equals the Python reference, and its output equals the scalar
(TVM-only) build's to within one output LSB (TVM's quantize divides by the scale where
torch, and the kernel, multiply by its reciprocal).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from c_check import compile_and_compare, inputs
from qflow import ConvReluPool, quantize, randomize_bn

from pipeline import torchenv  # noqa: F401  (registers torch's quantized_decomposed ops)
from pipeline.backend.kernels import hostlib
from pipeline.backend.kernels import reference as ref
from pipeline.backend.kernels.reference import C7X_ERR_PARAM, C7X_ERR_SHAPE, C7X_OK
from pipeline.backend.passes.offload_calls import offload_calls
from pipeline.backend.passes.pipeline import run_offload
from pipeline.backend.passes.requantize import inverse_scale

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed for the C kernels")

DTYPES = {"i8": np.int8, "i16": np.int16}
QD = torch.ops.quantized_decomposed


def _floats(scale: float, zp: int, dtype) -> np.ndarray:
    """float32 inputs: random, exact ties (k + 0.5) * scale, the saturation edges, +-0, +-inf, NaN."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(3)
    k = rng.integers(info.min - zp - 4, info.max - zp + 4, 400)
    ties = ((k + 0.5) * scale).astype(np.float32)
    spread = (rng.standard_normal(600) * scale * (info.max - info.min) / 4).astype(np.float32)
    edges = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3e38, -3e38, (info.max - zp) * scale,
                      (info.min - zp) * scale, (info.max - zp + 1) * scale], np.float32)
    return np.concatenate([ties, spread, edges])


@pytest.mark.parametrize("suf", sorted(DTYPES))
@pytest.mark.parametrize("scale, zp", [(0.0123, 0), (0.0371, -17), (1.7e-4, 5)])
def test_quantize_is_torchs_bit_for_bit(suf, scale, zp):
    dtype = DTYPES[suf]
    info = np.iinfo(dtype)
    x = _floats(scale, zp, dtype)
    inv = inverse_scale(scale)
    c, twin = np.zeros(len(x), dtype), np.zeros(len(x), dtype)
    assert hostlib.call_kernel(f"c7x_quantize_f32_{suf}", x, c, len(x), zp, inv) == C7X_OK
    assert getattr(ref, f"c7x_quantize_f32_{suf}")(x, twin, len(x), zp, inv) == C7X_OK
    np.testing.assert_array_equal(c, twin)
    torch_q = QD.quantize_per_tensor(torch.from_numpy(x), scale, zp, int(info.min), int(info.max),
                                     getattr(torch, np.dtype(dtype).name)).numpy()
    finite = ~np.isnan(x)                      # torch casts NaN to an unspecified integer
    np.testing.assert_array_equal(c[finite], torch_q[finite])
    assert (c[np.isnan(x)] == zp).all()        # ours: NaN -> the zero point (float 0)
    assert c[x == np.inf].tolist() == [info.max] and c[x == -np.inf].tolist() == [info.min]
    assert len(set(c.tolist())) > 100          # the inputs reach across the range


@pytest.mark.parametrize("suf", sorted(DTYPES))
@pytest.mark.parametrize("scale, zp", [(0.0123, 0), (0.0371, -17), (3.3e5, 2)])
def test_dequantize_is_torchs_bit_for_bit_on_a_prefix(suf, scale, zp):
    dtype = DTYPES[suf]
    info = np.iinfo(dtype)
    q = np.random.default_rng(4).integers(info.min, info.max + 1, 1000).astype(dtype)
    q[:2] = info.min, info.max
    n = 990                                    # a padded FC output: the first n of n_in are real
    c, twin = np.full(n, np.nan, np.float32), np.full(n, np.nan, np.float32)
    assert hostlib.call_kernel(f"c7x_dequantize_{suf}_f32", q, c, len(q), n, zp, scale) == C7X_OK
    assert getattr(ref, f"c7x_dequantize_{suf}_f32")(q, twin, len(q), n, zp, scale) == C7X_OK
    torch_dq = QD.dequantize_per_tensor(torch.from_numpy(q[:n]), scale, zp, int(info.min), int(info.max),
                                        getattr(torch, np.dtype(dtype).name)).numpy()
    np.testing.assert_array_equal(c.view(np.uint32), twin.view(np.uint32))
    np.testing.assert_array_equal(c.view(np.uint32), torch_dq.view(np.uint32))


@pytest.mark.parametrize("suf", sorted(DTYPES))
def test_bad_arguments_are_refused_alike(suf):
    dtype = DTYPES[suf]
    big = int(np.iinfo(dtype).max) + 1
    x, q = np.zeros(8, np.float32), np.zeros(8, dtype)
    for kernel, args, status in [
        (f"c7x_quantize_f32_{suf}", (x, q, 8, big, 1.0), C7X_ERR_PARAM),          # zero point out of range
        (f"c7x_quantize_f32_{suf}", (x, q, 8, 0, 0.0), C7X_ERR_PARAM),            # scale not > 0
        (f"c7x_quantize_f32_{suf}", (x, q, 8, 0, float("inf")), C7X_ERR_PARAM),
        (f"c7x_quantize_f32_{suf}", (x, q, 0, 0, 1.0), C7X_ERR_SHAPE),
        (f"c7x_dequantize_{suf}_f32", (q, x, 4, 8, 0, 1.0), C7X_ERR_SHAPE),       # n > n_in
        (f"c7x_dequantize_{suf}_f32", (q, x, 8, 8, 0, float("nan")), C7X_ERR_PARAM),
    ]:
        assert hostlib.call_kernel(kernel, *args) == status, (kernel, args)
        assert getattr(ref, kernel)(*args) == status, (kernel, args)


@pytest.fixture(scope="module", params=["int8", "int16"])
def net(request):
    """ConvReluPool with 10 classes (its FC output padded to the MMA's width, then sliced), quantized."""
    torch.manual_seed(0)
    model = randomize_bn(ConvReluPool(classes=10))
    return request.param, quantize(model, torch.randn(1, 3, 16, 16), dtype=request.param)


def test_the_edges_become_kernels_and_no_scalar_call_is_left(net, tmp_path):
    dtype, flow = net
    suf = {"int8": "i8", "int16": "i16"}[dtype]
    mod, _ = run_offload(flow.mod)
    calls = offload_calls(mod)
    assert (calls[0].kernel, calls[-1].kernel) == (f"c7x_quantize_f32_{suf}", f"c7x_dequantize_{suf}_f32")
    n_in, n = calls[-1].scalars[:2]
    assert n == 10 and n_in > n                # the slice of the padded FC output, read in place
    x = inputs((1, 3, 16, 16), n=3)
    summary, staged = compile_and_compare(flow.mod, "edges", tmp_path / "mmalib", x, mmalib=True)
    assert summary["tvm_kernels"] == [] and summary["calls_by_backend"]["tvm"] == 0, summary["tvm_kernels"]
    _, scalar = compile_and_compare(flow.mod, "edges", tmp_path / "scalar", x, mmalib=False)
    # Same numbers up to TVM's quantize (x / scale, not torch's x * (1 / scale)) and the kernels'
    # requantize: within a few output LSB of each other, and of torch's Q/DQ model.
    out_scale = float(np.abs(np.diff(np.unique(staged))).min())
    qdq = np.concatenate([flow.qdq(torch.from_numpy(xi[None])).detach().numpy() for xi in x])
    assert np.abs(staged - qdq).max() <= 3 * out_scale and np.abs(scalar - staged).max() <= 3 * out_scale
