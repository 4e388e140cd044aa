"""Stages on a Dask cluster (issue 12): ``DOIT_C7X_EXECUTOR=dask-local:2`` (a real
LocalCluster, scheduler and 2 worker processes on 127.0.0.1) builds the same bytes
as a local run, a killed worker fails its task in one line and the next run
re-runs it, and bad values or a stage's own errors give their one line.

The project is shared by the tests (file order): each ``doit`` run under the
executor starts its own cluster (a few seconds), so the runs are few.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import time

import pytest

from doitproj import TESTS, Project
from pipeline import executor
from pipeline.errors import ExecutorError, PipelineError

DASK = {"DOIT_C7X_EXECUTOR": "dask-local:2", "DOIT_C7X_CACHE": "off"}
LOCAL = {"DOIT_C7X_EXECUTOR": "", "DOIT_C7X_CACHE": "off"}
BUILT = ("t8", "t16")
TASKS = [f"codegen:{m}" for m in BUILT] + ["calibrate:bad_jpeg", "export:crashy"]
# doit's database, and the stamps: they hold mtimes (pipeline/stamps.py); logs: tracebacks.
SKIP = (".doit.db", ".stamps", "logs", ".lock")  # .lock: the pid of the run holding it


def artifact_files(art) -> dict[str, bytes]:
    """Relative path -> bytes of every stage output under ``art``."""
    return {str(p.relative_to(art)): p.read_bytes() for p in sorted(art.rglob("*")) if p.is_file()
            and not any(part.startswith(s) for part in p.relative_to(art).parts for s in SKIP)}


def failure_line(run, task: str) -> str:
    """``<stage>: <error>`` from the one line a failed model gets: ``<model>: FAILED at <stage>: <error>``."""
    stage, model = task.split(":")
    head = f"{model}: FAILED at "
    line = next(line for line in run.out.splitlines() if line.startswith(f"{head}{stage}: "))
    return line[len(head):]  # "<stage>: <error>", the stage's own line


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """The same tasks built locally (kept in artifacts.local), then on the cluster,
    in the same folder (the workers see the head's absolute paths)."""
    p = Project(tmp_path_factory.mktemp("dask"), copy_pipeline=True)  # others may edit pipeline/
    p.add_images("setA", 3, seed0=0)
    p.add_images("corrupt", 2, seed0=5)
    (p.root / "calib_data" / "corrupt" / "zz_broken_3.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    p.add_model("t8", "setA", "int8")
    p.add_model("t16", "setA", "int16")
    p.add_model("bad_jpeg", "corrupt")
    (p.root / "models" / "crashy.toml").write_text(
        (p.root / "models" / "t8.toml").read_text().replace("tinynets:small_cnn", "tinynets:crashing"))
    local = p.doit(*TASKS, env=LOCAL)
    (p.root / "artifacts").rename(p.root / "artifacts.local")
    dask = p.doit("-n", "2", "-P", "thread", *TASKS, env=DASK)
    return p, local, dask


def test_dask_build_is_byte_identical_to_a_local_build(builds):
    p, local, dask = builds
    assert "Traceback" not in dask.out, dask.out
    ok = {t for t in local.executed if t.split(":")[1] in BUILT}
    assert ok >= {f"{s}:{m}" for s in ("export", "prepare", "calibrate", "convert", "codegen") for m in BUILT}
    assert {t for t in dask.executed if t.split(":")[1] in BUILT} == ok
    here, there = artifact_files(p.root / "artifacts.local"), artifact_files(p.root / "artifacts")
    for m in BUILT:
        assert f"{m}/c/scalar/model.c" in here and f"{m}/calibrated.pt" in here
    assert sorted(there) == sorted(here)
    assert [k for k in here if here[k] != there[k]] == []


def test_stage_errors_from_a_worker_give_their_usual_line(builds):
    _, local, dask = builds
    assert local.returncode == dask.returncode == 1
    jpeg = failure_line(dask, "calibrate:bad_jpeg")
    assert "zz_broken_3.jpg: not a readable JPEG/PNG image" in jpeg  # a CalibrationDataError
    assert jpeg == failure_line(local, "calibrate:bad_jpeg")
    crash = failure_line(dask, "export:crashy")
    assert "model 'crashy': unexpected RuntimeError: boom inside the builder" in crash
    assert crash == failure_line(local, "export:crashy")


def test_pipeline_errors_survive_pickling():
    """What the worker sends back: every PipelineError subclass, same type and line."""
    import pipeline.backend.profile_block  # noqa: F401  (define every subclass)
    import pipeline.stages.verify  # noqa: F401
    from distributed.protocol.pickle import dumps, loads

    def subclasses(c):
        return [c] + [s for d in c.__subclasses__() for s in subclasses(d)]

    classes = subclasses(PipelineError)
    assert len(classes) >= 9
    for cls in classes:
        for back in (pickle.loads(pickle.dumps(cls("model 'm': x"))), loads(dumps(cls("model 'm': x")))):
            assert type(back) is cls and str(back) == "model 'm': x"


def test_killed_worker_fails_in_one_line_and_the_next_run_reruns_it(builds):
    p = builds[0]
    p.add_model("tk", "setA")
    kill = dict(DASK, C7X_TEST_KILL_ON_SAVE="tk/calibrated", PYTHONPATH=f"{TESTS / 'killhook'}:{p.root}")
    killed = p.doit("-n", "2", "-P", "thread", "calibrate:tk", env=kill)
    assert killed.returncode == 1, killed.out
    line = failure_line(killed, "calibrate:tk")
    assert line.startswith("calibrate: model 'tk': the Dask worker running it died"), line
    assert "nothing it wrote is trusted, run doit again" in line
    assert "Traceback" not in killed.out
    art = p.root / "artifacts" / "tk"
    assert (art / "prepared.pt").is_file() and not (art / "calibrated.pt").exists()
    assert list(art.glob(".tmp-calibrated.pt.*")), "the kill hook did not fire mid-write"
    assert not (art / ".stamps" / "calibrate.json").exists()

    rerun = p.doit("-n", "2", "-P", "thread", "calibrate:tk", env=DASK)
    assert rerun.returncode == 0, rerun.out
    assert rerun.executed == ["calibrate:tk"]
    assert (art / "calibrated.pt").is_file() and not list(art.glob(".tmp-*"))
    # what the cluster built, stamps included, is up to date for a local run too
    again = p.doit("calibrate:tk", *TASKS[:2], env=LOCAL)
    assert again.executed == [], again.out


@pytest.mark.parametrize("value", ["dask-local:0", "dask-local:two", "dask:/h:1", "dask://h", "tcp://h:8786",
                                   "dask://h:99999", "local"])
def test_bad_target_value_names_the_variable_and_the_two_forms(value):
    with pytest.raises(ExecutorError) as e:
        executor.parse_target(value)
    msg = str(e.value)
    assert msg.startswith(f"DOIT_C7X_EXECUTOR={value!r} is not an executor")
    assert "dask://HOST:PORT" in msg and "dask-local:N" in msg and "\n" not in msg


def test_importing_the_executor_imports_neither_torch_nor_dask():
    code = ("import sys, pipeline.executor; "
            "print(sorted(m for m in ('torch', 'tvm', 'dask', 'distributed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_target_forms():
    assert executor.parse_target("dask-local:3") == ("local", 3)
    assert executor.parse_target(" dask://10.0.0.5:8786 ") == ("remote", "tcp://10.0.0.5:8786")
    assert executor.parse_target("dask://[::1]:8786") == ("remote", "tcp://[::1]:8786")


def test_bad_target_fails_the_task_with_one_line(builds):
    p = builds[0]
    p.add_model("tb", "setA")
    run = p.doit("export:tb", env=dict(DASK, DOIT_C7X_EXECUTOR="dask-local:zero"))
    assert run.returncode == 1
    line = failure_line(run, "export:tb")
    assert line.startswith("export: DOIT_C7X_EXECUTOR='dask-local:zero' is not an executor"), line
    assert "Traceback" not in run.out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_scheduler_at_the_address_fails_in_one_line(builds):
    p = builds[0]
    port = _free_port()
    t0 = time.monotonic()
    p.add_model("tn", "setA")
    run = p.doit("export:tn", env=dict(DASK, DOIT_C7X_EXECUTOR=f"dask://127.0.0.1:{port}",
                                       DOIT_C7X_CONNECT_TIMEOUT="2"))
    assert time.monotonic() - t0 < 60
    assert run.returncode == 1
    line = failure_line(run, "export:tn")
    assert line.startswith(f"export: DOIT_C7X_EXECUTOR: no Dask scheduler answered at tcp://127.0.0.1:{port} "
                           "within 2 s"), line


def test_remote_scheduler_runs_the_stages(builds):
    """``dask://HOST:PORT``: a scheduler and a worker started like on a cluster
    (``dask scheduler`` / ``dask worker``), the worker with the project on its path."""
    p = builds[0]
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(p.root))

    def start(module, *args):
        return subprocess.Popen([sys.executable, "-m", f"distributed.cli.{module}", *args, "--no-dashboard"],
                                env=env, cwd=p.root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    sched = start("dask_scheduler", "--host", "127.0.0.1", "--port", str(port))
    worker = start("dask_worker", f"tcp://127.0.0.1:{port}", "--nthreads", "1")
    try:
        p.add_model("tr", "setA")
        run = p.doit("-n", "2", "-P", "thread", "convert:tr",
                     env=dict(DASK, DOIT_C7X_EXECUTOR=f"dask://127.0.0.1:{port}"))
        assert run.returncode == 0, run.out
        assert run.executed == ["export:tr", "prepare:tr", "calibrate:tr", "convert:tr"]
        assert (p.root / "artifacts" / "tr" / "quantized.pt2").is_file()
    finally:
        for proc in (worker, sched):
            proc.terminate()
            proc.wait(timeout=30)
