/* Scalar element conversions between dtypes: the single definition of the rules, shared by the
 * CPU backend and (through SPCONV_HD) the CUDA kernels, so that both backends agree bit for bit.
 * Must stay valid C11 and C++ (nvcc).
 *
 * The rules:
 * - float -> float: f64 -> f32 is the C conversion (round to nearest even); f32 -> f16 and
 *   f32 -> bf16 round to nearest even, overflow gives inf, NaN stays NaN (made quiet, sign and top
 *   payload bits kept). f64 -> f16 and f64 -> bf16 go through f32 first. That double rounding can
 *   differ from a direct rounding when the f64 value lies within half an f32 ulp of a 16-bit tie;
 *   we accept it because GPUs have no direct f64 -> bf16 instruction everywhere and the CPU must
 *   match the GPU.
 * - float -> integer truncates toward zero; NaN gives 0; values beyond the integer's range
 *   (including inf) saturate to its min/max. A plain C cast would be undefined behaviour there.
 * - integer -> float is the C conversion (round to nearest even); integer -> f16/bf16 goes
 *   through f32 (again a possible double rounding, only for |values| > 2^24).
 * - integer -> integer wraps modulo 2^bits (two's complement), as NumPy and PyTorch do.
 */
#ifndef SPCONV_TENSOR_CONVERT_H
#define SPCONV_TENSOR_CONVERT_H

#include <stdint.h>
#include <string.h>

#include "spconv/types.h"

#ifdef __CUDACC__
#define SPCONV_HD __host__ __device__
#else
#define SPCONV_HD
#endif

/* ---- bit casts (memcpy is the aliasing-safe way in C and C++, and nvcc supports it) -------- */

static inline SPCONV_HD uint32_t spconv__f32_bits(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

static inline SPCONV_HD float spconv__f32_from_bits(uint32_t bits) {
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* ---- binary16 ------------------------------------------------------------------------------ */

/* Round the f32 subnormal-range magnitude `abs_bits` (below 2^-14) to a binary16 subnormal. */
static inline SPCONV_HD uint16_t spconv__f32_to_f16_subnormal(uint32_t abs_bits) {
    if (abs_bits <= 0x33000000u) return 0; /* <= 2^-25: half of the smallest subnormal ties to 0 */
    uint32_t exponent = abs_bits >> 23;
    uint32_t mantissa = (abs_bits & 0x7FFFFFu) | 0x800000u;
    /* The value is mantissa * 2^(exponent - 150); in units of 2^-24 that is a shift right by
     * 126 - exponent, which lies in [14, 24] here. */
    uint32_t shift = 126u - exponent;
    uint32_t result = mantissa >> shift;
    uint32_t rest = mantissa & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (result & 1u))) ++result; /* may carry into 2^-14: fine */
    return (uint16_t)result;
}

static inline SPCONV_HD uint16_t spconv__f32_to_f16(float value) {
    uint32_t bits = spconv__f32_bits(value);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    uint32_t abs_bits = bits & 0x7FFFFFFFu;
    if (abs_bits > 0x7F800000u) /* NaN: keep the top payload bits, force the quiet bit */
        return (uint16_t)(sign | 0x7E00u | ((abs_bits >> 13) & 0x3FFu));
    if (abs_bits >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* >= 65520 rounds to inf */
    if (abs_bits < 0x38800000u) return (uint16_t)(sign | spconv__f32_to_f16_subnormal(abs_bits));
    /* Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even; a
     * carry out of the mantissa correctly bumps the exponent. */
    uint32_t rounded = abs_bits - 0x38000000u + 0x0FFFu + ((abs_bits >> 13) & 1u);
    return (uint16_t)(sign | (rounded >> 13));
}

static inline SPCONV_HD float spconv__f16_to_f32(uint16_t half) {
    uint32_t sign = (uint32_t)(half & 0x8000u) << 16;
    uint32_t exponent = (half >> 10) & 0x1Fu;
    uint32_t mantissa = half & 0x3FFu;
    if (exponent == 0x1Fu) return spconv__f32_from_bits(sign | 0x7F800000u | (mantissa << 13));
    if (exponent != 0) return spconv__f32_from_bits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
    if (mantissa == 0) return spconv__f32_from_bits(sign);
    /* Subnormal half: normalise, since every half subnormal is a normal f32. */
    uint32_t f32_exponent = 113u;
    while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        --f32_exponent;
    }
    return spconv__f32_from_bits(sign | (f32_exponent << 23) | ((mantissa & 0x3FFu) << 13));
}

/* ---- bfloat16 ------------------------------------------------------------------------------ */

static inline SPCONV_HD uint16_t spconv__f32_to_bf16(float value) {
    uint32_t bits = spconv__f32_bits(value);
    /* Rounding could carry a NaN's payload into inf; keep it NaN by forcing the quiet bit. */
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((bits >> 16) | 0x0040u);
    return (uint16_t)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

static inline SPCONV_HD float spconv__bf16_to_f32(uint16_t bits) {
    return spconv__f32_from_bits((uint32_t)bits << 16);
}

/* ---- f32 <-> f64 -------------------------------------------------------------------------- */

/* NaNs are converted bit by bit, as x86 does (quiet bit set, sign and top payload bits kept):
 * a plain C conversion of a NaN gives different bits depending on the optimiser (constant folding
 * keeps a signalling NaN) and the hardware (NVIDIA GPUs produce one canonical NaN), and both
 * backends must agree bit for bit. Other values convert exactly (f32 -> f64) or round to nearest
 * even (f64 -> f32), which IEEE fixes. */

static inline SPCONV_HD double spconv__f32_to_f64(float value) {
    uint32_t bits = spconv__f32_bits(value);
    if ((bits & 0x7FFFFFFFu) <= 0x7F800000u) return (double)value;
    uint64_t wide = ((uint64_t)(bits & 0x80000000u) << 32) | 0x7FF8000000000000ull |
                    ((uint64_t)(bits & 0x3FFFFFu) << 29);
    double result;
    memcpy(&result, &wide, sizeof result);
    return result;
}

static inline SPCONV_HD float spconv__f64_to_f32(double value) {
    uint64_t bits;
    memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7FFFFFFFFFFFFFFFull) <= 0x7FF0000000000000ull) return (float)value;
    uint32_t narrow = (uint32_t)((bits >> 32) & 0x80000000u) | 0x7FC00000u |
                      (uint32_t)((bits >> 29) & 0x3FFFFFu);
    return spconv__f32_from_bits(narrow);
}

/* ---- float -> integer: truncate, NaN -> 0, saturate ---------------------------------------- */

static inline SPCONV_HD int32_t spconv__f64_to_i32(double value) {
    if (value != value) return 0;
    if (value >= 2147483648.0) return INT32_MAX;
    if (value <= -2147483649.0) return INT32_MIN;
    return (int32_t)value;
}

static inline SPCONV_HD int64_t spconv__f64_to_i64(double value) {
    if (value != value) return 0;
    if (value >= 9223372036854775808.0) return INT64_MAX;
    if (value < -9223372036854775808.0) return INT64_MIN;
    return (int64_t)value;
}

static inline SPCONV_HD uint8_t spconv__f64_to_u8(double value) {
    if (value != value) return 0;
    if (value >= 256.0) return 255;
    if (value <= -1.0) return 0;
    return (uint8_t)value;
}

/* ---- integer -> integer: modulo 2^bits ------------------------------------------------------ */

static inline SPCONV_HD int32_t spconv__i64_to_i32(int64_t value) {
    /* Converting an out-of-range unsigned value to a signed type is implementation-defined in C,
     * so map the upper half of uint32 onto the negatives by hand. */
    uint32_t low = (uint32_t)(uint64_t)value;
    return low <= 0x7FFFFFFFu ? (int32_t)low : (int32_t)(low - 0x80000000u) + INT32_MIN;
}

/* ---- loads and stores of one element of any dtype ------------------------------------------- */

/* Value of a floating element (exact: every f16/bf16/f32 value is a double). */
static inline SPCONV_HD double spconv__load_floating(const void *src, spconv_dtype dtype) {
    uint16_t h;
    float f;
    double d;
    switch (dtype) {
    case SPCONV_F16: memcpy(&h, src, sizeof h); return spconv__f32_to_f64(spconv__f16_to_f32(h));
    case SPCONV_BF16: memcpy(&h, src, sizeof h); return spconv__f32_to_f64(spconv__bf16_to_f32(h));
    case SPCONV_F32: memcpy(&f, src, sizeof f); return spconv__f32_to_f64(f);
    default: memcpy(&d, src, sizeof d); return d;
    }
}

/* Value of an integer element. */
static inline SPCONV_HD int64_t spconv__load_integer(const void *src, spconv_dtype dtype) {
    int32_t i;
    int64_t l;
    uint8_t u;
    switch (dtype) {
    case SPCONV_I32: memcpy(&i, src, sizeof i); return i;
    case SPCONV_U8: memcpy(&u, src, sizeof u); return u;
    default: memcpy(&l, src, sizeof l); return l;
    }
}

/* Store a value that came from a floating element (or a fill value). */
static inline SPCONV_HD void spconv__store_from_floating(void *dst, spconv_dtype dtype, double value) {
    uint16_t h;
    float f;
    int32_t i;
    int64_t l;
    uint8_t u;
    switch (dtype) {
    case SPCONV_F16: h = spconv__f32_to_f16(spconv__f64_to_f32(value)); memcpy(dst, &h, sizeof h); break;
    case SPCONV_BF16: h = spconv__f32_to_bf16(spconv__f64_to_f32(value)); memcpy(dst, &h, sizeof h); break;
    case SPCONV_F32: f = spconv__f64_to_f32(value); memcpy(dst, &f, sizeof f); break;
    case SPCONV_F64: memcpy(dst, &value, sizeof value); break;
    case SPCONV_I32: i = spconv__f64_to_i32(value); memcpy(dst, &i, sizeof i); break;
    case SPCONV_I64: l = spconv__f64_to_i64(value); memcpy(dst, &l, sizeof l); break;
    case SPCONV_U8: u = spconv__f64_to_u8(value); memcpy(dst, &u, sizeof u); break;
    }
}

/* Store a value that came from an integer element. */
static inline SPCONV_HD void spconv__store_from_integer(void *dst, spconv_dtype dtype, int64_t value) {
    uint16_t h;
    float f;
    double d;
    int32_t i;
    uint8_t u;
    switch (dtype) {
    case SPCONV_F16: h = spconv__f32_to_f16((float)value); memcpy(dst, &h, sizeof h); break;
    case SPCONV_BF16: h = spconv__f32_to_bf16((float)value); memcpy(dst, &h, sizeof h); break;
    case SPCONV_F32: f = (float)value; memcpy(dst, &f, sizeof f); break;
    case SPCONV_F64: d = (double)value; memcpy(dst, &d, sizeof d); break;
    case SPCONV_I32: i = spconv__i64_to_i32(value); memcpy(dst, &i, sizeof i); break;
    case SPCONV_I64: memcpy(dst, &value, sizeof value); break;
    case SPCONV_U8: u = (uint8_t)(uint64_t)value; memcpy(dst, &u, sizeof u); break;
    }
}

static inline SPCONV_HD int spconv__dtype_is_integer(spconv_dtype dtype) {
    return dtype == SPCONV_I32 || dtype == SPCONV_I64 || dtype == SPCONV_U8;
}

/* Convert one element of `src_dtype` at `src` into `dst_dtype` at `dst`, by the rules above.
 * Integers never pass through double, so i64 -> i64 and i64 -> f32 stay exact C conversions. */
static inline SPCONV_HD void spconv__convert_element(void *dst, spconv_dtype dst_dtype,
                                                     const void *src, spconv_dtype src_dtype) {
    if (spconv__dtype_is_integer(src_dtype))
        spconv__store_from_integer(dst, dst_dtype, spconv__load_integer(src, src_dtype));
    else
        spconv__store_from_floating(dst, dst_dtype, spconv__load_floating(src, src_dtype));
}

#endif /* SPCONV_TENSOR_CONVERT_H */
