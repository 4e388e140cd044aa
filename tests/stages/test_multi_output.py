"""A model with two outputs through every stage (issue 11).

``tinynets:two_head_cnn`` returns (logits, feature map): export, calibrate,
convert, import, codegen, host build, verify (the host C bit-exact with the
Python reference on the packed buffer of both outputs, every intermediate
tensor too), evaluate, holdout, profile, layers and visualize run as stage
functions, and the summary block reads the results. Accuracy is on output 0,
which each report says in one line. ``tinynets:shared_head_cnn`` (its logits
are also the softmax head's input) goes through verify (slow: 15 s more).
"""

from __future__ import annotations

import json

import pytest
import torch

from doitproj import TINY, Project, build_through

from pipeline.errors import UnsupportedOpError
from pipeline.data.torch_outputs import model_outputs, single_output
from pipeline.stages.summary import model_lines
from pipeline.visualize.graph import build_graph

NOTE = "model has 2 outputs; accuracy is on output 0, bit-exactness on all"


def _project(root, builder: str, last: str):
    p = Project(root)
    p.add_images("setA", 4)
    (p.root / "models" / "two.toml").write_text(TINY.format(dtype="int8", set="setA")
                                                .replace("tinynets:small_cnn", f"tinynets:{builder}"))
    return build_through(p.root, last=last)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    ctx = _project(tmp_path_factory.mktemp("multi"), "two_head_cnn", "visualize")
    return ctx, ctx.layout.verify.parent


def load(folder, name):
    return json.loads((folder / name).read_text())


def test_verify_is_bit_exact_on_both_outputs(built):
    _, art = built
    v = load(art, "verify.json")
    assert v["notes"] == [NOTE] and v["summary_lines"][-1] == NOTE
    for r in v["variants"]:
        ref = r["vs_python_reference"]
        assert ref["bit_exact_images"] == r["images"] == 4 and ref["intermediates"]["all_equal"]
        assert [(o["index"], o["shape"], o["bit_exact_images"]) for o in r["outputs"]] == \
            [(0, [1, 10], 4), (1, [1, 16, 16, 16], 4)]
        # each output against its own Q/DQ twin, at its own scale: a few steps at most
        assert all(o["vs_pytorch_qdq"]["unit"] == "lsb" and o["vs_pytorch_qdq"]["max_lsb"] <= 4 for o in r["outputs"])
        assert r["vs_pytorch_qdq"]["top1_agreement"] == 4  # output 0, the logits


def test_reports_score_output_0_and_say_so(built):
    _, art = built
    report = load(art, "report.json")
    assert NOTE in report["notes"] and report["labeled"] == 4
    assert [o["shape"] for o in report["outputs"]] == [[1, 10], [1, 16, 16, 16]]
    holdout = load(art, "holdout.json")
    assert holdout["method"] == "k-fold" and holdout["note"] == NOTE and "top1" in holdout["c"]


def test_manifest_and_page_name_both_outputs(built):
    ctx, art = built
    manifest = load(ctx.layout.codegen_dir("mmalib"), "manifest.json")
    writers = {c["output"]: c for c in manifest["calls"] if c["output"].startswith("output")}
    assert set(writers) == {"output0", "output1"}
    assert writers["output0"]["shape"] == [1, 10] and writers["output1"]["shape"] == [1, 16, 16, 16]
    graph = build_graph(manifest)
    outs = [n for n in graph["nodes"] if n["kind"] == "io" and n["id"] != "input"]
    assert [(n["id"], n["label"]) for n in outs] == [("output0", ["output 0", "1x10"]),
                                                      ("output1", ["output 1", "1x16x16x16"])]
    assert {e["to"] for e in graph["edges"]} >= {"output0", "output1"}
    assert (art / "offload.html").is_file()


def test_profile_and_layers_cover_every_call_and_layer(built):
    ctx, art = built
    manifest = load(ctx.layout.codegen_dir("mmalib"), "manifest.json")
    profile = load(art, "profile.json")
    assert len(profile["variants"]["mmalib"]["calls"]) == len(manifest["calls"])
    layers = {lay["id"]: lay for lay in load(art, "layers.json")["layers"]}
    # the conv whose output is output 1 and the classifier of output 0 are both compared
    assert all(lay["c_vs_qdq"] is not None for lay in layers.values()), layers


def test_summary_block_says_all_outputs_are_bit_exact(built):
    _, art = built
    lines = model_lines("two", load(art, "report.json"), load(art, "verify.json"),
                        {v: load(art / "c" / v, "manifest.json") for v in ("mmalib", "scalar")},
                        load(art, "layers.json"), load(art, "holdout.json"))
    text = "\n".join(lines)
    assert f"note           {NOTE}" in text
    assert "bit-exact      host C == Python integer reference on every image (all 2 outputs): mmalib 4/4" in text
    # the distance to Q/DQ in LSB and, in brackets, in logits (verify.json's max_abs / mean_abs)
    pt = next(r for r in load(art, "verify.json")["variants"] if r["variant"] == "mmalib")["vs_pytorch_qdq"]
    assert (f"vs Q/DQ        (in int8 LSB, and in logits) mmalib max {pt['max_lsb']:g} ({pt['max_abs']:.3g}), "
            f"mean {pt['mean_lsb']:.2f} ({pt['mean_abs']:.3g})") in text


# 15 s more; its C (an output read back by a later kernel) is proven in the default
# run by tests/backend/test_multi_output_codegen.py ("softmax")
@pytest.mark.slow
def test_an_output_read_by_the_other_head_verifies(tmp_path):
    ctx = _project(tmp_path, "shared_head_cnn", "verify")
    v = json.loads(ctx.layout.verify.read_text())
    assert all(r["vs_python_reference"]["bit_exact_images"] == 4 for r in v["variants"])
    assert [o["shape"] for o in v["variants"][0]["outputs"]] == [[1, 10], [1, 10]]


def test_model_outputs_take_tensors_and_flat_tuples_only():
    a, b = torch.zeros(1, 2), torch.ones(1, 3)
    assert model_outputs(a, "m") == [a] and model_outputs((a, b), "m") == [a, b]
    assert single_output((a, b), "m") is a
    with pytest.raises(UnsupportedOpError, match="model 'm' returns tuple of .*flat tuple of tensors"):
        model_outputs((a, (b,)), "m")
