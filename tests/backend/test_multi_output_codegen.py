"""Models with several outputs (issue 11): the C entry keeps its ABI
``<m>_run(weights, input, output)`` and packs every output back to back in
``output``, in the model's return order.

Each net goes through lowering, the memory plan, the emitter, gcc and the
Python reference (bit-exact on the whole packed buffer), and each output
unpacked from the C equals the PyTorch Q/DQ model's output of the same index
(within 2 steps of an int8 scale: the order and the offsets are right). The
plan's corner cases: an output that a later kernel reads back from the
caller's buffer, the same tensor returned twice, the model input returned,
a reshape view returned; a tuple of one stays a single output.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from tvm import relax

from c_check import GCC, compile_and_compare, inputs, strict_compile
from qflow import quantize

from pipeline.backend.call_graph import io_names
from pipeline.backend.host import model_info
from pipeline.backend.interp import Program, split_outputs
from pipeline.backend.lower import lower_module
from pipeline.backend.memory_plan import Plan, _Planner, plan_main

pytestmark = pytest.mark.skipif(GCC is None, reason="gcc is not installed: the host build needs it")

SHAPE = (1, 3, 16, 16)


class _Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3, 1, 1)
        self.fc = nn.Linear(8, 10)

    def features(self, x):
        return F.relu(self.c(x))

    def logits(self, y):
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))


class LogitsAndFeatures(_Base):
    def forward(self, x):
        y = self.features(x)
        return self.logits(y), y


class LogitsAndSoftmax(_Base):  # output 0's int8 codes feed the softmax kernel computing output 1
    def forward(self, x):
        z = self.logits(self.features(x))
        return z, F.softmax(z, 1)


class LogitsAndLogSoftmax(_Base):  # no kernel: a scalar pass reads output 0 back from its slot
    def forward(self, x):
        z = self.logits(self.features(x))
        return z, F.log_softmax(z, 1)


class Twice(_Base):  # one tensor in two slots
    def forward(self, x):
        z = self.logits(self.features(x))
        return z, z


class PooledAndInput(_Base):  # the pooled features, and the model input itself
    def forward(self, x):
        p = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.fc(p.flatten(1)), p.flatten(1), x


class TupleOfOne(_Base):
    def forward(self, x):
        return (self.logits(self.features(x)),)


NETS = {"features": LogitsAndFeatures, "softmax": LogitsAndSoftmax, "log_softmax": LogitsAndLogSoftmax, "twice": Twice, "pooled_input": PooledAndInput}


_flows = {}


def _flow(name):
    if name not in _flows:
        torch.manual_seed(0)
        _flows[name] = quantize(NETS[name](), torch.randn(*SHAPE), dtype="int8")
    return _flows[name]


def _qdq_outputs(flow, x) -> list[np.ndarray]:
    with torch.no_grad():
        per_image = [flow.qdq(torch.from_numpy(x[i:i + 1])) for i in range(len(x))]
    return [np.concatenate([o[k].numpy() for o in per_image]) for k in range(len(per_image[0]))]


_builds = {}


@pytest.fixture
def build(tmp_path_factory):
    """``build(name, mmalib)``: (codegen folder, inputs, host outputs) of a net, compiled,
    built and proven bit-exact on the whole packed buffer once per module."""
    def get(name, mmalib):
        if (name, mmalib) not in _builds:
            out, x = tmp_path_factory.mktemp(f"{name}_{mmalib}"), inputs(SHAPE)
            _, c = compile_and_compare(_flow(name).mod, "multi", out, x, mmalib=mmalib)
            _builds[name, mmalib] = out, x, c
        return _builds[name, mmalib]
    return get


@pytest.mark.parametrize("name, mmalib", [("features", True), ("features", False), ("softmax", True),
                                          ("softmax", False), ("log_softmax", True), ("twice", True), ("pooled_input", False)])
def test_every_output_is_bit_exact_and_in_its_slot(name, mmalib, build):
    out, x, c = build(name, mmalib)
    flow = _flow(name)
    want = _qdq_outputs(flow, x)
    got = model_info(out).split(c)
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want):  # within 2 int8 steps; a swapped or shifted output would be far off
        np.testing.assert_allclose(g, w, rtol=0, atol=2.5 * np.abs(w).max() / 127)
    ref = Program(out).run_outputs(x[:1])
    assert [r.shape for r in ref] == [(1, *w.shape[1:]) for w in want]


def test_header_gives_count_offsets_and_shapes(build, tmp_path):
    out = build("features", True)[0]
    h = (out / "model.h").read_text()
    macros = dict(re.findall(r"#define (MULTI_OUTPUT\w*) (\{[^}]*\}|\d+)", h))
    assert macros == {"MULTI_OUTPUT_COUNT": "2", "MULTI_OUTPUT_SIZE": "2058",
                      "MULTI_OUTPUT0_NDIM": "2", "MULTI_OUTPUT0_SHAPE": "{1, 10}", "MULTI_OUTPUT0_SIZE": "10",
                      "MULTI_OUTPUT0_OFFSET": "0", "MULTI_OUTPUT1_NDIM": "4", "MULTI_OUTPUT1_SHAPE": "{1, 8, 16, 16}",
                      "MULTI_OUTPUT1_SIZE": "2048", "MULTI_OUTPUT1_OFFSET": "10"}
    info = model_info(out)
    assert info.output_shape == (1, 2058) and info.output_shapes == ((1, 10), (1, 8, 16, 16))
    strict_compile(out, tmp_path)  # the new text is C99 clean too


def _plan(name, mmalib=True):
    return plan_main(lower_module(_flow(name).mod, mmalib=mmalib).mod)


def test_an_output_read_by_a_later_kernel_is_read_from_its_slot():
    plan = _plan("log_softmax")
    logits, probs = plan.outputs
    assert plan.output_offsets == [0, 10] and not plan.copies()
    assert (logits.home, logits.offset, probs.home, probs.offset) == ("output", 0, "output", 10)
    readers = [name for name, args in plan.calls if logits in args[:-1]]
    assert readers and "log_softmax" in readers[-1]


def test_a_tensor_returned_twice_is_copied_into_the_second_slot(build):
    plan = _plan("twice")
    assert plan.outputs[0] is plan.outputs[1]
    assert [(i, t.name) for i, t in plan.copies()] == [(1, plan.outputs[0].name)]
    assert io_names(plan)[plan.outputs[0].name] == "output0"
    out = build("twice", True)[0]
    assert f"memcpy(output + 10, multi_{plan.outputs[0].name}.data, sizeof(float) * 10u);" in \
        (out / "model.c").read_text()


def test_the_input_returned_is_copied():
    plan = _plan("pooled_input")
    assert plan.output_offsets == [0, 10, 18]
    assert [(i, t.home) for i, t in plan.copies()] == [(2, "input")]
    assert [t.offset for t in plan.outputs[:2]] == [0, 10]


def test_views_of_an_output_move_with_it_and_a_view_returned_places_its_root():
    # FuseOps folds the reshapes of these small nets into their kernels, so the
    # views are put in by hand: a [1, 10] read through a_view, b [1, 6] through b_view.
    planner = _Planner(None)
    planner.plan = Plan(input=None, output=None, arena_bytes=0)
    a, b = (planner.tensor(relax.TensorType(s, "float32"), "output", 0) for s in ([1, 10], [1, 6]))
    a_view = planner.tensor(relax.TensorType([1, 2, 5], "float32"), "output", 0, view=True)
    b_view = planner.tensor(relax.TensorType([1, 2, 3], "float32"), "output", 0, view=True)
    planner.plan.views.update({a_view.name: a.name, b_view.name: b.name})
    planner.plan.outputs = [b_view, a]  # a view returned first, then a tensor that has a view
    planner.place_outputs()
    assert planner.plan.output_offsets == [0, 6]
    assert [t.offset for t in (a, a_view, b, b_view)] == [6, 6, 0, 0]
    assert not planner.plan.copies()


def test_a_tuple_of_one_stays_a_single_output(tmp_path):
    torch.manual_seed(0)
    flow = quantize(TupleOfOne(), torch.randn(*SHAPE), dtype="int8")
    compile_and_compare(flow.mod, "one", tmp_path, inputs(SHAPE), mmalib=True)
    h = (tmp_path / "model.h").read_text()
    assert "#define ONE_OUTPUT_SHAPE {1, 10}" in h and "OUTPUT_COUNT" not in h and "OUTPUT0" not in h
    assert "output + " not in (tmp_path / "model.c").read_text()


def test_split_outputs_checks_the_sizes():
    packed = np.arange(2 * 14, dtype=np.float32).reshape(2, 14)
    a, b = split_outputs(packed, [(1, 10), (1, 2, 2)])
    assert a.shape == (2, 10) and b.shape == (2, 2, 2) and b[1, 0, 0] == 24
    with pytest.raises(ValueError, match="do not hold outputs"):
        split_outputs(packed, [(1, 10)])
