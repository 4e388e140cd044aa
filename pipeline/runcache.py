"""The run-cache: stage outputs stored under the digest of the stage's inputs.

DVC's run-cache, for our stages (``docs/architecture.md``, "The run-cache").
After a stage succeeds, its outputs (the record's ``outs``) are stored in a
content-addressed entry; before a stage runs, an entry for the same inputs
restores the outputs (hard link, else copy) and the stage does not run. So
flipping a model int8 -> int16 -> int8 rebuilds nothing the second time, and
variants whose upstream inputs are identical share entries.

- **Key** (:func:`stage_key`): SHA-256 of the stage name, its tracked
  parameters (the stamp's config digest: model-entry fields, library
  versions), the MD5 of every input file in the record's order (upstream
  artifacts, images, checkpoint, and the pipeline sources the stage runs),
  the outputs' paths relative to the model folder, the project and artifacts
  folders (outputs hold absolute paths, so projects share entries when they
  sit at the same path, e.g. on a shared filesystem) and, unless the stage's
  outputs never name the model (``Stage.shared``), the model name.
- **Entry**: ``<cache>/entries/<key[:2]>/<key>/`` with the files and
  ``entry.json`` (size and SHA-256 of each). It is built in ``<cache>/tmp/``
  and renamed into place, so readers never see half an entry and two
  concurrent writers of one key leave one whole entry.
- **Corruption**: a restore re-hashes every file; an entry that does not
  match is removed and the stage runs as if it were absent.
- **Size**: :func:`prune` removes least recently used entries (a restore
  touches ``entry.json``) down to a limit; ``DOIT_C7X_CACHE_MAX`` prunes
  after every store.

``DOIT_C7X_CACHE``: the cache folder (default ``<artifacts>/.cache``; a
shared folder works across projects and machines), or ``off``.
Imports neither torch nor tvm.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

FORMAT = 1  # bump when the key or the entry layout changes
CACHE_ENV = "DOIT_C7X_CACHE"
MAX_ENV = "DOIT_C7X_CACHE_MAX"
DEFAULT_MAX = "20G"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def cache_root(artifacts: Path) -> Path | None:
    """The cache folder for a project whose artifacts are in ``artifacts``
    (None when ``DOIT_C7X_CACHE=off``). A relative value is relative to the
    current folder, made absolute here."""
    value = os.environ.get(CACHE_ENV, "").strip()
    if value.lower() in ("off", "0", "false", "no"):
        return None
    return Path(value).resolve() if value else Path(artifacts) / ".cache"


def parse_size(text: str) -> int:
    """Bytes of a size such as ``500M``, ``20G`` or ``1048576`` (binary units).

    Raises ValueError with one line for anything else."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"{text!r} is not a size (examples: 500M, 20G, 1048576)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def max_bytes() -> int:
    """The size limit of ``DOIT_C7X_CACHE_MAX`` (default 20G); raises ValueError."""
    return parse_size(os.environ.get(MAX_ENV, "").strip() or DEFAULT_MAX)


def stage_key(stage: str, model: str | None, config_digest: str, dep_md5s: list[str],
              outs: list[str], where: list[str] = ()) -> str:
    """The entry key of one stage run (hex SHA-256, module doc). ``model`` is
    None for a stage whose outputs are the same whatever the model is called;
    ``where``: the project and artifacts folders (outputs hold absolute paths)."""
    doc = {"format": FORMAT, "stage": stage, "model": model, "config": config_digest,
           "deps": dep_md5s, "outs": outs, "where": list(where)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _place(src: Path, dst: Path) -> None:
    """Hard-link (else copy) ``src`` to ``dst``, atomically replacing ``dst``."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        if os.path.samefile(src, dst):
            return  # already this entry's file (rename() of two links to one file does nothing)
    except OSError:
        pass  # no dst yet
    tmp = dst.with_name(f".{dst.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        os.link(src, tmp)
    except OSError:  # another filesystem, or links not allowed
        shutil.copy2(src, tmp)
    os.replace(tmp, dst)


@dataclass(frozen=True)
class RunCache:
    """A cache folder (module doc). Every method is safe with concurrent users."""

    root: Path

    def entry(self, key: str) -> Path:
        return self.root / "entries" / key[:2] / key

    def restore(self, key: str, base: Path, outs: list[str]) -> bool:
        """Put the outputs of entry ``key`` at ``base / out`` for each of ``outs``.

        Returns False (and changes nothing) when there is no entry, when it
        lists other files, or when a file's hash does not match (the entry is
        then removed: a corrupted entry is never trusted)."""
        entry = self.entry(key)
        try:
            files = json.loads((entry / "entry.json").read_text())["files"]
        except (OSError, ValueError, KeyError):
            return False
        if sorted(files) != sorted(outs):
            return False
        for rel, (size, digest) in files.items():
            f = entry / "files" / rel
            try:
                ok = f.stat().st_size == size and _sha256(f) == digest
            except OSError:
                ok = False
            if not ok:
                print(f"run-cache: entry {key[:12]} is corrupted ({rel}); ignoring it", file=sys.stderr)
                self._remove(entry)
                return False
        for rel in outs:
            _place(entry / "files" / rel, base / rel)
        os.utime(entry / "entry.json")  # least recently used comes first in prune()
        return True

    def store(self, key: str, base: Path, outs: list[str], meta: dict) -> bool:
        """Store ``base / out`` for each of ``outs`` as entry ``key``. Returns
        False if an entry is already there (a concurrent writer won)."""
        if (self.entry(key) / "entry.json").is_file():
            return False
        tmp = self.root / "tmp" / f"{key[:12]}.{uuid.uuid4().hex[:8]}"
        try:
            files = {}
            for rel in outs:
                _place(base / rel, tmp / "files" / rel)
                files[rel] = [(tmp / "files" / rel).stat().st_size, _sha256(tmp / "files" / rel)]
            (tmp / "entry.json").write_text(json.dumps({**meta, "files": files, "created": time.time()},
                                                       indent=1, sort_keys=True))
            self.entry(key).parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(tmp, self.entry(key))  # atomic; fails if another writer got there first
            except OSError:
                return False
            return True
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _remove(self, entry: Path) -> None:
        # rename first so a concurrent reader never sees a half-deleted entry
        trash = self.root / "tmp" / f"trash.{uuid.uuid4().hex[:8]}"
        try:
            trash.parent.mkdir(parents=True, exist_ok=True)
            os.rename(entry, trash)
        except OSError:
            return
        shutil.rmtree(trash, ignore_errors=True)

    def entries(self) -> list[tuple[Path, float, int]]:
        """(entry folder, last use as a Unix time, bytes) of every entry."""
        out = []
        for info in self.root.glob("entries/*/*/entry.json"):
            try:
                st = info.stat()
                size = sum(f.stat().st_size for f in info.parent.rglob("*") if f.is_file())
            except OSError:
                continue  # removed meanwhile
            out.append((info.parent, st.st_mtime, size))
        return out

    def size(self) -> tuple[int, int]:
        """(number of entries, bytes). Bytes count hard-linked files in full."""
        es = self.entries()
        return len(es), sum(s for _, _, s in es)

    def prune(self, limit: int) -> tuple[int, int]:
        """Remove least recently used entries until the cache holds at most
        ``limit`` bytes. Returns (entries removed, bytes freed)."""
        es = sorted(self.entries(), key=lambda e: e[1])
        total = sum(s for _, _, s in es)
        removed = freed = 0
        for entry, _, size in es:
            if total <= limit:
                break
            self._remove(entry)
            total -= size
            removed += 1
            freed += size
        return removed, freed


def human(n: int) -> str:
    """``n`` bytes as e.g. ``1.5 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
