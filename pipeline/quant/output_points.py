"""Layer output points of a converted Q/DQ program: where a layer's output is compared.

A layer's output point is the tensor its output quantize makes: in the Q/DQ
program the dequantize of the quantize that ends the layer (after a fused
ReLU / ReLU6; conv-BN folded). The layers stage compares the float model, the
Q/DQ model and the C there (:func:`output_points`, :func:`dequantize`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..frontend.provenance import KEY

_QUANTIZE = ("quantize_per_tensor",)
_DEQUANTIZE = ("dequantize_per_tensor",)


def _op_name(node) -> str:
    return str(getattr(node, "target", ""))

def _is(node, names) -> bool:
    return node.op == "call_function" and any(f"quantized_decomposed.{n}." in _op_name(node) for n in names)

def _layer_id(node) -> str | None:
    return (node.meta.get("custom") or {}).get(KEY, {}).get("id")

@dataclass
class Point:
    """Where a layer's output is compared: ``node`` is the float node name the
    output quantize reads (the debugger's key), ``q`` that quantize's node
    name in the Q/DQ module and ``dq`` the names of its dequantize users,
    ``qparams`` the dequantize's (scale, zero_point, quant_min, quant_max,
    dtype)."""

    node: str
    q: str
    dq: tuple[str, ...]
    qparams: tuple

    @property
    def scale(self) -> float:
        return float(self.qparams[0])

    @property
    def zero_point(self) -> int:
        return int(self.qparams[1])

def _walk_to_quantize(node):
    """From a layer's main op forward through single-user float ops (the fused
    activation) to the quantize that ends the layer, or None."""
    for _ in range(8):
        users = list(node.users)
        if len(users) != 1:
            return None
        node = users[0]
        if _is(node, _QUANTIZE):
            return node
    return None

def _requantize_of(qnode, dtype: str):
    """The quantize into ``dtype`` reading a dequantize of ``qnode`` (an int8 <->
    int16 boundary of a mixed-precision program), or None."""
    for dq in (u for u in qnode.users if _is(u, _DEQUANTIZE)):
        for w in dq.users:
            if _is(w, _QUANTIZE) and str(w.args[5]).removeprefix("torch.") == dtype:
                return w
    return None

def output_points(q: torch.fx.GraphModule, layer_ids: list[str],
                  named: dict[str, str] | None = None,
                  requantize: dict[str, str] | None = None) -> dict[str, Point]:
    """Output point of each layer id in the converted Q/DQ module ``q``.

    The quantize ending the layer is found from the main op (the node whose
    provenance id is the layer id) by :func:`_walk_to_quantize`; ``named``
    (layer id -> the float node id the C's last call is named after, from
    ``relax/layers.json``) overrides it where the C names its output.
    ``requantize`` (layer id -> output dtype of the manifest's requantize
    layers): such a layer is compared at the quantize into that dtype that
    re-quantizes its named node's output. Layers without a point (nothing
    quantizes them) are left out."""
    quantizes: dict[str, list] = {}
    main_op: dict[str, object] = {}
    for n in q.graph.nodes:
        if _is(n, _QUANTIZE) and hasattr(n.args[0], "op"):
            src = _layer_id(n.args[0])
            if src is not None:
                quantizes.setdefault(src, []).append(n)
        elif n.op == "call_function" and _layer_id(n) is not None:
            main_op.setdefault(_layer_id(n), n)
    out = {}
    for lid in layer_ids:
        qnode = base = None
        if named and named.get(lid) in quantizes:
            qnode = base = quantizes[named[lid]][0]
            if lid in (requantize or {}):  # compared with the float value it re-quantizes
                qnode = _requantize_of(base, requantize[lid])
        elif lid in main_op:
            qnode = quantizes[lid][0] if lid in quantizes else _walk_to_quantize(main_op[lid])
        if qnode is None:
            continue
        dq = [u for u in qnode.users if _is(u, _DEQUANTIZE)]
        if not dq:
            continue
        out[lid] = Point(node=_layer_id((base or qnode).args[0]), q=qnode.name, dq=tuple(u.name for u in dq),
                         qparams=tuple(dq[0].args[1:6]))
    return out

def dequantize(c_out: np.ndarray, point: Point) -> tuple[np.ndarray, np.ndarray]:
    """(float value, integer) of a C output tensor at ``point``.

    An integer tensor is dequantized as torch's ``dequantize_per_tensor``
    computes it, ``(float32(q) - zero_point) * float32(scale)``; a float
    tensor (a fused kernel already dequantized it) is kept, and its integer
    recovered as ``rint(x / scale) + zero_point`` (exact: x is (q - zp) * scale
    rounded to float32)."""
    scale, zp = point.scale, point.zero_point
    if c_out.dtype.kind == "f":
        return c_out, np.rint(c_out.astype(np.float64) / scale).astype(np.int32) + zp
    return (c_out.astype(np.float32) - np.float32(zp)) * np.float32(scale), c_out
