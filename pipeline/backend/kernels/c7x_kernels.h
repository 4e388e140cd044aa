/*
 * c7x_kernels.h: the kernel ABI that doit-c7x's generated code calls.
 *
 * These are the extern names and argument lists of TI's MMALIB wrappers and
 * C7x kernels (c7x-backend-facts.md, section B). On the DSP they resolve to
 * TI's libraries; on the host, c7x_kernels_ref.c implements them in plain C99
 * so the generated C can be proven bit-exact against the Python reference
 * (pipeline/backend/kernels/reference.py) without a board.
 *
 * Layouts: activations NCHW with N = 1, weights OIHW (conv), [C*KH*KW]
 * (depthwise, natural order), [N, K] (fully connected, transposed inside).
 *
 * Requantization of conv / depthwise / FC (per output channel c):
 *   out = saturate(rshift((acc + bias[c]) * scale[c], shift[c]))
 * acc   = sum of raw int products (no zero point; folded into bias),
 *         int32 for i8 (computed in int64), int64 for i16;
 * bias  = int32 (i8) / int64 (i16); scale in [1, 127]; shift in [0, 31];
 * rshift rounds as C7X_ROUNDING says (one switch for every kernel here):
 *   C7X_ROUND_HALF_UP (default): floor((v + 2^(shift-1)) / 2^shift)
 *   C7X_ROUND_FLOOR:             floor(v / 2^shift)   (truncation toward -inf)
 * Padding pixels are raw 0 (the generated code only offloads layers whose
 * input zero point is 0 when they pad).
 *
 * Every kernel returns 0 on success, nonzero on bad arguments.
 */
#ifndef C7X_KERNELS_H
#define C7X_KERNELS_H

#include <stdint.h>

#define C7X_ROUND_HALF_UP 0
#define C7X_ROUND_FLOOR 1
#ifndef C7X_ROUNDING
#define C7X_ROUNDING C7X_ROUND_HALF_UP
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- MMALIB (tagged c7x_offload_backend = "mmalib") ---- */

/* conv2d, groups = 1. in [1, C_in, H_in, W_in], w [C_out, C_in, KH, KW],
 * out [1, C_out, H_out, W_out], H_out = (H_in + pad_top + pad_bottom - KH) / stride_h + 1. */
int32_t mmalib_conv2d_i8(const int8_t* in, const int8_t* w, const int32_t* bias,
                         const uint8_t* scale, const uint8_t* shift, int8_t* out,
                         int32_t C_in, int32_t H_in, int32_t W_in, int32_t C_out,
                         int32_t KH, int32_t KW, int32_t stride_h, int32_t stride_w,
                         int32_t pad_top, int32_t pad_bottom, int32_t pad_left, int32_t pad_right);
int32_t mmalib_conv2d_i16(const int16_t* in, const int16_t* w, const int64_t* bias,
                          const uint8_t* scale, const uint8_t* shift, int16_t* out,
                          int32_t C_in, int32_t H_in, int32_t W_in, int32_t C_out,
                          int32_t KH, int32_t KW, int32_t stride_h, int32_t stride_w,
                          int32_t pad_top, int32_t pad_bottom, int32_t pad_left, int32_t pad_right);
/* grouped conv, 1 < groups < C_in: w [C_out, C_in / groups, KH, KW]. */
int32_t mmalib_conv2d_i8_grouped_loop(const int8_t* in, const int8_t* w, const int32_t* bias,
                                      const uint8_t* scale, const uint8_t* shift, int8_t* out,
                                      int32_t C_in, int32_t H_in, int32_t W_in, int32_t C_out,
                                      int32_t KH, int32_t KW, int32_t stride_h, int32_t stride_w,
                                      int32_t pad_top, int32_t pad_bottom, int32_t pad_left,
                                      int32_t pad_right, int32_t groups);
/* depthwise conv2d, groups = C: w [C * KH * KW]. num_groups must equal C. */
int32_t mmalib_depthwise_conv2d_i8(const int8_t* in, const int8_t* w, const int32_t* bias,
                                   const uint8_t* scale, const uint8_t* shift, int8_t* out,
                                   int32_t C, int32_t H_in, int32_t W_in, int32_t KH, int32_t KW,
                                   int32_t stride_h, int32_t stride_w, int32_t pad_top,
                                   int32_t pad_bottom, int32_t pad_left, int32_t pad_right,
                                   int32_t num_groups);
int32_t mmalib_depthwise_conv2d_i16(const int16_t* in, const int16_t* w, const int64_t* bias,
                                    const uint8_t* scale, const uint8_t* shift, int16_t* out,
                                    int32_t C, int32_t H_in, int32_t W_in, int32_t KH, int32_t KW,
                                    int32_t stride_h, int32_t stride_w, int32_t pad_top,
                                    int32_t pad_bottom, int32_t pad_left, int32_t pad_right,
                                    int32_t num_groups);
/* fully connected: in [M, K], w [N, K], out [M, N]. */
int32_t mmalib_matmul_bias_i8(const int8_t* in, const int8_t* w, const int32_t* bias,
                              const uint8_t* scale, const uint8_t* shift, int8_t* out,
                              int32_t M, int32_t K, int32_t N);
int32_t mmalib_matmul_bias_i16(const int16_t* in, const int16_t* w, const int64_t* bias,
                               const uint8_t* scale, const uint8_t* shift, int16_t* out,
                               int32_t M, int32_t K, int32_t N);

/* ---- C7x kernels (not MMALIB) ---- */

/* Residual add of two equally shaped tensors (n elements, no broadcasting).
 * params: 16 bytes, little-endian: int32 M_x, int32 M_skip, int32 shift,
 * int8 zp_x, int8 zp_skip, int8 zp_out, pad (int16 kernel: the same blob, zero points 0).
 * r = rshift((x - zp_x) * M_x + (skip - zp_skip) * M_skip, shift) + zp_out;
 * if has_relu: r = max(r, zp_out); out = saturate(r).
 * Accumulation in int64 (both dtypes), rounding per C7X_ROUNDING. */
int32_t c7x_int8_residual_add_relu(const int8_t* x, const int8_t* skip, const uint8_t* params,
                                   int8_t* out, int32_t n, int32_t has_relu);
int32_t c7x_int16_residual_add_relu(const int16_t* x, const int16_t* skip, const uint8_t* params,
                                    int16_t* out, int32_t n, int32_t has_relu);

/* Max pool with equal input/output quantization; padding pixels never win. */
int32_t c7x_int8_max_pool(const int8_t* in, int8_t* out, int32_t N, int32_t C, int32_t H_in,
                          int32_t W_in, int32_t H_out, int32_t W_out, int32_t kH, int32_t kW,
                          int32_t sH, int32_t sW, int32_t pH, int32_t pW);
int32_t c7x_int8_max_pool_tidl(const int8_t* in, int8_t* out, int32_t N, int32_t C, int32_t H_in,
                               int32_t W_in, int32_t H_out, int32_t W_out, int32_t kH, int32_t kW,
                               int32_t sH, int32_t sW, int32_t pH, int32_t pW);

/* out[i] = max(in[i], zp). */
int32_t c7x_int8_relu(const int8_t* in, int8_t* out, int32_t n, int32_t zp);
/* out[i] = min(max(in[i], lo), hi)  (ReLU6 / clip with equal in/out quantization). */
int32_t c7x_int8_clamp(const int8_t* in, int8_t* out, int32_t n, int32_t lo, int32_t hi);

#ifdef __cplusplus
}
#endif
#endif /* C7X_KERNELS_H */
