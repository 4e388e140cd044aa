"""The prepared and converted PT2E model, rebuilt from ``float.pt2`` (what several stages share).

A PT2E prepared GraphModule holds observer modules that neither pickle nor
``torch.export.save`` can store. So the ``prepare`` stage stores what identifies
it: the prepared module's weights (conv-BN folded) and a table of where
observers sit and with which dtype/scheme/range. Both are independent of the
observer *class*, which is a calibration option: changing it re-runs calibrate,
not prepare. The stages after it rebuild the module with :func:`build_prepared`
(deterministic), :func:`check_prepared` proves the rebuild matches, and
:func:`load_converted` gives the Q/DQ model of a calibrated state.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torchao.quantization.pt2e import ObserverBase
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from .. import torchenv
from ..config import ModelSpec
from ..errors import ConfigError, StaleArtifactError


def read_int16_selection(path: Path | None) -> frozenset[str]:
    """The int16 layer ids of a mixed-precision model: the ``layers`` list of
    ``int16_layers.json`` (written by the ``mixed_precision`` stage); empty for
    None (a model without mixed precision)."""
    if path is None:
        return frozenset()
    import json
    return frozenset(json.loads(Path(path).read_text())["layers"])


def observer_kwargs(spec: ModelSpec, observer: str) -> dict:
    """The observer options of a model entry for ``observer``: ``[calibration]
    percentile`` for "percentile", nothing for the others."""
    return {"percentile": spec.calibration.percentile} if observer == "percentile" else {}


def make_quantizer(spec: ModelSpec, observer: str | None = None, int16_layers=frozenset()):
    """The quantizer a model entry asks for (ours, or the vendor fork's).

    ``observer`` overrides ``spec.calibration.observer`` (its options come from the
    entry, :func:`observer_kwargs`); ``int16_layers``: layer ids with int16
    activations (mixed precision, ours only)."""
    q = spec.quantizer
    if q.implementation == "tvm":
        try:
            from tvm.relax.frontend.torch import C7xMMAQuantizer as Vendor  # type: ignore[attr-defined]
        except ImportError:
            raise ConfigError(
                f"{spec.source} (model {spec.name!r}): quantizer.implementation = 'tvm' needs TI's "
                f"tvm fork (tvm.relax.frontend.torch.C7xMMAQuantizer); the installed tvm lacks it. "
                f"Use implementation = 'c7x'") from None
        return Vendor(dtype=spec.dtype, symmetric_activations=q.symmetric_activations)
    from .quantizer import C7xMMAQuantizer
    name = observer or spec.calibration.observer
    return C7xMMAQuantizer(dtype=spec.dtype, symmetric_activations=q.symmetric_activations,
                           weight_dtype=q.weight_dtype, observer=name,
                           observer_kwargs=observer_kwargs(spec, name),
                           fuse_activations=q.fuse_activations, int16_layers=int16_layers)


def load_program(float_pt2: "Path | torch.export.ExportedProgram") -> torch.export.ExportedProgram:
    """``float_pt2`` loaded, or itself if it already is an ExportedProgram."""
    if isinstance(float_pt2, torch.export.ExportedProgram):
        return float_pt2
    return torchenv.load_program(float_pt2)


def build_prepared(spec: ModelSpec, float_pt2: "Path | torch.export.ExportedProgram",
                   observer: str | None = None, int16_layers=frozenset(),
                   bias_slots: bool | None = None) -> torch.fx.GraphModule:
    """Run ``prepare_pt2e`` with the entry's quantizer on ``float_pt2``: a file,
    or an already loaded ExportedProgram, which stays unchanged.
    ``int16_layers``: layer ids with int16 activations (mixed precision).
    ``bias_slots`` (default: ``[calibration] bias_correction``): give bias-less
    conv/linear layers a zero bias for bias correction to adjust
    (:func:`pipeline.quant.bias_correction.add_bias_slots`); the prepare stage
    stores the model without them (:func:`check_prepared` ignores them).

    Passing the ExportedProgram lets a caller build the float and the
    quantized model from the same in-memory program, which PT2E's numeric
    debugger needs to match their nodes (the ``layers`` stage). Its module is
    then a deep copy (node metadata included): ``ep.module()`` shares the
    program's parameter tensors, and loading a state into the prepared module
    would write into them."""
    if isinstance(float_pt2, torch.export.ExportedProgram):
        module = copy.deepcopy(float_pt2.module())
    else:
        module = torchenv.load_program(float_pt2).module()
    gm = prepare_pt2e(module, make_quantizer(spec, observer, int16_layers))
    torchenv.release_torchao_modules()
    if spec.calibration.bias_correction if bias_slots is None else bias_slots:
        from .bias_correction import add_bias_slots
        add_bias_slots(gm)
    return gm


def _observer_names(gm: torch.fx.GraphModule) -> list[str]:
    # remove_duplicate=False: a shared observer is registered under several names
    return [n for n, m in gm.named_modules(remove_duplicate=False) if isinstance(m, ObserverBase)]


def split_state(gm: torch.fx.GraphModule) -> tuple[dict, dict]:
    """(weights, observer buffers) of a prepared module's state_dict."""
    obs = tuple(n + "." for n in _observer_names(gm))
    sd = gm.state_dict()
    return ({k: v for k, v in sd.items() if not k.startswith(obs)},
            {k: v for k, v in sd.items() if k.startswith(obs)})


def observer_table(gm: torch.fx.GraphModule) -> str:
    """One line per observer: name, dtype, qscheme, [quant_min, quant_max], ch_axis."""
    lines = []
    for name in _observer_names(gm):
        mod = gm.get_submodule(name)
        lines.append(f"{name}\t{mod.dtype}\t{mod.qscheme}\t[{mod.quant_min}, {mod.quant_max}]\t"
                     f"ch_axis={getattr(mod, 'ch_axis', None)}")
    return "\n".join(lines) + "\n"


def check_prepared(gm: torch.fx.GraphModule, prepared_state: Path, table: Path) -> None:
    """Check that a rebuilt prepared module equals the stored one (weights and
    observer placement); load the stored weights into it. Raises StaleArtifactError
    (one line: re-run prepare) when they differ."""
    from .bias_correction import SLOT_PREFIX
    weights = torch.load(prepared_state, map_location="cpu", weights_only=True)
    own, _ = split_state(gm)
    own = {k: v for k, v in own.items() if not k.startswith(SLOT_PREFIX)}  # zero biases, not stored
    same = set(own) == set(weights) and all(torch.equal(own[k], weights[k]) for k in own)
    if not same or observer_table(gm) != table.read_text():
        raise StaleArtifactError(f"the prepared model rebuilt from float.pt2 differs from {prepared_state} "
                                 f"(an artifact edited or left from another run); re-run: doit prepare")
    gm.load_state_dict(weights, strict=False)


def load_converted(spec: ModelSpec, float_pt2: "Path | torch.export.ExportedProgram",
                   calibrated_state: Path, int16_layers=frozenset()) -> torch.fx.GraphModule:
    """Rebuild the prepared model, load the calibrated observers, ``convert_pt2e``.

    The result computes the Q/DQ model in PyTorch (the numerical reference of
    every later stage). Int8/int16 weights are folded into constants.
    ``float_pt2``: the float program's file or the loaded ExportedProgram
    (see :func:`build_prepared`); ``int16_layers``: the layer ids of a
    mixed-precision model (:func:`read_int16_selection`).
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


