"""Offload of integer transposes to the ``c7x_permute_i8`` / ``_i16`` kernels (data movement).

Pattern (``docs/reference.md``, "Permute"): ``permute_dims(x)`` on an int8 / int16 tensor,
what the Q/DQ cleanups leave of a transpose between integer layers (window partitions of
Swin, attention's heads -> tokens, ConvNeXt's NCHW <-> NHWC), ->
``call_tir(c7x_permute_<t>, x)`` with ``x``'s shape padded to :data:`PERMUTE_RANK` axes
by leading axes of length 1. Runs after the cleanups, before the model's edges. A
permute that moves only axes of length 1 is a reshape already (``cleanup.py``).
Eligibility: int8 / int16, static shape of at most six axes, input not a
compile-time constant (those fold). Anything else stays on the scalar path with the
reason in the offload log.
"""

from __future__ import annotations

import tvm

from ..kernels.catalog import find
from ..kernels.reference import PERMUTE_RANK
from ..refusal import Declined, declining
from .graph import Graph, const_array, static_shape, var_name
from .log import OffloadLog
from .primfunc import TensorArg, offload_primfunc
from .rewrite import Offload, run_pass



def padded_permutation(shape: tuple[int, ...], axes: list[int]) -> tuple[list[int], list[int]]:
    """``(dims, perm)`` of exactly :data:`PERMUTE_RANK` axes for a transpose of ``shape`` by
    ``axes``: leading axes of length 1 added, the permutation shifted to match. Raises
    :class:`Declined` for more than six axes."""
    pad = PERMUTE_RANK - len(shape)
    if pad < 0:
        raise Declined(f"{len(shape)} axes: the kernel takes at most {PERMUTE_RANK}")
    return [1] * pad + list(shape), list(range(pad)) + [a + pad for a in axes]


def _planner(graph: Graph, binding):
    call = graph.call(binding.value, "relax.permute_dims")
    if call is None:
        return None
    x = call.args[0]
    dtype = str(x.ty.dtype) if hasattr(x.ty, "dtype") else ""
    if find("permute", dtype) is None:
        return None  # a float transpose: part of a scalar layer
    with declining(var_name(binding.var), "permute", dtype):
        shape, out_shape = static_shape(x), static_shape(binding.var)
        if shape is None or out_shape is None:
            raise Declined("dynamic shape")
        if const_array(x) is not None:
            raise Declined("input is a compile-time constant")
        axes = list(range(len(shape)))[::-1] if call.attrs.axes is None else [int(a) for a in call.attrs.axes]
        dims, perm = padded_permutation(shape, axes)
        kernel = find("permute", dtype)
        prim = offload_primfunc(kernel, [TensorArg("data", shape, dtype), TensorArg("out", out_shape, dtype)],
                                [*dims, *perm])

        def build(ctx):
            return ctx.call_offload(prim, [x], out_shape, dtype)

        return Offload(var_name(binding.var), "permute", dtype, kernel, build)


def offload_permute(mod: tvm.IRModule, log: OffloadLog | None = None) -> tvm.IRModule:
    """int8 / int16 ``permute_dims`` -> ``c7x_permute_i8`` / ``_i16(in, out, d0..d5, p0..p5)``
    (module docstring)."""
    return run_pass(mod, log, "permute", _planner)
