"""Squeeze-excitation multiply: c7x_int{8,16}_channel_mul (C == numpy twin, near the
float formula), the multiplier fold, the quantizer's SE-gate extension, the offload
pass, and SE nets compiled with host C == Python reference bit for bit."""

from __future__ import annotations

import shutil
import struct
import zlib

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torchao.quantization.pt2e.quantizer.quantizer import Q_ANNOTATION_KEY

from c_check import compile_and_compare, inputs
from qflow import quantize

from pipeline.backend import fold
from pipeline.backend.kernels import hostlib
from pipeline.backend.kernels import reference as ref
from pipeline.backend.kernels.catalog import KERNELS
from pipeline.backend.manifest import build_manifest
from pipeline.backend.passes.log import OffloadLog
from pipeline.backend.passes.offload_calls import offload_calls
from pipeline.backend.passes.pipeline import run_offload
from pipeline.backend.refusal import Declined
from pipeline.quant import C7xMMAQuantizer

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the host kernels")
DTYPES = (np.int8, np.int16)


def _rng(*parts):
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


def _blob(m, shift, zx=0, zg=0, zo=0):
    return np.frombuffer(struct.pack("<iiibbbx", m, shift, 0, zx, zg, zo), np.uint8).copy()


def _rand(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


@needs_gcc
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("planes,hw", [(1, 1), (3, 7), (17, 49)])
@pytest.mark.parametrize("rounding", ["half_up", "floor"])
def test_channel_mul_c_equals_python(dtype, planes, hw, rounding):
    rng = _rng(str(dtype), planes, hw, rounding)
    x, g = _rand(rng, dtype, (planes, hw)), _rand(rng, dtype, planes)
    i8 = dtype == np.int8
    for s_x, s_g, s_o in ((0.02, 0.004, 0.01), (0.5, 0.9, 1e-3), (1e-4, 1e-4, 0.3)):
        zps = (5, -9, 12) if i8 else (0, 0, 0)
        blob = fold.channel_mul_params(s_x, zps[0], s_g, zps[1], s_o, zps[2], np.dtype(dtype).name)
        outs = [np.full((planes, hw), 0x55, dtype) for _ in range(2)]
        assert hostlib.call_kernel(f"c7x_{np.dtype(dtype).name}_channel_mul", x, g, blob, outs[0],
                                   planes, hw, rounding=rounding) == ref.C7X_OK
        fn = KERNELS[f"c7x_{np.dtype(dtype).name}_channel_mul"]
        assert fn(x, g, blob, outs[1], planes, hw, rounding=rounding) == ref.C7X_OK
        np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_channel_mul_is_the_float_formula_within_half_an_lsb_and_a_bit(dtype):
    """Independent anchor: exact rationals in float64; M's 2^-30 precision adds < 1e-3 LSB."""
    rng = _rng("anchor", str(dtype))
    name = np.dtype(dtype).name
    x, g = _rand(rng, dtype, (6, 11)), _rand(rng, dtype, 6)
    s_x, s_g, s_o = 0.031, 0.0047, 0.0123 if dtype == np.int8 else 5.0
    zx, zg, zo = (3, -4, 7) if dtype == np.int8 else (0, 0, 0)
    out = np.zeros((6, 11), dtype)
    blob = fold.channel_mul_params(s_x, zx, s_g, zg, s_o, zo, name)
    assert KERNELS[f"c7x_{name}_channel_mul"](x, g, blob, out, 6, 11) == ref.C7X_OK
    exact = (x.astype(np.float64) - zx) * s_x * ((g.astype(np.float64) - zg) * s_g)[:, None] / s_o + zo
    info = np.iinfo(dtype)
    inside = (exact > info.min) & (exact < info.max)
    assert inside.mean() > 0.3 and np.abs(out[inside] - exact[inside]).max() <= 0.5 + 1e-3
    assert (out[~inside] == np.clip(np.rint(exact[~inside]), info.min, info.max)).all()


def test_channel_mul_params_use_the_full_multiplier_width():
    for dtype, bits in (("int8", 31), ("int16", 29)):
        for r in (1e-9, 3.3e-4, 0.7, 1.0, 123.0):
            m, shift = struct.unpack("<ii", fold.channel_mul_params(r, 0, 1.0, 0, 1.0, 0, dtype)[:8].tobytes())
            assert 2 ** (bits - 1) <= m < 2**bits or shift == 62
            assert abs(m / 2.0**shift - r) <= r * 2.0 ** -(bits - 2)
    with pytest.raises(Declined):
        fold.channel_mul_params(2.0**40, 0, 1.0, 0, 1.0, 0, "int8")
    with pytest.raises(Declined):
        fold.channel_mul_params(0.1, 200, 1.0, 0, 1.0, 0, "int8")


@needs_gcc
@pytest.mark.parametrize("m,shift", [(-1, 3), (2**31 - 1, 63)])
def test_channel_mul_bad_params_are_param_errors(m, shift):
    x, g, out = np.ones((2, 3), np.int8), np.ones(2, np.int8), np.full((2, 3), 0x55, np.int8)
    for call in (lambda *a: hostlib.call_kernel("c7x_int8_channel_mul", *a), ref.c7x_int8_channel_mul):
        assert call(x, g, _blob(m, shift), out, 2, 3) == ref.C7X_ERR_PARAM
    assert (out == 0x55).all()
    assert ref.c7x_int16_channel_mul(x.astype(np.int16), g.astype(np.int16), _blob(2**29, 10),
                                     out.astype(np.int16), 2, 3) == ref.C7X_ERR_PARAM


class SE(nn.Module):
    """RegNet / EfficientNet squeeze-excitation: mean -> conv -> relu -> conv -> sigmoid -> mul."""

    def __init__(self, c=12, gate=torch.sigmoid, gate_first=True):
        super().__init__()
        self.c0, self.f1, self.f2, self.c3 = (nn.Conv2d(3, c, 3, 1, 1), nn.Conv2d(c, 4, 1),
                                              nn.Conv2d(4, c, 1), nn.Conv2d(c, 8, 1))
        self.gate, self.gate_first = gate, gate_first

    def forward(self, x):
        y = F.relu(self.c0(x))
        s = self.gate(self.f2(F.relu(self.f1(y.mean((2, 3), keepdim=True)))))
        return self.c3(s * y if self.gate_first else y * s)


class PlainSigmoid(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        return self.c(torch.sigmoid(x) * x)      # silu written out: not an SE gate


def _flow(model, shape=(1, 3, 7, 9), **kw):
    torch.manual_seed(0)
    return quantize(model, torch.randn(*shape), **kw)


def test_quantizer_annotates_the_se_gate_sigmoid_only():
    q = C7xMMAQuantizer()
    for model, expect in ((SE(), True), (PlainSigmoid(), False)):
        ep = torch.export.export(model.eval(), (torch.randn(1, 3, 7, 9),))
        gm = q.annotate(ep.module())
        sig = [n for n in gm.graph.nodes if n.target == torch.ops.aten.sigmoid.default]
        assert len(sig) == 1 and (Q_ANNOTATION_KEY in sig[0].meta) == expect, model


@pytest.mark.parametrize("dtype", ["int8", "int16"])
@pytest.mark.parametrize("gate_first", [True, False])
def test_pass_offloads_the_se_multiply(dtype, gate_first):
    flow = _flow(SE(gate_first=gate_first), dtype=dtype)
    log = OffloadLog()
    mod, _ = run_offload(flow.mod, log)
    (call,) = [c for c in offload_calls(mod) if c.kernel.endswith("channel_mul")]
    assert call.kernel == f"c7x_{dtype}_channel_mul" and call.backend == "c7x"
    assert call.scalars == [12, 63] and call.buffer_args == [0, 1, 2, 3]
    assert [tuple(int(d) for d in p.shape) for p in call.prim.params] == [
        (1, 12, 7, 9), (1, 12, 1, 1), (16,), (1, 12, 7, 9)]
    layers = build_manifest(flow.mod, mod, log)["layers"]
    assert [e["backend"] for e in layers if e["op"] == "multiply"] == ["c7x"]
    if dtype == "int8":   # the sigmoid gate runs as a table
        assert [e["backend"] for e in layers if e["op"] == "sigmoid"] == ["c7x"]


def test_elementwise_multiply_of_equal_shapes_is_not_matched():
    flow = _flow(PlainSigmoid())
    mod, log = run_offload(flow.mod)
    assert not [c for c in offload_calls(mod) if "channel_mul" in c.kernel]


@needs_gcc
@pytest.mark.parametrize("dtype", ["int8", "int16"])
@pytest.mark.parametrize("gate", ["sigmoid", "hardsigmoid"])
def test_se_net_c_equals_reference_and_is_near_torch_qdq(tmp_path, dtype, gate):
    fn = torch.sigmoid if gate == "sigmoid" else F.hardsigmoid
    flow = _flow(SE(gate=fn), dtype=dtype)
    x = inputs((1, 3, 7, 9), n=3)
    summary, out = compile_and_compare(flow.mod, "se", tmp_path / "c", x, mmalib=True)
    with torch.no_grad():
        expect = np.concatenate([flow.qdq(torch.from_numpy(x[i:i + 1])).numpy() for i in range(3)])
    span = float(np.abs(expect).max()) + 1e-6
    assert np.abs(out - expect).max() <= 0.05 * span
