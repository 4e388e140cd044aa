"""Offload PrimFuncs: the TIR function that stands for one kernel call.

The contract (:mod:`pipeline.backend`): buffer parameters in extern-call
order with the output last, a body that is exactly one ``T.call_extern`` of
the kernel on the buffers' data pointers and int32 (or float32) scalars, and the
attributes ``c7x_kernel`` and ``c7x_offload_backend``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import tirx

from ..kernels import catalog


def backend_of(kernel: str) -> str:
    """``"mmalib"`` for TI's MMALIB kernels, ``"c7x"`` for ours (the catalog record's
    backend). Raises KeyError for a kernel the catalog does not declare."""
    return catalog.kernel(kernel).backend


@dataclass(frozen=True)
class TensorArg:
    """One buffer parameter of an offload PrimFunc."""

    name: str
    shape: tuple[int, ...]
    dtype: str


def _scalar(v) -> tirx.PrimExpr:
    """An int as an int32 immediate; a float (a ``float`` parameter of the
    requantize kernels) as a float32 immediate, which must be exact in float32."""
    if isinstance(v, float):
        if float(np.float32(v)) != v:
            raise ValueError(f"float scalar {v!r} is not a float32 value")
        return tirx.FloatImm("float32", v)
    return tirx.IntImm("int32", int(v))


def offload_primfunc(kernel: str, tensors: list[TensorArg], scalars: list) -> tirx.PrimFunc:
    """The offload PrimFunc of the contract in :mod:`pipeline.backend`.

    Parameters are ``tensors`` in extern-call order, the output buffer last;
    the body is exactly ``T.call_extern("int32", kernel, <buf>.data..., <scalars>...)``
    with each int of ``scalars`` an int32 immediate and each Python float a
    float32 one (it must be a float32 value: ValueError otherwise);
    attributes ``{"c7x_kernel": kernel, "c7x_offload_backend": "mmalib" | "c7x"}``.
    """
    bufs = [tirx.decl_buffer(t.shape, t.dtype, t.name) for t in tensors]
    args = [b.data for b in bufs] + [_scalar(v) for v in scalars]
    body = tirx.Evaluate(tirx.call_extern("int32", kernel, *args))
    return tirx.PrimFunc(bufs, body).with_attrs({"c7x_kernel": kernel,
                                                 "c7x_offload_backend": backend_of(kernel)})
