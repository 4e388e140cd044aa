"""doit re-runs exactly what is stale (issue 2, item 6).

Two tiny models in a temp project: ``tiny_a`` calibrates on setA, ``tiny_b``
on setB. Each test changes one thing, runs doit, and asserts exactly which
tasks ran; it then checks that a second run runs nothing. The tests share the
project and run in file order.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from doitproj import Project

PKG_HERE = Path(__file__).resolve().parents[2] / "pipeline"  # the package this process imports

MODELS = ("tiny_a", "tiny_b")
ALL_STAGES = ("export", "prepare", "calibrate", "convert", "relax_import", "codegen",
              "host_build", "verify", "evaluate")
FROM_CALIBRATE = ALL_STAGES[2:]
FROM_PREPARE = ALL_STAGES[1:]


@pytest.fixture(scope="module")
def proj(tmp_path_factory):
    p = Project(tmp_path_factory.mktemp("staleness"), copy_pipeline=True)
    p.add_images("setA", 3, seed0=0)
    p.add_images("setB", 3, seed0=10)
    p.add_model("tiny_a", "setA")
    p.add_model("tiny_b", "setB")
    run = p.doit()
    assert run.returncode == 0, run.out
    assert {t for t in run.executed} >= {f"{s}:{m}" for s in ALL_STAGES for m in MODELS}
    assert "summary" in run.executed
    return p


def assert_ran(run, expected: dict[str, set[str]]):
    """``expected``: stage -> models whose task must have run (all others must not)."""
    assert run.returncode == 0, run.out
    for stage in ALL_STAGES:
        assert run.ran(stage) == expected.get(stage, set()), (stage, run.executed)


def assert_nothing_runs(proj):
    again = proj.doit()
    assert again.returncode == 0, again.out
    assert again.executed == [], again.executed


def test_nothing_changed_runs_nothing(proj):
    assert_nothing_runs(proj)


def test_touch_without_change_runs_nothing(proj):
    img = sorted((proj.root / "calib_data" / "setA").iterdir())[0]
    later = time.time() + 5
    os.utime(img, (later, later))
    for f in (proj.root / "artifacts" / "tiny_a").glob("*.pt*"):
        os.utime(f, (later, later))
    assert_nothing_runs(proj)


def test_edited_jpeg_reruns_calibrate_onward_for_its_set_only(proj):
    from doitproj import write_jpeg
    img = sorted((proj.root / "calib_data" / "setA").iterdir())[0]
    write_jpeg(img, seed=99)
    run = proj.doit()
    assert_ran(run, {s: {"tiny_a"} for s in FROM_CALIBRATE})
    assert "summary" in run.executed
    assert_nothing_runs(proj)


def test_added_jpeg_reruns_calibrate_onward(proj):
    proj.add_images("setB", 1, seed0=50)
    run = proj.doit()
    assert_ran(run, {s: {"tiny_b"} for s in FROM_CALIBRATE})
    assert_nothing_runs(proj)


def test_removed_jpeg_reruns_calibrate_onward(proj):
    sorted((proj.root / "calib_data" / "setB").iterdir())[-1].unlink()
    run = proj.doit()
    assert_ran(run, {s: {"tiny_b"} for s in FROM_CALIBRATE})
    assert_nothing_runs(proj)


def test_dtype_change_reruns_prepare_onward_not_export(proj):
    proj.add_model("tiny_a", "setA", dtype="int16")
    run = proj.doit()
    assert_ran(run, {s: {"tiny_a"} for s in FROM_PREPARE})
    assert_nothing_runs(proj)


def test_calibration_option_reruns_calibrate_onward_only(proj):
    proj.add_model("tiny_b", "setB", extra='observer = "histogram"\n')
    run = proj.doit()
    assert_ran(run, {s: {"tiny_b"} for s in FROM_CALIBRATE})
    assert_nothing_runs(proj)


def test_bias_correction_and_percentile_rerun_calibrate_onward_only(proj):
    """Both are calibration options: calibrate re-runs, and its changed state (corrected
    biases; the percentile is an observer buffer) re-runs convert and what follows."""
    proj.add_model("tiny_b", "setB", extra='observer = "percentile"\nbias_correction = true\n')
    assert_ran(proj.doit(), {s: {"tiny_b"} for s in FROM_CALIBRATE})
    proj.add_model("tiny_b", "setB", extra='observer = "percentile"\npercentile = 99.0\nbias_correction = true\n')
    assert_ran(proj.doit(), {s: {"tiny_b"} for s in FROM_CALIBRATE})
    assert_nothing_runs(proj)


def test_codegen_option_reruns_codegen_onward_only(proj):
    proj.add_model("tiny_a", "setA", dtype="int16", extra="[codegen]\nmmalib = false\n")
    run = proj.doit()
    assert_ran(run, {s: {"tiny_a"} for s in ("codegen", "host_build", "verify")})
    art = proj.root / "artifacts" / "tiny_a"
    assert [d.name for d in (art / "c").iterdir()] == ["scalar"]  # no stale MMALIB build left
    assert_nothing_runs(proj)


def test_pipeline_code_change_reruns_its_stage(proj):
    """Editing a stage's source (here: appending a comment to the project's
    private copy of the package) re-runs that stage."""
    src = proj.root / "pipeline" / "stages" / "evaluate.py"
    original = src.read_text()
    try:
        src.write_text(original + "\n# touched by test_staleness\n")
        run = proj.doit()
        assert_ran(run, {"evaluate": set(MODELS)})
    finally:
        src.write_text(original)
    run = proj.doit()
    assert_ran(run, {"evaluate": set(MODELS)})
    assert_nothing_runs(proj)


def test_a_shared_module_change_reruns_exactly_the_stages_that_import_it(proj):
    """Code dependencies are the import closure (pipeline/code_deps.py):
    editing the image loader re-runs the stages that load images, no other."""
    from pipeline.stages.registry import BY_NAME
    src = proj.root / "pipeline" / "data" / "images.py"
    importers = {s for s in ALL_STAGES if str(src) in {p.replace(str(PKG_HERE), str(proj.root / "pipeline"))
                                                        for p in BY_NAME[s].sources()}}
    assert {"calibrate", "evaluate", "verify"} <= importers and "host_build" not in importers
    original = src.read_text()
    try:
        src.write_text(original + "\n# touched by test_staleness\n")
        assert_ran(proj.doit(), {s: set(MODELS) for s in importers})
    finally:
        src.write_text(original)
    assert_ran(proj.doit(), {s: set(MODELS) for s in importers})
    assert_nothing_runs(proj)


def test_project_builder_module_change_reruns_export_onward(proj):
    src = proj.root / "tinynets.py"
    original = src.read_text()
    src.write_text(original.replace("nn.Conv2d(16, 32, 1)", "nn.Conv2d(16, 32, 1, bias=False)"))
    try:
        run = proj.doit()
        assert_ran(run, {s: set(MODELS) for s in ALL_STAGES})
    finally:
        src.write_text(original)
    assert_ran(proj.doit(), {s: set(MODELS) for s in ALL_STAGES})
    assert_nothing_runs(proj)


def test_deleted_artifact_reruns_its_task(proj):
    (proj.root / "artifacts" / "tiny_a" / "report.json").unlink()
    run = proj.doit()
    assert_ran(run, {"evaluate": {"tiny_a"}})
    assert_nothing_runs(proj)


def test_deleted_upstream_artifact_stops_at_identical_output(proj):
    """Deleting quantized.pt2 re-runs convert; its output is byte-identical, so
    nothing after it re-runs (early cutoff from deterministic artifacts)."""
    (proj.root / "artifacts" / "tiny_b" / "quantized.pt2").unlink()
    run = proj.doit()
    assert_ran(run, {"convert": {"tiny_b"}})
    assert_nothing_runs(proj)
