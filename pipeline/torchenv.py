"""Set up torch/torchao the same way for every stage: quiet and deterministic.

:func:`setup` is the one set-up call: ``Stage.function()`` makes it before it
imports a stage module whose code uses this module (so before torch is
imported), tests make it in ``conftest.py``, scripts before their first stage.
Importing this module changes nothing and imports no torch, so ``doit list``
stays free of torch and a module may import torch at its top like any library.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import functools
import hashlib
import io
import logging
import os
import types
import typing

if typing.TYPE_CHECKING:
    import torch

_READY = False


def setup() -> None:
    """Set this process up for the stages; idempotent (later calls return at once).

    - torchao 0.18 logs a deprecation notice through torch's pytree logger on import:
      that logger is quietened.
    - ``OMP_WAIT_POLICY=PASSIVE`` unless set (read when torch loads OpenMP, so this
      must run before the first ``import torch`` to apply): idle OpenMP threads sleep
      instead of spinning; under ``doit -n 2`` two stages share 2 cores, and spinning
      threads made each other's stages about 3x slower. Results do not depend on it.
    - torch's intra-op threads: ``C7X_TORCH_THREADS`` (default 2). Float summation
      order, and so some artifacts' bytes, depend on it (``docs/numerics.md``).
    - torchao's PT2E module and ``torch.ao.quantization.fx._decomposed`` imported:
      they register the ``quantized_decomposed`` ops ``torch.export.load`` needs.
    - ``torch.export.load`` made about twice as fast (:func:`_memoize_export_type_hints`).
    """
    global _READY
    if _READY:
        return
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch
    torch.set_num_threads(int(os.environ.get("C7X_TORCH_THREADS", "2")))
    import torchao.quantization.pt2e  # noqa: F401  (registers the Q/DQ ops)
    from torch.ao.quantization.fx import _decomposed  # noqa: F401  (needed by torch.export.load)
    _memoize_export_type_hints()
    _READY = True


def _memoize_export_type_hints() -> None:
    """Make ``torch.export.load`` about twice as fast: its deserializer rebuilds
    the schema dataclasses from JSON and calls ``typing.get_type_hints(cls,
    globalns=vars(schema))`` once per node object (the figures:
    ``docs/measuring.md``, "Figures behind the code"). The hints of a class do not change, so torch's serialize
    module gets a copy of ``typing`` whose ``get_type_hints`` is memoized for
    exactly that call; every other name is ``typing``'s own. A torch without that
    module layout is left as it is (its loads are only slower)."""
    try:
        from torch._export.serde import schema, serialize
    except ImportError:
        return
    if getattr(serialize, "typing", None) is not typing:
        return
    schema_ns = vars(schema)

    @functools.lru_cache(maxsize=None)
    def schema_hints(cls, include_extras: bool) -> dict:
        return typing.get_type_hints(cls, globalns=schema_ns, include_extras=include_extras)

    def get_type_hints(obj, globalns=None, localns=None, include_extras=False):
        if globalns is schema_ns and localns is None and isinstance(obj, type):
            return dict(schema_hints(obj, include_extras))
        return typing.get_type_hints(obj, globalns, localns, include_extras)

    shim = types.ModuleType("typing")
    shim.__dict__.update(vars(typing))
    shim.get_type_hints = get_type_hints
    serialize.typing = shim


_memoize_export_type_hints()


# Device look-ups that torchao 0.18 and torch 2.14 memoize with functools.cache,
# keyed by (and so keeping alive) the module they are given.
_MODULE_CACHES = (("torchao.utils", "_assert_and_get_unique_device"),
                  ("torch.ao.quantization.fx.utils", "assert_and_get_unique_device"))


def release_torchao_modules() -> None:
    """Let go of every model PT2E has seen. ``prepare_pt2e``, ``convert_pt2e``
    and the BN folds ask for a module's device through functions that are
    ``functools.cache``'d on the module (:data:`_MODULE_CACHES`), so each
    prepared, converted or folded model stayed alive for the whole process,
    weights included (``docs/measuring.md``, "Figures behind the code"). They only memoize the
    device; emptying them changes no result. One that a torch/torchao version
    lacks is skipped."""
    import importlib

    for module, name in _MODULE_CACHES:
        try:
            cached = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if hasattr(cached, "cache_clear"):
            cached.cache_clear()


@contextlib.contextmanager
def torch_threads(n: int):
    """torch's intra-op thread count set to ``n`` inside the block, restored after
    (it is per process: other threads of the process see it meanwhile)."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def quiet_output(report: list):
    """Inside the block, everything written to file descriptors 1 and 2 (Python prints,
    logging handlers bound to the original streams, C++ messages) goes to a temporary
    file instead; its text is appended to ``report`` afterwards, whatever happens.

    For torch calls that print long reports before raising (``torch.export`` of an
    untraceable model prints its graph twice): the caller raises one line and keeps
    the report where the user can read it."""
    import sys
    import tempfile
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    handlers = [h for h in _stream_handlers() if h.stream in (sys.stdout, sys.stderr)]
    with tempfile.TemporaryFile(mode="w+b") as sink, open(sink.fileno(), "w", closefd=False) as text, \
            contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            streams = [h.setStream(text) for h in handlers]   # logging handlers bound to a stream object
            yield
        finally:
            for h, stream in zip(handlers, streams):
                h.setStream(stream)
            text.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            sink.seek(0)
            report.append(sink.read().decode("utf-8", "replace"))


def _stream_handlers() -> list[logging.StreamHandler]:
    """Every logging StreamHandler of every known logger (torch binds its own to sys.stderr)."""
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    return [h for lg in loggers for h in lg.handlers if type(h) is logging.StreamHandler]


def process_map(fn, jobs: dict, threads: int):
    """Yield ``(key, fn(*args))`` for every ``key -> args`` of ``jobs``, in completion
    order, from joblib's loky processes (``min(len(jobs), cores)`` at a time), each call
    with ``threads`` torch threads. ``fn`` must be a module-level function (pickled by
    reference). A call's exception is re-raised here."""
    import warnings

    import joblib
    # loky retires a worker whose memory grew (a model's weights) between two jobs and starts
    # another, saying so with a UserWarning; no job is lost (the search's folds meet it)
    warnings.filterwarnings("ignore", message="A worker stopped while some jobs were given to the executor")
    n_jobs = max(1, min(len(jobs), os.cpu_count() or 1))
    with joblib.Parallel(n_jobs=n_jobs, backend="loky", return_as="generator_unordered") as parallel:
        yield from parallel(joblib.delayed(_keyed_call)(key, fn, threads, args) for key, args in jobs.items())


def _keyed_call(key, fn, threads: int, args: tuple):
    """``(key, fn(*args))`` with ``threads`` torch threads (in a loky worker, set up as
    every stage process is: :func:`setup`)."""
    setup()
    with torch_threads(threads):
        return key, fn(*args)


def strip_nondeterministic_meta(ep: "torch.export.ExportedProgram") -> None:
    """Drop node metadata that embeds Python object ids (``from_node`` holds
    ``graph_id = id(graph)``), so saving the same program twice gives the same
    bytes and doit's MD5 check can stop an unchanged cascade; and takes the
    machine's paths out of ``stack_trace`` (:func:`pipeline.fsutil.portable`), so a
    clone of the project at another path makes the same bytes."""
    from .fsutil import portable
    for node in ep.graph.nodes:
        node.meta.pop("from_node", None)
        if isinstance(node.meta.get("stack_trace"), str):
            node.meta["stack_trace"] = portable(node.meta["stack_trace"])


def save_tensors(obj, path) -> None:
    """``torch.save`` ``obj`` to ``path`` atomically, byte-stable.

    torch.save names the zip's root folder after the file it writes to; saving
    through a buffer keeps the temporary name of the atomic write out of the bytes.
    """
    import io

    import torch

    from .fsutil import write_bytes
    buf = io.BytesIO()
    torch.save(obj, buf)
    write_bytes(path, buf.getvalue())


# Programs loaded in this process, by the sha256 of their file's bytes. A cold
# build loads float.pt2 in prepare and again in evaluate, quantized.pt2 in
# relax_import and again in evaluate; a load costs far more than a deep copy
# (docs/measuring.md, "Figures behind the code"). Files of at most half of PROGRAM_CACHE_BYTES stay, the
# most recent up to that total, so a large model's peak RSS does not grow by a
# second copy of its weights.
_PROGRAMS: "collections.OrderedDict[str, tuple[torch.export.ExportedProgram, int]]" = collections.OrderedDict()
PROGRAM_CACHE_BYTES = 256 * 2**20   # total size of the files whose programs stay loaded


def load_program(path) -> "torch.export.ExportedProgram":
    """``torch.export.load(path)``, from memory when a file with the same bytes
    was loaded before in this process.

    Every call returns its own deep copy (node metadata, parameters and buffers
    included), so a caller that changes the program or writes into the tensors
    of its ``module()`` (which shares them) cannot change what the next caller
    gets. Keyed by the sha256 of the bytes, so a rewritten file is loaded
    afresh. Raises what ``torch.export.load`` raises (OSError, and
    torch's deserialization errors for a file that is not a program)."""
    setup()
    import torch
    if os.path.getsize(path) > PROGRAM_CACHE_BYTES // 2:  # too large to keep (nor to read twice)
        return torch.export.load(path)
    data = open(path, "rb").read()
    key = hashlib.sha256(data).hexdigest()
    entry = _PROGRAMS.pop(key, None) or (torch.export.load(io.BytesIO(data)), len(data))
    _PROGRAMS[key] = entry
    while sum(size for _, size in _PROGRAMS.values()) > PROGRAM_CACHE_BYTES:
        _PROGRAMS.popitem(last=False)
    return _private_copy(entry[0])


def _private_copy(ep: "torch.export.ExportedProgram") -> "torch.export.ExportedProgram":
    """``copy.deepcopy(ep)`` whose node metadata shares nothing with ``ep``: fx's
    graph copy copies each ``node.meta`` shallowly, so its ``custom`` and
    ``nn_module_stack`` dicts were the cached program's own, and what
    ``torch.export.export`` writes there (``_torchdynamo_disable``) reached every
    later copy: convert's quantized.pt2 then depended on what ran before it in
    the process (found by tests/stages/test_executor.py: a Dask build differed from a
    local one). ``val`` (FakeTensors) and other non-container entries stay shared;
    nothing writes into them."""
    out = copy.deepcopy(ep)
    for node in out.graph.nodes:
        node.meta = {k: copy.deepcopy(v) if isinstance(v, (dict, list)) else v for k, v in node.meta.items()}
    return out


def save_program(ep: "torch.export.ExportedProgram", path) -> None:
    """``torch.export.save`` atomically, without nondeterministic node metadata."""
    import io

    import torch

    from .fsutil import write_bytes
    strip_nondeterministic_meta(ep)
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    write_bytes(path, buf.getvalue())
