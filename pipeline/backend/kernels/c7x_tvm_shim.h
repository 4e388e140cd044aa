/*
 * c7x_tvm_shim.h: the few TVM / DLPack declarations that TVM's generated C
 * (tvm_kernels.c) needs, so it builds with no TVM header and no TVM runtime.
 *
 * TVM's C codegen emits every PrimFunc as a packed function
 *   int32_t __tvm_ffi_<name>(void* self, void* args, int32_t num_args, void* result)
 * that reads ((TVMFFIAny*)args)[i].type_index / .v_ptr (type index 7 =
 * kTVMFFIDLTensorPtr: v_ptr is a DLTensor*), then the DLTensor's data, shape,
 * strides and device; and that takes scratch memory from
 * TVMBackendAllocWorkspace / TVMBackendFreeWorkspace (LIFO). The generated
 * model.c provides those two from a static arena (the generated files rename
 * them per model with #define, so two models can be linked together).
 *
 * Layouts follow dlpack.h (DLTensor, DLDevice, DLDataType) and tvm/ffi/c_api.h
 * (TVMFFIAny). TVMFFIAny is declared here with only the members the generated
 * code touches, because its other members live in an anonymous union, which
 * C99 does not have; on 64-bit targets (C7x, x86-64) its size and the offset
 * of v_ptr (8) equal TVM's. Only code using this header passes it around.
 *
 * c7x_f32_bits / c7x_f64_bits: a float constant of the generated code given
 * by its IEEE-754 bit pattern (exact, infinities and NaN included; TVM's own
 * decimal printing keeps 7 digits). Reading the other member of a union is
 * defined in C99 (TC3, 6.5.2.3 footnote 82); compilers fold the call to a
 * constant. See pipeline/backend/tir_c.py.
 */
#ifndef C7X_TVM_SHIM_H
#define C7X_TVM_SHIM_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifndef TVM_DLL
#define TVM_DLL
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int32_t device_type;
  int32_t device_id;
} DLDevice;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} DLTensor;

enum { kDLCPU = 1 };
enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2 };
enum { kTVMFFIDLTensorPtr = 7, kTVMFFITensor = 70 };

typedef struct {
  int32_t type_index;
  uint32_t zero_padding;
  void* v_ptr;
} TVMFFIAny;

static inline float c7x_f32_bits(uint32_t bits) {
  union {
    uint32_t u;
    float f;
  } v;
  v.u = bits;
  return v.f;
}

static inline double c7x_f64_bits(uint64_t bits) {
  union {
    uint64_t u;
    double f;
  } v;
  v.u = bits;
  return v.f;
}

/* Signature of every generated kernel entry (__tvm_ffi_<name>). */
typedef int32_t (*C7xTvmPackedFunc)(void* self, void* args, int32_t num_args, void* result);

void* TVMBackendAllocWorkspace(int device_type, int device_id, uint64_t nbytes,
                               int dtype_code_hint, int dtype_bits_hint);
int TVMBackendFreeWorkspace(int device_type, int device_id, void* ptr);

#ifdef __cplusplus
}
#endif
#endif /* C7X_TVM_SHIM_H */
