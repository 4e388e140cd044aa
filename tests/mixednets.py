"""A tiny net with named submodules for the mixed-precision tests (tests/quant/test_mixed_precision.py,
tests/stages/test_mixed_staleness.py); doit test projects use it as ``builder = "mixednets:outlier_net"``."""

import torch
import torch.nn as nn


def conv_bn(cin, cout, stride=1, groups=1):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU6(inplace=True))


class Block(nn.Module):
    """Residual: x + project(depthwise(expand(x)))."""

    def __init__(self, c):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(c, 2 * c, 1), nn.ReLU6(inplace=True), conv_bn(2 * c, 2 * c, groups=2 * c),
                                  nn.Conv2d(2 * c, c, 1))

    def forward(self, x):
        return x + self.conv(x)


class TinyNet(nn.Module):
    """3x32x32 -> 10: features.0 (conv-BN-ReLU6, stride 2), features.1 (residual block),
    features.2 (1x1 conv + ReLU), features.3 (1x1 conv), pool, classifier.1 (linear).

    ``outlier``: channel 0 of features.2's output is scaled up by that factor and
    features.3's weights on it scaled down (the float function is unchanged; in int8
    that tensor's scale leaves the other channels a few codes)."""

    def __init__(self, outlier: float = 1.0):
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(conv_bn(3, 8, 2), Block(8), nn.Sequential(nn.Conv2d(8, 16, 1), nn.ReLU()),
                                      nn.Conv2d(16, 16, 1))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.1), nn.Linear(16, 10))
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.running_var.uniform_(0.5, 1.5)
                    m.running_mean.uniform_(-0.1, 0.1)
            conv = self.features[2][0]
            conv.weight[0] *= outlier
            conv.bias[0] = conv.bias[0].abs() * outlier
            self.features[3].weight[:, 0] /= outlier

    def forward(self, x):
        return self.classifier(self.pool(self.features(x)).flatten(1))


def outlier_net() -> nn.Module:
    """Builder: :class:`TinyNet` with a 300x outlier channel between features.2 and features.3."""
    return TinyNet(outlier=300.0)
