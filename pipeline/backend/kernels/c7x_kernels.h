/*
 * c7x_kernels.h: the kernel ABI that doit-c7x's generated code calls.
 *
 * These are the extern names and argument lists of TI's MMALIB wrappers and
 * C7x kernels (docs/reference.md, "Kernel ABI"). On the DSP they resolve to
 * TI's libraries; on the host, c7x_kernels_ref.c implements them in plain C99
 * so the generated C can be proven bit-exact against the Python reference
 * (pipeline/backend/kernels/reference.py) without a board.
 *
 * Layouts: activations NCHW with N = 1, weights OIHW (conv), [C*KH*KW]
 * (depthwise, natural order), [N, K] (fully connected, transposed inside).
 *
 * Requantization of conv / depthwise / FC (per output channel c):
 *   out = clamp(rshift((acc + bias[c]) * scale[c], shift[c]), act_min, act_max)
 * act_min <= act_max, both in the output type's range (else C7X_ERR_PARAM): the
 * type's range, or the fused activation's integer bounds (ReLU: [zp_out, max],
 * ReLU6 / clip: [q(lo), q(hi)]), so the activation costs no pass of its own.
 * acc   = sum of raw int products (no zero point; folded into bias), exact:
 *         MMALIB keeps it in int32 for i8 (exact while the reduction length
 *         K = C_in / groups * KH * KW < 2^17), the host reference in int64;
 *         int64 for i16. K <= C7X_MAX_REDUCTION (2^23) keeps |acc| <= 2^53.
 * bias  = int32 (i8) / int64 (i16), any value (huge ones simply saturate);
 * scale in [0, C7X_MAX_SCALE = 127] (0 comes from the fold for r <= 0; the FC
 *         kernel reads scale as signed int8, so > 127 is an error);
 * shift in [0, C7X_MAX_SHIFT = 31];
 * NULL bias / scale / shift mean 0 / 1 / 0 for every channel (wrapper defaults).
 * The result is that of exact integer arithmetic for any argument values
 * (no int64 wrap-around, however large the bias).
 * rshift rounds as C7X_ROUNDING says (one switch for every kernel here):
 *   C7X_ROUND_HALF_UP (default): floor((v + 2^(shift-1)) / 2^shift)  (shift > 0)
 *   C7X_ROUND_FLOOR:             floor(v / 2^shift)   (toward -inf)
 * saturate clips to the output type's range ([-128, 127] / [-32768, 32767]);
 * with act_min / act_max at that range, clamp is saturate.
 * Padding pixels read pad_value (conv / depthwise): the input zero point, so a
 * padded window sums exactly what the float model's zero padding gives, with the
 * zero point's term folded into bias for every pixel alike (docs/reference.md,
 * "Folding"). pad_value lies in the input type's range (else C7X_ERR_PARAM). On
 * the C7x the wrapper DMAs the input into an L2 buffer whose border holds
 * pad_value (written once per buffer, as TIDL pads its buffers); no pass of its own.
 * Sizes: every size / stride is >= 1, every padding >= 0, at least one output
 * pixel, and no buffer holds more than C7X_MAX_ELEMS elements.
 *
 * Every kernel returns C7X_OK (0) on success. On bad arguments it writes
 * nothing and returns, checking in this order:
 *   C7X_ERR_NULL  a required pointer is NULL;
 *   C7X_ERR_SHAPE a size, stride, padding or group count is out of range or
 *                 inconsistent (a size <= 0 included);
 *   C7X_ERR_PARAM a numeric parameter is out of range (scale, shift, lo > hi,
 *                 a zero point or float scale of the requantize kernels).
 * Buffer lengths themselves cannot be checked in C: the caller passes buffers
 * of exactly the sizes the scalar arguments imply.
 */
#ifndef C7X_KERNELS_H
#define C7X_KERNELS_H

#include <stdint.h>

#define C7X_ROUND_HALF_UP 0
#define C7X_ROUND_FLOOR 1
#ifndef C7X_ROUNDING
#define C7X_ROUNDING C7X_ROUND_HALF_UP
#endif

#define C7X_OK 0
#define C7X_ERR_NULL 1
#define C7X_ERR_SHAPE 2
#define C7X_ERR_PARAM 3

#define C7X_MAX_ELEMS INT64_C(2147483647)
#define C7X_MAX_REDUCTION INT64_C(8388608)
#define C7X_MAX_SCALE 127
#define C7X_MAX_SHIFT 31

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
                         int32_t pad_top, int32_t pad_bottom, int32_t pad_left, int32_t pad_right,
                         int32_t pad_value, int32_t act_min, int32_t act_max);
int32_t mmalib_conv2d_i16(const int16_t* in, const int16_t* w, const int64_t* bias,
                          const uint8_t* scale, const uint8_t* shift, int16_t* out,
                          int32_t C_in, int32_t H_in, int32_t W_in, int32_t C_out,
                          int32_t KH, int32_t KW, int32_t stride_h, int32_t stride_w,
                          int32_t pad_top, int32_t pad_bottom, int32_t pad_left, int32_t pad_right,
                          int32_t pad_value, int32_t act_min, int32_t act_max);
/* grouped conv: w [C_out, C_in / groups, KH, KW]; groups divides C_in and C_out.
 * The pass uses it for 1 < groups < C_in; the host reference accepts any groups >= 1. */
int32_t mmalib_conv2d_i8_grouped_loop(const int8_t* in, const int8_t* w, const int32_t* bias,
                                      const uint8_t* scale, const uint8_t* shift, int8_t* out,
                                      int32_t C_in, int32_t H_in, int32_t W_in, int32_t C_out,
                                      int32_t KH, int32_t KW, int32_t stride_h, int32_t stride_w,
                                      int32_t pad_top, int32_t pad_bottom, int32_t pad_left,
                                      int32_t pad_right, int32_t groups, int32_t pad_value,
                                      int32_t act_min, int32_t act_max);
/* depthwise conv2d, groups = C: in/out [1, C, H, W], w [C * KH * KW] (= OIHW with I = 1),
 * output size as for conv2d. num_groups must equal C (else C7X_ERR_SHAPE).
 * MMALIB only takes square 3/5/7 kernels (docs/reference.md, "Eligibility"); the host
 * reference takes any. */
int32_t mmalib_depthwise_conv2d_i8(const int8_t* in, const int8_t* w, const int32_t* bias,
                                   const uint8_t* scale, const uint8_t* shift, int8_t* out,
                                   int32_t C, int32_t H_in, int32_t W_in, int32_t KH, int32_t KW,
                                   int32_t stride_h, int32_t stride_w, int32_t pad_top,
                                   int32_t pad_bottom, int32_t pad_left, int32_t pad_right,
                                   int32_t num_groups, int32_t pad_value,
                                   int32_t act_min, int32_t act_max);
int32_t mmalib_depthwise_conv2d_i16(const int16_t* in, const int16_t* w, const int64_t* bias,
                                    const uint8_t* scale, const uint8_t* shift, int16_t* out,
                                    int32_t C, int32_t H_in, int32_t W_in, int32_t KH, int32_t KW,
                                    int32_t stride_h, int32_t stride_w, int32_t pad_top,
                                    int32_t pad_bottom, int32_t pad_left, int32_t pad_right,
                                    int32_t num_groups, int32_t pad_value,
                                   int32_t act_min, int32_t act_max);
/* fully connected: in [M, K], w [N, K], out [M, N]; bias / scale / shift per n. */
int32_t mmalib_matmul_bias_i8(const int8_t* in, const int8_t* w, const int32_t* bias,
                              const uint8_t* scale, const uint8_t* shift, int8_t* out,
                              int32_t M, int32_t K, int32_t N,
                         int32_t act_min, int32_t act_max);
int32_t mmalib_matmul_bias_i16(const int16_t* in, const int16_t* w, const int64_t* bias,
                               const uint8_t* scale, const uint8_t* shift, int16_t* out,
                               int32_t M, int32_t K, int32_t N,
                         int32_t act_min, int32_t act_max);
/* Activation x activation matmul, batched (docs/reference.md, "Attention matmul"): attention's
 * Q.K^T and attention.V, both operands quantized per tensor. a [a_size] and b [b_size] are whole
 * buffers read through strided views (element strides >= 0, the streaming engine's addressing):
 *   A[i, m, k] = a[a_offset + i a_sb + m a_sm + k a_sk],  B[i, k, n] = b[b_offset + i b_sb + k b_sk + n b_sn],
 *   out[i, m, n] = saturate(rshift(sum_k (A - za)(B - zb) * M, shift) + zo)     (out [batch, M, N] contiguous)
 * with params = the channel multiply's 16-byte blob (int32 M, int32 shift <= 62, int32 0, int8 za, zb,
 * zo). za, zb in {0, -128} for int8 (a signed or an unsigned MMA operand), 0 for int16 (zo too);
 * M < 2^31 (int8) / 2^17 (int16) and K <= 2^14 keep |acc * M| below 2^61 (else C7X_ERR_PARAM /
 * C7X_ERR_SHAPE). Each operand needs a unit stride on one matrix axis (a transposed operand is
 * read by the streaming engine's transpose mode), else C7X_ERR_PARAM; a view reaching past its
 * buffer is C7X_ERR_SHAPE. */
int32_t mmalib_batch_matmul_i8(const int8_t* a, const int8_t* b, const uint8_t* params, int8_t* out,
                               int32_t a_size, int32_t b_size, int32_t batch, int32_t M, int32_t K,
                               int32_t N, int32_t a_offset, int32_t a_sb, int32_t a_sm, int32_t a_sk,
                               int32_t b_offset, int32_t b_sb, int32_t b_sk, int32_t b_sn);
int32_t mmalib_batch_matmul_i16(const int16_t* a, const int16_t* b, const uint8_t* params, int16_t* out,
                                int32_t a_size, int32_t b_size, int32_t batch, int32_t M, int32_t K,
                                int32_t N, int32_t a_offset, int32_t a_sb, int32_t a_sm, int32_t a_sk,
                                int32_t b_offset, int32_t b_sb, int32_t b_sk, int32_t b_sn);

/* ---- C7x kernels (not MMALIB) ---- */

/* Residual add of two equally shaped tensors (n elements, no broadcasting).
 * params: 16 bytes, little-endian: int32 M_x, int32 M_skip, int32 shift,
 * int8 zp_x, int8 zp_skip, int8 zp_out, pad. The int16 kernel reads the same
 * blob and applies the same formula (the pass writes zero points 0 for it).
 * r = rshift((x - zp_x) * M_x + (skip - zp_skip) * M_skip, shift) + zp_out;
 * if has_relu != 0: r = max(r, zp_out); out = saturate(r).
 * Accumulation in int64 (both dtypes; exact), rounding per C7X_ROUNDING
 * (TI's kernel floors: build with C7X_ROUND_FLOOR to match it),
 * shift in [0, C7X_MAX_SHIFT] (the pass uses 15: docs/reference.md, "Residual add"). */
int32_t c7x_int8_residual_add_relu(const int8_t* x, const int8_t* skip, const uint8_t* params,
                                   int8_t* out, int32_t n, int32_t has_relu);
int32_t c7x_int16_residual_add_relu(const int16_t* x, const int16_t* skip, const uint8_t* params,
                                    int16_t* out, int32_t n, int32_t has_relu);

/* Residual add whose skip operand is broadcast (an attention bias or mask added to the
 * scores of every window / head): x, out [d0, d1, d2] contiguous; skip [skip_size] read at
 * skip[i0 s0 + i1 s1 + i2] (element strides s0, s1 >= 0; 0 repeats the skip along that
 * axis). Same params blob and formula as c7x_int8_residual_add_relu, per element.
 * Requires (d0 - 1) s0 + (d1 - 1) s1 + d2 <= skip_size. */
int32_t c7x_int8_broadcast_add(const int8_t* x, const int8_t* skip, const uint8_t* params, int8_t* out,
                               int32_t skip_size, int32_t d0, int32_t d1, int32_t d2, int32_t s0,
                               int32_t s1, int32_t has_relu);
int32_t c7x_int16_broadcast_add(const int16_t* x, const int16_t* skip, const uint8_t* params, int16_t* out,
                                int32_t skip_size, int32_t d0, int32_t d1, int32_t d2, int32_t s0,
                                int32_t s1, int32_t has_relu);

/* Max pool with equal input/output quantization; padding pixels never win.
 * in [N, C, H_in, W_in], out [N, C, H_out, W_out]; window (oh, ow) covers rows
 * oh * sH - pH ... + kH - 1 (columns alike), clipped to the input.
 * Requires pH < kH, pW < kW and H_out (W_out) equal to the floor-mode size
 * (H_in + 2 pH - kH) / sH + 1 or torch's ceil_mode size, so no window is empty. */
int32_t c7x_int8_max_pool(const int8_t* in, int8_t* out, int32_t N, int32_t C, int32_t H_in,
                          int32_t W_in, int32_t H_out, int32_t W_out, int32_t kH, int32_t kW,
                          int32_t sH, int32_t sW, int32_t pH, int32_t pW);
int32_t c7x_int8_max_pool_tidl(const int8_t* in, int8_t* out, int32_t N, int32_t C, int32_t H_in,
                               int32_t W_in, int32_t H_out, int32_t W_out, int32_t kH, int32_t kW,
                               int32_t sH, int32_t sW, int32_t pH, int32_t pW);
/* The same on int16 (ours: TI's library names no int16 max pool). */
int32_t c7x_int16_max_pool(const int16_t* in, int16_t* out, int32_t N, int32_t C, int32_t H_in,
                           int32_t W_in, int32_t H_out, int32_t W_out, int32_t kH, int32_t kW,
                           int32_t sH, int32_t sW, int32_t pH, int32_t pW);

/* out[i] = saturate(max(in[i], zp)). */
int32_t c7x_int8_relu(const int8_t* in, int8_t* out, int32_t n, int32_t zp);
/* out[i] = saturate(min(max(in[i], lo), hi)), lo <= hi (else C7X_ERR_PARAM)
 * (ReLU6 / clip with equal in/out quantization). */
int32_t c7x_int8_clamp(const int8_t* in, int8_t* out, int32_t n, int32_t lo, int32_t hi);

/* Squeeze-excitation multiply (ours: TI names no such kernel; docs/reference.md,
 * "Squeeze-excitation multiply"): x [planes, hw] times a per-plane gate [planes]
 * (planes = N * C, hw = H * W; the gate is [N, C, 1, 1] broadcast over H, W).
 * params: 16 bytes, little-endian: int32 M, int32 shift, int32 (unused, 0),
 * int8 zp_x, int8 zp_g, int8 zp_out, pad (the int16 kernel: zero points 0).
 * r = rshift((x - zp_x) * (gate - zp_g) * M, shift) + zp_out; out = saturate(r).
 * int64 arithmetic, rounding per C7X_ROUNDING; requires 0 <= shift <= 62 and
 * 0 <= M < 2^31 (int8) / 2^29 (int16) so the product stays below 2^62
 * (else C7X_ERR_PARAM). */
int32_t c7x_int8_channel_mul(const int8_t* x, const int8_t* gate, const uint8_t* params,
                             int8_t* out, int32_t planes, int32_t hw);
int32_t c7x_int16_channel_mul(const int16_t* x, const int16_t* gate, const uint8_t* params,
                              int16_t* out, int32_t planes, int32_t hw);

/* Element-wise int8 function by a 256-entry table (ours: TI names no such kernel;
 * docs/reference.md, "Activation tables"): out[i] = table[in[i] + 128].
 * The table is built at compile time from the layer's Q/DQ semantics,
 * table[v + 128] = q(f(dq(v))) for every int8 v, so any element-wise activation
 * (hardswish, hardsigmoid, SiLU, sigmoid, GELU) with its requantization is exact. */
int32_t c7x_int8_lut(const int8_t* in, const int8_t* table, int8_t* out, int32_t n);

/* Softmax over the last axis of int8 rows (ours: TI names no such kernel; docs/reference.md,
 * "Softmax"): in / out int8 [rows, n], table int32 [256] built at compile time from the
 * input scale s, table[k] = round(2^16 * exp(s * (k - 255))), so that for each row
 *   m = max(in), e_i = table[in_i - m + 255], S = sum e_i (int64), inv = floor(2^40 / S),
 *   out_i = min(127, ((e_i * inv + 2^31) >> 32) - 128),
 * the int8 code of e_i / S at the fixed output scale 1/256, zero point -128 (the
 * quantizer's softmax output spec). Integer only; within 1 output LSB of
 * q(softmax(dq(in))). Requires 0 <= table[k] <= table[255] <= 2^24 (C7X_ERR_PARAM
 * otherwise) so that S >= 1 and e_i * inv < 2^63; one division per row, the rest vectorises. */
int32_t c7x_int8_softmax(const int8_t* in, const int32_t* table, int8_t* out, int32_t rows, int32_t n);

/* LayerNorm over the last axis of int8 rows (ours: TI names no such kernel; docs/reference.md,
 * "LayerNorm"): in / out int8 [rows, n], gamma int32 [n] = round(2^16 * g_c / s_out),
 * beta int64 [n] = round(2^40 * (b_c / s_out + out_zp)), eps_q = round(eps * n^2 / s_in^2).
 * Integer only (I-BERT's integer LayerNorm, Kim et al. 2021, with an exact ratio):
 *   x_i = in_i - in_zp, S1 = sum x_i, S2 = sum x_i^2, D = isqrt(2^16 (n S2 - S1^2 + eps_q)),
 *   R = floor(2^48 / D) (0 when D = 0), z_i = floor(((n x_i - S1) R + 2^15) / 2^16)  (Q24),
 *   out_i = clamp(floor((gamma_c z_i + beta_c + 2^39) / 2^40), -128, 127).
 * Requires 1 <= n <= 4096 (C7X_ERR_SHAPE) so |z_i| <= 2^30, and eps_q >= 0,
 * |in_zp| <= 128, |beta_c| <= 2^56 (C7X_ERR_PARAM): every product stays below 2^62. */
int32_t c7x_int8_layer_norm(const int8_t* in, const int32_t* gamma, const int64_t* beta, int8_t* out,
                            int32_t rows, int32_t n, int32_t in_zp, int32_t eps_q);

/* L2 normalisation over the last axis of int8 rows (ours; docs/reference.md, "L2 normalize"):
 * torch's F.normalize(x, dim=-1), Swin V2's cosine attention. in / out int8 [rows, n],
 * gain = round(2^16 / s_out). Integer only, as c7x_int8_layer_norm without the mean:
 *   x_i = in_i - in_zp, S2 = sum x_i^2, D = isqrt(2^32 S2), R = floor(2^56 / D) (0 when D = 0),
 *   z_i = floor((x_i R + 2^15) / 2^16)  (x_i / sqrt(S2) in Q24),
 *   out_i = clamp(floor((gain z_i + out_zp 2^40 + 2^39) / 2^40), -128, 127).
 * Requires 1 <= n <= 4096 (C7X_ERR_SHAPE), |in_zp| <= 128, 0 < gain < 2^31 and out_zp in
 * [-128, 127] (C7X_ERR_PARAM): every product stays below 2^62. */
int32_t c7x_int8_l2_normalize(const int8_t* in, int8_t* out, int32_t rows, int32_t n, int32_t in_zp,
                              int32_t gain, int32_t out_zp);

/* Requantize between int8 and int16 (ours: TI names no such kernel; the style is that of
 * its float-scale c7x_int8_requantize_clamp / c7x_int8_rescale, docs/reference.md,
 * "Requantize"). What torch's Q/DQ model computes at an int8 <-> int16 boundary,
 * quantize_per_tensor(dequantize_per_tensor(x, in_scale, in_zp), s_out, out_zp),
 * in float32 (docs/numerics.md, "torch's quantize"):
 *   d = (float)(in[i] - in_zp) * in_scale;  v = d * out_inv_scale;
 *   out[i] = saturate(round_half_even(v) + out_zp)
 * out_inv_scale is float32(1.0 / (double)s_out), the reciprocal torch multiplies by
 * (computed by the caller). Bit-exact with torch when float32 products are rounded
 * to nearest (no FMA, no wider intermediates). n elements, in / out must not overlap.
 * Requires in_zp / out_zp inside the in / out dtype and both scales finite and > 0
 * (else C7X_ERR_PARAM). */
int32_t c7x_requantize_i8_i16(const int8_t* in, int16_t* out, int32_t n, int32_t in_zp,
                              float in_scale, int32_t out_zp, float out_inv_scale);
int32_t c7x_requantize_i16_i8(const int16_t* in, int8_t* out, int32_t n, int32_t in_zp,
                              float in_scale, int32_t out_zp, float out_inv_scale);
/* int8 -> int8 and int16 -> int16, the same formula: after a max pool whose input and
 * output quantization differ (max commutes with the monotone requantize,
 * docs/reference.md, "Max pool"). */
int32_t c7x_requantize_i8_i8(const int8_t* in, int8_t* out, int32_t n, int32_t in_zp,
                             float in_scale, int32_t out_zp, float out_inv_scale);
int32_t c7x_requantize_i16_i16(const int16_t* in, int16_t* out, int32_t n, int32_t in_zp,
                               float in_scale, int32_t out_zp, float out_inv_scale);

/* Average pools (ours: TI names no such kernel; docs/reference.md, "Average pools").
 * What torch's Q/DQ model computes, quantize_per_tensor(pool(dequantize_per_tensor(in))),
 * in float32 and in torch's order of additions, so bit-exact with torch's CPU ops when
 * float32 operations are rounded to nearest (no FMA, no wider intermediates):
 *   y = (float)(in - in_zp) * in_scale                       (each value rounded once)
 *   out = saturate(round_half_even(m * out_inv_scale) + out_zp)
 * with out_inv_scale = float32(1.0 / (double)s_out), computed by the caller, and m:
 *
 * global average pool (torch's mean over H, W; adaptive_avg_pool2d to 1 x 1):
 * in [planes, hw] (planes = N * C, hw = H * W), out [planes];
 *   m = S / (float)hw, S = the float32 sum of a plane's hw values in the order of
 *   torch's x86 CPU sum (SumKernel.cpp, cascade_sum; reference.py, torch_order_sum):
 *   hw < 8: row_sum of the values; hw >= 8: row_sum of the hw / 8 vectors of 8
 *   consecutive values (lane-wise), then 0 + the hw % 8 trailing values in order +
 *   lane 0 + ... + lane 7. row_sum(items): the columns k = 0..3 of the full rows of 4
 *   items are summed by torch's 4-level cascade (multi_row_sum: chunks of 2^P rows,
 *   P = max(4, ceil_log2(rows) / 4), move up a level after each chunk), the leftover
 *   items are added to column 0, then columns 1, 2, 3.
 *
 * average pool (avg_pool2d): the max pool's geometry (pH < kH; H_out the floor- or
 * ceil-mode size, so no window is empty); in [N, C, H_in, W_in], out [N, C, H_out, W_out];
 *   m = (0 + the window's input pixels, row by row) / (float)divisor, the divisor the
 *   window clipped to [-pad, size + pad) if count_include_pad != 0, else to the input.
 *
 * Requires in_zp / out_zp inside the dtype and both scales finite and > 0 (else
 * C7X_ERR_PARAM); a NaN (only when the scales overflow float32) stores out_zp. */
int32_t c7x_int8_global_avg_pool(const int8_t* in, int8_t* out, int32_t planes, int32_t hw,
                                 int32_t in_zp, float in_scale, int32_t out_zp,
                                 float out_inv_scale);
int32_t c7x_int16_global_avg_pool(const int16_t* in, int16_t* out, int32_t planes, int32_t hw,
                                  int32_t in_zp, float in_scale, int32_t out_zp,
                                  float out_inv_scale);
int32_t c7x_int8_avg_pool(const int8_t* in, int8_t* out, int32_t N, int32_t C, int32_t H_in,
                          int32_t W_in, int32_t H_out, int32_t W_out, int32_t kH, int32_t kW,
                          int32_t sH, int32_t sW, int32_t pH, int32_t pW,
                          int32_t count_include_pad, int32_t in_zp, float in_scale,
                          int32_t out_zp, float out_inv_scale);
int32_t c7x_int16_avg_pool(const int16_t* in, int16_t* out, int32_t N, int32_t C, int32_t H_in,
                           int32_t W_in, int32_t H_out, int32_t W_out, int32_t kH, int32_t kW,
                           int32_t sH, int32_t sW, int32_t pH, int32_t pW,
                           int32_t count_include_pad, int32_t in_zp, float in_scale,
                           int32_t out_zp, float out_inv_scale);

/* Per-channel affine requantize (ours: TI's runtime names no such kernel; docs/reference.md,
 * "Channel affine"): a BatchNorm that cannot be folded into a conv (DenseNet's
 * pre-activation BN -> ReLU, fed by a concat of differently quantized parts) with its
 * requantization and an optional ReLU, computed as torch's Q/DQ program does,
 * q(batch_norm(cat(dq(parts)))) [-> dq -> relu -> q], in float32:
 * in / out [N, C, hw]; params: C * 16 bytes, per channel c little-endian int32 in_zp[c],
 * float32 in_scale[c], alpha[c], beta[c] (a concat's parts each bring their own in_zp /
 * in_scale for their channel range; alpha / beta are torch's batch_norm terms,
 * alpha = weight / sqrt(var + eps), beta = bias - mean * alpha, computed by the caller).
 *   x = (float)(in - in_zp[c]) * in_scale[c]
 *   y = x * alpha[c] + beta[c]             rounded ONCE (a fused multiply-add, as torch's
 *                                           AVX2 / AVX512 CPU batch_norm; emulated exactly
 *                                           with IEEE double, no libm)
 *   t = saturate(round_half_even(y * mid_inv_scale) + mid_zp)
 *   has_relu == 0: out = t (mid_scale, out_zp, out_inv_scale are checked, not used)
 *   has_relu != 0: out = saturate(round_half_even((float)(max(t, mid_zp) - mid_zp) * mid_scale
 *                                                 * out_inv_scale) + out_zp)
 *                  (torch's quantize(relu(dequantize(t))): relu(dq(t)) = dq(max(t, mid_zp)))
 * Inverse scales are float32(1.0 / (double)s), computed by the caller. Bit-exact with torch
 * when float32 / double operations are rounded to nearest (no FMA contraction, no wider
 * intermediates, no reassociation). Requires zero points inside the dtype, scales finite and
 * > 0, |in_scale|, |alpha|, |beta| <= C7X_AFFINE_LIMIT (so nothing overflows before the
 * quantize; else C7X_ERR_PARAM). in / out must not overlap. */
#define C7X_AFFINE_LIMIT 1099511627776.0f /* 2^40 */
int32_t c7x_int8_channel_affine(const int8_t* in, const uint8_t* params, int8_t* out, int32_t N,
                                int32_t C, int32_t hw, int32_t mid_zp, float mid_scale,
                                float mid_inv_scale, int32_t has_relu, int32_t out_zp,
                                float out_inv_scale);
int32_t c7x_int16_channel_affine(const int16_t* in, const uint8_t* params, int16_t* out,
                                 int32_t N, int32_t C, int32_t hw, int32_t mid_zp,
                                 float mid_scale, float mid_inv_scale, int32_t has_relu,
                                 int32_t out_zp, float out_inv_scale);

/* Quantize / dequantize at the model's edges (ours: the reference leaves both to TVM's
 * scalar code; docs/reference.md, "Quantize and dequantize"): torch's ops in float32,
 *   quantize:   out[i] = saturate(round_half_even(in[i] * out_inv_scale) + out_zp)
 *               (in[i] * out_inv_scale rounded once; NaN gives out_zp)
 *   dequantize: out[i] = (float)(in[i] - in_zp) * in_scale                 (rounded once)
 * for i < n. The dequantize reads the first n of in's n_in elements: the real outputs of
 * an FC whose output channels were padded to the MMA's width. Statuses: NULL; n <= 0 or,
 * dequantize, n > n_in (shape); a zero point outside the integer type or a scale that is
 * not a finite float32 > 0 (param). */
int32_t c7x_quantize_f32_i8(const float* in, int8_t* out, int32_t n, int32_t out_zp,
                            float out_inv_scale);
int32_t c7x_quantize_f32_i16(const float* in, int16_t* out, int32_t n, int32_t out_zp,
                             float out_inv_scale);
int32_t c7x_dequantize_i8_f32(const int8_t* in, float* out, int32_t n_in, int32_t n,
                              int32_t in_zp, float in_scale);
int32_t c7x_dequantize_i16_f32(const int16_t* in, float* out, int32_t n_in, int32_t n,
                               int32_t in_zp, float in_scale);

/* Transpose of an int8 / int16 tensor (ours; docs/reference.md, "Permute"): in [d0, ..., d5]
 * (C order; fewer axes are leading axes of length 1), out = in transposed by (p0, ..., p5), C
 * order: out[i0..i5] = in[j] with j_{p_k} = i_k. Pure data movement (on the C7x a multi-dimensional
 * DMA transfer). C7X_ERR_SHAPE for a non-positive axis or more than C7X_MAX_ELEMS elements,
 * C7X_ERR_PARAM unless (p0..p5) is a permutation of 0..5. */
int32_t c7x_permute_i8(const int8_t* in, int8_t* out, int32_t d0, int32_t d1, int32_t d2, int32_t d3,
                       int32_t d4, int32_t d5, int32_t p0, int32_t p1, int32_t p2, int32_t p3, int32_t p4,
                       int32_t p5);
int32_t c7x_permute_i16(const int16_t* in, int16_t* out, int32_t d0, int32_t d1, int32_t d2, int32_t d3,
                        int32_t d4, int32_t d5, int32_t p0, int32_t p1, int32_t p2, int32_t p3, int32_t p4,
                        int32_t p5);

/* Gather along one axis of an int8 / int16 tensor (ours; docs/reference.md, "Take"): in
 * [outer, n_in, inner], index int32 [n_out] (constant), out[o, j, i] = in[o, index[j], i].
 * Pure data movement: Swin's cyclic shift (torch.roll, a take per axis). C7X_ERR_SHAPE for a
 * non-positive size, C7X_ERR_PARAM for an index outside [0, n_in) (checked before writing). */
int32_t c7x_take_i8(const int8_t* in, const int32_t* index, int8_t* out, int32_t outer, int32_t n_in,
                    int32_t n_out, int32_t inner);
int32_t c7x_take_i16(const int16_t* in, const int32_t* index, int16_t* out, int32_t outer, int32_t n_in,
                     int32_t n_out, int32_t inner);

/* Concatenate and slice with requantize (ours: the reference leaves concat and split to
 * TVM's scalar code; docs/reference.md, "Concat and split"). c7x_concat<K>_<t> writes
 * the concatenation of K segments, each requantized from its own quantization to the
 * output's by torch's dequantize + quantize in float32, as c7x_requantize_*:
 *   for o < outer, for each segment j in order, for i < n<j>:
 *     out[o * N + pos<j> + i] = saturate(round_half_even(
 *         (float)(in<j>[o * size<j> + offset<j> + i] - zp<j>) * scale<j> * out_inv_scale) + out_zp)
 * with N = n0 + ... + n<K-1> and pos<j> = n0 + ... + n<j-1> (both products rounded to
 * float32). in<j> holds outer * size<j> elements and out outer * N. A concat along axis a
 * of NCHW tensors has outer = the product of the dims before a; a split piece is the
 * segment [offset, offset + n) of every block of size elements; K = 1 is a slice
 * (one piece of a split) requantized on its own. Statuses: NULL; outer, size or n <= 0,
 * offset < 0, offset + n > size, or a buffer above C7X_MAX_ELEMS (shape); a zero point
 * outside the type or a scale that is not a finite float32 > 0 (param). */
int32_t c7x_concat1_i8(const int8_t* in0, int8_t* out, int32_t outer, int32_t size0,
                       int32_t offset0, int32_t n0, int32_t zp0, float scale0, int32_t out_zp,
                       float out_inv_scale);
int32_t c7x_concat1_i16(const int16_t* in0, int16_t* out, int32_t outer, int32_t size0,
                        int32_t offset0, int32_t n0, int32_t zp0, float scale0, int32_t out_zp,
                        float out_inv_scale);
int32_t c7x_concat2_i8(const int8_t* in0, const int8_t* in1, int8_t* out, int32_t outer,
                       int32_t size0, int32_t offset0, int32_t n0, int32_t zp0, float scale0,
                       int32_t size1, int32_t offset1, int32_t n1, int32_t zp1, float scale1,
                       int32_t out_zp, float out_inv_scale);
int32_t c7x_concat2_i16(const int16_t* in0, const int16_t* in1, int16_t* out, int32_t outer,
                        int32_t size0, int32_t offset0, int32_t n0, int32_t zp0, float scale0,
                        int32_t size1, int32_t offset1, int32_t n1, int32_t zp1, float scale1,
                        int32_t out_zp, float out_inv_scale);
int32_t c7x_concat3_i8(const int8_t* in0, const int8_t* in1, const int8_t* in2, int8_t* out,
                       int32_t outer, int32_t size0, int32_t offset0, int32_t n0, int32_t zp0,
                       float scale0, int32_t size1, int32_t offset1, int32_t n1, int32_t zp1,
                       float scale1, int32_t size2, int32_t offset2, int32_t n2, int32_t zp2,
                       float scale2, int32_t out_zp, float out_inv_scale);
int32_t c7x_concat3_i16(const int16_t* in0, const int16_t* in1, const int16_t* in2,
                        int16_t* out, int32_t outer, int32_t size0, int32_t offset0, int32_t n0,
                        int32_t zp0, float scale0, int32_t size1, int32_t offset1, int32_t n1,
                        int32_t zp1, float scale1, int32_t size2, int32_t offset2, int32_t n2,
                        int32_t zp2, float scale2, int32_t out_zp, float out_inv_scale);
int32_t c7x_concat4_i8(const int8_t* in0, const int8_t* in1, const int8_t* in2,
                       const int8_t* in3, int8_t* out, int32_t outer, int32_t size0,
                       int32_t offset0, int32_t n0, int32_t zp0, float scale0, int32_t size1,
                       int32_t offset1, int32_t n1, int32_t zp1, float scale1, int32_t size2,
                       int32_t offset2, int32_t n2, int32_t zp2, float scale2, int32_t size3,
                       int32_t offset3, int32_t n3, int32_t zp3, float scale3, int32_t out_zp,
                       float out_inv_scale);
int32_t c7x_concat4_i16(const int16_t* in0, const int16_t* in1, const int16_t* in2,
                        const int16_t* in3, int16_t* out, int32_t outer, int32_t size0,
                        int32_t offset0, int32_t n0, int32_t zp0, float scale0, int32_t size1,
                        int32_t offset1, int32_t n1, int32_t zp1, float scale1, int32_t size2,
                        int32_t offset2, int32_t n2, int32_t zp2, float scale2, int32_t size3,
                        int32_t offset3, int32_t n3, int32_t zp3, float scale3, int32_t out_zp,
                        float out_inv_scale);

#ifdef __cplusplus
}
#endif
#endif /* C7X_KERNELS_H */
