"""pipeline.quant.graph.fake_quantize_per_tensor equals torch's fake_quantize_per_tensor_affine bit for bit."""

from __future__ import annotations

import pytest
import torch

from pipeline.quant.graph import fake_quantize_per_tensor


@pytest.mark.parametrize("qmin,qmax,zp", [(-128, 127, 0), (-128, 127, 17), (0, 255, 128), (-32768, 32767, -5)])
@pytest.mark.parametrize("scale", [0.0234, 1 / 3, 7.77e-5, 2.0])
def test_same_bits_as_torch(qmin, qmax, zp, scale):
    gen = torch.Generator().manual_seed(0)
    span = scale * (qmax - qmin)
    x = torch.cat([
        (torch.rand(4, 3, 9, 11, generator=gen) - 0.5).flatten() * 1.5 * span,   # in range and saturating
        (torch.arange(-600, 600) + 0.5) * scale,                                # exact ties: half to even
        torch.tensor([0.0, -0.0, scale / 2, -scale / 2, 1e30, -1e30]),
    ])
    want = torch.fake_quantize_per_tensor_affine(x, scale, zp, qmin, qmax)
    got = fake_quantize_per_tensor(x, scale, zp, qmin, qmax)
    assert got.dtype == torch.float32 and got.shape == x.shape
    assert torch.equal(got, want), int((got != want).sum())


def test_channels_last_keeps_its_layout_and_values():
    x = torch.randn(2, 8, 5, 5).contiguous(memory_format=torch.channels_last) * 4
    got = fake_quantize_per_tensor(x, 0.05, 3, -128, 127)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, torch.fake_quantize_per_tensor_affine(x, 0.05, 3, -128, 127))
