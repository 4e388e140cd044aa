"""Where each layer came from: PyTorch module path and source line, carried
from torch.export's node metadata through PT2E and the Relax import.

torch.export records ``nn_module_stack`` and ``stack_trace`` on every node of
the float program, but convert's re-export replaces ``nn_module_stack`` with
its wrapper module. ``node.meta["custom"]`` survives prepare, convert,
re-export and ``torch.export.save`` (it is where PT2E's numeric debugger keeps
its handles), so :func:`tag_program` copies the provenance there once, on the
float program. :func:`attribute_bindings` then maps every binding of the
imported Relax ``main`` to the FX node it was translated from.

A layer's id is the name of its node in the float program (``conv2d_3``):
stable across builds and stages, and shared by the offload manifest, the
per-layer profile and the per-layer numerics.
"""

from __future__ import annotations

import re

KEY = "c7x_layer"

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)\n\s*(?P<code>[^\n]*)')
#: Frames inside these packages are framework plumbing, not the user's model.
_FRAMEWORK = ("/torch/", "/torchao/", "/tvm/")


def _short_path(path: str, root: str | None = None) -> str:
    """``.../site-packages/torchvision/models/x.py`` -> ``torchvision/models/x.py``;
    a file of the project (under ``root``) -> its path relative to the project,
    so the artifacts do not depend on where the project lives."""
    marker = "site-packages/"
    if marker in path:
        return path.split(marker, 1)[1]
    if root and path.startswith(root.rstrip("/") + "/"):
        return path[len(root.rstrip("/")) + 1:]
    return path


def source_line(stack_trace: str | None, root: str | None = None) -> tuple[str | None, str | None]:
    """``("file.py:64", "return self.conv(x)")`` of the innermost frame of
    ``stack_trace`` outside torch itself (the model code that called the op),
    or ``(None, None)``."""
    frames = list(_FRAME.finditer(stack_trace or ""))
    user = [f for f in frames if not any(p in f["file"] for p in _FRAMEWORK)]
    if not user:
        return None, None
    f = user[-1]
    return f"{_short_path(f['file'], root)}:{f['line']}", f["code"].strip()


def node_provenance(node, root: str | None = None) -> dict | None:
    """Provenance of one FX node of the float program, from its metadata:
    ``{"id", "module", "module_type", "source", "code"}`` (None for nodes
    without ``nn_module_stack``, e.g. placeholders)."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    path, mtype = list(stack.values())[-1]
    mtype = mtype if isinstance(mtype, str) else f"{mtype.__module__}.{mtype.__qualname__}"
    source, code = source_line(node.meta.get("stack_trace"), root)
    return {"id": node.name, "module": path, "module_type": mtype, "source": source, "code": code}


def tag_program(ep, root: str | None = None) -> int:
    """Store :func:`node_provenance` in ``node.meta["custom"][KEY]`` for every
    ``call_function`` node of the float ExportedProgram ``ep`` (in place);
    source files under ``root`` (the project) are named relative to it.
    Returns how many nodes were tagged."""
    n = 0
    for node in ep.graph.nodes:
        if node.op != "call_function":
            continue
        prov = node_provenance(node, root)
        if prov is not None:
            node.meta.setdefault("custom", {})[KEY] = prov
            n += 1
    return n


def _tagged(node, seen: int = 0) -> dict | None:
    """The provenance of an FX node; a Q/DQ node inserted by PT2E has none and
    takes that of the tensor it quantizes (its first argument)."""
    prov = node.meta.get("custom", {}).get(KEY)
    if prov is not None or seen > 8:
        return prov
    first = node.args[0] if node.args else None
    if getattr(first, "op", None) == "call_function" and "quantize" in str(node.target):
        return _tagged(first, seen + 1)
    return None


def attribute_bindings(main, env: dict) -> dict[str, dict]:
    """Map binding names of the imported Relax ``main`` to FX provenance.

    ``env``: the importer's FX node -> Relax value table. Each FX node's
    translation emits a contiguous run of bindings ending in the node's own
    value, so a binding belongs to the first node whose value follows it.
    Returns ``{binding name: {**provenance, "fx_node", "fx_op"}}``; the
    provenance fields are None for a node without any (a weight's dequantize).
    """
    from tvm import relax

    by_var = {}
    for node, value in env.items():
        if isinstance(value, relax.Var) and getattr(node, "op", None) == "call_function":
            by_var.setdefault(value.name, node)
    out, pending = {}, []
    for block in main.body.blocks:
        for b in block.bindings:
            pending.append(b.var.name)
            node = by_var.get(b.var.name)
            if node is None:
                continue
            prov = _tagged(node) or dict.fromkeys(("id", "module", "module_type", "source", "code"))
            for name in pending:
                out[name] = {**prov, "fx_node": node.name, "fx_op": str(node.target)}
            pending = []
    return out


def binding_names(main, layers: dict[str, dict]) -> dict[str, str]:
    """New names for the bindings of ``main``: the FX node's name for the
    binding that holds a node's value (``conv2d_3``), ``<node>__<k>`` for the
    helper bindings before it; ``output`` for the returned value.

    FX names never contain ``__`` (aten op names), so the helpers cannot
    collide with them, and none looks like TVM's fresh ``lv<N>`` names, which
    passes after the import create: a layer's name means that layer only.
    """
    groups: dict[str, list[str]] = {}
    for block in main.body.blocks:
        for b in block.bindings:
            if b.var.name in layers:
                groups.setdefault(layers[b.var.name]["fx_node"], []).append(b.var.name)
    out = {}
    for node, names in groups.items():
        *helpers, last = names
        out[last] = node
        out.update({h: f"{node}__{k}" for k, h in enumerate(helpers)})
    # The rest (the returned tuple) too: no importer name ("gv", "lv<N>") may
    # survive, since later passes make fresh names of that form.
    rest = [b.var.name for block in main.body.blocks for b in block.bindings if b.var.name not in out]
    out.update({r: "output" if k == 0 else f"output__{k}" for k, r in enumerate(rest)})
    if len(set(out.values())) != len(out):
        return {}  # keep the importer's names rather than make two bindings share one
    return out


def rename_bindings(mod, names: dict[str, str]):
    """``mod`` with the bindings of ``main`` renamed by ``names`` (old -> new)."""
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class _Renamer(PyExprMutator):
        def _renamed(self, var, cls):
            new = names.get(var.name)
            return var if new is None else cls(new, var.ty)

        def visit_var_def_(self, var):
            return self._renamed(var, relax.Var)

        def visit_dataflow_var_def_(self, var):
            return self._renamed(var, relax.DataflowVar)

    renamer = _Renamer(mod)
    main = renamer.visit_expr(mod["main"])
    out = mod.__class__({gv: f for gv, f in mod.functions.items() if gv.name_hint != "main"}, attrs=mod.attrs)
    out["main"] = main
    return out
