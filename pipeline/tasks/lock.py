"""One build at a time per project: an advisory lock on ``artifacts/.lock``.

Two ``doit`` runs of one project at once would interleave their writes (one
run's outputs under the other's stamps), so every command that builds or
deletes takes the lock when the task list loads, before doit reads its
dependency database, and holds it until the process exits (``flock``: the
kernel drops it when a run is killed, so a stale lock never blocks anyone).
Read-only commands (``list``, ``info``, ``help``, ``dumpdb``) take none.

A second run waits with one line naming the holder; with
``DOIT_C7X_NO_WAIT=1`` it refuses instead (doit parses its own options
before a dodo file loads, so the switch is a variable, not ``--no-wait``).
As in DVC (``.dvc/tmp/rwlock``) and Bazel (the output base lock). Stdlib only.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path

LOCK_NAME = ".lock"
NO_WAIT_ENV = "DOIT_C7X_NO_WAIT"
READ_ONLY = frozenset({"list", "info", "help", "dumpdb", "tabcompletion"})

_held: dict[str, int] = {}  # lock path -> open descriptor (kept for the life of the process)


def doit_command(argv: list[str]) -> str | None:
    """The doit command of this process (``run`` for ``doit`` or ``doit <tasks>``),
    or None when the process is not doit (e.g. a test that loads a project)."""
    prog = Path(argv[0]) if argv else Path()
    if not (prog.name == "doit" or prog.parts[-2:] == ("doit", "__main__.py")):
        return None
    from doit.doit_cmd import DoitMain
    commands = {c.get_name() for c in DoitMain.DOIT_CMDS}
    words = [a for a in argv[1:] if not a.startswith("-")]
    return words[0] if words and words[0] in commands else "run"


def needs_lock(argv: list[str]) -> bool:
    """Whether this process is a doit command that may write the project."""
    command = doit_command(argv)
    return command is not None and command not in READ_ONLY


def acquire(artifacts: Path, wait: bool | None = None) -> None:
    """Hold the project lock of ``artifacts`` until this process exits.

    ``wait`` None reads ``DOIT_C7X_NO_WAIT``. Waits (one line on stderr) while
    another process holds it; raises :class:`SystemExit` with one line when
    ``wait`` is False. Idempotent within a process."""
    path = Path(artifacts) / LOCK_NAME
    if str(path) in _held:
        return
    if wait is None:
        wait = os.environ.get(NO_WAIT_ENV, "").strip().lower() in ("", "0", "false", "no")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        if not wait:
            os.close(fd)
            raise SystemExit(f"doit-c7x: another doit run ({holder}) is building this project "
                             f"({path}); try again when it ends, or unset {NO_WAIT_ENV} to wait") from None
        print(f"doit-c7x: waiting for another doit run ({holder}) to finish with this project ({path})",
              file=sys.stderr, flush=True)
        fcntl.flock(fd, fcntl.LOCK_EX)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}, since {time.strftime('%H:%M:%S')}\n".encode(), 0)
    _held[str(path)] = fd


def other_holder(artifacts: Path) -> str | None:
    """Who holds the project lock of ``artifacts`` when another process does ("pid N, since
    HH:MM:SS"), else None. Takes nothing: the lock is tried and released at once."""
    path = Path(artifacts) / LOCK_NAME
    if str(path) in _held or not path.is_file():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(fd)
    finally:
        os.close(fd)   # closing drops a lock this call took
    return None


def _holder(fd: int) -> str:
    try:
        return os.pread(fd, 200, 0).decode(errors="replace").strip() or "pid unknown"
    except OSError:
        return "pid unknown"
