"""Calibration options (issue 3, item 2) on a tiny model, through the stage functions."""

import json
from pathlib import Path

import pytest

from doitproj import tiny_spec, write_jpeg


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from pipeline.stages.export import export_model
    from pipeline.stages.prepare import prepare_model
    d = tmp_path_factory.mktemp("cal")
    (d / "s").mkdir()
    for i in range(5):
        write_jpeg(d / "s" / f"im_{i}_{i}.jpg", seed=i)
    spec = tiny_spec(d)
    export_model(spec, None, d / "float.pt2", Path(__file__).resolve().parents[1])
    prepare_model(spec, d / "float.pt2", d / "prepared.pt", d / "obs.txt")
    return d


def calibrate(d, name, **cal):
    from pipeline.stages.calibrate import calibrate_model
    spec = tiny_spec(d, **cal)
    info = calibrate_model(spec, d / "float.pt2", d / "prepared.pt", d / "obs.txt", d / "s",
                           d / f"{name}.pt", d / f"{name}.json")
    import torch
    return info, torch.load(d / f"{name}.pt", weights_only=True)


def observer_ranges(state):
    return {k: v for k, v in state.items() if k.endswith(("min_val", "max_val"))}


def test_minmax_ranges_do_not_depend_on_batch_size(exported):
    import torch
    _, s1 = calibrate(exported, "b1", batch_size=1, observer="minmax")
    info, s3 = calibrate(exported, "b3", batch_size=3, observer="minmax")
    assert info["batch_size"] == 3 and info["num_images"] == 5
    r1, r3 = observer_ranges(s1), observer_ranges(s3)
    assert r1 and r1.keys() == r3.keys()
    # batched convolutions may round differently in the last ulp; the ranges are the same
    assert all(torch.allclose(r1[k], r3[k], rtol=1e-5, atol=1e-6) for k in r1)


def test_num_images_and_order_select_deterministically(exported):
    info_a, sa = calibrate(exported, "n2a", num_images=2, order="shuffled", seed=7)
    info_b, sb = calibrate(exported, "n2b", num_images=2, order="shuffled", seed=7)
    info_c, _ = calibrate(exported, "n2c", num_images=2, order="sorted")
    assert info_a["images"] == info_b["images"] and len(info_a["images"]) == 2
    assert info_c["images"] == ["im_0_0.jpg", "im_1_1.jpg"]
    assert (exported / "n2a.pt").read_bytes() == (exported / "n2b.pt").read_bytes()


def test_observer_choice_changes_ranges(exported):
    _, mm = calibrate(exported, "mm", observer="minmax")
    _, hist = calibrate(exported, "hist", observer="histogram")
    assert any(k.endswith("histogram") for k in hist)
    assert not any(k.endswith("histogram") for k in mm)


def test_random_calibration_is_stamped_not_for_deployment(exported):
    info, _ = calibrate(exported, "rnd", source="random", num_images=3)
    assert info["for_deployment"] is False and info["images"] == [] and info["num_images"] == 3
    assert json.loads((exported / "rnd.json").read_text())["source"] == "random"


def test_layer_sqnr_before_and_after_the_method_reach_the_summary(exported):
    """calibration.json records each layer's Q/DQ-vs-float SQNR before and after the steps
    after observing; without a method they are equal; the summary names the five worst
    layers both ways with the method (issue 30, item 5)."""
    from pipeline.stages.summary import model_lines
    plain, _ = calibrate(exported, "plain", observer="minmax", exact_requantize=False)
    rec = plain["layer_sqnr"]
    assert rec["images"] == 5 and len(rec["layers"]) >= 5
    assert all(r["before_db"] == r["after_db"] for r in rec["layers"])
    tuned, _ = calibrate(exported, "ada", observer="minmax", exact_requantize=True, adaround_iterations=20)
    rows = tuned["layer_sqnr"]["layers"]
    assert [r["id"] for r in rows] == [r["id"] for r in rec["layers"]]
    assert any(r["before_db"] != r["after_db"] for r in rows)
    rep = {"labeled": 3, "images": 3, "dtype": "int8", "weight_dtype": "int8", "evaluation_set": "s",
           "float_top1": 1, "quant_top1": 1, "top1_agreement": 3, "mean_abs_logit_error": 0.01}
    lines = model_lines("tiny", rep, None, {}, calibration=tuned)
    method, before, after = (ln for ln in lines if ln.startswith(("  method", "  worst before", "  worst after")))
    assert "exact requantize + AdaRound 20" in method
    worst = min(rows, key=lambda r: r["before_db"] if r["before_db"] is not None else 1e9)
    assert before.startswith(f"  worst before   {worst['module']} {worst['before_db']:.1f} (after ")
    assert after.count("(before ") == 5 and "5 calibration images" in before
    assert not any(ln.startswith("  method") for ln in model_lines("tiny", rep, None, {}, calibration=plain))


def test_without_diagnosis_the_state_is_the_same_and_no_sqnr_is_measured(exported, monkeypatch):
    """The holdout's folds calibrate with diagnose=False: the same calibrated state, no
    per-layer SQNR pass (layer_sqnr: False)."""
    import torch
    from pipeline.stages import calibrate as stage
    from pipeline.stages.calibrate import calibrate_model
    calls = []
    real = stage.layer_sqnr
    monkeypatch.setattr(stage, "layer_sqnr", lambda *a: calls.append(1) or real(*a))
    spec = tiny_spec(exported, observer="minmax", exact_requantize=True)
    d = exported
    with_sqnr = calibrate_model(spec, d / "float.pt2", d / "prepared.pt", d / "obs.txt", d / "s",
                                d / "diag.pt", d / "diag.json")
    assert len(calls) == 2 and with_sqnr["layer_sqnr"]["layers"]
    without = calibrate_model(spec, d / "float.pt2", d / "prepared.pt", d / "obs.txt", d / "s",
                              d / "nodiag.pt", d / "nodiag.json", diagnose=False)
    assert len(calls) == 2 and without["layer_sqnr"] is False
    a, b = torch.load(d / "diag.pt", weights_only=True), torch.load(d / "nodiag.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
