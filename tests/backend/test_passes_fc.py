"""Fully connected (torch linear) offload: 2-D and 3-D inputs, bias first or absent,
N padding, K padding (zero weight columns and an ``R.nn.pad`` of the input), int16.

The K-padding cases also go through the whole host build (gcc): host C == Python
reference bit for bit, the output within the Q/DQ model's usual LSB, and the manifest
shows the FC offloaded and no scalar layer (the pad is not a layer)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn as nn
from c_check import GCC, compile_and_compare, inputs
from qflow import quantize

from pipeline.backend.passes.graph import Graph, const_array
from pipeline.backend.passes.fc import offload_fc_i8, offload_fc_i16
from pipeline.backend.passes.log import OffloadLog
from pipeline.backend.passes.offload_calls import layer_calls, offload_calls
from pipeline.backend.passes.pipeline import run_offload


class FC(nn.Module):
    def __init__(self, k, n, bias=True, relu=False):
        super().__init__()
        self.fc = nn.Linear(k, n, bias=bias)
        self.relu = relu

    def forward(self, x):
        y = self.fc(x)
        return torch.relu(y) if self.relu else y


def _flow(k, n, shape=None, **kw):
    torch.manual_seed(0)
    model = FC(k, n, bias=kw.pop("bias", True), relu=kw.pop("relu", False))
    return quantize(model, torch.randn(*(shape or (1, k))), **kw)


def _params(mod):
    """(d_s, d_zp, W, w_s, bias or None, o_s, o_zp) of the single linear of an imported module."""
    g = Graph(mod["main"])
    mm = next(b.value for b in g.bindings if g.call(b.var, "relax.matmul") is not None)
    lhs = g.call(mm.args[0], "relax.reshape")
    dq_x = g.call(lhs.args[0] if lhs is not None else mm.args[0], "relax.dequantize")
    dq_w = g.call(g.call(mm.args[1], "relax.permute_dims").args[0], "relax.dequantize")
    add = next((b.value for b in g.bindings if g.call(b.var, "relax.add") is not None), None)
    bias = None if add is None else next(const_array(a) for a in add.args if const_array(a) is not None)
    q = [b.value for b in g.bindings if g.call(b.var, "relax.quantize") is not None][-1]
    num = lambda e: const_array(e).item()  # noqa: E731
    return (num(dq_x.args[1]), num(dq_x.args[2]), const_array(dq_w.args[0]), const_array(dq_w.args[1]),
            bias, num(q.args[1]), num(q.args[2]))


def _ops(mod):
    g = Graph(mod["main"])
    return [b.value.op.name for b in g.bindings if g.call(b.var, *_ALL) is not None]


_ALL = ("relax.matmul", "relax.strided_slice", "relax.clip", "relax.reshape", "relax.call_tir")


def test_fc_i8_2d():
    flow = _flow(64, 32)
    log = OffloadLog()
    mod = offload_fc_i8(flow.mod, log)
    (call,) = offload_calls(mod)
    assert call.kernel == call.extern_name == "mmalib_matmul_bias_i8" and call.backend == "mmalib"
    assert call.buffer_args == [0, 1, 2, 3, 4, 5]
    assert [str(p.dtype) for p in call.prim.params] == ["int8", "int8", "int32", "uint8", "uint8", "int8"]
    assert call.scalars[:-2] == [1, 64, 32]                                    # M, K, N
    d_s, d_zp, w, w_s, b, o_s, o_zp = _params(flow.mod)
    np.testing.assert_array_equal(call.const(1), w)                      # [N, K] torch layout
    unit = d_s * w_s.astype(np.float64)
    np.testing.assert_array_equal(call.const(2), np.rint(b / unit).astype(np.int32))
    assert "relax.matmul" not in _ops(mod) and "relax.strided_slice" not in _ops(mod)
    assert log.decisions[0].note is None


def test_fc_asymmetric_folds_both_zero_points():
    flow = _flow(32, 32, symmetric_activations=False)
    d_s, d_zp, w, w_s, b, o_s, o_zp = _params(flow.mod)
    assert d_zp != 0 and o_zp != 0
    (call,) = offload_calls(offload_fc_i8(flow.mod))
    unit = d_s * w_s.astype(np.float64)
    expected = np.rint(b / unit) - d_zp * w.astype(np.int64).sum(1) + np.rint(o_zp * o_s / unit)
    np.testing.assert_array_equal(call.const(2), expected.astype(np.int32))


def test_fc_pads_n_to_the_mma_width_and_slices_back():
    flow = _flow(32, 40)
    log = OffloadLog()
    mod = offload_fc_i8(flow.mod, log)
    (call,) = offload_calls(mod)
    assert call.scalars[:-2] == [1, 32, 64]
    w = call.const(1)
    assert w.shape == (64, 32)
    np.testing.assert_array_equal(w[:40], _params(flow.mod)[2])
    for i in (1, 2, 3, 4):                                                # W, bias, scale, shift
        assert not call.const(i)[40:].any()
    assert tuple(int(d) for d in call.prim.params[5].shape) == (1, 64)
    g = Graph(mod["main"])
    (sl,) = [g.call(b.var, "relax.strided_slice") for b in g.bindings
             if g.call(b.var, "relax.strided_slice") is not None]
    axes, begin, end = ([int(v.value) for v in t.fields] for t in sl.args[1:4])
    assert (axes, begin, end) == ([1], [0], [40])
    assert tuple(int(d) for d in sl.ty.shape.values) == (1, 40)
    assert "N=40 padded to 64" in log.decisions[0].note


def test_fc_3d_input_reshape_form_with_relu():
    flow = _flow(32, 64, shape=(1, 4, 32), relu=True)
    assert "relax.reshape" in _ops(flow.mod)                            # reshape -> matmul -> reshape
    mod = offload_fc_i8(flow.mod)
    (call,) = offload_calls(mod)
    assert call.scalars[:-2] == [4, 32, 64]                                    # M = 1 * 4
    assert [tuple(int(d) for d in p.shape) for p in call.prim.params][0] == (1, 4, 32)
    assert [tuple(int(d) for d in p.shape) for p in call.prim.params][5] == (1, 4, 64)
    g = Graph(mod["main"])
    assert call.scalars[-2:] == [_params(flow.mod)[6], 127]  # the fused ReLU: the kernel's saturation range
    assert not any(g.call(b.var, "relax.clip") is not None for b in g.bindings)
    assert "relax.matmul" not in _ops(mod)


def test_fc_without_bias():
    flow = _flow(32, 32, bias=False)
    (call,) = offload_calls(offload_fc_i8(flow.mod))
    assert not call.const(2).any()                                       # symmetric: zero bias


def _pad_of(mod, call):
    """(input shape, output shape) of the K-pad copy the offloaded call reads, else None;
    asserts it is an opaque PrimFunc (FuseOps keeps it a call of its own)."""
    g = Graph(mod["main"])
    pad = g.call(call.args[0], "relax.call_tir")
    if pad is None:
        assert g.call(call.args[0], "relax.nn.pad") is None
        return None
    prim = mod[pad.args[0]]
    assert pad.args[0].name_hint.startswith("fc_k_pad") and int(prim.attrs["op_pattern"]) == 8
    assert "c7x_kernel" not in prim.attrs                                # a scalar-path copy, not an offload
    return [[int(d) for d in p.shape] for p in prim.params]


def test_fc_pads_k_with_zero_weight_columns_and_an_input_pad():
    flow = _flow(40, 32, symmetric_activations=False)                  # d_zp != 0: bias folds -d_zp sum W
    log = OffloadLog()
    mod = offload_fc_i8(flow.mod, log)
    (call,) = offload_calls(mod)
    assert call.scalars[:-2] == [1, 64, 32]                                    # M, K_pad, N
    d_s, d_zp, w, w_s, b, o_s, o_zp = _params(flow.mod)
    assert d_zp != 0
    wp = call.const(1)
    assert wp.shape == (32, 64)
    np.testing.assert_array_equal(wp[:, :40], w)
    assert not wp[:, 40:].any()                                           # zero columns
    unit = d_s * w_s.astype(np.float64)                                   # bias over the unpadded K
    expected = np.rint(b / unit) - d_zp * w.astype(np.int64).sum(1) + np.rint(o_zp * o_s / unit)
    np.testing.assert_array_equal(call.const(2), expected.astype(np.int32))
    assert _pad_of(mod, call) == [[1, 40], [1, 64]]                       # last axis 40 -> 64
    assert [tuple(int(d) for d in p.shape) for p in call.prim.params][0] == (1, 64)
    assert "relax.strided_slice" not in _ops(mod)                         # N = 32 needs no slice
    assert log.decisions[0].status == "offloaded"
    assert "K=40 padded to 64" in log.decisions[0].note and "N=" not in log.decisions[0].note


def test_fc_k_already_a_multiple_has_no_pad():
    (call,) = offload_calls(mod := offload_fc_i8(_flow(64, 40).mod))
    assert call.scalars[:-2] == [1, 64, 64] and _pad_of(mod, call) is None


def test_fc_i16_pads_k_and_n_to_16_on_a_3d_input():
    flow = _flow(7, 24, shape=(1, 3, 7), dtype="int16")                 # int8 weights, widened
    log = OffloadLog()
    mod = offload_fc_i16(flow.mod, log)
    (call,) = offload_calls(mod)
    assert call.scalars[:-2] == [3, 16, 32]                                    # M = 3, K 7 -> 16, N 24 -> 32
    w = call.const(1)
    assert w.shape == (32, 16) and str(w.dtype) == "int16"
    assert not w[:, 7:].any() and not w[24:].any()                       # zero columns and rows
    np.testing.assert_array_equal(w[:24, :7] != 0, _params(flow.mod)[2] != 0)   # pre-scaled in place
    assert _pad_of(mod, call) == [[1, 3, 7], [1, 3, 16]]
    assert [tuple(int(d) for d in p.shape) for p in call.prim.params][0] == (1, 3, 16)
    note = log.decisions[0].note
    assert "K=7 padded to 16" in note and "N=24 padded to 32" in note and "pre-scaled" in note


# (dtype, K, N, rows of a 3-D input or 0, quantize kwargs): K not a multiple of the MMA
# width (32 int8, 16 int16), with and without N padding; 440 is RegNetY-400MF's classifier.
E2E = {
    "i8_k40": ("int8", 40, 32, 0, {}),
    "i8_k440_n40": ("int8", 440, 40, 0, {}),
    "i8_k7_n10_3d_affine": ("int8", 7, 10, 3, {"symmetric_activations": False}),
    "i16_k40": ("int16", 40, 16, 0, {}),
    "i16_k7_n24_3d": ("int16", 7, 24, 3, {}),
    "i16_k440_n40_w16": ("int16", 440, 40, 0, {"weight_dtype": "int16"}),
}


def _lsb_bound(flow, dtype):
    """Per-output-channel bound on |ours - Q/DQ| in output LSB: 2 for int8; for int16
    ``2 + |q| * rel`` with ``rel`` the relative error of each channel's multiplier
    ``k*scale/2^shift`` against ``d_s w_s / o_s`` (the 7-bit scale, pre-scaled by
    ``k`` for widened int8 weights: docs/reference.md "int16 folding")."""
    if dtype == "int8":
        return lambda q: 2
    (call,) = layer_calls(run_offload(flow.mod)[0])
    d_s, _, w, w_s, _, o_s, _ = _params(flow.mod)
    n = len(w_s)
    w2 = call.const(1)[:n, :w.shape[1]].astype(np.int64)          # unpadded block
    k = np.array([w2[c][w[c] != 0][0] // int(w[c][w[c] != 0][0]) for c in range(n)])
    r = d_s * w_s.astype(np.float64) / o_s
    rel = np.abs(k * call.const(3)[:n] / 2.0 ** call.const(4)[:n].astype(np.int64) - r) / r
    return lambda q: 2 + np.abs(q) * rel * 1.01


@pytest.mark.skipif(GCC is None, reason="gcc is not installed: the host build needs it")
@pytest.mark.parametrize("case", sorted(E2E))
def test_fc_padded_k_host_c_is_exact_and_within_lsb_of_qdq(case, tmp_path):
    dtype, k, n, rows, kw = E2E[case]
    shape = (1, rows, k) if rows else (1, k)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    calib = [torch.randn(shape, generator=gen) for _ in range(4)]
    flow = quantize(FC(k, n), calib[0], calib=calib, dtype=dtype, **kw)
    x = inputs(shape, n=3)
    _, c = compile_and_compare(flow.mod, "fc", tmp_path, x, mmalib=True)   # host C == Python, bit-exact
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    (fc,) = manifest["layers"]                                            # the pad is not a layer
    k_pad = -(-k // {"int8": 32, "int16": 16}[dtype]) * {"int8": 32, "int16": 16}[dtype]
    assert (fc["op"], fc["backend"], fc["weight_shape"]) == ("fc", "mmalib", [n, k])
    assert f"K={k} padded to {k_pad}" in fc["note"] and manifest["summary"]["by_backend"]["scalar"]["layers"] == 0
    (mm,) = [c for c in manifest["calls"] if c["backend"] == "mmalib"]
    (feed,) = [c for c in manifest["calls"] if c["output"] in mm["inputs"]]
    assert feed["shape"][-1] == k_pad and feed["backend"] == "tvm"        # the kernel reads [.., K_pad]
    assert feed["func"].startswith("fc_k_pad") and feed["layer"] == fc["id"]   # not fused; the FC's call
    _, _, _, _, _, o_s, o_zp = _params(flow.mod)
    with torch.no_grad():
        qdq = np.concatenate([flow.qdq(torch.from_numpy(x[i:i + 1])).numpy() for i in range(len(x))])
    assert c.shape == qdq.shape == (len(x), *shape[1:-1], n)
    q_ours, q_ref = np.rint(c / o_s) + o_zp, np.rint(qdq / o_s) + o_zp
    diff = np.abs(q_ours - q_ref)
    assert np.all(diff <= _lsb_bound(flow, dtype)(q_ref)), (case, diff.max())
    if dtype == "int8":                                 # int16: the multiplier's precision dominates
        assert (diff == 0).mean() > 0.8, (case, (diff == 0).mean())
    assert np.abs(q_ref).max() > (60 if dtype == "int8" else 1000)       # a real range was exercised


def test_fc_i16_pads_to_16():
    flow = _flow(32, 24, dtype="int16", weight_dtype="int16")
    log = OffloadLog()
    assert offload_calls(offload_fc_i8(flow.mod)) == []
    mod = offload_fc_i16(flow.mod, log)
    (call,) = offload_calls(mod)
    assert call.kernel == "mmalib_matmul_bias_i16" and call.scalars[:-2] == [1, 32, 32]
    assert [str(p.dtype) for p in call.prim.params] == ["int16", "int16", "int64", "uint8", "uint8", "int16"]
    assert "N=24 padded to 32" in log.decisions[0].note


def test_fc_i16_widened_int8_weights_are_prescaled():
    flow = _flow(32, 24, dtype="int16")                                 # int8 weights (default)
    log = OffloadLog()
    (call,) = offload_calls(offload_fc_i16(flow.mod, log))
    d_s, _, w, w_s, b, o_s, _ = _params(flow.mod)
    assert str(w.dtype) == "int8"
    w2, bias = call.const(1).astype(np.int64), call.const(2)
    k = np.array([w2[n][w[n] != 0][0] // int(w[n][w[n] != 0][0]) for n in range(24)])
    np.testing.assert_array_equal(w2[:24], w.astype(np.int64) * k[:, None])
    assert np.all((k >= 1) & (k <= 256)) and k.max() > 1
    unit = d_s * w_s.astype(np.float64)
    np.testing.assert_array_equal(bias[:24], np.rint(b / unit).astype(np.int64) * k)
    r = unit / o_s
    approx = k * call.const(3)[:24] / 2.0 ** call.const(4)[:24].astype(np.int64)
    assert np.all(np.abs(approx - r) / r < 1e-3)
    assert not w2[24:].any() and not call.const(3)[24:].any()           # padded rows stay 0
    assert "pre-scaled" in log.decisions[0].note and "N=24 padded to 32" in log.decisions[0].note


class ConstantBranch(nn.Module):
    """Swin-V2's continuous position bias in miniature: an MLP on a constant table
    (a buffer), added to a layer of the input."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.linspace(-1, 1, 64).reshape(1, 64))
        self.mlp = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32))
        self.fc = nn.Linear(64, 32)

    def forward(self, x):
        return self.fc(x) + self.mlp(self.table)


@pytest.mark.skipif(GCC is None, reason="gcc builds the host model")
def test_layers_computed_from_constants_only_stay_with_tvm_and_fold(tmp_path):
    """An offload kernel call on constants only would be evaluated by FoldConstant
    through LLVM, which has no extern kernels (the process segfaulted). Those
    layers are declined with the reason and folded; the layer of the input
    still offloads, and the build is bit-exact."""
    torch.manual_seed(0)
    flow = quantize(ConstantBranch(), torch.randn(1, 64))
    log = OffloadLog()
    run_offload(flow.mod, log)
    fc = [(d.status, d.reason) for d in log.decisions if d.op == "fc"]
    assert fc.count(("declined", "computed from constants only (folded at compile time)")) == 2
    assert sum(1 for s, _ in fc if s == "offloaded") == 1
    x = inputs((1, 64), n=2)
    _, out = compile_and_compare(flow.mod, "constbranch", tmp_path / "c", x, mmalib=True)
    with torch.no_grad():
        expect = np.concatenate([flow.qdq(torch.from_numpy(x[i:i + 1])).numpy() for i in range(len(x))])
    assert np.abs(out - expect).max() <= 4 * np.abs(expect).max() / 127
