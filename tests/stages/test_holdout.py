"""The held-out estimate (stage ``holdout``): k-fold re-calibration on a tiny net.

Proves that every evaluation image is held out exactly once, that a fold's
calibration never sees its own held-out images, that a separate evaluation
set is recognised as already held out, and how the summary shows both.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from doitproj import Project, build_through
from pipeline import torchenv
from pipeline.errors import CalibrationDataError
from pipeline.stages import folds, holdout
from pipeline.stages.registry import get


def test_folds_split_by_position_and_cover_every_image_once():
    imgs = [Path(f"i{n}.jpg") for n in range(7)]
    got = folds.folds_of(imgs, 3)
    assert got == [imgs[0::3], imgs[1::3], imgs[2::3]]
    assert sorted(p for f in got for p in f) == sorted(imgs)
    with pytest.raises(ValueError, match="2 images cannot make 3 folds"):
        folds.folds_of(imgs[:2], 3)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("holdout")
    p = Project(root)
    p.add_model("tiny")
    p.add_images("setA", 6)
    return build_through(root, last="evaluate")


def _run(ctx, **over):
    args = {**get("holdout").args(ctx), **over}
    return holdout.holdout_model(**args)


def test_kfold_holds_every_image_out_once_and_never_calibrates_on_it(built, monkeypatch):
    import pipeline.stages.calibrate as calibrate
    seen, diagnosed = [], []
    real = calibrate.calibrate_model

    def spy(spec, float_pt2, prepared_state, prepared_table, calib_dir, *a, **k):
        seen.append(sorted(p.name for p in Path(calib_dir).iterdir()))
        diagnosed.append(k.get("diagnose", True))
        return real(spec, float_pt2, prepared_state, prepared_table, calib_dir, *a, **k)

    monkeypatch.setattr(calibrate, "calibrate_model", spy)
    monkeypatch.setattr(folds.os, "cpu_count", lambda: 1)   # folds in this process: the spy sees them
    rec = _run(built)
    assert rec["method"] == "k-fold" and rec["folds"] == 2 and rec["images"] == 6
    held = [set(f["held_out"]) for f in rec["folds_detail"]]
    names = {p.name for p in built.evaluation_images}
    assert held[0] | held[1] == names and not held[0] & held[1]
    assert [set(s) for s in seen] == [names - h for h in held]  # fold f calibrated on the rest only
    assert diagnosed == [False, False]   # a fold's per-layer SQNR would be thrown away
    assert [f["calibrated_on"] for f in rec["folds_detail"]] == [3, 3]
    for key in ("qdq", "c"):
        assert 0 <= rec[key]["top1_agreement_with_float"] <= 6
        assert rec[key]["mean_abs_logit_error_vs_float"] >= 0
    assert rec["c"]["variant"] == "mmalib"
    per = rec["per_image"]
    assert sum(r["c"] == r["float"] for r in per) == rec["c"]["top1_agreement_with_float"]
    assert sum(r["qdq"] == r["float"] for r in per) == rec["qdq"]["top1_agreement_with_float"]
    saved = json.loads(built.layout.holdout.read_text())
    assert saved == json.loads(json.dumps(rec))
    assert not list(built.layout.dir.glob(".holdout-*")), "fold folders must be removed"


def test_folds_side_by_side_give_what_one_process_gives(built, monkeypatch):
    """On several cores the folds run in loky processes with their share of the torch
    threads; with the same thread count in one process every number is the same."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: the folds never run side by side")
    monkeypatch.setattr(folds, "SIDE_BY_SIDE_BYTES", 0)   # the tiny model's folds too
    with torchenv.torch_threads(2):
        side = _run(built)                       # two folds of one thread each
    monkeypatch.setattr(folds.os, "cpu_count", lambda: 1)
    with torchenv.torch_threads(1):
        one = _run(built)
    drop = lambda r: {k: v for k, v in r.items() if k != "seconds"}
    assert drop(side) == drop(one)


def test_separate_evaluation_set_is_already_held_out(built, tmp_path):
    other = tmp_path / "setB"
    other.mkdir()
    (other / "x_1.jpg").write_bytes(built.evaluation_images[0].read_bytes())
    rec = _run(built, images_dir=other, out=tmp_path / "h.json")
    assert rec["method"] == "separate" and "folds" not in rec


def test_fewer_images_than_folds_is_one_clear_error(built, tmp_path):
    import dataclasses
    spec = dataclasses.replace(built.spec, evaluation_folds=7)
    with pytest.raises(CalibrationDataError, match=r"6 evaluation images .* cannot make 7 folds"):
        _run(built, spec=spec, out=tmp_path / "h.json")
    assert not (tmp_path / "h.json").exists()


def test_summary_leads_with_held_out_and_keeps_in_sample_second():
    from pipeline.stages.summary import model_lines
    report = {"labeled": 4, "dtype": "int8", "weight_dtype": "int8", "evaluation_set": "s", "notes": [],
              "float_top1": 3, "quant_top1": 3, "top1_agreement": 4, "images": 4, "mean_abs_logit_error": 0.1}
    h = {"method": "k-fold", "folds": 2, "labeled": 4, "images": 4, "evaluation_set": "s", "float_top1": 3,
         "qdq": {"top1": 2, "top1_agreement_with_float": 3, "mean_abs_logit_error_vs_float": 0.25},
         "c": {"variant": "mmalib", "top1": 2, "top1_agreement_with_float": 3,
               "mean_abs_logit_error_vs_float": 0.26}}
    lines = model_lines("m", report, None, {}, None, h)
    assert lines[1].startswith("  held-out       2-fold on s") and "PyTorch Q/DQ 2/4 | C mmalib 2/4" in lines[1]
    assert "Q/DQ 3/4, 0.250 | C mmalib 3/4, 0.260" in lines[2]
    assert lines[3].startswith("  in-sample") and "PyTorch Q/DQ 3/4" in lines[3]
    sep = model_lines("m", report, None, {}, None, {"method": "separate"})
    assert sep[1].startswith("  held-out       (evaluation images not used for calibration) top-1 float 3/4")


def test_a_small_model_runs_its_folds_in_this_process(built, monkeypatch):
    """A fold of a model under SIDE_BY_SIDE_BYTES costs less than a process's imports."""
    import pipeline.torchenv as te
    monkeypatch.setattr(te, "process_map", lambda *a, **k: pytest.fail("folds sent to processes"))
    assert built.layout.float_pt2.stat().st_size < folds.SIDE_BY_SIDE_BYTES
    assert _run(built)["method"] == "k-fold"


@pytest.mark.parametrize("name", ["absolute", "dotdot"])
def test_a_calibration_set_path_never_moves_the_folds_outside_their_work_folder(built, tmp_path, monkeypatch, name):
    """Issue 48: holdout linked the user's ``calibration.set`` under its work folder, so an
    absolute set failed and ``../..`` made folders and links in the project root."""
    import dataclasses
    calib_dir = built.calib_root / built.spec.calibration.set
    # three levels up from a fold's calib_data/ is the folder of holdout.json (here tmp_path)
    setting = str(calib_dir.resolve()) if name == "absolute" else "../../../escaped_set"
    spec = dataclasses.replace(built.spec, calibration=dataclasses.replace(built.spec.calibration, set=setting))
    monkeypatch.setattr(folds.os, "cpu_count", lambda: 1)
    before = set(built.root.parent.iterdir()) | set(built.root.iterdir())
    rec = _run(built, spec=spec, out=tmp_path / "h.json")
    assert rec["method"] == "k-fold" and [f["calibrated_on"] for f in rec["folds_detail"]] == [3, 3]
    assert set(built.root.parent.iterdir()) | set(built.root.iterdir()) == before   # nothing made outside
    assert [p.name for p in tmp_path.iterdir()] == ["h.json"]
    assert not list(built.layout.dir.glob(".holdout-*"))


def test_segmentation_scores_match_instances_and_their_masks():
    """A segmentation model's held-out record: output 0 scored as detections, and the instances
    after NMS with each match's mask IoU, for the Q/DQ model and the C build, per image too."""
    import numpy as np
    det = np.array([[[0, 0, 16, 16, 0.9, 1], [16, 16, 32, 32, 0.8, 3], [0, 16, 8, 32, 0.1, 5]]], np.float32)
    logits = np.full((1, 3, 8, 8), -4.0, np.float32)
    logits[0, 0, :4, :4] = logits[0, 1, 4:, 4:] = 4.0
    worse = logits.copy()
    worse[0, 1] = -4.0                      # the C build loses the second mask
    rec = holdout.segmentation_scores("mmalib", [Path("a.jpg")], [det, logits], [det, logits], [det, worse], (32, 32))
    assert rec["qdq"]["instances_vs_float"]["mean_mask_iou"] == 1.0
    c = rec["c"]["instances_vs_float"]
    assert (c["matched"], c["reference_instances"], c["worst_mask_iou"]) == (2, 2, 0.0)
    assert rec["c"]["detections_vs_float"]["confident"]["matched"] == 2
    row = rec["per_image"][0]
    assert (row["float_instances"], row["c_instances_matched"], row["c_mask_iou"], row["qdq_mask_iou"]) == (2, 2, 0.5, 1.0)


def test_a_target_entry_scores_the_search_folds_and_gets_what_its_own_folds_give(built, monkeypatch, tmp_path):
    """The search leaves its chosen recipe's folds, run on through the C build, in
    search_folds.npz; the holdout stage scores those (no calibration of its own) and gets
    every number it gets by running the folds itself. Another choice's file is not used."""
    import dataclasses
    import pipeline.stages.calibrate as calibrate
    from pipeline.config import AccuracyTarget
    from pipeline.stages import search
    monkeypatch.setenv("DOIT_C7X_CACHE", "off")   # measured here, not restored: the folds exist
    spec = dataclasses.replace(built.spec, quantizer=dataclasses.replace(
        built.spec.quantizer, target=AccuracyTarget("logit_error", 100.0)))   # the first recipe meets it
    found = search.search_model(**{**get("search").args(built), "spec": spec})
    assert found["chosen"]["name"] == "percentile" and built.layout.search_folds.exists()
    assert not list(built.layout.dir.glob(".search-*")), "the search's folds must be removed"
    args = {"spec": spec, "recipe": built.layout.search, "out": tmp_path / "holdout.json"}
    calls = []
    real = calibrate.calibrate_model
    monkeypatch.setattr(calibrate, "calibrate_model", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(folds.os, "cpu_count", lambda: 1)   # folds in this process: the spy sees them
    reused = _run(built, **args, search_folds=built.layout.search_folds)
    assert calls == [] and reused["folds_from"].startswith("search")
    own = _run(built, **args, search_folds=None)
    assert len(calls) == 2 and "folds_from" not in own
    drop = lambda r: {k: v for k, v in r.items() if k not in ("seconds", "folds_from")}
    assert drop(reused) == drop(own)
    # a file written for another choice is ignored: the folds run again
    other = tmp_path / "other.npz"
    folds.write_fold_outputs(other, {"build": {"calibration": {}, "quantizer": {}}, "images": [], "rows": []},
                              {"qdq": [], "c": []})
    again = _run(built, **args, search_folds=other)
    assert len(calls) == 4 and drop(again) == drop(own)
