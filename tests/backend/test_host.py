"""Host build (gcc) of the generated C: bit-exact with the Python reference
(which has no memory plan, so this proves TVM's arena plan), within 1 LSB of
torch on the scalar path, and the error paths of the entry point."""

from __future__ import annotations

import shutil
import time

import numpy as np
import pytest
import torch

from qflow import ConvReluPool, InvertedResidual, ResidualBlock, quantize, randomize_bn

from pipeline.backend.compile import compile_model
from pipeline.backend.host import build_host, run_host, run_host_timed
from pipeline.backend.interp import run_reference
from pipeline.backend.lower import lower_module
from pipeline.backend.memory_plan import plan_main
from pipeline.errors import ToolchainError

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")

NETS = {"crp": (ConvReluPool, (1, 3, 16, 16)), "res": (ResidualBlock, (1, 32, 8, 8)),
        "inv": (lambda: InvertedResidual(stride=2, cout=48), (1, 32, 8, 8))}
# (net, quantizer kwargs): int8, int16 activations with int8 and with int16 weights,
# int8 affine (nonzero zero points).
QUANT = {"i8": {"dtype": "int8"}, "i16": {"dtype": "int16"},
         "i16w16": {"dtype": "int16", "weight_dtype": "int16"},
         "i8asym": {"dtype": "int8", "symmetric_activations": False}}


@pytest.fixture(scope="module")
def flows():
    cache = {}

    def get(net, quant):
        if (net, quant) not in cache:
            make, shape = NETS[net]
            torch.manual_seed(0)
            cache[(net, quant)] = (quantize(randomize_bn(make()), torch.randn(*shape), **QUANT[quant]), shape)
        return cache[(net, quant)]
    return get


@pytest.fixture(scope="module")
def built(flows, tmp_path_factory):
    """(net, quant, mmalib) -> (flow, input shape, codegen dir, exe)."""
    cache = {}

    def get(net, quant, mmalib):
        key = (net, quant, mmalib)
        if key not in cache:
            flow, shape = flows(net, quant)
            out = tmp_path_factory.mktemp(f"{net}_{quant}_{int(mmalib)}")
            compile_model(flow.mod, net, out, mmalib=mmalib)
            build_host(out, out / "model.exe")
            cache[key] = (flow, shape, out, out / "model.exe")
        return cache[key]
    return get


def _inputs(shape, n=3, seed=5):
    return (np.random.default_rng(seed).standard_normal((n, *shape[1:])) * 1.5).astype(np.float32)


def _lsb(a, b, flow):
    scale = [n.args[1] for n in flow.ep.graph.nodes if "dequantize_per_tensor" in str(n.target)][-1]
    return np.abs(np.rint(a.astype(np.float64) / scale) - np.rint(b.astype(np.float64) / scale))


CASES = [(n, q, m) for n in sorted(NETS) for q in ("i8", "i16") for m in (False, True)]
CASES += [("inv", "i16w16", False), ("res", "i8asym", False), ("res", "i8asym", True)]


@pytest.mark.parametrize("net,quant,mmalib", CASES)
def test_c_equals_reference_bit_for_bit(built, net, quant, mmalib):
    flow, shape, out, exe = built(net, quant, mmalib)
    x = _inputs(shape)
    c = run_host(exe, out, x)
    ref = run_reference(out, x)
    assert c.shape == ref.shape
    np.testing.assert_array_equal(c.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("net,quant", [(n, q) for n in sorted(NETS) for q in ("i8", "i16", "i16w16", "i8asym")])
def test_scalar_c_within_one_lsb_of_torch(built, net, quant):
    flow, shape, out, exe = built(net, quant, False)
    x = _inputs(shape, n=4, seed=6)
    c = run_host(exe, out, x)
    with torch.no_grad():
        ref = np.concatenate([flow.qdq(torch.from_numpy(x[i:i + 1])).numpy() for i in range(len(x))])
    assert _lsb(c, ref, flow).max() <= 1


def test_arena_is_reused(flows):
    """Precondition of the bit-exactness proof: the plan does overlap tensors."""
    flow, _ = flows("res", "i8")
    plan = plan_main(lower_module(flow.mod, mmalib=False).mod)
    arena = [t for t in plan.tensors if t.home == "arena" and not t.view]
    assert len({t.offset for t in arena}) < len(arena)


@pytest.mark.skipif(shutil.which("nm") is None, reason="binutils nm is not installed")
def test_executable_needs_only_libc_and_libm(built):
    """The reference kernels are linked in, so only C library symbols stay undefined."""
    import subprocess

    _, _, _, exe = built("res", "i8", True)
    listing = subprocess.run(["nm", "-u", str(exe)], capture_output=True, text=True).stdout
    strong = {ln.split()[-1] for ln in listing.splitlines() if ln.split()[0] == "U"}
    assert strong and all("@GLIBC_" in sym for sym in strong), strong


def test_workspace_overflow_is_an_error_not_a_crash(built, tmp_path):
    flow, shape, out, exe = built("crp", "i8", False)
    assert "#define CRP_WORKSPACE_BYTES 64u" not in (out / "model.h").read_text()
    small = tmp_path / "small.exe"
    build_host(out, small, extra_flags=("-DCRP_WORKSPACE_LIMIT=64",))
    with pytest.raises(ToolchainError, match=r"run failed on image 0 \(-4\)"):
        run_host(small, out, _inputs(shape, n=1))


def test_corrupt_or_foreign_weights_are_rejected(built, tmp_path):
    _, shape, out, exe = built("crp", "i8", False)
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    blob = bytearray((bad / "weights.bin").read_bytes())
    blob[-70] ^= 0x40
    (bad / "weights.bin").write_bytes(bytes(blob))
    with pytest.raises(ToolchainError, match=r"weights check failed \(-2\)"):
        run_host(exe, bad, _inputs(shape, n=1))
    _, _, other, _ = built("crp", "i16", False)
    shutil.copy(other / "weights.bin", bad / "weights.bin")
    with pytest.raises(ToolchainError, match=r"weights check failed \(-2\)"):
        run_host(exe, bad, _inputs(shape, n=1))


def test_c_array_weights_give_the_same_outputs(flows, built, tmp_path):
    flow, shape, out, exe = built("inv", "i8", True)
    compile_model(flow.mod, "inv", tmp_path, mmalib=True, weights_format="c_array")
    build_host(tmp_path, tmp_path / "arr.exe")
    x = _inputs(shape)
    np.testing.assert_array_equal(run_host(tmp_path / "arr.exe", tmp_path, x), run_host(exe, out, x))


def test_missing_or_failing_gcc_is_a_toolchain_error(built, tmp_path, monkeypatch):
    _, _, out, _ = built("crp", "i8", False)
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    (broken / "model.c").write_text((broken / "model.c").read_text() + "\nthis is not C;\n")
    with pytest.raises(ToolchainError, match="gcc failed") as err:
        build_host(broken, tmp_path / "x.exe")
    assert "\n" not in str(err.value)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ToolchainError, match="gcc not found"):
        build_host(out, tmp_path / "y.exe")


@pytest.mark.slow
def test_mobilenet_v2_scalar_end_to_end(tmp_path):
    """torchvision MobileNetV2 (random weights + BN stats, 3 random calibration
    images), mmalib off: C == reference bit for bit, within 1 LSB of torch."""
    import torchvision

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    calib = [torch.randn(1, 3, 224, 224, generator=gen) for _ in range(3)]
    model = randomize_bn(torchvision.models.mobilenet_v2())
    flow = quantize(model, calib[0], calib=calib, dtype="int8")
    t0 = time.perf_counter()
    summary = compile_model(flow.mod, "mobilenet_v2", tmp_path, mmalib=False)
    compile_s = time.perf_counter() - t0
    build_host(tmp_path, tmp_path / "mbv2.exe")
    x = torch.randn(2, 3, 224, 224, generator=gen).numpy()
    run = run_host_timed(tmp_path / "mbv2.exe", tmp_path, x)
    ref = run_reference(tmp_path, x)
    np.testing.assert_array_equal(run.outputs.view(np.uint32), ref.view(np.uint32))
    with torch.no_grad():
        torch_out = np.concatenate([flow.qdq(torch.from_numpy(x[i:i + 1])).numpy() for i in range(2)])
    lsb = _lsb(run.outputs, torch_out, flow)
    assert lsb.max() <= 1
    print(f"\nMobileNetV2 scalar: compile {compile_s:.1f} s, host {run.ms_per_image:.0f} ms/image, "
          f"max {lsb.max():.0f} LSB ({int((lsb > 0).sum())}/{lsb.size} elements off), "
          f"arena {summary['arena_bytes']} B, workspace {summary['workspace_bytes']} B, "
          f"weights {summary['weights_bytes']} B")


def test_an_executable_built_for_another_cpu_says_to_rebuild(built, tmp_path):
    """SIGILL (an instruction this CPU lacks, gcc -march=native elsewhere) names host_build.
    Simulated with a stand-in that dies of SIGILL as such a binary would."""
    _, shape, out, _ = built("crp", "i8", False)
    foreign = tmp_path / "foreign.exe"
    foreign.write_text("#!/bin/sh\nkill -ILL $$\n")
    foreign.chmod(0o755)
    with pytest.raises(ToolchainError, match="built for another CPU .* re-run its host_build task"):
        run_host(foreign, out, _inputs(shape, n=1))


def test_host_build_and_profile_track_the_cpu_they_build_for(tmp_path, monkeypatch):
    """-march=native executables: host_build's and profile's tracked parameters name
    the CPU, so another kind of machine (or a run-cache shared with one) rebuilds them
    (and profile's times are of the CPU they were measured on)."""
    from pipeline import toolchain
    from pipeline.backend.host import CFLAGS
    from pipeline.entries import load_models
    from pipeline.layout import Layout
    from pipeline.stages import registry
    from pipeline.stages.context import StageContext
    assert "-march=native" in CFLAGS
    spec = next(s for s in load_models(registry.PKG.parent / "models") if s.name == "mobilenet_v2")
    ctx = StageContext(spec=spec, layout=Layout(tmp_path, spec.name), root=registry.PKG.parent,
                                calib_root=tmp_path, weights=None)
    for name in ("host_build", "profile"):
        stage = next(s for s in registry.STAGES if s.name == name)
        here = stage.tracked(ctx)["host_cpu"]
        assert here == toolchain.host_cpu() and len(here) == 16
        with monkeypatch.context() as m:
            m.setattr(registry, "host_cpu", lambda: "another-cpu-kind")
            assert stage.tracked(ctx)["host_cpu"] == "another-cpu-kind"


@pytest.mark.parametrize("extra", [(), ("-DCRP_PROFILE_LAYERS",)])
def test_the_cached_kernel_object_gives_the_executable_the_plain_command_gives(built, tmp_path, extra):
    """build_host links the reference kernels compiled once (hostlib.kernel_object) instead of
    compiling them into every executable: the file must be the one host_command's own
    gcc line (the command build.json records for users) makes."""
    import subprocess

    from pipeline.backend.host import host_command, kernel_flags
    _, _, out, _ = built("crp", "i8", True)
    plain = host_command(out, tmp_path / "plain.exe", extra_flags=extra)
    subprocess.run(plain, check=True, capture_output=True)
    build_host(out, tmp_path / "cached.exe", extra_flags=extra)
    assert (tmp_path / "plain.exe").read_bytes() == (tmp_path / "cached.exe").read_bytes()
    flags = kernel_flags(plain)
    assert "-DC7X_ROUNDING=C7X_ROUND_HALF_UP" in flags and "-O3" in flags
    assert not any(f.startswith(("-I", "-Wl,", "-DC7X_MODEL")) or f == str(out) for f in flags)
