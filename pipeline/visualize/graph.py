"""The offload graph of one build, from its ``manifest.json``.

One node per top-level kernel call of the generated C (MMALIB, C7x kernel or
TVM scalar), plus an ``input`` and an ``output`` node: a build with N calls
has N + 2 nodes. One edge per tensor and reader: each name in a call's
``inputs`` gives an edge from the call that wrote it (or from ``input``) to
that call, a call reading the same tensor twice gets one edge, and the call
writing ``output`` gets an edge to the ``output`` node. A model with several
outputs has one node per output instead, ``output0``, ``output1``... (the
manifest's names, :func:`pipeline.backend.call_graph.io_names`), each with an
edge from the call writing it: N calls and K outputs give N + 1 + K nodes.

Node labels are computed here (tested in Python, drawn as given by the
page): the call that runs a layer's kernel (its ``func``, else the layer's
first call) is labelled with the layer's op, the others (a clip after an
MMALIB conv, a dequantize) with their kernel name; the second line is the
output shape.
"""

from __future__ import annotations

import re

from ..backend.tile_names import reference_name

#: Node kinds: the call backends of the manifest plus input/output.
KINDS = ("mmalib", "c7x", "tvm", "io")

#: Fill colour per node kind. MMALIB, TVM and input/output are the reference
#: visualiser's (docs/reference.md, "Visualize and profile formats"); the
#: reference has no C7x-kernel engine, so that colour is ours (purple, away
#: from TIDL's red #DE0000 and the other three).
COLOURS = {"mmalib": "#F57C00", "c7x": "#7B3FA0", "tvm": "#117788", "io": "#BDBDBD"}

#: Legend text per node kind.
KIND_NAMES = {"mmalib": "MMALIB", "c7x": "C7x kernel", "tvm": "TVM scalar", "io": "input / output"}

#: Layer fields the page shows (everything else in a manifest layer is dropped).
LAYER_FIELDS = ("id", "name", "op", "dtype", "input_shape", "weight_shape", "output_shape", "activation",
                "macs", "backend", "kernel", "func", "reason", "note", "module", "module_type", "source",
                "code", "out_dtype")

_MAX_LABEL = 26


def shape_text(shape) -> str:
    """``[1, 32, 112, 112]`` -> ``"1x32x112x112"`` ("?" when unknown)."""
    return "x".join(str(d) for d in shape) if shape else "?"


def short_kernel(kernel: str) -> str:
    """A readable node label for a TVM kernel name.

    ``fused_matmul_cast19_multiply19_add24_quantize65`` -> ``matmul_cast_multiply_add…``,
    ``tir_clip3`` -> ``clip``: no ``fused_`` or ``tir_`` prefixes, no numbering, at
    most 26 characters. The full name stays in the node's details.
    """
    name = re.sub(r"(^|_)tir_", r"\1", re.sub(r"^fused_", "", kernel))
    return _clip("_".join(re.sub(r"\d+$", "", part) or part for part in name.split("_")))


def _clip(name: str) -> str:
    """``name`` cut to :data:`_MAX_LABEL` characters (an ellipsis marks the cut)."""
    return name if len(name) <= _MAX_LABEL else name[:_MAX_LABEL - 1] + "\u2026"


def _primary_calls(calls: list[dict], layers: dict[str, dict]) -> set[int]:
    """Index of the call that runs each layer: the one calling the layer's func, else its first."""
    out = set()
    for lid, lay in layers.items():
        mine = [c for c in calls if c.get("layer") == lid]
        # a tiled call's func is tiled<tc><w|i>_<the layer's func> (pipeline/backend/tile_names.py)
        main = [c for c in mine if lay.get("func") and reference_name(c.get("func", "")) == lay["func"]]
        if mine:
            out.add((main or mine)[0]["index"])
    return out


def _layer_title(lay: dict) -> str:
    """A layer's node title in a mixed-precision build: its op and dtype
    (``conv2d int16``; ``requantize int8>int16`` for a boundary)."""
    if lay.get("out_dtype"):
        return f"{lay['op']} {lay['dtype']}>{lay['out_dtype']}"
    return f"{lay['op']} {lay['dtype']}"


def _output_names(writer: dict[str, str]) -> list[str]:
    """The model outputs some call writes: ``["output0", "output1", ...]`` in return
    order for a model with several, else ``["output"]`` (a node even when no call writes it)."""
    several = sorted((n for n in writer if re.fullmatch(r"output\d+", n)), key=lambda n: int(n[6:]))
    return several or ["output"]


def _output_nodes(outputs: list[str], calls: list[dict], writer: dict[str, str]) -> list[dict]:
    """The io node of each output: one output is labelled with the last call's shape;
    output ``i`` of several with the shape of the call writing it."""
    if outputs == ["output"]:
        last = calls[-1] if calls else {}
        return [{"id": "output", "kind": "io", "label": ["output", shape_text(last.get("shape"))],
                 "shape": last.get("shape"), "dtype": last.get("dtype"), "layer": None, "call": None}]
    by_node = {f"c{c['index']}": c for c in calls}
    nodes = []
    for name in outputs:
        call = by_node[writer[name]]
        shape = call.get("shape") if call.get("output") == name else None  # a split's other outputs: unknown
        nodes.append({"id": name, "kind": "io", "label": [f"output {name[6:]}", shape_text(shape)],
                      "shape": shape, "dtype": "float32", "layer": None, "call": None})
    return nodes


def build_graph(manifest: dict) -> dict:
    """Page data of one build: ``layers``, ``calls``, ``nodes``, ``edges``, ``summary``.

    Raises ValueError when a call reads a tensor no earlier call wrote (the
    manifest's calls are a dataflow order, ``tests/stages/test_layer_names.py``).
    """
    layers = [{k: lay.get(k) for k in LAYER_FIELDS} for lay in manifest["layers"]]
    by_id = {lay["id"]: lay for lay in layers}
    calls = [dict(c) for c in manifest["calls"]]
    for lay in layers:
        lay["calls"] = [c["index"] for c in calls if c.get("layer") == lay["id"]]
    primary = _primary_calls(calls, by_id)
    mixed = len({lay["dtype"] for lay in layers if lay.get("dtype") in ("int8", "int16")}) > 1

    first_shape = calls[0].get("shape") if calls else None
    nodes = [{"id": "input", "kind": "io", "label": ["input", shape_text(first_shape)],
              "shape": first_shape, "dtype": "float32", "layer": None, "call": None}]
    edges: list[dict] = []
    writer = {"input": "input"}
    for c in calls:
        nid = f"c{c['index']}"
        lay = by_id.get(c.get("layer"))
        if lay is not None and c["index"] in primary:
            title = _layer_title(lay) if mixed else lay["op"]
        elif c["backend"] in ("mmalib", "c7x") and c.get("kernel"):  # a kernel's name: its digits are dtypes
            title = _clip(c["kernel"])
        else:
            title = short_kernel(c.get("kernel") or c.get("func") or "?")
        nodes.append({"id": nid, "kind": c["backend"] if c["backend"] in COLOURS else "tvm",
                      "label": [title, shape_text(c.get("shape"))], "shape": c.get("shape"),
                      "dtype": c.get("dtype"), "layer": c.get("layer"), "call": c["index"],
                      "primary": c["index"] in primary})
        for tensor in dict.fromkeys(c.get("inputs", [])):
            if tensor not in writer:
                raise ValueError(f"manifest call {c['index']} ({c.get('func')}) reads {tensor!r}, "
                                 "which no earlier call writes")
            edges.append({"from": writer[tensor], "to": nid, "tensor": tensor})
        for tensor in c.get("outputs") or [c.get("output")]:  # a split writes several
            writer[tensor] = nid
    outputs = _output_names(writer)
    nodes += _output_nodes(outputs, calls, writer)
    edges += [{"from": writer[n], "to": n, "tensor": n} for n in outputs if n in writer]
    return {"layers": layers, "calls": calls, "nodes": nodes, "edges": edges,
            "summary": manifest.get("summary", {})}


def kind_counts(graph: dict) -> dict[str, int]:
    """Nodes per kind (the legend's counts)."""
    out = {k: 0 for k in KINDS}
    for n in graph["nodes"]:
        out[n["kind"]] += 1
    return out
