"""Stage ``verify``: prove the generated C on the host, on the real images.

For every build variant the host executable runs the preprocessed images and
is compared with

1. the Python integer reference of the same lowered program
   (``backend.interp``): must be bit-identical on every image, else the stage
   fails (this proves the emitter, the memory plan and the kernels). On the
   first ``INTERMEDIATE_IMAGES`` image(s) every kernel call's output tensor is
   compared too (the host executable dumps them when asked, ``C7X_DUMP``,
   :func:`pipeline.backend.host.dump_flags`), so a degenerate output
   (constant logits) cannot hide a wrong layer: the stage fails naming the
   first differing call and its layer;
2. the PyTorch Q/DQ model (``quantized.pt2``): difference in integer steps
   (LSB) of the output scale, and top-1 agreement;
3. the float model and the labels: the accuracy of what would actually run.

The PyTorch outputs of (2) and (3) are the ones ``evaluate`` computed on the
same images (``torch_outputs.npz``, :mod:`.torch_outputs`): neither program is
loaded or run again here.

A detection model (``task = "detection"``, output ``[1, D, 6]``) is compared
by IoU-matched detections instead of top-1 (:mod:`pipeline.data.detections`):
matched fraction at IoU >= 0.5 and score difference, for the C build against
the Q/DQ model and against float; the detections of float, Q/DQ and every C
build are drawn on the evaluation images (``detections/*.jpg`` and an
``index.html`` linking them).

A model with several outputs (a tuple return; the C packs them back to back
in its output buffer, :mod:`pipeline.backend.memory_plan`): (1) compares the
whole packed buffer, so bit-exactness covers every output; (2) and (3), which
need one tensor (LSB against one scale, top-1, detections), are on output 0;
``outputs`` lists every output's exactness and LSB distance to its Q/DQ twin
(each at its own scale), and a summary line says so.

Measured on MobileNetV2 with real weights: the PyTorch Q/DQ model is not
stable at the bit level itself (1 vs 2 threads, or MKLDNN on/off, changes
outputs by up to ~16 LSB), because a 1-LSB rounding flip in an early layer
propagates. So the report also gives that self-noise band of PyTorch; the
scalar build is judged against it, and exactness is judged against (1).
That band is measured on the first ``torch_outputs.SELF_NOISE_IMAGES`` images (named in
the report): a second full Q/DQ run (by evaluate), and a few images give the band.

Cost: one host process per build for all images (it also writes the dump),
started in the background at once; each build's Python reference runs in its
own thread (:func:`_outputs_in_parallel`), so the compile of one build overlaps
the other's runs and the host C; each lowered program is parsed and built once
per process (``interp.Program``).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from .. import torchenv
from ..config import ModelSpec, list_images
from ..data import detections, fidelity
from ..data.images import label_of, load_images
from ..errors import CalibrationDataError, PipelineError
from ..fsutil import write_json
from ..data.torch_outputs import outputs_note
from ..data.torch_outputs import read as read_torch_outputs


INTERMEDIATE_IMAGES = 1   # first images whose every kernel-call output is compared


class VerificationError(PipelineError):
    """The host C disagrees with the Python reference of the same program."""


def lsb_stats(a: np.ndarray, b: np.ndarray, lsb: float | None) -> dict:
    """Differences of two [N, K] outputs: in integer steps of ``lsb`` when the
    output is dequantized, else in output units (``"unit"`` says which), and
    always in output units (``max_abs``, ``mean_abs``: float logits for a
    classifier, comparable across dtypes where an LSB is not).

    Dequantized outputs are (q - zp) * lsb in float32; rounding each back to
    its integer before subtracting counts steps exactly (a float quotient of
    the difference reads a 1-step int16 difference as 1.002)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    e = np.abs(a64 - b64)
    d = np.abs(np.rint(a64 / lsb) - np.rint(b64 / lsb)) if lsb else e
    out = {"unit": "lsb" if lsb else "float", "max_lsb": round(float(d.max()), 6),
           "mean_lsb": round(float(d.mean()), 6), "max_abs": round(float(e.max()), 6),
           "mean_abs": round(float(e.mean()), 6), "elements_off": int((d > (0.5 if lsb else 0)).sum()),
           "elements": int(d.size)}
    if a.ndim == 2:  # [N, K] logits; a detection output [N, D, 6] has no top-1
        out["top1_agreement"] = int((fidelity.decisions(a) == fidelity.decisions(b)).sum())
    return out


def accuracy(logits: np.ndarray, float_logits: np.ndarray, labels: list[int | None]) -> dict:
    """Decision (top-1, or a single logit's sign) against the labels and the float model, mean
    |logit - float logit| absolute and relative (:func:`pipeline.data.fidelity.classifier_scores`),
    and the mean and worst cosine of each image's output to float's (what an embedding is judged by).
    An output that is not ``[N, K]`` logits (a feature map, e.g. ``[N, 256, 64, 64]``) has no
    decision: only the cosines and the mean |error|."""
    cos = fidelity.cosines(logits, float_logits)
    cosines = {"cosine_mean": round(float(cos.mean()), 6), "cosine_min": round(float(cos.min()), 6)}
    if np.ndim(logits) != 2:
        err = float(np.abs(np.asarray(logits, np.float64) - float_logits).mean())
        return {**cosines, "mean_abs_error_vs_float": round(err, 6)}
    return {**fidelity.classifier_scores(logits, float_logits, labels), **cosines}


def verify_variant(variant: str, host: np.ndarray, ref: np.ndarray, intermediates: dict,
                   torch_out: np.ndarray, float_out: np.ndarray, labels: list, lsb: float,
                   packed: tuple[np.ndarray, np.ndarray] | None = None, outputs: list[dict] | None = None) -> dict:
    """Compare one build's host outputs ``host`` with its Python reference
    ``ref``, the Q/DQ model ``torch_out`` and the float model (all [N, ...]
    float32, shaped alike: output 0 of a model with several); ``intermediates``:
    :func:`compare_intermediates`. ``packed``: (host, reference) buffers [N, total]
    of a model with several outputs, whose equality decides ``bit_exact_images``;
    ``outputs``: :func:`outputs_detail`. The host outputs are returned under ``"_outputs"``."""
    a, b = packed if packed is not None else (host, ref)
    per_image_exact = [bool(np.array_equal(a[i], b[i])) for i in range(len(a))]
    out = {"variant": variant, "images": len(host),
           "vs_python_reference": {"bit_exact_images": sum(per_image_exact), **lsb_stats(host, ref, lsb),
                                   "intermediates": intermediates},
           "vs_pytorch_qdq": lsb_stats(host, torch_out, lsb), "_outputs": host}
    if outputs:
        out["outputs"] = outputs
    if detections.is_detection_output(torch_out.shape):
        out["vs_pytorch_qdq"]["detections"] = detections.compare_all(torch_out, host)
        out["accuracy"] = {"detections_vs_float": detections.compare_all(float_out, host)}
    else:
        out["accuracy"] = accuracy(host, float_out, labels)
    return out


def outputs_detail(host: list[np.ndarray], ref: list[np.ndarray], torch_outs: list[np.ndarray],
                   lsbs: list[float | None]) -> list[dict]:
    """Per output of a model with several (lists in return order, each [N, ...]):
    shape, images bit-exact with the Python reference, and :func:`lsb_stats` against
    the Q/DQ model at that output's own scale."""
    return [{"index": i, "shape": [1, *h.shape[1:]],
             "bit_exact_images": sum(bool(np.array_equal(h[k], r[k])) for k in range(len(h))),
             "vs_pytorch_qdq": lsb_stats(h, t, lsb)}
            for i, (h, r, t, lsb) in enumerate(zip(host, ref, torch_outs, lsbs))]


def compare_intermediates(ref_calls: list[tuple[str, np.ndarray]], dump: list[tuple[str, bytes]],
                          manifest_calls: list[dict], images: int = 1) -> dict:
    """Every kernel call's output of the Python reference (``Program.run_recording``:
    PrimFunc name, array) against the host dump build's (``host.read_dump``:
    symbol ``__tvm_ffi_<prefix><name>``, bytes), in call order over ``images``
    image(s). ``manifest_calls``: manifest.json ``calls`` (the call's layer).
    ``all_equal`` is False at the first call whose function or bytes differ,
    or when the counts differ; ``first_difference`` then names it. A conv the
    staged plan fused into the next call (manifest ``computed_in``) has no tensor
    of its own in the C: its reference record is skipped (``tensors`` counts the
    compared ones); the fused call's dump is the next call's output."""
    per_image = max(len(manifest_calls), 1)
    # a conv fused into the next call (manifest "computed_in") writes no tensor of its own in C
    kept = [(i, f, a) for i, (f, a) in enumerate(ref_calls)
            if not (manifest_calls and "computed_in" in manifest_calls[i % per_image])]
    first = None
    for k, ((_, func, a), (symbol, raw)) in enumerate(zip(kept, dump)):
        if not symbol.endswith("_" + func) or a.tobytes() != raw:
            first = k
            break
    if first is None and len(kept) != len(dump):
        first = min(len(kept), len(dump))
    equal = len(kept) if first is None else first
    out = {"images": images, "tensors": len(kept), "host_tensors": len(dump), "equal": equal,
           "all_equal": first is None}
    if first is not None:
        index = kept[first][0] if first < len(kept) else len(ref_calls)
        call = manifest_calls[index % per_image] if manifest_calls else {}
        diff = {"image": index // per_image, "call": index % per_image, "func": call.get("func"),
                "layer": call.get("layer")}
        if first < min(len(kept), len(dump)):
            a, raw = kept[first][2], dump[first][1]
            diff["host_symbol"] = dump[first][0]
            if len(raw) == a.nbytes:
                diff["elements_off"] = int((np.frombuffer(raw, a.dtype) != a.ravel()).sum())
                diff["elements"] = int(a.size)
        out["first_difference"] = diff
    return out


def _describe(diff: dict) -> str:
    """``call 12 (mmalib_conv2d_i8_3, layer conv2d_3) on image 0`` of a first_difference."""
    return (f"call {diff['call']} ({diff['func']}, layer {diff['layer']}) on image {diff['image']}")


def summary_line(r: dict, noise: dict) -> str:
    """One line per build for the run's summary."""
    ref, pt, acc = r["vs_python_reference"], r["vs_pytorch_qdq"], r["accuracy"]
    n = r["images"]
    if "detections" in pt:
        return (f"[{r['variant']}] C == Python integer reference on {ref['bit_exact_images']}/{n} images; "
                f"detections vs PyTorch Q/DQ: {_matched(pt['detections'])}; vs float: "
                f"{_matched(acc['detections_vs_float'])}")
    unit = "LSB" if pt["unit"] == "lsb" else "(output units)"
    inter = ref["intermediates"]
    head = (f"[{r['variant']}] C == Python integer reference on {ref['bit_exact_images']}/{n} images "
            f"(+ {inter['equal']}/{inter['tensors']} intermediate tensors of the first {inter['images']}); "
            f"vs PyTorch Q/DQ: max {pt['max_lsb']:g}, mean {pt['mean_lsb']:g} {unit} (max {pt['max_abs']:.3g}, ")
    if "top1_agreement" not in pt:   # a feature map: no decision to agree on
        return (head + f"mean {pt['mean_abs']:.3g} in output units) (PyTorch vs itself: max {noise['max_lsb']:g}, "
                f"mean {noise['mean_lsb']:g}); vs float: mean |error| {acc['mean_abs_error_vs_float']:.4g}, "
                f"cosine mean {acc['cosine_mean']:.4f}, worst {acc['cosine_min']:.4f}")
    return (head + f"mean {pt['mean_abs']:.3g} in logits), top-1 agreement "
            f"{pt['top1_agreement']}/{n} (PyTorch vs itself: max {noise['max_lsb']:g}, mean "
            f"{noise['mean_lsb']:g}); {_top1(acc)}agrees with float "
            f"{acc['top1_agreement_with_float']}/{n}, mean |logit error| vs float "
            f"{acc['mean_abs_logit_error_vs_float']:.4f}{_relative(acc)}, cosine to float mean "
            f"{acc['cosine_mean']:.4f}, worst {acc['cosine_min']:.4f}")


def _top1(acc: dict) -> str:
    """``top-1 17/20, `` against the labels, or nothing when no image has one of the model's classes."""
    return f"top-1 {acc['top1']}/{acc['labeled']}, " if acc["labeled"] else ""


def _relative(acc: dict) -> str:
    """`` (0.12 of float's spread)``: the logit error relative to float's logit standard deviation."""
    rel = acc.get("relative_logit_error_vs_float")
    return "" if rel is None else f" ({rel:.2f} of float's spread)"


def _matched(d: dict) -> str:
    """``matched 12/20 (0.60) at IoU >= 0.5, mean |score diff| 0.01 (score >= 0.25); ...`` of compare_all."""
    parts = []
    for c in (d["confident"], d["top"]):
        frac = "n/a" if c["matched_fraction"] is None else f"{c['matched_fraction']:.2f}"
        ds = "" if c["mean_abs_score_diff"] is None else f", mean |score diff| {c['mean_abs_score_diff']:.4f}"
        parts.append(f"matched {c['matched']}/{c['reference_detections']} ({frac}) at IoU >= "
                     f"{c['iou_threshold']}{ds} ({c['selection']})")
    return "; ".join(parts)


def draw_detections(x: torch.Tensor, paths: list[Path], outputs: dict[str, np.ndarray], folder: Path,
                    matched: dict[str, dict] | None = None) -> dict:
    """Draw every output kind's detections on every image (``<stem>_<kind>.jpg``) and write
    ``index.html``, a table with one row per image and one column per kind; ``matched``
    (kind -> its :func:`detections.compare_all` against float) adds each image's match
    counts. Returns the counts drawn."""
    from ..fsutil import write_text
    names = detections.coco80()  # as predict labels them; an index past 80 is drawn as a number
    drawn = {k: [detections.draw(x[i], out[i], folder / f"{p.stem}_{k}.jpg", names=names)
                 for i, p in enumerate(paths)] for k, out in outputs.items()}
    head = "".join(f"<th>{k}</th>" for k in outputs)
    per = detections.per_image([p.name for p in paths], matched) if matched else []
    rows = "".join(f"<tr><td>{p.name}{_counts(per[i]) if per else ''}</td>" + "".join(
        f'<td><a href="{p.stem}_{k}.jpg"><img src="{p.stem}_{k}.jpg" width="240"></a></td>' for k in outputs)
        + "</tr>\n" for i, p in enumerate(paths))
    write_text(folder / "index.html", "<!doctype html><meta charset=utf-8><title>detections</title>\n"
               f"<p>Detections with score &ge; {detections.CONF} (else the first 10 rows), boxes in input "
               f"pixels, labelled with the COCO class and score. Under each name: float's detections and how many of them "
               f"each build matches at IoU &ge; {detections.IOU} (these images calibrated the build; the "
               f"held-out numbers are in holdout.json).</p>\n<table><tr><th>image</th>{head}</tr>\n{rows}</table>\n")
    return {k: sum(v) for k, v in drawn.items()}


def _counts(row: dict) -> str:
    """``<br>float 7<br>qdq 7/7<br>...``: one image's row of :func:`detections.per_image`, as HTML."""
    n = row["float_detections"]
    kinds = [k.removesuffix("_matched") for k in row if k.endswith("_matched")]
    return f"<br>float {n}" + "".join(f"<br>{k} {row[k + '_matched']}/{n}" for k in kinds)


class _Build:
    """One build variant's verification work. The host executable starts at
    once in the background on every image, dumping the kernel-call outputs of
    the first ``INTERMEDIATE_IMAGES`` (``C7X_DUMP``, host_main.c) into ``tmp``."""

    def __init__(self, variant: str, codegen_dir: Path, exe: Path, images: np.ndarray, tmp: Path):
        from ..backend import host

        self.variant, self.codegen_dir, self.exe, self.images = variant, codegen_dir, exe, images
        self.dump_file = tmp / f"{variant}.dump"
        self.run = host.start_host(exe, codegen_dir, images, env={
            "C7X_DUMP": str(self.dump_file), "C7X_DUMP_IMAGES": str(INTERMEDIATE_IMAGES)})

    def outputs(self) -> tuple[np.ndarray, np.ndarray, dict]:
        """(host outputs, Python reference outputs, intermediates compare) of every image;
        a model with several outputs gives them packed, [N, total] (``host.ModelInfo.split``).
        Raises VerificationError if the executable wrote no dump (built without
        ``host.dump_flags``: re-run host_build)."""
        from ..backend import host
        from ..backend.interp import Program

        prog = Program(self.codegen_dir)
        ref, ref_calls = [], []
        for i in range(len(self.images)):
            if i < INTERMEDIATE_IMAGES:
                out, calls = prog.run_recording(self.images[i:i + 1])
                ref_calls += calls
            else:
                out = prog.run(self.images[i:i + 1])
            ref.append(out)
        host_out = self.run.wait().outputs
        if ref_calls and not self.dump_file.exists():
            raise VerificationError(f"host executable {self.exe} wrote no kernel-call dump (C7X_DUMP): "
                                    f"it was built without host.dump_flags; re-run its host_build task")
        dump = host.read_dump(self.dump_file) if ref_calls else []
        manifest = json.loads((self.codegen_dir / "manifest.json").read_text())
        inter = compare_intermediates(ref_calls, dump, manifest["calls"], min(INTERMEDIATE_IMAGES, len(self.images)))
        return host_out, np.concatenate(ref, axis=0), inter


def _outputs_in_parallel(work: dict[str, "_Build"]) -> dict[str, tuple]:
    """:meth:`_Build.outputs` of every build, one thread each (in ``work``'s order).

    The reference runs are numpy / torch / LLVM calls that release the GIL, and the
    builds' LLVM compiles take turns (``interp._BUILD_LOCK``), so one build's compile
    overlaps another's runs and the host executables. torch runs one intra-op
    thread per caller meanwhile: the conv accumulations are exact integer sums
    (``kernels.reference``), so the thread count cannot change a result, and
    two callers with two threads each would oversubscribe 2 cores. The build
    with the largest ``lowered.py`` (the longest LLVM compile and reference
    runs: the scalar build) is started first, so its compile does not wait
    for the others' (docs/measuring.md, "Figures behind the code"). The first
    exception of any build is raised."""
    from concurrent.futures import ThreadPoolExecutor

    def cost(v: str) -> int:
        lowered = work[v].codegen_dir / "lowered.py"  # (missing: Program names it)
        return lowered.stat().st_size if lowered.exists() else 0

    with torchenv.torch_threads(1), ThreadPoolExecutor(max_workers=len(work), thread_name_prefix="verify") as pool:
        futures = {v: pool.submit(work[v].outputs) for v in sorted(work, key=cost, reverse=True)}
        return {v: futures[v].result() for v in work}


def verify_model(spec: ModelSpec, torch_outputs: Path, images_dir: Path,
                 builds: dict[str, tuple[Path, Path]], out: Path) -> dict:
    """Verify every build variant on the evaluation images; write ``verify.json``.
    ``torch_outputs``: evaluate's PyTorch outputs of the same images
    (:mod:`.torch_outputs`; PipelineError if they are of other images).

    Raises :class:`VerificationError` (after writing the JSON) if any image's
    host output, or any intermediate tensor of the first ``INTERMEDIATE_IMAGES``
    image(s), differs from the Python reference.
    """
    paths = list_images(images_dir, strict=True)
    if not paths:
        raise CalibrationDataError(f"model {spec.name!r}: no images in {images_dir} to verify on")
    x = load_images(paths, spec.preprocess, desc=f"verify {spec.name}", model=spec.name)
    images = x.numpy().astype(np.float32)
    with tempfile.TemporaryDirectory(prefix="c7x-verify-") as tmp:
        work = {v: _Build(v, cdir, exe, images, Path(tmp)) for v, (cdir, exe) in builds.items()}
        kept = read_torch_outputs(torch_outputs, [p.name for p in paths], images, spec.name)
        torch_outs, float_outs, lsbs = kept.qdq_outs, kept.float_outs, kept.lsbs
        torch_out, float_out, lsb = torch_outs[0], float_outs[0], lsbs[0]
        k = len(kept.noise)
        noise = {**lsb_stats(kept.noise, torch_out[:k], lsb), "images": [p.name for p in paths[:k]]}
        # an embedding has no classes: its labels say nothing about it (cosine is its measure)
        labels = [None if spec.task == "embedding" else label_of(p) for p in paths]
        shape = torch_out.shape
        results = []
        for v, (host_out, ref_out, inter) in _outputs_in_parallel(work).items():
            w = work[v]
            if len(torch_outs) == 1:
                results.append(verify_variant(v, host_out.reshape(shape), ref_out.reshape(shape), inter,
                                              torch_out, float_out, labels, lsb))
                continue
            host_parts = _split(w.codegen_dir, host_out, torch_outs)
            ref_parts = _split(w.codegen_dir, ref_out, torch_outs)
            results.append(verify_variant(v, host_parts[0], ref_parts[0], inter, torch_out, float_out, labels,
                                          lsb, packed=(host_out, ref_out),
                                          outputs=outputs_detail(host_parts, ref_parts, torch_outs, lsbs)))
    host_outputs = {f"c_{r['variant']}": r.pop("_outputs") for r in results}
    detecting = spec.detects
    if detecting and not detections.is_detection_output(torch_out.shape):
        raise PipelineError(f"model {spec.name!r}: task = \"{spec.task}\" needs a [1, D, 6] output 0 "
                            f"(x1, y1, x2, y2, score, class), got {list(torch_out.shape[1:])} per image; "
                            f"fix the builder or drop 'task' in {spec.source}")
    qdq_acc = ({"detections_vs_float": detections.compare_all(float_out, torch_out)} if detecting
               else accuracy(torch_out, float_out, labels))
    report = {"model": spec.name, "dtype": spec.dtype, "output_lsb": lsb,
              "images": [p.name for p in paths], "variants": results,
              "pytorch_qdq": {"accuracy": qdq_acc, "self_noise_1_thread_no_mkldnn": noise},
              "summary_lines": [summary_line(r, noise) for r in results]}
    if outputs_note(len(torch_outs)):  # one line: which output the numbers above are on
        report["notes"] = [outputs_note(len(torch_outs))]
        report["summary_lines"].append(outputs_note(len(torch_outs)))
    if detecting:
        matched = {"qdq": qdq_acc["detections_vs_float"],
                   **{f"c_{r['variant']}": r["accuracy"]["detections_vs_float"] for r in results}}
        report["detections_drawn"] = draw_detections(
            x, paths, {"float": float_out, "qdq": torch_out, **host_outputs}, out.parent / "detections", matched)
    write_json(out, report)
    _raise_if_inexact(spec, results, len(paths), out)
    return report


def _split(codegen_dir: Path, packed: np.ndarray, torch_outs: list[np.ndarray]) -> list[np.ndarray]:
    """The outputs in a build's packed [N, total] buffer, [N, ...] each as model.h
    shapes them. Raises PipelineError when they are not the program's outputs."""
    from ..backend.host import model_info
    parts = model_info(codegen_dir).split(packed)
    if [p.shape for p in parts] != [t.shape for t in torch_outs]:
        raise PipelineError(f"{codegen_dir}/model.h declares outputs {[list(p.shape[1:]) for p in parts]} per "
                            f"image, the Q/DQ program returns {[list(t.shape[1:]) for t in torch_outs]}: "
                            f"re-run codegen")
    return parts


def _raise_if_inexact(spec: ModelSpec, results: list[dict], n: int, out: Path) -> None:
    """VerificationError naming the builds whose outputs differ, and the first
    differing intermediate tensor of each build that has one."""
    bad = [r["variant"] for r in results if r["vs_python_reference"]["bit_exact_images"] != n]
    inter = [f"{r['variant']}: {_describe(r['vs_python_reference']['intermediates']['first_difference'])}"
             for r in results if not r["vs_python_reference"]["intermediates"]["all_equal"]]
    if bad or inter:
        what = [f"outputs differ for build(s) {bad}"] if bad else []
        what += [f"first differing intermediate tensor: {'; '.join(inter)}"] if inter else []
        raise VerificationError(f"model {spec.name!r}: host C differs from the Python integer reference: "
                                f"{'; '.join(what)}; see {out}")
