"""The quantized graphs still import into Relax (the backend depends on it), and the
vendor quantizer, when installed, takes the same call the prepare stage makes."""

from __future__ import annotations

import inspect

import pytest
import torch

import qflow
from quant_graph import Q, nodes


@pytest.mark.parametrize("make, shape, kwargs", [
    (lambda: qflow.ConvReluPool(c=8, classes=4), (1, 3, 8, 8), {}),
    (lambda: qflow.InvertedResidual(cin=8, cout=8, expand=4), (1, 8, 8, 8), {}),
    (lambda: qflow.InvertedResidual(cin=8, cout=8, expand=4), (1, 8, 8, 8), dict(dtype="int16")),
    (lambda: qflow.InvertedResidual(cin=8, cout=8, expand=4), (1, 8, 8, 8),
     dict(fuse_activations=False, symmetric_activations=False)),
])
def test_qflow_quantize_imports_into_relax(make, shape, kwargs):
    """Every torch quantize_per_tensor becomes one R.quantize in the imported module."""
    flow = qflow.quantize(qflow.randomize_bn(make()), torch.randn(shape), **kwargs)
    text = flow.mod.script()
    n_q = len(nodes(flow.qdq, Q))
    assert n_q > 0
    assert text.count("R.quantize(") == n_q
    assert "R.dequantize(" in text


def _vendor_quantizer():
    try:
        from tvm.relax.frontend.torch import C7xMMAQuantizer  # type: ignore[attr-defined]
    except ImportError:
        return None
    return C7xMMAQuantizer


@pytest.mark.skipif(_vendor_quantizer() is None,
                    reason="TI's tvm fork (tvm.relax.frontend.torch.C7xMMAQuantizer) is not installed; "
                           "upstream apache-tvm has no C7x quantizer")
def test_vendor_quantizer_accepts_the_prepare_stage_call():
    """pipeline/quant/program.py calls the vendor class with dtype= and
    symmetric_activations= only; ours must accept the same keywords."""
    from pipeline.quant import C7xMMAQuantizer
    vendor = inspect.signature(_vendor_quantizer().__init__).parameters
    ours = inspect.signature(C7xMMAQuantizer.__init__).parameters
    for name in ("dtype", "symmetric_activations"):
        assert name in vendor and name in ours
        assert vendor[name].default == ours[name].default
