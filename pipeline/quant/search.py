"""The recipe search's candidates, their scores, and the choice (``[quantizer] target``).

A candidate is a set of overrides of the entry's ``[calibration]`` and
``[quantizer]`` fields: the calibration recipe (affine activations, the
output-error range search, AdaRound) and, when the target allows int16, an
automatic int16 layer budget with int16 weights. The search stage tries them
cheapest first: every int8 recipe runs the same kernels (so costs the same
cycles; they are tried in the order of what their calibration costs), and an
int16 layer costs more cycles than its int8 form (docs/estimate.md), so int16
budgets come after, bisected (:func:`int16_ladder`). The stage stops at the
cheapest candidate whose held-out score meets the target and records every
measured candidate's estimated cycles (staged plan) beside its score.

Loading this module imports neither torch nor tvm: the stages that read the
choice (:func:`resolved`) run it before they build anything.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ..config import ModelSpec

#: the int8 recipes, cheapest calibration first: (name, what it adds, overrides). Each adds
#: a step of the method measured on MobileNetV2 (README, "Accuracy"; docs/guide.md), and each
#: sets every field the ladder varies, so no entry value leaks into a candidate.
INT8_RECIPES = (
    ("percentile", "99.99th-percentile ranges, symmetric activations, kernel-exact requantize",
     {"quantizer": {"symmetric_activations": True},
      "calibration": {"observer": "percentile", "range_search": False, "adaround_iterations": 0}}),
    ("affine", "+ a zero point per activation tensor (the conv kernels pad with it: no cycle more)",
     {"quantizer": {"symmetric_activations": False},
      "calibration": {"observer": "percentile", "range_search": False, "adaround_iterations": 0}}),
    ("affine+range", "+ each activation's percentile chosen by the model's output error",
     {"quantizer": {"symmetric_activations": False},
      "calibration": {"observer": "percentile", "range_search": "output", "adaround_iterations": 0}}),
    ("affine+range+adaround", "+ AdaRound: learned weight rounding, 200 steps per layer",
     {"quantizer": {"symmetric_activations": False},
      "calibration": {"observer": "percentile", "range_search": "output", "adaround_iterations": 200}}),
)

#: int16 layer budgets tried after the int8 recipes (share of the model's estimated cycles,
#: ``int16_cycles``), on the best int8 recipe, with int16 weights in the int16 layers
INT16_BUDGETS = (0.05, 0.10, 0.20, 0.40)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One build the search may choose: ``name``, what it is (``text``), and its
    ``overrides`` {"calibration": {field: value}, "quantizer": {field: value}}."""

    name: str
    text: str
    overrides: dict

    def to_json(self) -> dict:
        return {"name": self.name, "text": self.text, "overrides": self.overrides}


def int8_candidates(spec: ModelSpec) -> list[Candidate]:
    """The recipes of :data:`INT8_RECIPES` as candidates of ``spec`` (no int16 layer but the
    entry's own ``int16_layers`` patterns). A ``dtype = "int16"`` model gets the first only:
    int16 activations are symmetric (the i16 kernels' rule), and the range search and
    AdaRound are int8 methods."""
    off = {"mixed_precision": "off", "int16_cycles": None}
    recipes = INT8_RECIPES[:1] if spec.dtype == "int16" else INT8_RECIPES
    return [Candidate(name, text, {"calibration": dict(o.get("calibration", {})),
                                   "quantizer": {**off, **o.get("quantizer", {})}})
            for name, text, o in recipes]


def int16_candidates(base: Candidate) -> list[Candidate]:
    """``base`` with each budget of :data:`INT16_BUDGETS` of automatically chosen int16 layers."""
    return [Candidate(f"{base.name}+int16 {b:.0%}", f"{base.text}; int16 layers within {b:.0%} of the "
                      f"estimated cycles, int16 weights",
                      {"calibration": dict(base.overrides["calibration"]),
                       "quantizer": {**base.overrides["quantizer"], "mixed_precision": "auto",
                                     "int16_cycles": b, "weight_dtype": "int16"}})
            for b in INT16_BUDGETS]


def int16_ladder(cands: list[Candidate], score, target) -> list[dict]:
    """The records of the int16 budgets ``cands`` (smallest first) the search measures, in
    the order it measures them; ``score(candidate)`` measures one and returns its record
    ("met": meets ``target`` within its cycle cap, "cycles").

    A larger budget lets the greedy choice take more layers, so its error is lower and its
    cycles higher: an assumption, true of every ladder measured so far (docs/measuring.md,
    "Recipe search"; where it fails, a cheaper budget that meets the target is missed). The largest
    budget goes first: over the cycle cap, it is dropped and the next largest tried; within
    the cap but missing the target, no smaller budget can meet it and the search stops;
    meeting it, the smaller budgets are bisected for the cheapest that meets it. So an
    unreachable target costs one int16 candidate, not the whole ladder, and a reachable one
    at most 1 + ceil(log2(n)) (without the cap)."""
    out, lo, hi = [], 0, len(cands)
    while hi > lo:   # the largest budget within the cycle cap
        hi -= 1
        out.append(score(cands[hi]))
        if target.within(out[-1]["cycles"]):
            if not out[-1]["met"]:
                return out
            break
    else:
        return out
    while lo < hi:   # bisect the smaller budgets [lo, hi) for the cheapest that meets
        mid = (lo + hi) // 2
        out.append(score(cands[mid]))
        lo, hi = (lo, mid) if out[-1]["met"] else (mid + 1, hi)
    return out


def apply(spec: ModelSpec, overrides: dict) -> ModelSpec:
    """``spec`` with a candidate's ``overrides`` applied and no target (what the stages
    build). Raises KeyError for an unknown field (a bug in the ladder, not user input)."""
    cal = dataclasses.replace(spec.calibration, **overrides.get("calibration", {}))
    q = dataclasses.replace(spec.quantizer, **overrides.get("quantizer", {}), target=None)
    return dataclasses.replace(spec, calibration=cal, quantizer=q)


def resolved(spec: ModelSpec, recipe: Path | None) -> ModelSpec:
    """The spec a stage builds: ``spec`` itself without a target, else with the choice of
    ``recipe`` (``search.json``) applied (:func:`apply`). Raises
    :class:`~pipeline.errors.StaleArtifactError` when the entry has a target and the file is
    missing or was written for another target."""
    from ..errors import StaleArtifactError
    target = spec.quantizer.target
    if target is None:
        return spec
    try:
        record = json.loads(Path(recipe).read_text()) if recipe else None
    except (OSError, ValueError):
        record = None
    if not record or record.get("target") != target.to_record():
        raise StaleArtifactError(f"model {spec.name!r}: {recipe} does not hold the search for "
                                 f"{target.text()}; run search:{spec.name} first")
    return apply(spec, record["chosen"]["overrides"])


def choose(target, tried: list[dict]) -> tuple[dict, str | None]:
    """(the chosen record of ``tried``, a notice or None). ``tried``: the measured candidates,
    each with ``value`` (the metric) and ``cycles`` (estimated; None when not measured). The
    cheapest (fewest cycles, then first tried) that meets ``target`` within its cycle cap; if none does, the most
    accurate within the cap (the cheapest when none is within it), with a one-line notice
    saying by how much it misses."""
    within = [t for t in tried if target.within(t["cycles"])]
    met = [t for t in within if target.met_by(t["value"], t.get("worst_image"))]
    if met:   # cycles None: an int8-only search, where every candidate costs the same
        return min(met, key=lambda t: (t["cycles"] or 0, tried.index(t))), None
    if not within:
        best = min(tried, key=lambda t: t["cycles"])
        return best, (f"no candidate is within {target.max_mcycles:g}M est. cycles: the cheapest, "
                      f"{best['name']}, takes {best['cycles'] / 1e6:.2f}M")
    sign = 1 if target.sense == "max" else -1
    best = min(within, key=lambda t: (sign * t["value"], t["cycles"] or 0))
    where = " within the cycle cap" if len(within) < len(tried) else ""
    return best, (f"no candidate meets {target.text()}: the most accurate{where}, {best['name']}, reaches "
                  f"{best['value']:.4g}{_miss(target, best)}")


def _miss(target, best: dict) -> str:
    """`` (misses by 0.05)``, and the per-image floor's miss (`` worst image 0.67, misses
    the per-image floor by 0.08``) when that is what fails."""
    parts = []
    if not target.met_by(best["value"]):
        parts.append(f"misses by {abs(best['value'] - target.bound):.3g}")
    worst = best.get("worst_image")
    if target.per_image is not None and worst is not None and worst < target.per_image:
        parts.append(f"worst image {worst:.3g}, misses the per-image floor by {target.per_image - worst:.3g}")
    return f" ({'; '.join(parts)})" if parts else ""


def worst_image(float_out, out) -> float | None:
    """The lowest share of float's confident detections matched on one image, over the images
    where float has at least :data:`pipeline.config.PER_IMAGE_MIN_DETECTIONS` of them (output
    0, ``[N, D, 6]`` each, :func:`pipeline.data.detections.compare`); None when there is none."""
    from ..config import PER_IMAGE_MIN_DETECTIONS
    from ..data import detections
    per = detections.compare_all(float_out, out)["confident"]["per_image"]
    shares = [matched / n for n, matched in per if n >= PER_IMAGE_MIN_DETECTIONS]
    return round(min(shares), 6) if shares else None


def measure(metric: str, float_out, out) -> float:
    """The held-out value of ``metric`` (:data:`pipeline.config.ACCURACY_METRICS`) of a
    build's outputs ``out`` against float's ``float_out`` (output 0 of each: ``[N, K]``
    logits, ``[N, D, 6]`` detections or ``[N, ...]`` embeddings, float32), with the
    functions the holdout stage reports with (:mod:`pipeline.data.fidelity`,
    :mod:`pipeline.data.detections`). A detector with no confident float detection scores 1."""
    from ..data import detections, fidelity
    if metric == "cosine":
        return round(float(fidelity.cosines(out, float_out).mean()), 6)
    if metric == "detections_matched":
        frac = detections.compare_all(float_out, out)["confident"]["matched_fraction"]
        return 1.0 if frac is None else float(frac)
    got = fidelity.classifier_scores(out, float_out, [None] * len(out))
    if metric == "top1_agreement":
        return round(got["top1_agreement_with_float"] / len(out), 6)
    return float(got["mean_abs_logit_error_vs_float" if metric == "logit_error" else "relative_logit_error_vs_float"])
