"""Small hand-built nets, one per quantizer rule (shapes in each docstring).

``tests/qflow.py`` provides ConvReluPool, ResidualBlock and InvertedResidual;
these add the ops that those do not reach.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def _seeded(module: nn.Module, seed: int = 0) -> nn.Module:
    """Re-initialise ``module``'s parameters from a fixed seed (tests are deterministic)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return module


class ConvThen(nn.Module):
    """x [1,3,8,8] -> conv3x3 (3->8, bias ``bias``) -> ``op`` -> conv1x1 (8->8).

    A negative bias puts the conv output's largest magnitude on the negative side,
    so an activation that clips negatives changes the symmetric scale: an
    independent output observer then differs from a shared one."""

    def __init__(self, op: nn.Module, bias: float = 0.0, tail: bool = True):
        super().__init__()
        self.c1 = _seeded(nn.Conv2d(3, 8, 3, 1, 1))
        with torch.no_grad():
            self.c1.bias.fill_(bias)
        self.op = op
        self.c2 = _seeded(nn.Conv2d(8, 8, 1), 1) if tail else nn.Identity()

    def forward(self, x):
        return self.c2(self.op(self.c1(x)))


class Lambda(nn.Module):
    """Wrap a function as a module (for ops with no nn module: view, permute...)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


class DepthwiseNet(nn.Module):
    """x [1,8,8,8] -> depthwise conv3x3 (groups=8, bias) -> pointwise conv1x1 8->16."""

    def __init__(self):
        super().__init__()
        self.dw = _seeded(nn.Conv2d(8, 8, 3, 1, 1, groups=8))
        self.pw = _seeded(nn.Conv2d(8, 16, 1), 1)

    def forward(self, x):
        return self.pw(self.dw(x))


class LinearNet(nn.Module):
    """x [2,16] -> linear 16->32 -> relu -> linear 32->8."""

    def __init__(self):
        super().__init__()
        self.fc1 = _seeded(nn.Linear(16, 32))
        self.fc2 = _seeded(nn.Linear(32, 8), 1)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class MatMulNet(nn.Module):
    """x [4,16]: ``mm(x, w)`` [4,8] and ``addmm(b, x, w)`` [4,8] with a parameter w [16,8]."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 8, generator=torch.Generator().manual_seed(0)))
        self.b = nn.Parameter(torch.randn(8, generator=torch.Generator().manual_seed(1)))

    def forward(self, x):
        return torch.mm(x, self.w), torch.addmm(self.b, x, self.w)


class AddNet(nn.Module):
    """x [1,3,8,8] -> two conv3x3 (3->8) branches added (add.Tensor, or add_.Tensor when
    ``inplace`` as in torchvision's ResNet), with or without a relu after the add."""

    def __init__(self, relu: bool, inplace: bool = False):
        super().__init__()
        self.a = _seeded(nn.Conv2d(3, 8, 3, 1, 1))
        self.b = _seeded(nn.Conv2d(3, 8, 3, 1, 1), 1)
        self.relu = relu
        self.inplace = inplace

    def forward(self, x):
        y = self.a(x)
        if self.inplace:
            y += self.b(x)
        else:
            y = y + self.b(x)
        return F.relu(y) if self.relu else y


class CatNet(nn.Module):
    """x [1,3,8,8] -> cat of two conv3x3 (3->8) outputs with different ranges (bias 0
    and -5) -> conv1x1 16->4."""

    def __init__(self):
        super().__init__()
        self.a = ConvThen(nn.Identity(), 0.0, tail=False)
        self.b = ConvThen(nn.Identity(), -5.0, tail=False)
        self.c = _seeded(nn.Conv2d(16, 4, 1))

    def forward(self, x):
        return self.c(torch.cat([self.a(x), self.b(x)], 1))


class NonTensorAdd(nn.Module):
    """x [1,3,8,8] -> conv3x3 -> ``+ 1.0`` (scalar) and ``+ arange(8)`` (int64 tensor)."""

    def __init__(self):
        super().__init__()
        self.c = _seeded(nn.Conv2d(3, 8, 3, 1, 1))

    def forward(self, x):
        y = self.c(x)
        return y + 1.0, y + torch.arange(8)


class DetectionHead(nn.Module):
    """Toy single-level detector, x [1,3,8,8]:

    conv3x3+relu (3->8) -> conv1x1 (8->6) = [1,6,8,8] -> permute [1,8,8,6] ->
    reshape [1,64,6] -> split [4 box, 2 class] -> class max.dim -> topk(5) over 64
    anchors. With ``use_topk=False`` the class maxima are returned instead.
    ``act_on_scores`` puts a ReLU between the score conv and the permute."""

    def __init__(self, use_topk: bool = True, act_on_scores: bool = False):
        super().__init__()
        self.feat = _seeded(nn.Conv2d(3, 8, 3, 1, 1))
        self.head = _seeded(nn.Conv2d(8, 6, 1), 1)
        self.use_topk = use_topk
        self.act_on_scores = act_on_scores

    def forward(self, x):
        p = self.head(F.relu(self.feat(x)))
        if self.act_on_scores:
            p = F.relu(p)
        p = p.permute(0, 2, 3, 1).reshape(1, -1, 6)
        boxes, scores = p.split([4, 2], dim=2)
        best = scores.max(dim=2)[0]
        if not self.use_topk:
            return boxes, best
        values, index = best.topk(5, dim=1)
        return boxes, values, index


class IntFlatten(nn.Module):
    """x [1,3,8,8] -> conv3x3 -> argmax over channels (int64 [1,8,8]) -> flatten [1,64]."""

    def __init__(self):
        super().__init__()
        self.c = _seeded(nn.Conv2d(3, 8, 3, 1, 1))

    def forward(self, x):
        return self.c(x).argmax(1).flatten(1)


class TwoUsers(nn.Module):
    """x [1,3,8,8] -> conv3x3 whose output feeds both a relu and the graph output."""

    def __init__(self):
        super().__init__()
        self.c = _seeded(nn.Conv2d(3, 8, 3, 1, 1))

    def forward(self, x):
        y = self.c(x)
        return F.relu(y), y
