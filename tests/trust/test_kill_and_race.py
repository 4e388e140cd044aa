"""kill -9 at any moment, and two runs at once (issue 27): nothing corrupt is ever
trusted, and the next run leaves no temporaries behind.

A reference project is built once. Then a second project with the same inputs
is killed (SIGKILL, the whole process group) at several moments of its default
run, each followed by a run that must finish; at the end every deterministic
artifact equals the reference's bit for bit, no temporary remains, and a last
run has nothing to do."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from doitproj import Project

#: artifacts whose bytes do not depend on timing (profile.json and the page embed host times)
DETERMINISTIC = ("float.pt2", "calibrated.pt", "quantized.pt2", "relax/module.py", "relax/params.bin",
                 "c/mmalib/model.c", "c/mmalib/weights.bin", "c/scalar/model.c", "report.json",
                 "verify.json", "layers.json", "estimate.json")
LEFTOVER = (".tmp-", ".holdout-")


def _project(root: Path) -> Project:
    p = Project(root)
    p.add_images("setA", 3)
    p.add_model("tiny", "setA")
    return p


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    p = _project(tmp_path_factory.mktemp("kill-ref"))
    run = p.doit(env={"DOIT_C7X_CACHE": "off"})
    assert run.returncode == 0, run.out
    return p


def _env(p: Project, **extra) -> dict:
    return dict(os.environ, PYTHONPATH=str(p.root), DOIT_C7X_CACHE_SECRET=str(p.root / "cache-secret"), **extra)


def _kill_after(p: Project, seconds: float) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "doit"], cwd=p.root, env=_env(p), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(seconds)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)  # doit and its gcc / host children, as an OOM kill would
    proc.wait()


def _leftovers(root: Path) -> list[str]:
    return [str(f.relative_to(root)) for f in (root / "artifacts").rglob("*")
            if f.name.startswith(LEFTOVER) and ".cache" not in f.parts]


def test_kill_9_at_several_moments_never_leaves_a_trusted_corrupt_artifact(reference, tmp_path):
    p = _project(tmp_path / "victim")
    for seconds in (4, 9, 2.5, 14, 6):  # different stages (the cache restores more each time)
        _kill_after(p, seconds)
    run = p.doit()
    assert run.returncode == 0, run.out
    assert _leftovers(p.root) == []
    for rel in DETERMINISTIC:
        got = (p.root / "artifacts" / "tiny" / rel).read_bytes()
        assert got == (reference.root / "artifacts" / "tiny" / rel).read_bytes(), rel
    assert p.doit().executed == []


def test_two_runs_at_once_with_different_settings_end_consistent(reference, tmp_path):
    """int8 and int16 started together: the lock serialises them, and whichever ran
    last, a third run rebuilds exactly what its settings need and then matches a
    clean build of the entry as it stands."""
    p = _project(tmp_path / "race")
    model = p.root / "models" / "tiny.toml"
    int8 = model.read_text()
    procs = []
    for text in (int8, int8.replace('dtype = "int8"', 'dtype = "int16"')):
        model.write_text(text)
        procs.append(subprocess.Popen([sys.executable, "-m", "doit"], cwd=p.root, env=_env(p),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        time.sleep(1.5)  # the first has loaded its task list (int8) when the entry flips
    outs = [proc.communicate(timeout=900)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outs
    assert any("waiting for another doit run" in o for o in outs), outs
    model.write_text(int8)
    final = p.doit()
    assert final.returncode == 0, final.out
    for rel in DETERMINISTIC:
        got = (p.root / "artifacts" / "tiny" / rel).read_bytes()
        assert got == (reference.root / "artifacts" / "tiny" / rel).read_bytes(), rel
    assert p.doit().executed == []
