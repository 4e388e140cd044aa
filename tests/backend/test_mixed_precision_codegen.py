"""Mixed int8 / int16 graphs through the backend (issue 10, item 4).

Nets quantized with ``C7xMMAQuantizer("int8", int16_layers={...})`` (layer ids
from ``tag_program``, as the export stage tags them), calibrated, converted,
imported and compiled, then built with gcc and run:

- host C == the Python integer reference bit for bit (MMALIB and scalar builds);
- every conv, depthwise conv, FC and residual add runs on its MMALIB / C7x
  kernel in its own dtype (the i16 kernels for int16 layers), and every
  int8 <-> int16 boundary of the Q/DQ program is one requantize kernel call,
  whose output is torch's ``quantize(dequantize(x))`` of its input;
- weights.bin holds int8 weights for the int8 kernels and the widened,
  pre-scaled int16 weights (``k[c] * W8``) the i16 kernels take;
- the scalar build stays within one output step of torch's Q/DQ model.

The MobileNetV2 check (slow) does the same with torchvision's ImageNet weights
and a handful of int16 layers on real images.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from c_check import compile_and_compare, inputs
from qflow import InvertedResidual, randomize_bn
from tinynets import SmallCNN
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from tvm import relax

from pipeline import torchenv  # noqa: F401  (quantized_decomposed ops registered)
from pipeline.backend.compile import io_quantization
from pipeline.backend.interp import Program
from pipeline.frontend.provenance import tag_program
from pipeline.frontend.qdq_import import import_with_provenance
from pipeline.quant import C7xMMAQuantizer

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed for the host build")

REPO = Path(__file__).resolve().parents[2]
WEIGHTED = ("conv2d", "depthwise_conv2d", "grouped_conv2d", "fc")
ON_KERNELS = WEIGHTED + ("residual_add",)
REQUANTIZE = {("int8", "int16"): "c7x_requantize_i8_i16", ("int16", "int8"): "c7x_requantize_i16_i8"}
_TORCH = {"int8": torch.int8, "int16": torch.int16}


class MixedFlow:
    """A net quantized with int16 layers: the torch Q/DQ model, its Relax import
    (params bound), the binding provenance and each layer id's activation dtype."""

    def __init__(self, model, example, int16_layers, calib, **quantizer_kwargs):
        ep = torch.export.export(model.eval(), (example,))
        tag_program(ep)
        quantizer = C7xMMAQuantizer("int8", int16_layers=frozenset(int16_layers), **quantizer_kwargs)
        prepared = prepare_pt2e(ep.module(), quantizer)
        with torch.no_grad():
            for x in calib:
                prepared(x)
        self.dtypes = quantizer.layer_dtypes()
        self.qdq = convert_pt2e(prepared)
        mod, params, self.provenance = import_with_provenance(torch.export.export(self.qdq, (example,)))
        self.mod = relax.transform.BindParams("main", params)(mod)

    def torch_outputs(self, x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return np.concatenate([self.qdq(torch.from_numpy(x[i:i + 1])).numpy() for i in range(len(x))])

    def boundaries(self) -> list[tuple[str, str]]:
        """(from, to) dtypes of every quantize(dequantize(x)) changing the dtype in the Q/DQ program."""
        out = []
        for n in self.qdq.graph.nodes:
            src = n.args[0] if n.op == "call_function" and n.args else None
            if "quantize_per_tensor" in str(n.target) and "dequantize" not in str(n.target) \
                    and "dequantize_per_tensor" in str(getattr(src, "target", "")):
                a, b = (str(d).removeprefix("torch.") for d in (src.args[5], n.args[5]))
                if a != b:
                    out.append((a, b))
        return out


def small_cnn_flow(int16_layers, **kw) -> MixedFlow:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    calib = [torch.randn(1, 3, 32, 32, generator=gen) for _ in range(4)]
    return MixedFlow(SmallCNN(), torch.randn(1, 3, 32, 32), int16_layers, calib, **kw)


def compile_both(flow: MixedFlow, tmp: Path, x: np.ndarray, mmalib: bool, name="mixed"):
    """compile -> gcc -> host == Python reference bit for bit; returns (folder, manifest, outputs)."""
    out = tmp / ("mmalib" if mmalib else "scalar")
    out.mkdir()
    _, c = compile_and_compare(flow.mod, name, out, x, mmalib=mmalib, provenance=flow.provenance)
    return out, json.loads((out / "manifest.json").read_text()), c


def check_layers_on_their_kernels(flow: MixedFlow, manifest: dict) -> None:
    """Every conv / dw / FC / residual add on MMALIB or C7x in the dtype the quantizer gave it;
    one c7x requantize per boundary of the Q/DQ program."""
    layers = manifest["layers"]
    for lay in (x for x in layers if x["op"] in ON_KERNELS):
        assert lay["backend"] in ("mmalib", "c7x"), lay
        assert lay["dtype"] == flow.dtypes[lay["id"]], lay
        assert ("16" in lay["kernel"]) == (lay["dtype"] == "int16"), lay
    requant = [x for x in layers if x["op"] == "requantize"]
    assert sorted((x["dtype"], x["out_dtype"]) for x in requant) == sorted(flow.boundaries())
    assert all(x["backend"] == "c7x" and x["kernel"] == REQUANTIZE[x["dtype"], x["out_dtype"]] for x in requant)
    assert len({x["id"] for x in layers}) == len(layers)
    by_op = manifest["summary"]["by_op"]
    assert by_op["requantize"] == {"layers": len(requant), "offloaded": len(requant)}
    calls = [c for c in manifest["calls"] if c["kernel"].startswith("c7x_requantize_")]
    assert sorted(c["layer"] for c in calls) == sorted(x["id"] for x in requant)


def offload_weights(folder: Path) -> list[tuple[str, np.ndarray]]:
    """(kernel, weight array from weights.bin) of every MMALIB call of the build in ``folder``."""
    prog = Program(folder)
    main = prog.mod["main"]
    weight_of = dict(zip(main.params[1:], prog.weights))
    out = []
    for block in main.body.blocks:
        for b in block.bindings:
            v = b.value
            name = getattr(getattr(v, "op", None), "name_hint", None)
            if name in prog.externs and prog.externs[name].kernel.startswith("mmalib_"):
                out.append((prog.externs[name].kernel, weight_of[v.args[1]]))
    return out


def check_weights(folder: Path, int16_weights: bool = False) -> None:
    """int8 kernels read int8 weights; int16 kernels read int16 weights that are
    int8 weights times a per-channel factor k in [1, 256] (docs/numerics.md,
    "int16 per-channel weight pre-scaling") or, with ``int16_weights``
    (``weight_dtype="int16"``), int16 weights on the full range of every channel."""
    found = offload_weights(folder)
    assert found
    for kernel, w in found:
        int16 = kernel.endswith("i16")
        assert w.dtype == (np.int16 if int16 else np.int8), kernel
        if int16 and int16_weights:
            flat = w.ravel().astype(np.int64)  # the full int16 range, no pre-scale factor
            assert np.abs(flat).max() >= 16384 and np.gcd.reduce(flat) == 1, kernel
        elif int16:
            for row in w.reshape(w.shape[0], -1).astype(np.int64):
                assert any((row % k == 0).all() and np.abs(row // k).max() <= 128 for k in range(1, 257)), \
                    (kernel, row)


def quantize_params(flow: MixedFlow) -> dict[str, tuple[float, int]]:
    """Binding name -> (scale, zero point) of every per-tensor quantize of the import."""
    out = {}
    for block in flow.mod["main"].body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and getattr(v.op, "name", "") == "relax.quantize":
                out[b.var.name] = (float(v.args[1].value.numpy()), int(v.args[2].value.numpy()))
    return out


def check_requantize_calls(flow: MixedFlow, folder: Path, manifest: dict, image: np.ndarray) -> None:
    """Each requantize call's output is torch's quantize(dequantize(input)) of the
    tensor the C handed it (captured while the Python reference runs), with the
    Q/DQ program's scales; the kernel got torch's reciprocal of the output scale."""
    prog = Program(folder)
    outputs: dict[int, np.ndarray] = {}
    prog.run(image, lambda i, func, out: outputs.__setitem__(i, out.copy()))
    calls, params = manifest["calls"], quantize_params(flow)
    layers = {x["id"]: x for x in manifest["layers"]}
    qd = torch.ops.quantized_decomposed
    checked = 0
    for c in (c for c in calls if c["kernel"].startswith("c7x_requantize_")):
        lay = layers[c["layer"]]
        src = next(p for p in reversed(calls[:c["index"]]) if p["output"] == c["inputs"][0])
        _, z1, s1, z2, inv = [v for kind, v in prog.externs[c["func"]].args if kind != "buf"]
        s2, zp2 = params[lay["name"]]
        assert zp2 == z2 and inv == float(np.float32(1.0 / s2))
        r1, r2 = np.iinfo(lay["dtype"]), np.iinfo(lay["out_dtype"])
        d = qd.dequantize_per_tensor(torch.from_numpy(outputs[src["index"]].reshape(-1)), s1, z1,
                                     int(r1.min), int(r1.max), _TORCH[lay["dtype"]])
        t = qd.quantize_per_tensor(d, s2, z2, int(r2.min), int(r2.max), _TORCH[lay["out_dtype"]]).numpy()
        np.testing.assert_array_equal(outputs[c["index"]].reshape(-1), t)
        checked += 1
    assert checked == sum(x["op"] == "requantize" for x in manifest["layers"]) > 0


CASES = {  # name -> (int16 layer ids of SmallCNN, quantizer options)
    "int16_conv_and_add": ({"conv2d_1", "add"}, {}),
    "int16_stem_dw_fc": ({"conv2d", "conv2d_2", "linear"}, {}),
    "affine_int8": ({"conv2d_1", "add", "linear"}, {"symmetric_activations": False}),
    "int16_weights": ({"conv2d", "conv2d_2", "linear"}, {"weight_dtype": "int16"}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_small_cnn_mixed_builds_are_bit_exact_and_offload_every_layer_in_its_dtype(tmp_path, case):
    layers16, kw = CASES[case]
    flow = small_cnn_flow(layers16, **kw)
    assert {k for k, d in flow.dtypes.items() if d == "int16"} >= layers16
    assert ("int8", "int16") in flow.boundaries() and ("int16", "int8") in flow.boundaries()
    x = inputs((1, 3, 32, 32), n=3)
    ref = flow.torch_outputs(x)
    lsb = io_quantization(flow.mod)["output"].scale

    folder, manifest, out = compile_both(flow, tmp_path, x, mmalib=True)
    check_layers_on_their_kernels(flow, manifest)
    check_weights(folder, kw.get("weight_dtype") == "int16")
    check_requantize_calls(flow, folder, manifest, x[:1])
    # the kernels' 7-bit (int8) / pre-scaled (int16) multipliers: a few int8 steps, which an
    # int16 output counts in hundreds of its own steps; measured <= 0.4 % of the output span
    assert np.abs(out - ref).max() <= 0.02 * np.abs(ref).max()

    folder, manifest, out = compile_both(flow, tmp_path, x, mmalib=False)
    assert all(lay["backend"] == "scalar" for lay in manifest["layers"])
    assert manifest["summary"]["by_op"]["requantize"]["layers"] == len(flow.boundaries())
    assert np.abs(out - ref).max() <= lsb * 1.001  # integer convs, float epilogue as torch


def test_int16_max_pool_runs_on_its_kernel(tmp_path):
    """An int16 stem makes its max pool int16: it runs on c7x_int16_max_pool, on the
    integers (no float copy in between), bit-exact with the Python reference."""
    flow = small_cnn_flow({"conv2d"})
    x = inputs((1, 3, 32, 32), n=2)
    folder, manifest, _ = compile_both(flow, tmp_path, x, mmalib=True)
    (pool,) = [lay for lay in manifest["layers"] if lay["op"] == "max_pool2d"]
    assert (pool["dtype"], pool["backend"], pool["kernel"]) == ("int16", "c7x", "c7x_int16_max_pool")
    (call,) = [c for c in manifest["calls"] if c["layer"] == pool["id"]]
    assert call["dtype"] == "int16" and call["backend"] == "c7x"
    check_layers_on_their_kernels(flow, manifest)


def test_inverted_residual_with_int16_depthwise(tmp_path):
    """MobileNetV2 block with only its 3x3 depthwise in int16 (zero points 0: symmetric)."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    calib = [torch.randn(1, 32, 8, 8, generator=gen) for _ in range(4)]
    flow = MixedFlow(randomize_bn(InvertedResidual()), torch.randn(1, 32, 8, 8), {"conv2d_1"}, calib)
    x = inputs((1, 32, 8, 8), n=3)
    folder, manifest, _ = compile_both(flow, tmp_path, x, mmalib=True)
    check_layers_on_their_kernels(flow, manifest)
    kinds = {lay["op"]: lay["kernel"] for lay in manifest["layers"]
             if lay["dtype"] == "int16" and lay["op"] != "requantize"}
    assert kinds == {"depthwise_conv2d": "mmalib_depthwise_conv2d_i16"}
    check_requantize_calls(flow, folder, manifest, x[:1])


# --------------------------------------------------------------------------
# MobileNetV2, real weights and images
# --------------------------------------------------------------------------

# first conv; inverted-residual block features.3 (expand, depthwise, project) with its add; classifier
MBV2_INT16 = {"conv2d", "conv2d_6", "conv2d_7", "conv2d_8", "add", "linear"}


@pytest.mark.slow
def test_mobilenet_v2_mixed_is_bit_exact_on_real_images(tmp_path):
    import torchvision

    from pipeline.entries import load_models
    from pipeline.data.images import list_images, load_images
    from pipeline.weights import resolve_weights

    images = list_images(REPO / "calib_data" / "imagenet20")
    if len(images) != 20:
        pytest.skip("calib_data/imagenet20 is not fetched: run `bash scripts/setup.sh` first")
    spec = next(m for m in load_models(REPO / "models") if m.name == "mobilenet_v2")
    model = torchvision.models.mobilenet_v2()
    model.load_state_dict(torch.load(resolve_weights(spec, REPO), map_location="cpu", weights_only=True))
    x = load_images(images[:7], spec.preprocess, desc="mbv2 mixed")
    flow = MixedFlow(model, x[:1], MBV2_INT16, [x[i:i + 1] for i in range(4)])
    assert {k for k, d in flow.dtypes.items() if d == "int16"} >= MBV2_INT16

    test = x[4:7].numpy()
    folder, manifest, out = compile_both(flow, tmp_path, test, mmalib=True, name="mbv2_mixed")
    check_layers_on_their_kernels(flow, manifest)
    s = manifest["summary"]
    weighted = [lay for lay in manifest["layers"] if lay["op"] in WEIGHTED]
    assert len(weighted) == 53 and s["by_backend"]["mmalib"]["macs"] == sum(lay["macs"] for lay in weighted)
    assert s["macs_offloaded"] == s["macs_total"]  # 100% of conv / FC MACs on MMALIB
    int16 = {lay["id"] for lay in manifest["layers"] if lay["dtype"] == "int16" and lay["op"] != "requantize"}
    assert int16 == MBV2_INT16
    check_weights(folder)
    ref = flow.torch_outputs(test)
    assert (out.argmax(1) == ref.argmax(1)).all()
    folder, manifest, out = compile_both(flow, tmp_path, test, mmalib=False, name="mbv2_mixed")
    assert manifest["summary"]["by_op"]["requantize"]["layers"] == len(flow.boundaries()) == 4
    assert (out.argmax(1) == ref.argmax(1)).all()


def test_mixed_project_through_the_stages_names_and_measures_every_boundary(tmp_path):
    """A doit project with ``[quantizer] int16_layers`` run through the stage
    functions up to ``layers``: the manifest has the requantize layers on C7x and
    layers.json compares each at its own quantize (the output dtype's scale), C
    against Q/DQ, like every other layer."""
    from doitproj import Project, build_through

    p = Project(tmp_path / "proj")
    p.add_images("setA", 3)
    p.add_model("tinymix", "setA", extra='[quantizer]\nint16_layers = ["c1", "pw"]\n')
    build_through(p.root, last="layers")
    art = p.root / "artifacts" / "tinymix"
    manifest = json.loads((art / "c" / "mmalib" / "manifest.json").read_text())
    requant = {lay["id"]: lay for lay in manifest["layers"] if lay["op"] == "requantize"}
    assert len(requant) == 4 and all(lay["backend"] == "c7x" for lay in requant.values())
    assert all(lay["backend"] != "scalar" for lay in manifest["layers"] if lay["op"] in ON_KERNELS)
    scales = quantize_scales(art / "relax")
    for entry in json.loads((art / "layers.json").read_text())["layers"]:
        if entry["id"] in requant:
            assert np.float32(entry["compared_at"]["scale"]) == np.float32(scales[entry["id"]]), entry
            assert entry["c_vs_qdq"] is not None and entry["qdq_vs_float"] is not None, entry


def quantize_scales(relax_dir: Path) -> dict[str, float]:
    """Binding name -> scale of every per-tensor quantize of the imported module."""
    from pipeline.frontend.irmodule_io import load_irmodule

    mod = load_irmodule(relax_dir / "module.py", relax_dir / "params.bin")
    out = {}
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and getattr(v.op, "name", "") == "relax.quantize":
                out[b.var.name] = float(v.args[1].value.numpy())
    return out
