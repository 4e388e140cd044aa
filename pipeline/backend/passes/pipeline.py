"""The offload pass pipeline: every family in the reference's order, then cleanups.

The order is :data:`PASS_ORDER`, written once; why it is that order
(``docs/reference.md``, "Pass order"): the reference's step 1 (int8 conv,
depthwise, FC, residual add, then the int16 ones), then its max-pool / ReLU
fusions (our int16 max pool right after the int8 one), the int8 <-> int16
requantize and the Q/DQ cleanups. Our passes slot in where they cannot steal
a binding from the reference's: the per-channel affine (an unfolded
batch_norm) runs before relu/clip so it can take the relu that follows it; the activation tables after relu/clip, whose patterns are
single clips that never contain an activation's chain, the softmax and the
LayerNorm (their patterns start at the quantize of a softmax / layer_norm, which no
other pass claims), the activation x activation matmuls (their operands are no
constants, so the FC passes left them); the squeeze-excitation
multiply and the average pools (the reference's step 4 names an avgpool
fusion), then concat and split (data movement between layers: their patterns
start at a quantize of a concat or of a split piece, which no layer pass
claims) before the requantize. The integer transposes and gathers (Swin's roll) the
cleanups leave go to the permute and take kernels right after them. The model's edges (the input quantize, the
output dequantize) come last, after the cleanups: only the Q/DQ that are left
are real passes over a tensor. CanonicalizeBindings and DeadCodeElimination
follow (the float weights' dequantize bindings die there).

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

import tvm
from tvm import relax

from .activation import offload_activation_lut_i8
from .avg_pool import offload_avg_pool2d, offload_global_avg_pool
from .channel_affine import offload_channel_affine
from .channel_mul import offload_channel_mul
from .cleanup import collapse_reshapes, eliminate_qdq_pairs, eliminate_qdq_transparent
from .concat import offload_concat
from .conv import offload_conv2d_i8, offload_conv2d_i16
from .depthwise import offload_depthwise_conv2d_i8, offload_depthwise_conv2d_i16
from .edges import offload_input_quantize, offload_output_dequantize
from .fc import offload_fc_i8, offload_fc_i16
from .l2_normalize import offload_l2_normalize_i8
from .layer_norm import offload_layer_norm_i8
from .log import OffloadLog
from .matmul import offload_batch_matmul_i8, offload_batch_matmul_i16
from .movement import integer_slices_and_pads
from .permute import offload_permute
from .pool import offload_max_pool2d_i8, offload_max_pool2d_i16
from .relu import offload_relu_i8
from .requantize import offload_requantize
from .residual import offload_residual_add_i8, offload_residual_add_i16
from .softmax import offload_softmax_i8
from .take import offload_take

#: every pass, in order (module docstring); ``run_offload`` runs exactly these
PASS_ORDER = (
    integer_slices_and_pads,
    offload_conv2d_i8, offload_depthwise_conv2d_i8, offload_fc_i8, offload_residual_add_i8,
    offload_conv2d_i16, offload_fc_i16, offload_residual_add_i16, offload_depthwise_conv2d_i16,
    offload_max_pool2d_i8, offload_max_pool2d_i16, offload_channel_affine, offload_relu_i8,
    offload_activation_lut_i8, offload_softmax_i8, offload_layer_norm_i8, offload_l2_normalize_i8, offload_batch_matmul_i8,
    offload_batch_matmul_i16, offload_channel_mul,
    offload_global_avg_pool, offload_avg_pool2d, offload_concat,
    offload_requantize,
    eliminate_qdq_transparent, eliminate_qdq_pairs, offload_permute, offload_take, collapse_reshapes,
    offload_input_quantize, offload_output_dequantize,
)


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
    for p in PASS_ORDER:
        mod = p(mod, log, tidl_kernels=tidl_kernels) if p is offload_max_pool2d_i8 else p(mod, log)
    mod = relax.transform.CanonicalizeBindings()(mod)
    mod = relax.transform.DeadCodeElimination()(mod)
    return mod, log
