"""A killed run followed by an undo must not leave outputs taken as up to date
(doit forgets a killed run; the input stamps remember)."""

import json
import os
import signal
import subprocess
import sys
import time

from doitproj import Project
from pipeline.stamps import StampCheck, config_digest, write_stamp


class FakeTask:
    def __init__(self, deps, targets=()):
        self.file_dep = set(deps)
        self.targets = list(targets)


def test_stamp_check_follows_content_not_timestamps(tmp_path):
    a = tmp_path / "a.bin"
    a.write_bytes(b"one")
    stamp = tmp_path / "s.json"
    digest = config_digest({"x": 1})
    check = StampCheck(stamp, digest)
    assert not check(FakeTask([str(a)]), {})          # no stamp yet
    write_stamp(stamp, digest, [str(a)])
    assert check(FakeTask([str(a)]), {})
    later = time.time() + 10
    os.utime(a, (later, later))                         # touch: same content
    assert check(FakeTask([str(a)]), {})
    a.write_bytes(b"two")                               # edit
    assert not check(FakeTask([str(a)]), {})
    a.write_bytes(b"one")                               # undo
    assert check(FakeTask([str(a)]), {})
    assert not StampCheck(stamp, config_digest({"x": 2}))(FakeTask([str(a)]), {})
    assert not check(FakeTask([str(a), str(stamp)]), {})  # dependency list changed


def test_kill_after_stage_then_undo_reruns_the_stage(tmp_path):
    p = Project(tmp_path)
    p.add_images("setA", 3)
    entry = p.add_model("tiny", "setA")
    assert p.doit("calibrate:tiny").returncode == 0
    original = entry.read_text()
    entry.write_text(original + "num_images = 1\n")
    art = p.root / "artifacts" / "tiny"
    before = (art / "calibration.json").stat().st_mtime_ns
    env = dict(os.environ, PYTHONPATH=str(p.root))
    proc = subprocess.Popen([sys.executable, "-m", "doit", "calibrate:tiny"], cwd=p.root, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while (art / "calibration.json").stat().st_mtime_ns == before and time.time() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # the stage finished; doit's database never learns it
    proc.wait()
    assert json.loads((art / "calibration.json").read_text())["num_images"] == 1
    entry.write_text(original)          # undo: doit's old record matches the inputs again
    run = p.doit("calibrate:tiny")
    assert run.returncode == 0, run.out
    assert "calibrate:tiny" in run.executed
    assert json.loads((art / "calibration.json").read_text())["num_images"] == 3
    assert p.doit("calibrate:tiny").executed == []


def test_an_output_edited_after_the_stage_makes_it_stale(tmp_path):
    a, out = tmp_path / "a.bin", tmp_path / "out.json"
    a.write_bytes(b"input")
    out.write_text('{"dtype": "int8"}')
    stamp = tmp_path / "s.json"
    write_stamp(stamp, "cfg", [str(a)], outs=[str(out)])
    check = StampCheck(stamp, "cfg")
    task = FakeTask([str(a)], [str(out)])
    assert check(task, {})
    out.write_text('{"dtype": "int16"}')  # same size, edited by hand
    assert not check(task, {})
    out.unlink()
    assert not check(task, {})
