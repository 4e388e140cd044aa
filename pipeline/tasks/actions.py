"""doit actions: module-level functions with plain-data arguments.

They are picklable, so ``doit -n`` with processes works everywhere, and they
import a stage's module only when its task runs. A user-facing error
(:class:`~pipeline.errors.PipelineError`) becomes a one-line task failure; any
other exception also fails in one line, with its traceback kept in
``artifacts/<model>/logs/<stage>.traceback.txt``.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

from doit.exceptions import TaskFailed

from .. import executor, runcache, stamps  # executor: stdlib only until a stage runs
from ..errors import PipelineError


def run_stage(stage: str, model: str, args: dict, stamp: dict | None = None, log: str | None = None,
              cache: dict | None = None):
    """doit action: run ``stage``'s function with keyword ``args`` for ``model``.

    ``stamp`` ({"path", "digest", "deps", "outs"}): the stage's input stamp is
    removed first and rewritten after success (see :mod:`pipeline.stamps`).
    ``cache`` ({"root", "base", "outs", "shared"}): the run-cache
    (:mod:`pipeline.runcache`); an entry for these inputs restores the outputs
    instead of running the stage, and a successful run is stored, unless an
    input changed while the stage ran (its outputs then match no key). ``log``:
    where an unexpected exception's traceback goes. Returns a
    :class:`doit.exceptions.TaskFailed` with one line, or on success
    ``{"run_cache": "restored" | "stored" | "off"}`` (doit keeps it as the
    task's values; the reporter names the restored stages).
    """
    records = stamps.file_records(stamp["deps"], previous=stamp["path"]) if stamp else None
    if stamp:
        stamps.invalidate(stamp["path"])
    key = _cache_key(stage, model, stamp, records, cache)
    if key and _restore(cache, key):
        stamps.write_stamp(stamp["path"], stamp["digest"], stamp["deps"], records, stamp.get("outs", ()))
        return {"run_cache": "restored"}
    try:
        _execute(stage, model, args)
    except PipelineError as e:
        return TaskFailed(f"{stage}: {e}")
    except Exception as e:  # a bug, or bad input we do not recognise yet: keep the traceback
        where = _save_traceback(Path(log) if log else Path(f"{stage}.traceback.txt"))
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        return TaskFailed(f"{stage}: model {model!r}: unexpected {type(e).__name__}: {first} "
                          f"(traceback in {where}; please report it)")
    if stamp:
        changed = stamps.changed_inputs(stamp["deps"], records)
        if changed:  # another process edited an input meanwhile: outputs match neither state
            return TaskFailed(f"{stage}: model {model!r}: {changed[0]} changed while the stage ran; "
                              f"run doit again to rebuild from the current inputs")
        stamps.write_stamp(stamp["path"], stamp["digest"], stamp["deps"], records, stamp.get("outs", ()))
    return {"run_cache": _store(cache, key, stage, model) if key else "off"}


def _cache_key(stage, model, stamp, records, cache) -> str | None:
    if not (cache and cache.get("root") and stamp):
        return None
    return runcache.stage_key(stage, None if cache["shared"] else model, stamp["digest"],
                              [records[d][2] for d in stamp["deps"]], cache["outs"])


def _open_cache(cache: dict) -> runcache.RunCache | None:
    """The run-cache with its secret, or None (one line, once) when the secret is unusable."""
    return runcache.open_cache(Path(cache["root"]))


def _restore(cache: dict, key: str) -> bool:
    rc = _open_cache(cache)
    try:
        return bool(rc) and rc.restore(key, Path(cache["base"]), cache["outs"])
    except OSError as e:  # an unreadable cache never fails a build: the stage runs
        print(f"run-cache: cannot restore from {cache['root']}: {e}", file=sys.stderr)
        return False


def _store(cache: dict, key: str, stage: str, model: str) -> str:
    rc = _open_cache(cache)
    if rc is None:
        return "off"
    try:
        rc.store(key, Path(cache["base"]), cache["outs"], {"stage": stage, "model": model})
        if cache.get("max_bytes"):
            rc.prune(cache["max_bytes"])
    except OSError as e:  # a full or read-only cache never fails a build
        print(f"run-cache: cannot store in {cache['root']}: {e}", file=sys.stderr)
        return "off"
    return "stored"


def _execute(stage: str, model: str, args: dict) -> None:
    """Run the stage function here, or on a Dask worker when ``DOIT_C7X_EXECUTOR``
    is set (:mod:`pipeline.executor`; doit and the stamps stay in this process)."""
    target = os.environ.get(executor.VAR, "").strip()
    if target:
        executor.run_on_executor(target, stage, model, args)
    else:
        from ..stages import registry
        registry.get(stage).function()(**args)


def _save_traceback(log: Path) -> Path:
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(traceback.format_exc())
    return log


def fail_config(message: str):
    """doit action of an invalid model entry: fail with the validation message."""
    return TaskFailed(message)


def run_summary(payload: dict):
    """doit action of the summary task (see :mod:`pipeline.stages.summary`)."""
    from ..stages import summary
    try:
        summary.summarize(payload)
    except PipelineError as e:
        return TaskFailed(f"summary: {e}")
    return None


def run_cache_command(root: str | None, max_size: str = ""):
    """doit action of the ``cache`` task: print the run-cache's size; with
    ``max_size`` (e.g. ``5G``) first prune it to that size, least recently used first."""
    if root is None:
        print(f"run-cache: off ({runcache.CACHE_ENV}=off)")
        return None
    rc = runcache.RunCache(Path(root), b"")  # size and prune read no signature
    if max_size:
        try:
            limit = runcache.parse_size(max_size)
        except ValueError as e:
            return TaskFailed(f"cache: --max-size: {e}")
        removed, freed = rc.prune(limit)
        print(f"run-cache: pruned {removed} entries ({runcache.human(freed)}) to stay under {runcache.human(limit)}")
    n, size = rc.size()
    print(f"run-cache: {root}: {n} entries, {runcache.human(size)} "
          f"(limit {os.environ.get(runcache.MAX_ENV) or runcache.DEFAULT_MAX}, pruned after every store)")
    return None
