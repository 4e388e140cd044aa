"""Every path a stage writes stays under ``artifacts/<model>/`` whatever the entry's set names
say (issue 48): calibration and evaluation sets given as an absolute path or climbing out of
``calib_data/`` with ``..``, through the whole default run (k-fold holdout included) of tiny nets."""

from __future__ import annotations

from pathlib import Path

from doitproj import Project, write_jpeg


def _snapshot(folder: Path, skip: tuple[str, ...] = ()) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")
            if not any(part in skip for part in p.relative_to(folder).parts)}


def test_set_paths_outside_calib_data_write_nothing_outside_the_models_artifacts(tmp_path):
    outside = tmp_path / "photos"          # beside the project, not under calib_data/
    (outside / "calib").mkdir(parents=True)
    (outside / "eval").mkdir()
    for i in range(4):
        write_jpeg(outside / "calib" / f"img_{i:02d}_{i}.jpg", i)
        write_jpeg(outside / "eval" / f"img_{i:02d}_{i}.jpg", 10 + i)
    p = Project(tmp_path / "proj")
    p.add_model("tiny_abs", str((outside / "calib").resolve()))      # k-fold holdout on an absolute set
    p.add_model("tiny_up", "../../photos/calib")                      # ... on a set that climbs out
    p.add_model("tiny_eval", "../../photos/calib", extra='\n[evaluation]\nset = "../../photos/eval"\n')
    (p.root / "calib_data").mkdir()
    before_outside = _snapshot(outside)
    before_root = _snapshot(p.root, skip=("artifacts", "__pycache__"))
    run = p.doit()
    assert run.returncode == 0, run.out
    assert {f"holdout:{m}" for m in ("tiny_abs", "tiny_up", "tiny_eval")} <= set(run.executed), run.out
    assert _snapshot(outside) == before_outside                      # the photos' folders untouched
    made = _snapshot(p.root, skip=("artifacts", "__pycache__")) - before_root
    assert all(m.startswith((".doit", "cache-secret")) for m in made), made   # doit's own database only
    assert sorted(q.name for q in tmp_path.iterdir()) == ["photos", "proj"]
