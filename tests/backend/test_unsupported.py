"""Graphs the static-C emitter cannot express fail with one UnsupportedOpError
line that names the op (or the interface problem) and says what to do."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import tvm
from tvm import relax, tirx

from qflow import quantize, randomize_bn

from pipeline.backend import tir_c
from pipeline.backend.compile import compile_model
from pipeline.errors import UnsupportedOpError


class _Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3, 1, 1)
        self.fc = nn.Linear(8, 10)

    def features(self, x):
        return F.relu(self.c(x))

    def logits(self, y):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


class TopK(_Head):
    # the smallest k: our static-C topk (passes/topk.py) takes only the largest
    def forward(self, x):
        return torch.topk(self.logits(self.features(x)), 3, largest=False).values


class LogitsAndArgMax(_Head):
    def forward(self, x):
        z = self.logits(self.features(x))
        return z, torch.argmax(z, 1)


class ArgMax(_Head):
    def forward(self, x):
        return torch.argmax(self.logits(self.features(x)), 1)


class AbsNet(_Head):
    def forward(self, x):
        return self.logits(torch.abs(self.c(x)))


def _flow(net):
    torch.manual_seed(0)
    return quantize(randomize_bn(net()), torch.randn(1, 3, 16, 16), dtype="int8")


def _one_line_error(mod, tmp_path, mmalib=False) -> str:
    with pytest.raises(UnsupportedOpError) as err:
        compile_model(mod, "net", tmp_path, mmalib=mmalib)
    text = str(err.value)
    assert "\n" not in text and "Traceback" not in text
    # No chained traceback either (raise ... from None).
    assert err.value.__cause__ is None and (err.value.__context__ is None or err.value.__suppress_context__)
    return text


@pytest.mark.parametrize("mmalib", [False, True])
def test_topk_names_the_op_and_what_to_do(tmp_path, mmalib):
    text = _one_line_error(_flow(TopK).mod, tmp_path, mmalib)
    assert text == ("TVM cannot lower relax.topk to TIR (topk axis=-1 largest=False ret_type=both: only the "
                    "last axis, largest, values and indices): cut the model before it and run it on the host")


def test_a_non_float32_second_output_names_its_index_and_op(tmp_path):
    # two outputs are fine (tests/backend/test_multi_output_codegen.py); an int64 one is not
    text = _one_line_error(_flow(LogitsAndArgMax).mod, tmp_path)
    assert "model output 1 is int64" in text and "relax.argmax" in text and "cut the model before" in text


def test_non_float32_output_names_its_op(tmp_path):
    text = _one_line_error(_flow(ArgMax).mod, tmp_path)
    assert "int64" in text and "relax.argmax" in text and "cut the model before" in text


def _relu_module(shape) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(relax.op.nn.relu(x)))
    return bb.get()


def test_dynamic_shape_is_rejected(tmp_path):
    text = _one_line_error(_relu_module([tirx.Var("n", "int64"), 4]), tmp_path)
    assert "static shape" in text and "fixed input shape" in text


def test_two_inputs_are_rejected(tmp_path):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 4], "float32"))
    y = relax.Var("y", relax.TensorType([1, 4], "float32"))
    with bb.function("main", [x, y]):
        bb.emit_func_output(bb.emit(relax.op.add(x, y)))
    assert "takes 2 inputs" in _one_line_error(bb.get(), tmp_path)


def test_legalization_failure_names_the_op(tmp_path, monkeypatch):
    import pipeline.backend.lower as lower

    def broken(bb, call):
        raise ValueError("no rule for this\nsecond line of a long TVM message")
    monkeypatch.setattr(lower, "LEGALIZE_MAP", {**lower.LEGALIZE_MAP, "relax.nn.relu": broken})
    text = _one_line_error(_relu_module([1, 4]), tmp_path)
    assert "relax.nn.relu" in text and "no rule for this" in text and "second line" not in text


def test_codegen_failure_names_the_kernel(tmp_path, monkeypatch):
    """Without the libm rewrite TVM's C codegen rejects tirx.fabs; the error
    names the fused kernel and the unresolved intrinsic."""
    monkeypatch.setattr(tir_c, "libm_calls", lambda func: func)
    text = _one_line_error(_flow(AbsNet).mod, tmp_path)
    assert "abs" in text and "tirx.fabs" in text and "cut the model before" in text


def test_abs_net_compiles_with_the_rewrite(tmp_path):
    summary = compile_model(_flow(AbsNet).mod, "net", tmp_path, mmalib=False)
    assert summary["calls"] > 0 and "fabsf(" in (tmp_path / "tvm_kernels.c").read_text()
