"""The codegen folder as a product: ASCII C names, no unused arena, headers
copied in (``gcc -I<folder>`` suffices), preprocessing in model.h, kernel
calls per backend in the manifest, all byte-deterministic."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

from c_check import STRICT, compile_and_compare, gcc, inputs, strict_compile
from qflow import ConvReluPool, quantize, randomize_bn

from pipeline.backend.compile import compile_model
from pipeline.backend.emit_c import HEADERS, c_name
from pipeline.backend.host import KERNELS_DIR

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")

IMAGENET = {"resize": 256, "crop": 224, "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}


@pytest.fixture(scope="module")
def crp():
    torch.manual_seed(0)
    return quantize(randomize_bn(ConvReluPool()), torch.randn(1, 3, 16, 16), dtype="int8")


@pytest.fixture(scope="module")
def built(crp, tmp_path_factory):
    """mmalib -> (codegen dir, summary) of ConvReluPool int8, with ImageNet preprocessing."""
    cache = {}

    def get(mmalib):
        if mmalib not in cache:
            out = tmp_path_factory.mktemp(f"crp{int(mmalib)}")
            cache[mmalib] = (out, compile_model(crp.mod, "crp", out, mmalib=mmalib, preprocess=IMAGENET))
        return cache[mmalib]
    return get


def test_c_name_is_ascii():
    assert c_name("café") == "caf_"
    assert c_name("naïve-net.v2") == "na_ve_net_v2"
    assert c_name("9lives") == "m_9lives" and c_name("") == "m_"
    assert c_name("résnet_18") == "r_snet_18"


def _relu_module(n=64) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, n], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(bb.emit(relax.op.nn.relu(x)))
        bb.emit_func_output(y)
    return bb.get()


@needs_gcc
def test_model_without_planned_storage_has_no_arena(tmp_path):
    """One kernel writing straight into the caller's output: no arena to declare
    (it used to be an unused static: -Wunused-variable). Non-ASCII name too."""
    x = inputs((1, 64))
    summary, out = compile_and_compare(_relu_module(), "café", tmp_path / "c", x, mmalib=False)
    np.testing.assert_array_equal(out, np.maximum(x, 0))
    src = (tmp_path / "c" / "model.c").read_text()
    assert "_arena[" not in src and "int caf__run(" in src
    assert "int caf__run(const uint8_t* weights" in (tmp_path / "c" / "model.h").read_text()
    assert summary["c_name"] == "caf_"
    strict_compile(tmp_path / "c", tmp_path)


@needs_gcc
def test_folder_compiles_on_its_own(built, tmp_path):
    out, _ = built(True)
    alone = tmp_path / "alone"
    shutil.copytree(out, alone)
    for h in HEADERS:
        assert (alone / h.name).read_bytes() == h.read_bytes()
    for src in ("model.c", "tvm_kernels.c"):
        text = (alone / src).read_text()
        # the folder's own headers with quotes (<c7x.h> is TI's compiler header, for the profile timer)
        assert '#include "c7x_tvm_shim.h"' in text and all(f"#include <{h.name}>" not in text for h in HEADERS)
    strict_compile(alone, tmp_path)  # -I <alone> only
    harness = tmp_path / "host_main.c"  # away from KERNELS_DIR's headers
    shutil.copy(KERNELS_DIR / "host_main.c", harness)
    rc, err = gcc([*STRICT, "-I", str(alone), "-fsyntax-only", str(harness), "-DC7X_MODEL=crp", "-DC7X_MODEL_UC=CRP"])
    assert rc == 0, err


@needs_gcc
def test_model_header_has_the_preprocessing(built, tmp_path):
    out, _ = built(False)
    h = (out / "model.h").read_text()
    assert "#define CRP_PREPROCESS_RESIZE 256" in h and "#define CRP_PREPROCESS_CROP 224" in h
    assert "#define CRP_PREPROCESS_MEAN {0.485f, 0.456f, 0.406f}" in h
    assert "#define CRP_PREPROCESS_STD {0.229f, 0.224f, 0.225f}" in h
    assert ("RGB in [0,1], shorter side resized with bilinear antialiasing (torchvision), center crop, "
            "normalize, NCHW float32") in h
    use = tmp_path / "use.c"
    use.write_text('#include "model.h"\n'
                   "const float m[3] = CRP_PREPROCESS_MEAN;\nconst float s[3] = CRP_PREPROCESS_STD;\n"
                   "const int r = CRP_PREPROCESS_RESIZE, c = CRP_PREPROCESS_CROP;\n")
    rc, err = gcc([*STRICT, "-I", str(out), "-c", str(use), "-o", str(tmp_path / "use.o")])
    assert rc == 0, err


def test_bad_preprocess_is_a_value_error(crp, tmp_path):
    for bad in ({"resize": 256, "crop": 224, "mean": [0.5, 0.5]}, {**IMAGENET, "mean": [0.5, 0.5]},
                {**IMAGENET, "crop": 0}, {**IMAGENET, "resize": "256"}):
        with pytest.raises(ValueError, match="preprocess"):
            compile_model(crp.mod, "crp", tmp_path, mmalib=False, preprocess=bad)
    assert not list(tmp_path.iterdir())  # rejected before anything is written


def test_output_with_preprocess_is_byte_deterministic(crp, built, tmp_path):
    out, _ = built(True)
    compile_model(crp.mod, "crp", tmp_path, mmalib=True, preprocess=dict(IMAGENET, mean=list(IMAGENET["mean"])))
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(p.name for p in tmp_path.iterdir())
    for name in files:
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes(), name


@pytest.mark.parametrize("mmalib", [False, True])
def test_manifest_counts_kernel_calls_by_backend(built, mmalib):
    out, summary = built(mmalib)
    s = json.loads((out / "manifest.json").read_text())["summary"]
    calls, tvm_kernels = s["calls"], s["tvm_kernels"]
    assert set(calls) == {"mmalib", "c7x", "tvm"} and sum(calls.values()) == summary["calls"]
    assert summary["calls_by_backend"] == calls and summary["tvm_kernels"] == tvm_kernels
    assert tvm_kernels == sorted(set(tvm_kernels)) and calls["tvm"] == len(names := model_c_calls(
        (out / "model.c").read_text())) - calls["mmalib"] - calls["c7x"]
    assert len(names) == summary["calls"]
    called = set(names)
    assert set(tvm_kernels) <= called
    if mmalib:   # every pass on a kernel: the convs on MMALIB, pool, input quantize, output dequantize on C7x
        assert calls["mmalib"] > 0 and calls["tvm"] == 0 and tvm_kernels == []
        assert {"c7x_quantize_f32_i8_0", "c7x_dequantize_i8_f32_0"} <= called
    else:
        assert calls["mmalib"] == calls["c7x"] == 0 and set(tvm_kernels) == called and calls["tvm"] > 0


def model_c_calls(model_c: str) -> list[str]:
    """Kernel names of model.c's calls, in order (its ``/* k: name */`` comments)."""
    import re

    return re.findall(r"/\* \d+: (\w+) \*/", model_c)
