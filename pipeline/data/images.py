"""Decode and preprocess labeled image sets (torchvision decoding and transforms).

Labels follow the file-name convention of the shipped set:
``<anything>_<class index>.jpg`` (e.g. ``imagenet_03_990.jpg`` -> class 990).
"""

from __future__ import annotations

import random
import re
from struct import error as struct_error
from pathlib import Path

import joblib
import numpy as np
import torch
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms import v2
from tqdm import tqdm

from ..config import CalibrationSpec, PreprocessSpec, list_images
from ..errors import CalibrationDataError

_LABEL = re.compile(r"_(\d+)\.[A-Za-z]+$")

#: Largest image we decode, in pixels: Pillow's own decompression-bomb limit
#: (``PIL.Image.MAX_IMAGE_PIXELS``, 89,478,485 = 0.25 GiB of 24-bit pixels).
MAX_PIXELS = 89_478_485
#: Largest ratio of an image's long side to its short side. The preprocessing scales the
#: short side up or down to ``resize`` pixels, so memory grows with this ratio, not with
#: the file: a 1,250-byte PNG of 1 x 300,000 pixels would become 256 x 76.8M pixels. At
#: 32:1 (a very wide panorama) the resized RGB float tensor stays near 25 MB.
MAX_ASPECT = 32
#: Pillow modes torchvision's decoders turn into 8-bit RGB.
_MODES = {"1", "L", "LA", "P", "PA", "RGB", "RGBA", "CMYK", "YCbCr"}


def make_transform(pre: PreprocessSpec) -> v2.Compose:
    """uint8 CHW RGB image -> float32 CHW: resize (bilinear, antialiased) the
    shorter side to ``pre.resize``, or to exactly ``(H, W)`` when it is a pair,
    center-crop ``pre.crop``, scale to [0, 1], normalize with
    ``pre.mean``/``pre.std`` (torchvision's ImageNet recipe; the "yolo" preset
    is resize [320, 320], mean 0, std 1: ultralytics' /255 input). With
    ``pre.letterbox``: :class:`LetterBox` instead of resize and crop."""
    if pre.letterbox:
        return v2.Compose([LetterBox(pre.crop), v2.ToDtype(torch.float32, scale=True),
                           v2.Normalize(list(pre.mean), list(pre.std))])
    return v2.Compose([
        v2.Resize(list(pre.resize) if isinstance(pre.resize, tuple) else pre.resize, antialias=True),
        v2.CenterCrop(pre.crop),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(list(pre.mean), list(pre.std)),
    ])


def letterbox_geometry(size: tuple[int, int], side: int) -> tuple[float, int, int, int, int]:
    """``(ratio, new_h, new_w, top, left)`` of ultralytics' ``LetterBox`` (``auto=False``,
    ``center=True``, ``scaleup=True``) for an ``(H, W)`` image into a ``side`` square:
    ``ratio = min(side / H, side / W)``, the scaled size ``round(H * ratio)`` x
    ``round(W * ratio)``, and the top / left padding ``round(pad / 2 - 0.1)``
    (``ultralytics/data/augment.py``, ``LetterBox.__call__``)."""
    h, w = size
    r = min(side / h, side / w)
    nh, nw = int(round(h * r)), int(round(w * r))
    return r, nh, nw, int(round((side - nh) / 2 - 0.1)), int(round((side - nw) / 2 - 0.1))


class LetterBox(torch.nn.Module):
    """uint8 ``[3, H, W]`` -> uint8 ``[3, side, side]``: scaled to fit with the aspect kept
    (bilinear without antialiasing, as OpenCV's ``INTER_LINEAR`` that ultralytics uses),
    padded evenly with gray 114 (:func:`letterbox_geometry`)."""

    def __init__(self, side: int):
        super().__init__()
        self.side = side

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        _, nh, nw, top, left = letterbox_geometry(tuple(img.shape[-2:]), self.side)
        if (nh, nw) != tuple(img.shape[-2:]):
            img = v2.functional.resize(img, [nh, nw], antialias=False)
        return v2.functional.pad(img, [left, top, self.side - nw - left, self.side - nh - top], fill=114)


#: Leading bytes of the formats we name when we refuse them (JPEG and PNG are decoded).
_MAGIC = ((b"\xff\xd8\xff", "JPEG"), (b"\x89PNG\r\n\x1a\n", "PNG"), (b"GIF87a", "GIF"), (b"GIF89a", "GIF"),
          (b"BM", "BMP"), (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"), (b"\x00\x00\x00\x0cjP  ", "JPEG 2000"))


def _kind(raw: bytes) -> str | None:
    if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
        return "WEBP"
    if raw[4:8] == b"ftyp":
        return "HEIF/AVIF"
    return next((kind for magic, kind in _MAGIC if raw.startswith(magic)), None)


def check_header(path: Path, raw: bytes) -> None:
    """Refuse, before any pixel is decoded, what could take the process down or
    decode to something else than one 8-bit picture: not a JPEG or PNG (a GIF
    named ``.jpg``), more than :data:`MAX_PIXELS` pixels (a 74-byte PNG can
    declare 60000x60000 and crash the decoder), sides in a ratio over
    :data:`MAX_ASPECT` (resizing the short side would take the memory), several frames (animated PNG),
    16-bit or float samples.

    The format is told by its leading bytes, and the header is read by Pillow's
    JPEG or PNG plugin class directly (no decoding), not through
    ``PIL.Image.open``: ultralytics replaces that function, when it is imported,
    with one that tries to pip-install a HEIF plugin on an unknown file.

    Raises :class:`CalibrationDataError` naming the file, the reason and what to do."""
    import io

    from PIL.JpegImagePlugin import JpegImageFile
    from PIL.PngImagePlugin import PngImageFile
    fix = "replace or remove the file"
    if not raw:
        raise CalibrationDataError(f"{path}: empty file; {fix}")
    kind = _kind(raw)
    if kind is None:
        raise CalibrationDataError(f"{path}: not a readable JPEG/PNG image (no known image header); {fix}")
    if kind not in ("JPEG", "PNG"):
        raise CalibrationDataError(f"{path}: is a {kind} image, not a JPEG or PNG; convert it or remove the file")
    try:
        im = (JpegImageFile if kind == "JPEG" else PngImageFile)(io.BytesIO(raw))
        (w, h), mode, frames = im.size, im.mode, getattr(im, "n_frames", 1)
    except (OSError, ValueError, SyntaxError, EOFError, IndexError, struct_error) as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:120]
        raise CalibrationDataError(f"{path}: not a readable JPEG/PNG image ({reason}); {fix}") from None
    if w * h > MAX_PIXELS or w <= 0 or h <= 0:
        raise CalibrationDataError(f"{path}: declares {w}x{h} pixels, too many pixels to decode safely "
                                   f"(over {MAX_PIXELS:,}); resize it or remove the file")
    if max(w, h) > MAX_ASPECT * min(w, h):
        raise CalibrationDataError(f"{path}: declares {w}x{h} pixels, sides in a ratio over {MAX_ASPECT}:1 that "
                                   f"resizing would blow up in memory; crop it or remove the file")
    if kind == "PNG" and frames != 1:
        raise CalibrationDataError(f"{path}: an animated PNG ({frames} frames); save one frame or remove the file")
    if mode not in _MODES:
        raise CalibrationDataError(f"{path}: {mode} samples (16-bit or float), not 8-bit; save it as 8-bit "
                                   f"RGB or remove the file")


def load_image(path: Path, transform) -> torch.Tensor:
    """Decode one image file to a preprocessed float32 [3, crop, crop] tensor.

    Raises :class:`CalibrationDataError` naming the file when it is not a
    readable JPEG/PNG, or fails :func:`check_header`.
    """
    return transform(decode_rgb(path))


def decode_rgb(path: Path) -> torch.Tensor:
    """The image file ``path`` as uint8 RGB ``[3, H, W]`` at its own size; errors as :func:`load_image`."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise CalibrationDataError(f"{path}: cannot be read ({e.strerror}); fix its permissions or remove it") from None
    check_header(path, raw)
    try:
        img = decode_image(torch.frombuffer(bytearray(raw), dtype=torch.uint8), mode=ImageReadMode.RGB)
    except (RuntimeError, ValueError) as e:
        raise CalibrationDataError(
            f"{path}: not a readable JPEG/PNG image ({_decoder_reason(e)}); replace or remove the file") from None
    return img


def input_to_original(boxes: np.ndarray, pre: PreprocessSpec, size: tuple[int, int]) -> np.ndarray:
    """Boxes ``[..., 4]`` (x1, y1, x2, y2 in the model input's pixels) -> the original image's pixels
    (an ``(H, W)`` ``size`` image preprocessed by :func:`make_transform`), clamped to the image.
    Undoes the crop offset and the resize as torchvision computes them (:func:`_resize_geometry`),
    or the letterbox as ultralytics' ``scale_boxes`` does (padding off, divided by the ratio)."""
    h0, w0 = size
    out = np.array(boxes, dtype=np.float64, copy=True)
    if pre.letterbox:
        r, _, _, top, left = letterbox_geometry(size, pre.crop)
        out[..., 0::2] = np.clip((out[..., 0::2] - left) / r, 0, w0)
        out[..., 1::2] = np.clip((out[..., 1::2] - top) / r, 0, h0)
        return out + 0.0
    rh, rw, top, left = _resize_geometry(pre, size)
    out[..., 0::2] = np.clip((out[..., 0::2] + left) * w0 / rw, 0, w0)
    out[..., 1::2] = np.clip((out[..., 1::2] + top) * h0 / rh, 0, h0)
    return out + 0.0   # no "-0" printed for a box at the border


def masks_to_original(masks: np.ndarray, pre: PreprocessSpec, size: tuple[int, int]) -> np.ndarray:
    """bool masks ``[k, crop, crop]`` on the model input -> bool ``[k, H, W]`` on the original
    ``(H, W)`` image: the letterbox's padding cut off (or the crop put back in the resized
    frame, nothing outside it), then resized to the image by nearest neighbour."""
    k = len(masks)
    if pre.letterbox:
        _, nh, nw, top, left = letterbox_geometry(size, pre.crop)
        frame = masks[:, top:top + nh, left:left + nw]
    else:
        rh, rw, top, left = _resize_geometry(pre, size)
        frame = np.zeros((k, rh, rw), dtype=bool)
        frame[:, top:top + pre.crop, left:left + pre.crop] = masks
    if k == 0:
        return np.zeros((0, *size), dtype=bool)
    t = torch.from_numpy(np.ascontiguousarray(frame)).to(torch.uint8)[:, None]
    return torch.nn.functional.interpolate(t, size=size, mode="nearest")[:, 0].numpy().astype(bool)


def _resize_geometry(pre: PreprocessSpec, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """``(resized H, resized W, crop top, crop left)`` of :func:`make_transform` on an ``(H, W)``
    image, as torchvision computes them (``Resize``: the short side to ``resize``, the long one
    ``int(resize * long / short)``, or exactly ``(H, W)``; ``CenterCrop``:
    ``round((side - crop) / 2)`` cut before)."""
    h0, w0 = size
    if isinstance(pre.resize, tuple):
        rh, rw = pre.resize
    elif h0 <= w0:
        rh, rw = pre.resize, int(pre.resize * w0 / h0)
    else:
        rh, rw = int(pre.resize * h0 / w0), pre.resize
    return rh, rw, int(round((rh - pre.crop) / 2.0)), int(round((rw - pre.crop) / 2.0))


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
    files = list_images(folder, strict=True)
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
