"""run_stage stores nothing from a run whose inputs changed under it (issue 27)."""

from __future__ import annotations

from pathlib import Path

from doit.exceptions import TaskFailed

from pipeline import runcache
from pipeline.tasks import actions


def test_an_input_edited_while_the_stage_runs_fails_it_and_stores_nothing(tmp_path, monkeypatch):
    dep, out = tmp_path / "in.txt", tmp_path / "m" / "out.txt"
    dep.write_text("int8")
    out.parent.mkdir()
    monkeypatch.setenv(runcache.SECRET_ENV, str(tmp_path / "secret"))

    def stage_meanwhile_edited(stage, model, args):
        out.write_text("built from " + dep.read_text())
        dep.write_text("int16")  # another process (or the user) edits the input mid-run

    monkeypatch.setattr(actions, "_execute", stage_meanwhile_edited)
    stamp = {"path": str(tmp_path / "m" / ".stamps" / "s.json"), "digest": "cfg", "deps": [str(dep)],
             "outs": [str(out)]}
    cache = {"root": str(tmp_path / "cache"), "base": str(out.parent), "outs": ["out.txt"], "shared": False}
    result = actions.run_stage("s", "m", {}, stamp, None, cache)
    assert isinstance(result, TaskFailed)
    assert f"{dep} changed while the stage ran; run doit again" in result.get_msg()
    assert not Path(stamp["path"]).exists()  # so the next run rebuilds it
    assert not list((tmp_path / "cache").glob("entries/*/*"))  # and nothing was stored for either input

    monkeypatch.setattr(actions, "_execute", lambda *a: out.write_text("built from " + dep.read_text()))
    assert actions.run_stage("s", "m", {}, stamp, None, cache) == {"run_cache": "stored"}
    assert Path(stamp["path"]).exists() and len(list((tmp_path / "cache").glob("entries/*/*"))) == 1
