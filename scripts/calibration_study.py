"""Compare calibration methods on a real model with held-out images (k-fold): prints a table.

    .venv/bin/python scripts/calibration_study.py [--model mobilenet_v2] [--folds 5] [--methods NAME,...]
    .venv/bin/python scripts/calibration_study.py --deployed [--second-set scenes]
    .venv/bin/python scripts/calibration_study.py --deployed --model my_mixed

With a mixed-precision entry (``mixed_precision = "auto"`` and ``target = false``: a variant
of ``mobilenet_v2`` such as ``mobilenet_v2_mixed`` before it stated a target), ``--deployed``
compares the weights of its int16 layers, int8 (pre-scaled) or int16, each
with the entry's own calibration method; every fold redoes the automatic
int16 choice on its own calibration images, as the holdout stage does.

``--deployed`` scores the deployed C too (issue 30): each fold runs the
holdout stage's own fold flow (:func:`pipeline.stages.folds.run_fold`:
calibrate, convert, relax import, codegen, gcc host build), and a second set
of real photos that no calibration sees (default ``calib_data/scenes``, the
YOLO scenes: no labels needed, agreement is with float) is scored with the
model calibrated on every image. Its rows are the kernel-aware methods
(channel equalization, range search, kernel-exact requantize, AdaRound,
affine int8) with the default observer.

For every method (activation observer, percentile, bias correction, symmetric
or affine int8) and every fold, the stage functions calibrate on the other
folds' images (prepare -> calibrate -> convert's ``load_converted``, exactly
what the pipeline builds), and the fold's images go through the PyTorch Q/DQ
model. Image ``i`` of the calibration set (file-name order) is in fold
``i % k``, so no image is ever used to calibrate the model that is scored on
it. Columns, over all images (each held out once): top-1 agreement with the
float model, top-1 against the file-name labels, mean |logit - float logit|,
and the mean calibrate-stage seconds per fold (observers, bias correction).

Also prints the bias-correction time of one calibration on all images. Works
in a temporary folder; the repo's artifacts are not touched. Needs the
model's weights (``scripts/setup.sh``) and ``calib_data/<set>``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline import torchenv  # noqa: E402,F401
from pipeline.config import ModelSpec, list_images  # noqa: E402
from pipeline.entries import load_models  # noqa: E402
from pipeline.data.images import label_of, load_images  # noqa: E402
from pipeline.stages.calibrate import calibrate_model  # noqa: E402
from pipeline.quant.program import load_converted  # noqa: E402
from pipeline.data.torch_outputs import run_program, single_output  # noqa: E402
from pipeline.stages.export import export_model  # noqa: E402
from pipeline.stages.prepare import prepare_model  # noqa: E402
from pipeline.weights import resolve_weights  # noqa: E402

import torch  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Method:
    """One row: the calibration and quantizer options it sets."""

    name: str
    observer: str
    percentile: float = 99.99
    bias_correction: bool = False
    symmetric: bool = True
    equalize: bool = False
    exact_requantize: bool = False
    range_search: bool | str = False
    adaround_iterations: int = 0
    weight_dtype: str | None = None   # the int16 layers' weights (mixed entries)

    def apply(self, spec: ModelSpec) -> ModelSpec:
        cal = dataclasses.replace(spec.calibration, observer=self.observer, percentile=self.percentile,
                                  bias_correction=self.bias_correction, num_images=0, equalize=self.equalize,
                                  exact_requantize=self.exact_requantize, range_search=self.range_search,
                                  adaround_iterations=self.adaround_iterations)
        q = dataclasses.replace(spec.quantizer, symmetric_activations=self.symmetric, weight_dtype=self.weight_dtype)
        return dataclasses.replace(spec, calibration=cal, quantizer=q)


def methods() -> list[Method]:
    base = [Method("minmax", "minmax"), Method("moving_average", "moving_average"),
            Method("histogram (MSE)", "histogram")]
    base += [Method(f"percentile {p}", "percentile", percentile=p) for p in (99.9, 99.99, 99.999)]
    base.append(Method("entropy (KL)", "entropy"))
    rows = []
    for m in base:
        rows += [m, dataclasses.replace(m, name=m.name + " + BC", bias_correction=True)]
    rows += [Method("minmax, affine int8", "minmax", symmetric=False),
             Method("minmax, affine int8 + BC", "minmax", symmetric=False, bias_correction=True)]
    return rows


def deployed_methods() -> list[Method]:
    """The rows of ``--deployed``: the default observer with the kernel-aware options."""
    p = Method("percentile 99.99", "percentile")
    return [p, dataclasses.replace(p, name="+ exact requantize", exact_requantize=True),
            dataclasses.replace(p, name="+ equalization", equalize=True),
            dataclasses.replace(p, name="+ equalization + exact requantize", equalize=True, exact_requantize=True),
            dataclasses.replace(p, name="+ bias correction + exact requantize", bias_correction=True,
                                exact_requantize=True),
            dataclasses.replace(p, name="+ range search + exact requantize", range_search=True,
                                exact_requantize=True),
            dataclasses.replace(p, name="+ AdaRound 200 + exact requantize", adaround_iterations=200,
                                exact_requantize=True),
            dataclasses.replace(p, name="affine int8 + exact requantize", symmetric=False, exact_requantize=True),
            dataclasses.replace(p, name="affine int8 + AdaRound 200 + exact requantize", symmetric=False,
                                adaround_iterations=200, exact_requantize=True),
            dataclasses.replace(p, name="affine int8 + output range search + exact requantize + AdaRound 200",
                                symmetric=False, range_search="output", adaround_iterations=200,
                                exact_requantize=True),
            dataclasses.replace(p, name="affine int8 + output range search + exact requantize + AdaRound 100",
                                symmetric=False, range_search="output", adaround_iterations=100,
                                exact_requantize=True),
            dataclasses.replace(p, name="affine int8 + output range search + exact requantize", symmetric=False,
                                range_search="output", exact_requantize=True),
            Method("percentile 99.999 + exact requantize", "percentile", percentile=99.999, exact_requantize=True)]


def mixed_methods(spec: ModelSpec) -> list[Method]:
    """The rows of ``--deployed`` for a mixed entry: its calibration method, with the
    int16 layers' weights int8 and int16."""
    c = spec.calibration
    own = Method("", c.observer, percentile=c.percentile, bias_correction=c.bias_correction,
                 symmetric=spec.quantizer.symmetric_activations, equalize=c.equalize,
                 exact_requantize=c.exact_requantize, range_search=c.range_search,
                 adaround_iterations=c.adaround_iterations)
    return [dataclasses.replace(own, name=f"int16 layers with {w} weights", weight_dtype=None if w == "int8" else w)
            for w in ("int8", "int16")]


def run_deployed(m: Method, spec: ModelSpec, work: Path, float_pt2: Path, prepared: dict,
                 folds: list[list[int]], images: list[Path], x: torch.Tensor, second: torch.Tensor) -> dict:
    """Q/DQ and C logits of ``m`` on every image held out (k-fold) and on ``second``
    (calibrated on all ``images``), with the holdout stage's fold flow."""
    from pipeline.stages.folds import run_fold
    mspec = m.apply(spec)
    classes = None
    out = {}
    t0 = time.perf_counter()
    for f, test in enumerate(folds):
        train = [images[i] for i in range(len(images)) if i not in test]
        got = run_fold(mspec, float_pt2, prepared[m.symmetric], train, x[test], work / f"{id(m)}_{f}", None)
        classes = classes or got["qdq"].shape[1]
        for k in ("qdq", "c"):
            out.setdefault(k, torch.zeros(len(images), classes))[test] = torch.from_numpy(got[k])
    got = run_fold(mspec, float_pt2, prepared[m.symmetric], images, second, work / f"{id(m)}_all", None)
    out.update({"qdq2": torch.from_numpy(got["qdq"]), "c2": torch.from_numpy(got["c"]),
                "seconds": (time.perf_counter() - t0) / (len(folds) + 1)})
    return out


def deployed_table(spec, rows_in, args, n, ref, ref2) -> None:
    """Print the ``--deployed`` table (markdown)."""
    n2 = len(ref2)
    print(f"\n{spec.name}: {args.folds}-fold held-out on calib_data/{spec.calibration.set} ({n} images) "
          f"and calib_data/{args.second_set} ({n2} photos no calibration sees); agreement with float top-1, "
          f"mean |logit - float logit|\n")
    print("| method | Q/DQ k-fold | C k-fold | Q/DQ second set | C second set | build s / fold |")
    print("|---|---|---|---|---|---|")
    agree = lambda a, r: int((a.argmax(1) == r.argmax(1)).sum())
    err = lambda a, r: float((a - r).abs().mean())
    for name, r in rows_in:
        print(f"| {name} | {agree(r['qdq'], ref)}/{n}, {err(r['qdq'], ref):.3f} | {agree(r['c'], ref)}/{n}, "
              f"{err(r['c'], ref):.3f} | {agree(r['qdq2'], ref2)}/{n2}, {err(r['qdq2'], ref2):.3f} | "
              f"{agree(r['c2'], ref2)}/{n2}, {err(r['c2'], ref2):.3f} | {r['seconds']:.0f} |")


def fold_dir(images: list[Path], folder: Path) -> Path:
    """A calibration folder of symlinks (the calibrate stage reads a folder)."""
    folder.mkdir(parents=True)
    for p in images:
        os.symlink(p.resolve(), folder / p.name)
    return folder


def qdq_logits(spec: ModelSpec, float_pt2: Path, state: Path, x: torch.Tensor) -> torch.Tensor:
    """Logits [N, classes] of the convert stage's Q/DQ model, one image at a time."""
    q = load_converted(spec, float_pt2, state)
    with torch.no_grad():
        return torch.cat([single_output(q(x[i:i + 1]), spec.name) for i in range(len(x))])


def run_method(m: Method, spec: ModelSpec, work: Path, float_pt2: Path, prepared: dict,
               folds: list[list[int]], images: list[Path], x: torch.Tensor, classes: int) -> dict:
    mspec = m.apply(spec)
    state, table = prepared[m.symmetric]
    logits = torch.zeros(len(images), classes)
    seconds = []
    for f, test in enumerate(folds):
        d = work / f"{m.name.replace(' ', '_')}_{f}"
        train = [images[i] for i in range(len(images)) if i not in test]
        calib = fold_dir(train, d / "calib")
        t0 = time.perf_counter()
        calibrate_model(mspec, float_pt2, state, table, calib, d / "calibrated.pt", d / "calibration.json")
        seconds.append(time.perf_counter() - t0)
        logits[test] = qdq_logits(mspec, float_pt2, d / "calibrated.pt", x[test])
    return {"logits": logits, "seconds": sum(seconds) / len(seconds)}


def bias_correction_seconds(spec: ModelSpec, work: Path, float_pt2: Path, prepared: dict, calib: Path) -> float:
    """The bias-correction time of one calibration on every image of ``calib``."""
    m = Method("minmax + BC", "minmax", bias_correction=True)
    info = calibrate_model(m.apply(spec), float_pt2, *prepared[True], calib, work / "all.pt", work / "all.json")
    return info["bias_correction"]["seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--methods", default="", help="comma-separated row names (default: all)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--deployed", action="store_true", help="score the deployed C too (kernel-aware rows)")
    ap.add_argument("--second-set", default="scenes", help="with --deployed: photos no calibration sees")
    args = ap.parse_args()
    spec = next(s for s in load_models(REPO / "models") if getattr(s, "name", None) == args.model)
    # the study compares methods itself: the entry's accuracy target (the search stage) plays no part
    if spec.quantizer.target is not None and spec.quantizer.target.int16:
        sys.exit(f"model {args.model!r}: its int16 layers come from the recipe search (quantizer.target); "
                 f"the study needs an entry with mixed_precision = \"auto\" and target = false")
    spec = dataclasses.replace(spec, quantizer=dataclasses.replace(spec.quantizer, target=None))
    mixed_auto = spec.quantizer.mixed_precision == "auto"
    if spec.dtype != "int8" or (spec.quantizer.mixed and not (args.deployed and mixed_auto)):
        sys.exit(f"model {args.model!r}: the study compares int8 calibrations; pick an int8 entry "
                 f"(or, with --deployed, an automatic mixed-precision one)")
    calib = REPO / "calib_data" / spec.calibration.set
    images = list_images(calib)
    if len(images) < args.folds:
        sys.exit(f"{calib}: {len(images)} images cannot make {args.folds} folds; run scripts/setup.sh")
    folds = [list(range(f, len(images), args.folds)) for f in range(args.folds)]
    rows_of = mixed_methods(spec) if mixed_auto else deployed_methods() if args.deployed else methods()
    wanted = [m for m in rows_of if not args.methods or m.name in args.methods.split(",")]
    labels = [label_of(p) for p in images]
    with tempfile.TemporaryDirectory(prefix="calibration_study-") as tmp:
        work = Path(tmp)
        float_pt2 = work / "float.pt2"
        export_model(spec, resolve_weights(spec, REPO), float_pt2, REPO)
        prepared = {}
        for sym in sorted({m.symmetric for m in wanted} | {True}):
            mspec = dataclasses.replace(spec, quantizer=dataclasses.replace(spec.quantizer, symmetric_activations=sym))
            prepared[sym] = (work / f"prepared_{sym}.pt", work / f"prepared_{sym}.txt")
            prepare_model(mspec, float_pt2, *prepared[sym])
        x = load_images(images, spec.preprocess, desc="images", model=spec.name)
        ref = run_program(float_pt2, x, spec.name)
        if args.deployed:
            second = load_images(list_images(REPO / "calib_data" / args.second_set), spec.preprocess,
                                 desc="second set", model=spec.name)
            ref2 = run_program(float_pt2, second, spec.name)
            done = []
            for m in wanted:
                done.append((m.name, run_deployed(m, spec, work, float_pt2, prepared, folds, images, x, second)))
                print(f"{m.name}: done", file=sys.stderr, flush=True)
            deployed_table(spec, done, args, len(images), ref, ref2)
            return
        f1 = ref.argmax(1)
        float_top1 = sum(int(f1[i]) == y for i, y in enumerate(labels) if y is not None)
        rows = []
        for m in wanted:
            r = run_method(m, spec, work, float_pt2, prepared, folds, images, x, ref.shape[1])
            q1 = r["logits"].argmax(1)
            rows.append({"method": m.name, "agree": int((q1 == f1).sum()),
                         "top1": sum(int(q1[i]) == y for i, y in enumerate(labels) if y is not None),
                         "logit_err": float((r["logits"] - ref).abs().mean()), "seconds": r["seconds"]})
            print(f"{m.name}: {rows[-1]}", file=sys.stderr, flush=True)
        bc = bias_correction_seconds(spec, work, float_pt2, prepared, calib)
    n, k = len(images), args.folds
    print(f"\n{spec.name} int8, calib_data/{spec.calibration.set}: {k}-fold held-out ({n} images, each "
          f"calibrated on the other {n - n // k}); float top-1 {float_top1}/{n}\n")
    print("| method | top-1 agreement with float | top-1 vs labels | mean abs logit error | calibrate s / fold |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['method']} | {r['agree']}/{n} | {r['top1']}/{n} | {r['logit_err']:.3f} | {r['seconds']:.1f} |")
    print(f"\nbias correction on all {n} images: {bc:.2f} s")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "float_top1": float_top1, "bias_correction_s": bc}, indent=1))


if __name__ == "__main__":
    main()
