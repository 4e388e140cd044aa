"""Calibration batches: what calibrate, its shards and the int16 sensitivity pass feed the model."""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import ModelSpec
from .images import iter_images


def calibration_batches(spec: ModelSpec, images: list[Path]):
    """Yield float32 NCHW batches of ``spec.calibration.batch_size`` images
    (or of Gaussian noise, seed ``calibration.seed``, for ``source = "random"``)."""
    cal = spec.calibration
    if cal.source == "random":
        gen = torch.Generator().manual_seed(cal.seed)
        n = cal.num_images or 8
        for i in range(0, n, cal.batch_size):
            yield torch.randn(min(cal.batch_size, n - i), *spec.input_shape[1:], generator=gen)
        return
    batch = []
    for x in iter_images(images, spec.preprocess, model=spec.name):
        batch.append(x)
        if len(batch) == cal.batch_size:
            yield torch.stack(batch)
            batch = []
    if batch:
        yield torch.stack(batch)
