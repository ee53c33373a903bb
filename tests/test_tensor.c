/* Tests of the tensor core: dtypes and 16-bit conversions, creation, reference counting, views,
 * copies across layouts and dtypes, printing, and every error path. Oracles are brute force:
 * every element is addressed from its multi-index and the strides, and compared with the value
 * the operation's definition gives. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "tensor/tensor_impl.h"

/* A pointer that no function may leave in *out after a failure. */
#define POISON ((spconv_tensor *)(uintptr_t)0x10)

/* Expect `expr` (which writes `out`) to fail with `expected` and a message containing
 * `substring`, leaving out NULL. */
#define CHECK_FAILS(out, expr, expected, substring)       \
    do {                                                  \
        (out) = POISON;                                   \
        SPCONV_ASSERT_FAILS(expr, expected, substring);   \
        assert_null(out);                                 \
    } while (0)

static const spconv_dtype all_dtypes[SPCONV_DTYPE_COUNT] = {
    SPCONV_F16, SPCONV_BF16, SPCONV_F32, SPCONV_F64, SPCONV_I32, SPCONV_I64, SPCONV_U8};

/* ---- element access written independently of the library's copy code --------------------- */

static double decode(const void *p, spconv_dtype dtype) {
    uint16_t h;
    float f;
    double d;
    int32_t i;
    int64_t l;
    uint8_t u;
    switch (dtype) {
    case SPCONV_F16: memcpy(&h, p, 2); return spconv_f16_to_f32(h);
    case SPCONV_BF16: memcpy(&h, p, 2); return spconv_bf16_to_f32(h);
    case SPCONV_F32: memcpy(&f, p, 4); return f;
    case SPCONV_F64: memcpy(&d, p, 8); return d;
    case SPCONV_I32: memcpy(&i, p, 4); return i;
    case SPCONV_I64: memcpy(&l, p, 8); return (double)l;
    case SPCONV_U8: memcpy(&u, p, 1); return u;
    }
    return NAN;
}

/* `value` must be representable in every dtype (a small non-negative integer). */
static void encode(void *p, spconv_dtype dtype, double value) {
    uint16_t h;
    float f = (float)value;
    int32_t i = (int32_t)value;
    int64_t l = (int64_t)value;
    uint8_t u = (uint8_t)value;
    switch (dtype) {
    case SPCONV_F16: h = spconv_f32_to_f16(f); memcpy(p, &h, 2); break;
    case SPCONV_BF16: h = spconv_f32_to_bf16(f); memcpy(p, &h, 2); break;
    case SPCONV_F32: memcpy(p, &f, 4); break;
    case SPCONV_F64: memcpy(p, &value, 8); break;
    case SPCONV_I32: memcpy(p, &i, 4); break;
    case SPCONV_I64: memcpy(p, &l, 8); break;
    case SPCONV_U8: memcpy(p, &u, 1); break;
    }
}

/* Address of element `index` computed from the public geometry. */
static char *element_ptr(const spconv_tensor *t, const int64_t *index) {
    int64_t offset = 0;
    for (int d = 0; d < spconv_tensor_ndim(t); ++d) offset += index[d] * spconv_tensor_stride(t, d);
    return (char *)spconv_tensor_data(t) + offset * (int64_t)spconv_dtype_size(spconv_tensor_dtype(t));
}

static double element(const spconv_tensor *t, const int64_t *index) {
    return decode(element_ptr(t, index), spconv_tensor_dtype(t));
}

/* Row-major odometer; 0 once every index has been visited. */
static int next_index(int ndim, const int64_t *sizes, int64_t *index) {
    for (int d = ndim - 1; d >= 0; --d) {
        if (++index[d] < sizes[d]) return 1;
        index[d] = 0;
    }
    return 0;
}

static void unravel(int64_t linear, int ndim, const int64_t *sizes, int64_t *index) {
    for (int d = ndim - 1; d >= 0; --d) {
        index[d] = linear % sizes[d];
        linear /= sizes[d];
    }
}

static int64_t ravel(int ndim, const int64_t *sizes, const int64_t *index) {
    int64_t linear = 0;
    for (int d = 0; d < ndim; ++d) linear = linear * sizes[d] + index[d];
    return linear;
}

/* A contiguous f64 CPU tensor whose element k (row-major) holds k. */
static spconv_tensor *iota(int ndim, const int64_t *sizes) {
    spconv_tensor *t = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_empty(spconv_cpu(), SPCONV_F64, ndim, sizes, &t));
    double *data = spconv_tensor_data(t);
    for (int64_t k = 0; k < spconv_tensor_numel(t); ++k) data[k] = (double)k;
    return t;
}

/* ============================================================================================= */
/* dtypes and conversions                                                                        */
/* ============================================================================================= */

static void test_dtype_properties(void **state) {
    (void)state;
    static const size_t sizes[] = {2, 2, 4, 8, 4, 8, 1};
    static const char *names[] = {"f16", "bf16", "f32", "f64", "i32", "i64", "u8"};
    static const int floating[] = {1, 1, 1, 1, 0, 0, 0};
    for (int i = 0; i < SPCONV_DTYPE_COUNT; ++i) {
        assert_int_equal(spconv_dtype_size(all_dtypes[i]), sizes[i]);
        assert_string_equal(spconv_dtype_name(all_dtypes[i]), names[i]);
        assert_int_equal(spconv_dtype_is_floating(all_dtypes[i]), floating[i]);
    }
    assert_int_equal(spconv_dtype_size((spconv_dtype)99), 0);
    assert_string_equal(spconv_dtype_name((spconv_dtype)99), "invalid");
    assert_int_equal(spconv_dtype_is_floating((spconv_dtype)-1), 0);
}

static float f32_from_bits(uint32_t bits) {
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static void test_f16_known_values(void **state) {
    (void)state;
    static const struct {
        float value;
        uint16_t bits;
    } cases[] = {
        {1.0f, 0x3C00},
        {-2.0f, 0xC000},
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {0.5f, 0x3800},
        {0.1f, 0x2E66},
        {65504.0f, 0x7BFF},            /* largest finite */
        {65519.0f, 0x7BFF},            /* below the tie: stays finite */
        {65520.0f, 0x7C00},            /* the tie with 65536 rounds to even: inf */
        {-65520.0f, 0xFC00},
        {1e10f, 0x7C00},
        {INFINITY, 0x7C00},
        {-INFINITY, 0xFC00},
        {0x1.0p-14f, 0x0400},          /* smallest normal */
        {0x1.0p-24f, 0x0001},          /* smallest subnormal */
        {0x1.0p-25f, 0x0000},          /* half of it ties to even: 0 */
        {0x1.8p-25f, 0x0001},          /* above the tie */
        {0x1.8p-24f, 0x0002},          /* 1.5 units ties to even: 2 */
        {0x1.4p-23f, 0x0002},          /* 2.5 units ties to even: 2 */
        {0x1.ffcp-15f, 0x0400},        /* 1023.5 units ties to even: the smallest normal */
        {0x1.0p-26f, 0x0000},
        {-0x1.0p-24f, 0x8001},
        {1.0f + 0x1.0p-11f, 0x3C00},   /* tie between 0x3C00 and 0x3C01: even */
        {1.0f + 0x1.8p-10f, 0x3C02},   /* tie between 0x3C01 and 0x3C02: even */
        {1.0f + 0x1.0p-11f + 0x1.0p-20f, 0x3C01}, /* just above a tie */
        {2049.0f, 0x6800},             /* integer tie: 2048 */
        {2051.0f, 0x6802},             /* integer tie: 2052 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        if (spconv_f32_to_f16(cases[i].value) != cases[i].bits)
            fail_msg("f16(%a) = 0x%04X, expected 0x%04X", (double)cases[i].value,
                     spconv_f32_to_f16(cases[i].value), cases[i].bits);
    }
    assert_true(spconv_f16_to_f32(0x0001) == 0x1.0p-24f);
    assert_true(spconv_f16_to_f32(0x03FF) == 1023.0f * 0x1.0p-24f);
    assert_true(spconv_f16_to_f32(0x7BFF) == 65504.0f);
    assert_true(spconv_f16_to_f32(0x7C00) == INFINITY);
    assert_true(spconv_f16_to_f32(0xFC00) == -INFINITY);
    assert_true(signbit(spconv_f16_to_f32(0x8000)) && spconv_f16_to_f32(0x8000) == 0.0f);
}

static void test_f16_nan(void **state) {
    (void)state;
    static const uint32_t nans[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x7FBFFFFFu, 0x7F802000u};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; ++i) {
        uint16_t h = spconv_f32_to_f16(f32_from_bits(nans[i]));
        assert_int_equal(h & 0x7C00, 0x7C00);
        assert_true((h & 0x03FF) != 0);
        assert_int_equal(h & 0x8000, (nans[i] >> 16) & 0x8000);
        assert_true(isnan(spconv_f16_to_f32(h)));
    }
    assert_true(isnan(spconv_f16_to_f32(0x7C01)));
    assert_true(isnan(spconv_f16_to_f32(0xFE00)));
}

/* Every binary16 value survives f16 -> f32 -> f16 (NaNs stay NaN). */
static void test_f16_round_trip_all(void **state) {
    (void)state;
    for (uint32_t h = 0; h <= 0xFFFF; ++h) {
        float f = spconv_f16_to_f32((uint16_t)h);
        int is_nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0;
        if (is_nan) {
            assert_true(isnan(f));
            assert_true(isnan(spconv_f16_to_f32(spconv_f32_to_f16(f))));
        } else if (spconv_f32_to_f16(f) != h) {
            fail_msg("0x%04X -> %a -> 0x%04X", h, (double)f, spconv_f32_to_f16(f));
        }
    }
}

/* Each element of @p n values of @p src_dtype at @p data (every other slot of a 2n buffer, so
 * that a strided view exists), converted to @p dst_dtype both through a contiguous tensor (the
 * CPU backend's typed, threaded path) and through a strided view (its element-wise path): the
 * same bits. */
static void expect_paths_agree(spconv_dtype src_dtype, spconv_dtype dst_dtype, void *data,
                               int64_t n) {
    const size_t element = spconv_dtype_size(src_dtype);
    char *packed = malloc((size_t)n * element);
    assert_non_null(packed);
    for (int64_t i = 0; i < n; ++i)
        memcpy(packed + (size_t)i * element, (char *)data + (size_t)(2 * i) * element, element);
    spconv_tensor *contiguous = NULL, *strided = NULL, *a = NULL, *b = NULL;
    const int64_t stride = 2;
    SPCONV_ASSERT_OK(spconv_tensor_wrap(spconv_cpu(), src_dtype, 1, &n, NULL, packed, NULL, NULL,
                                        &contiguous));
    SPCONV_ASSERT_OK(spconv_tensor_wrap(spconv_cpu(), src_dtype, 1, &n, &stride, data, NULL, NULL,
                                        &strided));
    assert_false(spconv_tensor_is_contiguous(strided));
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, contiguous, dst_dtype, &a));
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, strided, dst_dtype, &b));
    const size_t out = spconv_dtype_size(dst_dtype);
    for (int64_t i = 0; i < n; ++i)
        if (memcmp((char *)spconv_tensor_data(a) + (size_t)i * out,
                   (char *)spconv_tensor_data(b) + (size_t)i * out, out) != 0)
            fail_msg("%s -> %s: element %lld differs between the paths", spconv_dtype_name(src_dtype),
                     spconv_dtype_name(dst_dtype), (long long)i);
    spconv_tensor *all[] = {contiguous, strided, a, b};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) spconv_tensor_release(all[i]);
    free(packed);
}

/* Every 16-bit pattern to f32, and 2^20 + 5 random f32 patterns plus the edges to f16 and bf16
 * (on x86 machines with F16C, through those instructions for f16). */
static void test_contiguous_conversions_match_elementwise(void **state) {
    (void)state;
    uint16_t *halves = malloc(2 * 65536 * sizeof *halves);
    assert_non_null(halves);
    for (uint32_t h = 0; h <= 0xFFFF; ++h) halves[2 * h] = (uint16_t)h, halves[2 * h + 1] = 0;
    expect_paths_agree(SPCONV_F16, SPCONV_F32, halves, 65536);
    expect_paths_agree(SPCONV_BF16, SPCONV_F32, halves, 65536);
    /* a count that is no multiple of 8: the vector path's scalar tail too */
    expect_paths_agree(SPCONV_F16, SPCONV_F32, halves + 2 * 31744, 65536 - 31744 - 3);
    free(halves);
    const int64_t n = ((int64_t)1 << 20) + 5;
    uint32_t *bits = malloc((size_t)(2 * n) * sizeof *bits);
    assert_non_null(bits);
    const uint32_t edges[] = {0u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x7F800001u,
                              0x477FEFFFu, 0x477FF000u, 0x33000000u, 0x33000001u, 0x387FFFFFu,
                              0x38800000u, 0x7F7FFFFFu, 0x00000001u};
    for (int64_t i = 0; i < n; ++i) {
        bits[2 * i] = i < (int64_t)(sizeof edges / sizeof edges[0])
                          ? edges[i]
                          : (uint32_t)spconv_test_rand_u64();
        bits[2 * i + 1] = 0;
    }
    expect_paths_agree(SPCONV_F32, SPCONV_F16, bits, n);
    expect_paths_agree(SPCONV_F32, SPCONV_BF16, bits, n);
    free(bits);
}

/* Exact value of a finite f16 in double, decoded from the bits (independently of the library). */
static double f16_exact(uint16_t h) {
    int exponent = (h >> 10) & 0x1F;
    double mantissa = h & 0x3FF;
    double magnitude = exponent == 0 ? ldexp(mantissa, -24) : ldexp(1024 + mantissa, exponent - 25);
    return (h & 0x8000) ? -magnitude : magnitude;
}

/* Random floats round to the nearest f16 (ties to even): no neighbour is closer. */
static void test_f16_rounding_random(void **state) {
    (void)state;
    for (int trial = 0; trial < 200000; ++trial) {
        float x = ldexpf(spconv_test_rand_float(1.0f, 2.0f), (int)spconv_test_rand_int(-27, 15));
        if (trial & 1) x = -x;
        uint16_t h = spconv_f32_to_f16(x);
        uint16_t magnitude = h & 0x7FFF;
        if (magnitude == 0x7C00) { /* inf only at or beyond the tie above 65504 */
            assert_true(fabs((double)x) >= 65520.0);
            continue;
        }
        double error = fabs(f16_exact(h) - (double)x);
        for (int delta = -1; delta <= 1; delta += 2) {
            int neighbour = magnitude + delta;
            if (neighbour < 0 || neighbour >= 0x7C00) continue;
            double other = fabs(f16_exact((uint16_t)((h & 0x8000) | neighbour)) - (double)x);
            if (other < error || (other == error && (magnitude & 1)))
                fail_msg("f16(%a) = 0x%04X but 0x%04X is nearer or even", (double)x, h, neighbour);
        }
    }
}

static void test_bf16_known_values(void **state) {
    (void)state;
    static const struct {
        uint32_t f32_bits;
        uint16_t bits;
    } cases[] = {
        {0x3F800000u, 0x3F80},       /* 1.0 */
        {0x3F808000u, 0x3F80},       /* 1.00390625: tie, even stays */
        {0x3F818000u, 0x3F82},       /* 1.01171875: tie, rounds up to even */
        {0x3F808001u, 0x3F81},       /* just above the tie */
        {0x3F810000u, 0x3F81},       /* 1.0078125: exact */
        {0xC0490FDBu, 0xC049},       /* -pi */
        {0x7F7FFFFFu, 0x7F80},       /* FLT_MAX rounds to inf */
        {0x7F7F7FFFu, 0x7F7F},
        {0x7F800000u, 0x7F80},       /* inf */
        {0xFF800000u, 0xFF80},
        {0x00010000u, 0x0001},       /* subnormal */
        {0x00008000u, 0x0000},       /* subnormal tie to even */
        {0x80000000u, 0x8000},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        uint16_t got = spconv_f32_to_bf16(f32_from_bits(cases[i].f32_bits));
        if (got != cases[i].bits)
            fail_msg("bf16(0x%08X) = 0x%04X, expected 0x%04X", cases[i].f32_bits, got, cases[i].bits);
    }
    /* A NaN whose payload lies only in the dropped bits must not become inf. */
    uint16_t nan_bits = spconv_f32_to_bf16(f32_from_bits(0x7F800001u));
    assert_true(isnan(spconv_bf16_to_f32(nan_bits)));
    assert_true(isnan(spconv_bf16_to_f32(spconv_f32_to_bf16(NAN))));
    for (uint32_t b = 0; b <= 0xFFFF; ++b) {
        float f = spconv_bf16_to_f32((uint16_t)b);
        if (isnan(f))
            assert_true(isnan(spconv_bf16_to_f32(spconv_f32_to_bf16(f))));
        else
            assert_int_equal(spconv_f32_to_bf16(f), b);
    }
}

/* Copy a 1-d f64 tensor holding `values` into `dtype` and read the results back as f64. */
static void convert_values(const double *values, int64_t n, spconv_dtype from, spconv_dtype to,
                           void *out, size_t out_bytes) {
    spconv_tensor *src = NULL, *dst = NULL, *typed = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_F64, 1, &n, values, &src));
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, src, from, &typed));
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, typed, to, &dst));
    SPCONV_ASSERT_OK(spconv_tensor_copy_to_host(NULL, dst, out, out_bytes));
    spconv_tensor_release(src);
    spconv_tensor_release(typed);
    spconv_tensor_release(dst);
}

static void test_float_to_integer_rules(void **state) {
    (void)state;
    const double in[] = {NAN, INFINITY, -INFINITY, 3.7, -3.7, 2147483647.9, 2147483648.0,
                         -2147483648.9, -2147483649.0, 1e300, -0.9, 255.9, 256.0, -1.0};
    const int64_t n = sizeof in / sizeof in[0];
    int32_t i32[14];
    int64_t i64[14];
    uint8_t u8[14];
    convert_values(in, n, SPCONV_F64, SPCONV_I32, i32, sizeof i32);
    convert_values(in, n, SPCONV_F64, SPCONV_I64, i64, sizeof i64);
    convert_values(in, n, SPCONV_F64, SPCONV_U8, u8, sizeof u8);
    const int32_t want32[] = {0, INT32_MAX, INT32_MIN, 3, -3, INT32_MAX, INT32_MAX,
                              INT32_MIN, INT32_MIN, INT32_MAX, 0, 255, 256, -1};
    const int64_t want64[] = {0, INT64_MAX, INT64_MIN, 3, -3, 2147483647, 2147483648,
                              -2147483648, -2147483649, INT64_MAX, 0, 255, 256, -1};
    const uint8_t want8[] = {0, 255, 0, 3, 0, 255, 255, 0, 0, 255, 0, 255, 255, 0};
    for (int64_t k = 0; k < n; ++k) {
        assert_int_equal(i32[k], want32[k]);
        assert_true(i64[k] == want64[k]);
        assert_int_equal(u8[k], want8[k]);
    }
    /* f32 sources follow the same rules (f32 -> double is exact). */
    const double from_f32[] = {NAN, 3e9, -3e9, -7.5};
    int32_t out32[4];
    convert_values(from_f32, 4, SPCONV_F32, SPCONV_I32, out32, sizeof out32);
    assert_int_equal(out32[0], 0);
    assert_int_equal(out32[1], INT32_MAX);
    assert_int_equal(out32[2], INT32_MIN);
    assert_int_equal(out32[3], -7);
}

static void test_integer_rules(void **state) {
    (void)state;
    const int64_t values[] = {((int64_t)1 << 32) + 5, (int64_t)1 << 31, -1, 300,
                              ((int64_t)1 << 53) + 1, INT64_MIN};
    const int64_t n = 6;
    spconv_tensor *src = NULL, *dst = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_I64, 1, &n, values, &src));
    int32_t i32[6];
    uint8_t u8[6];
    float f32[6];
    double f64[6];
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, src, SPCONV_I32, &dst));
    SPCONV_ASSERT_OK(spconv_tensor_copy_to_host(NULL, dst, i32, sizeof i32));
    spconv_tensor_release(dst);
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, src, SPCONV_U8, &dst));
    SPCONV_ASSERT_OK(spconv_tensor_copy_to_host(NULL, dst, u8, sizeof u8));
    spconv_tensor_release(dst);
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, src, SPCONV_F32, &dst));
    SPCONV_ASSERT_OK(spconv_tensor_copy_to_host(NULL, dst, f32, sizeof f32));
    spconv_tensor_release(dst);
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, src, SPCONV_F64, &dst));
    SPCONV_ASSERT_OK(spconv_tensor_copy_to_host(NULL, dst, f64, sizeof f64));
    spconv_tensor_release(dst);
    spconv_tensor_release(src);
    /* integer -> integer wraps modulo 2^bits */
    const int32_t want32[] = {5, INT32_MIN, -1, 300, 1, 0};
    const uint8_t want8[] = {5, 0, 255, 44, 1, 0};
    for (int k = 0; k < 6; ++k) {
        assert_int_equal(i32[k], want32[k]);
        assert_int_equal(u8[k], want8[k]);
        /* integer -> float is C's conversion */
        assert_true(f32[k] == (float)values[k]);
        assert_true(f64[k] == (double)values[k]);
    }
}

static void test_double_rounding_through_f32(void **state) {
    (void)state;
    /* Just above an f16 tie: a direct rounding would give 0x3C01, but f64 -> f32 first lands on
     * the tie itself, which rounds to even. This is the documented rule (convert.h). */
    const double in[] = {1.0 + 0x1.0p-11 + 0x1.0p-40, 1.0 + 0x1.0p-8 + 0x1.0p-40};
    uint16_t half[2], brain[2];
    convert_values(in, 2, SPCONV_F64, SPCONV_F16, half, sizeof half);
    convert_values(in, 2, SPCONV_F64, SPCONV_BF16, brain, sizeof brain);
    assert_int_equal(half[0], 0x3C00);
    assert_int_equal(brain[1], 0x3F80);
}

/* ============================================================================================= */
/* storages and creation                                                                         */
/* ============================================================================================= */

static void test_storage_create(void **state) {
    (void)state;
    spconv_storage *s = NULL;
    SPCONV_ASSERT_OK(spconv_storage_create(spconv_cpu(), 1000, &s));
    assert_non_null(spconv_storage_data(s));
    assert_int_equal((uintptr_t)spconv_storage_data(s) % 64, 0);
    assert_int_equal(spconv_storage_nbytes(s), 1000);
    assert_true(spconv_device_equal(spconv_storage_device(s), spconv_cpu()));
    memset(spconv_storage_data(s), 0xAB, 1000);
    spconv_storage_release(s);
    SPCONV_ASSERT_OK(spconv_storage_create(spconv_cpu(), 0, &s));
    assert_int_equal(spconv_storage_nbytes(s), 0);
    spconv_storage_release(s);
    spconv_storage_release(NULL);
    spconv_storage_retain(NULL);
}

static void test_empty_geometry(void **state) {
    (void)state;
    spconv_tensor *t = NULL;
    const int64_t sizes[] = {2, 3, 4};
    SPCONV_ASSERT_OK(spconv_tensor_empty(spconv_cpu(), SPCONV_F32, 3, sizes, &t));
    assert_int_equal(spconv_tensor_ndim(t), 3);
    assert_int_equal(spconv_tensor_numel(t), 24);
    assert_int_equal(spconv_tensor_stride(t, 0), 12);
    assert_int_equal(spconv_tensor_stride(t, 1), 4);
    assert_int_equal(spconv_tensor_stride(t, -1), 1);
    assert_int_equal(spconv_tensor_size(t, -3), 2);
    assert_int_equal(spconv_tensor_size(t, 3), 0);
    assert_int_equal(spconv_tensor_size(t, -4), 0);
    assert_int_equal(spconv_tensor_stride(t, 7), 0);
    assert_memory_equal(spconv_tensor_sizes(t), sizes, sizeof sizes);
    assert_int_equal(spconv_tensor_offset(t), 0);
    assert_int_equal(spconv_tensor_dtype(t), SPCONV_F32);
    assert_true(spconv_tensor_is_contiguous(t));
    assert_true(spconv_device_equal(spconv_tensor_device(t), spconv_cpu()));
    assert_ptr_equal(spconv_tensor_data(t), spconv_storage_data(spconv_tensor_storage(t)));
    assert_int_equal(spconv_storage_nbytes(spconv_tensor_storage(t)), 96);
    assert_int_equal((uintptr_t)spconv_tensor_data(t) % 64, 0);
    spconv_tensor_release(t);

    /* a scalar */
    SPCONV_ASSERT_OK(spconv_tensor_empty(spconv_cpu(), SPCONV_I64, 0, NULL, &t));
    assert_int_equal(spconv_tensor_ndim(t), 0);
    assert_int_equal(spconv_tensor_numel(t), 1);
    assert_true(spconv_tensor_is_contiguous(t));
    spconv_tensor_release(t);

    /* empty: numel 0, strides still distinct */
    const int64_t empty_sizes[] = {3, 0, 2};
    SPCONV_ASSERT_OK(spconv_tensor_empty(spconv_cpu(), SPCONV_U8, 3, empty_sizes, &t));
    assert_int_equal(spconv_tensor_numel(t), 0);
    assert_int_equal(spconv_tensor_stride(t, 0), 2);
    assert_int_equal(spconv_tensor_stride(t, 1), 2);
    assert_true(spconv_tensor_is_contiguous(t));
    spconv_tensor_release(t);
}

static void test_zeros_full(void **state) {
    (void)state;
    const int64_t sizes[] = {3, 5};
    for (int i = 0; i < SPCONV_DTYPE_COUNT; ++i) {
        spconv_tensor *z = NULL, *f = NULL;
        SPCONV_ASSERT_OK(spconv_tensor_zeros(NULL, spconv_cpu(), all_dtypes[i], 2, sizes, &z));
        SPCONV_ASSERT_OK(spconv_tensor_full(NULL, spconv_cpu(), all_dtypes[i], 2, sizes, 7.0, &f));
        int64_t index[2] = {0, 0};
        do {
            assert_true(element(z, index) == 0.0);
            assert_true(element(f, index) == 7.0);
        } while (next_index(2, sizes, index));
        spconv_tensor_release(z);
        spconv_tensor_release(f);
    }
    spconv_tensor *t = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_full(NULL, spconv_cpu(), SPCONV_I32, 1, sizes, -3.9, &t));
    assert_int_equal(((int32_t *)spconv_tensor_data(t))[2], -3);
    spconv_tensor_release(t);
    SPCONV_ASSERT_OK(spconv_tensor_full(NULL, spconv_cpu(), SPCONV_U8, 1, sizes, -5.0, &t));
    assert_int_equal(((uint8_t *)spconv_tensor_data(t))[0], 0);
    spconv_tensor_release(t);
    SPCONV_ASSERT_OK(spconv_tensor_full(NULL, spconv_cpu(), SPCONV_F16, 1, sizes, 1.0, &t));
    assert_int_equal(((uint16_t *)spconv_tensor_data(t))[2], 0x3C00);
    spconv_tensor_release(t);
    SPCONV_ASSERT_OK(spconv_tensor_zeros(NULL, spconv_cpu(), SPCONV_F32, 0, NULL, &t));
    assert_true(*(float *)spconv_tensor_data(t) == 0.0f);
    spconv_tensor_release(t);
}

static void check_arange(spconv_dtype dtype, int64_t start, int64_t end, int64_t step,
                         int64_t expected_length) {
    spconv_tensor *t = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_arange(NULL, spconv_cpu(), dtype, start, end, step, &t));
    assert_int_equal(spconv_tensor_ndim(t), 1);
    assert_int_equal(spconv_tensor_numel(t), expected_length);
    int64_t expected = start;
    for (int64_t i = 0; i < expected_length; ++i) {
        if (dtype == SPCONV_I64)
            assert_true(((int64_t *)spconv_tensor_data(t))[i] == expected);
        else
            assert_true(element(t, &i) == (double)expected);
        if (i + 1 < expected_length) expected += step;
    }
    spconv_tensor_release(t);
}

static void test_arange(void **state) {
    (void)state;
    check_arange(SPCONV_I64, 0, 10, 1, 10);
    check_arange(SPCONV_I64, 0, 10, 3, 4);
    check_arange(SPCONV_I32, 10, 0, -3, 4);
    check_arange(SPCONV_F32, -5, 5, 2, 5);
    check_arange(SPCONV_F16, 7, -8, -1, 15);
    check_arange(SPCONV_I64, 5, 5, 1, 0);
    check_arange(SPCONV_I64, 5, 0, 1, 0);
    check_arange(SPCONV_I64, 0, 5, -1, 0);
    check_arange(SPCONV_I64, INT64_MAX - 2, INT64_MAX, 1, 2);
    check_arange(SPCONV_I64, INT64_MIN, INT64_MAX, INT64_MAX, 3);
    check_arange(SPCONV_I64, INT64_MAX, INT64_MIN, INT64_MIN, 2);
    spconv_tensor *t;
    CHECK_FAILS(t, spconv_tensor_arange(NULL, spconv_cpu(), SPCONV_I64, 0, 10, 0, &t),
                SPCONV_ERR_INVALID_ARGUMENT, "spconv_tensor_arange: step is 0");
    CHECK_FAILS(t, spconv_tensor_arange(NULL, spconv_cpu(), SPCONV_I64, INT64_MIN, INT64_MAX, 1, &t),
                SPCONV_ERR_OVERFLOW, "overflow int64");
    CHECK_FAILS(t, spconv_tensor_arange(NULL, spconv_cpu(), SPCONV_I64, 0, INT64_MAX, 1, &t),
                SPCONV_ERR_OVERFLOW, "more than 2^63 bytes");
    CHECK_FAILS(t, spconv_tensor_arange(NULL, spconv_cpu(), (spconv_dtype)9, 0, 3, 1, &t),
                SPCONV_ERR_INVALID_ARGUMENT, "dtype 9 is not a spconv_dtype");
    SPCONV_ASSERT_FAILS(spconv_tensor_arange(NULL, spconv_cpu(), SPCONV_I64, 0, 3, 1, NULL),
                        SPCONV_ERR_NULL_POINTER, "'out' is NULL");
}

static void test_from_host(void **state) {
    (void)state;
    float host[6] = {1, 2, 3, 4, 5, 6};
    const int64_t sizes[] = {2, 3};
    spconv_tensor *t = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_F32, 2, sizes, host, &t));
    host[0] = 100.0f; /* the tensor holds a copy */
    assert_true(((float *)spconv_tensor_data(t))[0] == 1.0f);
    assert_true(((float *)spconv_tensor_data(t))[5] == 6.0f);
    spconv_tensor_release(t);
    const int64_t empty[] = {0, 3};
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_F32, 2, empty, NULL, &t));
    assert_int_equal(spconv_tensor_numel(t), 0);
    spconv_tensor_release(t);
    CHECK_FAILS(t, spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_F32, 2, sizes, NULL, &t),
                SPCONV_ERR_NULL_POINTER, "spconv_tensor_from_host: 'host_data' is NULL for 6 elements");
}

typedef struct deleter_log {
    int calls;
    void *data;
} deleter_log;

static void count_deleter(void *data, void *user) {
    deleter_log *log = user;
    log->calls++;
    log->data = data;
}

static void test_wrap(void **state) {
    (void)state;
    double memory[12];
    for (int i = 0; i < 12; ++i) memory[i] = i;
    deleter_log log = {0, NULL};
    const int64_t sizes[] = {3, 2};
    const int64_t strides[] = {4, 2};
    spconv_tensor *t = NULL, *view = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_wrap(spconv_cpu(), SPCONV_F64, 2, sizes, strides, memory,
                                        count_deleter, &log, &t));
    assert_false(spconv_tensor_is_contiguous(t));
    assert_int_equal(spconv_storage_nbytes(spconv_tensor_storage(t)), 11 * sizeof(double));
    int64_t index[2] = {2, 1};
    assert_true(element(t, index) == 10.0);
    SPCONV_ASSERT_OK(spconv_tensor_select(t, 0, 1, &view));
    spconv_tensor_release(t);
    assert_int_equal(log.calls, 0); /* the view still holds the storage */
    int64_t one = 1;
    assert_true(element(view, &one) == 6.0);
    spconv_tensor_release(view);
    assert_int_equal(log.calls, 1);
    assert_ptr_equal(log.data, memory);

    /* contiguous strides by default, no deleter */
    SPCONV_ASSERT_OK(spconv_tensor_wrap(spconv_cpu(), SPCONV_F64, 2, sizes, NULL, memory, NULL, NULL, &t));
    assert_true(spconv_tensor_is_contiguous(t));
    assert_ptr_equal(spconv_tensor_data(t), memory);
    spconv_tensor_release(t);

    /* failures never call the deleter: the caller still owns the memory */
    const int64_t negative[] = {4, -1};
    CHECK_FAILS(t, spconv_tensor_wrap(spconv_cpu(), SPCONV_F64, 2, sizes, negative, memory,
                                      count_deleter, &log, &t),
                SPCONV_ERR_INVALID_ARGUMENT, "spconv_tensor_wrap: strides[1] = -1 is negative");
    CHECK_FAILS(t, spconv_tensor_wrap(spconv_cpu(), SPCONV_F64, 2, sizes, NULL, NULL,
                                      count_deleter, &log, &t),
                SPCONV_ERR_NULL_POINTER, "spconv_tensor_wrap: 'data' is NULL");
    if (spconv_cuda_device_count() == 0)
        CHECK_FAILS(t, spconv_tensor_wrap(spconv_cuda(0), SPCONV_F64, 2, sizes, NULL, memory,
                                          count_deleter, &log, &t),
                    SPCONV_ERR_NO_DEVICE, "spconv_tensor_wrap: ");
    const int64_t huge_sizes[] = {3, 3};
    const int64_t huge_strides[] = {INT64_MAX / 2, INT64_MAX / 2};
    CHECK_FAILS(t, spconv_tensor_wrap(spconv_cpu(), SPCONV_U8, 2, huge_sizes, huge_strides, memory,
                                      count_deleter, &log, &t),
                SPCONV_ERR_OVERFLOW, "reach past element 2^63");
    assert_int_equal(log.calls, 1);
}

static void test_from_storage(void **state) {
    (void)state;
    spconv_storage *s = NULL;
    SPCONV_ASSERT_OK(spconv_storage_create(spconv_cpu(), 10 * sizeof(float), &s));
    spconv_tensor *t = NULL;
    const int64_t sizes[] = {2, 3};
    const int64_t strides[] = {4, 1};
    SPCONV_ASSERT_OK(spconv_tensor_from_storage(s, 3, SPCONV_F32, 2, sizes, strides, &t));
    assert_int_equal(spconv_tensor_offset(t), 3);
    assert_ptr_equal(spconv_tensor_data(t), (float *)spconv_storage_data(s) + 3);
    assert_ptr_equal(spconv_tensor_storage(t), s);
    spconv_storage_release(s); /* the tensor keeps it alive */
    ((float *)spconv_tensor_data(t))[6] = 1.5f;
    spconv_tensor_release(t);

    SPCONV_ASSERT_OK(spconv_storage_create(spconv_cpu(), 10 * sizeof(float), &s));
    /* exactly up to the last element */
    SPCONV_ASSERT_OK(spconv_tensor_from_storage(s, 4, SPCONV_F32, 2, sizes, NULL, &t));
    spconv_tensor_release(t);
    CHECK_FAILS(t, spconv_tensor_from_storage(s, 5, SPCONV_F32, 2, sizes, NULL, &t),
                SPCONV_ERR_OUT_OF_RANGE,
                "spconv_tensor_from_storage: sizes [2, 3] strides [3, 1] at offset 5 need 6 "
                "elements from the offset, but the storage holds 10 f32 elements (40 bytes)");
    CHECK_FAILS(t, spconv_tensor_from_storage(s, 0, SPCONV_F64, 2, sizes, NULL, &t),
                SPCONV_ERR_OUT_OF_RANGE, "holds 5 f64 elements");
    CHECK_FAILS(t, spconv_tensor_from_storage(s, -1, SPCONV_F32, 2, sizes, NULL, &t),
                SPCONV_ERR_OUT_OF_RANGE, "offset -1 is negative");
    /* empty views may sit at the end, not beyond it */
    const int64_t none[] = {0};
    SPCONV_ASSERT_OK(spconv_tensor_from_storage(s, 10, SPCONV_F32, 1, none, NULL, &t));
    spconv_tensor_release(t);
    CHECK_FAILS(t, spconv_tensor_from_storage(s, 11, SPCONV_F32, 1, none, NULL, &t),
                SPCONV_ERR_OUT_OF_RANGE, "at offset 11");
    CHECK_FAILS(t, spconv_tensor_from_storage(NULL, 0, SPCONV_F32, 2, sizes, NULL, &t),
                SPCONV_ERR_NULL_POINTER, "spconv_tensor_from_storage: 'storage' is NULL");
    const int64_t bad_strides[] = {-4, 1};
    CHECK_FAILS(t, spconv_tensor_from_storage(s, 0, SPCONV_F32, 2, sizes, bad_strides, &t),
                SPCONV_ERR_INVALID_ARGUMENT, "strides[0] = -4 is negative");
    spconv_storage_release(s);
}

static void test_refcount(void **state) {
    (void)state;
    const int64_t sizes[] = {4, 4};
    spconv_tensor *base = iota(2, sizes), *view = NULL, *view2 = NULL;
    spconv_storage *storage = spconv_tensor_storage(base);
    assert_int_equal(base->refcount, 1);
    assert_int_equal(storage->refcount, 1);
    SPCONV_ASSERT_OK(spconv_tensor_transpose(base, 0, 1, &view));
    assert_int_equal(storage->refcount, 2);
    assert_int_equal(base->refcount, 1); /* a view retains the storage, not the tensor */
    SPCONV_ASSERT_OK(spconv_tensor_narrow(view, 0, 1, 2, &view2));
    assert_ptr_equal(view2->storage, storage); /* a view of a view does not chain */
    assert_int_equal(storage->refcount, 3);
    spconv_tensor_retain(base);
    assert_int_equal(base->refcount, 2);
    spconv_tensor_release(base);
    spconv_tensor_release(base);
    assert_int_equal(storage->refcount, 2);
    spconv_tensor_release(view);
    int64_t index[2] = {1, 3};
    assert_true(element(view2, index) == 3 * 4 + 2); /* base[3][2] */
    spconv_tensor_release(view2);
    spconv_tensor_release(NULL);
    spconv_tensor_retain(NULL);
}

/* An allocator hook that counts what it hands out and takes back. */
typedef struct counted_hook {
    int allocs, frees;
} counted_hook;

static void *counted_alloc(size_t nbytes, spconv_device device, void *user) {
    (void)device;
    ((counted_hook *)user)->allocs++;
    return aligned_alloc(SPCONV_ALLOCATOR_ALIGNMENT,
                         (nbytes + SPCONV_ALLOCATOR_ALIGNMENT - 1) / SPCONV_ALLOCATOR_ALIGNMENT *
                             SPCONV_ALLOCATOR_ALIGNMENT);
}

static void counted_free(void *ptr, size_t nbytes, spconv_device device, void *user) {
    (void)nbytes;
    (void)device;
    ((counted_hook *)user)->frees++;
    free(ptr);
}

static void other_free(void *ptr, size_t nbytes, spconv_device device, void *user) {
    counted_free(ptr, nbytes, device, user);
}

/* spconv_tensor_take_memory hands a hook's memory over only when nothing else uses it and it is
 * that hook's; then the library never frees it, and on a refusal the tensor is as it was. */
static void test_take_memory(void **state) {
    (void)state;
    counted_hook hook = {0, 0};
    spconv_context *ctx = NULL;
    SPCONV_ASSERT_OK(spconv_context_create(spconv_cpu(), &ctx));
    SPCONV_ASSERT_OK(spconv_context_set_allocator(ctx, counted_alloc, counted_free, &hook));
    const int64_t sizes[] = {4, 5};
    spconv_tensor *t = NULL, *view = NULL, *own = NULL;
    void *data = NULL;
    size_t nbytes = 0;

    SPCONV_ASSERT_OK(spconv_tensor_zeros(ctx, spconv_cpu(), SPCONV_F32, 2, sizes, &t));
    assert_int_equal(hook.allocs, 1);
    void *first = spconv_tensor_data(t);
    SPCONV_ASSERT_OK(spconv_tensor_take_memory(t, counted_free, &hook, &data, &nbytes));
    assert_ptr_equal(data, first);
    assert_int_equal(nbytes, 20 * sizeof(float));
    assert_int_equal(hook.frees, 0); /* the tensor is gone, its memory is ours */
    assert_true(((float *)data)[19] == 0.0f);
    counted_free(data, nbytes, spconv_cpu(), &hook);

    SPCONV_ASSERT_OK(spconv_tensor_zeros(ctx, spconv_cpu(), SPCONV_F32, 2, sizes, &t));
    spconv_tensor_retain(t);
    SPCONV_ASSERT_FAILS(spconv_tensor_take_memory(t, counted_free, &hook, &data, &nbytes),
                        SPCONV_ERR_INVALID_ARGUMENT, "the tensor has 2 references");
    spconv_tensor_release(t);
    SPCONV_ASSERT_OK(spconv_tensor_select(t, 0, 1, &view));
    SPCONV_ASSERT_FAILS(spconv_tensor_take_memory(t, counted_free, &hook, &data, &nbytes),
                        SPCONV_ERR_INVALID_ARGUMENT, "storage is shared (2 references");
    SPCONV_ASSERT_FAILS(spconv_tensor_take_memory(view, counted_free, &hook, &data, &nbytes),
                        SPCONV_ERR_INVALID_ARGUMENT, "storage is shared");
    spconv_tensor_release(view);
    SPCONV_ASSERT_FAILS(spconv_tensor_take_memory(t, other_free, &hook, &data, &nbytes),
                        SPCONV_ERR_INVALID_ARGUMENT, "another hook");
    counted_hook stranger = {0, 0};
    SPCONV_ASSERT_FAILS(spconv_tensor_take_memory(t, counted_free, &stranger, &data, &nbytes),
                        SPCONV_ERR_INVALID_ARGUMENT, "other user data");
    SPCONV_ASSERT_FAILS(spconv_tensor_take_memory(NULL, counted_free, &hook, &data, &nbytes),
                        SPCONV_ERR_NULL_POINTER, "spconv_tensor_take_memory");
    SPCONV_ASSERT_FAILS(spconv_tensor_take_memory(t, NULL, &hook, &data, &nbytes),
                        SPCONV_ERR_NULL_POINTER, "spconv_tensor_take_memory");
    assert_int_equal(hook.frees, 1);
    spconv_tensor_release(t); /* refused: still the library's to free, through the hook */
    assert_int_equal(hook.frees, 2);

    SPCONV_ASSERT_OK(spconv_tensor_zeros(NULL, spconv_cpu(), SPCONV_F32, 2, sizes, &own));
    SPCONV_ASSERT_FAILS(spconv_tensor_take_memory(own, counted_free, &hook, &data, &nbytes),
                        SPCONV_ERR_INVALID_ARGUMENT, "is the library's own");
    spconv_tensor_release(own);
    float memory[20];
    SPCONV_ASSERT_OK(spconv_tensor_wrap(spconv_cpu(), SPCONV_F32, 2, sizes, NULL, memory, NULL,
                                        NULL, &own));
    SPCONV_ASSERT_FAILS(spconv_tensor_take_memory(own, counted_free, &hook, &data, &nbytes),
                        SPCONV_ERR_INVALID_ARGUMENT, "is wrapped caller memory");
    spconv_tensor_release(own);
    assert_int_equal(hook.allocs, 2);
    spconv_context_destroy(ctx);
}

static void test_out_of_memory(void **state) {
    (void)state;
    spconv_tensor *t;
    const int64_t huge[] = {(int64_t)1 << 62};
    CHECK_FAILS(t, spconv_tensor_empty(spconv_cpu(), SPCONV_U8, 1, huge, &t), SPCONV_ERR_OUT_OF_MEMORY,
                "spconv_tensor_empty: cannot allocate 4611686018427387904 bytes on the cpu backend "
                "(out of host memory: 4611686018427387904 bytes (4.29e+09 GiB) are more than this "
                "machine's memory and swap");
    CHECK_FAILS(t, spconv_tensor_zeros(NULL, spconv_cpu(), SPCONV_U8, 1, huge, &t),
                SPCONV_ERR_OUT_OF_MEMORY, "spconv_tensor_zeros: cannot allocate");
    spconv_storage *s = (spconv_storage *)POISON;
    SPCONV_ASSERT_FAILS(spconv_storage_create(spconv_cpu(), SIZE_MAX, &s), SPCONV_ERR_OUT_OF_MEMORY,
                        "spconv_storage_create: cannot allocate 18446744073709551615 bytes");
    assert_null(s);
}

/* ============================================================================================= */
/* views                                                                                         */
/* ============================================================================================= */

static void shuffle(int n, int *values) {
    for (int i = 0; i < n; ++i) values[i] = i;
    for (int i = n - 1; i > 0; --i) {
        int j = (int)spconv_test_rand_int(0, i), swap = values[i];
        values[i] = values[j];
        values[j] = swap;
    }
}

/* A view with `sizes` into a larger contiguous parent of `dtype`: dims permuted at random, each
 * with a random start and step. *parent receives the parent; the caller releases both. */
static spconv_tensor *strided_window(spconv_dtype dtype, int ndim, const int64_t *sizes,
                                     spconv_tensor **parent) {
    int perm[SPCONV_MAX_DIMS], dims[SPCONV_MAX_DIMS];
    int64_t parent_sizes[SPCONV_MAX_DIMS] = {0}, starts[SPCONV_MAX_DIMS] = {0}, steps[SPCONV_MAX_DIMS] = {0};
    shuffle(ndim, perm);
    for (int k = 0; k < ndim; ++k) {
        int64_t length = sizes[perm[k]];
        steps[k] = spconv_test_rand_int(1, 3);
        starts[k] = spconv_test_rand_int(0, 2);
        parent_sizes[k] = starts[k] + (length > 0 ? (length - 1) * steps[k] + 1 : 0) +
                          spconv_test_rand_int(0, 1);
        dims[perm[k]] = k;
    }
    SPCONV_ASSERT_OK(spconv_tensor_empty(spconv_cpu(), dtype, ndim, parent_sizes, parent));
    spconv_tensor *window = *parent, *next = NULL;
    spconv_tensor_retain(window);
    for (int k = 0; k < ndim; ++k) {
        int64_t length = sizes[perm[k]];
        int64_t end = starts[k] + (length > 0 ? (length - 1) * steps[k] + 1 : 0);
        SPCONV_ASSERT_OK(spconv_tensor_slice(window, k, starts[k], end, steps[k], &next));
        spconv_tensor_release(window);
        window = next;
    }
    SPCONV_ASSERT_OK(spconv_tensor_permute(window, dims, &next));
    spconv_tensor_release(window);
    for (int i = 0; i < ndim; ++i) assert_int_equal(spconv_tensor_size(next, i), sizes[i]);
    return next;
}

/* A random f64 tensor with distinct values: contiguous, or a strided window of a larger one. */
static spconv_tensor *random_base(int ndim, const int64_t *sizes) {
    if (spconv_test_rand_int(0, 1) == 0) return iota(ndim, sizes);
    spconv_tensor *parent = NULL;
    spconv_tensor *window = strided_window(SPCONV_F64, ndim, sizes, &parent);
    double *data = spconv_tensor_data(parent);
    for (int64_t k = 0; k < spconv_tensor_numel(parent); ++k) data[k] = (double)k;
    spconv_tensor_release(parent);
    return window;
}

typedef enum view_kind {
    VIEW_NARROW, VIEW_SLICE, VIEW_SELECT, VIEW_PERMUTE, VIEW_TRANSPOSE, VIEW_VIEW, VIEW_RESHAPE,
    VIEW_SQUEEZE, VIEW_UNSQUEEZE, VIEW_EXPAND, VIEW_KIND_COUNT
} view_kind;

/* A view operation, its parameters and (for the brute-force mapping) what it means. */
typedef struct view_spec {
    view_kind kind;
    int dim, dim1;
    int64_t start, end, step;   /* narrow: start, length in end; slice: as given */
    int dims[SPCONV_MAX_DIMS];  /* permute */
    int ndim;                   /* view, reshape, expand: requested sizes */
    int64_t sizes[SPCONV_MAX_DIMS];
} view_spec;

static int64_t python_bound(int64_t bound, int64_t size) {
    if (bound < 0) bound += size;
    return bound < 0 ? 0 : bound > size ? size : bound;
}

/* Base index that view index `v` reads, by the definition of each operation. */
static void map_view_index(const view_spec *spec, const spconv_tensor *base,
                           const spconv_tensor *view, const int64_t *v, int64_t *b) {
    int n = spconv_tensor_ndim(base);
    const int64_t *bs = spconv_tensor_sizes(base);
    switch (spec->kind) {
    case VIEW_NARROW:
    case VIEW_SLICE:
        for (int d = 0; d < n; ++d) b[d] = v[d];
        b[spec->dim] = spec->kind == VIEW_NARROW
                           ? v[spec->dim] + spec->start
                           : python_bound(spec->start, bs[spec->dim]) + v[spec->dim] * spec->step;
        break;
    case VIEW_SELECT:
        for (int d = 0, j = 0; d < n; ++d)
            b[d] = d == spec->dim ? (spec->start + bs[d]) % bs[d] : v[j++];
        break;
    case VIEW_PERMUTE:
        for (int i = 0; i < n; ++i) b[spec->dims[i]] = v[i];
        break;
    case VIEW_TRANSPOSE: {
        int d0 = (spec->dim + n) % n, d1 = (spec->dim1 + n) % n;
        for (int d = 0; d < n; ++d) b[d] = v[d];
        b[d0] = v[d1];
        b[d1] = v[d0];
        break;
    }
    case VIEW_VIEW:
    case VIEW_RESHAPE:
        unravel(ravel(spconv_tensor_ndim(view), spconv_tensor_sizes(view), v), n, bs, b);
        break;
    case VIEW_SQUEEZE:
        for (int d = 0, j = 0; d < n; ++d) {
            int removed = bs[d] == 1 && (spec->dim == SPCONV_ALL_DIMS || (spec->dim + n) % n == d);
            b[d] = removed ? 0 : v[j++];
        }
        break;
    case VIEW_UNSQUEEZE: {
        int at = spec->dim < 0 ? spec->dim + n + 1 : spec->dim;
        for (int i = 0, d = 0; i <= n; ++i)
            if (i != at) b[d++] = v[i];
        break;
    }
    case VIEW_EXPAND: {
        int lead = spec->ndim - n;
        for (int d = 0; d < n; ++d) b[d] = bs[d] == 1 ? 0 : v[d + lead];
        break;
    }
    case VIEW_KIND_COUNT: break;
    }
}

/* Random sizes with the given number of elements, sometimes with a -1 to infer. */
static int random_factorisation(int64_t numel, int64_t *sizes) {
    int ndim = (int)spconv_test_rand_int(1, 4);
    for (int d = 0; d < ndim; ++d) sizes[d] = 1;
    for (int64_t p = 2, rest = numel; rest > 1;) {
        if (rest % p != 0) {
            ++p;
            continue;
        }
        sizes[spconv_test_rand_int(0, ndim - 1)] *= p;
        rest /= p;
    }
    if (spconv_test_rand_int(0, 1)) sizes[spconv_test_rand_int(0, ndim - 1)] = -1;
    return ndim;
}

static void random_view_spec(const spconv_tensor *base, view_spec *spec) {
    int n = spconv_tensor_ndim(base);
    const int64_t *bs = spconv_tensor_sizes(base);
    memset(spec, 0, sizeof *spec);
    spec->kind = (view_kind)spconv_test_rand_int(0, VIEW_KIND_COUNT - 1);
    spec->dim = (int)spconv_test_rand_int(0, n - 1);
    int64_t size = bs[spec->dim];
    switch (spec->kind) {
    case VIEW_NARROW:
        spec->start = spconv_test_rand_int(0, size);
        spec->end = spconv_test_rand_int(0, size - spec->start);
        break;
    case VIEW_SLICE:
        spec->start = spconv_test_rand_int(-size - 2, size + 2);
        spec->end = spconv_test_rand_int(-size - 2, size + 2);
        spec->step = spconv_test_rand_int(1, 3);
        break;
    case VIEW_SELECT: spec->start = spconv_test_rand_int(-size, size - 1); break;
    case VIEW_PERMUTE: shuffle(n, spec->dims); break;
    case VIEW_TRANSPOSE:
        spec->dim -= (int)spconv_test_rand_int(0, 1) * n; /* sometimes counted from the end */
        spec->dim1 = (int)spconv_test_rand_int(-n, n - 1);
        break;
    case VIEW_VIEW:
    case VIEW_RESHAPE: spec->ndim = random_factorisation(spconv_tensor_numel(base), spec->sizes); break;
    case VIEW_SQUEEZE:
        if (spconv_test_rand_int(0, 2) == 0) spec->dim = SPCONV_ALL_DIMS;
        break;
    case VIEW_UNSQUEEZE: spec->dim = (int)spconv_test_rand_int(-n - 1, n); break;
    case VIEW_EXPAND: {
        int lead = (int)spconv_test_rand_int(0, 2);
        spec->ndim = n + lead;
        for (int i = 0; i < spec->ndim; ++i) {
            int64_t old = i < lead ? 1 : bs[i - lead];
            spec->sizes[i] = old == 1 ? spconv_test_rand_int(0, 3) : old;
            if (i >= lead && spconv_test_rand_int(0, 3) == 0) spec->sizes[i] = -1;
        }
        break;
    }
    case VIEW_KIND_COUNT: break;
    }
}

static spconv_status apply_view(const view_spec *spec, const spconv_tensor *base, spconv_tensor **out) {
    switch (spec->kind) {
    case VIEW_NARROW: return spconv_tensor_narrow(base, spec->dim, spec->start, spec->end, out);
    case VIEW_SLICE:
        return spconv_tensor_slice(base, spec->dim, spec->start, spec->end, spec->step, out);
    case VIEW_SELECT: return spconv_tensor_select(base, spec->dim, spec->start, out);
    case VIEW_PERMUTE: return spconv_tensor_permute(base, spec->dims, out);
    case VIEW_TRANSPOSE: return spconv_tensor_transpose(base, spec->dim, spec->dim1, out);
    case VIEW_VIEW: return spconv_tensor_view(base, spec->ndim, spec->sizes, out);
    case VIEW_RESHAPE: return spconv_tensor_reshape(NULL, base, spec->ndim, spec->sizes, out);
    case VIEW_SQUEEZE: return spconv_tensor_squeeze(base, spec->dim, out);
    case VIEW_UNSQUEEZE: return spconv_tensor_unsqueeze(base, spec->dim, out);
    case VIEW_EXPAND: return spconv_tensor_expand(base, spec->ndim, spec->sizes, out);
    case VIEW_KIND_COUNT: break;
    }
    return SPCONV_ERR_INTERNAL;
}

/* The cached contiguity agrees with the addresses: element v sits at ravel(v). */
static void check_contiguity_cache(const spconv_tensor *t) {
    int n = spconv_tensor_ndim(t);
    if (spconv_tensor_numel(t) == 0) {
        assert_true(spconv_tensor_is_contiguous(t));
        return;
    }
    int64_t index[SPCONV_MAX_DIMS] = {0};
    int dense = 1;
    size_t element_size = spconv_dtype_size(spconv_tensor_dtype(t));
    do {
        char *expected = (char *)spconv_tensor_data(t) + ravel(n, spconv_tensor_sizes(t), index) * element_size;
        if (element_ptr(t, index) != expected) dense = 0;
    } while (next_index(n, spconv_tensor_sizes(t), index));
    assert_int_equal(spconv_tensor_is_contiguous(t), dense);
}

static void test_views_random(void **state) {
    (void)state;
    int views_refused = 0;
    for (int trial = 0; trial < 3000; ++trial) {
        int ndim = (int)spconv_test_rand_int(1, 4);
        int64_t sizes[SPCONV_MAX_DIMS];
        for (int d = 0; d < ndim; ++d) sizes[d] = spconv_test_rand_int(1, 4);
        spconv_tensor *base = random_base(ndim, sizes), *view = NULL;
        view_spec spec;
        random_view_spec(base, &spec);
        spconv_status st = apply_view(&spec, base, &view);
        if (spec.kind == VIEW_VIEW && st == SPCONV_ERR_INVALID_ARGUMENT) {
            /* Only strided bases may refuse, and reshape must then copy. */
            assert_false(spconv_tensor_is_contiguous(base));
            SPCONV_ASSERT_ERROR_CONTAINS("without copying (use spconv_tensor_reshape)");
            ++views_refused;
            spec.kind = VIEW_RESHAPE;
            st = apply_view(&spec, base, &view);
            assert_true(spconv_tensor_storage(view) != spconv_tensor_storage(base));
        }
        if (st != SPCONV_OK)
            fail_msg("view kind %d failed: %s", (int)spec.kind, spconv_last_error());
        if (spec.kind != VIEW_RESHAPE)
            assert_ptr_equal(spconv_tensor_storage(view), spconv_tensor_storage(base));
        if (spec.kind == VIEW_SLICE) {
            int64_t count = 0, size = spconv_tensor_size(base, spec.dim);
            for (int64_t i = python_bound(spec.start, size); i < python_bound(spec.end, size); i += spec.step)
                ++count;
            assert_int_equal(spconv_tensor_size(view, spec.dim), count);
        }
        check_contiguity_cache(view);
        int64_t v[SPCONV_MAX_DIMS] = {0}, b[SPCONV_MAX_DIMS];
        int vn = spconv_tensor_ndim(view);
        if (spconv_tensor_numel(view) > 0) {
            do {
                map_view_index(&spec, base, view, v, b);
                if (element(view, v) != element(base, b))
                    fail_msg("view kind %d: element mismatch", (int)spec.kind);
            } while (next_index(vn, spconv_tensor_sizes(view), v));
        }
        spconv_tensor_release(view);
        spconv_tensor_release(base);
    }
    assert_true(views_refused > 0); /* the random bases do exercise the refusal */
}

/* Expected sizes of specific views, including Python's slice clamping. */
static void test_view_shapes(void **state) {
    (void)state;
    const int64_t sizes[] = {4, 6};
    spconv_tensor *base = iota(2, sizes), *v = NULL, *w = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_slice(base, 1, -4, 100, 3, &v));
    assert_int_equal(spconv_tensor_size(v, 1), 2); /* columns 2 and 5 */
    assert_int_equal(spconv_tensor_stride(v, 1), 3);
    assert_int_equal(spconv_tensor_offset(v), 2);
    spconv_tensor_release(v);
    SPCONV_ASSERT_OK(spconv_tensor_slice(base, 0, 3, 1, 1, &v));
    assert_int_equal(spconv_tensor_size(v, 0), 0);
    spconv_tensor_release(v);
    SPCONV_ASSERT_OK(spconv_tensor_slice(base, 0, 1, 2, INT64_MAX, &v)); /* huge step, one row */
    assert_int_equal(spconv_tensor_size(v, 0), 1);
    spconv_tensor_release(v);
    /* a window of the columns still splits its rows without copying */
    SPCONV_ASSERT_OK(spconv_tensor_narrow(base, 1, 0, 3, &v));
    const int64_t split[] = {2, 2, 3};
    SPCONV_ASSERT_OK(spconv_tensor_view(v, 3, split, &w));
    assert_int_equal(spconv_tensor_stride(w, 0), 12);
    assert_int_equal(spconv_tensor_stride(w, 1), 6);
    spconv_tensor_release(w);
    const int64_t flat[] = {12};
    SPCONV_ASSERT_FAILS(spconv_tensor_view(v, 1, flat, &w), SPCONV_ERR_INVALID_ARGUMENT,
                        "spconv_tensor_view: a tensor with sizes [4, 3] and strides [6, 1] "
                        "cannot be viewed as [12] without copying");
    spconv_tensor_release(v);
    /* a transposed tensor splits a dim */
    SPCONV_ASSERT_OK(spconv_tensor_transpose(base, 0, 1, &v));
    const int64_t split_t[] = {6, 2, -1};
    SPCONV_ASSERT_OK(spconv_tensor_view(v, 3, split_t, &w));
    assert_int_equal(spconv_tensor_size(w, 2), 2);
    assert_int_equal(spconv_tensor_stride(w, 1), 12);
    spconv_tensor_release(w);
    spconv_tensor_release(v);
    /* expand: new dims and size-1 dims get stride 0 */
    const int64_t col_sizes[] = {4, 1};
    SPCONV_ASSERT_OK(spconv_tensor_narrow(base, 1, 2, 1, &v));
    const int64_t to[] = {3, -1, 5};
    SPCONV_ASSERT_OK(spconv_tensor_expand(v, 3, to, &w));
    assert_memory_equal(spconv_tensor_sizes(v), col_sizes, sizeof col_sizes);
    assert_int_equal(spconv_tensor_size(w, 1), 4);
    assert_int_equal(spconv_tensor_stride(w, 0), 0);
    assert_int_equal(spconv_tensor_stride(w, 1), 6);
    assert_int_equal(spconv_tensor_stride(w, 2), 0);
    assert_false(spconv_tensor_is_contiguous(w));
    spconv_tensor_release(w);
    spconv_tensor_release(v);
    /* a 0-d tensor views as any all-ones shape */
    SPCONV_ASSERT_OK(spconv_tensor_select(base, 0, 1, &v));
    SPCONV_ASSERT_OK(spconv_tensor_select(v, 0, -1, &w));
    assert_int_equal(spconv_tensor_ndim(w), 0);
    assert_true(*(double *)spconv_tensor_data(w) == 11.0);
    spconv_tensor_release(v);
    const int64_t ones[] = {1, 1};
    SPCONV_ASSERT_OK(spconv_tensor_view(w, 2, ones, &v));
    spconv_tensor_release(v);
    SPCONV_ASSERT_OK(spconv_tensor_squeeze(w, SPCONV_ALL_DIMS, &v));
    assert_int_equal(spconv_tensor_ndim(v), 0);
    spconv_tensor_release(v);
    spconv_tensor_release(w);
    spconv_tensor_release(base);
}

/* Writes through a view land in the base, and the other way round. */
static void test_views_share_storage(void **state) {
    (void)state;
    const int64_t sizes[] = {3, 4};
    spconv_tensor *base = iota(2, sizes), *row = NULL, *col = NULL, *t = NULL, *every = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_select(base, 0, 1, &row));
    SPCONV_ASSERT_OK(spconv_tensor_transpose(base, 0, 1, &t));
    SPCONV_ASSERT_OK(spconv_tensor_select(t, 0, 2, &col));
    SPCONV_ASSERT_OK(spconv_tensor_slice(base, 1, 0, 4, 2, &every));
    SPCONV_ASSERT_OK(spconv_tensor_fill(NULL, row, -1.0));
    SPCONV_ASSERT_OK(spconv_tensor_fill(NULL, col, -2.0));
    const double *data = spconv_tensor_data(base);
    const double expected[] = {0, 1, -2, 3, -1, -1, -2, -1, 8, 9, -2, 11};
    assert_memory_equal(data, expected, sizeof expected);
    int64_t index[2] = {2, 1};
    *(double *)element_ptr(every, index) = 42.0; /* base[2][2] */
    assert_true(data[10] == 42.0);
    ((double *)spconv_tensor_data(base))[4 + 3] = 7.0;
    int64_t three = 3;
    assert_true(element(row, &three) == 7.0);
    spconv_tensor_release(row);
    spconv_tensor_release(col);
    spconv_tensor_release(t);
    spconv_tensor_release(every);
    spconv_tensor_release(base);
}

/* ============================================================================================= */
/* copies                                                                                        */
/* ============================================================================================= */

static void fill_parent(spconv_tensor *parent, int random, double background) {
    char *data = spconv_tensor_data(parent);
    spconv_dtype dtype = spconv_tensor_dtype(parent);
    size_t size = spconv_dtype_size(dtype);
    for (int64_t k = 0; k < spconv_tensor_numel(parent); ++k)
        encode(data + k * (int64_t)size, dtype, random ? (double)spconv_test_rand_int(0, 100) : background);
}

/* A tensor holding random small integers (exact in every dtype) in a random layout: contiguous,
 * a strided window, or an expanded (stride-0) view. */
static spconv_tensor *random_source(spconv_dtype dtype, int ndim, const int64_t *sizes) {
    int64_t inner[SPCONV_MAX_DIMS];
    for (int d = 0; d < ndim; ++d) inner[d] = sizes[d];
    int choice = (int)spconv_test_rand_int(0, 2);
    int expand_dim = ndim > 0 ? (int)spconv_test_rand_int(0, ndim - 1) : -1;
    if (choice == 2 && (expand_dim < 0 || sizes[expand_dim] == 0)) choice = 1;
    if (choice == 2) inner[expand_dim] = 1;
    spconv_tensor *parent = NULL, *t = NULL;
    if (choice == 0) {
        SPCONV_ASSERT_OK(spconv_tensor_empty(spconv_cpu(), dtype, ndim, sizes, &t));
        fill_parent(t, 1, 0);
        return t;
    }
    t = strided_window(dtype, ndim, inner, &parent);
    fill_parent(parent, 1, 0);
    spconv_tensor_release(parent);
    if (choice == 1) return t;
    spconv_tensor *expanded = NULL;
    if (expand_dim == 0 && spconv_test_rand_int(0, 1)) {
        /* drop the dim altogether, so that expand adds it in front */
        spconv_tensor *lower = NULL;
        SPCONV_ASSERT_OK(spconv_tensor_select(t, 0, 0, &lower));
        spconv_tensor_release(t);
        t = lower;
    }
    SPCONV_ASSERT_OK(spconv_tensor_expand(t, ndim, sizes, &expanded));
    spconv_tensor_release(t);
    return expanded;
}

/* Every element of `dst` equals `src` at the same index, and the parent's other elements still
 * hold `background`. */
static void check_copied(const spconv_tensor *dst, const spconv_tensor *src,
                         const spconv_tensor *parent, double background) {
    int n = spconv_tensor_ndim(dst);
    const int64_t *sizes = spconv_tensor_sizes(dst);
    int64_t parent_numel = spconv_tensor_numel(parent);
    char *touched = calloc((size_t)parent_numel + 1, 1);
    assert_non_null(touched);
    int64_t index[SPCONV_MAX_DIMS] = {0};
    size_t size = spconv_dtype_size(spconv_tensor_dtype(dst));
    if (spconv_tensor_numel(dst) > 0) {
        do {
            if (element(dst, index) != element(src, index))
                fail_msg("%s <- %s: element %g != %g", spconv_dtype_name(spconv_tensor_dtype(dst)),
                         spconv_dtype_name(spconv_tensor_dtype(src)), element(dst, index),
                         element(src, index));
            touched[(element_ptr(dst, index) - (char *)spconv_tensor_data(parent)) / (int64_t)size] = 1;
        } while (next_index(n, sizes, index));
    }
    for (int64_t k = 0; k < parent_numel; ++k) {
        if (touched[k]) continue;
        if (decode((char *)spconv_tensor_data(parent) + k * (int64_t)size, spconv_tensor_dtype(parent)) != background)
            fail_msg("copy_ wrote outside its destination (parent element %lld)", (long long)k);
    }
    free(touched);
}

static void test_copy_layouts_all_dtypes(void **state) {
    (void)state;
    for (int a = 0; a < SPCONV_DTYPE_COUNT; ++a) {
        for (int b = 0; b < SPCONV_DTYPE_COUNT; ++b) {
            for (int trial = 0; trial < 15; ++trial) {
                int ndim = (int)spconv_test_rand_int(0, 4);
                int64_t sizes[SPCONV_MAX_DIMS];
                for (int d = 0; d < ndim; ++d)
                    sizes[d] = spconv_test_rand_int(0, 9) == 0 ? 0 : spconv_test_rand_int(1, 5);
                spconv_tensor *src = random_source(all_dtypes[a], ndim, sizes);
                spconv_tensor *parent = NULL, *dst = NULL;
                if (spconv_test_rand_int(0, 2) == 0) {
                    SPCONV_ASSERT_OK(spconv_tensor_empty(spconv_cpu(), all_dtypes[b], ndim, sizes, &dst));
                    parent = dst;
                    spconv_tensor_retain(parent);
                } else {
                    dst = strided_window(all_dtypes[b], ndim, sizes, &parent);
                }
                fill_parent(parent, 0, 7.0);
                SPCONV_ASSERT_OK(spconv_tensor_copy_(NULL, dst, src));
                check_copied(dst, src, parent, 7.0);
                spconv_tensor_release(src);
                spconv_tensor_release(dst);
                spconv_tensor_release(parent);
            }
        }
    }
}

/* Overlapping source and destination behave as if the source were read first. */
static void test_copy_overlap(void **state) {
    (void)state;
    const int64_t n = 10;
    spconv_tensor *base = iota(1, &n), *head = NULL, *tail = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_narrow(base, 0, 0, 9, &head));
    SPCONV_ASSERT_OK(spconv_tensor_narrow(base, 0, 1, 9, &tail));
    SPCONV_ASSERT_OK(spconv_tensor_copy_(NULL, tail, head));
    const double shifted_up[] = {0, 0, 1, 2, 3, 4, 5, 6, 7, 8};
    assert_memory_equal(spconv_tensor_data(base), shifted_up, sizeof shifted_up);
    SPCONV_ASSERT_OK(spconv_tensor_copy_(NULL, head, tail));
    const double shifted_down[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 8};
    assert_memory_equal(spconv_tensor_data(base), shifted_down, sizeof shifted_down);
    SPCONV_ASSERT_OK(spconv_tensor_copy_(NULL, base, base)); /* the same view: nothing to do */
    assert_memory_equal(spconv_tensor_data(base), shifted_down, sizeof shifted_down);
    spconv_tensor_release(head);
    spconv_tensor_release(tail);
    spconv_tensor_release(base);

    /* Two storages wrapping one buffer (two wrapped views of one torch tensor) overlap too:
     * every other element, one view two elements on (strided, so copied element by element). */
    double buffer[20], want[20];
    for (int i = 0; i < 20; ++i) buffer[i] = want[i] = i;
    for (int i = 18; i >= 2; i -= 2) want[i] = want[i - 2];
    const int64_t nine = 9, two = 2;
    spconv_tensor *first = NULL, *second = NULL;
    SPCONV_ASSERT_OK(
        spconv_tensor_wrap(spconv_cpu(), SPCONV_F64, 1, &nine, &two, buffer, NULL, NULL, &first));
    SPCONV_ASSERT_OK(spconv_tensor_wrap(spconv_cpu(), SPCONV_F64, 1, &nine, &two, buffer + 2, NULL,
                                        NULL, &second));
    SPCONV_ASSERT_OK(spconv_tensor_copy_(NULL, second, first));
    assert_memory_equal(buffer, want, sizeof want);
    spconv_tensor_release(second);
    SPCONV_ASSERT_OK(
        spconv_tensor_wrap(spconv_cpu(), SPCONV_F64, 1, &nine, &two, buffer, NULL, NULL, &second));
    SPCONV_ASSERT_OK(spconv_tensor_copy_(NULL, second, first)); /* the same memory: nothing */
    assert_memory_equal(buffer, want, sizeof want);
    spconv_tensor_release(first);
    spconv_tensor_release(second);

    const int64_t square[] = {3, 3};
    spconv_tensor *m = iota(2, square), *mt = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_transpose(m, 0, 1, &mt));
    SPCONV_ASSERT_OK(spconv_tensor_copy_(NULL, m, mt));
    const double transposed[] = {0, 3, 6, 1, 4, 7, 2, 5, 8};
    assert_memory_equal(spconv_tensor_data(m), transposed, sizeof transposed);
    spconv_tensor_release(mt);
    spconv_tensor_release(m);
}

static void test_contiguous_clone_to(void **state) {
    (void)state;
    const int64_t sizes[] = {2, 3};
    spconv_tensor *base = iota(2, sizes), *t = NULL, *out = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_contiguous(NULL, base, &out));
    assert_ptr_equal(out, base);
    spconv_tensor_release(out);
    SPCONV_ASSERT_OK(spconv_tensor_to_device(NULL, base, spconv_cpu(), &out));
    assert_ptr_equal(out, base);
    spconv_tensor_release(out);
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, base, SPCONV_F64, &out));
    assert_ptr_equal(out, base);
    spconv_tensor_release(out);

    SPCONV_ASSERT_OK(spconv_tensor_transpose(base, 0, 1, &t));
    const double transposed[] = {0, 3, 1, 4, 2, 5};
    SPCONV_ASSERT_OK(spconv_tensor_contiguous(NULL, t, &out));
    assert_true(spconv_tensor_is_contiguous(out));
    assert_memory_equal(spconv_tensor_data(out), transposed, sizeof transposed);
    spconv_tensor_release(out);
    SPCONV_ASSERT_OK(spconv_tensor_to_device(NULL, t, spconv_cpu(), &out));
    assert_memory_equal(spconv_tensor_data(out), transposed, sizeof transposed);
    spconv_tensor_release(out);
    float as_f32[6];
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, t, SPCONV_F32, &out));
    assert_int_equal(spconv_tensor_dtype(out), SPCONV_F32);
    SPCONV_ASSERT_OK(spconv_tensor_copy_to_host(NULL, out, as_f32, sizeof as_f32));
    for (int i = 0; i < 6; ++i) assert_true(as_f32[i] == (float)transposed[i]);
    spconv_tensor_release(out);
    double host[6];
    SPCONV_ASSERT_OK(spconv_tensor_copy_to_host(NULL, t, host, sizeof host));
    assert_memory_equal(host, transposed, sizeof transposed);

    SPCONV_ASSERT_OK(spconv_tensor_clone(NULL, base, &out));
    assert_true(spconv_tensor_storage(out) != spconv_tensor_storage(base));
    assert_memory_equal(spconv_tensor_data(out), spconv_tensor_data(base), 6 * sizeof(double));
    ((double *)spconv_tensor_data(out))[0] = 99.0;
    assert_true(((double *)spconv_tensor_data(base))[0] == 0.0);
    spconv_tensor_release(out);

    if (spconv_cuda_device_count() == 0) {
        CHECK_FAILS(out, spconv_tensor_to_device(NULL, base, spconv_cuda(0), &out),
                    SPCONV_ERR_NO_DEVICE, "spconv_tensor_to_device: ");
        SPCONV_ASSERT_ERROR_CONTAINS("CUDA");
    }
    CHECK_FAILS(out, spconv_tensor_to_device(NULL, base, spconv_cuda(-1), &out),
                SPCONV_ERR_NO_DEVICE, "spconv_tensor_to_device: ");
    CHECK_FAILS(out, spconv_tensor_to_device(NULL, base, (spconv_device){SPCONV_DEVICE_CPU, 1}, &out),
                SPCONV_ERR_INVALID_ARGUMENT, "CPU device index must be 0, got 1");
    CHECK_FAILS(out, spconv_tensor_to_dtype(NULL, base, (spconv_dtype)7, &out),
                SPCONV_ERR_INVALID_ARGUMENT, "spconv_tensor_to_dtype: dtype 7 is not a spconv_dtype");
    CHECK_FAILS(out, spconv_tensor_clone(NULL, NULL, &out), SPCONV_ERR_NULL_POINTER,
                "spconv_tensor_clone: 't' is NULL");
    CHECK_FAILS(out, spconv_tensor_contiguous(NULL, NULL, &out), SPCONV_ERR_NULL_POINTER,
                "spconv_tensor_contiguous: 't' is NULL");
    spconv_tensor_release(t);
    spconv_tensor_release(base);
}

static void test_fill_views(void **state) {
    (void)state;
    const int64_t sizes[] = {4, 5};
    for (int i = 0; i < SPCONV_DTYPE_COUNT; ++i) {
        spconv_tensor *base = NULL, *window = NULL;
        SPCONV_ASSERT_OK(spconv_tensor_zeros(NULL, spconv_cpu(), all_dtypes[i], 2, sizes, &base));
        SPCONV_ASSERT_OK(spconv_tensor_slice(base, 1, 1, 5, 2, &window));
        SPCONV_ASSERT_OK(spconv_tensor_fill(NULL, window, 3.0));
        int64_t index[2] = {0, 0};
        do {
            double want = index[1] == 1 || index[1] == 3 ? 3.0 : 0.0;
            assert_true(element(base, index) == want);
        } while (next_index(2, sizes, index));
        spconv_tensor_release(window);
        spconv_tensor_release(base);
    }
    /* filling an expanded view writes its one element */
    const int64_t one = 1, many[] = {3, 4};
    spconv_tensor *scalar = iota(1, &one), *wide = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_expand(scalar, 2, many, &wide));
    SPCONV_ASSERT_OK(spconv_tensor_fill(NULL, wide, 5.0));
    assert_true(*(double *)spconv_tensor_data(scalar) == 5.0);
    spconv_tensor_release(wide);
    spconv_tensor_release(scalar);
}

static void test_copy_errors(void **state) {
    (void)state;
    const int64_t a_sizes[] = {2, 3}, b_sizes[] = {3, 2}, one = 1, wide[] = {3, 2};
    spconv_tensor *a = iota(2, a_sizes), *b = iota(2, b_sizes), *scalar = iota(1, &one), *ex = NULL;
    SPCONV_ASSERT_FAILS(spconv_tensor_copy_(NULL, a, b), SPCONV_ERR_SHAPE_MISMATCH,
                        "spconv_tensor_copy_: dst has sizes [2, 3] but src has sizes [3, 2]");
    const int64_t two_d[] = {1, 1};
    spconv_tensor *s2 = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_view(scalar, 2, two_d, &s2));
    SPCONV_ASSERT_OK(spconv_tensor_expand(s2, 2, wide, &ex));
    SPCONV_ASSERT_FAILS(spconv_tensor_copy_(NULL, ex, b), SPCONV_ERR_INVALID_ARGUMENT,
                        "spconv_tensor_copy_: dst is an expanded view (dim 0 has size 3 and stride 0)");
    SPCONV_ASSERT_OK(spconv_tensor_copy_(NULL, b, ex)); /* reading an expanded view is fine */
    SPCONV_ASSERT_FAILS(spconv_tensor_copy_(NULL, NULL, b), SPCONV_ERR_NULL_POINTER,
                        "spconv_tensor_copy_: 'dst' is NULL");
    SPCONV_ASSERT_FAILS(spconv_tensor_copy_(NULL, a, NULL), SPCONV_ERR_NULL_POINTER,
                        "spconv_tensor_copy_: 'src' is NULL");
    double host[6];
    SPCONV_ASSERT_FAILS(spconv_tensor_copy_to_host(NULL, a, host, 8), SPCONV_ERR_INVALID_ARGUMENT,
                        "spconv_tensor_copy_to_host: nbytes = 8 but the f64 tensor [2, 3] needs 48");
    SPCONV_ASSERT_FAILS(spconv_tensor_copy_to_host(NULL, a, NULL, sizeof host),
                        SPCONV_ERR_NULL_POINTER, "spconv_tensor_copy_to_host: 'dst' is NULL");
    SPCONV_ASSERT_FAILS(spconv_tensor_copy_to_host(NULL, NULL, host, sizeof host),
                        SPCONV_ERR_NULL_POINTER, "spconv_tensor_copy_to_host: 't' is NULL");
    SPCONV_ASSERT_FAILS(spconv_tensor_fill(NULL, NULL, 1.0), SPCONV_ERR_NULL_POINTER,
                        "spconv_tensor_fill: 't' is NULL");
    spconv_tensor_release(s2);
    spconv_tensor_release(ex);
    spconv_tensor_release(scalar);
    spconv_tensor_release(a);
    spconv_tensor_release(b);
}

/* ============================================================================================= */
/* printing                                                                                      */
/* ============================================================================================= */

/* Print into a temporary file and return its text (malloc'd). */
static char *print_to_string(const spconv_tensor *t, int64_t max_elements) {
    FILE *file = tmpfile();
    assert_non_null(file);
    SPCONV_ASSERT_OK(spconv_tensor_print(NULL, t, file, max_elements));
    long length = ftell(file);
    rewind(file);
    char *text = calloc((size_t)length + 1, 1);
    assert_non_null(text);
    assert_int_equal(fread(text, 1, (size_t)length, file), (size_t)length);
    fclose(file);
    return text;
}

static void test_describe(void **state) {
    (void)state;
    const int64_t sizes[] = {2, 3};
    spconv_tensor *t = NULL, *v = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_empty(spconv_cpu(), SPCONV_F32, 2, sizes, &t));
    char buf[128];
    spconv_tensor_describe(t, buf, sizeof buf);
    assert_string_equal(buf, "tensor f32 cpu [2, 3] strides [3, 1] offset 0 contiguous");
    SPCONV_ASSERT_OK(spconv_tensor_slice(t, 1, 1, 3, 1, &v));
    spconv_tensor_describe(v, buf, sizeof buf);
    assert_string_equal(buf, "tensor f32 cpu [2, 2] strides [3, 1] offset 1 non-contiguous");
    spconv_tensor_release(v);
    char small[10];
    spconv_tensor_describe(t, small, sizeof small);
    assert_string_equal(small, "tensor f3"); /* truncated, still terminated */
    spconv_tensor_describe(t, NULL, 0);
    spconv_tensor_describe(NULL, buf, sizeof buf);
    assert_string_equal(buf, "tensor NULL");
    spconv_tensor_release(t);
    SPCONV_ASSERT_OK(spconv_tensor_empty(spconv_cpu(), SPCONV_BF16, 0, NULL, &t));
    spconv_tensor_describe(t, buf, sizeof buf);
    assert_string_equal(buf, "tensor bf16 cpu [] strides [] offset 0 contiguous");
    spconv_tensor_release(t);
}

static void test_print(void **state) {
    (void)state;
    spconv_tensor *flat = NULL, *t = NULL, *tt = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_arange(NULL, spconv_cpu(), SPCONV_I32, 0, 6, 1, &flat));
    const int64_t sizes[] = {2, 3};
    SPCONV_ASSERT_OK(spconv_tensor_view(flat, 2, sizes, &t));
    char *text = print_to_string(t, 100);
    assert_string_equal(text, "tensor i32 cpu [2, 3] strides [3, 1] offset 0 contiguous\n"
                              "[[0, 1, 2], [3, 4, 5]]\n");
    free(text);
    text = print_to_string(t, 4);
    assert_string_equal(strchr(text, '\n') + 1, "[[0, 1, 2], [3, ...]]\n");
    free(text);
    text = print_to_string(t, 3);
    assert_string_equal(strchr(text, '\n') + 1, "[[0, 1, 2], ...]\n");
    free(text);
    text = print_to_string(t, 0);
    assert_string_equal(text, "tensor i32 cpu [2, 3] strides [3, 1] offset 0 contiguous\n");
    free(text);
    SPCONV_ASSERT_OK(spconv_tensor_transpose(t, 0, 1, &tt));
    text = print_to_string(tt, 100);
    assert_string_equal(strchr(text, '\n') + 1, "[[0, 3], [1, 4], [2, 5]]\n");
    free(text);
    spconv_tensor_release(tt);
    spconv_tensor_release(t);
    spconv_tensor_release(flat);

    SPCONV_ASSERT_OK(spconv_tensor_full(NULL, spconv_cpu(), SPCONV_F16, 0, NULL, 0.5, &t));
    text = print_to_string(t, 10);
    assert_string_equal(strchr(text, '\n') + 1, "0.5\n");
    free(text);
    spconv_tensor_release(t);
    const int64_t empty[] = {2, 0};
    SPCONV_ASSERT_OK(spconv_tensor_empty(spconv_cpu(), SPCONV_F32, 2, empty, &t));
    text = print_to_string(t, 10);
    assert_string_equal(strchr(text, '\n') + 1, "[]\n");
    free(text);
    SPCONV_ASSERT_FAILS(spconv_tensor_print(NULL, t, stdout, -1), SPCONV_ERR_INVALID_ARGUMENT,
                        "spconv_tensor_print: max_elements = -1 is negative");
    SPCONV_ASSERT_FAILS(spconv_tensor_print(NULL, t, NULL, 1), SPCONV_ERR_NULL_POINTER,
                        "spconv_tensor_print: 'stream' is NULL");
    SPCONV_ASSERT_FAILS(spconv_tensor_print(NULL, NULL, stdout, 1), SPCONV_ERR_NULL_POINTER,
                        "spconv_tensor_print: 't' is NULL");
    spconv_tensor_release(t);
}

/* ============================================================================================= */
/* error paths of creation and views                                                              */
/* ============================================================================================= */

static void test_creation_errors(void **state) {
    (void)state;
    spconv_tensor *t;
    const int64_t sizes[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    SPCONV_ASSERT_FAILS(spconv_tensor_empty(spconv_cpu(), SPCONV_F32, 1, sizes, NULL),
                        SPCONV_ERR_NULL_POINTER, "spconv_tensor_empty: 'out' is NULL");
    CHECK_FAILS(t, spconv_tensor_empty(spconv_cpu(), SPCONV_F32, 9, sizes, &t),
                SPCONV_ERR_INVALID_ARGUMENT, "spconv_tensor_empty: ndim = 9 is outside [0, 8]");
    CHECK_FAILS(t, spconv_tensor_empty(spconv_cpu(), SPCONV_F32, -1, sizes, &t),
                SPCONV_ERR_INVALID_ARGUMENT, "ndim = -1 is outside [0, 8]");
    CHECK_FAILS(t, spconv_tensor_empty(spconv_cpu(), SPCONV_F32, 2, NULL, &t),
                SPCONV_ERR_NULL_POINTER, "spconv_tensor_empty: 'sizes' is NULL with ndim = 2");
    const int64_t negative[] = {2, -3};
    CHECK_FAILS(t, spconv_tensor_empty(spconv_cpu(), SPCONV_F32, 2, negative, &t),
                SPCONV_ERR_INVALID_ARGUMENT, "spconv_tensor_empty: sizes[1] = -3 is negative (sizes [2, -3])");
    const int64_t too_many[] = {(int64_t)1 << 32, (int64_t)1 << 32};
    CHECK_FAILS(t, spconv_tensor_empty(spconv_cpu(), SPCONV_U8, 2, too_many, &t),
                SPCONV_ERR_OVERFLOW,
                "spconv_tensor_empty: the number of elements of sizes [4294967296, 4294967296] overflows int64");
    const int64_t empty_but_huge[] = {0, (int64_t)1 << 32, (int64_t)1 << 32};
    CHECK_FAILS(t, spconv_tensor_empty(spconv_cpu(), SPCONV_U8, 3, empty_but_huge, &t),
                SPCONV_ERR_OVERFLOW, "overflows int64");
    const int64_t too_big[] = {(int64_t)1 << 61};
    CHECK_FAILS(t, spconv_tensor_empty(spconv_cpu(), SPCONV_F32, 1, too_big, &t), SPCONV_ERR_OVERFLOW,
                "spconv_tensor_empty: 2305843009213693952 elements of f32 = more than 2^63 bytes");
    CHECK_FAILS(t, spconv_tensor_empty(spconv_cpu(), (spconv_dtype)42, 1, sizes, &t),
                SPCONV_ERR_INVALID_ARGUMENT, "spconv_tensor_empty: dtype 42 is not a spconv_dtype");
    CHECK_FAILS(t, spconv_tensor_empty((spconv_device){SPCONV_DEVICE_CPU, 1}, SPCONV_F32, 1, sizes, &t),
                SPCONV_ERR_INVALID_ARGUMENT, "spconv_tensor_empty: CPU device index must be 0, got 1");
    CHECK_FAILS(t, spconv_tensor_empty((spconv_device){(spconv_device_type)5, 0}, SPCONV_F32, 1, sizes, &t),
                SPCONV_ERR_INVALID_ARGUMENT, "spconv_tensor_empty: unknown device type 5");
    if (spconv_cuda_device_count() == 0)
        CHECK_FAILS(t, spconv_tensor_empty(spconv_cuda(0), SPCONV_F32, 1, sizes, &t),
                    SPCONV_ERR_NO_DEVICE, "spconv_tensor_empty: ");
    CHECK_FAILS(t, spconv_tensor_zeros(NULL, spconv_cpu(), SPCONV_F32, 1, negative + 1, &t),
                SPCONV_ERR_INVALID_ARGUMENT, "spconv_tensor_zeros: sizes[0] = -3 is negative");
    CHECK_FAILS(t, spconv_tensor_full(NULL, spconv_cpu(), SPCONV_F32, 9, sizes, 1.0, &t),
                SPCONV_ERR_INVALID_ARGUMENT, "spconv_tensor_full: ndim = 9");
    CHECK_FAILS(t, spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_F32, 1, negative + 1, sizes, &t),
                SPCONV_ERR_INVALID_ARGUMENT, "spconv_tensor_from_host: sizes[0] = -3 is negative");
    spconv_storage *s = (spconv_storage *)POISON;
    SPCONV_ASSERT_FAILS(spconv_storage_create(spconv_cpu(), 8, NULL), SPCONV_ERR_NULL_POINTER,
                        "spconv_storage_create: 'out' is NULL");
    SPCONV_ASSERT_FAILS(spconv_storage_wrap(spconv_cpu(), NULL, 8, NULL, NULL, &s),
                        SPCONV_ERR_NULL_POINTER, "spconv_storage_wrap: 'data' is NULL with nbytes = 8");
    assert_null(s);
    if (spconv_cuda_device_count() == 0) {
        s = (spconv_storage *)POISON;
        SPCONV_ASSERT_FAILS(spconv_storage_create(spconv_cuda(0), 8, &s), SPCONV_ERR_NO_DEVICE,
                            "spconv_storage_create: ");
        assert_null(s);
    }
}

/* Strides that size-1 dims and empty tensors may carry unchecked (any value is valid there)
 * never overflow a view's offset or stride, and a byte count that does not fit in size_t is
 * SPCONV_ERR_OVERFLOW, not a wrapped zero. */
static void test_views_of_unchecked_strides(void **state) {
    (void)state;
    spconv_storage *s = NULL;
    SPCONV_ASSERT_OK(spconv_storage_create(spconv_cpu(), 64, &s));
    spconv_tensor *t = NULL, *v = NULL;
    const int64_t one = 1, huge = INT64_MAX;
    SPCONV_ASSERT_OK(spconv_tensor_from_storage(s, 15, SPCONV_F32, 1, &one, &huge, &t));
    SPCONV_ASSERT_OK(spconv_tensor_narrow(t, 0, 1, 0, &v)); /* empty: start == size */
    assert_int_equal(spconv_tensor_numel(v), 0);
    assert_ptr_equal(spconv_tensor_data(v), spconv_tensor_data(t));
    spconv_tensor_release(v);
    SPCONV_ASSERT_OK(spconv_tensor_slice(t, 0, 1, 5, 1, &v));
    assert_int_equal(spconv_tensor_numel(v), 0);
    assert_ptr_equal(spconv_tensor_data(v), spconv_tensor_data(t));
    spconv_tensor_release(v);
    spconv_tensor_release(t);

    const int64_t sizes[2] = {0, 3}, strides[2] = {1, INT64_MAX};
    SPCONV_ASSERT_OK(spconv_tensor_from_storage(s, 0, SPCONV_F32, 2, sizes, strides, &t));
    SPCONV_ASSERT_OK(spconv_tensor_unsqueeze(t, 1, &v));
    assert_int_equal(spconv_tensor_ndim(v), 3);
    assert_int_equal(spconv_tensor_size(v, 1), 1);
    spconv_tensor_release(v);
    spconv_tensor_release(t);
    spconv_storage_release(s);

    float value = 1.0f;
    char buf[1];
    const int64_t quarter = (int64_t)1 << 62;
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_F32, 1, &one, &value, &t));
    SPCONV_ASSERT_OK(spconv_tensor_expand(t, 1, &quarter, &v)); /* 2^62 floats: 2^64 bytes */
    SPCONV_ASSERT_FAILS(spconv_tensor_copy_to_host(NULL, v, buf, 0), SPCONV_ERR_OVERFLOW,
                        "take more than SIZE_MAX bytes");
    spconv_tensor_release(v);
    spconv_tensor_release(t);
}

static void test_view_errors(void **state) {
    (void)state;
    const int64_t sizes[] = {2, 3};
    spconv_tensor *base = iota(2, sizes), *t, *tt = NULL;
    CHECK_FAILS(t, spconv_tensor_narrow(base, 2, 0, 1, &t), SPCONV_ERR_OUT_OF_RANGE,
                "spconv_tensor_narrow: dim 2 is out of range for a 2-d tensor (valid: -2 .. 1)");
    CHECK_FAILS(t, spconv_tensor_narrow(base, -3, 0, 1, &t), SPCONV_ERR_OUT_OF_RANGE, "dim -3 is out of range");
    CHECK_FAILS(t, spconv_tensor_narrow(base, 1, 4, 0, &t), SPCONV_ERR_OUT_OF_RANGE,
                "spconv_tensor_narrow: start 4 is outside [0, 3] for dim 1 of size 3");
    CHECK_FAILS(t, spconv_tensor_narrow(base, 1, -1, 1, &t), SPCONV_ERR_OUT_OF_RANGE, "start -1 is outside");
    CHECK_FAILS(t, spconv_tensor_narrow(base, 1, 1, 3, &t), SPCONV_ERR_OUT_OF_RANGE,
                "spconv_tensor_narrow: start 1 + length 3 is outside dim 1 of size 3");
    CHECK_FAILS(t, spconv_tensor_narrow(base, 1, 1, -1, &t), SPCONV_ERR_OUT_OF_RANGE, "length -1");
    CHECK_FAILS(t, spconv_tensor_narrow(base, 1, 1, INT64_MAX, &t), SPCONV_ERR_OUT_OF_RANGE, "is outside dim 1");
    CHECK_FAILS(t, spconv_tensor_narrow(NULL, 0, 0, 1, &t), SPCONV_ERR_NULL_POINTER,
                "spconv_tensor_narrow: 't' is NULL");
    SPCONV_ASSERT_FAILS(spconv_tensor_narrow(base, 0, 0, 1, NULL), SPCONV_ERR_NULL_POINTER,
                        "spconv_tensor_narrow: 'out' is NULL");
    CHECK_FAILS(t, spconv_tensor_slice(base, 0, 0, 2, 0, &t), SPCONV_ERR_INVALID_ARGUMENT,
                "spconv_tensor_slice: step 0 must be >= 1");
    CHECK_FAILS(t, spconv_tensor_slice(base, 5, 0, 2, 1, &t), SPCONV_ERR_OUT_OF_RANGE,
                "spconv_tensor_slice: dim 5 is out of range");
    CHECK_FAILS(t, spconv_tensor_select(base, 1, 3, &t), SPCONV_ERR_OUT_OF_RANGE,
                "spconv_tensor_select: index 3 is out of range for dim 1 of size 3");
    CHECK_FAILS(t, spconv_tensor_select(base, 1, -4, &t), SPCONV_ERR_OUT_OF_RANGE, "index -4 is out of range");
    const int dup[] = {0, 0}, outside[] = {0, 2};
    CHECK_FAILS(t, spconv_tensor_permute(base, dup, &t), SPCONV_ERR_INVALID_ARGUMENT,
                "spconv_tensor_permute: dim 0 appears twice in dims (not a permutation)");
    CHECK_FAILS(t, spconv_tensor_permute(base, outside, &t), SPCONV_ERR_OUT_OF_RANGE,
                "spconv_tensor_permute: dims[1] = 2 is outside [0, 2)");
    CHECK_FAILS(t, spconv_tensor_permute(base, NULL, &t), SPCONV_ERR_NULL_POINTER,
                "spconv_tensor_permute: 'dims' is NULL for a 2-d tensor");
    CHECK_FAILS(t, spconv_tensor_transpose(base, 0, 2, &t), SPCONV_ERR_OUT_OF_RANGE,
                "spconv_tensor_transpose: dim 2 is out of range");
    const int64_t two_infer[] = {-1, -1}, mismatch[] = {4, 2}, indivisible[] = {4, -1},
                  zero_infer[] = {0, -1}, bad[] = {-2, 3};
    CHECK_FAILS(t, spconv_tensor_view(base, 2, two_infer, &t), SPCONV_ERR_INVALID_ARGUMENT,
                "spconv_tensor_view: sizes [-1, -1] has more than one -1");
    CHECK_FAILS(t, spconv_tensor_view(base, 2, mismatch, &t), SPCONV_ERR_SHAPE_MISMATCH,
                "spconv_tensor_view: sizes [4, 2] hold 8 elements but the tensor [2, 3] holds 6");
    CHECK_FAILS(t, spconv_tensor_view(base, 2, indivisible, &t), SPCONV_ERR_SHAPE_MISMATCH,
                "spconv_tensor_view: 6 elements of [2, 3] do not divide into sizes [4, -1]");
    CHECK_FAILS(t, spconv_tensor_view(base, 2, zero_infer, &t), SPCONV_ERR_INVALID_ARGUMENT,
                "cannot infer the -1 in sizes [0, -1] next to a size of 0");
    CHECK_FAILS(t, spconv_tensor_view(base, 2, bad, &t), SPCONV_ERR_INVALID_ARGUMENT,
                "sizes[0] = -2 is negative");
    CHECK_FAILS(t, spconv_tensor_view(base, 9, bad, &t), SPCONV_ERR_INVALID_ARGUMENT, "ndim = 9");
    CHECK_FAILS(t, spconv_tensor_view(base, 2, NULL, &t), SPCONV_ERR_NULL_POINTER, "'sizes' is NULL");
    SPCONV_ASSERT_OK(spconv_tensor_transpose(base, 0, 1, &tt));
    const int64_t flat = 6;
    CHECK_FAILS(t, spconv_tensor_view(tt, 1, &flat, &t), SPCONV_ERR_INVALID_ARGUMENT,
                "spconv_tensor_view: a tensor with sizes [3, 2] and strides [1, 3] cannot be viewed "
                "as [6] without copying (use spconv_tensor_reshape)");
    CHECK_FAILS(t, spconv_tensor_reshape(NULL, tt, 2, mismatch, &t), SPCONV_ERR_SHAPE_MISMATCH,
                "spconv_tensor_reshape: sizes [4, 2] hold 8 elements");
    SPCONV_ASSERT_OK(spconv_tensor_reshape(NULL, tt, 1, &flat, &t)); /* reshape copies instead */
    const double flat_values[] = {0, 3, 1, 4, 2, 5};
    assert_memory_equal(spconv_tensor_data(t), flat_values, sizeof flat_values);
    spconv_tensor_release(t);
    CHECK_FAILS(t, spconv_tensor_squeeze(base, 2, &t), SPCONV_ERR_OUT_OF_RANGE,
                "spconv_tensor_squeeze: dim 2 is out of range");
    CHECK_FAILS(t, spconv_tensor_unsqueeze(base, 3, &t), SPCONV_ERR_OUT_OF_RANGE,
                "spconv_tensor_unsqueeze: dim 3 is out of range for a 3-d tensor");
    CHECK_FAILS(t, spconv_tensor_unsqueeze(base, -4, &t), SPCONV_ERR_OUT_OF_RANGE, "dim -4");
    const int64_t eight[] = {1, 1, 1, 1, 1, 1, 1, 1};
    spconv_tensor *full = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_view(base, 8, (const int64_t[]){2, 3, 1, 1, 1, 1, 1, 1}, &full));
    CHECK_FAILS(t, spconv_tensor_unsqueeze(full, 0, &t), SPCONV_ERR_INVALID_ARGUMENT,
                "spconv_tensor_unsqueeze: the tensor already has the maximum of 8 dims");
    spconv_tensor_release(full);
    CHECK_FAILS(t, spconv_tensor_expand(base, 1, eight, &t), SPCONV_ERR_INVALID_ARGUMENT,
                "spconv_tensor_expand: ndim = 1 is outside [2, 8] for a 2-d tensor");
    const int64_t grow[] = {4, 3}, new_negative[] = {-1, 2, 3}, huge[] = {(int64_t)1 << 40, (int64_t)1 << 40, 2, 3};
    CHECK_FAILS(t, spconv_tensor_expand(base, 2, grow, &t), SPCONV_ERR_SHAPE_MISMATCH,
                "spconv_tensor_expand: cannot expand dim 0 of size 2 to 4 (only size-1 dims broadcast; "
                "tensor [2, 3], sizes [4, 3])");
    CHECK_FAILS(t, spconv_tensor_expand(base, 3, new_negative, &t), SPCONV_ERR_INVALID_ARGUMENT,
                "spconv_tensor_expand: sizes[0] = -1 is invalid (-1 only keeps an existing dim)");
    CHECK_FAILS(t, spconv_tensor_expand(base, 4, huge, &t), SPCONV_ERR_OVERFLOW,
                "spconv_tensor_expand: the number of elements of sizes");
    CHECK_FAILS(t, spconv_tensor_expand(base, 2, NULL, &t), SPCONV_ERR_NULL_POINTER, "'sizes' is NULL");
    spconv_tensor *scalar = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_empty(spconv_cpu(), SPCONV_F32, 0, NULL, &scalar));
    CHECK_FAILS(t, spconv_tensor_select(scalar, 0, 0, &t), SPCONV_ERR_OUT_OF_RANGE,
                "spconv_tensor_select: dim 0 is out of range for a 0-d tensor (it has no dims)");
    spconv_tensor_release(scalar);
    spconv_tensor_release(tt);
    spconv_tensor_release(base);
}

int main(void) {
    spconv_test_seed();
    const struct CMUnitTest dtypes[] = {
        cmocka_unit_test(test_dtype_properties),
        cmocka_unit_test(test_f16_known_values),
        cmocka_unit_test(test_f16_nan),
        cmocka_unit_test(test_f16_round_trip_all),
        cmocka_unit_test(test_contiguous_conversions_match_elementwise),
        cmocka_unit_test(test_f16_rounding_random),
        cmocka_unit_test(test_bf16_known_values),
        cmocka_unit_test(test_float_to_integer_rules),
        cmocka_unit_test(test_integer_rules),
        cmocka_unit_test(test_double_rounding_through_f32),
    };
    const struct CMUnitTest creation[] = {
        cmocka_unit_test(test_storage_create),
        cmocka_unit_test(test_empty_geometry),
        cmocka_unit_test(test_zeros_full),
        cmocka_unit_test(test_arange),
        cmocka_unit_test(test_from_host),
        cmocka_unit_test(test_wrap),
        cmocka_unit_test(test_from_storage),
        cmocka_unit_test(test_refcount),
        cmocka_unit_test(test_take_memory),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_creation_errors),
    };
    const struct CMUnitTest views[] = {
        cmocka_unit_test(test_views_share_storage),
        cmocka_unit_test(test_view_shapes),
        cmocka_unit_test(test_views_random),
        cmocka_unit_test(test_views_of_unchecked_strides),
        cmocka_unit_test(test_view_errors),
    };
    const struct CMUnitTest copies[] = {
        cmocka_unit_test(test_copy_layouts_all_dtypes),
        cmocka_unit_test(test_copy_overlap),
        cmocka_unit_test(test_contiguous_clone_to),
        cmocka_unit_test(test_fill_views),
        cmocka_unit_test(test_copy_errors),
    };
    const struct CMUnitTest printing[] = {
        cmocka_unit_test(test_describe),
        cmocka_unit_test(test_print),
    };
    int failures = 0;
    failures += cmocka_run_group_tests_name("dtypes", dtypes, NULL, NULL);
    failures += cmocka_run_group_tests_name("creation", creation, NULL, NULL);
    failures += cmocka_run_group_tests_name("views", views, NULL, NULL);
    failures += cmocka_run_group_tests_name("copies", copies, NULL, NULL);
    failures += cmocka_run_group_tests_name("printing", printing, NULL, NULL);
    return failures == 0 ? 0 : 1;
}
