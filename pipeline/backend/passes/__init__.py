"""Relax passes of the C7x backend.

Offload: one module per op family (conv, depthwise, fc, matmul, residual, pool,
avg_pool, relu, activation, softmax, layer_norm, l2_normalize, channel_affine,
channel_mul, concat, permute, take, requantize, edges: the input quantize and
output dequantize). Each is ``IRModule -> IRModule``, logs its decisions into a
shared :class:`~.log.OffloadLog` and asks the kernel catalog for the kernels it
emits (``catalog.find``; a record's ``offload`` names its passes). Rewrites that
emit no kernel: ``movement`` (slices and zero pads of a dequantized tensor as
takes and concats) and ``cleanup`` (Q/DQ around data movement, ``q(dq(x))``
pairs, reshape chains). ``pipeline.run_offload`` runs them in
``pipeline.PASS_ORDER`` (its docstring says why that order;
``tests/backend/test_catalog.py`` checks every pass there emits a catalog kernel
or is a known rewrite).

Around the offload: ``fold_constants`` evaluates input-independent subgraphs
before it, ``scalar`` rewrites what stays on TVM's scalar path onto integers
and ``topk`` gives ``relax.topk`` a static-C PrimFunc after it. Shared code,
lowest layer first: ``log`` (the decisions), ``graph`` (read-only queries:
bindings, constants, shapes, Q/DQ, fused activations), ``primfunc`` (the
offload PrimFunc contract), ``rewrite`` (the binding rewriter and
``run_pass``, which catches :class:`~pipeline.backend.refusal.Declined`),
``weighted`` (matching and folding of conv / depthwise / FC).
``offload_calls`` reads the result back.
"""
