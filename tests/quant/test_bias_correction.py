"""Empirical bias correction (pipeline.quant.bias_correction; Nagel et al. 2019, sec. 4.2)
on small nets, and through the calibrate / convert stage functions (issue 10, item 2)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

from doitproj import write_jpeg
from pipeline import torchenv  # noqa: F401
from pipeline.config import CalibrationSpec, ModelSpec, PreprocessSpec, WeightsSpec
from pipeline.quant.bias_correction import (SLOT_PREFIX, _channel_mean, _Lockstep, _PerImage,
                                            add_bias_slots, correct_biases, weighted_nodes)
from qflow import randomize_bn
from quant_graph import prepare
from tinynets import SmallCNN

TESTS = Path(__file__).resolve().parent.parent


def small_net() -> torch.nn.Module:
    """SmallCNN with BN statistics and one conv without a bias (c1, no BN after it)."""
    torch.manual_seed(0)
    net = randomize_bn(SmallCNN())
    net.c1 = torch.nn.Conv2d(16, 16, 3, 1, 1, bias=False)
    return net.eval()


def images(n=12, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 3, 32, 32, generator=gen) for _ in range(n)]


def layer_means(gm, xs, skip_observers):
    out = {}

    def rec(node):
        def hook(outs):
            out[node.name] = _channel_mean(node, outs)
            return outs
        return hook

    with torch.no_grad():
        _Lockstep(gm, {n.name: rec(n) for n in weighted_nodes(gm)}, skip_observers).run(_PerImage(xs))
    return out


def mean_errors(float_gm, prepared, xs):
    """Per layer: mean over channels of |E[y_qdq] - E[y_float]| on ``xs``."""
    f = layer_means(float_gm, xs, skip_observers=True)
    q = layer_means(convert_pt2e(copy.deepcopy(prepared)), xs, skip_observers=False)
    return {k: float((q[k] - f[k]).abs().mean()) for k in f}


@pytest.fixture(scope="module")
def calibrated():
    xs = images()
    gm = prepare(small_net(), xs[0], observer="minmax")
    slots = add_bias_slots(gm)
    with torch.no_grad():
        for x in xs:
            gm(x)
    return gm, slots, xs


def test_bias_slot_is_zero_and_changes_nothing(calibrated):
    gm, slots, xs = calibrated
    assert slots == [SLOT_PREFIX + "conv2d_1"]
    assert torch.equal(gm.get_parameter(slots[0]), torch.zeros(16))
    plain = prepare(small_net(), xs[0])
    with torch.no_grad():
        assert torch.equal(plain(xs[1]), gm(xs[1]))
    assert add_bias_slots(gm) == []          # every layer has a bias now


def test_correction_removes_the_mean_error_on_the_calibration_data(calibrated):
    gm, _, xs = calibrated
    float_ref = copy.deepcopy(gm)             # the float model keeps the uncorrected biases
    before = mean_errors(float_ref, gm, xs)
    corrected = copy.deepcopy(gm)
    records = correct_biases(corrected, xs)
    after = mean_errors(float_ref, corrected, xs)
    assert [r["node"] for r in records] == list(before) == ["conv2d", "conv2d_1", "conv2d_2", "conv2d_3", "linear"]
    assert all(before[k] > 1e-5 for k in before)
    assert all(after[k] < 0.02 * before[k] for k in after), (before, after)
    assert records[1]["created"] and records[1]["bias"] == SLOT_PREFIX + "conv2d_1"
    # the recorded correction is the measured error (layer 1: nothing upstream corrected yet)
    assert records[0]["mean_abs"] == pytest.approx(before["conv2d"], rel=1e-4)


def test_correction_changes_only_biases(calibrated):
    gm, _, xs = calibrated
    corrected = copy.deepcopy(gm)
    correct_biases(corrected, xs)
    biases = {n.args[2].target for n in weighted_nodes(gm)}
    old, new = gm.state_dict(), corrected.state_dict()
    changed = {k for k in old if not torch.equal(old[k], new[k])}
    assert changed == {k for k in biases}


def test_missing_bias_is_an_error():
    xs = images(2)
    gm = prepare(small_net(), xs[0])
    with torch.no_grad():
        gm(xs[0])
    with pytest.raises(ValueError, match="add_bias_slots"):
        correct_biases(gm, xs)


# ------------------------------------------------------------------ stage functions
def spec_of(d: Path, builder="tinynets:small_cnn", shape=(1, 3, 32, 32), kwargs=None, **cal) -> ModelSpec:
    return ModelSpec(name="tiny", source=d / "tiny.toml", builder=builder, builder_kwargs=kwargs or {},
                     input_shape=shape, weights=WeightsSpec(pretrained=False),
                     preprocess=PreprocessSpec(resize=36, crop=32),
                     calibration=CalibrationSpec(set="s", **cal), evaluation_set="s")


def run_stages(d: Path, name: str, spec: ModelSpec, int16_selection=None):
    from pipeline.stages.calibrate import calibrate_model
    from pipeline.quant.program import load_converted
    from pipeline.stages.export import export_model
    from pipeline.stages.prepare import prepare_model
    from pipeline.quant.program import read_int16_selection
    if not (d / "float.pt2").exists():
        export_model(spec, None, d / "float.pt2", TESTS)
    prepare_model(spec, d / "float.pt2", d / f"{name}_prepared.pt", d / f"{name}_obs.txt", int16_selection)
    info = calibrate_model(spec, d / "float.pt2", d / f"{name}_prepared.pt", d / f"{name}_obs.txt", d / "s",
                           d / f"{name}.pt", d / f"{name}.json", int16_selection)
    q = load_converted(spec, d / "float.pt2", d / f"{name}.pt", read_int16_selection(int16_selection))
    return info, q


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("bc")
    (d / "s").mkdir()
    for i in range(6):
        write_jpeg(d / "s" / f"im_{i}_{i}.jpg", seed=i)
    return d


def test_calibrate_stage_records_and_convert_loads_the_corrected_biases(folder):
    info_off, q_off = run_stages(folder, "off", spec_of(folder))
    info, q = run_stages(folder, "on", spec_of(folder, bias_correction=True))
    assert info_off["bias_correction"] is False
    bc = json.loads((folder / "on.json").read_text())["bias_correction"]
    assert bc["method"] == "empirical" and "Nagel" in bc["reference"] and bc["images"] == 6
    assert [r["layer"] for r in bc["layers"]] == ["conv2d", "conv2d_1", "conv2d_2", "conv2d_3", "linear"]
    assert all(r["mean_abs"] > 0 and not r["created"] for r in bc["layers"])
    # same observers (bias correction runs after them), different biases in the Q/DQ model
    s_off = torch.load(folder / "off.pt", weights_only=True)
    s_on = torch.load(folder / "on.pt", weights_only=True)
    assert s_off.keys() == s_on.keys()
    differ = {k for k in s_off if not torch.equal(s_off[k], s_on[k])}
    assert differ == {r["bias"] for r in bc["layers"]}
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert not torch.equal(q_off(x), q(x))


def test_bias_less_layer_gets_a_slot_through_the_stages(tmp_path):
    (tmp_path / "s").mkdir()
    for i in range(3):
        write_jpeg(tmp_path / "s" / f"im_{i}_{i}.jpg", seed=i)
    conv = dict(in_channels=3, out_channels=8, kernel_size=3, bias=False)
    spec = spec_of(tmp_path, builder="torch.nn:Conv2d", kwargs=conv, observer="percentile",
                   percentile=99.0, bias_correction=True)
    info, q = run_stages(tmp_path, "slot", spec)
    (rec,) = info["bias_correction"]["layers"]
    assert rec["created"] and rec["channels"] == 8 and info["observer_options"] == {"percentile": 99.0}
    # the prepared state (prepare stage) has no slot; the calibrated one has it, corrected
    assert not any(k.startswith(SLOT_PREFIX) for k in torch.load(tmp_path / "slot_prepared.pt", weights_only=True))
    bias = torch.load(tmp_path / "slot.pt", weights_only=True)[rec["bias"]]
    assert float(bias.abs().max()) == pytest.approx(rec["max_abs"], rel=1e-6)
    assert torch.equal(q.get_parameter(rec["bias"]), bias)


def test_mixed_precision_selection_with_bias_correction(folder):
    sel = folder / "int16_layers.json"
    sel.write_text(json.dumps({"layers": ["conv2d_1", "add"]}))
    info, q = run_stages(folder, "mixed", spec_of(folder, observer="entropy", bias_correction=True), sel)
    assert len(info["bias_correction"]["layers"]) == 5
    dtypes = {n.args[-1] for n in q.graph.nodes if n.op == "call_function"
              and n.target == torch.ops.quantized_decomposed.quantize_per_tensor.default}
    assert dtypes == {torch.int8, torch.int16}
