"""relax_import's module file: save_irmodule / load_irmodule round trips."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from pipeline.errors import StaleArtifactError
from pipeline.frontend.irmodule_io import load_irmodule, save_irmodule


def _where_minus_inf() -> tvm.IRModule:
    """main(x) = where(x == -inf, 0, x): what torch's safe softmax (ViT) imports to."""
    x = relax.Var("x", relax.TensorType([2, 3], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            mask = bb.emit(relax.op.equal(x, relax.const(-np.inf, "float32")))
            y = bb.emit_output(relax.op.where(mask, relax.const(0.0, "float32"), x))
        bb.emit_func_output(y)
    return bb.get()


def test_non_finite_scalar_constant_round_trips(tmp_path):
    """TVMScript prints R.const("-inf") and cannot parse it: it must travel as a parameter."""
    script, params = tmp_path / "module.py", tmp_path / "params.bin"
    save_irmodule(_where_minus_inf(), {}, script, params)
    assert "-inf" not in script.read_text()
    mod = load_irmodule(script, params)
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    x = np.array([[-np.inf, 1, 2], [3, -np.inf, -5]], np.float32)
    np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), np.where(np.isinf(x), 0, x))


def test_unparsable_module_is_one_line(tmp_path):
    script, params = tmp_path / "module.py", tmp_path / "params.bin"
    save_irmodule(_where_minus_inf(), {}, script, params)
    script.write_text(script.read_text().replace("R.where", "R.no_such_op"))
    with pytest.raises(StaleArtifactError, match=r"module\.py: cannot parse the imported module .*relax_import") as e:
        load_irmodule(script, params)
    assert "\n" not in str(e.value)
