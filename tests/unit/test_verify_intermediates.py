"""verify's intermediate-tensor compare: the host build's kernel-call dump (ld --wrap
around every kernel call, C7X_DUMP) against the Python reference's record of every
call, on real compiled nets; a tampered tensor is reported as the first differing
call and its layer."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
import torch

from qflow import InvertedResidual, ResidualBlock, quantize, randomize_bn

from pipeline.backend.compile import compile_model
from pipeline.backend.host import CFLAGS, build_host, kernel_symbols, read_dump, start_host
from pipeline.backend.interp import Program
from pipeline.stages import verify

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")

NETS = {"res": (ResidualBlock, (1, 32, 8, 8)), "inv": (lambda: InvertedResidual(stride=2, cout=48), (1, 32, 8, 8))}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """(net, mmalib) -> (codegen dir, host exe, the same sources built without the wrappers, input shape)."""
    cache = {}

    def get(net, mmalib):
        if (net, mmalib) not in cache:
            make, shape = NETS[net]
            torch.manual_seed(0)
            flow = quantize(randomize_bn(make()), torch.randn(*shape), dtype="int8")
            out = tmp_path_factory.mktemp(f"{net}_{int(mmalib)}")
            compile_model(flow.mod, net, out, mmalib=mmalib)
            build_host(out, out / "model.exe")
            _build_unwrapped(out, out / "plain.exe")
            cache[(net, mmalib)] = (out, out / "model.exe", out / "plain.exe", shape)
        return cache[(net, mmalib)]
    return get


def _build_unwrapped(out, exe):
    """The host build's gcc command without the dump flags (host.dump_flags)."""
    from pipeline.backend.host import dump_flags, host_command

    drop = set(dump_flags(out))
    cmd = [a for a in host_command(out, exe) if a not in drop]
    assert len(cmd) < len(host_command(out, exe)) and set(CFLAGS) <= set(cmd)
    subprocess.run(cmd, check=True)


def _images(shape, n):
    return (np.random.default_rng(3).standard_normal((n, *shape[1:])) * 1.5).astype(np.float32)


def _dump(exe, out, x, tmp_path, images=1):
    path = tmp_path / "calls.dump"
    run = start_host(exe, out, x, env={"C7X_DUMP": str(path), "C7X_DUMP_IMAGES": str(images)}).wait()
    return run.outputs, read_dump(path)


@pytest.mark.parametrize("net,mmalib", [("res", True), ("res", False), ("inv", True)])
def test_every_kernel_call_of_the_host_equals_the_reference(compiled, net, mmalib, tmp_path):
    out, dump_exe, exe, shape = compiled(net, mmalib)
    x = _images(shape, 3)
    host_out, dump = _dump(dump_exe, out, x, tmp_path)
    # the wrapped build computes what the same C without wrappers computes
    plain = start_host(exe, out, x).wait().outputs
    np.testing.assert_array_equal(host_out.view(np.uint32), plain.view(np.uint32))
    ref_out, ref_calls = Program(out).run_recording(x[:1])
    np.testing.assert_array_equal(ref_out.view(np.uint32), host_out[:1].view(np.uint32))
    calls = json.loads((out / "manifest.json").read_text())["calls"]
    assert len(dump) == len(ref_calls) == len(calls) > 1       # image 1 only: one record per call
    assert {s for s, _ in dump} <= set(kernel_symbols(out))
    r = verify.compare_intermediates(ref_calls, dump, calls)
    assert r == {"images": 1, "tensors": len(calls), "host_tensors": len(calls), "equal": len(calls),
                 "all_equal": True}


def test_two_dumped_images_give_two_records_per_call(compiled, tmp_path):
    out, dump_exe, _, shape = compiled("res", True)
    x = _images(shape, 3)
    _, dump = _dump(dump_exe, out, x, tmp_path, images=2)
    prog = Program(out)
    ref_calls = prog.run_recording(x[:1])[1] + prog.run_recording(x[1:2])[1]
    calls = json.loads((out / "manifest.json").read_text())["calls"]
    r = verify.compare_intermediates(ref_calls, dump, calls, images=2)
    assert r["all_equal"] and r["tensors"] == 2 * len(calls)


def test_a_wrong_intermediate_tensor_names_its_call_and_layer(compiled, tmp_path):
    out, dump_exe, _, shape = compiled("res", True)
    x = _images(shape, 1)
    _, dump = _dump(dump_exe, out, x, tmp_path)
    _, ref_calls = Program(out).run_recording(x)
    calls = json.loads((out / "manifest.json").read_text())["calls"]
    k = next(i for i, c in enumerate(calls) if c["layer"] is not None)  # a layer's call, not the input quantize
    symbol, raw = dump[k]
    wrong = bytearray(raw)
    wrong[0] ^= 1
    dump[k] = (symbol, bytes(wrong))
    r = verify.compare_intermediates(ref_calls, dump, calls)
    assert not r["all_equal"] and r["equal"] == k
    d = r["first_difference"]
    assert (d["image"], d["call"], d["func"], d["layer"]) == (0, k, calls[k]["func"], calls[k]["layer"])
    assert d["elements_off"] == 1 and d["host_symbol"] == symbol
    # verify's failure names that call and layer
    result = verify.verify_variant("mmalib", np.zeros((1, 10), np.float32), np.zeros((1, 10), np.float32), r,
                                   np.zeros((1, 10), np.float32), np.zeros((1, 10), np.float32), [None], 0.1)
    result.pop("_outputs")
    spec = type("Spec", (), {"name": "res"})()
    with pytest.raises(verify.VerificationError, match=rf"call {k} \({calls[k]['func']}, layer "
                                                       rf"{calls[k]['layer']}\) on image 0"):
        verify._raise_if_inexact(spec, [result], 1, tmp_path / "verify.json")


def test_a_missing_call_is_a_difference(compiled, tmp_path):
    out, dump_exe, _, shape = compiled("res", False)
    x = _images(shape, 1)
    _, dump = _dump(dump_exe, out, x, tmp_path)
    _, ref_calls = Program(out).run_recording(x)
    calls = json.loads((out / "manifest.json").read_text())["calls"]
    r = verify.compare_intermediates(ref_calls, dump[:-1], calls)
    assert not r["all_equal"] and r["first_difference"]["call"] == len(calls) - 1


def test_without_c7x_dump_the_host_build_writes_nothing(compiled, tmp_path, monkeypatch):
    out, dump_exe, _, shape = compiled("res", True)
    monkeypatch.chdir(tmp_path)
    start_host(dump_exe, out, _images(shape, 1)).wait()
    assert not list(tmp_path.iterdir())


def test_a_truncated_dump_is_an_error(compiled, tmp_path):
    out, dump_exe, _, shape = compiled("res", True)
    _dump(dump_exe, out, _images(shape, 1), tmp_path)
    path = tmp_path / "calls.dump"
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(ValueError, match="truncated dump record"):
        read_dump(path)


def test_a_conv_fused_into_the_next_call_is_skipped_and_later_calls_keep_their_index(tmp_path):
    """With 60 KB of L2 the block's 73 KB expansion is computed tile by tile inside the
    depthwise call (levels.fusable): the C dumps no tensor for the conv, the reference
    does; the compare skips it, and a difference after it still names its own call."""
    from pipeline.backend.levels import Budget
    torch.manual_seed(1)
    shape = (1, 32, 24, 24)
    flow = quantize(randomize_bn(InvertedResidual(stride=1, cout=32)), torch.randn(*shape), dtype="int8")
    out = tmp_path / "fused"
    compile_model(flow.mod, "inv", out, mmalib=True, budget=Budget(60_000, 0))
    build_host(out, out / "model.exe")
    x = _images(shape, 1)
    _, dump = _dump(out / "model.exe", out, x, tmp_path)
    _, ref_calls = Program(out).run_recording(x)
    calls = json.loads((out / "manifest.json").read_text())["calls"]
    fused = [c["index"] for c in calls if "computed_in" in c]
    assert len(fused) == 1 and len(dump) == len(ref_calls) - 1 == len(calls) - 1
    r = verify.compare_intermediates(ref_calls, dump, calls)
    assert r["all_equal"] and r["tensors"] == r["host_tensors"] == len(calls) - 1
    k = fused[0] + 2  # the call after the fused one, one record earlier in the dump
    symbol, raw = dump[k - 1]
    dump[k - 1] = (symbol, bytes([raw[0] ^ 1]) + raw[1:])
    d = verify.compare_intermediates(ref_calls, dump, calls)["first_difference"]
    assert (d["call"], d["func"]) == (k, calls[k]["func"])


def test_a_feature_map_output_is_summarised_by_cosine_without_a_top1():
    """An embedding that is a feature map ([N, 256, 64, 64], LiteMedSAM's) has no decision:
    verify scores it by cosine and says so in one line, instead of failing on 'top1_agreement'."""
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(2, 4, 3, 3)).astype(np.float32)
    host = np.round(ref * 10) / 10
    inter = {"all_equal": True, "equal": 5, "tensors": 5, "images": 1}
    r = verify.verify_variant("mmalib", host, host, inter, host, ref, [None, None], 0.1)
    assert "top1_agreement_with_float" not in r["accuracy"] and r["accuracy"]["cosine_min"] > 0.99
    line = verify.summary_line(r, {"max_lsb": 0.0, "mean_lsb": 0.0})
    assert line.startswith("[mmalib] C == Python integer reference on 2/2 images") and "cosine mean 0.99" in line
    assert "top-1" not in line
