"""In-memory PT2E -> Relax flow for tests on small hand-built nets.

The stage functions work on files; tests of the quantizer and the backend want
the same steps on a tiny ``nn.Module`` without files. This module strings the
library calls together exactly as the stages do.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline import torchenv  # noqa: F401  (quiet torch, Q/DQ ops registered)

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e


@dataclass
class QFlow:
    """Results of :func:`quantize`: the torch Q/DQ reference and its Relax import."""

    qdq: torch.fx.GraphModule            # convert_pt2e output (runs in torch)
    ep: torch.export.ExportedProgram      # re-exported Q/DQ program, batch 1
    mod: object                           # tvm.IRModule, params bound as constants
    params: dict                          # name -> numpy (before binding)


def quantize(model: nn.Module, example: torch.Tensor, calib: list[torch.Tensor] | None = None,
             quantizer=None, **quantizer_kwargs) -> QFlow:
    """Export, prepare (C7xMMAQuantizer unless ``quantizer`` is given), calibrate on
    ``calib`` (default: 4 seeded Gaussian batches), convert, re-export, import."""
    from pipeline.frontend.qdq_import import import_exported_program
    from pipeline.quant import C7xMMAQuantizer
    from tvm import relax

    model = model.eval()
    ep = torch.export.export(model, (example,))
    prepared = prepare_pt2e(ep.module(), quantizer or C7xMMAQuantizer(**quantizer_kwargs))
    gen = torch.Generator().manual_seed(0)
    calib = calib if calib is not None else [torch.randn(example.shape, generator=gen) for _ in range(4)]
    with torch.no_grad():
        for x in calib:
            prepared(x)
    qdq = convert_pt2e(prepared)
    ep_q = torch.export.export(qdq, (example,))
    mod, params = import_exported_program(ep_q)
    bound = relax.transform.BindParams("main", params)(mod)
    return QFlow(qdq=qdq, ep=ep_q, mod=bound, params=params)


def randomize_bn(model: nn.Module) -> nn.Module:
    """Give BatchNorm layers non-trivial statistics (seeded) so folding matters."""
    gen = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.copy_(torch.rand(m.num_features, generator=gen) * 0.2 - 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.bias.copy_(torch.rand(m.num_features, generator=gen) * 0.2 - 0.1)
    return model


class ConvReluPool(nn.Module):
    """conv3x3+BN+ReLU -> maxpool -> conv1x1(bias)+ReLU6 -> avgpool -> flatten -> linear."""

    def __init__(self, cin=3, c=32, classes=64):
        super().__init__()
        self.c1 = nn.Conv2d(cin, c, 3, 1, 1, bias=False)
        self.b1 = nn.BatchNorm2d(c)
        self.pool = nn.MaxPool2d(2)
        self.c2 = nn.Conv2d(c, c, 1)
        self.fc = nn.Linear(c, classes)

    def forward(self, x):
        y = self.pool(F.relu(self.b1(self.c1(x))))
        y = F.relu6(self.c2(y))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


class ResidualBlock(nn.Module):
    """ResNet basic block (stride 1) followed by a 3x3 stride-2 conv."""

    def __init__(self, c=32):
        super().__init__()
        self.c1 = nn.Conv2d(c, c, 3, 1, 1, bias=False)
        self.b1 = nn.BatchNorm2d(c)
        self.c2 = nn.Conv2d(c, c, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(c)
        self.c3 = nn.Conv2d(c, c, 3, 2, 1)

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = F.relu(self.b2(self.c2(y)) + x)
        return self.c3(y)


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expand + ReLU6, depthwise 3x3 (stride s) + ReLU6, 1x1 project (+ skip)."""

    def __init__(self, cin=32, cout=32, stride=1, expand=4):
        super().__init__()
        h = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.m = nn.Sequential(
            nn.Conv2d(cin, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
            nn.Conv2d(h, h, 3, stride, 1, groups=h, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
            nn.Conv2d(h, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return x + self.m(x) if self.use_res else self.m(x)
