"""The pipeline sources a stage runs, derived from its imports (no hand-kept list).

A stage's code dependencies are the import closure of its function's module
inside the ``pipeline`` package, plus the data files those modules read
(``DATA_FILES`` in each module). Editing any of them re-runs the stage; editing
anything else does not. Computed from the source text without importing it
(loading the task list imports neither torch nor tvm):

- **Imports** are found by a regular expression over each file: every
  ``from <.relative|pipeline.x> import a, b`` and ``import pipeline.x``
  statement, at any indentation (imports inside functions count), after the
  triple-quoted strings are cut out: a docstring's usage example (such as
  ``pipeline/__init__.py``'s ``from pipeline.tasks import ...``) would
  otherwise make every stage depend on the whole task layer. Other text that
  only looks like an import adds a dependency, never hides one: the closure
  can be too large, not too small.
  ``tests/stages/test_code_deps.py`` runs every stage and checks that each
  ``pipeline`` module it loaded is in its closure.
- **Packages**: importing ``pipeline.a.b`` runs ``pipeline/__init__.py`` and
  ``pipeline/a/__init__.py`` too, so they are in the closure.
- **Data files**: a module that reads files of the package declares them as
  ``DATA_FILES = ("kernels/*.c", ...)``, glob patterns relative to its own
  folder (a literal tuple on one logical line, read with ``ast.literal_eval``).
  A test checks that every non-Python file of the package is declared.
- **Kept between runs**: ``doit list`` and every ``doit`` compute the closures of
  every stage; they are stored in the user's cache folder
  (``$XDG_CACHE_HOME/doit-c7x/``, :func:`_store`) under a SHA-256 of the
  package's file list and of every ``.py`` file's bytes, so any edit, added or
  removed file makes them be computed again (a file that cannot be written or
  read is ignored: the closures are then computed as before). It holds paths
  only, nothing that runs.
Stdlib only (and the atomic write of :mod:`pipeline.fsutil`).
"""

from __future__ import annotations

import ast
import functools
import glob
import hashlib
import json
import os
import re
from pathlib import Path

from .fsutil import write_text

PKG = Path(__file__).resolve().parent  # the pipeline package folder

# One pass over the text: a triple-quoted string is matched (and skipped) as a whole, so an
# import-like line inside a docstring is no import; everything else is an import statement.
_IMPORT = re.compile(
    r'"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\''
    r"|^[ \t]*(?:from[ \t]+(?P<base>\.+[\w.]*|pipeline(?:\.\w+)*)[ \t]+import[ \t]+(?P<names>\([^)]*\)|[^\n#]*)"
    r"|import[ \t]+(?P<abs>pipeline(?:\.\w+)*))", re.M)
_ALIAS = re.compile(r"\bas\s+\w+")
_WORD = re.compile(r"\w+")
_DATA = re.compile(r"^DATA_FILES[ \t]*(?::[^=]*)?=[ \t]*(\([^)]*\))", re.M)


@functools.lru_cache(maxsize=1)
def _modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> file (one walk of the folder; plain
    strings while walking: ``doit list`` runs this, and pathlib is slow)."""
    out = {}
    root = str(PKG)
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        rel = os.path.relpath(folder, root)
        parts = ("pipeline",) + (() if rel == "." else tuple(rel.split(os.sep)))
        for name in names:
            if name.endswith(".py"):
                stem = name[:-3]
                out[".".join(parts if stem == "__init__" else parts + (stem,))] = Path(folder, name)
    return out


@functools.lru_cache(maxsize=None)
def _source(module: str) -> str:
    """The text of ``module``'s file (read once per process)."""
    return module_file(module).read_text()


def module_file(module: str) -> Path | None:
    """``pipeline/a/b.py`` or ``pipeline/a/b/__init__.py`` of module ``pipeline.a.b`` (None if neither)."""
    return _modules().get(module)


def _package_of(module: str, path: Path) -> str:
    """The package relative imports of ``module`` (at ``path``) resolve against."""
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


@functools.lru_cache(maxsize=None)
def imports(module: str) -> frozenset[str]:
    """``pipeline`` modules (existing ones) that ``module``'s source imports."""
    path = module_file(module)
    if path is None:
        return frozenset()
    out = set()
    for m in _IMPORT.finditer(_source(module)):
        if m["abs"] is None and m["base"] is None:
            continue   # a triple-quoted string
        if m["abs"]:
            out.add(m["abs"])
            continue
        base = m["base"]
        if base.startswith("."):
            level = len(base) - len(base.lstrip("."))
            pkg = _package_of(module, path).split(".")
            stem = pkg[:len(pkg) - level + 1]
            base = ".".join(stem + ([base.lstrip(".")] if base.lstrip(".") else []))
        out.add(base)
        for name in _WORD.findall(_ALIAS.sub("", m["names"])):
            out.add(f"{base}.{name}")  # `from pkg import submodule`; non-modules are dropped below
    return frozenset(o for o in out if o.startswith("pipeline") and module_file(o) is not None)


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


@functools.lru_cache(maxsize=None)
def data_files(module: str) -> tuple[Path, ...]:
    """Files matching the module's ``DATA_FILES`` patterns (relative to its folder)."""
    path = module_file(module)
    text = _source(module) if path else ""
    m = _DATA.search(text) if "DATA_FILES" in text else None
    if not m:
        return ()
    out = []
    for pattern in ast.literal_eval(m.group(1)):   # the package folder is resolved: normpath suffices
        out += [Path(os.path.normpath(p)) for p in sorted(glob.glob(os.path.join(path.parent, pattern)))
                if os.path.isfile(p)]
    return tuple(out)


@functools.lru_cache(maxsize=None)
def closure(module: str) -> tuple[Path, ...]:
    """Every source and data file ``module`` runs: its import closure inside
    ``pipeline`` (with the packages' ``__init__.py``) and their data files, sorted
    (kept between runs: :func:`_store`)."""
    stored = _store()
    if module in stored["closures"]:
        return tuple(Path(p) for p in stored["closures"][module])
    found = _closure(module)
    stored["closures"][module] = [str(p) for p in found]
    _save(stored)
    return found


def _closure(module: str) -> tuple[Path, ...]:
    seen: set[str] = set()
    todo = [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo += [n for n in imports(m) | set(_parents(m)) if n not in seen]
    files = {module_file(m) for m in seen} - {None}
    for m in seen:
        files.update(data_files(m))
    return tuple(sorted(files, key=str))


def _digest() -> str:
    """SHA-256 of the package's file list and of every ``.py`` file's bytes."""
    h = hashlib.sha256(str(PKG).encode())
    for folder, dirs, names in sorted(os.walk(PKG)):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in sorted(names):
            path = os.path.join(folder, name)
            h.update(b"\0" + os.path.relpath(path, PKG).encode() + b"\0")
            if name.endswith(".py"):
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()


def _store_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "doit-c7x", f"code_deps-{hashlib.sha256(str(PKG).encode()).hexdigest()[:16]}.json")


@functools.lru_cache(maxsize=1)
def _store() -> dict:
    """The closures computed for this exact package before (``{"digest", "closures"}``),
    or an empty store when there are none, or they are of other sources or unreadable."""
    digest = _digest()
    try:
        stored = json.loads(_store_path().read_text())
        if stored.get("digest") == digest and isinstance(stored.get("closures"), dict) and all(
                isinstance(v, list) and all(isinstance(p, str) for p in v) for v in stored["closures"].values()):
            return stored
    except (OSError, ValueError):
        pass
    return {"digest": digest, "closures": {}}


def _save(stored: dict) -> None:
    """Write the store atomically; a folder that cannot be written is ignored."""
    try:
        write_text(_store_path(), json.dumps(stored))
    except OSError:
        pass
