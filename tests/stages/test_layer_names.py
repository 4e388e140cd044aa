"""Layers carry the names users recognise (issue 9, item 1): the PyTorch
module path and source line of every manifest layer come from torch.export's
node metadata, through PT2E and the Relax import, and every kernel call of
the generated C is tied to one layer id.

A tiny net goes through the stage functions (no doit); MobileNetV2's names
are checked against torchvision in ``test_e2e_mobilenet.py``.
"""

from __future__ import annotations

import json

import pytest
import torch.nn as nn

from doitproj import Project, build_through
from tinynets import SmallCNN



@pytest.fixture(scope="module", params=["int8", "int16"])
def built(request, tmp_path_factory):
    p = Project(tmp_path_factory.mktemp(f"names_{request.param}"))
    p.add_images("setA", 2)
    p.add_model("tiny", "setA", dtype=request.param)
    return build_through(p.root)


def manifests(ctx):
    return {v: json.loads((ctx.layout.codegen_dir(v) / "manifest.json").read_text()) for v in ("mmalib", "scalar")}


def test_every_layer_names_its_pytorch_module_and_source(built):
    modules = dict(SmallCNN().named_modules())
    for variant, m in manifests(built).items():
        for layer in m["layers"]:
            assert layer["module"] in modules, (variant, layer)
            assert layer["source"] and layer["source"].split(":")[-1].isdigit(), layer
        kinds = {lay["module"]: lay["module_type"] for lay in m["layers"]}
        assert kinds["stem.0"] == "torch.nn.modules.conv.Conv2d"
        assert kinds["fc"] == "torch.nn.modules.linear.Linear"
        assert {lay["op"] for lay in m["layers"] if lay["module"] == "dw.0"} == {"depthwise_conv2d"}
        assert isinstance(modules["fc"], nn.Linear)


def test_layer_ids_are_unique_and_shared_by_both_builds(built):
    m = manifests(built)
    ids = {v: [lay["id"] for lay in man["layers"]] for v, man in m.items()}
    for v in ids:
        assert len(ids[v]) == len(set(ids[v])), v
    assert ids["mmalib"] == ids["scalar"]


def test_every_call_belongs_to_a_layer_and_the_calls_form_a_dataflow_graph(built):
    for variant, m in manifests(built).items():
        calls, ids = m["calls"], {lay["id"] for lay in m["layers"]}
        assert calls[0]["inputs"] == ["input"] and calls[-1]["output"] == "output"
        first = next(i for i, c in enumerate(calls) if c["layer"] is not None)
        assert all(c["layer"] in ids for c in calls[first:]), variant
        assert {c["layer"] for c in calls} >= ids, variant  # every layer runs somewhere
        made = {"input"}
        for c in calls:
            assert set(c["inputs"]) <= made, (variant, c)  # read only what ran before
            made.add(c["output"])
        offloaded = {lay["id"] for lay in m["layers"] if lay["backend"] != "scalar"}
        assert offloaded <= {c["layer"] for c in calls if c["backend"] in ("mmalib", "c7x")}
