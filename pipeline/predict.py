"""Predict: run a built model's deployed host C on your own images.

    .venv/bin/python -m pipeline.predict MODEL IMAGE_OR_FOLDER... [--top 5] [--save DIR] [--build mmalib]

Each image is decoded and preprocessed as the build's calibration images are
(``[preprocess]`` of the entry: :func:`pipeline.data.images.make_transform`),
run through the host executable that ``doit host_build:MODEL`` made (the same
C the verify stage checks bit for bit), and printed: a classifier's top-k
labels with softmax scores, or a detector's detections (class, score, box in
input pixels). ``--save DIR`` writes each preprocessed image with its boxes
(a detector) or its top-1 label (a classifier) drawn. The host time per image
is the harness's CPU time, not a C7x figure (``doit estimate:MODEL`` has that).

Refused with one line (exit status 2): an unknown model, a model not built yet,
a build older than its inputs (any stage from export to host_build not up to
date, by the same input stamps doit checks: ``pipeline/stamps.py``), an image
that is not a readable JPEG / PNG.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

from .errors import PipelineError

#: the label font when Debian's fonts-dejavu-core is there
FONT = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")


def stale_stages(project, spec, last: str = "host_build") -> list[str]:
    """Names of the stages ``last`` depends on (itself included) whose input stamp does not
    match their current inputs, outputs and configuration: the build on disk is not what
    ``doit`` would build now. Reads files only (no torch, no tvm)."""
    from .stages.registry import STAGES
    from .stamps import StampCheck

    ctx = project.context(spec)
    tasks = {s.name: project.task(s, spec) for s in STAGES if s.applies(ctx)}
    producer = {t: name for name, task in tasks.items() for t in task["targets"]}
    wanted, todo = set(), [last]
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo += [producer[d] for d in tasks[name]["file_dep"] if d in producer]
    stale = []
    for name in sorted(wanted, key=[s.name for s in STAGES].index):
        task, check = tasks[name], tasks[name]["uptodate"][-1]
        if not (isinstance(check, StampCheck) and check(SimpleNamespace(**task), {})):
            stale.append(name)
    return stale


def image_paths(args: list[str]) -> list[Path]:
    """Files as given, folders expanded to their JPEG / PNG files (sorted, as a calibration
    set is listed: :func:`pipeline.config.list_images`). Raises PipelineError for a path
    that does not exist or a folder without images."""
    from .config import list_images

    out = []
    for a in map(Path, args):
        if a.is_dir():
            found = list_images(a, strict=True)
            if not found:
                raise PipelineError(f"{a}: no .jpg/.jpeg/.png image in this folder")
            out += found
        elif a.is_file():
            out.append(a)
        else:
            raise PipelineError(f"{a}: no such file or folder")
    return out


def _class_names(spec, n: int) -> list[str]:
    """Names of a classifier's ``n`` outputs from its torchvision weights' metadata (no
    download: the names are in torchvision's code), else ``class <i>``."""
    try:
        from torchvision.models import get_model_weights
        module, _, fn = spec.builder.partition(":")
        if module.startswith("torchvision.models"):
            names = list(get_model_weights(fn))[0].meta.get("categories", [])
            if len(names) == n:
                return names
    except (ValueError, KeyError, IndexError, ImportError):
        pass
    return [f"class {i}" for i in range(n)]


def predict(project, spec, paths: list[Path], variant: str = "mmalib", top: int = 5,
            save: Path | None = None) -> list[str]:
    """Run ``spec``'s host build ``variant`` on ``paths``; return the lines to print.
    Raises PipelineError (one line) as the module docstring says."""
    ctx = project.context(spec)
    builds = ctx.layout.builds(spec)
    if variant not in builds:
        raise PipelineError(f"model '{spec.name}' has no {variant} build (builds: {', '.join(builds)})")
    codegen, exe = builds[variant]
    if not exe.is_file():
        raise PipelineError(f"model '{spec.name}' is not built yet: run .venv/bin/doit host_build:{spec.name}")
    stale = stale_stages(project, spec)
    if stale:
        raise PipelineError(f"model '{spec.name}': the build on disk is older than its inputs (stale: "
                            f"{', '.join(stale)}); run .venv/bin/doit host_build:{spec.name} first")
    import numpy as np
    import torch

    from .backend.host import model_info, run_host_timed
    from .data import detections
    from .data.images import decode_rgb, load_image, make_transform

    transform = make_transform(spec.preprocess)
    images = [load_image(p, transform) for p in paths]
    run = run_host_timed(exe, codegen, torch.stack(images).numpy())
    outputs = model_info(codegen).split(run.outputs)   # one [N, ...] array per model output
    detecting = spec.detects
    names = detections.coco80() if detecting else _class_names(spec, int(outputs[0].shape[-1]))
    float_out = None
    if spec.task == "embedding":   # the float model's vectors, to say how close the C's are
        from .data.torch_outputs import run_program
        float_out = run_program(ctx.layout.float_pt2, torch.stack(images), spec.name).numpy()
    lines = [f"{spec.name} [{variant}]: {len(paths)} image(s), host C {run.ms_per_image:.1f} ms per image "
             "(x86 time of the reference kernels, not C7x cycles)"]
    for i, (path, img, out) in enumerate(zip(paths, images, outputs[0])):
        lines.append(f"{path}:")
        if detecting:   # boxes (and masks) in the photo's own pixels, drawn on the photo at its own size
            original = decode_rgb(path)
            rows, masks = _instances(spec, out, outputs, i, tuple(original.shape[1:]))
            out = rows
            lines += [f"  {names[int(r[5])] if int(r[5]) < len(names) else int(r[5])} {r[4]:.2f} "
                      f"box [{r[0]:.0f}, {r[1]:.0f}, {r[2]:.0f}, {r[3]:.0f}] (x1, y1, x2, y2 in pixels of "
                      f"the {original.shape[2]}x{original.shape[1]} image)"
                      + (f", mask {int(masks[j].sum())} pixels" if masks is not None else "")
                      for j, r in enumerate(rows)] or ["  no detection"]
        elif float_out is not None:
            lines.append("  " + _embedding_line(out, float_out[i]))
        elif len(out) == 1:   # a binary classifier's one logit
            lines.append(f"  logit {float(out[0]):.3f}, sigmoid {1 / (1 + np.exp(-float(out[0]))):.3f} "
                         f"(class 1 when above 0.5)")
        else:
            p = torch.softmax(torch.from_numpy(np.asarray(out, np.float32)), 0)
            scores, idx = p.topk(min(top, len(p)))
            lines += [f"  {s:.3f}  {names[i]}" for s, i in zip(scores.tolist(), idx.tolist())]
        if save is not None and not detecting and (float_out is not None or len(out) == 1):
            lines.append("  (nothing drawn for an embedding or a single logit)")
        elif save is not None:
            shown = _unnormalized(img, spec.preprocess)
            target = save / f"{path.stem}.jpg"
            if detecting:
                detections.draw(original.float() / 255, out, target, names=names,
                                font=str(FONT) if FONT.is_file() else None, masks=masks, selected=True)
            else:
                _draw_label(shown, f"{names[idx[0]]} {scores[0]:.2f}", target)
            lines.append(f"  saved {target}")
    return lines


def _instances(spec, det, outputs: list, i: int, size: tuple[int, int]):
    """Image ``i``'s rows ``[k, 6]`` in the photo's pixels (``size`` = its (H, W)) and, for a
    segmentation model, its bool masks ``[k, H, W]`` on the photo (else None): confident rows
    for a detector (:func:`pipeline.data.detections.select`), the instances after NMS for a
    segmentation model (:func:`pipeline.data.segmentation.instances`)."""
    import numpy as np

    from .data import detections, segmentation
    from .data.images import input_to_original, masks_to_original

    masks = None
    if spec.task == "segmentation":
        rows, masks = segmentation.instances(det, outputs[1][i], tuple(spec.input_shape[2:]))
        masks = masks_to_original(masks, spec.preprocess, size)
    else:
        rows = detections.select(det)
    rows = np.array(rows, copy=True)
    rows[:, :4] = input_to_original(rows[:, :4], spec.preprocess, size)
    return rows, masks


def _embedding_line(vec, float_vec) -> str:
    """``768-d vector, norm 12.345, cosine to the float model 0.9987``."""
    from .data.fidelity import cosines
    cos = float(cosines(vec[None], float_vec[None])[0])
    import numpy as np
    return f"{vec.size}-d vector, norm {np.linalg.norm(vec.astype(np.float64)):.3f}, cosine to the float model {cos:.4f}"


def _unnormalized(img, pre):
    """The preprocessed float32 [3, H, W] image back in [0, 1] (undo mean / std)."""
    import torch

    mean, std = torch.tensor(pre.mean).view(3, 1, 1), torch.tensor(pre.std).view(3, 1, 1)
    return (img * std + mean).clamp(0, 1)


def _draw_label(image, label: str, out: Path) -> None:
    """Write ``image`` (float32 [3, H, W] in [0, 1]) as a JPEG with ``label`` in a frame."""
    import torch
    from torchvision.io import encode_jpeg
    from torchvision.utils import draw_bounding_boxes

    from .fsutil import write_bytes

    h, w = image.shape[1:]
    font = {"font": str(FONT), "font_size": 14} if FONT.is_file() else {}  # else PIL's small bitmap font
    drawn = draw_bounding_boxes((image * 255).to(torch.uint8), torch.tensor([[1, 1, w - 2, h - 2]]),
                                labels=[label], colors="orange", width=2, label_colors="black",
                                label_background_colors="orange", fill_labels=True, **font)
    write_bytes(out, encode_jpeg(drawn).numpy().tobytes())


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring). Returns the exit status: 0, or 2 after one line on stderr."""
    ap = argparse.ArgumentParser(prog="python -m pipeline.predict", description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="model name (a models/*.toml file name)")
    ap.add_argument("images", nargs="+", help="image files or folders of .jpg/.jpeg/.png")
    ap.add_argument("--build", default="mmalib", help="which host build runs (mmalib or scalar; default mmalib)")
    ap.add_argument("--top", type=int, default=5, help="labels printed per image (classifiers; default 5)")
    ap.add_argument("--save", type=Path, help="folder to write the images with their labels / boxes drawn")
    ap.add_argument("--models", default="models", help="the models folder (default: models)")
    args = ap.parse_args(argv)
    try:
        from .tasks import Project

        project = Project(args.models)
        spec = next((s for s in project.valid() if s.name == args.model), None)
        if spec is None:
            known = ", ".join(s.name for s in project.valid())
            raise PipelineError(f"no model '{args.model}' in {project.models_dir} (known: {known})")
        paths = image_paths(args.images)
        if args.save is not None:
            args.save.mkdir(parents=True, exist_ok=True)
        print("\n".join(predict(project, spec, paths, args.build, args.top, args.save)))
    except PipelineError as e:
        print(f"predict: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
