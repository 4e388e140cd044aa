/* c7x_memory.h: memory placement and DMA for the generated model.c (doit-c7x).
 *
 * Sections. model.c puts each static buffer in a named section: ".l2sram"
 * (L2 SRAM of the C7x core), ".msmc" (shared L3 SRAM) or ".ddr". The linker
 * command file written beside model.c (c7x_memory.cmd) maps them to the
 * L2SRAM / MSMC / DDR memory ranges of the application's own linker file.
 * The attribute is applied under TI's C7000 compiler (__C7000__), or when
 * C7X_SECTIONS is defined (a host build can check the placement); otherwise
 * the buffers are plain statics.
 *
 * DMA. model.c copies weights from weights.bin (DDR) into an L2 slot with
 * C7X_DMA_COPY(dst, src, bytes) and waits for every copy issued so far with
 * C7X_DMA_WAIT() before the call that reads them. By default the copy is a
 * synchronous memcpy (correct on the host and on the C7x; the C7x then does
 * the copy itself instead of overlapping it with the previous call). To use
 * the SoC's DMA engine, define both macros before this header is included
 * (e.g. with the compiler's --preinclude / -include of a file that maps them
 * onto TI's DMA utility of the SDK): C7X_DMA_COPY must start an asynchronous
 * copy and C7X_DMA_WAIT must block until all started copies are complete.
 */
#ifndef C7X_MEMORY_H
#define C7X_MEMORY_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__C7000__) || defined(C7X_SECTIONS)
#define C7X_SECTION(name) __attribute__((section(name)))
#else
#define C7X_SECTION(name)
#endif

#ifndef C7X_DMA_COPY
#define C7X_DMA_COPY(dst, src, bytes) memcpy((dst), (src), (bytes))
#endif
#ifndef C7X_DMA_WAIT
#define C7X_DMA_WAIT() ((void)0)
#endif

/* Instrumented host builds (-DC7X_COUNT_DMA) count the bytes copied; the
 * counter is defined by model.c under -D<M>_COUNT_TRAFFIC. */
#ifdef C7X_COUNT_DMA
#include <stdint.h>
extern uint64_t c7x_dma_bytes;
#define C7X_DMA_COUNT(bytes) (c7x_dma_bytes += (uint64_t)(bytes))
#else
#define C7X_DMA_COUNT(bytes) ((void)0)
#endif

/* The copy and wait as functions, for the tiled kernels of tvm_kernels.c
 * (pipeline/backend/tiling.py) and model.c alike. */
static inline int32_t c7x_dma_copy(void* dst, const void* src, int32_t bytes)
{
    C7X_DMA_COPY(dst, src, (size_t)bytes);
    C7X_DMA_COUNT(bytes);
    return 0;
}

static inline int32_t c7x_dma_wait(void)
{
    C7X_DMA_WAIT();
    return 0;
}

#endif /* C7X_MEMORY_H */
