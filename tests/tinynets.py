"""Tiny random-init networks used as model builders in doit-level tests.

Referenced from test projects' model entries as ``builder = "tinynets:<name>"``.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class SmallCNN(nn.Module):
    """3x32x32 -> 10 classes: conv-BN-ReLU, maxpool, residual block, depthwise, linear."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.pool = nn.MaxPool2d(2)
        self.c1 = nn.Conv2d(16, 16, 3, 1, 1)
        self.dw = nn.Sequential(nn.Conv2d(16, 16, 3, 2, 1, groups=16), nn.ReLU6())
        self.pw = nn.Conv2d(16, 32, 1)
        self.fc = nn.Linear(32, classes)

    def forward(self, x):
        y = self.pool(self.stem(x))
        y = F.relu(self.c1(y) + y)
        y = self.pw(self.dw(y))
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))


def small_cnn(classes: int = 10) -> nn.Module:
    """Builder: :class:`SmallCNN` with its (seeded by the export stage) random init."""
    return SmallCNN(classes)


class _Crashing(nn.Module):
    def train(self, mode: bool = True):
        raise RuntimeError("boom inside the builder")


def crashing() -> nn.Module:
    """Builder whose module fails the way a bug would, after the builder returned
    (``model.eval()`` raises): tests the unexpected-error path with its traceback file.
    A builder that raises itself is the user's error, reported in one line instead."""
    return _Crashing()


class ActivationCNN(nn.Module):
    """3x32x32 -> 10: conv + hardswish, squeeze-excitation (hardsigmoid gate), SiLU,
    sigmoid, GELU, global average pool, linear (the element-wise activations of
    MobileNetV3 / EfficientNet / RegNet)."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, 2, 1)
        self.se1, self.se2 = nn.Conv2d(16, 4, 1), nn.Conv2d(4, 16, 1)
        self.c2 = nn.Conv2d(16, 16, 3, 1, 1)
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        y = F.hardswish(self.c1(x))
        y = y * F.hardsigmoid(self.se2(F.relu(self.se1(F.adaptive_avg_pool2d(y, 1)))))
        y = F.gelu(F.silu(self.c2(y)).sigmoid())
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))


def activation_cnn(classes: int = 10) -> nn.Module:
    """Builder: :class:`ActivationCNN` (random init)."""
    return ActivationCNN(classes)


class TwoHeadCNN(nn.Module):
    """3x32x32 -> (10 logits, the 16x16x16 feature map the classifier reads): a
    model with two outputs, returned in that order."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU())
        self.c1 = nn.Conv2d(16, 16, 3, 1, 1)
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        y = F.relu(self.c1(self.stem(x)))
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1)), y


def two_head_cnn(classes: int = 10) -> nn.Module:
    """Builder: :class:`TwoHeadCNN` (random init)."""
    return TwoHeadCNN(classes)


class SharedHeadCNN(TwoHeadCNN):
    """3x32x32 -> (10 logits, their softmax): the first output is also the input
    of the second head, so the C reads it back from the caller's buffer."""

    def forward(self, x):
        logits = super().forward(x)[0]
        return logits, F.softmax(logits, 1)


def shared_head_cnn(classes: int = 10) -> nn.Module:
    """Builder: :class:`SharedHeadCNN` (random init)."""
    return SharedHeadCNN(classes)


class ShuffleCNN(nn.Module):
    """3x32x32 -> 10: conv-BN-ReLU stem, then torchvision's ShuffleNetV2 units: one
    stride-2 (two branches concatenated, channel shuffle) and two stride-1 (channel
    split, one branch, concat, channel shuffle, so a shuffle feeds the next split),
    a 1x1 conv, global average pool, linear."""

    def __init__(self, classes: int = 10):
        from torchvision.models.shufflenetv2 import InvertedResidual
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.units = nn.Sequential(InvertedResidual(16, 32, 2), InvertedResidual(32, 32, 1),
                                   InvertedResidual(32, 32, 1))
        self.head = nn.Sequential(nn.Conv2d(32, 64, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        y = self.head(self.units(self.stem(x)))
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))


def shuffle_cnn(classes: int = 10) -> nn.Module:
    """Builder: :class:`ShuffleCNN` (random init)."""
    return ShuffleCNN(classes)


class ResidualNet(nn.Module):
    """stem conv (ReLU) -> 1x1 projection (no act) -> two residual blocks
    (1x1 ReLU6 expand, 3x3 depthwise ReLU6, 1x1 project, add) -> 1x1 head (ReLU) -> GAP -> fc.
    The projections and adds form one rescalable stream; the stream channels get
    deliberately uneven ranges (outlier channels, as MobileNetV2's)."""

    def __init__(self, c=8, e=16, classes=10):
        super().__init__()
        self.stem = nn.Conv2d(3, 12, 3, padding=1)
        self.proj0 = nn.Conv2d(12, c, 1)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Conv2d(c, e, 1), nn.ReLU6(), nn.Conv2d(e, e, 3, padding=1, groups=e),
                                                  nn.ReLU6(), nn.Conv2d(e, c, 1)) for _ in range(2))
        self.head = nn.Conv2d(c, 16, 1)
        self.fc = nn.Linear(16, classes)
        with torch.no_grad():
            gain = torch.ones(c)
            gain[:2] = 20.0   # two outlier channels of the stream
            self.proj0.weight.mul_(gain.view(-1, 1, 1, 1))
            self.proj0.bias.mul_(gain)

    def forward(self, x):
        y = self.proj0(torch.relu(self.stem(x)))
        for b in self.blocks:
            y = y + b(y)
        return self.fc(torch.relu(self.head(y)).mean((2, 3)))


def residual_net(classes: int = 10) -> nn.Module:
    """A seeded :class:`ResidualNet` (16x16 input; tests/quant/test_equalize.py)."""
    torch.manual_seed(0)
    return ResidualNet(classes=classes).eval()
