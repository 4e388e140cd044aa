"""Stage ``search``: the cheapest build that meets ``[quantizer] target`` (``search.json``).

Runs only for entries with a target. The candidates (:mod:`pipeline.quant.search`:
the int8 calibration recipes, then, with ``int16 = true``, int16 layer budgets on
the best of them) are tried in order, cheapest first. Each is scored on images it
never calibrated on, by the holdout stage's own fold flow (:mod:`pipeline.stages.folds`):
k-fold on the calibration set when the evaluation set is that set (image ``i`` in fold
``i % k``), else calibrated on the whole calibration set and scored on the separate
evaluation set. A candidate is scored on its PyTorch Q/DQ model (kernel-exact requantize
keeps the deployed C within a few output LSB of it; the holdout stage then scores the
chosen build's C), and its estimated C7x cycles come from fold 0's deployed build
(relax import, codegen with the staged memory plan, :func:`pipeline.perf.report.estimate_build`
on the entry's ``[target]``). Every all-int8 recipe runs the same kernel calls, so an
int8-only search without a cycle cap measures no cycles at all (None: the estimate stage
gives the build's), and one with int16 measures them once for the int8 recipes (also when
the scores come from an int8-only search's cache entries: only the cycles are measured then, on
fold 0; an int8-only search that built its choice's C keeps the int8 cycles for the next). The int16
budgets of one fold share one sensitivity pass. The int8 recipes are tried in order up to the first
that meets the target (on a Dask cluster :func:`window` of them at once, their folds as tasks of the
cluster, the records kept up to the first that meets it); the int16 budgets, largest first, then
bisected (:func:`pipeline.quant.search.int16_ladder`: an unreachable target costs one of them). The
choice is the one with the fewest cycles among those that meet it, else the most accurate with a
one-line notice saying by how much it misses.

Every measured candidate is kept in the run-cache (:mod:`pipeline.runcache`: a signed
entry of one JSON file, a score and a cycle count, no code), its key a hash of everything
it depends on (the float program, the images, the build it makes, this stage's code), so
a second search or another model with the same sub-build (``mobilenet_v2`` and a variant
with int16 allowed share the int8 recipes) measures it once; with the run-cache off,
nothing is kept.

``search.json``: ``target``, ``method``, ``candidates`` (each: name, overrides, value,
cycles, seconds, whether it met the target, whether it came from the cache), ``chosen``,
``notice``, ``not_measured`` (the int16 budgets the ladder had no need to measure) and ``summary``. The stages that build the model read the choice from it
(:func:`pipeline.quant.search.resolved`).

``search_folds.npz``: the folds of the candidate chosen so far stay on disk; once the
choice is made, its folds run on through the C build (relax import, codegen, host build)
and their held-out Q/DQ and C outputs are written here, so the holdout stage scores them
instead of calibrating the same folds again. A choice from the run-cache has no folds: the
file is then empty and the holdout stage runs its own.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ..config import AccuracyTarget, ModelSpec
from ..data.images import load_images
from ..fsutil import sha256_file, write_json
from ..quant import search
from .folds import (evaluation_images, fold_meta, gather_folds, kfold_splits, run_fold, run_folds,
                    write_fold_outputs)
from .registry import BY_NAME


def search_model(spec: ModelSpec, float_pt2: Path, calib_dir: Path, images_dir: Path, out: Path,
                 folds_out: Path) -> dict:
    """Write ``search.json`` (module doc) for ``spec``'s ``[quantizer] target``; return it.
    Also write ``folds_out`` (``search_folds.npz``, :func:`write_fold_outputs`): the chosen
    candidate's held-out outputs, for the holdout stage.

    Raises :class:`CalibrationDataError` when the evaluation folder is empty or holds fewer
    images than ``[evaluation] folds``, and ConfigError when the entry has no target."""
    from ..errors import ConfigError
    target = spec.quantizer.target
    if target is None:
        raise ConfigError(f"{spec.source}: the search stage needs [quantizer] target")
    t0 = time.perf_counter()
    splits, names, method = _splits(spec, calib_dir, images_dir)
    x = load_images(names, spec.preprocess, desc=f"search {spec.name}", model=spec.name)
    from ..data.torch_outputs import run_program_outputs
    float_out = run_program_outputs(float_pt2, x, spec.name)[0].numpy()
    with _Trial(spec, float_pt2, splits, x, float_out, out) as trial:
        tried = trial.ladder()
        chosen, notice = search.choose(target, tried)
        trial.finish(chosen, method, names, folds_out)
    record = {"model": spec.name, "target": target.to_record(), "method": method,
              "evaluation_set": spec.evaluation_set, "images": len(names), "scored_on": "PyTorch Q/DQ",
              "cycles": (f"estimated C7x cycles of fold 0's deployed build (staged plan), target {spec.target.name}"
                         if trial.need_cycles else "not measured: every all-int8 recipe runs the same kernel "
                                                   "calls (estimate.json gives the build's)"),
              "candidates": tried, "chosen": chosen, "notice": notice,
              "not_measured": trial.not_measured, "seconds": round(time.perf_counter() - t0, 1)}
    record["summary"] = summary_line(record)
    write_json(out, record)
    print(f"search {spec.name}: {record['summary']}", file=sys.stderr)
    return record


def summary_line(record: dict) -> str:
    """One line: the recipe chosen and why (or the notice), and how many int16 budgets the
    ladder had no need to measure."""
    c = record["chosen"]
    why = record["notice"] or (f"the cheapest of {len(record['candidates'])} tried that meets "
                               f"{AccuracyTarget.from_record(record['target']).text()}")
    skipped = len(record.get("not_measured") or [])
    if skipped:
        why += (f"; {skipped} int16 budget{'s' if skipped > 1 else ''} not measured (a smaller budget only "
                f"loses accuracy, a larger one only costs cycles)")
    return (f"{c['name']} ({c['metric']} {c['value']:.4g}{_worst(c)} held out{_mcycles(c['cycles'], ', ')}): "
            f"{why}")


def _worst(rec: dict) -> str:
    """``, worst image 0.75`` for a detector's candidate (nothing without an image of
    enough detections, or for another metric)."""
    w = rec.get("worst_image")
    return "" if w is None else f", worst image {w:.3g}"


def _mcycles(cycles: int | None, lead: str = "") -> str:
    """``, 4.04M est. cycles`` (nothing when the search measured none)."""
    return "" if cycles is None else f"{lead}{cycles / 1e6:.2f}M est. cycles"


def _splits(spec: ModelSpec, calib_dir: Path, images_dir: Path):
    """([(training images, rows of the scored images)], the scored images, method): the
    holdout stage's folds, or the whole calibration set against a separate evaluation set."""
    method, eval_images, calib_images = evaluation_images(spec, calib_dir, images_dir)
    if method == "separate":
        return [(calib_images, list(range(len(eval_images))))], eval_images, method
    return kfold_splits(spec, calib_images, eval_images, images_dir), eval_images, method


class _Trial:
    """Scores candidates of one model: its folds, float outputs and candidate cache. A
    context manager: its temporary folder (the int16 budgets' shared sensitivity passes, the
    folds of the candidate chosen so far) is removed on exit."""

    def __init__(self, spec, float_pt2, splits, x, float_out, out: Path):
        self.spec, self.float_pt2, self.splits, self.x, self.float_out = spec, Path(float_pt2), splits, x, float_out
        self.work = Path(out).parent
        self.cache = _open_cache(self.work.parent)
        self.base = self._base_key()
        self.cycles: dict[str, int] = {}   # "int8" -> the cycles of every all-int8 recipe
        target = spec.quantizer.target   # cycles decide only between int8 and int16, or against a cap
        self.need_cycles = target.int16 or target.max_mcycles is not None
        self.left: dict[str, tuple[Path, list[str]]] = {}   # candidate -> its fold folders' root, last stage run
        self.not_measured: list[str] = []   # the int16 budgets the ladder had no need to measure

    def __enter__(self):
        self.tmp = Path(tempfile.mkdtemp(prefix=".search-", dir=self.work))
        self.kept = self.tmp / "sensitivity"
        self.kept.mkdir()
        return self

    def __exit__(self, *exc):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def ladder(self) -> list[dict]:
        """The records of the candidates measured: the int8 recipes in order until one meets
        the target, then (``int16 = true``, none met) the int16 budgets on the most accurate
        of them, largest first, then bisected (:func:`pipeline.quant.search.int16_ladder`)."""
        target = self.spec.quantizer.target
        tried = self._in_order(search.int8_candidates(self.spec), lambda r: r["met"])
        if target.int16 and not tried[-1]["met"]:
            sign = 1 if target.sense == "max" else -1
            best = min(tried, key=lambda t: sign * t["value"])
            base = search.Candidate(best["name"], best["text"], best["overrides"])
            seen: list[dict] = []

            def one(cand: search.Candidate) -> dict:   # measured alone; keep the choice's folds only
                seen.append(self.score(cand))
                self._keep_only(search.choose(target, [*tried, *seen])[0]["name"])
                return seen[-1]
            budgets = search.int16_candidates(base)
            tried += search.int16_ladder(budgets, one, target)
            self.not_measured = [c.name for c in budgets if c.name not in {r["name"] for r in seen}]
        return tried

    def _known_int8_cycles(self, cands: list) -> None:
        """Take the int8 cycles from the first cached all-int8 recipe that carries them (every
        all-int8 recipe runs the same kernel calls; an int8-only search stores its choice's)."""
        for cand in cands:
            hit = self._cached(self._key(cand))
            if hit is not None and hit["cycles"] is not None and not search.apply(self.spec, cand.overrides).quantizer.mixed:
                self.cycles["int8"] = hit["cycles"]
                return

    def _in_order(self, cands: list, stop, before: list[dict] = ()) -> list[dict]:
        """The records of ``cands`` in order, up to the first for which ``stop`` holds.
        :func:`window` of them are measured at once (their folds side by side on a Dask
        cluster); the ones measured after the stop are kept in the run-cache, not in the
        records, so the result is the same on any executor. After each window only the folds
        of the choice so far (``before`` and these records) are kept."""
        out, size = [], window(len(self.splits))
        for i in range(0, len(cands), size):
            recs = self.score_many(cands[i:i + size])
            stopped = next((j for j, r in enumerate(recs) if stop(r)), None)
            out += recs if stopped is None else recs[:stopped + 1]
            self._keep_only(search.choose(self.spec.quantizer.target, [*before, *out])[0]["name"])
            if stopped is not None:
                break
        return out

    def _keep_only(self, name: str) -> None:
        """Remove the fold folders of every candidate but ``name``."""
        for other in [n for n in self.left if n != name]:
            shutil.rmtree(self.left.pop(other)[0], ignore_errors=True)

    def finish(self, chosen: dict, method: str, names: list[Path], out: Path) -> None:
        """Write ``out`` (:func:`write_fold_outputs`): the chosen candidate's folds, still on
        disk from its measurement, run on through the host C build, so the holdout stage
        need not calibrate them again. An empty file when there is nothing to finish: the
        choice came from the run-cache, or the scored images are a separate set (the
        holdout stage measures nothing then)."""
        left = self.left.get(chosen["name"])
        if left is None or method != "k-fold":
            write_fold_outputs(out, None)
            return
        root, done = left
        spec = search.apply(self.spec, chosen["overrides"])
        # an int8-only search measures no cycles; fold 0's build gives them to the next search's cache
        cycles = chosen["cycles"] is None and not spec.quantizer.mixed and self.cache is not None
        jobs = [(spec, self.float_pt2, None, train, self.x[rows], root / f"fold{f}", None, "host_build",
                 cycles and f == 0, None, done[f]) for f, (train, rows) in enumerate(self.splits)]
        got: dict[int, int | None] = {}
        outs = gather_folds(jobs, self.splits, len(self.x), lambda f, result: got.update({f: result.get("cycles")}))
        write_fold_outputs(out, fold_meta(spec, names, self.splits), outs)
        if cycles:
            cand = search.Candidate(chosen["name"], chosen["text"], chosen["overrides"])
            worst = {} if chosen.get("worst_image") is None else {"worst": chosen["worst_image"]}
            self._store(self._key(cand), cand, {"value": chosen["value"], **worst, "cycles": int(got[0]),
                                                "seconds": chosen["seconds"]})

    def score_many(self, cands: list) -> list[dict]:
        """The candidates' records (:meth:`score`), the ones not cached measured together."""
        keys = [self._key(c) for c in cands]
        hits = [self._cached(k) for k in keys]
        for cand, key, hit in zip(cands, keys, hits):
            if hit is not None and hit["cycles"] is None and self.need_cycles:
                # scored by an int8-only search, which skips the cycles: keep the score, add the cycles
                hit["cycles"] = self._cycles_only(cand)
                self._store(key, cand, hit)
        todo = [i for i, h in enumerate(hits) if h is None]
        t0 = time.perf_counter()
        measured = self._measure([cands[i] for i in todo])
        for i, hit in zip(todo, measured):
            hit["seconds"] = round(time.perf_counter() - t0, 1)   # with others: their window's time
            self._store(keys[i], cands[i], hit)
            hits[i] = hit
        return [self._record(c, h, cached=i not in todo) for i, (c, h) in enumerate(zip(cands, hits))]

    def score(self, cand: search.Candidate) -> dict:
        """The candidate's record: held-out ``value`` of the target metric and ``cycles``."""
        return self.score_many([cand])[0]

    def _record(self, cand: search.Candidate, hit: dict, cached: bool) -> dict:
        target = self.spec.quantizer.target
        worst = {"worst_image": hit.get("worst")} if target.metric == "detections_matched" else {}
        cycles = hit["cycles"] if self.need_cycles else None   # an int8-only search shows none
        rec = {**cand.to_json(), "metric": target.metric, "value": hit["value"], **worst, "cycles": cycles,
               "met": target.met_by(hit["value"], hit.get("worst")) and target.within(hit["cycles"]),
               "seconds": hit["seconds"], "from_cache": cached}
        print(f"search {self.spec.name}: {cand.name}: {target.metric} {rec['value']:.4g}{_worst(rec)}"
              f"{_mcycles(rec['cycles'], ', ')}{' (cached)' if cached else ''}"
              f"{', meets ' + target.text() if rec['met'] else ''}", file=sys.stderr)
        return rec

    def _measure(self, cands: list) -> list[dict]:
        """Run every fold of every candidate in one :func:`run_folds`; {"value", "cycles"} each."""
        specs = [search.apply(self.spec, c.overrides) for c in cands]
        # every all-int8 recipe runs the same kernel calls (a zero point costs no cycle: the conv
        # kernels pad with it), so their cycles are measured once; int16 choices each time
        structures = ["int16" if s.quantizer.mixed else "int8" for s in specs]
        timed = {st for st in structures if st in self.cycles}
        want = []
        for st in structures:
            want.append(self.need_cycles and (st == "int16" or st not in timed))
            timed.add(st)
        roots = [Path(tempfile.mkdtemp(prefix="candidate-", dir=self.tmp)) for _ in cands]
        outs = [np.zeros((len(self.x), *self.float_out.shape[1:]), np.float32) for _ in cands]
        cycles: list[int | None] = [self.cycles.get(st) for st in structures]
        index = [(c, f) for c in range(len(cands)) for f in range(len(self.splits))]
        through = {(c, f): "codegen" if (f == 0 and want[c]) else "convert" for c, f in index}
        jobs = [(specs[c], self.float_pt2, None, self.splits[f][0], self.x[self.splits[f][1]], roots[c] / f"fold{f}",
                 None, through[c, f], f == 0 and want[c], self.kept / f"fold{f}.json") for c, f in index]
        for j, got in run_folds(jobs):
            c, f = index[j]
            outs[c][self.splits[f][1]] = got["qdq"][0]
            if "cycles" in got:
                cycles[c] = self.cycles[structures[c]] = int(got["cycles"])
        for c, cand in enumerate(cands):   # kept while it may be the choice (:meth:`_keep_only`)
            self.left[cand.name] = (roots[c], [through[c, f] for f in range(len(self.splits))])
        metric = self.spec.quantizer.target.metric
        results = []
        for c, out in enumerate(outs):
            cyc = (cycles[c] if cycles[c] is not None else self.cycles.get(structures[c])) if self.need_cycles else None
            worst = {"worst": search.worst_image(self.float_out, out)} if metric == "detections_matched" else {}
            results.append({"value": search.measure(metric, self.float_out, out), **worst, "cycles": cyc})
        return results

    def _cycles_only(self, cand: search.Candidate) -> int:
        """The estimated cycles of ``cand``'s build, for a score that came without them: every
        all-int8 recipe's are measured once, on fold 0 of the candidate (through codegen)."""
        cspec = search.apply(self.spec, cand.overrides)
        structure = "int16" if cspec.quantizer.mixed else "int8"
        if structure == "int8" and structure not in self.cycles:
            self._known_int8_cycles(search.int8_candidates(self.spec))
        if structure == "int16" or structure not in self.cycles:
            train, rows = self.splits[0]
            root = Path(tempfile.mkdtemp(prefix=".search-", dir=self.work))
            try:
                got = run_fold(cspec, self.float_pt2, None, train, self.x[rows], root / "fold0", None,
                               "codegen", True, self.kept / "fold0.json")
            finally:
                shutil.rmtree(root, ignore_errors=True)
            self.cycles[structure] = int(got["cycles"])
        return self.cycles[structure]

    def _cached(self, key: str) -> dict | None:
        """The candidate's measurement from the run-cache, or None."""
        if self.cache is None:
            return None
        with tempfile.TemporaryDirectory(dir=self.work, prefix=".search-hit-") as tmp:
            if not self.cache.restore(key, Path(tmp), [CANDIDATE_FILE]):
                return None
            return _read_cached(Path(tmp) / CANDIDATE_FILE)

    def _store(self, key: str, cand: search.Candidate, hit: dict) -> None:
        """Keep a measurement in the run-cache (a full or read-only cache is skipped)."""
        if self.cache is None:
            return
        with tempfile.TemporaryDirectory(dir=self.work, prefix=".search-put-") as tmp:
            write_json(Path(tmp) / CANDIDATE_FILE, hit)
            try:
                self.cache.store(key, Path(tmp), [CANDIDATE_FILE], {"stage": "search", "model": self.spec.name,
                                                                      "candidate": cand.name})
            except OSError as e:
                print(f"run-cache: cannot store a search candidate in {self.cache.root}: {e}", file=sys.stderr)

    def _base_key(self) -> str:
        """What every candidate of this model depends on but its recipe and int16 choice
        (:meth:`_key` adds those)."""
        spec = self.spec
        fields = {f: dataclasses.asdict(getattr(spec, f)) for f in ("preprocess", "codegen", "target")}
        code = sorted((Path(p).name, sha256_file(p)) for p in BY_NAME["search"].sources())
        images = [[(p.name, sha256_file(p)) for p in train] for train, _ in self.splits]
        return _digest({"float": sha256_file(self.float_pt2), "fields": fields, "dtype": spec.dtype,
                        "task": spec.task, "metric": spec.quantizer.target.metric, "splits": images,
                        "scored": [rows for _, rows in self.splits], "x": hashlib.sha256(self.x.numpy().tobytes()).hexdigest(),
                        "code": code})

    def _key(self, cand: search.Candidate) -> str:
        """The candidate's cache key: the build it makes (the entry with its overrides), so
        entries that differ only in fields the candidate sets or ignores share it."""
        spec = search.apply(self.spec, cand.overrides)
        built = {f: dataclasses.asdict(getattr(spec, f)) for f in ("calibration", "quantizer")}
        if not spec.quantizer.mixed:   # all-int8: the int16 budgets and weights play no part
            for k in ("int16_macs", "int16_cycles", "weight_dtype", "mixed_precision"):
                built["quantizer"].pop(k)
        return _digest({"base": self.base, "built": built})


def window(folds: int) -> int:
    """How many candidates the search measures at once: on a Dask worker (the project's Dask
    executor), as many as the cluster has workers for all their folds (at least one); else one,
    whose folds already fill the local cores."""
    from ..quant.shards import on_dask_worker
    if not on_dask_worker():
        return 1
    from distributed import get_client
    return max(1, len(get_client().scheduler_info()["workers"]) // max(1, folds))


#: the one file of a candidate's run-cache entry
CANDIDATE_FILE = "candidate.json"


def _open_cache(artifacts: Path):
    """The project's run-cache (:func:`pipeline.runcache.cache_root`), or None when it is
    off or its secret is unusable (:func:`pipeline.runcache.open_cache` says why, once)."""
    from .. import runcache
    root = runcache.cache_root(artifacts)
    return None if root is None else runcache.open_cache(root)


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _read_cached(path: Path) -> dict | None:
    """A cached candidate measurement, or None when absent or not of the expected form
    (a number and an integer: anything else is ignored and measured again)."""
    try:
        if path.stat().st_size > 4096:
            return None
        got = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    ok = (isinstance(got, dict) and number(got.get("value"))
          and (got.get("cycles") is None or type(got["cycles"]) is int)
          and (got.get("worst") is None or number(got["worst"])) and number(got.get("seconds")))
    if not ok:
        return None
    worst = {"worst": float(got["worst"])} if got.get("worst") is not None else {}
    return {"value": float(got["value"]), **worst, "cycles": got["cycles"], "seconds": got["seconds"]}
