"""Read back the offload calls of a rewritten module (for tests, the manifest and consumers).

An offload call is a ``main`` binding ``v = R.call_tir(gv, (args...), out_ty)``
whose ``gv`` is an offload PrimFunc (attribute ``c7x_kernel``; contract in
:mod:`pipeline.backend`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax, tirx

from ..kernels import catalog
from .graph import Graph, const_array

_CALL_TIR = "relax.call_tir"


def extern_call(prim: tirx.PrimFunc) -> tirx.Call:
    """The ``T.call_extern`` of an offload PrimFunc (also found inside a root block)."""
    body = prim.body
    while not isinstance(body, tirx.Evaluate):
        inner = getattr(body, "block", None) or getattr(body, "body", None)
        if inner is None:
            raise ValueError(f"no call_extern in offload PrimFunc body {type(prim.body).__name__}")
        body = inner
    return body.value


@dataclass
class OffloadCall:
    """One ``call_tir`` of an offload PrimFunc in ``main``.

    ``var``: binding name; ``func``: PrimFunc name; ``args``: the Relax
    arguments (activations are Vars, folded parameters constants);
    ``prim``: the PrimFunc.
    """

    var: str
    func: str
    args: list
    prim: tirx.PrimFunc

    @property
    def kernel(self) -> str:
        """The ``c7x_kernel`` attribute."""
        return str(self.prim.attrs["c7x_kernel"])

    @property
    def backend(self) -> str:
        """The ``c7x_offload_backend`` attribute ("mmalib" | "c7x")."""
        return str(self.prim.attrs["c7x_offload_backend"])

    @property
    def edge(self) -> bool:
        """True for the input quantize / output dequantize kernels (``passes/edges.py``)."""
        return catalog.kernel(self.kernel).edge

    @property
    def extern(self) -> tirx.Call:
        """The body's ``call_extern``."""
        return extern_call(self.prim)

    @property
    def extern_name(self) -> str:
        """The extern symbol the body calls (first argument of ``call_extern``)."""
        return str(self.extern.args[0].value)

    @property
    def buffer_args(self) -> list[int]:
        """For each pointer argument of the extern (``<buf>.data``, which TVM 0.27
        writes as ``tirx.buffer_data(buf)``), the index of ``buf`` among the
        PrimFunc's parameters, in call order."""
        params = list(self.prim.params)
        order = []
        for a in self.extern.args[1:]:
            if isinstance(a, tirx.IntImm):
                break
            order.append(next(i for i, p in enumerate(params) if p.same_as(a.args[0])))
        return order

    @property
    def scalars(self) -> list:
        """The scalar arguments of the extern, in order: ints (int32) and floats
        (the float32 scales of the requantize kernels)."""
        return [int(a.value) if isinstance(a, tirx.IntImm) else float(a.value)
                for a in self.extern.args[1:] if isinstance(a, (tirx.IntImm, tirx.FloatImm))]

    def const(self, i: int) -> np.ndarray | None:
        """numpy value of Relax argument ``i`` if it is a constant."""
        return const_array(self.args[i])


def offload_calls(mod: tvm.IRModule) -> list[OffloadCall]:
    """All offload calls of ``mod["main"]`` in graph order."""
    calls = []
    for b in Graph(mod["main"]).bindings:
        v = b.value
        if not (isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) and v.op.name == _CALL_TIR):
            continue
        gv = v.args[0]
        prim = mod[gv]
        if isinstance(prim, tirx.PrimFunc) and prim.attrs is not None and "c7x_kernel" in prim.attrs:
            calls.append(OffloadCall(b.var.name, gv.name_hint, list(v.args[1].fields), prim))
    return calls


def layer_calls(mod: tvm.IRModule) -> list[OffloadCall]:
    """The offload calls of the model's layers: :func:`offload_calls` without the
    input quantize, output dequantize and data-movement (concat, split) kernels."""
    return [c for c in offload_calls(mod) if catalog.kernel(c.kernel).layer]
