/* Benchmark of the map ops on one device (tools/gpu-check.sh runs it with --device cuda and cpu):
 *   bench_maps [--device cpu|cuda[:N]] [--reps N] [--large-kernels] [DATA_DIR]
 * Cases: voxelizing spconv_benchmark_pc.bin (198,130 points; 0.1 m cells, 5 points, mean mode),
 * and the subm 3x3x3, the stride-2 3x3x3 and the 2x2x2 stride-2 (pool) rulebooks of the 125,562 sites of
 * spconv_test_indices.i32; with --large-kernels also its subm 5^3, 7^3 and 9^3 rulebooks and a
 * 1 x 1 x 40,001 subm kernel over 20,001 sites on separate lines (bench_long_lines). Inputs are
 * on the device before the clock starts; each repetition is
 * timed after 3 warm-ups, on a GPU with CUDA events queued before and after the call (the
 * device's clock, read once the context is synchronised), on the CPU from the call to its return
 * (monotonic host clock); prints the median as
 *   result case=<name> median_ms=<ms> gflops=0 gbps=0 clock=cuda-events|host
 * On the host emulation the figures are CPU times of the emulated kernels and mean nothing for a
 * GPU. DATA_DIR defaults to $SPCONV_DATA_DIR, else ../shared/data; missing files are skipped. */
#define _POSIX_C_SOURCE 199309L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/device_clock.h"
#include "spconv/spconv.h"
#include "bench_common.h"

#define MAX_REPS 1000
#define WARMUPS 3

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* A raw file of @p columns values of @p elem bytes per row as a tensor on @p device, or NULL. */
static spconv_tensor *read_raw(spconv_context *ctx, const char *dir, const char *name,
                               spconv_dtype dtype, int64_t columns, spconv_device device) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        printf("%s: not found, skipped\n", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    const long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    const size_t elem = spconv_dtype_size(dtype);
    const int64_t rows = bytes / (long)(columns * (int64_t)elem);
    void *data = malloc((size_t)(rows * columns) * elem + 1);
    spconv_tensor *t = NULL;
    if (data != NULL && fread(data, elem, (size_t)(rows * columns), f) == (size_t)(rows * columns)) {
        const int64_t sizes[2] = {rows, columns};
        if (spconv_tensor_from_host(ctx, device, dtype, 2, sizes, data, &t) != SPCONV_OK) {
            fprintf(stderr, "bench_maps: %s\n", spconv_last_error());
            t = NULL;
        }
    }
    free(data);
    fclose(f);
    return t;
}

typedef struct map_case {
    const char *name;
    spconv_context *ctx;
    const spconv_tensor *input;
    const spconv_voxelize_params *voxelize; /* NULL: a rulebook */
    const spconv_conv_params *conv;
    int64_t shape[3];
    spconv__device_clock *clock; /* NULL: the host's clock */
} map_case;

/* One call, timed on the device's clock into *device_ms when there is one. */
static int run_once(const map_case *c, double *device_ms) {
    int first = -1, last = -1;
    spconv_status st = spconv__device_clock_mark(c->clock, c->ctx, &first);
    if (st != SPCONV_OK) {
        fprintf(stderr, "bench_maps: %s: %s\n", c->name, spconv_last_error());
        return 0;
    }
    if (c->voxelize != NULL) {
        spconv_voxels v;
        st = spconv_voxelize(c->ctx, c->input, c->voxelize, &v);
        if (st == SPCONV_OK) spconv_voxels_release(&v);
    } else {
        spconv_rulebook *rb;
        st = spconv_rulebook_build(c->ctx, c->input, c->shape, 1, c->conv, &rb);
        if (st == SPCONV_OK) spconv_rulebook_release(rb);
    }
    if (st == SPCONV_OK) st = spconv__device_clock_mark(c->clock, c->ctx, &last);
    if (st == SPCONV_OK) st = spconv_context_synchronize(c->ctx);
    *device_ms = 0.0;
    if (st == SPCONV_OK) st = spconv__device_clock_span(c->clock, first, last, device_ms);
    if (st == SPCONV_OK) st = spconv__device_clock_resolve(c->clock);
    if (st != SPCONV_OK) fprintf(stderr, "bench_maps: %s: %s\n", c->name, spconv_last_error());
    return st == SPCONV_OK;
}

static int bench_case(const map_case *c, int reps) {
    double times[MAX_REPS], device_ms = 0.0;
    for (int w = 0; w < WARMUPS; ++w)
        if (!run_once(c, &device_ms)) return 0;
    for (int r = 0; r < reps; ++r) {
        const double t0 = now_ms();
        if (!run_once(c, &device_ms)) return 0;
        times[r] = c->clock != NULL ? device_ms : now_ms() - t0;
    }
    printf("result case=%s median_ms=%.4f gflops=0 gbps=0 clock=%s\n", c->name,
           bench_median(times, reps), c->clock != NULL ? "cuda-events" : "host");
    return 1;
}

/* 20,001 sites each alone on its line under a 1 x 1 x 40,001 subm kernel: one pair a site, but
 * N x min(N, KV / 2) tests (4 x 10^8) for a build that tests every pair of sites or probes every
 * offset; through bins (rulebook/site_bins.h), a few tests a site. */
static int bench_long_lines(spconv_context *ctx, spconv_device device,
                            spconv__device_clock *clock, int reps) {
    enum { SITES = 20001 };
    const int64_t shape[3] = {150, 150, 40001}, sizes[2] = {SITES, 4};
    int32_t *rows = malloc((size_t)SITES * 4 * sizeof *rows);
    if (rows == NULL) return 0;
    for (int32_t r = 0; r < SITES; ++r) {
        rows[4 * r] = 0;
        rows[4 * r + 1] = r / 150;
        rows[4 * r + 2] = r % 150;
        rows[4 * r + 3] = (int32_t)((int64_t)r * 7919 % 40001);
    }
    spconv_tensor *sites = NULL;
    int ok = spconv_tensor_from_host(ctx, device, SPCONV_I32, 2, sizes, rows, &sites) == SPCONV_OK;
    free(rows);
    if (!ok) {
        fprintf(stderr, "bench_maps: %s\n", spconv_last_error());
        return 0;
    }
    spconv_conv_params line = spconv_conv_params_default(SPCONV_CONV_SUBM);
    line.kernel[0] = line.kernel[1] = 1, line.kernel[2] = 40001;
    const map_case c = {"rulebook_subm_1x1x40001_lines", ctx, sites, NULL, &line,
                        {shape[0], shape[1], shape[2]}, clock};
    ok = bench_case(&c, reps);
    spconv_tensor_release(sites);
    return ok;
}

static spconv_device parse_device(const char *text) {
    if (strcmp(text, "cpu") == 0) return spconv_cpu();
    if (strcmp(text, "cuda") == 0) return spconv_cuda(0);
    if (strncmp(text, "cuda:", 5) == 0) return spconv_cuda(atoi(text + 5));
    fprintf(stderr, "bench_maps: --device %s: expected cpu, cuda or cuda:N\n", text);
    exit(2);
}

int main(int argc, char **argv) {
    const char *dir = getenv("SPCONV_DATA_DIR") ? getenv("SPCONV_DATA_DIR") : "../shared/data";
    spconv_device device = spconv_cpu();
    int reps = 20, large = 0;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
            device = parse_device(argv[++i]);
        } else if (strcmp(argv[i], "--large-kernels") == 0) {
            large = 1;
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = atoi(argv[++i]);
            if (reps < 1 || reps > MAX_REPS) {
                fprintf(stderr, "bench_maps: --reps must be in [1, %d]\n", MAX_REPS);
                return 2;
            }
        } else {
            dir = argv[i];
        }
    }
    spconv_context *ctx;
    if (spconv_context_create(device, &ctx) != SPCONV_OK) {
        fprintf(stderr, "bench_maps: %s\n", spconv_last_error());
        return 2;
    }
    spconv__device_clock *clock = NULL;
    if (spconv__device_clock_create(device, &clock) != SPCONV_OK) {
        fprintf(stderr, "bench_maps: %s\n", spconv_last_error());
        return 2;
    }
    int ok = 1;
    spconv_tensor *points = read_raw(ctx, dir, "spconv_benchmark_pc.bin", SPCONV_F32, 4, device);
    const spconv_voxelize_params vp = {{0.1f, 0.1f, 0.1f}, {-80.0f, -80.0f, -2.0f, 80.0f, 80.0f, 6.0f},
                                       5, INT64_MAX, SPCONV_VOXELIZE_MEAN};
    if (points != NULL) {
        const map_case c = {"voxelize_benchmark_pc", ctx, points, &vp, NULL, {0, 0, 0}, clock};
        ok &= bench_case(&c, reps);
    }
    spconv_tensor *sites = read_raw(ctx, dir, "spconv_test_indices.i32", SPCONV_I32, 4, device);
    if (sites != NULL) {
        const spconv_conv_params subm = spconv_conv_params_default(SPCONV_CONV_SUBM);
        spconv_conv_params down = spconv_conv_params_default(SPCONV_CONV_REGULAR);
        for (int a = 0; a < 3; ++a) down.stride[a] = 2, down.padding[a] = 1;
        const map_case c1 = {"rulebook_subm3_spconv_test", ctx, sites, NULL, &subm,
                             {80, 1600, 1600}, clock};
        const map_case c2 = {"rulebook_stride2_spconv_test", ctx, sites, NULL, &down,
                             {80, 1600, 1600}, clock};
        /* The first max pool of spconv's bench_basic: a 2^3 window, stride 2, no padding. */
        spconv_conv_params pool = spconv_conv_params_default(SPCONV_CONV_REGULAR);
        for (int a = 0; a < 3; ++a) pool.kernel[a] = 2, pool.stride[a] = 2, pool.padding[a] = 0;
        const map_case c3 = {"rulebook_pool2_spconv_test", ctx, sites, NULL, &pool,
                             {80, 1600, 1600}, clock};
        ok &= bench_case(&c1, reps);
        ok &= bench_case(&c2, reps);
        ok &= bench_case(&c3, reps);
        if (large) { /* subm kernels on either side of SPCONV_SUBM_BINS_ABOVE_PROBES */
            static const char *names[3] = {"rulebook_subm5_spconv_test",
                                           "rulebook_subm7_spconv_test",
                                           "rulebook_subm9_spconv_test"};
            for (int k = 0; k < 3; ++k) {
                spconv_conv_params wide = subm;
                for (int a = 0; a < 3; ++a) wide.kernel[a] = 5 + 2 * k;
                const map_case c = {names[k], ctx, sites, NULL, &wide, {80, 1600, 1600}, clock};
                ok &= bench_case(&c, reps);
            }
        }
    }
    if (large) ok &= bench_long_lines(ctx, device, clock, reps);
    spconv_tensor_release(points);
    spconv_tensor_release(sites);
    spconv__device_clock_destroy(clock);
    spconv_context_destroy(ctx);
    return ok ? 0 : 1;
}
