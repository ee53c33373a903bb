/* `spconv run` and `spconv bench` (path in env SPCONV_TOOL, set by CTest) on the bundled sample
 * and on small files made here: outputs held against the C API (voxel counts, output sites,
 * weights loaded from a folder = the same weights from the seed), the picture decoded by libpng,
 * the per-layer table, the bench JSON, and every error exit (status 2, one line on stderr, no
 * output folder left behind). */
#define _XOPEN_SOURCE 700

#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/json_check.h"
#include "common/png_read.h"
#include "common/run_tool.h"
#include "common/test_files.h"
#include "common/test_util.h"

#define PATH_CAP SPCONV_TOOL_PATH_CAP
#define PICTURE_MARGIN 8     /* the picture's documented layout (tools/spconv/net_picture.h) */
#define PICTURE_PANEL_SIDE 800

typedef spconv_tool_fixture fixture;

static int setup(void **state) { return spconv_tool_setup(state, "spconv_run_cli"); }

static int teardown(void **state) { return spconv_tool_teardown(state); }

static const char *in_dir(const fixture *f, const char *name, char *buf) {
    return spconv_tool_scratch_path(f, name, buf);
}

static void expect_success(fixture *f, const char *const *args) {
    int rc = spconv_tool_run(f, args);
    if (rc != 0) fail_msg("exit status %d, stderr: %s", rc, f->err_text);
}

static void expect_in_stdout(const fixture *f, const char *substring) {
    if (strstr(f->out_text, substring) == NULL)
        fail_msg("stdout does not contain \"%s\":\n%s", substring, f->out_text);
}

static spconv_tensor *read_npy(const char *dir, const char *name) {
    char path[PATH_CAP];
    spconv_tensor *t = NULL;
    SPCONV_ASSERT_OK(spconv_npy_read(spconv_test_join(dir, name, path, sizeof path), &t));
    return t;
}

static void assert_shape(const spconv_tensor *t, int ndim, const int64_t *sizes) {
    assert_int_equal(spconv_tensor_ndim(t), ndim);
    for (int d = 0; d < ndim; ++d) assert_int_equal(spconv_tensor_size(t, d), sizes[d]);
}

/* ---- what the library says the CLI should produce --------------------------------------------- */

static const char *sample_scan(void) {
    static char path[PATH_CAP];
    snprintf(path, sizeof path, "%s/data/sample_scan.bin", SPCONV_TEST_SOURCE_DIR);
    return path;
}

/* The input sparse tensor of network @p net for the scan @p path, through the C API. */
static spconv_sparse_tensor *api_input(const char *net, const char *path) {
    spconv_net_input zin;
    SPCONV_ASSERT_OK(spconv_zoo_input(net, &zin));
    spconv_point_cloud *pc = NULL;
    SPCONV_ASSERT_OK(spconv_point_cloud_read(path, SPCONV_CLOUD_AUTO, 0, &pc));
    spconv_sparse_tensor *sp = NULL;
    SPCONV_ASSERT_OK(spconv_net_input_from_points(NULL, &zin, spconv_point_cloud_points(pc),
                                                  SPCONV_F32, &sp, NULL));
    spconv_point_cloud_destroy(pc);
    return sp;
}

static int zoo_layers(const char *name) {
    spconv_net *net = NULL;
    SPCONV_ASSERT_OK(spconv_zoo_create(name, SPCONV_F32, 1, &net));
    int layers = spconv_net_num_layers(net);
    spconv_net_destroy(net);
    return layers;
}

/* Every layer of zoo network @p net appears as a row "<index>  <name>  <kind>" of the table. */
static void expect_every_layer(const fixture *f, const char *net_name) {
    spconv_net *net = NULL;
    SPCONV_ASSERT_OK(spconv_zoo_create(net_name, SPCONV_F32, 1, &net));
    for (int i = 0; i < spconv_net_num_layers(net); ++i) {
        const spconv_layer_desc *layer = spconv_net_layer(net, i);
        char row[256];
        snprintf(row, sizeof row, "\n%3d  %s ", i, layer->name);
        expect_in_stdout(f, row);
        expect_in_stdout(f, spconv_layer_kind_name(layer->kind));
    }
    spconv_net_destroy(net);
}

/* ---- the picture ------------------------------------------------------------------------------ */

static int compare_u32(const void *a, const void *b) {
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Pixels of the panel at (x0, y0) that differ from its most common colour (its background). */
static int64_t panel_marks(const uint8_t *rgb, int64_t stride, int64_t x0, int64_t y0,
                           int64_t width, int64_t height) {
    uint32_t *colours = malloc((size_t)(width * height) * sizeof *colours);
    assert_non_null(colours);
    for (int64_t y = 0; y < height; ++y) {
        for (int64_t x = 0; x < width; ++x) {
            const uint8_t *p = rgb + 3 * ((y0 + y) * stride + x0 + x);
            colours[y * width + x] = (uint32_t)p[0] << 16 | (uint32_t)p[1] << 8 | p[2];
        }
    }
    const int64_t n = width * height;
    qsort(colours, (size_t)n, sizeof *colours, compare_u32);
    int64_t most = 0;
    for (int64_t i = 0, run_start = 0; i < n; ++i) {
        if (i + 1 < n && colours[i + 1] == colours[i]) continue;
        most = i + 1 - run_start > most ? i + 1 - run_start : most;
        run_start = i + 1;
    }
    free(colours);
    return n - most;
}

/* picture.png decodes as 8-bit RGB of the documented size; each panel holds at least
 * @p min_heat / @p min_points marked pixels (0: exactly none). */
static void check_picture(const char *dir, const char *net, int64_t min_heat, int64_t min_points) {
    if (!spconv_test_png_available()) {
        print_message("note: no libpng in this build, picture.png not checked\n");
        return;
    }
    spconv_net_input zin;
    SPCONV_ASSERT_OK(spconv_zoo_input(net, &zin));
    const int64_t h = zin.spatial_shape[1], w = zin.spatial_shape[2], longest = h > w ? h : w;
    const int64_t f = (longest + PICTURE_PANEL_SIDE - 1) / PICTURE_PANEL_SIDE;
    const int64_t ph = (h + f - 1) / f, pw = (w + f - 1) / f;
    char path[PATH_CAP];
    int64_t width, height;
    int color_type, depth;
    uint8_t *rgb = NULL;
    assert_int_equal(spconv_test_png_read(spconv_test_join(dir, "picture.png", path, sizeof path),
                                          &width, &height, &rgb, &color_type, &depth), 0);
    assert_int_equal(width, 2 * pw + 3 * PICTURE_MARGIN);
    assert_int_equal(height, ph + 2 * PICTURE_MARGIN);
    assert_int_equal(color_type, 2);
    assert_int_equal(depth, 8);
    int64_t heat = panel_marks(rgb, width, PICTURE_MARGIN, PICTURE_MARGIN, pw, ph);
    int64_t points = panel_marks(rgb, width, 2 * PICTURE_MARGIN + pw, PICTURE_MARGIN, pw, ph);
    if (min_heat == 0) assert_int_equal(heat, 0);
    else assert_true(heat >= min_heat);
    if (min_points == 0) assert_int_equal(points, 0);
    else assert_true(points >= min_points);
    free(rgb);
}

/* ---- run on the bundled sample ---------------------------------------------------------------- */

static void test_run_second_on_sample(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    char out[PATH_CAP];
    expect_success(f, (const char *[]){"run", "--net", "second", "--out", in_dir(f, "second", out),
                                       NULL});
    spconv_tensor *output = read_npy(out, "output.npy");
    assert_shape(output, 4, (const int64_t[]){1, 256, 200, 176});
    assert_int_equal(spconv_tensor_dtype(output), SPCONV_F32);
    const float *v = spconv_tensor_data(output);
    int64_t nonzero = 0;
    for (int64_t i = 0; i < spconv_tensor_numel(output); ++i) {
        assert_true(isfinite(v[i]));
        nonzero += v[i] != 0.0f;
    }
    assert_true(nonzero > 0);
    spconv_tensor_release(output);
    char path[PATH_CAP];
    assert_false(spconv_test_exists(spconv_test_join(out, "out_indices.npy", path, sizeof path)));
    /* The summary's voxel count is what the library makes of the sample. */
    spconv_sparse_tensor *input = api_input("second", sample_scan());
    char voxels[64];
    snprintf(voxels, sizeof voxels, " %lld voxels", (long long)spconv_sparse_num_sites(input));
    expect_in_stdout(f, voxels);
    expect_in_stdout(f, "[1, 256, 200, 176]");
    spconv_sparse_release(input);
    expect_every_layer(f, "second");
    check_picture(out, "second", 1000, 1000);
}

/* The U-Net's output sites are its input sites, in their order. */
static void test_run_unet_on_sample(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    char out[PATH_CAP];
    expect_success(f, (const char *[]){"run", "--net", "unet", "--threads", "1", "--out",
                                       in_dir(f, "unet", out), NULL});
    spconv_sparse_tensor *input = api_input("unet", sample_scan());
    const int64_t n = spconv_sparse_num_sites(input);
    spconv_tensor *output = read_npy(out, "output.npy");
    spconv_tensor *indices = read_npy(out, "out_indices.npy");
    assert_shape(output, 2, (const int64_t[]){n, 16});
    assert_shape(indices, 2, (const int64_t[]){n, 4});
    assert_int_equal(spconv_tensor_dtype(indices), SPCONV_I32);
    spconv_tensor *expected = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_contiguous(NULL, spconv_sparse_indices(input), &expected));
    assert_memory_equal(spconv_tensor_data(indices), spconv_tensor_data(expected),
                        (size_t)n * 4 * sizeof(int32_t));
    spconv_tensor_release(expected);
    spconv_tensor_release(indices);
    spconv_tensor_release(output);
    spconv_sparse_release(input);
    expect_every_layer(f, "unet");
    check_picture(out, "unet", 1000, 1000);
}

/* bench_basic pools six times: the output sites lie in a [1, 25, 25] grid, each once. */
static void test_run_basic_on_sample(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    char out[PATH_CAP];
    expect_success(f, (const char *[]){"run", sample_scan(), "--net", "basic", "--quiet", "--out",
                                       in_dir(f, "basic", out), NULL});
    spconv_tensor *output = read_npy(out, "output.npy");
    spconv_tensor *indices = read_npy(out, "out_indices.npy");
    const int64_t n = spconv_tensor_size(output, 0);
    assert_true(n > 0 && n <= 25 * 25);
    assert_shape(output, 2, (const int64_t[]){n, 256});
    assert_shape(indices, 2, (const int64_t[]){n, 4});
    const int32_t *rows = spconv_tensor_data(indices);
    char seen[25 * 25] = {0};
    for (int64_t i = 0; i < n; ++i) {
        const int32_t *r = rows + 4 * i;
        assert_true(r[0] == 0 && r[1] == 0 && r[2] >= 0 && r[2] < 25 && r[3] >= 0 && r[3] < 25);
        assert_false(seen[r[2] * 25 + r[3]]);
        seen[r[2] * 25 + r[3]] = 1;
    }
    spconv_tensor_release(indices);
    spconv_tensor_release(output);
    assert_null(strstr(f->out_text, "net.19 ")); /* --quiet: no table, one summary line */
    expect_in_stdout(f, "basic: ");
    check_picture(out, "basic", 1000, 1000);
}

/* ---- small scans made here -------------------------------------------------------------------- */

/* @p count points of the sample in front of the sensor (x > 1 m, inside the KITTI range of
 * second and unet), every third one so that they spread over the scene, as a KITTI .bin. */
static const char *small_scan(const fixture *f, int64_t count, char *path) {
    size_t n = 0;
    float *points = (float *)spconv_test_read_bytes(sample_scan(), &n);
    assert_non_null(points);
    int64_t kept = 0;
    for (int64_t i = 0; i < (int64_t)(n / 16) && kept < count; i += 3)
        if (points[4 * i] > 1.0f) memmove(points + 4 * kept++, points + 4 * i, 16);
    assert_int_equal(kept, count);
    assert_int_equal(
        spconv_test_write_bytes(in_dir(f, "small.bin", path), points, (size_t)count * 16), 0);
    free(points);
    return path;
}

static void save_weights(const char *net_name, uint64_t seed, const char *dir,
                         spconv_net_layout layout) {
    spconv_net *net = NULL;
    SPCONV_ASSERT_OK(spconv_zoo_create(net_name, SPCONV_F32, seed, &net));
    SPCONV_ASSERT_OK(spconv_net_save_weights(NULL, net, dir, layout));
    spconv_net_destroy(net);
}

static void assert_same_npy(const char *dir_a, const char *dir_b, const char *name) {
    spconv_tensor *a = read_npy(dir_a, name), *b = read_npy(dir_b, name);
    assert_int_equal(spconv_tensor_dtype(a), spconv_tensor_dtype(b));
    assert_int_equal(spconv_tensor_numel(a), spconv_tensor_numel(b));
    assert_memory_equal(spconv_tensor_data(a), spconv_tensor_data(b),
                        (size_t)spconv_tensor_numel(a) * spconv_dtype_size(spconv_tensor_dtype(a)));
    spconv_tensor_release(a);
    spconv_tensor_release(b);
}

static void assert_different_npy(const char *dir_a, const char *dir_b, const char *name) {
    spconv_tensor *a = read_npy(dir_a, name), *b = read_npy(dir_b, name);
    assert_int_equal(spconv_tensor_numel(a), spconv_tensor_numel(b));
    assert_true(memcmp(spconv_tensor_data(a), spconv_tensor_data(b),
                       (size_t)spconv_tensor_numel(a) * sizeof(float)) != 0);
    spconv_tensor_release(a);
    spconv_tensor_release(b);
}

/* run / bench --device cuda (a GPU, or the host emulation): every zoo network on a small scan
 * writes the CPU's output sites and an output that agrees with the CPU's. The bound is loose on
 * purpose, normalised error <= 1e-3: f32 sums of up to 27 * 128 products in a different order
 * on each backend (2 gamma_n ~ 4e-4 of the absolute sums per layer) along ~20 layers; the
 * device path is held to the CPU far more tightly in f64 by test_cuda_conv, and here a wrong
 * layer would still move the output by O(1). A device that is not there is a usage error. */
static double max_normalised_difference(const char *dir_a, const char *dir_b) {
    spconv_tensor *a = read_npy(dir_a, "output.npy"), *b = read_npy(dir_b, "output.npy");
    assert_int_equal(spconv_tensor_numel(a), spconv_tensor_numel(b));
    const float *x = spconv_tensor_data(a), *y = spconv_tensor_data(b);
    double diff = 0.0, scale = 0.0;
    for (int64_t i = 0; i < spconv_tensor_numel(a); ++i) {
        const double d = fabs((double)x[i] - (double)y[i]);
        diff = d > diff || isnan(d) ? d : diff;
        scale = fabs((double)x[i]) > scale ? fabs((double)x[i]) : scale;
    }
    spconv_tensor_release(a);
    spconv_tensor_release(b);
    return scale > 0.0 ? diff / scale : diff;
}

static void test_run_on_device(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    char scan[PATH_CAP], on_cpu[PATH_CAP], on_gpu[PATH_CAP];
    small_scan(f, 3000, scan);
    const int devices = spconv_has_cuda() ? spconv_cuda_device_count() : 0;
    char missing[32];
    snprintf(missing, sizeof missing, "cuda:%d", devices);
    const char *absent[] = {"run", scan, "--device", missing, "--out", in_dir(f, "x", on_cpu), NULL};
    spconv_tool_expect_usage_error(f, absent, spconv_has_cuda() ? "no CUDA device"
                                                                : "has no CUDA backend");
    const char *absent_bench[] = {"bench", "--input", scan, "--device", missing, NULL};
    spconv_tool_expect_usage_error(f, absent_bench, spconv_has_cuda() ? "no CUDA device"
                                                                      : "has no CUDA backend");
    if (devices == 0) {
        print_message("skip: no CUDA device for the --device cuda runs\n");
        skip();
    }
    static const char *nets[] = {"second", "basic", "unet"};
    for (size_t i = 0; i < sizeof nets / sizeof nets[0]; ++i) {
        char cpu_name[32], gpu_name[32];
        snprintf(cpu_name, sizeof cpu_name, "cpu_%s", nets[i]);
        snprintf(gpu_name, sizeof gpu_name, "gpu_%s", nets[i]);
        const char *a[] = {"run", scan, "--net", nets[i], "--quiet", "--out",
                           in_dir(f, cpu_name, on_cpu), NULL};
        const char *b[] = {"run", scan, "--net", nets[i], "--quiet", "--progress", "--device",
                           "cuda:0", "--out", in_dir(f, gpu_name, on_gpu), NULL};
        expect_success(f, a);
        expect_success(f, b);
        /* on a GPU a layer is only queued when reported: no time yet */
        assert_non_null(strstr(f->err_text, "progress: layer 1/"));
        assert_non_null(strstr(f->err_text, ") queued"));
        if (strcmp(nets[i], "second") != 0) {
            char x[PATH_CAP], y[PATH_CAP];
            size_t nx, ny;
            char *p = spconv_test_read_bytes(spconv_test_join(on_cpu, "out_indices.npy", x, PATH_CAP), &nx);
            char *q = spconv_test_read_bytes(spconv_test_join(on_gpu, "out_indices.npy", y, PATH_CAP), &ny);
            assert_non_null(p);
            assert_non_null(q);
            assert_int_equal(nx, ny);
            assert_memory_equal(p, q, nx);
            free(p);
            free(q);
        }
        const double err = max_normalised_difference(on_cpu, on_gpu);
        print_message("%s on cuda:0 against the CPU: normalised difference %.3g\n", nets[i], err);
        if (!(err <= 1e-3)) fail_msg("%s: normalised difference %.3g", nets[i], err);
    }
    const char *bench[] = {"bench", "--input", scan, "--net", "unet", "--device", "cuda",
                           "--repeat", "1", "--warmup", "0", "--peak-size", "32", "--backward",
                           "--phases", NULL};
    expect_success(f, bench);
    expect_in_stdout(f, "backward:");
    expect_in_stdout(f, "on the device's clock (CUDA events");
    expect_in_stdout(f, "device GEMM peak: ");
    expect_in_stdout(f, "forward (training): gather ");
}

/* Weights saved from seed 7 (RSCK, and KRSC read as such) give what --seed 7 gives. */
static void test_run_weights(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    char scan[PATH_CAP], rsck[PATH_CAP], krsc[PATH_CAP], o_seed[PATH_CAP], o_rsck[PATH_CAP],
        o_krsc[PATH_CAP], o_other[PATH_CAP];
    small_scan(f, 4000, scan);
    save_weights("unet", 7, in_dir(f, "w_rsck", rsck), SPCONV_NET_LAYOUT_RSCK);
    save_weights("unet", 7, in_dir(f, "w_krsc", krsc), SPCONV_NET_LAYOUT_KRSC);
    const char *q = "--quiet", *n = "--net";
    expect_success(f, (const char *[]){"run", scan, n, "unet", q, "--seed", "7", "--out",
                                       in_dir(f, "o_seed", o_seed), NULL});
    expect_success(f, (const char *[]){"run", scan, n, "unet", q, "--weights", rsck, "--out",
                                       in_dir(f, "o_rsck", o_rsck), NULL});
    expect_success(f, (const char *[]){"run", scan, n, "unet", q, "--weights", krsc,
                                       "--weight-layout", "krsc", "--seed", "3", "--out",
                                       in_dir(f, "o_krsc", o_krsc), NULL});
    expect_success(f, (const char *[]){"run", scan, n, "unet", q, "--seed", "8", "--progress",
                                       "--out", in_dir(f, "o_other", o_other), NULL});
    /* --progress off a terminal: one line per layer, in order. */
    int lines = 0;
    for (const char *c = f->err_text; *c != '\0'; ++c) lines += *c == '\n';
    assert_int_equal(lines, zoo_layers("unet"));
    char last[64];
    snprintf(last, sizeof last, "layer %d/%d head ", lines, lines);
    /* Marked as progress, so that no line looks like the one-line error of a failed command. */
    assert_non_null(strstr(f->err_text, "spconv run: progress: layer 1/"));
    assert_non_null(strstr(f->err_text, last));
    spconv_tensor *output = read_npy(o_seed, "output.npy");
    assert_true(spconv_tensor_size(output, 0) > 1000); /* the comparisons below compare sites */
    spconv_tensor_release(output);
    assert_same_npy(o_seed, o_rsck, "output.npy");
    assert_same_npy(o_seed, o_krsc, "output.npy");
    assert_different_npy(o_seed, o_other, "output.npy");
}

/* --dtype f16 / bf16: output.npy holds what the C API's 16-bit network gives on the same input
 * (f16 as f16; bf16 widened to f32, exactly), bit for bit, for one scan and for a batch of two
 * (each scan's part the same as its run alone), and bench runs in that dtype too. */
static void test_run_dtype(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    char scan[PATH_CAP], other[PATH_CAP], one[PATH_CAP], many[PATH_CAP], part[PATH_CAP];
    small_scan(f, 3000, scan);
    /* a second, different scan for the batch: the first 1000 points of the first */
    size_t bytes = 0;
    void *points = spconv_test_read_bytes(scan, &bytes);
    assert_non_null(points);
    assert_int_equal(spconv_test_write_bytes(in_dir(f, "other.bin", other), points, 1000 * 16), 0);
    free(points);
    const char *names[2] = {"f16", "bf16"};
    const spconv_dtype dtypes[2] = {SPCONV_F16, SPCONV_BF16};
    for (int d = 0; d < 2; ++d) {
        char tag[32];
        snprintf(tag, sizeof tag, "one_%s", names[d]);
        expect_success(f, (const char *[]){"run", scan, "--net", "unet", "--dtype", names[d],
                                           "--quiet", "--out", in_dir(f, tag, one), NULL});
        spconv_net *net = NULL;
        SPCONV_ASSERT_OK(spconv_zoo_create("unet", dtypes[d], 1, &net));
        spconv_sparse_tensor *in32 = api_input("unet", scan), *in = NULL;
        spconv_tensor *f16 = NULL, *out = NULL, *want = NULL;
        SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, spconv_sparse_features(in32), dtypes[d], &f16));
        int64_t shape[3];
        spconv_sparse_spatial_shape(in32, shape);
        SPCONV_ASSERT_OK(spconv_sparse_create(f16, spconv_sparse_indices(in32), shape, 1, &in));
        SPCONV_ASSERT_OK(spconv_net_forward(NULL, net, in, SPCONV_NET_INFERENCE, &out, NULL));
        SPCONV_ASSERT_OK(spconv_tensor_to_dtype(
            NULL, out, dtypes[d] == SPCONV_BF16 ? SPCONV_F32 : dtypes[d], &want));
        check_picture(one, "unet", 100, 1000); /* drawn from the 16-bit output */
        spconv_tensor *got = read_npy(one, "output.npy");
        assert_int_equal(spconv_tensor_dtype(got), spconv_tensor_dtype(want));
        assert_int_equal(spconv_tensor_numel(got), spconv_tensor_numel(want));
        assert_memory_equal(spconv_tensor_data(got), spconv_tensor_data(want),
                            (size_t)spconv_tensor_numel(got) *
                                spconv_dtype_size(spconv_tensor_dtype(got)));
        spconv_tensor *all[] = {f16, out, want, got};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) spconv_tensor_release(all[i]);
        spconv_sparse_release(in);
        spconv_sparse_release(in32);
        spconv_net_destroy(net);

        snprintf(tag, sizeof tag, "many_%s", names[d]);
        expect_success(f, (const char *[]){"run", scan, other, "--net", "unet", "--dtype", names[d],
                                           "--batch-size", "2", "--quiet", "--out",
                                           in_dir(f, tag, many), NULL});
        spconv_test_join(many, "small", part, sizeof part);
        assert_same_npy(one, part, "output.npy");
        assert_same_npy(one, part, "out_indices.npy");
    }
    char json[PATH_CAP];
    expect_success(f, (const char *[]){"bench", "--net", "basic", "--dtype", "f16", "--input",
                                       scan, "--repeat", "1", "--warmup", "0", "--peak-size", "0",
                                       "--backward", "--json", in_dir(f, "f16.json", json), NULL});
    expect_in_stdout(f, "f16, GEMM by");
    size_t n = 0;
    char *text = spconv_test_read_bytes(json, &n);
    assert_non_null(text);
    assert_non_null(strstr(text, "\"dtype\": \"f16\""));
    free(text);
}

/* A scan with no point in the network's range runs, says so, and gives an empty output. */
static void test_run_zero_voxels(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    const float far[8] = {-10.0f, 0.0f, 0.0f, 0.5f, -20.0f, 1.0f, 0.0f, 0.5f}; /* behind x = 0 */
    char scan[PATH_CAP], out[PATH_CAP];
    assert_int_equal(spconv_test_write_bytes(in_dir(f, "far.bin", scan), far, sizeof far), 0);
    expect_success(f, (const char *[]){"run", scan, "--out", in_dir(f, "zero", out), NULL});
    expect_in_stdout(f, " 0 voxels");
    spconv_tensor *output = read_npy(out, "output.npy");
    assert_shape(output, 4, (const int64_t[]){1, 256, 200, 176});
    const float *v = spconv_tensor_data(output);
    for (int64_t i = 0; i < spconv_tensor_numel(output); ++i) assert_true(v[i] == 0.0f);
    spconv_tensor_release(output);
    check_picture(out, "second", 0, 0);
    expect_success(f, (const char *[]){"run", scan, "--net", "unet", "--out",
                                       in_dir(f, "zero_unet", out), NULL});
    output = read_npy(out, "output.npy");
    assert_shape(output, 2, (const int64_t[]){0, 16});
    spconv_tensor_release(output);
}

/* ---- run: bad input --------------------------------------------------------------------------- */

static void test_run_errors(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    char scan[PATH_CAP], out[PATH_CAP], file[PATH_CAP], under_file[PATH_CAP], weights[PATH_CAP],
        param[PATH_CAP], missing[PATH_CAP];
    small_scan(f, 500, scan);
    in_dir(f, "never", out);
    spconv_tool_expect_usage_error(
        f, (const char *[]){"run", in_dir(f, "missing.bin", missing), "--out", out, NULL},
        "missing.bin");
    spconv_tool_expect_usage_error(
        f, (const char *[]){"run", scan, "--net", "pointnet", "--out", out, NULL},
        "--net 'pointnet'");
    spconv_tool_expect_usage_error(f,
                                   (const char *[]){"run", scan, "--weights",
                                                    in_dir(f, "nowhere", weights), "--out", out,
                                                    NULL},
                                   "nowhere");
    save_weights("unet", 1, in_dir(f, "weights", weights), SPCONV_NET_LAYOUT_AUTO);
    /* A weight of the wrong shape, then a missing one: each named. */
    spconv_tensor *wrong = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_zeros(NULL, spconv_cpu(), SPCONV_F32, 3,
                                         (const int64_t[]){1, 16, 15}, &wrong));
    SPCONV_ASSERT_OK(spconv_npy_write(NULL, spconv_test_join(weights, "head.weight.npy", param,
                                                             sizeof param), wrong));
    spconv_tensor_release(wrong);
    const char *with_weights[] = {"run", scan, "--net", "unet", "--weights", weights, "--out", out,
                                  NULL};
    spconv_tool_expect_usage_error(f, with_weights, "head.weight");
    assert_int_equal(remove(param), 0);
    spconv_tool_expect_usage_error(f, with_weights, "head.weight");
    /* Weights saved in RSCK read as OIDHW: the message lists the OIDHW shape alone. */
    spconv_tool_expect_usage_error(f, (const char *[]){"run", scan, "--net", "unet", "--weights",
                                                       weights, "--weight-layout", "oidhw",
                                                       "--out", out, NULL},
                                   "needs OIDHW [C_out, C_in, KD, KH, KW] = [");
    assert_non_null(strstr(f->err_text, "(the layout asked for)"));
    assert_null(strstr(f->err_text, "KRSC"));
    assert_null(strstr(f->err_text, "RSCK"));
    spconv_tool_expect_usage_error(
        f, (const char *[]){"run", scan, "--weight-layout", "nhwc", NULL}, "--weight-layout");
    /* Outputs that cannot be written: a file where the folder should be, or above it. */
    assert_int_equal(spconv_test_write_bytes(in_dir(f, "a_file", file), "x", 1), 0);
    spconv_tool_expect_usage_error(f, (const char *[]){"run", scan, "--out", file, NULL},
                                   "a_file' is a file, not a folder");
    spconv_test_join(file, "sub", under_file, sizeof under_file);
    char line[3 * PATH_CAP];
    snprintf(line, sizeof line, "spconv run: --out '%s': '%s' is a file, not a folder",
             under_file, file);
    spconv_tool_expect_usage_error(f, (const char *[]){"run", scan, "--out", under_file, NULL},
                                   line);
    /* A final name taken by a folder fails before the network runs: no layer table. */
    char r10[PATH_CAP], picture[PATH_CAP];
    assert_int_equal(mkdir(in_dir(f, "r10", r10), 0777), 0);
    assert_int_equal(mkdir(spconv_test_join(r10, "picture.png", picture, PATH_CAP), 0777), 0);
    snprintf(line, sizeof line, "spconv run: --out '%s': '%s' is a folder", r10, picture);
    spconv_tool_expect_usage_error(f, (const char *[]){"run", scan, "--out", r10, NULL}, line);
    assert_string_equal(f->out_text, "");
    assert_int_equal(spconv_test_count_entries(r10), 1);
    /* A scan of x, y, z only for a network that also takes the intensity: the networks that
     * would take it are named. An ASCII PCD, which is read with or without PCL (a build without
     * it refuses binary PCD as not supported). */
    char xyz_path[PATH_CAP], xyz_text[512];
    int used = snprintf(xyz_text, sizeof xyz_text,
                        "VERSION .7\nFIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nCOUNT 1 1 1\n"
                        "WIDTH 10\nHEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS 10\nDATA ascii\n");
    for (int p = 0; p < 10; ++p)
        used += snprintf(xyz_text + used, sizeof xyz_text - (size_t)used, "0 0 0\n");
    assert_int_equal(spconv_test_write_bytes(in_dir(f, "xyz.pcd", xyz_path), xyz_text,
                                             (size_t)used),
                     0);
    snprintf(line, sizeof line, "spconv run: '%s' has 3 fields per point; --net second takes 4 "
             "(x, y, z, intensity); networks that take at most 3: basic", xyz_path);
    spconv_tool_expect_usage_error(f, (const char *[]){"run", xyz_path, "--out", out, NULL}, line);
    /* No SCAN and the sample named by SPCONV_SAMPLE_SCAN is missing. */
    f->extra_env = "SPCONV_SAMPLE_SCAN=/nonexistent/sample.bin";
    spconv_tool_expect_usage_error(f, (const char *[]){"run", "--out", out, NULL},
                                   "/nonexistent/sample.bin");
    f->extra_env = NULL;
    assert_false(spconv_test_exists(out)); /* no failed run left a folder behind */
}

/* ---- bench ------------------------------------------------------------------------------------ */

/* The JSON file is valid and has the documented keys; @p layers layer entries. */
static void check_bench_json(const char *path, int layers, int backward) {
    size_t n = 0, error_at = 0;
    char *text = spconv_test_read_bytes(path, &n);
    assert_non_null(text);
    if (!spconv_test_json_valid(text, &error_at))
        fail_msg("%s is not valid JSON near byte %zu: %.40s", path, error_at, text + error_at);
    static const char *const keys[] = {
        "\"schema\"", "\"config\"", "\"net\"", "\"input\"", "\"sites\"", "\"spatial_shape\"",
        "\"threads\"", "\"repeat\"", "\"warmup\"", "\"sgemm_peak_gflops\"", "\"passes\"",
        "\"forward\"", "\"wall_ms\"", "\"phases_ms\"", "\"rulebook\"", "\"gather\"", "\"gemm\"",
        "\"scatter\"", "\"other\"", "\"median\"", "\"min\"", "\"max\"", "\"gflops\"",
        "\"gemm_share_of_peak\"", "\"layers\"", "\"forward_ms\"", "\"pairs\"", "\"per_pass\"",
        "\"start_unix_ms\"", "\"forward_ms_per_pass\"", "\"tensor_mib\"", "\"rss_peak_mib\"",
        "\"input_grad\"", "\"replicate\"", "\"dtype\"", "\"device_clock\"", "\"time_phases\"",
        "\"copy_gbps\"", "\"device_ms\"", "\"gather_gbps\"", "\"scatter_gbps\""};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; ++k)
        if (strstr(text, keys[k]) == NULL) fail_msg("%s has no key %s", path, keys[k]);
    int entries = 0;
    for (const char *c = strstr(text, "\"index\":"); c != NULL; c = strstr(c + 1, "\"index\":"))
        ++entries;
    assert_int_equal(entries, layers);
    assert_int_equal(strstr(text, "\"backward_ms\"") != NULL, backward);
    assert_int_equal(strstr(text, "\"backward_ms_per_pass\"") != NULL, backward);
    free(text);
}

/* Count of @p needle in the file @p path. */
static int count_in_file(const char *path, const char *needle) {
    size_t n = 0;
    char *text = spconv_test_read_bytes(path, &n);
    assert_non_null(text);
    int count = 0;
    for (const char *c = strstr(text, needle); c != NULL; c = strstr(c + 1, needle)) ++count;
    free(text);
    return count;
}

/* --peak-every-pass: every pass carries the peak measured beside it, and its wall / floor is its
 * wall time over the pass's GFLOP at that peak (each number printed to 6 digits, hence 1e-4). */
static void check_pass_floor(const char *path) {
    size_t n = 0;
    char *text = spconv_test_read_bytes(path, &n);
    assert_non_null(text);
    const char *forward = strstr(text, "\"passes\": {\"forward\": ");
    assert_non_null(forward);
    double gflop = 0.0, start = 0.0, wall = 0.0, peak = 0.0, ratio = 0.0;
    const char *g = strstr(forward, "\"gflop\": ");
    assert_non_null(g);
    assert_int_equal(sscanf(g, "\"gflop\": %lf", &gflop), 1);
    const char *first = strstr(forward, "\"per_pass\": [{\"rep\": 0, ");
    assert_non_null(first);
    assert_int_equal(sscanf(first, "\"per_pass\": [{\"rep\": 0, \"start_unix_ms\": %lf, "
                                   "\"wall_ms\": %lf, \"peak_gflops\": %lf, \"wall_over_floor\": %lf",
                            &start, &wall, &peak, &ratio), 4);
    assert_true(gflop > 0.0 && wall > 0.0 && peak > 0.0);
    const double expected = wall / (gflop * 1e3 / peak);
    assert_true(fabs(ratio - expected) <= 1e-4 * expected);
    assert_int_equal(count_in_file(path, "\"peak_gflops\": null"), 0);
    free(text);
}

/* An inference's lower bound on memory is there, and the engine did not hold less than it (a
 * bound that counted more than the engine keeps at its peak would fail this). Where the C
 * library does not tell allocation sizes the engine's figure is 0 and only the bound is checked. */
static void check_needed_memory(const char *path) {
    size_t n = 0;
    char *text = spconv_test_read_bytes(path, &n);
    assert_non_null(text);
    const char *needed = strstr(text, "\"needed_mib\": ");
    const char *held = strstr(text, "\"tensor_mib\": {\"median\": ");
    assert_true(needed != NULL && held != NULL);
    double needed_mib = 0.0, held_mib = 0.0;
    assert_int_equal(sscanf(needed, "\"needed_mib\": %lf", &needed_mib), 1);
    assert_int_equal(sscanf(held, "\"tensor_mib\": {\"median\": %lf", &held_mib), 1);
    assert_true(needed_mib > 0.0);
    if (held_mib > 0.0 && needed_mib > held_mib)
        fail_msg("%s: %.3f MiB needed, but the engine held %.3f", path, needed_mib, held_mib);
    free(text);
}

static void test_bench_json(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    char scan[PATH_CAP], json[PATH_CAP];
    small_scan(f, 5000, scan);
    expect_success(f, (const char *[]){"bench", "--net", "unet", "--input", scan, "--repeat", "2",
                                       "--warmup", "0", "--backward", "--peak-size", "128",
                                       "--peak-every-pass", "--json", in_dir(f, "unet.json", json),
                                       NULL});
    check_bench_json(json, zoo_layers("unet"), 1);
    check_pass_floor(json);
    assert_int_equal(count_in_file(json, "\"needed_mib\""), 0); /* a training forward */
    /* Every pass is there: 2 forwards and 2 backwards, each with its start and its phases; each
     * layer has 2 values per phase and direction. */
    assert_int_equal(count_in_file(json, "{\"rep\": "), 4);
    assert_int_equal(count_in_file(json, "{\"rep\": 1, \"start_unix_ms\": "), 2);
    assert_int_equal(count_in_file(json, "\"forward_ms_per_pass\": {\"total\": ["),
                     zoo_layers("unet"));
    expect_in_stdout(f, "forward (training)");
    expect_in_stdout(f, "backward: ");
    expect_in_stdout(f, "% of the sgemm peak");
    expect_in_stdout(f, "sgemm peak beside each pass: ");
    expect_in_stdout(f, ", each pass against its own peak");
    expect_success(f, (const char *[]){"bench", "--repeat", "1", "--warmup", "0", "--peak-size",
                                       "0", "--json", in_dir(f, "second.json", json), NULL});
    check_bench_json(json, zoo_layers("second"), 0);
    assert_int_equal(count_in_file(json, "\"peak_gflops\": null, \"wall_over_floor\": null"), 1);
    expect_in_stdout(f, "sample_scan.bin");
    expect_in_stdout(f, "engine tensors at their most");
    check_needed_memory(json);
    expect_in_stdout(f, "MiB needed (parameters, and what layer ");
    /* unet saves tensors for its concats: the bound holds there too. */
    expect_success(f, (const char *[]){"bench", "--net", "unet", "--input", scan, "--repeat", "1",
                                       "--warmup", "0", "--peak-size", "0", "--json",
                                       in_dir(f, "unet_inference.json", json), NULL});
    check_needed_memory(json);
    assert_int_equal(spconv_test_count_entries(f->dir), 6); /* scan, 3 JSON, stdout, stderr */
}

/* --replicate R runs on R copies of the input, one batch entry each: R times the sites, the
 * same layers; --input-grad adds the first layer's data gradient to the backward's work. */
static void test_bench_replicate_and_input_grad(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    char scan[PATH_CAP], one[PATH_CAP], three[PATH_CAP];
    small_scan(f, 3000, scan);
    expect_success(f, (const char *[]){"bench", "--net", "second", "--input", scan, "--repeat",
                                       "1", "--warmup", "0", "--peak-size", "0", "--backward",
                                       "--json", in_dir(f, "one.json", one), NULL});
    expect_success(f, (const char *[]){"bench", "--net", "second", "--input", scan, "--repeat",
                                       "1", "--warmup", "0", "--peak-size", "0", "--backward",
                                       "--input-grad", "--replicate", "3", "--json",
                                       in_dir(f, "three.json", three), NULL});
    check_bench_json(one, zoo_layers("second"), 1);
    check_bench_json(three, zoo_layers("second"), 1);
    long long sites_one = 0, sites_three = 0;
    size_t len = 0;
    char *a = spconv_test_read_bytes(one, &len), *b = spconv_test_read_bytes(three, &len);
    assert_true(a != NULL && b != NULL);
    assert_int_equal(sscanf(strstr(a, "\"sites\": "), "\"sites\": %lld", &sites_one), 1);
    assert_int_equal(sscanf(strstr(b, "\"sites\": "), "\"sites\": %lld", &sites_three), 1);
    assert_true(sites_one > 0);
    assert_int_equal(sites_three, 3 * sites_one);
    assert_non_null(strstr(a, "\"input_grad\": false, \"replicate\": 1,"));
    assert_non_null(strstr(b, "\"input_grad\": true, \"replicate\": 3,"));
    free(a);
    free(b);
    spconv_tool_expect_usage_error(
        f, (const char *[]){"bench", "--input-grad", NULL},
        "spconv bench: --input-grad needs --backward (the gradient comes from a backward)");
    spconv_tool_expect_usage_error(
        f, (const char *[]){"bench", "--peak-every-pass", "--peak-size", "0", NULL},
        "spconv bench: --peak-every-pass needs a peak (--peak-size is 0)");
    spconv_tool_expect_usage_error(f, (const char *[]){"bench", "--replicate", "0", NULL},
                                   "--replicate");
}

/* Random unique sites in bench_basic's grid [80, 1600, 1600] and 3 features each. */
static void random_voxels(int64_t n, int32_t *rows, float *features) {
    for (int64_t i = 0; i < n; ++i) {
        rows[4 * i] = 0;
        rows[4 * i + 1] = (int32_t)spconv_test_rand_int(0, 79);
        rows[4 * i + 2] = (int32_t)spconv_test_rand_int(0, 1599);
        rows[4 * i + 3] = (int32_t)(i * 3 + spconv_test_rand_int(0, 2)); /* x tells rows apart */
        for (int c = 0; c < 3; ++c) features[3 * i + c] = spconv_test_rand_float(-1.0f, 1.0f);
    }
}

static void bench_voxels(fixture *f, const char *input, const char *json, int64_t sites) {
    expect_success(f, (const char *[]){"bench", "--net", "basic", "--input", input, "--repeat", "1",
                                       "--warmup", "0", "--peak-size", "0", "--json", json, NULL});
    check_bench_json(json, zoo_layers("basic"), 0);
    check_needed_memory(json);
    char expected[64];
    snprintf(expected, sizeof expected, "\"sites\": %lld", (long long)sites);
    size_t n;
    char *text = spconv_test_read_bytes(json, &n);
    assert_non_null(strstr(text, expected));
    assert_non_null(strstr(text, "\"input_kind\": \"voxels\""));
    free(text);
}

/* Voxel files in each accepted form: raw folder, .npy folder, raw prefix. */
static void test_bench_voxel_files(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    enum { N = 400 };
    int32_t rows[4 * N];
    float features[3 * N];
    random_voxels(N, rows, features);
    char raw[PATH_CAP], npy[PATH_CAP], path[PATH_CAP], json[PATH_CAP];
    assert_int_equal(mkdir(in_dir(f, "raw", raw), 0777), 0);
    spconv_test_join(raw, "spconv_test_indices.i32", path, PATH_CAP);
    assert_int_equal(spconv_test_write_bytes(path, rows, sizeof rows), 0);
    spconv_test_join(raw, "spconv_test_features.f32", path, PATH_CAP);
    assert_int_equal(spconv_test_write_bytes(path, features, sizeof features), 0);
    bench_voxels(f, raw, in_dir(f, "raw.json", json), N);
    assert_int_equal(mkdir(in_dir(f, "npy", npy), 0777), 0);
    spconv_tensor *t = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_I32, 2,
                                             (const int64_t[]){N, 4}, rows, &t));
    SPCONV_ASSERT_OK(
        spconv_npy_write(NULL, spconv_test_join(npy, "indices.npy", path, PATH_CAP), t));
    spconv_tensor_release(t);
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_F32, 2,
                                             (const int64_t[]){N, 3}, features, &t));
    SPCONV_ASSERT_OK(
        spconv_npy_write(NULL, spconv_test_join(npy, "features.npy", path, PATH_CAP), t));
    spconv_tensor_release(t);
    bench_voxels(f, npy, in_dir(f, "npy.json", json), N);
    bench_voxels(f, spconv_test_join(raw, "spconv_test", path, PATH_CAP),
                 in_dir(f, "prefix.json", json), N);
}

static void test_bench_errors(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    enum { N = 50 };
    int32_t rows[4 * N];
    float features[3 * N];
    random_voxels(N, rows, features);
    char dir[PATH_CAP], idx[PATH_CAP], feat[PATH_CAP], json[PATH_CAP], empty[PATH_CAP];
    assert_int_equal(mkdir(in_dir(f, "bad", dir), 0777), 0);
    spconv_test_join(dir, "spconv_test_indices.i32", idx, PATH_CAP);
    spconv_test_join(dir, "spconv_test_features.f32", feat, PATH_CAP);
    const char *args[] = {"bench", "--net", "basic", "--input", dir, "--repeat", "1", "--warmup",
                          "0", "--peak-size", "0", NULL};
    assert_int_equal(spconv_test_write_bytes(idx, rows, sizeof rows), 0);
    assert_int_equal(spconv_test_write_bytes(feat, features, sizeof features - 4), 0);
    spconv_tool_expect_usage_error(f, args, "spconv_test_features.f32");
    assert_int_equal(spconv_test_write_bytes(feat, features, sizeof features), 0);
    assert_int_equal(spconv_test_write_bytes(idx, rows, sizeof rows - 8), 0);
    spconv_tool_expect_usage_error(f, args, "spconv_test_indices.i32");
    rows[4 * 17 + 2] = 1600; /* y outside [0, 1600) */
    assert_int_equal(spconv_test_write_bytes(idx, rows, sizeof rows), 0);
    spconv_tool_expect_usage_error(f, args, "row 17");
    rows[4 * 17 + 2] = rows[4 * 3 + 2], rows[4 * 17 + 1] = rows[4 * 3 + 1];
    rows[4 * 17 + 3] = rows[4 * 3 + 3]; /* a duplicate of row 3 */
    assert_int_equal(spconv_test_write_bytes(idx, rows, sizeof rows), 0);
    spconv_tool_expect_usage_error(f, args, "row");
    assert_int_equal(mkdir(in_dir(f, "empty", empty), 0777), 0);
    spconv_tool_expect_usage_error(f, (const char *[]){"bench", "--input", empty, NULL},
                                   "indices.npy");
    spconv_tool_expect_usage_error(
        f, (const char *[]){"bench", "--input", in_dir(f, "no.bin", idx), NULL}, "no.bin");
    spconv_tool_expect_usage_error(f, (const char *[]){"bench", "--repeat", "0", NULL}, "--repeat");
    spconv_tool_expect_usage_error(f, (const char *[]){"bench", "--net", "x", NULL}, "--net");
    spconv_test_join(empty, "no/such/folder.json", json, PATH_CAP);
    char line[3 * PATH_CAP], folder[PATH_CAP];
    snprintf(line, sizeof line, "spconv bench: --json '%s': folder '%s' does not exist", json,
             spconv_test_join(empty, "no/such", folder, PATH_CAP));
    spconv_tool_expect_usage_error(f, (const char *[]){"bench", "--json", json, NULL}, line);
    /* A file where the folder should be: refused before the timing, no temporary named. */
    spconv_test_join(feat, "x.json", json, PATH_CAP);
    snprintf(line, sizeof line, "spconv bench: --json '%s': '%s' is a file, not a folder", json,
             feat);
    spconv_tool_expect_usage_error(f, (const char *[]){"bench", "--json", json, NULL}, line);
    spconv_tool_expect_usage_error(
        f, (const char *[]){"bench", "--json", "/proc/bench.json", NULL},
        "spconv bench: --json '/proc/bench.json': cannot write in folder '/proc': ");
}

/* .npy voxel files: what the file holds, and which network takes it. */
static void test_bench_npy_input_errors(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    enum { N = 4 };
    char dir[PATH_CAP], path[PATH_CAP], line[3 * PATH_CAP], raw[PATH_CAP];
    assert_int_equal(mkdir(in_dir(f, "npy", dir), 0777), 0);
    int32_t rows[4 * N] = {0, 1, 1, 1, 0, 2, 2, 2, 0, 3, 3, 3, 0, 4, 4, 4};
    float features[4 * N] = {0};
    spconv_tensor *t = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_I32, 2,
                                             (const int64_t[]){N, 4}, rows, &t));
    SPCONV_ASSERT_OK(
        spconv_npy_write(NULL, spconv_test_join(dir, "indices.npy", path, PATH_CAP), t));
    spconv_tensor_release(t);
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_F32, 2,
                                             (const int64_t[]){N, 2}, features, &t));
    SPCONV_ASSERT_OK(
        spconv_npy_write(NULL, spconv_test_join(dir, "features.npy", path, PATH_CAP), t));
    snprintf(line, sizeof line, "spconv bench: --input: '%s' is f32 [4, 2]; --net basic takes "
             "floating [4, 3] (a row per index row, 3 channels)", path);
    spconv_tool_expect_usage_error(f, (const char *[]){"bench", "--net", "basic", "--input", dir,
                                                       NULL}, line);
    /* The features as indices: the dtype and shape are named. */
    SPCONV_ASSERT_OK(
        spconv_npy_write(NULL, spconv_test_join(dir, "indices.npy", path, PATH_CAP), t));
    spconv_tensor_release(t);
    snprintf(line, sizeof line, "spconv bench: --input: '%s' is f32 [4, 2]; it must be int32 or "
             "int64 [N, 4]", path);
    spconv_tool_expect_usage_error(f, (const char *[]){"bench", "--net", "basic", "--input", dir,
                                                       NULL}, line);
    /* Raw files with 4 channels per row, given to basic (3): said in channels, with the networks
     * that take 4. */
    assert_int_equal(mkdir(in_dir(f, "raw", raw), 0777), 0);
    spconv_test_join(raw, "spconv_test_indices.i32", path, PATH_CAP);
    assert_int_equal(spconv_test_write_bytes(path, rows, sizeof rows), 0);
    spconv_test_join(raw, "spconv_test_features.f32", path, PATH_CAP);
    assert_int_equal(spconv_test_write_bytes(path, features, sizeof features), 0);
    snprintf(line, sizeof line, "spconv bench: --input: '%s' holds 4 float32 channels for each of "
             "the 4 rows; --net basic takes 3; networks that take 4: ", path);
    spconv_tool_expect_usage_error(f, (const char *[]){"bench", "--net", "basic", "--input", raw,
                                                       NULL}, line);
    assert_non_null(strstr(f->err_text, "second"));
}

/* ---- interrupted runs leave nothing ----------------------------------------------------------- */

/* Start the tool with @p args, its stderr on a pipe (*err_fd); returns the pid. */
static pid_t start_tool(const fixture *f, const char *const *args, int *err_fd) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], STDERR_FILENO);
        int null = open("/dev/null", O_WRONLY);
        dup2(null, STDOUT_FILENO);
        close(fds[0]);
        const char *argv[32] = {f->tool};
        for (int i = 0; args[i] != NULL && i < 30; ++i) argv[i + 1] = args[i];
        execv(f->tool, (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    *err_fd = fds[0];
    return pid;
}

/* Interrupt @p pid and reap it; it must have died of the signal, not finished. */
static void interrupt(pid_t pid, int err_fd) {
    assert_int_equal(kill(pid, SIGINT), 0);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT);
    close(err_fd);
}

/* The output folder of run and the JSON temporary of bench are made only once the work is done:
 * interrupted in the middle, neither leaves anything behind. */
static void test_interrupted_leaves_nothing(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    char scan[PATH_CAP], out[PATH_CAP], json[PATH_CAP];
    small_scan(f, 5000, scan);
    in_dir(f, "interrupted", out);
    int err_fd;
    /* Wait for the first layer's progress line: the network is running. */
    pid_t pid = start_tool(f, (const char *[]){"run", scan, "--net", "unet", "--progress", "--out",
                                               out, NULL}, &err_fd);
    char text[4096] = "";
    size_t used = 0;
    while (strstr(text, "progress: layer 1/") == NULL && used + 1 < sizeof text) {
        ssize_t n = read(err_fd, text + used, sizeof text - 1 - used);
        assert_true(n > 0);
        used += (size_t)n;
        text[used] = '\0';
    }
    assert_false(spconv_test_exists(out));
    interrupt(pid, err_fd);
    assert_false(spconv_test_exists(out));
    /* bench with far more passes than it can do before the signal. */
    const int entries = spconv_test_count_entries(f->dir);
    pid = start_tool(f, (const char *[]){"bench", "--net", "unet", "--input", scan, "--repeat",
                                         "100000", "--peak-size", "0", "--json",
                                         in_dir(f, "bench.json", json), NULL}, &err_fd);
    const struct timespec pause = {0, 500 * 1000 * 1000};
    nanosleep(&pause, NULL);
    assert_int_equal(waitpid(pid, NULL, WNOHANG), 0); /* still timing */
    assert_int_equal(spconv_test_count_entries(f->dir), entries);
    interrupt(pid, err_fd);
    assert_int_equal(spconv_test_count_entries(f->dir), entries);
}

/* The JSON checker the bench tests rely on tells valid from invalid text. */
static void test_json_checker(void **state) {
    (void)state;
    static const char *const valid[] = {"{}", "[]", " {\"a\": [1, -2.5e3, true, null, \"x\\n\"]} ",
                                        "0", "\"\\u00e9\""};
    static const char *const invalid[] = {"", "{", "{\"a\" 1}", "[1,]", "01", "1.", "nan",
                                          "\"tab\there\"", "{} {}", "[\"\\x\"]", "{a: 1}"};
    size_t at;
    for (size_t i = 0; i < sizeof valid / sizeof valid[0]; ++i)
        assert_true(spconv_test_json_valid(valid[i], &at));
    for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; ++i)
        if (spconv_test_json_valid(invalid[i], &at)) fail_msg("accepted %s", invalid[i]);
}

int main(void) {
    spconv_test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_checker),
        cmocka_unit_test_setup_teardown(test_run_second_on_sample, setup, teardown),
        cmocka_unit_test_setup_teardown(test_run_unet_on_sample, setup, teardown),
        cmocka_unit_test_setup_teardown(test_run_basic_on_sample, setup, teardown),
        cmocka_unit_test_setup_teardown(test_run_on_device, setup, teardown),
        cmocka_unit_test_setup_teardown(test_run_weights, setup, teardown),
        cmocka_unit_test_setup_teardown(test_run_dtype, setup, teardown),
        cmocka_unit_test_setup_teardown(test_run_zero_voxels, setup, teardown),
        cmocka_unit_test_setup_teardown(test_run_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bench_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bench_replicate_and_input_grad, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bench_voxel_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bench_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bench_npy_input_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_interrupted_leaves_nothing, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
