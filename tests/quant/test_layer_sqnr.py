"""Per-layer SQNR before / after the calibrate method (pipeline.quant.layer_sqnr): issue 30, item 5."""

from __future__ import annotations

import copy
import math

import torch
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

from pipeline import torchenv  # noqa: F401  (torch settings before torchao)
from pipeline.quant.adaround import adaround
from pipeline.quant.layer_sqnr import layer_sqnr
from quant_graph import prepare
from tinynets import residual_net


def _calibrated(seed: int = 3):
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(1, 3, 16, 16, generator=gen) for _ in range(4)]
    model = residual_net().eval()
    gm = prepare(model, xs[0], observer="minmax")
    with torch.no_grad():
        for x in xs:
            gm(x)
    return model, gm, xs


def _sqnr(x: torch.Tensor, ref: torch.Tensor) -> float:
    return 10 * math.log10(float((x.double() ** 2).sum()) / float(((x.double() - ref.double()) ** 2).sum()))


def test_the_output_layer_sqnr_is_that_of_convert_pt2e():
    """The last point's Q/DQ value is what the converted Q/DQ model outputs: its SQNR against
    the float model equals one computed from convert_pt2e and the float module directly."""
    model, gm, xs = _calibrated()
    got = layer_sqnr(gm, xs)
    assert len(got) >= 10 and all(v is None or v > 0 for v in got.values())
    qdq = convert_pt2e(copy.deepcopy(gm))
    with torch.no_grad():
        q = torch.cat([qdq(x) for x in xs])
        f = torch.cat([model(x) for x in xs])
    assert abs(list(got.values())[-1] - _sqnr(q, f)) < 0.01, (list(got.values())[-1], _sqnr(q, f))


def test_adaround_raises_the_output_sqnr_and_leaves_the_model_usable():
    _, gm, xs = _calibrated(4)
    before = layer_sqnr(gm, xs)
    assert layer_sqnr(gm, xs) == before        # measuring changes nothing (observers only compute qparams)
    adaround(gm, xs, iterations=40)
    after = layer_sqnr(gm, xs)
    assert after.keys() == before.keys()
    last = list(before)[-1]
    assert after[last] > before[last]
