"""Lowered Relax module -> a folder of standalone static C: the C text and :func:`emit`.

Files written by :func:`emit` (``<m>`` is the C name of the model):

- ``model.h``: ``int <m>_run(const uint8_t* weights, const float* input,
  float* output)``, ``int <m>_check_weights(const uint8_t* weights, size_t
  nbytes)``, input/output shapes, the quantization of the model's input
  quantize and output dequantize, arena/workspace/weights sizes, the
  weights.bin CRC-32, the error codes and, when given, the input
  preprocessing (``<M>_PREPROCESS_RESIZE/CROP/MEAN/STD``). A model with
  several outputs packs them back to back in ``output``, in its return
  order (:mod:`.memory_plan`): ``<M>_OUTPUT_SIZE`` is the total, and
  ``<M>_OUTPUT_COUNT`` plus per output ``<M>_OUTPUT<i>_NDIM / _SHAPE /
  _SIZE / _OFFSET`` (floats into ``output``) replace ``<M>_OUTPUT_NDIM /
  _SHAPE`` and the output quantization; one output's text is unchanged.
- ``model.c``: the entry point, printed from the static memory plan of
  ``main`` (:mod:`.memory_plan`). One static activation arena laid out by
  TVM's ``StaticPlanBlockMemory`` (each storage at a 64-byte aligned offset),
  one static LIFO workspace serving ``TVMBackendAllocWorkspace`` (no malloc;
  an oversize request makes the kernel fail and ``<m>_run`` return
  ``<M>_ERR_WORKSPACE``), one static ``DLTensor`` per tensor, and one packed
  call per kernel in ``main``'s order. Compiled with ``-D<M>_PROFILE_LAYERS``
  it also times every call and defines ``<m>_print_layer_profile()``, which
  prints TI's ``-profile-layers`` block (:func:`.c_support.profile_support`); without the
  define the profiling text preprocesses to nothing.
- ``tvm_kernels.c``: TVM's C codegen of every PrimFunc, post-processed
  (:mod:`.kernel_source`).
- ``weights.bin`` (format in :mod:`.weights_bin`) and, for
  ``weights_format="c_array"``, ``weights_data.c``.
- ``c7x_kernels.h``, ``c7x_tvm_shim.h``, ``c7x_memory.h`` (sections and DMA):
  copies, included with quotes, so the folder compiles on its own
  (``gcc -I<folder>``).
- ``c7x_memory.cmd``: the TI linker command file placing model.c's sections
  (:func:`linker_command`). With ``memory="staged"`` (:mod:`.levels`) model.c
  has one arena per memory level and the two L2 weight slots in named
  sections, the DMA copies before each call, and tiled calls
  (:mod:`.tiling`); ``-D<M>_COUNT_TRAFFIC`` counts the bytes per level.
- ``lowered.py``: the lowered module as TVMScript with every constant of
  ``main`` lifted to a parameter ``w<i>`` = weights.bin entry ``i``
  (:func:`.interp.lowered_script`); the Python reference executor
  (:mod:`.interp`) runs it.

Everything is a pure function of the lowered module and the model name:
same input, byte-identical files.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import tvm

from ..config import MEMORY_PLANS
from . import tiling, weights_bin
from .c_header import SECTIONS, arena_name, check_preprocess, dl_dtype, header, shape_init
from .c_support import ALIGN_MACRO, call_support, profile_support, runtime_support, traffic_support
from .interp import lowered_script
from .kernel_source import KERNELS_HEADER, kernel_source
from .levels import ALIGN, Budget, place
from .lower import is_offload
from .memory_plan import LEVELS, Plan, Tensor, call_counts, plan_main
from .tile_names import fused_name, tiled_name


SHIM_HEADER = Path(__file__).parent / "kernels" / "c7x_tvm_shim.h"
MEMORY_HEADER = Path(__file__).parent / "kernels" / "c7x_memory.h"
DATA_FILES = ("kernels/c7x_tvm_shim.h", "kernels/c7x_memory.h")  # copied into c/<build>/ (code_deps.py)



# ---------------------------------------------------------------------------
# names
# ---------------------------------------------------------------------------

def c_name(model_name: str) -> str:
    """C identifier prefix for ``model_name``: every character outside ASCII
    ``[A-Za-z0-9_]`` (accented letters too) -> ``_``, ``m_`` prepended if it
    would start with a digit (or be empty)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", model_name)
    return "m_" + name if not name or name[0].isdigit() else name


# ---------------------------------------------------------------------------
# model.c (model.h: c_header.py; the runtime support text: c_support.py)
# ---------------------------------------------------------------------------


def _arena_decls(m: str, M: str, plan: Plan, tensors: list[Tensor]) -> list[str]:
    """Static arenas: the flat plan's one (TVM's offsets), or one per level in its
    section plus the two L2 weight slots (:mod:`.levels`)."""
    if plan.levels is None:
        if not any(t.home == "arena" for t in tensors):  # else an unused static (-Wunused-variable)
            return []
        return ["", "/* activations: one arena, offsets from TVM's StaticPlanBlockMemory */",
                f"static uint8_t {m}_arena[{M}_ARENA_BYTES] C7X_ALIGNED(64);"]
    lv = plan.levels
    out = ["", "/* activations: one arena per memory level, each tensor placed for its lifetime "
               "(pipeline/backend/levels.py) */"]
    for lvl in LEVELS:
        if lv.arena[lvl]:
            out.append(f"static uint8_t {arena_name(m, lvl)}[{M}_ARENA_{lvl.upper()}_BYTES] "
                       f"C7X_ALIGNED({ALIGN}) C7X_SECTION(\"{SECTIONS[lvl]}\");")
    if lv.slot_bytes:
        out += ["/* weights: two L2 slots, filled from weights.bin by DMA one call ahead (double-buffered) */",
                f"static uint8_t {m}_wslot[2][{M}_WEIGHT_SLOT_BYTES] C7X_ALIGNED({ALIGN}) "
                f"C7X_SECTION(\"{SECTIONS['l2']}\");"]
    return out


def _tensor_decls(m: str, tensors: list[Tensor]) -> list[str]:
    """One static shape array and DLTensor per tensor (data set by <m>_run)."""
    out = ["/* ---- tensors ---- */"]
    for t in tensors:
        out.append(f"static int64_t {m}_{t.name}_shape[{max(len(t.shape), 1)}] = {shape_init(t.shape)};")
        out.append(f"static DLTensor {m}_{t.name} = {{NULL, {{kDLCPU, 0}}, {len(t.shape)}, "
                   f"{dl_dtype(t.dtype)}, {m}_{t.name}_shape, NULL, 0}};")
    return out


def _dma_lines(m: str, M: str, plan: Plan, k: int, entries: list, indent: str = "  ") -> list[str]:
    """The copies of call ``k``'s staged weights from weights.bin into its L2 slot."""
    return [f"{indent}{M}_DMA({m}_wslot[{t.staged[0]}] + {t.staged[1]}, weights + {entries[t.offset].offset}, "
            f"{t.nbytes}u); /* {t.name} -> slot {t.staged[0]} */" for t in plan.levels.staged[k]]


def fused_args(plan: Plan, k: int) -> list[Tensor]:
    """The arguments of fused call ``k`` (:func:`.tiling.fused_primfunc`): the slots, the
    fused conv's inputs (all but its output, which lives in the slots), then call ``k``'s
    own arguments after its slots and that input."""
    args = plan.calls[k][1]
    return [args[0], *plan.calls[plan.fused[k]][1][:-1], *args[2:]]


def _run_function(m: str, plan: Plan, tensors: list[Tensor], entries: list, prefix: str) -> list[str]:
    """<m>_run: checks, tensor data pointers, one packed call per kernel (and, in the
    staged plan, the weight DMA: the next staged call's copy starts before a staged call)."""
    M = m.upper()
    staged = plan.levels is not None
    offsets = {"input": lambda t: "(void*)input",
               "output": lambda t: f"(void*)(output + {t.offset})" if t.offset else "(void*)output",
               "arena": lambda t: f"(void*)({arena_name(m, t.level if staged else None)} + {t.offset})",
               "weight": lambda t: (f"(void*)({m}_wslot[{t.staged[0]}] + {t.staged[1]})" if t.staged else
                                    f"(void*)(weights + {entries[t.offset].offset})"),
               "slot": lambda t: f"(void*){m}_wslot",
               "tile": lambda t: f"(void*){m}_wslot"}  # computed tile by tile in the slots (.levels)
    out = ["", f"int {m}_run(const uint8_t* weights, const float* input, float* output) {{",
           f"  if (weights == NULL || input == NULL || output == NULL) return {M}_ERR_NULL;",
           f"  if (((uintptr_t)weights & 63u) != 0) return {M}_ERR_ALIGN;",
           f"  if (!{m}_header_ok(weights)) return {M}_ERR_WEIGHTS;",
           f"  {m}_ws_top = 0;", f"  {m}_ws_overflow = 0;", f"  {M}_PROFILE_RESET();", f"  {M}_TRAFFIC_RESET();"]
    out += [f"  {m}_{t.name}.data = {offsets[t.home](t)};" for t in tensors]
    # DMA order: a staged call waits for its weights and starts the next staged call's
    # copy (into the other slot); a tiled call uses both slots itself (its copies are
    # inside its kernel, .tiling), so the next staged copy starts after it.
    lv = plan.levels if staged else None
    dma = [k for k in range(len(plan.calls)) if lv and (lv.staged[k] or k in lv.tiled)]
    is_staged = (lambda k: bool(lv.staged[k])) if lv else (lambda k: False)

    def after(k: int) -> int | None:
        i = dma.index(k) + 1
        return dma[i] if i < len(dma) and is_staged(dma[i]) else None

    if dma and is_staged(dma[0]):
        out += ["  /* weights of the first staged call; each staged call then starts the next one's copy */"]
        out += _dma_lines(m, M, plan, dma[0], entries)
    fused = {j: k for k, j in plan.fused.items()}  # producer -> the call it runs inside

    def stage_in(k: int) -> list[str]:  # DMA of the DDR activations call k reads, into L2
        return [f"    {M}_DMA({m}_{copy.name}.data, {m}_{src.name}.data, {copy.nbytes}u); /* {src.name} (DDR) -> L2 */"
                for src, copy in (lv.stage_in.get(k, []) if lv else [])]
    for k, (name, args) in enumerate(plan.calls):
        refs = ", ".join(f"&{m}_{t.name}" for t in args)
        if k in fused:  # computed inside call fused[k]; its inputs copied in, counted as if it ran alone
            out += [f"  {{ /* {k}: {name}, tile by tile inside call {fused[k]} */", *stage_in(k)]
            out += (["    C7X_DMA_WAIT();"] if k in lv.stage_in else []) + [
                f"    DLTensor* const a[{len(args)}] = {{{refs}}};",
                f"    {M}_TRAFFIC_COUNT(a, {len(args)});", "    (void)a;", "  }"]
            continue
        tiled = bool(lv) and k in lv.tiled
        what = "input" if tiled and k in lv.tiled_input else "weights"
        out += [f"  {{ /* {k}: {name}" + (f", {what} in tiles of {lv.tiled[k]} channels" if tiled else "") + " */"]
        out += stage_in(k)
        if is_staged(k) or (lv and k in lv.stage_in):
            out += ["    C7X_DMA_WAIT(); /* this call's weights / inputs are in L2 */"]
        if is_staged(k):
            out += _dma_lines(m, M, plan, after(k), entries, "    ") if after(k) is not None else []
        out += [f"    DLTensor* const a[{len(args)}] = {{{refs}}};"]
        call = ("a", len(args))
        if k in plan.fused:  # the fused PrimFunc: slots, the conv's inputs, this call's weights and output
            real = fused_args(plan, k)
            out += [f"    DLTensor* const f[{len(real)}] = {{{', '.join(f'&{m}_{t.name}' for t in real)}}};",
                    "    (void)a; /* this call's own arguments, for the traffic count */"]
            call = ("f", len(real))
        out += [f"    {M}_PROFILE_START();",
                f"    if ({m}_call(__tvm_ffi_{prefix}{name}, {call[0]}, {call[1]}) != 0) return {m}_fail({k});",
                f"    {M}_PROFILE_STOP({k});",
                (f"    {M}_TRAFFIC_COUNT_TILED(a, {len(args)}, {1 if k in lv.tiled_input else 2});" if tiled
                 else f"    {M}_TRAFFIC_COUNT(a, {len(args)});")]
        if tiled and after(k) is not None:
            out += ["    /* the next staged call's weights, now that both slots are free */"]
            out += _dma_lines(m, M, plan, after(k), entries, "    ")
        out += ["  }"]
    for i, t in plan.copies():  # outputs not written in place (module docstring of memory_plan)
        off = plan.output_offsets[i]
        dst = f"output + {off}" if off else "output"
        out.append(f"  memcpy({dst}, {m}_{t.name}.data, sizeof(float) * {plan.output_size(i)}u);")
    out += [f"  return {M}_OK;", "}", ""]
    return out


def model_source(m: str, plan: Plan, entries: list, prefix: str) -> str:
    """Text of model.c for ``plan`` (kernels named ``__tvm_ffi_<prefix><name>``;
    ``entries``: the weights.bin table, :func:`weights_bin.pack`)."""
    M = m.upper()
    max_args = max([len(a) for _, a in plan.calls] + [len(fused_args(plan, k)) for k in plan.fused] + [1])
    kernels = sorted({name for name, _ in plan.calls})
    out = [f"/* model.c: static C entry of model {m}; generated by doit-c7x, do not edit. */",
           f"#if defined({M}_PROFILE_LAYERS) && !defined(__C7000__) && !defined(_POSIX_C_SOURCE)",
           "#define _POSIX_C_SOURCE 199309L /* clock_gettime(CLOCK_MONOTONIC) under -std=c99 */",
           "#endif",
           "#include <stddef.h>", "#include <stdint.h>", "#include <string.h>", "",
           '#include "model.h"', "",
           f"#if defined({M}_COUNT_TRAFFIC) && !defined(C7X_COUNT_DMA)",
           "#define C7X_COUNT_DMA /* c7x_memory.h's c7x_dma_copy counts into c7x_dma_bytes */",
           "#endif",
           f"#define TVMBackendAllocWorkspace {m}_TVMBackendAllocWorkspace",
           f"#define TVMBackendFreeWorkspace {m}_TVMBackendFreeWorkspace",
           '#include "c7x_tvm_shim.h"', '#include "c7x_memory.h"', "", ALIGN_MACRO,
           "/* kernels (tvm_kernels.c) */"]
    out += [f"int32_t __tvm_ffi_{prefix}{k}(void* self, void* args, int32_t num_args, void* result);"
            for k in kernels]
    used = {id(t) for _, args in plan.calls for t in args} | {id(plan.input)} | {id(t) for t in plan.outputs}
    if plan.levels is not None:   # a DMA source no call reads directly (e.g. a view of the input)
        used |= {id(src) for pairs in plan.levels.stage_in.values() for src, _ in pairs}
    tensors = [t for t in plan.tensors if id(t) in used]
    out += _arena_decls(m, M, plan, tensors)
    ws_level = plan.levels.workspace_level if plan.levels is not None else None
    out.append(runtime_support(m, M, f' C7X_SECTION("{SECTIONS[ws_level]}")' if ws_level else ""))
    if plan.calls:
        out.append(call_support(m, M, max_args))
    out.append(traffic_support(m, M, plan))
    out.append(profile_support(m, M, [f"__tvm_ffi_{prefix}{name}" for name, _ in plan.calls]))
    out += _tensor_decls(m, tensors)
    out += _run_function(m, plan, tensors, entries, prefix)
    return "\n".join(out)


def weights_array_source(m: str, blob: bytes) -> str:
    """Text of weights_data.c: ``const uint8_t <m>_weights[]``, 64-byte aligned."""
    M = m.upper()
    rows = [", ".join(f"0x{b:02x}" for b in blob[i:i + 16]) for i in range(0, len(blob), 16)]
    return "\n".join([f"/* weights_data.c: weights.bin of model {m} as a C array; generated, do not edit. */",
                      "#include <stdint.h>", '#include "model.h"', "", ALIGN_MACRO,
                      f"const uint8_t {m}_weights[{M}_WEIGHTS_BYTES] C7X_ALIGNED(64) = {{",
                      ",\n".join(rows), "};", ""])


# ---------------------------------------------------------------------------
# everything
# ---------------------------------------------------------------------------

HEADERS = (KERNELS_HEADER, SHIM_HEADER, MEMORY_HEADER)
"""Headers copied into every codegen folder, so ``gcc -I<folder>`` suffices.
``[codegen] memory`` (``config.MEMORY_PLANS``): "staged" (:mod:`.levels`: L2 / MSMC /
DDR, weights by DMA) or "flat" (one DDR arena laid out by TVM, weights read in place)."""


def tileable_calls(mod: tvm.IRModule, plan: Plan) -> dict[int, tuple[int, str]]:
    """Call index -> (output channels, what its tiles stream), for the calls :mod:`.tiling` can split."""
    out = {}
    for k, (name, _) in enumerate(plan.calls):
        c = tiling.channels(mod[name]) if is_offload(mod[name]) else None
        if c:
            out[k] = c
    return out


def tile_calls(mod: tvm.IRModule, plan: Plan) -> tvm.IRModule:
    """``mod`` with every tiled call (``plan.levels.tiled``) calling the tiled form of its
    PrimFunc (:func:`.tiling.tiled_primfunc`, named ``tiled<tc><w|i>_<name>``) with the L2
    slots as a first argument (a tensor of ``home`` "slot"); PrimFuncs no call uses are dropped."""
    funcs = {gv.name_hint: f for gv, f in mod.functions.items()}
    lv = plan.levels
    for k, tc in sorted(lv.tiled.items()):
        name, args = plan.calls[k]
        w = lv.streamed(k, plan)
        elems = lv.slot_bytes // np.dtype(w.dtype).itemsize
        # its own name (a PrimFunc shared by calls may be tiled for one of them only), ending
        # in the untiled one's, which the reference (lowered.py) and the dumps match on
        if k in plan.fused:  # the conv before it computes its input tiles (levels.fusable)
            producer = plan.calls[plan.fused[k]][0]
            tiled = fused_name(producer, name, tc)
            funcs.setdefault(tiled, tiling.fused_primfunc(mod[producer], mod[name], tc, elems))
        else:
            tiled = tiled_name(name, tc, "input" if k in lv.tiled_input else "weights")
            funcs.setdefault(tiled, tiling.tiled_primfunc(mod[name], tc, elems))
        slots = Tensor(f"t{len(plan.tensors)}", (2 * elems,), w.dtype, "slot", 0, level="l2")
        plan.tensors.append(slots)
        plan.calls[k] = (tiled, [slots, *args])
    called = {name for name, _ in plan.calls}
    return tvm.IRModule({tvm.ir.GlobalVar(n): f for n, f in funcs.items()
                         if n in called or not isinstance(f, tvm.tirx.PrimFunc)}, attrs=mod.attrs)


def linker_command(m: str, plan: Plan) -> str:
    """Text of c7x_memory.cmd: a TI linker command file placing the named sections of
    model.c (:data:`SECTIONS`) in the memory ranges ``L2SRAM``, ``MSMC`` and ``DDR``,
    which the application's own linker file (the SDK's) defines. Listed with the
    application's .cmd on the cl7x link line (:func:`pipeline.toolchain.link_command`)."""
    peak = plan.levels.peak if plan.levels is not None else None
    lines = [f"/* c7x_memory.cmd: where model {m}'s buffers go on the C7x; generated by doit-c7x, do not edit.",
             " * Link it with the application's linker command file, which defines the MEMORY ranges",
             " * L2SRAM, MSMC and DDR (TI's SDK linker files do). Bytes this model needs in each: */"]
    for lvl in LEVELS:
        need = peak[lvl] if peak else 0
        lines.append(f"/*   {SECTIONS[lvl]:8} {need:>10} bytes */")
    lines += ["SECTIONS", "{"]
    region = {"l2": "L2SRAM", "msmc": "MSMC", "ddr": "DDR"}
    lines += [f"    {SECTIONS[lvl]:8} > {region[lvl]}" for lvl in LEVELS if not peak or peak[lvl]]
    lines += ["}", ""]
    return "\n".join(lines)


def emit(mod: tvm.IRModule, model_name: str, out_dir: Path, *, quant: dict | None = None,
         weights_format: str = "bin", preprocess: dict | None = None, memory: str = "flat",
         budget: Budget | None = None) -> dict:
    """Write model.h, model.c, tvm_kernels.c, weights.bin (+ weights_data.c
    for ``weights_format="c_array"``), lowered.py and copies of
    c7x_kernels.h / c7x_tvm_shim.h into ``out_dir``.

    ``mod``: output of :func:`pipeline.backend.lower.lower_module` (``.mod``).
    ``quant``: ``{"input": Quant | None, "output": Quant | None}`` for model.h.
    ``preprocess``: ``{"resize", "crop", "mean", "std"}`` for model.h's
    PREPROCESS macros (:func:`check_preprocess`), or None.
    Returns ``{"c_name", "arena_bytes", "workspace_bytes", "weights_bytes",
    "weights_count", "weights_crc32", "kernels", "calls", "calls_by_backend",
    "tvm_kernels", "workspace_by_kernel", "plan"}`` (``plan``: the
    :class:`~.memory_plan.Plan` printed as model.c). Raises UnsupportedOpError (see
    :func:`.memory_plan.plan_main`), ValueError for an unknown ``weights_format`` or a bad
    ``preprocess``.
    """
    from ..fsutil import write_bytes, write_text

    if weights_format not in ("bin", "c_array"):
        raise ValueError(f"weights_format must be 'bin' or 'c_array', not {weights_format!r}")
    if memory not in MEMORY_PLANS or (memory == "staged" and budget is None):
        raise ValueError(f"memory must be one of {list(MEMORY_PLANS)} (staged needs a budget), not {memory!r}")
    if preprocess is not None:
        check_preprocess(preprocess)
    m = c_name(model_name)
    prefix = m + "_"
    plan = plan_main(mod)
    blob, entries, crc = weights_bin.pack(plan.weights)
    ks = kernel_source(mod, prefix)
    called = {name for name, _ in plan.calls}
    workspace = max([ks.workspace.get(k, 0) for k in called] + [64])
    lowered = lowered_script(mod, plan)  # the untiled program: the Python reference runs it
    if memory == "staged":
        place(plan, budget, workspace, tileable_calls(mod, plan))
        plan.arena_bytes = sum(plan.levels.arena.values())
        if plan.levels.tiled:  # C once more: the placement needed the workspace of the first
            mod = tile_calls(mod, plan)
            ks = kernel_source(mod, prefix)
            called = {name for name, _ in plan.calls}
    sizes = {"arena": plan.arena_bytes, "workspace": workspace, "weights": len(blob)}
    out_dir = Path(out_dir)
    write_text(out_dir / "model.h", header(m, plan, sizes, crc, quant or {}, weights_format == "c_array",
                                           preprocess))
    write_text(out_dir / "model.c", model_source(m, plan, entries, prefix))
    write_text(out_dir / "tvm_kernels.c", ks.source)
    for h in HEADERS:
        write_text(out_dir / h.name, h.read_text())
    write_bytes(out_dir / "weights.bin", blob)
    if weights_format == "c_array":
        write_text(out_dir / "weights_data.c", weights_array_source(m, blob))
    write_text(out_dir / "lowered.py", lowered)
    write_text(out_dir / "c7x_memory.cmd", linker_command(m, plan))
    by_backend, tvm_kernels = call_counts(mod, plan)
    return {"c_name": m, "arena_bytes": plan.arena_bytes, "workspace_bytes": workspace,
            "weights_bytes": len(blob), "weights_count": len(entries), "weights_crc32": crc,
            "kernels": len(called), "calls": len(plan.calls), "calls_by_backend": by_backend,
            "tvm_kernels": tvm_kernels,
            "workspace_by_kernel": {k: ks.workspace.get(k, 0) for k in sorted(called)}, "plan": plan,
            "mod": mod}
