/* `spconv voxelize` and `spconv info`: from a LiDAR file (.bin, .pcd, .ply) to voxels in .npy
 * files, and what a file holds. See each command's --help. */
#define _POSIX_C_SOURCE 199309L
#define _DEFAULT_SOURCE /* sysinfo */

#include <float.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/sysinfo.h>
#include <time.h>

#include "cli_args.h"
#include "commands.h"
#include "spconv/spconv.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int ends_with(const char *text, const char *suffix) {
    size_t n = strlen(text), m = strlen(suffix);
    return n >= m && strcmp(text + n - m, suffix) == 0;
}

static int read_scan(const char *cmd, const char *path, int64_t columns, spconv_point_cloud **pc) {
    /* The reader tells formats by name (.bin, .pcd, .ply) and only .bin has a column count: say
     * so in the option's words before the library names its parameter. */
    if (columns > 0 && !ends_with(path, ".bin"))
        return cli_error(cmd, "--columns %lld: only a .bin file takes a column count; '%s' is %s",
                         (long long)columns, path,
                         ends_with(path, ".pcd")   ? "a PCD file"
                         : ends_with(path, ".ply") ? "a PLY file"
                                                   : "not named .bin");
    spconv_status st = spconv_point_cloud_read(path, SPCONV_CLOUD_AUTO, (int)columns, pc);
    return st == SPCONV_OK ? 0 : cli_status_error(cmd, st, "reading the scan");
}

static void print_fields(const spconv_point_cloud *pc) {
    printf("  fields        ");
    for (int f = 0; f < spconv_point_cloud_num_fields(pc); ++f)
        printf("%s%s", f ? " " : "", spconv_point_cloud_field_name(pc, f));
    printf("\n");
}

/* ---- spconv info ------------------------------------------------------------------------------ */

/* Smallest, largest and mean value of every field. */
static void print_field_stats(const spconv_point_cloud *pc) {
    const int64_t P = spconv_point_cloud_num_points(pc);
    const int F = spconv_point_cloud_num_fields(pc);
    const float *d = spconv_tensor_data(spconv_point_cloud_points(pc));
    printf("  %-14s %14s %14s %14s\n", "field", "min", "max", "mean");
    for (int f = 0; f < F; ++f) {
        float lo = FLT_MAX, hi = -FLT_MAX;
        double sum = 0.0;
        for (int64_t i = 0; i < P; ++i) {
            float v = d[i * F + f];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
            sum += v;
        }
        printf("  %-14s %14.6g %14.6g %14.6g\n", spconv_point_cloud_field_name(pc, f), lo, hi,
               sum / (double)P);
    }
}

int spconv_cmd_info(int argc, char **argv) {
    static const char cmd[] = "info";
    const char *path = NULL;
    int64_t columns = 0;
    cli_option opts[] = {
        {.name = "--columns", .kind = CLI_INT, .value = &columns, .metavar = "F", .min = 3,
         .max = 4096, .help = "float32 per point of a .bin file (default: 5 for .pcd.bin, else 4)"},
    };
    cli_spec spec = {.command = cmd, .summary = "print what a point-cloud file holds",
                     .positional = "SCAN", .positional_value = &path, .options = opts,
                     .num_options = 1,
                     .epilog = "SCAN is a KITTI/nuScenes .bin, a PCD or a PLY file. Prints the "
                               "format, the points\n(after dropping NaN/inf), the fields and "
                               "each field's range and mean."};
    int status;
    if (!cli_parse(&spec, argc, argv, &status)) return status;
    spconv_point_cloud *pc;
    double t0 = now_ms();
    int rc = read_scan(cmd, path, columns, &pc);
    if (rc != 0) return rc;
    double read_ms = now_ms() - t0;
    int64_t width, height;
    spconv_point_cloud_layout(pc, &width, &height);
    printf("%s\n  format        %s\n", path, spconv_point_cloud_format_detail(pc));
    printf("  points        %lld (%lld NaN/inf dropped", (long long)spconv_point_cloud_num_points(pc),
           (long long)spconv_point_cloud_dropped_nonfinite(pc));
    if (height > 1) printf("; organized %lld x %lld", (long long)width, (long long)height);
    printf(")\n");
    print_fields(pc);
    float lo[3], hi[3];
    if (spconv_point_cloud_bounds(pc, lo, hi) == SPCONV_OK) {
        printf("  bounds        x [%g, %g]  y [%g, %g]  z [%g, %g]\n", lo[0], hi[0], lo[1], hi[1],
               lo[2], hi[2]);
        print_field_stats(pc);
    }
    printf("  read          %.2f ms\n", read_ms);
    spconv_point_cloud_destroy(pc);
    return 0;
}

/* ---- spconv voxelize -------------------------------------------------------------------------- */

typedef struct voxelize_args {
    const char *scan;
    double voxel_size[3];
    double range[6];
    int64_t max_points;
    int64_t max_voxels; /* 0: no limit */
    int64_t columns;    /* 0: from the name */
    int64_t threads;    /* 0: all cores */
    const char *out_dir;
    const char *device; /* NULL: the CPU */
} voxelize_args;

/* Voxel centres (x, y, z) followed by the mean of every field and the point count: a PCD that
 * PCL tools and CloudCompare can show. */
static spconv_status centres_cloud(const spconv_voxels *v, const spconv_voxelize_params *vp,
                                   const spconv_point_cloud *pc, spconv_tensor **out) {
    const int64_t M = spconv_tensor_size(v->coords, 0), F = spconv_point_cloud_num_fields(pc);
    const int64_t cols = 3 + F + 1;
    spconv_status st = spconv_tensor_empty(spconv_cpu(), SPCONV_F32, 2, (int64_t[]){M, cols}, out);
    if (st != SPCONV_OK) return st;
    float *d = spconv_tensor_data(*out);
    const int32_t *c = spconv_tensor_data(v->coords), *n = spconv_tensor_data(v->num_points);
    const float *mean = spconv_tensor_data(v->features);
    for (int64_t i = 0; i < M; ++i) {
        float *row = d + i * cols;
        for (int a = 0; a < 3; ++a) /* coords are (z, y, x) */
            row[a] = vp->range[a] + ((float)c[i * 3 + 2 - a] + 0.5f) * vp->voxel_size[a];
        memcpy(row + 3, mean + i * F, (size_t)F * sizeof *row);
        row[3 + F] = (float)n[i];
    }
    return SPCONV_OK;
}

static int write_centres(cli_outdir *od, const spconv_voxels *v, const spconv_voxelize_params *vp,
                         const spconv_point_cloud *pc) {
    const int F = spconv_point_cloud_num_fields(pc);
    char **names = calloc((size_t)F + 4, sizeof *names);
    spconv_tensor *centres = NULL;
    const char *path;
    int rc = names == NULL ? cli_error(od->cmd, "out of memory") : 0;
    for (int f = 0; rc == 0 && f < F + 4; ++f) {
        const char *base = f < 3 ? (const char *[]){"x", "y", "z"}[f]
                           : f < 3 + F ? spconv_point_cloud_field_name(pc, f - 3) : "num_points";
        size_t len = strlen(base) + 6;
        names[f] = malloc(len);
        if (names[f] == NULL) rc = cli_error(od->cmd, "out of memory");
        else snprintf(names[f], len, "%s%s", f >= 3 && f < 3 + F ? "mean_" : "", base);
    }
    if (rc == 0) rc = cli_outdir_path(od, "centres.pcd", &path);
    spconv_status st = SPCONV_OK;
    if (rc == 0) st = centres_cloud(v, vp, pc, &centres);
    if (rc == 0 && st == SPCONV_OK) st = spconv_pcd_write(NULL, path, centres, (const char *const *)names);
    if (rc == 0 && st != SPCONV_OK) rc = cli_outdir_write_error(od, path, st, "centres.pcd");
    for (int f = 0; names != NULL && f < F + 4; ++f) free(names[f]);
    free(names);
    spconv_tensor_release(centres);
    return rc;
}

static int write_outputs(const char *cmd, const voxelize_args *a, spconv_context *ctx,
                         const spconv_voxels *v, const spconv_voxelize_params *vp,
                         const spconv_point_cloud *pc) {
    cli_outdir od;
    int rc = cli_outdir_open(&od, cmd, a->out_dir);
    if (rc == 0) rc = cli_outdir_write_npy(&od, ctx, "coords.npy", v->coords);
    if (rc == 0) rc = cli_outdir_write_npy(&od, ctx, "features.npy", v->features);
    if (rc == 0) rc = cli_outdir_write_npy(&od, ctx, "voxels.npy", v->voxels);
    if (rc == 0) rc = cli_outdir_write_npy(&od, ctx, "num_points.npy", v->num_points);
    if (rc == 0) rc = write_centres(&od, v, vp, pc);
    if (rc == 0) rc = cli_outdir_commit(&od);
    cli_outdir_close(&od);
    return rc;
}

static void print_summary(const voxelize_args *a, const spconv_point_cloud *pc,
                          const spconv_voxels *v, const double ms[3]) {
    const spconv_voxelize_stats *s = &v->stats;
    printf("%s\n  format        %s\n", a->scan, spconv_point_cloud_format_detail(pc));
    print_fields(pc);
    printf("  points read   %lld\n", (long long)(s->points_in + spconv_point_cloud_dropped_nonfinite(pc)));
    printf("  dropped       NaN/inf %lld, out of range %lld, voxel overflow %lld\n",
           (long long)(s->dropped_nonfinite + spconv_point_cloud_dropped_nonfinite(pc)),
           (long long)s->dropped_range, (long long)s->dropped_voxel_overflow);
    printf("  not stored    %lld points beyond %lld per voxel (still mapped to their voxel)\n",
           (long long)s->dropped_point_overflow, (long long)a->max_points);
    printf("  voxels        %lld", (long long)spconv_tensor_size(v->coords, 0));
    if (a->max_voxels > 0) printf(" (at most %lld)", (long long)a->max_voxels);
    printf("\n  grid          %lld x %lld x %lld (x, y, z); spatial shape D,H,W = %lld,%lld,%lld\n",
           (long long)v->grid_size[0], (long long)v->grid_size[1], (long long)v->grid_size[2],
           (long long)v->grid_size[2], (long long)v->grid_size[1], (long long)v->grid_size[0]);
    printf("  time          read %.2f ms, voxelize %.2f ms", ms[0], ms[1]);
    if (a->out_dir != NULL) printf(", write %.2f ms", ms[2]);
    printf("\n");
    if (a->out_dir != NULL)
        printf("  wrote         %s/{coords,features,voxels,num_points}.npy, centres.pcd\n",
               a->out_dir);
}

static void voxelize_options(voxelize_args *a, cli_option *opts, int *n) {
    opts[(*n)++] = (cli_option){.name = "--voxel-size", .kind = CLI_FLOATS, .value = a->voxel_size,
                                .count = 3, .metavar = "X,Y,Z", .required = 1,
                                .help = "voxel size in metres along x, y, z"};
    opts[(*n)++] = (cli_option){.name = "--range", .kind = CLI_FLOATS, .value = a->range,
                                .count = 6, .metavar = "XMIN,YMIN,ZMIN,XMAX,YMAX,ZMAX",
                                .required = 1, .help = "point range; grid = round((max-min)/size)"};
    opts[(*n)++] = (cli_option){.name = "--max-points", .kind = CLI_INT, .value = &a->max_points,
                                .metavar = "N", .min = 1, .max = 1 << 20,
                                .help = "points kept per voxel (default 5)"};
    opts[(*n)++] = (cli_option){.name = "--max-voxels", .kind = CLI_INT, .value = &a->max_voxels,
                                .metavar = "M", .min = 1, .max = INT32_MAX,
                                .help = "voxels kept, first come first kept (default: no limit)"};
    opts[(*n)++] = (cli_option){.name = "--columns", .kind = CLI_INT, .value = &a->columns,
                                .metavar = "F", .min = 3, .max = 4096,
                                .help = "float32 per point of a .bin (default: 5 for .pcd.bin, else 4)"};
    opts[(*n)++] = (cli_option){.name = "--threads", .kind = CLI_INT, .value = &a->threads,
                                .metavar = "N", .min = 1, .max = SPCONV_MAX_THREADS,
                                .help = "CPU threads (default: all cores)"};
    opts[(*n)++] = (cli_option){.name = "--out", .kind = CLI_PATH, .value = &a->out_dir,
                                .metavar = "DIR",
                                .help = "output folder (created; files appear only on success)"};
    opts[(*n)++] = (cli_option){.name = "--device", .kind = CLI_PATH, .value = &a->device,
                                .metavar = "cpu|cuda[:N]",
                                .help = "where to voxelize (default cpu; the results are the same)"};
}

/* Each axis of --voxel-size and --range on its own, so that the message names the option at
 * fault; what only the two together decide (the grid's size) is left to the library's check. */
static int check_grid_options(const char *cmd, const voxelize_args *a) {
    static const char axes[3] = {'x', 'y', 'z'};
    for (int i = 0; i < 3; ++i)
        if (!((float)a->voxel_size[i] > 0.0f))
            return cli_error(cmd, "--voxel-size: %c = %g must be positive", axes[i],
                             a->voxel_size[i]);
    const double *r = a->range;
    for (int i = 0; i < 3; ++i)
        if (!((float)r[i] < (float)r[i + 3]))
            return cli_error(cmd, "--range '%g,%g,%g,%g,%g,%g': %cMIN %g must be less than %cMAX "
                             "%g", r[0], r[1], r[2], r[3], r[4], r[5], axes[i] - 32, r[i],
                             axes[i] - 32, r[i + 3]);
    return 0;
}

/* Parameters from the arguments. */
static int make_params(const char *cmd, const voxelize_args *a, spconv_voxelize_params *vp) {
    int rc = check_grid_options(cmd, a);
    if (rc != 0) return rc;
    for (int i = 0; i < 3; ++i) vp->voxel_size[i] = (float)a->voxel_size[i];
    for (int i = 0; i < 6; ++i) vp->range[i] = (float)a->range[i];
    vp->max_points = a->max_points;
    vp->max_voxels = a->max_voxels > 0 ? a->max_voxels : INT64_MAX;
    /* Without --out only the counts of the summary are needed: the [M, max-points, F] voxels
     * array can be far larger than the scan, so it is made only when it is written. */
    vp->outputs = a->out_dir != NULL ? SPCONV_VOXELIZE_VOXELS | SPCONV_VOXELIZE_MEAN : 0;
    int64_t grid[3];
    spconv_status st = spconv_voxelize_grid_size(vp, grid);
    return st == SPCONV_OK ? 0 : cli_status_error(cmd, st, "--voxel-size/--range");
}

/* The memory this process can have: the machine's, or less under an address-space limit. */
static double memory_limit(const char **what) {
    struct sysinfo info;
    double bytes = sysinfo(&info) == 0 ? (double)info.totalram * info.mem_unit : 0.0;
    *what = "this machine's memory";
    struct rlimit limit;
    if (getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
        (bytes == 0.0 || (double)limit.rlim_cur < bytes)) {
        bytes = (double)limit.rlim_cur;
        *what = "this process's address-space limit";
    }
    return bytes;
}

/* voxels.npy is [M, --max-points, F] float32, M known only after voxelizing: a large --max-points
 * can ask for far more than the machine has. When even M = every point could be too much, count
 * the voxels first (without the voxels array) and refuse a size that cannot fit. */
static int check_voxels_size(const char *cmd, const voxelize_args *a, spconv_context *ctx,
                             const spconv_point_cloud *pc, const spconv_voxelize_params *vp) {
    if (!(vp->outputs & SPCONV_VOXELIZE_VOXELS)) return 0;
    const char *what;
    const double limit = memory_limit(&what);
    const int64_t points = spconv_point_cloud_num_points(pc);
    const double row = (double)vp->max_points * spconv_point_cloud_num_fields(pc) * 4.0;
    const double most = (double)(points < vp->max_voxels ? points : vp->max_voxels);
    if (limit <= 0.0 || most * row <= limit) return 0;
    spconv_voxelize_params counting = *vp;
    counting.outputs = 0;
    spconv_voxels v;
    spconv_status st = spconv_voxelize(ctx, spconv_point_cloud_points(pc), &counting, &v);
    if (st != SPCONV_OK) return cli_status_error(cmd, st, "voxelizing");
    const int64_t m = spconv_tensor_size(v.coords, 0);
    spconv_voxels_release(&v);
    const double gib = 1024.0 * 1024.0 * 1024.0;
    if ((double)m * row <= limit) return 0;
    return cli_error(cmd, "--max-points %lld: voxels.npy would be [M = %lld, %lld, %d] float32 = "
                     "%.0f GiB, more than %s (%.1f GiB)", (long long)a->max_points, (long long)m,
                     (long long)vp->max_points, spconv_point_cloud_num_fields(pc),
                     (double)m * row / gib, what, limit / gib);
}

/* Voxelize on the device of @p ctx (the points copied there) and bring the results back to the
 * host, where they are written and summarised. */
static spconv_status voxelize_on(spconv_context *ctx, const spconv_tensor *points,
                                 const spconv_voxelize_params *vp, spconv_voxels *v) {
    const spconv_device device = spconv_context_device(ctx);
    if (device.type == SPCONV_DEVICE_CPU) return spconv_voxelize(ctx, points, vp, v);
    spconv_tensor *on_device;
    spconv_status st = spconv_tensor_to_device(ctx, points, device, &on_device);
    if (st != SPCONV_OK) return st;
    st = spconv_voxelize(ctx, on_device, vp, v);
    spconv_tensor_release(on_device);
    spconv_tensor **outputs[5] = {&v->voxels, &v->features, &v->coords, &v->num_points,
                                  &v->point_voxel};
    for (int i = 0; i < 5 && st == SPCONV_OK; ++i) {
        if (*outputs[i] == NULL) continue;
        spconv_tensor *host;
        st = spconv_tensor_to_device(ctx, *outputs[i], spconv_cpu(), &host);
        if (st != SPCONV_OK) break;
        spconv_tensor_release(*outputs[i]);
        *outputs[i] = host;
    }
    if (st != SPCONV_OK) spconv_voxels_release(v);
    return st;
}

static int run_voxelize(const char *cmd, const voxelize_args *a, spconv_context *ctx,
                        const spconv_voxelize_params *vp) {
    spconv_point_cloud *pc;
    double ms[3] = {0, 0, 0}, t0 = now_ms();
    int rc = read_scan(cmd, a->scan, a->columns, &pc);
    if (rc != 0) return rc;
    ms[0] = now_ms() - t0;
    rc = check_voxels_size(cmd, a, ctx, pc, vp);
    if (rc != 0) {
        spconv_point_cloud_destroy(pc);
        return rc;
    }
    spconv_voxels v;
    t0 = now_ms();
    spconv_status st = voxelize_on(ctx, spconv_point_cloud_points(pc), vp, &v);
    ms[1] = now_ms() - t0;
    if (st != SPCONV_OK) rc = cli_status_error(cmd, st, "voxelizing");
    if (rc == 0 && a->out_dir != NULL) {
        t0 = now_ms();
        rc = write_outputs(cmd, a, ctx, &v, vp, pc);
        ms[2] = now_ms() - t0;
    }
    if (rc == 0) print_summary(a, pc, &v, ms);
    spconv_voxels_release(&v);
    spconv_point_cloud_destroy(pc);
    return rc;
}

int spconv_cmd_voxelize(int argc, char **argv) {
    static const char cmd[] = "voxelize";
    voxelize_args a = {.max_points = 5};
    cli_option opts[9];
    int n = 0;
    voxelize_options(&a, opts, &n);
    cli_spec spec = {
        .command = cmd,
        .summary = "points of a LiDAR scan to voxels (spconv's Point2VoxelCPU3d), as .npy files",
        .positional = "SCAN", .positional_value = &a.scan, .options = opts, .num_options = n,
        .epilog = "SCAN is a KITTI/nuScenes .bin, a PCD or a PLY file. Voxel c = floor((p - min) / "
                  "size); voxels are\nnumbered by first appearance. With --out DIR, writes "
                  "coords.npy (int32 [M, 3] z, y, x),\nfeatures.npy (float32 [M, F] mean of the "
                  "voxel's points), voxels.npy (float32\n[M, max-points, F], unused slots zero), "
                  "num_points.npy (int32 [M]) and centres.pcd\n(voxel centres with the mean "
                  "features, for PCL tools and CloudCompare).\nExample (SECOND, KITTI): --voxel-size "
                  "0.05,0.05,0.1 --range 0,-40,-3,70.4,40,1"};
    int status;
    if (!cli_parse(&spec, argc, argv, &status)) return status;
    spconv_voxelize_params vp;
    int rc = make_params(cmd, &a, &vp);
    static const char *const out_names[] = {"coords.npy",     "features.npy", "voxels.npy",
                                            "num_points.npy", "centres.pcd",  NULL};
    if (rc == 0 && a.out_dir != NULL) rc = cli_outdir_check(cmd, a.out_dir, out_names);
    spconv_device device;
    if (rc == 0) rc = cli_parse_device(cmd, "--device", a.device, &device);
    if (rc != 0) return rc;
    spconv_context *ctx;
    spconv_status st = spconv_context_create(device, &ctx);
    if (st != SPCONV_OK) return cli_status_error(cmd, st, "creating a context");
    st = spconv_context_set_num_threads(ctx, (int)a.threads);
    rc = st == SPCONV_OK ? run_voxelize(cmd, &a, ctx, &vp) : cli_status_error(cmd, st, "--threads");
    spconv_context_destroy(ctx);
    return rc;
}
