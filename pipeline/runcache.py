"""The run-cache: stage outputs stored under the digest of the stage's inputs.

DVC's run-cache, for our stages (``docs/architecture.md``, "The run-cache";
threat model in ``docs/trust.md``). After a stage succeeds, its outputs (the
record's ``outs``) are copied into a content-addressed entry; before a stage
runs, an entry for the same inputs restores the outputs (copied: artifacts are
never links into the cache) and the stage does not run. So flipping a model
int8 -> int16 -> int8 rebuilds nothing the second time, and variants whose
upstream inputs are identical share entries.

- **Key** (:func:`stage_key`): SHA-256 of the stage name, its tracked
  parameters (the stamp's config digest: model-entry fields, library
  versions), the MD5 of every input file in the record's order (upstream
  artifacts, images, checkpoint, and the pipeline sources the stage runs),
  the outputs' paths relative to the model folder and, unless the stage's
  outputs never name the model (``Stage.shared``), the model name. No
  absolute path: a clone of the project elsewhere finds the same entries.
- **Entry**: ``<cache>/entries/<key[:2]>/<key>/`` with the files and
  ``entry.json`` (size, SHA-256 and executable bit of each, signed). It is
  built in ``<cache>/tmp/`` and renamed into place, so readers never see half
  an entry and two concurrent writers of one key leave one whole entry.
- **Authentication**: ``entry.json`` carries an HMAC-SHA256 over the key, the
  file list and the metadata, with a secret kept outside the cache folder
  (:func:`load_secret`). Whoever can write to the cache but does not hold the
  secret cannot make an entry we restore: an unsigned or mis-signed entry is
  ignored with one line. A restore copies each file and checks the copy's
  hash against the signed list before moving it into place.
- **Code** (:func:`carries_code`: executables, C sources and headers, linker
  commands, TVMScript modules, ``.pt2`` archives, which hold pickles, web pages
  and archives of any of these) is restored only from entries the user made
  (:func:`owned_by_me`); from anyone else's the stage runs and derives it
  again. A colleague's entries still restore data (JSON records, weights read
  by the weights-only unpickler, ``.bin`` blobs, images): calibration, mixed
  precision, holdout, layers.
- **Corruption**: a file whose hash does not match its signed record removes
  the entry and the stage runs as if it were absent.
- **Anything odd is ignored, never followed** (:func:`_read_regular`): only
  regular files are read (a FIFO, device or link in an entry is not opened
  through), ``entry.json`` is at most :data:`MAX_RECORD_BYTES`, parsed within a
  nesting depth and checked field by field, and a stored file is read no
  further than the size its signed record declares. Whatever is wrong, one line
  names the entry and the stage runs; a broken or unsigned entry under a key is
  replaced by the next good store.
- **Size**: :func:`prune` removes least recently used entries (a restore
  touches ``entry.json``) down to a limit; ``DOIT_C7X_CACHE_MAX`` prunes
  after every store.

``DOIT_C7X_CACHE``: the cache folder (default ``<artifacts>/.cache``; a
shared folder works across projects, checkouts and machines), or ``off``.
``DOIT_C7X_CACHE_SECRET``: the file holding the signing secret (default
``~/.config/doit-c7x/cache-secret``, created on first use, mode 0600); a team
sharing a cache shares this file like any other credential.
Imports neither torch nor tvm.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import stat
import os
import re
import shutil
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from .fsutil import umask

#: ``entry.json`` is a few hundred bytes per output file; a bigger one is not ours
MAX_RECORD_BYTES = 1 << 20
#: nesting of a genuine ``entry.json`` (record -> files -> [size, digest, x] / meta -> values)
MAX_RECORD_DEPTH = 8
_HEX64 = re.compile(r"[0-9a-f]{64}")
FORMAT = 2  # bump when the key or the entry layout changes (2: signed entries, no paths in keys)
CACHE_ENV = "DOIT_C7X_CACHE"
SECRET_ENV = "DOIT_C7X_CACHE_SECRET"
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


_SAID: set[str] = set()


def open_cache(root: Path) -> "RunCache | None":
    """The cache at ``root`` with this user's secret, or None when the secret is unusable
    (:class:`CacheSecretError`: its one line is printed once per process, not once per stage)."""
    try:
        return RunCache(Path(root), load_secret(Path(root)))
    except CacheSecretError as e:
        if str(e) not in _SAID:
            _SAID.add(str(e))
            print(f"run-cache: off: {e}", file=sys.stderr)
        return None


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


class CacheSecretError(Exception):
    """The signing secret cannot be read or made, or sits inside the cache folder."""


def secret_path() -> Path:
    """Where the signing secret is: ``DOIT_C7X_CACHE_SECRET``, else
    ``$XDG_CONFIG_HOME/doit-c7x/cache-secret`` (``~/.config`` by default)."""
    value = os.environ.get(SECRET_ENV, "").strip()
    if value:
        return Path(value).expanduser().resolve()
    config = os.environ.get("XDG_CONFIG_HOME", "").strip() or Path.home() / ".config"
    return (Path(config) / "doit-c7x" / "cache-secret").resolve()


def load_secret(root: Path) -> bytes:
    """The signing secret for the cache at ``root`` (created on first use: 32
    random bytes as hex, mode 0600, when the file is missing).

    Raises :class:`CacheSecretError` (one line) when the file is unreadable,
    empty, inside ``root``, readable or writable by others, or hard-linked
    elsewhere: a secret that cache writers can read signs nothing."""
    path = secret_path()
    root = Path(root).resolve()
    if path == root or root in path.parents:
        raise CacheSecretError(f"the cache secret {path} is inside the cache folder {root}; "
                               f"keep it elsewhere ({SECRET_ENV}=<file outside the cache>)")
    try:
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
        value = path.read_bytes().strip()
    except FileExistsError:  # another process made it meanwhile
        value = path.read_bytes().strip()
    except OSError as e:
        raise CacheSecretError(f"cannot read or create the cache secret {path} ({e.strerror}); "
                               f"set {SECRET_ENV} to a readable file") from None
    if len(value) < 16:
        raise CacheSecretError(f"the cache secret {path} holds fewer than 16 bytes; "
                               f"delete it to have a new one made, or copy your team's secret there")
    _check_secret_file(path)
    return value


def _check_secret_file(path: Path) -> None:
    """Refuse a secret others can read or write (any group / other permission), or one
    with several hard links (a link inside the cache folder would pass the path check)."""
    st = os.stat(path)
    if st.st_mode & 0o066:
        raise CacheSecretError(f"the cache secret {path} can be read or written by others "
                               f"(mode {st.st_mode & 0o777:o}); chmod 600 {path}")
    if st.st_nlink > 1:
        raise CacheSecretError(f"the cache secret {path} has {st.st_nlink} hard links (one inside a cache folder "
                               f"would let its writers read it); keep a single copy of the file")


def stage_key(stage: str, model: str | None, config_digest: str, dep_md5s: list[str],
              outs: list[str]) -> str:
    """The entry key of one stage run (hex SHA-256, module doc). ``model`` is
    None for a stage whose outputs are the same whatever the model is called."""
    doc = {"format": FORMAT, "stage": stage, "model": model, "config": config_digest,
           "deps": dep_md5s, "outs": outs}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _signature(secret: bytes, key: str, files: dict, meta: dict) -> str:
    """HMAC-SHA256 (RFC 2104) of what an entry claims: its key, files and metadata."""
    doc = json.dumps({"key": key, "files": files, "meta": meta}, sort_keys=True).encode()
    return hmac.new(secret, doc, hashlib.sha256).hexdigest()


#: outputs that are code or become code when loaded (module doc, "Code"): by suffix
CODE_SUFFIXES = frozenset({".c", ".h", ".cmd", ".py", ".pt2", ".exe", ".so", ".o", ".a", ".html", ".js",
                           ".gz", ".tar", ".sh", ".mk"})
CODE_NAMES = frozenset({"Makefile"})


def carries_code(rel: str, executable: bool) -> bool:
    """Whether the output ``rel`` (a path relative to the model folder) is code or turns
    into code when a stage or the user loads it (:data:`CODE_SUFFIXES`, :data:`CODE_NAMES`,
    or the executable bit)."""
    p = Path(rel)
    return executable or p.suffix in CODE_SUFFIXES or p.name in CODE_NAMES


def owned_by_me(path: Path, root: Path) -> bool:
    """Whether no other account can have put ``path`` there: the file and every
    folder from ``root`` down to it belong to this user and are not links, and
    the file is writable by no one else. (A group-writable folder is fine: a
    file someone else put in it would be theirs.)"""
    me = os.getuid()
    p = Path(path)
    chain = [p] + [q for q in p.parents if q == root or root in q.parents]
    try:
        stats = [os.lstat(q) for q in chain]
    except OSError:
        return False
    return (all(st.st_uid == me and not stat.S_ISLNK(st.st_mode) for st in stats)
            and not stats[0].st_mode & 0o022)


def _open_regular(path: Path):
    """``path`` opened for reading as a binary file object if it is a regular file reached
    without following a link at its last component; else OSError. Opened non-blocking,
    so a FIFO cannot hang the open, then checked with fstat (what was opened is checked)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    return os.fdopen(fd, "rb")


def _read_regular(path: Path, limit: int) -> bytes:
    """The bytes of the regular file ``path`` (:func:`_open_regular`), at most ``limit``;
    OSError when it is not one or holds more."""
    with _open_regular(path) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(f"{path} holds more than {limit} bytes")
    return data


def _depth(text: str) -> int:
    """Deepest bracket nesting of a JSON text (strings skipped), without parsing it."""
    depth = deepest = 0
    in_str = escaped = False
    for ch in text:
        if in_str:
            escaped, in_str = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def parse_record(raw: bytes) -> dict:
    """A stored ``entry.json`` -> ``{"files": {rel: [size, sha256, executable]}, "meta": dict,
    "hmac": hex}``, each field type-checked. Raises ValueError (one reason) for anything else:
    not UTF-8 JSON, nested deeper than :data:`MAX_RECORD_DEPTH`, a missing or mistyped field."""
    text = raw.decode("utf-8")
    if _depth(text) > MAX_RECORD_DEPTH:
        raise ValueError(f"nested deeper than {MAX_RECORD_DEPTH}")
    rec = json.loads(text)
    files, meta, sig = (rec.get(k) for k in ("files", "meta", "hmac")) if isinstance(rec, dict) else (None,) * 3
    if not isinstance(sig, str) or not _HEX64.fullmatch(sig):
        raise ValueError("no hex hmac")
    if not isinstance(meta, dict) or not isinstance(files, dict) or not files:
        raise ValueError("no files or meta")
    for rel, spec in files.items():
        ok = (isinstance(spec, list) and len(spec) == 3 and type(spec[0]) is int and spec[0] >= 0
              and isinstance(spec[1], str) and _HEX64.fullmatch(spec[1]) and isinstance(spec[2], bool))
        parts = Path(rel).parts
        if not ok or not parts or Path(rel).is_absolute() or ".." in parts:
            raise ValueError(f"a bad file record {rel[:40]!r}")
    return {"files": files, "meta": meta, "hmac": sig}


def _copy_checked(src: Path, dst: Path, size: int, digest: str, executable: bool) -> Path | None:
    """Copy ``src`` to a temporary next to ``dst``; the temporary's path if its
    bytes have ``size`` and ``digest`` (checked on the copy, so a file swapped
    after the check cannot slip in), else None (and no temporary is left).
    Only a regular file is read (:func:`_open_regular`: no FIFO, device or link),
    and never more than ``size`` + 1 bytes."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".tmp-{dst.name}.{uuid.uuid4().hex[:8]}")
    h = hashlib.sha256()
    n = 0
    try:
        with _open_regular(src) as fin, open(tmp, "wb") as fout:
            while n <= size and (block := fin.read(min(1 << 20, size + 1 - n))):
                h.update(block)
                n += len(block)
                fout.write(block)
    except OSError:
        tmp.unlink(missing_ok=True)
        return None
    if n != size or h.hexdigest() != digest:
        tmp.unlink(missing_ok=True)
        return None
    os.chmod(tmp, (0o777 if executable else 0o666) & ~umask())
    return tmp


@dataclass(frozen=True)
class RunCache:
    """A cache folder (module doc) and the secret its entries are signed with.
    Every method is safe with concurrent users."""

    root: Path
    secret: bytes

    def entry(self, key: str) -> Path:
        return self.root / "entries" / key[:2] / key

    def _verified(self, key: str, quiet: bool = False) -> dict | None:
        """The signed record of entry ``key``, or None: missing, unreadable, malformed
        (:func:`parse_record`) or not signed by us, each but the first with one line
        naming the entry (none when ``quiet``)."""
        entry = self.entry(key)
        try:
            rec = parse_record(_read_regular(entry / "entry.json", MAX_RECORD_BYTES))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError, MemoryError) as e:
            if not quiet:
                print(f"run-cache: entry {key[:12]} in {self.root} is unreadable ({str(e)[:120]}); "
                      f"ignoring it", file=sys.stderr)
            return None
        if not hmac.compare_digest(rec["hmac"], _signature(self.secret, key, rec["files"], rec["meta"])):
            if not quiet:
                print(f"run-cache: entry {key[:12]} in {self.root} is not signed with this cache's secret "
                      f"({secret_path()}); ignoring it", file=sys.stderr)
            return None
        return rec

    def restore(self, key: str, base: Path, outs: list[str]) -> bool:
        """Copy the outputs of entry ``key`` to ``base / out`` for each of ``outs``.

        Returns False (and changes nothing) when there is no entry, when it is
        not signed with this cache's secret, when it lists other files, when it
        holds code (:func:`carries_code`) that someone else could have put there
        (:func:`owned_by_me`: a colleague's entry, signed or not), or when a
        file's hash does not match (the entry is then removed)."""
        rec = self._verified(key)
        if rec is None or sorted(rec["files"]) != sorted(outs):
            return False
        entry = self.entry(key)
        code = [rel for rel, (_, _, x) in rec["files"].items() if carries_code(rel, x)]
        if code and not all(owned_by_me(entry / "files" / rel, self.root) for rel in code):
            shown = ", ".join(code[:3]) + (f" and {len(code) - 3} more" if len(code) > 3 else "")
            print(f"run-cache: entry {key[:12]} holds code ({shown}) that you did not store yourself; "
                  f"deriving it here instead", file=sys.stderr)
            return False
        placed: list[tuple[Path, Path]] = []
        for rel, (size, digest, executable) in rec["files"].items():
            tmp = _copy_checked(entry / "files" / rel, base / rel, size, digest, executable)
            if tmp is None:
                for t, _ in placed:
                    t.unlink(missing_ok=True)
                print(f"run-cache: entry {key[:12]} is corrupted ({rel}); ignoring it", file=sys.stderr)
                self._remove(entry)
                return False
            placed.append((tmp, base / rel))
        for tmp, dst in placed:
            os.replace(tmp, dst)
        os.utime(entry / "entry.json")  # least recently used comes first in prune()
        return True

    def store(self, key: str, base: Path, outs: list[str], meta: dict) -> bool:
        """Copy ``base / out`` for each of ``outs`` into a signed entry ``key``.
        Returns False if a good entry is already there (a concurrent writer won); a
        broken or unsigned one under the key is removed first, so it cannot block ours."""
        if os.path.lexists(self.entry(key)):
            if self._verified(key, quiet=True) is not None:
                return False
            self._remove(self.entry(key))
        tmp = self.root / "tmp" / f"{key[:12]}.{uuid.uuid4().hex[:8]}"
        try:
            files = {}
            for rel in outs:
                dst = tmp / "files" / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(base / rel, dst)
                executable = bool(os.stat(base / rel).st_mode & 0o111)
                os.chmod(dst, 0o755 if executable else 0o644)
                files[rel] = [dst.stat().st_size, _sha256(dst), executable]
            rec = {"meta": meta, "files": files, "created": time.time(),
                   "hmac": _signature(self.secret, key, files, meta)}
            (tmp / "entry.json").write_text(json.dumps(rec, indent=1, sort_keys=True))
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
        if trash.is_symlink():   # a planted link: remove the link, never what it points to
            trash.unlink(missing_ok=True)
        else:
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
        """(number of entries, bytes)."""
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
