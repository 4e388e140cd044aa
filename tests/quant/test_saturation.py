"""The input bound of saturating activations (pipeline.quant.saturation): the bound itself,
the bounded observers, and what the quantizer gives them on small nets."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pipeline import torchenv  # noqa: F401
from pipeline.quant import saturation
from pipeline.quant.saturation import BOUNDED, input_bound
from pipeline.quant.specs import OBSERVERS
from quant_graph import DQ, Q, convert, input_dq, nodes, one, qparams

FUNCS = {"tanh": (torch.tanh, -1.0, 1.0), "sigmoid": (torch.sigmoid, 0.0, 1.0),
         "hardsigmoid": (F.hardsigmoid, 0.0, 1.0)}


def codes(y, lo, hi, bits, affine):
    """``y`` quantized on the finest grid that covers the output range [lo, hi]."""
    n = 2 ** bits - 1
    if affine:
        scale = (hi - lo) / n
        return torch.round((y - lo) / scale)
    scale = max(abs(lo), hi) / ((n - 1) / 2)
    return torch.round(y / scale)


@pytest.mark.parametrize("kind", sorted(FUNCS))
@pytest.mark.parametrize("dtype,bits", [("int8", 8), ("int16", 16)])
@pytest.mark.parametrize("affine", [True, False])
def test_past_the_bound_the_output_code_moves_by_at_most_one(kind, dtype, bits, affine):
    f, lo, hi = FUNCS[kind]
    t = input_bound(kind, dtype)
    x = torch.cat([torch.linspace(t, 50 * t, 20001, dtype=torch.float64)])
    for sign, end in ((1, hi), (-1, lo)):
        got = codes(f(sign * x), lo, hi, bits, affine)
        at_bound = codes(f(torch.tensor(sign * t, dtype=torch.float64)), lo, hi, bits, affine)
        assert float((got - at_bound).abs().max()) <= 1, (kind, sign)
    # and the bound is not loose: at half of it the output still moves by many codes
    inner = codes(f(torch.tensor([t / 2, t], dtype=torch.float64)), lo, hi, bits, affine)
    assert float(inner[1] - inner[0]) >= 2


def test_bounds_in_input_units():
    assert input_bound("tanh", "int8") == pytest.approx(0.5 * math.log(1019))
    assert input_bound("sigmoid", "int8") == pytest.approx(math.log(1019))
    assert input_bound("hardsigmoid", "int16") == 3.0
    assert input_bound("tanh", "int16") > input_bound("tanh", "int8")
    with pytest.raises(KeyError):
        input_bound("relu", "int8")


def _observer(cls, symmetric, **kw):
    scheme = torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine
    return cls(dtype=torch.int8, qscheme=scheme, quant_min=-128, quant_max=127, **kw)


def _options(name):
    return {"percentile": 99.99} if name == "percentile" else {}


@pytest.mark.parametrize("name", sorted(OBSERVERS))
@pytest.mark.parametrize("symmetric", [True, False])
def test_bounded_observer_inside_the_bound_changes_nothing(name, symmetric):
    base = OBSERVERS[name]
    x = torch.randn(4096, generator=torch.Generator().manual_seed(1)) * 0.8
    plain, bounded = _observer(base, symmetric, **_options(name)), _observer(BOUNDED[base], symmetric, bound=5.0,
                                                                             **_options(name))
    plain(x), bounded(x)
    for a, b in zip(plain.calculate_qparams(), bounded.calculate_qparams()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", sorted(OBSERVERS))
def test_bounded_observer_clips_a_wide_range(name):
    base = OBSERVERS[name]
    x = torch.randn(4096, generator=torch.Generator().manual_seed(2))
    x[:8] = torch.tensor([700.0, -650, 400, -300, 250, 900, -800, 120])
    obs = _observer(BOUNDED[base], True, bound=3.5, **_options(name))
    obs(x)
    scale, zp = obs.calculate_qparams()
    assert float(scale) == pytest.approx(3.5 / 127.5, rel=1e-6) and int(zp) == 0
    assert "bound=3.5" in repr(obs)
    # affine, all positive: keeps 0 as its lower end
    obs = _observer(BOUNDED[base], False, bound=3.5, **_options(name))
    obs(x.abs())
    scale, zp = obs.calculate_qparams()
    assert float(scale) == pytest.approx(3.5 / 255, rel=1e-6) and int(zp) == -128


class LinearTanh(torch.nn.Module):
    """An embedding head: fc 16 -> 32 whose outputs are mostly within +-3, with a few
    channels scaled to the hundreds (ResNet-50's "massive activations"), then tanh;
    ``extra`` also adds the fc output to the result (a second, non-saturating reader)."""

    def __init__(self, extra=False):
        super().__init__()
        self.fc = torch.nn.Linear(16, 32)
        gen = torch.Generator().manual_seed(3)
        with torch.no_grad():
            self.fc.weight.copy_(torch.randn(32, 16, generator=gen) * 0.3)
            self.fc.weight[:2] *= 400
        self.extra = extra

    def forward(self, x):
        y = self.fc(x)
        return torch.tanh(y) + y if self.extra else torch.tanh(y)


def _tanh_input(gm):
    (tanh,) = nodes(gm, torch.ops.aten.tanh.default)
    return input_dq(tanh)


def test_quantizer_bounds_a_tensor_only_tanh_reads_and_gains_accuracy(monkeypatch):
    model, x = LinearTanh().eval(), torch.randn(64, 16, generator=torch.Generator().manual_seed(4))
    gm = convert(model, x, [x])
    got = _tanh_input(gm)
    assert got.scale == pytest.approx(input_bound("tanh", "int8") / 127.5, rel=1e-6)
    # one Q/DQ between fc and tanh: the fc output and the tanh input share the observer
    assert len(nodes(gm, Q)) == len(nodes(gm, DQ)) == 3
    with torch.no_grad():
        err = float((gm(x) - model(x)).abs().mean())
    monkeypatch.setattr(saturation, "input_bound", lambda kind, dtype: math.inf)
    wide = convert(model, x, [x])
    assert _tanh_input(wide).scale > 10 * got.scale
    with torch.no_grad():
        err_wide = float((wide(x) - model(x)).abs().mean())
    assert err < 0.25 * err_wide, (err, err_wide)


def test_a_tensor_with_another_reader_keeps_its_full_range():
    model, x = LinearTanh(extra=True).eval(), torch.randn(64, 16, generator=torch.Generator().manual_seed(4))
    gm = convert(model, x, [x])
    fc_out = qparams(next(n for n in nodes(gm, Q) if n.args[0].target == torch.ops.aten.linear.default))
    assert fc_out.scale > 100 / 127.5
    assert _tanh_input(gm).scale == fc_out.scale   # shared: no requantize added before the tanh


class PlainSigmoid(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 1)

    def forward(self, x):
        return torch.sigmoid(self.conv(x) * 50)


def test_a_sigmoid_that_is_no_se_gate_stays_float_and_unbounded():
    x = torch.randn(2, 3, 8, 8)
    gm = convert(PlainSigmoid().eval(), x)
    (sig,) = nodes(gm, torch.ops.aten.sigmoid.default)
    assert sig.args[0].target != DQ
    assert one(gm, torch.ops.aten.conv2d.default) is not None
