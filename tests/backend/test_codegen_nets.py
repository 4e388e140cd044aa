"""Nets that used to break codegen, quantized with PT2E and compiled end to
end: C99-clean, only libc/libm/kernel symbols undefined, host C == Python
reference bit for bit (and near torch).

- ReLU6 as its own q(clip(dq)) with equal quantization (``fuse_activations=False``,
  or a relu6 after max_pool): crashed in passes/scalar.py (``relax.PrimValue``).
- MobileNetV3 pieces (hardswish, hardsigmoid, squeeze-excitation multiply):
  ``R.clip(x, 0, inf)`` crashed the float-literal fix-up (``float('"inf"')``).
- abs / exp / tanh / sqrt: ``Unresolved call tirx.fabs`` in TVM's C codegen.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from c_check import compile_and_compare, inputs, libc_symbols, strict_compile, undefined_symbols
from qflow import ConvReluPool, InvertedResidual, quantize, randomize_bn

from pipeline.backend.kernel_source import kernel_names

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("nm") is None,
                                reason="gcc and binutils nm are needed")


class PoolRelu6(nn.Module):
    """conv + ReLU -> max_pool -> standalone ReLU6 -> linear (default quantizer options)."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 16, 3, 1, 1)
        self.fc = nn.Linear(16 * 8 * 8, 10)

    def forward(self, x):
        y = F.relu6(F.max_pool2d(F.relu(self.c(x)), 2))
        return self.fc(torch.flatten(y, 1))


class SqueezeExcite(nn.Module):
    def __init__(self, c, r=4):
        super().__init__()
        self.f1, self.f2 = nn.Conv2d(c, c // r, 1), nn.Conv2d(c // r, c, 1)

    def forward(self, x):
        w = F.relu(self.f1(F.adaptive_avg_pool2d(x, 1)))
        return x * F.hardsigmoid(self.f2(w))


class MobileNetV3Like(nn.Module):
    """MobileNetV3-small pieces: conv+hardswish, depthwise+hardswish, SE
    (hardsigmoid gate, multiply), 1x1 project, pool, linear."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16)
        self.dw, self.b2 = nn.Conv2d(16, 16, 3, 1, 1, groups=16, bias=False), nn.BatchNorm2d(16)
        self.se = SqueezeExcite(16)
        self.pw, self.b3 = nn.Conv2d(16, 24, 1, bias=False), nn.BatchNorm2d(24)
        self.fc = nn.Linear(24, 10)

    def forward(self, x):
        y = F.hardswish(self.b1(self.c1(x)))
        y = self.se(F.hardswish(self.b2(self.dw(y))))
        y = self.b3(self.pw(y))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


class MathNet(nn.Module):
    """conv, then abs / exp / tanh / sqrt / sigmoid in float between Q/DQ."""

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3, 1, 1)

    def forward(self, x):
        y = self.c(x)
        a = torch.abs(y)
        return torch.exp(-a) + torch.tanh(y) + torch.sqrt(a + 1.0) + torch.sigmoid(y)


IMG = (1, 3, 16, 16)
NETS = {  # name -> (factory, input shape, quantizer kwargs)
    "crp_nofuse": (ConvReluPool, IMG, {"fuse_activations": False}),
    "inv_nofuse": (lambda: InvertedResidual(stride=1), (1, 32, 8, 8), {"fuse_activations": False}),
    "pool_relu6": (PoolRelu6, IMG, {}),
    "mbv3": (MobileNetV3Like, IMG, {}),
    "math": (MathNet, IMG, {}),
}
CASES = [(n, d, m) for n in sorted(NETS) for d in ("int8", "int16") for m in (False, True)]


@pytest.fixture(scope="module")
def flows():
    cache = {}

    def get(name, dtype):
        if (name, dtype) not in cache:
            make, shape, kw = NETS[name]
            torch.manual_seed(0)
            cache[(name, dtype)] = quantize(randomize_bn(make()), torch.randn(*shape), dtype=dtype, **kw)
        return cache[(name, dtype)]
    return get


def _torch(flow, x):
    with torch.no_grad():
        return np.concatenate([flow.qdq(torch.from_numpy(x[i:i + 1])).numpy() for i in range(len(x))])


@pytest.mark.parametrize("name,dtype,mmalib", CASES)
def test_net_compiles_cleanly_and_c_equals_reference(flows, tmp_path, name, dtype, mmalib):
    flow = flows(name, dtype)
    x = inputs(NETS[name][1])
    summary, out = compile_and_compare(flow.mod, name, tmp_path / "c", x, mmalib=mmalib)
    objs = strict_compile(tmp_path / "c", tmp_path)
    undefined = undefined_symbols(objs, tmp_path) - set(kernel_names())
    assert undefined <= libc_symbols(), undefined - libc_symbols()
    # Near torch's Q/DQ model: the scalar path within a few output steps
    # (float ops in between may round differently), MMALIB within its requant error.
    ref = _torch(flow, x)
    span = float(np.abs(ref).max()) + 1e-6
    assert np.abs(out - ref).max() <= 0.1 * span, (np.abs(out - ref).max(), span)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["int8", "int16"])
def test_mobilenet_v2_small_input_without_fused_activations(tmp_path, dtype):
    """torchvision MobileNetV2 on a 32x32 input, every ReLU6 quantized on its own."""
    import torchvision

    torch.manual_seed(0)
    model = randomize_bn(torchvision.models.mobilenet_v2(num_classes=10))
    flow = quantize(model, torch.randn(1, 3, 32, 32), dtype=dtype, fuse_activations=False)
    x = inputs((1, 3, 32, 32), n=2)
    for mmalib in (False, True):
        compile_and_compare(flow.mod, "mbv2", tmp_path / str(mmalib), x, mmalib=mmalib)
