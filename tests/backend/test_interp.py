"""The Python reference executor: no FMA in its LLVM build, offload calls decoded
from the PrimFunc bodies, and results within 1 LSB of the torch Q/DQ model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import tvm

from qflow import ConvReluPool, InvertedResidual, ResidualBlock, quantize, randomize_bn

from pipeline.errors import StaleArtifactError
from pipeline.backend.compile import compile_model
from pipeline.backend.interp import Program, _contracts, llvm_target, run_reference
from pipeline.backend.kernels.hostlib import kernel_signatures

NETS = {"crp": (ConvReluPool, (1, 3, 16, 16)), "res": (ResidualBlock, (1, 32, 8, 8)),
        "inv": (lambda: InvertedResidual(stride=2, cout=48), (1, 32, 8, 8))}


def _host_has_fma() -> bool:
    try:
        return " fma " in f" {Path('/proc/cpuinfo').read_text()} ".replace("\n", " ")
    except OSError:
        return False


def test_llvm_target_does_not_contract_multiply_add():
    assert not _contracts(llvm_target())


@pytest.mark.skipif(not _host_has_fma(), reason="the host CPU has no FMA: cannot run the contracting build")
def test_fma_probe_detects_contraction():
    """The probe is sensitive: an FMA-capable mcpu does contract (measured)."""
    assert _contracts(tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"}))


def _flow(net: str, **kw):
    make, shape = NETS[net]
    torch.manual_seed(0)
    return quantize(randomize_bn(make()), torch.randn(*shape), **kw), shape


def _torch_outputs(flow, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return np.concatenate([flow.qdq(torch.from_numpy(x[i:i + 1])).numpy() for i in range(len(x))])


def _output_scale(flow) -> float:
    return [n.args[1] for n in flow.ep.graph.nodes if "dequantize_per_tensor" in str(n.target)][-1]


def lsb_diff(a: np.ndarray, b: np.ndarray, scale: float) -> np.ndarray:
    """|a - b| in output quanta: both are dequantized values (q - zp) * scale,
    so rint(v / scale) recovers q - zp exactly."""
    return np.abs(np.rint(a.astype(np.float64) / scale) - np.rint(b.astype(np.float64) / scale))


@pytest.mark.parametrize("dtype", ["int8", "int16"])
@pytest.mark.parametrize("net", sorted(NETS))
def test_reference_within_one_lsb_of_torch(net, dtype, tmp_path):
    """Scalar path (mmalib off): every output element within 1 LSB of torch's Q/DQ model."""
    flow, shape = _flow(net, dtype=dtype)
    compile_model(flow.mod, net, tmp_path, mmalib=False)
    x = np.random.default_rng(4).standard_normal((3, *shape[1:])).astype(np.float32)
    ours = run_reference(tmp_path, x)
    ref = _torch_outputs(flow, x)
    assert ours.shape == ref.shape and ours.dtype == np.float32
    lsb = lsb_diff(ours, ref, _output_scale(flow))
    assert lsb.max() <= 1, lsb.max()


def test_offload_calls_are_decoded_from_the_primfunc(tmp_path):
    flow, shape = _flow("crp", dtype="int8")
    compile_model(flow.mod, "crp", tmp_path, mmalib=True)
    prog = Program(tmp_path)
    assert prog.externs, "no offload PrimFunc in an MMALIB build"
    sigs = kernel_signatures()
    for name, ext in prog.externs.items():
        params = sigs[ext.kernel]
        assert len(ext.args) == len(params), name
        for (kind, _), p in zip(ext.args, params):
            assert (kind == "buf") == p.pointer, (name, p.name)
        func = prog.mod[name]
        buffers = [v for kind, v in ext.args if kind == "buf"]
        assert buffers == list(range(len(func.params)))  # contract: params in call order, output last


def test_unparsable_lowered_module_is_a_clear_error(tmp_path):
    (tmp_path / "lowered.py").write_text("this is not TVMScript\n")
    with pytest.raises(StaleArtifactError, match="lowered.py: not a TVMScript module doit-c7x wrote"):
        Program(tmp_path)  # refused by the guard before TVM's parser sees it


@pytest.mark.parametrize("mmalib", [True, False], ids=["mmalib", "scalar"])
def test_module_remembered_by_codegen_equals_the_parsed_lowered_py(tmp_path, mmalib):
    """codegen's printed module is reused by a Program of the same process (no
    TVMScript parse, no second LLVM build): it must be the module lowered.py
    parses to, and run to the same bits. A changed lowered.py is parsed afresh."""
    from pipeline.backend import interp

    flow, shape = _flow("inv", dtype="int8")
    compile_model(flow.mod, "inv", tmp_path, mmalib=mmalib)
    text = (tmp_path / "lowered.py").read_text()
    remembered = Program(tmp_path)
    assert remembered.mod.same_as(interp._compiled(tmp_path / "lowered.py").mod)
    parsed = tvm.script.from_source(text)
    tvm.ir.assert_structural_equal(remembered.mod, parsed)
    interp._COMPILED.clear()
    fresh = Program(tmp_path)
    assert not fresh.mod.same_as(remembered.mod)
    x = np.random.default_rng(5).standard_normal((2, *shape[1:])).astype(np.float32)
    for i in range(2):
        np.testing.assert_array_equal(remembered.run(x[i:i + 1]), fresh.run(x[i:i + 1]))
    (tmp_path / "lowered.py").write_text(text + "# edited\n")
    assert not Program(tmp_path).mod.same_as(fresh.mod)


def test_scalar_primfunc_arguments_are_checked_without_the_llvm_asserts(tmp_path):
    """The reference's LLVM build drops the packed API's asserts; Program checks
    each argument's count, shape and dtype itself, naming the PrimFunc."""
    flow, _ = _flow("crp")
    compile_model(flow.mod, "crp", tmp_path, mmalib=False)
    prog = Program(tmp_path)
    func, types = next(iter(prog.params.items()))
    assert None not in types, "every parameter of a legalized op is a static buffer"
    (shape, dtype), *_ = types
    from pipeline.backend.interp import _aligned_zeros
    good = [_aligned_zeros(s, d) for s, d in types]
    prog._call(func, good)  # the right arrays run
    other = "float64" if dtype != "float64" else "float32"
    for args in ([_aligned_zeros((*shape, 2), dtype), *good[1:]], [_aligned_zeros(shape, other), *good[1:]],
                 good[:-1]):
        with pytest.raises(ValueError, match=f"{func}: "):
            prog._call(func, args)
