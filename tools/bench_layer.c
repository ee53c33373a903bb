/* bench_layer: times one sparse conv layer on spconv's own benchmark input (125,562 sites of
 * ../shared/data/spconv_test_*, batch 0, shape [80, 1600, 1600]):
 *   - rulebook building: subm 3x3x3, and regular 3x3x3 stride 2 padding 1;
 *   - forward and backward of subm 3x3x3 convs at 64->64 and 128->128 channels (random
 *     features, weights and output gradients of those widths), split into the executor's
 *     phases (gather, GEMM, scatter) through its internal timing hook; the backward also with
 *     only d_features and only d_weight asked for, so that the two products are timed apart;
 *   - max pooling 2x2x2 stride 2 at 64 channels (basic's first pool): its rulebook, the pool
 *     with and without argmax and its backward, each set against the least bytes it must move
 *     (forward: every input row read once, every output row and argmax written once; backward:
 *     every output gradient and argmax row read once, every input gradient row written once) at
 *     this machine's streaming bandwidth, measured here as the time to read that many bytes and
 *     write that many.
 * Every figure is the median of --repeat runs after one warm-up. GFLOP/s counts 2 * pairs *
 * C_in * C_out per pass (forward one pass, backward two: d_features and d_weight, each alone
 * one) and is also given as a share of this machine's sgemm peak, measured here with a 2048^3
 * sgemm run the way the executor runs its products (row blocks of single-threaded BLAS, one per
 * thread).
 *
 *   bench_layer [--repeat N] [--threads T] [--no-conv] [DATA_DIR]
 * --no-conv skips the conv layers (the rulebooks and the pool take seconds, the convs a minute).
 * DATA_DIR defaults to $SPCONV_DATA_DIR, then ../shared/data. Without the data it says so and
 * exits 0. A benchmark, not a test: it asserts nothing about the timings. Freed memory is kept
 * for reuse, as the `spconv` tool keeps it (tools/spconv/main.c): otherwise every repetition's
 * outputs (32 MB at 64 channels) are fresh mmaps that fault in page by page, and on 2 threads
 * the faults of the two threads contend (the 64->64 forward's products read 27 ms instead of
 * 20 on a 2-core Xeon). */
#include <stdint.h>
#include <stdio.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <stdlib.h>
#include <string.h>

#include "conv/conv_cpu.h"
#include "io/pointcloud_file.h"
#include "conv/conv_exec.h"
#include "conv/gemm_peak.h"
#include "core/parallel.h"
#include "spconv/spconv.h"
#include "bench_common.h"

#define PEAK_SIZE 2048

typedef struct bench_options {
    int repeat;
    int threads;
    int no_conv;
    const char *data_dir;
} bench_options;

static _Noreturn void die(const char *what, spconv_status st) {
    fprintf(stderr, "bench_layer: %s failed: %s (%s)\n", what, spconv_status_string(st),
            spconv_last_error());
    exit(1);
}

#define CHECK(expr)                                                                                \
    do {                                                                                           \
        spconv_status bench_st_ = (expr);                                                          \
        if (bench_st_ != SPCONV_OK) die(#expr, bench_st_);                                         \
    } while (0)

/* The whole file, or NULL when it cannot be read (a named pipe or device is refused by the
 * library's opener rather than waited on); *bytes gets its size. */
static void *read_file(const char *dir, const char *name, size_t *bytes) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *data = NULL;
    *bytes = 0;
    if (spconv__file_read_all("bench_layer", path, SIZE_MAX - 1, &data, bytes) != SPCONV_OK)
        return NULL;
    if (*bytes == 0) {
        free(data);
        return NULL;
    }
    return data;
}

static void parse_args(int argc, char **argv, bench_options *o) {
    o->repeat = 5;
    o->threads = 0;
    o->no_conv = 0;
    o->data_dir = getenv("SPCONV_DATA_DIR");
    if (o->data_dir == NULL || *o->data_dir == '\0') o->data_dir = "../shared/data";
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) {
            o->repeat = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            o->threads = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--no-conv") == 0) {
            o->no_conv = 1;
        } else if (argv[i][0] != '-') {
            o->data_dir = argv[i];
        } else {
            fprintf(stderr, "usage: bench_layer [--repeat N] [--threads T] [--no-conv] [DATA_DIR]\n");
            exit(2);
        }
    }
    if (o->repeat < 1 || o->threads < 0) {
        fprintf(stderr, "bench_layer: --repeat must be >= 1 and --threads >= 0\n");
        exit(2);
    }
}

static float *random_floats(int64_t n, float scale, uint64_t *state) {
    float *v = malloc((size_t)n * sizeof(float));
    if (v == NULL) {
        fprintf(stderr, "bench_layer: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; ++i) {
        *state = *state * 6364136223846793005u + 1442695040888963407u; /* LCG: speed, not quality */
        v[i] = scale * ((float)(*state >> 40) * 0x1.0p-24f * 2.0f - 1.0f);
    }
    return v;
}

static spconv_tensor *random_tensor(int ndim, const int64_t *sizes, float scale, uint64_t *state) {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= sizes[i];
    float *v = random_floats(n, scale, state);
    spconv_tensor *t = NULL;
    CHECK(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_F32, ndim, sizes, v, &t));
    free(v);
    return t;
}

/* Median build time of a rulebook over @p repeat builds after a warm-up; *rb keeps the last. */
static double bench_rulebook(spconv_context *ctx, const spconv_tensor *indices,
                             const int64_t shape[3], const spconv_conv_params *params, int repeat,
                             spconv_rulebook **rb) {
    double *times = malloc((size_t)(repeat + 1) * sizeof(double));
    *rb = NULL;
    for (int r = 0; r <= repeat; ++r) {
        spconv_rulebook_release(*rb);
        *rb = NULL;
        double t0 = spconv__now_s();
        CHECK(spconv_rulebook_build(ctx, indices, shape, 1, params, rb));
        times[r] = spconv__now_s() - t0;
    }
    double seconds = bench_median(times + 1, repeat);
    free(times);
    return seconds;
}

/* Median wall time and per-phase times (thread averages) of repeated forward or backward runs. */
typedef struct phase_medians {
    double total_s, gather_s, gemm_s, scatter_s;
    double best_s; /* the fastest run: what the code does when nothing else holds the cores */
} phase_medians;

/* What run_conv times: the forward, the whole backward, or one of its two products. */
enum { RUN_FORWARD, RUN_BACKWARD, RUN_DATA_GRAD, RUN_WEIGHT_GRAD, RUN_KINDS };

static phase_medians run_conv(spconv_context *ctx, const spconv_rulebook *rb,
                              const spconv_tensor *x, const spconv_tensor *w,
                              const spconv_tensor *g, int kind, int repeat) {
    double *samples = malloc((size_t)(4 * (repeat + 1)) * sizeof(double));
    for (int r = 0; r <= repeat; ++r) {
        spconv__conv_timing timing = {0};
        spconv__conv_options options = {SPCONV__GEMM_AUTO, &timing, NULL};
        spconv_tensor *o1 = NULL, *o2 = NULL, *o3 = NULL;
        double t0 = spconv__now_s();
        if (kind == RUN_BACKWARD)
            CHECK(spconv__conv_backward_ex(ctx, rb, x, w, g, &options, &o1, &o2, &o3));
        else if (kind == RUN_DATA_GRAD)
            CHECK(spconv__conv_backward_ex(ctx, rb, x, w, g, &options, &o1, NULL, NULL));
        else if (kind == RUN_WEIGHT_GRAD)
            CHECK(spconv__conv_backward_ex(ctx, rb, x, w, g, &options, NULL, &o2, NULL));
        else
            CHECK(spconv__conv_forward_ex(ctx, rb, x, w, NULL, &options, &o1));
        double wall = spconv__now_s() - t0;
        spconv_tensor_release(o1);
        spconv_tensor_release(o2);
        spconv_tensor_release(o3);
        int idx = r == 0 ? repeat : r - 1; /* the warm-up lands in the unused last slot */
        samples[0 * (repeat + 1) + idx] = wall;
        samples[1 * (repeat + 1) + idx] = timing.gather_s / timing.threads;
        samples[2 * (repeat + 1) + idx] = timing.gemm_s / timing.threads;
        samples[3 * (repeat + 1) + idx] = timing.scatter_s / timing.threads;
    }
    double best = samples[0];
    for (int r = 1; r < repeat; ++r) best = samples[r] < best ? samples[r] : best;
    phase_medians m = {bench_median(samples, repeat), bench_median(samples + (repeat + 1), repeat),
                       bench_median(samples + 2 * (repeat + 1), repeat),
                       bench_median(samples + 3 * (repeat + 1), repeat), best};
    free(samples);
    return m;
}

/* Median time of max pooling @p x over @p rb, with argmax or without. */
static double bench_pool(spconv_context *ctx, const spconv_rulebook *rb, const spconv_tensor *x,
                         int with_argmax, int repeat) {
    double *times = malloc((size_t)(repeat + 1) * sizeof(double));
    for (int r = 0; r <= repeat; ++r) {
        spconv_tensor *out = NULL, *arg = NULL;
        double t0 = spconv__now_s();
        CHECK(spconv_maxpool_forward(ctx, rb, x, &out, with_argmax ? &arg : NULL));
        times[r] = spconv__now_s() - t0;
        spconv_tensor_release(out);
        spconv_tensor_release(arg);
    }
    double seconds = bench_median(times + 1, repeat);
    free(times);
    return seconds;
}

/* Median time of the pool's backward from @p argmax and a gradient @p g of its output. */
static double bench_pool_backward(spconv_context *ctx, const spconv_rulebook *rb,
                                  const spconv_tensor *argmax, const spconv_tensor *g, int repeat) {
    double *times = malloc((size_t)(repeat + 1) * sizeof(double));
    for (int r = 0; r <= repeat; ++r) {
        spconv_tensor *gx = NULL;
        double t0 = spconv__now_s();
        CHECK(spconv_maxpool_backward(ctx, rb, argmax, g, &gx));
        times[r] = spconv__now_s() - t0;
        spconv_tensor_release(gx);
    }
    double seconds = bench_median(times + 1, repeat);
    free(times);
    return seconds;
}

/* Streaming ceiling: the median time for @p threads threads to read @p read_bytes (summing
 * them, so the loads cannot be dropped) and write @p write_bytes, both buffers resident (not
 * freshly mapped), as a pass over memory that no cache holds. */
static double bench_stream(int threads, size_t read_bytes, size_t write_bytes, int repeat) {
    const int64_t nr = (int64_t)(read_bytes / sizeof(float)), nw = (int64_t)(write_bytes / sizeof(float));
    float *src = malloc((size_t)nr * sizeof(float)), *dst = malloc((size_t)nw * sizeof(float));
    if (src == NULL || dst == NULL) {
        fprintf(stderr, "bench_layer: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < nr; ++i) src[i] = (float)(i & 1023);
    memset(dst, 0, (size_t)nw * sizeof(float));
    double *times = malloc((size_t)(repeat + 1) * sizeof(double));
    volatile float sink = 0.0f;
    (void)threads; /* only the OpenMP pragmas read it */
    for (int r = 0; r <= repeat; ++r) {
        float total = 0.0f;
        double t0 = spconv__now_s();
        SPCONV_OMP(omp parallel num_threads(threads) reduction(+ : total))
        {
            float lanes[16] = {0};
            SPCONV_OMP(omp for schedule(static) nowait)
            for (int64_t i = 0; i < nr / 16; ++i)
                for (int l = 0; l < 16; ++l) lanes[l] += src[16 * i + l];
            SPCONV_OMP(omp for schedule(static))
            for (int64_t i = 0; i < nw; ++i) dst[i] = 1.0f;
            for (int l = 0; l < 16; ++l) total += lanes[l];
        }
        times[r] = spconv__now_s() - t0;
        sink = sink + total + dst[nw / 2];
    }
    double seconds = bench_median(times + 1, repeat);
    free(times);
    free(src);
    free(dst);
    return seconds;
}

/* Medians of every RUN_ kind of a subm 3x3x3 conv at @p channels -> @p channels. */
static void bench_conv(spconv_context *ctx, const spconv_rulebook *rb, int64_t channels, int repeat,
                       uint64_t *state, phase_medians result[RUN_KINDS]) {
    const int64_t n = spconv_rulebook_num_in(rb);
    int64_t x_sizes[2] = {n, channels}, w_sizes[3] = {27, channels, channels};
    spconv_tensor *x = random_tensor(2, x_sizes, 1.0f, state);
    spconv_tensor *w = random_tensor(3, w_sizes, 0.1f, state);
    spconv_tensor *g = random_tensor(2, x_sizes, 1.0f, state);
    for (int kind = 0; kind < RUN_KINDS; ++kind)
        result[kind] = run_conv(ctx, rb, x, w, g, kind, repeat);
    spconv_tensor_release(x);
    spconv_tensor_release(w);
    spconv_tensor_release(g);
}

static void print_phase(const char *name, double seconds, int64_t pairs, double gflop,
                        double peak) {
    if (gflop > 0.0)
        printf("  %-10s %9.2f ms %10lld pairs %8.1f GFLOP/s %6.1f%% of peak\n", name, seconds * 1e3,
               (long long)pairs, gflop / seconds, 100.0 * gflop / seconds / peak);
    else
        printf("  %-10s %9.2f ms %10lld pairs\n", name, seconds * 1e3, (long long)pairs);
}

static void print_conv(const phase_medians *m, int64_t channels, int kind, int64_t pairs,
                       double peak) {
    static const char *const names[RUN_KINDS] = {"forward", "backward", "backward, d_features only",
                                                 "backward, d_weight only"};
    const double gflop = (kind == RUN_BACKWARD ? 4.0 : 2.0) * (double)pairs * (double)channels *
                         (double)channels * 1e-9;
    printf("\nsubm 3x3x3 %lld->%lld %s: %.1f GFLOP (phases: thread averages; other: wall time "
           "outside them)\n",
           (long long)channels, (long long)channels, names[kind], gflop);
    print_phase("gather", m->gather_s, pairs, 0.0, peak);
    print_phase("GEMM", m->gemm_s, pairs, gflop, peak);
    print_phase("scatter", m->scatter_s, pairs, 0.0, peak);
    print_phase("other", m->total_s - m->gather_s - m->gemm_s - m->scatter_s, pairs, 0.0, peak);
    print_phase("total", m->total_s, pairs, gflop, peak);
    print_phase("best total", m->best_s, pairs, gflop, peak);
}

/* Sites from the data folder, or NULL (after a message) when the files are missing or do not
 * match; *n gets the site count. */
static int32_t *load_sites(const char *dir, int64_t *n, int *missing) {
    size_t idx_bytes = 0, feat_bytes = 0;
    int32_t *rows = read_file(dir, "spconv_test_indices.i32", &idx_bytes);
    float *features = read_file(dir, "spconv_test_features.f32", &feat_bytes);
    *missing = rows == NULL || features == NULL;
    *n = (int64_t)(idx_bytes / (4 * sizeof(int32_t)));
    if (*missing)
        printf("bench_layer: skipped: spconv_test_indices.i32 / spconv_test_features.f32 not "
               "found in %s (pass the folder or set SPCONV_DATA_DIR)\n",
               dir);
    else if (feat_bytes != (size_t)*n * 3 * sizeof(float))
        fprintf(stderr, "bench_layer: %lld sites but %zu bytes of features (3 floats per site)\n",
                (long long)*n, feat_bytes);
    int ok = !*missing && feat_bytes == (size_t)*n * 3 * sizeof(float);
    free(features); /* the layers here get random features of their own widths */
    if (!ok) free(rows);
    return ok ? rows : NULL;
}

int main(int argc, char **argv) {
#if defined(__GLIBC__)
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
    bench_options o;
    parse_args(argc, argv, &o);
    int64_t n;
    int missing;
    int32_t *rows = load_sites(o.data_dir, &n, &missing);
    if (rows == NULL) return missing ? 0 : 1;
    spconv_context *ctx = NULL;
    CHECK(spconv_context_create(spconv_cpu(), &ctx));
    CHECK(spconv_context_set_num_threads(ctx, o.threads));
    const int threads = spconv_context_num_threads(ctx);
    int64_t sizes[2] = {n, 4}, shape[3] = {80, 1600, 1600};
    spconv_tensor *indices = NULL;
    CHECK(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_I32, 2, sizes, rows, &indices));

    /* The peak is measured before and after the layers and the higher one is used: on a shared
     * machine either may have run while other work held the cores. */
    double peak_before, peak_after;
    CHECK(spconv__sgemm_peak(threads, PEAK_SIZE, o.repeat, &peak_before));
    spconv_conv_params subm = spconv_conv_params_default(SPCONV_CONV_SUBM);
    spconv_conv_params regular = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    for (int a = 0; a < 3; ++a) regular.stride[a] = 2, regular.padding[a] = 1;
    spconv_rulebook *rb, *rb_s2;
    double subm_s = bench_rulebook(ctx, indices, shape, &subm, o.repeat, &rb);
    double regular_s = bench_rulebook(ctx, indices, shape, &regular, o.repeat, &rb_s2);
    uint64_t state = 12345;
    phase_medians c64[RUN_KINDS], c128[RUN_KINDS];
    if (!o.no_conv) {
        bench_conv(ctx, rb, 64, o.repeat, &state, c64);
        bench_conv(ctx, rb, 128, o.repeat, &state, c128);
    }
    spconv_conv_params pool = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    for (int a = 0; a < 3; ++a) pool.kernel[a] = 2, pool.stride[a] = 2;
    spconv_rulebook *rb_pool;
    double pool_rb_s = bench_rulebook(ctx, indices, shape, &pool, o.repeat, &rb_pool);
    const int64_t pool_channels = 64, pool_out = spconv_rulebook_num_out(rb_pool);
    int64_t pool_sizes[2] = {n, pool_channels};
    spconv_tensor *pool_x = random_tensor(2, pool_sizes, 1.0f, &state);
    double pool_s = bench_pool(ctx, rb_pool, pool_x, 0, o.repeat);
    double pool_arg_s = bench_pool(ctx, rb_pool, pool_x, 1, o.repeat);
    spconv_tensor *pool_y = NULL, *pool_argmax = NULL;
    CHECK(spconv_maxpool_forward(ctx, rb_pool, pool_x, &pool_y, &pool_argmax));
    int64_t pool_g_sizes[2] = {pool_out, pool_channels};
    spconv_tensor *pool_g = random_tensor(2, pool_g_sizes, 1.0f, &state);
    double pool_back_s = bench_pool_backward(ctx, rb_pool, pool_argmax, pool_g, o.repeat);
    spconv_tensor_release(pool_g);
    spconv_tensor_release(pool_argmax);
    spconv_tensor_release(pool_y);
    const size_t pool_read = (size_t)(n * pool_channels) * sizeof(float);
    const size_t pool_write = (size_t)(pool_out * pool_channels) * sizeof(float);
    double stream_s = bench_stream(threads, pool_read, pool_write, o.repeat);
    double stream_arg_s = bench_stream(threads, pool_read, 2 * pool_write, o.repeat);
    double stream_back_s = bench_stream(threads, 2 * pool_write, pool_read, o.repeat);
    spconv_tensor_release(pool_x);
    CHECK(spconv__sgemm_peak(threads, PEAK_SIZE, o.repeat, &peak_after));
    const double peak = peak_before > peak_after ? peak_before : peak_after;

    printf("bench_layer: %lld sites, shape [80, 1600, 1600], %d thread%s, GEMM by %s, median of "
           "%d after a warm-up\n",
           (long long)n, threads, threads == 1 ? "" : "s",
           spconv__gemm_has_blas() ? "BLAS" : "the C fallback", o.repeat);
    printf("sgemm peak (%d^3 f32, %d thread%s): %.1f GFLOP/s (before %.1f, after %.1f)\n",
           PEAK_SIZE, threads, threads == 1 ? "" : "s", peak, peak_before, peak_after);
    printf("\nrulebook\n  %-28s %9.2f ms %10lld pairs\n  %-28s %9.2f ms %10lld pairs\n",
           "subm 3x3x3", subm_s * 1e3, (long long)spconv_rulebook_num_pairs(rb),
           "regular 3x3x3 stride 2 pad 1", regular_s * 1e3,
           (long long)spconv_rulebook_num_pairs(rb_s2));
    const int64_t pairs = spconv_rulebook_num_pairs(rb);
    for (int kind = 0; kind < RUN_KINDS && !o.no_conv; ++kind)
        print_conv(&c64[kind], 64, kind, pairs, peak);
    for (int kind = 0; kind < RUN_KINDS && !o.no_conv; ++kind)
        print_conv(&c128[kind], 128, kind, pairs, peak);

    printf("\nmax pool 2x2x2 stride 2, %lld channels: %lld -> %lld sites\n",
           (long long)pool_channels, (long long)n, (long long)pool_out);
    printf("  %-28s %9.2f ms %10lld pairs\n", "rulebook", pool_rb_s * 1e3,
           (long long)spconv_rulebook_num_pairs(rb_pool));
    printf("  %-28s %9.2f ms  streaming floor %.2f ms (%.1f MB at %.1f GB/s): %.2fx\n",
           "pool (inference)", pool_s * 1e3, stream_s * 1e3, (pool_read + pool_write) * 1e-6,
           (pool_read + pool_write) / stream_s * 1e-9, pool_s / stream_s);
    printf("  %-28s %9.2f ms  streaming floor %.2f ms (%.1f MB at %.1f GB/s): %.2fx\n",
           "pool with argmax", pool_arg_s * 1e3, stream_arg_s * 1e3,
           (pool_read + 2 * pool_write) * 1e-6, (pool_read + 2 * pool_write) / stream_arg_s * 1e-9,
           pool_arg_s / stream_arg_s);
    printf("  %-28s %9.2f ms  streaming floor %.2f ms (%.1f MB at %.1f GB/s): %.2fx\n",
           "pool backward", pool_back_s * 1e3, stream_back_s * 1e3,
           (pool_read + 2 * pool_write) * 1e-6, (pool_read + 2 * pool_write) / stream_back_s * 1e-9,
           pool_back_s / stream_back_s);

    spconv_rulebook_release(rb_pool);
    spconv_rulebook_release(rb_s2);
    spconv_rulebook_release(rb);
    spconv_tensor_release(indices);
    spconv_context_destroy(ctx);
    free(rows);
    return 0;
}
