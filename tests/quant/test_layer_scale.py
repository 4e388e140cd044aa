"""Layer scales folded into the linear before them (pipeline/quant/layer_scale.py)."""

import torch
from torch import nn

from pipeline.quant.layer_scale import fold_layer_scales

aten = torch.ops.aten


class Block(nn.Module):
    def __init__(self, shared: bool = False):
        super().__init__()
        self.fc = nn.Linear(8, 6)
        self.gamma = nn.Parameter(torch.linspace(0.1, 2.0, 6))
        self.shared = shared

    def forward(self, x):
        y = self.fc(x)
        out = y * self.gamma
        return out + y if self.shared else out   # shared: the linear's output has another use


def _gm(model):
    torch.manual_seed(0)
    return torch.export.export(model.eval(), (torch.randn(1, 5, 8),)).module()


def _ops(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_the_scale_goes_into_the_weights_and_the_output_is_unchanged():
    torch.manual_seed(0)
    gm = _gm(Block())
    x = torch.randn(1, 5, 8)
    before = gm(x)
    fold_layer_scales(gm)
    assert aten.mul.Tensor not in _ops(gm) and aten.linear.default in _ops(gm)
    torch.testing.assert_close(gm(x), before, rtol=1e-6, atol=1e-6)


def test_a_linear_whose_output_is_also_used_elsewhere_is_left_alone():
    gm = _gm(Block(shared=True))
    fold_layer_scales(gm)
    assert aten.mul.Tensor in _ops(gm)
