"""Random-weight models made numerically realistic on real images: BatchNorm
statistics re-estimated, the classifier centred and scaled.

The one route for both is export's (``[weights] reestimate_batchnorm`` and
``logit_std``, :func:`make_realistic`): export reads the model's calibration
selection, and the task tracks those files, so an edited image re-runs export.

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


def final_layer(model: torch.nn.Module) -> torch.nn.Module:
    """The classifier: the last ``nn.Linear`` in module order, else the last ``nn.Conv2d``
    (SqueezeNet's 1x1 conv). Raises ValueError when there is neither."""
    for kind in (torch.nn.Linear, torch.nn.Conv2d):
        found = [m for m in model.modules() if isinstance(m, kind)]
        if found:
            return found[-1]
    raise ValueError(f"{type(model).__name__}: no Linear or Conv2d layer to scale")


def scale_classifier(model: torch.nn.Module, x: torch.Tensor, logit_std: float) -> float:
    """Center, then scale the final layer so the logits' std over the images (per class,
    averaged) is ``logit_std``.

    Centering shifts the layer's bias: by the mean over the images of each logit when
    the layer's output is the model output (a Linear head), else by the mean over
    images and pixels of each output channel (SqueezeNet's conv before ReLU and average
    pool, where one class would otherwise win on every image). Scaling multiplies
    weight and bias by one factor, exact through a positively homogeneous tail (ReLU,
    average pool). A final layer whose weights are all zero (torchvision's ViT head) is
    first drawn from N(0, 1/fan_in) (LeCun normal, the global torch RNG: seeded by
    ``pipeline.models.zoo.torchvision_random``), else no scaling could make the logits vary. Returns the
    factor (1.0 if the logits do not vary at all, which the sweep then reports as
    degenerate).
    """
    layer = final_layer(model)
    if not layer.weight.any():
        # a zero-initialised head (torchvision's VisionTransformer: heads.head) makes every
        # logit its bias, the same on every image: give it LeCun-normal weights first
        torch.nn.init.normal_(layer.weight, std=layer.weight[0].numel() ** -0.5)
    if layer.bias is not None:
        out, y = _forward_with(model, layer, x)
        if out.shape == y.shape and torch.equal(out, y):  # the layer is the output
            layer.bias.sub_(y.mean(dim=0).reshape(layer.bias.shape))
        elif out.dim() == 4:
            layer.bias.sub_(out.mean(dim=(0, 2, 3)))
    std = float(model(x).std(dim=0).mean())
    factor = logit_std / std if std > 0 else 1.0
    layer.weight.mul_(factor)
    if layer.bias is not None:
        layer.bias.mul_(factor)
    return factor


def _forward_with(model: torch.nn.Module, layer: torch.nn.Module, x: torch.Tensor):
    """(output of ``layer``, output of ``model``) for input ``x``."""
    seen = {}
    handle = layer.register_forward_hook(lambda m, i, o: seen.__setitem__("out", o))
    try:
        y = model(x)
    finally:
        handle.remove()
    return seen["out"], y


def make_realistic(model: torch.nn.Module, images: torch.Tensor, *, reestimate: bool,
                   batch: int = BATCH, logit_std: float | None = None) -> dict:
    """Export's route for a random-weight model (``[weights] reestimate_batchnorm``,
    ``batchnorm_batch``, ``logit_std``): re-estimate every BatchNorm on ``images``
    (float32 NCHW, preprocessed as the model expects; ``batch`` images per pass, 0 = all
    in one pass), then centre and scale the classifier to ``logit_std``
    (:func:`scale_classifier`), in that order: the head's scale depends on the statistics.
    Returns what was done: ``{"batchnorm_layers": n}`` and / or ``{"logit_scale": factor}``.
    Leaves the model in eval mode."""
    done = {}
    with torch.no_grad():
        if reestimate:
            done["batchnorm_layers"] = reestimate_batchnorm(model, images, batch=batch or None)
        if logit_std is not None:
            model.eval()
            done["logit_scale"] = scale_classifier(model, images, logit_std)
    model.eval()
    return done
