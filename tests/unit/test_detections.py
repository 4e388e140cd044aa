"""Detections: tie-order-independent selection, matching, BatchNorm re-estimation of a random
network, and the reports of a detection model (issue 11)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.data import detections


def _rows(scores, classes=None):
    """[D, 6] detections, one distinct box per row, ranked by score."""
    d = len(scores)
    boxes = np.stack([np.arange(d) * 20.0, np.zeros(d), np.arange(d) * 20.0 + 10, np.full(d, 10.0)], 1)
    cls = np.zeros(d) if classes is None else np.asarray(classes, float)
    return np.concatenate([boxes, np.asarray(scores, float)[:, None], cls[:, None]], 1).astype(np.float32)


def test_a_tie_group_at_the_top_cut_is_dropped():
    det = _rows([0.9, 0.8, 0.5, 0.5, 0.5, 0.1])
    assert detections.select(det, conf=None, top=3)[:, 4].tolist() == pytest.approx([0.9, 0.8])
    assert detections.select(det, conf=None, top=2)[:, 4].tolist() == pytest.approx([0.9, 0.8])
    assert len(detections.select(det, conf=0.3)) == 5  # a threshold cut does not depend on the order


def test_the_last_rows_tie_group_is_dropped_when_the_output_is_full():
    det = _rows([0.9, 0.6, 0.6])  # the model's own top-3 may have cut a larger group of 0.6
    assert detections.select(det, conf=0.5)[:, 4].tolist() == pytest.approx([0.9])
    assert len(detections.select(_rows([0.9, 0.6, 0.2]), conf=0.5)) == 2


def test_two_tie_orders_of_one_output_match_completely():
    """What torch's and our C's top-k do differently: the same scores, ties in another order."""
    rng = np.random.default_rng(0)
    scores = np.sort(rng.choice([0.9, 0.7, 0.4, 0.3], size=40))[::-1]
    a = _rows(scores)
    b = a.copy()
    for s in np.unique(scores):  # reverse every tie group
        idx = np.flatnonzero(scores == s)
        b[idx] = a[idx[::-1]]
    for conf, top in ((0.25, None), (None, 20)):
        r = detections.compare(a[None], b[None], conf=conf, top=top)
        assert r["reference_detections"] > 0 and r["matched_fraction"] == 1.0
    # without the rule the first 20 rows of the two orders differ
    assert not np.array_equal(a[:20], b[:20])


def test_reestimated_batchnorm_gives_normalised_activations():
    from pipeline.models.random_weights import reestimate_batchnorm
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Dropout(0.5))
    x = torch.rand(16, 3, 12, 12) * 5 + 3  # two equal batches: the mean of the batch means is the mean
    assert reestimate_batchnorm(net, x) == 1
    assert not net.training and net[1].momentum == 0.1  # restored
    with torch.no_grad():
        y = net(x)
        again = net(x)
    assert torch.equal(y, again)  # eval mode: dropout off
    assert y.mean(dim=(0, 2, 3)).abs().max() < 1e-3 and (y.var(dim=(0, 2, 3)) - 1).abs().max() < 0.05
    with pytest.raises(ValueError, match="no images"):
        reestimate_batchnorm(net, x[:0])


def test_builder_versions_track_ultralytics_for_the_yolo_builder():
    from pipeline.stages.context import builder_versions
    import importlib.metadata
    assert builder_versions("pipeline.models.yolo:yolo26n") == {
        "ultralytics": importlib.metadata.version("ultralytics")}
    assert builder_versions("torchvision.models:mobilenet_v2") == {}  # tracked as a stage version
    assert builder_versions("mynets:tiny") == {}  # a project module: its source is a file_dep
    assert builder_versions("dask.array:ones") == {"dask": importlib.metadata.version("dask")}


def test_reestimate_batchnorm_needs_random_weights_and_images(tmp_path):
    from pipeline.entries import parse_model
    from pipeline.errors import ConfigError
    base = {"builder": "torchvision.models:resnet18", "input_shape": [1, 3, 224, 224]}
    spec = parse_model("r", tmp_path / "r.toml", {**base, "weights": {"pretrained": False,
                                                                      "reestimate_batchnorm": True}})
    assert spec.weights.reestimate_batchnorm
    with pytest.raises(ConfigError, match="reestimate_batchnorm needs 'pretrained = false'"):
        parse_model("r", tmp_path / "r.toml", {**base, "weights": {"file": "x.pth", "reestimate_batchnorm": True}})
    with pytest.raises(ConfigError, match="reestimate_batchnorm"):
        parse_model("r", tmp_path / "r.toml", {**base, "calibration": {"source": "random"},
                                               "weights": {"pretrained": False, "reestimate_batchnorm": True}})
    spec = parse_model("r", tmp_path / "r.toml", {**base, "weights": {"pretrained": False, "logit_std": 2,
                                                                      "batchnorm_batch": 0}})
    assert spec.weights.logit_std == 2.0 and spec.weights.batchnorm_batch == 0
    for weights, needle in (({"pretrained": False, "logit_std": -1}, "logit_std must be a positive number"),
                            ({"file": "x.pth", "logit_std": 2.0}, "logit_std needs 'pretrained = false'"),
                            ({"pretrained": False, "batchnorm_batch": -1}, "batchnorm_batch must be an integer >= 0")):
        with pytest.raises(ConfigError, match=needle):
            parse_model("r", tmp_path / "r.toml", {**base, "weights": weights})


def _dets(n_img=2, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_img):
        scores = np.sort(rng.uniform(0, 1, 12))[::-1]
        out.append(_rows(scores, classes=rng.integers(0, 3, 12)))
    return np.stack(out)


def test_summary_of_a_detection_model_reports_matched_detections_not_top1():
    from pipeline.stages.summary import model_lines
    ref, other = _dets(), _dets(seed=1)
    same, diff = detections.compare_all(ref, ref), detections.compare_all(ref, other)
    report = {"dtype": "int8", "weight_dtype": "int8", "images": 2, "evaluation_set": "imagenet20",
              "detections_qdq_vs_float": diff, "notes": ["NOT FOR DEPLOYMENT: random-init weights"]}
    verify = {"variants": [{"variant": "mmalib", "images": 2,
                            "vs_python_reference": {"bit_exact_images": 2},
                            "vs_pytorch_qdq": {"detections": same},
                            "accuracy": {"detections_vs_float": diff}}]}
    holdout = {"method": "k-fold", "folds": 2, "evaluation_set": "imagenet20",
               "qdq": {"detections_vs_float": diff}, "c": {"variant": "mmalib", "detections_vs_float": same}}
    text = "\n".join(model_lines("yolo", report, verify, {}, holdout=holdout))
    n_conf = same["confident"]["reference_detections"]
    assert "2 images, detection" in text and "top-1" not in text
    assert f"C mmalib {n_conf}/{n_conf} (1.00) score >= 0.25" in text  # C vs Q/DQ, and held-out C vs float
    assert "held-out       2-fold" in text and "in-sample" in text
    assert f"{diff['confident']['matched']}/{diff['confident']['reference_detections']}" in text
    assert "bit-exact      host C == Python integer reference on every image: mmalib 2/2" in text


def test_a_split_kernels_tensors_are_all_its_outputs_in_the_call_graph():
    """YOLO26's head splits one tensor in two with one TVM kernel: both are written by it."""
    from pipeline.backend.call_graph import _output_count
    from pipeline.backend.memory_plan import Tensor
    from pipeline.visualize.graph import build_graph
    t = {n: Tensor(n, (1, 4), "float32", "arena", 0) for n in ("t0", "t1", "t2")}
    w = Tensor("w0", (4,), "int8", "weight", 0)
    name = lambda a: a.name  # noqa: E731
    assert _output_count([t["t0"], t["t1"], t["t2"]], name, {"t0": 0}) == 2  # split(t0) -> t1, t2
    assert _output_count([t["t0"], w, t["t1"]], name, {"t0": 0}) == 1  # a weight is never an output
    assert _output_count([t["t1"], t["t2"]], name, {"t1": 0}) == 1
    manifest = {"layers": [], "calls": [
        {"index": 0, "func": "q", "backend": "tvm", "inputs": ["input"], "output": "t0", "shape": [1, 8]},
        {"index": 1, "func": "split", "backend": "tvm", "inputs": ["t0"], "output": "t2", "outputs": ["t1", "t2"],
         "shape": [1, 4]},
        {"index": 2, "func": "add", "backend": "tvm", "inputs": ["t1", "t2"], "output": "output", "shape": [1, 4]}]}
    g = build_graph(manifest)
    assert {(e["from"], e["to"], e["tensor"]) for e in g["edges"]} == {
        ("input", "c0", "input"), ("c0", "c1", "t0"), ("c1", "c2", "t1"), ("c1", "c2", "t2"),
        ("c2", "output", "output")}


def test_draw_labels_boxes_with_class_names_when_given(tmp_path, monkeypatch):
    import torch
    import torchvision.utils

    from pipeline.data import detections

    seen = []
    real = torchvision.utils.draw_bounding_boxes

    def spy(img, boxes, labels=None, **kw):
        seen.append(labels)
        return real(img, boxes, labels=labels, **kw)

    monkeypatch.setattr(torchvision.utils, "draw_bounding_boxes", spy)
    det = np.array([[2, 2, 20, 20, 0.9, 1], [5, 5, 9, 9, 0.5, 7], [0, 0, 1, 1, 0.1, 0]], np.float32)
    image = torch.rand(3, 32, 32)
    assert detections.draw(image, det, tmp_path / "a.jpg", names=["person", "bicycle"]) == 2
    assert detections.draw(image, det, tmp_path / "b.jpg") == 2
    assert seen == [["bicycle 0.90", "7:0.50"], ["1:0.90", "7:0.50"]]   # class 7 has no name in the list
    assert (tmp_path / "a.jpg").read_bytes()[:3] == b"\xff\xd8\xff"


def test_map50_is_one_for_float_against_itself_and_charges_a_false_positive():
    """mAP@0.5 against float's confident rows: 1.0 for float itself (its confident rows rank
    first); a confident detection float does not make, ranked above the true one, halves it
    (COCO's 101-point AP: precision 0.5 at recall 1)."""
    ref = _rows([0.9, 0.1])[None]  # one confident pseudo-label (score >= 0.25), one low row
    assert detections.map50(ref, ref) == pytest.approx(1.0)
    # (a last low row: a selection reaching the output's last row drops that row's tie group)
    fp_first = np.array([[60, 60, 70, 70, 0.95, 0], [0, 0, 10, 10, 0.8, 0], [90, 0, 99, 9, 0.01, 0]],
                        np.float32)[None]
    assert detections.map50(ref, fp_first) == pytest.approx(0.5)
    assert detections.map50(_rows([0.1, 0.05])[None], ref) is None  # no pseudo-label: undefined
    assert detections.compare_all(ref, fp_first)["map50"] == pytest.approx(0.5)


def test_per_image_rows_count_float_detections_and_each_builds_matches():
    ref = np.stack([_rows([0.9, 0.8, 0.7, 0.01]), _rows([0.1, 0.05, 0.02, 0.01])])
    half = ref.copy()
    half[0, 1, 5] = 2  # one detection of the first image changes class: not matched
    rows = detections.per_image(["a.jpg", "b.jpg"], {"qdq": detections.compare_all(ref, ref),
                                                     "c": detections.compare(ref, half)})
    assert rows[0] == {"image": "a.jpg", "float_detections": 3, "qdq_matched": 3, "qdq_fraction": 1.0,
                       "c_matched": 2, "c_fraction": pytest.approx(0.6667)}
    assert rows[1]["float_detections"] == 0 and rows[1]["c_fraction"] is None


def test_summary_gives_the_held_out_per_image_fractions_and_map():
    from pipeline.stages.summary import _matched, per_image_line
    rows = [{"image": "a.jpg", "float_detections": 5, "c_fraction": 0.8},
            {"image": "b.jpg", "float_detections": 1, "c_fraction": 0.0},
            {"image": "c.jpg", "float_detections": 0, "c_fraction": None}]
    line = per_image_line(rows, "c", "held-out C mmalib")
    assert "mean 0.40 over 2 images with float detections, lowest 0.00 (b.jpg, 1 detection)" in line
    assert "lowest with >= 3 detections 0.80; 1 below TI's 0.40 bar" in line
    assert per_image_line(rows[2:], "c", "x") is None
    ref = _rows([0.9, 0.8])[None]
    assert _matched(detections.compare_all(ref, ref)).endswith("mAP@0.5 1.00")


def test_coco80_names_are_yolos_class_order():
    names = detections.coco80()
    assert len(names) == 80 and names[:3] == ["person", "bicycle", "car"] and names[79] == "toothbrush"
