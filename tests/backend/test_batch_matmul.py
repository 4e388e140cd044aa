"""Attention matmuls on the MMA (issue 28, item 2): the mmalib_batch_matmul kernels (C == numpy
twin on strided, transposed and broadcast views; their checks), the strided-view resolution, the
quantizer's rule (scale hoisted, operands sharing their producer's observer) and two attention
blocks through codegen bit-exact with every MAC on MMALIB and no TVM scalar call."""

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
from pipeline.backend.passes.matmul import strided_view
from pipeline.backend.passes.pipeline import run_offload
from pipeline.quant import rules

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the host kernels")
KERNELS = {np.int8: "mmalib_batch_matmul_i8", np.int16: "mmalib_batch_matmul_i16"}


def _rng(*parts):
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


def _dense(src: np.ndarray, off, sb, sr, sc, batch, rows, cols) -> np.ndarray:
    """The [batch, rows, cols] operand a strided view reads from the flat ``src``."""
    i, r, c = np.ix_(np.arange(batch), np.arange(rows), np.arange(cols))
    return src.reshape(-1)[off + i * sb + r * sr + c * sc].astype(np.int64)


# (batch, M, K, N, A view (offset, sb, s_m, s_k), B view (offset, sb, s_k, s_n), a_size, b_size)
CASES = {
    # q [T, 3D] split: A = q rows, B = k^T read through k's rows (transposed B)
    "qk_t": (1, 6, 16, 6, (0, 0, 48, 1), (16, 0, 1, 48), 6 * 48, 6 * 48),
    # attention . v: A contiguous, B = v columns of the fused qkv tensor
    "attn_v": (1, 6, 6, 16, (0, 36, 6, 1), (32, 0, 48, 1), 36, 6 * 48),
    # YOLO26's (q^T) @ k, heads batched: A transposed (unit stride on rows)
    "heads_a_t": (2, 16, 8, 16, (0, 512, 1, 16), (128, 512, 16, 1), 1024, 1024),
    # B broadcast over the batch (batch stride 0), odd sizes
    "broadcast": (3, 5, 7, 9, (0, 35, 7, 1), (0, 0, 9, 1), 105, 63),
}


def _params(dtype, za, zb, zo, r=0.0031):
    return fold.batch_matmul_params(1.0, za, 1.0, zb, 1.0 / r, zo, 1.0, np.dtype(dtype).name)


@needs_gcc
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype,zps", [(np.int8, (0, 0, 0)), (np.int8, (-128, 0, 5)), (np.int8, (0, -128, -3)),
                                       (np.int16, (0, 0, 0))])
def test_c_equals_python_and_the_exact_rescale(case, dtype, zps):
    batch, m, k, n, av, bv, a_size, b_size = CASES[case]
    rng = _rng(case, dtype, zps)
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max + 1, a_size, dtype=dtype)
    b = rng.integers(info.min, info.max + 1, b_size, dtype=dtype)
    za, zb, zo = zps
    r = 0.0031 if dtype == np.int8 else 3.1e-7
    params = _params(dtype, za, zb, zo, r)
    args = (a_size, b_size, batch, m, k, n, *av, *bv)
    out_c, out_py = np.full((batch, m, n), 7, dtype), np.full((batch, m, n), 7, dtype)
    assert hostlib.call_kernel(KERNELS[dtype], a, b, params, out_c, *args) == ref.C7X_OK
    assert catalog.KERNELS[KERNELS[dtype]](a, b, params, out_py, *args) == ref.C7X_OK
    np.testing.assert_array_equal(out_c, out_py)
    # against the definition: round(r * sum (A - za)(B - zb)) + zo, saturated (r exact to 2^-16 or better)
    acc = _dense(a, *av, batch, m, k) - za
    acc = np.matmul(acc, _dense(b, *bv, batch, k, n) - zb)
    ideal = np.clip(np.floor(acc * r + 0.5) + zo, info.min, info.max)
    assert np.abs(out_py - ideal).max() <= 1
    assert (out_py == ideal).mean() > 0.97


@needs_gcc
@pytest.mark.parametrize("bad,status", [
    ("no_unit_stride", ref.C7X_ERR_PARAM), ("past_the_buffer", ref.C7X_ERR_SHAPE),
    ("negative_stride", ref.C7X_ERR_SHAPE), ("k_too_long", ref.C7X_ERR_SHAPE),
    ("zero_point", ref.C7X_ERR_PARAM), ("multiplier", ref.C7X_ERR_PARAM)])
def test_invalid_arguments_are_refused_in_c_and_python_alike(bad, status):
    batch, m, k, n, av, bv, a_size, b_size = CASES["qk_t"]
    av, bv, za = list(av), list(bv), 0
    if bad == "no_unit_stride":
        av[3] = 2
    elif bad == "past_the_buffer":
        bv[0] = 33   # 33 + 15 + 5 * 48 + 1 = 289 > 288
    elif bad == "negative_stride":
        av[2] = -48
    elif bad == "k_too_long":
        k = ref.BATCH_MATMUL_MAX_K + 1
    elif bad == "zero_point":
        za = 5
    params = _params(np.int8, 0, 0, 0)
    if bad == "zero_point":
        params[12] = np.uint8(za)
    if bad == "multiplier":
        params[:4] = np.frombuffer(np.int32(-1).tobytes(), np.uint8)
    a, b = np.zeros(a_size, np.int8), np.zeros(b_size, np.int8)
    args = (a_size, b_size, batch, m, k, n, *av, *bv)
    for call in (lambda o: hostlib.call_kernel("mmalib_batch_matmul_i8", a, b, params, o, *args),
                 lambda o: ref.mmalib_batch_matmul_i8(a, b, params, o, *args)):
        out = np.full((batch, m, n), 9, np.int8)
        assert call(out) == status
        assert (out == 9).all()   # nothing written


def test_int16_refuses_zero_points():
    batch, m, k, n, av, bv, a_size, b_size = CASES["qk_t"]
    params = _params(np.int16, 0, 0, 0, 3e-7)
    params[12] = np.uint8(128)  # za = -128: only int8 operands may be unsigned
    out = np.zeros((batch, m, n), np.int16)
    a, b = np.zeros(a_size, np.int16), np.zeros(b_size, np.int16)
    assert ref.mmalib_batch_matmul_i16(a, b, params, out, a_size, b_size, batch, m, k, n, *av, *bv) == \
        ref.C7X_ERR_PARAM


def test_geometry_counts_the_macs():
    g = catalog.geometry("mmalib_batch_matmul_i8", None, None, None, None, 1024, 1024, 2, 16, 8, 16,
                         0, 512, 1, 16, 128, 512, 16, 1)
    assert g.status() == ref.C7X_OK and g.macs() == 2 * 16 * 8 * 16


# ------------------------------------------------------------------ strided views

def test_strided_view_of_a_split_piece_transposed():
    # qkv [1, 6, 48] -> split at 16, 32 -> piece 1 (k) -> permute to [1, 16, 6] (k^T)
    steps = [lambda i: np.split(i, [16, 32], axis=-1)[1], lambda i: np.transpose(i, (0, 2, 1))]
    assert strided_view((1, 6, 48), steps, (1,)) == (16, 0, 1, 48)


def test_strided_view_of_heads_batches_them():
    # [1, 2, 32, 16] (heads, channels, tokens) -> split channels [8, 8, 16] -> q -> [2, 8, 16]
    steps = [lambda i: np.split(i, [8, 16], axis=2)[0], lambda i: i.reshape(2, 8, 16)]
    assert strided_view((1, 2, 32, 16), steps, (2,)) == (0, 512, 16, 1)


def test_a_gather_that_is_no_strided_view_is_refused():
    # a permute then a reshape that merges the permuted axes: no single row stride
    steps = [lambda i: np.transpose(i, (1, 0)), lambda i: i.reshape(2, 6)]
    assert strided_view((3, 4), steps, ()) is None
    assert strided_view((4,), [lambda i: i[::-1].reshape(2, 2)], ()) is None  # negative stride


# ------------------------------------------------------------------ quantizer

class Attention(nn.Module):
    """One attention head, scale on the scores (``(q @ k^T) * scale``)."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.scale = dim ** -0.5

    def forward(self, x):                      # x [1, tokens, dim]
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        attn = torch.softmax(q @ k.transpose(-2, -1) * self.scale, dim=-1)
        return self.proj(attn @ v)


class HeadsAttention(nn.Module):
    """YOLO26's C2PSA attention (ultralytics ``Attention``): 1x1 conv qkv over [B, C, H, W],
    heads split by a view, the scale on the queries, ``(q * scale)^T @ k``, ``v @ attn^T``."""

    def __init__(self, dim: int = 32, heads: int = 2):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.key_dim = self.head_dim // 2
        self.scale = self.key_dim ** -0.5
        self.qkv = nn.Conv2d(dim, dim + 2 * self.key_dim * heads, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x):                      # x [1, C, H, W]
        b, c, h, w = x.shape
        q, k, v = self.qkv(x).view(b, self.heads, 2 * self.key_dim + self.head_dim, h * w).split(
            [self.key_dim, self.key_dim, self.head_dim], dim=2)
        attn = ((q * self.scale).transpose(-2, -1) @ k).softmax(dim=-1)
        return self.proj((v @ attn.transpose(-2, -1)).view(b, c, h, w))


def _flow(model, shape, **kw):
    torch.manual_seed(0)
    model = model.eval()
    torch.manual_seed(1)
    return quantize(model, torch.randn(*shape), **kw)


def _model(cls):
    torch.manual_seed(3)
    return cls().eval()


def test_scale_is_hoisted_behind_the_matmul_and_the_float_model_is_unchanged():
    model = _model(HeadsAttention)
    x = torch.randn(1, 32, 4, 4)
    gm = torch.export.export(model, (x,)).module()
    with torch.no_grad():
        before = gm(x)
        rules.hoist_scalar_multiplies(gm)
        after = gm(x)
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-6)
    muls = [n for n in gm.graph.nodes if rules.scalar_factor(n) is not None]
    assert len(muls) == 1 and muls[0].args[0].target in rules.MATMUL


def test_operands_share_the_producers_observer():
    """q, k (views of the qkv conv's output) reach the matmul at the conv's qparams: no requantize."""
    flow = _flow(_model(HeadsAttention), (1, 32, 4, 4))
    g = flow.qdq.graph
    mms = [n for n in g.nodes if n.op == "call_function" and n.target in rules.MATMUL]
    assert len(mms) == 2
    scales = {n.args[1] for n in g.nodes if n.op == "call_function" and "dequantize_per_tensor" in str(n.target)
              and any(u.target in rules.VIEW_OPS for u in n.users)}
    conv_out = next(n for n in g.nodes if n.op == "call_function" and "quantize_per_tensor" in str(n.target)
                    and n.args[0].target == torch.ops.aten.conv2d.default)
    assert conv_out.args[1] in scales
    first = mms[0]
    for operand in first.args:
        dq = next(a for a in [operand, *operand.all_input_nodes] if "dequantize" in str(getattr(a, "target", "")))
        assert dq.args[1] == conv_out.args[1]


@pytest.mark.parametrize("dtype,kernel", [("int8", "mmalib_batch_matmul_i8"), ("int16", "mmalib_batch_matmul_i16")])
@pytest.mark.parametrize("cls", [Attention, HeadsAttention])
def test_pass_offloads_both_matmuls(cls, dtype, kernel):
    shape = (1, 6, 16) if cls is Attention else (1, 32, 4, 4)
    flow = _flow(_model(cls), shape, dtype=dtype)
    log = OffloadLog()
    run_offload(flow.mod, log)
    mm = [d for d in log.decisions if d.op == "matmul"]
    assert [(d.status, d.kernel) for d in mm] == [("offloaded", kernel)] * 2
    assert "folded into the rescale" in (mm[0].note or "")


class MaskHead(nn.Module):
    """YOLO-seg's masks: coefficients (a cat of two heads' convs) x prototypes (conv + SiLU)."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(8, 4, 1), nn.Conv2d(8, 4, 1)
        self.proto = nn.Sequential(nn.Conv2d(8, 4, 3, padding=1), nn.SiLU())

    def forward(self, x):                      # x [1, 8, H, W]
        coef = torch.cat([self.c1(x).flatten(2), self.c2(x).flatten(2)], 2)    # [1, 4, 2HW]
        return (coef.transpose(1, 2) @ self.proto(x).flatten(2)).sigmoid()    # [1, 2HW, HW]


class PositionalAttention(HeadsAttention):
    """YOLO26's C2PSA attention whole: v is read by attention.V and by the positional conv too."""

    def __init__(self, dim: int = 32, heads: int = 2):
        super().__init__(dim, heads)
        self.pe = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)

    def forward(self, x):                      # x [1, C, H, W]
        b, c, h, w = x.shape
        q, k, v = self.qkv(x).view(b, self.heads, 2 * self.key_dim + self.head_dim, h * w).split(
            [self.key_dim, self.key_dim, self.head_dim], dim=2)
        attn = ((q * self.scale).transpose(-2, -1) @ k).softmax(dim=-1)
        return self.proj((v @ attn.transpose(-2, -1)).view(b, c, h, w) + self.pe(v.reshape(b, c, h, w)))


AFFINE_CASES = {Attention: (1, 6, 16), PositionalAttention: (1, 32, 4, 4), MaskHead: (1, 8, 4, 4)}


@pytest.mark.parametrize("cls", list(AFFINE_CASES), ids=lambda c: c.__name__)
def test_affine_int8_observes_matmul_operands_symmetric_and_offloads_them(cls):
    """Affine int8 (the search's affine recipes): a tensor an activation matmul reads gets zero
    point 0 (the MMA takes 0 or -128), and its other readers (the positional conv) read it so too,
    with no requantize; other tensors stay affine. Before, the operands had zero points like
    (19, -89) and every matmul here stayed on the scalar path."""
    flow = _flow(_model(cls), AFFINE_CASES[cls], symmetric_activations=False)
    log = OffloadLog()
    run_offload(flow.mod, log)
    assert {(d.status, d.kernel) for d in log.decisions if d.op == "matmul"} == {("offloaded", "mmalib_batch_matmul_i8")}
    symmetric = _flow(_model(cls), AFFINE_CASES[cls])
    assert _requantizes(flow.qdq) == _requantizes(symmetric.qdq)
    zps = {int(n.args[2]) for n in flow.qdq.graph.nodes
           if n.op == "call_function" and "quantize_per_tensor" in str(n.target)}
    assert zps - {0, -128}, "some tensor should keep an affine zero point"


def _requantizes(qdq) -> int:
    """The number of q(dq(x)) pairs of ``qdq``: a tensor observed twice."""
    return sum(1 for n in qdq.graph.nodes if n.op == "call_function" and "quantize_per_tensor" in str(n.target)
               and "dequantize" in str(getattr(n.args[0], "target", "")))


@needs_gcc
def test_affine_mask_head_is_bit_exact_on_mmalib(tmp_path):
    flow = _flow(_model(MaskHead), (1, 8, 4, 4), symmetric_activations=False)
    summary, _ = compile_and_compare(flow.mod, "mask", tmp_path / "c", inputs((1, 8, 4, 4), n=2), mmalib=True)
    assert summary["macs_offloaded"] == summary["macs_total"] > 0


@needs_gcc
@pytest.mark.parametrize("dtype", ["int8", "int16"])
def test_heads_attention_block_is_bit_exact_on_mmalib_with_no_scalar_call(tmp_path, dtype):
    """YOLO26's attention block: every MAC on MMALIB; C == reference bit for bit; within a few
    output LSB of torch's Q/DQ program (the softmax's 1-LSB bound, carried). int8: no TVM scalar
    call; int16: only the softmax (no int16 softmax kernel: the quantizer leaves it float)."""
    model = _model(HeadsAttention)
    flow = _flow(model, (1, 32, 4, 4), dtype=dtype)
    x = inputs((1, 32, 4, 4), n=3)
    summary, out = compile_and_compare(flow.mod, "attn", tmp_path / "c", x, mmalib=True)
    assert summary["macs_offloaded"] == summary["macs_total"] > 0
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    scalar = [e["op"] for e in manifest["layers"] if e["backend"] == "scalar"]
    assert scalar == ([] if dtype == "int8" else ["softmax"])
    if dtype == "int8":
        assert summary["calls_by_backend"]["tvm"] == 0
    assert sorted((e["op"], e["backend"]) for e in manifest["layers"] if e["op"] == "matmul") == \
        [("matmul", "mmalib")] * 2
    with torch.no_grad():
        expect = np.concatenate([flow.qdq(torch.from_numpy(x[i:i + 1])).numpy() for i in range(3)])
    out_scale = max(abs(float(n.args[1])) for n in flow.qdq.graph.nodes
                    if n.op == "call_function" and "dequantize_per_tensor" in str(n.target)
                    and n.users and all(u.op == "output" for u in n.users))
    # int16's LSB is 256 times finer: the float32 rounding inside torch's chain shows as a few more LSB
    assert np.abs(out - expect).max() <= (4 if dtype == "int8" else 16) * out_scale


@needs_gcc
def test_call_work_records_the_matmul_macs(tmp_path):
    flow = _flow(_model(HeadsAttention), (1, 32, 4, 4))
    compile_and_compare(flow.mod, "attn", tmp_path / "c", inputs((1, 32, 4, 4), n=1), mmalib=True)
    calls = json.loads((tmp_path / "c" / "manifest.json").read_text())["calls"]
    macs = sorted(c["work"]["macs"] for c in calls if c["kernel"] == "mmalib_batch_matmul_i8")
    # q^T k: 2 heads x [16 tokens, 8] x [8, 16 tokens]; v attn^T: 2 x [16, 16] x [16, 16]
    assert macs == [2 * 16 * 8 * 16, 2 * 16 * 16 * 16]


# ------------------------------------------------------------------ torch's fused attention (ViT)

class MHABlock(nn.Module):
    """A pre-norm encoder attention as torchvision's ViT writes it: nn.MultiheadAttention,
    which exports as one scaled_dot_product_attention."""

    def __init__(self, dim: int = 32, heads: int = 2):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x):                      # x [1, tokens, dim]
        y = self.ln(x)
        return x + self.attn(y, y, y, need_weights=False)[0]


def _sdpa_nodes(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in rules.SDPA]


def test_fused_attention_is_decomposed_and_equal_in_float():
    model, x = _model(MHABlock), torch.randn(1, 6, 32)
    gm = torch.export.export(model, (x,)).module()
    assert len(_sdpa_nodes(gm)) == 1
    with torch.no_grad():
        before = gm(x)
        rules.decompose_attention(gm)
        after = gm(x)
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-6)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert not _sdpa_nodes(gm) and targets.count(torch.ops.aten.matmul.default) == 2
    assert torch.ops.aten.softmax.int in targets


def test_masked_attention_is_left_fused():
    """A mask (or causal attention) is not the plain form: scaled_dot_product_attention stays."""

    class Masked(nn.Module):
        def forward(self, q, k, v):
            return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    q = torch.randn(1, 2, 4, 8)
    gm = torch.export.export(Masked(), (q, q, q)).module()
    rules.decompose_attention(gm)
    assert len(_sdpa_nodes(gm)) == 1


@needs_gcc
def test_mha_block_runs_its_matmuls_and_softmax_on_kernels_bit_exact(tmp_path):
    flow = _flow(_model(MHABlock), (1, 6, 32))
    log = OffloadLog()
    run_offload(flow.mod, log)
    ops = [(d.op, d.status) for d in log.decisions if d.op in ("matmul", "softmax", "layer_norm")]
    assert sorted(ops) == [("layer_norm", "offloaded"), ("matmul", "offloaded"), ("matmul", "offloaded"),
                           ("softmax", "offloaded")]
    x = inputs((1, 6, 32), n=2)
    summary, out = compile_and_compare(flow.mod, "mha", tmp_path / "c", x, mmalib=True)
    assert summary["macs_offloaded"] == summary["macs_total"] > 0
    with torch.no_grad():
        expect = np.concatenate([flow.qdq(torch.from_numpy(x[i:i + 1])).numpy() for i in range(2)])
    assert np.abs(out - expect).max() <= 0.05 * np.abs(expect).max()


@needs_gcc
def test_mha_block_reads_q_k_v_where_the_projection_wrote_them(tmp_path):
    """nn.MultiheadAttention selects q, k, v from its fused projection through unflatten,
    transpose, squeeze, select and view: those views share the projection's observer, so no
    requantize is left between the projection and the matmuls, whose kernels read the projection's
    output through strides; the batch-first transposes at batch 1 are reshapes, the heads -> tokens
    transpose after attention.V is c7x_permute_i8's: no TVM scalar call is left (8 when the views
    had observers of their own)."""
    from tvm import relax
    flow = _flow(_model(MHABlock), (1, 6, 32))
    mod, _ = run_offload(flow.mod, OffloadLog())
    bindings = [b for blk in mod["main"].body.blocks for b in blk.bindings]
    matmuls = [b.value for b in bindings if isinstance(b.value, relax.Call) and "batch_matmul" in str(b.value.args[0])]
    fc_out = {b.var for b in bindings if isinstance(b.value, relax.Call) and "matmul_bias" in str(b.value.args[0])}
    operands = [a for call in matmuls for a in call.args[1].fields[:2]]
    assert len(matmuls) == 2 and sum(a in fc_out for a in operands) == 3   # q, k and v; the 4th is the softmax
    assert not [b for b in bindings if isinstance(b.value, relax.Call) and str(b.value.op) == "relax.quantize"]
    summary, _ = compile_and_compare(flow.mod, "mha", tmp_path / "c", inputs((1, 6, 32), n=1), mmalib=True)
    assert summary["calls_by_backend"]["tvm"] == 0


def test_a_permute_of_unit_axes_is_a_reshape():
    from tvm import relax
    from pipeline.backend.passes.cleanup import _moves_only_unit_axes
    x = relax.Var("x", relax.TensorType([1, 5, 16], "int8"))
    assert _moves_only_unit_axes(relax.op.permute_dims(x, [1, 0, 2]))      # [1, T, E] -> [T, 1, E]
    assert not _moves_only_unit_axes(relax.op.permute_dims(x, [0, 2, 1]))  # a real transpose
    assert not _moves_only_unit_axes(relax.op.permute_dims(x))            # reverses T and E


class WindowAttentionScores(nn.Module):
    """Swin's window partition before Q.K^T: [1, 4, 4, C] -> 2x2 windows of 2x2 tokens. The
    windows are no single strided view of the projection's output (window (i, j) starts at
    8Ci + 2Cj), so the kernel reads the partitioned tensor the permute kernel writes."""

    def __init__(self, c: int = 32):
        super().__init__()
        self.proj = nn.Linear(c, c)
        self.out = nn.Linear(4, 4)

    def forward(self, x):                      # x [1, 4, 4, C]
        c = x.shape[-1]
        w = self.proj(x).view(1, 2, 2, 2, 2, c).permute(0, 1, 3, 2, 4, 5).reshape(1, 4, 4, c)
        return self.out(torch.softmax(w @ w.transpose(-2, -1), dim=-1))


@needs_gcc
def test_an_operand_with_no_strided_view_into_the_source_reads_the_nearer_tensor(tmp_path):
    flow = _flow(_model(WindowAttentionScores), (1, 4, 4, 32))
    log = OffloadLog()
    run_offload(flow.mod, log)
    assert [(d.status, d.kernel) for d in log.decisions if d.op == "matmul"] == [("offloaded", "mmalib_batch_matmul_i8")]
    summary, _ = compile_and_compare(flow.mod, "win", tmp_path / "c", inputs((1, 4, 4, 32), n=2), mmalib=True)
    assert summary["macs_offloaded"] == summary["macs_total"]


def test_rewritten_nodes_keep_no_numeric_debugger_identity_of_another_shape():
    """The layers stage matches float and quantized nodes by torchao's ``from_node``: a hoisted
    multiply (another shape than the one it was made from) and the inner nodes of a decomposed
    attention must not carry their origin's identity, the attention's output must."""
    model, x = _model(HeadsAttention), torch.randn(1, 32, 4, 4)
    gm = torch.export.export(model, (x,)).module()
    rules.hoist_scalar_multiplies(gm)
    moved = [n for n in gm.graph.nodes if rules.scalar_factor(n) is not None]
    assert moved and all("from_node" not in n.meta for n in moved)
    gm = torch.export.export(_model(MHABlock), (torch.randn(1, 6, 32),)).module()
    origin = _sdpa_nodes(gm)[0].meta.get("from_node")
    before = set(gm.graph.nodes)
    rules.decompose_attention(gm)
    new = [n for n in gm.graph.nodes if n not in before]
    assert len(new) == 5 and new[-1].target == torch.ops.aten.matmul.default
    assert all("from_node" not in n.meta for n in new[:-1])
    assert origin is not None and new[-1].meta.get("from_node") == origin


# ------------------------------------------------------------------ einsum (MaxViT)

def test_einsum_matmul_plan():
    assert rules.einsum_matmul_plan("B G H I D, B G H J D -> B G H I J") == (
        [0, 1, 2, 3, 4], [0, 1, 2, 4, 3], [0, 1, 2, 3, 4])
    assert rules.einsum_matmul_plan("bgpc,bgqc->bgqp") == ([0, 1, 2, 3], [0, 1, 3, 2], [0, 1, 3, 2])
    for equation in ("ii->i", "bij,bjk", "...ij,...jk->...ik", "ij,jk,kl->il", "i,j->ij", "bij,bjk->bk",
                     "bij,bjk->bijk", "iij,jk->ik"):
        assert rules.einsum_matmul_plan(equation) is None, equation


def _maxvit_attention():
    from torchvision.models.maxvit import RelativePositionalMultiHeadAttention
    torch.manual_seed(3)
    return RelativePositionalMultiHeadAttention(32, 16, 16).eval()   # 2 heads, 4x4 window


def test_einsum_is_rewritten_as_a_matmul_and_equal_in_float():
    model, x = _maxvit_attention(), torch.randn(1, 2, 16, 32)
    gm = torch.export.export(model, (x,)).module()
    with torch.no_grad():
        before = gm(x)
        rules.einsum_as_matmul(gm)
        after = gm(x)
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-6)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.einsum.default not in targets
    assert targets.count(torch.ops.aten.matmul.default) == 2


@needs_gcc
def test_maxvit_attention_runs_on_kernels_bit_exact_with_no_scalar_call(tmp_path):
    """MaxViT's window attention: both einsums on MMALIB (the key scale folded into the rescale),
    the relative position bias (a constant broadcast over the windows) on the broadcast add."""
    flow = _flow(_maxvit_attention(), (1, 2, 16, 32))
    log = OffloadLog()
    run_offload(flow.mod, log)
    decided = sorted((d.op, d.kernel) for d in log.decisions if d.op in ("matmul", "residual_add", "softmax"))
    assert decided == [("matmul", "mmalib_batch_matmul_i8")] * 2 + [("residual_add", "c7x_int8_broadcast_add"),
                                                                     ("softmax", "c7x_int8_softmax")]
    summary, _ = compile_and_compare(flow.mod, "maxvit", tmp_path / "c", inputs((1, 2, 16, 32), n=2), mmalib=True)
    assert summary["macs_offloaded"] == summary["macs_total"] > 0
    assert summary["calls_by_backend"]["tvm"] == 0


# ------------------------------------------------------------------ a whole (tiny) ViT

@needs_gcc
def test_tiny_vit_runs_entirely_on_kernels_bit_exact(tmp_path):
    """torchvision's VisionTransformer (one layer, 2 heads, 16 tokens + the class token): the class
    token is quantized at compile time into the concat kernel's constant input, its select at the
    end is an int8 take; every MAC on MMALIB and no TVM scalar call."""
    from torchvision.models.vision_transformer import VisionTransformer
    torch.manual_seed(3)
    model = VisionTransformer(image_size=32, patch_size=8, num_layers=1, num_heads=2, hidden_dim=32,
                              mlp_dim=64, num_classes=10).eval()
    flow = _flow(model, (1, 3, 32, 32))
    log = OffloadLog()
    run_offload(flow.mod, log)
    assert [d.status for d in log.decisions if d.op == "concat"] == ["offloaded"]
    summary, out = compile_and_compare(flow.mod, "vit", tmp_path / "c", inputs((1, 3, 32, 32), n=2), mmalib=True)
    assert summary["macs_offloaded"] == summary["macs_total"] > 0
    assert summary["calls_by_backend"]["tvm"] == 0
    with torch.no_grad():
        expect = np.concatenate([flow.qdq(torch.from_numpy(inputs((1, 3, 32, 32), n=2)[i:i + 1])).numpy()
                                 for i in range(2)])
    assert np.abs(out - expect).max() <= 0.05 * np.abs(expect).max()


@needs_gcc
def test_call_work_counts_an_fc_on_nhwc_tokens_by_its_last_axis(tmp_path):
    """Swin and ConvNeXt run their MLPs on [1, H, W, C] tokens: the MACs are H W C_in C_out (the
    output channels are the last axis, not axis 1 as for an NCHW conv)."""
    class TokensMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(32, 64)        # widths the FC pass does not pad

        def forward(self, x):                  # x [1, 3, 5, 32]
            return self.fc(x)

    flow = _flow(_model(TokensMLP), (1, 3, 5, 32))
    compile_and_compare(flow.mod, "mlp", tmp_path / "c", inputs((1, 3, 5, 32), n=1), mmalib=True)
    calls = json.loads((tmp_path / "c" / "manifest.json").read_text())["calls"]
    assert [c["work"]["macs"] for c in calls if c["kernel"] == "mmalib_matmul_bias_i8"] == [3 * 5 * 32 * 64]
