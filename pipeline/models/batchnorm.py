"""BatchNorm statistics re-estimated on real images (for random-weight models).

A randomly initialised CNN keeps BatchNorm's initial running statistics
(mean 0, variance 1), which do not describe its activations: measured on
YOLO26n with ultralytics' init, the activations shrink layer by layer and
every one of the 300 output scores is the same number (the classifier bias),
so a "bit-exact" check compares constants. Re-estimating the statistics on
the calibration images (AdaBN, Li et al. 2016, "Revisiting Batch
Normalization For Practical Domain Adaptation") makes every layer see
normalised activations again, so the outputs vary with the input. Random
noise does not work: statistics taken on noise images blow up on photos
(measured: every YOLO26n score saturated at 1.0).
"""

from __future__ import annotations

import torch

#: images per forward pass; the statistics are a cumulative average over batches
BATCH = 8


def reestimate_batchnorm(model: torch.nn.Module, images: torch.Tensor, batch: int | None = BATCH) -> int:
    """Replace every BatchNorm's running mean / variance by its statistics on ``images``.

    ``images``: float32 NCHW ``[N, C, H, W]``, preprocessed as the model expects.
    Only the BatchNorm layers run in training mode (dropout and detection
    heads keep their eval behaviour); ``momentum = None`` makes the running
    values the plain average over the ``ceil(N / batch)`` batches (``batch``
    None: one pass of all images, whose statistics they then are). The model is
    left in eval mode. Returns the number of BatchNorm layers updated (0: the
    model has none, nothing changed). Raises ValueError for an empty ``images``.
    """
    if len(images) == 0:
        raise ValueError("no images to re-estimate the BatchNorm statistics on")
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    model.eval()
    saved = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
        m.train()
    with torch.no_grad():
        step = batch or len(images)
        for i in range(0, len(images), step):
            model(images[i:i + step])
    for m, momentum in zip(norms, saved):
        m.momentum = momentum
    model.eval()
    return len(norms)
