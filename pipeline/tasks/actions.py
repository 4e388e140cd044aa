"""doit actions: module-level functions with plain-data arguments.

They are picklable, so ``doit -n`` with processes works everywhere, and they
import a stage's module only when its task runs. A user-facing error
(:class:`~pipeline.errors.PipelineError`) becomes a one-line task failure; any
other exception also fails in one line, with its traceback kept in
``artifacts/<model>/logs/<stage>.traceback.txt``.
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path

from doit.exceptions import TaskFailed

from .. import stamps
from ..errors import PipelineError


def run_stage(stage: str, model: str, args: dict, stamp: dict | None = None, log: str | None = None):
    """doit action: run ``stage``'s function with keyword ``args`` for ``model``.

    ``stamp`` ({"path", "digest", "deps"}): the stage's input stamp is removed
    first and rewritten after success (see :mod:`pipeline.stamps`). ``log``:
    where an unexpected exception's traceback goes. Returns None on success or
    a :class:`doit.exceptions.TaskFailed` with one line.
    """
    if stamp:
        stamps.invalidate(stamp["path"])
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
        stamps.write_stamp(stamp["path"], stamp["digest"], stamp["deps"])
    return None


def _execute(stage: str, model: str, args: dict) -> None:
    """Run the stage function here, or on a Dask worker when ``DOIT_C7X_EXECUTOR``
    is set (:mod:`pipeline.executor`; doit and the stamps stay in this process)."""
    target = os.environ.get("DOIT_C7X_EXECUTOR", "").strip()
    if target:
        from ..executor import run_on_executor
        run_on_executor(target, stage, model, args)
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
