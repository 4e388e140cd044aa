"""One test per row of the annotation table (docs/reference.md, "Quantizer rules"), on the
converted Q/DQ graph."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from quant_graph import (DQ, DQ_CHANNEL, QDQ_OPS, convert, input_dq, nodes, one, output_q, qparams,
                         weight_dq)
from quant_nets import (AddNet, CatNet, ConvThen, DepthwiseNet, DetectionHead, IntFlatten, Lambda,
                        LinearNet, MatMulNet, NonTensorAdd)

aten = torch.ops.aten
X = torch.randn(1, 3, 8, 8)


def test_conv_input_act_output_act():
    """conv2d (here depthwise then pointwise): input and output observed, so the two
    convs meet through one Q/DQ pair (same scale on both sides)."""
    gm = convert(DepthwiseNet(), torch.randn(1, 8, 8, 8))
    dw, pw = nodes(gm, aten.conv2d.default)
    assert input_dq(dw) is not None and weight_dq(gm, dw) is not None
    assert output_q(dw) is not None and output_q(dw) == input_dq(pw)
    assert output_q(pw) is not None


def test_linear_input_act_per_channel_weight_output_act():
    gm = convert(LinearNet(), torch.randn(2, 16), fuse_activations=False)
    fc1, fc2 = nodes(gm, aten.linear.default)
    for fc in (fc1, fc2):
        assert input_dq(fc) is not None
        assert weight_dq(gm, fc) is not None
        assert output_q(fc) is not None
        assert fc.args[2].target not in (DQ, DQ_CHANNEL)  # bias float


def test_mm_both_inputs_per_tensor_act_output_act():
    gm = convert(MatMulNet(), torch.randn(4, 16))
    mm = one(gm, aten.mm.default)
    assert input_dq(mm, 0) is not None and input_dq(mm, 1) is not None  # per-tensor, not per-channel
    assert output_q(mm) is not None


def test_addmm_operands_per_tensor_bias_float_output_act():
    gm = convert(MatMulNet(), torch.randn(4, 16))
    addmm = one(gm, aten.addmm.default)
    bias = addmm.args[0]
    assert not (isinstance(bias, torch.fx.Node) and bias.target in QDQ_OPS)
    assert input_dq(addmm, 1) is not None
    assert input_dq(addmm, 2) is not None  # the weight operand: per-tensor (reference)
    assert output_q(addmm) is not None


@pytest.mark.parametrize("inplace, target", [(False, aten.add.Tensor), (True, aten.add_.Tensor)])
def test_residual_add_both_inputs_act_output_act(inplace, target):
    gm = convert(AddNet(relu=False, inplace=inplace), X)
    add = one(gm, target)
    a, b = nodes(gm, aten.conv2d.default)
    assert input_dq(add, 0) == output_q(a) and input_dq(add, 1) == output_q(b)
    assert input_dq(add, 0) is not None and input_dq(add, 1) is not None
    assert output_q(add) is not None


def test_add_with_scalar_or_int_tensor_is_not_annotated():
    """Float-tensor gating: ``y + 1.0`` (not a Node) and ``y + arange`` (int64 Node) stay float."""
    gm = convert(NonTensorAdd(), X)
    scalar_add, int_add = nodes(gm, aten.add.Tensor)
    assert output_q(scalar_add) is None
    assert output_q(int_add) is None
    assert int_add.args[1].target == aten.arange.default  # no Q/DQ on the int operand


INDEPENDENT_ACTS = [
    (nn.GELU(), aten.gelu.default), (nn.SiLU(), aten.silu.default),
    (nn.Hardsigmoid(), aten.hardsigmoid.default), (nn.Hardswish(), aten.hardswish.default),
    (nn.SiLU(inplace=True), aten.silu_.default), (nn.Hardswish(inplace=True), aten.hardswish_.default),
]


@pytest.mark.parametrize("op, target", INDEPENDENT_ACTS, ids=lambda v: str(v))
def test_activation_input_act_independent_output(op, target):
    """conv -> activation -> graph output, so only the activation's own annotation can
    quantize its output. A bias of -3 puts the conv output's largest magnitude on the
    negative side; the activation squashes it, so its own observer's scale is far below
    the conv's (sharing would give the conv's)."""
    gm = convert(ConvThen(op, bias=-3.0, tail=False), X)
    conv = one(gm, aten.conv2d.default)
    act = one(gm, target)
    assert input_dq(act) is not None and input_dq(act) == output_q(conv)
    out = output_q(act)
    assert out is not None
    assert out.scale < 0.5 * input_dq(act).scale


POOLS = [
    (nn.AdaptiveAvgPool2d(1), aten.adaptive_avg_pool2d.default),
    (nn.AvgPool2d(2), aten.avg_pool2d.default),
    (Lambda(lambda x: x.mean((2, 3), keepdim=True)), aten.mean.dim),
]


@pytest.mark.parametrize("op, target", POOLS, ids=lambda v: str(v))
def test_average_pools_input_act_independent_output(op, target):
    """conv -> pool -> graph output. Averaging shrinks the range, so the pool's own output
    observer gives a smaller scale than its input's."""
    gm = convert(ConvThen(op, tail=False), X)
    pool = one(gm, target)
    assert input_dq(pool) is not None
    assert output_q(pool) is not None and output_q(pool).scale < input_dq(pool).scale


def test_layer_norm_input_act_weight_bias_float_output_act():
    """layer_norm alone on the graph input: any Q/DQ around it comes from its annotation."""
    gm = convert(nn.LayerNorm(8), torch.randn(1, 4, 8))
    ln = one(gm, aten.layer_norm.default)
    assert input_dq(ln) is not None
    weight, bias = ln.args[2], ln.args[3]
    assert weight.op == "get_attr" and bias.op == "get_attr"  # float, no dequantize
    assert output_q(ln) is not None and output_q(ln) != input_dq(ln)


TRANSPARENT = [
    (nn.MaxPool2d(2), aten.max_pool2d.default, True),
    (Lambda(lambda x: x.view(1, 8, 64)), aten.view.default, True),
    (Lambda(lambda x: x.permute(0, 2, 3, 1)), aten.permute.default, True),
    (Lambda(lambda x: torch.flatten(x, 1)), aten.flatten.using_ints, True),
    (Lambda(lambda x: x.reshape(1, 8, 64)), aten.reshape.default, True),
    (nn.Dropout(0.5), aten.dropout.default, True),
    # relu-like ops are fused by default; fuse_activations=False shows the table's rule
    (nn.ReLU(), aten.relu.default, False),
    (nn.ReLU(inplace=True), aten.relu_.default, False),
    (nn.ReLU6(), aten.hardtanh.default, False),
    (nn.ReLU6(inplace=True), aten.hardtanh_.default, False),
    (Lambda(F.relu6), aten.relu6.default, False),
]


@pytest.mark.parametrize("op, target, fuse", TRANSPARENT, ids=lambda v: str(v))
def test_transparent_output_shares_the_annotated_input(op, target, fuse):
    """Transparent op after a conv: its input and output carry the conv output's scale
    and zero point. A negative conv bias makes a non-shared output scale differ."""
    gm = convert(ConvThen(op, bias=-3.0, tail=False), X, fuse_activations=fuse)
    conv = one(gm, aten.conv2d.default)
    node = one(gm, target)
    assert output_q(conv) is not None
    assert input_dq(node) == output_q(conv)
    assert output_q(node) == output_q(conv)


def test_transparent_on_unannotated_input_gets_independent_output():
    """relu directly on the graph input (not annotated): input observed over [-4, 1],
    output independently over [0, 1]."""
    x = torch.linspace(-4.0, 1.0, 192).reshape(1, 3, 8, 8)
    gm = convert(Lambda(F.relu), x, [x])
    relu = one(gm, aten.relu.default)
    assert input_dq(relu).scale == pytest.approx(4.0 / 127.5)
    assert output_q(relu).scale == pytest.approx(1.0 / 127.5)


def test_transparent_on_int_tensor_is_not_annotated():
    gm = convert(IntFlatten(), X)
    flat = one(gm, aten.flatten.using_ints)
    assert flat.args[0].target == aten.argmax.default
    assert output_q(flat) is None


NOT_ANNOTATED = [
    (Lambda(lambda x: torch.cat([x, x], 1)), aten.cat.default),
    (Lambda(lambda x: x * x), aten.mul.Tensor),
    (Lambda(lambda x: F.group_norm(x, 1)), aten.group_norm.default),
    (Lambda(torch.sigmoid), aten.sigmoid.default),
]


@pytest.mark.parametrize("op, target", NOT_ANNOTATED, ids=lambda v: str(v))
def test_cat_mul_group_norm_sigmoid_are_not_annotated(op, target):
    """Applied to the graph input: annotating the op would put Q/DQ on its input or output."""
    gm = convert(op, X)
    assert len(nodes(gm, target)) == 1
    assert nodes(gm, *QDQ_OPS) == []


def test_cat_does_not_unify_its_inputs():
    """cat of two convs with different ranges: each input keeps its own scale (no
    shared cat spec), and the consumer re-quantizes cat's float output."""
    gm = convert(CatNet(), X)
    cat = one(gm, aten.cat.default)
    first, second = cat.args[0]
    assert first.target == DQ and second.target == DQ
    assert qparams(first).scale != qparams(second).scale
    assert output_q(cat) is not None  # the consumer conv's input observer


def _detection_nodes(gm):
    return {name: one(gm, t) for name, t in [("permute", aten.permute.default),
                                              ("reshape", aten.reshape.default),
                                              ("max", aten.max.dim)]}


def test_detection_head_ops_reaching_topk_stay_float():
    gm = convert(DetectionHead(use_topk=True), X)
    head = nodes(gm, aten.conv2d.default)[1]
    ops = _detection_nodes(gm)
    assert output_q(head) is not None and input_dq(ops["permute"]) == output_q(head)
    for name, node in ops.items():
        assert output_q(node) is None, f"{name} output quantized on the way to topk"
    assert ops["reshape"].args[0] is ops["permute"]


def test_same_head_without_topk_is_quantized():
    """Control for the detection rule: without topk the permute/reshape are transparent."""
    gm = convert(DetectionHead(use_topk=False), X)
    ops = _detection_nodes(gm)
    assert output_q(ops["permute"]) is not None
    assert output_q(ops["reshape"]) == output_q(ops["permute"])


def test_activation_reaching_topk_is_not_fused():
    """relu on the scores: the score conv output is observed (as the reference does) and
    the relu stays float; the feature relu (not reaching topk) is fused."""
    gm = convert(DetectionHead(use_topk=True, act_on_scores=True), X)
    feat, head = nodes(gm, aten.conv2d.default)
    feat_relu, score_relu = nodes(gm, aten.relu.default)
    assert output_q(feat) is None and output_q(feat_relu) is not None
    assert output_q(head) is not None and output_q(score_relu) is None
