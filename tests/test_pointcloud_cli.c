/* `spconv voxelize` and `spconv info` (path in env SPCONV_TOOL, set by CTest): the .npy and .pcd
 * outputs held against the same computation through the C API, the summary, and the error exits
 * (status 2, one line on stderr naming the problem, no output folder left behind), hostile inputs
 * included: named pipes, files PCL aborted on or printed its own lines about. */
#define _XOPEN_SOURCE 700

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/run_tool.h"
#include "common/test_files.h"
#include "common/test_util.h"
#include "io/pointcloud_pcd.h"

#define PATH_CAP SPCONV_TOOL_PATH_CAP

typedef spconv_tool_fixture fixture;

static int setup(void **state) { return spconv_tool_setup(state, "spconv_pc_cli"); }

static int teardown(void **state) { return spconv_tool_teardown(state); }

static const char *in_dir(const fixture *f, const char *name, char *buf) {
    return spconv_tool_scratch_path(f, name, buf);
}

static spconv_tensor *read_npy(const fixture *f, const char *dir, const char *name) {
    char folder[PATH_CAP], path[PATH_CAP];
    spconv_test_join(in_dir(f, dir, folder), name, path, PATH_CAP);
    spconv_tensor *t = NULL;
    SPCONV_ASSERT_OK(spconv_npy_read(path, &t));
    return t;
}

static void assert_same_tensor(const spconv_tensor *a, const spconv_tensor *b) {
    assert_int_equal(spconv_tensor_dtype(a), spconv_tensor_dtype(b));
    assert_int_equal(spconv_tensor_ndim(a), spconv_tensor_ndim(b));
    for (int d = 0; d < spconv_tensor_ndim(a); ++d)
        assert_int_equal(spconv_tensor_size(a, d), spconv_tensor_size(b, d));
    size_t bytes = (size_t)spconv_tensor_numel(a) * spconv_dtype_size(spconv_tensor_dtype(a));
    assert_memory_equal(spconv_tensor_data(a), spconv_tensor_data(b), bytes);
}

/* A random KITTI-like scan in the scratch folder; returns it as a tensor. */
static spconv_tensor *write_scan(const fixture *f, const char *name, int64_t P) {
    spconv_tensor *t = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_empty(spconv_cpu(), SPCONV_F32, 2, (int64_t[]){P, 4}, &t));
    float *d = spconv_tensor_data(t);
    for (int64_t i = 0; i < P; ++i) {
        d[i * 4 + 0] = spconv_test_rand_float(-5.0f, 75.0f);
        d[i * 4 + 1] = spconv_test_rand_float(-45.0f, 45.0f);
        d[i * 4 + 2] = spconv_test_rand_float(-3.5f, 1.5f);
        d[i * 4 + 3] = spconv_test_rand_float(0.0f, 1.0f);
    }
    char path[PATH_CAP];
    SPCONV_ASSERT_OK(spconv_bin_write(NULL, in_dir(f, name, path), t));
    return t;
}

/* The outputs of `spconv voxelize` equal spconv_voxelize on the same points; centres.pcd holds
 * the voxel centres, the means and the counts. */
static void test_voxelize_outputs(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    spconv_tensor *points = write_scan(f, "scan.bin", spconv_test_rand_int(1000, 20000));
    char scan[PATH_CAP], out[PATH_CAP];
    const char *args[] = {"voxelize", in_dir(f, "scan.bin", scan), "--voxel-size", "0.2,0.2,0.25",
                          "--range", "0,-40,-3,70.4,40,1", "--max-points", "3", "--max-voxels",
                          "20000", "--threads", "2", "--out", in_dir(f, "out", out), NULL};
    assert_int_equal(spconv_tool_run(f, args), 0);
    assert_string_equal(f->err_text, "");
    const spconv_voxelize_params vp = {{0.2f, 0.2f, 0.25f}, {0, -40, -3, 70.4f, 40, 1}, 3, 20000,
                                       SPCONV_VOXELIZE_VOXELS | SPCONV_VOXELIZE_MEAN};
    spconv_voxels v;
    SPCONV_ASSERT_OK(spconv_voxelize(NULL, points, &vp, &v));
    const char *names[4] = {"coords.npy", "features.npy", "voxels.npy", "num_points.npy"};
    const spconv_tensor *want[4] = {v.coords, v.features, v.voxels, v.num_points};
    for (int i = 0; i < 4; ++i) {
        spconv_tensor *got = read_npy(f, "out", names[i]);
        assert_same_tensor(got, want[i]);
        spconv_tensor_release(got);
    }
    char line[128];
    snprintf(line, sizeof line, "voxels        %lld", (long long)spconv_tensor_size(v.coords, 0));
    assert_non_null(strstr(f->out_text, line));
    snprintf(line, sizeof line, "out of range %lld", (long long)v.stats.dropped_range);
    assert_non_null(strstr(f->out_text, line));
    assert_non_null(strstr(f->out_text, "grid          352 x 400 x 16"));
    /* centres.pcd: x, y, z of the centre, mean of each field, count */
    char pcd[PATH_CAP];
    spconv_test_join(out, "centres.pcd", pcd, PATH_CAP);
    size_t n = 0;
    char *bytes = spconv_test_read_bytes(pcd, &n);
    assert_non_null(bytes);
    spconv__pcd_header h;
    SPCONV_ASSERT_OK(spconv__pcd_check("test", pcd, bytes, n, n, &h));
    const int64_t M = spconv_tensor_size(v.coords, 0);
    assert_int_equal(h.points, M);
    assert_int_equal(h.values, 8);
    assert_non_null(strstr(bytes, "FIELDS x y z mean_x mean_y mean_z mean_intensity num_points\n"));
    const float *rows = (const float *)(bytes + h.data_offset);
    const int32_t *c = spconv_tensor_data(v.coords), *cnt = spconv_tensor_data(v.num_points);
    const float *mean = spconv_tensor_data(v.features);
    for (int64_t i = 0; i < M; ++i) {
        float row[8];
        memcpy(row, rows + i * 8, sizeof row);
        for (int a = 0; a < 3; ++a) {
            float centre = vp.range[a] + ((float)c[i * 3 + 2 - a] + 0.5f) * vp.voxel_size[a];
            assert_true(fabsf(row[a] - centre) < 1e-4f);
        }
        assert_memory_equal(row + 3, mean + i * 4, 4 * sizeof(float));
        assert_true(row[7] == (float)cnt[i]);
    }
    free(bytes);
    spconv_voxels_release(&v);
    spconv_tensor_release(points);
}

/* Without --out only the summary is printed; the project's sample scan works as input. */
static void test_voxelize_sample_scan(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    char sample[PATH_CAP];
    snprintf(sample, sizeof sample, "%s", __FILE__);
    char *slash = strrchr(sample, '/');
    assert_non_null(slash);
    snprintf(slash, sizeof sample - (size_t)(slash - sample), "/../data/sample_scan.bin");
    const char *args[] = {"voxelize", sample, "--voxel-size", "0.05,0.05,0.1", "--range",
                          "0,-40,-3,70.4,40,1", NULL};
    assert_int_equal(spconv_tool_run(f, args), 0);
    assert_non_null(strstr(f->out_text, "points read   100791")); /* data/README.md */
    assert_non_null(strstr(f->out_text, "grid          1408 x 1600 x 40"));
    assert_int_equal(spconv_test_count_entries(f->dir), 2); /* stdout.txt and stderr.txt */
}

/* --device cuda writes the CPU's files byte for byte (when a device, or the emulation, is
 * there); a device that is not there, or a bad name, is one line and exit status 2. */
static void test_voxelize_device(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    spconv_tensor_release(write_scan(f, "scan.bin", spconv_test_rand_int(1000, 20000)));
    char scan[PATH_CAP], out_cpu[PATH_CAP], out_gpu[PATH_CAP];
    in_dir(f, "scan.bin", scan);
    const int devices = spconv_has_cuda() ? spconv_cuda_device_count() : 0;
    if (devices > 0) {
        const char *on_cpu[] = {"voxelize", scan, "--voxel-size", "0.2,0.2,0.25", "--range",
                                "0,-40,-3,70.4,40,1", "--max-points", "3", "--out",
                                in_dir(f, "cpu", out_cpu), NULL};
        const char *on_gpu[] = {"voxelize", scan, "--voxel-size", "0.2,0.2,0.25", "--range",
                                "0,-40,-3,70.4,40,1", "--max-points", "3", "--device", "cuda:0",
                                "--out", in_dir(f, "gpu", out_gpu), NULL};
        assert_int_equal(spconv_tool_run(f, on_cpu), 0);
        assert_int_equal(spconv_tool_run(f, on_gpu), 0);
        const char *names[5] = {"coords.npy", "features.npy", "voxels.npy", "num_points.npy",
                                "centres.pcd"};
        for (int i = 0; i < 5; ++i) {
            char a[PATH_CAP], b[PATH_CAP];
            size_t na, nb;
            char *x = spconv_test_read_bytes(spconv_test_join(out_cpu, names[i], a, PATH_CAP), &na);
            char *y = spconv_test_read_bytes(spconv_test_join(out_gpu, names[i], b, PATH_CAP), &nb);
            assert_non_null(x);
            assert_non_null(y);
            assert_int_equal(na, nb);
            assert_memory_equal(x, y, na);
            free(x);
            free(y);
        }
    }
    char missing[32];
    snprintf(missing, sizeof missing, "cuda:%d", devices);
    const char *absent[] = {"voxelize", scan, "--voxel-size", "1,1,1", "--range", "0,0,0,9,9,9",
                            "--device", missing, NULL};
    spconv_tool_expect_usage_error(f, absent, spconv_has_cuda() ? "no CUDA device"
                                                                : "has no CUDA backend");
    const char *bad[] = {"voxelize", scan, "--voxel-size", "1,1,1", "--range", "0,0,0,9,9,9",
                         "--device", "gpu0", NULL};
    spconv_tool_expect_usage_error(f, bad, "expected cpu, cuda or cuda:N");
}

static void test_info(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    spconv_tensor *points = write_scan(f, "scan.pcd.bin", 0);
    spconv_tensor_release(points);
    points = write_scan(f, "cloud.pcd.bin", 10);
    spconv_tensor_release(points);
    char path[PATH_CAP];
    /* 10 KITTI points (40 floats) read as nuScenes records (5 floats): 8 points */
    const char *args[] = {"info", in_dir(f, "cloud.pcd.bin", path), NULL};
    assert_int_equal(spconv_tool_run(f, args), 0);
    assert_non_null(strstr(f->out_text, "nuScenes .bin, 5 float32 per point"));
    assert_non_null(strstr(f->out_text, "points        8 (0 NaN/inf dropped)"));
    assert_non_null(strstr(f->out_text, "fields        x y z intensity ring"));
    assert_non_null(strstr(f->out_text, "bounds        x ["));
    const char *four[] = {"info", path, "--columns", "4", NULL};
    assert_int_equal(spconv_tool_run(f, four), 0);
    assert_non_null(strstr(f->out_text, "points        10 (0 NaN/inf dropped)"));
    const char *empty[] = {"info", in_dir(f, "scan.pcd.bin", path), NULL};
    assert_int_equal(spconv_tool_run(f, empty), 0);
    assert_non_null(strstr(f->out_text, "points        0"));
}

static void test_errors(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    spconv_tensor_release(write_scan(f, "scan.bin", 100));
    char scan[PATH_CAP], out[PATH_CAP], cut[PATH_CAP];
    in_dir(f, "scan.bin", scan);
    in_dir(f, "out", out);
    const char *missing[] = {"voxelize", in_dir(f, "nope.bin", cut), "--voxel-size", "1,1,1",
                             "--range", "0,0,0,1,1,1", "--out", out, NULL};
    spconv_tool_expect_usage_error(f, missing, "cannot open");
    const char *size0[] = {"voxelize", scan, "--voxel-size", "0,1,1", "--range", "0,0,0,1,1,1", NULL};
    spconv_tool_expect_usage_error(f, size0,
                                   "spconv voxelize: --voxel-size: x = 0 must be positive");
    const char *negative[] = {"voxelize", scan, "--voxel-size", "1,1,-0.5", "--range",
                              "0,0,0,1,1,1", NULL};
    spconv_tool_expect_usage_error(f, negative, "--voxel-size: z = -0.5 must be positive");
    const char *range[] = {"voxelize", scan, "--voxel-size", "1,1,1", "--range", "0,5,0,1,1,1", NULL};
    spconv_tool_expect_usage_error(f, range,
                                   "--range '0,5,0,1,1,1': YMIN 5 must be less than YMAX 1");
    const char *range_x[] = {"voxelize", scan, "--voxel-size", "1,1,1", "--range",
                             "70,-40,-3,0,40,1", NULL};
    spconv_tool_expect_usage_error(f, range_x,
                                   "--range '70,-40,-3,0,40,1': XMIN 70 must be less than XMAX 0");
    const char *huge[] = {"voxelize", scan, "--voxel-size", "1e-9,1,1", "--range", "0,0,0,100,1,1", NULL};
    spconv_tool_expect_usage_error(f, huge, "more than int32 coordinates hold");
    const char *points0[] = {"voxelize", scan, "--voxel-size", "1,1,1", "--range", "0,0,0,1,1,1",
                             "--max-points", "0", NULL};
    spconv_tool_expect_usage_error(f, points0, "--max-points");
    const char *nosize[] = {"voxelize", scan, "--range", "0,0,0,1,1,1", NULL};
    spconv_tool_expect_usage_error(f, nosize, "--voxel-size");
    const char *columns[] = {"voxelize", scan, "--voxel-size", "1,1,1", "--range", "0,0,0,1,1,1",
                             "--columns", "2", NULL};
    spconv_tool_expect_usage_error(f, columns, "--columns");
    char bytes[4 * 4 * 3 + 2] = {0};
    assert_int_equal(spconv_test_write_bytes(in_dir(f, "cut.bin", cut), bytes, sizeof bytes), 0);
    const char *truncated[] = {"voxelize", cut, "--voxel-size", "1,1,1", "--range", "0,0,0,1,1,1",
                               "--out", out, NULL};
    spconv_tool_expect_usage_error(f, truncated, "not a whole number of 16-byte records");
    const char *info[] = {"info", cut, NULL};
    spconv_tool_expect_usage_error(f, info, "truncated");
    /* --columns is judged in the CLI's words, before the file is even opened. */
    char pcd[PATH_CAP], line[3 * PATH_CAP];
    const char *columns_pcd[] = {"info", in_dir(f, "bunny.pcd", pcd), "--columns", "5", NULL};
    snprintf(line, sizeof line, "spconv info: --columns 5: only a .bin file takes a column count; "
             "'%s' is a PCD file", pcd);
    spconv_tool_expect_usage_error(f, columns_pcd, line);
    const char *columns_ply[] = {"voxelize", in_dir(f, "x.ply", pcd), "--voxel-size", "1,1,1",
                                 "--range", "0,0,0,1,1,1", "--columns", "4", NULL};
    spconv_tool_expect_usage_error(f, columns_ply, "/x.ply' is a PLY file");
    /* --out: a part of the path is a file; checked before the scan is read. */
    char under[PATH_CAP + 8];
    snprintf(under, sizeof under, "%s/sub", scan);
    const char *out_under_file[] = {"voxelize", in_dir(f, "never.bin", pcd), "--voxel-size",
                                    "1,1,1", "--range", "0,0,0,1,1,1", "--out", under, NULL};
    snprintf(line, sizeof line, "spconv voxelize: --out '%s': '%s' is a file, not a folder", under,
             scan);
    spconv_tool_expect_usage_error(f, out_under_file, line);
    assert_false(spconv_test_exists(out));
}

/* A --max-points that makes voxels.npy larger than the machine is refused with the size, exit 2,
 * before anything is allocated or written. */
static void test_voxelize_max_points_memory(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    /* 20000 points in 1 cm voxels: about 20000 voxels x 2^20 slots x 4 floats = 320 GiB. */
    spconv_tensor_release(write_scan(f, "scan.bin", 20000));
    char scan[PATH_CAP], out[PATH_CAP];
    const char *args[] = {"voxelize", in_dir(f, "scan.bin", scan), "--voxel-size", "0.01,0.01,0.01",
                          "--range", "-80,-80,-10,80,80,10", "--max-points", "1048576", "--out",
                          in_dir(f, "v5", out), NULL};
    spconv_tool_expect_usage_error(f, args, "spconv voxelize: --max-points 1048576: voxels.npy "
                                            "would be [M = ");
    assert_non_null(strstr(f->err_text, ", 1048576, 4] float32 = "));
    assert_non_null(strstr(f->err_text, "GiB, more than this "));
    assert_false(spconv_test_exists(out));
}


/* Valid PLY files that PCL's reader aborted the process on (a vertex list, an indented obj_info)
 * or printed lines of its own about (a face list it does not handle, beside our output): the tool
 * answers with its one line or its summary, and nothing else on stderr. */
static void test_ply_files_pcl_mishandled(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    char path[PATH_CAP];
    const char *xyz = "ply\nformat ascii 1.0\nelement vertex 2\nproperty float x\n"
                      "property float y\nproperty float z\n";
    char text[512];
    snprintf(text, sizeof text, "%sproperty list uchar int foo\nend_header\n1 2 3 1 5\n"
             "4 5 6 3 7 8 9\n", xyz);
    assert_int_equal(spconv_test_write_bytes(in_dir(f, "list.ply", path), text, strlen(text)), 0);
    const char *info[] = {"info", path, NULL};
    spconv_tool_expect_usage_error(f, info,
                                   "line 7: property list 'foo' in element 'vertex' is not "
                                   "supported");
    const char *voxelize[] = {"voxelize", path, "--voxel-size", "1,1,1", "--range", "0,0,0,9,9,9",
                              NULL};
    spconv_tool_expect_usage_error(f, voxelize, "property list 'foo'");
    snprintf(text, sizeof text, "ply\nformat ascii 1.0\n obj_info indented\nelement vertex 2\n"
             "property float x\nproperty float y\nproperty float z\nelement face 1\n"
             "property list uchar int vertex_indices\nend_header\n1 2 3\n4 5 6\n2 0 1\n");
    assert_int_equal(spconv_test_write_bytes(path, text, strlen(text)), 0);
    assert_int_equal(spconv_tool_run(f, info), 0);
    assert_non_null(strstr(f->out_text, "points        2 (0 NaN/inf dropped)"));
    assert_string_equal(f->err_text, "");
}

/* ASCII PCD values that PCL read as zeros or wrapped, with exit status 0. */
static void test_pcd_ascii_values_checked(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    char path[PATH_CAP];
    const char *text = "FIELDS x y z intensity\nSIZE 4 4 4 1\nTYPE F F F I\nPOINTS 2\n"
                       "DATA ascii\n1 2 3 4\n1 2 3 300\n";
    assert_int_equal(spconv_test_write_bytes(in_dir(f, "x.pcd", path), text, strlen(text)), 0);
    const char *info[] = {"info", path, NULL};
    spconv_tool_expect_usage_error(f, info, "line 7: field 'intensity' value '300' does not fit "
                                            "I1 (int8)");
    text = "FIELDS x y z\nPOINTS 2\nDATA ascii\n1 2 3\n1 two 3\n";
    assert_int_equal(spconv_test_write_bytes(path, text, strlen(text)), 0);
    spconv_tool_expect_usage_error(f, info, "line 5: field 'y' value 'two' is not a number");
}

/* A named pipe as any input: refused at once (it blocked the tool forever in fopen before; the
 * alarm ends this test instead of letting it hang). */
static void test_named_pipe_inputs(void **state) {
    fixture *f = spconv_tool_or_skip(state);
    alarm(120);
    char pipe[PATH_CAP], dir[PATH_CAP], file[PATH_CAP];
    assert_int_equal(mkfifo(in_dir(f, "scan.pcd", pipe), 0600), 0);
    const char *info[] = {"info", pipe, NULL};
    spconv_tool_expect_usage_error(f, info, "is not a regular file (a named pipe)");
    const char *voxelize[] = {"voxelize", pipe, "--voxel-size", "1,1,1", "--range", "0,0,0,9,9,9",
                              NULL};
    spconv_tool_expect_usage_error(f, voxelize, "is not a regular file (a named pipe)");
    const char *run[] = {"run", pipe, "--out", in_dir(f, "out", dir), NULL};
    spconv_tool_expect_usage_error(f, run, "is not a regular file (a named pipe)");
    assert_false(spconv_test_exists(dir));
    /* voxel files for `bench --input DIR`: regular indices, the features a pipe */
    assert_int_equal(mkdir(in_dir(f, "voxels", dir), 0700), 0);
    const int32_t row[4] = {0, 1, 2, 3};
    assert_int_equal(spconv_test_write_bytes(spconv_test_join(dir, "spconv_test_indices.i32", file,
                                                              PATH_CAP), row, sizeof row), 0);
    assert_int_equal(mkfifo(spconv_test_join(dir, "spconv_test_features.f32", file, PATH_CAP),
                            0600), 0);
    const char *bench[] = {"bench", "--net", "basic", "--input", dir, "--repeat", "1", NULL};
    spconv_tool_expect_usage_error(f, bench, "is not a regular file (a named pipe)");
    alarm(0);
}

int main(void) {
    spconv_test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_voxelize_outputs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_voxelize_sample_scan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_voxelize_device, setup, teardown),
        cmocka_unit_test_setup_teardown(test_info, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ply_files_pcl_mishandled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pcd_ascii_values_checked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_named_pipe_inputs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_voxelize_max_points_memory, setup, teardown),
    };
    return cmocka_run_group_tests_name("pointcloud_cli", tests, NULL, NULL);
}
