/* The sgemm peak measurement (see gemm_peak.h). */
#include <stdlib.h>
#include <string.h>

#include "conv/conv_cpu.h"
#include "conv/fused.h"
#include "conv/gemm.h"
#include "conv/gemm_peak.h"
#include "core/error.h"

/* The fused kernels' product is blocked as a GEMM library blocks its own: B in PANEL x PANEL
 * blocks, packed once per product, and each thread's rows of A and C in PANEL-wide panels, so
 * that a block of B stays in L2 while the rows stream past it, as in a conv layer (K, N <= 256). */
#define PANEL 256

typedef struct fused_scratch {
    void *packed;   /* [kb][nb] blocks of B, spconv__fused_packed_bytes(PANEL, PANEL) each */
    float *panels;  /* per thread: A's rows in [kb][count][PANEL] panels, then C's [count][PANEL] */
    size_t block_bytes;
    int64_t thread_floats;
} fused_scratch;

static void fused_thread_product(const fused_scratch *f, int t, int64_t n, int64_t first,
                                 int64_t count, const float *a, float *c) {
    const int64_t blocks = (n + PANEL - 1) / PANEL;
    float *ap = f->panels + t * f->thread_floats, *cp = ap + count * blocks * PANEL;
    for (int64_t kb = 0; kb < blocks; ++kb) { /* panel kb: [count, kw], contiguous */
        const int64_t kw = n - kb * PANEL < PANEL ? n - kb * PANEL : PANEL;
        for (int64_t i = 0; i < count; ++i)
            memcpy(ap + kb * count * PANEL + i * kw, a + (first + i) * n + kb * PANEL,
                   (size_t)kw * sizeof(float));
    }
    for (int64_t nb = 0; nb < blocks; ++nb) { /* C's panel nb: [count, nw], contiguous */
        const int64_t nw = n - nb * PANEL < PANEL ? n - nb * PANEL : PANEL;
        for (int64_t kb = 0; kb < blocks; ++kb) {
            const int64_t kw = n - kb * PANEL < PANEL ? n - kb * PANEL : PANEL;
            const char *block = (const char *)f->packed + (size_t)(kb * blocks + nb) * f->block_bytes;
            const float *panel = ap + kb * count * PANEL;
            if (kb == 0)
                spconv__fused_rows_set(SPCONV_F32, count, panel, NULL, 0, cp, NULL, 0, kw, nw,
                                       block, 0, NULL);
            else
                spconv__fused_rows(SPCONV_F32, count, panel, NULL, 0, cp, NULL, 0, kw, nw, block, 0);
        }
        for (int64_t i = 0; i < count; ++i)
            memcpy(c + (first + i) * n + nb * PANEL, cp + i * nw, (size_t)nw * sizeof(float));
    }
}

/* One product C = A @ B split into row blocks, one per thread: one single-threaded GEMM call
 * each, or (f != NULL) the fused kernels over the block's rows. */
static void blocked_product(int threads, int64_t n, const float *a, const float *b,
                            const fused_scratch *f, float *c) {
    const int64_t rows = (n + threads - 1) / threads, blocks = (n + PANEL - 1) / PANEL;
    SPCONV_OMP(omp parallel num_threads(threads)) {
        if (f != NULL) {
            SPCONV_OMP(omp for schedule(static))
            for (int64_t blk = 0; blk < blocks * blocks; ++blk) {
                const int64_t kb = blk / blocks, nb = blk % blocks;
                const int64_t kw = n - kb * PANEL < PANEL ? n - kb * PANEL : PANEL,
                              nw = n - nb * PANEL < PANEL ? n - nb * PANEL : PANEL;
                spconv__fused_pack(SPCONV_F32, b + kb * PANEL * n + nb * PANEL, n, 0, kw, nw,
                                   (char *)f->packed + (size_t)blk * f->block_bytes);
            }
        }
        SPCONV_OMP(omp for schedule(static, 1))
        for (int t = 0; t < threads; ++t) {
            const int64_t first = t * rows, count = first + rows < n ? rows : n - first;
            if (count <= 0) continue;
            if (f != NULL)
                fused_thread_product(f, t, n, first, count, a, c);
            else
                spconv__sgemm(SPCONV__GEMM_AUTO, 0, 0, count, n, n, a + first * n, n, b, n, 0.0f,
                              c + first * n, n);
        }
    }
}

static double fastest_product(int threads, int64_t n, int repeat, const float *a, const float *b,
                              const fused_scratch *f, float *c) {
    blocked_product(threads, n, a, b, f, c); /* warm-up: pages, caches, BLAS start-up */
    double fastest = 0.0;
    for (int r = 0; r < repeat; ++r) {
        const double start = spconv__now_s();
        blocked_product(threads, n, a, b, f, c);
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
    const int64_t blocks = (n + PANEL - 1) / PANEL, rows = (n + threads - 1) / threads;
    fused_scratch f = {NULL, NULL, spconv__fused_packed_bytes(SPCONV_F32, PANEL, PANEL),
                       rows * (blocks + 1) * PANEL};
    const size_t fused_bytes =
        fused ? (size_t)(blocks * blocks) * f.block_bytes +
                    (size_t)(threads * f.thread_floats) * sizeof(float)
              : 0;
    float *a = malloc((size_t)(3 * n * n) * sizeof *a + fused_bytes);
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
        f.packed = c + n * n;
        f.panels = (float *)((char *)f.packed + (size_t)(blocks * blocks) * f.block_bytes);
        *fused_gflops = fastest_product(threads, n, repeat, a, b, &f, c);
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
