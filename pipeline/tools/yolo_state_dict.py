"""Turn a trusted ultralytics checkpoint (``yolo26n.pt``) into a plain state dict.

Usage (once, on a checkpoint you trust)::

    python -m pipeline.tools.yolo_state_dict yolo26n.pt            # -> $TORCH_HOME/hub/checkpoints/yolo26n_state_dict.pt
    python -m pipeline.tools.yolo_state_dict yolo26n.pt -o my.pt   # anywhere (then set weights.path)

An ultralytics ``.pt`` is a pickle of whole Python objects (``{"model":
DetectionModel, "ema": ..., "train_args": ...}``): loading it runs arbitrary
code from the file, so the pipeline never does (the export stage loads only
``torch.load(weights_only=True)`` state dicts). This tool is the one place
that unpickles, on the user's explicit request, and writes the float32
tensors alone (``{"model.0.conv.weight": Tensor, ...}``, ultralytics'
``DetectionModel`` keys), which the export stage then loads safely.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import PipelineError
from ..models.yolo import offline_ultralytics
from ..weights import torch_hub_checkpoints


def convert(src: Path, out: Path) -> int:
    """Unpickle the trusted checkpoint ``src`` and save its model's float32 state dict to ``out``.

    Takes ``ckpt["ema"]`` when present (ultralytics saves its EMA weights
    there, the ones it evaluates), else ``ckpt["model"]``, else a bare module.
    Returns the number of tensors written. Raises :class:`PipelineError` (one
    line) when ``src`` holds no ultralytics model.
    """
    import torch
    offline_ultralytics()  # the pickle names ultralytics classes; import them offline
    ckpt = torch.load(src, map_location="cpu", weights_only=False)  # trusted by the user: see module doc
    model = ckpt
    if isinstance(ckpt, dict):
        model = ckpt.get("ema") if ckpt.get("ema") is not None else ckpt.get("model")
    if not isinstance(model, torch.nn.Module):
        held = sorted(map(str, ckpt))[:8] if isinstance(ckpt, dict) else type(ckpt).__name__
        raise PipelineError(f"{src}: no ultralytics model in it (holds {held}); "
                            f"pass the .pt file ultralytics saved")
    state = {k: v.float() if v.is_floating_point() else v for k, v in model.float().state_dict().items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, out)
    return len(state)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m pipeline.tools.yolo_state_dict CHECKPOINT [-o OUT]``."""
    ap = argparse.ArgumentParser(prog="python -m pipeline.tools.yolo_state_dict", description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint", type=Path, help="ultralytics .pt file you trust (it is unpickled)")
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
