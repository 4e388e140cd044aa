"""The recipe search (stage ``search``, ``[quantizer] target``) on a tiny net: a target
int8 meets stops at the first recipe, one only int16 meets picks int16 layers, an
impossible one gives the notice; candidates come from the cache the second time, and
the stages after it build the chosen recipe."""

from __future__ import annotations

import dataclasses
import json

import pytest

from doitproj import Project, build_through
from pipeline.config import AccuracyTarget
from pipeline.errors import StaleArtifactError
from pipeline.quant import search as recipes
from pipeline.stages import search
from pipeline.stages.registry import get


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("search")
    # the run-cache (artifacts/.cache) keeps the candidates, signed with this project's secret
    mp = pytest.MonkeyPatch()
    mp.setenv("DOIT_C7X_CACHE_SECRET", str(root / "cache-secret"))
    mp.delenv("DOIT_C7X_CACHE", raising=False)
    p = Project(root)
    p.add_model("tiny", extra='[evaluation]\nset = "setA"\n')
    p.add_images("setA", 6)
    yield build_through(root, last="export")
    mp.undo()


def _search(ctx, target: AccuracyTarget) -> dict:
    spec = dataclasses.replace(ctx.spec, quantizer=dataclasses.replace(ctx.spec.quantizer, target=target))
    args = {**get("search").args(ctx), "spec": spec}
    return search.search_model(**args)


@pytest.fixture(scope="module")
def impossible(built):
    """Every candidate measured (int16 allowed, an error of 0 asked): the ladder's values."""
    return _search(built, AccuracyTarget("logit_error", 0.0, int16=True))


def test_an_impossible_target_measures_every_candidate_and_says_by_how_much_it_misses(built, impossible):
    rec = impossible
    names = [c["name"] for c in rec["candidates"]]
    assert names[:4] == ["percentile", "affine", "affine+range", "affine+range+adaround"]
    # the largest int16 budget misses: no smaller one can meet it, the ladder stops
    assert len(names) == 5 and names[4].endswith(f"+int16 {max(recipes.INT16_BUDGETS):.0%}")
    assert rec["not_measured"] == [f"{names[4].rsplit(' ', 1)[0]} {b:.0%}" for b in recipes.INT16_BUDGETS[:-1]]
    assert rec["summary"].endswith("; 3 int16 budgets not measured (a smaller budget only loses accuracy, "
                                   "a larger one only costs cycles)")
    best = min(rec["candidates"], key=lambda c: c["value"])
    assert rec["chosen"]["name"] == best["name"] and not any(c["met"] for c in rec["candidates"])
    assert rec["notice"].startswith("no candidate meets logit_error <= 0") and best["name"] in rec["notice"]
    assert f"misses by {best['value']:.3g}" in rec["notice"]
    # int16 layers cost cycles; every int8 recipe runs the same kernels
    int8 = {c["cycles"] for c in rec["candidates"][:4]}
    assert len(int8) <= 2 and min(c["cycles"] for c in rec["candidates"][4:]) > min(int8)
    assert json.loads(built.layout.search.read_text())["summary"] == rec["summary"]
    assert not list(built.layout.dir.glob(".search-*")), "fold folders must be removed"
    # each candidate is one signed run-cache entry of one JSON file, under the artifacts' cache
    entries = list((built.layout.dir.parent / ".cache" / "entries").glob("*/*/entry.json"))
    metas = [json.loads(e.read_text())["meta"] for e in entries]
    assert sorted(m["candidate"] for m in metas if m.get("stage") == "search") == sorted(names)


def test_a_target_int8_meets_stops_at_the_first_recipe_and_the_second_run_is_cached(built, impossible):
    first = impossible["candidates"][0]
    rec = _search(built, AccuracyTarget("logit_error", first["value"] * 1.01 + 1e-9, int16=True))
    assert [c["name"] for c in rec["candidates"]] == ["percentile"] and rec["chosen"]["met"]
    assert rec["notice"] is None and rec["chosen"]["from_cache"]   # measured by the first search
    assert rec["chosen"]["value"] == first["value"]
    assert "the cheapest of 1 tried that meets logit_error <=" in rec["summary"]


def test_a_target_only_int16_meets_picks_int16_layers(built, impossible):
    cands = impossible["candidates"]
    int8_best = min(c["value"] for c in cands[:4])
    assert cands[4]["value"] < int8_best, "on this net the largest int16 budget must beat every int8 recipe"
    bound = (cands[4]["value"] + int8_best) / 2
    rec = _search(built, AccuracyTarget("logit_error", bound, int16=True))
    chosen = rec["chosen"]
    assert "int16" in chosen["name"] and chosen["met"] and chosen["value"] <= bound
    assert chosen["overrides"]["quantizer"]["weight_dtype"] == "int16"
    assert all(c["from_cache"] for c in rec["candidates"][:5])
    # the largest budget meets it, then the smaller ones are bisected: 10%, then 5% or 20%
    budgets = [c["name"].rsplit(" ", 1)[1] for c in rec["candidates"][4:]]
    assert budgets[:2] == ["40%", "10%"] and budgets[2:] == (["5%"] if rec["candidates"][5]["met"] else ["20%"])
    # cheapest first: no int16 candidate that meets the target has fewer cycles
    assert chosen["cycles"] == min(c["cycles"] for c in rec["candidates"] if c["met"])


def test_without_int16_the_search_stays_int8(built, impossible, monkeypatch):
    rec = _search(built, AccuracyTarget("logit_error", 0.0))
    assert [c["name"] for c in rec["candidates"]] == [c["name"] for c in impossible["candidates"][:4]]
    assert "int16" not in rec["chosen"]["name"]
    # every all-int8 recipe runs the same calls: an int8-only search measures no cycles (the
    # candidates above came from the int16 search's measurements; another metric measures anew)
    fresh = _search(built, AccuracyTarget("top1_agreement", 1.0 + 1e-9))
    assert all(c["cycles"] is None and not c["from_cache"] for c in fresh["candidates"])
    assert "not measured" in fresh["cycles"] and "est. cycles" not in fresh["summary"]
    # a search that needs cycles keeps those scores, and the int8 cycles the int8-only search's
    # finished choice left in its cache entry: nothing is measured again
    monkeypatch.setattr(search._Trial, "_cycles_only", lambda *a: pytest.fail("int8 cycles measured again"))
    monkeypatch.setattr(search._Trial, "_measure", lambda self, cands: [] if not cands else pytest.fail(
        f"measured again: {[c.name for c in cands]}"))
    again = _search(built, AccuracyTarget("top1_agreement", 1.0 + 1e-9))
    assert all(c["from_cache"] and c["cycles"] is None for c in again["candidates"])
    monkeypatch.undo()
    again = _search(built, AccuracyTarget("top1_agreement", 1.0 + 1e-9, int16=True))
    int8 = again["candidates"][:4]
    assert all(c["from_cache"] for c in int8) and [c["value"] for c in int8] == [c["value"] for c in fresh["candidates"]]
    assert {c["cycles"] for c in int8} == {impossible["candidates"][0]["cycles"]}


def test_the_stages_after_it_build_the_chosen_recipe(built, impossible, tmp_path):
    """resolved(): the choice of search.json applied, the target gone; a missing or foreign
    search.json is refused in one line."""
    spec = dataclasses.replace(built.spec, quantizer=dataclasses.replace(
        built.spec.quantizer, target=AccuracyTarget("logit_error", 0.0, int16=True)))
    saved = tmp_path / "search.json"   # (the other tests rewrite the project's own)
    saved.write_text(json.dumps(impossible))
    got = recipes.resolved(spec, saved)
    chosen = impossible["chosen"]["overrides"]
    assert got.quantizer.target is None
    assert got.quantizer.symmetric_activations == chosen["quantizer"].get("symmetric_activations", True)
    assert got.calibration.adaround_iterations == chosen["calibration"].get("adaround_iterations", 0)
    assert recipes.resolved(built.spec, None) is built.spec   # no target: the entry as written
    other = dataclasses.replace(spec, quantizer=dataclasses.replace(spec.quantizer,
                                                                    target=AccuracyTarget("cosine", 0.9)))
    with pytest.raises(StaleArtifactError, match="run search:tiny first"):
        recipes.resolved(other, saved)
    with pytest.raises(StaleArtifactError, match="does not hold the search"):
        recipes.resolved(spec, tmp_path / "missing.json")


def _search_on_worker(ctx, target):
    """Runs inside a Dask worker: the search's folds become tasks of the cluster."""
    from pipeline.quant.shards import on_dask_worker
    assert on_dask_worker()
    return _search(ctx, target)


def test_on_a_dask_worker_candidates_run_side_by_side_as_tasks_of_the_cluster(built, impossible, monkeypatch):
    """4 workers, 2 folds: two candidates at a time, their four folds at once on the cluster,
    and the same records as the local search."""
    distributed = pytest.importorskip("distributed")
    monkeypatch.setenv("DOIT_C7X_CACHE", "off")   # measured again, not read from the run-cache
    target = AccuracyTarget("logit_error", 0.0)
    with distributed.LocalCluster(n_workers=4, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=":0", worker_dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client, distributed.get_task_stream(client) as stream:
        rec = client.submit(_search_on_worker, built, target, pure=False).result(timeout=600)
    folds = [t for t in stream.data if t["key"].startswith("_fold_task")]
    assert len(folds) == 4 * 2 + 2   # 4 recipes x 2 folds, then the chosen one's 2 run on through the C build
    spans = [(ss["start"], ss["stop"]) for t in folds for ss in t["startstops"] if ss["action"] == "compute"]
    at_once = max(sum(a <= t < b for a, b in spans) for t, _ in spans)
    assert at_once >= 3, f"folds of two candidates should overlap, at most {at_once} did"
    local = {c["name"]: c["value"] for c in impossible["candidates"][:4]}
    assert [c["name"] for c in rec["candidates"]] == list(local)
    assert all(c["value"] == pytest.approx(local[c["name"]], rel=1e-3) for c in rec["candidates"])


@pytest.mark.parametrize("bound, cap, order", [
    (0.15, None, ["40%"]),                      # unreachable: the largest budget misses, so would any
    (0.26, None, ["40%", "10%", "5%"]),         # met at 10%: bisected down to the cheapest
    (0.21, None, ["40%", "10%", "20%"]),        # met at 20%
    (0.15, 6, ["40%", "20%"]),                  # 40% over the cycle cap: the next largest, which misses
    (0.15, 4, ["40%", "20%", "10%", "5%"]),     # every budget over the cap
])
def test_int16_budgets_go_largest_first_then_bisect(bound, cap, order):
    values = {"5%": 0.30, "10%": 0.25, "20%": 0.20, "40%": 0.16}
    cycles = {"5%": 4.1e6, "10%": 4.5e6, "20%": 5.0e6, "40%": 11e6}
    target = AccuracyTarget("logit_error", bound, int16=True, max_mcycles=cap)
    cands = [recipes.Candidate(b, "", {}) for b in values]

    def score(c):
        return {"name": c.name, "cycles": cycles[c.name],
                "met": target.met_by(values[c.name]) and target.within(cycles[c.name])}
    assert [r["name"] for r in recipes.int16_ladder(cands, score, target)] == order


def test_choose_prefers_fewer_cycles_among_those_that_meet():
    t = AccuracyTarget("cosine", 0.9)
    tried = [{"name": "a", "value": 0.95, "cycles": 300}, {"name": "b", "value": 0.91, "cycles": 200},
             {"name": "c", "value": 0.80, "cycles": 100}]
    assert recipes.choose(t, tried) == (tried[1], None)
    best, notice = recipes.choose(AccuracyTarget("cosine", 0.99), tried)
    assert best is tried[0] and "misses by 0.04" in notice


def test_a_per_image_floor_excludes_a_candidate_that_loses_one_image():
    import numpy as np
    t = AccuracyTarget("detections_matched", 0.9, per_image=0.75)
    tried = [{"name": "a", "value": 0.95, "worst_image": 0.67, "cycles": None},
             {"name": "b", "value": 0.92, "worst_image": 0.8, "cycles": None}]
    assert recipes.choose(t, tried) == (tried[1], None)
    best, notice = recipes.choose(t, tried[:1])
    assert best is tried[0] and notice.endswith("(worst image 0.67, misses the per-image floor by 0.08)")
    # worst_image: over the images where float has >= 3 confident detections ([N, D, 6] rows:
    # x1, y1, x2, y2, score, class), the lowest share matched
    box = [[0, 0, 10, 10, 0.9, 1], [20, 20, 30, 30, 0.8, 1], [40, 40, 50, 50, 0.7, 2], [60, 60, 70, 70, 0.6, 3]]
    empty = [[0, 0, 0, 0, 0, 0]]
    ref = np.array([box + empty, box[:2] + empty * 3], np.float32)        # 4 and 2 detections
    got = ref.copy()
    got[0, 3, 5] = 0                                                      # one of image 0's four lost
    got[1] = 0                                                            # image 1 has only 2: not held
    assert recipes.worst_image(ref, got) == 0.75 and recipes.worst_image(ref[1:], got[1:]) is None


def test_a_cycle_cap_excludes_candidates_over_it():
    tried = [{"name": "int8", "value": 0.30, "cycles": 4_000_000}, {"name": "i16 20%", "value": 0.20, "cycles": 5_000_000},
             {"name": "i16 40%", "value": 0.15, "cycles": 11_000_000}]
    best, notice = recipes.choose(AccuracyTarget("logit_error", 0.15, int16=True, max_mcycles=6), tried)
    assert best is tried[1] and "the most accurate within the cycle cap, i16 20%" in notice
    assert recipes.choose(AccuracyTarget("logit_error", 0.15, True), tried) == (tried[2], None)
    best, notice = recipes.choose(AccuracyTarget("logit_error", 0.15, True, max_mcycles=1), tried)
    assert best is tried[0] and notice.startswith("no candidate is within 1M est. cycles")


def test_doit_builds_the_chosen_recipe_and_a_new_target_reruns_from_the_search(tmp_path):
    """Through doit: the summary names the recipe; a second run is up to date; a stricter
    target re-runs the search (its first candidate from the cache) and the stages after it."""
    p = Project(tmp_path)
    entry = '[quantizer]\ntarget = {{ metric = "logit_error", max = {bound} }}\n[evaluation]\nset = "setA"\n'
    p.add_model("tiny", extra=entry.format(bound=1.0))
    p.add_images("setA", 6)
    first = p.doit("calibrate:tiny", "summary", timeout=900)
    assert first.returncode == 0, first.out[-3000:]
    assert "  recipe         percentile (logit_error " in first.out and "the cheapest of 1 tried" in first.out
    again = p.doit("calibrate:tiny", timeout=900)
    assert again.returncode == 0 and "search:tiny" in again.uptodate and not again.executed
    p.add_model("tiny", extra=entry.format(bound=0.0))   # nothing meets it: every recipe is tried
    stricter = p.doit("calibrate:tiny", timeout=900)
    assert stricter.returncode == 0, stricter.out[-3000:]
    assert {"search:tiny", "prepare:tiny", "calibrate:tiny"} <= set(stricter.executed)
    rec = json.loads((p.root / "artifacts" / "tiny" / "search.json").read_text())
    assert [c["from_cache"] for c in rec["candidates"]] == [True, False, False, False]
    info = json.loads((p.root / "artifacts" / "tiny" / "calibration.json").read_text())
    chosen = rec["chosen"]["overrides"]["calibration"]
    assert bool(info["adaround"]) == bool(chosen.get("adaround_iterations"))
    assert bool(info["range_search"]) == bool(chosen.get("range_search"))


def test_the_entries_check_names_every_field_the_candidates_set(built):
    """pipeline.entries refuses a target beside these fields (the candidates would drop them
    unseen); its list is config's, held here to what the candidates really set."""
    from pipeline.config import SEARCHED_FIELDS, SEARCHED_INT16_FIELDS
    for int16, want in ((False, SEARCHED_FIELDS), (True, SEARCHED_FIELDS + SEARCHED_INT16_FIELDS)):
        spec = dataclasses.replace(built.spec, quantizer=dataclasses.replace(
            built.spec.quantizer, target=AccuracyTarget("logit_error", 0.2, int16=int16)))
        cands = recipes.int8_candidates(spec)
        cands += recipes.int16_candidates(cands[0]) if int16 else []
        assert sorted({f"{sec}.{k}" for c in cands for sec, fields in c.overrides.items() for k in fields}) == sorted(want)
