/* Row-major products through CBLAS (OpenBLAS) or the plain-C blocked fallback. */
#include "conv/gemm.h"
#include "conv/gemm_peak.h"

#include <stdio.h>
#include <string.h>

#include "spconv/config.h"

#if SPCONV_HAVE_BLAS
#include <cblas.h>
#endif

/* Fallback blocking: a [FALLBACK_KB, FALLBACK_NB] panel of op(B) is packed contiguously (32 KiB
 * in f32, 64 KiB in f64, on the stack) so that the innermost loop runs over contiguous memory
 * whether or not B is transposed, and a row segment of C (at most FALLBACK_NB elements) stays in
 * L1 while the panel's rows stream past it. Each C element still receives its k terms in
 * increasing order, like the naive triple loop. */
#define FALLBACK_KB 64
#define FALLBACK_NB 128

#define MIN_I64(x, y) ((x) < (y) ? (x) : (y))

/* One body for both element types, instantiated as two typed functions below so that callers
 * stay type-checked. */
#define SPCONV_FALLBACK_GEMM_BODY(T)                                                               \
    if (m <= 0 || n <= 0) return;                                                                  \
    if (beta != (T)1)                                                                              \
        for (int64_t i = 0; i < m; ++i)                                                            \
            for (int64_t j = 0; j < n; ++j)                                                        \
                c[i * ldc + j] = beta == (T)0 ? (T)0 : beta * c[i * ldc + j];                      \
    T panel[FALLBACK_KB * FALLBACK_NB];                                                            \
    for (int64_t j0 = 0; j0 < n; j0 += FALLBACK_NB) {                                              \
        int64_t nb = MIN_I64(FALLBACK_NB, n - j0);                                                 \
        for (int64_t p0 = 0; p0 < k; p0 += FALLBACK_KB) {                                          \
            int64_t kb = MIN_I64(FALLBACK_KB, k - p0);                                             \
            for (int64_t p = 0; p < kb; ++p)                                                       \
                for (int64_t j = 0; j < nb; ++j)                                                   \
                    panel[p * FALLBACK_NB + j] =                                                   \
                        trans_b ? b[(j0 + j) * ldb + p0 + p] : b[(p0 + p) * ldb + j0 + j];         \
            for (int64_t i = 0; i < m; ++i) {                                                      \
                T *restrict c_row = c + i * ldc + j0;                                              \
                for (int64_t p = 0; p < kb; ++p) {                                                 \
                    T a_ip = trans_a ? a[(p0 + p) * lda + i] : a[i * lda + p0 + p];                \
                    const T *restrict panel_row = panel + p * FALLBACK_NB;                         \
                    for (int64_t j = 0; j < nb; ++j) c_row[j] += a_ip * panel_row[j];              \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

SPCONV__VECTOR_CLONES
void spconv__sgemm_fallback(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                            const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                            float *c, int64_t ldc) {
    SPCONV_FALLBACK_GEMM_BODY(float)
}

SPCONV__VECTOR_CLONES
void spconv__dgemm_fallback(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                            const double *a, int64_t lda, const double *b, int64_t ldb, double beta,
                            double *c, int64_t ldc) {
    SPCONV_FALLBACK_GEMM_BODY(double)
}

#if SPCONV_HAVE_BLAS
static enum CBLAS_TRANSPOSE cblas_op(int trans) { return trans ? CblasTrans : CblasNoTrans; }
#endif

void spconv__sgemm(spconv__gemm_impl impl, int trans_a, int trans_b, int64_t m, int64_t n,
                   int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                   float *c, int64_t ldc) {
#if SPCONV_HAVE_BLAS
    /* BLAS rejects k = 0 through its leading-dimension checks (lda >= max(1, k) and friends) and
     * prints to stderr, so empty products stay with the fallback, which only applies beta. */
    if (impl != SPCONV__GEMM_FALLBACK && m > 0 && n > 0 && k > 0) {
        cblas_sgemm(CblasRowMajor, cblas_op(trans_a), cblas_op(trans_b), (blasint)m, (blasint)n,
                    (blasint)k, 1.0f, a, (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
        return;
    }
#endif
    spconv__sgemm_fallback(trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
}

void spconv__dgemm(spconv__gemm_impl impl, int trans_a, int trans_b, int64_t m, int64_t n,
                   int64_t k, const double *a, int64_t lda, const double *b, int64_t ldb,
                   double beta, double *c, int64_t ldc) {
#if SPCONV_HAVE_BLAS
    if (impl != SPCONV__GEMM_FALLBACK && m > 0 && n > 0 && k > 0) {
        cblas_dgemm(CblasRowMajor, cblas_op(trans_a), cblas_op(trans_b), (blasint)m, (blasint)n,
                    (blasint)k, 1.0, a, (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
        return;
    }
#endif
    spconv__dgemm_fallback(trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
}

void spconv__gemm(spconv_dtype dtype, spconv__gemm_impl impl, int trans_a, int trans_b, int64_t m,
                  int64_t n, int64_t k, const void *a, int64_t lda, const void *b, int64_t ldb,
                  int beta_one, void *c, int64_t ldc) {
    if (dtype == SPCONV_F32)
        spconv__sgemm(impl, trans_a, trans_b, m, n, k, a, lda, b, ldb, beta_one ? 1.0f : 0.0f, c,
                      ldc);
    else
        spconv__dgemm(impl, trans_a, trans_b, m, n, k, a, lda, b, ldb, beta_one ? 1.0 : 0.0, c,
                      ldc);
}

void spconv__gemm_prepare(void) {
#if SPCONV_HAVE_BLAS
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
#endif
}

int spconv__gemm_has_blas(void) { return SPCONV_HAVE_BLAS; }

const char *spconv__blas_name(void) {
#if SPCONV_HAVE_BLAS && defined(OPENBLAS_VERSION)
    static char name[96];
    if (name[0] == '\0') {
        const char *core = openblas_get_corename(), *version = OPENBLAS_VERSION; /* " OpenBLAS x " */
        while (*version == ' ') ++version;
        int len = (int)strlen(version);
        while (len > 0 && version[len - 1] == ' ') --len;
        snprintf(name, sizeof name, "%.*s (%s kernels)", len, version,
                 core != NULL ? core : "unknown");
    }
    return name;
#elif SPCONV_HAVE_BLAS
    return "CBLAS";
#else
    return "the built-in fallback GEMM";
#endif
}
