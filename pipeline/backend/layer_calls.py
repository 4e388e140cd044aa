"""Which kernel call of a C build holds a layer's output tensor, and the Python reference's
values of those calls (the ``layers`` stage's C side).

A layer's last call (``manifest.json`` ``calls``) usually writes the layer's
quantized result; a TVM function that fused the layer's end with ops mixing or
reordering tensors does not, and is read from its PrimFunc name
(:func:`not_layer_output`).
"""

from __future__ import annotations

import re

import numpy as np

from ..errors import StaleArtifactError

# Ops of a TVM function after which its output is no longer one layer's tensor:
# they mix several tensors, reorder or select elements (ShuffleNetV2's concat +
# channel shuffle + split). Element-wise ops, casts, (de)quantize, a reshape that
# keeps the element order (a mean's [1, C, 1, 1] -> [1, C]) and the strided slice
# that drops an FC's padding leave it the layer's value.
_MIXING = re.compile(r"(?:^|_)(concatenate|split|transpose|stack|take|gather|layout_transform|tile|repeat|flip)"
                     r"\d*(?=_|$)")

def not_layer_output(call: dict | None, relax_layers: dict) -> str | None:
    """Why the output of ``call`` (a layer's last kernel call in ``manifest.json``,
    None: the layer has none) is not that layer's output tensor, else None.

    A call whose output binding is named in ``relax/layers.json`` is that
    binding's tensor. An unnamed TVM call's ops are read from its PrimFunc
    name, which TVM's FuseOps makes ``fused_`` + the names of the primitive
    functions it fused, in order, each with its dedup digits (``fused_tir_clip1_
    dequantize_concatenate_quantize1_reshape_transpose_reshape1_dequantize2_split``):
    one of :data:`_MIXING` there means the layer's own result (the clip after
    its MMALIB conv, say) exists only inside that function, and the function
    returns something else (a split half of the shuffled concat)."""
    if call is None:
        return "no kernel call of this build is tied to the layer (manifest.json calls)"
    if any(relax_layers.get(v, {}).get("id") for v in call["vars"]) or call["backend"] != "tvm":
        return None
    ops = list(dict.fromkeys(m.group(1) for m in _MIXING.finditer(call["func"])))
    outs = call.get("outputs") or [call["output"]]
    if not ops and len(outs) == 1:
        return None
    what = f"fused with {', '.join(ops)}" if ops else f"a call writing {len(outs)} tensors"
    return (f"{what} in one TVM function ({call['func']}, call {call['index']}); its output is not this "
            f"layer's tensor")

# The main op of a layer kind as TVM's scalar path names it in a PrimFunc.
_MAIN_OP = {"conv2d": "conv2d", "depthwise_conv2d": "conv2d", "fc": "matmul"}

def named_call(call: dict, relax_layers: dict) -> bool:
    """``call`` is a kernel (not TVM) whose output binding is named in ``relax/layers.json``:
    the layer's tensor, before a TVM function that moves it (a channel shuffle)."""
    return call["backend"] != "tvm" and any(relax_layers.get(v, {}).get("id") for v in call["vars"])

def whole_layer(call: dict, op: str) -> bool:
    """``call`` is one TVM function computing a layer of kind ``op`` from its
    input to its output quantize (TVM's scalar path: ``fused_conv2d2_cast1_
    multiply1_add1_relu1_quantize6``): its name holds the main op, ends in the
    quantize, and it mixes no tensors and writes one."""
    main, f = _MAIN_OP.get(op), call["func"]
    return (call["backend"] == "tvm" and main is not None and len(call.get("outputs") or [call["output"]]) == 1
            and not _MIXING.search(f) and bool(re.search(rf"(?:^|_){main}\d*_", f))
            and bool(re.search(r"_quantize\d*$", f)))

def layer_calls(manifest: dict, relax_layers: dict) -> tuple[dict[str, dict], dict[str, str]]:
    """(layer id -> the kernel call whose output is the layer's tensor, layer id
    -> why no call's is) for the layers of ``manifest``.

    The layer's last call (``calls``, tied to layers by :mod:`pipeline.backend.
    call_graph`), unless :func:`not_layer_output` says its output is something
    else; then an earlier call of the layer that computes the whole layer
    (:func:`whole_layer`: the scalar build's conv whose clip TVM did not fuse
    into the next concat; :func:`_named`: a kernel whose output is the layer's
    binding, before TVM's channel shuffle) if there is one. An MMALIB kernel's output before its
    fused clip is not the layer's tensor (negative values a ReLU clips), so
    there the layer is not comparable."""
    by_layer: dict[str, list[dict]] = {}
    for c in manifest["calls"]:
        if c["layer"] is not None:
            by_layer.setdefault(c["layer"], []).append(c)
    chosen, why = {}, {}
    for lay in manifest["layers"]:
        lid, calls = lay["id"], by_layer.get(lay["id"], [])
        reason = not_layer_output(calls[-1] if calls else None, relax_layers)
        pick = calls[-1] if reason is None else next((c for c in reversed(calls[:-1])
                                                       if whole_layer(c, lay["op"]) or named_call(c, relax_layers)),
                                                      None)
        if pick is not None:
            chosen[lid] = pick
        else:
            why[lid] = reason
    return chosen, why

def named_points(last: dict[str, dict], relax_layers: dict) -> dict[str, str]:
    """Layer id -> float node id the last call's output binding was named after
    (``relax/layers.json``), where it has a name there."""
    out = {}
    for lid, c in last.items():
        ids = {relax_layers[v]["id"] for v in c["vars"] if relax_layers.get(v, {}).get("id")}
        if len(ids) == 1:
            out[lid] = ids.pop()
    return out

def same_layout(c_out: np.ndarray, shape: tuple) -> bool:
    """A C tensor holds the Q/DQ tensor's elements in the same order (equal
    shapes, or equal up to size-1 axes, e.g. a mean's [1, C] vs [1, C, 1, 1])."""
    squeeze = lambda s: tuple(d for d in s if d != 1)  # noqa: E731
    return tuple(c_out.shape) == tuple(shape) or (c_out.size == int(np.prod(shape))
                                                 and squeeze(c_out.shape) == squeeze(shape))

def capture_calls(prog, image: np.ndarray, calls: list[dict], wanted: dict[int, str]) -> dict[str, np.ndarray]:
    """Run the Python reference on one image; the outputs of the ``wanted``
    calls (index -> layer id). Checks that the program's calls are the
    manifest's, in order."""
    from .tile_names import reference_name

    got, seen = {}, []

    def observe(index, func, output):
        seen.append(func)
        if index < len(calls) and reference_name(calls[index]["func"]) != func:  # a tiled call: the untiled
            raise StaleArtifactError(f"lowered.py call {index} is {func}, the manifest says "
                                     f"{calls[index]['func']}; re-run: doit codegen")
        if index in wanted:
            got[wanted[index]] = np.array(output)

    prog.run(image, observer=observe)
    if len(seen) != len(calls):
        raise StaleArtifactError(f"lowered.py makes {len(seen)} kernel calls, the manifest lists {len(calls)}; "
                                 f"re-run: doit codegen")
    return got
