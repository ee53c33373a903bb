/* bench_hash_flood: crafted against random coordinates for the two hash tables of the pipeline.
 *   bench_hash_flood [--voxel-points N] [--sites N] [--repeat R] [--threads T]
 *                    [--write-scan FILE [--scan-points P]]
 *  - voxelizer: N points (default 65,536), one per voxel, on SECOND's KITTI grid (0.05 x 0.05 x
 *    0.1 m over [0, 70.4] x [-40, 40] x [-3, 1], no voxel limit), crafted so that their voxel keys
 *    share one window of the old Fibonacci-hashed table, against N uniform random points;
 *  - rulebook: N sites (default 131,072) in spatial shape [80, 1600, 1600], crafted into one
 *    window of the old murmur3-finalised table, against N random distinct sites; a submanifold
 *    3x3x3 rulebook on each (the site table build plus 13 lookups per site).
 * It prints the median and fastest of R runs (default 3, interleaved, after one warm-up run of
 * each) of each, and their ratio (crafted over random; about 1 for a table that crafted keys cannot cluster).
 * --write-scan writes a KITTI .bin scan (x, y, z, 0) of P crafted points (default 1,048,576 = 16 MiB) for SECOND's input, to feed
 * `spconv run FILE --net second`. A benchmark: it asserts nothing about the timings. */
#define _POSIX_C_SOURCE 199309L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/hash_flood.h"
#include "spconv/spconv.h"
#include "bench_common.h"

#define MAX_REPEAT 100

static _Noreturn void die(const char *what) {
    fprintf(stderr, "bench_hash_flood: %s: %s\n", what, spconv_last_error());
    exit(1);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

typedef struct timing {
    double median, fastest;
} timing;

static timing summarize(double *ms, int n) {
    const double middle = bench_median(ms, n);
    return (timing){middle, ms[0]};
}

static spconv_voxelize_params kitti_params(void) {
    spconv_voxelize_params vp = {{0.05f, 0.05f, 0.1f}, {0.0f, -40.0f, -3.0f, 70.4f, 40.0f, 1.0f},
                                 5, INT64_MAX, SPCONV_VOXELIZE_MEAN};
    return vp;
}

static spconv_tensor *wrap(spconv_dtype dtype, const void *data, int64_t n) {
    spconv_tensor *t;
    if (spconv_tensor_wrap(spconv_cpu(), dtype, 2, (const int64_t[]){n, 4}, NULL, (void *)data,
                           NULL, NULL, &t) != SPCONV_OK)
        die("wrapping the input");
    return t;
}

/* One timed run; *size gets the voxels. */
static double voxelize_ms(spconv_context *ctx, const spconv_tensor *points,
                          const spconv_voxelize_params *vp, int64_t *size) {
    spconv_voxels out;
    const double t0 = now_ms();
    if (spconv_voxelize(ctx, points, vp, &out) != SPCONV_OK) die("spconv_voxelize");
    const double ms = now_ms() - t0;
    *size = spconv_tensor_size(out.coords, 0);
    spconv_voxels_release(&out);
    return ms;
}

/* One timed submanifold 3x3x3 build; *size gets the pairs. */
static double subm_ms(spconv_context *ctx, const spconv_tensor *indices, const int64_t shape[3],
                      int64_t *size) {
    const spconv_conv_params params = spconv_conv_params_default(SPCONV_CONV_SUBM);
    spconv_rulebook *rb;
    const double t0 = now_ms();
    if (spconv_rulebook_build(ctx, indices, shape, 1, &params, &rb) != SPCONV_OK)
        die("spconv_rulebook_build");
    const double ms = now_ms() - t0;
    *size = spconv_rulebook_num_pairs(rb);
    spconv_rulebook_release(rb);
    return ms;
}

static void print_row(const char *table, int64_t n, timing crafted, timing random,
                      const char *unit, int64_t crafted_out, int64_t random_out) {
    printf("%-10s %8lld  crafted %10.2f ms (min %10.2f)  random %8.2f ms (min %8.2f)  ratio %7.2f"
           "  [%s: crafted %lld, random %lld]\n",
           table, (long long)n, crafted.median, crafted.fastest, random.median, random.fastest,
           crafted.median / random.median, unit, (long long)crafted_out, (long long)random_out);
}

static void bench_voxelizer(spconv_context *ctx, int64_t n, int repeat) {
    const spconv_voxelize_params vp = kitti_params();
    float *crafted = malloc((size_t)n * 4 * sizeof *crafted);
    float *random = malloc((size_t)n * 4 * sizeof *random);
    if (crafted == NULL || random == NULL) die("out of memory");
    const int64_t found = spconv_flood_voxel_points(n, 4, &vp, crafted);
    if (found != n) {
        fprintf(stderr, "bench_hash_flood: only %lld crafted points\n", (long long)found);
        exit(1);
    }
    spconv_flood_random_points(n, 4, &vp, 12345, random);
    spconv_tensor *crafted_t = wrap(SPCONV_F32, crafted, n), *random_t = wrap(SPCONV_F32, random, n);
    /* Interleaved, after one warm-up run of each, so that other load on a shared machine falls on
     * both alike. */
    double crafted_ms[MAX_REPEAT + 1], random_ms[MAX_REPEAT + 1];
    int64_t crafted_voxels = 0, random_voxels = 0;
    for (int r = 0; r <= repeat; ++r) {
        crafted_ms[r] = voxelize_ms(ctx, crafted_t, &vp, &crafted_voxels);
        random_ms[r] = voxelize_ms(ctx, random_t, &vp, &random_voxels);
    }
    print_row("voxelizer", n, summarize(crafted_ms + 1, repeat), summarize(random_ms + 1, repeat),
              "voxels", crafted_voxels, random_voxels);
    spconv_tensor_release(crafted_t);
    spconv_tensor_release(random_t);
    free(crafted);
    free(random);
}

static void bench_rulebook(spconv_context *ctx, int64_t n, int repeat) {
    const int64_t shape[3] = {80, 1600, 1600};
    int32_t *crafted = malloc((size_t)n * 4 * sizeof *crafted);
    int32_t *random = malloc((size_t)n * 4 * sizeof *random);
    if (crafted == NULL || random == NULL) die("out of memory");
    const int64_t found = spconv_flood_rulebook_sites(n, shape, crafted);
    if (found != n) {
        fprintf(stderr, "bench_hash_flood: only %lld crafted sites\n", (long long)found);
        exit(1);
    }
    spconv_flood_random_sites(n, shape, 12345, random);
    spconv_tensor *crafted_t = wrap(SPCONV_I32, crafted, n), *random_t = wrap(SPCONV_I32, random, n);
    double crafted_ms[MAX_REPEAT + 1], random_ms[MAX_REPEAT + 1];
    int64_t crafted_pairs = 0, random_pairs = 0;
    for (int r = 0; r <= repeat; ++r) {
        crafted_ms[r] = subm_ms(ctx, crafted_t, shape, &crafted_pairs);
        random_ms[r] = subm_ms(ctx, random_t, shape, &random_pairs);
    }
    print_row("rulebook", n, summarize(crafted_ms + 1, repeat), summarize(random_ms + 1, repeat),
              "pairs", crafted_pairs, random_pairs);
    spconv_tensor_release(crafted_t);
    spconv_tensor_release(random_t);
    free(crafted);
    free(random);
}

static void write_scan(const char *path, int64_t n) {
    spconv_net_input zin;
    if (spconv_zoo_input("second", &zin) != SPCONV_OK) die("spconv_zoo_input");
    spconv_voxelize_params vp;
    for (int a = 0; a < 3; ++a) {
        vp.voxel_size[a] = (float)zin.voxel_size[a];
        vp.range[a] = (float)zin.point_range[a];
        vp.range[a + 3] = (float)zin.point_range[a + 3];
    }
    vp.max_points = zin.max_points_per_voxel;
    vp.max_voxels = zin.max_voxels;
    vp.outputs = SPCONV_VOXELIZE_MEAN;
    float *points = malloc((size_t)n * 4 * sizeof *points);
    if (points == NULL) die("out of memory");
    const int64_t found = spconv_flood_voxel_points(n, 4, &vp, points);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(points, 4 * sizeof *points, (size_t)found, f) != (size_t)found ||
        fclose(f) != 0) {
        fprintf(stderr, "bench_hash_flood: cannot write %s\n", path);
        exit(1);
    }
    printf("wrote %lld crafted points (%lld bytes) to %s\n", (long long)found,
           (long long)found * 16, path);
    free(points);
}

int main(int argc, char **argv) {
    int64_t voxel_points = 65536, sites = 131072, scan_points = 1048576;
    int repeat = 3, threads = 0;
    const char *scan_path = NULL;
    for (int i = 1; i < argc; ++i) {
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (value != NULL && strcmp(argv[i], "--voxel-points") == 0) voxel_points = atoll(value);
        else if (value != NULL && strcmp(argv[i], "--sites") == 0) sites = atoll(value);
        else if (value != NULL && strcmp(argv[i], "--repeat") == 0) repeat = atoi(value);
        else if (value != NULL && strcmp(argv[i], "--threads") == 0) threads = atoi(value);
        else if (value != NULL && strcmp(argv[i], "--write-scan") == 0) scan_path = value;
        else if (value != NULL && strcmp(argv[i], "--scan-points") == 0) scan_points = atoll(value);
        else {
            fprintf(stderr, "usage: bench_hash_flood [--voxel-points N] [--sites N] [--repeat R] "
                            "[--threads T] [--write-scan FILE [--scan-points P]]\n");
            return 2;
        }
        ++i;
    }
    if (repeat < 1 || repeat > MAX_REPEAT || voxel_points < 1 || sites < 1 || scan_points < 1) {
        fprintf(stderr, "bench_hash_flood: counts must be >= 1 and --repeat at most %d\n",
                MAX_REPEAT);
        return 2;
    }
    if (scan_path != NULL) {
        write_scan(scan_path, scan_points);
        return 0;
    }
    spconv_context *ctx;
    if (spconv_context_create(spconv_cpu(), &ctx) != SPCONV_OK) die("spconv_context_create");
    if (threads > 0) spconv_context_set_num_threads(ctx, threads);
    printf("threads %d, %d runs each\n", spconv_context_num_threads(ctx), repeat);
    bench_voxelizer(ctx, voxel_points, repeat);
    bench_rulebook(ctx, sites, repeat);
    spconv_context_destroy(ctx);
    return 0;
}
