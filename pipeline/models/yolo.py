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


#: mask candidates the segmentation export keeps (ultralytics' ``max_det`` is 300; masks
#: cost K x 32 x (imgsz/4)^2 MACs, so fewer rows are kept than in the detector)
SEG_MAX_DET = 100


def yolo11n_seg(num_classes: int = 80, max_det: int = SEG_MAX_DET, imgsz: int = 320) -> torch.nn.Module:
    """YOLO11n-seg instance segmentation (ultralytics' ``yolo11n-seg.yaml``) in a ranked export form.

    Input: float32 NCHW ``[N, 3, imgsz, imgsz]`` RGB in [0, 1] (``imgsz`` a multiple of
    32). Outputs, a tuple:

    - detections float32 ``[N, max_det, 6]``: ``x1, y1, x2, y2`` (input pixels), ``score``
      (sigmoid class probability), ``class`` (index as float), ranked by score: the
      ``max_det`` anchors of best class score, one row each (ultralytics' ``Detect.postprocess``
      with ``agnostic_nms``; its predictor's ``multi_label=False``). YOLO11 is not NMS-free: class-aware NMS runs on the host
      in float (:mod:`pipeline.data.segmentation`), as ultralytics' ``non_max_suppression``.
    - mask logits float32 ``[N, max_det, imgsz/4, imgsz/4]``: each candidate's 32 mask
      coefficients times the 32 prototypes (``Segment.proto``), the matmul ultralytics'
      ``process_mask`` does after NMS, done here in the graph so it runs on the MMA; a
      pixel is in the mask when its logit is > 0 (sigmoid > 0.5).

    The prototypes' 2x2 stride-2 ``ConvTranspose2d`` runs as a 1x1 conv to 4x the channels
    and a depth-to-space (:class:`PhaseConvTranspose`, exact). Random init; the state dict
    keys are those of an ultralytics ``SegmentationModel``. Returns the module in eval mode.
    """
    if imgsz % 32:
        raise ValueError(f"yolo11n_seg: imgsz must be a multiple of 32 (the P5 stride), got {imgsz}")
    tasks = offline_ultralytics()
    model = tasks.SegmentationModel("yolo11n-seg.yaml", nc=num_classes, verbose=False)
    head = model.model[-1]
    head.export = True
    head.xyxy = True   # decode corners, as the ranked rows carry them
    head.max_det = max_det
    head.agnostic_nms = True   # rank anchors by their best class, one row each (predict's multi_label=False)
    head.proto.upsample = PhaseConvTranspose(head.proto.upsample)
    head.dfl = LastAxisDFL(head.dfl)
    _fix_anchor_grid(head, imgsz)
    head.forward = types.MethodType(_ranked_segment_forward, head)
    return model.eval()


def _ranked_segment_forward(self, x):
    """``Segment.forward`` in export form, ranked (:func:`yolo11n_seg`): ``(detections, mask logits)``."""
    preds = self.forward_head(x, **self.one2many)
    proto = self.proto(x[0])                                    # [N, 32, H/4, W/4]
    rows = self.postprocess(self._inference(preds).permute(0, 2, 1))  # [N, K, 6 + 32]
    detections, coefficients = rows.split([6, self.nm], dim=-1)
    n, nm, h, w = proto.shape
    masks = torch.matmul(coefficients, proto.reshape(n, nm, h * w))  # [N, K, H*W]
    return detections, masks.reshape(n, -1, h, w)


class LastAxisDFL(torch.nn.Module):
    """Ultralytics' ``DFL`` (distribution focal loss decode: the expected bin of a softmax over
    ``c1`` bins per box side) with the softmax over the last axis.

    ``DFL.forward`` softmaxes axis 1 of ``[b, c1, 4, a]`` then sums with weights 0..c1-1 by a
    1x1 conv; here the bins are moved last (a permute), softmaxed there and weighted by a
    linear: the same numbers, but a softmax over the last axis is an offloaded kernel where
    the other stays a scalar loop (14% of YOLO11n-seg's estimated cycles). Keeps ``conv`` as
    its state (ultralytics' key ``dfl.conv.weight``). Input float32 ``[b, 4 * c1, a]``; output
    ``[b, 4, a]`` (distances in grid cells)."""

    def __init__(self, dfl: torch.nn.Module):
        super().__init__()
        self.conv, self.c1 = dfl.conv, dfl.c1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, a = x.shape
        bins = x.view(b, 4, self.c1, a).permute(0, 1, 3, 2).softmax(-1)       # [b, 4, a, c1]
        return torch.nn.functional.linear(bins, self.conv.weight.view(1, self.c1)).view(b, 4, a)


class PhaseConvTranspose(torch.nn.Module):
    """A ``ConvTranspose2d(c, c_out, 2, stride=2)`` as a 1x1 conv and a depth-to-space.

    Output pixel ``(2h + i, 2w + j)`` of a 2x2 stride-2 transposed conv is
    ``W[:, :, i, j]^T x[h, w] + b`` (PyTorch's ConvTranspose2d definition), so one 1x1 conv
    with ``4 c_out`` filters ordered ``(c_out, i, j)`` computes all four phases and a
    reshape / permute interleaves them: exact, and both parts are offloaded kernels (conv,
    permute). Keeps the transposed conv's ``weight`` [c, c_out, 2, 2] and ``bias`` [c_out] as
    its state (ultralytics' keys); the 1x1 filters are derived buffers, refreshed on load.
    Input float32 NCHW ``[N, c, H, W]``; output ``[N, c_out, 2H, 2W]``.
    """

    def __init__(self, deconv: torch.nn.ConvTranspose2d):
        super().__init__()
        if (tuple(deconv.kernel_size), tuple(deconv.stride), tuple(deconv.padding)) != ((2, 2), (2, 2), (0, 0)):
            raise ValueError(f"PhaseConvTranspose: a 2x2 stride-2 unpadded ConvTranspose2d only, got {deconv}")
        self.weight = deconv.weight
        self.bias = deconv.bias if deconv.bias is not None else torch.nn.Parameter(torch.zeros(deconv.out_channels))
        self.register_buffer("phase_weight", torch.empty(0), persistent=False)
        self.register_buffer("phase_bias", torch.empty(0), persistent=False)
        self.refresh()
        self.register_load_state_dict_post_hook(lambda module, _: module.refresh())

    @torch.no_grad()
    def refresh(self) -> None:
        """Recompute the 1x1 filters [4 c_out, c, 1, 1] and bias [4 c_out] from ``weight``, ``bias``."""
        c_in, c_out = self.weight.shape[:2]
        self.phase_weight = self.weight.detach().permute(1, 2, 3, 0).reshape(4 * c_out, c_in, 1, 1).clone(
            memory_format=torch.contiguous_format)   # a plain layout: torch.export saves it whole
        self.phase_bias = self.bias.detach().repeat_interleave(4).clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        y = torch.nn.functional.conv2d(x, self.phase_weight, self.phase_bias)   # [N, 4 c_out, H, W]
        y = y.reshape(n, -1, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3)             # [N, c_out, H, 2, W, 2]
        return y.reshape(n, -1, 2 * h, 2 * w)
