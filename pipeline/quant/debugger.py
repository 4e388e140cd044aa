"""The float and Q/DQ models of PT2E's numeric debugger, instrumented at the layers' output points.

Both models are built from ONE in-memory float program in this process,
because the debugger matches nodes by their ``from_node`` ancestry
(``NodeSourceDebugInfo``: float node name + graph id). The float side gets the
conv-BN fold ``prepare_pt2e`` applies (:func:`float_reference`), and the
channel equalization the calibration recorded (:func:`replay_equalization`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .. import torchenv
from ..config import ModelSpec
from ..errors import StaleArtifactError
from .output_points import Point, output_points
from .program import load_converted, load_program, read_int16_selection

def not_comparable(ref, x) -> str | None:
    """Why the debugger's float value ``ref`` cannot be compared with the Q/DQ tensor ``x``
    (a tuple of tensors, another element count), else None."""
    if not isinstance(ref, torch.Tensor):
        return f"the float node returns {type(ref).__name__} of {len(ref)} tensors" \
            if isinstance(ref, (tuple, list)) else f"the float node returns {type(ref).__name__}"
    if ref.numel() != torch.as_tensor(x).numel():
        return f"float {list(ref.shape)} vs Q/DQ {list(torch.as_tensor(x).shape)}"
    return None

def float_reference(ep) -> torch.fx.GraphModule:
    """A copy of ``ep.module()`` with conv-BN (and linear-BN) folded by the
    functions ``prepare_pt2e`` uses, so each float node computes what the Q/DQ
    node of the same name computes before quantization. Deep-copied (node
    metadata included), so it shares no tensor with ``ep``."""
    import copy

    from torchao.quantization.pt2e.utils import _fuse_conv_bn_, _fuse_linear_bn_
    m = copy.deepcopy(ep.module())
    _fuse_conv_bn_(m)
    _fuse_linear_bn_(m)
    torchenv.release_torchao_modules()
    m.recompile()
    return m

def out_of_place(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Replace in-place aten ops (``hardtanh_`` of ``ReLU6(inplace=True)``...)
    by their out-of-place twins, in place; node names and metadata stay.

    The debugger's loggers keep the tensor a node returned, not a copy, so an
    in-place op after a logged node would overwrite the logged value."""
    from .graph import out_of_place as twin
    for n in gm.graph.nodes:
        if n.op == "call_function":
            n.target = twin(n.target)
    gm.recompile()
    return gm

def loggers(model) -> dict:
    from torchao.quantization.pt2e._numeric_debugger import OutputLogger
    return {m.node_name: m for _, m in model.named_children() if isinstance(m, OutputLogger)}

def keeploggers(model: torch.fx.GraphModule, names: set[str]) -> torch.fx.GraphModule:
    """Remove the debugger's loggers except those whose source node is in
    ``names`` (in place): only the compared points are kept, which keeps the
    logged tensors of one image small and the runs fast."""
    from torchao.quantization.pt2e._numeric_debugger import OutputLogger
    for n in list(model.graph.nodes):
        if n.op != "call_module":
            continue
        mod = getattr(model, n.target, None)
        if isinstance(mod, OutputLogger) and mod.debug_info.name not in names:
            n.replace_all_uses_with(n.args[0])
            model.graph.erase_node(n)
            delattr(model, n.target)
    model.recompile()
    return model

@dataclass
class DebugModels:
    """The float and Q/DQ models with numeric-debugger loggers where layers are compared."""

    ref: torch.fx.GraphModule
    qdq: torch.fx.GraphModule
    qdq_loggers: dict
    points: dict[str, Point]

    def clear(self) -> None:
        """Forget the logged values of the last image."""
        for lg in list(loggers(self.ref).values()) + list(self.qdq_loggers.values()):
            lg.stats.clear()

def replay_equalization(ref: torch.fx.GraphModule, groups: list[dict]) -> None:
    """Apply the recorded channel scales of ``groups`` (calibration.json) to the float
    reference ``ref`` in place. Raises StaleArtifactError when a recorded group is not in ``ref``."""
    from .equalize import apply_scales, find_groups
    found = {(g.producers, g.consumers): g for g in find_groups(ref)}
    for rec in groups:
        g = found.get((tuple(rec["producers"]), tuple(rec["consumers"])))
        if g is None:
            raise StaleArtifactError(f"equalized group {rec['producers']} -> {rec['consumers']} of "
                                     f"calibration.json is not in the float program; re-run: doit calibrate")
        apply_scales(ref, g, torch.tensor(rec["scales"], dtype=torch.float64))

def debug_models(spec: ModelSpec, float_pt2: Path, calibrated_state: Path, int16_selection: Path | None,
                  layers: list[dict], named: dict[str, str], equalized: list[dict] = ()) -> DebugModels:
    """Float and Q/DQ models from ONE in-memory program (the debugger matches nodes by
    ``from_node``), instrumented only at the layers' output points. ``equalized``: the
    groups whose channel scales the float reference replays (:func:`replay_equalization`)."""
    from torchao.quantization.pt2e._numeric_debugger import prepare_for_propagation_comparison

    ep = load_program(float_pt2)
    q = load_converted(spec, ep, calibrated_state, read_int16_selection(int16_selection))
    requantize = {lay["id"]: lay["out_dtype"] for lay in layers if lay["op"] == "requantize"}
    points = output_points(q, [lay["id"] for lay in layers], named, requantize)
    keep = {p.node for p in points.values()}
    ref = float_reference(ep)
    replay_equalization(ref, list(equalized))
    ref_model = keeploggers(prepare_for_propagation_comparison(out_of_place(ref)), keep)
    qdq_model = prepare_for_propagation_comparison(out_of_place(q))
    # a requantize's Q/DQ nodes log under their own debug name (no float node of their own)
    read = {p.q for p in points.values()} | {d for p in points.values() for d in p.dq}
    keep_qdq = keep | {lg.debug_info.name for name, lg in loggers(qdq_model).items() if name in read}
    qdq_model = keeploggers(qdq_model, keep_qdq)
    return DebugModels(ref_model, qdq_model, loggers(qdq_model), points)
