"""Stage ``calibrate``: prepared model + calibration images -> observer ranges
(and, with ``[calibration] bias_correction``, corrected conv/linear biases)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from .. import torchenv
from ..config import ModelSpec
from ..errors import ConfigError
from ..data.batches import calibration_batches
from ..data.images import select_images
from ..fsutil import write_json
from ..quant.layer_sqnr import layer_sqnr
from ..quant.program import build_prepared, check_prepared, observer_kwargs, read_int16_selection
from ..quant.recipe import refine, single_images
from ..quant.search import resolved


def calibrate_model(spec: ModelSpec, float_pt2: Path, prepared_state: Path, prepared_table: Path,
                    calib_dir: Path, out_state: Path, out_info: Path,
                    int16_selection: Path | None = None, diagnose: bool = True,
                    recipe: Path | None = None) -> dict:
    """Run the calibration images through the prepared model; save the full
    state (weights + filled observers) and a JSON record of what was used.

    With ``[calibration] bias_correction`` the conv/linear biases of the saved
    state are then corrected on the same images (empirical bias correction,
    :mod:`pipeline.quant.bias_correction`); the record lists each layer's
    correction (``bias_correction.layers``).

    With ``[calibration] shards = k > 1`` (and images as the source) the images
    are calibrated in k contiguous slices on workers and their observers merged
    into this process's prepared model (:mod:`pipeline.quant.shards`,
    :mod:`pipeline.quant.merge`); bias correction then runs here on the whole
    set. The record gains ``shards`` {requested, used, images per shard,
    merge method per observer class}; with shards = 1 it is unchanged.

    The kernel-aware options run around the observation, each
    recorded in calibration.json under its name (False when off):

    1. ``equalize``: channels of the rescalable tensors equalized on the images
       before any observer runs (:mod:`pipeline.quant.equalize`; its ``scales``
       are replayed by the layers stage on its float reference);
    2. ``range_search``: each int8 activation's percentile chosen by the error
       at its readers' outputs (true / "readers") or at the model's outputs
       ("output") (:mod:`pipeline.quant.range_search`);
    3. ``exact_requantize`` (default on): int8 weight scales snapped to kernel
       multipliers (:mod:`pipeline.quant.exact_rescale`);
    4. ``adaround_iterations``: learned weight rounding (:mod:`pipeline.quant.adaround`);
    5. ``bias_correction`` (above), last.

    Raises :class:`CalibrationDataError` for a missing/empty folder or an
    unreadable image (nothing is written then). ``int16_selection``:
    ``int16_layers.json`` of a mixed-precision model. Raises ConfigError for
    shards > 1 with an observer that cannot be merged (moving_average).
    ``diagnose=False`` leaves out the per-layer SQNR before / after the method
    (``layer_sqnr``: False): the holdout stage's folds, whose records nobody reads.
    """
    spec = resolved(spec, recipe)   # [quantizer] target: the recipe the search chose
    cal = spec.calibration
    images = select_images(calib_dir, cal, spec.name) if cal.source == "images" else []
    int16_layers = read_int16_selection(int16_selection)
    gm = build_prepared(spec, float_pt2, int16_layers=int16_layers)
    check_prepared(gm, prepared_state, prepared_table)
    total = len(images) if images else (cal.num_images or 8)
    slices = _shard_slices(spec, gm, images)
    equalized = _equalize(spec, gm, images) if cal.equalize else None
    merge = None
    t0 = time.perf_counter()
    # disable=None: a live img/s bar on a terminal, nothing in logs (the line below stays)
    seen = []  # the batches again, for the steps after observing (20 MobileNetV2 images: 12 MB)
    keep = bool(cal.bias_correction or cal.range_search or cal.adaround_iterations)
    images_for_sqnr = []  # the first SQNR_IMAGES images, for the per-layer SQNR before / after the method
    with torch.no_grad(), tqdm(total=total, desc=f"calibrate {spec.name}", unit="img", leave=False,
                               disable=None) as bar:
        if len(slices) > 1:
            from ..quant.shards import calibrate_sharded
            merge = calibrate_sharded(gm, slices, bar, spec, float_pt2, prepared_state, prepared_table,
                                      int16_layers)
        else:
            for batch in calibration_batches(spec, images):
                gm(batch)
                bar.update(len(batch))
                if keep:
                    seen.append(batch)
                if sum(map(len, images_for_sqnr)) < SQNR_IMAGES:
                    images_for_sqnr.append(batch)
    seconds = time.perf_counter() - t0
    if merge is not None and keep:  # the whole set, as one process sees it
        seen = list(calibration_batches(spec, images))
    if merge is not None:
        images_for_sqnr = list(calibration_batches(spec, images[:SQNR_IMAGES]))
    images_for_sqnr = single_images(images_for_sqnr)[:SQNR_IMAGES]
    before = layer_sqnr(gm, images_for_sqnr) if diagnose else None
    refined = refine(gm, seen, cal)
    sqnr = False
    if diagnose:   # with nothing refined the model after is the model before: no second pass
        after = layer_sqnr(gm, images_for_sqnr) if any(refined.values()) else before
        sqnr = _sqnr_record(gm, before, after, len(images_for_sqnr))
    torchenv.save_tensors(gm.state_dict(), out_state)
    info = {
        "model": spec.name,
        "source": cal.source,
        "set": cal.set if cal.source == "images" else None,
        "images": [p.name for p in images],
        "num_images": total,
        "observer": cal.observer,
        "observer_options": observer_kwargs(spec, cal.observer),
        "equalization": equalized or False,
        **refined,
        "layer_sqnr": sqnr,
        "batch_size": cal.batch_size,
        "order": cal.order,
        "for_deployment": cal.source == "images",
    }
    if cal.shards > 1:  # (absent with shards = 1: the record stays as before sharding existed)
        info["shards"] = {"requested": cal.shards, "used": len(slices),
                          "images": [len(s) for s in slices], "merge": merge or {}}
    write_json(out_info, info)
    print(f"calibrate {spec.name}: {total} {'images' if images else 'random tensors'}, observer "
          f"{cal.observer}, {total / max(seconds, 1e-9):.1f} img/s"
          + (f", bias correction of {len(refined['bias_correction']['layers'])} layers in "
             f"{refined['bias_correction']['seconds']} s" if refined["bias_correction"] else "")
          + (f", AdaRound of {len(refined['adaround']['layers'])} layers in {refined['adaround']['seconds']} s"
             if refined["adaround"] else "")
          + (f", {len(slices)} shards" if len(slices) > 1 else ""),
          file=sys.stderr)
    return info


#: the per-layer SQNR before / after the method uses at most this many calibration images
SQNR_IMAGES = 20


def _sqnr_record(gm: torch.fx.GraphModule, before: dict, after: dict, n: int) -> dict:
    """The ``layer_sqnr`` record of calibration.json: per activation tensor (graph order),
    its module path and the Q/DQ-vs-float SQNR (dB, None = identical) before and after
    the steps that run after observing (:func:`refine`), on ``n`` calibration images."""
    from ..quant.graph import observer_of
    from ..quant.mixed import module_path
    nodes = {n.name: n for n in gm.graph.nodes}

    def name(node) -> str:  # an observer of an observer: the int8 <-> int16 requantize of a mixed model
        if observer_of(gm, node) is not None:
            return f"{name(node.args[0])} requantize"
        return module_path(node) or node.name
    return {"images": n, "measure": "PyTorch Q/DQ vs float SQNR at each layer output (calibration images), "
                                    "before and after the steps after observing",
            "layers": [{"id": k, "module": name(nodes[k]), "before_db": before[k], "after_db": after.get(k)}
                       for k in before]}


def _shard_slices(spec: ModelSpec, gm: torch.fx.GraphModule, images: list[Path]) -> list[list[Path]]:
    """The image slices of ``[calibration] shards`` (:func:`pipeline.quant.shards.split_images`;
    one slice, no sharding, for shards = 1 or random tensors). Raises ConfigError when an
    observer of ``gm`` has no merge (moving_average), before any image is read."""
    cal = spec.calibration
    if cal.shards <= 1 or not images:
        return [images]
    from ..quant.merge import NotMergeable, merge_entry, observers
    from ..quant.shards import split_images
    try:
        for obs in observers(gm).values():
            merge_entry(obs)
    except NotMergeable as e:
        raise ConfigError(f"{spec.source} (model {spec.name!r}): calibration.shards = {cal.shards}: {e}") from None
    return split_images(images, cal.batch_size, cal.shards)


def _equalize(spec: ModelSpec, gm: torch.fx.GraphModule, images: list[Path]) -> dict:
    """Channel equalization of the prepared ``gm`` (in place) on the calibration
    images (or the random batches); the ``equalization`` record of calibration.json."""
    from ..quant.equalize import REFERENCE, equalize
    t0 = time.perf_counter()
    per_image = single_images(calibration_batches(spec, images))
    groups = equalize(gm, per_image, spec.calibration.equalize_alpha)
    return {"method": "smoothquant", "reference": REFERENCE, "alpha": spec.calibration.equalize_alpha,
            "seconds": round(time.perf_counter() - t0, 2), "groups": groups}


