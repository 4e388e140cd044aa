"""Activation and weight specs, read off the converted Q/DQ graph (docs/reference.md,
"Quantizer rules" and "The user's examples")."""

from __future__ import annotations

import pytest
import torch

from qflow import ConvReluPool
from quant_graph import (DQ, DQ_CHANNEL, Q, calibration, convert, input_dq, nodes, qparams,
                         weight_dq)
from quant_nets import DepthwiseNet, LinearNet

aten = torch.ops.aten
X = torch.randn(1, 3, 8, 8)
RANGES = {torch.int8: (-128, 127), torch.int16: (-32768, 32767)}


def _weighted(gm):
    return nodes(gm, aten.conv2d.default, aten.linear.default)


def _activation_qparams(gm):
    return [qparams(n) for n in nodes(gm, Q, DQ)]


@pytest.mark.parametrize("dtype, torch_dtype", [("int8", torch.int8), ("int16", torch.int16)])
def test_symmetric_activations_full_range_zero_point_0(dtype, torch_dtype):
    gm = convert(ConvReluPool(c=8, classes=4), X, dtype=dtype)
    acts = _activation_qparams(gm)
    assert len(acts) >= 10
    assert {(p.dtype, p.quant_min, p.quant_max, p.zero_point) for p in acts} == \
        {(torch_dtype, *RANGES[torch_dtype], 0)}


@pytest.mark.parametrize("dtype, divisor", [("int8", 127.5), ("int16", 32767.5)])
def test_minmax_symmetric_scale_is_absmax_over_half_range(dtype, divisor):
    """MinMaxObserver, per_tensor_symmetric: scale = max|x| / ((qmax - qmin) / 2)."""
    calib = calibration(X.shape)
    gm = convert(ConvReluPool(c=8, classes=4), X, calib, dtype=dtype)
    first_conv = _weighted(gm)[0]
    absmax = max(float(x.abs().max()) for x in calib)
    assert input_dq(first_conv).scale == pytest.approx(absmax / divisor, rel=1e-6)


@pytest.mark.parametrize("net, example, n_weighted", [
    (ConvReluPool(c=8, classes=4), X, 3),
    (DepthwiseNet(), torch.randn(1, 8, 8, 8), 2),
    (LinearNet(), torch.randn(2, 16), 2),
])
@pytest.mark.parametrize("kwargs, wdtype", [({}, torch.int8), (dict(dtype="int16"), torch.int8),
                                            (dict(dtype="int16", weight_dtype="int16"), torch.int16)])
def test_weights_per_channel_symmetric_axis_0(net, example, n_weighted, kwargs, wdtype):
    """Every conv/linear weight (incl. depthwise) is dequantize_per_channel on axis 0 with one
    scale per output channel and zero points 0; int8 by default in both modes (user's
    document), int16 with weight_dtype="int16" (reference code)."""
    gm = convert(net, example, **kwargs)
    weighted = _weighted(gm)
    assert len(weighted) == n_weighted
    for node in weighted:
        w = weight_dq(gm, node)
        assert w is not None, f"{node.name}: weight is not per-channel dequantized"
        assert (w.axis, w.dtype, w.quant_min, w.quant_max) == (0, wdtype, *RANGES[wdtype])
        assert w.int_weight.dtype == wdtype
        assert w.scales.shape == (w.int_weight.shape[0],)
        assert torch.all(w.zero_points == 0)
        # bias (if any) stays float: no dequantize in front of it
        if len(node.args) > 2 and node.args[2] is not None:
            assert node.args[2].target not in (DQ, DQ_CHANNEL)


def test_weight_scale_is_channel_absmax_over_127_5():
    net = DepthwiseNet()
    gm = convert(net, torch.randn(1, 8, 8, 8))
    w = weight_dq(gm, _weighted(gm)[0])
    expected = net.dw.weight.detach().abs().amax(dim=(1, 2, 3)) / 127.5
    torch.testing.assert_close(w.scales.float(), expected, rtol=1e-6, atol=0)


def test_int16_activations_int8_weights_by_default():
    gm = convert(ConvReluPool(c=8, classes=4), X, dtype="int16")
    assert {p.dtype for p in _activation_qparams(gm)} == {torch.int16}
    assert {weight_dq(gm, n).dtype for n in _weighted(gm)} == {torch.int8}


def test_asymmetric_int8_gives_nonzero_zero_point_weights_stay_symmetric():
    """All-positive calibration input: the affine input quantizer uses the whole range
    ([0, max] -> [-128, 127], zero point -128); weights keep zero point 0."""
    calib = [torch.rand(X.shape, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    gm = convert(ConvReluPool(c=8, classes=4), X, calib, symmetric_activations=False)
    first_conv = _weighted(gm)[0]
    assert input_dq(first_conv).zero_point == -128
    assert all(torch.all(weight_dq(gm, n).zero_points == 0) for n in _weighted(gm))


def test_asymmetric_int16_request_is_symmetric_on_the_graph():
    calib = [torch.rand(X.shape, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    with pytest.warns(UserWarning):
        gm = convert(ConvReluPool(c=8, classes=4), X, calib, dtype="int16", symmetric_activations=False)
    acts = _activation_qparams(gm)
    assert {(p.dtype, p.zero_point) for p in acts} == {(torch.int16, 0)}
