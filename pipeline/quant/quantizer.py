"""C7xMMAQuantizer: the PT2E quantizer that shapes graphs for the C7x MMALIB backend.

First version (walking skeleton): conv2d/linear with per-channel symmetric
weights, residual add, relu/hardtanh (fused into the producer), pools, flatten
and reshapes. Full parity with the reference table is tracked separately.
"""

from __future__ import annotations

import warnings

import torch
from torch.fx import Node
from torchao.quantization.pt2e import (HistogramObserver, MinMaxObserver,
                                       MovingAverageMinMaxObserver, PerChannelMinMaxObserver)
from torchao.quantization.pt2e.quantizer import (QuantizationAnnotation, QuantizationSpec,
                                                 Quantizer, SharedQuantizationSpec)

aten = torch.ops.aten

_RANGES = {"int8": (torch.int8, -128, 127), "int16": (torch.int16, -32768, 32767)}
_OBSERVERS = {"minmax": MinMaxObserver, "histogram": HistogramObserver,
              "moving_average": MovingAverageMinMaxObserver}

_WEIGHTED = {aten.conv2d.default, aten.linear.default}
_ADD = {aten.add.Tensor, aten.add_.Tensor}
_ACTIVATIONS = {aten.relu.default, aten.relu_.default, aten.hardtanh.default, aten.hardtanh_.default}
_INDEPENDENT = {aten.adaptive_avg_pool2d.default, aten.avg_pool2d.default, aten.mean.dim}
_TRANSPARENT = {aten.max_pool2d.default, aten.flatten.using_ints, aten.view.default,
                aten.reshape.default, aten.permute.default, aten.dropout.default}


class C7xMMAQuantizer(Quantizer):
    """PT2E quantizer for the TI C7x MMA (see module docstring)."""

    def __init__(self, dtype: str = "int8", symmetric_activations: bool = True,
                 weight_dtype: str | None = None, observer: str = "minmax",
                 fuse_activations: bool = True):
        super().__init__()
        if dtype not in _RANGES:
            raise ValueError(f"dtype must be one of {sorted(_RANGES)}, got {dtype!r}")
        if dtype == "int16" and not symmetric_activations:
            warnings.warn("int16 activations are always symmetric (asymmetric int16 has no "
                          "lowering path); symmetric_activations=False is ignored", UserWarning)
            symmetric_activations = True
        if observer not in _OBSERVERS:
            raise ValueError(f"observer must be one of {sorted(_OBSERVERS)}, got {observer!r}")
        self.dtype = dtype
        self.symmetric_activations = symmetric_activations
        self.weight_dtype = weight_dtype or "int8"
        self.fuse_activations = fuse_activations
        qdtype, qmin, qmax = _RANGES[dtype]
        scheme = torch.per_tensor_symmetric if symmetric_activations else torch.per_tensor_affine
        self.act_spec = QuantizationSpec(dtype=qdtype, quant_min=qmin, quant_max=qmax, qscheme=scheme,
                                         observer_or_fake_quant_ctr=_OBSERVERS[observer].with_args())
        wdtype, wmin, wmax = _RANGES[self.weight_dtype]
        self.weight_spec = QuantizationSpec(dtype=wdtype, quant_min=wmin, quant_max=wmax,
                                            qscheme=torch.per_channel_symmetric, ch_axis=0,
                                            observer_or_fake_quant_ctr=PerChannelMinMaxObserver.with_args())

    def _fused_activation(self, node: Node) -> Node | None:
        users = list(node.users)
        if self.fuse_activations and len(users) == 1 and users[0].target in _ACTIVATIONS:
            return users[0]
        return None

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        """Attach ``quantization_annotation`` to supported nodes (skips annotated ones)."""
        for node in model.graph.nodes:
            if node.op != "call_function" or "quantization_annotation" in node.meta:
                continue
            if node.target in _WEIGHTED:
                self._annotate(node, {node.args[0]: self.act_spec, node.args[1]: self.weight_spec})
            elif node.target in _ADD and all(isinstance(a, Node) for a in node.args[:2]):
                self._annotate(node, {a: self.act_spec for a in node.args[:2]})
            elif node.target in _ACTIVATIONS or node.target in _TRANSPARENT:
                src = node.args[0]
                ann = src.meta.get("quantization_annotation")
                if ann is not None and ann.output_qspec is not None:
                    out = SharedQuantizationSpec(src)
                else:
                    out = self.act_spec
                node.meta["quantization_annotation"] = QuantizationAnnotation(
                    input_qspec_map={src: self.act_spec}, output_qspec=out, _annotated=True)
            elif node.target in _INDEPENDENT:
                node.meta["quantization_annotation"] = QuantizationAnnotation(
                    input_qspec_map={node.args[0]: self.act_spec}, output_qspec=self.act_spec,
                    _annotated=True)
        return model

    def _annotate(self, node: Node, input_map: dict) -> None:
        act = self._fused_activation(node)
        node.meta["quantization_annotation"] = QuantizationAnnotation(
            input_qspec_map=input_map, output_qspec=None if act is not None else self.act_spec,
            _annotated=True)
        if act is not None:
            act.meta["quantization_annotation"] = QuantizationAnnotation(
                output_qspec=self.act_spec, _annotated=True)

    def validate(self, model: torch.fx.GraphModule) -> None:
        """Nothing to check in the skeleton version."""
