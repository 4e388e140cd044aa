"""Read the weights of an ONNX file as a PyTorch state dict (``[weights] format = "onnx"``).

An ONNX file is a protobuf: :func:`onnx.load` parses it and runs nothing (external data files
are not followed: ``load_external_data=False``). Only the graph's initializers are kept, as
float32 tensors; the graph itself is never run. Names follow ``torch.onnx.export`` of a Hugging
Face model:

- an initializer with a parameter name (``backbone.encoder.layer.0.norm1.weight``) keeps it;
- a ``Linear`` weight exported as a ``MatMul`` operand (``onnx::MatMul_1966``, ``[in, out]``) is
  named after its node (``/backbone/encoder/layer.0/attention/attention/key/MatMul`` ->
  ``backbone.encoder.layer.0.attention.attention.key.weight``) and transposed to ``[out, in]``;
- position embeddings that ``interpolate_pos_encoding`` split into the class row (``[1, 1, D]``,
  read by ``<prefix>/embeddings/Concat_*``) and the patch rows (``[1, P, D]``, read by
  ``<prefix>/embeddings/Reshape_*``) are joined again as ``<prefix>.embeddings.position_embeddings``
  ``[1, 1 + P, D]``;
- any other unnamed initializer is left out (constants of the graph, not parameters).
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import PipelineError, brief

_UNNAMED = re.compile(r"onnx::")


def read_state_dict(path: Path) -> dict:
    """``{name: float32 torch.Tensor}`` of the ONNX file ``path`` (module doc). Raises
    :class:`PipelineError` (one line) when it is not an ONNX model or holds no parameter."""
    import numpy as np
    import onnx
    import torch
    from onnx import numpy_helper

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf DecodeError, OSError: not an ONNX model
        raise PipelineError(f"{path}: not an ONNX model ({brief(e)})") from None
    graph = model.graph
    arrays = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    state = {name: a for name, a in arrays.items() if not _UNNAMED.match(name)}
    consumers: dict[str, list[str]] = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in arrays and _UNNAMED.match(name):
                consumers.setdefault(name, []).append(node.name)
                if node.op_type == "MatMul" and i == 1 and node.name.endswith("/MatMul"):
                    key = node.name[1:-len("/MatMul")].replace("/", ".") + ".weight"
                    state[key] = arrays[name].T
    state.update(_position_embeddings(arrays, consumers))
    if not state:
        raise PipelineError(f"{path}: no named parameter among its {len(arrays)} initializers")
    return {k: torch.from_numpy(np.array(v, dtype=np.float32, copy=True)) for k, v in state.items()}


def _position_embeddings(arrays: dict, consumers: dict) -> dict:
    """``{"<prefix>.embeddings.position_embeddings": [1, 1 + P, D]}`` from the class and patch
    rows ``interpolate_pos_encoding`` split (module doc), or nothing."""
    import numpy as np

    parts: dict[str, dict[str, object]] = {}
    for name, nodes in consumers.items():
        for node in nodes:
            m = re.fullmatch(r"/(.*)/embeddings/(Concat|Reshape)(_\d+)?", node)
            if m and arrays[name].ndim == 3:
                parts.setdefault(m.group(1), {})[m.group(2)] = arrays[name]
    out = {}
    for prefix, p in parts.items():
        cls, patches = p.get("Concat"), p.get("Reshape")
        if cls is not None and patches is not None and cls.shape[1] == 1 and cls.shape[2] == patches.shape[2]:
            out[f"{prefix.replace('/', '.')}.embeddings.position_embeddings"] = np.concatenate([cls, patches], 1)
    return out
