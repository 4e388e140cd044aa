"""The steps after observing, in order: range search, kernel-exact requantize, AdaRound,
bias correction (``[calibration]`` options).

:func:`refine` runs them on an observed prepared model, in place, and returns
their ``calibration.json`` records. The ``calibrate`` stage runs it on its
model, the ``mixed_precision`` stage on its all-int8 model.
"""

from __future__ import annotations

import time

import torch


def single_images(batches) -> list[torch.Tensor]:
    """The images of NCHW ``batches`` as batch-1 tensors, in order (what the passes after
    observing take)."""
    return [b[i:i + 1] for b in batches for i in range(len(b))]


def refine(gm: torch.fx.GraphModule, seen: list[torch.Tensor], cal) -> dict:
    """The steps after observing on the observed ``gm`` (in place), in order,
    on the NCHW float32 batches ``seen``; their calibration.json records (False for an
    option that is off). The mixed_precision stage runs them too, on its all-int8 model."""
    out = {"range_search": _search_ranges(gm, seen, cal.range_search) if cal.range_search else False}
    out["exact_requantize"] = _snap(gm) if cal.exact_requantize else False
    out["adaround"] = _adaround(gm, seen, cal.adaround_iterations) if cal.adaround_iterations else False
    out["bias_correction"] = _correct_biases(gm, seen) if cal.bias_correction else False
    return out


def _search_ranges(gm: torch.fx.GraphModule, batches: list[torch.Tensor], criterion: bool | str) -> dict:
    """Percentiles chosen by the error at the readers' or the model's outputs (in place);
    the ``range_search`` record."""
    from .range_search import CANDIDATES, search_ranges, search_ranges_at_output
    t0 = time.perf_counter()
    per_image = single_images(batches)
    criterion = "output" if criterion == "output" else "readers"
    chosen = (search_ranges_at_output if criterion == "output" else search_ranges)(gm, per_image)
    return {"criterion": criterion, "candidates": list(CANDIDATES), "images": len(per_image),
            "seconds": round(time.perf_counter() - t0, 2), "observers": chosen}


def _snap(gm: torch.fx.GraphModule) -> dict:
    """Kernel-exact weight scales of the calibrated ``gm`` (in place); the
    ``exact_requantize`` record of calibration.json."""
    from .exact_rescale import snap_weight_scales
    layers = snap_weight_scales(gm)
    return {"layers": len(layers),
            "max_raise": round(max((r["max_raise"] for r in layers), default=0.0), 6),
            "mean_raise": round(sum(r["mean_raise"] for r in layers) / max(len(layers), 1), 6)}


def _adaround(gm: torch.fx.GraphModule, batches: list[torch.Tensor], iterations: int) -> dict:
    """AdaRound of the int8 weights (in place); the ``adaround`` record of calibration.json."""
    from .adaround import REFERENCE, adaround
    t0 = time.perf_counter()
    per_image = single_images(batches)
    layers = adaround(gm, per_image, iterations)
    return {"reference": REFERENCE, "iterations": iterations, "images": len(per_image),
            "seconds": round(time.perf_counter() - t0, 2), "layers": layers}


def _correct_biases(gm: torch.fx.GraphModule, batches: list[torch.Tensor]) -> dict:
    """Bias correction of the calibrated ``gm`` (in place) on the images of
    ``batches`` (NCHW float32); the ``bias_correction`` record of calibration.json."""
    from .bias_correction import REFERENCE, correct_biases
    t0 = time.perf_counter()
    per_image = single_images(batches)
    layers = correct_biases(gm, per_image)
    return {"method": "empirical", "reference": REFERENCE, "images": len(per_image),
            "seconds": round(time.perf_counter() - t0, 2), "layers": layers}
