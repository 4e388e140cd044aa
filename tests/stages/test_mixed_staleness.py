"""doit re-runs a mixed-precision entry exactly as far as its int16 choice changed (issue 10, item 3).

A tiny model (tests/mixednets.py, 3 JPEGs) with ``mixed_precision = "auto"``, built
through ``convert``. Changing the selection keys (``int16_layers``, ``int16_macs``)
re-runs ``mixed_precision`` and ``prepare`` onward, never ``export``; a new measurement
(stage code, calibration images) that picks the same layers writes a byte-identical
``int16_layers.json``, and ``prepare`` stays. The tests share the project and run in
file order.
"""

from __future__ import annotations

import json
import shutil

import pytest

from doitproj import TESTS, Project

MODEL = "tiny_m"
STAGES = ("export", "mixed_precision", "prepare", "calibrate", "convert")
FROM_PREPARE = STAGES[1:]
TARGET = f"convert:{MODEL}"

# tests/mixednets.py TinyNet with its outlier tensor features.2 -> features.3: the two convs
# are 38.4 % of the MACs, so a 40 % budget holds them and 30 % can never hold features.3
# (its only other tensor goes to the average pool, which is never int16).
ENTRY = """builder = "mixednets:outlier_net"
input_shape = [1, 3, 32, 32]
dtype = "int8"
preprocess = {{ resize = 36, crop = 32 }}
[weights]
pretrained = false
[calibration]
set = "setA"
[quantizer]
mixed_precision = "auto"
int16_layers = {patterns}
int16_macs = {budget}
"""


@pytest.fixture(scope="module")
def proj(tmp_path_factory):
    p = Project(tmp_path_factory.mktemp("mixed_staleness"), copy_pipeline=True)
    shutil.copy(TESTS / "mixednets.py", p.root / "mixednets.py")
    p.add_images("setA", 3, seed0=0)
    set_entry(p, [], 0.40)
    run = p.doit(TARGET)
    assert_ran(run, STAGES)
    assert {"features.2.0", "features.3"} <= set(modules(p))  # the outlier tensor is int16
    return p


def set_entry(p: Project, patterns: list[str], budget: float) -> None:
    (p.root / "models" / f"{MODEL}.toml").write_text(ENTRY.format(patterns=json.dumps(patterns), budget=budget))


def selection(p: Project) -> bytes:
    return (p.root / "artifacts" / MODEL / "int16_layers.json").read_bytes()


def modules(p: Project) -> list[str]:
    return json.loads(selection(p))["modules"]


def assert_ran(run, stages: tuple[str, ...]):
    assert run.returncode == 0, run.out
    assert [s for s in STAGES if run.ran(s)] == list(stages), run.executed


def test_nothing_changed_runs_nothing(proj):
    assert proj.doit(TARGET).executed == []


def test_remeasurement_with_the_same_choice_stops_at_mixed_precision(proj):
    """New code in the stage re-runs it; the same layers (same bytes) leave prepare onward alone."""
    before = selection(proj)
    stage = proj.root / "pipeline" / "stages" / "mixed_precision.py"
    stage.write_text(stage.read_text() + "\n# edited by the staleness test\n")
    assert_ran(proj.doit(TARGET), ("mixed_precision",))
    assert selection(proj) == before


def test_new_image_remeasures_but_prepare_stays(proj):
    """An edited calibration image re-runs the measurement and calibration; the choice is
    the same (the outlier tensor dominates), so prepare does not run."""
    from doitproj import write_jpeg
    before = selection(proj)
    write_jpeg(sorted((proj.root / "calib_data" / "setA").iterdir())[0], seed=99)
    assert_ran(proj.doit(TARGET), ("mixed_precision", "calibrate", "convert"))
    assert selection(proj) == before


def test_budget_change_with_the_same_choice_stops_at_mixed_precision(proj):
    """prepare onward track [quantizer] minus the choice keys: the choice reaches them
    as int16_layers.json, which comes out byte-identical here."""
    before = selection(proj)
    set_entry(proj, [], 0.45)
    assert_ran(proj.doit(TARGET), ("mixed_precision",))
    assert selection(proj) == before


def test_budget_change_reruns_prepare_onward_but_not_export(proj):
    set_entry(proj, [], 0.30)
    assert_ran(proj.doit(TARGET), FROM_PREPARE)
    assert "features.3" not in modules(proj)
    assert proj.doit(TARGET).executed == []


def test_pattern_change_reruns_prepare_onward_but_not_export(proj):
    set_entry(proj, ["features.3"], 0.30)
    assert_ran(proj.doit(TARGET), FROM_PREPARE)
    assert "features.3" in modules(proj)
    assert proj.doit(TARGET).executed == []
