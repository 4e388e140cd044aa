"""The kernel catalog: one record per C7x / MMALIB kernel, everything the flow knows about it.

A kernel is declared once, here, by a :class:`Kernel` record: its C entry point
(``c7x_kernels.h``; the body in ``c7x_kernels_ref.c``), the offload pass that
emits it (``pipeline.backend.passes.<module>.<function>``, run in the order of
``passes/pipeline.py``), its numpy twin and geometry check
(:mod:`.reference`), the engine the performance model costs it on, and how the
memory plan may tile it. Every other table is derived from this one:
``reference.KERNELS``, ``reference.buffer_shapes``, ``tiling.TILEABLE``,
``call_work``'s MAC kernels and ``perf.model.engine``.

Adding a kernel: write its C body (int8 and int16 variants from one macro, as
the others in ``c7x_kernels_ref.c``) and prototype, its numpy twin and geometry
in :mod:`.reference`, the pass that emits it, and one record below.
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
    """One kernel. ``name``: the C entry point and the twin's name; ``offload``: the pass
    that emits it, ``"<module>.<function>"`` under ``pipeline.backend.passes``;
    ``reference``: the numpy twin (same arguments as the C, plus ``rounding``);
    ``geometry``: the :class:`reference._Geometry` that checks the scalars and gives the
    buffer shapes; ``engine``: one of :data:`ENGINES`; ``tiling``: a :class:`Tileable`,
    or None when the plan never tiles it; ``vector_factor``: cycles per element of a
    vector kernel, in units of one element per lane per cycle (1: one pass at the
    operand's width; assumed for kernels that make several passes or work in 64-bit
    lanes, docs/estimate.md)."""

    name: str
    offload: str
    reference: Callable[..., int]
    geometry: type
    engine: str
    tiling: Tileable | None = None
    vector_factor: float = 1.0

    @property
    def backend(self) -> str:
        """"mmalib" for TI's MMALIB kernels, "c7x" for ours (the manifest's backend)."""
        return "mmalib" if self.name.startswith("mmalib_") else "c7x"

    @property
    def edge(self) -> bool:
        """True for the model's edges (input quantize, output dequantize): kernels, but no layer of the model."""
        return self.offload.startswith("edges.")

    @property
    def layer(self) -> bool:
        """False for the edges and for data movement (concat, split, permute, take): kernels that compute
        no layer of the model (``backend/manifest.py``)."""
        return not (self.edge or self.offload.startswith(("concat.", "permute.", "take.")))

    @property
    def macs(self) -> bool:
        """True for a multiply-accumulate kernel (its work is counted in MACs)."""
        return self.engine != "vector"


_CONV, _FC, _DW = Tileable((3,), "conv"), Tileable((2,), "fc", rows=0), Tileable((0, 11), "depthwise")
#: (in, out, n, ...): streamed in runs of elements when its input spilled to DDR
_ELEMENTWISE = Tileable((0,), "elementwise", pointers=2)


def _records() -> tuple[Kernel, ...]:
    K = Kernel
    return (
        K("mmalib_conv2d_i8", "conv.offload_conv2d_i8", ref.mmalib_conv2d_i8, ref.ConvGeometry, "mma", _CONV),
        K("mmalib_conv2d_i16", "conv.offload_conv2d_i16", ref.mmalib_conv2d_i16, ref.ConvGeometry, "mma", _CONV),
        K("mmalib_conv2d_i8_grouped_loop", "conv.offload_conv2d_i8", ref.mmalib_conv2d_i8_grouped_loop,
          ref.ConvGeometry, "mma"),
        K("mmalib_depthwise_conv2d_i8", "depthwise.offload_depthwise_conv2d_i8", ref.mmalib_depthwise_conv2d_i8,
          ref.DepthwiseGeometry, "mma_depthwise", _DW),
        K("mmalib_depthwise_conv2d_i16", "depthwise.offload_depthwise_conv2d_i16",
          ref.mmalib_depthwise_conv2d_i16, ref.DepthwiseGeometry, "mma_depthwise", _DW),
        K("mmalib_matmul_bias_i8", "fc.offload_fc_i8", ref.mmalib_matmul_bias_i8, ref.MatmulGeometry, "mma", _FC),
        K("mmalib_matmul_bias_i16", "fc.offload_fc_i16", ref.mmalib_matmul_bias_i16, ref.MatmulGeometry, "mma",
          _FC),
        # an activation x activation matmul: MACs on the MMA, never tiled (both operands are activations)
        K("mmalib_batch_matmul_i8", "matmul.offload_batch_matmul_i8", ref.mmalib_batch_matmul_i8,
          ref.BatchMatmulGeometry, "mma"),
        K("mmalib_batch_matmul_i16", "matmul.offload_batch_matmul_i16", ref.mmalib_batch_matmul_i16,
          ref.BatchMatmulGeometry, "mma"),
        K("c7x_int8_residual_add_relu", "residual.offload_residual_add_i8", ref.c7x_int8_residual_add_relu,
          ref.ElementwiseGeometry, "vector"),
        K("c7x_int16_residual_add_relu", "residual.offload_residual_add_i16", ref.c7x_int16_residual_add_relu,
          ref.ElementwiseGeometry, "vector"),
        K("c7x_int8_broadcast_add", "residual.offload_residual_add_i8", ref.c7x_int8_broadcast_add,
          ref.BroadcastAddGeometry, "vector"),
        K("c7x_int16_broadcast_add", "residual.offload_residual_add_i16", ref.c7x_int16_broadcast_add,
          ref.BroadcastAddGeometry, "vector"),
        K("c7x_int8_max_pool", "pool.offload_max_pool2d_i8", ref.c7x_int8_max_pool, ref.PoolGeometry, "vector"),
        K("c7x_int8_max_pool_tidl", "pool.offload_max_pool2d_i8", ref.c7x_int8_max_pool_tidl, ref.PoolGeometry,
          "vector"),
        K("c7x_int16_max_pool", "pool.offload_max_pool2d_i16", ref.c7x_int16_max_pool, ref.PoolGeometry,
          "vector"),
        K("c7x_int8_relu", "relu.offload_relu_i8", ref.c7x_int8_relu, ref.ElementwiseGeometry, "vector"),
        K("c7x_int8_clamp", "relu.offload_relu_i8", ref.c7x_int8_clamp, ref.ElementwiseGeometry, "vector"),
        K("c7x_int8_channel_mul", "channel_mul.offload_channel_mul", ref.c7x_int8_channel_mul,
          ref.ChannelMulGeometry, "vector"),
        K("c7x_int16_channel_mul", "channel_mul.offload_channel_mul", ref.c7x_int16_channel_mul,
          ref.ChannelMulGeometry, "vector"),
        K("c7x_int8_lut", "activation.offload_activation_lut_i8", ref.c7x_int8_lut, ref.ElementwiseGeometry,
          "vector"),
        # assumed vector factors (docs/estimate.md): LayerNorm makes two passes in 64-bit lanes (sums,
        # then two multiplies per element), softmax three (max; table gather and 64-bit sum; multiply)
        K("c7x_int8_softmax", "softmax.offload_softmax_i8", ref.c7x_int8_softmax, ref.SoftmaxGeometry, "vector",
          vector_factor=12.0),
        K("c7x_int8_layer_norm", "layer_norm.offload_layer_norm_i8", ref.c7x_int8_layer_norm,
          ref.LayerNormGeometry, "vector", vector_factor=24.0),
        K("c7x_int8_l2_normalize", "l2_normalize.offload_l2_normalize_i8", ref.c7x_int8_l2_normalize,
          ref.LayerNormGeometry, "vector", vector_factor=24.0),
        K("c7x_requantize_i8_i16", "requantize.offload_requantize", ref.c7x_requantize_i8_i16,
          ref.ElementwiseGeometry, "vector", _ELEMENTWISE),
        K("c7x_requantize_i16_i8", "requantize.offload_requantize", ref.c7x_requantize_i16_i8,
          ref.ElementwiseGeometry, "vector", _ELEMENTWISE),
        K("c7x_requantize_i8_i8", "pool.offload_max_pool2d_i8", ref.c7x_requantize_i8_i8,
          ref.ElementwiseGeometry, "vector", _ELEMENTWISE),
        K("c7x_requantize_i16_i16", "pool.offload_max_pool2d_i16", ref.c7x_requantize_i16_i16,
          ref.ElementwiseGeometry, "vector", _ELEMENTWISE),
        K("c7x_int8_global_avg_pool", "avg_pool.offload_global_avg_pool", ref.c7x_int8_global_avg_pool,
          ref.GlobalPoolGeometry, "vector"),
        K("c7x_int16_global_avg_pool", "avg_pool.offload_global_avg_pool", ref.c7x_int16_global_avg_pool,
          ref.GlobalPoolGeometry, "vector"),
        K("c7x_int8_avg_pool", "avg_pool.offload_avg_pool2d", ref.c7x_int8_avg_pool, ref.AvgPoolGeometry, "vector"),
        K("c7x_int16_avg_pool", "avg_pool.offload_avg_pool2d", ref.c7x_int16_avg_pool, ref.AvgPoolGeometry,
          "vector"),
        K("c7x_int8_channel_affine", "channel_affine.offload_channel_affine", ref.c7x_int8_channel_affine,
          ref.ChannelAffineGeometry, "vector"),
        K("c7x_int16_channel_affine", "channel_affine.offload_channel_affine", ref.c7x_int16_channel_affine,
          ref.ChannelAffineGeometry, "vector"),
        K("c7x_quantize_f32_i8", "edges.offload_input_quantize", ref.c7x_quantize_f32_i8,
          ref.ElementwiseGeometry, "vector", _ELEMENTWISE),
        K("c7x_quantize_f32_i16", "edges.offload_input_quantize", ref.c7x_quantize_f32_i16,
          ref.ElementwiseGeometry, "vector", _ELEMENTWISE),
        K("c7x_dequantize_i8_f32", "edges.offload_output_dequantize", ref.c7x_dequantize_i8_f32,
          ref.DequantizeGeometry, "vector"),
        K("c7x_dequantize_i16_f32", "edges.offload_output_dequantize", ref.c7x_dequantize_i16_f32,
          ref.DequantizeGeometry, "vector"),
        # data movement (a multi-dimensional DMA on the C7x; costed as one vector pass, assumed)
        K("c7x_permute_i8", "permute.offload_permute", ref.c7x_permute_i8, ref.PermuteGeometry, "vector"),
        K("c7x_permute_i16", "permute.offload_permute", ref.c7x_permute_i16, ref.PermuteGeometry, "vector"),
        K("c7x_take_i8", "take.offload_take", ref.c7x_take_i8, ref.TakeGeometry, "vector"),
        K("c7x_take_i16", "take.offload_take", ref.c7x_take_i16, ref.TakeGeometry, "vector"),
        *(K(f"c7x_concat{k}_{t}", "concat.offload_concat", getattr(ref, f"c7x_concat{k}_{t}"), ref.ConcatGeometry,
            "vector") for k in range(1, ref.MAX_SEGMENTS + 1) for t in ("i8", "i16")),
    )


#: extern name -> record, in the header's order
CATALOG: dict[str, Kernel] = {k.name: k for k in _records()}


def kernel(name: str) -> Kernel:
    """The record of kernel ``name``. Raises KeyError naming it when unknown."""
    try:
        return CATALOG[name]
    except KeyError:
        raise KeyError(f"unknown C7x kernel {name!r}: not in pipeline/backend/kernels/catalog.py") from None


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
