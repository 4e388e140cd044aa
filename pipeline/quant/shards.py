"""Sharded calibration: map slices of the calibration images over workers, merge their observers.

``[calibration] shards = k`` (k > 1) splits the selected images into k
contiguous slices in order, on batch boundaries (every shard sees the same
batches as a single process would). Each shard rebuilds the prepared model
(``build_prepared`` + ``check_prepared``, deterministic), runs its slice
through it and returns its observers' states; the head merges them in shard
order (:mod:`pipeline.quant.merge`). The head runs the first batch itself
first, so the |x|-histogram observers of every shard bin on the grid a single
process uses (:func:`calibrate_sharded`). Shards compute with the head's torch
thread count (:func:`_with_threads`): with fewer threads a layer may sum in
another order and minmax would no longer be bit-exact.

Where the shards run: when the calibrate stage itself runs on a Dask worker
(the project's Dask executor), as tasks of that cluster through
``distributed.worker_client()`` (the calling task secedes from the worker's
thread pool while it waits); otherwise in local processes, joblib's loky
backend with ``n_jobs = min(k, cpu count)``. Either way one progress bar
counts all images as shards finish.

Cost: every shard pays a fresh process's imports and a ``prepare_pt2e`` of the
model (MobileNetV2: several seconds), so sharding pays off with more cores
than one process's torch threads already use, or with a Dask cluster;
scripts/bench_calibration.py measures it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from ..config import ModelSpec


def split_images(images: list[Path], batch_size: int, shards: int) -> list[list[Path]]:
    """``images`` in at most ``shards`` contiguous, non-empty slices of whole
    batches (``batch_size`` images; the last batch may be short), sizes as even
    as the batch count allows; the first slices take the remainder."""
    batches = [images[i:i + batch_size] for i in range(0, len(images), batch_size)]
    k = max(1, min(shards, len(batches)))
    q, r = divmod(len(batches), k)
    out, start = [], 0
    for s in range(k):
        n = q + (s < r)
        out.append([p for b in batches[start:start + n] for p in b])
        start += n
    return out


def calibrate_sharded(gm: torch.fx.GraphModule, slices: list[list[Path]], bar, spec: ModelSpec,
                      float_pt2: Path, prepared_state: Path, prepared_table: Path,
                      int16_layers=frozenset()) -> dict[str, str]:
    """Calibrate the prepared ``gm`` (in place) on ``slices`` (contiguous image
    lists of whole batches, :func:`split_images`), one shard per slice; returns
    the merge record {observer class: method} (:func:`pipeline.quant.merge.merge_into`).

    The first batch runs here first: it fixes the histogram grid of the |x|
    observers (``hist_max``, :mod:`pipeline.quant.observers`), which every shard
    then starts from (:func:`pipeline.quant.merge.grid_seeds`), so all shard
    histograms lie on the single-process grid and merge by adding counts. Shard 0
    continues from this process's state with the rest of its slice."""
    from ..data.batches import calibration_batches
    from ..quant.merge import grid_seeds, merge_into, observer_states
    bs = spec.calibration.batch_size
    with torch.no_grad():
        for batch in calibration_batches(spec, slices[0][:bs]):
            gm(batch)
            bar.update(len(batch))
    head, seeds = observer_states(gm), grid_seeds(gm)
    jobs = [(slices[0][bs:], head)] + [(s, seeds) for s in slices[1:]]
    states = run_shards(jobs, bar, spec, float_pt2, prepared_state, prepared_table, int16_layers)
    return merge_into(gm, states)


def calibrate_shard(spec: ModelSpec, float_pt2: Path, prepared_state: Path, prepared_table: Path,
                    images: list[Path], init: dict, int16_layers=frozenset()) -> dict:
    """Worker job: a fresh prepared model whose observers start from ``init``
    ({observer name: some of its buffers}), calibrated on ``images`` (NCHW
    float32 batches of ``calibration.batch_size``); its observer states
    (:func:`pipeline.quant.merge.observer_states`). Raises
    :class:`~pipeline.errors.CalibrationDataError` for an unreadable image and
    RuntimeError when the rebuilt prepared model differs from the stored one."""
    from ..data.batches import calibration_batches
    from .program import build_prepared, check_prepared
    from ..quant.merge import load_observer_states, observer_states
    gm = build_prepared(spec, float_pt2, int16_layers=int16_layers)
    check_prepared(gm, prepared_state, prepared_table)
    load_observer_states(gm, init)
    with torch.no_grad():
        for batch in calibration_batches(spec, images):
            gm(batch)
    return observer_states(gm)


def on_dask_worker() -> bool:
    """True inside a task on a Dask worker (``distributed.get_worker()`` succeeds).
    Checked without importing distributed when it is not loaded already."""
    if "distributed" not in sys.modules:
        return False
    from distributed import get_worker
    try:
        get_worker()
    except ValueError:
        return False
    return True


def run_shards(jobs: list[tuple[list[Path], dict]], bar, spec: ModelSpec, float_pt2: Path,
               prepared_state: Path, prepared_table: Path, int16_layers=frozenset()) -> list[dict]:
    """:func:`calibrate_shard` for every (images, initial observer states) job
    (module doc: Dask tasks or loky processes); the observer states in job
    order. A job without images returns its initial states untouched. ``bar``
    (tqdm) advances by a job's image count as it finishes. A shard's exception
    is re-raised here."""
    results: list = [init if not images else None for images, init in jobs]
    todo = [i for i, (images, _) in enumerate(jobs) if images]
    args = {i: (spec, float_pt2, prepared_state, prepared_table, jobs[i][0], jobs[i][1], int16_layers)
            for i in todo}
    runner = _run_dask if on_dask_worker() else _run_local
    for i, states in runner(args):
        results[i] = states
        bar.update(len(jobs[i][0]))
    return results


def _run_dask(args: dict[int, tuple]):
    """Yield (job index, states) as the shard tasks finish on the cluster."""
    yield from dask_map(calibrate_shard, args)


def dask_map(fn, args: dict, threads: int | None = None, name: str | None = None):
    """Yield (key, ``fn(*args[key])``) as tasks of the cluster finish, from inside a task on a
    Dask worker (``distributed.worker_client()``: the calling task secedes while it waits, so a
    one-worker cluster runs them too). Each task sets its worker process up as a stage process
    and computes with ``threads`` torch threads (default: the caller's; :func:`_with_threads`
    says why). ``fn`` must be importable by name (a module-level function); ``name``: the
    tasks' key prefix on the cluster (its dashboard and task stream)."""
    import uuid
    from distributed import as_completed, worker_client
    threads = torch.get_num_threads() if threads is None else threads
    with worker_client() as client:
        futures = {client.submit(_with_threads, threads, fn, *a, pure=False,
                                 key=f"{name or fn.__name__}-{uuid.uuid4().hex}"): k for k, a in args.items()}
        for fut in as_completed(futures):
            yield futures[fut], fut.result()


def _run_local(args: dict[int, tuple]):
    """Yield (job index, states) as the shards finish in loky processes, each with this
    process's torch thread count (:func:`_with_threads` says why)."""
    from .. import torchenv
    yield from torchenv.process_map(calibrate_shard, args, torch.get_num_threads())


def _with_threads(threads: int, fn, *a):
    """``fn(*a)`` (:func:`calibrate_shard`, a holdout fold) with ``threads`` torch threads, the head's: a conv or
    linear layer's summation order depends on the thread count, and minmax is only
    bit-exact when every batch is computed as in one process. (On 2 cores, two
    shards then run 2 threads each: oversubscribed, but exact. torch's thread count
    is per process: on a Dask worker with several task threads the others see it
    too until it is restored; the project's executor runs one task per worker.)"""
    from .. import torchenv
    torchenv.setup()   # a worker process: set up as every stage process is, then the head's threads
    with torchenv.torch_threads(threads):
        return fn(*a)
