"""Concat and split on the C7x (``passes/concat.py``, ``c7x_concat<K>_<t>``).

Kernel level: the host C == the numpy twin == torch's dequantize, cat, quantize bit for
bit, for every K and dtype, several blocks (outer > 1) and saturation; bad
arguments give the same status in C and Python. Net level: a C2f-style block (a split
into halves, one half through a conv, the halves and the conv joined) and an SPPF-style
four-way concat become c7x_concat kernels with no TVM scalar call left, the host C equals
the Python reference bit for bit, and the output equals the PyTorch Q/DQ model's.
"""

from __future__ import annotations

import shutil
import zlib

import numpy as np
import pytest
import torch
import torch.nn as nn

from c_check import compile_and_compare, inputs
from qflow import quantize

from pipeline import torchenv  # noqa: F401  (quantized_decomposed ops registered)
from pipeline.backend.kernels import catalog, hostlib
from pipeline.backend.kernels import reference as ref
from pipeline.backend.passes.offload_calls import layer_calls, offload_calls
from pipeline.backend.passes.pipeline import run_offload
from pipeline.backend.passes.requantize import inverse_scale

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the host kernels")

DTYPES = {"i8": np.int8, "i16": np.int16}
QD = torch.ops.quantized_decomposed


def _rng(*parts) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


def _torch_concat(pieces, out_scale: float, out_zp: int, dtype) -> np.ndarray:
    """What the Q/DQ model computes: dequantize each piece, cat the floats, quantize."""
    info, tdt = np.iinfo(dtype), getattr(torch, np.dtype(dtype).name)
    floats = [QD.dequantize_per_tensor(torch.from_numpy(np.ascontiguousarray(p)), s, z, info.min, info.max, tdt)
              for p, s, z in pieces]
    return QD.quantize_per_tensor(torch.cat(floats, 1), out_scale, out_zp, info.min, info.max, tdt).numpy()


@pytest.mark.parametrize("suf", sorted(DTYPES))
@pytest.mark.parametrize("k", range(1, ref.MAX_SEGMENTS + 1))
def test_the_kernel_is_torchs_dequantize_cat_quantize(suf, k):
    dtype = DTYPES[suf]
    info = np.iinfo(dtype)
    rng = _rng(suf, k)
    outer = 3
    ins, scalars, pieces = [], [], []
    for j in range(k):
        size = int(rng.integers(4, 40))
        offset = int(rng.integers(0, size // 2))
        n = int(rng.integers(1, size - offset + 1))
        x = rng.integers(info.min, info.max + 1, outer * size).astype(dtype)
        x[:2] = info.min, info.max                    # saturation at both ends
        scale = float(np.float32(rng.uniform(0.01, 0.2)))
        zp = int(rng.integers(-5, 6))
        ins.append(x)
        scalars += [size, offset, n, zp, scale]
        pieces.append((x.reshape(outer, size)[:, offset:offset + n], scale, zp))
    out_scale, out_zp = float(np.float32(pieces[0][1] * 0.37)), 3   # magnifies: some values saturate
    total = sum(p[0].shape[1] for p in pieces)
    args = [outer, *scalars, out_zp, inverse_scale(out_scale)]
    name = f"c7x_concat{k}_{suf}"
    c, twin = np.zeros(outer * total, dtype), np.zeros(outer * total, dtype)
    assert hostlib.call_kernel(name, *ins, c, *args) == ref.C7X_OK
    assert catalog.KERNELS[name](*ins, twin, *args) == ref.C7X_OK
    np.testing.assert_array_equal(c, twin)
    np.testing.assert_array_equal(c, _torch_concat(pieces, out_scale, out_zp, dtype).reshape(-1))
    assert c.min() == info.min and c.max() == info.max  # the scale ratio saturates some values


def test_equal_quantization_copies_every_value():
    x = np.arange(-128, 128, dtype=np.int8)
    out = np.zeros(64, np.int8)
    s = 0.0731
    # elements 32..63 of each of two blocks of 128, same scale and zero point: a pure copy
    assert hostlib.call_kernel("c7x_concat1_i8", x, out, 2, 128, 32, 32, -7, s, -7, inverse_scale(s)) == ref.C7X_OK
    np.testing.assert_array_equal(out, np.concatenate([x[32:64], x[160:192]]))


@pytest.mark.parametrize("suf", sorted(DTYPES))
def test_bad_arguments_are_refused_alike(suf):
    dtype = DTYPES[suf]
    big = int(np.iinfo(dtype).max) + 1
    a, b, out = np.zeros(16, dtype), np.zeros(16, dtype), np.zeros(32, dtype)
    name = f"c7x_concat2_{suf}"
    good = [1, 16, 0, 16, 0, 0.5, 16, 0, 16, 0, 0.5, 0, 2.0]
    for i, value, status in [(0, 0, ref.C7X_ERR_SHAPE),          # outer 0
                             (2, 1, ref.C7X_ERR_SHAPE),          # offset + n > size
                             (3, 0, ref.C7X_ERR_SHAPE),          # empty segment
                             (7, -1, ref.C7X_ERR_SHAPE),         # negative offset
                             (4, big, ref.C7X_ERR_PARAM),        # zero point outside the dtype
                             (10, float("nan"), ref.C7X_ERR_PARAM),
                             (12, 0.0, ref.C7X_ERR_PARAM)]:      # out_inv_scale not > 0
        args = list(good)
        args[i] = value
        assert hostlib.call_kernel(name, a, b, out, *args) == status, (i, value)
        assert catalog.KERNELS[name](a, b, out, *args) == status, (i, value)
    assert catalog.KERNELS[name](a, None, out, *good) == ref.C7X_ERR_NULL
    assert catalog.buffer_shapes(name, a, b, out, *good) == {"in0": (16,), "in1": (16,), "out": (32,)}


class C2fSPPF(nn.Module):
    """A C2f block (split into halves, a conv on the second, cat of both halves and the
    conv's output) then an SPPF-style cat of a tensor and three max pools of it."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.cv1 = nn.Sequential(nn.Conv2d(3, 2 * c, 1), nn.ReLU())
        self.m = nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.ReLU())
        self.cv2 = nn.Sequential(nn.Conv2d(3 * c, c, 1), nn.ReLU())
        self.pool = nn.MaxPool2d(5, 1, 2)
        self.cv3 = nn.Conv2d(4 * c, 4, 1)

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        y.append(self.m(y[-1]))
        z = self.cv2(torch.cat(y, 1))
        p1 = self.pool(z)
        p2 = self.pool(p1)
        return self.cv3(torch.cat([z, p1, p2, self.pool(p2)], 1))


@pytest.fixture(scope="module", params=["int8", "int16"])
def net(request):
    torch.manual_seed(0)
    return request.param, quantize(C2fSPPF(), torch.randn(1, 3, 12, 12), dtype=request.param)


def test_split_and_concat_become_kernels(net):
    dtype, flow = net
    suf = {"int8": "i8", "int16": "i16"}[dtype]
    mod, log = run_offload(flow.mod)
    kernels = [c.kernel for c in offload_calls(mod)]
    # the C2f join reads both halves of the split as one segment of cv1's output
    assert f"c7x_concat2_{suf}" in kernels and f"c7x_concat4_{suf}" in kernels, kernels
    assert f"c7x_concat1_{suf}" in kernels            # the half the conv reads, requantized on its own
    assert not any(c.kernel.startswith("c7x_concat") for c in layer_calls(mod))  # data movement, not layers
    join = next(c for c in offload_calls(mod) if c.kernel == f"c7x_concat2_{suf}")
    outer, size0, offset0, n0 = join.scalars[:4]
    assert (outer, offset0, n0) == (1, 0, size0) and size0 == 16 * 12 * 12


def test_the_compiled_net_is_exact_and_has_no_scalar_call(net, tmp_path):
    dtype, flow = net
    x = inputs((1, 3, 12, 12), n=3)
    summary, host = compile_and_compare(flow.mod, "c2f", tmp_path / "mmalib", x, mmalib=True)
    assert summary["calls_by_backend"]["tvm"] == 0, summary["tvm_kernels"]
    qdq = np.concatenate([flow.qdq(torch.from_numpy(xi[None])).detach().numpy() for xi in x])
    # the input quantize and every join are torch's ops (exact: the kernel tests above); the
    # four convs' requantize is the kernels' integer one, a 7-bit multiplier and a shift
    # (docs/numerics.md), often a step off torch's float one, which the next layers carry
    # (int8: up to 3 output steps here): within 3% of the output's range
    assert np.abs(host - qdq).max() <= 0.03 * np.abs(qdq).max(), np.abs(host - qdq).max()
