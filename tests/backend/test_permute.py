"""Integer transposes on the C7x: the c7x_permute kernels (C == numpy twin == np.transpose),
their checks, the pass that takes what the Q/DQ cleanups leave, and the reshape cleanups."""

from __future__ import annotations

import itertools
import shutil

import numpy as np
import pytest
from tvm import relax

from pipeline.backend.kernels import hostlib
from pipeline.backend.kernels import reference as ref
from pipeline.backend.passes.log import OffloadLog
from pipeline.backend.passes.permute import offload_permute, padded_permutation
from pipeline.backend.refusal import Declined

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the host kernels")


@needs_gcc
@pytest.mark.parametrize("dtype", [np.int8, np.int16])
@pytest.mark.parametrize("shape,axes", [((2, 3, 4), (2, 0, 1)), ((1, 2, 5, 8), (2, 0, 1, 3)),
                                        ((2, 4, 2, 4, 3), (0, 1, 3, 2, 4)), ((7, 5), (1, 0)),
                                        ((2, 1, 3, 1, 2, 2), (5, 4, 3, 2, 1, 0))])
def test_c_equals_python_equals_numpy(shape, axes, dtype):
    rng = np.random.default_rng(len(shape))
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max + 1, shape, dtype=dtype)
    dims, perm = padded_permutation(shape, list(axes))
    expect = np.transpose(x, axes)
    name = "c7x_permute_i8" if dtype == np.int8 else "c7x_permute_i16"
    out_c, out_py = np.zeros(expect.shape, dtype), np.zeros(expect.shape, dtype)
    assert hostlib.call_kernel(name, x, out_c, *dims, *perm) == ref.C7X_OK
    assert getattr(ref, name)(x, out_py, *dims, *perm) == ref.C7X_OK
    np.testing.assert_array_equal(out_c, expect)
    np.testing.assert_array_equal(out_py, expect)


@needs_gcc
@pytest.mark.parametrize("perm,status", [((0, 1, 2, 3, 4, 4), ref.C7X_ERR_PARAM), ((0, 1, 2, 3, 4, 6), ref.C7X_ERR_PARAM),
                                         ((0, 1, 2, 3, 5, -1), ref.C7X_ERR_PARAM)])
def test_a_non_permutation_is_refused_and_nothing_is_written(perm, status):
    x = np.arange(6, dtype=np.int8)
    dims = (1, 1, 1, 1, 2, 3)
    for call in (lambda o: hostlib.call_kernel("c7x_permute_i8", x, o, *dims, *perm),
                 lambda o: ref.c7x_permute_i8(x, o, *dims, *perm)):
        out = np.full(6, 9, np.int8)
        assert call(out) == status
        assert (out == 9).all()


def test_padded_permutation():
    assert padded_permutation((2, 3), [1, 0]) == ([1, 1, 1, 1, 2, 3], [0, 1, 2, 3, 5, 4])
    with pytest.raises(Declined, match="at most 6"):
        padded_permutation((1,) * 7, list(range(7)))


def _module(dtype: str, shape, axes):
    from tvm import IRModule
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(list(shape), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.permute_dims(x, axes))
        bb.emit_func_output(y)
    mod = bb.get()
    assert isinstance(mod, IRModule)
    return mod


@pytest.mark.parametrize("dtype,kernel", [("int8", "c7x_permute_i8"), ("int16", "c7x_permute_i16")])
def test_pass_offloads_an_integer_transpose_and_leaves_a_float_one(dtype, kernel):
    log = OffloadLog()
    offload_permute(_module(dtype, (2, 3, 4), [2, 0, 1]), log)
    assert [(d.op, d.status, d.kernel) for d in log.decisions] == [("permute", "offloaded", kernel)]
    log = OffloadLog()
    offload_permute(_module("float32", (2, 3, 4), [2, 0, 1]), log)
    assert log.decisions == []


def test_every_permutation_of_four_axes_round_trips():
    x = np.arange(2 * 3 * 4 * 5, dtype=np.int8).reshape(2, 3, 4, 5)
    for axes in itertools.permutations(range(4)):
        dims, perm = padded_permutation(x.shape, list(axes))
        out = np.zeros(np.transpose(x, axes).shape, np.int8)
        assert ref.c7x_permute_i8(x, out, *dims, *perm) == ref.C7X_OK
        np.testing.assert_array_equal(out, np.transpose(x, axes))


def test_a_reshape_of_a_reshape_is_one_view():
    from pipeline.backend.passes.cleanup import collapse_reshapes
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2, 3, 4], "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.reshape(x, [6, 4]))
            b = bb.emit_output(relax.op.reshape(a, [24]))
        bb.emit_func_output(b)
    log = OffloadLog()
    mod = relax.transform.DeadCodeElimination()(collapse_reshapes(bb.get(), log))
    calls = [bd.value for blk in mod["main"].body.blocks for bd in blk.bindings]
    assert len(calls) == 1 and calls[0].args[0].same_as(mod["main"].params[0])
    assert [d.op for d in log.decisions] == ["reshape"]
