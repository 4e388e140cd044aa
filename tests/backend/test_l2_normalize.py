"""L2 normalisation on the integers (issue 28: Swin V2's cosine attention): c7x_int8_l2_normalize
(C == numpy twin; within 1 LSB of torch's ``q(F.normalize(dq(x)))`` and equal on almost every
element; refused arguments), and a Swin V2 block through codegen bit-exact with no TVM call."""

from __future__ import annotations

import json
import shutil
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from c_check import compile_and_compare, inputs
from qflow import quantize

from pipeline.backend.kernels import hostlib
from pipeline.backend.kernels import reference as ref
from pipeline.backend.passes.log import OffloadLog
from pipeline.backend.passes.pipeline import run_offload
from pipeline import torchenv  # noqa: F401  (registers the quantized_decomposed ops)

QD = torch.ops.quantized_decomposed
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the host kernels")


def _rng(*parts):
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


@needs_gcc
@pytest.mark.parametrize("n,zp_in,s_in", [(16, 0, 0.02), (32, -7, 0.05), (49, 12, 0.003), (768, 0, 0.01)])
@pytest.mark.parametrize("s_out,zp_out", [(1 / 127, 0), (0.0062, -3)])
def test_c_equals_python_and_torchs_normalize_within_one_lsb(n, zp_in, s_in, s_out, zp_out):
    rng = _rng(n, zp_in, s_in, s_out)
    x = rng.integers(-128, 128, (40, n), dtype=np.int8)
    x[0] = zp_in                                  # a row of zeros: 0 out, as torch's eps clamp gives
    x[1, :] = zp_in
    x[1, 3] = zp_in + 1                           # a one-hot row: +-1 exactly
    gain = ref.l2_normalize_gain(s_out)
    args = (40, n, zp_in, gain, zp_out)
    out_c, out_py = np.zeros_like(x), np.zeros_like(x)
    assert hostlib.call_kernel("c7x_int8_l2_normalize", x, out_c, *args) == ref.C7X_OK
    assert ref.c7x_int8_l2_normalize(x, out_py, *args) == ref.C7X_OK
    np.testing.assert_array_equal(out_c, out_py)
    d = QD.dequantize_per_tensor(torch.from_numpy(x), s_in, zp_in, -128, 127, torch.int8)
    expect = QD.quantize_per_tensor(F.normalize(d, dim=-1), s_out, zp_out, -128, 127, torch.int8).numpy()
    diff = np.abs(out_py.astype(int) - expect)
    assert diff.max() <= 1 and (diff == 0).mean() > 0.99
    assert (out_py[0] == zp_out).all()


@needs_gcc
@pytest.mark.parametrize("args,status", [((2, 0, 0, 1 << 16, 0), ref.C7X_ERR_SHAPE),
                                         ((2, 4097, 0, 1 << 16, 0), ref.C7X_ERR_SHAPE),
                                         ((2, 5, 129, 1 << 16, 0), ref.C7X_ERR_PARAM),
                                         ((2, 5, 0, 0, 0), ref.C7X_ERR_PARAM),
                                         ((2, 5, 0, 1 << 16, 128), ref.C7X_ERR_PARAM)])
def test_invalid_arguments_are_refused_in_c_and_python_alike(args, status):
    rows, n = args[0], max(args[1], 1)
    x = np.zeros(rows * n, np.int8)
    for call in (lambda o: hostlib.call_kernel("c7x_int8_l2_normalize", x, o, *args),
                 lambda o: ref.c7x_int8_l2_normalize(x, o, *args)):
        out = np.full(rows * n, 9, np.int8)
        assert call(out) == status
        assert (out == 9).all()


def _swin_v2_block():
    from torchvision.models.swin_transformer import SwinTransformerBlockV2
    torch.manual_seed(3)
    return SwinTransformerBlockV2(32, 2, [4, 4], [2, 2]).eval()


@needs_gcc
def test_swin_v2_block_normalizes_on_the_kernel_bit_exact_with_no_scalar_call(tmp_path):
    """Cosine attention: q and k normalised on c7x_int8_l2_normalize (k then transposed on the
    integers), the per-head logit scale on the channel-affine kernel, the continuous position
    bias folded at compile time and added by the broadcast add; nothing left to TVM."""
    torch.manual_seed(1)
    flow = quantize(_swin_v2_block(), torch.randn(1, 8, 8, 32))
    log = OffloadLog()
    run_offload(flow.mod, log)
    assert [(d.op, d.status) for d in log.decisions if d.op == "l2_normalize"] == [("l2_normalize", "offloaded")] * 2
    summary, _ = compile_and_compare(flow.mod, "swin2", tmp_path / "c", inputs((1, 8, 8, 32), n=2), mmalib=True)
    assert summary["macs_offloaded"] == summary["macs_total"] > 0
    assert summary["calls_by_backend"]["tvm"] == 0
    # the manifest lists each normalisation as one layer on its kernel, its power / sum inside it
    layers = json.loads((tmp_path / "c" / "manifest.json").read_text())["layers"]
    assert [(e["op"], e["backend"]) for e in layers if e["op"] == "l2_normalize"] == [("l2_normalize", "c7x")] * 2
    assert not [e for e in layers if e["backend"] == "scalar"]
