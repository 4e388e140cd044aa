"""Outputs are written atomically: a failed or killed stage leaves nothing a
later run could take as up to date (issue 2, item 6)."""


import pytest

from doitproj import TESTS, Project
from pipeline.fsutil import atomic_dir, atomic_path, write_text


def test_failed_write_keeps_the_old_file_and_no_temporaries(tmp_path):
    target = tmp_path / "a" / "out.bin"
    write_text(target, "old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half of the new")
            raise RuntimeError("stage crashed")
    assert target.read_text() == "old"
    assert [p.name for p in target.parent.iterdir()] == ["out.bin"]


def test_failed_directory_write_keeps_the_old_set(tmp_path):
    target = tmp_path / "c" / "mmalib"
    with atomic_dir(target) as tmp:
        (tmp / "model.c").write_text("v1")
        (tmp / "model.h").write_text("v1")
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as tmp:
            (tmp / "model.c").write_text("v2")
            raise RuntimeError("emitter crashed")
    assert sorted(p.read_text() for p in target.iterdir()) == ["v1", "v1"]
    assert [p.name for p in target.parent.iterdir()] == ["mmalib"]


def test_killed_stage_is_rerun_and_leftovers_are_cleaned(tmp_path):
    p = Project(tmp_path)
    p.add_images("setA", 2)
    p.add_model("tiny", "setA")
    first = p.doit("prepare:tiny")
    assert first.returncode == 0, first.out
    env = {"C7X_TEST_KILL_ON_SAVE": "calibrated", "PYTHONPATH": f"{TESTS / 'killhook'}:{p.root}"}
    killed = p.doit("calibrate:tiny", env=env)
    assert killed.returncode != 0
    art = p.root / "artifacts" / "tiny"
    assert not (art / "calibrated.pt").exists()
    assert [f.name for f in art.glob(".tmp-calibrated.pt.*")], "the kill hook did not fire mid-write"
    rerun = p.doit("calibrate:tiny")
    assert rerun.returncode == 0, rerun.out
    assert rerun.executed == ["calibrate:tiny"]
    assert (art / "calibrated.pt").is_file() and not list(art.glob(".tmp-*"))
    assert p.doit("calibrate:tiny").executed == []
