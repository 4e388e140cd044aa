"""The kernel catalog: one record per C7x / MMALIB kernel, everything the flow knows about it.

A kernel is declared once, here, by a :class:`Kernel` record: its C entry point
(``c7x_kernels.h``; the body in ``c7x_kernels_ref.c``), the offload pass that
emits it (``pipeline.backend.passes.<module>.<function>``, run in the order of
``passes/pipeline.py``), its numpy twin and geometry check
(:mod:`.reference`), the engine the performance model costs it on, and how the
memory plan may tile it. Every other table is derived from this one:
``reference.KERNELS``, ``reference.buffer_shapes``, ``tiling.TILEABLE``,
``call_work``'s MAC kernels and ``perf.model.engine``. Passes and the performance model
look a kernel up by operation and dtype (:func:`find`), so its name string is written
here and nowhere else in ``pipeline/`` (``tests/backend/test_catalog.py``).

Adding a kernel: write its C body (int8 and int16 variants from one macro, as
the others in ``c7x_kernels_ref.c``) and prototype, its numpy twin and geometry
in :mod:`.reference` (named like the kernel), the pass that emits it (which asks
:func:`find` for it), and one record below.
``tests/backend/test_catalog.py`` checks that each record's pieces exist and
agree (the header, the twin's arguments, the pass).

This module imports numpy only (the reference loads torch lazily), so the
performance model can read it without torch or tvm.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from . import reference as ref

#: engines of the performance model (``perf/model.py``; TVM's scalar C is its fourth): the MMA at full rate, the
#: MMA with one lane per channel (depthwise), the vector unit (elementwise kernels)
ENGINES = ("mma", "mma_depthwise", "vector")


@dataclass(frozen=True)
class Tileable:
    """How the memory plan tiles a kernel over output channels (``backend/tiling.py``).

    ``c_out``: indices, among the scalars after the ``pointers`` pointer arguments (six:
    in, w, bias, scale, shift, out; two for an elementwise kernel: in, out), of the
    output-channel count (C_out / N, and a depthwise's num_groups; an elementwise
    kernel's element count n); ``kind``: "conv" (NCHW output), "fc" (``[..., N]``
    output), "depthwise" or "elementwise" (one element per "channel"); ``rows``: index
    of the scalar that must be 1 (FC: M), or None."""

    c_out: tuple[int, ...]
    kind: str
    rows: int | None = None
    pointers: int = 6

    @property
    def streams(self) -> str:
        """What a tile copies into L2: "input" for a depthwise conv (its channels are
        independent, its weights small) and an elementwise kernel, "weights" otherwise."""
        return "input" if self.kind in ("depthwise", "elementwise") else "weights"


@dataclass(frozen=True)
class Kernel:
    """One kernel. ``name``: the C entry point and its numpy twin's name (:mod:`.reference`);
    ``op`` / ``dtypes`` / ``variant``: what the passes and the performance model look it up by
    (:func:`find`; ``dtypes`` the operand dtypes, input first, e.g. ``("int8", "int16")`` for a
    requantize, ``("float32", "int8")`` for the input quantize); ``offload``: the passes that
    emit it, ``"<module>.<function>"`` under ``pipeline.backend.passes``; ``geometry``: the
    :class:`reference._Geometry` that checks the scalars and gives the buffer shapes;
    ``engine``: one of :data:`ENGINES`; ``tiling``: a :class:`Tileable`, or None when the plan
    never tiles it; ``vector_factor``: cycles per element of a vector kernel, in units of one
    element per lane per cycle (1: one pass at the operand's width; assumed for kernels that
    make several passes or work in 64-bit lanes, docs/estimate.md)."""

    name: str
    op: str
    dtypes: tuple[str, ...]
    offload: tuple[str, ...]
    geometry: type
    engine: str
    tiling: Tileable | None = None
    vector_factor: float = 1.0
    variant: str = ""

    @property
    def reference(self) -> Callable[..., int]:
        """The numpy twin: the function of :mod:`.reference` named like the kernel (same
        arguments as the C, plus ``rounding``)."""
        return getattr(ref, self.name)

    @property
    def backend(self) -> str:
        """"mmalib" for TI's MMALIB kernels, "c7x" for ours (the manifest's backend)."""
        return "mmalib" if self.name.startswith("mmalib_") else "c7x"

    @property
    def edge(self) -> bool:
        """True for the model's edges (input quantize, output dequantize): kernels, but no layer of the model."""
        return self.op in EDGES

    @property
    def layer(self) -> bool:
        """False for the edges and for data movement (concat, permute, take): kernels that compute
        no layer of the model (``backend/manifest.py``)."""
        return not (self.edge or self.op in MOVEMENT)

    @property
    def macs(self) -> bool:
        """True for a multiply-accumulate kernel (its work is counted in MACs)."""
        return self.engine != "vector"


#: ops of the model's edges and of data movement (kernels that compute no layer)
EDGES, MOVEMENT = ("quantize", "dequantize"), ("concat", "permute", "take")

_CONV, _FC, _DW = Tileable((3,), "conv"), Tileable((2,), "fc", rows=0), Tileable((0, 11), "depthwise")
#: (in, out, n, ...): streamed in runs of elements when its input spilled to DDR
_ELEMENTWISE = Tileable((0,), "elementwise", pointers=2)
_I8, _I16 = ("int8",), ("int16",)


def _records() -> tuple[Kernel, ...]:
    def K(name, op, dtypes, offload, geometry, engine, tiling=None, **kw):   # noqa: N802
        return Kernel(name, op, dtypes, (offload,) if isinstance(offload, str) else offload, geometry, engine,
                      tiling, **kw)

    g = ref
    return (
        K("mmalib_conv2d_i8", "conv2d", _I8, "conv.offload_conv2d_i8", g.ConvGeometry, "mma", _CONV),
        K("mmalib_conv2d_i16", "conv2d", _I16, "conv.offload_conv2d_i16", g.ConvGeometry, "mma", _CONV),
        K("mmalib_conv2d_i8_grouped_loop", "conv2d", _I8, "conv.offload_conv2d_i8", g.ConvGeometry, "mma",
          variant="grouped"),
        K("mmalib_depthwise_conv2d_i8", "depthwise_conv2d", _I8, "depthwise.offload_depthwise_conv2d_i8",
          g.DepthwiseGeometry, "mma_depthwise", _DW),
        K("mmalib_depthwise_conv2d_i16", "depthwise_conv2d", _I16, "depthwise.offload_depthwise_conv2d_i16",
          g.DepthwiseGeometry, "mma_depthwise", _DW),
        K("mmalib_matmul_bias_i8", "matmul_bias", _I8, "fc.offload_fc_i8", g.MatmulGeometry, "mma", _FC),
        K("mmalib_matmul_bias_i16", "matmul_bias", _I16, "fc.offload_fc_i16", g.MatmulGeometry, "mma", _FC),
        # an activation x activation matmul: MACs on the MMA, never tiled (both operands are activations)
        K("mmalib_batch_matmul_i8", "batch_matmul", _I8, "matmul.offload_batch_matmul_i8",
          g.BatchMatmulGeometry, "mma"),
        K("mmalib_batch_matmul_i16", "batch_matmul", _I16, "matmul.offload_batch_matmul_i16",
          g.BatchMatmulGeometry, "mma"),
        K("c7x_int8_residual_add_relu", "residual_add", _I8, "residual.offload_residual_add_i8",
          g.ElementwiseGeometry, "vector"),
        K("c7x_int16_residual_add_relu", "residual_add", _I16, "residual.offload_residual_add_i16",
          g.ElementwiseGeometry, "vector"),
        K("c7x_int8_broadcast_add", "broadcast_add", _I8, "residual.offload_residual_add_i8",
          g.BroadcastAddGeometry, "vector"),
        K("c7x_int16_broadcast_add", "broadcast_add", _I16, "residual.offload_residual_add_i16",
          g.BroadcastAddGeometry, "vector"),
        K("c7x_int8_max_pool", "max_pool", _I8, "pool.offload_max_pool2d_i8", g.PoolGeometry, "vector"),
        K("c7x_int8_max_pool_tidl", "max_pool", _I8, "pool.offload_max_pool2d_i8", g.PoolGeometry, "vector",
          variant="tidl"),
        K("c7x_int16_max_pool", "max_pool", _I16, "pool.offload_max_pool2d_i16", g.PoolGeometry, "vector"),
        K("c7x_int8_relu", "relu", _I8, "relu.offload_relu_i8", g.ElementwiseGeometry, "vector"),
        K("c7x_int8_clamp", "clamp", _I8, "relu.offload_relu_i8", g.ElementwiseGeometry, "vector"),
        K("c7x_int8_channel_mul", "channel_mul", _I8, "channel_mul.offload_channel_mul", g.ChannelMulGeometry,
          "vector"),
        K("c7x_int16_channel_mul", "channel_mul", _I16, "channel_mul.offload_channel_mul", g.ChannelMulGeometry,
          "vector"),
        K("c7x_int8_lut", "lut", _I8, "activation.offload_activation_lut_i8", g.ElementwiseGeometry, "vector"),
        # assumed vector factors (docs/estimate.md): LayerNorm makes two passes in 64-bit lanes (sums,
        # then two multiplies per element), softmax three (max; table gather and 64-bit sum; multiply)
        K("c7x_int8_softmax", "softmax", _I8, "softmax.offload_softmax_i8", g.SoftmaxGeometry, "vector",
          vector_factor=12.0),
        K("c7x_int8_layer_norm", "layer_norm", _I8, "layer_norm.offload_layer_norm_i8", g.LayerNormGeometry,
          "vector", vector_factor=24.0),
        K("c7x_int8_l2_normalize", "l2_normalize", _I8, "l2_normalize.offload_l2_normalize_i8",
          g.LayerNormGeometry, "vector", vector_factor=24.0),
        K("c7x_requantize_i8_i16", "requantize", ("int8", "int16"), "requantize.offload_requantize",
          g.ElementwiseGeometry, "vector", _ELEMENTWISE),
        K("c7x_requantize_i16_i8", "requantize", ("int16", "int8"), "requantize.offload_requantize",
          g.ElementwiseGeometry, "vector", _ELEMENTWISE),
        # same-dtype requantize: a Q/DQ pair with new parameters, and a max pool's output step
        K("c7x_requantize_i8_i8", "requantize", ("int8", "int8"),
          ("requantize.offload_requantize", "pool.offload_max_pool2d_i8"), g.ElementwiseGeometry, "vector",
          _ELEMENTWISE),
        K("c7x_requantize_i16_i16", "requantize", ("int16", "int16"),
          ("requantize.offload_requantize", "pool.offload_max_pool2d_i16"), g.ElementwiseGeometry, "vector",
          _ELEMENTWISE),
        K("c7x_int8_global_avg_pool", "global_avg_pool", _I8, "avg_pool.offload_global_avg_pool",
          g.GlobalPoolGeometry, "vector"),
        K("c7x_int16_global_avg_pool", "global_avg_pool", _I16, "avg_pool.offload_global_avg_pool",
          g.GlobalPoolGeometry, "vector"),
        K("c7x_int8_avg_pool", "avg_pool", _I8, "avg_pool.offload_avg_pool2d", g.AvgPoolGeometry, "vector"),
        K("c7x_int16_avg_pool", "avg_pool", _I16, "avg_pool.offload_avg_pool2d", g.AvgPoolGeometry, "vector"),
        K("c7x_int8_channel_affine", "channel_affine", _I8, "channel_affine.offload_channel_affine",
          g.ChannelAffineGeometry, "vector"),
        K("c7x_int16_channel_affine", "channel_affine", _I16, "channel_affine.offload_channel_affine",
          g.ChannelAffineGeometry, "vector"),
        K("c7x_quantize_f32_i8", "quantize", ("float32", "int8"), "edges.offload_input_quantize",
          g.ElementwiseGeometry, "vector", _ELEMENTWISE),
        K("c7x_quantize_f32_i16", "quantize", ("float32", "int16"), "edges.offload_input_quantize",
          g.ElementwiseGeometry, "vector", _ELEMENTWISE),
        K("c7x_dequantize_i8_f32", "dequantize", ("int8", "float32"), "edges.offload_output_dequantize",
          g.DequantizeGeometry, "vector"),
        K("c7x_dequantize_i16_f32", "dequantize", ("int16", "float32"), "edges.offload_output_dequantize",
          g.DequantizeGeometry, "vector"),
        # data movement (a multi-dimensional DMA on the C7x; costed as one vector pass, assumed)
        K("c7x_permute_i8", "permute", _I8, "permute.offload_permute", g.PermuteGeometry, "vector"),
        K("c7x_permute_i16", "permute", _I16, "permute.offload_permute", g.PermuteGeometry, "vector"),
        K("c7x_take_i8", "take", _I8, "take.offload_take", g.TakeGeometry, "vector"),
        K("c7x_take_i16", "take", _I16, "take.offload_take", g.TakeGeometry, "vector"),
        # one kernel per segment count (variant "<k>"): c7x_concat<k>_i8 / _i16
        *(K(f"c7x_concat{k}_{t}", "concat", (d,), "concat.offload_concat", g.ConcatGeometry, "vector",
            variant=str(k))
          for k in range(1, ref.MAX_SEGMENTS + 1) for t, d in (("i8", "int8"), ("i16", "int16"))),
    )


#: extern name -> record, in the header's order
CATALOG: dict[str, Kernel] = {k.name: k for k in _records()}


def kernel(name: str) -> Kernel:
    """The record of kernel ``name``. Raises KeyError naming it when unknown."""
    try:
        return CATALOG[name]
    except KeyError:
        raise KeyError(f"unknown C7x kernel {name!r}: not in pipeline/backend/kernels/catalog.py") from None


_BY_OP: dict[tuple, str] = {(k.op, k.dtypes, k.variant): k.name for k in CATALOG.values()}


def find(op: str, *dtypes: str, variant: str = "") -> str | None:
    """The C entry point of kernel ``op`` on ``dtypes`` (operand dtypes, input first; one
    dtype for a kernel whose operands share it), e.g. ``find("conv2d", "int8")`` ->
    ``"mmalib_conv2d_i8"``, ``find("requantize", "int16", "int8")``, ``find("concat",
    "int8", variant="3")``; None when the catalog has no such kernel (the pass declines).
    The one way code other than this module names a kernel."""
    return _BY_OP.get((op, tuple(dtypes), variant))


def of_op(op: str) -> tuple[Kernel, ...]:
    """Every record of ``op``, in the header's order."""
    return tuple(k for k in CATALOG.values() if k.op == op)


#: extern name -> numpy twin (``reference``'s functions)
KERNELS: dict[str, Callable[..., int]] = {name: k.reference for name, k in CATALOG.items()}


def geometry(name: str, *args):
    """The geometry (:mod:`.reference`) of kernel ``name`` called with ``args`` in the C order.
    Raises ``KeyError`` for an unknown kernel, ``TypeError`` for a wrong argument count."""
    rec = kernel(name)
    arguments = inspect.signature(rec.reference).bind(*args).arguments
    return rec.geometry.from_arguments({k.rstrip("_"): v for k, v in arguments.items()})


def buffer_shapes(name: str, *args) -> dict[str, tuple[int, ...]]:
    """Shapes of the pointer arguments of kernel ``name`` (keys: C parameter
    names, e.g. "in", "w", "out") implied by its scalar arguments, given in the
    C order like a call. Empty when the scalars are invalid: the kernel then
    returns an error before touching any buffer. Raises ``KeyError`` for an
    unknown kernel, ``TypeError`` for a wrong argument count."""
    g = geometry(name, *args)
    return g.shapes() if g.status() == ref.C7X_OK else {}
