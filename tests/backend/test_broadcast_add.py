"""The residual add with a broadcast skip (issue 28: MaxViT's position bias and Swin's window
mask added to the attention scores): c7x_int8_broadcast_add / _int16 (C == numpy twin == the
plain residual add on the materialised skip; refused arguments), the stride plan of the pass,
and a scores + mask block through codegen bit-exact with no TVM scalar call."""

from __future__ import annotations

import json
import shutil
import zlib

import numpy as np
import pytest
import torch
import torch.nn as nn

from c_check import compile_and_compare, inputs
from qflow import quantize

from pipeline.backend import fold
from pipeline.backend.kernels import catalog, hostlib
from pipeline.backend.kernels import reference as ref
from pipeline.backend.passes.log import OffloadLog
from pipeline.backend.passes.pipeline import run_offload
from pipeline.backend.passes.residual import broadcast_strides

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the host kernels")
KERNELS = {np.int8: "c7x_int8_broadcast_add", np.int16: "c7x_int16_broadcast_add"}
PLAIN = {np.int8: "c7x_int8_residual_add_relu", np.int16: "c7x_int16_residual_add_relu"}

# out shape, skip shape: MaxViT's bias over windows, Swin's mask over heads, a row vector
CASES = {"bias_over_windows": ((1, 3, 2, 5, 5), (1, 2, 5, 5)),
         "mask_over_heads": ((1, 4, 3, 5, 5), (1, 4, 1, 5, 5)),
         "row": ((6, 7), (7,))}


def _rng(*parts):
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


def test_strides_of_the_broadcast():
    assert broadcast_strides((1, 3, 2, 5, 5), (1, 2, 5, 5)) == (1, 3, 50, 0, 0)
    assert broadcast_strides((1, 4, 3, 5, 5), (1, 4, 1, 5, 5)) == (4, 3, 25, 25, 0)
    assert broadcast_strides((2, 3), (2, 3)) == (1, 1, 6, 0, 0)
    assert broadcast_strides((4, 4), (4, 1)) is None            # broadcast along the innermost axis
    assert broadcast_strides((2, 3, 2, 3, 5), (3, 1, 3, 1)) is None  # four groups
    assert broadcast_strides((2, 3), (2, 4)) is None            # not broadcastable
    assert broadcast_strides((3,), (1, 3)) is None              # skip of a higher rank


@needs_gcc
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype,relu", [(np.int8, 0), (np.int8, 1), (np.int16, 0)])
def test_c_equals_python_equals_the_plain_add_on_the_broadcast_skip(case, dtype, relu):
    out_shape, skip_shape = CASES[case]
    d0, d1, d2, s0, s1 = broadcast_strides(out_shape, skip_shape)
    rng = _rng(case, dtype, relu)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max + 1, out_shape, dtype=dtype)
    skip = rng.integers(info.min, info.max + 1, skip_shape, dtype=dtype)
    zps = (3, -7, 2) if dtype == np.int8 else (0, 0, 0)
    params = fold.residual_add_params(0.02, zps[0], 0.005, zps[1], 0.03, zps[2])
    args = (skip.size, d0, d1, d2, s0, s1, relu)
    out_c, out_py, plain = (np.full(out_shape, 9, dtype) for _ in range(3))
    assert hostlib.call_kernel(KERNELS[dtype], x, skip, params, out_c, *args) == ref.C7X_OK
    assert catalog.KERNELS[KERNELS[dtype]](x, skip, params, out_py, *args) == ref.C7X_OK
    full = np.ascontiguousarray(np.broadcast_to(skip, out_shape))
    assert hostlib.call_kernel(PLAIN[dtype], x, full, params, plain, x.size, relu) == ref.C7X_OK
    np.testing.assert_array_equal(out_c, out_py)
    np.testing.assert_array_equal(out_c, plain)


@needs_gcc
@pytest.mark.parametrize("bad,status", [("past_the_skip", ref.C7X_ERR_SHAPE), ("negative_stride", ref.C7X_ERR_SHAPE),
                                        ("shift", ref.C7X_ERR_PARAM)])
def test_invalid_arguments_are_refused_in_c_and_python_alike(bad, status):
    d0, d1, d2, s0, s1 = broadcast_strides(*CASES["mask_over_heads"])
    skip_size = 4 * 25
    if bad == "past_the_skip":
        s0 += 1
    elif bad == "negative_stride":
        s1 = -1
    params = fold.residual_add_params(0.02, 0, 0.005, 0, 0.03, 0)
    if bad == "shift":
        params[8:12] = np.frombuffer(np.int32(99).tobytes(), np.uint8)
    x, skip = np.zeros(d0 * d1 * d2, np.int8), np.zeros(skip_size, np.int8)
    args = (skip_size, d0, d1, d2, s0, s1, 0)
    for call in (lambda o: hostlib.call_kernel("c7x_int8_broadcast_add", x, skip, params, o, *args),
                 lambda o: ref.c7x_int8_broadcast_add(x, skip, params, o, *args)):
        out = np.full(d0 * d1 * d2, 9, np.int8)
        assert call(out) == status
        assert (out == 9).all()   # nothing written


class MaskedScores(nn.Module):
    """Scores of windows and heads plus a fixed mask broadcast over the heads (Swin's shifted
    windows) and a learned bias broadcast over the windows (MaxViT's position bias)."""

    def __init__(self, windows: int = 4, heads: int = 2, tokens: int = 5):
        super().__init__()
        self.shape = (1, windows, heads, tokens, tokens)
        self.proj = nn.Linear(tokens, tokens)
        self.register_buffer("mask", torch.where(torch.rand(1, windows, 1, tokens, tokens) > 0.7, -3.0, 0.0))
        self.bias = nn.Parameter(torch.randn(heads, tokens, tokens) * 0.5)
        self.out = nn.Linear(tokens, tokens)

    def forward(self, x):                      # x [1, windows, heads, tokens, tokens]
        return self.out(torch.softmax(self.proj(x) + self.mask + self.bias, dim=-1))


@needs_gcc
@pytest.mark.parametrize("dtype,kernel", [("int8", "c7x_int8_broadcast_add"), ("int16", "c7x_int16_broadcast_add")])
def test_masked_scores_add_on_the_kernel_bit_exact(tmp_path, dtype, kernel):
    torch.manual_seed(3)
    model = MaskedScores().eval()
    torch.manual_seed(1)
    flow = quantize(model, torch.randn(*model.shape), dtype=dtype)
    log = OffloadLog()
    run_offload(flow.mod, log)
    adds = [(d.status, d.kernel) for d in log.decisions if d.op == "residual_add"]
    assert adds == [("offloaded", kernel)] * 2
    summary, _ = compile_and_compare(flow.mod, "masked", tmp_path / "c", inputs(model.shape, n=2), mmalib=True)
    assert summary["calls_by_backend"]["c7x"] > 0
    calls = json.loads((tmp_path / "c" / "manifest.json").read_text())["calls"]
    adds = [(c["kernel"], c["backend"]) for c in calls if c["layer"] in ("add", "add_1")]
    # no scalar call of theirs (the mask and bias are folded); int16 has no softmax kernel, so
    # the second add's output is dequantized for the float softmax
    assert adds == [(kernel, "c7x")] * 2 + ([("dequantize", "tvm")] if dtype == "int16" else [])
