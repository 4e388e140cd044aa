"""YOLO26 builders: ultralytics' architecture, built offline from its bundled YAML.

``builder = "pipeline.models.yolo:yolo26n"`` in a model entry. The architecture
comes from ultralytics' ``yolo26n.yaml`` (shipped inside the pinned ultralytics
wheel); nothing is downloaded. Weights are loaded by the export stage from a
plain state dict (``torch.load(weights_only=True)``); an ultralytics ``.pt``
checkpoint is a pickle of whole objects and is converted once with
``python -m pipeline.tools.yolo_state_dict`` (:mod:`pipeline.tools.yolo_state_dict`).
"""

from __future__ import annotations

import os
import types

import torch

#: ultralytics' default ``max_det`` (``Detect.max_det``): rows of the end-to-end output.
MAX_DET = 300


def offline_ultralytics():
    """Import ultralytics with its network probe off.

    ``ultralytics.utils`` resolves ``ONLINE = is_online()`` at import (a DNS
    lookup) unless ``YOLO_OFFLINE`` is set (``ultralytics/utils/__init__.py``,
    ``is_online``); we set it first, so importing never touches the network.
    Returns the ``ultralytics.nn.tasks`` module.
    """
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics.nn import tasks
    return tasks


def yolo26n(num_classes: int = 80, max_det: int = MAX_DET, imgsz: int = 320) -> torch.nn.Module:
    """YOLO26n detection model in its end-to-end (NMS-free, one-to-one head) export form.

    Input: float32 NCHW ``[N, 3, imgsz, imgsz]`` RGB in [0, 1] (``imgsz`` a
    multiple of 32). Output: float32 ``[N, max_det, 6]``, one row per
    detection, ranked by score: ``x1, y1, x2, y2`` (input pixels), ``score``
    (sigmoid class probability), ``class`` (index as float). This is
    ultralytics' ``Detect`` head with ``end2end = True`` and ``export = True``
    (``Detect.forward`` -> ``postprocess``: topk over anchors, gather, topk
    over anchor x class). Random init (ultralytics' ``initialize_weights``,
    seeded by the caller); the state dict keys are those of an ultralytics
    ``DetectionModel`` (``model.0.conv.weight`` ...). Returns the module in
    eval mode.
    """
    if imgsz % 32:
        raise ValueError(f"yolo26n: imgsz must be a multiple of 32 (the P5 stride), got {imgsz}")
    tasks = offline_ultralytics()
    model = tasks.DetectionModel("yolo26n.yaml", nc=num_classes, verbose=False)
    head = model.model[-1]
    head.end2end = True  # the one-to-one head; the one-to-many branch is dead code in export
    head.export = True   # forward returns the detections alone, not (detections, raw dict)
    head.max_det = max_det
    _fix_anchor_grid(head, imgsz)
    return model.eval()


def _fix_anchor_grid(head: torch.nn.Module, imgsz: int) -> None:
    """Give ``head`` the anchor grid of an ``imgsz`` input as non-persistent buffers.

    Ultralytics rebuilds the grid in every call with ``arange`` / ``item()`` on
    its stride tensor, or caches it keyed on the batch shape, which
    ``torch.export`` specialises; a constant grid exports as two float
    constants: anchors ``[2, A]`` (cell centres, grid units) and strides
    ``[1, A]`` (pixels), A = sum of (imgsz / stride)^2 over the three levels.
    Non-persistent: the state dict keeps ultralytics' keys.
    """
    from ultralytics.utils.tal import make_anchors
    feats = [torch.empty(1, 1, imgsz // int(s), imgsz // int(s)) for s in head.stride.tolist()]
    anchors, strides = (a.transpose(0, 1) for a in make_anchors(feats, head.stride, 0.5))
    head.register_buffer("grid_anchors", anchors.contiguous(), persistent=False)
    head.register_buffer("grid_strides", strides.contiguous(), persistent=False)

    def decode(self, x):  # Detect._get_decode_boxes with the fixed grid
        boxes = self.decode_bboxes(self.dfl(x["boxes"]), self.grid_anchors.unsqueeze(0))
        return boxes * self.grid_strides

    head._get_decode_boxes = types.MethodType(decode, head)
