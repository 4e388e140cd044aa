"""int8 softmax on the C7x: the c7x_int8_softmax kernel (C == numpy twin), its error
against torch's Q/DQ softmax (within 1 output LSB), the quantizer rule, the offload
pass, and a small attention block through codegen bit-exact (issue 28, item 3)."""

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

from pipeline.backend.kernels import hostlib
from pipeline.backend.kernels import reference as ref
from pipeline.backend.passes.log import OffloadLog
from pipeline.backend.passes.pipeline import run_offload

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the host kernels")
QD = torch.ops.quantized_decomposed


def _rng(*parts):
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


def _qdq_softmax(x: np.ndarray, s_in: float, zp_in: int) -> np.ndarray:
    """torch's Q/DQ program: dequantize, float32 softmax over the last axis, quantize at
    the fixed output qparams."""
    d = QD.dequantize_per_tensor(torch.from_numpy(x), s_in, zp_in, -128, 127, torch.int8)
    p = torch.softmax(d, dim=-1)
    return QD.quantize_per_tensor(p, ref.SOFTMAX_OUT_SCALE, ref.SOFTMAX_OUT_ZERO_POINT, -128, 127,
                                  torch.int8).numpy()


@needs_gcc
@pytest.mark.parametrize("rows,n", [(1, 1), (3, 7), (8, 100), (2, 197), (1, 1000)])
def test_softmax_c_equals_python(rows, n):
    rng = _rng("softmax", rows, n)
    for s_in in (0.004, 0.05, 0.3):
        x = rng.integers(-128, 128, (rows, n), dtype=np.int8)
        table = ref.softmax_table(s_in)
        out_c, out_py = np.full((rows, n), 0x55, np.int8), np.full((rows, n), 0x55, np.int8)
        assert hostlib.call_kernel("c7x_int8_softmax", x, table, out_c, rows, n) == ref.C7X_OK
        assert ref.c7x_int8_softmax(x, table, out_py, rows, n) == ref.C7X_OK
        np.testing.assert_array_equal(out_c, out_py)


@pytest.mark.parametrize("s_in", [0.002, 0.02, 0.08, 0.25])
@pytest.mark.parametrize("n", [4, 49, 100, 197])
def test_softmax_is_within_one_lsb_of_torch_qdq(s_in, n):
    """The documented bound (docs/reference.md, "Softmax"): |out - q(softmax(dq(x)))| <= 1
    output LSB (1/256) on every element, and equal on almost all of them."""
    rng = _rng("bound", s_in, n)
    zp = int(rng.integers(-20, 20))
    x = rng.integers(-128, 128, (64, n), dtype=np.int8)
    x[:8] = np.clip(x[:8].astype(np.int16) // 16 + 100, -128, 127).astype(np.int8)  # peaked rows
    out = np.zeros_like(x)
    assert ref.c7x_int8_softmax(x, ref.softmax_table(s_in), out, 64, n) == ref.C7X_OK
    diff = np.abs(out.astype(np.int16) - _qdq_softmax(x, s_in, zp).astype(np.int16))
    assert diff.max() <= 1
    assert (diff == 0).mean() >= 0.99


def test_a_dominant_element_saturates_like_torch():
    """p = 1.0 is code 128, beyond int8: both clamp it to 127."""
    x = np.array([[127, -128, -128, -128]], np.int8)
    out = np.zeros_like(x)
    assert ref.c7x_int8_softmax(x, ref.softmax_table(0.5), out, 1, 4) == ref.C7X_OK
    assert out.tolist() == [[127, -128, -128, -128]] == _qdq_softmax(x, 0.5, 0).tolist()


def test_table_is_q16_exp_of_the_code_distance():
    t = ref.softmax_table(0.01)
    assert t.dtype == np.int32 and t.shape == (256,)
    assert t[255] == 1 << 16 and t[254] == round(65536 * np.exp(-0.01)) and t[0] == round(65536 * np.exp(-2.55))
    assert (np.diff(t) >= 0).all()
    with pytest.raises(ValueError, match="positive"):
        ref.softmax_table(0.0)


@needs_gcc
@pytest.mark.parametrize("bad", ["zero_one", "negative", "above_one", "huge"])
def test_an_invalid_table_is_a_param_error_in_c_and_python(bad):
    table = ref.softmax_table(0.1)
    if bad == "zero_one":
        table[255] = 0
    elif bad == "negative":
        table[3] = -1
    elif bad == "above_one":
        table[100] = table[255] + 1
    else:
        table[:] = 1 << 25
    x = np.zeros((1, 4), np.int8)
    for call in (lambda o: hostlib.call_kernel("c7x_int8_softmax", x, table, o, 1, 4),
                 lambda o: ref.c7x_int8_softmax(x, table, o, 1, 4)):
        out = np.full((1, 4), 9, np.int8)
        assert call(out) == ref.C7X_ERR_PARAM
        assert (out == 9).all()   # nothing written


class Attention(nn.Module):
    """One attention head block as vision transformers write it: q k^T * scale, softmax,
    times v (the matmuls are mmalib_batch_matmul's, tests/backend/test_batch_matmul.py)."""

    def __init__(self, dim: int = 8):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.scale = dim ** -0.5

    def forward(self, x):                      # x [1, tokens, dim]
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        attn = torch.softmax(q @ k.transpose(-2, -1) * self.scale, dim=-1)
        return self.proj(attn @ v)


def _flow(model, shape, **kw):
    torch.manual_seed(0)
    return quantize(model.eval(), torch.randn(*shape), **kw)


def test_quantizer_observes_the_input_and_fixes_the_output_qparams():
    flow = _flow(Attention(), (1, 6, 8))
    g = flow.qdq.graph
    sm = [n for n in g.nodes if n.op == "call_function" and "softmax" in str(n.target)]
    assert len(sm) == 1
    dq_in = sm[0].args[0]
    assert "dequantize_per_tensor" in str(dq_in.target)
    q_out = next(iter(sm[0].users))
    assert "quantize_per_tensor" in str(q_out.target)
    assert (q_out.args[1], q_out.args[2]) == (ref.SOFTMAX_OUT_SCALE, ref.SOFTMAX_OUT_ZERO_POINT)


def test_int16_softmax_stays_float():
    """No int16 softmax kernel: in int16 mode the quantizer leaves softmax float."""
    flow = _flow(Attention(), (1, 6, 8), dtype="int16")
    sm = next(n for n in flow.qdq.graph.nodes if n.op == "call_function" and "softmax" in str(n.target))
    # its neighbours (the matmuls) observe their tensors in int16; no int8 softmax output spec
    quantizes = [u for u in sm.users if "quantize_per_tensor" in str(u.target)]
    assert quantizes and all(q.args[-1] == torch.int16 for q in quantizes)
    assert all((q.args[1], q.args[2]) != (ref.SOFTMAX_OUT_SCALE, ref.SOFTMAX_OUT_ZERO_POINT) for q in quantizes)


def test_pass_offloads_the_softmax_and_logs_it():
    flow = _flow(Attention(), (1, 6, 8))
    log = OffloadLog()
    run_offload(flow.mod, log)
    sm = [d for d in log.decisions if d.op == "softmax"]
    assert [(d.status, d.kernel) for d in sm] == [("offloaded", "c7x_int8_softmax")]


@needs_gcc
def test_attention_block_c_equals_reference_and_stays_close_to_torch_qdq(tmp_path):
    """Linear, matmuls and softmax kernels, linear: the C build equals the Python reference bit
    for bit; against torch's Q/DQ model the output differs by at most a few LSB (the
    softmax's 1-LSB bound, carried through attn @ v and the projection)."""
    flow = _flow(Attention(), (1, 6, 8))
    x = inputs((1, 6, 8), n=3)
    summary, out = compile_and_compare(flow.mod, "attn", tmp_path / "c", x, mmalib=True)
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert {e["op"]: e["backend"] for e in manifest["layers"]}["softmax"] == "c7x"
    with torch.no_grad():
        expect = np.concatenate([flow.qdq(torch.from_numpy(x[i:i + 1])).numpy() for i in range(3)])
    assert np.abs(out - expect).max() <= 0.1 * np.abs(expect).max()
