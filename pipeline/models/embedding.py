"""Image-embedding builders: a torchvision backbone whose classifier is a projection.

``builder = "pipeline.models.embedding:resnet50_tanh"`` in a model entry: torchvision's ResNet-50
with its ``fc`` replaced by a ``2048 -> dim`` projection and a ``tanh`` on the output, under the
module name ``pre`` (the layout of imgsim's image-similarity checkpoint, whose keys carry a
``module.pre.`` prefix: the entry strips ``module.``). No module of the checkpoint's package is
imported; the architecture is rebuilt here from torchvision.
"""

from __future__ import annotations

import torch
from torch import nn


class TanhEmbedding(nn.Module):
    """``tanh(pre(x))``: a backbone ``pre`` ending in a linear projection, squashed to (-1, 1).

    Input float32 NCHW ``[N, 3, H, W]`` (ImageNet mean/std); output float32 ``[N, dim]``.
    """

    def __init__(self, pre: nn.Module):
        super().__init__()
        self.pre = pre

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.pre(x))


def resnet50_tanh(dim: int = 768) -> TanhEmbedding:
    """torchvision ResNet-50 with ``fc`` = ``Linear(2048, dim)``, then ``tanh`` (random init; the
    export stage loads the checkpoint). Returns the module in eval mode."""
    import torchvision
    return TanhEmbedding(torchvision.models.resnet50(weights=None, num_classes=dim)).eval()
