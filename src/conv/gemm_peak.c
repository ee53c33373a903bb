/* The sgemm peak measurement (see gemm_peak.h). */
#include <stdlib.h>

#include "conv/conv_cpu.h"
#include "conv/fused.h"
#include "conv/gemm.h"
#include "conv/gemm_peak.h"
#include "core/error.h"

/* One product C = A @ B split into row blocks, one per thread: one single-threaded GEMM call
 * each, or (packed != NULL) the fused kernels over the block's rows with B packed once. */
static void blocked_product(int threads, int64_t n, const float *a, const float *b,
                            const void *packed, float *c) {
    const int64_t rows = (n + threads - 1) / threads;
    SPCONV_OMP(omp parallel for num_threads(threads) schedule(static, 1))
    for (int t = 0; t < threads; ++t) {
        const int64_t first = t * rows, count = first + rows < n ? rows : n - first;
        if (count <= 0) continue;
        if (packed != NULL)
            spconv__fused_rows_set(SPCONV_F32, count, a, NULL, first, c, NULL, first, n, n, packed,
                                   NULL);
        else
            spconv__sgemm(SPCONV__GEMM_AUTO, 0, 0, count, n, n, a + first * n, n, b, n, 0.0f,
                          c + first * n, n);
    }
}

static double fastest_product(int threads, int64_t n, int repeat, const float *a, const float *b,
                              const void *packed, float *c) {
    blocked_product(threads, n, a, b, packed, c); /* warm-up: pages, caches, BLAS start-up */
    double fastest = 0.0;
    for (int r = 0; r < repeat; ++r) {
        const double start = spconv__now_s();
        blocked_product(threads, n, a, b, packed, c);
        const double seconds = spconv__now_s() - start;
        if (r == 0 || seconds < fastest) fastest = seconds;
    }
    return 2.0 * (double)n * (double)n * (double)n / fastest * 1e-9;
}

spconv_status spconv__sgemm_peak_parts(int threads, int64_t n, int repeat, double *blas_gflops,
                                       double *fused_gflops) {
    static const char func[] = "spconv__sgemm_peak";
    SPCONV_CHECK_NOT_NULL(func, blas_gflops);
    SPCONV_CHECK_NOT_NULL(func, fused_gflops);
    SPCONV_RETURN_ERROR_IF(n < 1 || n > 16384 || repeat < 1 || threads < 0,
                           SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: n = %lld must be in [1, 16384], repeat = %d >= 1, threads = %d >= 0",
                           func, (long long)n, repeat, threads);
#ifdef _OPENMP
    if (threads == 0) threads = omp_get_max_threads();
#else
    threads = 1;
#endif
    const int fused = spconv__fused_available();
    const size_t packed_bytes = fused ? spconv__fused_packed_bytes(SPCONV_F32, n, n) : 0;
    float *a = malloc((size_t)(3 * n * n) * sizeof *a + packed_bytes);
    if (a == NULL)
        SPCONV_RETURN_ERROR(SPCONV_ERR_OUT_OF_MEMORY, "%s: out of memory for 3 matrices %lld^2",
                            func, (long long)n);
    float *b = a + n * n, *c = b + n * n;
    uint64_t state = 0x9e3779b97f4a7c15u;
    for (int64_t i = 0; i < 2 * n * n; ++i) {
        state = state * 6364136223846793005u + 1442695040888963407u; /* speed, not quality */
        a[i] = (float)(state >> 40) * 0x1.0p-24f - 0.5f;
    }
    spconv__gemm_prepare();
    *blas_gflops = fastest_product(threads, n, repeat, a, b, NULL, c);
    *fused_gflops = 0.0;
    if (fused) {
        void *packed = c + n * n;
        spconv__fused_pack(SPCONV_F32, b, n, 0, n, n, packed);
        *fused_gflops = fastest_product(threads, n, repeat, a, b, packed, c);
    }
    free(a);
    return SPCONV_OK;
}

spconv_status spconv__sgemm_peak(int threads, int64_t n, int repeat, double *gflops) {
    SPCONV_CHECK_NOT_NULL("spconv__sgemm_peak", gflops);
    double blas, fused;
    SPCONV_FORWARD_IF_ERROR(spconv__sgemm_peak_parts(threads, n, repeat, &blas, &fused));
    *gflops = blas > fused ? blas : fused;
    return SPCONV_OK;
}
