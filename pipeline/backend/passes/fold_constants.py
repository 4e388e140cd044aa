"""Compile-time evaluation of the input-independent subgraphs of a model.

Some layers compute what depends only on shapes and weights: Swin's shifted-window
attention mask (arange, mod, equal, where ...) and Swin V2's continuous position-bias
MLP (a small MLP over a constant coordinate table). Left in the graph they are counted
as layers (and, where an offload pass claims an FC of them, run on every inference).
:func:`fold_constant_subgraphs` evaluates each such subgraph once, at compile time,
with TVM on the host (``tvm.compile`` for ``llvm``, the Relax VM), and replaces it by
its value, a constant that goes to ``weights.bin`` like any weight.

Which bindings: every ``R.<op>(...)`` binding whose arguments are all constants (or
such bindings); evaluated are the *frontier* ones, read by a binding that is not
constant or by the output. A frontier whose subgraph only moves or requantizes
constants (``dequantize``, ``quantize``, ``reshape``, ``permute_dims``, ...: how the
importer writes a weight, ``dq(int8 W)``) is left alone: the offload passes read
those patterns, and ``FoldConstant`` handles them after offload. For the same reason a
frontier ``dq(x)`` is folded at ``x``: the integer constant stays behind its dequantize.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

#: ops that only move, reshape or (de)quantize: a constant subgraph of these alone is a
#: weight as the importer writes it, which the offload passes must see unfolded
LAYOUT_OPS = frozenset({"relax.dequantize", "relax.quantize", "relax.reshape", "relax.permute_dims",
                        "relax.expand_dims", "relax.squeeze", "relax.astype", "relax.broadcast_to",
                        "relax.flatten"})


def _op_name(value) -> str | None:
    return value.op.name if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) else None


def _leaves(expr):
    """Every leaf argument of a call (tuples flattened)."""
    if isinstance(expr, relax.Tuple):
        for f in expr.fields:
            yield from _leaves(f)
    else:
        yield expr


def _leaves_of_call(call):
    for a in call.args:
        yield from _leaves(a)


def _is_const(arg, const) -> bool:
    """A leaf argument known at compile time: anything but a variable (constants, shapes,
    prim values, dtypes; arguments are atoms in Relax's normal form), or a constant binding."""
    return not isinstance(arg, relax.Var) or arg in const


def constant_bindings(func: relax.Function) -> dict:
    """``{var: binding value}`` of the bindings of ``func`` computed from constants only, in order."""
    const: dict = {}
    for block in func.body.blocks:
        for b in block.bindings:
            v = b.value
            name = _op_name(v)
            if name is not None and name != "relax.call_tir" and all(_is_const(a, const) for a in _leaves_of_call(v)):
                const[b.var] = v
            elif isinstance(v, relax.TupleGetItem) and isinstance(v.tuple_value, relax.Var) and v.tuple_value in const:
                const[b.var] = v
    return const


def _users(func: relax.Function) -> dict:
    """``{var: [binding vars reading it]}``; None stands for the function's output."""
    users: dict = {}
    for block in func.body.blocks:
        for b in block.bindings:
            for leaf in _vars_in(b.value):
                users.setdefault(leaf, []).append(b.var)
    for leaf in _vars_in(func.body.body):
        users.setdefault(leaf, []).append(None)
    return users


def _vars_in(expr) -> list:
    out = []
    relax.analysis.post_order_visit(expr, lambda e: out.append(e) if isinstance(e, relax.Var) else None)
    return out


def _remap(expr, env: dict):
    """``expr`` with the variables of ``env`` replaced (calls, tuples, tuple items)."""
    if isinstance(expr, relax.Var):
        return env.get(expr, expr)
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([_remap(f, env) for f in expr.fields])
    if isinstance(expr, relax.TupleGetItem):
        return relax.TupleGetItem(_remap(expr.tuple_value, env), expr.index)
    if isinstance(expr, relax.Call):
        return relax.Call(expr.op, [_remap(a, env) for a in expr.args], expr.attrs, expr.ty_args)
    return expr


def _subgraph(var, const: dict) -> set:
    """The constant bindings ``var`` depends on (itself included)."""
    need, stack = set(), [var]
    while stack:
        v = stack.pop()
        if v in need:
            continue
        need.add(v)
        stack += [u for u in _vars_in(const[v]) if u in const]
    return need


def _evaluate(const: dict, targets: list) -> list[np.ndarray]:
    """The values of ``targets`` (constant bindings), computed by TVM on the host
    (``tvm.compile`` for llvm, the Relax VM): one function of no argument returning them all."""
    need = set().union(*(_subgraph(t, const) for t in targets))
    bb = relax.BlockBuilder()
    env = {}
    with bb.function("main", []):
        for v in (v for v in const if v in need):
            env[v] = bb.emit(_remap(const[v], env), name_hint=v.name)
        bb.emit_func_output(relax.Tuple([env[t] for t in targets]))
    vm = relax.VirtualMachine(tvm.compile(bb.get(), target="llvm"), tvm.cpu())
    out = vm["main"]()
    return [out[i].numpy() for i in range(len(targets))]


def _fold_point(var, const: dict):
    """What to evaluate for the frontier ``var``: itself, or, when it is the dequantize of a
    constant binding (a quantized mask or bias table: the quantizer observed it), that binding,
    so ``dq(integer constant)`` is left, the pattern the offload passes read (Swin's window
    mask on the broadcast add)."""
    value = const[var]
    inner = value.args[0] if _op_name(value) == "relax.dequantize" else None
    return inner if isinstance(inner, relax.Var) and inner in const else var


def fold_constant_subgraphs(mod: tvm.IRModule) -> tuple[tvm.IRModule, list[tuple[str, str]]]:
    """Replace every input-independent computing subgraph of ``mod["main"]`` by its value
    (module docstring). ``mod``: the imported module, parameters bound as constants, before
    any offload pass. Returns the new module and ``(binding name, op name)`` of every binding
    folded away (all the constant bindings each folded frontier depended on), in binding
    order; the module is returned unchanged when there is nothing to fold."""
    func = mod["main"]
    const = constant_bindings(func)
    users = _users(func)
    frontier = [v for v in const if any(u is None or u not in const for u in users.get(v, []))]
    points = dict.fromkeys(_fold_point(v, const) for v in frontier)
    targets = [v for v in points if isinstance(v.ty, relax.TensorType)   # (a tuple's items are frontiers)
               and any(_op_name(const[u]) not in LAYOUT_OPS for u in _subgraph(v, const))]
    if not targets:
        return mod, []
    values = _evaluate(const, targets)
    folded = {t: relax.const(val, str(t.ty.dtype)) for t, val in zip(targets, values)}
    new = tvm.IRModule(dict(mod.functions_items()))
    new["main"] = _replace_uses(func, folded)
    new = relax.transform.DeadCodeElimination(["main"])(new)
    kept = {b.var.name for block in new["main"].body.blocks for b in block.bindings}
    return new, [(v.name, _op_name(const[v]) or "tuple item") for v in const if v.name not in kept]


def _replace_uses(func: relax.Function, values: dict) -> relax.Function:
    """``func`` with every use of a variable of ``values`` replaced by its constant (the
    bindings that computed them are then dead: DeadCodeElimination drops them)."""
    blocks = [type(block)([relax.VarBinding(b.var, _remap(b.value, values)) for b in block.bindings])
              for block in func.body.blocks]
    body = relax.SeqExpr(blocks, _remap(func.body.body, values))
    return relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)
