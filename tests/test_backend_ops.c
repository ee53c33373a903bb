/* Every map op on every backend present, against the CPU backend bit for bit (after ggml's
 * test-backend-ops): voxelize (single scans and batches, every output, overflows, drops) and
 * rulebook build (regular, subm, transposed, pool; per-axis kernel, stride, padding, dilation;
 * batches of 1 and 2) on fresh random inputs (the seed is printed) and on the real scans of
 * ../shared/data, plus the error paths a device adds: bad coordinates validated on the device
 * (the CPU's messages), a full hash table, a device that is not there. Backends: the CPU itself,
 * then CUDA device 0 when one is present (the host emulation counts: its kernels then run here). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rulebook_testing.h"
#include "common/test_util.h"
#include "spconv/config.h"
#if SPCONV_HAVE_CUDA
#include "cuda/hash_table.h"
#endif

#define MAX_BACKENDS 2

typedef struct backend_under_test {
    spconv_device device;
    const char *name;
} backend_under_test;

static int list_backends(backend_under_test out[MAX_BACKENDS]) {
    int n = 0;
    out[n++] = (backend_under_test){spconv_cpu(), "cpu"};
    if (spconv_has_cuda() && spconv_cuda_device_count() > 0)
        out[n++] = (backend_under_test){spconv_cuda(0), "cuda:0"};
    return n;
}

static int gpu_present(void) { return spconv_has_cuda() && spconv_cuda_device_count() > 0; }

/* ---- comparing tensors on any device --------------------------------------------------------- */

static unsigned char *read_back(spconv_context *ctx, const spconv_tensor *t, size_t *nbytes) {
    *nbytes = (size_t)spconv_tensor_numel(t) * spconv_dtype_size(spconv_tensor_dtype(t));
    unsigned char *bytes = malloc(*nbytes > 0 ? *nbytes : 1);
    assert_non_null(bytes);
    SPCONV_ASSERT_OK(spconv_tensor_copy_to_host(ctx, t, bytes, *nbytes));
    return bytes;
}

/* Fail, naming the first differing byte, unless @p got and @p want hold the same dtype, shape and
 * bits (both NULL is equal). */
static void assert_same_tensor(spconv_context *ctx, const spconv_tensor *got,
                               const spconv_tensor *want, const char *what, const char *backend) {
    if (got == NULL || want == NULL) {
        if (got != want) fail_msg("%s on %s: one tensor is NULL, the other not", what, backend);
        return;
    }
    assert_int_equal(spconv_tensor_dtype(got), spconv_tensor_dtype(want));
    assert_int_equal(spconv_tensor_ndim(got), spconv_tensor_ndim(want));
    for (int d = 0; d < spconv_tensor_ndim(got); ++d)
        if (spconv_tensor_size(got, d) != spconv_tensor_size(want, d))
            fail_msg("%s on %s: size %d is %" PRId64 ", the CPU's %" PRId64, what, backend, d,
                     spconv_tensor_size(got, d), spconv_tensor_size(want, d));
    size_t n_got, n_want;
    unsigned char *a = read_back(ctx, got, &n_got), *b = read_back(ctx, want, &n_want);
    assert_int_equal(n_got, n_want);
    for (size_t i = 0; i < n_got; ++i)
        if (a[i] != b[i]) {
            free(a);
            free(b);
            fail_msg("%s on %s: byte %zu differs from the CPU's", what, backend, i);
        }
    free(a);
    free(b);
}

/* ---- voxelize ---------------------------------------------------------------------------------- */

static void assert_same_voxels(spconv_context *ctx, const spconv_voxels *got,
                               const spconv_voxels *want, const char *backend) {
    assert_same_tensor(ctx, got->coords, want->coords, "coords", backend);
    assert_same_tensor(ctx, got->num_points, want->num_points, "num_points", backend);
    assert_same_tensor(ctx, got->point_voxel, want->point_voxel, "point_voxel", backend);
    assert_same_tensor(ctx, got->voxels, want->voxels, "voxels", backend);
    assert_same_tensor(ctx, got->features, want->features, "features", backend);
    assert_memory_equal(got->grid_size, want->grid_size, sizeof got->grid_size);
    assert_memory_equal(&got->stats, &want->stats, sizeof got->stats);
    if (spconv_tensor_numel(got->num_points) > 0)
        assert_int_equal(spconv_tensor_device(got->coords).type,
                         spconv_tensor_device(got->point_voxel).type);
}

/* A random cloud on a coarse grid, so that voxels collect several points: some points outside
 * the range, some NaN or infinite, runs of equal points. f32 [P, F] on the CPU. */
static spconv_tensor *random_cloud(int64_t P, int64_t F) {
    float *data = malloc((size_t)(P * F + 1) * sizeof *data);
    assert_non_null(data);
    for (int64_t i = 0; i < P; ++i) {
        float *p = data + i * F;
        if (i > 0 && spconv_test_rand_int(0, 9) == 0) {
            memcpy(p, p - F, (size_t)F * sizeof *p); /* the same voxel again, next in the list */
        } else {
            p[0] = spconv_test_rand_float(-1.0f, 9.0f);
            p[1] = spconv_test_rand_float(-1.0f, 9.0f);
            p[2] = spconv_test_rand_float(-0.5f, 4.5f);
        }
        for (int64_t f = 3; f < F; ++f) p[f] = spconv_test_rand_float(-1.0f, 1.0f);
        const int64_t odd = spconv_test_rand_int(0, 99);
        if (odd == 0) p[spconv_test_rand_int(0, 2)] = NAN;
        if (odd == 1) p[spconv_test_rand_int(0, 2)] = -INFINITY;
        /* A -0.0 stays -0.0 in the mean of a voxel of one point (test_voxelize_one_point_bits
         * has NaN payloads, which only such voxels keep on a GPU: docs/cuda.md). */
        if (odd == 2) p[spconv_test_rand_int(0, F - 1)] = -0.0f;
    }
    const int64_t sizes[2] = {P, F};
    spconv_tensor *t;
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_F32, 2, sizes, data, &t));
    free(data);
    return t;
}

static spconv_voxelize_params random_voxel_params(void) {
    spconv_voxelize_params p;
    const float size = spconv_test_rand_int(0, 1) ? 0.5f : 1.0f;
    for (int a = 0; a < 3; ++a) p.voxel_size[a] = size * (a == 2 ? 0.5f : 1.0f);
    p.range[0] = 0.0f, p.range[1] = 0.0f, p.range[2] = 0.0f;
    p.range[3] = 8.0f, p.range[4] = 8.0f, p.range[5] = 4.0f;
    p.max_points = spconv_test_rand_int(1, 6);
    p.max_voxels = spconv_test_rand_int(0, 2) == 0 ? spconv_test_rand_int(1, 60) : INT64_MAX;
    p.outputs = (int)spconv_test_rand_int(0, 3);
    return p;
}

/* Voxelize @p scans on the CPU and on @p b (points copied to its device), compare. */
static void compare_voxelize(const backend_under_test *b, spconv_tensor *const *scans,
                             int64_t num_scans, int batch, const spconv_voxelize_params *params) {
    spconv_context *cpu_ctx, *ctx;
    SPCONV_ASSERT_OK(spconv_context_create(spconv_cpu(), &cpu_ctx));
    SPCONV_ASSERT_OK(spconv_context_create(b->device, &ctx));
    spconv_tensor *moved[4];
    assert_true(num_scans <= 4);
    for (int64_t i = 0; i < num_scans; ++i)
        SPCONV_ASSERT_OK(spconv_tensor_to_device(ctx, scans[i], b->device, &moved[i]));
    spconv_voxels want, got;
    if (batch) {
        SPCONV_ASSERT_OK(spconv_voxelize_batch(cpu_ctx, (const spconv_tensor *const *)scans,
                                               num_scans, params, &want));
        SPCONV_ASSERT_OK(spconv_voxelize_batch(ctx, (const spconv_tensor *const *)moved,
                                               num_scans, params, &got));
    } else {
        SPCONV_ASSERT_OK(spconv_voxelize(cpu_ctx, scans[0], params, &want));
        SPCONV_ASSERT_OK(spconv_voxelize(ctx, moved[0], params, &got));
    }
    assert_int_equal(spconv_tensor_device(got.coords).type, b->device.type);
    assert_same_voxels(ctx, &got, &want, b->name);
    spconv_voxels_release(&want);
    spconv_voxels_release(&got);
    for (int64_t i = 0; i < num_scans; ++i) spconv_tensor_release(moved[i]);
    spconv_context_destroy(ctx);
    spconv_context_destroy(cpu_ctx);
}

static void test_voxelize_random(void **state) {
    (void)state;
    backend_under_test backends[MAX_BACKENDS];
    const int n = list_backends(backends);
    for (int round = 0; round < 12; ++round) {
        const int64_t F = spconv_test_rand_int(3, 5);
        const int64_t num_scans = spconv_test_rand_int(1, 2);
        const int batch = round % 2;
        spconv_tensor *scans[2];
        for (int64_t i = 0; i < num_scans; ++i)
            scans[i] = random_cloud(spconv_test_rand_int(round == 0 ? 0 : 1, 3000), F);
        const spconv_voxelize_params params = random_voxel_params();
        for (int b = 0; b < n; ++b) compare_voxelize(&backends[b], scans, batch ? num_scans : 1,
                                                     batch, &params);
        for (int64_t i = 0; i < num_scans; ++i) spconv_tensor_release(scans[i]);
    }
}

/* The mean of a voxel of one point is that point bit for bit: -0.0, a signalling NaN and a quiet
 * NaN with a payload (a sum from 0.0 would make +0.0 and quiet or replace the NaNs). Each point
 * has a voxel of its own, so no arithmetic touches them on either backend. */
static void test_voxelize_one_point_bits(void **state) {
    (void)state;
    backend_under_test backends[MAX_BACKENDS];
    const int n = list_backends(backends);
    const uint32_t bits[4] = {0x80000000u, 0x7f800001u, 0x7fc0beefu, 0xffa00001u};
    float points[4][5];
    for (int i = 0; i < 4; ++i) {
        points[i][0] = 0.5f + (float)i, points[i][1] = 0.5f, points[i][2] = 0.5f;
        points[i][3] = (float)i;
        memcpy(&points[i][4], &bits[i], sizeof bits[i]);
    }
    const int64_t sizes[2] = {4, 5};
    spconv_tensor *cloud;
    SPCONV_ASSERT_OK(
        spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_F32, 2, sizes, points, &cloud));
    const spconv_voxelize_params params = {{1.0f, 1.0f, 1.0f}, {0.0f, 0.0f, 0.0f, 8.0f, 8.0f, 8.0f},
                                           4, 100, SPCONV_VOXELIZE_MEAN};
    for (int b = 0; b < n; ++b) compare_voxelize(&backends[b], &cloud, 1, 0, &params);
    spconv_voxels v;
    SPCONV_ASSERT_OK(spconv_voxelize(NULL, cloud, &params, &v));
    assert_int_equal(spconv_tensor_size(v.features, 0), 4);
    for (int i = 0; i < 4; ++i) {
        uint32_t got;
        memcpy(&got, (const float *)spconv_tensor_data(v.features) + 5 * i + 4, sizeof got);
        assert_int_equal(got, bits[i]);
    }
    spconv_voxels_release(&v);
    spconv_tensor_release(cloud);
}

/* An output too large to describe (max_points INT64_MAX with the [M, max_points, F] voxels) is
 * refused by every backend with a message naming the call (spconv_voxelize or _batch), not an
 * inner function. */
static void test_voxelize_output_overflow(void **state) {
    (void)state;
    backend_under_test backends[MAX_BACKENDS];
    const int n = list_backends(backends);
    spconv_tensor *cloud = random_cloud(100, 4);
    const spconv_voxelize_params params = {
        {1.0f, 1.0f, 1.0f}, {-1.0f, -1.0f, -1.0f, 9.0f, 9.0f, 5.0f}, INT64_MAX, 50,
        SPCONV_VOXELIZE_VOXELS};
    for (int b = 0; b < n; ++b) {
        spconv_tensor *moved = NULL;
        SPCONV_ASSERT_OK(spconv_tensor_to_device(NULL, cloud, backends[b].device, &moved));
        spconv_voxels v;
        SPCONV_ASSERT_FAILS(spconv_voxelize(NULL, moved, &params, &v), SPCONV_ERR_OVERFLOW,
                            "spconv_voxelize: ");
        const spconv_tensor *scans[2] = {moved, moved};
        SPCONV_ASSERT_FAILS(spconv_voxelize_batch(NULL, scans, 2, &params, &v),
                            SPCONV_ERR_OVERFLOW, "spconv_voxelize_batch: ");
        spconv_tensor_release(moved);
    }
    spconv_tensor_release(cloud);
}

/* A raw float32 file of 4 values per point (the KITTI / spconv layout) as a [P, 4] CPU tensor, or
 * NULL (the caller skips) when the data folder does not have it. */
static spconv_tensor *read_raw_f32(const char *name, int64_t columns) {
    char *path = spconv_test_data_path(name);
    if (path == NULL) return NULL;
    FILE *f = fopen(path, "rb");
    free(path);
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    const long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    const int64_t rows = bytes / (long)(columns * sizeof(float));
    float *data = malloc((size_t)(rows * columns + 1) * sizeof *data);
    assert_non_null(data);
    assert_int_equal(fread(data, sizeof(float), (size_t)(rows * columns), f),
                     (size_t)(rows * columns));
    fclose(f);
    const int64_t sizes[2] = {rows, columns};
    spconv_tensor *t;
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_F32, 2, sizes, data, &t));
    free(data);
    return t;
}

static void test_voxelize_real_scans(void **state) {
    (void)state;
    spconv_tensor *bench = read_raw_f32("spconv_benchmark_pc.bin", 4);
    spconv_tensor *kitti = read_raw_f32("kitti_000008.bin", 4);
    if (bench == NULL || kitti == NULL) {
        spconv_tensor_release(bench);
        spconv_tensor_release(kitti);
        print_message("the real scans are not in the data folder: skipped\n");
        skip();
    }
    /* SECOND's KITTI voxelization, and spconv's benchmark one (0.1 m cells, 5 points). */
    spconv_voxelize_params second = {{0.05f, 0.05f, 0.1f}, {0.0f, -40.0f, -3.0f, 70.4f, 40.0f, 1.0f},
                                     5, 16000, SPCONV_VOXELIZE_MEAN | SPCONV_VOXELIZE_VOXELS};
    spconv_voxelize_params wide = {{0.1f, 0.1f, 0.1f}, {-80.0f, -80.0f, -2.0f, 80.0f, 80.0f, 6.0f},
                                   5, INT64_MAX, SPCONV_VOXELIZE_MEAN};
    backend_under_test backends[MAX_BACKENDS];
    const int n = list_backends(backends);
    spconv_tensor *both[2] = {kitti, bench};
    for (int b = 0; b < n; ++b) {
        compare_voxelize(&backends[b], &kitti, 1, 0, &second);
        compare_voxelize(&backends[b], &bench, 1, 0, &wide);
        compare_voxelize(&backends[b], both, 2, 1, &second);
    }
    spconv_tensor_release(bench);
    spconv_tensor_release(kitti);
}

/* ---- rulebooks ------------------------------------------------------------------------------- */

static void assert_same_rulebook(spconv_context *ctx, const spconv_rulebook *got,
                                 const spconv_rulebook *want, const char *backend) {
    assert_int_equal(spconv_rulebook_num_in(got), spconv_rulebook_num_in(want));
    assert_int_equal(spconv_rulebook_num_out(got), spconv_rulebook_num_out(want));
    assert_int_equal(spconv_rulebook_kernel_volume(got), spconv_rulebook_kernel_volume(want));
    int64_t shape_got[3], shape_want[3];
    spconv_rulebook_out_shape(got, shape_got);
    spconv_rulebook_out_shape(want, shape_want);
    assert_memory_equal(shape_got, shape_want, sizeof shape_got);
    assert_int_equal(spconv_rulebook_num_pairs(got), spconv_rulebook_num_pairs(want));
    const int64_t active = spconv_rulebook_num_active_offsets(want);
    assert_int_equal(spconv_rulebook_num_active_offsets(got), active);
    for (int64_t a = 0; a <= active; ++a) {
        if (a < active && spconv_rulebook_active_offsets(got)[a] !=
                              spconv_rulebook_active_offsets(want)[a])
            fail_msg("rulebook on %s: active offset %" PRId64 " is %" PRId64 ", the CPU's %" PRId64,
                     backend, a, spconv_rulebook_active_offsets(got)[a],
                     spconv_rulebook_active_offsets(want)[a]);
        if (spconv_rulebook_active_starts(got)[a] != spconv_rulebook_active_starts(want)[a])
            fail_msg("rulebook on %s: active start %" PRId64 " is %" PRId64 ", the CPU's %" PRId64,
                     backend, a, spconv_rulebook_active_starts(got)[a],
                     spconv_rulebook_active_starts(want)[a]);
    }
    assert_same_tensor(ctx, spconv_rulebook_out_indices(got), spconv_rulebook_out_indices(want),
                       "out_indices", backend);
    assert_same_tensor(ctx, spconv_rulebook_pairs_in(got), spconv_rulebook_pairs_in(want),
                       "pairs_in", backend);
    assert_same_tensor(ctx, spconv_rulebook_pairs_out(got), spconv_rulebook_pairs_out(want),
                       "pairs_out", backend);
    if (spconv_rulebook_num_pairs(got) > 0)
        assert_int_equal(spconv_tensor_device(spconv_rulebook_pairs_in(got)).type,
                         spconv_tensor_device(spconv_rulebook_in_indices(got)).type);
}

/* Build on the CPU and on @p b from the same rows (copied to its device), compare. */
static void compare_rulebook(const backend_under_test *b, const spconv_tensor *indices,
                             const int64_t shape[3], int64_t batch,
                             const spconv_conv_params *params) {
    spconv_context *cpu_ctx, *ctx;
    SPCONV_ASSERT_OK(spconv_context_create(spconv_cpu(), &cpu_ctx));
    SPCONV_ASSERT_OK(spconv_context_create(b->device, &ctx));
    spconv_tensor *moved;
    SPCONV_ASSERT_OK(spconv_tensor_to_device(ctx, indices, b->device, &moved));
    spconv_rulebook *want, *got;
    SPCONV_ASSERT_OK(spconv_rulebook_build(cpu_ctx, indices, shape, batch, params, &want));
    SPCONV_ASSERT_OK(spconv_rulebook_build(ctx, moved, shape, batch, params, &got));
    assert_same_rulebook(ctx, got, want, b->name);
    if (params->kind == SPCONV_CONV_REGULAR) { /* the inverse swaps a device rulebook too */
        spconv_rulebook *inv_got, *inv_want;
        SPCONV_ASSERT_OK(spconv_rulebook_inverse(got, &inv_got));
        SPCONV_ASSERT_OK(spconv_rulebook_inverse(want, &inv_want));
        assert_same_rulebook(ctx, inv_got, inv_want, b->name);
        spconv_rulebook_release(inv_got);
        spconv_rulebook_release(inv_want);
    }
    spconv_rulebook_release(want);
    spconv_rulebook_release(got);
    spconv_tensor_release(moved);
    spconv_context_destroy(ctx);
    spconv_context_destroy(cpu_ctx);
}

static spconv_conv_params random_conv_params(spconv_conv_kind kind) {
    spconv_conv_params p = spconv_conv_params_default(kind);
    for (int a = 0; a < 3; ++a) {
        if (kind == SPCONV_CONV_SUBM) {
            p.kernel[a] = 2 * spconv_test_rand_int(0, 2) + 1;
        } else {
            p.kernel[a] = spconv_test_rand_int(1, 4);
            p.stride[a] = spconv_test_rand_int(1, 3);
            p.padding[a] = spconv_test_rand_int(0, 2);
        }
        p.dilation[a] = spconv_test_rand_int(1, 2);
        if (kind == SPCONV_CONV_TRANSPOSED) {
            const int64_t limit = p.stride[a] > p.dilation[a] ? p.stride[a] : p.dilation[a];
            p.output_padding[a] = spconv_test_rand_int(0, limit - 1);
        }
    }
    return p;
}

static void test_rulebook_random(void **state) {
    (void)state;
    backend_under_test backends[MAX_BACKENDS];
    const int n = list_backends(backends);
    const spconv_conv_kind kinds[3] = {SPCONV_CONV_REGULAR, SPCONV_CONV_SUBM,
                                       SPCONV_CONV_TRANSPOSED};
    for (int round = 0; round < 36; ++round) {
        const spconv_conv_kind kind = kinds[round % 3];
        const int64_t batch = spconv_test_rand_int(1, 2);
        int64_t shape[3];
        for (int a = 0; a < 3; ++a) shape[a] = spconv_test_rand_int(6, 24);
        const spconv_conv_params params = random_conv_params(kind);
        int64_t out_shape[3];
        if (spconv_conv_output_shape(&params, shape, out_shape) != SPCONV_OK) continue;
        const int64_t cells = shape[0] * shape[1] * shape[2];
        const int64_t per_batch = round < 3 ? round : spconv_test_rand_int(1, cells / 4);
        int32_t *rows = spconv_test_random_sites(batch, shape, per_batch);
        spconv_tensor *indices = spconv_test_indices_tensor(rows, batch * per_batch);
        for (int b = 0; b < n; ++b) compare_rulebook(&backends[b], indices, shape, batch, &params);
        spconv_tensor_release(indices);
        free(rows);
    }
}

/* Pooling is the regular geometry (kernel 2, stride 2, as the networks' pools). */
static void test_rulebook_pool_and_wide_kernels(void **state) {
    (void)state;
    backend_under_test backends[MAX_BACKENDS];
    const int n = list_backends(backends);
    const int64_t shape[3] = {11, 40, 37};
    int32_t *rows = spconv_test_random_sites(2, shape, 900);
    spconv_tensor *indices = spconv_test_indices_tensor(rows, 1800);
    spconv_conv_params pool = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    for (int a = 0; a < 3; ++a) pool.kernel[a] = pool.stride[a] = 2;
    spconv_conv_params subm5 = spconv_conv_params_default(SPCONV_CONV_SUBM);
    subm5.kernel[0] = 1, subm5.kernel[1] = 5, subm5.kernel[2] = 7;
    spconv_conv_params subm1 = spconv_conv_params_default(SPCONV_CONV_SUBM);
    subm1.kernel[0] = subm1.kernel[1] = subm1.kernel[2] = 1;
    spconv_conv_params down = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    down.kernel[0] = 3, down.stride[0] = 2, down.padding[0] = 1, down.kernel[1] = 1;
    down.stride[2] = 3, down.dilation[2] = 2;
    const spconv_conv_params *all[4] = {&pool, &subm5, &subm1, &down};
    for (int b = 0; b < n; ++b)
        for (int c = 0; c < 4; ++c) compare_rulebook(&backends[b], indices, shape, 2, all[c]);
    spconv_tensor_release(indices);
    free(rows);
}

/* Sites spread over a grid whose output keys need more than 32 bits (1500^3 outputs: 33 bits),
 * where the device sorts 64-bit candidate keys; the smaller grids of the other tests take 32. */
static void test_rulebook_wide_keys(void **state) {
    (void)state;
    backend_under_test backends[MAX_BACKENDS];
    const int n = list_backends(backends);
    const int64_t small[3] = {12, 12, 12}, shape[3] = {3000, 3000, 3000};
    int32_t *rows = spconv_test_random_sites(2, small, 200);
    for (int64_t r = 0; r < 400; ++r)
        for (int a = 1; a < 4; ++a) rows[4 * r + a] = rows[4 * r + a] * 250 + (int32_t)(r % 2);
    spconv_tensor *indices = spconv_test_indices_tensor(rows, 400);
    spconv_conv_params down = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    for (int a = 0; a < 3; ++a) down.stride[a] = 2, down.padding[a] = 1;
    spconv_conv_params up = spconv_conv_params_default(SPCONV_CONV_TRANSPOSED);
    for (int a = 0; a < 3; ++a) up.stride[a] = 2;
    for (int b = 0; b < n; ++b) {
        compare_rulebook(&backends[b], indices, shape, 2, &down);
        compare_rulebook(&backends[b], indices, shape, 2, &up);
    }
    spconv_tensor_release(indices);
    free(rows);
}

static void test_rulebook_real_sites(void **state) {
    (void)state;
    char *path = spconv_test_data_path("spconv_test_indices.i32");
    if (path == NULL) {
        print_message("spconv_test_indices.i32 is not in the data folder: skipped\n");
        skip();
    }
    FILE *f = fopen(path, "rb");
    free(path);
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    const int64_t n_rows = ftell(f) / (long)(4 * sizeof(int32_t));
    fseek(f, 0, SEEK_SET);
    int32_t *rows = malloc((size_t)(4 * n_rows) * sizeof *rows);
    assert_non_null(rows);
    assert_int_equal(fread(rows, sizeof(int32_t), (size_t)(4 * n_rows), f), (size_t)(4 * n_rows));
    fclose(f);
    spconv_tensor *indices = spconv_test_indices_tensor(rows, n_rows);
    const int64_t shape[3] = {80, 1600, 1600};
    spconv_conv_params subm = spconv_conv_params_default(SPCONV_CONV_SUBM);
    spconv_conv_params down = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    for (int a = 0; a < 3; ++a) down.stride[a] = 2, down.padding[a] = 1;
    backend_under_test backends[MAX_BACKENDS];
    const int n = list_backends(backends);
    for (int b = 0; b < n; ++b) {
        compare_rulebook(&backends[b], indices, shape, 1, &subm);
        compare_rulebook(&backends[b], indices, shape, 1, &down);
    }
    spconv_tensor_release(indices);
    free(rows);
}

/* The rulebook cache of a sparse tensor works on every device: a SUBM key is reused and a
 * REGULAR rulebook inverts under its key, the device rulebook's tensors swapped. */
static void test_rulebook_cache(void **state) {
    (void)state;
    backend_under_test backends[MAX_BACKENDS];
    const int n = list_backends(backends);
    const int64_t shape[3] = {9, 30, 31};
    int32_t *rows = spconv_test_random_sites(2, shape, 300);
    spconv_tensor *host = spconv_test_indices_tensor(rows, 600);
    for (int b = 0; b < n; ++b) {
        spconv_context *ctx;
        SPCONV_ASSERT_OK(spconv_context_create(backends[b].device, &ctx));
        spconv_tensor *indices, *features;
        SPCONV_ASSERT_OK(spconv_tensor_to_device(ctx, host, backends[b].device, &indices));
        const int64_t sizes[2] = {600, 3};
        SPCONV_ASSERT_OK(spconv_tensor_zeros(ctx, backends[b].device, SPCONV_F32, 2, sizes,
                                             &features));
        spconv_sparse_tensor *sp;
        SPCONV_ASSERT_OK(spconv_sparse_create(features, indices, shape, 2, &sp));
        const spconv_conv_params subm = spconv_conv_params_default(SPCONV_CONV_SUBM);
        spconv_rulebook *first, *again;
        SPCONV_ASSERT_OK(spconv_sparse_get_rulebook(ctx, sp, &subm, "subm1", &first));
        SPCONV_ASSERT_OK(spconv_sparse_get_rulebook(ctx, sp, &subm, "subm1", &again));
        assert_ptr_equal(first, again);
        spconv_rulebook_release(again);
        spconv_rulebook_release(first);
        spconv_conv_params down = spconv_conv_params_default(SPCONV_CONV_REGULAR);
        for (int a = 0; a < 3; ++a) down.stride[a] = 2, down.padding[a] = 1;
        spconv_rulebook *fwd, *inv;
        SPCONV_ASSERT_OK(spconv_sparse_get_rulebook(ctx, sp, &down, "down1", &fwd));
        spconv_sparse_tensor *coarse;
        spconv_tensor *coarse_features;
        const int64_t coarse_sizes[2] = {spconv_rulebook_num_out(fwd), 3};
        SPCONV_ASSERT_OK(spconv_tensor_zeros(ctx, backends[b].device, SPCONV_F32, 2, coarse_sizes,
                                             &coarse_features));
        SPCONV_ASSERT_OK(spconv_sparse_from_rulebook(sp, fwd, coarse_features, &coarse));
        spconv_conv_params up = down;
        up.kind = SPCONV_CONV_INVERSE;
        SPCONV_ASSERT_OK(spconv_sparse_get_rulebook(ctx, coarse, &up, "down1", &inv));
        assert_int_equal(spconv_rulebook_num_out(inv), 600);
        assert_int_equal(spconv_rulebook_num_pairs(inv), spconv_rulebook_num_pairs(fwd));
        spconv_rulebook_release(inv);
        spconv_rulebook_release(fwd);
        spconv_sparse_release(coarse);
        spconv_tensor_release(coarse_features);
        spconv_sparse_release(sp);
        spconv_tensor_release(features);
        spconv_tensor_release(indices);
        spconv_context_destroy(ctx);
    }
    spconv_tensor_release(host);
    free(rows);
}

/* ---- error paths ----------------------------------------------------------------------------- */

/* Bad rows are found on the device, with the CPU's status and the CPU's message, word for word. */
static void test_bad_coordinates_on_device(void **state) {
    (void)state;
    if (!gpu_present()) {
        print_message("no CUDA device (nor the emulation): skipped\n");
        skip();
    }
    const int64_t shape[3] = {8, 9, 10};
    int32_t *rows = spconv_test_random_sites(2, shape, 40);
    const spconv_conv_params subm = spconv_conv_params_default(SPCONV_CONV_SUBM);
    const spconv_conv_params regular = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    spconv_conv_params binned = subm; /* through bins, which wait for the validation first */
    for (int a = 0; a < 3; ++a) binned.kernel[a] = 9;
    const spconv_conv_params *kinds[3] = {&subm, &regular, &binned};
    spconv_context *ctx;
    SPCONV_ASSERT_OK(spconv_context_create(spconv_cuda(0), &ctx));
    /* 0: a duplicate; 1: out of the shape; 2: batch index too large; 3: a duplicate before a row
     * out of range (the first offending row is named) */
    for (int variant = 0; variant < 4; ++variant) {
        int32_t *bad = malloc(80 * 4 * sizeof *bad);
        assert_non_null(bad);
        memcpy(bad, rows, 80 * 4 * sizeof *bad);
        if (variant == 0 || variant == 3) memcpy(bad + 4 * 57, bad + 4 * 12, 4 * sizeof *bad);
        if (variant == 1 || variant == 3) bad[4 * 63 + 3] = 10;
        if (variant == 2) bad[4 * 30] = 2;
        spconv_tensor *host = spconv_test_indices_tensor(bad, 80), *dev;
        SPCONV_ASSERT_OK(spconv_tensor_to_device(ctx, host, spconv_cuda(0), &dev));
        for (int k = 0; k < 3; ++k) {
            const spconv_conv_params *params = kinds[k];
            spconv_rulebook *rb = NULL;
            const spconv_status want = spconv_rulebook_build(NULL, host, shape, 2, params, &rb);
            assert_int_not_equal(want, SPCONV_OK);
            char message[512];
            snprintf(message, sizeof message, "%s", spconv_last_error());
            SPCONV_ASSERT_STATUS(spconv_rulebook_build(ctx, dev, shape, 2, params, &rb), want);
            assert_null(rb);
            assert_string_equal(spconv_last_error(), message);
        }
        spconv_tensor_release(dev);
        spconv_tensor_release(host);
        free(bad);
    }
    spconv_context_destroy(ctx);
    free(rows);
}

/* compare_rulebook for each of @p params on every backend, on @p per_batch random sites in each
 * of @p batch batches of @p shape. */
static void compare_on_random_sites(int64_t batch, const int64_t shape[3], int64_t per_batch,
                                    const spconv_conv_params *const *params, int count) {
    backend_under_test backends[MAX_BACKENDS];
    const int n = list_backends(backends);
    int32_t *rows = spconv_test_random_sites(batch, shape, per_batch);
    spconv_tensor *indices = spconv_test_indices_tensor(rows, batch * per_batch);
    for (int b = 0; b < n; ++b)
        for (int c = 0; c < count; ++c)
            compare_rulebook(&backends[b], indices, shape, batch, params[c]);
    spconv_tensor_release(indices);
    free(rows);
}

/* Kernels far larger than the input: a submanifold kernel with more offsets to probe than there are
 * sites (it goes through bins instead, on the CPU and the device alike), and kernels of
 * more than 2^16 offsets, whose counts come back as the list of the offsets that occur rather
 * than a count per offset (cuda/rulebook.cu). Each is the CPU's rulebook, bit for bit. */
static void test_huge_kernels(void **state) {
    (void)state;
    const int64_t cube[3] = {120, 120, 120};
    spconv_conv_params subm = spconv_conv_params_default(SPCONV_CONV_SUBM);
    for (int a = 0; a < 3; ++a) subm.kernel[a] = 255; /* 16,581,375 offsets, 600 sites */
    spconv_conv_params subm_dilated = spconv_conv_params_default(SPCONV_CONV_SUBM);
    subm_dilated.kernel[0] = 5, subm_dilated.kernel[1] = 129, subm_dilated.kernel[2] = 131;
    subm_dilated.dilation[0] = 3, subm_dilated.dilation[1] = 2;
    spconv_conv_params pool = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    for (int a = 0; a < 3; ++a) pool.kernel[a] = pool.stride[a] = 61, pool.padding[a] = 1;
    const spconv_conv_params *on_cube[3] = {&subm, &subm_dilated, &pool};
    compare_on_random_sites(2, cube, 300, on_cube, 3);
    /* A long x axis: kernels of over 65,536 offsets over 20 sites, each reaching most of them. */
    const int64_t line[3] = {5, 5, 20000};
    spconv_conv_params wide = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    wide.kernel[2] = 7283, wide.padding[0] = wide.padding[1] = 1, wide.padding[2] = 3641;
    spconv_conv_params wide_t = spconv_conv_params_default(SPCONV_CONV_TRANSPOSED);
    wide_t.kernel[0] = 1, wide_t.kernel[2] = 21851, wide_t.padding[1] = 1;
    wide_t.padding[2] = 10925;
    const spconv_conv_params *on_line[2] = {&wide, &wide_t};
    compare_on_random_sites(1, line, 20, on_line, 2);
    /* Kernels of 2,000,000,001 offsets on x, padded so that each of 64 rows reaches one output
     * at offset 10^9: the builders compute that window (rulebook/axis_reach.h); trying every
     * offset before it took a second per row. */
    const int64_t column[3] = {8, 8, 1};
    spconv_conv_params padded = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    padded.kernel[0] = padded.kernel[1] = 1, padded.kernel[2] = 2000000001;
    padded.padding[2] = 1000000000;
    spconv_conv_params padded_t = padded;
    padded_t.kind = SPCONV_CONV_TRANSPOSED;
    const spconv_conv_params *on_column[2] = {&padded, &padded_t};
    compare_on_random_sites(1, column, 64, on_column, 2);
    int32_t *rows = spconv_test_random_sites(1, column, 64);
    spconv_tensor *indices = spconv_test_indices_tensor(rows, 64);
    spconv_rulebook *rb = NULL;
    SPCONV_ASSERT_OK(spconv_rulebook_build(NULL, indices, column, 1, &padded, &rb));
    assert_int_equal(spconv_rulebook_num_pairs(rb), 64);
    assert_int_equal(spconv_rulebook_num_active_offsets(rb), 1);
    assert_int_equal(spconv_rulebook_active_offsets(rb)[0], 1000000000);
    spconv_rulebook_release(rb);
    spconv_tensor_release(indices);
    free(rows);
    /* Submanifold kernels of more than SPCONV_SUBM_BINS_ABOVE_PROBES probes over more sites than
     * probes go through bins too (rulebook/site_bins.h): a dilated 9 x 11 x 7 kernel on a dense
     * cube, where bins hold many sites, and a 1 x 1 x 40,001 kernel on long lines. */
    const int64_t dense[3] = {14, 22, 16}, lines[3] = {40, 75, 50000};
    spconv_conv_params blocky = spconv_conv_params_default(SPCONV_CONV_SUBM);
    blocky.kernel[0] = 9, blocky.kernel[1] = 11, blocky.kernel[2] = 7;
    blocky.dilation[0] = 2, blocky.dilation[2] = 3;
    spconv_conv_params long_x = spconv_conv_params_default(SPCONV_CONV_SUBM);
    long_x.kernel[2] = 40001;
    const spconv_conv_params *on_dense[1] = {&blocky}, *on_lines[1] = {&long_x};
    compare_on_random_sites(2, dense, 2000, on_dense, 1);
    compare_on_random_sites(1, lines, 3000, on_lines, 1);
    /* Few sites under a kernel of fewer than 2^16 offsets go through bins too. */
    const int64_t small_cube[3] = {12, 12, 12};
    spconv_conv_params small = spconv_conv_params_default(SPCONV_CONV_SUBM);
    for (int a = 0; a < 3; ++a) small.kernel[a] = 5; /* 62 probed offsets, 60 sites */
    small.dilation[1] = 2;
    const spconv_conv_params *on_small[1] = {&small};
    compare_on_random_sites(2, small_cube, 30, on_small, 1);
}

/* A table with fewer slots than keys is an error, not a hang; one with room is not. */
static void test_full_table(void **state) {
    (void)state;
#if !SPCONV_HAVE_CUDA
    print_message("built without the CUDA backend: skipped\n");
    skip();
#else
    if (!gpu_present()) {
        print_message("no CUDA device (nor the emulation): skipped\n");
        skip();
    }
    uint64_t keys[40];
    for (int i = 0; i < 40; ++i) keys[i] = (uint64_t)i * 977 + 5;
    SPCONV_ASSERT_FAILS(spconv__cuda_hash_fill_check(0, keys, 40, 32), SPCONV_ERR_CAPACITY,
                        "hash table of 32 slots is full");
    SPCONV_ASSERT_FAILS(spconv__cuda_hash_fill_check(0, keys, 17, 16), SPCONV_ERR_CAPACITY,
                        "is full");
    SPCONV_ASSERT_OK(spconv__cuda_hash_fill_check(0, keys, 16, 16));
    SPCONV_ASSERT_OK(spconv__cuda_hash_fill_check(0, keys, 40, 64));
#endif
}

/* A device that is not there: contexts and tensors are refused before any op runs. */
static void test_no_device(void **state) {
    (void)state;
    const int missing = spconv_has_cuda() ? spconv_cuda_device_count() : 0;
    spconv_context *ctx = NULL;
    SPCONV_ASSERT_STATUS(spconv_context_create(spconv_cuda(missing), &ctx), SPCONV_ERR_NO_DEVICE);
    assert_null(ctx);
    spconv_tensor *t = NULL;
    const int64_t sizes[2] = {4, 4};
    SPCONV_ASSERT_STATUS(spconv_tensor_empty(spconv_cuda(missing), SPCONV_I32, 2, sizes, &t),
                         SPCONV_ERR_NO_DEVICE);
    assert_null(t);
}

int main(void) {
    spconv_test_seed();
    backend_under_test backends[MAX_BACKENDS];
    const int n = list_backends(backends);
    printf("backends:");
    for (int b = 0; b < n; ++b) printf(" %s", backends[b].name);
    printf("%s\n", n == 1 ? " (no CUDA device: the CPU is compared with itself)" : "");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_voxelize_random),
        cmocka_unit_test(test_voxelize_one_point_bits),
        cmocka_unit_test(test_voxelize_output_overflow),
        cmocka_unit_test(test_voxelize_real_scans),
        cmocka_unit_test(test_rulebook_random),
        cmocka_unit_test(test_rulebook_pool_and_wide_kernels),
        cmocka_unit_test(test_rulebook_wide_keys),
        cmocka_unit_test(test_rulebook_real_sites),
        cmocka_unit_test(test_rulebook_cache),
        cmocka_unit_test(test_bad_coordinates_on_device),
        cmocka_unit_test(test_huge_kernels),
        cmocka_unit_test(test_full_table),
        cmocka_unit_test(test_no_device),
    };
    return cmocka_run_group_tests_name("backend_ops", tests, NULL, NULL);
}
