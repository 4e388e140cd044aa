"""Turn a trusted ultralytics checkpoint (``yolo26n.pt``) into a plain state dict.

Usage (once, on a checkpoint you trust)::

    python -m pipeline.tools.yolo_state_dict yolo26n.pt            # -> $TORCH_HOME/hub/checkpoints/yolo26n_state_dict.pt
    python -m pipeline.tools.yolo_state_dict yolo26n.pt -o my.pt   # anywhere (then set weights.path)

An ultralytics ``.pt`` is a pickle of whole Python objects (``{"model":
DetectionModel, "ema": ..., "train_args": ...}``); a full unpickle runs
whatever code the file names. Nothing here does one: :func:`load_checkpoint`
runs torch's weights-only unpickler with an explicit allow-list of the module
classes a YOLO26 checkpoint names (:data:`ALLOWED`: torch's layers and
ultralytics' blocks, classes whose construction runs no code of the file), so
a file naming anything else is refused before it is built. The export stage
loads the pinned checkpoint this way (``[weights] format = "ultralytics"``,
only when its sha256 is the pinned one); this command writes the float32
tensors alone (``{"model.0.conv.weight": Tensor, ...}``, ultralytics'
``DetectionModel`` keys) for a checkpoint of your own.
"""

from __future__ import annotations

import argparse
import importlib
import pickle
import re
import sys
from pathlib import Path

from ..errors import PipelineError, brief
from ..models.yolo import offline_ultralytics
from ..weights import torch_hub_checkpoints

#: the classes a YOLO26 detection or YOLO11 segmentation checkpoint may name (besides what
#: torch's weights-only unpickler always allows: tensors, storages, OrderedDict, set ...);
#: read with pickletools from ultralytics' yolo26n.pt and yolo11n-seg.pt
ALLOWED = (
    "torch.nn.modules.activation.SiLU", "torch.nn.modules.batchnorm.BatchNorm2d",
    "torch.nn.modules.container.ModuleList", "torch.nn.modules.container.Sequential",
    "torch.nn.modules.conv.Conv2d", "torch.nn.modules.conv.ConvTranspose2d", "torch.nn.modules.linear.Identity", "torch.nn.modules.pooling.MaxPool2d",
    "torch.nn.modules.upsampling.Upsample",
    "ultralytics.nn.modules.block.Attention", "ultralytics.nn.modules.block.Bottleneck",
    "ultralytics.nn.modules.block.C2PSA", "ultralytics.nn.modules.block.C3k", "ultralytics.nn.modules.block.C3k2",
    "ultralytics.nn.modules.block.DFL", "ultralytics.nn.modules.block.PSABlock", "ultralytics.nn.modules.block.Proto",
    "ultralytics.nn.modules.block.SPPF",
    "ultralytics.nn.modules.conv.Concat", "ultralytics.nn.modules.conv.Conv", "ultralytics.nn.modules.conv.DWConv",
    "ultralytics.nn.modules.head.Detect", "ultralytics.nn.modules.head.Segment",
    "ultralytics.nn.tasks.DetectionModel", "ultralytics.nn.tasks.SegmentationModel",
)


#: ``getattr`` calls a checkpoint may make: older ultralytics saved ``Segment.detect =
#: Detect.forward``, pickled as ``getattr(Detect, "forward")``. The builtin itself is never
#: allowed (getattr over ``__globals__`` reaches any module); :func:`_class_method` stands in.
ALLOWED_GETATTR = {("ultralytics.nn.modules.head.Detect", "forward")}


def _class_method(owner, name):
    """Stand-in for ``getattr`` in a checkpoint: only the pairs of :data:`ALLOWED_GETATTR`.
    Raises :class:`pickle.UnpicklingError` for any other."""
    where = f"{getattr(owner, '__module__', '?')}.{getattr(owner, '__qualname__', type(owner).__name__)}"
    if not isinstance(owner, type) or (where, name) not in ALLOWED_GETATTR:
        raise pickle.UnpicklingError(f"GLOBAL getattr({where}, {name!r})")
    return getattr(owner, name)


def _allowed_classes() -> list:
    offline_ultralytics()  # ultralytics imports offline (no settings file, no network)
    out: list = [(_class_method, "builtins.getattr")]
    for name in ALLOWED:
        module, _, attr = name.rpartition(".")
        out.append(getattr(importlib.import_module(module), attr))
    return out


def load_checkpoint(src: Path) -> dict:
    """``src`` (an ultralytics ``.pt``) -> its model's float32 state dict, by torch's
    weights-only unpickler limited to :data:`ALLOWED` (module docstring).

    Takes ``ckpt["ema"]`` when present (ultralytics saves its EMA weights there, the
    ones it evaluates), else ``ckpt["model"]``, else a bare module. Raises
    :class:`PipelineError` (one line) for a file that names a class outside the
    allow-list, is not a checkpoint, or holds no model."""
    import torch

    try:
        with torch.serialization.safe_globals(_allowed_classes()):
            ckpt = torch.load(src, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        glob = re.search(r"GLOBAL ([\w.]+(?:\(.*?\))?)", str(e))
        what = glob.group(1) if glob else brief(e)
        raise PipelineError(f"{src}: names {what}, which is not on the allow-list of YOLO module classes "
                            "(pipeline/tools/yolo_state_dict.py); refusing to unpickle it") from None
    except Exception as e:  # zip / EOF errors: not a checkpoint
        raise PipelineError(f"{src}: not a torch checkpoint ({brief(e)})") from None
    model = ckpt
    if isinstance(ckpt, dict):
        model = ckpt.get("ema") if ckpt.get("ema") is not None else ckpt.get("model")
    if not isinstance(model, torch.nn.Module):
        held = sorted(map(str, ckpt))[:8] if isinstance(ckpt, dict) else type(ckpt).__name__
        raise PipelineError(f"{src}: no ultralytics model in it (holds {held}); "
                            f"pass the .pt file ultralytics saved")
    return {k: v.float() if v.is_floating_point() else v for k, v in model.float().state_dict().items()}


def convert(src: Path, out: Path) -> int:
    """Save :func:`load_checkpoint` of ``src`` to ``out``; returns the number of tensors.
    Raises :class:`PipelineError` as :func:`load_checkpoint` does."""
    import torch

    state = load_checkpoint(src)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, out)
    return len(state)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m pipeline.tools.yolo_state_dict CHECKPOINT [-o OUT]``."""
    ap = argparse.ArgumentParser(prog="python -m pipeline.tools.yolo_state_dict", description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint", type=Path, help="ultralytics .pt file (read with an allow-list, never fully unpickled)")
    ap.add_argument("-o", "--out", type=Path, help="output file (default: $TORCH_HOME/hub/checkpoints/"
                                                   "<name>_state_dict.pt, where models/yolo26n.toml looks)")
    args = ap.parse_args(argv)
    out = args.out or torch_hub_checkpoints() / f"{args.checkpoint.stem}_state_dict.pt"
    try:
        n = convert(args.checkpoint, out)
    except (PipelineError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out} ({n} tensors); the yolo26n model entry finds it there")
    return 0


if __name__ == "__main__":
    sys.exit(main())
