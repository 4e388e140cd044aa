"""Decode and preprocess labeled image sets (torchvision decoding and transforms).

Labels follow the file-name convention of the shipped set:
``<anything>_<class index>.jpg`` (e.g. ``imagenet_03_990.jpg`` -> class 990).
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import joblib
import torch
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms import v2
from tqdm import tqdm

from ..config import CalibrationSpec, PreprocessSpec, list_images
from ..errors import CalibrationDataError

_LABEL = re.compile(r"_(\d+)\.[A-Za-z]+$")


def make_transform(pre: PreprocessSpec) -> v2.Compose:
    """uint8 CHW RGB image -> float32 CHW: resize (bilinear, antialiased) the
    shorter side to ``pre.resize``, or to exactly ``(H, W)`` when it is a pair,
    center-crop ``pre.crop``, scale to [0, 1], normalize with
    ``pre.mean``/``pre.std`` (torchvision's ImageNet recipe; the "yolo" preset
    is resize [320, 320], mean 0, std 1: ultralytics' /255 input)."""
    return v2.Compose([
        v2.Resize(list(pre.resize) if isinstance(pre.resize, tuple) else pre.resize, antialias=True),
        v2.CenterCrop(pre.crop),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(list(pre.mean), list(pre.std)),
    ])


def load_image(path: Path, transform) -> torch.Tensor:
    """Decode one image file to a preprocessed float32 [3, crop, crop] tensor.

    Raises :class:`CalibrationDataError` naming the file when it is not a
    readable JPEG/PNG.
    """
    raw = path.read_bytes()
    try:
        if not raw:
            raise ValueError("empty file")
        img = decode_image(torch.frombuffer(bytearray(raw), dtype=torch.uint8), mode=ImageReadMode.RGB)
    except (RuntimeError, ValueError) as e:
        raise CalibrationDataError(
            f"{path}: not a readable JPEG/PNG image ({_decoder_reason(e)}); replace or remove the file") from None
    return transform(img)


def _decoder_reason(e: Exception) -> str:
    """torchvision's message without its C++ source location, first sentence only."""
    msg = str(e).splitlines()[0]
    if ".cpp:" in msg:  # "decode_jpeg, /path/decode_jpeg.cpp:171, Image is incomplete or truncated"
        msg = msg.split(", ", 2)[-1]
    return msg.split(". ")[0].rstrip(".")


def label_of(path: Path) -> int | None:
    """Class index encoded in the file name, or None."""
    m = _LABEL.search(path.name)
    return int(m.group(1)) if m else None


def select_images(folder: Path, calib: CalibrationSpec, model: str) -> list[Path]:
    """The calibration images in their deterministic order, capped at ``num_images``.

    Raises :class:`CalibrationDataError` when the folder is missing or empty.
    """
    files = list_images(folder)
    if not files:
        fetchable = folder.with_name(folder.name + ".source.toml").is_file()
        fix = ("run `python -m pipeline.assets` to fetch it" if fetchable
               else "add .jpg/.jpeg/.png images there or point calibration.set at another folder")
        raise CalibrationDataError(
            f"model {model!r}: calibration folder {folder} is missing or holds no .jpg/.jpeg/.png "
            f"images; {fix}")
    if calib.order == "shuffled":
        random.Random(calib.seed).shuffle(files)
    return files[: calib.num_images] if calib.num_images else files


def _decode(path: Path, transform) -> torch.Tensor | CalibrationDataError:
    """Worker job: the error is returned, not raised, so the pool never dies mid-batch."""
    try:
        return load_image(path, transform)
    except CalibrationDataError as e:
        return e


def iter_images(paths: list[Path], pre: PreprocessSpec, n_jobs: int = 2, model: str | None = None):
    """Yield preprocessed float32 [3, crop, crop] tensors in ``paths`` order.

    Decoding runs ahead in joblib threads (torchvision's decoders release the
    GIL), so the consumer (calibration, evaluation) overlaps with it. Raises
    :class:`CalibrationDataError` for the first unreadable file, after the
    queued decodes finished: a thread still inside torchvision when the
    interpreter exits aborts the process ("terminate called without an
    active exception").
    """
    transform = make_transform(pre)
    jobs = (joblib.delayed(_decode)(p, transform) for p in paths)
    with joblib.Parallel(n_jobs=n_jobs, prefer="threads", return_as="generator") as parallel:
        results = parallel(jobs)
        try:
            for r in results:
                if isinstance(r, CalibrationDataError):
                    raise CalibrationDataError(f"model {model!r}: {r}" if model else str(r))
                yield r
        finally:
            for _ in results:  # let every queued decode finish before leaving
                pass


def load_images(paths: list[Path], pre: PreprocessSpec, desc: str, n_jobs: int = 2,
                model: str | None = None) -> torch.Tensor:
    """All of ``paths`` as one float32 NCHW tensor, behind a progress bar (img/s)."""
    it = tqdm(iter_images(paths, pre, n_jobs, model), total=len(paths), desc=desc, unit="img", leave=False,
              disable=None)  # None: a live bar on a terminal, silent in logs
    return torch.stack(list(it))
