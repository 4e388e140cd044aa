"""fuse_activations (our deviation, quantizer module docstring) in both modes, and the
unbroken int8 chain on the MobileNetV2 shapes the backend sees."""

from __future__ import annotations

import pytest
import torch
import torchvision

from qflow import ConvReluPool, InvertedResidual, randomize_bn
from quant_graph import convert, input_dq, nodes, one, output_q
from quant_nets import AddNet, LinearNet, TwoUsers

aten = torch.ops.aten
X = torch.randn(1, 3, 8, 8)
RELU6 = (aten.hardtanh.default, aten.hardtanh_.default)


def test_fused_conv_relu_observes_after_the_activation():
    """ConvReluPool: conv->relu and conv->relu6: the conv output has no Q, the activation
    output does, and max_pool2d shares the relu's Q (transparent)."""
    gm = convert(ConvReluPool(c=8, classes=4), X)
    c1, c2 = nodes(gm, aten.conv2d.default)
    relu, relu6 = one(gm, aten.relu.default), one(gm, aten.relu6.default)
    assert relu.args[0] is c1 and relu6.args[0] is c2  # no Q/DQ between conv and activation
    assert output_q(c1) is None and output_q(c2) is None
    assert output_q(relu) is not None and output_q(relu6) is not None
    pool = one(gm, aten.max_pool2d.default)
    assert input_dq(pool) == output_q(relu) == output_q(pool)


def test_unfused_conv_relu_follows_the_reference_table():
    """fuse_activations=False: conv output observed, relu shares that observer."""
    gm = convert(ConvReluPool(c=8, classes=4), X, fuse_activations=False)
    c1, c2 = nodes(gm, aten.conv2d.default)
    relu, relu6 = one(gm, aten.relu.default), one(gm, aten.relu6.default)
    for conv, act in ((c1, relu), (c2, relu6)):
        assert output_q(conv) is not None
        assert input_dq(act) == output_q(conv) == output_q(act)


@pytest.mark.parametrize("fuse", [True, False])
def test_relu6_block(fuse):
    """MobileNetV2 inverted residual (ReLU6 = hardtanh): fused, each ReLU6 is observed on its
    own [0, <=6] range straight after the conv; unfused, it shares the conv's observer."""
    block = randomize_bn(InvertedResidual(cin=8, cout=8, stride=1, expand=4))
    gm = convert(block, torch.randn(1, 8, 8, 8), fuse_activations=fuse)
    acts = nodes(gm, *RELU6)
    assert len(acts) == 2
    for act in acts:
        conv = act.args[0] if fuse else act.args[0].args[0].args[0]  # act <- DQ <- Q <- conv
        assert conv.target == aten.conv2d.default
        if fuse:
            assert output_q(conv) is None and input_dq(act) is None
            assert output_q(act).scale <= 6.0 / 127.5 * (1 + 1e-6)
        else:
            assert output_q(conv) is not None and output_q(act) == output_q(conv)


@pytest.mark.parametrize("inplace, target", [(False, aten.add.Tensor), (True, aten.add_.Tensor)])
def test_add_relu_fused(inplace, target):
    gm = convert(AddNet(relu=True, inplace=inplace), X)
    add, relu = one(gm, target), one(gm, aten.relu.default)
    assert input_dq(add, 0) is not None and input_dq(add, 1) is not None
    assert relu.args[0] is add and output_q(add) is None
    assert output_q(relu) is not None


def test_linear_relu_fused():
    gm = convert(LinearNet(), torch.randn(2, 16))
    fc1 = nodes(gm, aten.linear.default)[0]
    relu = one(gm, aten.relu.default)
    assert relu.args[0] is fc1 and output_q(fc1) is None and output_q(relu) is not None


def test_producer_with_two_users_is_not_fused():
    gm = convert(TwoUsers(), X)
    conv, relu = one(gm, aten.conv2d.default), one(gm, aten.relu.default)
    assert output_q(conv) is not None
    assert input_dq(relu) == output_q(conv) == output_q(relu)  # transparent, shared


@pytest.mark.parametrize("fuse", [True, False])
def test_torchvision_mobilenet_v2_int8_chain_unbroken(fuse):
    """torchvision MobileNetV2 (width 0.25, 32x32 input, ~4 s): every conv2d/linear reads a
    dequantized int8 input, and every ReLU6 (hardtanh_), add, pool, flatten and dropout
    output is quantized, so no float tensor sits between two MMALIB layers."""
    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v2(width_mult=0.25, num_classes=10)
    gm = convert(model, torch.randn(1, 3, 32, 32), fuse_activations=fuse)
    weighted = nodes(gm, aten.conv2d.default, aten.linear.default)
    assert len(weighted) == 53
    assert all(input_dq(n) is not None and input_dq(n).dtype == torch.int8 for n in weighted)
    quantized_outputs = nodes(gm, aten.hardtanh_.default, aten.add.Tensor, aten.adaptive_avg_pool2d.default,
                              aten.flatten.using_ints, aten.dropout.default)
    assert len(quantized_outputs) == 35 + 11 + 3  # ReLU6, residual adds (width 0.25), head
    assert all(output_q(n) is not None for n in quantized_outputs)
