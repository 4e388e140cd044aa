"""Mixed precision (issue 10, item 3): ``int16_layers`` patterns, the simulation of
mixed assignments, and the automatic choice of the ``mixed_precision`` stage.

Tiny nets with named submodules, exported and tagged as the export stage does;
calibration on real JPEGs (seeded noise) for the stage-level tests.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re

import pytest

from pipeline import torchenv  # noqa: F401  (quiet torch, Q/DQ ops registered)

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.export import Dim
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from doitproj import write_jpeg
from mixednets import TinyNet
from pipeline.entries import load_models
from pipeline.errors import ConfigError
from pipeline.frontend.provenance import tag_program
from pipeline.quant import C7xMMAQuantizer, mixed
from pipeline.quant.mixed_sim import MixedSimulator


def export(model: nn.Module) -> torch.export.ExportedProgram:
    ep = torch.export.export(model.eval(), (torch.randn(2, 3, 32, 32),),
                             dynamic_shapes=({0: Dim("batch", min=1, max=64)},))
    tag_program(ep)
    return ep


@pytest.fixture(scope="module")
def ep():
    return export(TinyNet())


def calib_images(n=6, seed=0):
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- layers, patterns

def test_layers_ids_modules_ops_macs(ep):
    layers = {layer.module: layer for layer in mixed.program_layers(ep.graph)}
    assert list(layers) == ["features.0.0", "features.1.conv.0", "features.1.conv.2.0", "features.1.conv.3",
                            "features.1", "features.2.0", "features.3", "classifier.1"]
    assert layers["features.1"].op == "add" and layers["features.1"].macs == 0
    assert layers["features.0.0"].op == "conv2d" and layers["features.0.0"].macs == 8 * 16 * 16 * 3 * 9
    assert layers["features.1.conv.2.0"].macs == 16 * 16 * 16 * 9  # depthwise: C_in/groups = 1
    assert layers["classifier.1"].op == "linear" and layers["classifier.1"].macs == 10 * 16
    assert layers["features.0.0"].id == "conv2d"


def test_patterns_resolve_to_layer_ids(ep):
    layers = mixed.program_layers(ep.graph)
    by_module = {layer.module: layer.id for layer in layers}
    got = mixed.resolve_patterns(["features.1.*", "classifier.1"], layers, "models/x.toml")
    assert got == [by_module[m] for m in ("features.1.conv.0", "features.1.conv.2.0", "features.1.conv.3")] \
        + [by_module["classifier.1"]]
    assert mixed.resolve_patterns(["features.1"], layers, "x") == [by_module["features.1"]]  # the add alone
    assert mixed.resolve_patterns([], layers, "x") == []


def test_pattern_matching_nothing_is_one_line_with_close_paths(ep):
    layers = mixed.program_layers(ep.graph)
    with pytest.raises(ConfigError) as err:
        mixed.resolve_patterns(["features.1.*", "clasifier.1"], layers, "models/tiny_mixed.toml")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("models/tiny_mixed.toml: ") and "'clasifier.1'" in msg
    close = msg.split("closest module paths: ")[1].split(", ")
    assert len(close) == 3 and close[0] == "classifier.1"


def test_choose_by_gain_per_mac_within_budget(ep):
    layers = mixed.program_layers(ep.graph)
    ids = {layer.module: layer.id for layer in layers}
    a, b, c, add = ids["features.0.0"], ids["features.1.conv.0"], ids["classifier.1"], ids["features.1"]
    cands = [mixed.TensorCandidate("p", "q", (a, b), 0.0, 1.0),   # big gain, 2 convs (34 % of MACs)
             mixed.TensorCandidate("q", "r", (c,), 0.0, 0.01),    # small gain, tiny linear: more per MAC
             mixed.TensorCandidate("r", "s", (add,), 0.0, 0.001)]  # an add alone: 0 MACs
    share_ab, share_c = mixed.mac_share([a, b], layers), mixed.mac_share([c], layers)
    assert mixed.choose(cands, layers, budget=share_ab + share_c) == [a, b, add, c]  # graph order
    assert mixed.choose(cands, layers, budget=share_ab) == [add, c]  # c first; then a+b do not fit
    assert mixed.choose(cands, layers, budget=1.0, min_gain=0.005) == [a, b, c]  # the add's gain is noise
    assert mixed.choose(cands, layers, budget=share_ab + share_c, fixed=[ids["features.3"]]) == \
        [add, ids["features.3"], c]  # the manual layer counts against the budget
    with pytest.raises(ValueError, match="over the int16_macs budget"):
        mixed.choose(cands, layers, budget=share_ab / 2, fixed=[a, b])


# ----------------------------------------------------------------------------- simulation

def prepared(ep, int16, x, weight_dtype=None):
    gm = prepare_pt2e(copy.deepcopy(ep.module()),
                      C7xMMAQuantizer("int8", int16_layers=int16, weight_dtype=weight_dtype))
    with torch.no_grad():
        gm(x)
    return gm


@pytest.fixture(scope="module", params=[None, "int16"], ids=["int8_weights", "int16_weights"])
def sim(ep, request):
    """The simulator of TinyNet; its int16 layers' weights int8, or int16 (``weight_dtype``)."""
    x, wd = calib_images(), request.param
    every = frozenset(mixed.layer_id(n) for n in ep.graph.nodes if n.op == "call_function")
    out = MixedSimulator(ep, prepared(ep, frozenset(), x, wd), prepared(ep, every, x, wd),
                         lambda s: C7xMMAQuantizer("int8", int16_layers=s, weight_dtype=wd))
    out.weight_dtype = wd
    return out


ALL = ("conv2d", "conv2d_1", "conv2d_2", "conv2d_3", "add", "conv2d_4", "conv2d_5", "linear")
ASSIGNMENTS = [(), ("conv2d_1",), ("conv2d_1", "conv2d_2"), ("conv2d_2", "conv2d_3", "add"),
               ("conv2d", "add", "conv2d_4"), ("conv2d_5", "linear"), ALL]


@pytest.mark.parametrize("int16", ASSIGNMENTS, ids=lambda s: "+".join(s) or "int8")
def test_simulation_matches_a_real_mixed_convert(ep, sim, int16):
    real = convert_pt2e(prepared(ep, frozenset(int16), calib_images(), sim.weight_dtype))
    test = calib_images(4, seed=7)
    with torch.no_grad():
        want = real(test)
    sim.select(int16)
    got = sim.run(test)
    scale = want.abs().max()
    assert torch.allclose(got, want, atol=1e-5 * scale, rtol=0), (got - want).abs().max()


def test_boundaries_follow_the_edge_rule(sim):
    table = sim.dtypes(frozenset({"conv2d_2", "conv2d_3"}))  # depthwise + project of features.1
    assert table[("hardtanh__2", "conv2d_3")] == ("int16",)        # between two int16 layers
    assert table[("hardtanh_", "conv2d_1")] == ("int8",)           # neither int16
    assert table[("hardtanh__1", "conv2d_2")] == ("int8", "int16")  # int8 requantized up
    assert table[("conv2d_3", "add")] == ("int16", "int8")         # int16 requantized down
    needs = sim.requirements(ALL)
    by_edge = {(sim.edges[k].producer, sim.edges[k].consumer): v for k, v in needs.items()}
    assert by_edge[("hardtanh__2", "conv2d_3")] == ("conv2d_2", "conv2d_3")
    assert by_edge[("x", "conv2d")] == ("conv2d",) and by_edge[("linear", "output")] == ("linear",)
    # the pool follows an int16 producer (quantizer: no requantize before an average pool)
    assert by_edge[("conv2d_5", "adaptive_avg_pool2d")] == ("conv2d_5",)
    assert sim.dtypes(frozenset({"conv2d_5"}))[("conv2d_5", "adaptive_avg_pool2d")] == ("int16",)
    weights = {e.consumer: k for k, e in enumerate(sim.edges) if e.weight}
    assert sorted(weights) == ["conv2d", "conv2d_1", "conv2d_2", "conv2d_3", "conv2d_4", "conv2d_5", "linear"]
    if sim.weight_dtype == "int16":  # an int16 layer's weights are int16, an int8 layer's int8
        assert table[sim.edges[weights["conv2d_3"]].producer, "conv2d_3"] == ("int16",)
        assert table[sim.edges[weights["conv2d_1"]].producer, "conv2d_1"] == ("int8",)
        assert all(needs[k] == (c,) for c, k in weights.items())  # each layer's own candidate
    else:  # int8 weights everywhere: no weight is ever a candidate
        assert not set(weights.values()) & set(needs)


def test_forked_variants_equal_full_runs(sim):
    """run_variants (one pass, forks at each edge; in-place ReLU6 inside) equals a full run
    with that edge's steps set by hand."""
    x = calib_images(3, seed=3)
    sim.select(frozenset(ALL))
    variants = [(k, ("int8",)) for k in range(len(sim.edges))]
    base, outs = sim.run_variants(x, variants, lambda y: y.clone())
    assert torch.equal(base, sim.run(x))
    for k, out in enumerate(outs):
        mod = sim.edges[k].module
        saved = mod.steps
        mod.steps = (mod.qparams["int8"],)
        try:
            assert torch.equal(out, sim.run(x)), sim.edges[k]
        finally:
            mod.steps = saved


class Attention(nn.Module):
    """One attention head as vision transformers write it (tests/backend/test_softmax.py): in int8
    its softmax output has fixed qparams, in int16 the softmax stays float and the matmul observes
    that tensor: the same place, another kind of observer."""

    def __init__(self, dim: int = 8, sdpa: bool = False):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.sdpa = sdpa

    def forward(self, x):                      # x [N, tokens, dim]
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if self.sdpa:   # DINOv2's form: the quantizer decomposes it into new nodes before annotating
            return self.proj(F.scaled_dot_product_attention(q, k, v)) + x
        attn = torch.softmax(q @ k.transpose(-2, -1) * 0.35, dim=-1)
        return self.proj(attn @ v) + x


@pytest.mark.parametrize("sdpa", [False, True], ids=["matmuls", "sdpa"])
@pytest.mark.parametrize("int16", [(), ("linear",), ("linear_1", "add"), "all"], ids=str)
def test_attention_simulation_matches_a_real_mixed_convert(int16, sdpa):
    ep = torch.export.export(Attention(sdpa=sdpa).eval(), (torch.randn(2, 6, 8),),
                             dynamic_shapes=({0: Dim("batch", min=1, max=64)},))
    tag_program(ep)
    gen = torch.Generator().manual_seed(0)
    x, test = torch.randn(6, 6, 8, generator=gen), torch.randn(4, 6, 8, generator=gen)
    every = frozenset(mixed.layer_id(n) for n in ep.graph.nodes if n.op == "call_function")
    sim = MixedSimulator(ep, prepared(ep, frozenset(), x), prepared(ep, every, x),
                         lambda s: C7xMMAQuantizer("int8", int16_layers=s))
    chosen = every if int16 == "all" else frozenset(int16)
    real = convert_pt2e(prepared(ep, chosen, x))
    with torch.no_grad():
        want = real(test)
    sim.select(frozenset({"linear"}) if chosen == every else every)   # the scratch graph transformed twice
    sim.select(chosen)
    got = sim.run(test)
    assert torch.allclose(got, want, atol=1e-5 * want.abs().max(), rtol=0), (got - want).abs().max()


# ----------------------------------------------------------------------------- the stage

def entry(quantizer: str) -> str:
    """The tiny test project's int8 entry (tests/doitproj.py TINY) with a [quantizer] table."""
    from doitproj import TINY
    return TINY.format(dtype="int8", set="cal") + "[quantizer]\n" + quantizer + "\n"


def stage_setup(tmp_path, model: nn.Module, quantizer: str):
    from pipeline.stages.mixed_precision import mixed_precision_model
    (tmp_path / "models").mkdir(exist_ok=True)
    (tmp_path / "models" / "tiny_mixed.toml").write_text(entry(quantizer))
    spec = load_models(tmp_path / "models")[0]
    cal = tmp_path / "calib_data" / "cal"
    cal.mkdir(parents=True, exist_ok=True)
    for i in range(6):
        write_jpeg(cal / f"img_{i:02d}_{i}.jpg", seed=i)
    float_pt2 = tmp_path / "float.pt2"
    torchenv.save_program(export(model), float_pt2)

    def run(tag="a"):
        out, sel = tmp_path / f"mixed_{tag}.json", tmp_path / f"int16_{tag}.json"
        record = mixed_precision_model(spec, float_pt2, cal, out, sel)
        assert json.loads(out.read_text()) == record
        return record, sel.read_bytes()
    return spec, run


def test_auto_choice_picks_the_outlier_tensor_within_budget(tmp_path):
    spec, run = stage_setup(tmp_path, TinyNet(outlier=300.0),
                            'mixed_precision = "auto"\nint16_macs = 0.65\nint16_layers = ["features.0.*"]')
    record, selection = run("a")
    ids = {layer["module"]: layer["id"] for layer in record["layers"]}
    best = max(record["candidates"], key=lambda c: c["gain"])
    assert (best["producer"], best["consumer"]) == ("relu", ids["features.3"])  # the outlier tensor
    assert best["layers"] == sorted([ids["features.2.0"], ids["features.3"]])
    assert set(best["layers"]) <= set(record["chosen"])
    assert ids["features.0.0"] in record["chosen"]  # the manual pattern, counted in the budget
    assert record["method"] == "auto" and record["budget"] == 0.65
    assert record["int16_macs"] == sum(x["macs"] for x in record["layers"] if x["id"] in record["chosen"])
    assert record["int16_macs"] <= 0.65 * record["total_macs"]
    errors = record["errors"]
    assert errors["chosen"]["mse"] < min(errors["all_int8"]["mse"] / 3, 1.5 * errors["all_int16"]["mse"])
    for c in record["candidates"]:  # gains are measured: error minus the all-int16 error
        assert math.isclose(c["gain"], c["error"] - errors["all_int16"]["mse"], abs_tol=1e-7)
    sel = json.loads(selection)
    assert sel["layers"] == sorted(record["chosen"])
    assert sel["modules"] == [next(x["module"] for x in record["layers"] if x["id"] == i) for i in sel["layers"]]
    again, selection2 = run("b")
    assert selection2 == selection and again["candidates"] == record["candidates"]  # deterministic


def test_layer_cycles_are_estimated_and_int16_costs_more(ep):
    from pipeline.target import load_target

    layers = mixed.program_layers(ep.graph, load_target("am67a"))
    assert all(layer.cycles is not None and layer.cycles[1] > layer.cycles[0] > 0 for layer in layers)
    assert [layer.macs for layer in layers] == [layer.macs for layer in mixed.program_layers(ep.graph)]
    assert {"cycles_int8", "cycles_int16"} <= set(layers[0].to_dict())
    assert "cycles_int8" not in mixed.program_layers(ep.graph)[0].to_dict()  # MAC budget: file unchanged


def test_choose_within_a_budget_of_estimated_cycles(ep):
    from pipeline.target import load_target

    layers = mixed.program_layers(ep.graph, load_target("am67a"))
    ids = {layer.module: layer.id for layer in layers}
    a, c, add = ids["features.0.0"], ids["classifier.1"], ids["features.1"]
    cands = [mixed.TensorCandidate("p", "q", (a,), 0.0, 1.0), mixed.TensorCandidate("q", "r", (c,), 0.0, 0.5),
             mixed.TensorCandidate("r", "s", (add,), 0.0, 0.4)]
    cost, total = mixed.costs(layers, "cycles")
    assert total == pytest.approx(sum(layer.cycles[0] for layer in layers))
    assert cost[add] > 0  # an add is free in MACs, not in cycles
    budget = (cost[a] + cost[c]) / total
    chosen = mixed.choose(cands, layers, budget, unit="cycles")
    assert mixed.cost_share(chosen, layers, "cycles") <= budget + 1e-12
    assert set(chosen) <= {a, c, add} and chosen  # within the cycles budget, best gain per cycle first
    assert mixed.choose(cands, layers, budget, unit="macs") != chosen or budget >= 1
    with pytest.raises(ValueError, match="over the int16_cycles budget"):
        mixed.choose(cands, layers, cost[a] / total / 2, fixed=[a], unit="cycles")
    with pytest.raises(ValueError, match="needs layers with estimated cycles"):
        mixed.costs(mixed.program_layers(ep.graph), "cycles")


def test_auto_choice_within_int16_cycles(tmp_path):
    spec, run = stage_setup(tmp_path, TinyNet(outlier=300.0), 'mixed_precision = "auto"\nint16_cycles = 0.55')
    record, _ = run("a")
    assert record["budget_unit"] == "cycles" and record["budget"] == 0.55 and record["target"] == "am67a"
    assert record["chosen"] and 0 < record["int16_cycles_share"] <= 0.55
    cycles = {x["id"]: x["cycles_int16"] for x in record["layers"]}
    total = sum(x["cycles_int8"] for x in record["layers"])
    assert record["int16_cycles_share"] == pytest.approx(sum(cycles[i] for i in record["chosen"]) / total, abs=1e-4)



def test_a_kept_sensitivity_pass_serves_another_budget_as_a_fresh_one_would(tmp_path):
    """The search's int16 budgets of one fold share one pass (``sensitivity``): the reused
    pass chooses what a fresh pass with that budget chooses; another recipe measures anew."""
    import dataclasses
    from pipeline.stages.mixed_precision import mixed_precision_model
    spec, _ = stage_setup(tmp_path, TinyNet(outlier=300.0), 'mixed_precision = "auto"\nint16_cycles = 0.2')
    float_pt2, cal, kept = tmp_path / "float.pt2", tmp_path / "calib_data" / "cal", tmp_path / "kept.json"

    def with_budget(s, budget, tag):
        s = dataclasses.replace(s, quantizer=dataclasses.replace(s.quantizer, int16_cycles=budget))
        return mixed_precision_model(s, float_pt2, cal, tmp_path / f"m_{tag}.json", tmp_path / f"s_{tag}.json",
                                     sensitivity=kept)

    first = with_budget(spec, 0.2, "first")
    assert kept.is_file() and first["errors"]["chosen"] and first["seconds_sensitivity"] > 0
    reused = with_budget(spec, 0.55, "reused")
    fresh = mixed_precision_model(dataclasses.replace(spec, quantizer=dataclasses.replace(
        spec.quantizer, int16_cycles=0.55)), float_pt2, cal, tmp_path / "m_fresh.json", tmp_path / "s_fresh.json")
    assert "chosen" not in reused["errors"] and reused["seconds_sensitivity"] == 0
    assert reused["candidates"] == fresh["candidates"] and reused["chosen"] == fresh["chosen"]
    assert len(reused["chosen"]) >= len(first["chosen"])
    # another recipe is another pass: measured, and kept in its place
    other = dataclasses.replace(spec, calibration=dataclasses.replace(spec.calibration, observer="minmax"))
    again = with_budget(other, 0.55, "other")
    assert again["errors"]["chosen"] and again["seconds_sensitivity"] > 0


@pytest.mark.parametrize("body, message", [
    ('mixed_precision = "auto"\nint16_cycles = 0.1\nint16_macs = 0.1', "set one budget"),
    ('int16_cycles = 0.1\nint16_layers = ["features.0.*"]', "int16_cycles is a budget of mixed_precision"),
    ('mixed_precision = "auto"\nint16_cycles = 1.5', r"int16_cycles must be in \(0, 1\]"),
])
def test_int16_cycles_entry_errors_are_one_line(tmp_path, body, message):
    (tmp_path / "m.toml").write_text('builder = "x.y:z"\ninput_shape = [1, 3, 224, 224]\n[quantizer]\n' + body + "\n")
    (entry,) = load_models(tmp_path)
    assert isinstance(entry.error, ConfigError) and "\n" not in str(entry.error)
    assert re.search(message, str(entry.error)), entry.error


def test_manual_patterns_over_budget_fail_in_one_line(tmp_path):
    spec, run = stage_setup(tmp_path, TinyNet(), 'mixed_precision = "auto"\nint16_macs = 0.05\n'
                                                 'int16_layers = ["features.0.0"]')
    with pytest.raises(ConfigError, match=r"tiny_mixed\.toml: the int16_layers patterns alone take") as err:
        run()
    assert "\n" not in str(err.value)


def test_manual_only_entry_writes_its_layers(tmp_path):
    spec, run = stage_setup(tmp_path, TinyNet(), 'int16_layers = ["features.1.conv.*", "features.1"]')
    record, selection = run()
    assert record["method"] == "manual" and record["candidates"] == []
    mods = json.loads(selection)["modules"]
    assert sorted(mods) == ["features.1", "features.1.conv.0", "features.1.conv.2.0", "features.1.conv.3"]
    assert record["errors"]["chosen"]["mse"] <= record["errors"]["all_int8"]["mse"]


def test_unknown_pattern_through_the_stage(tmp_path):
    spec, run = stage_setup(tmp_path, TinyNet(), 'int16_layers = ["feature.1.*"]')
    with pytest.raises(ConfigError, match=r"tiny_mixed\.toml: quantizer\.int16_layers pattern 'feature\.1\.\*'"):
        run()


# ----------------------------------------------------------------------------- MobileNetV2

@pytest.mark.slow
def test_mobilenet_v2_mixed_choice_and_simulation_fidelity(tmp_path):
    """MobileNetV2 with the recipe the search chooses for it, int16 layers within 10 % of
    the MACs (the shipped mixed entry before it stated a target), and a real
    prepare/calibrate/convert of the choice as close to float as the simulation said
    (measured with minmax and no method: simulated 0.298, real 0.304 logit MSE, all-int8
    0.826; with the default percentile observer: chosen 0.15, all-int8 0.26)."""
    from pathlib import Path

    from pipeline.data.images import load_images, select_images
    from pipeline.stages.calibrate import calibrate_model
    from pipeline.stages.convert import convert_model
    from pipeline.stages.export import export_model
    from pipeline.stages.mixed_precision import mixed_precision_model
    from pipeline.stages.prepare import prepare_model

    repo = Path(__file__).resolve().parents[2]
    cal = repo / "calib_data" / "imagenet20"
    if len(list(cal.glob("*.jpg"))) != 20:
        pytest.skip("calib_data/imagenet20 is not fetched: run `bash scripts/setup.sh` first")
    from pipeline.quant.search import apply
    base = next(s for s in load_models(repo / "models") if s.name == "mobilenet_v2")
    spec = apply(base, {"calibration": {"observer": "percentile", "range_search": "output", "adaround_iterations": 200},
                        "quantizer": {"symmetric_activations": False, "mixed_precision": "auto", "int16_macs": 0.10,
                                      "weight_dtype": "int16"}})
    f = {n: tmp_path / n for n in ("float.pt2", "mixed.json", "int16.json", "prepared.pt", "table.txt",
                                   "calibrated.pt", "calibration.json", "quantized.pt2")}
    export_model(spec, None, f["float.pt2"], repo)
    record = mixed_precision_model(spec, f["float.pt2"], cal, f["mixed.json"], f["int16.json"])
    assert record["num_images"] == 20  # its time is a benchmark figure (record["seconds"]), not a test
    assert record["layer_count"] == 63 and record["total_macs"] == 300_774_272
    assert 0.05 < record["int16_share"] <= 0.10
    errors = record["errors"]
    # measured with the entry's method (affine int8, output range search, exact requantize,
    # AdaRound) and int16 weights in the int16 layers: all-int8 0.089, chosen 0.055, all-int16
    # 0.00008 (with int8 weights there: 0.089, 0.077, 0.038; symmetric, no method: 0.26, 0.15,
    # 0.08). int16 weights take the int16 error to nothing, so the choice gains more.
    assert errors["all_int16"]["mse"] < errors["chosen"]["mse"] < 0.95 * errors["all_int8"]["mse"]

    prepare_model(spec, f["float.pt2"], f["prepared.pt"], f["table.txt"], f["int16.json"])
    x = load_images(select_images(cal, spec.calibration, spec.name), spec.preprocess, "images")
    with torch.no_grad():
        ref = torch.export.load(f["float.pt2"]).module()(x)

    def real_mse(s) -> float:
        calibrate_model(s, f["float.pt2"], f["prepared.pt"], f["table.txt"], cal, f["calibrated.pt"],
                        f["calibration.json"], f["int16.json"])
        convert_model(s, f["float.pt2"], f["calibrated.pt"], f["quantized.pt2"], f["int16.json"])
        with torch.no_grad():
            q = torch.export.load(f["quantized.pt2"]).module()
            return float(((torch.cat([q(x[i:i + 1]) for i in range(len(x))]) - ref) ** 2).mean())

    # the simulation models the entry's method (exact requantize + AdaRound, run on its
    # all-int8 model before the sensitivity pass: issue 30, item 3), approximately: the
    # method is tuned in the all-int8 model, the real build tunes it around its int16 layers.
    # Measured, same choice, simulated vs real: no method 0.0870 vs 0.0897, range search only
    # 0.0656 vs 0.0707, AdaRound only 0.0754 vs 0.0781, the entry's method 0.0551 vs 0.0648.
    assert record["method_simulated"]["adaround"] and record["method_simulated"]["exact_requantize"]
    mse = real_mse(spec)
    assert abs(mse - errors["chosen"]["mse"]) < 0.25 * errors["chosen"]["mse"], (mse, errors)
    # ... which improves on plain calibration for the same int16 choice
    plain = dataclasses.replace(spec, calibration=dataclasses.replace(
        spec.calibration, range_search=False, exact_requantize=False, adaround_iterations=0))
    assert mse < 0.85 * real_mse(plain)
