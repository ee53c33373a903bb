/* The conv executors' GEMM: the plain-C blocked fallback (called directly, as builds without BLAS
 * use it) and the default path (BLAS when built in) against a naive triple loop in double, over
 * transposes, leading dimensions with padding, beta 0 and 1, sizes of 0 and sizes that cross the
 * fallback's block edges. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "conv/fused.h"
#include "conv/gemm.h"

typedef struct gemm_case {
    int trans_a, trans_b;
    int64_t m, n, k, lda, ldb, ldc;
    int beta_one;
} gemm_case;

/* Element (i, p) of op(A) for A stored row-major with leading dimension lda. */
static double op_at(const double *a, int trans, int64_t ld, int64_t row, int64_t col) {
    return trans ? a[col * ld + row] : a[row * ld + col];
}

/* C = op(A) op(B) + beta C in double: the obviously-correct definition. abs_sum receives, per
 * entry, the sum of the magnitudes of its terms (|a_ip b_pj| over p, plus |c| when beta is 1),
 * which scales the rounding error of any summation order. */
static void naive_gemm(const gemm_case *g, const double *a, const double *b, double *c,
                       double *abs_sum) {
    for (int64_t i = 0; i < g->m; ++i)
        for (int64_t j = 0; j < g->n; ++j) {
            double sum = g->beta_one ? c[i * g->ldc + j] : 0.0, mag = fabs(sum);
            for (int64_t p = 0; p < g->k; ++p) {
                double term = op_at(a, g->trans_a, g->lda, i, p) * op_at(b, g->trans_b, g->ldb, p, j);
                sum += term;
                mag += fabs(term);
            }
            c[i * g->ldc + j] = sum;
            abs_sum[i * g->ldc + j] = mag;
        }
}

/* gamma_n = n u / (1 - n u): a sum of n products computed in any order with unit roundoff u
 * (with or without fused multiply-adds) is within gamma_n * sum|terms| of the exact value
 * (Higham, Accuracy and Stability of Numerical Algorithms, section 3.1). */
static double gamma_n(int64_t n, double unit_roundoff) {
    double nu = (double)n * unit_roundoff;
    return nu / (1.0 - nu);
}

static double *random_matrix(int64_t n) {
    double *v = malloc((size_t)(n + 1) * sizeof(double));
    assert_non_null(v);
    for (int64_t i = 0; i < n; ++i) v[i] = spconv_test_rand_float(-1.0f, 1.0f);
    return v;
}

/* Largest ratio over C's m x n block of |got - want| to the bound that the arithmetic allows:
 * got is a sum of k + 1 terms (beta C counts as one) in a precision of unit roundoff u, want the
 * same sum in double, so |got - want| <= (gamma_{k+1}(u) + gamma_{k+1}(2^-53)) * abs_sum. The
 * inputs are exact in both precisions (floats stored in doubles). A ratio above 1 is a real
 * error; a NaN (C's NaN start leaking through beta = 0) is infinite. */
static double block_error(const gemm_case *g, const double *got, const double *want,
                          const double *abs_sum, double unit_roundoff) {
    const double bound = gamma_n(g->k + 1, unit_roundoff) + gamma_n(g->k + 1, 0x1p-53);
    double worst = 0.0;
    for (int64_t i = 0; i < g->m; ++i)
        for (int64_t j = 0; j < g->n; ++j) {
            const int64_t at = i * g->ldc + j;
            double d = fabs(got[at] - want[at]);
            if (isnan(d)) return INFINITY;
            /* an entry with no terms (k = 0, beta = 0) must be exactly 0 */
            double ratio = d == 0.0 ? 0.0 : d / (bound * abs_sum[at]);
            if (ratio > worst) worst = ratio;
        }
    return worst;
}

/* Run one case through @p impl (or the fallback entry points directly when @p direct) in f32 and
 * f64; C starts as NaN when beta is 0, which must not leak through. */
static void check_case(const gemm_case *g, spconv__gemm_impl impl, int direct) {
    int64_t a_rows = g->trans_a ? g->k : g->m, b_rows = g->trans_b ? g->n : g->k;
    int64_t a_n = a_rows * g->lda, b_n = b_rows * g->ldb, c_n = g->m * g->ldc;
    double *a = random_matrix(a_n), *b = random_matrix(b_n), *c0 = random_matrix(c_n);
    if (!g->beta_one)
        for (int64_t i = 0; i < c_n; ++i) c0[i] = NAN;
    double *want = malloc((size_t)(c_n + 1) * sizeof(double));
    double *abs_sum = malloc((size_t)(c_n + 1) * sizeof(double));
    float *af = malloc((size_t)(a_n + 1) * sizeof(float)),
          *bf = malloc((size_t)(b_n + 1) * sizeof(float));
    float *cf = malloc((size_t)(c_n + 1) * sizeof(float));
    double *cd = malloc((size_t)(c_n + 1) * sizeof(double)),
           *cf_d = malloc((size_t)(c_n + 1) * sizeof(double));
    assert_true(want && abs_sum && af && bf && cf && cd && cf_d);
    for (int64_t i = 0; i < c_n; ++i) want[i] = cd[i] = c0[i], cf[i] = (float)c0[i];
    for (int64_t i = 0; i < a_n; ++i) af[i] = (float)a[i];
    for (int64_t i = 0; i < b_n; ++i) bf[i] = (float)b[i];
    naive_gemm(g, a, b, want, abs_sum);
    if (direct) {
        spconv__sgemm_fallback(g->trans_a, g->trans_b, g->m, g->n, g->k, af, g->lda, bf, g->ldb,
                               (float)g->beta_one, cf, g->ldc);
        spconv__dgemm_fallback(g->trans_a, g->trans_b, g->m, g->n, g->k, a, g->lda, b, g->ldb,
                               (double)g->beta_one, cd, g->ldc);
    } else {
        spconv__gemm(SPCONV_F32, impl, g->trans_a, g->trans_b, g->m, g->n, g->k, af, g->lda, bf,
                     g->ldb, g->beta_one, cf, g->ldc);
        spconv__gemm(SPCONV_F64, impl, g->trans_a, g->trans_b, g->m, g->n, g->k, a, g->lda, b,
                     g->ldb, g->beta_one, cd, g->ldc);
    }
    for (int64_t i = 0; i < c_n; ++i) cf_d[i] = cf[i];
    /* Each error is a fraction of the entry's own rounding bound (see block_error), so the check
     * can fail only on a wrong result, never on cancellation in a sum that is nearly 0. */
    double err32 = block_error(g, cf_d, want, abs_sum, 0x1p-24);
    double err64 = block_error(g, cd, want, abs_sum, 0x1p-53);
    if (!(err32 <= 1.0) || !(err64 <= 1.0))
        fail_msg("gemm %s m=%lld n=%lld k=%lld trans=(%d,%d) ld=(%lld,%lld,%lld) beta=%d: "
                 "f32 error %.3g, f64 error %.3g of the rounding bound",
                 direct ? "fallback" : "default", (long long)g->m, (long long)g->n, (long long)g->k,
                 g->trans_a, g->trans_b, (long long)g->lda, (long long)g->ldb, (long long)g->ldc,
                 g->beta_one, err32, err64);
    free(a), free(b), free(c0), free(want), free(abs_sum), free(af), free(bf), free(cf), free(cd), free(cf_d);
}

static gemm_case random_case(void) {
    gemm_case g;
    g.trans_a = (int)spconv_test_rand_int(0, 1);
    g.trans_b = (int)spconv_test_rand_int(0, 1);
    /* mostly small, sometimes 0, sometimes past the fallback's 64 x 128 blocks */
    int64_t limits[3] = {9, 70, 300};
    g.m = spconv_test_rand_int(0, limits[spconv_test_rand_int(0, 2)]);
    g.n = spconv_test_rand_int(0, limits[spconv_test_rand_int(0, 2)]);
    g.k = spconv_test_rand_int(0, limits[spconv_test_rand_int(0, 2)]);
    int64_t a_cols = g.trans_a ? g.m : g.k, b_cols = g.trans_b ? g.k : g.n;
    g.lda = (a_cols > 0 ? a_cols : 1) + spconv_test_rand_int(0, 3);
    g.ldb = (b_cols > 0 ? b_cols : 1) + spconv_test_rand_int(0, 3);
    g.ldc = (g.n > 0 ? g.n : 1) + spconv_test_rand_int(0, 3);
    g.beta_one = (int)spconv_test_rand_int(0, 1);
    return g;
}

static void test_fallback_vs_naive(void **state) {
    (void)state;
    for (int i = 0; i < 300; ++i) {
        gemm_case g = random_case();
        check_case(&g, SPCONV__GEMM_FALLBACK, 1);
        check_case(&g, SPCONV__GEMM_FALLBACK, 0);
    }
}

static void test_default_vs_naive(void **state) {
    (void)state;
    printf("default GEMM: %s\n", spconv__gemm_has_blas() ? "BLAS" : "fallback");
    spconv__gemm_prepare();
    for (int i = 0; i < 300; ++i) {
        gemm_case g = random_case();
        check_case(&g, SPCONV__GEMM_AUTO, 0);
    }
    /* The conv executors' shapes: a gathered chunk times W[k], its transpose, and the
     * weight-gradient product over a long k. */
    gemm_case shapes[3] = {{0, 0, 1024, 64, 64, 64, 64, 64, 0},
                           {0, 1, 1024, 64, 64, 64, 64, 64, 1},
                           {1, 0, 64, 48, 1500, 64, 48, 48, 1}};
    for (int i = 0; i < 3; ++i) {
        check_case(&shapes[i], SPCONV__GEMM_AUTO, 0);
        check_case(&shapes[i], SPCONV__GEMM_FALLBACK, 1);
    }
}

/* The fused kernels' promise (fused.h): y[dst_i, j] += (sum over p, increasing, of x[src_i, p] *
 * B[p, j] by fused multiply-adds from zero), or in set mode y[dst_i, j] = bias[j] (or 0) + that
 * sum, a NaN result stored as the default quiet NaN, whatever the count, tiles and tails. The scalar
 * loop below does exactly that with fma(), so the two agree bit for bit; rows of y that no pair
 * targets must keep their bits. */
/* The default quiet NaN that the fused kernels store for every NaN result. */
static float canonical_nan_float(void) {
    const uint32_t bits = 0x7fc00000u;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
static double canonical_nan_double(void) {
    const uint64_t bits = 0x7ff8000000000000ull;
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

#define FUSED_REFERENCE(T, FMA)                                                                    \
    static void fused_reference_##T(int64_t count, const T *x, const int32_t *src, T *y,           \
                                    const int32_t *dst, int64_t k, int64_t n, const T *b,          \
                                    int64_t ldb, int trans, int set, const T *bias) {              \
        for (int64_t i = 0; i < count; ++i)                                                        \
            for (int64_t j = 0; j < n; ++j) {                                                      \
                T acc = 0;                                                                         \
                for (int64_t p = 0; p < k; ++p)                                                    \
                    acc = FMA(x[(int64_t)src[i] * k + p], trans ? b[j * ldb + p] : b[p * ldb + j], \
                              acc);                                                                \
                T *out = &y[(int64_t)dst[i] * n + j];                                              \
                *out = set ? (bias != NULL ? bias[j] : (T)0) + acc : *out + acc;                   \
                if (isnan(*out)) *out = canonical_nan_##T();                                       \
            }                                                                                      \
    }
FUSED_REFERENCE(float, fmaf)
FUSED_REFERENCE(double, fma)

#define FUSED_CASE(T, DTYPE)                                                                       \
    {                                                                                              \
        T *x = malloc((size_t)(rows * k + 1) * sizeof(T));                                         \
        T *b = malloc((size_t)(b_len + 1) * sizeof(T));                                    \
        T *y = malloc((size_t)(rows * n) * sizeof(T)), *want = malloc((size_t)(rows * n) * sizeof(T)); \
        void *packed = malloc(spconv__fused_packed_bytes(DTYPE, k, n));                            \
        T *bias = malloc((size_t)n * sizeof(T));                                                   \
        assert_true(x && b && y && want && packed && bias);                                        \
        for (int64_t j = 0; j < n; ++j) bias[j] = (T)spconv_test_rand_float(-1.0f, 1.0f);          \
        const T *use_bias = with_bias ? bias : NULL;                                               \
        for (int64_t i = 0; i < rows * k; ++i) x[i] = (T)spconv_test_rand_float(-1.0f, 1.0f);      \
        if (special && rows * k > 0) { /* NaNs and infinities: the NaN results' bits are fixed */  \
            x[spconv_test_rand_int(0, rows * k - 1)] = (T)NAN;                                     \
            x[spconv_test_rand_int(0, rows * k - 1)] = (T)INFINITY;                                \
            x[spconv_test_rand_int(0, rows * k - 1)] = -(T)INFINITY;                               \
        }                                                                                          \
        for (int64_t i = 0; i < b_len; ++i) b[i] = (T)spconv_test_rand_float(-1.0f, 1.0f); \
        for (int64_t i = 0; i < rows * n; ++i) want[i] = y[i] = (T)spconv_test_rand_float(-2.0f, 2.0f); \
        spconv__fused_pack(DTYPE, b, ldb, trans, k, n, packed);                                    \
        fused_reference_##T(count, x, src, want, dst, k, n, b, ldb, trans, set, use_bias);         \
        const int32_t *s_rows = identity ? NULL : src, *d_rows = identity ? NULL : dst;            \
        /* direct: B read where it lies (row p at b + p * ldb), not packed */                      \
        const int direct = !trans && spconv__fused_reads_b(DTYPE, n) && read_b;                    \
        const void *use_b = direct ? (const void *)b : packed;                                     \
        if (set)                                                                                   \
            spconv__fused_rows_set(DTYPE, count, x, s_rows, 0, y, d_rows, 0, k, n, use_b,          \
                                   direct ? ldb : 0, use_bias);                                    \
        else                                                                                       \
            spconv__fused_rows(DTYPE, count, x, s_rows, 0, y, d_rows, 0, k, n, use_b,              \
                               direct ? ldb : 0);                                                  \
        if (memcmp(y, want, (size_t)(rows * n) * sizeof(T)) != 0)                                  \
            fail_msg("fused %s rows differ: count %lld k %lld n %lld trans %d identity %d set %d " \
                     "bias %d direct %d", #T, (long long)count, (long long)k, (long long)n, trans, \
                     identity, set, with_bias, direct);                                            \
        free(x), free(b), free(y), free(want), free(packed), free(bias);                           \
    }

/* Run @p cases once with every kernel set the machine has (AVX2, and AVX-512 where present),
 * then restore the default set; skipped without AVX2 + FMA. */
static void for_each_kernel_set(const char *what, void (*cases)(void)) {
    if (!spconv__fused_available()) {
        printf("skipped: this machine has no AVX2 + FMA, so the executors use the unfused path\n");
        skip();
    }
    const int widest = spconv__fused_isa(0);
    for (int isa = 2; isa <= widest; ++isa) {
        spconv__fused_isa(isa);
        printf("%s: checking the %s set\n", what, isa == 3 ? "AVX-512" : "AVX2");
        cases();
    }
    spconv__fused_isa(widest);
}

static void fused_rows_cases(void);

static void test_fused_rows_bitwise(void **state) {
    (void)state;
    for_each_kernel_set("fused kernels", fused_rows_cases);
}

static void fused_rows_cases(void) {
    for (int iter = 0; iter < 400; ++iter) {
        const int64_t rows = spconv_test_rand_int(1, 60);
        const int64_t count = spconv_test_rand_int(0, rows);
        const int trans = (int)spconv_test_rand_int(0, 1), identity = (int)spconv_test_rand_int(0, 3) == 0;
        /* half the cases whole tiles (16 floats, 8 doubles), which B may be read in place for */
        const int64_t tile = iter % 2 == 0 ? 16 : 8;
        const int whole = (int)spconv_test_rand_int(0, 1), read_b = (int)spconv_test_rand_int(0, 2) > 0;
        const int64_t k = spconv_test_rand_int(0, 70);
        const int64_t n = whole ? tile * spconv_test_rand_int(1, 5) : spconv_test_rand_int(1, 70);
        const int set = (int)spconv_test_rand_int(0, 2) == 0, with_bias = (int)spconv_test_rand_int(0, 1);
        const int special = (int)spconv_test_rand_int(0, 4) == 0;
        const int64_t ldb = (trans ? k : n) + spconv_test_rand_int(0, 2);
        const int64_t b_len = (trans ? n : k) * ldb; /* B's rows as stored */
        int32_t *src = malloc((size_t)rows * sizeof(int32_t)), *dst = malloc((size_t)rows * sizeof(int32_t));
        assert_true(src && dst);
        /* src rows may repeat; dst rows are distinct (a random permutation's prefix). */
        for (int64_t i = 0; i < rows; ++i) dst[i] = (int32_t)i;
        for (int64_t i = rows - 1; i > 0; --i) {
            int64_t r = spconv_test_rand_int(0, i);
            int32_t t = dst[i];
            dst[i] = dst[r], dst[r] = t;
        }
        for (int64_t i = 0; i < rows; ++i) src[i] = identity ? (int32_t)i : (int32_t)spconv_test_rand_int(0, rows - 1);
        if (identity)
            for (int64_t i = 0; i < rows; ++i) dst[i] = (int32_t)i;
        if (iter % 2 == 0)
            FUSED_CASE(float, SPCONV_F32)
        else
            FUSED_CASE(double, SPCONV_F64)
        free(src), free(dst);
    }
}

/* The fused weight gradient (fused.h): sums[c, j] += (sum over i, increasing, of x[src_i, c] *
 * g[dst_i, j] by fused multiply-adds from zero), the NaN results as the default NaN; rows may
 * repeat on both sides. The scalar loop below does exactly that, so they agree bit for bit. */
#define WEIGHT_REFERENCE(T, FMA)                                                                   \
    static void weight_reference_##T(int64_t count, const T *x, const int32_t *src, const T *g,    \
                                     const int32_t *dst, int64_t c_in, int64_t c_out, T *sums) {   \
        for (int64_t c = 0; c < c_in; ++c)                                                         \
            for (int64_t j = 0; j < c_out; ++j) {                                                  \
                T acc = 0;                                                                         \
                for (int64_t i = 0; i < count; ++i)                                                \
                    acc = FMA(x[(int64_t)src[i] * c_in + c], g[(int64_t)dst[i] * c_out + j], acc); \
                T *out = &sums[c * c_out + j];                                                     \
                *out += acc;                                                                       \
                if (isnan(*out)) *out = canonical_nan_##T();                                       \
            }                                                                                      \
    }
WEIGHT_REFERENCE(float, fmaf)
WEIGHT_REFERENCE(double, fma)

#define WEIGHT_CASE(T, DTYPE)                                                                      \
    {                                                                                              \
        /* x and g exactly their rows (a read past the last row is out of bounds under ASan) */   \
        T *x = malloc((size_t)(rows * c_in) * sizeof(T));                                          \
        T *g = malloc((size_t)(rows * c_out) * sizeof(T));                                         \
        T *sums = malloc((size_t)(c_in * c_out) * sizeof(T));                                      \
        T *want = malloc((size_t)(c_in * c_out) * sizeof(T));                                      \
        void *scratch = malloc(spconv__fused_weight_scratch_bytes(DTYPE, count, c_in, c_out));     \
        assert_true(x && g && sums && want && scratch);                                            \
        for (int64_t i = 0; i < rows * c_in; ++i) x[i] = (T)spconv_test_rand_float(-1.0f, 1.0f);   \
        for (int64_t i = 0; i < rows * c_out; ++i) g[i] = (T)spconv_test_rand_float(-1.0f, 1.0f);  \
        if (special) {                                                                             \
            x[spconv_test_rand_int(0, rows * c_in - 1)] = (T)NAN;                                  \
            g[spconv_test_rand_int(0, rows * c_out - 1)] = (T)INFINITY;                            \
        }                                                                                          \
        for (int64_t i = 0; i < c_in * c_out; ++i)                                                 \
            want[i] = sums[i] = (T)spconv_test_rand_float(-2.0f, 2.0f);                            \
        weight_reference_##T(count, x, src, g, dst, c_in, c_out, want);                            \
        /* the packed tiles too, lanes past c_out included (the product never stores those):     \
         * tile t row i holds g[dst_i, t * tw ..] and zeros past c_out, over a poisoned scratch */ \
        const int64_t tw = sizeof(T) == 4 ? 16 : 8, tiles = (c_out + tw - 1) / tw;                 \
        memset(scratch, 0xff, spconv__fused_weight_scratch_bytes(DTYPE, count, c_in, c_out));      \
        spconv__fused_weight_gather(DTYPE, count, x, identity ? NULL : src, base, g,               \
                                    identity ? NULL : dst, base, c_in, c_out, scratch);            \
        for (int64_t t = 0; t < tiles; ++t)                                                        \
            for (int64_t i = 0; i < count; ++i)                                                    \
                for (int64_t e = 0; e < tw; ++e) {                                                 \
                    const int64_t col = t * tw + e, row = identity ? base + i : dst[i];            \
                    const T want_v = col < c_out ? g[row * c_out + col] : (T)0;                    \
                    const T *got = (const T *)scratch + (t * count + i) * tw + e;                  \
                    if (memcmp(got, &want_v, sizeof(T)) != 0)                                      \
                        fail_msg("fused %s weight gather: tile %lld row %lld lane %lld differs "   \
                                 "(count %lld c_out %lld identity %d)", #T, (long long)t,          \
                                 (long long)i, (long long)e, (long long)count, (long long)c_out,   \
                                 identity);                                                        \
                }                                                                                  \
        spconv__fused_weight_product(DTYPE, count, x, identity ? NULL : src, base, c_in, c_out,    \
                                     scratch, sums);                                               \
        if (memcmp(sums, want, (size_t)(c_in * c_out) * sizeof(T)) != 0)                           \
            fail_msg("fused %s weight gradient differs: count %lld c_in %lld c_out %lld "          \
                     "identity %d", #T, (long long)count, (long long)c_in, (long long)c_out,       \
                     identity);                                                                    \
        free(x), free(g), free(sums), free(want), free(scratch);                                   \
    }

static void fused_weight_cases(void) {
    for (int iter = 0; iter < 300; ++iter) {
        /* up to 160 pairs: past the gather's prefetch distance (48) */
        const int64_t rows = spconv_test_rand_int(1, 160);
        const int64_t count = spconv_test_rand_int(1, rows);
        const int64_t c_in = spconv_test_rand_int(1, 40), c_out = spconv_test_rand_int(1, 70);
        const int identity = (int)spconv_test_rand_int(0, 3) == 0;
        const int special = (int)spconv_test_rand_int(0, 4) == 0;
        int32_t *src = malloc((size_t)rows * sizeof(int32_t));
        int32_t *dst = malloc((size_t)rows * sizeof(int32_t));
        assert_true(src && dst);
        const int64_t base = identity ? rows - count : 0; /* identity: rows base.. */
        for (int64_t i = 0; i < rows; ++i) {
            src[i] = identity ? (int32_t)(base + i) : (int32_t)spconv_test_rand_int(0, rows - 1);
            dst[i] = identity ? (int32_t)(base + i) : (int32_t)spconv_test_rand_int(0, rows - 1);
        }
        if (iter % 2 == 0)
            WEIGHT_CASE(float, SPCONV_F32)
        else
            WEIGHT_CASE(double, SPCONV_F64)
        free(src), free(dst);
    }
}

static void test_fused_weight_bitwise(void **state) {
    (void)state;
    for_each_kernel_set("fused weight gradient", fused_weight_cases);
}

/* The out-row kernels (fused.h) against the per-offset kernels, which the forward ran before: the
 * identity's rows set (bias + x W_self) or the rows set to the bias (or zero), then each offset's
 * pairs added in increasing offset order. The two must agree bit for bit, NaNs and infinities
 * included, whether B is packed or read in place. */
#define OUT_ROWS_CASE(T, DTYPE)                                                                    \
    {                                                                                              \
        const int64_t tile = DTYPE == SPCONV_F32 ? 16 : 8;                                         \
        const int64_t n = spconv_test_rand_int(0, 1) ? tile * spconv_test_rand_int(1, 6)           \
                                                    : spconv_test_rand_int(1, 100);                \
        const int64_t k = spconv_test_rand_int(0, 6), offsets = spconv_test_rand_int(1, 64);       \
        const int64_t rows = spconv_test_rand_int(1, 80), num_x = spconv_test_rand_int(1, 90);     \
        const int self = (int)spconv_test_rand_int(0, 1) && num_x >= rows;                         \
        const int with_bias = (int)spconv_test_rand_int(0, 1);                                     \
        const int in_place = spconv__fused_reads_b(DTYPE, n) && spconv_test_rand_int(0, 2) > 0;    \
        const int64_t ldb = n + (in_place ? spconv_test_rand_int(0, 1) * tile : 0);                \
        const int64_t ws = offsets + 1; /* the last one is W_self */                               \
        T *x = malloc((size_t)(num_x * k + 1) * sizeof(T));                                        \
        T *b = malloc((size_t)(ws * k * ldb + 1) * sizeof(T));                                     \
        char *packed = malloc((size_t)ws * spconv__fused_packed_bytes(DTYPE, k, n) + 1);           \
        T *bias = malloc((size_t)n * sizeof(T));                                                   \
        T *y = malloc((size_t)(rows * n) * sizeof(T)), *want = malloc((size_t)(rows * n) * sizeof(T)); \
        uint64_t *masks = malloc((size_t)rows * sizeof(uint64_t));                                 \
        int32_t *sources = malloc((size_t)(rows * offsets) * sizeof(int32_t));                     \
        int32_t *src = malloc((size_t)rows * sizeof(int32_t)), *dst = malloc((size_t)rows * sizeof(int32_t)); \
        const void *w[64];                                                                         \
        assert_true(x && b && packed && bias && y && want && masks && sources && src && dst);      \
        for (int64_t i = 0; i < num_x * k; ++i) x[i] = (T)spconv_test_rand_float(-1.0f, 1.0f);     \
        if (spconv_test_rand_int(0, 3) == 0 && num_x * k > 0) {                                    \
            x[spconv_test_rand_int(0, num_x * k - 1)] = (T)NAN;                                    \
            x[spconv_test_rand_int(0, num_x * k - 1)] = (T)INFINITY;                               \
            x[spconv_test_rand_int(0, num_x * k - 1)] = -(T)INFINITY;                              \
        }                                                                                          \
        for (int64_t i = 0; i < ws * k * ldb; ++i) b[i] = (T)spconv_test_rand_float(-1.0f, 1.0f);  \
        for (int64_t j = 0; j < n; ++j) bias[j] = (T)spconv_test_rand_float(-1.0f, 1.0f);          \
        if (spconv_test_rand_int(0, 2) == 0) /* NaNs with a sign or a payload, -0: a row that no \
                                              * product reaches keeps these bits as they are */ \
            for (int q = 0; q < 4; ++q) {                                                          \
                const int64_t j = spconv_test_rand_int(0, n - 1);                                  \
                if (sizeof(T) == 4) {                                                              \
                    const uint32_t bits[4] = {0xffc00000u, 0x7fc01234u, 0x7f800001u, 0x80000000u}; \
                    memcpy(&bias[j], &bits[q], sizeof(T));                                         \
                } else {                                                                           \
                    const uint64_t bits[4] = {UINT64_C(0xfff8000000000000),                        \
                                              UINT64_C(0x7ff8000000001234),                        \
                                              UINT64_C(0x7ff0000000000001),                        \
                                              UINT64_C(0x8000000000000000)};                       \
                    memcpy(&bias[j], &bits[q], sizeof(T));                                         \
                }                                                                                  \
            }                                                                                      \
        const size_t pb = spconv__fused_packed_bytes(DTYPE, k, n);                                 \
        for (int64_t o = 0; o < ws; ++o)                                                           \
            spconv__fused_pack(DTYPE, b + o * k * ldb, ldb, 0, k, n, packed + (size_t)o * pb);     \
        for (int64_t o = 0; o < offsets; ++o)                                                      \
            w[o] = in_place ? (const void *)(b + o * k * ldb) : (const void *)(packed + (size_t)o * pb); \
        const void *w_self = !self ? NULL : in_place ? (const void *)(b + offsets * k * ldb)       \
                                                     : (const void *)(packed + (size_t)offsets * pb); \
        for (int64_t i = 0; i < rows; ++i) {                                                       \
            masks[i] = 0;                                                                          \
            for (int64_t o = 0; o < offsets; ++o) {                                                \
                sources[i * offsets + o] = (int32_t)spconv_test_rand_int(0, num_x - 1);            \
                if (spconv_test_rand_int(0, 3) == 0) masks[i] |= UINT64_C(1) << o;                 \
            }                                                                                      \
        }                                                                                          \
        const T *use_bias = with_bias ? bias : NULL;                                               \
        const int64_t use_ldb = in_place ? ldb : 0;                                                \
        /* the per-offset way */                                                                   \
        if (self)                                                                                  \
            spconv__fused_rows_set(DTYPE, rows, x, NULL, 0, want, NULL, 0, k, n, w_self, use_ldb,  \
                                   use_bias);                                                      \
        else                                                                                       \
            for (int64_t i = 0; i < rows; ++i)                                                     \
                for (int64_t j = 0; j < n; ++j) want[i * n + j] = use_bias ? bias[j] : (T)0;       \
        for (int64_t o = 0; o < offsets; ++o) {                                                    \
            int64_t count = 0;                                                                     \
            for (int64_t i = 0; i < rows; ++i)                                                     \
                if (masks[i] >> o & 1) {                                                           \
                    src[count] = sources[i * offsets + o];                                         \
                    dst[count++] = (int32_t)i;                                                     \
                }                                                                                  \
            spconv__fused_rows(DTYPE, count, x, src, 0, want, dst, 0, k, n, w[o], use_ldb);        \
        }                                                                                          \
        for (int64_t i = 0; i < rows * n; ++i) y[i] = (T)spconv_test_rand_float(-2.0f, 2.0f);     \
        spconv__fused_out_rows(DTYPE, rows, x, 0, w_self, masks, sources, offsets, w, use_ldb, k,  \
                               n, use_bias, y);                                                    \
        if (memcmp(y, want, (size_t)(rows * n) * sizeof(T)) != 0)                                  \
            fail_msg("out rows %s differ: rows %lld k %lld n %lld offsets %lld self %d bias %d "   \
                     "in place %d", #T, (long long)rows, (long long)k, (long long)n,               \
                     (long long)offsets, self, with_bias, in_place);                               \
        free(x), free(b), free(packed), free(bias), free(y), free(want), free(masks);              \
        free(sources), free(src), free(dst);                                                       \
    }

static void out_rows_cases(void) {
    for (int iter = 0; iter < 300; ++iter) {
        if (iter % 2 == 0)
            OUT_ROWS_CASE(float, SPCONV_F32)
        else
            OUT_ROWS_CASE(double, SPCONV_F64)
    }
}

static void test_fused_out_rows_bitwise(void **state) {
    (void)state;
    for_each_kernel_set("out-row kernels", out_rows_cases);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fallback_vs_naive),
        cmocka_unit_test(test_default_vs_naive),
        cmocka_unit_test(test_fused_rows_bitwise),
        cmocka_unit_test(test_fused_weight_bitwise),
        cmocka_unit_test(test_fused_out_rows_bitwise),
    };
    spconv_test_seed();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
