"""Relax passes of the C7x backend.

Offload (one module per op family; each is ``IRModule -> IRModule`` and logs its
decisions into a shared :class:`~.log.OffloadLog`):

conv, depthwise, fc, residual, pool, relu, requantize, channel_affine,
activation, channel_mul, avg_pool and edges (the input quantize and output
dequantize); which kernels each emits is in the kernel
catalog (``pipeline/backend/kernels/catalog.py``, a record's ``offload``), and
``cleanup`` removes Q/DQ around data movement and ``q(dq(x))`` pairs.

``pipeline.run_offload`` runs them in ``pipeline.PASS_ORDER``. Shared code, lowest
layer first: ``log`` (the decisions), ``graph`` (read-only queries: bindings,
constants, shapes, Q/DQ, fused activations), ``primfunc`` (the offload
PrimFunc contract), ``rewrite`` (the binding rewriter and ``run_pass``, which
catches :class:`~pipeline.backend.refusal.Declined`), ``weighted`` (matching
and folding of conv / depthwise / FC). ``offload_calls`` reads the result
back; ``scalar`` rewrites what stays on the scalar path.
"""
