"""Channel equalization (pipeline.quant.equalize) and kernel-exact weight scales
(pipeline.quant.exact_rescale) on a small residual net: issue 30, item 1."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

from pipeline.errors import StaleArtifactError
from pipeline import torchenv  # noqa: F401  (torch settings before torchao)
from pipeline.backend.fold import float_to_scale_shift
from pipeline.quant.bias_correction import weighted_nodes
from pipeline.quant.equalize import apply_scales, equalize, find_groups
from pipeline.quant.exact_rescale import next_multiplier, snap_weight_scales
from quant_graph import prepare
from tinynets import ResidualNet


def _images(n=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 3, 16, 16, generator=gen) for _ in range(n)]


@pytest.fixture(scope="module")
def prepared():
    torch.manual_seed(0)
    net = ResidualNet().eval()
    xs = _images()
    return prepare(net, xs[0], observer="minmax"), xs


def _float(gm, x):
    """The float model of a prepared graph: its observers skipped."""
    from pipeline.quant.bias_correction import _Lockstep, _PerImage
    with torch.no_grad():
        return _Lockstep(gm, {}, skip_observers=True).run(_PerImage([x])).items[0]


def test_groups_are_the_stream_only(prepared):
    gm, _ = prepared
    groups = find_groups(gm)
    assert len(groups) == 1
    g = groups[0]
    assert len(g.producers) == 3 and len(g.consumers) == 3      # proj0 + 2 projections; 2 expands + head
    assert sum(1 for m in g.members if m.startswith("add")) == 2
    # the stem (ReLU after it) and the depthwise (ReLU6) are not rescaled
    assert all("conv2d" in c for c in g.consumers)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_equalized_float_model_gives_the_same_outputs(prepared, alpha):
    gm, xs = prepared
    eq = copy.deepcopy(gm)
    records = equalize(eq, xs, alpha)
    assert len(records) == 1 and records[0]["channels"] == 8
    if alpha > 0:   # the outlier channels are rescaled (alpha 0 looks at the weights only)
        assert any(abs(s - 1.0) > 0.1 for s in records[0]["scales"])
    for x in _images(3, seed=1):
        ref, got = _float(gm, x), _float(eq, x)
        assert torch.allclose(ref, got, rtol=1e-4, atol=1e-5), (ref - got).abs().max()


def test_equalization_evens_out_the_stream(prepared):
    gm, xs = prepared
    rec = equalize(copy.deepcopy(gm), xs, 1.0)[0]
    assert rec["spread_before"] > 10          # the outlier channels
    assert rec["spread_after"] == pytest.approx(1.0, abs=0.01)


def _sqnr_db(gm, x, names):
    """Q/DQ-vs-float SQNR (dB) of nodes ``names`` of the calibrated prepared ``gm`` on ``x``."""
    from pipeline.quant.bias_correction import _Lockstep, _PerImage

    def values(m, skip):
        out = {}
        hooks = {n: (lambda nm: lambda o: out.__setitem__(nm, o[0]) or o)(n) for n in names}
        with torch.no_grad():
            _Lockstep(m, hooks, skip).run(_PerImage([x]))
        return out
    f, q = values(gm, True), values(convert_pt2e(copy.deepcopy(gm)), False)
    return {n: float(10 * torch.log10(f[n].pow(2).sum() / (f[n] - q[n]).pow(2).sum())) for n in names}


def test_equalization_helps_the_consumers(prepared):
    """The convs that read the stream see a better-quantized input: their outputs' SQNR
    rises (the stream itself is compared in different units before and after)."""
    gm, xs = prepared
    eq = copy.deepcopy(gm)
    equalize(eq, xs, 1.0)
    consumers = find_groups(gm)[0].consumers
    for m in (gm, eq):
        with torch.no_grad():
            for x in xs:
                m(x)
    x = _images(1, seed=2)[0]
    before, after = _sqnr_db(copy.deepcopy(gm), x, consumers), _sqnr_db(eq, x, consumers)
    assert all(after[c] > before[c] + 1.0 for c in consumers), (before, after)


def test_apply_scales_replays_a_record(prepared):
    gm, xs = prepared
    a, b = copy.deepcopy(gm), copy.deepcopy(gm)
    rec = equalize(a, xs, 0.5)[0]
    apply_scales(b, find_groups(b)[0], torch.tensor(rec["scales"], dtype=torch.float64))
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa, pb), name


def test_layers_stage_replays_the_record_on_its_float_reference(prepared):
    """The layers stage's float reference (the exported program, no observers) gets the
    recorded scales, so a stream node computes what the equalized Q/DQ node approximates."""
    from pipeline.quant.bias_correction import _Lockstep, _PerImage
    from pipeline.quant.debugger import replay_equalization
    gm, xs = prepared
    eq = copy.deepcopy(gm)
    records = equalize(eq, xs, 0.5)
    torch.manual_seed(0)
    ref = torch.export.export(ResidualNet().eval(), (xs[0],)).module()
    replay_equalization(ref, records)
    stream = list(find_groups(gm)[0].members)
    got, want = {}, {}
    for m, out, skip in ((ref, got, False), (eq, want, True)):
        hooks = {n: (lambda nm, d: lambda o: d.__setitem__(nm, o[0]) or o)(n, out) for n in stream}
        with torch.no_grad():
            _Lockstep(m, hooks, skip).run(_PerImage([xs[1]]))
    for n in stream:
        assert torch.allclose(got[n], want[n], rtol=1e-4, atol=1e-5), n
    with pytest.raises(StaleArtifactError, match="not in the float program"):
        replay_equalization(ref, [{**records[0], "producers": ["conv2d_99"]}])


def test_bad_alpha_and_no_images(prepared):
    gm, xs = prepared
    with pytest.raises(ValueError, match="alpha"):
        equalize(copy.deepcopy(gm), xs, 1.5)
    with pytest.raises(ValueError, match="image"):
        equalize(copy.deepcopy(gm), [], 0.5)


@pytest.mark.parametrize("r", [1e-6, 3.3e-4, 0.01, 0.0123456, 0.5, 0.999, 1.0, 3.7, 126.9])
def test_next_multiplier_is_the_least_kernel_multiplier_above(r):
    m, k = next_multiplier(r)
    assert 1 <= m <= 127 and 0 <= k <= 31 and m / 2**k >= r
    # nothing representable lies in [r, m/2^k)
    for kk in range(32):
        mm = math.ceil(r * 2**kk)
        if mm <= 127:
            assert mm / 2**kk >= m / 2**k
    assert next_multiplier(0.0) is None and next_multiplier(200.0) is None


def test_snapped_scales_make_every_rescale_exact(prepared):
    gm, xs = prepared
    m = copy.deepcopy(gm)
    with torch.no_grad():
        for x in xs:
            m(x)
    before = convert_pt2e(copy.deepcopy(m))
    records = snap_weight_scales(m)
    after = convert_pt2e(m)
    assert len(records) == len(weighted_nodes(gm))            # every layer here is int8 -> int8
    assert all(0.0 <= r["max_raise"] <= 1 / 63 for r in records)
    checked = 0
    for q in weighted_nodes(after):
        users = list(q.users)
        while users and users[0].target != torch.ops.quantized_decomposed.quantize_per_tensor.default:
            users = list(users[0].users)
        s_in, s_out = float(q.args[0].args[1]), float(users[0].args[1])
        owner, _, name = q.args[1].args[1].target.rpartition(".")
        s_w = getattr(after.get_submodule(owner) if owner else after, name).double()
        for s in s_w.tolist():
            r = s_in * s / s_out
            m_, k = float_to_scale_shift(r)
            assert abs(m_ / 2**k - r) / r < 1e-6       # the kernel multiplier is the Q/DQ rescale
            checked += 1
    assert checked > 40
    # and the Q/DQ model is as close to float as before (weights at most 1.6% coarser)
    test = _images(4, seed=3)
    err = lambda q: sum(float((q(x) - _float(gm, x)).abs().mean()) for x in test)
    assert err(after) < 1.5 * err(before)


@pytest.mark.parametrize("weight_dtype, snapped", [("int16", True), (None, False)])
def test_int16_layers_are_snapped_with_int16_weights_only(weight_dtype, snapped):
    """int16 -> int16 layers with int16 weights have the int8 kernels' 7-bit multiplier:
    snapped like int8 ones. With int8 weights (pre-scaled, ~14-bit) they are left alone."""
    torch.manual_seed(0)
    xs = _images()
    m = prepare(ResidualNet().eval(), xs[0], observer="minmax", dtype="int16", weight_dtype=weight_dtype)
    with torch.no_grad():
        for x in xs:
            m(x)
    records = snap_weight_scales(m)
    assert len(records) == (len(weighted_nodes(m)) if snapped else 0)
    if not snapped:
        return
    after = convert_pt2e(m)
    for q in weighted_nodes(after):
        assert q.args[0].args[5] == torch.int16 and q.args[1].args[6] == torch.int16  # input, weights
        users = list(q.users)
        while users[0].target != torch.ops.quantized_decomposed.quantize_per_tensor.default:
            users = list(users[0].users)
        s_in, s_out = float(q.args[0].args[1]), float(users[0].args[1])
        owner, _, name = q.args[1].args[1].target.rpartition(".")
        for s in getattr(after.get_submodule(owner) if owner else after, name).double().tolist():
            m_, k = float_to_scale_shift(s_in * s / s_out)
            assert abs(m_ / 2**k - s_in * s / s_out) / (s_in * s / s_out) < 1e-6


def test_calibrate_stage_records_both_and_convert_loads_them(tmp_path):
    """Through the stage functions: calibration.json records the groups and the snapped
    layers; the converted Q/DQ model has kernel multipliers and float-equal behaviour."""
    import json

    from doitproj import write_jpeg
    from pipeline.config import CalibrationSpec, ModelSpec, PreprocessSpec, WeightsSpec
    from pipeline.stages.calibrate import calibrate_model
    from pipeline.quant.program import load_converted
    from pipeline.stages.export import export_model
    from pipeline.stages.prepare import prepare_model
    from pathlib import Path
    (tmp_path / "s").mkdir()
    for i in range(4):
        write_jpeg(tmp_path / "s" / f"im_{i}_{i}.jpg", seed=i)
    spec = ModelSpec(name="res", source=tmp_path / "res.toml", builder="tinynets:residual_net",
                     input_shape=(1, 3, 16, 16), weights=WeightsSpec(pretrained=False),
                     preprocess=PreprocessSpec(resize=18, crop=16),
                     calibration=CalibrationSpec(set="s", equalize=True), evaluation_set="s")
    d = tmp_path
    export_model(spec, None, d / "float.pt2", Path(__file__).resolve().parent.parent)
    prepare_model(spec, d / "float.pt2", d / "p.pt", d / "p.txt")
    info = calibrate_model(spec, d / "float.pt2", d / "p.pt", d / "p.txt", d / "s", d / "c.pt", d / "c.json")
    rec = json.loads((d / "c.json").read_text())
    assert rec["equalization"]["alpha"] == 0.5 and len(rec["equalization"]["groups"]) == 1
    assert rec["exact_requantize"]["layers"] == 10 and 0 < rec["exact_requantize"]["max_raise"] <= 1 / 63
    assert info["equalization"] == rec["equalization"]
    q = load_converted(spec, d / "float.pt2", d / "c.pt")
    for node in weighted_nodes(q):
        users = list(node.users)
        while users and users[0].target != torch.ops.quantized_decomposed.quantize_per_tensor.default:
            users = list(users[0].users)
        owner, _, name = node.args[1].args[1].target.rpartition(".")
        for s_w in getattr(q.get_submodule(owner) if owner else q, name).double().tolist():
            r = float(node.args[0].args[1]) * s_w / float(users[0].args[1])
            m, k = float_to_scale_shift(r)
            assert abs(m / 2**k - r) / r < 1e-6
