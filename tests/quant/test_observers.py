"""The clipping activation observers (pipeline.quant.observers) on known distributions,
and through prepare_pt2e / convert_pt2e on a tiny net (issue 10, item 2)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline import torchenv  # noqa: F401
from pipeline.quant import C7xMMAQuantizer
from pipeline.quant.observers import EntropyObserver, PercentileObserver, kl_divergences
from qflow import ConvReluPool
from quant_graph import DQ, Q, convert, input_dq, nodes, qparams

RANGES = {"int8": (torch.int8, -128, 127), "int16": (torch.int16, -32768, 32767)}


def make(cls, dtype="int8", symmetric=True, **kw):
    qdtype, lo, hi = RANGES[dtype]
    scheme = torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine
    return cls(dtype=qdtype, qscheme=scheme, quant_min=lo, quant_max=hi, **kw)


def gaussian_with_outliers(seed=0, n=50_000, batches=4):
    """Batches of N(0, 1) with 0.05 % outliers at +-20..60 sigma; the first batch has
    the smallest range, so the histogram has to grow (bin merges) later."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for b in range(batches):
        x = torch.randn(n, generator=gen) * (1 + 0.2 * b)
        k = n // 2000
        x[:k] = (torch.rand(k, generator=gen) * 40 + 20) * torch.sign(torch.randn(k, generator=gen)) * (b + 1)
        out.append(x.reshape(10, -1))
    return out


def observe(obs, batches):
    for x in batches:
        obs(x)
    return obs


def bin_width(obs) -> float:
    return float(obs.hist_max) / obs.bins


# ------------------------------------------------------------------ percentile
@pytest.mark.parametrize("p", [99.0, 99.9, 99.99])
def test_percentile_matches_numpy_over_several_batches(p):
    batches = gaussian_with_outliers()
    obs = observe(make(PercentileObserver, percentile=p), batches)
    a = np.abs(torch.cat([b.flatten() for b in batches]).numpy())
    want = np.percentile(a, p)
    assert float(obs.hist_max) >= a.max() > float(obs.hist_max) / 2  # grew by doubling, half the bins used
    assert abs(obs.threshold() - want) <= bin_width(obs)
    if p <= 99.9:                                                    # outliers: 0.05 % of the values
        assert obs.threshold() < 0.5 * a.max()


@pytest.mark.parametrize("dtype, half", [("int8", 127.5), ("int16", 32767.5)])
def test_percentile_symmetric_qparams(dtype, half):
    obs = observe(make(PercentileObserver, dtype, percentile=99.9), gaussian_with_outliers())
    scale, zp = obs.calculate_qparams()
    assert int(zp) == 0 and float(scale) == pytest.approx(obs.threshold() / half, rel=1e-6)


def test_percentile_affine_on_relu_output_uses_all_codes_from_zero():
    batches = [b.clamp(min=0) for b in gaussian_with_outliers()]
    obs = observe(make(PercentileObserver, symmetric=False, percentile=99.9), batches)
    scale, zp = obs.calculate_qparams()
    assert int(zp) == -128                                           # 0 maps to quant_min
    assert float(scale) == pytest.approx(obs.threshold() / 255, rel=1e-6)


def test_percentile_100_is_the_minmax_range():
    batches = gaussian_with_outliers()
    obs = observe(make(PercentileObserver, percentile=100), batches)
    x = torch.cat([b.flatten() for b in batches])
    lo, hi = obs.clipped_range()
    assert float(lo) == float(x.min()) and float(hi) == float(x.max())


def test_histogram_growth_is_exact():
    """Doubling the range merges bin pairs: the same histogram as one over the final range,
    except the first batch's max (on the old top edge, so in the bin just below the
    boundary it sits on in the wider histogram)."""
    gen = torch.Generator().manual_seed(3)
    small = torch.rand(20_000, generator=gen)
    small[0] = 1.0
    big = torch.rand(20_000, generator=gen) * 3.5
    grown = observe(make(PercentileObserver), [small, big])
    direct = make(PercentileObserver)
    direct(torch.tensor([4.0]))  # fixes hist_max = 4 = 1.0 doubled twice
    direct(small)
    direct(big)
    direct.histogram[-1] -= 1    # drop the 4.0 again
    assert float(grown.hist_max) == 4.0 and float(grown.histogram.sum()) == 40_000
    diff = grown.histogram - direct.histogram
    moved = diff.nonzero().flatten().tolist()
    assert moved == [511, 512] and diff[511] == 1 and diff[512] == -1   # 1.0: edge of bin 511|512


def test_percentile_is_in_the_state_and_wins_over_the_constructor():
    obs = observe(make(PercentileObserver, percentile=99.0), gaussian_with_outliers())
    fresh = make(PercentileObserver, percentile=99.99)
    fresh.load_state_dict(obs.state_dict(), strict=True)
    assert float(fresh.percentile) == 99.0 and fresh.threshold() == obs.threshold()


@pytest.mark.parametrize("p", [0, -1, 100.5])
def test_bad_percentile_raises(p):
    with pytest.raises(ValueError, match="percentile"):
        make(PercentileObserver, percentile=p)


def test_observer_options_are_checked_by_the_quantizer():
    with pytest.raises(ValueError, match="minmax.*percentile"):
        C7xMMAQuantizer(observer="minmax", observer_kwargs={"percentile": 99.9})


# ------------------------------------------------------------------ entropy
def _direct_kl(h: np.ndarray, i: int, levels: int) -> float:
    """Migacz's slide procedure for one candidate, written out bin by bin."""
    p = h[:i].astype(float).copy()
    p[i - 1] += h[i:].sum()
    group = (np.arange(i) * levels) // i
    q = np.zeros(i)
    for k in range(levels):
        members = group == k
        nonzero = members & (h[:i] > 0)
        if nonzero.any():
            q[nonzero] = h[:i][members].sum() / nonzero.sum()
    p, q = p / p.sum(), q / q.sum()
    pos = p > 0
    if (q[pos] == 0).any():
        return float("inf")
    return float((p[pos] * np.log(p[pos] / q[pos])).sum())


def test_closed_form_kl_equals_the_slide_procedure():
    rng = np.random.default_rng(0)
    x = np.abs(rng.standard_t(3, 100_000))
    h, _ = np.histogram(x, 2048, (0, x.max()))
    h[1500:1600] = 0                      # empty bins: some candidates have KL = inf
    cands = np.arange(128, 2049, 29)
    fast = kl_divergences(torch.tensor(h, dtype=torch.float64), torch.tensor(cands), 128).numpy()
    ref = np.array([_direct_kl(h, i, 128) for i in cands])
    assert np.array_equal(np.isinf(fast), np.isinf(ref)) and np.isinf(ref).any()
    finite = np.isfinite(ref)
    np.testing.assert_allclose(fast[finite], ref[finite], rtol=1e-9, atol=1e-12)


def test_entropy_threshold_below_max_on_heavy_tails():
    batches = gaussian_with_outliers()
    obs = observe(make(EntropyObserver), batches)
    amax = float(torch.cat([b.flatten() for b in batches]).abs().max())
    t = obs.threshold()
    assert 2.0 < t < 0.2 * amax   # well past the Gaussian bulk, far below the outliers
    scale, zp = obs.calculate_qparams()
    assert int(zp) == 0 and float(scale) == pytest.approx(t / 127.5, rel=1e-6)


def test_entropy_keeps_almost_all_of_a_uniform_range():
    x = torch.rand(200_000, generator=torch.Generator().manual_seed(1)) * 2 - 1
    obs = observe(make(EntropyObserver), [x])
    assert obs.threshold() > 0.9


def test_entropy_ignores_exact_zeros():
    """ReLU output: the zeros do not move the threshold (class doc)."""
    x = gaussian_with_outliers(batches=1)[0].flatten()
    relu = observe(make(EntropyObserver, symmetric=False), [x.clamp(min=0)])
    positive = observe(make(EntropyObserver, symmetric=False), [x[x > 0]])
    assert relu.levels() == 256 and relu.threshold() == positive.threshold()


def test_entropy_int16_falls_back_to_the_observed_range():
    batches = gaussian_with_outliers()
    obs = observe(make(EntropyObserver, "int16"), batches)
    amax = float(torch.cat([b.flatten() for b in batches]).abs().max())
    scale, zp = obs.calculate_qparams()
    assert int(zp) == 0 and float(scale) == pytest.approx(amax / 32767.5, rel=1e-6)


@pytest.mark.parametrize("value", [2.0, -2.0, 1e-3])
@pytest.mark.parametrize("cls", [PercentileObserver, EntropyObserver])
def test_constant_tensor_gives_a_valid_range(cls, value):
    """All values equal (a constant branch of a random-weight YOLO26 head): the clipped
    range stays ordered and torchao accepts it (it asserts min <= max)."""
    obs = observe(make(cls), [torch.full((4, 100), value)])
    lo, hi = obs.clipped_range()
    assert float(lo) <= float(hi) and max(abs(float(lo)), abs(float(hi))) <= abs(value) * (1 + 1e-6)
    scale, _ = obs.calculate_qparams()
    assert float(scale) > 0


def test_uncalibrated_observer_warns_and_returns_defaults():
    with pytest.warns(UserWarning, match="must run observer"):
        scale, zp = make(EntropyObserver).calculate_qparams()
    assert float(scale) == 1.0 and int(zp) == 0


# ------------------------------------------------------------------ through PT2E
X = torch.randn(1, 3, 8, 8)


def calib_with_outlier():
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(1, 3, 8, 8, generator=gen) for _ in range(4)]
    xs[2][0, 0, 0, 0] = 40.0
    return xs


@pytest.mark.parametrize("observer, kwargs", [("percentile", {"percentile": 99.0}), ("entropy", {})])
@pytest.mark.parametrize("dtype, symmetric", [("int8", True), ("int8", False), ("int16", True)])
def test_observer_converts_to_valid_qdq(observer, kwargs, dtype, symmetric):
    net = ConvReluPool(c=8, classes=4)
    calib = calib_with_outlier()
    gm = convert(net, X, calib, dtype=dtype, symmetric_activations=symmetric,
                 observer=observer, observer_kwargs=kwargs)
    qdtype, lo, hi = RANGES[dtype]
    acts = [qparams(n) for n in nodes(gm, Q, DQ)]
    assert len(acts) >= 10
    for p in acts:
        assert (p.dtype, p.quant_min, p.quant_max) == (qdtype, lo, hi)
        assert 0 < p.scale < float("inf") and lo <= p.zero_point <= hi
        if symmetric:
            assert p.zero_point == 0
    with torch.no_grad():
        ref, out = net.eval()(calib[0]), gm(calib[0])
    sqnr = 10 * torch.log10(ref.pow(2).mean() / (ref - out).pow(2).mean())
    assert sqnr > 15, float(sqnr)


@pytest.mark.parametrize("observer, kwargs", [("percentile", {"percentile": 99.0}), ("entropy", {})])
def test_clipping_observer_gives_a_smaller_input_scale_than_minmax(observer, kwargs):
    net = ConvReluPool(c=8, classes=4)
    first = lambda gm: input_dq(nodes(gm, torch.ops.aten.conv2d.default)[0]).scale
    minmax = first(convert(net, X, calib_with_outlier()))
    clipped = first(convert(net, X, calib_with_outlier(), observer=observer, observer_kwargs=kwargs))
    assert minmax == pytest.approx(40 / 127.5, rel=1e-6) and clipped < 0.2 * minmax


def test_percentile_keeps_the_whole_range_at_int16():
    """int16 has more levels than bins: clipping would be the only error, so t = max |x|."""
    from pipeline.quant.observers import PercentileObserver
    x = torch.cat([torch.randn(10000), torch.tensor([50.0])])
    o16 = PercentileObserver(percentile=99.0, dtype=torch.int16, qscheme=torch.per_tensor_symmetric,
                             quant_min=-32768, quant_max=32767)
    o8 = PercentileObserver(percentile=99.0, dtype=torch.int8, qscheme=torch.per_tensor_symmetric,
                            quant_min=-128, quant_max=127)
    o16(x), o8(x)
    assert o16.threshold() == pytest.approx(50.0) and o8.threshold() < 5.0
