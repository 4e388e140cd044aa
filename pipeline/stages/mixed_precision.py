"""Stage ``mixed_precision``: float program + calibration images -> the int16 layers of an int8 model.

Runs only for mixed-precision entries (``[quantizer] int16_layers`` and/or
``mixed_precision = "auto"``). The ``int16_layers`` patterns are resolved to
layer ids (:mod:`pipeline.quant.mixed`); with ``"auto"`` a sensitivity pass on
the calibration images adds the layers with the most gain per MAC within
``int16_macs``. The pass and every error recorded come from
:class:`~pipeline.quant.mixed_sim.MixedSimulator`: all-int8 and all-int16
prepared models, calibrated once each, stand in for a prepare/calibrate/convert
per assignment. The all-int8 model first gets the calibrate stage's method
(range search, exact requantize, AdaRound, bias correction: whatever the entry's
``[calibration]`` turns on, :func:`pipeline.quant.recipe.refine`), so the
sensitivity measures what the method leaves and the int16 budget goes there.
Its refined weights stand for every layer's, int16 ones
included (the real int16 layers' AdaRound sees int16 inputs).

Metric: mean squared logit error vs the float program over the images (logit
units squared; lower is better), with the output SQNR in dB beside it.

Outputs: ``mixed_precision.json`` (every measurement, the choice, timings) and
``int16_layers.json`` (``{"layers": [...], "modules": [...]}``, the choice
alone: new measurements with the same choice write the same bytes, so
``prepare`` does not re-run).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path

import torch

from ..config import ModelSpec
from ..data.images import select_images
from ..errors import ConfigError
from ..fsutil import sha256_file, write_json
from ..quant import mixed
from ..data.batches import calibration_batches
from ..target import spec_target
from ..data.torch_outputs import single_output
from ..quant.program import build_prepared, load_program, make_quantizer
from ..quant.sqnr import sqnr_db
from ..quant.search import resolved


#: the sensitivity pass and the recorded errors use at most this many calibration
#: images (all of them for the shipped 20-image set), in batches of ``BATCH``.
MAX_IMAGES = 64
BATCH = 32


def mixed_precision_model(spec: ModelSpec, float_pt2: Path, calib_dir: Path, out: Path,
                          out_selection: Path, recipe: Path | None = None, sensitivity: Path | None = None) -> dict:
    """Choose the int16 layers of ``spec`` and write ``out`` (mixed_precision.json)
    and ``out_selection`` (int16_layers.json), both atomically; return the record.

    ``sensitivity``: a file that keeps the sensitivity pass (its ranked tensor edges and
    the all-int8/all-int16 errors) for calls that differ only in the int16 budget
    (``int16_macs``/``int16_cycles``): read when it was made for the same float program,
    images and recipe (:func:`_sensitivity_key`), else measured and written. The search
    stage gives one per fold, so its int16 budgets share one pass; the stage itself
    passes none. A reused pass records no ``errors.chosen`` (it needs the simulator).

    Raises :class:`ConfigError` for a pattern that matches no layer, manual
    patterns over the ``int16_macs`` budget, or a quantizer other than ours;
    :class:`CalibrationDataError` for a missing/empty calibration folder."""
    spec = resolved(spec, recipe)   # [quantizer] target: the recipe the search chose
    t0 = time.perf_counter()
    q = spec.quantizer
    if not q.mixed:   # the search chose an all-int8 build: no int16 layer, nothing to measure
        write_json(out_selection, {"layers": [], "modules": []})
        write_json(out, {"model": spec.name, "method": "none", "note": "the recipe search chose no int16 layer "
                         "(search.json)", "chosen": [], "int16_layer_count": 0, "int16_share": 0.0,
                         "seconds": round(time.perf_counter() - t0, 2)})
        return {"chosen": []}
    if q.implementation != "c7x":
        raise ConfigError(f"{spec.source}: mixed precision needs quantizer.implementation = 'c7x' "
                          f"(the int16_layers option of our quantizer); got {q.implementation!r}")
    ep = load_program(float_pt2)
    unit, budget = budget_of(spec)
    layers = mixed.program_layers(ep.graph, spec_target(spec) if unit == "cycles" else None)
    manual = mixed.resolve_patterns(q.int16_layers, layers, spec.source)
    if q.mixed_precision == "auto" and mixed.cost_share(manual, layers, unit) > budget + 1e-12:
        raise ConfigError(f"{spec.source}: the int16_layers patterns alone take "
                          f"{mixed.cost_share(manual, layers, unit):.1%} of the {unit}, over int16_{unit} = "
                          f"{budget:g}; raise int16_{unit} or list fewer layers")
    cal = spec.calibration
    images = select_images(calib_dir, cal, spec.name) if cal.source == "images" else []
    chosen, candidates, errors, n_used, t_sens, method = _measure_and_choose(
        spec, ep, layers, manual, images, sensitivity and (Path(sensitivity), _sensitivity_key(spec, float_pt2, images)))
    record = _record(spec, layers, manual, chosen, candidates, errors, method, images, n_used, t0)
    record["seconds_sensitivity"] = t_sens  # the pass over every tensor edge and the choice
    by_id = {layer.id: layer for layer in layers}
    write_json(out_selection, {"layers": sorted(chosen), "modules": [by_id[i].module for i in sorted(chosen)]})
    write_json(out, record)
    print(f"mixed_precision {spec.name}: {len(chosen)}/{len(layers)} layers int16 "
          f"({record['int16_share']:.1%} of MACs"
          + (f", {record['int16_cycles_share']:.1%} of estimated cycles" if "int16_cycles_share" in record else "")
          + f", {record['method']}), logit MSE int8 {errors['all_int8']['mse']:.4g}"
          + (f" -> chosen {errors['chosen']['mse']:.4g}" if errors.get("chosen") else " (sensitivity reused)")
          + f" (int16 {errors['all_int16']['mse']:.4g}), {record['seconds']} s", file=sys.stderr)
    return record


def budget_of(spec: ModelSpec) -> tuple[str, float]:
    """("macs", int16_macs) or ("cycles", int16_cycles): the unit and share of the automatic choice."""
    q = spec.quantizer
    return ("cycles", q.int16_cycles) if q.int16_cycles is not None else ("macs", q.int16_macs)


def _sensitivity_key(spec: ModelSpec, float_pt2: Path, images: list[Path]) -> str:
    """What a sensitivity pass depends on: the float program, the images, the recipe and
    every quantizer field but the int16 budget (which only the greedy choice reads)."""
    quantizer = {k: v for k, v in dataclasses.asdict(spec.quantizer).items() if k not in ("int16_macs", "int16_cycles")}
    return hashlib.sha256(json.dumps({
        "float": sha256_file(float_pt2), "images": [(p.name, sha256_file(p)) for p in images],
        "calibration": dataclasses.asdict(spec.calibration), "quantizer": quantizer, "dtype": spec.dtype,
        "preprocess": dataclasses.asdict(spec.preprocess)}, sort_keys=True, default=str).encode()).hexdigest()


def _reused(keep: tuple[Path, str] | None):
    """(candidates, errors, images used, method) from a kept sensitivity pass, or None."""
    if not keep or not keep[0].is_file():
        return None
    got = json.loads(keep[0].read_text())
    if got.get("key") != keep[1]:
        return None
    return ([mixed.TensorCandidate(c["producer"], c["consumer"], tuple(c["layers"]), c["error"], c["gain"])
             for c in got["candidates"]], got["errors"], got["images"], got["method"])


def _measure_and_choose(spec: ModelSpec, ep, layers, manual: list[str], images: list[Path],
                        keep: tuple[Path, str] | None = None):
    """(chosen ids, candidates, errors, images used, seconds of the sensitivity pass, the
    calibrate steps run on the all-int8 model first). ``keep``: (file, key) of a
    sensitivity pass to reuse or write (:func:`mixed_precision_model`'s ``sensitivity``)."""
    q = spec.quantizer
    unit, budget = budget_of(spec)
    reused = _reused(keep) if q.mixed_precision == "auto" else None
    if reused is not None:
        candidates, errors, n_used, method = reused
        gap = errors["all_int8"]["mse"] - errors["all_int16"]["mse"]
        chosen = mixed.choose(candidates, layers, budget, fixed=manual, min_gain=mixed.MIN_GAIN * gap, unit=unit)
        return chosen, candidates, dict(errors), n_used, 0.0, method
    batches = list(calibration_batches(spec, images))
    sim, method = _simulator(spec, ep, batches)
    x = torch.cat(batches)[:MAX_IMAGES]
    float_module = ep.module()
    with torch.no_grad():
        metric = _Metric([float_module(b) for b in x.split(BATCH)])
    ids = [layer.id for layer in layers]
    errors = {"all_int8": metric.of(sim, x, frozenset()), "all_int16": metric.of(sim, x, frozenset(ids))}
    candidates, chosen = [], manual
    t0 = time.perf_counter()
    if q.mixed_precision == "auto":
        candidates = _sensitivity(sim, x, metric, ids, errors["all_int16"]["mse"])
        gap = errors["all_int8"]["mse"] - errors["all_int16"]["mse"]
        chosen = mixed.choose(candidates, layers, budget, fixed=manual, min_gain=mixed.MIN_GAIN * gap, unit=unit)
        if keep:
            write_json(keep[0], {"key": keep[1], "errors": errors, "images": len(x), "method": method,
                                 "candidates": [_edge_json(c) for c in candidates]})
    seconds = round(time.perf_counter() - t0, 2)
    errors["chosen"] = metric.of(sim, x, frozenset(chosen))
    return chosen, candidates, errors, len(x), seconds, method


def _edge_json(c: "mixed.TensorCandidate") -> dict:
    """A ranked tensor edge as JSON."""
    return {"producer": c.producer, "consumer": c.consumer, "layers": list(c.layers), "error": c.error, "gain": c.gain}


def _simulator(spec: ModelSpec, ep, batches: list[torch.Tensor]):
    """(MixedSimulator, method record): all-int8 and all-int16 prepared models,
    calibrated on ``batches`` as the calibrate stage does; the all-int8 one refined by
    the entry's method (:func:`pipeline.quant.recipe.refine`)."""
    from ..quant.mixed_sim import MixedSimulator
    from ..quant.recipe import refine
    every = frozenset(mixed.layer_id(n) for n in ep.graph.nodes if n.op == "call_function")
    prepared = []
    for int16 in (frozenset(), every):
        gm = build_prepared(spec, ep, int16_layers=int16)
        with torch.no_grad():
            for b in batches:
                gm(b)
        prepared.append(gm)
    method = {k: bool(v) for k, v in refine(prepared[0], batches, spec.calibration).items()}
    sim = MixedSimulator(ep, *prepared, lambda s: make_quantizer(spec, int16_layers=s),
                         refined=any(method.values()))
    return sim, method


class _Metric:
    """Mean squared logit error vs the float outputs ``reference`` (one per batch), and SQNR;
    on output 0 of a model with several (what ``MixedSimulator.run_variants`` scores)."""

    def __init__(self, reference: list):
        reference = [single_output(r, "") for r in reference]
        self.reference = reference
        self.power = sum(float((r.double() ** 2).sum()) for r in reference)
        self.count = sum(r.numel() for r in reference)

    def squared(self, out, k: int) -> float:
        return float(((single_output(out, "").double() - self.reference[k].double()) ** 2).sum())

    def summary(self, squared: float) -> dict:
        mse = squared / self.count
        sqnr = sqnr_db(self.power, squared)   # None: identical to float
        return {"mse": round(mse, 8), "sqnr_db": None if sqnr is None else round(sqnr, 3)}

    def of(self, sim, x: torch.Tensor, int16) -> dict:
        sim.select(int16)
        return self.summary(sum(self.squared(sim.run(b), k) for k, b in enumerate(x.split(BATCH))))


def _sensitivity(sim, x, metric: _Metric, ids: list[str], int16_mse: float) -> list:
    """Every tensor edge some selection makes int16, measured int8 in the all-int16 model."""
    needs = sim.requirements(ids)
    edges = sorted(needs)
    sim.select(frozenset(ids))
    totals = [0.0] * len(edges)
    for k, b in enumerate(x.split(BATCH)):
        _, sq = sim.run_variants(b, [(e, ("int8",)) for e in edges], lambda out: metric.squared(out, k))
        totals = [t + s for t, s in zip(totals, sq)]
    out = []
    for e, total in zip(edges, totals):
        err = metric.summary(total)["mse"]
        edge = sim.edges[e]
        out.append(mixed.TensorCandidate(edge.producer, edge.consumer, needs[e], err, round(err - int16_mse, 8)))
    return out


def _record(spec, layers, manual, chosen, candidates, errors, method, images, n_used, t0) -> dict:
    q = spec.quantizer
    int16_macs = sum(layer.macs for layer in layers if layer.id in set(chosen))
    return {
        "model": spec.name,
        "method": "auto" if q.mixed_precision == "auto" else "manual",
        "metric": "mean squared logit error vs float (mse; lower is better) and output SQNR in dB",
        "measure": ("tensor edge int8 in the all-int16 model, simulated from all-int8 and all-int16 "
                    "calibrated models (pipeline/quant/mixed.py)"),
        "budget": budget_of(spec)[1] if q.mixed_precision == "auto" else None,
        "budget_unit": budget_of(spec)[0],
        "min_gain": mixed.MIN_GAIN if q.mixed_precision == "auto" else None,
        "patterns": list(q.int16_layers),
        "manual": manual,
        "layers": [{**layer.to_dict(), "int16": layer.id in set(chosen)} for layer in layers],
        "candidates": [{"producer": c.producer, "consumer": c.consumer, "layers": list(c.layers),
                        "macs": sum(layer.macs for layer in layers if layer.id in c.layers),
                        "error": c.error, "gain": c.gain} for c in candidates],
        "chosen": chosen,
        "int16_layer_count": len(chosen),
        "layer_count": len(layers),
        "int16_macs": int16_macs,
        "total_macs": mixed.total_macs(layers),
        "int16_share": round(mixed.mac_share(chosen, layers), 6),
        **({"int16_cycles_share": round(mixed.cost_share(chosen, layers, "cycles"), 6),
            "target": spec.target.name} if budget_of(spec)[0] == "cycles" else {}),
        "errors": errors,
        "method_simulated": method,   # the calibrate steps run on the all-int8 model first
        "images": [p.name for p in images][:n_used],
        "num_images": n_used,
        "seconds": round(time.perf_counter() - t0, 2),
    }
