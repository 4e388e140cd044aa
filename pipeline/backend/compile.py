"""``compile_model``: imported Q/DQ Relax module -> a folder of static C for the C7x.

Steps: :func:`~pipeline.backend.passes.fold_constants.fold_constant_subgraphs`
(input-independent subgraphs evaluated once, into weights.bin),
:func:`~pipeline.backend.lower.lower_module` (MMALIB offload when on,
scalar integer rewrites, TVM lowering and static memory plan), the offload
manifest, then :func:`~pipeline.backend.emit_c.emit`. Output files in
``out_dir``: ``model.h``, ``model.c``, ``tvm_kernels.c``, ``weights.bin``
(``weights_data.c`` too for ``weights_format="c_array"``), copies of
``c7x_kernels.h`` and ``c7x_tvm_shim.h`` (the folder compiles with
``gcc -I<out_dir>`` alone), ``lowered.py`` (for :mod:`.interp`),
``manifest.json``, ``memory_map.json`` and ``c7x_memory.cmd`` (where each buffer
lives on the C7x: :mod:`.levels`). Deterministic: the same module and options
give byte-identical files.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import tvm
from tvm import relax
from tvm.ir import GenericConst

from ..fsutil import write_json
from .call_graph import call_records
from .c_header import Quant, check_preprocess
from .emit_c import emit
from .levels import default_budget, memory_map
from .lower import lower_module
from .passes.fold_constants import fold_constant_subgraphs

MMALIB_OFF_REASON = "mmalib disabled"


def _bound_value(main, var):
    for block in main.body.blocks:
        for b in block.bindings:
            if b.var.same_as(var):
                return b.value
    return None


def _quant_of(call) -> Quant | None:
    s, z = call.args[1], call.args[2]
    if not (isinstance(s, GenericConst) and isinstance(z, GenericConst)):
        return None
    s, z = s.value.numpy(), z.value.numpy()
    if s.size != 1 or z.size != 1:
        return None
    dtype = str(call.args[0].ty.dtype) if call.op.name == "relax.dequantize" else str(call.attrs.out_dtype)
    return Quant(dtype, float(np.float32(s.reshape(()))), int(z.reshape(())))


def io_quantization(mod: tvm.IRModule) -> dict[str, Quant | None]:
    """Quantization of the model input (the per-tensor ``R.quantize`` applied
    to ``main``'s first parameter) and output (the per-tensor ``R.dequantize``
    that produces the returned tensor). ``None`` where there is none."""
    main = mod["main"]
    x = main.params[0]
    found: dict[str, Quant | None] = {"input": None, "output": None}
    for block in main.body.blocks:
        for b in block.bindings:
            v = b.value
            if (isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and v.op.name == "relax.quantize"
                    and v.args[0].same_as(x) and found["input"] is None):
                found["input"] = _quant_of(v)
    ret = main.body.body
    value = _bound_value(main, ret) if isinstance(ret, relax.Var) else ret
    if isinstance(value, relax.Tuple) and len(value.fields) == 1:
        value = value.fields[0]
    if isinstance(value, relax.Var):
        value = _bound_value(main, value)
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == "relax.dequantize":
        found["output"] = _quant_of(value)
    return found


def _manifest(mod: tvm.IRModule, offloaded: tvm.IRModule, log, mmalib: bool) -> dict:
    from .manifest import build_manifest
    from .passes.log import OffloadLog

    if mmalib:
        return build_manifest(mod, offloaded, log)
    manifest = build_manifest(mod, mod, OffloadLog())
    for layer in manifest["layers"]:
        layer["reason"] = MMALIB_OFF_REASON
    return manifest


PROVENANCE_KEYS = ("id", "module", "module_type", "source", "code")


def name_layers(layers: list[dict], provenance: dict[str, dict] | None) -> None:
    """Give each manifest layer its id, PyTorch module path and source line from
    ``provenance`` (binding name -> :mod:`pipeline.frontend.provenance` record),
    in place. Without one, the id is the binding name and the rest None.

    A requantize has no node of its own in the float program (PT2E inserted
    it; its provenance is that of the tensor it converts, so its module and
    source say where that tensor comes from): its id is its binding name,
    which keeps ids unique."""
    for layer in layers:
        prov = (provenance or {}).get(layer["name"], {})
        layer.update({k: prov.get(k) for k in PROVENANCE_KEYS})
        own = layer["op"] != "requantize" and layer["id"]
        layer["id"] = own or layer["name"]


def binding_order(mod: tvm.IRModule) -> dict[str, int]:
    """Binding name -> position in ``mod["main"]``."""
    bindings = [b for block in mod["main"].body.blocks for b in block.bindings]
    return {b.var.name: i for i, b in enumerate(bindings)}


def compile_model(mod: tvm.IRModule, model_name: str, out_dir: Path, *, mmalib: bool = True,
                  weights_format: str = "bin", preprocess: dict | None = None,
                  provenance: dict[str, dict] | None = None, memory: str = "staged",
                  budget=None) -> dict:
    """Compile ``mod`` into the static C files listed in the module docstring.

    ``mod``: the imported module with params bound (``load_irmodule``), NCHW,
    static shapes, one float32 input and one float32 output. ``model_name``:
    names the C entry (``<c_name>_run``; non-identifier characters become
    ``_``). ``out_dir``: an existing, empty folder (the caller makes it fresh
    and replaces the old one atomically). ``mmalib``: offload eligible layers
    to MMALIB/C7x kernels; off = everything on the scalar path (the baseline).
    ``weights_format``: "bin" (weights.bin, loaded by the caller) or
    "c_array" (also weights_data.c). ``preprocess``: the model's input
    preprocessing ``{"resize": int, "crop": int, "mean": [3], "std": [3]}``
    (``PreprocessSpec`` fields), written to model.h as ``<M>_PREPROCESS_*``;
    None leaves it out. ``provenance``: binding name -> PyTorch module path,
    source line and layer id (``relax/layers.json``), for the manifest's
    layers and calls (:mod:`.call_graph`). ``memory``: "staged" places buffers on the
    C7x's memory levels within ``budget`` (:class:`.levels.Budget`, :mod:`.levels`;
    None: the default target's, :func:`.levels.default_budget`), "flat" keeps one DDR arena; either way ``memory_map.json`` and ``c7x_memory.cmd``
    say where everything is. Returns a summary: ``c_name``, ``layers``,
    ``layers_offloaded``, ``macs_total``, ``macs_offloaded``, ``arena_bytes``,
    ``workspace_bytes``, ``weights_bytes``, ``kernels`` (distinct PrimFuncs),
    ``calls`` (kernel calls per image), ``calls_by_backend`` ({"mmalib",
    "c7x", "tvm"}: calls) and ``tvm_kernels`` (sorted names of the scalar
    PrimFuncs called); the manifest summary gets the last two as ``calls``
    and ``tvm_kernels``. Raises UnsupportedOpError (one line, naming the op)
    for a graph the emitter cannot express, ValueError for a bad
    ``weights_format`` or ``preprocess``.
    """
    if preprocess is not None:
        check_preprocess(preprocess)  # fail before the slow part
    out_dir = Path(out_dir)
    mod, folded = fold_constant_subgraphs(mod)   # first: the manifest counts what runs per inference
    low = lower_module(mod, mmalib=mmalib)
    manifest = _manifest(mod, low.offloaded, low.offload_log, mmalib)
    manifest["summary"]["folded"] = {"bindings": len(folded),
                                     "ops": dict(Counter(op.removeprefix("relax.") for _, op in folded))}
    name_layers(manifest["layers"], provenance)
    if memory == "staged" and budget is None:
        budget = default_budget()
    info = emit(low.mod, model_name, out_dir, quant=io_quantization(mod), weights_format=weights_format,
                preprocess=preprocess, memory=memory, budget=budget)
    mem = memory_map(info["plan"])
    write_json(out_dir / "memory_map.json", mem)
    manifest["calls"] = call_records(info["mod"], info["plan"], binding_order(mod), manifest["layers"],
                                     low.fused)
    manifest["summary"].update({k: info[k] for k in ("arena_bytes", "workspace_bytes", "weights_bytes")})
    manifest["summary"].update(calls=info["calls_by_backend"], tvm_kernels=info["tvm_kernels"])
    manifest["summary"]["memory"] = {k: mem[k] for k in ("plan", "peak", "traffic")}
    write_json(out_dir / "manifest.json", manifest)
    s = manifest["summary"]
    return {"c_name": info["c_name"], "layers": s["layers"], "layers_offloaded": s["layers_offloaded"],
            "macs_total": s["macs_total"], "macs_offloaded": s["macs_offloaded"],
            "arena_bytes": info["arena_bytes"], "workspace_bytes": info["workspace_bytes"],
            "weights_bytes": info["weights_bytes"], "kernels": info["kernels"], "calls": info["calls"],
            "calls_by_backend": info["calls_by_backend"], "tvm_kernels": info["tvm_kernels"]}
