"""yolo26n_random end to end through doit, as a user runs it on a fresh clone:
``doit verify:yolo26n_random`` exports, quantizes, generates and builds the C,
verifies it bit-exact and draws the detections; its offload page and held-out
numbers are built too (issue 11). Slow: ~6 minutes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from doitproj import Project

REPO = Path(__file__).resolve().parents[2]
N_IMAGES = 3


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    p = Project(tmp_path_factory.mktemp("yolo"))
    for name in ("yolo26n", "yolo26n_random"):  # the shipped entries, unchanged
        shutil.copy(REPO / "models" / f"{name}.toml", p.root / "models")
    images = p.root / "calib_data" / "imagenet20"
    images.mkdir(parents=True)
    for f in sorted((REPO / "calib_data" / "imagenet20").glob("*.jpg"))[:N_IMAGES]:
        shutil.copy(f, images)
    run = p.doit("verify:yolo26n_random", "visualize:yolo26n_random", "holdout:yolo26n_random", timeout=2400)
    assert run.returncode == 0, run.out[-3000:]
    return p


@pytest.mark.slow
def test_verify_is_bit_exact_on_every_build(built):
    v = json.loads((built.root / "artifacts" / "yolo26n_random" / "verify.json").read_text())
    assert [r["variant"] for r in v["variants"]] == ["mmalib", "scalar"]
    for r in v["variants"]:
        assert r["vs_python_reference"]["bit_exact_images"] == N_IMAGES
        assert r["vs_python_reference"]["max_lsb"] == 0
        det = r["vs_pytorch_qdq"]["detections"]["top"]
        # the first 100 rows less the tie group at the cut: BatchNorm re-estimated, scores vary
        assert N_IMAGES * 50 <= det["reference_detections"] <= N_IMAGES * 100
        assert 0 < det["matched"] <= det["reference_detections"]
    assert "detections vs PyTorch Q/DQ: matched" in v["summary_lines"][0]


@pytest.mark.slow
def test_detection_pictures_and_their_index(built):
    from torchvision.io import decode_jpeg, read_file
    d = built.root / "artifacts" / "yolo26n_random" / "detections"
    pictures = sorted(d.glob("*.jpg"))
    assert len(pictures) == N_IMAGES * 4  # float, qdq, c_mmalib, c_scalar
    img = decode_jpeg(read_file(str(pictures[0])))
    assert tuple(img.shape) == (3, 320, 320)
    index = (d / "index.html").read_text()
    assert all(f'src="{p.name}"' in index for p in pictures)


@pytest.mark.slow
def test_mmalib_runs_at_least_95_percent_of_the_macs_and_the_head_stays_float(built):
    m = json.loads((built.root / "artifacts" / "yolo26n_random" / "c" / "mmalib" / "manifest.json").read_text())
    s = m["summary"]
    assert s["by_backend"]["mmalib"]["macs"] / s["macs_total"] >= 0.95
    head = [layer for layer in m["layers"] if layer["op"] in ("topk", "gather_elements")]
    assert len(head) == 6 and all(layer["backend"] == "scalar" and layer.get("reason") for layer in head)


@pytest.mark.slow
def test_offload_page_holdout_and_summary_of_the_detection_model(built):
    art = built.root / "artifacts" / "yolo26n_random"
    page = (art / "offload.html").read_text()
    assert 'href="detections/index.html"' in page and "topk" in page
    h = json.loads((art / "holdout.json").read_text())
    assert h["method"] == "k-fold" and h["images"] == N_IMAGES
    for side in (h["qdq"], h["c"]):
        top = side["detections_vs_float"]["top"]
        assert top["reference_detections"] > 0 and 0 <= top["matched"] <= top["reference_detections"]
    bn = json.loads((art / "export.json").read_text())["batchnorm_reestimated_on"]
    assert bn["set"] == "imagenet20" and bn["images"] == N_IMAGES and bn["batchnorm_layers"] > 50


@pytest.mark.slow
def test_random_variant_is_named_only(built):
    run = built.doit("list", "--all")
    line = next(ln for ln in run.out.splitlines() if ln.startswith("verify:yolo26n_random "))
    assert "not in the default run" in line
    skipped = next(ln for ln in run.out.splitlines() if ln.startswith("export:yolo26n "))
    assert skipped  # (skipped only when no yolo26n_state_dict.pt is in $TORCH_HOME)



@pytest.mark.slow
def test_predict_prints_and_draws_the_detections_of_the_deployed_c(built):
    """``python -m pipeline.predict`` on a detector: per image, COCO-named detections with
    score and box (or "no detection": random weights may score nothing >= 0.25), and a
    JPEG with the boxes drawn."""
    import os
    import re
    import subprocess
    import sys

    image = sorted((built.root / "calib_data" / "imagenet20").glob("*.jpg"))[0]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(built.root), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "pipeline.predict", "yolo26n_random", str(image),
                           "--save", str(built.root / "shown")], cwd=built.root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("yolo26n_random [mmalib]: 1 image(s)") and lines[1] == f"{image}:"
    rows = lines[2:-1]
    from torchvision.io import decode_image
    size = decode_image(str(image)).shape[1:]
    assert rows == ["  no detection"] or all(
        re.fullmatch(rf"  [a-z ]+ [01]\.\d\d box \[\d+, \d+, \d+, \d+\] \(x1, y1, x2, y2 in pixels of the "
                     rf"{size[1]}x{size[0]} image\)", r) for r in rows), rows
    shown = built.root / "shown" / f"{image.stem}.jpg"
    assert shown.read_bytes()[:3] == b"\xff\xd8\xff"
    assert decode_image(str(shown)).shape[1:] == size   # drawn on the photo at its own size
