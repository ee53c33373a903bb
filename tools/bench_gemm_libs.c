/* bench_gemm_libs: which engine runs the products of the `basic` network fastest on this
 * machine: our fused kernels (conv/fused.h), the BLAS the build links (OpenBLAS), BLIS and
 * libxsmm. Issue 12 asked to measure these on the real layer shapes before choosing.
 *
 * The shapes are basic's 14 conv layers on spconv's benchmark input (125,562 sites), each as 27
 * products of pairs / 27 rows (one per kernel offset) by its W[k] (C_in x C_out), with the pair
 * counts `spconv bench --net basic --input ../shared/data` reports. Each offset's rows go in
 * calls of CHUNK rows (fewer where the threads would otherwise idle), all (offset, call) pairs
 * shared out to the threads (OpenMP, static), each call single-threaded on the thread's own
 * operand and product, which stay in its cache as a gathered chunk would: the libraries get
 * neither the gather nor the scatter that the unfused executor adds around them, so the
 * comparison favours them. The fused kernels pack each W[k] once per layer inside the timed
 * region, the offsets shared out to the threads, as the forward does.
 *
 *   - fused:    spconv__fused_rows_set (AVX2 or AVX-512, whichever the machine has), W[k]
 *               packed; "in place": the same kernels reading W[k] where it lies;
 *   - blas:     spconv__sgemm, i.e. cblas_sgemm of the linked BLAS (single-threaded per call);
 *   - blis:     cblas_sgemm of libblis.so.4, opened at run time with its own symbols first
 *               (RTLD_DEEPBIND), when installed (Debian: libblis4-serial or -openmp);
 *   - libxsmm:  JIT kernels from libxsmm_smmdispatch over strips of STRIP rows, when the build
 *               found libxsmm (Debian: libxsmm-dev; static only, so linked into this tool alone).
 *
 *   bench_gemm_libs [--repeat N] [--threads T]
 * Prints GFLOP/s per layer and engine (median of N timed repetitions after one warm-up, engines
 * taking turns within each repetition) and the sum of the medians over the network. A benchmark,
 * not a test: it asserts nothing about the timings; it checks that every engine computed the
 * same products (within a float32 error bound) so that no engine is timed doing something else. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef SPCONV_HAVE_LIBXSMM
#include <libxsmm.h>
#endif

#include "conv/fused.h"
#include "core/parallel.h"
#include "conv/gemm.h"
#include "conv/gemm_peak.h"
#include "bench_common.h"

#define OFFSETS 27
#define CHUNK 2048 /* rows per call */
#define STRIP 64   /* rows per libxsmm kernel call */
#define MAX_REPEAT 101

typedef struct layer_shape {
    const char *name;
    int64_t c_in, c_out, pairs;
} layer_shape;

/* basic on spconv_test_*: the convs' C_in, C_out and pairs (centre offset included). */
static const layer_shape layers[] = {
    {"net.0", 3, 64, 788888},     {"net.1", 64, 64, 788888},     {"net.3", 64, 96, 601049},
    {"net.4", 96, 96, 601049},    {"net.6", 96, 128, 277399},    {"net.7", 128, 128, 277399},
    {"net.9", 128, 160, 106418},  {"net.10", 160, 160, 106418},  {"net.12", 160, 192, 41697},
    {"net.13", 192, 192, 41697},  {"net.15", 192, 224, 14295},   {"net.16", 224, 224, 14295},
    {"net.18", 224, 256, 1662},   {"net.19", 256, 256, 1662}};
#define NUM_LAYERS ((int)(sizeof layers / sizeof layers[0]))

enum { ENGINE_FUSED, ENGINE_FUSED_IN_PLACE, ENGINE_BLAS, ENGINE_BLIS, ENGINE_XSMM, NUM_ENGINES };
static const char *const engine_names[NUM_ENGINES] = {"fused", "in place", "blas", "blis",
                                                      "libxsmm"};

/* cblas_sgemm with the CBLAS enums as ints (RowMajor 101, NoTrans 111). */
typedef void (*cblas_sgemm_fn)(int, int, int, int, int, int, float, const float *, int,
                               const float *, int, float, float *, int);
static cblas_sgemm_fn blis_sgemm;
static char blis_arch[64] = "";

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* @p bytes at a 64-byte boundary (free() releases them), or NULL. */
static void *aligned(size_t bytes) { return aligned_alloc(64, (bytes + 63) / 64 * 64); }

/* BLIS's cblas_sgemm, single-threaded per call (the OpenMP build of BLIS would otherwise start
 * its own team in every call where it does not see ours), or nothing. */
static void open_blis(void) {
#ifndef SPCONV_BENCH_NO_BLIS
    void *lib = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (lib == NULL) {
        snprintf(blis_arch, sizeof blis_arch, "libblis.so.4 not found");
        return;
    }
    blis_sgemm = (cblas_sgemm_fn)(uintptr_t)dlsym(lib, "cblas_sgemm");
    void (*set_threads)(long) = (void (*)(long))(uintptr_t)dlsym(lib, "bli_thread_set_num_threads");
    if (set_threads != NULL) set_threads(1);
    int (*query)(void) = (int (*)(void))(uintptr_t)dlsym(lib, "bli_arch_query_id");
    const char *(*name)(int) = (const char *(*)(int))(uintptr_t)dlsym(lib, "bli_arch_string");
    const char *(*version)(void) =
        (const char *(*)(void))(uintptr_t)dlsym(lib, "bli_info_get_version_str");
    if (blis_sgemm == NULL)
        snprintf(blis_arch, sizeof blis_arch, "libblis.so.4 has no cblas_sgemm");
    else if (query != NULL && name != NULL && version != NULL)
        snprintf(blis_arch, sizeof blis_arch, "%s, %s kernels", version(), name(query()));
#else
    snprintf(blis_arch, sizeof blis_arch, "not in sanitizer builds (RTLD_DEEPBIND)");
#endif
}

typedef struct operands {
    int64_t rows, k, n, chunk; /* rows of each offset's product, rows per call */
    float *w;                  /* [OFFSETS][k][n] */
    void *packed;              /* [OFFSETS] packed W[k] for the fused kernels */
    size_t packed_bytes;
    float *scratch; /* per thread: its operand [chunk][k] and product [chunk][n], line-aligned */
} operands;

/* Thread @p t's operand rows (chunk x k) and product rows (chunk x n). */
static int64_t line_floats(int64_t floats) { return (floats + 15) / 16 * 16; }
static int64_t thread_floats(const operands *o) {
    return line_floats(o->chunk * o->k) + line_floats(o->chunk * o->n);
}
static float *operand_of(const operands *o, int t) {
    return o->scratch + (int64_t)t * thread_floats(o);
}
static float *product_of(const operands *o, int t) {
    return operand_of(o, t) + line_floats(o->chunk * o->k);
}

static int thread_num(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* One call of @p engine: product_t = operand_t @ W[q] for @p count rows of thread @p t. */
static void product(const operands *o, int engine, int q, int64_t count, int t) {
    const float *a = operand_of(o, t), *w = o->w + (int64_t)q * o->k * o->n;
    float *p = product_of(o, t);
    if (engine == ENGINE_FUSED) {
        spconv__fused_rows_set(SPCONV_F32, count, a, NULL, 0, p, NULL, 0, o->k, o->n,
                               (const char *)o->packed + (size_t)q * o->packed_bytes, 0, NULL);
    } else if (engine == ENGINE_FUSED_IN_PLACE) {
        spconv__fused_rows_set(SPCONV_F32, count, a, NULL, 0, p, NULL, 0, o->k, o->n, w, o->n,
                               NULL);
    } else if (engine == ENGINE_BLAS) {
        spconv__sgemm(SPCONV__GEMM_UNFUSED, 0, 0, count, o->n, o->k, a, o->k, w, o->n, 0.0f, p,
                      o->n);
    } else if (engine == ENGINE_BLIS) {
        blis_sgemm(101, 111, 111, (int)count, (int)o->n, (int)o->k, 1.0f, a, (int)o->k, w,
                   (int)o->n, 0.0f, p, (int)o->n);
    } else {
#ifdef SPCONV_HAVE_LIBXSMM
        /* Column-major: p^T [n x count] = w^T [n x k] a^T [k x count], in strips of rows. */
        for (int64_t s = 0; s < count; s += STRIP) {
            const libxsmm_blasint mm = (libxsmm_blasint)o->n,
                                  nn = (libxsmm_blasint)(count - s < STRIP ? count - s : STRIP),
                                  kk = (libxsmm_blasint)o->k;
            const float alpha = 1.0f, beta = 0.0f;
            libxsmm_smmfunction kernel =
                libxsmm_smmdispatch(mm, nn, kk, NULL, NULL, NULL, &alpha, &beta, NULL, NULL);
            if (kernel != NULL)
                kernel(w, a + s * o->k, p + s * o->n);
            else
                libxsmm_sgemm(NULL, NULL, &mm, &nn, &kk, &alpha, w, &mm, a + s * o->k, &kk, &beta,
                              p + s * o->n, &mm);
        }
#endif
    }
}

/* A layer's products: every offset's rows in calls of o->chunk rows, all (offset, chunk) calls
 * shared out to the threads, each on its own operand and product (cache-resident, as a gathered
 * chunk would be). The fused kernels pack each W[k] first, as the forward does once a layer. */
static void run_layer(const operands *o, int engine) {
    if (engine == ENGINE_FUSED) {
        SPCONV_OMP(omp parallel for schedule(dynamic, 1))
        for (int q = 0; q < OFFSETS; ++q)
            spconv__fused_pack(SPCONV_F32, o->w + q * o->k * o->n, o->n, 0, o->k, o->n,
                               (char *)o->packed + (size_t)q * o->packed_bytes);
    }
    const int64_t chunks = (o->rows + o->chunk - 1) / o->chunk;
    SPCONV_OMP(omp parallel for schedule(static) collapse(2))
    for (int q = 0; q < OFFSETS; ++q)
        for (int64_t c = 0; c < chunks; ++c) {
            const int64_t lo = c * o->chunk;
            product(o, engine, q, o->rows - lo < o->chunk ? o->rows - lo : o->chunk, thread_num());
        }
}

/* Thread 0's product of offset 0 against double-precision sums: |error| <= (k + 1) eps sum
 * |terms| (a float32 dot product of k terms in any order, fused or not). */
static int check_products(const operands *o, int engine, const char *layer) {
    const double eps = 0x1.0p-24;
    const int64_t count = o->rows < o->chunk ? o->rows : o->chunk;
    product(o, engine, 0, count, 0);
    const float *a = operand_of(o, 0), *p = product_of(o, 0);
    for (int64_t s = 0; s < 64; ++s) {
        const int64_t r = (s * 7919) % count, j = (s * 104729) % o->n;
        double sum = 0.0, bound = 0.0;
        for (int64_t i = 0; i < o->k; ++i) {
            const double t = (double)a[r * o->k + i] * (double)o->w[i * o->n + j];
            sum += t;
            bound += fabs(t);
        }
        if (fabs(p[r * o->n + j] - sum) > (double)(o->k + 1) * eps * bound) {
            fprintf(stderr, "bench_gemm_libs: %s on %s: product[%lld][%lld] is %.9g, not %.9g\n",
                    engine_names[engine], layer, (long long)r, (long long)j, p[r * o->n + j], sum);
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    int repeat = 5, threads = 0;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) {
            repeat = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: bench_gemm_libs [--repeat N] [--threads T]\n");
            return 2;
        }
    }
    if (repeat < 1 || repeat > MAX_REPEAT || threads < 0) {
        fprintf(stderr, "bench_gemm_libs: --repeat must be in [1, %d] and --threads >= 0\n",
                MAX_REPEAT);
        return 2;
    }
#ifdef _OPENMP
    if (threads > 0) omp_set_num_threads(threads);
    threads = omp_get_max_threads();
#else
    threads = 1;
#endif
    int have[NUM_ENGINES] = {spconv__fused_available(), 0, spconv__gemm_has_blas(), 0, 0};
    open_blis();
    have[ENGINE_BLIS] = blis_sgemm != NULL;
#ifdef SPCONV_HAVE_LIBXSMM
    libxsmm_init();
    have[ENGINE_XSMM] = 1;
#endif
    /* W[k] read where it lies, as the forward reads it where that pays: every C_out here is a
     * whole number of the kernels' tiles. */
    have[ENGINE_FUSED_IN_PLACE] = have[ENGINE_FUSED];
    for (int l = 0; l < NUM_LAYERS; ++l)
        have[ENGINE_FUSED_IN_PLACE] &= spconv__fused_reads_b(SPCONV_F32, layers[l].c_out);
    spconv__gemm_prepare();
    printf("bench_gemm_libs: basic's conv products, 27 offsets x pairs / 27 rows, chunks of %d "
           "rows, %d thread%s, median of %d\n", CHUNK, threads, threads == 1 ? "" : "s", repeat);
    printf("  fused:   %s\n", have[ENGINE_FUSED] ? "our kernels, W[k] packed once a layer"
                                                : "not on this machine");
    printf("  in place: %s\n", have[ENGINE_FUSED_IN_PLACE] ? "our kernels, W[k] read where it lies"
                                                          : "-");
    printf("  blas:    %s\n", have[ENGINE_BLAS] ? spconv__blas_name() : "not built in");
    printf("  blis:    %s\n", blis_arch);
#ifdef SPCONV_HAVE_LIBXSMM
    printf("  libxsmm: %s, JIT kernels of %d-row strips\n", LIBXSMM_VERSION, STRIP);
#else
    printf("  libxsmm: not found by the build\n");
#endif
    printf("\n%-7s %5s %5s %7s", "layer", "C_in", "C_out", "rows");
    for (int e = 0; e < NUM_ENGINES; ++e)
        if (have[e]) printf(" %9s", engine_names[e]);
    printf("   (GFLOP/s)\n");

    double total_ms[NUM_ENGINES] = {0}, total_flops = 0.0;
    int rc = 0;
    for (int l = 0; l < NUM_LAYERS && rc == 0; ++l) {
        operands o = {(layers[l].pairs + OFFSETS - 1) / OFFSETS, layers[l].c_in, layers[l].c_out,
                      CHUNK, NULL, NULL,
                      spconv__fused_packed_bytes(SPCONV_F32, layers[l].c_in, layers[l].c_out),
                      NULL};
        if (o.chunk > (o.rows + threads - 1) / threads) o.chunk = (o.rows + threads - 1) / threads;
        /* Cache-line aligned, as the engine's tensors and workspaces are. */
        o.w = aligned(sizeof(float) * (size_t)(OFFSETS * o.k * o.n));
        o.packed = aligned((size_t)OFFSETS * o.packed_bytes);
        o.scratch = aligned(sizeof(float) * (size_t)(threads * thread_floats(&o)));
        if (o.w == NULL || o.packed == NULL || o.scratch == NULL) {
            fprintf(stderr, "bench_gemm_libs: out of memory\n");
            rc = 1;
        }
        uint64_t state = 0x2545f4914f6cdd1dULL + (uint64_t)l;
        for (int64_t i = 0; rc == 0 && i < threads * thread_floats(&o); ++i) {
            state = state * 6364136223846793005ULL + 1442695040888963407ULL;
            o.scratch[i] = (float)(state >> 40) * 0x1.0p-23f - 1.0f;
        }
        for (int64_t i = 0; rc == 0 && i < OFFSETS * o.k * o.n; ++i) {
            state = state * 6364136223846793005ULL + 1442695040888963407ULL;
            o.w[i] = (float)(state >> 40) * 0x1.0p-23f - 1.0f;
        }
        for (int e = 0; e < NUM_ENGINES && rc == 0; ++e) {
            if (!have[e]) continue;
            if (e == ENGINE_FUSED) run_layer(&o, e); /* packs W */
            rc = check_products(&o, e, layers[l].name);
        }
        double ms[NUM_ENGINES][MAX_REPEAT];
        for (int r = -1; rc == 0 && r < repeat; ++r)
            for (int t = 0; t < NUM_ENGINES && rc == 0; ++t) {
                const int e = (r + t + NUM_ENGINES) % NUM_ENGINES; /* engines take turns first */
                if (!have[e]) continue;
                const double start = now_s();
                run_layer(&o, e);
                if (r >= 0) ms[e][r] = 1e3 * (now_s() - start);
            }
        if (rc == 0) {
            const double flops = 2.0 * OFFSETS * (double)o.rows * (double)o.k * (double)o.n;
            total_flops += flops;
            printf("%-7s %5lld %5lld %7lld", layers[l].name, (long long)o.k, (long long)o.n,
                   (long long)o.rows);
            for (int e = 0; e < NUM_ENGINES; ++e) {
                if (!have[e]) continue;
                const double m = bench_median(ms[e], repeat);
                total_ms[e] += m;
                printf(" %9.1f", flops / m * 1e-6);
            }
            printf("\n");
        }
        free(o.scratch);
        free(o.w);
        free(o.packed);
    }
    if (rc != 0) return 1;
    printf("%-27s", "all layers, ms");
    for (int e = 0; e < NUM_ENGINES; ++e)
        if (have[e]) printf(" %9.1f", total_ms[e]);
    printf("\n%-27s", "all layers, GFLOP/s");
    for (int e = 0; e < NUM_ENGINES; ++e)
        if (have[e]) printf(" %9.1f", total_flops / total_ms[e] * 1e-6);
    printf("\n");
    return 0;
}
