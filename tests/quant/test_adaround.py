"""Adaptive rounding of int8 weights (pipeline.quant.adaround; Nagel et al. 2020): issue 30, item 1."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

from pipeline import torchenv  # (torch settings before torchao)
from pipeline.quant.adaround import adaround, round_layer
from pipeline.quant.bias_correction import weighted_nodes
from quant_graph import prepare
from tinynets import residual_net


def test_round_layer_lowers_the_output_error_on_a_linear_layer():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(16, 64, generator=gen) * 0.05
    scale = w.abs().amax(1) / 7.5          # a coarse grid (4-bit-like) so rounding matters
    x = [torch.randn(32, 64, generator=gen) for _ in range(4)]
    q, rec = round_layer(lambda a, b: F.linear(a, b), w, scale, -8, 7, x, x, iterations=300)
    assert torch.equal(q, q.round()) and q.min() >= -8 and q.max() <= 7
    assert rec["mse"] < 0.9 * rec["mse_nearest"] and rec["flipped"] > 0
    # the record's error is the layer's output error with these integers
    err = sum(float((F.linear(xi, scale[:, None] * q) - F.linear(xi, w)).pow(2).mean()) for xi in x) / 4
    assert err == pytest.approx(rec["mse"], rel=1e-5)


def test_adaround_writes_integers_that_convert_keeps():
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(1, 3, 16, 16, generator=gen) for _ in range(4)]
    gm = prepare(residual_net(), xs[0], observer="minmax")
    with torch.no_grad():
        for x in xs:
            gm(x)
    before = copy.deepcopy(gm)
    records = adaround(gm, xs, iterations=30)
    assert len(records) == len(weighted_nodes(gm)) == 10
    assert all(r["mse"] <= r["mse_nearest"] for r in records)
    q_new, q_old = convert_pt2e(gm), convert_pt2e(before)
    # same scales, integer weights from the learned rounding: some differ from nearest, none by more than 1
    ints = lambda q: [t for name, t in q.named_buffers() if t.dtype == torch.int8] + \
        [t for name, t in q.named_parameters() if t.dtype == torch.int8]
    new, old = ints(q_new), ints(q_old)
    assert len(new) == len(old) == 10
    diffs = [(a.int() - b.int()).abs().max() for a, b in zip(new, old)]
    assert max(diffs) == 1


def test_layers_side_by_side_give_the_same_weights_as_one_by_one():
    """The layers run in a thread pool, one torch thread each: the result does not depend
    on how many run at once, and the caller's thread count is restored."""
    gen = torch.Generator().manual_seed(2)
    xs = [torch.randn(1, 3, 16, 16, generator=gen) for _ in range(3)]
    gm = prepare(residual_net(), xs[0], observer="minmax")
    with torch.no_grad():
        for x in xs:
            gm(x)
    results = []
    before = torch.get_num_threads()
    for threads in (1, 2):   # 1 or 2 layers at a time
        m = copy.deepcopy(gm)
        with torchenv.torch_threads(threads):
            adaround(m, xs, iterations=20)
            assert torch.get_num_threads() == threads
        results.append({k: v for k, v in m.state_dict().items() if v.is_floating_point()})
    assert torch.get_num_threads() == before
    assert results[0].keys() == results[1].keys()
    assert all(torch.equal(results[0][k], results[1][k]) for k in results[0])


def test_bad_arguments():
    with pytest.raises(ValueError, match="iterations"):
        adaround(None, [torch.zeros(1)], iterations=0)


@pytest.mark.parametrize("beta", [None, 2.0, 11.3])
def test_hand_derived_gradient_matches_autograd(beta):
    """The step's gradient (adaround._Rounding) is autograd's gradient of the module
    doc's loss, including weights at the clamp's edges (base = qmax and below qmin)."""
    from pipeline.quant.adaround import GAMMA, LAMBDA, ZETA, _Rounding
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(8, 24, generator=gen) * 0.1
    scale = w.abs().amax(1) / 7
    s = scale[:, None]
    w[0, 0], w[1, 1] = 7.2 * s[0, 0], -9.4 * s[1, 0]      # floor = qmax, below qmin
    base = torch.floor(w / s)
    v = torch.randn(w.shape, generator=gen) * 2            # some h clamped at 0 and 1
    x, t = torch.randn(5, 24, generator=gen), torch.randn(5, 8, generator=gen)
    va = v.clone().requires_grad_(True)
    h = torch.clamp(torch.sigmoid(va) * (ZETA - GAMMA) + GAMMA, 0.0, 1.0)
    loss = (F.linear(x, s * torch.clamp(base + h, -8, 7)) - t).pow(2).mean()
    if beta is not None:
        loss = loss + LAMBDA * (1 - (2 * h - 1).abs().pow(beta)).sum() / v.numel()
    loss.backward()
    r = _Rounding(base, s, -8, 7)
    wq = r.weight(v)
    g_w, = torch.autograd.grad((F.linear(x, wq) - t).pow(2).mean(), wq)
    got = r.grad(g_w, beta)
    assert torch.allclose(got, va.grad, rtol=1e-5, atol=1e-9)
    assert (va.grad == 0).any() and (va.grad != 0).any()   # both sides of the clamps exercised
