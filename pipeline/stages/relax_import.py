"""Stage ``relax_import``: Q/DQ ExportedProgram -> Relax IRModule as TVMScript text."""

from __future__ import annotations

from pathlib import Path

from .. import torchenv
from ..frontend.irmodule_io import save_irmodule
from ..frontend.qdq_import import import_with_provenance
from ..fsutil import write_json


def import_model(quantized_pt2: Path, out_script: Path, out_params: Path, out_layers: Path) -> None:
    """Import ``quantized_pt2`` with ``from_exported_program(keep_params_as_input=True)``
    and the Q/DQ op map; write ``module.py`` (TVMScript), ``params.bin`` and
    ``layers.json`` (binding name -> PyTorch module path, source line and
    layer id, :mod:`pipeline.frontend.provenance`)."""
    ep = torchenv.load_program(quantized_pt2)
    mod, params, layers = import_with_provenance(ep)
    save_irmodule(mod, params, out_script, out_params)
    write_json(out_layers, layers)
