"""The offload pass pipeline: every family in the reference's order, then cleanups.

Order (``docs/reference.md``, "Pass order": step 1, then the max-pool / ReLU
fusions, the int8 <-> int16 requantize, then the Q/DQ cleanups): i8 conv, i8
depthwise, i8 FC, i8 residual add, i16 conv, i16 FC, i16 residual add, i16
depthwise, i8 max pool, the int8 / int16 unfolded batch_norm (+ relu) as a
per-channel affine requantize (ours; before relu/clip, so that it can take the
relu that follows the batch_norm), i8 relu/clip, i8 activation tables (ours: hardswish,
hardsigmoid, SiLU, sigmoid, GELU; after relu/clip, whose patterns are single
clips that never contain an activation's chain), the int8 / int16
squeeze-excitation multiply (ours), the int8 / int16 global and windowed average
pools (ours; the reference's step 4 names an avgpool fusion), requantize, transparent Q/DQ
elimination, Q/DQ pair elimination, then CanonicalizeBindings and
DeadCodeElimination (the float weights' dequantize bindings die here).

The requantize pass matches only ``q(dq(x))`` whose two dtypes differ, the
pair cleanup only equal dtypes and parameters, so the two never compete for a
binding; it runs after the layer passes, whose patterns start at a
dequantize it leaves in place (the layer after a boundary reads the
requantized tensor through its own ``dq``), like the reference's remaining
C7x fusions (its step 4).

Run it on the imported module with all parameters bound as constants and
*before* ``FoldConstant``: folding first would turn ``dq(int8 W)`` into a
float32 constant and no pattern would match (``docs/architecture.md``, "Data
flow").
"""

from __future__ import annotations

from functools import partial

import tvm
from tvm import relax

from .activation import offload_activation_lut_i8
from .avg_pool import offload_avg_pools
from .channel_affine import offload_channel_affine
from .channel_mul import offload_channel_mul
from .cleanup import eliminate_qdq_pairs, eliminate_qdq_transparent
from .conv import offload_conv2d_i8, offload_conv2d_i16
from .depthwise import offload_depthwise_conv2d_i8, offload_depthwise_conv2d_i16
from .fc import offload_fc_i8, offload_fc_i16
from .log import OffloadLog
from .pool import offload_max_pool2d_i8
from .relu import offload_relu_i8
from .requantize import offload_requantize
from .residual import offload_residual_add_i8, offload_residual_add_i16

OFFLOAD_PASSES = (
    offload_conv2d_i8,
    offload_depthwise_conv2d_i8,
    offload_fc_i8,
    offload_residual_add_i8,
    offload_conv2d_i16,
    offload_fc_i16,
    offload_residual_add_i16,
    offload_depthwise_conv2d_i16,
)
CLEANUP_PASSES = (eliminate_qdq_transparent, eliminate_qdq_pairs)


def run_offload(mod: tvm.IRModule, log: OffloadLog | None = None, *,
                tidl_kernels: bool = True) -> tuple[tvm.IRModule, OffloadLog]:
    """Offload every eligible Q/DQ pattern of ``mod["main"]`` to MMALIB / C7x kernels.

    ``mod``: the imported Relax module (NCHW, params bound as constants, no
    FoldConstant yet). Returns the rewritten module, whose offloaded layers are
    ``R.call_tir`` to offload PrimFuncs (contract in :mod:`pipeline.backend`)
    and whose other layers stay plain Relax ops for the scalar path, and the
    :class:`OffloadLog` (``log`` if given) with one decision per matched layer.
    ``tidl_kernels`` picks the max-pool kernel flavour (reference default: TIDL).
    """
    log = log if log is not None else OffloadLog()
    passes = (*OFFLOAD_PASSES, partial(offload_max_pool2d_i8, tidl_kernels=tidl_kernels),
              offload_channel_affine, offload_relu_i8, offload_activation_lut_i8, offload_channel_mul,
              offload_avg_pools, offload_requantize, *CLEANUP_PASSES)
    for p in passes:
        mod = p(mod, log)
    mod = relax.transform.CanonicalizeBindings()(mod)
    mod = relax.transform.DeadCodeElimination()(mod)
    return mod, log
