"""Sharded calibration against one process: MobileNetV2 int8 on N images.

    .venv/bin/python scripts/bench_calibration.py [--images 200] [--shards 2] [--observer percentile]

Makes ``--images`` JPEGs in a temporary folder from the 20 shipped ones in
``calib_data/imagenet20`` (seeded crops of 60-100 % of each side and
horizontal flips, re-encoded with torchvision's ``encode_jpeg``), exports and
prepares models/mobilenet_v2.toml there with the stage functions, then
calibrates it with ``shards = 1`` and with ``shards = --shards`` (local loky
processes). Prints both wall times, the speed-up, whether the two calibrated
states are identical and the largest relative difference of an activation
scale between them. Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def make_images(out: Path, n: int, seed: int = 0) -> list[Path]:
    """``n`` JPEGs in ``out``: seeded random crops (60-100 % of height and width) of the
    shipped imagenet20 images, half of them flipped; file names keep the label suffix."""
    import torch
    from torchvision.io import ImageReadMode, decode_image, encode_jpeg
    from pipeline.config import list_images
    src = list_images(REPO / "calib_data" / "imagenet20")
    gen = torch.Generator().manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        s = src[i % len(src)]
        img = decode_image(str(s), mode=ImageReadMode.RGB)
        _, h, w = img.shape
        ch, cw = (int(d * (0.6 + 0.4 * float(torch.rand(1, generator=gen)))) for d in (h, w))
        y, x = (int(torch.randint(0, d - c + 1, (1,), generator=gen)) for d, c in ((h, ch), (w, cw)))
        crop = img[:, y:y + ch, x:x + cw]
        if float(torch.rand(1, generator=gen)) < 0.5:
            crop = crop.flip(-1)
        p = out / f"aug_{i:04d}_{s.stem.rsplit('_', 1)[-1]}.jpg"
        p.write_bytes(encode_jpeg(crop.contiguous(), quality=90).numpy().tobytes())
        paths.append(p)
    return paths


def activation_scales(spec, float_pt2: Path, state: Path) -> dict[str, float]:
    """{observer name: scale} of every per-tensor activation observer of the calibrated ``state``."""
    import torch
    from pipeline.quant.merge import observers
    from pipeline.quant.program import build_prepared
    gm = build_prepared(spec, float_pt2)
    gm.load_state_dict(torch.load(state, weights_only=True))
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, obs in observers(gm).items():
            if obs.qscheme in (torch.per_tensor_symmetric, torch.per_tensor_affine):
                out[name] = float(obs.calculate_qparams()[0].reshape(-1)[0])
    return out


def bench_sharded_calibration(n_images: int = 200, shards: int = 2, observer: str | None = None) -> dict:
    """Calibrate MobileNetV2 int8 on ``n_images`` augmented JPEGs with 1 and with ``shards``
    shards (local processes); print and return {"seconds_1", "seconds_sharded", "speedup",
    "identical", "max_rel_scale_diff"}. ``observer``: default the entry's (percentile)."""
    import torch
    from pipeline.entries import load_models
    from pipeline.stages.calibrate import calibrate_model
    from pipeline.stages.export import export_model
    from pipeline.stages.prepare import prepare_model
    base = next(m for m in load_models(REPO / "models") if m.name == "mobilenet_v2")
    # the entry's settings as written (its accuracy target's search is not what is timed here)
    base = dataclasses.replace(base, quantizer=dataclasses.replace(base.quantizer, target=None))
    with tempfile.TemporaryDirectory(prefix="bench_calib_") as tmp:
        d = Path(tmp)
        make_images(d / "calib", n_images)
        cal = dataclasses.replace(base.calibration, set="calib", num_images=0,
                                  observer=observer or base.calibration.observer)
        specs = {k: dataclasses.replace(base, calibration=dataclasses.replace(cal, shards=k)) for k in (1, shards)}
        export_model(specs[1], None, d / "float.pt2", REPO)
        prepare_model(specs[1], d / "float.pt2", d / "prepared.pt", d / "observers.txt")
        seconds = {}
        for k, spec in specs.items():
            t0 = time.perf_counter()
            calibrate_model(spec, d / "float.pt2", d / "prepared.pt", d / "observers.txt", d / "calib",
                            d / f"calibrated_{k}.pt", d / f"calibration_{k}.json")
            seconds[k] = time.perf_counter() - t0
        a, b = (torch.load(d / f"calibrated_{k}.pt", weights_only=True) for k in (1, shards))
        identical = a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
        sa, sb = (activation_scales(specs[1], d / "float.pt2", d / f"calibrated_{k}.pt") for k in (1, shards))
        diff = max(abs(sa[n] - sb[n]) / sa[n] for n in sa)
    res = {"seconds_1": round(seconds[1], 2), "seconds_sharded": round(seconds[shards], 2),
           "speedup": round(seconds[1] / seconds[shards], 2), "identical": identical,
           "max_rel_scale_diff": diff}
    print(f"calibration of {n_images} images, MobileNetV2 int8 ({cal.observer}): 1 process "
          f"{res['seconds_1']} s, {shards} shards {res['seconds_sharded']} s, speed-up {res['speedup']}x; "
          f"states identical: {identical}, largest relative scale difference {diff:.3g}")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--observer", default=None, help="activation observer (default: the entry's)")
    args = ap.parse_args()
    bench_sharded_calibration(args.images, args.shards, args.observer)


if __name__ == "__main__":
    main()
