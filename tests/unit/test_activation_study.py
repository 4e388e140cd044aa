"""scripts/activation_study.py on a tiny net: conv + ReLU is one quantization point, and a
tensor whose channels span very different ranges loses less with a scale per channel."""

import importlib.util
from pathlib import Path

import torch
from torch import nn

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "activation_study.py"


def study():
    spec = importlib.util.spec_from_file_location("activation_study", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class TwoConvs(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn, self.relu, self.conv2 = nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1)
        with torch.no_grad():
            self.bn.weight.copy_(torch.tensor([100.0, 1.0, 1.0, 1.0]))   # channel 0 spans 100x the others
            self.conv2.weight[:, 0] *= 0.01                               # ... and counts like them

    def forward(self, x):
        return self.conv2(self.relu(self.bn(self.conv1(x))))


def test_fused_points_and_per_channel_scales():
    s = study()
    torch.manual_seed(0)
    model = TwoConvs().eval()
    x = torch.randn(4, 3, 8, 8)
    with torch.no_grad():
        ref = model(x)
    s.fold_batchnorm(model)
    assert isinstance(model.bn, nn.Identity)
    with torch.no_grad():
        assert torch.allclose(model(x), ref, atol=1e-4)   # folding keeps the function
    leaves = s.points(model)
    skip = s.fused(model, leaves, x)
    assert skip == {"conv1#0"}   # quantized at the ReLU's output, as PT2E does

    sym = {"dtype": torch.int8, "quant_min": -128, "quant_max": 127}
    per_tensor = s.observe(model, leaves, x, lambda out: s.MinMaxObserver(qscheme=torch.per_tensor_symmetric, **sym),
                           skip)
    per_channel = s.observe(model, leaves, x, lambda out: s.PerChannelMinMaxObserver(
        ch_axis=1, qscheme=torch.per_channel_symmetric, **sym), skip)
    assert set(per_tensor) == {"relu#0", "conv2#0"}
    err = {name: float((s.run(model, leaves, x, {"relu#0": obs["relu#0"]}) - ref).abs().mean())
           for name, obs in (("tensor", per_tensor), ("channel", per_channel))}
    assert err["channel"] < err["tensor"] / 5, err
