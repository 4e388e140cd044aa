"""The kernel calls of a compiled model as a graph, each tied to its layer.

One record per top-level call of ``<model>_run`` (the order of model.c),
with the tensors it reads and writes (arena tensor names of the static
memory plan, reshape views resolved to the tensor they read), so the
producer -> consumer edges are exact. Each call is tied to a layer of the
offload manifest: its output binding's position in the imported module says
which layer it finishes (the last layer whose main op precedes it), and a
call whose output has no name there (the MMALIB call before its fused clip,
a padded FC before its slice) belongs to the layer of the call that reads
its output. The calls before the first layer (the input quantize) belong to
none, and so does an unnamed call whose readers are in different layers (a
detection head's tuple-output topk), and a concat / split kernel (data
movement between layers, :mod:`.passes.concat`).

This is what ``offload.html`` draws and what the per-layer profile names.
"""

from __future__ import annotations

import bisect

import tvm

from .call_work import call_work
from .kernels import catalog
from .lower import is_offload
from .memory_plan import Plan


def _backend(mod: tvm.IRModule, name: str) -> tuple[str, str]:
    """(backend "mmalib" | "c7x" | "tvm", kernel symbol) of PrimFunc ``name``."""
    func = mod[name]
    if is_offload(func):
        return str(func.attrs["c7x_offload_backend"]), str(func.attrs["c7x_kernel"])
    return "tvm", name


def _moves_data(kernel: str) -> bool:
    """A data-movement kernel (concat, split: ``catalog.Kernel.layer`` False, not an edge)."""
    rec = catalog.kernel(kernel)
    return not (rec.layer or rec.edge)


def _root(plan: Plan, tensor) -> str:
    """The tensor a call argument holds the value of: a reshape view's source, an L2 copy's
    DDR original (:func:`.levels.stage_reads`), else itself."""
    name = tensor.copy_of or tensor.name
    return plan.views.get(name, name)


def _output_count(args, name, producer: dict) -> int:
    """How many trailing ``args`` of a destination-passing call are its outputs:
    the last always, and before it every tensor no earlier call wrote (a fresh
    allocation; not the model input, not a weight). A split writes several."""
    n = 1
    while n < len(args):
        a = args[-n - 1]
        if a.home == "weight" or name(a) == "input" or name(a) in producer:
            break
        n += 1
    return n


def io_names(plan: Plan) -> dict[str, str]:
    """Root tensor name -> ``input`` for the model input, ``output`` for the one
    output, ``output0``, ``output1``... (return order) for the outputs of a model
    with several, each written in place; an output copied into its slot (the
    same tensor returned twice, the input...) keeps its first name."""
    names = {_root(plan, plan.input): "input"}
    several = len(plan.outputs) > 1
    for i, t in enumerate(plan.outputs or [plan.output]):
        names.setdefault(_root(plan, t), f"output{i}" if several else "output")
    return names


def call_records(mod: tvm.IRModule, plan: Plan, order: dict[str, int], layers: list[dict],
                 fused: dict[str, list[str]] | None = None) -> list[dict]:
    """Records of ``plan.calls`` (``mod``: the lowered module the plan was made from).

    ``order``: binding name -> position in the imported ``main``; ``layers``:
    the manifest's layer entries (``name`` = anchor binding, ``id``);
    ``fused``: fused kernel -> the bindings it computes (``Lowered.fused``). Each
    record: ``index``, ``func`` (PrimFunc, the C symbol ``__tvm_ffi_<model>_<func>``),
    ``kernel``, ``backend``, ``inputs`` / ``output`` (tensor names; ``input`` and
    ``output`` for the model's own, :func:`io_names`; a kernel writing several tensors also has
    ``outputs``, ``output`` being the last), ``shape``, ``dtype`` (of ``output``), ``vars``
    (binding names of the output), ``layer`` (the layer ``id`` or None), and
    ``work`` / ``reads`` / ``writes`` (:func:`.call_work.call_work`: MACs or elements, and
    bytes per tensor with its memory level, for the performance estimate). A conv the
    staged plan fuses into the next call (:func:`.levels.fusable`) has
    ``computed_in``: that call's index; the C makes no call of its own for it.
    """
    anchors = sorted((order[lay["name"]], lay["id"]) for lay in layers if lay["name"] in order)
    keys = [a for a, _ in anchors]
    names = io_names(plan)
    records, producer, n_outs = [], {}, []
    for k, (func, args) in enumerate(plan.calls):
        backend, kernel = _backend(mod, func)
        n_out = _output_count(args, lambda a: names.get(_root(plan, a), _root(plan, a)), producer)
        n_outs.append(n_out)
        out = args[-1]
        ins = [names.get(_root(plan, a), _root(plan, a)) for a in args[:-n_out] if a.home not in ("weight", "slot")]
        outs = [names.get(_root(plan, a), _root(plan, a)) for a in args[-n_out:]]
        out_name = outs[-1]
        aliases = plan.aliases.get(out.name, [])
        known = [order[a] for a in aliases + (fused or {}).get(func, []) if a in order]
        layer = None
        if known:
            i = bisect.bisect_right(keys, max(known)) - 1
            layer = anchors[i][1] if i >= 0 else None
        records.append({"index": k, "func": func, "kernel": kernel, "backend": backend,
                        "inputs": ins, "output": out_name, "shape": list(out.shape), "dtype": out.dtype,
                        "vars": aliases, "layer": layer, "_named": bool(known)})
        if n_out > 1:  # a tuple-output kernel (split): every tensor it writes, in order
            records[-1]["outputs"] = outs
        producer.update(dict.fromkeys(outs, k))
    for rec in reversed(records):  # unnamed outputs: the layer of the call reading them
        if not rec.pop("_named"):
            readers = [r for r in records if rec["output"] in r["inputs"]]
            rec["layer"] = readers[0]["layer"] if len(readers) == 1 else rec["layer"]
    for rec in records:  # concat / split kernels move data between layers, finishing none
        if rec["backend"] != "tvm" and _moves_data(rec["kernel"]):
            rec["layer"] = None
    for rec, facts in zip(records, call_work(mod, plan, n_outs)):
        rec.update(facts)
    for k, j in plan.fused.items():
        records[j]["computed_in"] = k  # run tile by tile inside call k (.levels.fusable)
    return records
