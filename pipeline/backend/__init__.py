"""C7x backend: Relax IRModule -> standalone static C + weights.bin, MMALIB offload.

Module map (one concept each):

- ``fold``: compile-time requantization math (bias folding, per-channel
  scale/shift, residual-add multipliers). Pure numpy.
- ``passes/``: Relax rewrites, one module per op family. Each replaces an
  eligible Q/DQ pattern by ``R.call_tir`` to an *offload PrimFunc* (below) and
  logs why an ineligible match stays on the scalar path. ``passes.pipeline``
  fixes their order.
- ``lower``: legalize / fuse / TIR / static memory plan of what is left
  (TVM's passes), giving the lowered ``main`` the emitter walks; rejects what
  static C cannot express with one UnsupportedOpError line naming the op.
- ``tir_c``: TIR rewrites for TVM's C codegen: float intrinsics -> libm calls
  (C and LLVM reference alike), float constants -> exact bit patterns.
- ``memory_plan``: the lowered ``main`` flattened for static C: tensors
  (input, output, arena offsets, weights.bin entries), kernel calls in order,
  deduplicated constants.
- ``kernel_source``: ``tvm_kernels.c``, TVM's C codegen of every PrimFunc
  (scalar and offload), post-processed; per-kernel workspace sizes.
- ``emit_c``: the C text of ``model.c``/``model.h`` (+ ``weights_data.c``) and
  ``emit``, which writes the codegen folder: those, ``tvm_kernels.c``,
  ``weights.bin``, ``lowered.py`` and copies of the two headers (the folder
  compiles on its own).
- ``interp``: ``lowered.py`` (writer and reader) and the Python reference
  executor of it (integer kernels from ``kernels.reference``; TVM's own build
  for scalar-path PrimFuncs), bit-exact with the C.
- ``kernels/``: ``c7x_kernels.h`` (the kernel ABI), host C reference
  implementations, and ``reference.py`` (the same kernels in numpy).
- ``manifest``: per-layer offload manifest (op, shapes, dtype, backend, MACs, reason).
- ``profile_block``: TI's per-layer profile block (``-profile-layers``): the
  text ``model.c`` prints with ``-D<M>_PROFILE_LAYERS``, its parser, and the
  check of a block against a build's calls. Plain Python.

Offload PrimFunc convention (the contract between passes, emitter and interp):
a ``tirx.PrimFunc`` whose parameters are the tensors of the extern call in
order (inputs, constants, then the single output buffer last), whose body is
one ``T.call_extern("int32", <kernel name>, <buf>.data ..., <scalars>...)``
with the arguments of ``c7x_kernels.h`` (scalars int32, or float32 for a
``float`` parameter), and whose attributes are
``{"c7x_kernel": <kernel name>, "c7x_offload_backend": "mmalib" | "c7x"}``.
"""
