"""The C runtime support printed into ``model.c``: the static workspace, the packed-call
helpers, the per-layer profile (TI's ``-profile-layers`` block, ``-D<M>_PROFILE_LAYERS``)
and the traffic counters (``-D<M>_COUNT_TRAFFIC``). Text only: :mod:`.emit_c` places it.
"""

from __future__ import annotations

from . import weights_bin
from .c_header import arena_name
from .memory_plan import Plan

ALIGN_MACRO = """/* 64-byte alignment (MMALIB / DMA). GCC and TI's cl7x take the GCC attribute. */
#if defined(__GNUC__) || defined(__TI_COMPILER_VERSION__)
#define C7X_ALIGNED(n) __attribute__((aligned(n)))
#else
#define C7X_ALIGNED(n)
#endif
"""

def runtime_support(m: str, M: str, ws_section: str = "") -> str:
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

def call_support(m: str, M: str, max_args: int) -> str:
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

def profile_support(m: str, M: str, symbols: list[str]) -> str:
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

def traffic_support(m: str, M: str, plan: Plan) -> str:
    """Instrumented traffic count (C text, inside ``#ifdef <M>_COUNT_TRAFFIC``): the bytes
    every kernel call's tensors occupy, by the level their address is in, and the bytes
    copied DDR -> L2 by DMA. What the plan says (manifest ``memory``) must equal it."""
    on_chip = {"l2": [], "msmc": []}
    if plan.levels is not None:
        for lvl in on_chip:
            if plan.levels.arena[lvl]:
                on_chip[lvl].append(arena_name(m, lvl))
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
