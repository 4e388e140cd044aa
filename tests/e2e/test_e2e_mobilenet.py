"""The main job end to end on real input: MobileNetV2 with torchvision's
ImageNet weights, int8 and int16, calibrated and evaluated on the 20 labeled
JPEGs, through doit in a fresh project folder (issues 2-4, acceptance).

Also the automatic int8/int16 mixed build and the k-fold held-out numbers
of every model (issue 10). Marked slow (about 6 minutes on 2 cores); CI runs it.
"""

import json
import shutil
from pathlib import Path

import pytest

from doitproj import Project

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if len(list((REPO / "calib_data" / "imagenet20").glob("*.jpg"))) != 20:
        pytest.skip("calib_data/imagenet20 is not fetched: run `bash scripts/setup.sh` first")
    p = Project(tmp_path_factory.mktemp("e2e"))
    for m in ("mobilenet_v2", "mobilenet_v2_int16", "mobilenet_v2_mixed"):
        shutil.copy(REPO / "models" / f"{m}.toml", p.root / "models")
    shutil.copytree(REPO / "calib_data" / "imagenet20", p.root / "calib_data" / "imagenet20")
    run = p.doit("-n", "2", timeout=2400)  # three models, AdaRound in six calibrations: ~10 min on 2 cores
    assert run.returncode == 0, run.out[-4000:]
    return p, run


def test_report_float_and_quantized_accuracy(built):
    p, run = built
    r8, r16 = p.artifact("mobilenet_v2", "report.json"), p.artifact("mobilenet_v2_int16", "report.json")
    assert r8["float_top1"] == 18 and r8["labeled"] == 20          # torchvision MobileNetV2 on these 20
    # in-sample Q/DQ (affine int8, AdaRound): measured top-1 16/20, agreement 18/20, mean |logit
    # error| 0.259 (symmetric int8 before: 17/20, 19/20, 0.335); the held-out numbers are holdout.json's
    assert r8["quant_top1"] >= 16 and r8["top1_agreement"] >= 18 and r8["mean_abs_logit_error"] < 0.3
    assert any("20 of the 20 evaluation images were also calibration images" in n for n in r8["notes"])
    assert r8["for_deployment"] and r8["weights"]["sha256"].startswith("b0353104")
    # int16 activations keep the logits closer to float than int8 (measured: 0.21 vs 0.26 with
    # affine int8 + AdaRound; 0.21 vs 0.39 with symmetric int8 and no method, 0.21 vs 0.72 with minmax)
    assert r16["mean_abs_logit_error"] < r8["mean_abs_logit_error"]
    assert "== doit-c7x summary ==" in run.out and "float 18/20" in run.out


def test_coverage_mobilenet_v2_int8(built):
    p, _ = built
    layers = p.artifact("mobilenet_v2", "c/mmalib/manifest.json")["layers"]
    convs = [l for l in layers if l["op"] in ("conv2d", "depthwise_conv2d", "grouped_conv2d")]
    on = {"mmalib", "c7x"}
    assert len(convs) == 52 and all(l["backend"] in on for l in convs)
    assert sum(l["op"] == "depthwise_conv2d" for l in convs) == 17
    adds = [l for l in layers if l["op"] == "residual_add"]
    assert len(adds) == 10 and all(l["backend"] in on for l in adds)
    fc = [l for l in layers if l["op"] == "fc"]
    assert len(fc) == 1 and fc[0]["backend"] == "mmalib"


def test_layer_names_match_torchvision_modules(built):
    """Every conv / FC layer names the torchvision module it runs (issue 9, item 1)."""
    import torch.nn as nn
    from torchvision.models import mobilenet_v2

    p, _ = built
    modules = dict(mobilenet_v2().named_modules())
    layers = p.artifact("mobilenet_v2", "c/mmalib/manifest.json")["layers"]
    weighted = [lay for lay in layers if lay["op"] in ("conv2d", "depthwise_conv2d", "fc")]
    assert len(weighted) == 53
    for lay in weighted:
        kind = nn.Linear if lay["op"] == "fc" else nn.Conv2d
        assert isinstance(modules[lay["module"]], kind), lay
    by_module = {lay["module"]: lay for lay in weighted}
    assert by_module["features.0.0"]["op"] == "conv2d" and by_module["classifier.1"]["op"] == "fc"
    assert by_module["features.1.conv.0.0"]["op"] == "depthwise_conv2d"
    assert all(lay["source"].startswith("torchvision/models/mobilenetv2.py:") for lay in weighted)


@pytest.mark.parametrize("model", ["mobilenet_v2", "mobilenet_v2_int16"])
def test_host_c_is_bit_exact_and_accurate(built, model):
    p, _ = built
    v = p.artifact(model, "verify.json")
    report = p.artifact(model, "report.json")
    assert {r["variant"] for r in v["variants"]} == {"mmalib", "scalar"}
    for r in v["variants"]:
        assert r["vs_python_reference"]["bit_exact_images"] == 20, r["variant"]
        assert r["vs_python_reference"]["max_lsb"] == 0
        # the build classifies like the quantized model it implements, within one image for the
        # deployed MMALIB build; two for the scalar baseline (TVM's own integer lowering). Measured
        # on int8 with AdaRound: scalar top-1 15/20 against Q/DQ's 17/20 and 17/20 agreement with
        # float, at 1.22 LSB mean from Q/DQ (1.28 before): no larger distance, two close images flipped
        slack = 1 if r["variant"] == "mmalib" else 2
        assert abs(r["accuracy"]["top1"] - report["quant_top1"]) <= slack, r
        assert r["accuracy"]["top1_agreement_with_float"] >= 19 - slack, r
    scalar = next(r for r in v["variants"] if r["variant"] == "scalar")
    noise = v["pytorch_qdq"]["self_noise_1_thread_no_mkldnn"]
    # the scalar baseline is as close to PyTorch as PyTorch is to itself
    assert scalar["vs_pytorch_qdq"]["mean_lsb"] <= 1.5 * max(noise["mean_lsb"], 1.0)


def test_generated_c_on_disk_and_second_run_is_a_no_op(built):
    p, _ = built
    for model in ("mobilenet_v2", "mobilenet_v2_int16"):
        for f in ("model.c", "model.h", "tvm_kernels.c", "weights.bin", "manifest.json"):
            assert (p.root / "artifacts" / model / "c" / "mmalib" / f).stat().st_size > 0
    again = p.doit()
    assert again.returncode == 0 and again.executed == [], again.executed


def test_offload_page_is_small_self_contained_and_has_a_node_per_call(built):
    """The default run writes offload.html (issue 9, item 2); MobileNetV2's measured 219 KB."""
    import re
    p, _ = built
    page = p.root / "artifacts" / "mobilenet_v2" / "offload.html"
    html = page.read_text()
    assert page.stat().st_size < 400_000 and not re.search(r"https?://", html, re.IGNORECASE)
    data = json.loads(re.search(r'id="page-data">(.*?)</script>', html, re.S).group(1))
    for v in ("mmalib", "scalar"):
        calls = p.artifact("mobilenet_v2", f"c/{v}/manifest.json")["calls"]
        assert len(data["builds"][v]["nodes"]) == len(calls) + 2


def test_per_layer_numerics_cover_every_layer_and_agree_with_verify(built):
    """layers.json (issue 9, item 4): both comparisons for all 64 layers on the 20 images;
    at the model output, C vs Q/DQ is exactly verify's LSB distance; int16 is closer to float."""
    p, run = built
    mean_sqnr = {}
    for model in ("mobilenet_v2", "mobilenet_v2_int16"):
        lay = p.artifact(model, "layers.json")
        manifest = p.artifact(model, "c/mmalib/manifest.json")
        assert lay["images"] == 20 and lay["build"] == "mmalib" and len(lay["layers"]) == 64
        assert sorted(x["id"] for x in lay["layers"]) == sorted(x["id"] for x in manifest["layers"])
        sqnr = [x["qdq_vs_float"]["sqnr_db"] for x in lay["layers"]]
        assert sqnr == sorted(sqnr) and lay["worst"] == [x["id"] for x in lay["layers"][:3]]
        assert all(x["c_vs_qdq"] is not None for x in lay["layers"])
        last = next(x for x in lay["layers"] if x["id"] == manifest["calls"][-1]["layer"])
        mmalib = next(r for r in p.artifact(model, "verify.json")["variants"] if r["variant"] == "mmalib")
        assert last["c_vs_qdq"]["max_lsb"] == mmalib["vs_pytorch_qdq"]["max_lsb"]
        mean_sqnr[model] = sum(sqnr) / len(sqnr)
        worst = next(x for x in lay["layers"] if x["id"] == lay["worst"][0])
        assert f"worst layers   {worst['module'] or worst['id']} (" in run.out
    # measured: 22.0 vs 17.6 dB (affine int8; 13.1 dB with symmetric int8)
    assert mean_sqnr["mobilenet_v2_int16"] > mean_sqnr["mobilenet_v2"] + 3


def test_held_out_numbers_for_every_model_lead_the_summary(built):
    p, run = built
    for m in ("mobilenet_v2", "mobilenet_v2_int16", "mobilenet_v2_mixed"):
        h = p.artifact(m, "holdout.json")
        assert h["method"] == "k-fold" and h["folds"] == 2 and h["images"] == 20
        held = [set(f["held_out"]) for f in h["folds_detail"]]
        assert len(held[0] | held[1]) == 20 and not held[0] & held[1]
        assert h["float_top1"] == 18
        block = run.out.split(f"\n{m}: ", 1)[1]
        assert block.split("\n")[2].startswith("  held-out       2-fold on imagenet20")
    e8, e16, emix = (p.artifact(m, "holdout.json")["c"]["mean_abs_logit_error_vs_float"]
                     for m in ("mobilenet_v2", "mobilenet_v2_int16", "mobilenet_v2_mixed"))
    # measured (C build, held out, 2026-12-07): int8 0.252, int16 (int8 weights) 0.209, mixed (the
    # search's int16 layers, 40% of the cycles, with int16 weights) 0.161
    assert max(e16, emix) < e8


def test_mixed_build_keeps_every_layer_on_its_kernel_within_the_budget(built):
    p, run = built
    mixed = p.artifact("mobilenet_v2_mixed", "mixed_precision.json")
    # the entry states a target: the budget is the search's choice, a share of the estimated cycles
    choice = p.artifact("mobilenet_v2_mixed", "search.json")["chosen"]["overrides"]["quantizer"]
    assert mixed["method"] == "auto" and mixed["budget_unit"] == "cycles" and mixed["budget"] == choice["int16_cycles"]
    assert 0 < mixed["int16_cycles_share"] <= mixed["budget"] + 1e-9 and mixed["int16_macs"] > 0
    layers = p.artifact("mobilenet_v2_mixed", "c/mmalib/manifest.json")["layers"]
    heavy = [lay for lay in layers if lay["op"] in ("conv2d", "depthwise_conv2d", "fc", "residual_add", "requantize")]
    assert all(lay["backend"] in ("mmalib", "c7x") for lay in heavy)
    assert sum(lay["op"] == "requantize" for lay in layers) >= 2
    chosen = set(p.artifact("mobilenet_v2_mixed", "int16_layers.json")["layers"])
    weighted = {lay["id"]: lay for lay in layers if lay["op"] in ("conv2d", "depthwise_conv2d", "fc")}
    assert chosen & set(weighted)
    assert all((lay["dtype"] == "int16") == (i in chosen) for i, lay in weighted.items())
    v = p.artifact("mobilenet_v2_mixed", "verify.json")
    assert all(r["vs_python_reference"]["bit_exact_images"] == 20 for r in v["variants"])
    line = next(ln for ln in run.out.splitlines() if ln.startswith("  mixed "))
    assert "layers int16" in line and "int16 " in line.split("memory", 1)[1] and "int8 " in line
