"""torchvision classifiers with realistic random weights (no download), for the model-zoo sweep.

A model entry uses it as a builder with ``pretrained = false`` (the weights come
from this function, not from a checkpoint)::

    builder = "pipeline.models.zoo:torchvision_random"
    builder_kwargs = { name = "mobilenet_v3_small", images = "calib_data/imagenet20", num_images = 8 }
    input_shape = [1, 3, 224, 224]
    [weights]
    pretrained = false

torchvision's random init gives degenerate numerics: depthwise convs initialised
with ``kaiming_normal_(mode="fan_out")`` shrink the activations layer by layer and
BatchNorm's default running statistics (mean 0, var 1) never undo it, so e.g.
MobileNetV2's logits are about 1e-14 and the output scale collapses (issue 13).
:func:`torchvision_random` therefore

1. builds ``torchvision.models.get_model(name, weights=None)`` after
   ``torch.manual_seed(seed)`` (deterministic);
2. re-estimates every BatchNorm's running mean/var on the images: one
   train-mode forward pass of all images as one batch with ``momentum = None``
   (the cumulative average, here exactly the batch statistics), every other
   module in eval mode (dropout, stochastic depth off); this is the standard
   "BN re-calibration" and makes each BN output about zero-mean, unit-variance;
3. rescales the final classifier (the last ``nn.Linear``, else the last
   ``nn.Conv2d``; re-drawn when torchvision initialises it to zero, as ViT's)
   so that the logits' standard deviation over the images, averaged over the
   classes, is ``logit_std``; when that layer's output is the
   model output, its bias is also shifted so each logit has mean 0 over the
   images (an input-independent offset would otherwise eat the int8 range).
   With a positively homogeneous tail (ReLU, average pool) the scaling is exact.

Images: ``images`` is a folder of .jpg/.jpeg/.png files (a relative path is
taken from the current directory, which is the project root under doit), the
first ``num_images`` in sorted order (0 = all, at least 2), preprocessed with
``resize``/``crop`` and ImageNet mean/std (torchvision's classification recipe).

Staleness: the export stage tracks ``builder_kwargs`` but not the image files,
so editing an image in that folder does not re-run export by itself. Give
``images_sha256`` (:func:`images_digest` of the folder) to make export fail in
one line, with the new digest, when the images changed; the sweep
(``scripts/sweep.py``) always builds in a fresh project and does not need it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from .batchnorm import reestimate_batchnorm

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


def image_paths(images: str | Path, num_images: int = 0) -> list[Path]:
    """The first ``num_images`` (0 = all) image files of folder ``images``, sorted by name.

    Raises ValueError naming the folder when it holds fewer than 2 images (BatchNorm
    statistics of one image are degenerate for the 1x1 layers after global pooling).
    """
    from ..config import list_images
    paths = list_images(images)
    paths = paths[:num_images] if num_images else paths
    if len(paths) < 2:
        raise ValueError(f"torchvision_random: {images} holds {len(paths)} image(s) (.jpg/.jpeg/.png); "
                         f"re-estimating BatchNorm needs at least 2: add images or fix 'images'")
    return paths


def images_digest(paths: list[Path]) -> str:
    """sha256 over the names and contents of ``paths`` (the ``images_sha256`` builder kwarg)."""
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def torchvision_random(name: str, images: str, num_images: int = 0, seed: int = 0,
                       logit_std: float = 2.0, images_sha256: str | None = None,
                       **model_kwargs) -> torch.nn.Module:
    """torchvision classifier ``name`` with seeded random weights, BatchNorm statistics
    re-estimated on ``images`` and the classifier scaled to ``logit_std`` (module doc).

    Input of the returned module: float32 NCHW ``[N, 3, crop, crop]`` (:func:`crop_of`),
    ImageNet-normalised; output float32 ``[N, num_classes]`` logits. Returns it in eval
    mode. Raises ValueError for an unknown model name, too few images, or an
    ``images_sha256`` that does not match the images.
    """
    import torchvision
    from ..config import PreprocessSpec
    from ..data.images import load_images

    if name not in torchvision.models.list_models(module=torchvision.models):
        raise ValueError(f"torchvision_random: {name!r} is not a torchvision classification model; "
                         f"see torchvision.models.list_models(module=torchvision.models)")
    paths = image_paths(images, num_images)
    if images_sha256 is not None and images_digest(paths) != images_sha256:
        raise ValueError(f"torchvision_random: the images in {images} changed since images_sha256 was set; "
                         f"set images_sha256 = \"{images_digest(paths)}\" to rebuild with them")
    crop = crop_of(name)
    x = load_images(paths, PreprocessSpec(resize=crop * 8 // 7, crop=crop), desc="bn images", n_jobs=1)
    torch.manual_seed(seed)
    model = torchvision.models.get_model(name, weights=None, **{**MODEL_KWARGS.get(name, {}), **model_kwargs})
    with torch.no_grad():
        reestimate_batchnorm(model, x, batch=None)  # one pass: exactly the images' statistics
        scale_classifier(model, x, logit_std)
    return model.eval()


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
    :func:`torchvision_random`), else no scaling could make the logits vary. Returns the
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
