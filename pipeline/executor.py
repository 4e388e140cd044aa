"""Run a stage's function on a Dask cluster instead of in the doit process.

``DOIT_C7X_EXECUTOR`` picks the cluster (read by
:func:`pipeline.tasks.actions._execute`, which imports this module only when a
task runs, so loading the task list never imports dask):

- ``dask://HOST:PORT``: an existing ``dask.distributed`` scheduler at
  ``tcp://HOST:PORT``;
- ``dask-local:N``: a ``LocalCluster`` of N worker processes on this machine
  (loopback 127.0.0.1, one task at a time per worker, no dashboard), started on
  the first stage and closed when doit exits.

doit, its database and the input stamps stay in the head process; only the
stage function ``registry.get(stage).function()(**args)`` runs on a worker, so
the workers must see the same files at the same absolute paths (a shared
filesystem) and import the same ``pipeline`` from the same Python environment.
Run ``doit -n K -P thread``: every doit thread blocks on its own stage's
future, and they share one ``Client`` (thread-safe) per head process.

Failures: a stage's own exceptions come back unchanged (``PipelineError``
subclasses pickle by their message), so ``run_stage`` prints its usual line. A
killed worker or a lost connection becomes one :class:`ExecutorError` line; the
LocalCluster's scheduler allows 0 failures (``allowed_failures``), so a killed
worker fails the task instead of silently re-running it. ``run_stage`` removed
the stage's stamp before and writes it only after success, and stages write
their outputs atomically, so the next ``doit`` re-runs that stage.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import re
import threading
import uuid

from .errors import ExecutorError, brief

VAR = "DOIT_C7X_EXECUTOR"
FORMS = "dask://HOST:PORT (an existing scheduler) or dask-local:N (N local worker processes)"
TIMEOUT_VAR = "DOIT_C7X_CONNECT_TIMEOUT"
CONNECT_TIMEOUT_S = 20  # default: a scheduler that does not answer within this fails the stage in one line

_PRE_SPAWN = "distributed.nanny.pre-spawn-environ"
_REMOTE = re.compile(r"dask://(?P<host>[^:/\s]+|\[[0-9a-fA-F:]+\]):(?P<port>\d{1,5})")
_LOCAL = re.compile(r"dask-local:(?P<n>\d+)")

_lock = threading.Lock()
_clients: dict[str, object] = {}  # target -> distributed.Client
_clusters: list = []               # LocalClusters this process started


def parse_target(target: str) -> tuple[str, str | int]:
    """``("remote", "tcp://HOST:PORT")`` or ``("local", N)`` for a ``DOIT_C7X_EXECUTOR``
    value; :class:`ExecutorError` naming the variable, the value and the two forms otherwise."""
    t = target.strip()
    if m := _REMOTE.fullmatch(t):
        if 0 < int(m["port"]) < 65536:
            return "remote", f"tcp://{m['host']}:{int(m['port'])}"
    elif (m := _LOCAL.fullmatch(t)) and int(m["n"]) >= 1:
        return "local", int(m["n"])
    raise ExecutorError(f"{VAR}={target!r} is not an executor: use {FORMS}, or unset it to run stages here")


def _work(stage: str, args: dict) -> None:
    """Runs on the worker: the stage function, exactly as a local run calls it."""
    from .stages import registry
    registry.get(stage).function()(**args)


def run_on_executor(target: str, stage: str, model: str, args: dict) -> None:
    """Run ``stage``'s function with keyword ``args`` on the executor ``target`` and
    wait for it (thread-safe; called from doit's threads).

    Raises the stage's own exception unchanged, or :class:`ExecutorError` (one line)
    when the target is invalid, the cluster cannot be reached or started, the
    worker died, or the connection was lost.
    """
    client = _client(target)
    what = f"model {model!r}"
    try:
        future = client.submit(_work, stage, args, key=f"{stage}:{model}-{uuid.uuid4().hex[:8]}",
                               pure=False, retries=0)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # closed client, lost scheduler
        raise ExecutorError(f"{what}: could not submit to the Dask executor {target} "
                            f"({brief(e)}); nothing ran, run doit again") from None
    try:
        future.result()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:
        raise _translate(e, future.status, what, target) from None


def _translate(e: BaseException, status: str, what: str, target: str) -> BaseException:
    """The exception ``run_stage`` sees for a failed future."""
    from distributed import KilledWorker
    if isinstance(e, KilledWorker):
        happened = "the Dask worker running it died (killed, or out of memory)"
    elif status == "error" and isinstance(e, Exception):
        return e  # the stage's own exception, as a local run would raise it
    else:  # CommClosedError, OSError, TimeoutError, CancelledError: the head lost the cluster
        happened = f"the connection to the Dask executor {target} was lost ({brief(e)})"
    return ExecutorError(f"{what}: {happened}; nothing it wrote is trusted, run doit again to re-run it")


def _client(target: str):
    """The one Client of this process for ``target`` (started on first use)."""
    with _lock:
        if target not in _clients:
            kind, where = parse_target(target)
            _clients[target] = _start_local(where) if kind == "local" else _connect(where)
        return _clients[target]


def connect_timeout() -> float:
    """Seconds to wait for a remote scheduler: ``DOIT_C7X_CONNECT_TIMEOUT`` or 20."""
    raw = os.environ.get(TIMEOUT_VAR, "").strip()
    try:
        value = float(raw) if raw else CONNECT_TIMEOUT_S
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ExecutorError(f"{TIMEOUT_VAR}={raw!r} is not a number of seconds > 0")
    return value


def _connect(address: str):
    from distributed import Client
    timeout = connect_timeout()
    try:
        return Client(address, timeout=timeout, set_as_default=False)
    except (OSError, TimeoutError) as e:
        raise ExecutorError(f"{VAR}: no Dask scheduler answered at {address} within {timeout:g} s "
                            f"({brief(e)}); start one (dask scheduler --port PORT) or fix the address") from None


def _start_local(n: int):
    if multiprocessing.parent_process() is not None:
        # doit -n K without -P thread forks K processes: each would start its own cluster.
        raise ExecutorError(f"{VAR}=dask-local:{n} needs doit's thread pool: run doit -n K -P thread")
    import dask
    from distributed import Client, LocalCluster
    try:
        # Workers inherit this process's environment, C7X_TORCH_THREADS included
        # (pipeline/torchenv.py), so a stage runs with the thread count a local run
        # uses: torch's float rounding depends on it (a 1-thread worker changed the
        # calibrated.pt of MobileNetV2 int16 minmax), and the artifacts must not.
        # Dask's default would set OMP_NUM_THREADS=1 etc. in the workers; keep only
        # its memory-trim setting.
        with dask.config.set({_PRE_SPAWN: {"MALLOC_TRIM_THRESHOLD_": 65536}}):
            cluster = LocalCluster(
                n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                dashboard_address=None, scheduler_kwargs={"allowed_failures": 0},
                # like a local `doit -n K`: no per-worker memory cap that would kill a big stage
                memory_limit=0, silence_logs=logging.CRITICAL)  # failures reach doit as one line each
    except Exception as e:
        raise ExecutorError(f"{VAR}=dask-local:{n}: the local Dask cluster did not start "
                            f"({brief(e)})") from None
    _clusters.append(cluster)
    if len(_clusters) == 1:
        atexit.register(_shutdown)
    return Client(cluster, set_as_default=False)


def _shutdown() -> None:
    """Close the clients, then the local clusters (at exit of the head process)."""
    with _lock:
        for client in _clients.values():
            try:
                client.close()
            except Exception:  # exiting anyway; a half-closed client must not hide doit's result
                pass
        _clients.clear()
        for cluster in _clusters:
            try:
                cluster.close()
            except Exception:
                pass
        _clusters.clear()
