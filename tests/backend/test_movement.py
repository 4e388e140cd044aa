"""Slices and zero pads on the integers (issue 28: Swin's patch merging, Swin V2's pad to a
multiple of the window and its crop): the index and width plans, the rewrite leaves every value
unchanged (TVM's VM before and after), and patch merging (V1, V2) and a padded Swin V2 block go
through codegen bit-exact with no TVM scalar call."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import torch.nn as nn
from torchvision.models.swin_transformer import PatchMerging, PatchMergingV2, SwinTransformerBlockV2

import tvm
from tvm import relax
from c_check import compile_and_compare, inputs
from qflow import quantize

from pipeline.backend.passes.log import OffloadLog
from pipeline.models.efficientnet_lite import SameConv2d
from pipeline.backend.passes.movement import integer_slices_and_pads, pad_widths, slice_indices

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the host kernels")
BIG = 9223372036854775807   # torch's "to the end" bound, as exported


def _slice(shape, axes, begin, end, strides):
    x = relax.Var("x", relax.TensorType(shape, "int8"))
    return relax.op.strided_slice(x, axes, begin, end, strides)


@pytest.mark.parametrize("axes,begin,end,strides,out,expect", [
    ([1], [0], [BIG], [2], (1, 4, 8, 3), {1: [0, 2, 4, 6]}),          # x[:, 0::2]
    ([2], [1], [BIG], [2], (1, 8, 4, 3), {2: [1, 3, 5, 7]}),          # x[:, :, 1::2]
    ([1, 2], [0, 0], [6, 5], [1, 1], (1, 6, 5, 3), {1: range(6), 2: range(5)}),   # a crop
    ([1], [-3], [BIG], [1], (1, 3, 8, 3), {1: [5, 6, 7]}),            # a negative begin
    ([3], [0], [BIG], [1], (1, 8, 8, 3), {}),                         # keeps everything
])
def test_slice_indices_pick_what_python_slicing_picks(axes, begin, end, strides, out, expect):
    picks = slice_indices(_slice((1, 8, 8, 3), axes, begin, end, strides), (1, 8, 8, 3), out)
    assert {a: list(i) for a, i in picks} == {a: list(v) for a, v in expect.items()}
    assert all(i.dtype == np.int32 for _, i in picks)


def test_slice_indices_refuse_a_shape_they_do_not_give():
    assert slice_indices(_slice((1, 8, 8, 3), [1], [0], [BIG], [2]), (1, 8, 8, 3), (1, 3, 8, 3)) is None


def test_pad_widths_take_constant_zero_pads_only():
    x = relax.Var("x", relax.TensorType((1, 6, 6, 32), "float32"))
    assert pad_widths(relax.op.nn.pad(x, [0, 0, 0, 2, 1, 2, 0, 0]), 4) == [(1, 0, 2), (2, 1, 2)]
    assert pad_widths(relax.op.nn.pad(x, [0] * 8), 4) == []
    assert pad_widths(relax.op.nn.pad(x, [0, 0, 0, 2, 0, 2, 0, 0], pad_value=1.0), 4) is None
    assert pad_widths(relax.op.nn.pad(x, [0, 0, 0, 2, 0, 2, 0, 0], pad_mode="reflect"), 4) is None


class Merge(nn.Module):
    """An FC (so the merge reads a dequantized int8 tensor, as in Swin), then patch merging."""

    def __init__(self, v2: bool):
        super().__init__()
        self.pre = nn.Linear(32, 32)
        self.merge = (PatchMergingV2 if v2 else PatchMerging)(32)

    def forward(self, x):                       # x [1, 8, 8, 32] NHWC float32
        return self.merge(self.pre(x))


class PaddedBlock(nn.Module):
    """An FC, then a shifted Swin V2 block whose window (4) does not divide the 6 x 6 input: the
    block pads to 8 x 8 and crops back."""

    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(32, 32)
        self.block = SwinTransformerBlockV2(32, 2, [4, 4], [2, 2])

    def forward(self, x):                       # x [1, 6, 6, 32]
        return self.block(self.pre(x))


def _same_padded():
    """TF "same" padded convs (EfficientNet-Lite's): an asymmetric pad of the float input before a
    stride-2 conv, one of an int8 tensor before a stride-2 depthwise 5 x 5, then a symmetric one."""
    return nn.Sequential(SameConv2d(3, 8, 3, 2, 16), nn.ReLU6(), SameConv2d(8, 8, 5, 2, 8, groups=8),
                         nn.ReLU6(), SameConv2d(8, 4, 3, 1, 4))


CASES = {"same_padded_convs": (_same_padded, (1, 3, 16, 16)),
         "patch_merging": (lambda: Merge(False), (1, 8, 8, 32)),
         "patch_merging_v2": (lambda: Merge(True), (1, 8, 8, 32)),
         "padded_v2_block": (PaddedBlock, (1, 6, 6, 32))}


@pytest.fixture(scope="module", params=sorted(CASES))
def flow(request):
    make, shape = CASES[request.param]
    torch.manual_seed(0)
    model = make().eval()
    return request.param, shape, quantize(model, torch.randn(*shape))


def _run(mod, x: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x))
    return (out if hasattr(out, "numpy") else out[0]).numpy()


def _ops(mod) -> set[str]:
    out: set[str] = set()
    relax.analysis.post_order_visit(
        mod["main"], lambda e: out.add(e.op.name) if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None)
    return out


def test_the_rewrite_changes_no_value(flow):
    name, shape, f = flow
    log = OffloadLog()
    rewritten = integer_slices_and_pads(f.mod, log)
    done = {d.op for d in log.decisions if d.status == "simplified"}
    expect = {"padded_v2_block": {"strided_slice", "pad"}, "same_padded_convs": {"pad"}}
    assert done == expect.get(name, {"strided_slice"})
    assert "relax.nn.pad" not in _ops(rewritten)
    assert ("relax.take" in _ops(rewritten)) == (name != "same_padded_convs")
    if name == "same_padded_convs":   # both asymmetric pads went into their conv's padding
        notes = [d.note for d in log.decisions if d.status == "simplified"]
        assert any("[0, 0, 1, 1]" in n for n in notes) and any("[1, 1, 2, 2]" in n for n in notes), notes
    x = inputs(shape, n=1)
    np.testing.assert_array_equal(_run(rewritten, x).view(np.uint32), _run(f.mod, x).view(np.uint32))


@needs_gcc
def test_merging_and_padding_run_on_kernels_bit_exact_with_no_scalar_call(flow, tmp_path):
    name, shape, f = flow
    summary, _ = compile_and_compare(f.mod, name, tmp_path / "c", inputs(shape, n=2), mmalib=True)
    assert summary["calls_by_backend"].get("tvm", 0) == 0
    calls = json.loads((tmp_path / "c" / "manifest.json").read_text())["calls"]
    kernels = [c["kernel"] for c in calls]
    if name == "same_padded_convs":  # the pads are inside the conv calls: no copy, no concat
        assert not [k for k in kernels if "concat" in k or "requantize" in k], kernels
        layers = json.loads((tmp_path / "c" / "manifest.json").read_text())["layers"]
        pads = [l for l in layers if l["op"] == "pad"]
        assert pads and all("folded into the padding of conv" in l["reason"] for l in pads), pads
    elif name == "padded_v2_block":   # 6 -> 8 along H, then W: one two-segment concat each
        assert kernels.count("c7x_concat2_i8") == 2
    else:                           # four strided quarters, two takes each, joined along C
        assert kernels.count("c7x_concat4_i8") == 1 and kernels.count("c7x_take_i8") == 8
