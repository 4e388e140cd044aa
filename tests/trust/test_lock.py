"""One build at a time per project (pipeline/tasks/lock.py, issue 27): a second
doit waits with one line, or refuses with DOIT_C7X_NO_WAIT=1; list takes no lock."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from doitproj import Project
from pipeline.tasks.lock import doit_command


def test_the_command_is_read_from_doits_arguments():
    assert doit_command(["/v/bin/doit"]) == "run"
    assert doit_command(["/v/bin/doit", "-n", "2", "verify:m"]) == "run"
    assert doit_command(["/v/lib/doit/__main__.py", "list", "--all"]) == "list"
    assert doit_command(["/v/bin/doit", "clean"]) == "clean"
    assert doit_command(["pytest", "tests"]) is None  # a test loading a project takes no lock


@pytest.fixture(scope="module")
def proj(tmp_path_factory):
    p = Project(tmp_path_factory.mktemp("lock"))
    p.add_images("setA", 2)
    p.add_model("tiny", "setA")
    (p.root / "artifacts").mkdir()
    # the project's doit settings (doit's dumpdb reads pyproject.toml, not dodo.py)
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    (p.root / "pyproject.toml").write_text(text[text.index("[tool.doit."):])
    return p


def _hold(proj) -> int:
    """Take the project's lock as another doit run would."""
    fd = os.open(proj.root / "artifacts" / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.pwrite(fd, b"pid 4242, since 10:00:00\n", 0)
    return fd


def test_a_second_run_refuses_with_no_wait_and_list_is_not_blocked(proj):
    fd = _hold(proj)
    try:
        refused = proj.doit("export:tiny", env={"DOIT_C7X_NO_WAIT": "1"}, timeout=120)
        assert refused.returncode != 0
        lines = refused.out.strip().splitlines()
        assert len(lines) == 1 and "another doit run (pid 4242, since 10:00:00) is building this project" in lines[0]
        assert not (proj.root / "artifacts" / "tiny").exists()  # nothing ran
        listed = proj.doit("list", "--all", timeout=120)
        assert listed.returncode == 0 and "export:tiny" in listed.out
        dumped = proj.doit("dumpdb", timeout=120)   # the build holds doit's DB: one line, no dbm.error
        assert dumped.returncode != 0 and "Traceback" not in dumped.out, dumped.out
        assert "a doit run (pid 4242, since 10:00:00) is building this project" in dumped.out
    finally:
        os.close(fd)
    for f in (proj.root / "artifacts").glob(".doit.db*"):   # as before any run has written it
        f.unlink()
    dumped = proj.doit("dumpdb", timeout=120)   # no DB: one line, no dbm.error
    assert dumped.returncode != 0 and "Traceback" not in dumped.out
    assert "no doit run has finished in this project yet" in dumped.out


def test_a_second_run_waits_for_the_first_then_builds(proj):
    fd = _hold(proj)
    env = dict(os.environ, PYTHONPATH=str(proj.root), DOIT_C7X_CACHE_SECRET=str(proj.root / "cache-secret"))
    waiting = subprocess.Popen([sys.executable, "-m", "doit", "export:tiny"], cwd=proj.root, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(8)  # long enough to load the task list and reach the lock
        assert waiting.poll() is None  # still waiting
        assert not (proj.root / "artifacts" / "tiny").exists()
    finally:
        os.close(fd)  # the first run ends
    out, err = waiting.communicate(timeout=600)
    assert waiting.returncode == 0, out + err
    assert "doit-c7x: waiting for another doit run (pid 4242, since 10:00:00) to finish" in err
    assert (proj.root / "artifacts" / "tiny" / "float.pt2").is_file()


def test_the_next_run_removes_what_a_killed_run_left(proj):
    art = proj.root / "artifacts"
    leftovers = [art / "tiny" / "host" / ".tmp-mmalib.exe.1a2b3c.exe", art / "tiny" / ".tmp-report.json.x.json",
                 art / "tiny" / ".holdout-k2j3" / "fold0" / "calibrated.pt"]
    for f in leftovers:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"half written")
    assert proj.doit("list", timeout=120).returncode == 0
    assert all(f.exists() for f in leftovers)  # a read-only command takes no lock and sweeps nothing
    run = proj.doit("export:tiny", timeout=600)
    assert run.returncode == 0, run.out
    assert not any(f.exists() for f in leftovers) and not (art / "tiny" / ".holdout-k2j3").exists()
