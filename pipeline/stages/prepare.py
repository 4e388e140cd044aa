"""Stage ``prepare``: float program + quantizer options -> prepared model state.

The prepared weights and the observer table identify the prepared model
(:mod:`pipeline.quant.program`, which later stages use to rebuild it).
"""

from __future__ import annotations

from pathlib import Path

from .. import torchenv
from ..config import ModelSpec
from ..fsutil import write_text
from ..quant.program import build_prepared, observer_table, read_int16_selection, split_state
from ..quant.search import resolved


def prepare_model(spec: ModelSpec, float_pt2: Path, out_state: Path, out_table: Path,
                  int16_selection: Path | None = None, recipe: Path | None = None) -> None:
    """Write the prepared weights (``torch.save`` of a tensor dict) and the observer table.

    ``int16_selection``: ``int16_layers.json`` of a mixed-precision model."""
    spec = resolved(spec, recipe)   # [quantizer] target: the recipe the search chose
    gm = build_prepared(spec, float_pt2, observer="minmax", int16_layers=read_int16_selection(int16_selection),
                        bias_slots=False)
    weights, _ = split_state(gm)
    torchenv.save_tensors(weights, out_state)
    write_text(out_table, observer_table(gm))
