/* Benchmark of the point-cloud readers and the voxelizer.
 *   bench_voxelize [DATA_DIR] [--reps N]
 * DATA_DIR defaults to $SPCONV_DATA_DIR, else ../shared/data. Prints the median read time of each
 * file there that is present, then the time to voxelize spconv_benchmark_pc.bin (voxel 0.05 m,
 * mean mode) with 1 thread and with all threads: the median and, because a shared machine adds
 * other people's load, the fastest run too. */
#define _POSIX_C_SOURCE 199309L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "spconv/spconv.h"
#include "bench_common.h"

#define MAX_REPS 1000

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void join(char *buf, size_t size, const char *dir, const char *name) {
    snprintf(buf, size, "%s/%s", dir, name);
}

static void bench_reads(const char *dir, int reps) {
    static const char *const files[] = {"bunny.pcd", "cturtle.pcd", "office1.pcd", "cube.ply",
                                        "kitti_000008.bin", "nuscenes_lidar_top.pcd.bin",
                                        "spconv_benchmark_pc.bin"};
    printf("%-28s %-36s %9s %6s %9s\n", "file", "format", "points", "fields", "read ms");
    for (size_t f = 0; f < sizeof files / sizeof files[0]; ++f) {
        char path[1024];
        join(path, sizeof path, dir, files[f]);
        double times[MAX_REPS];
        spconv_point_cloud *pc = NULL;
        spconv_status st = SPCONV_OK;
        for (int r = 0; r < reps && st == SPCONV_OK; ++r) {
            spconv_point_cloud_destroy(pc);
            pc = NULL;
            double t0 = now_ms();
            st = spconv_point_cloud_read(path, SPCONV_CLOUD_AUTO, 0, &pc);
            times[r] = now_ms() - t0;
        }
        if (st != SPCONV_OK) {
            printf("%-28s skipped: %s\n", files[f], spconv_last_error());
            continue;
        }
        printf("%-28s %-36s %9lld %6d %9.2f\n", files[f], spconv_point_cloud_format_detail(pc),
               (long long)spconv_point_cloud_num_points(pc), spconv_point_cloud_num_fields(pc),
               bench_median(times, reps));
        spconv_point_cloud_destroy(pc);
    }
}

/* Median and fastest milliseconds of spconv_voxelize over @p reps runs; -1 on failure. */
static double time_voxelize(spconv_context *ctx, const spconv_tensor *points,
                            const spconv_voxelize_params *params, int reps, spconv_voxels *last,
                            double *fastest) {
    double times[MAX_REPS];
    for (int r = 0; r < reps; ++r) {
        spconv_voxels_release(last);
        double t0 = now_ms();
        spconv_status st = spconv_voxelize(ctx, points, params, last);
        times[r] = now_ms() - t0;
        if (st != SPCONV_OK) {
            fprintf(stderr, "bench_voxelize: %s\n", spconv_last_error());
            return -1.0;
        }
    }
    double med = bench_median(times, reps); /* sorts */
    *fastest = times[0];
    return med;
}

static int bench_voxelize(const char *dir, int reps) {
    char path[1024];
    join(path, sizeof path, dir, "spconv_benchmark_pc.bin");
    spconv_point_cloud *pc;
    if (spconv_point_cloud_read(path, SPCONV_CLOUD_AUTO, 0, &pc) != SPCONV_OK) {
        printf("voxelize: skipped: %s\n", spconv_last_error());
        return 0;
    }
    spconv_context *ctx;
    if (spconv_context_create(spconv_cpu(), &ctx) != SPCONV_OK) {
        spconv_point_cloud_destroy(pc);
        fprintf(stderr, "bench_voxelize: %s\n", spconv_last_error());
        return 1;
    }
    spconv_voxelize_params params = {{0.05f, 0.05f, 0.05f}, {-74.f, -38.f, -1.1f, 75.f, 61.f, 5.9f},
                                     5, INT64_MAX, SPCONV_VOXELIZE_MEAN};
    const int thread_counts[2] = {1, spconv_context_num_threads(NULL)};
    const char *const modes[2] = {"mean", "mean+voxels"};
    printf("\nvoxelize spconv_benchmark_pc.bin (%lld points), voxel 0.05 m, max 5 points/voxel\n",
           (long long)spconv_point_cloud_num_points(pc));
    printf("%-12s %8s %9s %10s %10s %10s\n", "outputs", "threads", "voxels", "median ms",
           "fastest ms", "grid");
    int rc = 0;
    for (int m = 0; m < 2 && rc == 0; ++m) {
        params.outputs = m == 0 ? SPCONV_VOXELIZE_MEAN : SPCONV_VOXELIZE_MEAN | SPCONV_VOXELIZE_VOXELS;
        for (int t = 0; t < 2 && rc == 0; ++t) {
            spconv_context_set_num_threads(ctx, thread_counts[t]);
            spconv_voxels v = {0};
            double fastest = 0;
            double ms = time_voxelize(ctx, spconv_point_cloud_points(pc), &params, reps, &v,
                                      &fastest);
            if (ms < 0) rc = 1;
            else
                printf("%-12s %8d %9lld %10.2f %10.2f %lldx%lldx%lld\n", modes[m],
                       thread_counts[t], (long long)spconv_tensor_size(v.coords, 0), ms, fastest,
                       (long long)v.grid_size[0], (long long)v.grid_size[1],
                       (long long)v.grid_size[2]);
            spconv_voxels_release(&v);
        }
    }
    spconv_context_destroy(ctx);
    spconv_point_cloud_destroy(pc);
    return rc;
}

int main(int argc, char **argv) {
    const char *dir = getenv("SPCONV_DATA_DIR");
    if (dir == NULL) dir = "../shared/data";
    int reps = 21;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (argv[i][0] != '-') {
            dir = argv[i];
        } else {
            fprintf(stderr, "usage: bench_voxelize [DATA_DIR] [--reps N]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "bench_voxelize: --reps must be in [1, %d]\n", MAX_REPS);
        return 2;
    }
    printf("data: %s, %d repetitions, medians\n\n", dir, reps);
    bench_reads(dir, reps);
    return bench_voxelize(dir, reps);
}
