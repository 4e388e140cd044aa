"""Per-layer numerics (issue 9, item 4): ``layers:<model>`` writes ``layers.json``.

A tiny net goes through the stage functions (no doit): every quantized layer
gets (a) PyTorch Q/DQ vs float from PT2E's numeric debugger and (b) the C
integer reference vs Q/DQ; both can fail (a perturbed weight, an injected
LSB); the order, the summary line and the one-line error. MobileNetV2's
numbers are checked in ``test_e2e_mobilenet.py``.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from doitproj import Project, build_through

from pipeline.errors import CalibrationDataError
from pipeline.backend.layer_calls import capture_calls
from pipeline.quant.debugger import float_reference
from pipeline.quant.output_points import Point, dequantize
from pipeline.quant.sqnr import Stats
from pipeline.stages import layers as L
from pipeline.stages.registry import get


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The tiny int8 net built through codegen, and its layers.json as the default run makes it."""
    p = Project(tmp_path_factory.mktemp("layers"))
    p.add_images("setA", 3)
    p.add_model("tiny", "setA", dtype="int8")
    ctx = build_through(p.root)
    stage = get("layers")
    report = stage.function()(**stage.args(ctx))
    return ctx, report


def manifest(ctx, variant="mmalib"):
    return json.loads((ctx.layout.codegen_dir(variant) / "manifest.json").read_text())


def run(ctx, tmp_path, **over):
    """The layers stage with some arguments replaced; its report."""
    args = dict(get("layers").args(ctx), out=tmp_path / "layers.json", **over)
    return L.layers_model(**args)


def by_id(report):
    return {lay["id"]: lay for lay in report["layers"]}


def test_every_quantized_layer_gets_both_comparisons(built):
    ctx, report = built
    on_disk = json.loads(ctx.layout.layers_json.read_text())
    assert on_disk == json.loads(json.dumps(report))
    assert {k: on_disk[k] for k in ("model", "images", "evaluation_set", "build")} == \
        {"model": "tiny", "images": 3, "evaluation_set": "setA", "build": "mmalib"}
    layers = manifest(ctx)["layers"]
    assert sorted(lay["id"] for lay in on_disk["layers"]) == sorted(lay["id"] for lay in layers)
    ops = {lay["op"] for lay in on_disk["layers"]}
    assert {"conv2d", "depthwise_conv2d", "fc", "residual_add", "max_pool2d", "mean"} <= ops
    for lay in on_disk["layers"]:
        assert set(lay) >= {"id", "module", "op", "backend", "qdq_vs_float", "c_vs_qdq"}, lay
        a, b = lay["qdq_vs_float"], lay["c_vs_qdq"]
        assert set(a) == {"sqnr_db", "cosine", "max_abs"} and set(b) == {"sqnr_db", "cosine", "max_abs", "max_lsb"}
        # a benign (random-init, well calibrated) net: Q/DQ is close to float at every layer
        assert math.isfinite(a["sqnr_db"]) and a["sqnr_db"] > 25 and a["cosine"] > 0.99, lay
        assert b["max_lsb"] <= 8 and b["cosine"] > 0.99, lay


def test_output_points_are_the_quantize_that_ends_each_layer(built):
    ctx, report = built
    at = {lay["id"]: lay["compared_at"] for lay in report["layers"]}
    assert at["conv2d"]["float_node"] == "relu"          # stem: conv-BN-ReLU, compared after the ReLU
    assert at["conv2d_2"]["float_node"] == "hardtanh"    # depthwise + ReLU6
    assert at["conv2d_3"]["float_node"] == "conv2d_3"    # pw: no activation
    assert at["add"]["float_node"] == "relu_1"           # F.relu(c1(y) + y)
    calls = manifest(ctx)["calls"]
    for lid, point in at.items():
        assert point["c_call"] == max(c["index"] for c in calls if c["layer"] == lid)
        assert point["qdq_node"].startswith("dequantize_per_tensor") and point["scale"] > 0


def test_sqnr_is_the_debuggers_own_on_one_image():
    import torch
    from torchao.quantization.pt2e._numeric_debugger import QuantizationComparisonResult

    g = torch.Generator().manual_seed(0)
    ref = torch.randn(2, 8, 5, 5, generator=g)
    x = ref + 0.05 * torch.randn(2, 8, 5, 5, generator=g)
    s = Stats()
    s.add(ref, x)
    assert s.result()["sqnr_db"] == pytest.approx(float(QuantizationComparisonResult(actual=x, ref=ref).sqnr),
                                                  abs=1e-3)
    assert s.result()["max_abs"] == pytest.approx(float((x - ref).abs().max()), rel=1e-5)
    same = Stats()
    same.add(ref, ref.clone())
    assert same.result() == {"sqnr_db": None, "cosine": 1.0, "max_abs": 0.0}


def test_c_integers_are_dequantized_exactly_as_torch_does():
    import torch

    q = np.arange(-128, 128, dtype=np.int8).reshape(1, 2, 8, 16)
    for scale, zp in ((0.0470588244497776, 0), (0.011176809668540955, 3), (1e-5, -7)):
        point = Point(node="n", q="q", dq=("dq",), qparams=(scale, zp, -128, 127, torch.int8))
        value, ints = dequantize(q, point)
        want = torch.ops.quantized_decomposed.dequantize_per_tensor(torch.from_numpy(q), scale, zp, -128, 127,
                                                                    torch.int8)
        assert np.array_equal(value, want.numpy()) and ints is q
        back, ints2 = dequantize(value, point)  # a fused kernel's float output: kept, integer recovered
        assert back is value and np.array_equal(ints2, q.astype(np.int32))


def test_perturbed_weights_drop_that_layers_sqnr_and_no_earlier_one(built, tmp_path):
    """The check can fail: 3x the weights of ``pw`` (conv2d_3) in the float program
    (the calibrated ranges stay) clips that layer in Q/DQ; layers before it are unchanged."""
    import torch

    ctx, base = built
    ep = torch.export.load(ctx.layout.float_pt2)
    with torch.no_grad():
        ep.state_dict["pw.weight"].mul_(3.0)
    bad = by_id(run(ctx, tmp_path, float_pt2=ep))
    good = by_id(base)
    assert bad["conv2d_3"]["qdq_vs_float"]["sqnr_db"] < good["conv2d_3"]["qdq_vs_float"]["sqnr_db"] - 10
    for lid in ("conv2d", "max_pool2d", "conv2d_1", "add", "conv2d_2"):
        assert bad[lid]["qdq_vs_float"] == good[lid]["qdq_vs_float"], lid
    assert run(ctx, tmp_path / "again")["layers"] == base["layers"]  # ep untouched by the stage itself


def test_scalar_build_agrees_with_qdq_and_an_injected_lsb_is_counted_exactly(built, tmp_path, monkeypatch):
    ctx, _ = built
    builds = {v: ctx.layout.codegen_dir(v) for v in ("mmalib", "scalar")}
    clean = by_id(run(ctx, tmp_path, builds=builds))
    base = clean["conv2d"]["c_vs_qdq_scalar"]
    assert base["max_lsb"] <= 1 and base["cosine"] > 0.9999  # scalar path: within 1 LSB of torch

    capture, k = capture_calls, 5
    scale = clean["conv2d"]["compared_at"]["scale"]

    def shifted(prog, image, calls, wanted):  # what the scalar reference showed for the stem, + k LSB once
        got = capture(prog, image, calls, wanted)
        if all(c["backend"] == "tvm" for c in calls):
            flat = got["conv2d"].reshape(-1)
            if flat.dtype.kind == "f":
                flat[0] += k * scale
            else:
                flat[0] = flat[0] + k if flat[0] <= np.iinfo(flat.dtype).max - k else flat[0] - k
        return got

    monkeypatch.setattr(L, "capture_calls", shifted)
    hit = by_id(run(ctx, tmp_path / "hit", builds=builds))
    got = hit["conv2d"]["c_vs_qdq_scalar"]
    assert k - base["max_lsb"] <= got["max_lsb"] <= k + base["max_lsb"]
    if base["max_lsb"] == 0:
        assert got["max_lsb"] == k
        assert got["max_abs"] == pytest.approx(k * hit["conv2d"]["compared_at"]["scale"], rel=1e-6)
    assert got["sqnr_db"] is not None and got["sqnr_db"] < (base["sqnr_db"] or math.inf)
    assert hit["conv2d"]["c_vs_qdq"] == clean["conv2d"]["c_vs_qdq"]       # the mmalib build untouched
    assert hit["conv2d_1"]["c_vs_qdq_scalar"] == clean["conv2d_1"]["c_vs_qdq_scalar"]


def test_last_layer_matches_verify_at_the_model_output(built):
    """At the model output, (b) is what verify measures: the Python reference vs
    quantized.pt2, in LSB of the output scale, computed by verify's own helpers."""
    import torch

    from pipeline.backend.interp import run_reference
    from pipeline.data.images import load_images
    from pipeline.config import list_images
    from pipeline.data.torch_outputs import output_scale, run_torch
    from pipeline.stages.verify import lsb_stats

    ctx, report = built
    x = load_images(list_images(ctx.calib_root / "setA"), ctx.spec.preprocess, desc="t")
    ref = run_reference(ctx.layout.codegen_dir("mmalib"), x.numpy())
    qdq = run_torch(torch.export.load(ctx.layout.quantized_pt2).module(), x)
    want = lsb_stats(ref, qdq, output_scale(ctx.layout.quantized_pt2))
    last = by_id(report)[manifest(ctx)["calls"][-1]["layer"]]
    assert last["c_vs_qdq"]["max_lsb"] == want["max_lsb"]


def test_layers_are_listed_worst_first(built):
    _, report = built
    sqnr = [lay["qdq_vs_float"]["sqnr_db"] for lay in report["layers"]]
    assert sqnr == sorted(sqnr)
    assert report["worst"] == [lay["id"] for lay in report["layers"][:3]]
    entries = [{"id": "a", "qdq_vs_float": {"sqnr_db": None}}, {"id": "b", "qdq_vs_float": None},
               {"id": "c", "qdq_vs_float": {"sqnr_db": 30.0}}, {"id": "d", "qdq_vs_float": {"sqnr_db": 12.5}}]
    assert [e["id"] for e in L.sort_worst_first(entries)] == ["d", "c", "a", "b"]


def test_summary_names_the_three_worst_layers_and_copes_without_layers_json(built):
    from pipeline.stages.summary import model_lines

    _, report = built
    rep = {"labeled": 3, "images": 3, "dtype": "int8", "weight_dtype": "int8", "evaluation_set": "setA",
           "float_top1": 1, "quant_top1": 1, "top1_agreement": 3, "mean_abs_logit_error": 0.01}
    line = next(ln for ln in model_lines("tiny", rep, None, {}, report) if "worst layers" in ln)
    mods = {lay["id"]: lay["module"] or lay["id"] for lay in report["layers"]}
    first = report["layers"][0]
    assert line.startswith(f"  worst layers   {mods[first['id']]} ({first['qdq_vs_float']['sqnr_db']:.1f} dB), ")
    assert all(mods[i] in line for i in report["worst"]) and "3 images" in line
    assert not any("worst layers" in ln for ln in model_lines("tiny", rep, None, {}, None))


def test_no_evaluation_images_is_a_one_line_error(built, tmp_path):
    ctx, _ = built
    empty = tmp_path / "calib_data" / "nothing"
    empty.mkdir(parents=True)
    with pytest.raises(CalibrationDataError) as e:
        run(ctx, tmp_path, images_dir=empty)
    msg = str(e.value)
    assert "\n" not in msg and str(empty) in msg and "'tiny'" in msg


def test_reference_observer_sees_every_call_and_changes_nothing(built):
    from pipeline.backend.interp import Program

    ctx, _ = built
    prog = Program(ctx.layout.codegen_dir("mmalib"))
    image = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    seen = []

    def observe(index, func, out):
        assert not out.flags.writeable
        seen.append((index, func, out.shape, str(out.dtype)))

    plain = prog.run(image)
    observed = prog.run(image, observer=observe)
    assert np.array_equal(plain, observed)
    calls = manifest(ctx)["calls"]
    assert seen == [(c["index"], c["func"], tuple(c["shape"]), c["dtype"]) for c in calls]


def test_converted_model_from_a_loaded_program_is_the_same_and_leaves_it_alone(built):
    """load_converted(ep) == load_converted(path) (the convert stage's refactor keeps its
    output), and neither it nor the float reference writes into ep's tensors."""
    import torch

    from pipeline.quant.program import load_converted

    ctx, _ = built
    ep = torch.export.load(ctx.layout.float_pt2)
    a = load_converted(ctx.spec, ctx.layout.float_pt2, ctx.layout.calibrated)
    b = load_converted(ctx.spec, ep, ctx.layout.calibrated)
    assert str(a.graph) == str(b.graph)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    with torch.no_grad():
        ep.state_dict["pw.weight"].mul_(3.0)  # calibrated.pt holds the original: loading it must not reach ep
    before = {k: v.clone() for k, v in ep.state_dict.items()}
    load_converted(ctx.spec, ep, ctx.layout.calibrated)
    float_reference(ep)
    assert all(torch.equal(before[k], v) for k, v in ep.state_dict.items())
