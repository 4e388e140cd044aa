"""Q/DQ cleanups: transparent ops on the integers and q(dq(x)) elimination."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
from qflow import ConvReluPool, quantize, randomize_bn
from tvm import relax

from pipeline.backend.passes.cleanup import eliminate_qdq_pairs, eliminate_qdq_transparent
from pipeline.backend.passes.graph import Graph
from pipeline.backend.passes.log import OffloadLog


def _count(mod, op):
    g = Graph(mod["main"])
    return sum(g.call(b.var, op) is not None for b in g.bindings)


def test_transparent_reshape_runs_on_int8():
    torch.manual_seed(0)
    flow = quantize(randomize_bn(ConvReluPool()), torch.randn(1, 3, 16, 16))
    log = OffloadLog()
    mod = eliminate_qdq_transparent(flow.mod, log)
    g = Graph(mod["main"])
    reshapes = [b.var for b in g.bindings if g.call(b.var, "relax.reshape") is not None]
    assert any(str(v.ty.dtype) == "int8" for v in reshapes)
    assert _count(mod, "relax.quantize") == _count(flow.mod, "relax.quantize") - 1
    assert [(d.op, d.status) for d in log.decisions] == [("reshape", "simplified")]


def test_qdq_pair_of_a_dropout_disappears():
    class Drop(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.2)
            self.fc = nn.Linear(32, 32)

        def forward(self, x):
            return self.fc(self.drop(x))

    torch.manual_seed(0)
    flow = quantize(Drop(), torch.randn(1, 32))
    log = OffloadLog()
    mod = eliminate_qdq_pairs(flow.mod, log)
    assert _count(mod, "relax.quantize") == _count(flow.mod, "relax.quantize") - 1
    assert [(d.op, d.status) for d in log.decisions] == [("qdq_pair", "simplified")]


def _handmade(out_scale: float, out_zp: int):
    """x:int8 -> dq(0.1, 2) -> reshape -> q(out_scale, out_zp) -> dq -> q(same)."""
    c = lambda v, dt: relax.const(np.array(v, dt), dt)  # noqa: E731
    x = relax.Var("x", relax.TensorType((1, 4, 2, 2), "int8"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            f = bb.emit(relax.op.dequantize(x, c(0.1, "float32"), c(2, "int8")))
            r = bb.emit(relax.op.reshape(f, (1, 16)))
            q = bb.emit(relax.op.quantize(r, c(out_scale, "float32"), c(out_zp, "int8")))
            f2 = bb.emit(relax.op.dequantize(q, c(0.5, "float32"), c(0, "int8")))
            q2 = bb.emit_output(relax.op.quantize(f2, c(0.5, "float32"), c(0, "int8")))
        bb.emit_func_output(q2)
    return bb.get()


def test_cleanups_need_equal_parameters():
    # Different scale or zero point: the reshape must stay float (a requantization is needed),
    # and q(dq) with different parameters stays too.
    for scale, zp in ((0.2, 2), (0.1, 3)):
        mod = _handmade(scale, zp)
        log = OffloadLog()
        out = eliminate_qdq_pairs(eliminate_qdq_transparent(mod, log), log)
        assert _count(out, "relax.quantize") == 2 - 1        # only the matching dq(0.5)/q(0.5) pair goes
        assert [d.op for d in log.decisions] == ["qdq_pair"]
    log = OffloadLog()
    out = eliminate_qdq_transparent(_handmade(0.1, 2), log)
    assert [d.op for d in log.decisions] == ["reshape"] and _count(out, "relax.dequantize") == 1
