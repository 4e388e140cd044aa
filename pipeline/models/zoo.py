"""torchvision classifiers with realistic random weights (no download), for the model-zoo sweep.

A model entry uses it as a builder with random weights made realistic by export
on the calibration images::

    builder = "pipeline.models.zoo:torchvision_random"
    builder_kwargs = { name = "mobilenet_v3_small", seed = 0 }
    input_shape = [1, 3, 224, 224]
    [weights]
    pretrained = false
    reestimate_batchnorm = true
    batchnorm_batch = 0     # all calibration images in one pass: exactly their statistics
    logit_std = 2.0

torchvision's random init gives degenerate numerics: depthwise convs initialised
with ``kaiming_normal_(mode="fan_out")`` shrink the activations layer by layer and
BatchNorm's default running statistics (mean 0, var 1) never undo it, so e.g.
MobileNetV2's logits are about 1e-14 and the output scale collapses.
So :func:`torchvision_random` builds ``torchvision.models.get_model(name,
weights=None)`` after ``torch.manual_seed(seed)`` (deterministic), and export
(:func:`pipeline.models.random_weights.make_realistic`, on the entry's
calibration selection, whose files the export task tracks)

1. re-estimates every BatchNorm's running mean/var on the images: train-mode
   forward passes with ``momentum = None`` (the cumulative average; one pass of
   all images gives exactly their statistics), every other module in eval mode
   (dropout, stochastic depth off); this is the standard "BN re-calibration" and
   makes each BN output about zero-mean, unit-variance;
2. rescales the final classifier (the last ``nn.Linear``, else the last
   ``nn.Conv2d``; re-drawn when torchvision initialises it to zero, as ViT's)
   so that the logits' standard deviation over the images, averaged over the
   classes, is ``logit_std``; when that layer's output is the
   model output, its bias is also shifted so each logit has mean 0 over the
   images (an input-independent offset would otherwise eat the int8 range).
   With a positively homogeneous tail (ReLU, average pool) the scaling is exact.
"""

from __future__ import annotations

import torch

#: builder kwargs that differ from torchvision's defaults: GoogLeNet/Inception without the
#: auxiliary heads (eval mode never runs them) and with the init they warn about otherwise.
MODEL_KWARGS = {
    "googlenet": {"aux_logits": False, "init_weights": True},
    "inception_v3": {"aux_logits": False, "init_weights": True},
}
#: input crop (resize = crop * 8 / 7, torchvision's ratio) of models trained at another size.
CROP = {"inception_v3": 299}


def crop_of(name: str) -> int:
    """Input height = width (pixels) the sweep uses for torchvision model ``name`` (224 by default)."""
    return CROP.get(name, 224)


def torchvision_random(name: str, seed: int = 0, **model_kwargs) -> torch.nn.Module:
    """torchvision classifier ``name`` with seeded random weights (``torch.manual_seed(seed)``
    before ``get_model(name, weights=None)``; :data:`MODEL_KWARGS` applied). Export then
    makes it realistic on the calibration images (module doc).

    Input of the returned module: float32 NCHW ``[N, 3, crop, crop]`` (:func:`crop_of`),
    ImageNet-normalised; output float32 ``[N, num_classes]`` logits. Returns it in eval
    mode. Raises ValueError for an unknown model name.
    """
    import torchvision

    if name not in torchvision.models.list_models(module=torchvision.models):
        raise ValueError(f"torchvision_random: {name!r} is not a torchvision classification model; "
                         f"see torchvision.models.list_models(module=torchvision.models)")
    torch.manual_seed(seed)
    model = torchvision.models.get_model(name, weights=None, **{**MODEL_KWARGS.get(name, {}), **model_kwargs})
    return model.eval()
