"""Relax passes of the C7x backend.

Offload (one module per op family; each is ``IRModule -> IRModule`` and logs its
decisions into a shared :class:`~.log.OffloadLog`):

- ``conv``: conv2d groups = 1 / grouped -> ``mmalib_conv2d_i8``, ``_i16``, ``_i8_grouped_loop``
- ``depthwise``: depthwise conv2d -> ``mmalib_depthwise_conv2d_i8``, ``_i16``
- ``fc``: linear (matmul with a transposed constant weight) -> ``mmalib_matmul_bias_i8``, ``_i16``
- ``residual``: residual add (+ReLU) -> ``c7x_int8_residual_add_relu``, ``c7x_int16_...``
- ``pool``: int8 max pool -> ``c7x_int8_max_pool_tidl`` / ``c7x_int8_max_pool``
- ``relu``: standalone int8 ReLU / clip -> ``c7x_int8_relu`` / ``c7x_int8_clamp``
- ``cleanup``: Q/DQ around data movement and q(dq(x)) pairs

``pipeline.run_offload`` runs them in the reference order. Shared code, lowest
layer first: ``log`` (the decisions), ``graph`` (read-only queries: bindings,
constants, shapes, Q/DQ, fused activations), ``primfunc`` (the offload
PrimFunc contract), ``rewrite`` (the binding rewriter and ``run_pass``, which
catches :class:`~pipeline.backend.refusal.Declined`), ``weighted`` (matching
and folding of conv / depthwise / FC). ``offload_calls`` reads the result
back; ``scalar`` rewrites what stays on the scalar path.
"""
