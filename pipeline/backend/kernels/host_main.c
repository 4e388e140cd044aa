/*
 * host_main.c: host harness around one generated model (model.h / model.c).
 *
 *   <exe> <weights.bin | -> <input.f32> <n_images> <output.f32>
 *
 * Reads n_images raw float32 inputs (each <M>_INPUT_SIZE floats, as the model
 * expects them: NCHW, batch 1), runs <m>_run on each, writes the raw float32
 * outputs back to back (<M>_OUTPUT_SIZE floats per image: for a model with
 * several outputs, all of them, packed as model.h's <M>_OUTPUT<i>_OFFSET
 * say). "-" as weights uses the C array of weights_data.c (build with
 * -DC7X_WEIGHTS_ARRAY). Prints "c7x-host: <n> images, <t> ms/image"
 * (CPU time, clock()) to stderr. Exit status 0, or 2 for bad usage / I/O,
 * 3 for a weights blob that fails <m>_check_weights, 4 if <m>_run fails (the
 * code is printed).
 *
 * Build with -DC7X_MODEL=<m> -DC7X_MODEL_UC=<M> (the C name of the model and
 * its upper-case macro prefix, as in model.h). Plain C99.
 *
 * Per-layer profile: with -DC7X_PROFILE_LAYERS (and -D<M>_PROFILE_LAYERS for
 * model.c) the harness calls <m>_print_layer_profile() after every image, so
 * stdout holds one "===== TVM Layer Profile =====" block per image, as TI's
 * runtime prints one per inference (also after a failed run: its block ends at
 * the last call that completed). On the host the counts are nanoseconds.
 *
 * Memory traffic: with -DC7X_COUNT_TRAFFIC (and -D<M>_COUNT_TRAFFIC for
 * model.c) the harness calls <m>_print_traffic() after every image: one line
 * "c7x-traffic l2=<B> msmc=<B> ddr=<B> dma=<B>" on stdout (bytes of that run).
 *
 * Intermediate tensors: built with -DC7X_DUMP_CALLS and
 * -DC7X_DUMP_SYMBOLS='C7X_WRAP(<sym>) ...' (one per kernel symbol of model.c)
 * and linked with -Wl,--wrap=<sym> for each (pipeline/backend/host.py does
 * this for every host build), every kernel call goes through __wrap_<sym>
 * below: model.c and the kernels compile unchanged, ld routes their calls
 * through the wrapper. With the environment variable C7X_DUMP=<file>, every
 * kernel call of the first C7X_DUMP_IMAGES images (default 1) appends its
 * output tensor, the call's last argument, to <file>: per call an int32
 * length of the kernel symbol, the symbol, an int64 byte count and the
 * tensor's bytes (host byte order). Without C7X_DUMP nothing is written.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "model.h"

#ifdef C7X_DUMP_CALLS
#include <string.h>

#include "c7x_tvm_shim.h"

static FILE* c7x_dump_file; /* NULL: not dumping (no C7X_DUMP, or past the dumped images) */

/* Called by each wrapper after a successful kernel call: write its last tensor argument. */
void c7x_dump_call(const char* symbol, void* args, int32_t num_args);
void c7x_dump_call(const char* symbol, void* args, int32_t num_args) {
  const DLTensor* t;
  int64_t nbytes;
  int32_t len = (int32_t)strlen(symbol), d;
  if (c7x_dump_file == NULL || num_args < 1) return;
  t = (const DLTensor*)((TVMFFIAny*)args)[num_args - 1].v_ptr;
  nbytes = ((int64_t)t->dtype.bits * t->dtype.lanes + 7) / 8;
  for (d = 0; d < t->ndim; ++d) nbytes *= t->shape[d];
  fwrite(&len, sizeof len, 1, c7x_dump_file);
  fwrite(symbol, 1, (size_t)len, c7x_dump_file);
  fwrite(&nbytes, sizeof nbytes, 1, c7x_dump_file);
  fwrite((const char*)t->data + t->byte_offset, 1, (size_t)nbytes, c7x_dump_file);
}

#ifdef C7X_DUMP_SYMBOLS
/* One wrapper per kernel symbol s: ld's --wrap=s sends model.c's calls here. */
#define C7X_WRAP(s)                                                            \
  int32_t __real_##s(void* self, void* args, int32_t num_args, void* result);  \
  int32_t __wrap_##s(void* self, void* args, int32_t num_args, void* result);  \
  int32_t __wrap_##s(void* self, void* args, int32_t num_args, void* result) { \
    int32_t rc = __real_##s(self, args, num_args, result);                     \
    if (rc == 0) c7x_dump_call(#s, args, num_args);                            \
    return rc;                                                                 \
  }
C7X_DUMP_SYMBOLS
#endif
#endif

#define C7X_CAT_(a, b) a##b
#define C7X_CAT(a, b) C7X_CAT_(a, b)
#define RUN C7X_CAT(C7X_MODEL, _run)
#define CHECK_WEIGHTS C7X_CAT(C7X_MODEL, _check_weights)
#define INPUT_SIZE C7X_CAT(C7X_MODEL_UC, _INPUT_SIZE)
#define OUTPUT_SIZE C7X_CAT(C7X_MODEL_UC, _OUTPUT_SIZE)
#define WEIGHTS_BYTES C7X_CAT(C7X_MODEL_UC, _WEIGHTS_BYTES)
#ifdef C7X_COUNT_TRAFFIC
#define PRINT_TRAFFIC C7X_CAT(C7X_MODEL, _print_traffic)
void PRINT_TRAFFIC(void); /* model.c, built with -D<M>_COUNT_TRAFFIC */
#endif
#ifdef C7X_PROFILE_LAYERS
#define PRINT_LAYER_PROFILE C7X_CAT(C7X_MODEL, _print_layer_profile)
void PRINT_LAYER_PROFILE(void); /* model.c, built with -D<M>_PROFILE_LAYERS */
#endif

/* Whole file into a 64-byte aligned buffer; *base gets the pointer to free. */
static uint8_t* read_file(const char* path, size_t* n, void** base) {
  FILE* f = fopen(path, "rb");
  long size;
  uint8_t* p;
  if (f == NULL) return NULL;
  if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return NULL;
  }
  *base = malloc((size_t)size + 64);
  if (*base == NULL) {
    fclose(f);
    return NULL;
  }
  /* malloc gives 16-byte alignment; the model wants 64 (C99 has no aligned_alloc). */
  p = (uint8_t*)*base + (64 - ((size_t)*base & 63u)) % 64;
  if (fread(p, 1, (size_t)size, f) != (size_t)size) {
    fclose(f);
    return NULL;
  }
  fclose(f);
  *n = (size_t)size;
  return p;
}

int main(int argc, char** argv) {
  const uint8_t* weights;
  size_t wbytes = 0, inbytes = 0;
  void *wbase = NULL, *inbase = NULL;
  const float* input;
  float* output;
  long n, i;
  int rc;
  clock_t t0;
  FILE* out;
#ifdef C7X_DUMP_CALLS
  const char* dump_path = getenv("C7X_DUMP");
  long dump_images = getenv("C7X_DUMP_IMAGES") ? strtol(getenv("C7X_DUMP_IMAGES"), NULL, 10) : 1;
  if (dump_path != NULL && (c7x_dump_file = fopen(dump_path, "wb")) == NULL) {
    fprintf(stderr, "c7x-host: cannot write %s\n", dump_path);
    return 2;
  }
#endif

  if (argc != 5) {
    fprintf(stderr, "usage: %s <weights.bin|-> <input.f32> <n_images> <output.f32>\n", argv[0]);
    return 2;
  }
#ifdef C7X_WEIGHTS_ARRAY
  if (argv[1][0] == '-' && argv[1][1] == '\0') {
    weights = C7X_CAT(C7X_MODEL, _weights);
    wbytes = WEIGHTS_BYTES;
  } else
#endif
  {
    weights = read_file(argv[1], &wbytes, &wbase);
  }
  if (weights == NULL) {
    fprintf(stderr, "c7x-host: cannot read weights %s\n", argv[1]);
    return 2;
  }
  rc = CHECK_WEIGHTS(weights, wbytes);
  if (rc != 0) {
    fprintf(stderr, "c7x-host: weights check failed (%d)\n", rc);
    return 3;
  }
  n = strtol(argv[3], NULL, 10);
  input = (const float*)read_file(argv[2], &inbytes, &inbase);
  if (input == NULL || n <= 0 || inbytes != (size_t)n * INPUT_SIZE * sizeof(float)) {
    fprintf(stderr, "c7x-host: %s must hold %ld x %d float32\n", argv[2], n, (int)INPUT_SIZE);
    return 2;
  }
  output = (float*)malloc((size_t)n * OUTPUT_SIZE * sizeof(float));
  if (output == NULL) return 2;
  t0 = clock();
  for (i = 0; i < n; ++i) {
#ifdef C7X_DUMP_CALLS
    if (c7x_dump_file != NULL && i == dump_images) {
      fclose(c7x_dump_file);
      c7x_dump_file = NULL;
    }
#endif
    rc = RUN(weights, input + (size_t)i * INPUT_SIZE, output + (size_t)i * OUTPUT_SIZE);
#ifdef C7X_PROFILE_LAYERS
    PRINT_LAYER_PROFILE();
#endif
#ifdef C7X_COUNT_TRAFFIC
    PRINT_TRAFFIC();
#endif
    if (rc != 0) {
      fprintf(stderr, "c7x-host: run failed on image %ld (%d)\n", i, rc);
      return 4;
    }
  }
  fprintf(stderr, "c7x-host: %ld images, %.3f ms/image\n", n,
          1000.0 * (double)(clock() - t0) / CLOCKS_PER_SEC / (double)n);
  out = fopen(argv[4], "wb");
  if (out == NULL || fwrite(output, sizeof(float), (size_t)n * OUTPUT_SIZE, out) != (size_t)n * OUTPUT_SIZE) {
    fprintf(stderr, "c7x-host: cannot write %s\n", argv[4]);
    return 2;
  }
  fclose(out);
#ifdef C7X_DUMP_CALLS
  if (c7x_dump_file != NULL && fclose(c7x_dump_file) != 0) {
    fprintf(stderr, "c7x-host: cannot write %s\n", dump_path);
    return 2;
  }
#endif
  free(output);
  free(inbase);
  free(wbase);
  return 0;
}
