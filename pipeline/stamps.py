"""Input stamps: each stage's outputs record which inputs made them.

doit writes its dependency database only when it exits, so a run killed after
a stage finished forgets that the stage ran: if the user then undoes the
change that triggered it, doit's record matches the inputs again while the
outputs on disk come from the undone inputs, and doit would call them up to
date. A stamp closes that hole. ``run_stage`` deletes the stage's stamp before
the stage writes anything and writes a new one (content hashes of every
``file_dep`` + the config digest) after it succeeded; :class:`StampCheck`, an
``uptodate`` callable, says "stale" unless the stamp on disk matches the
current inputs. Whatever the moment of a kill, the stamp is either missing or
describes exactly the outputs next to it.

A stamp stores (mtime_ns, size, md5) per file, like doit's own MD5 checker,
so a check hashes only files whose timestamp changed. It records the stage's
outputs the same way: an output edited or replaced by hand (or by anything
but the stage) makes the stage stale, as in DVC and Bazel.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .fsutil import write_json


def config_digest(config: dict) -> str:
    """md5 of the key-sorted JSON of ``config`` (what doit's config_changed uses)."""
    return hashlib.md5(json.dumps(config, sort_keys=True).encode()).hexdigest()


def _md5(path: str) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def invalidate(stamp: str | Path) -> None:
    """Remove a stage's stamp before it writes outputs."""
    Path(stamp).unlink(missing_ok=True)


def file_records(deps: list[str], previous: str | Path | dict | None = None) -> dict[str, list]:
    """``{dep: [mtime_ns, size, md5]}`` of each file; a file whose mtime and size
    match its record in ``previous`` (a stamp file, or records) keeps that md5
    (not re-hashed). Raises OSError for a missing file."""
    old = previous if isinstance(previous, dict) else {}
    if previous is not None and not isinstance(previous, dict):
        try:
            old = json.loads(Path(previous).read_text()).get("files", {})
        except (OSError, ValueError):
            pass
    files = {}
    for dep in deps:
        st = os.stat(dep)
        rec = old.get(dep)
        if rec and rec[0] == st.st_mtime_ns and rec[1] == st.st_size:
            files[dep] = rec
        else:
            files[dep] = [st.st_mtime_ns, st.st_size, _md5(dep)]
    return files


def changed_inputs(deps: list[str], records: dict) -> list[str]:
    """Inputs whose content is no longer what ``records`` (taken when the stage
    started) says: edited, replaced or removed while it ran."""
    out = []
    for dep in deps:
        try:
            now = file_records([dep], previous=records)[dep]
        except OSError:
            out.append(dep)
            continue
        if now[2] != records[dep][2]:
            out.append(dep)
    return out


def write_stamp(stamp: str | Path, digest: str, deps: list[str], records: dict | None = None,
                outs: list[str] = ()) -> None:
    """Record the inputs and outputs of a stage that just succeeded (atomic).
    ``records``: :func:`file_records` of ``deps`` taken before the stage ran;
    ``outs``: its output files (hashed now)."""
    records = records or file_records(deps)
    write_json(stamp, {"config": digest, "files": {d: records[d] for d in sorted(deps)},
                       "outs": file_records(sorted(outs))})


def _matches(rec: dict, names) -> bool:
    """Whether every file in ``rec`` still has its recorded size and content."""
    if set(rec) != set(names):
        return False
    for dep, (mtime, size, md5) in rec.items():
        try:
            st = os.stat(dep)
        except OSError:
            return False
        if st.st_size != size:
            return False
        if st.st_mtime_ns != mtime and _md5(dep) != md5:
            return False
    return True


class StampCheck:
    """doit ``uptodate`` callable: True only if the stamp matches the task's
    current ``file_dep`` contents, config digest and ``targets`` contents."""

    def __init__(self, stamp: str | Path, digest: str):
        self.stamp = Path(stamp)
        self.digest = digest

    def __call__(self, task, values) -> bool:
        try:
            rec = json.loads(self.stamp.read_text())
        except (OSError, ValueError):
            return False
        if rec.get("config") != self.digest:
            return False
        return _matches(rec.get("files", {}), task.file_dep) and _matches(rec.get("outs", {}), task.targets)

    def __repr__(self) -> str:
        return f"StampCheck({self.stamp.name})"
