"""C7xMMAQuantizer constructor options, observers, idempotency and validate()
(docs/reference.md, "Quantizer rules")."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
from torchao.quantization.pt2e import (HistogramObserver, MinMaxObserver,
                                       MovingAverageMinMaxObserver, ObserverBase,
                                       PerChannelMinMaxObserver)
from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, QuantizationSpec

from pipeline.quant import C7xMMAQuantizer
from qflow import ConvReluPool
from quant_graph import prepare

X = torch.randn(1, 3, 8, 8)


def small_net() -> nn.Module:
    return ConvReluPool(c=8, classes=4)


@pytest.mark.parametrize("dtype", ["uint8", "int4", "float16", None])
def test_unknown_dtype_raises_value_error_naming_allowed(dtype):
    with pytest.raises(ValueError, match=r"int16.*int8|int8.*int16"):
        C7xMMAQuantizer(dtype=dtype)


def test_unknown_observer_raises_value_error_naming_allowed():
    with pytest.raises(ValueError, match="entropy.*histogram.*minmax.*moving_average.*percentile"):
        C7xMMAQuantizer(observer="kl")


@pytest.mark.parametrize("kwargs", [dict(dtype="int8", weight_dtype="float16"),
                                    dict(weight_dtype="int4"), dict(dtype="int16", weight_dtype="uint8")])
def test_bad_weight_dtype_raises_value_error(kwargs):
    with pytest.raises(ValueError, match="weight_dtype"):
        C7xMMAQuantizer(**kwargs)


def test_asymmetric_int16_warns_and_stays_symmetric():
    with pytest.warns(UserWarning, match="int16 activations are always symmetric"):
        q = C7xMMAQuantizer(dtype="int16", symmetric_activations=False)
    assert q.symmetric_activations is True
    assert q.activation_spec.qscheme == torch.per_tensor_symmetric


def test_default_options_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        C7xMMAQuantizer()
        C7xMMAQuantizer(dtype="int16", weight_dtype="int16")
        C7xMMAQuantizer(symmetric_activations=False)


@pytest.mark.parametrize("observer, cls", [("minmax", MinMaxObserver), ("histogram", HistogramObserver),
                                           ("moving_average", MovingAverageMinMaxObserver)])
def test_observers_are_torchao_classes(observer, cls):
    """Activation observers are the requested torchao class, weights always
    PerChannelMinMaxObserver (torch.ao observers would not be converted)."""
    gm = prepare(small_net(), X, observer=observer)
    observers = [m for m in gm.modules() if isinstance(m, ObserverBase)]
    per_channel = [m for m in observers if isinstance(m, PerChannelMinMaxObserver)]
    acts = [m for m in observers if not isinstance(m, PerChannelMinMaxObserver)]
    assert len(per_channel) == 3  # c1, c2, fc weights
    assert acts and all(type(m) is cls for m in acts)
    assert all(type(m).__module__.startswith("torchao.") for m in observers)


def test_only_call_function_nodes_are_annotated_and_annotate_is_idempotent():
    gm = torch.export.export(small_net().eval(), (X,)).module()
    quantizer = C7xMMAQuantizer()
    quantizer.annotate(gm)
    first = {n: n.meta.get("quantization_annotation") for n in gm.graph.nodes}
    assert sum(ann is not None for ann in first.values()) >= 6
    assert all(ann is None for n, ann in first.items() if n.op != "call_function")
    quantizer.annotate(gm)
    C7xMMAQuantizer(fuse_activations=False).annotate(gm)  # would annotate differently
    again = {n: n.meta.get("quantization_annotation") for n in gm.graph.nodes}
    assert all(again[n] is first[n] for n in first)


def _annotated_graph(weight_qscheme) -> torch.fx.GraphModule:
    """The ConvReluPool graph with conv ``c1`` pre-annotated by a foreign quantizer whose
    weight spec uses ``weight_qscheme``, then annotated by ours (which must leave it)."""
    ep = torch.export.export(small_net().eval(), (X,))
    gm = ep.module()
    conv = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.conv2d.default)
    spec = QuantizationSpec(dtype=torch.int8, quant_min=-128, quant_max=127, qscheme=weight_qscheme,
                            observer_or_fake_quant_ctr=MinMaxObserver.with_args())
    foreign = QuantizationAnnotation(input_qspec_map={conv.args[1]: spec}, _annotated=True)
    conv.meta["quantization_annotation"] = foreign
    C7xMMAQuantizer().annotate(gm)
    assert conv.meta["quantization_annotation"] is foreign
    return gm


def test_validate_warns_on_per_tensor_conv_weight():
    gm = _annotated_graph(torch.per_tensor_symmetric)
    with pytest.warns(UserWarning, match="per-tensor"):
        C7xMMAQuantizer().validate(gm)


def test_validate_is_silent_on_per_channel_weights():
    gm = prepare(small_net(), X)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        C7xMMAQuantizer().validate(gm)


def test_int16_weights_reach_only_the_int16_layers_of_a_mixed_model():
    """weight_dtype="int16" with dtype int8: the int16 layers' weights are observed in
    int16, every int8 layer's in int8 (its kernels' only form)."""
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    from pipeline.frontend.provenance import tag_program
    from pipeline.quant.graph import observer_of
    from tinynets import SmallCNN
    ep = torch.export.export(SmallCNN().eval(), (torch.randn(1, 3, 32, 32),))
    tag_program(ep)
    q = C7xMMAQuantizer("int8", int16_layers={"conv2d_1", "linear"}, weight_dtype="int16")
    gm = prepare_pt2e(ep.module(), q)
    weights = {}
    for node in gm.graph.nodes:
        obs = observer_of(gm, node)
        if obs is not None and obs.qscheme == torch.per_channel_symmetric:
            (user,) = node.users
            weights[user.name] = obs.dtype
    assert weights["conv2d_1"] == torch.int16 and weights["linear"] == torch.int16
    assert {k: v for k, v in weights.items() if k not in ("conv2d_1", "linear")} \
        and all(v == torch.int8 for k, v in weights.items() if k not in ("conv2d_1", "linear"))
