/* `spconv run` (path in env SPCONV_TOOL, set by CTest) on voxel files and on many scans in
 * batches: voxel files give what the scan they came from gives; a batch's outputs are the scans
 * run one by one; every error exit is status 2, one line on stderr and no output left behind.
 *
 * Batch against one by one. The outputs' sites (out_indices.npy) must be identical: they are
 * integer geometry. The features are identical bit for bit when the products are the engine's
 * plain-C GEMM (each output element gets its terms in a fixed order whatever the other rows are;
 * checked when the build has no BLAS), and so they are with the fused kernels (conv/fused.h),
 * which the executors use wherever the machine has AVX2 + FMA. OpenBLAS does not promise that: how it sums a row of a
 * product depends on the product's row count and on where the row falls among its micro-tiles,
 * so a scan's rows in a batch of other rows round differently in the last bits (seen: 6e-7 on
 * values near 4). For that case the bound is the engine's own float32 rounding, measured
 * against the float64 network (see rounding_bound). */
#define _XOPEN_SOURCE 700

#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/run_tool.h"
#include "common/test_files.h"
#include "common/test_util.h"
#include "conv/fused.h"
#include "spconv/config.h"

#define PATH_CAP SPCONV_TOOL_PATH_CAP

typedef spconv_tool_fixture fixture;

static int setup(void **state) { return spconv_tool_setup(state, "spconv_run_batch"); }

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

static void assert_same_file(const char *dir_a, const char *dir_b, const char *name) {
    char a[PATH_CAP], b[PATH_CAP];
    size_t na = 0, nb = 0;
    char *x = spconv_test_read_bytes(spconv_test_join(dir_a, name, a, PATH_CAP), &na);
    char *y = spconv_test_read_bytes(spconv_test_join(dir_b, name, b, PATH_CAP), &nb);
    assert_non_null(x);
    assert_non_null(y);
    if (na != nb || memcmp(x, y, na) != 0) fail_msg("%s and %s differ", a, b);
    free(x);
    free(y);
}

static const char *sample_scan(void) {
    static char path[PATH_CAP];
    snprintf(path, sizeof path, "%s/data/sample_scan.bin", SPCONV_TEST_SOURCE_DIR);
    return path;
}

/* Scan @p part of 3: every third point of the sample in front of the sensor, from point @p part
 * on, up to @p count of them; so the scans differ and each spreads over the scene. */
static const char *part_scan(const fixture *f, const char *name, int part, int64_t count,
                             char *path) {
    size_t n = 0;
    float *points = (float *)spconv_test_read_bytes(sample_scan(), &n);
    assert_non_null(points);
    int64_t kept = 0;
    for (int64_t i = part; i < (int64_t)(n / 16) && kept < count; i += 3)
        if (points[4 * i] > 1.0f) memmove(points + 4 * kept++, points + 4 * i, 16);
    assert_int_equal(
        spconv_test_write_bytes(in_dir(f, name, path), points, (size_t)kept * 16), 0);
    free(points);
    return path;
}

/* The input of zoo network @p net for the scan @p path, through the C API, in @p dtype. */
static spconv_sparse_tensor *api_input(const char *net, const char *path, spconv_dtype dtype) {
    spconv_net_input zin;
    SPCONV_ASSERT_OK(spconv_zoo_input(net, &zin));
    spconv_point_cloud *pc = NULL;
    SPCONV_ASSERT_OK(spconv_point_cloud_read(path, SPCONV_CLOUD_AUTO, 0, &pc));
    spconv_sparse_tensor *sp = NULL;
    SPCONV_ASSERT_OK(spconv_net_input_from_points(NULL, &zin, spconv_point_cloud_points(pc),
                                                  dtype, &sp, NULL));
    spconv_point_cloud_destroy(pc);
    return sp;
}

static void write_npy(const char *dir, const char *name, const spconv_tensor *t) {
    char path[PATH_CAP];
    SPCONV_ASSERT_OK(spconv_npy_write(NULL, spconv_test_join(dir, name, path, PATH_CAP), t));
}

/* The voxels of @p scan for @p net as a folder of indices.npy + features.npy. */
static void save_voxels(const char *net, const char *scan, const char *dir) {
    spconv_sparse_tensor *sp = api_input(net, scan, SPCONV_F32);
    assert_int_equal(mkdir(dir, 0777), 0);
    write_npy(dir, "indices.npy", spconv_sparse_indices(sp));
    write_npy(dir, "features.npy", spconv_sparse_features(sp));
    spconv_sparse_release(sp);
}

/* ---- the bound for BLAS products -------------------------------------------------------------- */

/* The output of zoo network @p name (seed 1, the CLI's default weights) on @p scan in float64:
 * the exact value, as far as a float32 run can tell. */
static spconv_tensor *float64_output(const char *name, const char *scan) {
    spconv_net *net = NULL;
    SPCONV_ASSERT_OK(spconv_zoo_create(name, SPCONV_F64, 1, &net));
    spconv_sparse_tensor *in = api_input(name, scan, SPCONV_F64);
    spconv_tensor *out = NULL;
    SPCONV_ASSERT_OK(spconv_net_forward(NULL, net, in, SPCONV_NET_INFERENCE, &out, NULL));
    spconv_sparse_release(in);
    spconv_net_destroy(net);
    return out;
}

/*
 * With OpenBLAS the two float32 runs are two roundings of the same exact values E: |batched -
 * alone| <= |batched - E| + |alone - E|. A rigorous elementwise bound on each term (gamma_n
 * times |W| applied to |x|, layer after layer) compounds the weights' absolute values and is
 * useless on these networks (measured: 8e7 on unet outputs of size 5; 4e12 on second's). So the
 * bound is the float32 engine's own measured rounding: e = max |alone - E|, E from the float64
 * network, and the batched run may be off by as much again, with room for a batched run whose
 * rounding is up to three times the alone one's: |batched - alone| <= 4 e everywhere. Any real
 * fault (a scan's rows mixed with another's, a batch index left over) is orders of magnitude
 * larger than that.
 */
static double rounding_bound(const char *name, const char *scan, const float *alone, int64_t n) {
    spconv_tensor *exact = float64_output(name, scan);
    assert_int_equal(spconv_tensor_numel(exact), n);
    const double *e = spconv_tensor_data(exact);
    double worst = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        const double d = fabs((double)alone[i] - e[i]);
        worst = d > worst ? d : worst;
    }
    spconv_tensor_release(exact);
    return 4.0 * worst;
}

/* output.npy of a batch run (@p batched) and of the scan run alone (@p alone): the same sites,
 * and the same features (bitwise with the fused kernels or without BLAS; within rounding_bound
 * when OpenBLAS runs the products). */
static void compare_with_alone(const char *name, const char *scan, const char *batched,
                               const char *alone) {
    spconv_tensor *b = read_npy(batched, "output.npy"), *s = read_npy(alone, "output.npy");
    assert_int_equal(spconv_tensor_ndim(b), spconv_tensor_ndim(s));
    for (int d = 0; d < spconv_tensor_ndim(b); ++d)
        assert_int_equal(spconv_tensor_size(b, d), spconv_tensor_size(s, d));
    if (spconv_tensor_ndim(b) == 2) assert_same_file(batched, alone, "out_indices.npy");
    const float *vb = spconv_tensor_data(b), *vs = spconv_tensor_data(s);
    const int64_t n = spconv_tensor_numel(b);
    if (!SPCONV_HAVE_BLAS || spconv__fused_available()) {
        assert_same_file(batched, alone, "output.npy");
    } else {
        const double bound = rounding_bound(name, scan, vs, n);
        double worst = 0.0;
        for (int64_t i = 0; i < n; ++i) {
            const double diff = fabs((double)vb[i] - (double)vs[i]);
            if (diff > bound)
                fail_msg("%s element %lld: batched %.9g, alone %.9g, bound %.3g", batched,
                         (long long)i, vb[i], vs[i], bound);
            worst = diff > worst ? diff : worst;
        }
        print_message("note: %s: largest |batched - alone| %.3g, bound %.3g (OpenBLAS sums the "
                      "rows of a product in an order that depends on its row count)\n", name,
                      worst, bound);
    }
    spconv_tensor_release(b);
    spconv_tensor_release(s);
}

/* ---- voxel files as the input of run ---------------------------------------------------------- */

/* The voxels of a scan, given as files, with weights from a folder, give what the scan gives. */
static void test_run_voxel_files(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    char scan[PATH_CAP], vox[PATH_CAP], weights[PATH_CAP], o_scan[PATH_CAP], o_vox[PATH_CAP];
    part_scan(f, "scan.bin", 0, 6000, scan);
    save_voxels("unet", scan, in_dir(f, "vox", vox));
    spconv_net *net = NULL;
    SPCONV_ASSERT_OK(spconv_zoo_create("unet", SPCONV_F32, 5, &net));
    SPCONV_ASSERT_OK(spconv_net_save_weights(NULL, net, in_dir(f, "w", weights),
                                             SPCONV_NET_LAYOUT_KRSC));
    spconv_net_destroy(net);
    expect_success(f, (const char *[]){"run", scan, "--net", "unet", "--weights", weights,
                                       "--quiet", "--out", in_dir(f, "o_scan", o_scan), NULL});
    expect_success(f, (const char *[]){"run", vox, "--net", "unet", "--weights", weights,
                                       "--out", in_dir(f, "o_vox", o_vox), NULL});
    expect_in_stdout(f, "voxels (from voxel files)");
    expect_in_stdout(f, "picture.png not written: voxel files");
    assert_same_file(o_scan, o_vox, "output.npy");
    assert_same_file(o_scan, o_vox, "out_indices.npy");
    assert_int_equal(spconv_test_count_entries(o_vox), 2); /* no picture */
    /* A dense output (second) too, from raw voxel files given by prefix. */
    spconv_sparse_tensor *sp = api_input("second", scan, SPCONV_F32);
    char raw[PATH_CAP], prefix[PATH_CAP], path[2 * PATH_CAP];
    assert_int_equal(mkdir(in_dir(f, "raw", raw), 0777), 0);
    spconv_test_join(raw, "kitti", prefix, PATH_CAP);
    snprintf(path, sizeof path, "%s_indices.i32", prefix);
    spconv_tensor *t = spconv_sparse_indices(sp);
    assert_int_equal(spconv_test_write_bytes(path, spconv_tensor_data(t),
                                             (size_t)spconv_tensor_numel(t) * 4), 0);
    snprintf(path, sizeof path, "%s_features.f32", prefix);
    t = spconv_sparse_features(sp);
    assert_int_equal(spconv_test_write_bytes(path, spconv_tensor_data(t),
                                             (size_t)spconv_tensor_numel(t) * 4), 0);
    spconv_sparse_release(sp);
    expect_success(f, (const char *[]){"run", scan, "--quiet", "--out", o_scan, NULL});
    expect_success(f, (const char *[]){"run", prefix, "--quiet", "--out", o_vox, NULL});
    assert_same_file(o_scan, o_vox, "output.npy");
}

static void test_run_voxel_errors(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    char vox[PATH_CAP], out[PATH_CAP], line[3 * PATH_CAP], path[PATH_CAP];
    in_dir(f, "never", out);
    assert_int_equal(mkdir(in_dir(f, "vox", vox), 0777), 0);
    int32_t rows[8] = {0, 1, 2, 3, 0, 1, 2, 3}; /* a repeated row */
    float features[8] = {0};
    spconv_tensor *t = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_I32, 2,
                                             (const int64_t[]){2, 4}, rows, &t));
    write_npy(vox, "indices.npy", t);
    spconv_tensor_release(t);
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_F32, 2,
                                             (const int64_t[]){2, 4}, features, &t));
    write_npy(vox, "features.npy", t);
    spconv_tensor_release(t);
    spconv_tool_expect_usage_error(f, (const char *[]){"run", vox, "--out", out, NULL}, "row 1");
    /* The right rows, with channels for another network. */
    rows[7] = 4;
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_I32, 2,
                                             (const int64_t[]){2, 4}, rows, &t));
    write_npy(vox, "indices.npy", t);
    spconv_tensor_release(t);
    snprintf(line, sizeof line, "spconv run: SCAN: '%s' is f32 [2, 4]; --net basic takes "
             "floating [2, 3]",
             spconv_test_join(vox, "features.npy", path, PATH_CAP));
    spconv_tool_expect_usage_error(f, (const char *[]){"run", vox, "--net", "basic", "--out", out,
                                                       NULL}, line);
    /* A prefix whose features file is missing. */
    char prefix[PATH_CAP];
    snprintf(path, sizeof path, "%s/p_indices.i32", f->dir);
    assert_int_equal(spconv_test_write_bytes(path, rows, sizeof rows), 0);
    spconv_tool_expect_usage_error(
        f, (const char *[]){"run", in_dir(f, "p", prefix), "--out", out, NULL}, "p_features.f32");
    assert_false(spconv_test_exists(out));
}

/* ---- many scans ------------------------------------------------------------------------------- */

/* Three scans in a folder; batches of 2 (so that one batch is full and one is not) against
 * each scan alone, for a sparse output (unet: subm, strided and inverse convs, concatenation)
 * and a dense one (second). */
static void check_batches(fixture *f, const char *net) {
    char scans[PATH_CAP], path[2 * PATH_CAP], batched[PATH_CAP], alone[PATH_CAP], sub[PATH_CAP];
    static const char *const names[] = {"scan_a", "scan_b", "scan_c"};
    snprintf(scans, sizeof scans, "%s/scans_%s", f->dir, net);
    assert_int_equal(mkdir(scans, 0777), 0);
    for (int i = 0; i < 3; ++i) {
        char name[64];
        snprintf(name, sizeof name, "scans_%s/%s.bin", net, names[i]);
        part_scan(f, name, i, 3000 + 1500 * i, path);
    }
    snprintf(batched, sizeof batched, "%s/batched_%s", f->dir, net);
    expect_success(f, (const char *[]){"run", scans, "--net", net, "--batch-size", "2", "--out",
                                       batched, NULL});
    expect_in_stdout(f, "batch 1/2: scans 1-2 (scan_a .. scan_b)");
    expect_in_stdout(f, "batch 2/2: scans 3-3 (scan_c .. scan_c)");
    expect_in_stdout(f, " 3 scans in 2 batches of up to 2: ");
    expect_in_stdout(f, " scans/s");
    assert_string_equal(f->err_text, ""); /* no progress off a terminal without --progress */
    assert_int_equal(spconv_test_count_entries(batched), 3);
    for (int i = 0; i < 3; ++i) {
        snprintf(path, sizeof path, "%s/%s.bin", scans, names[i]);
        snprintf(alone, sizeof alone, "%s/alone_%s_%s", f->dir, net, names[i]);
        expect_success(f, (const char *[]){"run", path, "--net", net, "--quiet", "--out", alone,
                                           NULL});
        compare_with_alone(net, path, spconv_test_join(batched, names[i], sub, PATH_CAP), alone);
    }
}

static void test_run_batches_unet(void **state) {
    check_batches(spconv_tool_or_skip(state), "unet");
}

static void test_run_batches_second(void **state) {
    check_batches(spconv_tool_or_skip(state), "second");
}

/* Files, a list file (relative paths, comments) and voxel files together; --progress lines. */
static void test_run_list_and_progress(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    char a[PATH_CAP], b[PATH_CAP], vox[PATH_CAP], list[PATH_CAP], out[PATH_CAP],
        one[PATH_CAP], sub[PATH_CAP];
    part_scan(f, "one.bin", 0, 2000, a);
    assert_int_equal(mkdir(in_dir(f, "lists", list), 0777), 0);
    part_scan(f, "lists/two.bin", 1, 2500, b);
    save_voxels("unet", a, in_dir(f, "lists/three", vox));
    const char text[] = "# scans of the test\n  two.bin\n\nthree\r\n";
    assert_int_equal(spconv_test_write_bytes(in_dir(f, "lists/scans.txt", list), text,
                                             sizeof text - 1), 0);
    expect_success(f, (const char *[]){"run", a, "--list", list, "--net", "unet", "--batch-size",
                                       "3", "--progress", "--quiet", "--out",
                                       in_dir(f, "out", out), NULL});
    expect_in_stdout(f, "unet: 3 scans in 1 batches of up to 3: ");
    assert_null(strstr(f->out_text, "batch 1/1")); /* --quiet */
    assert_non_null(strstr(f->err_text, "spconv run: progress: 3/3 scans (batch 1/1), "));
    assert_int_equal(spconv_test_count_entries(out), 3);
    /* "three" holds the voxels of "one": the same output, in another slot of the batch. */
    assert_same_file(spconv_test_join(out, "one", one, PATH_CAP),
                     spconv_test_join(out, "three", sub, PATH_CAP), "out_indices.npy");
    /* One scan with --batch-size: the layout of many, so that a glob matching one file gives
     * what it gives for several. */
    expect_success(f, (const char *[]){"run", a, "--net", "unet", "--batch-size", "1", "--quiet",
                                       "--out", in_dir(f, "single", out), NULL});
    assert_true(spconv_test_exists(spconv_test_join(out, "one/output.npy", sub, PATH_CAP)));
}

static void test_run_batch_errors(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    char a[PATH_CAP], b[PATH_CAP], dup[PATH_CAP], list[PATH_CAP], out[PATH_CAP], line[3 * PATH_CAP],
        bad[PATH_CAP], empty[PATH_CAP], vox[PATH_CAP], path[PATH_CAP];
    part_scan(f, "a.bin", 0, 1500, a);
    part_scan(f, "b.bin", 1, 1500, b);
    in_dir(f, "never", out);
    const char *u = "--net", *unet = "unet", *o = "--out";
    /* A missing entry of a list: the list, the line and the path are named. */
    const char text[] = "a.bin\nmissing.bin\n";
    assert_int_equal(spconv_test_write_bytes(in_dir(f, "list.txt", list), text, sizeof text - 1),
                     0);
    snprintf(line, sizeof line, "spconv run: --list '%s' line 2: cannot read '%s/missing.bin': ",
             list, f->dir);
    spconv_tool_expect_usage_error(f, (const char *[]){"run", "--list", list, u, unet, o, out,
                                                       NULL}, line);
    const char comments[] = "# nothing\n\n";
    assert_int_equal(spconv_test_write_bytes(list, comments, sizeof comments - 1), 0);
    spconv_tool_expect_usage_error(f, (const char *[]){"run", "--list", list, o, out, NULL},
                                   "names no scan");
    spconv_tool_expect_usage_error(f, (const char *[]){"run", "--list", f->dir, o, out, NULL},
                                   "--list");
    /* Two inputs with one name. */
    assert_int_equal(mkdir(in_dir(f, "other", dup), 0777), 0);
    part_scan(f, "other/a.bin", 2, 1500, dup);
    snprintf(line, sizeof line, "spconv run: '%s' and '%s' would both write into --out/a", a, dup);
    spconv_tool_expect_usage_error(f, (const char *[]){"run", a, dup, o, out, NULL}, line);
    /* A folder without scans. */
    assert_int_equal(mkdir(in_dir(f, "empty", empty), 0777), 0);
    spconv_tool_expect_usage_error(f, (const char *[]){"run", a, empty, o, out, NULL},
                                   "holds no .bin, .pcd or .ply file");
    /* A broken scan in the second batch: the first batch's outputs go too. */
    assert_int_equal(spconv_test_write_bytes(in_dir(f, "z_bad.bin", bad), "12345", 5), 0);
    spconv_tool_expect_usage_error(f, (const char *[]){"run", a, b, bad, u, unet, "--batch-size",
                                                       "2", "--quiet", o, out, NULL}, "z_bad.bin");
    /* Voxel files of two batch entries cannot be one scan of a batch. */
    assert_int_equal(mkdir(in_dir(f, "vox2", vox), 0777), 0);
    int32_t rows[8] = {0, 1, 2, 3, 1, 1, 2, 3};
    float features[8] = {0};
    spconv_tensor *t = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_I32, 2,
                                             (const int64_t[]){2, 4}, rows, &t));
    write_npy(vox, "indices.npy", t);
    spconv_tensor_release(t);
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_F32, 2,
                                             (const int64_t[]){2, 4}, features, &t));
    write_npy(vox, "features.npy", t);
    spconv_tensor_release(t);
    snprintf(line, sizeof line, "spconv run: '%s' holds batch indices up to 1; with several "
             "inputs each must be one scan (batch index 0)", vox);
    spconv_tool_expect_usage_error(f, (const char *[]){"run", a, vox, u, unet, "--quiet", o, out,
                                                       NULL}, line);
    /* Options. */
    spconv_tool_expect_usage_error(f, (const char *[]){"run", a, b, "--batch-size", "0", NULL},
                                   "--batch-size");
    spconv_tool_expect_usage_error(f, (const char *[]){"run", "--batch-size", "2", o, out, NULL},
                                   "--batch-size needs inputs");
    assert_false(spconv_test_exists(out));
    /* A scan's output folder taken by a file: refused before any scan runs. */
    char taken[PATH_CAP];
    assert_int_equal(mkdir(in_dir(f, "taken", taken), 0777), 0);
    assert_int_equal(spconv_test_write_bytes(spconv_test_join(taken, "b", path, PATH_CAP), "x", 1),
                     0);
    spconv_tool_expect_usage_error(f, (const char *[]){"run", a, b, u, unet, o, taken, NULL},
                                   "is a file, not a folder");
    assert_string_equal(f->out_text, "");
    assert_int_equal(spconv_test_count_entries(taken), 1);
}

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

/* Interrupted after its first batch, a run of many scans removes the outputs it had written
 * under temporary names and the folders it made, and dies of the signal. */
static void test_run_batch_interrupted_leaves_nothing(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    char scans[PATH_CAP], path[PATH_CAP], out[PATH_CAP];
    assert_int_equal(mkdir(in_dir(f, "scans", scans), 0777), 0);
    for (int i = 0; i < 40; ++i) {
        char name[64];
        snprintf(name, sizeof name, "scans/s%02d.bin", i);
        part_scan(f, name, i % 3, 6000, path);
    }
    int err_fd;
    pid_t pid = start_tool(f, (const char *[]){"run", scans, "--net", "unet", "--progress",
                                               "--quiet", "--out", in_dir(f, "out", out), NULL},
                           &err_fd);
    char text[4096] = "";
    size_t used = 0;
    while (strstr(text, "progress: 1/40 scans") == NULL && used + 1 < sizeof text) {
        ssize_t n = read(err_fd, text + used, sizeof text - 1 - used);
        assert_true(n > 0);
        used += (size_t)n;
        text[used] = '\0';
    }
    assert_true(spconv_test_exists(out)); /* the first scan's folder, with its temporaries */
    assert_int_equal(kill(pid, SIGINT), 0);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    close(err_fd);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGINT)
        fail_msg("the run did not die of SIGINT (status %d): it finished 40 scans first?", status);
    assert_false(spconv_test_exists(out));
}

int main(void) {
    spconv_test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_run_voxel_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_run_voxel_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_run_batches_unet, setup, teardown),
        cmocka_unit_test_setup_teardown(test_run_batches_second, setup, teardown),
        cmocka_unit_test_setup_teardown(test_run_list_and_progress, setup, teardown),
        cmocka_unit_test_setup_teardown(test_run_batch_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_run_batch_interrupted_leaves_nothing, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
