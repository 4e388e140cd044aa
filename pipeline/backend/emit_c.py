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
  prints TI's ``-profile-layers`` block (:func:`_profile_support`); without the
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm

from ..config import MEMORY_PLANS
from ..errors import UnsupportedOpError
from . import tiling, weights_bin
from .interp import lowered_script
from .kernel_source import KERNELS_HEADER, kernel_source
from .levels import ALIGN, Budget, place
from .lower import is_offload
from .memory_plan import LEVELS, Plan, Tensor, call_counts, plan_main
from .tile_names import fused_name, tiled_name

#: the named section of each memory level (c7x_memory.cmd maps them)
SECTIONS = {"l2": ".l2sram", "msmc": ".msmc", "ddr": ".ddr"}

SHIM_HEADER = Path(__file__).parent / "kernels" / "c7x_tvm_shim.h"
MEMORY_HEADER = Path(__file__).parent / "kernels" / "c7x_memory.h"
DATA_FILES = ("kernels/c7x_tvm_shim.h", "kernels/c7x_memory.h")  # copied into c/<build>/ (code_deps.py)

_DL_CODE = {"int": "kDLInt", "uint": "kDLUInt", "float": "kDLFloat"}


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
# model.h / model.c
# ---------------------------------------------------------------------------

def hex_literal(value: float, bits: int = 32) -> str:
    """Exact C99 hexadecimal floating constant of a float32 (``f`` suffix) or
    float64 value, e.g. 0.5 -> ``0x1p-1f``."""
    v = float(np.float32(value)) if bits == 32 else float(value)
    text = v.hex()  # [-]0x1.<13 hex digits>p<exp>
    if "." in text:
        mant, exp = text.split("p")
        text = mant.rstrip("0").rstrip(".") + "p" + exp
    return text + ("f" if bits == 32 else "")


def _dl_dtype(dtype: str) -> str:
    kind = re.match(r"[a-z]+", dtype).group(0)
    if kind not in _DL_CODE:
        raise UnsupportedOpError(f"tensor of dtype {dtype} in the lowered main")
    return f"{{{_DL_CODE[kind]}, {int(dtype[len(kind):])}, 1}}"


def _shape_init(shape) -> str:
    return "{" + ", ".join(str(d) for d in shape) + "}" if shape else "{0}"


@dataclass
class Quant:
    """Quantization of the model input (its first quantize) or output (its
    last dequantize): ``dtype`` of the integers, ``scale``, ``zero_point``."""

    dtype: str
    scale: float
    zero_point: int


def c_float(value: float) -> str:
    """Shortest decimal C literal of a float32 (``0.485f``) that reads back
    as exactly ``float32(value)``."""
    return np.format_float_positional(np.float32(value), unique=True, trim="0") + "f"


PREPROCESS_KEYS = ("resize", "crop", "mean", "std")


def check_preprocess(pre: dict) -> dict:
    """Validate ``{"resize": int, "crop": int, "mean": [3 numbers], "std": [3
    numbers]}`` (the model's preprocessing, ``PreprocessSpec`` fields); returns
    it normalized (ints, float tuples). Raises ValueError naming the bad key."""
    if set(pre) != set(PREPROCESS_KEYS):
        raise ValueError(f"preprocess needs exactly the keys {list(PREPROCESS_KEYS)}, got {sorted(pre)}")
    out = {}
    for key in ("resize", "crop"):
        v = pre[key]
        if key == "resize" and isinstance(v, (tuple, list)) and len(v) == 2 and all(map(_pixels, v)):
            out[key] = (int(v[0]), int(v[1]))  # exact [H, W] (the "yolo" preset)
            continue
        if not _pixels(v):
            raise ValueError(f"preprocess[{key!r}] must be a positive int"
                             + (" or [H, W]" if key == "resize" else "") + f", got {v!r}")
        out[key] = int(v)
    for key in ("mean", "std"):
        v = list(pre[key])
        if len(v) != 3 or not all(isinstance(x, (int, float, np.floating, np.integer)) for x in v):
            raise ValueError(f"preprocess[{key!r}] must be 3 numbers (R, G, B), got {pre[key]!r}")
        out[key] = tuple(float(x) for x in v)
    return out


def _pixels(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, np.integer)) and v > 0


def _preprocess_lines(M: str, pre: dict | None) -> list[str]:
    if pre is None:
        return []
    pre = check_preprocess(pre)
    exact = isinstance(pre["resize"], tuple)
    resize = (f"#define {M}_PREPROCESS_RESIZE_HW {{{pre['resize'][0]}, {pre['resize'][1]}}} "
              f"/* resized to exactly H, W pixels (aspect not kept) */" if exact else
              f"#define {M}_PREPROCESS_RESIZE {pre['resize']} /* shorter side, pixels */")
    how = "resized to H x W" if exact else "shorter side resized"
    return [f"/* input preprocessing (as calibrated): RGB in [0,1], {how} with bilinear "
            "antialiasing (torchvision), center crop, normalize, NCHW float32 */",
            "/* normalize: (x - MEAN[c]) / STD[c] per channel c = R, G, B */",
            resize,
            f"#define {M}_PREPROCESS_CROP {pre['crop']} /* center crop, pixels */",
            f"#define {M}_PREPROCESS_MEAN {{{', '.join(c_float(v) for v in pre['mean'])}}} /* R, G, B */",
            f"#define {M}_PREPROCESS_STD {{{', '.join(c_float(v) for v in pre['std'])}}} /* R, G, B */", ""]


def header(m: str, plan: Plan, sizes: dict, crc: int, quant: dict[str, Quant | None],
           c_array: bool, preprocess: dict | None = None) -> str:
    """Text of model.h (see the module docstring). ``preprocess``: see
    :func:`check_preprocess`; None leaves the PREPROCESS macros out."""
    M = m.upper()
    lines = [f"/* model.h: static C entry of model {m}; generated by doit-c7x, do not edit. */",
             f"#ifndef {M}_MODEL_H", f"#define {M}_MODEL_H", "", "#include <stddef.h>", "#include <stdint.h>", ""]
    lines += _preprocess_lines(M, preprocess)
    roles = (("INPUT", plan.input),) + ((("OUTPUT", plan.output),) if len(plan.outputs) < 2 else ())
    for role, t in roles:
        n = int(np.prod(t.shape))
        lines += [f"/* {role.lower()}: float32, NCHW for images */",
                  f"#define {M}_{role}_NDIM {len(t.shape)}",
                  f"#define {M}_{role}_SHAPE {_shape_init(t.shape)}",
                  f"#define {M}_{role}_SIZE {n} /* float32 elements */"]
        q = quant.get(role.lower())
        if q is not None:
            lines += [f"/* quantized as {q.dtype}: q = clamp(round(x * (1 / scale)) + zero_point), as torch */",
                      f"#define {M}_{role}_QDTYPE \"{q.dtype}\"",
                      f"#define {M}_{role}_SCALE {hex_literal(q.scale)} /* {np.float32(q.scale)} */",
                      f"#define {M}_{role}_ZERO_POINT {q.zero_point}"]
        lines.append("")
    if len(plan.outputs) > 1:
        lines += _outputs_lines(M, plan)
    lines += ["/* memory, bytes */",
              f"#define {M}_ARENA_BYTES {sizes['arena']}u /* static activation arena"
              + (", all levels */" if plan.levels is not None else " */")]
    if plan.levels is not None:
        lv = plan.levels
        lines += [f"#define {M}_ARENA_{lvl.upper()}_BYTES {lv.arena[lvl]}u /* activations in {SECTIONS[lvl]} */"
                  for lvl in LEVELS if lv.arena[lvl]]
        if lv.slot_bytes:
            lines.append(f"#define {M}_WEIGHT_SLOT_BYTES {lv.slot_bytes}u /* one of two L2 weight slots */")
    lines += [
              f"#define {M}_WORKSPACE_BYTES {sizes['workspace']}u /* static kernel scratch (LIFO) */",
              f"#define {M}_WEIGHTS_BYTES {sizes['weights']}u /* weights.bin, 64-byte aligned */",
              f"#define {M}_WEIGHTS_COUNT {len(plan.weights)}u",
              f"#define {M}_WEIGHTS_CRC32 0x{crc:08x}u", "",
              "/* return codes of the functions below */",
              f"#define {M}_OK 0",
              f"#define {M}_ERR_NULL (-1)      /* a NULL pointer argument */",
              f"#define {M}_ERR_WEIGHTS (-2)   /* weights blob: bad magic/version/count/size/CRC or another build's */",
              f"#define {M}_ERR_ALIGN (-3)     /* weights not 64-byte aligned */",
              f"#define {M}_ERR_WORKSPACE (-4) /* a kernel asked for more scratch than the static workspace */",
              f"#define {M}_ERR_KERNEL_BASE (-1000) /* -1000 - k: kernel call k (0-based, model.c order) failed */",
              "",
              "#ifdef __cplusplus", 'extern "C" {', "#endif", "",
              "/* One inference. weights: the weights.bin blob (64-byte aligned); input:",
              f" * {M}_INPUT_SIZE floats; output: {M}_OUTPUT_SIZE floats. Not reentrant (static arena). */",
              f"int {m}_run(const uint8_t* weights, const float* input, float* output);", "",
              "/* Full check of a weights blob of nbytes bytes (header, size, CRC-32): 0 or an error. */",
              f"int {m}_check_weights(const uint8_t* weights, size_t nbytes);", ""]
    if c_array:
        lines += ["/* weights.bin as a C array (weights_data.c) */",
                  f"extern const uint8_t {m}_weights[{M}_WEIGHTS_BYTES];", ""]
    lines += ["#ifdef __cplusplus", "}", "#endif", f"#endif /* {M}_MODEL_H */", ""]
    return "\n".join(lines)


def _outputs_lines(M: str, plan: Plan) -> list[str]:
    """model.h macros of a model with several outputs: all packed back to back
    in ``output`` in the model's return order (``<M>_OUTPUT<i>_OFFSET``)."""
    total = sum(plan.output_size(i) for i in range(len(plan.outputs)))
    lines = [f"/* {len(plan.outputs)} outputs, float32, packed back to back in output[] in the model's "
             f"return order: output i is output[{M}_OUTPUT<i>_OFFSET ...] */",
             f"#define {M}_OUTPUT_COUNT {len(plan.outputs)}",
             f"#define {M}_OUTPUT_SIZE {total} /* float32 elements, all outputs */"]
    for i, (t, off) in enumerate(zip(plan.outputs, plan.output_offsets)):
        lines += [f"#define {M}_OUTPUT{i}_NDIM {len(t.shape)}",
                  f"#define {M}_OUTPUT{i}_SHAPE {_shape_init(t.shape)}",
                  f"#define {M}_OUTPUT{i}_SIZE {plan.output_size(i)} /* float32 elements */",
                  f"#define {M}_OUTPUT{i}_OFFSET {off} /* float32 elements into output */"]
    return lines + [""]


_ALIGN_MACRO = """/* 64-byte alignment (MMALIB / DMA). GCC and TI's cl7x take the GCC attribute. */
#if defined(__GNUC__) || defined(__TI_COMPILER_VERSION__)
#define C7X_ALIGNED(n) __attribute__((aligned(n)))
#else
#define C7X_ALIGNED(n)
#endif
"""


def _runtime_support(m: str, M: str, ws_section: str = "") -> str:
    """Workspace allocator and weights checks (C text). ``ws_section``: the
    workspace's ``C7X_SECTION(...)`` attribute text (staged plan), or ""."""
    return f"""
/* ---- static LIFO workspace: TVMBackendAllocWorkspace without malloc ---- */
#ifndef {M}_WORKSPACE_LIMIT /* tests may shrink it to provoke {M}_ERR_WORKSPACE */
#define {M}_WORKSPACE_LIMIT {M}_WORKSPACE_BYTES
#endif
static uint8_t {m}_workspace[{M}_WORKSPACE_LIMIT] C7X_ALIGNED(64){ws_section};
static size_t {m}_ws_top;
static int {m}_ws_overflow;

void* {m}_TVMBackendAllocWorkspace(int device_type, int device_id, uint64_t nbytes,
                               int dtype_code_hint, int dtype_bits_hint) {{
  uint64_t need = (nbytes + 63u) & ~(uint64_t)63u;
  void* p;
  (void)device_type; (void)device_id; (void)dtype_code_hint; (void)dtype_bits_hint;
  if (nbytes > (uint64_t){M}_WORKSPACE_LIMIT || need > (uint64_t)({M}_WORKSPACE_LIMIT - {m}_ws_top)) {{
    {m}_ws_overflow = 1;
    return NULL;
  }}
  p = {m}_workspace + {m}_ws_top;
  {m}_ws_top += (size_t)need;
  return p;
}}

int {m}_TVMBackendFreeWorkspace(int device_type, int device_id, void* ptr) {{
  size_t off;
  (void)device_type; (void)device_id;
  if (ptr == NULL) return -1;
  off = (size_t)((uint8_t*)ptr - {m}_workspace);
  if (off >= {m}_ws_top) return -1; /* not ours, or freed out of LIFO order */
  {m}_ws_top = off;
  return 0;
}}

/* ---- weights blob checks (format: pipeline/backend/weights_bin.py) ---- */
static uint32_t {m}_rd32(const uint8_t* p) {{
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}}

static int {m}_header_ok(const uint8_t* w) {{
  static const uint8_t magic[8] = {{'C', '7', 'X', 'W', 'G', 'T', 0, 1}};
  return memcmp(w, magic, 8) == 0 && {m}_rd32(w + 8) == {weights_bin.VERSION}u &&
         {m}_rd32(w + 12) == {M}_WEIGHTS_COUNT && {m}_rd32(w + 16) == {M}_WEIGHTS_BYTES &&
         {m}_rd32(w + 20) == 0u && {m}_rd32(w + 24) == {M}_WEIGHTS_CRC32;
}}

/* CRC-32 (zlib: reflected 0xEDB88320, init and final xor 0xFFFFFFFF), bitwise. */
static uint32_t {m}_crc32(const uint8_t* p, size_t n) {{
  uint32_t c = 0xFFFFFFFFu;
  size_t i;
  int k;
  for (i = 0; i < n; ++i) {{
    c ^= p[i];
    for (k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }}
  return c ^ 0xFFFFFFFFu;
}}

int {m}_check_weights(const uint8_t* weights, size_t nbytes) {{
  if (weights == NULL) return {M}_ERR_NULL;
  if (nbytes != (size_t){M}_WEIGHTS_BYTES || !{m}_header_ok(weights)) return {M}_ERR_WEIGHTS;
  if ({m}_crc32(weights + {weights_bin.HEADER_SIZE}, nbytes - {weights_bin.HEADER_SIZE}) != {M}_WEIGHTS_CRC32) return {M}_ERR_WEIGHTS;
  return {M}_OK;
}}
"""


def _call_support(m: str, M: str, max_args: int) -> str:
    """Kernel call helper and failure code (C text; only when main calls kernels)."""
    return f"""
/* ---- kernel calls: TVM packed-function convention, DLTensor pointers ---- */
static int32_t {m}_call(C7xTvmPackedFunc f, DLTensor* const* t, int32_t n) {{
  TVMFFIAny args[{max_args}];
  TVMFFIAny ret;
  int32_t i;
  for (i = 0; i < n; ++i) {{
    args[i].type_index = kTVMFFIDLTensorPtr;
    args[i].zero_padding = 0;
    args[i].v_ptr = t[i];
  }}
  ret.type_index = 0;
  ret.zero_padding = 0;
  ret.v_ptr = NULL;
  return f(NULL, args, n, &ret);
}}

static int {m}_fail(int k) {{
  return {m}_ws_overflow ? {M}_ERR_WORKSPACE : {M}_ERR_KERNEL_BASE - k;
}}
"""


def _profile_support(m: str, M: str, symbols: list[str]) -> str:
    """Per-layer profile, TI's ``-profile-layers`` (C text, all inside
    ``#ifdef <M>_PROFILE_LAYERS``; ``symbols``: the C symbol of each call).

    One timer macro, ``<M>_PROFILE_NOW()`` (uint64_t): the C7x's 64-bit
    time-stamp counter ``__TSC`` (``c7x.h``, +1 per CPU cycle) under TI's
    C7000 compiler (``__C7000__``), else ``clock_gettime(CLOCK_MONOTONIC)`` in
    nanoseconds. Per run, as TI's runtime: ``<m>_run`` restarts the count, so
    ``<m>_print_layer_profile()`` prints the block of the last run; the block
    keeps TI's words ("cycles") on the host too, so one parser
    (:mod:`.profile_block`) reads both."""
    n = len(symbols)
    names = ",\n".join(f'  "{s}"' for s in symbols)
    table = (f"""#define {M}_PROFILE_CALLS {n}
static const char* const {m}_profile_names[{M}_PROFILE_CALLS] = {{
{names}}};
static uint64_t {m}_profile_ticks[{M}_PROFILE_CALLS];
static uint64_t {m}_profile_start;
""" if n else "")
    loop = (f"""  for (i = 0; i < {m}_profile_count; ++i) {{
    printf("[%3d] %-40s %" PRIu64 " cycles\\n", i, {m}_profile_names[i], {m}_profile_ticks[i]);
    total += {m}_profile_ticks[i];
  }}
""" if n else "")
    decl = "  int i;\n" if n else ""
    return f"""#ifdef {M}_PROFILE_LAYERS
/* ---- per-layer profile: TI's -profile-layers, switched on with -D{M}_PROFILE_LAYERS ----
 * {m}_run times each of its {n} kernel calls and restarts the count on every run (one
 * block per inference, as TI's runtime); {m}_print_layer_profile() prints the last run's
 * block to stdout in the format of TI's TVMPrintLayerProfile (declare it yourself:
 * void {m}_print_layer_profile(void);). The timer is {M}_PROFILE_NOW(): the C7x's 64-bit
 * time-stamp counter __TSC (c7x.h, +1 per CPU cycle) under TI's C7000 compiler, else
 * clock_gettime(CLOCK_MONOTONIC) in nanoseconds. The block says "cycles" either way (one
 * parser reads both): on a host the numbers are NANOSECONDS of the host build, not DSP
 * cycles. Define {M}_PROFILE_NOW() yourself for another uint64_t counter. */
#include <inttypes.h>
#include <stdio.h>
#ifndef {M}_PROFILE_NOW
#if defined(__C7000__)
#include <c7x.h>
#define {M}_PROFILE_NOW() ((uint64_t)__TSC)
#else
#include <time.h>
static uint64_t {m}_profile_clock(void) {{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}}
#define {M}_PROFILE_NOW() {m}_profile_clock()
#endif
#endif
{table}static int {m}_profile_count;
#define {M}_PROFILE_RESET() ({m}_profile_count = 0)
#define {M}_PROFILE_START() ({m}_profile_start = {M}_PROFILE_NOW())
#define {M}_PROFILE_STOP(k) \\
  do {{ {m}_profile_ticks[k] = {M}_PROFILE_NOW() - {m}_profile_start; {m}_profile_count = (k) + 1; }} while (0)

void {m}_print_layer_profile(void);
void {m}_print_layer_profile(void) {{
  uint64_t total = 0;
{decl}  printf("\\n===== TVM Layer Profile =====\\n");
{loop}  printf("-----------------------------\\n");
  printf("Total: %" PRIu64 " cycles (%d layers)\\n", total, {m}_profile_count);
  printf("=============================\\n");
}}
#else
/* Profiling off (no -D{M}_PROFILE_LAYERS): the {M}_PROFILE_* hooks in {m}_run expand to
 * nothing, so the object code is that of model.c without any profiling text. */
#define {M}_PROFILE_RESET()
#define {M}_PROFILE_START()
#define {M}_PROFILE_STOP(k)
#endif"""


def _traffic_support(m: str, M: str, plan: Plan) -> str:
    """Instrumented traffic count (C text, inside ``#ifdef <M>_COUNT_TRAFFIC``): the bytes
    every kernel call's tensors occupy, by the level their address is in, and the bytes
    copied DDR -> L2 by DMA. What the plan says (manifest ``memory``) must equal it."""
    on_chip = {"l2": [], "msmc": []}
    if plan.levels is not None:
        for lvl in on_chip:
            if plan.levels.arena[lvl]:
                on_chip[lvl].append(_arena_name(m, lvl))
        if plan.levels.slot_bytes:
            on_chip["l2"].append(f"{m}_wslot")
    tests = [(i, " || ".join(f"{m}_in(p, {a}, sizeof {a})" for a in arrays))
             for i, arrays in ((0, on_chip["l2"]), (1, on_chip["msmc"])) if arrays]
    body = "".join(f"  if ({cond}) return {i};\n" for i, cond in tests)
    helper = (f"""static int {m}_in(const void* p, const void* lo, size_t n) {{
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)lo;
  return a >= b && a - b < n;
}}
""" if tests else "")
    unused = "" if tests else "  (void)p;\n"
    count = (f"""{helper}static int {m}_level(const void* p) {{
{unused}{body}  return 2;
}}
static uint64_t {m}_bytes(const DLTensor* t) {{
  uint64_t bytes = ((uint64_t)t->dtype.bits * t->dtype.lanes + 7u) / 8u;
  int d;
  for (d = 0; d < t->ndim; ++d) bytes *= (uint64_t)t->shape[d];
  return bytes;
}}
static void {m}_count(DLTensor* const* t, int n) {{
  int i;
  for (i = 0; i < n; ++i) {m}_traffic[{m}_level(t[i]->data)] += {m}_bytes(t[i]);
}}
""" if plan.calls else "")
    if plan.levels is not None and plan.levels.tiled:
        count += f"""/* a tiled call (t[0]: the L2 slots, t[s]: the tensor it streams from DDR, its weights or
 * its input): the kernel reads t[s] from the slots, where the DMA (counted by c7x_dma_copy)
 * put it tile by tile */
static void {m}_count_tiled(DLTensor* const* t, int n, int s) {{
  int i;
  for (i = 1; i < n; ++i) {m}_traffic[{m}_level(i == s ? t[0]->data : t[i]->data)] += {m}_bytes(t[i]);
}}
"""
    return f"""#ifdef {M}_COUNT_TRAFFIC
/* ---- traffic count, switched on with -D{M}_COUNT_TRAFFIC ----
 * Bytes per inference: [0] L2, [1] MSMC, [2] DDR, read or written by the kernel calls (each
 * tensor argument counted whole, at the level its address is in), and [3] copied DDR -> L2
 * by DMA (c7x_dma_copy counts into c7x_dma_bytes). {m}_print_traffic() prints the last
 * run's counts as one line to stdout. */
#include <inttypes.h>
#include <stdio.h>
static uint64_t {m}_traffic[4];
uint64_t c7x_dma_bytes;
{count}void {m}_print_traffic(void);
void {m}_print_traffic(void) {{
  printf("c7x-traffic l2=%" PRIu64 " msmc=%" PRIu64 " ddr=%" PRIu64 " dma=%" PRIu64 "\\n",
         {m}_traffic[0], {m}_traffic[1], {m}_traffic[2], c7x_dma_bytes);
}}
#define {M}_TRAFFIC_RESET() (memset({m}_traffic, 0, sizeof {m}_traffic), c7x_dma_bytes = 0)
#define {M}_TRAFFIC_COUNT(a, n) {m}_count(a, n)
#define {M}_TRAFFIC_COUNT_TILED(a, n, s) {m}_count_tiled(a, n, s)
#else
#define {M}_TRAFFIC_RESET()
#define {M}_TRAFFIC_COUNT(a, n)
#define {M}_TRAFFIC_COUNT_TILED(a, n, s)
#endif
#define {M}_DMA(dst, src, n) c7x_dma_copy(dst, src, n)"""


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
            out.append(f"static uint8_t {_arena_name(m, lvl)}[{M}_ARENA_{lvl.upper()}_BYTES] "
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
        out.append(f"static int64_t {m}_{t.name}_shape[{max(len(t.shape), 1)}] = {_shape_init(t.shape)};")
        out.append(f"static DLTensor {m}_{t.name} = {{NULL, {{kDLCPU, 0}}, {len(t.shape)}, "
                   f"{_dl_dtype(t.dtype)}, {m}_{t.name}_shape, NULL, 0}};")
    return out


def _arena_name(m: str, level: str | None) -> str:
    """C name of the activation arena of ``level`` (None: the flat plan's one arena)."""
    return f"{m}_arena" + (f"_{level}" if level else "")


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
               "arena": lambda t: f"(void*)({_arena_name(m, t.level if staged else None)} + {t.offset})",
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
           '#include "c7x_tvm_shim.h"', '#include "c7x_memory.h"', "", _ALIGN_MACRO,
           "/* kernels (tvm_kernels.c) */"]
    out += [f"int32_t __tvm_ffi_{prefix}{k}(void* self, void* args, int32_t num_args, void* result);"
            for k in kernels]
    used = {id(t) for _, args in plan.calls for t in args} | {id(plan.input)} | {id(t) for t in plan.outputs}
    if plan.levels is not None:   # a DMA source no call reads directly (e.g. a view of the input)
        used |= {id(src) for pairs in plan.levels.stage_in.values() for src, _ in pairs}
    tensors = [t for t in plan.tensors if id(t) in used]
    out += _arena_decls(m, M, plan, tensors)
    ws_level = plan.levels.workspace_level if plan.levels is not None else None
    out.append(_runtime_support(m, M, f' C7X_SECTION("{SECTIONS[ws_level]}")' if ws_level else ""))
    if plan.calls:
        out.append(_call_support(m, M, max_args))
    out.append(_traffic_support(m, M, plan))
    out.append(_profile_support(m, M, [f"__tvm_ffi_{prefix}{name}" for name, _ in plan.calls]))
    out += _tensor_decls(m, tensors)
    out += _run_function(m, plan, tensors, entries, prefix)
    return "\n".join(out)


def weights_array_source(m: str, blob: bytes) -> str:
    """Text of weights_data.c: ``const uint8_t <m>_weights[]``, 64-byte aligned."""
    M = m.upper()
    rows = [", ".join(f"0x{b:02x}" for b in blob[i:i + 16]) for i in range(0, len(blob), 16)]
    return "\n".join([f"/* weights_data.c: weights.bin of model {m} as a C array; generated, do not edit. */",
                      "#include <stdint.h>", '#include "model.h"', "", _ALIGN_MACRO,
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
