"""Refusal by exception (issue 8): a planner raises Declined inside
declining(), run_pass catches it once and logs the layer with the reason."""

from __future__ import annotations

import pytest
from tvm import relax

from pipeline.backend.passes.log import DECLINED, OffloadLog
from pipeline.backend.passes.rewrite import run_pass
from pipeline.backend.refusal import Declined, declining


def _module(n: int = 8):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, n], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(x))
            z = bb.emit_output(bb.emit(relax.op.nn.relu(y)))
        bb.emit_func_output(z)
    return bb.get()


def test_declining_attaches_the_layer_and_keeps_an_earlier_one():
    with pytest.raises(Declined) as e:
        with declining("outer", "conv2d", "int8"):
            with declining("inner", "fc", "int16"):
                raise Declined("K=30 is not a multiple of 32")
    assert (e.value.anchor, e.value.op, e.value.dtype, e.value.reason) == ("inner", "fc", "int16",
                                                                          "K=30 is not a multiple of 32")


def test_run_pass_logs_each_refusal_once_and_leaves_the_module_alone():
    mod = _module()

    def planner(graph, binding):
        with declining(binding.var.name, "relu", "int8"):
            raise Declined(f"no kernel for {binding.var.name}")

    log = OffloadLog()
    out = run_pass(mod, log, "test_pass", planner)
    declined = log.with_status(DECLINED)
    names = [b.var.name for block in mod["main"].body.blocks for b in block.bindings]
    assert [d.anchor for d in declined] == names
    assert [d.reason for d in declined] == [f"no kernel for {n}" for n in names]
    assert all(d.pass_name == "test_pass" for d in declined)
    assert out.same_as(mod)


def test_a_refusal_without_its_layer_is_a_planner_bug():
    def planner(graph, binding):
        raise Declined("forgot declining()")

    with pytest.raises(RuntimeError, match="outside declining"):
        run_pass(_module(), OffloadLog(), "buggy", planner)
