"""The emitted files: weights.bin format and content, C that compiles cleanly as
C99, only libc/libm/kernel symbols left undefined, exact float literals, and
byte-identical output for the same input."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from tvm import relax
from tvm.ir import GenericConst

from c_check import libc_symbols
from qflow import ConvReluPool, InvertedResidual, ResidualBlock, quantize, randomize_bn

from pipeline.backend import weights_bin
from pipeline.backend.compile import compile_model
from pipeline.backend.c_header import hex_literal
from pipeline.backend.host import KERNELS_DIR
from pipeline.backend.kernel_source import kernel_names
from pipeline.backend.memory_plan import plan_main
from pipeline.errors import UnsupportedOpError

GCC = shutil.which("gcc")
needs_gcc = pytest.mark.skipif(GCC is None, reason="gcc is not installed")
STRICT = ["-std=c99", "-Wall", "-Wextra", "-Wpedantic", "-Werror"]
# The only warnings TVM's generated tvm_kernels.c triggers (measured): it
# declares a shape/strides pointer per parameter and never reads most of them,
# and every packed function has the unused parameters self/num_args/result.
TVM_SUPPRESS = ["-Wno-unused-variable", "-Wno-unused-parameter"]

CONFIGS = {  # name -> (net factory, input shape, quantizer kwargs, mmalib)
    "crp_i8_scalar": (ConvReluPool, (1, 3, 16, 16), {"dtype": "int8"}, False),
    "crp_i8_mmalib": (ConvReluPool, (1, 3, 16, 16), {"dtype": "int8"}, True),
    "res_i16_scalar": (ResidualBlock, (1, 32, 8, 8), {"dtype": "int16"}, False),
    "inv_i16_mmalib": (lambda: InvertedResidual(stride=2, cout=48), (1, 32, 8, 8), {"dtype": "int16"}, True),
}


@pytest.fixture(scope="module")
def flows():
    """Quantized flows, one per (net, quantizer options), built once."""
    cache = {}

    def get(name):
        make, shape, kw, _ = CONFIGS[name]
        key = (make, shape, tuple(sorted(kw.items())))
        if key not in cache:
            torch.manual_seed(0)
            cache[key] = quantize(randomize_bn(make()), torch.randn(*shape), **kw)
        return cache[key]
    return get


@pytest.fixture(scope="module")
def built(flows, tmp_path_factory):
    """name -> (flow, codegen dir, compile summary), compiled once."""
    cache = {}

    def get(name, weights_format="bin"):
        key = (name, weights_format)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"{name}_{weights_format}")
            f = flows(name)
            cache[key] = (f, out, compile_model(f.mod, name, out, mmalib=CONFIGS[name][3],
                                                weights_format=weights_format))
        return cache[key]
    return get


def _gcc(args, cwd=None):
    done = subprocess.run([GCC, *args], capture_output=True, text=True, cwd=cwd)
    return done.returncode, done.stderr


# ---------------------------------------------------------------------------
# weights.bin
# ---------------------------------------------------------------------------

def test_weights_bin_layout_and_checksum():
    tensors = [np.arange(-5, 5, dtype=np.int8).reshape(2, 5), np.linspace(0, 1, 7, dtype=np.float32),
               np.array(7, np.int32), np.arange(6, dtype=np.int16).reshape(1, 2, 3), np.zeros(3, np.uint8)]
    blob, entries, crc = weights_bin.pack(tensors)
    magic, version, count, total, crc_field = struct.unpack_from("<8sIIQI", blob)
    assert (magic, version, count, total, crc_field) == (weights_bin.MAGIC, 1, 5, len(blob), crc)
    assert crc == zlib.crc32(blob[64:]) & 0xFFFFFFFF
    assert all(e.offset % 64 == 0 for e in entries) and len(blob) % 64 == 0
    back = weights_bin.unpack(blob)
    for t, b, e in zip(tensors, back, entries):
        assert b.dtype == t.dtype and b.shape == t.shape and np.array_equal(b, t)
        assert (e.dtype, e.shape, e.nbytes) == (str(t.dtype), t.shape, t.nbytes)
    bad = bytearray(blob)
    bad[entries[1].offset] ^= 1
    with pytest.raises(ValueError, match="checksum"):
        weights_bin.unpack(bytes(bad))
    with pytest.raises(ValueError, match="bytes"):
        weights_bin.unpack(blob[:-64])
    with pytest.raises(ValueError):
        weights_bin.pack([np.zeros((1,) * 6, np.int8)])


def _int8_weight_bytes(mod) -> int:
    total = 0
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            v = b.value
            if (isinstance(v, relax.Call) and getattr(v.op, "name", "") == "relax.dequantize"
                    and isinstance(v.args[0], GenericConst)):
                w = v.args[0].value.numpy()
                total += w.nbytes if w.dtype == np.int8 else 0
    return total


def test_weights_bin_keeps_int8_weights_without_float_copy(built):
    f, out, summary = built("crp_i8_scalar")
    blob = (out / "weights.bin").read_bytes()
    entries = weights_bin.unpack(blob)
    int8_in_model = _int8_weight_bytes(f.mod)
    assert int8_in_model > 0
    assert sum(e.nbytes for e in entries if e.dtype == np.int8) == int8_in_model
    assert all(sum(d > 1 for d in e.shape) <= 1 for e in entries if e.dtype.kind == "f")
    data = sum(e.nbytes for e in entries)
    overhead = 64 + 64 * len(entries) + 64 * len(entries)  # header, table, alignment padding
    assert len(blob) <= data + overhead and summary["weights_bytes"] == len(blob)
    assert len(blob) < 2 * int8_in_model  # a float32 copy would be 4x


# ---------------------------------------------------------------------------
# C sources
# ---------------------------------------------------------------------------

@needs_gcc
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_emitted_c_compiles_as_c99_without_warnings(built, name, tmp_path):
    _, out, _ = built(name)
    inc = ["-I", str(out), "-I", str(KERNELS_DIR)]
    rc, err = _gcc([*STRICT, *inc, "-c", str(out / "model.c"), "-o", str(tmp_path / "m.o")])
    assert rc == 0, err
    rc, err = _gcc([*STRICT, *TVM_SUPPRESS, *inc, "-c", str(out / "tvm_kernels.c"), "-o", str(tmp_path / "k.o")])
    assert rc == 0, err
    rc, err = _gcc([*STRICT, *inc, "-fsyntax-only", str(KERNELS_DIR / "host_main.c"),
                    f"-DC7X_MODEL={name}", f"-DC7X_MODEL_UC={name.upper()}"])
    assert rc == 0, err


@needs_gcc
def test_c_array_weights_compile_and_equal_the_blob(built, tmp_path):
    _, out, _ = built("crp_i8_scalar", "c_array")
    text = (out / "weights_data.c").read_text()
    body = text[text.index("= {") + 3:text.rindex("};")]
    data = bytes(int(b, 16) for b in re.findall(r"0x([0-9a-f]{2})", body))
    assert data == (out / "weights.bin").read_bytes()
    assert "extern const uint8_t crp_i8_scalar_weights" in (out / "model.h").read_text()
    rc, err = _gcc([*STRICT, "-I", str(out), "-c", str(out / "weights_data.c"), "-o", str(tmp_path / "w.o")])
    assert rc == 0, err


@needs_gcc
@pytest.mark.skipif(shutil.which("nm") is None, reason="binutils nm is not installed")
@pytest.mark.parametrize("name", ["crp_i8_scalar", "crp_i8_mmalib", "inv_i16_mmalib"])
def test_only_libc_libm_and_kernels_are_undefined(built, name, tmp_path):
    """model.c + tvm_kernels.c, linked together (-r): nothing from TVM is needed."""
    _, out, summary = built(name)
    objs = []
    for src in ("model.c", "tvm_kernels.c"):
        obj = tmp_path / (src + ".o")
        rc, err = _gcc(["-std=c99", "-O2", "-fno-pie", "-I", str(out), "-I", str(KERNELS_DIR),
                        "-c", str(out / src), "-o", str(obj)])
        assert rc == 0, err
        objs.append(str(obj))
    rc, err = _gcc(["-r", "-nostdlib", "-o", str(tmp_path / "model.o"), *objs])
    assert rc == 0, err
    undefined = set(subprocess.run(["nm", "-u", str(tmp_path / "model.o")], capture_output=True,
                                   text=True).stdout.split()) - {"U"}
    kernels = set(kernel_names())
    assert undefined - kernels <= libc_symbols(), undefined - kernels
    if CONFIGS[name][3]:
        assert undefined & kernels  # the offloaded layers do call the kernels
    assert not any(s.startswith(("TVM", "tvm", "__tvm")) for s in undefined), undefined


def _f32_bits(value: float) -> int:
    return int(np.array(value, np.float32).view(np.uint32))


def test_float_literals_are_exact(built):
    """Every decimal literal left in TVM's C is an integer (printed exactly);
    every other float constant is its bit pattern (c7x_f32_bits)."""
    f, out, _ = built("crp_i8_scalar")
    src = (out / "tvm_kernels.c").read_text()
    literals = re.findall(r"(?<![\w.])(\d\.\d{6}e[+-]\d{2,3})f?", src)
    assert literals and all(float(x).is_integer() for x in literals), literals
    scale = next(float(b.value.args[1].value.numpy()) for block in f.mod["main"].body.blocks
                 for b in block.bindings if getattr(b.value, "op", None) is not None
                 and getattr(b.value.op, "name", "") == "relax.quantize")
    inv = np.float32(1.0 / np.float64(scale))
    assert f"c7x_f32_bits((uint32_t){_f32_bits(inv)})" in src  # the input quantize multiplies by exactly this
    assert float.fromhex(hex_literal(0.1)[:-1]) == float(np.float32(0.1))


def test_model_header_describes_the_build(built):
    f, out, summary = built("crp_i8_mmalib")
    h = (out / "model.h").read_text()
    blob = (out / "weights.bin").read_bytes()
    assert f"#define CRP_I8_MMALIB_WEIGHTS_BYTES {len(blob)}u" in h
    assert f"#define CRP_I8_MMALIB_WEIGHTS_CRC32 0x{zlib.crc32(blob[64:]) & 0xFFFFFFFF:08x}u" in h
    assert f"#define CRP_I8_MMALIB_ARENA_BYTES {summary['arena_bytes']}u" in h
    assert "#define CRP_I8_MMALIB_INPUT_SHAPE {1, 3, 16, 16}" in h
    assert "#define CRP_I8_MMALIB_OUTPUT_SHAPE {1, 64}" in h
    out_scale = [n.args[1] for n in f.ep.graph.nodes if "dequantize_per_tensor" in str(n.target)][-1]
    assert f"#define CRP_I8_MMALIB_OUTPUT_SCALE {hex_literal(out_scale)}" in h
    assert "int crp_i8_mmalib_run(const uint8_t* weights, const float* input, float* output);" in h


def test_manifest_and_summary(built):
    import json

    _, out, summary = built("crp_i8_scalar")
    layers = json.loads((out / "manifest.json").read_text())["layers"]
    assert layers and all(e["backend"] == "scalar" and e["reason"] == "mmalib disabled" for e in layers)
    assert summary["layers"] == len(layers) and summary["layers_offloaded"] == 0
    assert summary["macs_total"] > 0 and summary["macs_offloaded"] == 0
    _, out, summary = built("crp_i8_mmalib")
    layers = json.loads((out / "manifest.json").read_text())["layers"]
    offloaded = [e for e in layers if e["backend"] != "scalar"]
    assert offloaded and summary["layers_offloaded"] == len(offloaded)
    assert summary["macs_offloaded"] == sum(e["macs"] for e in offloaded)


def test_unsupported_main_is_rejected():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 4], "float32"))
    y = relax.Var("y", relax.TensorType([1, 4], "float32"))
    with bb.function("main", [x, y]):
        bb.emit_func_output(bb.emit(relax.op.add(x, y)))
    with pytest.raises(UnsupportedOpError, match="parameters"):
        plan_main(bb.get())


# ---------------------------------------------------------------------------
# determinism
# ---------------------------------------------------------------------------

_SUBPROCESS_COMPILE = textwrap.dedent("""
    import sys
    from pathlib import Path
    from pipeline.frontend.irmodule_io import load_irmodule
    from pipeline.backend.compile import compile_model
    mod = load_irmodule(Path(sys.argv[1]), Path(sys.argv[2]))
    compile_model(mod, "det", Path(sys.argv[3]), mmalib=sys.argv[4] == "1")
""")


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("mmalib", [False, True])
def test_same_input_gives_byte_identical_files(flows, tmp_path, mmalib):
    """Twice in this process, and in two fresh interpreters with different hash seeds."""
    from pipeline.frontend.irmodule_io import load_irmodule, save_irmodule

    f = flows("res_i16_scalar")
    script, params = tmp_path / "mod.py", tmp_path / "params.bin"
    save_irmodule(f.mod, {}, script, params)
    mod = load_irmodule(script, params)
    runs = []
    for i in range(2):
        (tmp_path / f"in{i}").mkdir()
        compile_model(mod, "det", tmp_path / f"in{i}", mmalib=mmalib)
        runs.append(_files(tmp_path / f"in{i}"))
    for seed in ("1", "2"):
        out = tmp_path / f"sub{seed}"
        out.mkdir()
        env = dict(os.environ, PYTHONHASHSEED=seed)
        done = subprocess.run([sys.executable, "-c", _SUBPROCESS_COMPILE, str(script), str(params),
                               str(out), "1" if mmalib else "0"], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(_files(out))
    assert set(runs[0]) >= {"model.c", "model.h", "tvm_kernels.c", "weights.bin", "lowered.py", "manifest.json"}
    for other in runs[1:]:
        assert other == runs[0]
