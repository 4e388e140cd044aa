"""Atomic file output and content hashing.

Every stage writes its outputs through these helpers, so a stage that fails or
is killed mid-write never leaves a file (or folder) that a later run could take
for a finished artifact: data goes to a temporary name in the same folder and is
moved into place with ``os.replace`` only once complete.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

_TMP_PREFIX = ".tmp-"


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; move it into place on success.

    The caller writes the file at the yielded path (any library's ``save``
    works). On an exception the temporary file is removed and ``target`` is
    left untouched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(target)
    # keep the suffix: some writers (torch.export.save) check it
    fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX + target.name + ".", suffix=target.suffix,
                               dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, 0o666 & ~umask())  # mkstemp makes 0600; artifacts are shared files
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_bytes(target: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``target`` atomically."""
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)


def write_text(target: str | os.PathLike, text: str) -> None:
    """Write UTF-8 ``text`` to ``target`` atomically."""
    write_bytes(target, text.encode("utf-8"))


def write_json(target: str | os.PathLike, obj) -> None:
    """Write ``obj`` as indented, key-sorted JSON (byte-stable for equal input)."""
    write_text(target, json.dumps(obj, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces ``target`` as a whole.

    Used by stages with several output files (codegen, host build): either the
    whole new set is in place or the old one is gone, never a mix that a later
    run would take as complete.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(target)
    tmp = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX + target.name + ".", dir=target.parent))
    try:
        yield tmp
        _normal_modes(tmp)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX + "old.", dir=target.parent))
            os.replace(target, old / target.name)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def umask() -> int:
    """The process's file-creation mask (read without changing it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _normal_modes(folder: Path) -> None:
    """mkdtemp/mkstemp make 0700/0600; give the usual umask modes instead."""
    mask = umask()
    folder.chmod(0o777 & ~mask)
    for p in folder.rglob("*"):
        if p.is_dir():
            p.chmod(0o777 & ~mask)
        elif p.stat().st_mode & 0o777 == 0o600:
            p.chmod(0o666 & ~mask)


def _remove_leftovers(target: Path) -> None:
    """Delete temporaries a killed earlier write of ``target`` left behind."""
    for old in target.parent.glob(f"{_TMP_PREFIX}{target.name}.*"):
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's content."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


_PACKAGES = re.compile(r"(?:/[^\s\"'=]*)?/(?:site|dist)-packages/")


def portable(text: str, root: str | os.PathLike | None = None) -> str:
    """``text`` with the machine's paths taken out, so an artifact holding it is
    the same bytes in a clone of the project at another path (relocatable
    artifacts, ``docs/trust.md``): ``<root>/x`` becomes ``x`` and
    ``.../site-packages/torch/x.py`` becomes ``torch/x.py``. ``root``: the
    project folder (default: the current folder, where doit runs)."""
    base = str(Path(root).resolve() if root else Path.cwd().resolve()).rstrip("/") + "/"
    return _PACKAGES.sub("", text.replace(base, "") if base != "/" else text)


def portable_path(path: str | os.PathLike, root: str | os.PathLike | None = None) -> str:
    """One path as :func:`portable` writes it (a POSIX string)."""
    return portable(Path(path).as_posix(), root)


#: Temporaries a killed run can leave in ``artifacts/``: atomic writes (``.tmp-*``)
#: and the k-fold evaluation's work folders (``.holdout-*``).
LEFTOVER_PREFIXES = (_TMP_PREFIX, ".holdout-")


def sweep_leftovers(artifacts: str | os.PathLike, skip: tuple[str, ...] = (".cache",)) -> int:
    """Remove what killed runs left under ``artifacts`` (:data:`LEFTOVER_PREFIXES`),
    except inside ``skip`` folders (a run-cache has its own). Call it only while
    holding the project lock, when no other run of the project can be writing.
    Returns how many files or folders were removed."""
    removed = 0
    for folder, dirs, files in os.walk(artifacts):
        if Path(folder) == Path(artifacts):
            dirs[:] = [d for d in dirs if d not in skip]
        for name in list(dirs) + files:
            if name.startswith(LEFTOVER_PREFIXES):
                p = Path(folder) / name
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                    dirs.remove(name)
                else:
                    p.unlink(missing_ok=True)
                removed += 1
    return removed
