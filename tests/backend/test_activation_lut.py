"""int8 activation tables: the c7x_int8_lut kernel (C == numpy twin), the compile-time
table == torch's Q/DQ ops, the offload pass on every recognised form, and a tiny
net through codegen + verify bit-exact."""

from __future__ import annotations

import json
import shutil
import zlib

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from c_check import compile_and_compare, inputs
from qflow import quantize

from pipeline.backend.activation_table import ACTIVATIONS, activation_table
from pipeline.backend.kernels import hostlib
from pipeline.backend.kernels import reference as ref
from pipeline.backend.manifest import build_manifest
from pipeline.backend.passes.log import OffloadLog
from pipeline.backend.passes.pipeline import run_offload

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the host kernels")
QD = torch.ops.quantized_decomposed


def _rng(*parts):
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


@needs_gcc
@pytest.mark.parametrize("n", [1, 7, 256, 1001])
def test_lut_c_equals_python(n):
    rng = _rng("lut", n)
    x = rng.integers(-128, 128, n, dtype=np.int8)
    table = rng.integers(-128, 128, 256, dtype=np.int8)
    out_c, out_py = np.full(n, 0x55, np.int8), np.full(n, 0x55, np.int8)
    assert hostlib.call_kernel("c7x_int8_lut", x, table, out_c, n) == ref.C7X_OK
    assert ref.c7x_int8_lut(x, table, out_py, n) == ref.C7X_OK
    np.testing.assert_array_equal(out_c, out_py)
    np.testing.assert_array_equal(out_py, table[x.astype(np.int64) + 128])   # independent formula


@needs_gcc
def test_lut_covers_both_ends_of_the_table():
    x = np.array([-128, 127, 0, -1], np.int8)
    table = np.arange(-128, 128).astype(np.int8)[::-1].copy()           # table[i] = 127 - i
    out = np.zeros(4, np.int8)
    assert hostlib.call_kernel("c7x_int8_lut", x, table, out, 4) == ref.C7X_OK
    assert out.tolist() == [127, -128, -1, 0]


@pytest.mark.parametrize("kind", sorted(ACTIVATIONS))
@pytest.mark.parametrize("zp_in,zp_out", [(0, 0), (-17, 40)])
def test_table_equals_torch_qdq_ops_on_a_large_tensor(kind, zp_in, zp_out):
    """Looking up the table == running dequantize -> f -> quantize on a whole odd-shaped
    tensor (the vectorised path of the Q/DQ program), for random scales."""
    rng = _rng(kind, zp_in)
    s_in, s_out = (float(np.float32(v)) for v in rng.uniform(0.005, 0.08, 2))
    x = torch.from_numpy(rng.integers(-128, 128, (3, 37, 91), dtype=np.int8))
    d = QD.dequantize_per_tensor(x, s_in, zp_in, -128, 127, torch.int8)
    expect = QD.quantize_per_tensor(ACTIVATIONS[kind](d), s_out, zp_out, -128, 127, torch.int8)
    table = activation_table(kind, s_in, zp_in, s_out, zp_out)
    got = table[x.numpy().astype(np.int64) + 128]
    np.testing.assert_array_equal(got, expect.numpy())


class Acts(nn.Module):
    """Only activations between Q/DQ: the offloaded program is exactly torch's."""

    def forward(self, x):
        return torch.tanh(F.gelu(torch.sigmoid(F.silu(F.hardsigmoid(F.hardswish(x)) * 4.0 - 2.0))) * 3.0)


class ActsAfterConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 5, 3, 1, 1)

    def forward(self, x):
        return torch.tanh(F.gelu(torch.sigmoid(F.silu(F.hardsigmoid(F.hardswish(self.c(x)))))))


def _flow(model, shape, **kw):
    torch.manual_seed(0)
    return quantize(model, torch.randn(*shape) * 2, **kw)


def test_pass_offloads_every_form_and_the_manifest_names_them():
    flow = _flow(ActsAfterConv(), (1, 3, 7, 9))
    mod, log = run_offload(flow.mod)
    lut = [d for d in log.decisions if d.kernel == "c7x_int8_lut"]
    assert [d.op for d in lut] == ["hardswish", "hardsigmoid", "silu", "sigmoid", "gelu", "tanh"]
    assert all(d.status == "offloaded" for d in lut)
    layers = build_manifest(flow.mod, mod, log)["layers"]
    assert [(e["op"], e["backend"]) for e in layers] == [
        ("conv2d", "mmalib"), ("hardswish", "c7x"), ("hardsigmoid", "c7x"), ("silu", "c7x"),
        ("sigmoid", "c7x"), ("gelu", "c7x"), ("tanh", "c7x")]
    assert all(e["input_shape"] == e["output_shape"] == [1, 5, 7, 9] for e in layers[1:])


def test_int16_activations_stay_scalar_with_the_reason():
    flow = _flow(ActsAfterConv(), (1, 3, 7, 9), dtype="int16")
    log = OffloadLog()
    mod, _ = run_offload(flow.mod, log)
    acts = [d for d in log.decisions if d.op in ACTIVATIONS]
    assert len(acts) == 6 and all(d.status == "declined" and "128 KiB" in d.reason for d in acts)
    layers = build_manifest(flow.mod, mod, log)["layers"]
    assert [e["op"] for e in layers if e["backend"] == "scalar"] == [
        "hardswish", "hardsigmoid", "silu", "sigmoid", "gelu", "tanh"]


@needs_gcc
def test_activations_only_net_c_equals_reference_and_torch_qdq_exactly(tmp_path):
    """Input quantize, six tables, output dequantize: the C build equals the Python
    reference bit for bit and torch's Q/DQ model exactly (the tables are exact)."""
    flow = _flow(Acts(), (1, 3, 5, 11))
    x = inputs((1, 3, 5, 11), n=4, scale=2.0)
    summary, out = compile_and_compare(flow.mod, "acts", tmp_path / "c", x, mmalib=True)
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    ops = {e["op"]: e["backend"] for e in manifest["layers"]}
    assert all(ops[k] == "c7x" for k in ("hardswish", "hardsigmoid", "silu", "sigmoid", "gelu", "tanh"))
    with torch.no_grad():
        expect = np.concatenate([flow.qdq(torch.from_numpy(x[i:i + 1])).numpy() for i in range(4)])
    np.testing.assert_array_equal(out, expect)


@needs_gcc
def test_tiny_activation_net_through_codegen_and_verify_is_bit_exact(tmp_path):
    from doitproj import Project, build_through

    p = Project(tmp_path / "proj")
    toml = p.add_model("acts")
    toml.write_text(toml.read_text().replace("tinynets:small_cnn", "tinynets:activation_cnn"))
    p.add_images("setA", 3)
    build_through(p.root, last="verify")
    art = p.root / "artifacts" / "acts"
    manifest = json.loads((art / "c" / "mmalib" / "manifest.json").read_text())
    scalar = [e["op"] for e in manifest["layers"] if e["backend"] == "scalar"]
    assert not {"hardswish", "hardsigmoid", "silu", "sigmoid", "gelu"} & set(scalar), scalar
    verify = json.loads((art / "verify.json").read_text())
    for r in verify["variants"]:
        assert r["vs_python_reference"]["bit_exact_images"] == 3, r["variant"]
