"""Stage ``convert``: calibrated observers -> Q/DQ ExportedProgram (``quantized.pt2``)."""

from __future__ import annotations

from pathlib import Path

from .. import torchenv
from ..config import ModelSpec
from .prepare import build_prepared, read_int16_selection

import torch  # noqa: E402
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e  # noqa: E402


def load_converted(spec: ModelSpec, float_pt2: "Path | torch.export.ExportedProgram",
                   calibrated_state: Path, int16_layers=frozenset()) -> torch.fx.GraphModule:
    """Rebuild the prepared model, load the calibrated observers, ``convert_pt2e``.

    The result computes the Q/DQ model in PyTorch (the numerical reference of
    every later stage). Int8/int16 weights are folded into constants.
    ``float_pt2``: the float program's file or the loaded ExportedProgram
    (see :func:`.prepare.build_prepared`); ``int16_layers``: the layer ids of a
    mixed-precision model (:func:`.prepare.read_int16_selection`).
    """
    gm = build_prepared(spec, float_pt2, int16_layers=int16_layers)
    gm.load_state_dict(torch.load(calibrated_state, map_location="cpu", weights_only=True), strict=True)
    q = convert_pt2e(gm)
    torchenv.release_torchao_modules()
    _drop_unused_attributes(q)
    return q


def _drop_unused_attributes(gm: torch.fx.GraphModule) -> None:
    """convert_pt2e leaves the float weights that BN folding replaced as
    parameters no node reads; drop them so they are not exported."""
    used = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    for name, _ in list(gm.named_parameters()) + list(gm.named_buffers()):
        if name not in used:
            owner, _, attr = name.rpartition(".")
            mod = gm.get_submodule(owner) if owner else gm
            delattr(mod, attr)


def convert_model(spec: ModelSpec, float_pt2: Path, calibrated_state: Path, out: Path,
                  int16_selection: Path | None = None) -> None:
    """Convert and re-export with the static batch-1 input of ``spec.input_shape``."""
    q = load_converted(spec, float_pt2, calibrated_state, read_int16_selection(int16_selection))
    example = torch.zeros(*spec.input_shape)
    ep = torch.export.export(q, (example,))
    torchenv.save_program(ep, out)
