"""int8 LayerNorm on the C7x: the c7x_int8_layer_norm kernel (C == numpy twin), its
error against torch's Q/DQ LayerNorm, the compile-time constants, the offload pass and
a small transformer block through codegen bit-exact (issue 28, item 3)."""

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


def _case(rng, rows, n, s_in=0.05, zp_in=3, s_out=0.03, zp_out=-5, eps=1e-5):
    x = rng.integers(-128, 128, (rows, n), dtype=np.int8)
    gamma = rng.uniform(0.5, 1.5, n)
    beta = rng.uniform(-0.5, 0.5, n)
    g, b, e = ref.layer_norm_constants(gamma, beta, eps, s_in, s_out, zp_out)
    return x, (gamma, beta, eps, s_in, zp_in, s_out, zp_out), (g, b, e)


def _qdq_layer_norm(x, gamma, beta, eps, s_in, zp_in, s_out, zp_out) -> np.ndarray:
    """torch's Q/DQ program: dequantize, float32 layer_norm over the last axis, quantize."""
    d = QD.dequantize_per_tensor(torch.from_numpy(x), s_in, zp_in, -128, 127, torch.int8)
    y = torch.nn.functional.layer_norm(d, (x.shape[-1],), torch.tensor(gamma, dtype=torch.float32),
                                       torch.tensor(beta, dtype=torch.float32), eps)
    return QD.quantize_per_tensor(y, s_out, zp_out, -128, 127, torch.int8).numpy()


@needs_gcc
@pytest.mark.parametrize("rows,n", [(1, 1), (3, 7), (4, 96), (2, 768), (1, 4096)])
def test_layer_norm_c_equals_python(rows, n):
    rng = _rng("ln", rows, n)
    x, p, (g, b, e) = _case(rng, rows, n)
    x[0, : n // 2] = 7            # a row with a repeated value (small variance)
    out_c, out_py = np.full((rows, n), 0x55, np.int8), np.full((rows, n), 0x55, np.int8)
    assert hostlib.call_kernel("c7x_int8_layer_norm", x, g, b, out_c, rows, n, p[4], e) == ref.C7X_OK
    assert ref.c7x_int8_layer_norm(x, g, b, out_py, rows, n, p[4], e) == ref.C7X_OK
    np.testing.assert_array_equal(out_c, out_py)


@needs_gcc
def test_a_constant_row_gives_beta_in_c_and_python():
    """Zero variance and eps_q 0: D = 0, every element is beta (no division by zero)."""
    x = np.full((2, 6), -9, np.int8)
    g, b, e = ref.layer_norm_constants(np.ones(6), np.linspace(-0.3, 0.3, 6), 0.0, 0.1, 0.02, 4)
    assert e == 0
    for call in (lambda o: hostlib.call_kernel("c7x_int8_layer_norm", x, g, b, o, 2, 6, 0, e),
                 lambda o: ref.c7x_int8_layer_norm(x, g, b, o, 2, 6, 0, e)):
        out = np.zeros((2, 6), np.int8)
        assert call(out) == ref.C7X_OK
        np.testing.assert_array_equal(out[0], np.round(np.linspace(-0.3, 0.3, 6) / 0.02) + 4)


@pytest.mark.parametrize("n", [8, 96, 384, 768])
@pytest.mark.parametrize("s_in,zp_in", [(0.02, 0), (0.11, -17)])
def test_layer_norm_is_within_one_lsb_of_torch_qdq(n, s_in, zp_in):
    """The documented bound (docs/reference.md, "LayerNorm"): |out - q(layer_norm(dq(x)))| <= 1
    output LSB, equal on at least 99% of the elements."""
    rng = _rng("bound", n, s_in)
    x, (gamma, beta, eps, _, _, s_out, zp_out), _ = _case(rng, 32, n, s_in=s_in, zp_in=zp_in)
    g, b, e = ref.layer_norm_constants(gamma, beta, eps, s_in, s_out, zp_out)
    out = np.zeros_like(x)
    assert ref.c7x_int8_layer_norm(x, g, b, out, 32, n, zp_in, e) == ref.C7X_OK
    want = _qdq_layer_norm(x, gamma, beta, eps, s_in, zp_in, s_out, zp_out)
    diff = np.abs(out.astype(np.int16) - want.astype(np.int16))
    assert diff.max() <= 1
    assert (diff == 0).mean() >= 0.99


def test_constants_that_do_not_fit_are_refused():
    with pytest.raises(ValueError, match="weight"):
        ref.layer_norm_constants(np.array([1e6]), np.zeros(1), 1e-5, 0.1, 0.01, 0)
    with pytest.raises(ValueError, match="bias"):
        ref.layer_norm_constants(np.ones(1), np.array([1e4]), 1e-5, 0.1, 0.01, 0)
    with pytest.raises(ValueError, match="epsilon"):
        ref.layer_norm_constants(np.ones(4096), np.zeros(4096), 1.0, 1e-3, 0.01, 0)


class Block(nn.Module):
    """A pre-norm transformer block: LayerNorm, attention (softmax kernel), residual,
    LayerNorm, GELU MLP (table kernel), residual."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.scale = dim ** -0.5
        with torch.no_grad():
            for ln in (self.n1, self.n2):
                ln.weight.uniform_(0.5, 1.5)
                ln.bias.uniform_(-0.2, 0.2)

    def forward(self, x):                      # [1, tokens, dim]
        q, k, v = self.qkv(self.n1(x)).chunk(3, dim=-1)
        a = torch.softmax(q @ k.transpose(-2, -1) * self.scale, dim=-1)
        x = x + self.proj(a @ v)
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.n2(x))))


def _flow(model, shape, **kw):
    torch.manual_seed(0)
    return quantize(model.eval(), torch.randn(*shape), **kw)


def test_pass_offloads_both_layer_norms_and_logs_them():
    torch.manual_seed(0)
    flow = _flow(Block(), (1, 6, 16))
    log = OffloadLog()
    run_offload(flow.mod, log)
    ln = [d for d in log.decisions if d.op == "layer_norm"]
    assert [(d.status, d.kernel) for d in ln] == [("offloaded", "c7x_int8_layer_norm")] * 2


def test_int16_layer_norm_stays_scalar_with_the_reason():
    torch.manual_seed(0)
    flow = _flow(Block(), (1, 6, 16), dtype="int16")
    log = OffloadLog()
    run_offload(flow.mod, log)
    ln = [d for d in log.decisions if d.op == "layer_norm"]
    assert len(ln) == 2 and all(d.status == "declined" and "only int8" in d.reason for d in ln)


@needs_gcc
def test_transformer_block_c_equals_reference_and_stays_close_to_torch_qdq(tmp_path):
    """The block through codegen: host C == the Python reference bit for bit, LayerNorm,
    softmax and GELU on C7x kernels; against torch's Q/DQ model the output moves by a few
    output steps at most (each kernel's 1-LSB bound, carried through the block)."""
    torch.manual_seed(0)
    flow = _flow(Block(), (1, 6, 16))
    x = inputs((1, 6, 16), n=3)
    summary, out = compile_and_compare(flow.mod, "block", tmp_path / "c", x, mmalib=True)
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    backends = {}
    for e in manifest["layers"]:
        backends.setdefault(e["op"], set()).add(e["backend"])
    assert backends["layer_norm"] == {"c7x"} and backends["softmax"] == {"c7x"} and backends["gelu"] == {"c7x"}
    with torch.no_grad():
        expect = np.concatenate([flow.qdq(torch.from_numpy(x[i:i + 1])).numpy() for i in range(3)])
    assert np.abs(out - expect).max() <= 0.1 * np.abs(expect).max()
