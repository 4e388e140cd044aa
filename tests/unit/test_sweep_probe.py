"""The sweep's one-layer probe (scripts/sweep.py): the Q/DQ program with one layer
requantized as the MMALIB kernels do, and the "far from Q/DQ" rule that uses it."""

from __future__ import annotations

import copy
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

from qflow import quantize

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "tests" / "backend"))
import sweep  # noqa: E402


def _outputs(module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return np.concatenate([module(torch.from_numpy(x[i:i + 1])).numpy() for i in range(len(x))])


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed for the host build")
def test_probe_layer_computes_what_the_mmalib_kernel_computes(tmp_path):
    """One conv + ReLU: torch's Q/DQ layer differs from the MMALIB build on a few % of
    the outputs (7-bit multiplier); after requantize_like_mmalib it equals it but for
    rare ties (the kernel rounds half up, the folded bias is an integer)."""
    from c_check import compile_and_compare, inputs

    torch.manual_seed(0)
    x = inputs((1, 3, 16, 16), n=3, seed=7)
    flow = quantize(nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1), nn.ReLU()), torch.from_numpy(x[:1]))
    probe = copy.deepcopy(flow.qdq)
    assert sweep.requantize_like_mmalib(probe) == "conv2d"
    _, c = compile_and_compare(flow.mod, "one_conv", tmp_path, x, mmalib=True)
    qdq, moved = _outputs(flow.qdq, x), _outputs(probe, x)
    c = c.reshape(qdq.shape)
    lsb = sweep._attr(flow.qdq, [n for n in flow.qdq.graph.nodes if "dequantize_per_tensor" in str(n.target)][-1].args[1])
    before = float((np.abs(c - qdq) > lsb / 2).mean())
    after = float((np.abs(c - moved) > lsb / 2).mean())
    assert before > 0.01 and after < before / 10, (before, after)


def test_probe_finds_no_layer_without_a_conv():
    flow = quantize(nn.Sequential(nn.ReLU()), torch.randn(1, 3, 8, 8))
    assert sweep.requantize_like_mmalib(copy.deepcopy(flow.qdq)) is None


def _row(mmalib_mean: float, scalar_mean: float, probe_mean: float | None) -> dict:
    return {"bit_exact": {"mmalib": 4, "scalar": 4}, "images": 4, "logit_std": 30.0,
            "qdq_lsb": {"mmalib": [100.0, mmalib_mean], "scalar": [10.0, scalar_mean]},
            "probe_lsb": None if probe_mean is None else [100.0, probe_mean]}


def test_far_from_qdq_only_beyond_what_one_layer_moves():
    # ShuffleNetV2 x0.5 (random weights): MMALIB 26.9, scalar 0.95, probe 26.2 LSB mean
    assert sweep.status_of(_row(26.9, 0.95, 26.2)) == "bit-exact (mmalib amplified by the model)"
    assert sweep.status_of(_row(60.0, 0.95, 26.2)) == "bit-exact (mmalib far from Q/DQ)"
    assert sweep.status_of(_row(26.9, 0.95, None)) == "bit-exact (mmalib far from Q/DQ)"
    assert sweep.status_of(_row(2.0, 0.95, 0.3)) == "bit-exact"
