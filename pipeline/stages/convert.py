"""Stage ``convert``: calibrated observers -> Q/DQ ExportedProgram (``quantized.pt2``)."""

from __future__ import annotations

from pathlib import Path

import torch

from .. import torchenv
from ..config import ModelSpec
from ..quant.program import load_converted, read_int16_selection
from ..quant.search import resolved


def convert_model(spec: ModelSpec, float_pt2: Path, calibrated_state: Path, out: Path,
                  int16_selection: Path | None = None, recipe: Path | None = None) -> None:
    """Convert and re-export with the static batch-1 input of ``spec.input_shape``."""
    spec = resolved(spec, recipe)   # [quantizer] target: the recipe the search chose
    q = load_converted(spec, float_pt2, calibrated_state, read_int16_selection(int16_selection))
    example = torch.zeros(*spec.input_shape)
    ep = torch.export.export(q, (example,))
    torchenv.save_program(ep, out)
