/*
 * c7x_kernels_ref.c: host reference implementations of every kernel in c7x_kernels.h.
 *
 * On the DSP these names resolve to TI's MMALIB wrappers and C7x kernels; on the
 * host this file stands in for them, so that the generated C can be compiled by
 * gcc and proven bit-exact against pipeline/backend/kernels/reference.py.
 * The semantics (requantization, residual add, max pool, ReLU, clamp, channel multiply,
 * table lookup, int8 <-> int16 requantize, average pools, channel affine) are those
 * of docs/reference.md as pinned down in c7x_kernels.h; read the header first,
 * this file only adds how each is computed.
 *
 * Plain C99: no compiler extensions, no allocation, no implementation-defined
 * behaviour (right shifts of negative numbers and narrowing conversions are
 * written out), so the same file builds with gcc and TI's cl7x.
 */
#include <float.h>
#include <stddef.h>
#include <stdint.h>

#include "c7x_kernels.h"

#if C7X_ROUNDING != C7X_ROUND_HALF_UP && C7X_ROUNDING != C7X_ROUND_FLOOR
#error "C7X_ROUNDING must be C7X_ROUND_HALF_UP or C7X_ROUND_FLOOR"
#endif

/* Element types the generic loops below handle (activations and weights share one). */
typedef enum { ELEM_I8, ELEM_I16 } elem_type;

/* Output columns accumulated at once: bounds the stack (2 KiB of int64) without
 * allocation, and keeps the innermost loop over contiguous output pixels. */
#define ROW_TILE 256

/* Saturation points of requantize() (see there); reference.py uses the same. */
#define BIAS_LIMIT (INT64_C(1) << 55)
#define SUM_LIMIT (INT64_C(1) << 54)

/* ------------------------------------------------------------------------- */
/* Argument validation                                                        */
/* ------------------------------------------------------------------------- */

/* n1 * n2 * n3 * n4 as an element count, or -1 when any factor is not positive
 * or the product exceeds C7X_MAX_ELEMS (so every index below fits in int64 and
 * stays far from overflow). */
static int64_t elem_count(int32_t n1, int32_t n2, int32_t n3, int32_t n4)
{
    const int32_t dims[4] = {n1, n2, n3, n4};
    int64_t count = 1;
    int i;
    for (i = 0; i < 4; ++i) {
        if (dims[i] <= 0 || count > C7X_MAX_ELEMS / dims[i]) {
            return -1;
        }
        count *= dims[i];
    }
    return count;
}

/* Output size of one convolution axis: (size + pad_a + pad_b - k) / stride + 1,
 * or 0 when the arguments are out of range or not even one window fits. */
static int32_t conv_out_size(int32_t size, int32_t k, int32_t stride, int32_t pad_a, int32_t pad_b)
{
    int64_t span;
    if (size <= 0 || k <= 0 || stride <= 0 || pad_a < 0 || pad_b < 0) {
        return 0;
    }
    span = (int64_t)size + pad_a + pad_b - k;
    if (span < 0 || span > C7X_MAX_ELEMS) {
        return 0;
    }
    return (int32_t)(span / stride + 1);
}

/* Nonzero when every per-channel scale / shift is in the range the header
 * allows (scale <= C7X_MAX_SCALE, shift <= C7X_MAX_SHIFT). NULL = defaults. */
static int requant_params_ok(const uint8_t* scale, const uint8_t* shift, int32_t channels)
{
    int32_t c;
    for (c = 0; c < channels; ++c) {
        if ((scale != NULL && scale[c] > C7X_MAX_SCALE) ||
            (shift != NULL && shift[c] > C7X_MAX_SHIFT)) {
            return 0;
        }
    }
    return 1;
}

/* ------------------------------------------------------------------------- */
/* Integer arithmetic                                                         */
/* ------------------------------------------------------------------------- */

static int64_t clamp_i64(int64_t v, int64_t lo, int64_t hi)
{
    return v < lo ? lo : (v > hi ? hi : v);
}

/* floor(v / 2^shift), 0 <= shift <= 62, |v| < 2^62. Only non-negative values are
 * shifted, because >> of a negative value is implementation-defined in C99
 * (C99 6.5.7p5): for v < 0, floor(v / 2^s) = -ceil(-v / 2^s). (A 64-bit division
 * here cost a fifth of the host's time.) */
static int64_t floor_div_pow2(int64_t v, int32_t shift)
{
    if (v >= 0) {
        return v >> shift;
    }
    return -((-v + (((int64_t)1 << shift) - 1)) >> shift);
}

/* The rounding right shift of c7x_kernels.h, selected by C7X_ROUNDING. |v| must
 * stay below 2^62 so that adding the half cannot overflow. */
static int64_t rshift_round(int64_t v, int32_t shift)
{
#if C7X_ROUNDING == C7X_ROUND_HALF_UP
    if (shift > 0) {
        v += (int64_t)1 << (shift - 1);
    }
#endif
    return floor_div_pow2(v, shift);
}

/* out = rshift((acc + bias) * scale, shift), before saturation.
 * |acc| <= 2^53 (C7X_MAX_REDUCTION * 2^30). Clamping bias to +-2^55 and the sum
 * to +-2^54 cannot change the saturated result: any |sum| >= 2^54 with scale >= 1
 * and shift <= 31 is >= 2^23 after the shift, beyond int16 (and a scale of 0
 * gives 0 either way). It keeps (sum * scale), scale <= 127, below 2^61. */
static int64_t requantize(int64_t acc, int64_t bias, int32_t scale, int32_t shift)
{
    const int64_t sum = clamp_i64(acc + clamp_i64(bias, -BIAS_LIMIT, BIAS_LIMIT), -SUM_LIMIT,
                                  SUM_LIMIT);
    return rshift_round(sum * scale, shift);
}

/* Saturate to the element type's range and store out[idx]. The value is in
 * range when converted, so the conversion is exact (C99 6.3.1.3p1). */
static void store_saturated(void* out, int64_t idx, int64_t v, elem_type t)
{
    if (t == ELEM_I8) {
        ((int8_t*)out)[idx] = (int8_t)clamp_i64(v, INT8_MIN, INT8_MAX);
    } else {
        ((int16_t*)out)[idx] = (int16_t)clamp_i64(v, INT16_MIN, INT16_MAX);
    }
}

static int64_t load_elem(const void* base, int64_t idx, elem_type t)
{
    return t == ELEM_I8 ? ((const int8_t*)base)[idx] : ((const int16_t*)base)[idx];
}

/* Per-channel bias / scale / shift with the wrapper defaults for NULL (0 / 1 / 0,
 * docs/reference.md, "Wrapper behaviour"). Bias is int32 for int8 kernels, int64 for int16. */
typedef struct {
    const void* bias;
    const uint8_t* scale;
    const uint8_t* shift;
    elem_type type;
    int64_t act_min, act_max; /* output saturation range: the dtype's, or a fused ReLU / clip */
} requant_params;

/* Saturate the requantized v to [act_min, act_max] and store out[idx]: the fused
 * activation (ReLU, ReLU6, clip) is the saturation range, no pass of its own. */
static void store_requant(void* out, int64_t idx, int64_t v, const requant_params* q)
{
    store_saturated(out, idx, clamp_i64(v, q->act_min, q->act_max), q->type);
}

/* Nonzero when act_min <= act_max, both in the element type's range. */
static int act_range_ok(const requant_params* q)
{
    const int64_t lo = q->type == ELEM_I8 ? INT8_MIN : INT16_MIN;
    const int64_t hi = q->type == ELEM_I8 ? INT8_MAX : INT16_MAX;
    return lo <= q->act_min && q->act_min <= q->act_max && q->act_max <= hi;
}

static int64_t channel_bias(const requant_params* q, int32_t c)
{
    if (q->bias == NULL) {
        return 0;
    }
    return q->type == ELEM_I8 ? ((const int32_t*)q->bias)[c] : ((const int64_t*)q->bias)[c];
}

static int32_t channel_scale(const requant_params* q, int32_t c)
{
    return q->scale == NULL ? 1 : q->scale[c];
}

static int32_t channel_shift(const requant_params* q, int32_t c)
{
    return q->shift == NULL ? 0 : q->shift[c];
}

/* acc[i] += w * row[i * step] for i < n: the innermost loop of every convolution,
 * contiguous in acc (and in row when step == 1). */
static void axpy_row(int64_t* acc, const void* row, int32_t step, int64_t w, int32_t n, elem_type t)
{
    int32_t i;
    if (t == ELEM_I8) {
        const int8_t* p = (const int8_t*)row;
        for (i = 0; i < n; ++i) {
            acc[i] += w * p[(int64_t)i * step];
        }
    } else {
        const int16_t* p = (const int16_t*)row;
        for (i = 0; i < n; ++i) {
            acc[i] += w * p[(int64_t)i * step];
        }
    }
}

/* Sum of a[i] * b[i] for i < n, exact in int64 (n <= C7X_MAX_REDUCTION). */
static int64_t dot(const void* a, const void* b, int32_t n, elem_type t)
{
    int64_t acc = 0;
    int32_t i;
    if (t == ELEM_I8) {
        const int8_t* pa = (const int8_t*)a;
        const int8_t* pb = (const int8_t*)b;
        for (i = 0; i < n; ++i) {
            acc += (int32_t)pa[i] * pb[i];
        }
    } else {
        const int16_t* pa = (const int16_t*)a;
        const int16_t* pb = (const int16_t*)b;
        for (i = 0; i < n; ++i) {
            acc += (int64_t)pa[i] * pb[i];
        }
    }
    return acc;
}

static const void* elem_offset(const void* base, int64_t idx, elem_type t)
{
    return t == ELEM_I8 ? (const void*)((const int8_t*)base + idx)
                        : (const void*)((const int16_t*)base + idx);
}

/* ------------------------------------------------------------------------- */
/* Convolution (plain, grouped, depthwise)                                    */
/* ------------------------------------------------------------------------- */

typedef struct {
    int32_t C_in, H_in, W_in, C_out, KH, KW;
    int32_t stride_h, stride_w, pad_top, pad_bottom, pad_left, pad_right, groups;
    int32_t pad_value; /* what a padding pixel reads: the input zero point */
    int32_t H_out, W_out; /* derived by conv_check */
} conv_shape;

/* Validates the shape and fills H_out / W_out; returns a C7X_ERR_* code. */
static int32_t conv_check(conv_shape* s, const requant_params* q)
{
    int64_t reduction;
    if (s->C_in <= 0 || s->C_out <= 0 || s->groups <= 0 ||
        s->C_in % s->groups != 0 || s->C_out % s->groups != 0) {
        return C7X_ERR_SHAPE;
    }
    s->H_out = conv_out_size(s->H_in, s->KH, s->stride_h, s->pad_top, s->pad_bottom);
    s->W_out = conv_out_size(s->W_in, s->KW, s->stride_w, s->pad_left, s->pad_right);
    reduction = elem_count(s->C_in / s->groups, s->KH, s->KW, 1);
    if (s->H_out <= 0 || s->W_out <= 0 || elem_count(s->C_in, s->H_in, s->W_in, 1) < 0 ||
        elem_count(s->C_out, s->H_out, s->W_out, 1) < 0 || reduction < 0 ||
        reduction > C7X_MAX_REDUCTION || elem_count(s->C_out, (int32_t)reduction, 1, 1) < 0) {
        return C7X_ERR_SHAPE;
    }
    if (s->pad_value < (q->type == ELEM_I8 ? -128 : -32768) ||
        s->pad_value > (q->type == ELEM_I8 ? 127 : 32767)) {
        return C7X_ERR_PARAM;
    }
    return requant_params_ok(q->scale, q->shift, s->C_out) && act_range_ok(q) ? C7X_OK : C7X_ERR_PARAM;
}

/* Padding taps: a tap of weight wv whose input column lies in the padding reads
 * pad_value, so the accumulators of the columns [ow0, ow0 + n) outside the valid
 * range [lo, hi) of valid_columns gain pad_value * wv (all n of them for a padding
 * row: lo = hi = ow0). One body per accumulator type (SUF, ACC). */
#define C7X_DEFINE_PAD_TAPS(SUF, ACC)                                                         \
    static void pad_taps_##SUF(ACC* acc, int32_t ow0, int32_t n, int32_t lo, int32_t hi,       \
                               ACC pw)                                                         \
    {                                                                                          \
        const int32_t end = ow0 + n;                                                           \
        const int32_t a = lo < end ? lo : end;                                                 \
        const int32_t b = hi > a ? hi : a;                                                     \
        int32_t i;                                                                             \
        for (i = ow0; i < a; ++i) {                                                            \
            acc[i - ow0] += pw;                                                                \
        }                                                                                      \
        for (i = b; i < end; ++i) {                                                            \
            acc[i - ow0] += pw;                                                                \
        }                                                                                      \
    }

C7X_DEFINE_PAD_TAPS(i32, int32_t)
C7X_DEFINE_PAD_TAPS(i64, int64_t)

/* Output columns [*lo, *hi) of the tile [ow0, ow0 + n) whose input column
 * ow * stride - pad_left + kw lies inside [0, W_in); the rest read padding (pad_value). */
static void valid_columns(const conv_shape* s, int32_t kw, int32_t ow0, int32_t n,
                          int32_t* lo, int32_t* hi)
{
    const int64_t first = (int64_t)s->pad_left - kw;              /* need ow * stride >= first */
    const int64_t last = (int64_t)s->W_in - 1 + s->pad_left - kw; /* need ow * stride <= last */
    int64_t a = first <= 0 ? 0 : (first + s->stride_w - 1) / s->stride_w;
    int64_t b = last < 0 ? 0 : last / s->stride_w + 1;
    if (a < ow0) a = ow0;
    if (b > (int64_t)ow0 + n) b = (int64_t)ow0 + n;
    *lo = (int32_t)a;
    *hi = (int32_t)(b > a ? b : a);
}

/* Accumulates output channel co, row oh, columns [ow0, ow0 + n) into acc. */
static void conv_accumulate(const conv_shape* s, const void* in, const void* w, elem_type t,
                            int32_t co, int32_t oh, int32_t ow0, int32_t n, int64_t* acc)
{
    const int32_t cin_g = s->C_in / s->groups;
    const int32_t ci0 = (co / (s->C_out / s->groups)) * cin_g;
    int32_t ci, kh, kw, i;
    for (i = 0; i < n; ++i) {
        acc[i] = 0;
    }
    for (ci = 0; ci < cin_g; ++ci) {
        for (kh = 0; kh < s->KH; ++kh) {
            const int64_t ih = (int64_t)oh * s->stride_h - s->pad_top + kh;
            const int64_t row = ((int64_t)(ci0 + ci) * s->H_in + ih) * s->W_in;
            const int64_t wrow = (((int64_t)co * cin_g + ci) * s->KH + kh) * s->KW;
            if (ih < 0 || ih >= s->H_in) {
                for (kw = 0; kw < s->KW && s->pad_value != 0; ++kw) { /* a padding row */
                    pad_taps_i64(acc, ow0, n, ow0, ow0, s->pad_value * load_elem(w, wrow + kw, t));
                }
                continue;
            }
            for (kw = 0; kw < s->KW; ++kw) {
                int32_t lo, hi;
                const int64_t wv = load_elem(w, wrow + kw, t);
                valid_columns(s, kw, ow0, n, &lo, &hi);
                if (s->pad_value != 0) {
                    pad_taps_i64(acc, ow0, n, lo, hi, s->pad_value * wv);
                }
                if (hi > lo) {
                    const int64_t iw = (int64_t)lo * s->stride_w - s->pad_left + kw;
                    axpy_row(acc + (lo - ow0), elem_offset(in, row + iw, t), s->stride_w, wv,
                             hi - lo, t);
                }
            }
        }
    }
}

/* int8 products summed in int32 are exact while reduction * 2^14 < 2^31
 * (|w * x| <= 128 * 128): the fast paths below use int32 below this bound. */
#define I32_EXACT_REDUCTION 131071

/* Pointwise convolution (1x1, stride 1, no padding, one group): output pixel p
 * reads input pixel p, so a tile runs over the flattened H * W plane (rows of 7
 * to 112 columns are too short for the compiler to vectorise). Same sums as
 * conv_accumulate, in the same integers: only faster (MobileNetV2 int8 on the
 * host: 248 -> 65 ms per image with the int8 paths and -O3). One body for both
 * element types: SUF names the variant, T is the element type, ACC the
 * accumulator. int8 accumulates in int32 (C_in <= I32_EXACT_REDUCTION, exact);
 * int16 products fit int32 (|w * x| <= 2^30) and their sum needs int64. */
#define C7X_DEFINE_POINTWISE(SUF, T, ACC)                                                     \
    static void pointwise_accumulate_##SUF(const T* in, const T* w, int32_t C_in,             \
                                           int64_t plane, int32_t co, int64_t p0, int32_t n,   \
                                           ACC* acc)                                           \
    {                                                                                          \
        int32_t ci, i;                                                                         \
        for (i = 0; i < n; ++i) {                                                              \
            acc[i] = 0;                                                                        \
        }                                                                                      \
        for (ci = 0; ci < C_in; ++ci) {                                                        \
            const int32_t wv = w[(int64_t)co * C_in + ci];                                     \
            const T* p = in + (int64_t)ci * plane + p0;                                        \
            for (i = 0; i < n; ++i) {                                                          \
                acc[i] += (int32_t)(wv * p[i]);                                                \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
                                                                                               \
    static void pointwise_run_##SUF(const T* in, const T* w, const requant_params* q, T* out,  \
                                    const conv_shape* s)                                       \
    {                                                                                          \
        ACC acc[ROW_TILE];                                                                     \
        const int64_t plane = (int64_t)s->H_out * s->W_out;                                    \
        int32_t co, i;                                                                         \
        int64_t p0;                                                                            \
        for (co = 0; co < s->C_out; ++co) {                                                    \
            const int64_t bias = channel_bias(q, co);                                          \
            const int32_t scale = channel_scale(q, co);                                        \
            const int32_t shift = channel_shift(q, co);                                        \
            for (p0 = 0; p0 < plane; p0 += ROW_TILE) {                                         \
                const int32_t n = plane - p0 < ROW_TILE ? (int32_t)(plane - p0) : ROW_TILE;    \
                pointwise_accumulate_##SUF(in, w, s->C_in, plane, co, p0, n, acc);             \
                for (i = 0; i < n; ++i) {                                                      \
                    store_requant(out, (int64_t)co * plane + p0 + i,                           \
                                  requantize(acc[i], bias, scale, shift), q);                  \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }

C7X_DEFINE_POINTWISE(i8, int8_t, int32_t)
C7X_DEFINE_POINTWISE(i16, int16_t, int64_t)

/* conv_accumulate for int8 in int32 (reduction <= I32_EXACT_REDUCTION, exact). */
static void conv_accumulate_i8(const conv_shape* s, const int8_t* in, const int8_t* w, int32_t co,
                               int32_t oh, int32_t ow0, int32_t n, int32_t* acc)
{
    const int32_t cin_g = s->C_in / s->groups;
    const int32_t ci0 = (co / (s->C_out / s->groups)) * cin_g;
    int32_t ci, kh, kw, i;
    for (i = 0; i < n; ++i) {
        acc[i] = 0;
    }
    for (ci = 0; ci < cin_g; ++ci) {
        for (kh = 0; kh < s->KH; ++kh) {
            const int64_t ih = (int64_t)oh * s->stride_h - s->pad_top + kh;
            const int64_t row = ((int64_t)(ci0 + ci) * s->H_in + ih) * s->W_in;
            const int64_t wrow = (((int64_t)co * cin_g + ci) * s->KH + kh) * s->KW;
            if (ih < 0 || ih >= s->H_in) {
                for (kw = 0; kw < s->KW && s->pad_value != 0; ++kw) { /* a padding row */
                    pad_taps_i32(acc, ow0, n, ow0, ow0, s->pad_value * w[wrow + kw]);
                }
                continue;
            }
            for (kw = 0; kw < s->KW; ++kw) {
                int32_t lo, hi;
                const int32_t wv = w[wrow + kw];
                valid_columns(s, kw, ow0, n, &lo, &hi);
                if (s->pad_value != 0) {
                    pad_taps_i32(acc, ow0, n, lo, hi, s->pad_value * wv);
                }
                if (hi > lo) {
                    const int8_t* p = in + row + (int64_t)lo * s->stride_w - s->pad_left + kw;
                    int32_t* a = acc + (lo - ow0);
                    const int32_t m = hi - lo;
                    if (s->stride_w == 1) {
                        for (i = 0; i < m; ++i) {
                            a[i] += wv * p[i];
                        }
                    } else {
                        for (i = 0; i < m; ++i) {
                            a[i] += wv * p[(int64_t)i * s->stride_w];
                        }
                    }
                }
            }
        }
    }
}

static int pointwise(const conv_shape* s)
{
    return s->KH == 1 && s->KW == 1 && s->stride_h == 1 && s->stride_w == 1 && s->pad_top == 0 &&
           s->pad_bottom == 0 && s->pad_left == 0 && s->pad_right == 0 && s->groups == 1;
}

static void conv_run_i8(const int8_t* in, const int8_t* w, const requant_params* q, int8_t* out,
                        const conv_shape* s)
{
    int32_t acc[ROW_TILE];
    int32_t co, oh, ow0, i;
    for (co = 0; co < s->C_out; ++co) {
        const int64_t bias = channel_bias(q, co);
        const int32_t scale = channel_scale(q, co);
        const int32_t shift = channel_shift(q, co);
        for (oh = 0; oh < s->H_out; ++oh) {
            const int64_t orow = ((int64_t)co * s->H_out + oh) * s->W_out;
            for (ow0 = 0; ow0 < s->W_out; ow0 += ROW_TILE) {
                const int32_t n = s->W_out - ow0 < ROW_TILE ? s->W_out - ow0 : ROW_TILE;
                conv_accumulate_i8(s, in, w, co, oh, ow0, n, acc);
                for (i = 0; i < n; ++i) {
                    store_requant(out, orow + ow0 + i, requantize(acc[i], bias, scale, shift), q);
                }
            }
        }
    }
}

/* The one convolution every conv / depthwise kernel calls: NCHW in, OIHW w
 * ([C_out, C_in / groups, KH, KW]), NCHW out, N = 1, per-channel requantization. */
static int32_t conv_run(const void* in, const void* w, const requant_params* q, void* out,
                        conv_shape s)
{
    int64_t acc[ROW_TILE];
    int32_t co, oh, ow0, i;
    int32_t err;
    if (in == NULL || w == NULL || out == NULL) {
        return C7X_ERR_NULL;
    }
    err = conv_check(&s, q);
    if (err != C7X_OK) {
        return err;
    }
    /* Fast paths: the same integer sums in loops gcc can vectorise (4x faster). */
    if (q->type == ELEM_I16 && pointwise(&s)) {
        pointwise_run_i16((const int16_t*)in, (const int16_t*)w, q, (int16_t*)out, &s);
        return C7X_OK;
    }
    if (q->type == ELEM_I8 && (int64_t)(s.C_in / s.groups) * s.KH * s.KW <= I32_EXACT_REDUCTION) {
        if (pointwise(&s)) {
            pointwise_run_i8((const int8_t*)in, (const int8_t*)w, q, (int8_t*)out, &s);
        } else {
            conv_run_i8((const int8_t*)in, (const int8_t*)w, q, (int8_t*)out, &s);
        }
        return C7X_OK;
    }
    for (co = 0; co < s.C_out; ++co) {
        const int64_t bias = channel_bias(q, co);
        const int32_t scale = channel_scale(q, co);
        const int32_t shift = channel_shift(q, co);
        for (oh = 0; oh < s.H_out; ++oh) {
            const int64_t orow = ((int64_t)co * s.H_out + oh) * s.W_out;
            for (ow0 = 0; ow0 < s.W_out; ow0 += ROW_TILE) {
                const int32_t n = s.W_out - ow0 < ROW_TILE ? s.W_out - ow0 : ROW_TILE;
                conv_accumulate(&s, in, w, q->type, co, oh, ow0, n, acc);
                for (i = 0; i < n; ++i) {
                    store_requant(out, orow + ow0 + i, requantize(acc[i], bias, scale, shift), q);
                }
            }
        }
    }
    return C7X_OK;
}

static conv_shape make_conv_shape(int32_t C_in, int32_t H_in, int32_t W_in, int32_t C_out,
                                  int32_t KH, int32_t KW, int32_t stride_h, int32_t stride_w,
                                  int32_t pad_top, int32_t pad_bottom, int32_t pad_left,
                                  int32_t pad_right, int32_t groups, int32_t pad_value)
{
    conv_shape s;
    s.C_in = C_in;
    s.H_in = H_in;
    s.W_in = W_in;
    s.C_out = C_out;
    s.KH = KH;
    s.KW = KW;
    s.stride_h = stride_h;
    s.stride_w = stride_w;
    s.pad_top = pad_top;
    s.pad_bottom = pad_bottom;
    s.pad_left = pad_left;
    s.pad_right = pad_right;
    s.groups = groups;
    s.pad_value = pad_value;
    s.H_out = 0;
    s.W_out = 0;
    return s;
}

static requant_params make_requant(const void* bias, const uint8_t* scale, const uint8_t* shift,
                                   elem_type t, int32_t act_min, int32_t act_max)
{
    requant_params q;
    q.bias = bias;
    q.scale = scale;
    q.shift = shift;
    q.type = t;
    q.act_min = act_min;
    q.act_max = act_max;
    return q;
}

/* mmalib_conv2d_i8 / _i16: one body. SUF: i8 / i16; T: element type; B: bias type; ET: elem_type. */
#define C7X_DEFINE_CONV2D(SUF, T, B, ET)                                                           \
    int32_t mmalib_conv2d_##SUF(const T* in, const T* w, const B* bias, const uint8_t* scale,      \
                                const uint8_t* shift, T* out, int32_t C_in, int32_t H_in,          \
                                int32_t W_in, int32_t C_out, int32_t KH, int32_t KW,               \
                                int32_t stride_h, int32_t stride_w, int32_t pad_top,               \
                                int32_t pad_bottom, int32_t pad_left, int32_t pad_right,           \
                                int32_t pad_value, int32_t act_min, int32_t act_max)               \
    {                                                                                              \
        const requant_params q = make_requant(bias, scale, shift, ET, act_min, act_max);           \
        return conv_run(in, w, &q, out,                                                            \
                        make_conv_shape(C_in, H_in, W_in, C_out, KH, KW, stride_h, stride_w,       \
                                        pad_top, pad_bottom, pad_left, pad_right, 1, pad_value));  \
    }

C7X_DEFINE_CONV2D(i8, int8_t, int32_t, ELEM_I8)
C7X_DEFINE_CONV2D(i16, int16_t, int64_t, ELEM_I16)

int32_t mmalib_conv2d_i8_grouped_loop(const int8_t* in, const int8_t* w, const int32_t* bias,
                                      const uint8_t* scale, const uint8_t* shift, int8_t* out,
                                      int32_t C_in, int32_t H_in, int32_t W_in, int32_t C_out,
                                      int32_t KH, int32_t KW, int32_t stride_h, int32_t stride_w,
                                      int32_t pad_top, int32_t pad_bottom, int32_t pad_left,
                                      int32_t pad_right, int32_t groups, int32_t pad_value,
                                      int32_t act_min, int32_t act_max)
{
    const requant_params q = make_requant(bias, scale, shift, ELEM_I8, act_min, act_max);
    return conv_run(in, w, &q, out,
                    make_conv_shape(C_in, H_in, W_in, C_out, KH, KW, stride_h, stride_w, pad_top,
                                    pad_bottom, pad_left, pad_right, groups, pad_value));
}

/* Depthwise = grouped convolution with groups = C_in = C_out = C; the natural
 * weight order [C * KH * KW] is OIHW with I = 1. */
static int32_t depthwise_run(const void* in, const void* w, const requant_params* q, void* out,
                             conv_shape s, int32_t num_groups)
{
    if (in == NULL || w == NULL || out == NULL) {
        return C7X_ERR_NULL;
    }
    if (num_groups != s.C_in) {
        return C7X_ERR_SHAPE;
    }
    return conv_run(in, w, q, out, s);
}

/* mmalib_depthwise_conv2d_i8 / _i16: one body (parameters as C7X_DEFINE_CONV2D). */
#define C7X_DEFINE_DEPTHWISE(SUF, T, B, ET)                                                        \
    int32_t mmalib_depthwise_conv2d_##SUF(const T* in, const T* w, const B* bias,                  \
                                          const uint8_t* scale, const uint8_t* shift, T* out,      \
                                          int32_t C, int32_t H_in, int32_t W_in, int32_t KH,       \
                                          int32_t KW, int32_t stride_h, int32_t stride_w,          \
                                          int32_t pad_top, int32_t pad_bottom, int32_t pad_left,   \
                                          int32_t pad_right, int32_t num_groups,                   \
                                          int32_t pad_value, int32_t act_min, int32_t act_max)     \
    {                                                                                              \
        const requant_params q = make_requant(bias, scale, shift, ET, act_min, act_max);           \
        return depthwise_run(in, w, &q, out,                                                       \
                             make_conv_shape(C, H_in, W_in, C, KH, KW, stride_h, stride_w,         \
                                             pad_top, pad_bottom, pad_left, pad_right, C,          \
                                             pad_value),                                           \
                             num_groups);                                                          \
    }

C7X_DEFINE_DEPTHWISE(i8, int8_t, int32_t, ELEM_I8)
C7X_DEFINE_DEPTHWISE(i16, int16_t, int64_t, ELEM_I16)

/* ------------------------------------------------------------------------- */
/* Fully connected                                                            */
/* ------------------------------------------------------------------------- */

/* out[m, n] = requant(sum_k in[m, k] * w[n, k], channel n); in [M, K], w [N, K]. */
static int32_t matmul_run(const void* in, const void* w, const requant_params* q, void* out,
                          int32_t M, int32_t K, int32_t N)
{
    int32_t m, n;
    if (in == NULL || w == NULL || out == NULL) {
        return C7X_ERR_NULL;
    }
    if (elem_count(M, K, 1, 1) < 0 || elem_count(N, K, 1, 1) < 0 || elem_count(M, N, 1, 1) < 0 ||
        K > C7X_MAX_REDUCTION) {
        return C7X_ERR_SHAPE;
    }
    if (!requant_params_ok(q->scale, q->shift, N) || !act_range_ok(q)) {
        return C7X_ERR_PARAM;
    }
    for (m = 0; m < M; ++m) {
        const void* row = elem_offset(in, (int64_t)m * K, q->type);
        for (n = 0; n < N; ++n) {
            const int64_t acc = dot(row, elem_offset(w, (int64_t)n * K, q->type), K, q->type);
            store_requant(out, (int64_t)m * N + n,
                          requantize(acc, channel_bias(q, n), channel_scale(q, n), channel_shift(q, n)), q);
        }
    }
    return C7X_OK;
}

/* mmalib_matmul_bias_i8 / _i16: one body (parameters as C7X_DEFINE_CONV2D). */
#define C7X_DEFINE_MATMUL(SUF, T, B, ET)                                                           \
    int32_t mmalib_matmul_bias_##SUF(const T* in, const T* w, const B* bias,                       \
                                     const uint8_t* scale, const uint8_t* shift, T* out,           \
                                     int32_t M, int32_t K, int32_t N, int32_t act_min,             \
                                     int32_t act_max)                                              \
    {                                                                                              \
        const requant_params q = make_requant(bias, scale, shift, ET, act_min, act_max);           \
        return matmul_run(in, w, &q, out, M, K, N);                                                \
    }

C7X_DEFINE_MATMUL(i8, int8_t, int32_t, ELEM_I8)
C7X_DEFINE_MATMUL(i16, int16_t, int64_t, ELEM_I16)

/* ------------------------------------------------------------------------- */
/* Residual add                                                               */
/* ------------------------------------------------------------------------- */

/* Little-endian int32 at p[0..3], independent of host byte order and alignment;
 * the unsigned-to-signed step is written out (C99 6.3.1.3p3). */
static int64_t read_le_i32(const uint8_t* p)
{
    const uint32_t u = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
                       ((uint32_t)p[3] << 24);
    return u >= UINT32_C(0x80000000) ? (int64_t)u - (INT64_C(1) << 32) : (int64_t)u;
}

static int64_t read_i8(uint8_t b)
{
    return b >= 128 ? (int64_t)b - 256 : (int64_t)b;
}

static int32_t residual_run(const void* x, const void* skip, const uint8_t* params, void* out,
                            int32_t n, int32_t has_relu, elem_type t)
{
    int64_t m_x, m_skip, zp_x, zp_skip, zp_out;
    int32_t shift, i;
    if (x == NULL || skip == NULL || params == NULL || out == NULL) {
        return C7X_ERR_NULL;
    }
    if (elem_count(n, 1, 1, 1) < 0) {
        return C7X_ERR_SHAPE;
    }
    m_x = read_le_i32(params);
    m_skip = read_le_i32(params + 4);
    if (read_le_i32(params + 8) < 0 || read_le_i32(params + 8) > C7X_MAX_SHIFT) {
        return C7X_ERR_PARAM;
    }
    shift = (int32_t)read_le_i32(params + 8);
    zp_x = read_i8(params[12]);
    zp_skip = read_i8(params[13]);
    zp_out = read_i8(params[14]);
    for (i = 0; i < n; ++i) {
        /* |dx * m_x + ds * m_skip| <= 2 * 2^16 * 2^31 = 2^48: exact in int64. */
        const int64_t dx = load_elem(x, i, t) - zp_x;
        const int64_t ds = load_elem(skip, i, t) - zp_skip;
        int64_t r = rshift_round(dx * m_x + ds * m_skip, shift) + zp_out;
        if (has_relu != 0 && r < zp_out) {
            r = zp_out;
        }
        store_saturated(out, i, r, t);
    }
    return C7X_OK;
}

/* c7x_int8_residual_add_relu / c7x_int16_...: one body. TN: int8 / int16; T: element
 * type; ET: elem_type. */
#define C7X_DEFINE_RESIDUAL(TN, T, ET)                                                             \
    int32_t c7x_##TN##_residual_add_relu(const T* x, const T* skip, const uint8_t* params,         \
                                         T* out, int32_t n, int32_t has_relu)                      \
    {                                                                                              \
        return residual_run(x, skip, params, out, n, has_relu, ET);                                \
    }

C7X_DEFINE_RESIDUAL(int8, int8_t, ELEM_I8)
C7X_DEFINE_RESIDUAL(int16, int16_t, ELEM_I16)

/* The residual add of each [d2] row of x with the skip row at i0 s0 + i1 s1: the skip is
 * broadcast along the axes whose stride is 0. The params are checked by the first row's
 * call, before anything is written. */
static int32_t broadcast_add_run(const void* x, const void* skip, const uint8_t* params, void* out,
                                 int32_t skip_size, int32_t d0, int32_t d1, int32_t d2, int32_t s0,
                                 int32_t s1, int32_t has_relu, elem_type t)
{
    int32_t i0, i1, status;
    if (x == NULL || skip == NULL || params == NULL || out == NULL) {
        return C7X_ERR_NULL;
    }
    if (elem_count(d0, d1, d2, 1) < 0 || skip_size <= 0 || s0 < 0 || s1 < 0 ||
        (int64_t)s0 * (d0 - 1) + (int64_t)s1 * (d1 - 1) + d2 > skip_size) {
        return C7X_ERR_SHAPE;
    }
    for (i0 = 0; i0 < d0; ++i0) {
        for (i1 = 0; i1 < d1; ++i1) {
            const int64_t row = ((int64_t)i0 * d1 + i1) * d2;
            const int64_t at = (int64_t)i0 * s0 + (int64_t)i1 * s1;
            status = residual_run(elem_offset(x, row, t), elem_offset(skip, at, t), params,
                                  (void*)elem_offset(out, row, t), d2, has_relu, t);
            if (status != C7X_OK) {
                return status;
            }
        }
    }
    return C7X_OK;
}

/* c7x_int8_broadcast_add / c7x_int16_...: one body. */
#define C7X_DEFINE_BROADCAST_ADD(TN, T, ET)                                                        \
    int32_t c7x_##TN##_broadcast_add(const T* x, const T* skip, const uint8_t* params, T* out,     \
                                     int32_t skip_size, int32_t d0, int32_t d1, int32_t d2,        \
                                     int32_t s0, int32_t s1, int32_t has_relu)                     \
    {                                                                                              \
        return broadcast_add_run(x, skip, params, out, skip_size, d0, d1, d2, s0, s1, has_relu, ET); \
    }

C7X_DEFINE_BROADCAST_ADD(int8, int8_t, ELEM_I8)
C7X_DEFINE_BROADCAST_ADD(int16, int16_t, ELEM_I16)

/* ------------------------------------------------------------------------- */
/* Max pool                                                                   */
/* ------------------------------------------------------------------------- */

/* Nonzero when `out` is the floor-mode or the ceil-mode output size of one axis
 * (the ceil-mode rule of torch max_pool2d: a last window starting in the right
 * padding is dropped). With pad < k every such window holds an input pixel. */
static int pool_size_ok(int32_t size, int32_t k, int32_t stride, int32_t pad, int32_t out)
{
    const int32_t floor_out = conv_out_size(size, k, stride, pad, pad);
    int64_t ceil_out;
    if (floor_out <= 0 || pad >= k) {
        return 0;
    }
    ceil_out = ((int64_t)size + 2 * (int64_t)pad - k + stride - 1) / stride + 1;
    if ((ceil_out - 1) * stride >= (int64_t)size + pad) {
        ceil_out -= 1;
    }
    return out == floor_out || out == ceil_out;
}

/* Largest input pixel of the window at (oh, ow) of one [H_in, W_in] plane (element
 * type t, planes indexed from `base`); the window is clipped to the input, so padding
 * never wins (and never is empty, see pool_size_ok). */
static int64_t pool_window_max(const void* in, int64_t base, int32_t H_in, int32_t W_in, int64_t h0,
                               int64_t w0, int32_t kH, int32_t kW, elem_type t)
{
    const int64_t h_lo = h0 < 0 ? 0 : h0;
    const int64_t w_lo = w0 < 0 ? 0 : w0;
    const int64_t h_hi = h0 + kH < H_in ? h0 + kH : H_in;
    const int64_t w_hi = w0 + kW < W_in ? w0 + kW : W_in;
    int64_t best = INT16_MIN - 1;
    int64_t h, w;
    for (h = h_lo; h < h_hi; ++h) {
        for (w = w_lo; w < w_hi; ++w) {
            const int64_t v = load_elem(in, base + h * W_in + w, t);
            best = v > best ? v : best;
        }
    }
    return best;
}

static int32_t max_pool_run(const void* in, void* out, int32_t N, int32_t C, int32_t H_in,
                            int32_t W_in, int32_t H_out, int32_t W_out, int32_t kH, int32_t kW,
                            int32_t sH, int32_t sW, int32_t pH, int32_t pW, elem_type t)
{
    int64_t planes, p;
    int32_t oh, ow;
    if (in == NULL || out == NULL) {
        return C7X_ERR_NULL;
    }
    planes = elem_count(N, C, 1, 1);
    if (planes < 0 || elem_count(N, C, H_in, W_in) < 0 || elem_count(N, C, H_out, W_out) < 0 ||
        !pool_size_ok(H_in, kH, sH, pH, H_out) || !pool_size_ok(W_in, kW, sW, pW, W_out)) {
        return C7X_ERR_SHAPE;
    }
    for (p = 0; p < planes; ++p) {
        const int64_t src = p * H_in * W_in;
        const int64_t dst = p * H_out * W_out;
        for (oh = 0; oh < H_out; ++oh) {
            for (ow = 0; ow < W_out; ++ow) {
                store_saturated(out, dst + (int64_t)oh * W_out + ow,
                                pool_window_max(in, src, H_in, W_in, (int64_t)oh * sH - pH,
                                                (int64_t)ow * sW - pW, kH, kW, t), t);
            }
        }
    }
    return C7X_OK;
}

int32_t c7x_int8_max_pool(const int8_t* in, int8_t* out, int32_t N, int32_t C, int32_t H_in,
                          int32_t W_in, int32_t H_out, int32_t W_out, int32_t kH, int32_t kW,
                          int32_t sH, int32_t sW, int32_t pH, int32_t pW)
{
    return max_pool_run(in, out, N, C, H_in, W_in, H_out, W_out, kH, kW, sH, sW, pH, pW, ELEM_I8);
}

/* The TIDL-library variant computes the same function (docs/reference.md, "Max pool"). */
int32_t c7x_int8_max_pool_tidl(const int8_t* in, int8_t* out, int32_t N, int32_t C, int32_t H_in,
                               int32_t W_in, int32_t H_out, int32_t W_out, int32_t kH, int32_t kW,
                               int32_t sH, int32_t sW, int32_t pH, int32_t pW)
{
    return max_pool_run(in, out, N, C, H_in, W_in, H_out, W_out, kH, kW, sH, sW, pH, pW, ELEM_I8);
}

/* int16 (ours: TI's library names no int16 max pool): the same function on int16. */
int32_t c7x_int16_max_pool(const int16_t* in, int16_t* out, int32_t N, int32_t C, int32_t H_in,
                           int32_t W_in, int32_t H_out, int32_t W_out, int32_t kH, int32_t kW,
                           int32_t sH, int32_t sW, int32_t pH, int32_t pW)
{
    return max_pool_run(in, out, N, C, H_in, W_in, H_out, W_out, kH, kW, sH, sW, pH, pW, ELEM_I16);
}

/* ------------------------------------------------------------------------- */
/* ReLU and clamp                                                             */
/* ------------------------------------------------------------------------- */

int32_t c7x_int8_clamp(const int8_t* in, int8_t* out, int32_t n, int32_t lo, int32_t hi)
{
    int32_t i;
    if (in == NULL || out == NULL) {
        return C7X_ERR_NULL;
    }
    if (n <= 0) {
        return C7X_ERR_SHAPE;
    }
    if (lo > hi) {
        return C7X_ERR_PARAM;
    }
    for (i = 0; i < n; ++i) {
        store_saturated(out, i, clamp_i64(in[i], lo, hi), ELEM_I8);
    }
    return C7X_OK;
}

int32_t c7x_int8_relu(const int8_t* in, int8_t* out, int32_t n, int32_t zp)
{
    int32_t i;
    if (in == NULL || out == NULL) {
        return C7X_ERR_NULL;
    }
    if (n <= 0) {
        return C7X_ERR_SHAPE;
    }
    for (i = 0; i < n; ++i) {
        store_saturated(out, i, in[i] > zp ? in[i] : zp, ELEM_I8);
    }
    return C7X_OK;
}

/* ------------------------------------------------------------------------- */
/* Squeeze-excitation (channel-broadcast) multiply                            */
/* ------------------------------------------------------------------------- */

#define CHANNEL_MUL_SHIFT_MAX 62

/* rshift_round for shifts up to 62 (|v| < 2^62, so adding the half cannot overflow). */
static int64_t rshift_round_wide(int64_t v, int32_t shift)
{
    int64_t d, q;
#if C7X_ROUNDING == C7X_ROUND_HALF_UP
    if (shift > 0) {
        v += (int64_t)1 << (shift - 1);
    }
#endif
    d = (int64_t)1 << shift;
    q = v / d;
    if (v < 0 && q * d != v) {
        q -= 1;
    }
    return q;
}

static int32_t channel_mul_run(const void* x, const void* gate, const uint8_t* params, void* out,
                               int32_t planes, int32_t hw, elem_type t)
{
    int64_t m, shift, zp_x, zp_g, zp_out, p, i;
    const int64_t m_limit = t == ELEM_I8 ? (INT64_C(1) << 31) : (INT64_C(1) << 29);
    if (x == NULL || gate == NULL || params == NULL || out == NULL) {
        return C7X_ERR_NULL;
    }
    if (elem_count(planes, hw, 1, 1) < 0) {
        return C7X_ERR_SHAPE;
    }
    m = read_le_i32(params);
    shift = read_le_i32(params + 4);
    if (m < 0 || m >= m_limit || shift < 0 || shift > CHANNEL_MUL_SHIFT_MAX) {
        return C7X_ERR_PARAM;
    }
    zp_x = read_i8(params[12]);
    zp_g = read_i8(params[13]);
    zp_out = read_i8(params[14]);
    for (p = 0; p < planes; ++p) {
        /* |dx * dg| < 2^32 (int16) and m < 2^29: the product stays below 2^61. */
        const int64_t gm = (load_elem(gate, p, t) - zp_g) * m;
        for (i = p * hw; i < (p + 1) * hw; ++i) {
            const int64_t r =
                rshift_round_wide((load_elem(x, i, t) - zp_x) * gm, (int32_t)shift) + zp_out;
            store_saturated(out, i, r, t);
        }
    }
    return C7X_OK;
}

/* c7x_int8_channel_mul / c7x_int16_...: one body (parameters as C7X_DEFINE_RESIDUAL). */
#define C7X_DEFINE_CHANNEL_MUL(TN, T, ET)                                                          \
    int32_t c7x_##TN##_channel_mul(const T* x, const T* gate, const uint8_t* params, T* out,       \
                                   int32_t planes, int32_t hw)                                     \
    {                                                                                              \
        return channel_mul_run(x, gate, params, out, planes, hw, ET);                              \
    }

C7X_DEFINE_CHANNEL_MUL(int8, int8_t, ELEM_I8)
C7X_DEFINE_CHANNEL_MUL(int16, int16_t, ELEM_I16)

/* ------------------------------------------------------------------------- */
/* Activation x activation matmul on strided views (attention)                */
/* ------------------------------------------------------------------------- */

#define BATCH_MATMUL_MAX_K 16384

typedef struct {
    int64_t offset, sb, s_row, s_col; /* element strides of [batch, rows, cols] */
} strided_view;

/* One past the largest index the view reads, or -1 for a negative offset or stride. */
static int64_t view_end(const strided_view* v, int32_t batch, int32_t rows, int32_t cols)
{
    if (v->offset < 0 || v->sb < 0 || v->s_row < 0 || v->s_col < 0) {
        return -1;
    }
    return v->offset + v->sb * (batch - 1) + v->s_row * (rows - 1) + v->s_col * (cols - 1) + 1;
}

static int32_t batch_matmul_run(const void* a, const void* b, const uint8_t* params, void* out,
                                int32_t a_size, int32_t b_size, int32_t batch, int32_t M, int32_t K,
                                int32_t N, const strided_view* va, const strided_view* vb, elem_type t)
{
    int64_t m, shift, za, zb, zo, a_end, b_end;
    int32_t i, r, c, k;
    const int64_t m_limit = t == ELEM_I8 ? (INT64_C(1) << 31) : (INT64_C(1) << 17);
    if (a == NULL || b == NULL || params == NULL || out == NULL) {
        return C7X_ERR_NULL;
    }
    if (elem_count(batch, M, N, 1) < 0 || a_size <= 0 || b_size <= 0 || K <= 0 || K > BATCH_MATMUL_MAX_K) {
        return C7X_ERR_SHAPE;
    }
    a_end = view_end(va, batch, M, K);
    b_end = view_end(vb, batch, K, N);
    if (a_end <= 0 || a_end > a_size || b_end <= 0 || b_end > b_size) {
        return C7X_ERR_SHAPE;
    }
    if ((va->s_col != 1 && va->s_row != 1) || (vb->s_col != 1 && vb->s_row != 1)) {
        return C7X_ERR_PARAM;
    }
    m = read_le_i32(params);
    shift = read_le_i32(params + 4);
    za = read_i8(params[12]);
    zb = read_i8(params[13]);
    zo = read_i8(params[14]);
    if (m < 0 || m >= m_limit || shift < 0 || shift > CHANNEL_MUL_SHIFT_MAX ||
        (za != 0 && (t != ELEM_I8 || za != -128)) || (zb != 0 && (t != ELEM_I8 || zb != -128)) ||
        (t != ELEM_I8 && zo != 0)) {
        return C7X_ERR_PARAM;
    }
    for (i = 0; i < batch; ++i) {
        for (r = 0; r < M; ++r) {
            const int64_t arow = va->offset + va->sb * i + va->s_row * r;
            for (c = 0; c < N; ++c) {
                const int64_t bcol = vb->offset + vb->sb * i + vb->s_col * c;
                int64_t acc = 0; /* |acc| < K 2^30 <= 2^44, |acc * m| < 2^61 */
                for (k = 0; k < K; ++k) {
                    acc += (load_elem(a, arow + va->s_col * k, t) - za) *
                           (load_elem(b, bcol + vb->s_row * k, t) - zb);
                }
                store_saturated(out, ((int64_t)i * M + r) * N + c, rshift_round_wide(acc * m, (int32_t)shift) + zo, t);
            }
        }
    }
    return C7X_OK;
}

/* mmalib_batch_matmul_i8 / _i16: one body. */
#define C7X_DEFINE_BATCH_MATMUL(SUF, T, ET)                                                        \
    int32_t mmalib_batch_matmul_##SUF(const T* a, const T* b, const uint8_t* params, T* out,      \
                                      int32_t a_size, int32_t b_size, int32_t batch, int32_t M,   \
                                      int32_t K, int32_t N, int32_t a_offset, int32_t a_sb,       \
                                      int32_t a_sm, int32_t a_sk, int32_t b_offset, int32_t b_sb, \
                                      int32_t b_sk, int32_t b_sn)                                 \
    {                                                                                              \
        const strided_view va = {a_offset, a_sb, a_sm, a_sk};                                      \
        const strided_view vb = {b_offset, b_sb, b_sk, b_sn};                                      \
        return batch_matmul_run(a, b, params, out, a_size, b_size, batch, M, K, N, &va, &vb, ET); \
    }

C7X_DEFINE_BATCH_MATMUL(i8, int8_t, ELEM_I8)
C7X_DEFINE_BATCH_MATMUL(i16, int16_t, ELEM_I16)

/* ------------------------------------------------------------------------- */
/* Table lookup (element-wise activations)                                    */
/* ------------------------------------------------------------------------- */

int32_t c7x_int8_lut(const int8_t* in, const int8_t* table, int8_t* out, int32_t n)
{
    int32_t i;
    if (in == NULL || table == NULL || out == NULL) {
        return C7X_ERR_NULL;
    }
    if (n <= 0) {
        return C7X_ERR_SHAPE;
    }
    for (i = 0; i < n; ++i) {
        out[i] = table[(int32_t)in[i] + 128];
    }
    return C7X_OK;
}

/* ------------------------------------------------------------------------- */
/* Softmax over the last axis (int8 in, int8 out at scale 1/256, zero point -128) */
/* ------------------------------------------------------------------------- */

#define SOFTMAX_TABLE_MAX 16777216 /* 2^24: 512 * e + S stays far below 2^63 */

int32_t c7x_int8_softmax(const int8_t* in, const int32_t* table, int8_t* out, int32_t rows, int32_t n)
{
    int32_t r, i, k;
    if (in == NULL || table == NULL || out == NULL) {
        return C7X_ERR_NULL;
    }
    if (rows <= 0 || n <= 0 || (int64_t)rows * n > C7X_MAX_ELEMS) {
        return C7X_ERR_SHAPE;
    }
    if (table[255] <= 0 || table[255] > SOFTMAX_TABLE_MAX) {
        return C7X_ERR_PARAM;
    }
    for (k = 0; k < 255; ++k) {
        if (table[k] < 0 || table[k] > table[255]) {
            return C7X_ERR_PARAM;
        }
    }
    for (r = 0; r < rows; ++r) {
        const int8_t* x = in + (int64_t)r * n;
        int8_t* y = out + (int64_t)r * n;
        int32_t m = -128;
        int64_t sum = 0, inv;
        for (i = 0; i < n; ++i) {
            m = x[i] > m ? x[i] : m;
        }
        for (i = 0; i < n; ++i) {
            sum += table[(int32_t)x[i] - m + 255];
        }
        /* one division per row: inv = floor(2^40 / S) <= 2^24, e * inv <= 2^48 */
        inv = (INT64_C(1) << 40) / sum;
        for (i = 0; i < n; ++i) {
            int64_t q = (((int64_t)table[(int32_t)x[i] - m + 255] * inv + (INT64_C(1) << 31)) >> 32) - 128;
            y[i] = (int8_t)(q > 127 ? 127 : q);
        }
    }
    return C7X_OK;
}

/* ------------------------------------------------------------------------- */
/* LayerNorm over the last axis (int8 in and out, integer only)              */
/* ------------------------------------------------------------------------- */

#define LAYER_NORM_MAX_N 4096
#define LAYER_NORM_MAX_BETA (INT64_C(1) << 56)

/* floor(sqrt(v)) for 0 <= v < 2^62, bit by bit (no floating point). */
static int64_t isqrt_i64(int64_t v)
{
    int64_t root = 0, bit = INT64_C(1) << 60;
    while (bit > v) {
        bit >>= 2;
    }
    while (bit != 0) {
        if (v >= root + bit) {
            v -= root + bit;
            root = (root >> 1) + bit;
        } else {
            root >>= 1;
        }
        bit >>= 2;
    }
    return root;
}

int32_t c7x_int8_layer_norm(const int8_t* in, const int32_t* gamma, const int64_t* beta, int8_t* out,
                            int32_t rows, int32_t n, int32_t in_zp, int32_t eps_q)
{
    int32_t r, i;
    if (in == NULL || gamma == NULL || beta == NULL || out == NULL) {
        return C7X_ERR_NULL;
    }
    if (rows <= 0 || n <= 0 || n > LAYER_NORM_MAX_N || (int64_t)rows * n > C7X_MAX_ELEMS) {
        return C7X_ERR_SHAPE;
    }
    if (eps_q < 0 || in_zp < -128 || in_zp > 128) {
        return C7X_ERR_PARAM;
    }
    for (i = 0; i < n; ++i) {
        if (beta[i] > LAYER_NORM_MAX_BETA || beta[i] < -LAYER_NORM_MAX_BETA) {
            return C7X_ERR_PARAM;
        }
    }
    for (r = 0; r < rows; ++r) {
        const int8_t* x = in + (int64_t)r * n;
        int8_t* y = out + (int64_t)r * n;
        int64_t s1 = 0, s2 = 0, d, inv;
        for (i = 0; i < n; ++i) {
            int64_t v = (int64_t)x[i] - in_zp;
            s1 += v;
            s2 += v * v;
        }
        /* n S2 - S1^2 = n^2 var >= 0 (Cauchy-Schwarz), <= 2^40; D = sqrt with 8 fraction bits */
        d = isqrt_i64(((int64_t)n * s2 - s1 * s1 + eps_q) << 16);
        inv = d > 0 ? (INT64_C(1) << 48) / d : 0;
        for (i = 0; i < n; ++i) {
            int64_t z = floor_div_pow2(((int64_t)n * ((int64_t)x[i] - in_zp) - s1) * inv + (INT64_C(1) << 15), 16);
            int64_t q = floor_div_pow2((int64_t)gamma[i] * z + beta[i] + (INT64_C(1) << 39), 40);
            y[i] = (int8_t)clamp_i64(q, -128, 127);
        }
    }
    return C7X_OK;
}

/* ------------------------------------------------------------------------- */
/* L2 normalisation over the last axis (int8, integer only)                   */
/* ------------------------------------------------------------------------- */

int32_t c7x_int8_l2_normalize(const int8_t* in, int8_t* out, int32_t rows, int32_t n, int32_t in_zp,
                              int32_t gain, int32_t out_zp)
{
    int32_t r, i;
    if (in == NULL || out == NULL) {
        return C7X_ERR_NULL;
    }
    if (rows <= 0 || n <= 0 || n > LAYER_NORM_MAX_N || (int64_t)rows * n > C7X_MAX_ELEMS) {
        return C7X_ERR_SHAPE;
    }
    if (in_zp < -128 || in_zp > 128 || gain <= 0 || out_zp < -128 || out_zp > 127) {
        return C7X_ERR_PARAM;
    }
    for (r = 0; r < rows; ++r) {
        const int8_t* x = in + (int64_t)r * n;
        int8_t* y = out + (int64_t)r * n;
        int64_t s2 = 0, d, inv;
        for (i = 0; i < n; ++i) {
            int64_t v = (int64_t)x[i] - in_zp;
            s2 += v * v;
        }
        /* S2 <= 4096 * 256^2 = 2^28; D = sqrt with 16 fraction bits, below 2^30 */
        d = isqrt_i64(s2 << 32);
        inv = d > 0 ? (INT64_C(1) << 56) / d : 0;
        for (i = 0; i < n; ++i) {
            int64_t z = floor_div_pow2(((int64_t)x[i] - in_zp) * inv + (INT64_C(1) << 15), 16);
            int64_t q = floor_div_pow2((int64_t)gain * z + ((int64_t)out_zp << 40) + (INT64_C(1) << 39), 40);
            y[i] = (int8_t)clamp_i64(q, -128, 127);
        }
    }
    return C7X_OK;
}

/* ------------------------------------------------------------------------- */
/* int8 <-> int16 requantize (float32, as torch's Q/DQ)                       */
/* ------------------------------------------------------------------------- */

/* Beyond this magnitude every float32 is an integer and every result saturates. */
#define ROUND_LIMIT 16777216.0f /* 2^24 */

/* round-half-to-even of a float32, as torch.round / nearbyintf in the default
 * rounding mode, without libm and independent of the FPU rounding mode: for
 * |v| < 2^24 the truncation t and the fraction v - t are exact. Larger values
 * (and infinities) are clamped to +-2^24, which saturates int8 and int16 alike. */
static int64_t round_half_even(float v)
{
    int64_t t;
    float frac;
    if (v >= ROUND_LIMIT) {
        return (int64_t)ROUND_LIMIT;
    }
    if (v <= -ROUND_LIMIT) {
        return -(int64_t)ROUND_LIMIT;
    }
    t = (int64_t)v; /* truncates toward zero (C99 6.3.1.4) */
    frac = v - (float)t;
    if (frac > 0.5f || (frac == 0.5f && t % 2 != 0)) {
        t += 1;
    } else if (frac < -0.5f || (frac == -0.5f && t % 2 != 0)) {
        t -= 1;
    }
    return t;
}

/* Nonzero when s is a finite float32 > 0 (NaN fails both comparisons). */
static int positive_finite(float s)
{
    return s > 0.0f && s <= FLT_MAX;
}

static int zp_fits(int32_t zp, elem_type t)
{
    return t == ELEM_I8 ? (zp >= INT8_MIN && zp <= INT8_MAX) : (zp >= INT16_MIN && zp <= INT16_MAX);
}

static int32_t requantize_run(const void* in, void* out, int32_t n, int32_t in_zp, float in_scale,
                              int32_t out_zp, float out_inv_scale, elem_type tin, elem_type tout)
{
    int32_t i;
    if (in == NULL || out == NULL) {
        return C7X_ERR_NULL;
    }
    if (n <= 0) {
        return C7X_ERR_SHAPE;
    }
    if (!zp_fits(in_zp, tin) || !zp_fits(out_zp, tout) || !positive_finite(in_scale) ||
        !positive_finite(out_inv_scale)) {
        return C7X_ERR_PARAM;
    }
    for (i = 0; i < n; ++i) {
        /* Two float32 products, each rounded, as torch's dequantize then quantize;
         * in - zp is an exact integer below 2^17, so its float is exact. */
        const float d = (float)(load_elem(in, i, tin) - in_zp) * in_scale;
        const float v = d * out_inv_scale;
        store_saturated(out, i, round_half_even(v) + out_zp, tout);
    }
    return C7X_OK;
}

/* c7x_requantize_<from>_<to>: one body. SUF: i8_i16 ...; TI / TO: input / output element
 * types; EI / EO: their elem_type. */
#define C7X_DEFINE_REQUANTIZE(SUF, TI, TO, EI, EO)                                                 \
    int32_t c7x_requantize_##SUF(const TI* in, TO* out, int32_t n, int32_t in_zp, float in_scale,  \
                                 int32_t out_zp, float out_inv_scale)                              \
    {                                                                                              \
        return requantize_run(in, out, n, in_zp, in_scale, out_zp, out_inv_scale, EI, EO);         \
    }

C7X_DEFINE_REQUANTIZE(i8_i16, int8_t, int16_t, ELEM_I8, ELEM_I16)
C7X_DEFINE_REQUANTIZE(i16_i8, int16_t, int8_t, ELEM_I16, ELEM_I8)
C7X_DEFINE_REQUANTIZE(i8_i8, int8_t, int8_t, ELEM_I8, ELEM_I8)
C7X_DEFINE_REQUANTIZE(i16_i16, int16_t, int16_t, ELEM_I16, ELEM_I16)

/* ------------------------------------------------------------------------- */
/* Average pools (float32, as torch's Q/DQ)                                   */
/* ------------------------------------------------------------------------- */

/* torch's x86 CPU float32 sum (aten/src/ATen/native/cpu/SumKernel.cpp, "cascade_sum"):
 * 8-lane vectors, 4 interleaved partial sums, 4 cascade levels. */
#define SUM_LANES 8
#define SUM_ILP 4
#define SUM_LEVELS 4

/* One plane of a quantized tensor, read as torch's dequantize_per_tensor. */
typedef struct {
    const void* in;
    int64_t base;
    int32_t zp;
    float scale;
    elem_type type;
} dq_plane;

/* (float)(x - zp) * scale: x - zp is an integer below 2^17, exact in float32,
 * and the product is rounded once, as torch's (input.to(float32) - zp) * scale. */
static float dq_value(const dq_plane* p, int64_t i)
{
    return (float)(load_elem(p->in, p->base + i, p->type) - p->zp) * p->scale;
}

static int64_t ceil_log2(int64_t x)
{
    int64_t bits = 0;
    if (x <= 2) {
        return 1;
    }
    for (x -= 1; x > 0; x >>= 1) {
        ++bits;
    }
    return bits;
}

/* acc[k][l] += item (g * SUM_ILP + k), lane l, for the `width` lanes of each item
 * (width SUM_LANES: items are vectors of consecutive values; width 1: single values). */
static void add_group(float acc[SUM_ILP][SUM_LANES], const dq_plane* p, int64_t g, int32_t width)
{
    int32_t k, l;
    for (k = 0; k < SUM_ILP; ++k) {
        for (l = 0; l < width; ++l) {
            acc[k][l] += dq_value(p, (g * SUM_ILP + k) * width + l);
        }
    }
}

static void add_level(float dst[SUM_ILP][SUM_LANES], float src[SUM_ILP][SUM_LANES], int clear)
{
    int32_t k, l;
    for (k = 0; k < SUM_ILP; ++k) {
        for (l = 0; l < SUM_LANES; ++l) {
            dst[k][l] += src[k][l];
            if (clear) {
                src[k][l] = 0.0f;
            }
        }
    }
}

/* torch's multi_row_sum over `groups` groups of SUM_ILP items: chunks of 2^power
 * groups go into level 0; after each chunk a level moves up into the next until
 * the group count has a nonzero digit (base 2^power) at that level. */
static void cascade_sum(const dq_plane* p, int64_t groups, int32_t width,
                        float cols[SUM_ILP][SUM_LANES])
{
    float acc[SUM_LEVELS][SUM_ILP][SUM_LANES];
    const int64_t log = ceil_log2(groups) / SUM_LEVELS;
    const int64_t power = log > 4 ? log : 4;
    const int64_t step = (int64_t)1 << power;
    int64_t i = 0, j;
    int32_t level, k, l;
    for (level = 0; level < SUM_LEVELS; ++level) {
        for (k = 0; k < SUM_ILP; ++k) {
            for (l = 0; l < SUM_LANES; ++l) {
                acc[level][k][l] = 0.0f;
            }
        }
    }
    while (i + step <= groups) {
        for (j = 0; j < step; ++j, ++i) {
            add_group(acc[0], p, i, width);
        }
        for (level = 1; level < SUM_LEVELS; ++level) {
            add_level(acc[level], acc[level - 1], 1);
            if ((i & ((step - 1) << (level * power))) != 0) {
                break;
            }
        }
    }
    for (; i < groups; ++i) {
        add_group(acc[0], p, i, width);
    }
    for (level = 1; level < SUM_LEVELS; ++level) {
        add_level(acc[0], acc[level], 0);
    }
    for (k = 0; k < SUM_ILP; ++k) {
        for (l = 0; l < SUM_LANES; ++l) {
            cols[k][l] = acc[0][k][l];
        }
    }
}

/* torch's row_sum of `items` items: the column sums of the full groups of
 * SUM_ILP items, the leftover items added to column 0, then columns 1..3. */
static void row_sum(const dq_plane* p, int64_t items, int32_t width, float sum[SUM_LANES])
{
    float cols[SUM_ILP][SUM_LANES];
    const int64_t groups = items / SUM_ILP;
    int64_t j;
    int32_t k, l;
    cascade_sum(p, groups, width, cols);
    for (l = 0; l < SUM_LANES; ++l) {
        sum[l] = cols[0][l];
    }
    for (j = groups * SUM_ILP; j < items; ++j) {
        for (l = 0; l < width; ++l) {
            sum[l] += dq_value(p, j * width + l);
        }
    }
    for (k = 1; k < SUM_ILP; ++k) {
        for (l = 0; l < SUM_LANES; ++l) {
            sum[l] += cols[k][l];
        }
    }
}

/* Sum of the n dequantized values of one plane in torch's order (header). */
static float torch_order_sum(const dq_plane* p, int64_t n)
{
    float lanes[SUM_LANES], total = 0.0f;
    int64_t vectors, k;
    int32_t l;
    if (n < SUM_LANES) {
        row_sum(p, n, 1, lanes);
        return lanes[0];
    }
    vectors = n / SUM_LANES;
    row_sum(p, vectors, SUM_LANES, lanes);
    for (k = vectors * SUM_LANES; k < n; ++k) {
        total += dq_value(p, k);
    }
    for (l = 0; l < SUM_LANES; ++l) {
        total += lanes[l];
    }
    return total;
}

/* torch's quantize_per_tensor of one float32: round_half_even(v * inv) + zp, saturated.
 * A NaN (only from scales so large that +inf and -inf meet in a sum) stores zp. */
static void store_quantized(void* out, int64_t idx, float v, float inv, int32_t zp, elem_type t)
{
    const float q = v * inv;
    store_saturated(out, idx, (q == q ? round_half_even(q) : 0) + zp, t);
}

static int32_t global_avg_pool_run(const void* in, void* out, int32_t planes, int32_t hw,
                                   int32_t in_zp, float in_scale, int32_t out_zp,
                                   float out_inv_scale, elem_type t)
{
    dq_plane p;
    int64_t c;
    if (in == NULL || out == NULL) {
        return C7X_ERR_NULL;
    }
    if (elem_count(planes, hw, 1, 1) < 0) {
        return C7X_ERR_SHAPE;
    }
    if (!zp_fits(in_zp, t) || !zp_fits(out_zp, t) || !positive_finite(in_scale) ||
        !positive_finite(out_inv_scale)) {
        return C7X_ERR_PARAM;
    }
    p.in = in;
    p.zp = in_zp;
    p.scale = in_scale;
    p.type = t;
    for (c = 0; c < planes; ++c) {
        p.base = c * hw;
        /* torch's mean: sum, then a float32 division by the element count */
        store_quantized(out, c, torch_order_sum(&p, hw) / (float)hw, out_inv_scale, out_zp, t);
    }
    return C7X_OK;
}

/* c7x_int8_global_avg_pool / c7x_int16_...: one body (parameters as C7X_DEFINE_RESIDUAL). */
#define C7X_DEFINE_GLOBAL_AVG_POOL(TN, T, ET)                                                      \
    int32_t c7x_##TN##_global_avg_pool(const T* in, T* out, int32_t planes, int32_t hw,            \
                                       int32_t in_zp, float in_scale, int32_t out_zp,              \
                                       float out_inv_scale)                                        \
    {                                                                                              \
        return global_avg_pool_run(in, out, planes, hw, in_zp, in_scale, out_zp, out_inv_scale,    \
                                   ET);                                                            \
    }

C7X_DEFINE_GLOBAL_AVG_POOL(int8, int8_t, ELEM_I8)
C7X_DEFINE_GLOBAL_AVG_POOL(int16, int16_t, ELEM_I16)

typedef struct {
    int32_t N, C, H_in, W_in, H_out, W_out, kH, kW, sH, sW, pH, pW, count_include_pad;
} avg_pool_geometry;

/* torch's avg_pool2d of the window at (oh, ow): the sum from 0.0f over the window's
 * input pixels, rows then columns, divided by float32(divisor); the divisor counts the
 * window clipped to [-pad, size + pad) (count_include_pad) or to the input. */
static float avg_window(const dq_plane* p, const avg_pool_geometry* g, int64_t oh, int64_t ow)
{
    const int64_t h0 = oh * g->sH - g->pH, w0 = ow * g->sW - g->pW;
    const int64_t h1 = h0 + g->kH < (int64_t)g->H_in + g->pH ? h0 + g->kH : (int64_t)g->H_in + g->pH;
    const int64_t w1 = w0 + g->kW < (int64_t)g->W_in + g->pW ? w0 + g->kW : (int64_t)g->W_in + g->pW;
    const int64_t h_lo = h0 < 0 ? 0 : h0, w_lo = w0 < 0 ? 0 : w0;
    const int64_t h_hi = h1 < g->H_in ? h1 : g->H_in, w_hi = w1 < g->W_in ? w1 : g->W_in;
    const int64_t divisor =
        g->count_include_pad ? (h1 - h0) * (w1 - w0) : (h_hi - h_lo) * (w_hi - w_lo);
    float sum = 0.0f;
    int64_t h, w;
    for (h = h_lo; h < h_hi; ++h) {
        for (w = w_lo; w < w_hi; ++w) {
            sum += dq_value(p, h * g->W_in + w);
        }
    }
    return sum / (float)divisor;
}

static int32_t avg_pool_run(const void* in, void* out, const avg_pool_geometry* g, int32_t in_zp,
                            float in_scale, int32_t out_zp, float out_inv_scale, elem_type t)
{
    dq_plane p;
    int64_t planes, c, oh, ow;
    if (in == NULL || out == NULL) {
        return C7X_ERR_NULL;
    }
    planes = elem_count(g->N, g->C, 1, 1);
    if (planes < 0 || elem_count(g->N, g->C, g->H_in, g->W_in) < 0 ||
        elem_count(g->N, g->C, g->H_out, g->W_out) < 0 ||
        !pool_size_ok(g->H_in, g->kH, g->sH, g->pH, g->H_out) ||
        !pool_size_ok(g->W_in, g->kW, g->sW, g->pW, g->W_out)) {
        return C7X_ERR_SHAPE;
    }
    if (!zp_fits(in_zp, t) || !zp_fits(out_zp, t) || !positive_finite(in_scale) ||
        !positive_finite(out_inv_scale)) {
        return C7X_ERR_PARAM;
    }
    p.in = in;
    p.zp = in_zp;
    p.scale = in_scale;
    p.type = t;
    for (c = 0; c < planes; ++c) {
        const int64_t dst = c * g->H_out * g->W_out;
        p.base = c * g->H_in * g->W_in;
        for (oh = 0; oh < g->H_out; ++oh) {
            for (ow = 0; ow < g->W_out; ++ow) {
                store_quantized(out, dst + oh * g->W_out + ow, avg_window(&p, g, oh, ow),
                                out_inv_scale, out_zp, t);
            }
        }
    }
    return C7X_OK;
}

/* c7x_int8_avg_pool / c7x_int16_...: one body (parameters as C7X_DEFINE_RESIDUAL). */
#define C7X_DEFINE_AVG_POOL(TN, T, ET)                                                             \
    int32_t c7x_##TN##_avg_pool(const T* in, T* out, int32_t N, int32_t C, int32_t H_in,           \
                                int32_t W_in, int32_t H_out, int32_t W_out, int32_t kH,            \
                                int32_t kW, int32_t sH, int32_t sW, int32_t pH, int32_t pW,        \
                                int32_t count_include_pad, int32_t in_zp, float in_scale,          \
                                int32_t out_zp, float out_inv_scale)                               \
    {                                                                                              \
        const avg_pool_geometry g = {N, C, H_in, W_in, H_out, W_out, kH, kW, sH, sW, pH, pW,       \
                                     count_include_pad};                                           \
        return avg_pool_run(in, out, &g, in_zp, in_scale, out_zp, out_inv_scale, ET);              \
    }

C7X_DEFINE_AVG_POOL(int8, int8_t, ELEM_I8)
C7X_DEFINE_AVG_POOL(int16, int16_t, ELEM_I16)

/* ------------------------------------------------------------------------- */
/* Per-channel affine requantize (float32, as torch's Q/DQ batch_norm)        */
/* ------------------------------------------------------------------------- */

/* x * a + b rounded once to float32 (an exact fmaf without libm). The product of two
 * float32 is exact in double (24 + 24 bits); s = p + b is rounded to double and TwoSum
 * recovers its error e exactly. Rounding s to float can only differ from rounding the
 * exact s + e when s lies exactly halfway between f = (float)s and g = s + (s - f), and
 * e != 0: then the exact value is on e's side of the midpoint. Needs |x * a + b| far below
 * FLT_MAX (C7X_AFFINE_LIMIT) and IEEE double; reference.py's fma_f32 is its twin. */
static float fma_f32(float x, float a, float b)
{
    const double p = (double)x * (double)a;
    const double s = p + (double)b;
    const double bb = s - p;
    const double e = (p - (s - bb)) + ((double)b - bb);
    const float f = (float)s;
    const double d = s - (double)f;
    const double g = s + d;
    if (d != 0.0 && e != 0.0 && (double)(float)g == g && ((e > 0.0) == (g > (double)f))) {
        return (float)g;
    }
    return f;
}

static uint32_t read_le_u32(const uint8_t* p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static float read_le_f32(const uint8_t* p)
{
    union {
        uint32_t u;
        float f;
    } v;
    v.u = read_le_u32(p);
    return v.f;
}

static int32_t read_le_s32(const uint8_t* p)
{
    const uint32_t u = read_le_u32(p);
    return u <= (uint32_t)INT32_MAX ? (int32_t)u : (int32_t)((int64_t)u - (INT64_C(1) << 32));
}

/* |v| <= C7X_AFFINE_LIMIT (NaN fails). */
static int affine_bounded(float v)
{
    return v >= -C7X_AFFINE_LIMIT && v <= C7X_AFFINE_LIMIT;
}

static int32_t channel_affine_run(const void* in, const uint8_t* params, void* out, int32_t N,
                                  int32_t C, int32_t hw, int32_t mid_zp, float mid_scale,
                                  float mid_inv_scale, int32_t has_relu, int32_t out_zp,
                                  float out_inv_scale, elem_type t)
{
    int64_t n, c, i;
    if (in == NULL || params == NULL || out == NULL) {
        return C7X_ERR_NULL;
    }
    if (elem_count(N, C, hw, 1) < 0 || elem_count(C, 16, 1, 1) < 0) {
        return C7X_ERR_SHAPE;
    }
    if (!zp_fits(mid_zp, t) || !zp_fits(out_zp, t) || !positive_finite(mid_scale) ||
        !positive_finite(mid_inv_scale) || !positive_finite(out_inv_scale)) {
        return C7X_ERR_PARAM;
    }
    for (c = 0; c < C; ++c) {
        const uint8_t* q = params + 16 * c;
        const float scale = read_le_f32(q + 4);
        if (!zp_fits(read_le_s32(q), t) || !(scale > 0.0f) || !affine_bounded(scale) ||
            !affine_bounded(read_le_f32(q + 8)) || !affine_bounded(read_le_f32(q + 12))) {
            return C7X_ERR_PARAM;
        }
    }
    for (n = 0; n < N; ++n) {
        for (c = 0; c < C; ++c) {
            const uint8_t* q = params + 16 * c;
            const int32_t zp = read_le_s32(q);
            const float scale = read_le_f32(q + 4), alpha = read_le_f32(q + 8),
                        beta = read_le_f32(q + 12);
            const int64_t base = (n * C + c) * hw;
            for (i = 0; i < hw; ++i) {
                /* torch's dequantize (one float32 product), batch_norm (one fma) */
                const float x = (float)(load_elem(in, base + i, t) - zp) * scale;
                const float y = fma_f32(x, alpha, beta);
                const float v = y * mid_inv_scale;
                int64_t r = round_half_even(v) + mid_zp;
                const int64_t lo = t == ELEM_I8 ? INT8_MIN : INT16_MIN;
                const int64_t hi = t == ELEM_I8 ? INT8_MAX : INT16_MAX;
                r = clamp_i64(r, lo, hi);
                if (has_relu) {
                    /* quantize(relu(dequantize(r))): relu(dq(r)) = dq(max(r, mid_zp)) */
                    const float d = (float)((r > mid_zp ? r : mid_zp) - mid_zp) * mid_scale;
                    store_quantized(out, base + i, d, out_inv_scale, out_zp, t);
                } else {
                    store_saturated(out, base + i, r, t);
                }
            }
        }
    }
    return C7X_OK;
}

/* c7x_int8_channel_affine / c7x_int16_...: one body (parameters as C7X_DEFINE_RESIDUAL). */
#define C7X_DEFINE_CHANNEL_AFFINE(TN, T, ET)                                                       \
    int32_t c7x_##TN##_channel_affine(const T* in, const uint8_t* params, T* out, int32_t N,       \
                                      int32_t C, int32_t hw, int32_t mid_zp, float mid_scale,      \
                                      float mid_inv_scale, int32_t has_relu, int32_t out_zp,       \
                                      float out_inv_scale)                                         \
    {                                                                                              \
        return channel_affine_run(in, params, out, N, C, hw, mid_zp, mid_scale, mid_inv_scale,     \
                                  has_relu, out_zp, out_inv_scale, ET);                            \
    }

C7X_DEFINE_CHANNEL_AFFINE(int8, int8_t, ELEM_I8)
C7X_DEFINE_CHANNEL_AFFINE(int16, int16_t, ELEM_I16)

/* ------------------------------------------------------------------------- */
/* Quantize / dequantize at the model's edges                                 */
/* ------------------------------------------------------------------------- */

static int32_t quantize_run(const float* in, void* out, int32_t n, int32_t out_zp,
                            float out_inv_scale, elem_type t)
{
    int64_t i;
    if (in == NULL || out == NULL) {
        return C7X_ERR_NULL;
    }
    if (n <= 0) {
        return C7X_ERR_SHAPE;
    }
    if (!zp_fits(out_zp, t) || !positive_finite(out_inv_scale)) {
        return C7X_ERR_PARAM;
    }
    for (i = 0; i < n; ++i) {
        store_quantized(out, i, in[i], out_inv_scale, out_zp, t);
    }
    return C7X_OK;
}

static int32_t dequantize_run(const void* in, float* out, int32_t n_in, int32_t n, int32_t in_zp,
                              float in_scale, elem_type t)
{
    int64_t i;
    if (in == NULL || out == NULL) {
        return C7X_ERR_NULL;
    }
    if (n <= 0 || n_in < n) {
        return C7X_ERR_SHAPE;
    }
    if (!zp_fits(in_zp, t) || !positive_finite(in_scale)) {
        return C7X_ERR_PARAM;
    }
    for (i = 0; i < n; ++i) {
        out[i] = (float)(load_elem(in, i, t) - in_zp) * in_scale;
    }
    return C7X_OK;
}

/* c7x_quantize_f32_i8 / _i16: one body. SUF: i8 / i16; T: element type; ET: elem_type. */
#define C7X_DEFINE_QUANTIZE(SUF, T, ET)                                                            \
    int32_t c7x_quantize_f32_##SUF(const float* in, T* out, int32_t n, int32_t out_zp,             \
                                   float out_inv_scale)                                            \
    {                                                                                              \
        return quantize_run(in, out, n, out_zp, out_inv_scale, ET);                                \
    }                                                                                              \
    int32_t c7x_dequantize_##SUF##_f32(const T* in, float* out, int32_t n_in, int32_t n,            \
                                       int32_t in_zp, float in_scale)                              \
    {                                                                                              \
        return dequantize_run(in, out, n_in, n, in_zp, in_scale, ET);                              \
    }

C7X_DEFINE_QUANTIZE(i8, int8_t, ELEM_I8)
C7X_DEFINE_QUANTIZE(i16, int16_t, ELEM_I16)

/* ------------------------------------------------------------------------- */
/* Concatenate / slice with requantize (float32, as torch's Q/DQ)             */
/* ------------------------------------------------------------------------- */

typedef struct {
    const void* in;
    int32_t size, offset, n, zp;
    float scale;
} concat_segment;

/* Statuses of c7x_concat<K>_<t> (c7x_kernels.h), in the order the header lists them. */
static int32_t concat_check(const concat_segment* seg, int32_t k, const void* out, int32_t outer,
                            int32_t out_zp, float out_inv_scale, elem_type t)
{
    int64_t total = 0;
    int32_t j;
    if (out == NULL) {
        return C7X_ERR_NULL;
    }
    for (j = 0; j < k; ++j) {
        if (seg[j].in == NULL) {
            return C7X_ERR_NULL;
        }
    }
    for (j = 0; j < k; ++j) {
        if (seg[j].n <= 0 || seg[j].offset < 0 || (int64_t)seg[j].offset + seg[j].n > seg[j].size ||
            elem_count(outer, seg[j].size, 1, 1) < 0) {
            return C7X_ERR_SHAPE;
        }
        total += seg[j].n;
    }
    if (total > INT32_MAX || elem_count(outer, (int32_t)total, 1, 1) < 0) {
        return C7X_ERR_SHAPE;
    }
    for (j = 0; j < k; ++j) {
        if (!zp_fits(seg[j].zp, t) || !positive_finite(seg[j].scale)) {
            return C7X_ERR_PARAM;
        }
    }
    if (!zp_fits(out_zp, t) || !positive_finite(out_inv_scale)) {
        return C7X_ERR_PARAM;
    }
    return C7X_OK;
}

static int32_t concat_run(const concat_segment* seg, int32_t k, void* out, int32_t outer,
                          int32_t out_zp, float out_inv_scale, elem_type t)
{
    const int32_t status = concat_check(seg, k, out, outer, out_zp, out_inv_scale, t);
    int64_t o, i, pos = 0;
    int32_t j;
    if (status != C7X_OK) {
        return status;
    }
    for (o = 0; o < outer; ++o) {
        for (j = 0; j < k; ++j) {
            const int64_t base = o * seg[j].size + seg[j].offset;
            for (i = 0; i < seg[j].n; ++i) {
                const float d = (float)(load_elem(seg[j].in, base + i, t) - seg[j].zp) * seg[j].scale;
                const float v = d * out_inv_scale;
                store_saturated(out, pos++, round_half_even(v) + out_zp, t);
            }
        }
    }
    return C7X_OK;
}

/* One segment's parameters and its initialiser, for the wrappers below. */
#define C7X_SEG_PARAMS(j) int32_t size##j, int32_t offset##j, int32_t n##j, int32_t zp##j, float scale##j
#define C7X_SEG(j) {in##j, size##j, offset##j, n##j, zp##j, scale##j}

/* c7x_concat<K>_<t>: one body (concat_run). SUF: i8 / i16; T: element type; ET: elem_type. */
#define C7X_DEFINE_CONCAT(SUF, T, ET)                                                              \
    int32_t c7x_concat1_##SUF(const T* in0, T* out, int32_t outer, C7X_SEG_PARAMS(0),              \
                              int32_t out_zp, float out_inv_scale)                                 \
    {                                                                                              \
        const concat_segment s[1] = {C7X_SEG(0)};                                                  \
        return concat_run(s, 1, out, outer, out_zp, out_inv_scale, ET);                            \
    }                                                                                              \
    int32_t c7x_concat2_##SUF(const T* in0, const T* in1, T* out, int32_t outer,                   \
                              C7X_SEG_PARAMS(0), C7X_SEG_PARAMS(1), int32_t out_zp,                \
                              float out_inv_scale)                                                 \
    {                                                                                              \
        const concat_segment s[2] = {C7X_SEG(0), C7X_SEG(1)};                                      \
        return concat_run(s, 2, out, outer, out_zp, out_inv_scale, ET);                            \
    }                                                                                              \
    int32_t c7x_concat3_##SUF(const T* in0, const T* in1, const T* in2, T* out, int32_t outer,     \
                              C7X_SEG_PARAMS(0), C7X_SEG_PARAMS(1), C7X_SEG_PARAMS(2),             \
                              int32_t out_zp, float out_inv_scale)                                 \
    {                                                                                              \
        const concat_segment s[3] = {C7X_SEG(0), C7X_SEG(1), C7X_SEG(2)};                          \
        return concat_run(s, 3, out, outer, out_zp, out_inv_scale, ET);                            \
    }                                                                                              \
    int32_t c7x_concat4_##SUF(const T* in0, const T* in1, const T* in2, const T* in3, T* out,      \
                              int32_t outer, C7X_SEG_PARAMS(0), C7X_SEG_PARAMS(1),                 \
                              C7X_SEG_PARAMS(2), C7X_SEG_PARAMS(3), int32_t out_zp,                \
                              float out_inv_scale)                                                 \
    {                                                                                              \
        const concat_segment s[4] = {C7X_SEG(0), C7X_SEG(1), C7X_SEG(2), C7X_SEG(3)};              \
        return concat_run(s, 4, out, outer, out_zp, out_inv_scale, ET);                            \
    }

C7X_DEFINE_CONCAT(i8, int8_t, ELEM_I8)
C7X_DEFINE_CONCAT(i16, int16_t, ELEM_I16)

/* ------------------------------------------------------------------------- */
/* Permute (data movement)                                                    */
/* ------------------------------------------------------------------------- */

#define PERMUTE_RANK 6

static int32_t permute_run(const void* in, void* out, const int32_t* dims, const int32_t* perm, elem_type t)
{
    int64_t in_stride[PERMUTE_RANK], src_stride[PERMUTE_RANK], idx[PERMUTE_RANK], n, o, src;
    int32_t out_dims[PERMUTE_RANK], k, seen = 0;
    if (in == NULL || out == NULL) {
        return C7X_ERR_NULL;
    }
    n = elem_count(dims[0], dims[1], dims[2], dims[3]);
    if (n < 0 || elem_count(dims[4], dims[5], 1, 1) < 0 || n > C7X_MAX_ELEMS / ((int64_t)dims[4] * dims[5])) {
        return C7X_ERR_SHAPE;
    }
    n *= (int64_t)dims[4] * dims[5];
    for (k = 0; k < PERMUTE_RANK; ++k) {
        if (perm[k] < 0 || perm[k] >= PERMUTE_RANK || (seen & (1 << perm[k]))) {
            return C7X_ERR_PARAM;
        }
        seen |= 1 << perm[k];
    }
    in_stride[PERMUTE_RANK - 1] = 1;
    for (k = PERMUTE_RANK - 2; k >= 0; --k) {
        in_stride[k] = in_stride[k + 1] * dims[k + 1];
    }
    for (k = 0; k < PERMUTE_RANK; ++k) {
        out_dims[k] = dims[perm[k]];
        src_stride[k] = in_stride[perm[k]]; /* output axis k walks input axis perm[k] */
        idx[k] = 0;
    }
    src = 0;
    for (o = 0; o < n; ++o) {
        store_saturated(out, o, load_elem(in, src, t), t);
        for (k = PERMUTE_RANK - 1; k >= 0; --k) { /* odometer over the output index */
            if (++idx[k] < out_dims[k]) {
                src += src_stride[k];
                break;
            }
            src -= src_stride[k] * (out_dims[k] - 1);
            idx[k] = 0;
        }
    }
    return C7X_OK;
}

#define C7X_DEFINE_PERMUTE(SUF, T, ET)                                                             \
    int32_t c7x_permute_##SUF(const T* in, T* out, int32_t d0, int32_t d1, int32_t d2, int32_t d3, \
                              int32_t d4, int32_t d5, int32_t p0, int32_t p1, int32_t p2,          \
                              int32_t p3, int32_t p4, int32_t p5)                                  \
    {                                                                                              \
        const int32_t dims[PERMUTE_RANK] = {d0, d1, d2, d3, d4, d5};                               \
        const int32_t perm[PERMUTE_RANK] = {p0, p1, p2, p3, p4, p5};                               \
        return permute_run(in, out, dims, perm, ET);                                               \
    }

C7X_DEFINE_PERMUTE(i8, int8_t, ELEM_I8)
C7X_DEFINE_PERMUTE(i16, int16_t, ELEM_I16)

/* ------------------------------------------------------------------------- */
/* Take (gather along one axis; data movement)                                */
/* ------------------------------------------------------------------------- */

static int32_t take_run(const void* in, const int32_t* index, void* out, int32_t outer, int32_t n_in,
                        int32_t n_out, int32_t inner, elem_type t)
{
    int32_t o, j, i;
    if (in == NULL || index == NULL || out == NULL) {
        return C7X_ERR_NULL;
    }
    if (elem_count(outer, n_in, inner, 1) < 0 || elem_count(outer, n_out, inner, 1) < 0) {
        return C7X_ERR_SHAPE;
    }
    for (j = 0; j < n_out; ++j) {
        if (index[j] < 0 || index[j] >= n_in) {
            return C7X_ERR_PARAM;
        }
    }
    for (o = 0; o < outer; ++o) {
        for (j = 0; j < n_out; ++j) {
            const int64_t src = ((int64_t)o * n_in + index[j]) * inner;
            const int64_t dst = ((int64_t)o * n_out + j) * inner;
            for (i = 0; i < inner; ++i) {
                store_saturated(out, dst + i, load_elem(in, src + i, t), t);
            }
        }
    }
    return C7X_OK;
}

#define C7X_DEFINE_TAKE(SUF, T, ET)                                                                \
    int32_t c7x_take_##SUF(const T* in, const int32_t* index, T* out, int32_t outer, int32_t n_in, \
                           int32_t n_out, int32_t inner)                                           \
    {                                                                                              \
        return take_run(in, index, out, outer, n_in, n_out, inner, ET);                            \
    }

C7X_DEFINE_TAKE(i8, int8_t, ELEM_I8)
C7X_DEFINE_TAKE(i16, int16_t, ELEM_I16)
