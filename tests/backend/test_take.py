"""Gathers along one axis on the integers (issue 28: Swin's cyclic shift, ``torch.roll``):
c7x_take_i8 / _i16 (C == numpy twin == numpy's take; refused indices), the quantizer's roll
and empty-pad rules, and a shifted-window Swin block through codegen bit-exact with every MAC
on MMALIB and no TVM scalar call."""

from __future__ import annotations

import json
import shutil
import zlib

import numpy as np
import pytest
import torch

from c_check import compile_and_compare, inputs
from qflow import quantize

from pipeline.backend.kernels import catalog, hostlib
from pipeline.backend.kernels import reference as ref
from pipeline.quant import rules

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the host kernels")
KERNELS = {np.int8: "c7x_take_i8", np.int16: "c7x_take_i16"}


def _rng(*parts):
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


@needs_gcc
@pytest.mark.parametrize("dtype", [np.int8, np.int16])
@pytest.mark.parametrize("shape,axis,index", [
    ((1, 8, 8, 32), 1, (np.arange(8) + 2) % 8),     # Swin's roll by -2 along H
    ((1, 8, 8, 32), 2, (np.arange(8) + 6) % 8),     # ... and back by +2 along W
    ((3, 5, 7), 2, np.array([6, 0, 0, 3])),         # any gather: repeats, fewer entries
    ((4,), 0, np.array([3, 2, 1, 0, 1]))])
def test_c_equals_python_equals_numpy_take(dtype, shape, axis, index):
    rng = _rng(shape, axis, dtype)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max + 1, shape, dtype=dtype)
    index = index.astype(np.int32)
    expect = np.take(x, index, axis=axis)
    args = (int(np.prod(shape[:axis])), shape[axis], index.size, int(np.prod(shape[axis + 1:])))
    out_c, out_py = np.full(expect.shape, 9, dtype), np.full(expect.shape, 9, dtype)
    assert hostlib.call_kernel(KERNELS[dtype], x, index, out_c, *args) == ref.C7X_OK
    assert catalog.KERNELS[KERNELS[dtype]](x, index, out_py, *args) == ref.C7X_OK
    np.testing.assert_array_equal(out_c, expect)
    np.testing.assert_array_equal(out_py, expect)


@needs_gcc
@pytest.mark.parametrize("bad", [-1, 4])
def test_an_index_out_of_range_is_refused_before_writing(bad):
    x, index = np.arange(8, dtype=np.int8), np.array([0, bad, 1], np.int32)
    for call in (lambda o: hostlib.call_kernel("c7x_take_i8", x, index, o, 2, 4, 3, 1),
                 lambda o: ref.c7x_take_i8(x, index, o, 2, 4, 3, 1)):
        out = np.full(6, 9, np.int8)
        assert call(out) == ref.C7X_ERR_PARAM
        assert (out == 9).all()


def test_a_pad_of_zero_width_is_dropped_and_others_kept():
    class Pads(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.pad(torch.nn.functional.pad(x, (0, 0, 0, 0)), (1, 0, 0, 0))

    x = torch.randn(1, 3, 4, 4)
    gm = torch.export.export(Pads(), (x,)).module()
    before = gm(x)
    rules.drop_empty_pads(gm)
    pads = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in rules.PAD]
    assert len(pads) == 1 and list(pads[0].args[1]) == [1, 0, 0, 0]
    torch.testing.assert_close(gm(x), before, rtol=0, atol=0)


def _swin_block(v2: bool = False):
    from torchvision.models.swin_transformer import SwinTransformerBlock, SwinTransformerBlockV2
    torch.manual_seed(3)
    return (SwinTransformerBlockV2 if v2 else SwinTransformerBlock)(32, 2, [4, 4], [2, 2]).eval()


def test_the_roll_shares_its_observer_and_the_dropout_after_softmax_requantizes_nothing():
    torch.manual_seed(1)
    flow = quantize(_swin_block(), torch.randn(1, 8, 8, 32))
    g = flow.qdq.graph
    for roll in (n for n in g.nodes if n.op == "call_function" and n.target == torch.ops.aten.roll.default):
        dq_in, q_out = roll.args[0], next(iter(roll.users))
        assert "dequantize" in str(dq_in.target) and "quantize" in str(q_out.target)
        assert dq_in.args[1:] == q_out.args[1:]           # same scale, zero point: data movement
    softmax_q = [n for n in g.nodes if n.op == "call_function" and "quantize_per_tensor" in str(n.target)
                 and n.args[0].target == torch.ops.aten.softmax.int]
    scales = {float(n.args[1]) for n in g.nodes if n.op == "call_function" and "quantize_per_tensor" in str(n.target)}
    assert softmax_q and all(float(n.args[1]) == 1 / 256 for n in softmax_q)
    assert not [s for s in scales if abs(s - 1 / 256) < 1e-4 and s != 1 / 256]   # no near-copy of it


@needs_gcc
def test_shifted_window_block_is_bit_exact_on_kernels_with_no_scalar_call(tmp_path):
    """Swin's shifted block: the rolls on c7x_take_i8, the window mask (folded, then the
    broadcast add) and the position bias on c7x_int8_broadcast_add, attention on MMALIB."""
    torch.manual_seed(1)
    flow = quantize(_swin_block(), torch.randn(1, 8, 8, 32))
    x = inputs((1, 8, 8, 32), n=2)
    summary, _ = compile_and_compare(flow.mod, "swin", tmp_path / "c", x, mmalib=True)
    assert summary["macs_offloaded"] == summary["macs_total"] > 0
    assert summary["calls_by_backend"]["tvm"] == 0
    kernels = [c["kernel"] for c in json.loads((tmp_path / "c" / "manifest.json").read_text())["calls"]]
    assert kernels.count("c7x_take_i8") == 4 and kernels.count("c7x_int8_broadcast_add") == 2
