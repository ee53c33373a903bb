/* Point-cloud I/O: the real files of ../shared/data (checked against their README and, where the
 * format allows, against an independent parse in this file), .bin and PCD round trips on random
 * clouds, the conversion of PCL records of every field type, and every error path with its
 * status and message. */
#define _XOPEN_SOURCE 700

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/test_files.h"
#include "common/test_util.h"
#include "io/pointcloud_impl.h"
#include "io/pointcloud_pcd.h"
#include "io/pointcloud_pcl.h"
#include "io/pointcloud_ply.h"

#define PATH_CAP 1024

/* ---- a scratch folder per test --------------------------------------------------------------- */

static int setup(void **state) {
    char *dir = spconv_test_make_scratch("spconv_io");
    if (dir == NULL) return -1;
    *state = dir;
    return 0;
}

static int teardown(void **state) {
    char *dir = *state;
    int rc = spconv_test_remove_tree(dir);
    free(dir);
    return rc;
}

static const char *scratch_path(void **state, const char *name, char *buf) {
    return spconv_test_join((const char *)*state, name, buf, PATH_CAP);
}

static void write_text(const char *path, const char *text) {
    assert_int_equal(spconv_test_write_bytes(path, text, strlen(text)), 0);
}

/* ---- helpers ----------------------------------------------------------------------------- */

static spconv_point_cloud *read_cloud(const char *path, int bin_columns) {
    spconv_point_cloud *pc = NULL;
    SPCONV_ASSERT_OK(spconv_point_cloud_read(path, SPCONV_CLOUD_AUTO, bin_columns, &pc));
    assert_non_null(pc);
    return pc;
}

static void assert_fields(const spconv_point_cloud *pc, const char *const *names, int count) {
    assert_int_equal(spconv_point_cloud_num_fields(pc), count);
    assert_int_equal(spconv_tensor_size(spconv_point_cloud_points(pc), 1), count);
    for (int i = 0; i < count; ++i) {
        assert_string_equal(spconv_point_cloud_field_name(pc, i), names[i]);
        assert_int_equal(spconv_point_cloud_field_index(pc, names[i]), i);
    }
    assert_null(spconv_point_cloud_field_name(pc, count));
    assert_null(spconv_point_cloud_field_name(pc, -1));
}

static const float *cloud_data(const spconv_point_cloud *pc) {
    const spconv_tensor *t = spconv_point_cloud_points(pc);
    assert_int_equal(spconv_tensor_dtype(t), SPCONV_F32);
    assert_true(spconv_tensor_is_contiguous(t));
    return spconv_tensor_data(t);
}

/* A random cloud [rows, cols]; every row with index % nan_every == nan_every - 1 gets a
 * non-finite coordinate (nan_every = 0: none). */
static spconv_tensor *random_cloud(int64_t rows, int64_t cols, int64_t nan_every) {
    spconv_tensor *t = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_empty(spconv_cpu(), SPCONV_F32, 2, (int64_t[]){rows, cols}, &t));
    float *d = spconv_tensor_data(t);
    for (int64_t i = 0; i < rows * cols; ++i) d[i] = spconv_test_rand_float(-80.0f, 80.0f);
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    for (int64_t r = 0; nan_every > 0 && r < rows; ++r)
        if (r % nan_every == nan_every - 1)
            d[r * cols + spconv_test_rand_int(0, 2)] = bad[spconv_test_rand_int(0, 2)];
    return t;
}

/* The rows of @p expected with finite x, y, z must equal the cloud's rows bit for bit. */
static void assert_finite_rows_equal(const spconv_point_cloud *pc, const float *expected,
                                     int64_t rows, int64_t cols) {
    const float *got = cloud_data(pc);
    int64_t kept = 0;
    for (int64_t r = 0; r < rows; ++r) {
        const float *e = expected + r * cols;
        if (!isfinite(e[0]) || !isfinite(e[1]) || !isfinite(e[2])) continue;
        assert_memory_equal(got + kept * cols, e, (size_t)cols * sizeof *e);
        ++kept;
    }
    assert_int_equal(spconv_point_cloud_num_points(pc), kept);
    assert_int_equal(spconv_point_cloud_dropped_nonfinite(pc), rows - kept);
}

/* Path of a shared data file, or skip the test (the helper prints why). */
static char *data_file_or_skip(const char *name) {
    char *path = spconv_test_data_path(name);
    if (path == NULL) skip();
    return path;
}

/* Without PCL a binary PCD file must be refused as not supported; returns 1 in that case. PLY and
 * ASCII PCD are read in C, with or without PCL. */
static int refused_without_pcl(const char *path) {
    if (SPCONV_HAVE_PCL) return 0;
    size_t n = 0;
    char *bytes = spconv_test_read_bytes(path, &n);
    assert_non_null(bytes);
    int native = strncmp(bytes, "ply", 3) == 0 || strstr(bytes, "DATA ascii") != NULL;
    free(bytes);
    if (native) return 0;
    spconv_point_cloud *pc = NULL;
    SPCONV_ASSERT_FAILS(spconv_point_cloud_read(path, SPCONV_CLOUD_AUTO, 0, &pc),
                        SPCONV_ERR_NOT_SUPPORTED, "no PCL");
    assert_null(pc);
    return 1;
}

/* The shared data file @p name read through PCL, its path in *path; NULL (nothing to free) when
 * this build has no PCL and refused the file as it must. */
static spconv_point_cloud *read_pcl_data_file(const char *name, char **path) {
    *path = data_file_or_skip(name);
    if (refused_without_pcl(*path)) {
        free(*path);
        *path = NULL;
        return NULL;
    }
    return read_cloud(*path, 0);
}

/* ---- the shared data files: raw .bin scans against the file's own bytes ------------------- */

static void check_bin_file(const char *name, int64_t points, const char *const *names, int cols,
                           const char *detail) {
    char *path = data_file_or_skip(name);
    spconv_point_cloud *pc = read_cloud(path, 0);
    assert_int_equal(spconv_point_cloud_format(pc), SPCONV_CLOUD_BIN);
    assert_non_null(strstr(spconv_point_cloud_format_detail(pc), detail));
    assert_fields(pc, names, cols);
    assert_int_equal(spconv_point_cloud_num_points(pc) + spconv_point_cloud_dropped_nonfinite(pc),
                     points);
    size_t n = 0;
    float *raw = (float *)spconv_test_read_bytes(path, &n);
    assert_non_null(raw);
    assert_int_equal(n, (size_t)points * (size_t)cols * sizeof(float));
    assert_finite_rows_equal(pc, raw, points, cols);
    free(raw);
    spconv_point_cloud_destroy(pc);
    free(path);
}

static void test_kitti_bin(void **state) {
    (void)state;
    static const char *const names[] = {"x", "y", "z", "intensity"};
    check_bin_file("kitti_000008.bin", 17238, names, 4, "KITTI");
}

static void test_nuscenes_bin(void **state) {
    (void)state;
    static const char *const names[] = {"x", "y", "z", "intensity", "ring"};
    check_bin_file("nuscenes_lidar_top.pcd.bin", 34688, names, 5, "nuScenes");
}

static void test_benchmark_bin(void **state) {
    (void)state;
    static const char *const names[] = {"x", "y", "z", "intensity"};
    check_bin_file("spconv_benchmark_pc.bin", 198130, names, 4, "KITTI");
    /* The README gives the extent, rounded: x in [-74, 75], y in [-38, 61], z in [-1.1, 5.9]. */
    char *path = data_file_or_skip("spconv_benchmark_pc.bin");
    spconv_point_cloud *pc = read_cloud(path, 0);
    float lo[3], hi[3];
    SPCONV_ASSERT_OK(spconv_point_cloud_bounds(pc, lo, hi));
    const float want_lo[3] = {-74.0f, -38.0f, -1.1f}, want_hi[3] = {75.0f, 61.0f, 5.9f};
    for (int a = 0; a < 3; ++a) {
        assert_true(fabsf(lo[a] - want_lo[a]) <= 0.5f);
        assert_true(fabsf(hi[a] - want_hi[a]) <= 0.5f);
    }
    spconv_point_cloud_destroy(pc);
    free(path);
}

/* ---- the shared data files read through PCL ------------------------------------------------ */

/* bunny.pcd is ascii: parse its numbers here with strtof and compare every point. */
static void test_bunny_pcd(void **state) {
    (void)state;
    char *path = NULL;
    spconv_point_cloud *pc = read_pcl_data_file("bunny.pcd", &path);
    if (pc == NULL) return;
    static const char *const names[] = {"x", "y", "z"};
    assert_fields(pc, names, 3);
    assert_int_equal(spconv_point_cloud_num_points(pc), 397);
    assert_int_equal(spconv_point_cloud_format(pc), SPCONV_CLOUD_PCD);
    assert_non_null(strstr(spconv_point_cloud_format_detail(pc), "ascii"));
    size_t n = 0;
    char *text = spconv_test_read_bytes(path, &n);
    assert_non_null(text);
    char *cursor = strstr(text, "DATA ascii");
    assert_non_null(cursor);
    cursor += strlen("DATA ascii");
    const float *got = cloud_data(pc);
    for (int i = 0; i < 397 * 3; ++i) {
        char *end;
        float v = strtof(cursor, &end);
        assert_true(end != cursor);
        assert_true(v == got[i]);
        cursor = end;
    }
    free(text);
    spconv_point_cloud_destroy(pc);
    free(path);
}

static void test_cturtle_pcd(void **state) {
    (void)state;
    char *path = NULL;
    spconv_point_cloud *pc = read_pcl_data_file("cturtle.pcd", &path);
    if (pc == NULL) return;
    static const char *const names[] = {"x", "y", "z", "intensity"};
    assert_fields(pc, names, 4);
    assert_int_equal(spconv_point_cloud_num_points(pc) + spconv_point_cloud_dropped_nonfinite(pc),
                     167198);
    assert_non_null(strstr(spconv_point_cloud_format_detail(pc), "binary_compressed"));
    const float *d = cloud_data(pc);
    for (int64_t i = 0; i < spconv_point_cloud_num_points(pc) * 4; ++i) assert_true(isfinite(d[i]));
    spconv_point_cloud_destroy(pc);
    free(path);
}

/* office1.pcd: organized 640 x 480 with 52,744 NaN points; rgb unpacked into r, g, b bytes. */
static void test_office1_pcd(void **state) {
    (void)state;
    char *path = NULL;
    spconv_point_cloud *pc = read_pcl_data_file("office1.pcd", &path);
    if (pc == NULL) return;
    static const char *const names[] = {"x", "y", "z", "r", "g", "b"};
    assert_fields(pc, names, 6);
    int64_t width = 0, height = 0;
    spconv_point_cloud_layout(pc, &width, &height);
    assert_int_equal(width, 640);
    assert_int_equal(height, 480);
    assert_int_equal(spconv_point_cloud_dropped_nonfinite(pc), 52744);
    assert_int_equal(spconv_point_cloud_num_points(pc), 640 * 480 - 52744);
    const float *d = cloud_data(pc);
    for (int64_t i = 0; i < spconv_point_cloud_num_points(pc); ++i)
        for (int c = 3; c < 6; ++c) {
            float v = d[i * 6 + c];
            assert_true(v >= 0.0f && v <= 255.0f && v == floorf(v));
        }
    spconv_point_cloud_destroy(pc);
    free(path);
}

static void test_cube_ply(void **state) {
    (void)state;
    char *path = NULL;
    spconv_point_cloud *pc = read_pcl_data_file("cube.ply", &path);
    if (pc == NULL) return;
    static const char *const names[] = {"x", "y", "z"};
    assert_fields(pc, names, 3);
    assert_int_equal(spconv_point_cloud_num_points(pc), 24);
    assert_int_equal(spconv_point_cloud_format(pc), SPCONV_CLOUD_PLY);
    assert_non_null(strstr(spconv_point_cloud_format_detail(pc), "binary_little_endian"));
    spconv_point_cloud_destroy(pc);
    free(path);
}

/* ---- round trips --------------------------------------------------------------------------- */

static void test_bin_round_trip(void **state) {
    char path[PATH_CAP];
    for (int cols = 3; cols <= 7; ++cols) {
        int64_t rows = spconv_test_rand_int(0, 3000);
        spconv_tensor *t = random_cloud(rows, cols, spconv_test_rand_int(0, 9));
        scratch_path(state, "scan.bin", path);
        SPCONV_ASSERT_OK(spconv_bin_write(NULL, path, t));
        spconv_point_cloud *pc = read_cloud(path, cols);
        assert_finite_rows_equal(pc, spconv_tensor_data(t), rows, cols);
        if (cols == 4) {
            static const char *const names[] = {"x", "y", "z", "intensity"};
            assert_fields(pc, names, 4);
        }
        if (cols == 6) {
            static const char *const names[] = {"x", "y", "z", "f3", "f4", "f5"};
            assert_fields(pc, names, 6);
        }
        spconv_point_cloud_destroy(pc);
        spconv_tensor_release(t);
    }
    /* The column count from the name: ".pcd.bin" is nuScenes (5), other ".bin" KITTI (4). */
    spconv_tensor *t = random_cloud(20, 5, 0);
    SPCONV_ASSERT_OK(spconv_bin_write(NULL, scratch_path(state, "sweep.PCD.BIN", path), t));
    spconv_point_cloud *pc = read_cloud(path, 0);
    assert_int_equal(spconv_point_cloud_num_fields(pc), 5);
    assert_int_equal(spconv_point_cloud_num_points(pc), 20);
    spconv_point_cloud_destroy(pc);
    spconv_tensor_release(t);
}

/* A float64, transposed (non-contiguous) input is written as float32 rows. */
static void test_bin_write_any_layout(void **state) {
    char path[PATH_CAP];
    spconv_tensor *t = random_cloud(4, 50, 0), *tt = NULL, *d = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_transpose(t, 0, 1, &tt)); /* [50, 4] view */
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, tt, SPCONV_F64, &d));
    SPCONV_ASSERT_OK(spconv_bin_write(NULL, scratch_path(state, "t.bin", path), tt));
    spconv_point_cloud *pc = read_cloud(path, 4);
    const float *src = spconv_tensor_data(t), *got = cloud_data(pc);
    for (int r = 0; r < 50; ++r)
        for (int c = 0; c < 4; ++c) assert_true(got[r * 4 + c] == src[c * 50 + r]);
    spconv_point_cloud_destroy(pc);
    SPCONV_ASSERT_OK(spconv_bin_write(NULL, path, d));
    pc = read_cloud(path, 4);
    got = cloud_data(pc);
    for (int r = 0; r < 50; ++r)
        for (int c = 0; c < 4; ++c) assert_true(got[r * 4 + c] == src[c * 50 + r]);
    spconv_point_cloud_destroy(pc);
    spconv_tensor_release(d);
    spconv_tensor_release(tt);
    spconv_tensor_release(t);
}

/* Binary PCD written natively: its header passes the validator, PCL reads it back bit for bit. */
static void test_pcd_round_trip(void **state) {
    char path[PATH_CAP];
    static const char *const names[] = {"x", "y", "z", "intensity", "ring"};
    for (int round = 0; round < 4; ++round) {
        int64_t rows = spconv_test_rand_int(1, 5000);
        spconv_tensor *t = random_cloud(rows, 5, round == 0 ? 0 : spconv_test_rand_int(2, 9));
        scratch_path(state, "cloud.pcd", path);
        SPCONV_ASSERT_OK(spconv_pcd_write(NULL, path, t, names));
        size_t n = 0;
        char *bytes = spconv_test_read_bytes(path, &n);
        assert_non_null(bytes);
        spconv__pcd_header h;
        SPCONV_ASSERT_OK(spconv__pcd_check("test", path, bytes, n, n, &h));
        assert_int_equal(h.points, rows);
        assert_int_equal(h.data, SPCONV__PCD_BINARY);
        assert_int_equal(n - h.data_offset, (size_t)rows * 5 * sizeof(float));
        free(bytes);
        if (!refused_without_pcl(path)) {
            spconv_point_cloud *pc = read_cloud(path, 0);
            assert_fields(pc, names, 5);
            assert_finite_rows_equal(pc, spconv_tensor_data(t), rows, 5);
            spconv_point_cloud_destroy(pc);
        }
        spconv_tensor_release(t);
    }
}

/* Without names the columns are x, y, z, f3, ...; a cloud made in memory keeps its rows. */
static void test_pcd_default_names_and_create(void **state) {
    char path[PATH_CAP];
    spconv_tensor *t = random_cloud(30, 4, 3);
    spconv_point_cloud *made = NULL;
    SPCONV_ASSERT_OK(spconv_point_cloud_create(NULL, t, NULL, &made));
    static const char *const names[] = {"x", "y", "z", "f3"};
    assert_fields(made, names, 4);
    assert_int_equal(spconv_point_cloud_num_points(made), 30);
    assert_int_equal(spconv_point_cloud_format(made), SPCONV_CLOUD_AUTO);
    assert_string_equal(spconv_point_cloud_format_detail(made), "memory");
    SPCONV_ASSERT_OK(spconv_pcd_write(NULL, scratch_path(state, "d.pcd", path), t, NULL));
    if (!refused_without_pcl(path)) {
        spconv_point_cloud *pc = read_cloud(path, 0);
        assert_fields(pc, names, 4);
        assert_finite_rows_equal(pc, spconv_tensor_data(t), 30, 4);
        spconv_point_cloud_destroy(pc);
    }
    spconv_point_cloud_destroy(made);
    spconv_tensor_release(t);
}

/* bounds against a direct scan of the rows */
static void test_bounds(void **state) {
    (void)state;
    spconv_tensor *t = random_cloud(spconv_test_rand_int(1, 500), 4, 0);
    spconv_point_cloud *pc = NULL;
    SPCONV_ASSERT_OK(spconv_point_cloud_create(NULL, t, NULL, &pc));
    float lo[3], hi[3];
    SPCONV_ASSERT_OK(spconv_point_cloud_bounds(pc, lo, hi));
    const float *d = spconv_tensor_data(t);
    for (int a = 0; a < 3; ++a) {
        int hit_lo = 0, hit_hi = 0;
        for (int64_t r = 0; r < spconv_tensor_size(t, 0); ++r) {
            assert_true(d[r * 4 + a] >= lo[a] && d[r * 4 + a] <= hi[a]);
            hit_lo |= d[r * 4 + a] == lo[a];
            hit_hi |= d[r * 4 + a] == hi[a];
        }
        assert_true(hit_lo && hit_hi);
    }
    spconv_point_cloud_destroy(pc);
    spconv_tensor_release(t);
}

/* ---- PLY through PCL: colour properties and byte orders ----------------------------------- */

static void test_ply_ascii_colour(void **state) {
    char path[PATH_CAP];
    write_text(scratch_path(state, "c.ply", path),
               "ply\nformat ascii 1.0\ncomment made by test_io\nelement vertex 3\n"
               "property float x\nproperty float y\nproperty float z\nproperty uchar red\n"
               "property uchar green\nproperty uchar blue\nproperty float intensity\n"
               "end_header\n1 2 3 10 20 30 0.5\n-4 5.5 6 255 0 7 1\nnan 1 1 1 2 3 4\n");
    if (refused_without_pcl(path)) return;
    spconv_point_cloud *pc = read_cloud(path, 0);
    static const char *const names[] = {"x", "y", "z", "r", "g", "b", "intensity"};
    assert_fields(pc, names, 7);
    assert_int_equal(spconv_point_cloud_num_points(pc), 2);
    assert_int_equal(spconv_point_cloud_dropped_nonfinite(pc), 1);
    const float want[14] = {1, 2, 3, 10, 20, 30, 0.5f, -4, 5.5f, 6, 255, 0, 7, 1};
    assert_memory_equal(cloud_data(pc), want, sizeof want);
    assert_non_null(strstr(spconv_point_cloud_format_detail(pc), "PLY ascii"));
    spconv_point_cloud_destroy(pc);
}

static void put_be32(unsigned char *p, float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    for (int i = 0; i < 4; ++i) p[i] = (unsigned char)(bits >> (24 - 8 * i));
}

static void test_ply_big_endian(void **state) {
    char path[PATH_CAP];
    static const char header[] = "ply\nformat binary_big_endian 1.0\nelement vertex 2\n"
                                 "property float x\nproperty float y\nproperty float z\n"
                                 "end_header\n";
    const float values[6] = {1.5f, -2.25f, 1e-3f, 70.0f, 0.0f, -3.5f};
    unsigned char file[sizeof header - 1 + 24];
    memcpy(file, header, sizeof header - 1);
    for (int i = 0; i < 6; ++i) put_be32(file + sizeof header - 1 + 4 * i, values[i]);
    assert_int_equal(spconv_test_write_bytes(scratch_path(state, "be.ply", path), file, sizeof file), 0);
    if (refused_without_pcl(path)) return;
    spconv_point_cloud *pc = read_cloud(path, 0);
    assert_int_equal(spconv_point_cloud_num_points(pc), 2);
    assert_memory_equal(cloud_data(pc), values, sizeof values);
    spconv_point_cloud_destroy(pc);
}

/* ---- PCL records of every field type to float (plain C, runs without PCL too) ---------------- */

typedef struct raw_point {
    unsigned char bytes[36];
} raw_point;

/* Layout: x f32 @0, y f64 @4, z i16 @12, "_" padding @14, rgb u32 @16, normal f32 x3 @20,
 * label u8 @32, 3 padding bytes. */
static void put_raw_point(raw_point *p, float x, double y, int16_t z, uint32_t rgb,
                          const float normal[3], uint8_t label) {
    memset(p, 0xAB, sizeof *p);
    memcpy(p->bytes + 0, &x, 4);
    memcpy(p->bytes + 4, &y, 8);
    memcpy(p->bytes + 12, &z, 2);
    memcpy(p->bytes + 16, &rgb, 4);
    memcpy(p->bytes + 20, normal, 12);
    p->bytes[32] = label;
}

static const spconv__raw_field raw_fields[] = {
    {"x", SPCONV__F32, 0, 1},    {"y", SPCONV__F64, 4, 1},       {"z", SPCONV__I16, 12, 1},
    {"_", SPCONV__U8, 14, 2},    {"rgb", SPCONV__U32, 16, 1},    {"normal", SPCONV__F32, 20, 3},
    {"label", SPCONV__U8, 32, 1}};

static spconv__raw_cloud raw_cloud_of(const raw_point *points, uint64_t count) {
    spconv__raw_cloud raw = {(const unsigned char *)points, count * sizeof *points, count, 1,
                             sizeof *points, raw_fields, sizeof raw_fields / sizeof raw_fields[0],
                             NULL};
    return raw;
}

static void test_raw_convert_types(void **state) {
    (void)state;
    enum { N = 64 };
    raw_point points[N];
    float expected[N][10];
    int kept = 0;
    for (int i = 0; i < N; ++i) {
        float x = i % 7 == 3 ? NAN : spconv_test_rand_float(-50, 50);
        double y = spconv_test_rand_double(-1e3, 1e3);
        int16_t z = (int16_t)spconv_test_rand_int(-32768, 32767);
        uint32_t rgb = (uint32_t)spconv_test_rand_u64();
        float normal[3] = {spconv_test_rand_float(-1, 1), spconv_test_rand_float(-1, 1), 0.25f};
        uint8_t label = (uint8_t)spconv_test_rand_int(0, 255);
        put_raw_point(&points[i], x, y, z, rgb, normal, label);
        if (isnan(x)) continue;
        const float row[10] = {x, (float)y, (float)z, (float)((rgb >> 16) & 255),
                               (float)((rgb >> 8) & 255), (float)(rgb & 255), normal[0],
                               normal[1], normal[2], (float)label};
        memcpy(expected[kept++], row, sizeof row);
    }
    spconv__raw_cloud raw = raw_cloud_of(points, N);
    spconv_point_cloud *pc = NULL;
    SPCONV_ASSERT_OK(spconv__raw_cloud_convert("test", "mem", &raw, &pc));
    static const char *const names[] = {"x", "y", "z", "r", "g", "b",
                                        "normal_0", "normal_1", "normal_2", "label"};
    assert_fields(pc, names, 10);
    assert_int_equal(spconv_point_cloud_num_points(pc), kept);
    assert_int_equal(spconv_point_cloud_dropped_nonfinite(pc), N - kept);
    assert_memory_equal(cloud_data(pc), expected, (size_t)kept * sizeof expected[0]);
    spconv_point_cloud_destroy(pc);
}

static void test_raw_convert_errors(void **state) {
    (void)state;
    raw_point points[2];
    const float normal[3] = {0, 0, 1};
    put_raw_point(&points[0], 1, 2, 3, 0, normal, 1);
    put_raw_point(&points[1], 1, 2, 3, 0, normal, 1);
    spconv_point_cloud *pc = NULL;
    spconv__raw_cloud raw = raw_cloud_of(points, 2);
    raw.data_bytes = sizeof points - 1;
    SPCONV_ASSERT_FAILS(spconv__raw_cloud_convert("test", "mem", &raw, &pc), SPCONV_ERR_FORMAT,
                        "need more than");
    spconv__raw_field moved[7];
    memcpy(moved, raw_fields, sizeof moved);
    moved[5].offset = 30; /* normal: 12 bytes from 30 leave a 36-byte point */
    raw = raw_cloud_of(points, 2);
    raw.fields = moved;
    SPCONV_ASSERT_FAILS(spconv__raw_cloud_convert("test", "mem", &raw, &pc), SPCONV_ERR_FORMAT,
                        "field 'normal'");
    moved[5].offset = 20;
    moved[5].count = UINT64_MAX / 2; /* a count whose byte size overflows */
    SPCONV_ASSERT_FAILS(spconv__raw_cloud_convert("test", "mem", &raw, &pc), SPCONV_ERR_FORMAT,
                        "does not fit");
    moved[5].count = 3;
    moved[2].name = "zz";
    SPCONV_ASSERT_FAILS(spconv__raw_cloud_convert("test", "mem", &raw, &pc), SPCONV_ERR_FORMAT,
                        "no field 'z'");
    raw = raw_cloud_of(points, 2);
    raw.width = UINT64_MAX;
    raw.height = 3;
    SPCONV_ASSERT_FAILS(spconv__raw_cloud_convert("test", "mem", &raw, &pc), SPCONV_ERR_FORMAT,
                        "overflow");
    assert_null(pc);
}

/* ---- malformed PCD and PLY headers: the validator, and the reader in front of PCL ------------ */

/* @p text (+ @p extra binary bytes) must be refused with SPCONV_ERR_FORMAT and @p substring both
 * by the header check alone and by the reader (in builds without PCL too). */
static void expect_bad_file(void **state, const char *name, const char *text,
                            const void *extra, size_t extra_len, const char *substring) {
    char path[PATH_CAP];
    size_t n = strlen(text);
    char *bytes = malloc(n + extra_len + 1);
    assert_non_null(bytes);
    memcpy(bytes, text, n);
    if (extra_len > 0) memcpy(bytes + n, extra, extra_len);
    bytes[n + extra_len] = '\0';
    scratch_path(state, name, path);
    assert_int_equal(spconv_test_write_bytes(path, bytes, n + extra_len), 0);
    int is_pcd = strstr(name, ".pcd") != NULL;
    if (is_pcd) {
        spconv__pcd_header h;
        SPCONV_ASSERT_FAILS(spconv__pcd_check("check", path, bytes, n + extra_len, n + extra_len, &h),
                            SPCONV_ERR_FORMAT, substring);
    } else {
        spconv__ply_header h;
        SPCONV_ASSERT_FAILS(spconv__ply_check("check", path, bytes, n + extra_len, n + extra_len, &h),
                            SPCONV_ERR_FORMAT, substring);
    }
    free(bytes);
    /* with or without PCL: the header is checked before anything needs PCL */
    spconv_point_cloud *pc = NULL;
    SPCONV_ASSERT_FAILS(spconv_point_cloud_read(path, SPCONV_CLOUD_AUTO, 0, &pc), SPCONV_ERR_FORMAT,
                        substring);
    SPCONV_ASSERT_ERROR_CONTAINS(path);
    assert_null(pc);
}

#define PCD_XYZ "VERSION 0.7\nFIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nCOUNT 1 1 1\n"

static void test_pcd_header_lies(void **state) {
    float data[30] = {0};
    expect_bad_file(state, "points.pcd", PCD_XYZ "WIDTH 1000\nHEIGHT 1\nPOINTS 1000\nDATA binary\n",
                    data, sizeof data, "only 120 bytes follow");
    expect_bad_file(state, "wh.pcd", PCD_XYZ "WIDTH 10\nHEIGHT 2\nPOINTS 10\nDATA binary\n", data,
                    sizeof data, "WIDTH 10 x HEIGHT 2 != POINTS 10");
    expect_bad_file(state, "huge.pcd",
                    PCD_XYZ "WIDTH 4294967295\nHEIGHT 1\nPOINTS 4294967295\nDATA binary\n", data,
                    sizeof data, "more than PCL can index");
    expect_bad_file(state, "toobig.pcd", PCD_XYZ "WIDTH 99999999999\nHEIGHT 1\nPOINTS 1\nDATA binary\n",
                    data, sizeof data, "needs one count");
    expect_bad_file(state, "negative.pcd", PCD_XYZ "WIDTH -5\nHEIGHT 1\nPOINTS -5\nDATA binary\n",
                    data, sizeof data, "needs one count");
    expect_bad_file(state, "ascii.pcd", PCD_XYZ "WIDTH 50\nHEIGHT 1\nPOINTS 50\nDATA ascii\n1 2 3\n",
                    NULL, 0, "cannot hold them");
    /* binary_compressed: two little-endian uint32 sizes, then the LZF block */
    const uint32_t claims_more[2] = {1000, 10 * 12};
    expect_bad_file(state, "lzf1.pcd",
                    PCD_XYZ "WIDTH 10\nHEIGHT 1\nPOINTS 10\nDATA binary_compressed\n", claims_more,
                    sizeof claims_more, "claims 1000 bytes");
    const uint32_t wrong_size[4] = {8, 64, 0, 0};
    expect_bad_file(state, "lzf2.pcd",
                    PCD_XYZ "WIDTH 10\nHEIGHT 1\nPOINTS 10\nDATA binary_compressed\n", wrong_size,
                    sizeof wrong_size, "unpacks to 64 bytes");
    expect_bad_file(state, "lzf3.pcd",
                    PCD_XYZ "WIDTH 10\nHEIGHT 1\nPOINTS 10\nDATA binary_compressed\n", "abc", 3,
                    "ends before the sizes");
}

static void test_pcd_header_malformed(void **state) {
    float data[3] = {1, 2, 3};
    const char *tail = "WIDTH 1\nHEIGHT 1\nPOINTS 1\nDATA binary\n";
    char text[512];
    snprintf(text, sizeof text, "FIELDS x y z\nSIZE 4 4\nTYPE F F F\n%s", tail);
    expect_bad_file(state, "size.pcd", text, data, sizeof data, "differs from the number of FIELDS");
    snprintf(text, sizeof text, "FIELDS x y z\nSIZE 4 4 2\nTYPE F F F\n%s", tail);
    expect_bad_file(state, "type.pcd", text, data, sizeof data, "a TYPE must be");
    snprintf(text, sizeof text, "FIELDS x y z\nSIZE 4 4 3\nTYPE F F F\n%s", tail);
    expect_bad_file(state, "size3.pcd", text, data, sizeof data, "a SIZE must be 1, 2, 4 or 8");
    snprintf(text, sizeof text, "FIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nCOUNT 1 0 1\n%s", tail);
    expect_bad_file(state, "count.pcd", text, data, sizeof data, "a COUNT must be");
    snprintf(text, sizeof text, "FIELDS x y z\nFIELDS x y z\n%s", tail);
    expect_bad_file(state, "twice.pcd", text, data, sizeof data, "repeated or out of order");
    snprintf(text, sizeof text, "FIELDS x y z\nPOINTS 1\nSIZE 4 4 4\nDATA binary\n");
    expect_bad_file(state, "order.pcd", text, data, sizeof data, "repeated or out of order");
    snprintf(text, sizeof text, "SIZE 4 4 4\n%s", tail);
    expect_bad_file(state, "nofields.pcd", text, data, sizeof data, "without FIELDS before it");
    snprintf(text, sizeof text, "FIELDS x y z\nTYPE F F F\n%s", tail);
    expect_bad_file(state, "nosize.pcd", text, data, sizeof data, "TYPE needs SIZE");
    snprintf(text, sizeof text, "FIELDS x y z\nBOGUS 1\n%s", tail);
    expect_bad_file(state, "keyword.pcd", text, data, sizeof data, "unknown keyword");
    snprintf(text, sizeof text, "FIELDS x y w\nSIZE 4 4 4\nTYPE F F F\n%s", tail);
    expect_bad_file(state, "noz.pcd", text, data, sizeof data, "no field 'z'");
    snprintf(text, sizeof text, "FIELDS x y z\nVIEWPOINT 0 0 0 1 0 0\n%s", tail);
    expect_bad_file(state, "view.pcd", text, data, sizeof data, "needs 7 numbers");
    snprintf(text, sizeof text, "FIELDS x y z\nWIDTH 1\nPOINTS 1\nDATA zipped\n");
    expect_bad_file(state, "data.pcd", text, data, sizeof data, "needs one of ascii");
    expect_bad_file(state, "nodata.pcd", "FIELDS x y z\nWIDTH 1\nPOINTS 1\n", NULL, 0,
                    "no DATA line");
    expect_bad_file(state, "empty.pcd", "", NULL, 0, "no DATA line in the first 0 bytes");
    expect_bad_file(state, "nopoints.pcd", "FIELDS x y z\nWIDTH 1\nDATA ascii\n1 2 3\n", NULL, 0,
                    "lacks POINTS");
    /* PCL reads on past DATA while lines look like header lines (found by fuzz_pcd) */
    const char keyword_data[] = "COLUMNS a b\n\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c";
    expect_bad_file(state, "after.pcd", "FIELDS x y z\nPOINTS 1\nDATA binary\n", keyword_data,
                    sizeof keyword_data - 1, "PCL would read as more header");
    /* PCL ends its header at a line of white space (found by fuzz_pcd: PCL then crashed) */
    expect_bad_file(state, "blank.pcd", "# .PCD\n\r\r\nFIELDS x y z\nPOINTS 1\nDATA ascii\n1 2 3\n",
                    NULL, 0, "a line of only white space");
    char binary_junk[64];
    for (size_t i = 0; i < sizeof binary_junk; ++i) binary_junk[i] = (char)(i * 37 + 1);
    expect_bad_file(state, "junk.pcd", "", binary_junk, sizeof binary_junk, "header line 1");
}

#define PLY_HEAD "ply\nformat binary_little_endian 1.0\n"

static void test_ply_header_errors(void **state) {
    float data[6] = {0};
    expect_bad_file(state, "noz.ply",
                    PLY_HEAD "element vertex 2\nproperty float x\nproperty float y\n"
                             "property float w\nend_header\n",
                    data, sizeof data, "no vertex property 'z'");
    expect_bad_file(state, "novertex.ply",
                    PLY_HEAD "element point 2\nproperty float x\nproperty float y\n"
                             "property float z\nend_header\n",
                    data, sizeof data, "no vertex element");
    expect_bad_file(state, "absurd.ply",
                    PLY_HEAD "element vertex 2000000000\nproperty float x\nproperty float y\n"
                             "property float z\nend_header\n",
                    data, sizeof data, "need at least 24000000000 bytes");
    expect_bad_file(state, "faces.ply",
                    PLY_HEAD "element vertex 2\nproperty float x\nproperty float y\n"
                             "property float z\nelement face 100\nproperty list uchar int v\n"
                             "end_header\n",
                    data, sizeof data, "only 24 bytes follow");
    expect_bad_file(state, "count.ply",
                    PLY_HEAD "element vertex 4294967296\nproperty float x\nend_header\n", data,
                    sizeof data, "count in [0, 2^31)");
    expect_bad_file(state, "type.ply",
                    PLY_HEAD "element vertex 2\nproperty float128 x\nend_header\n", data,
                    sizeof data, "unknown property type");
    expect_bad_file(state, "list.ply",
                    PLY_HEAD "element vertex 2\nproperty list float int x\nend_header\n", data,
                    sizeof data, "integer count type");
    expect_bad_file(state, "magic.ply", "plyx\nformat ascii 1.0\n", NULL, 0,
                    "does not start with the line 'ply'");
    expect_bad_file(state, "empty.ply", "", NULL, 0, "does not start with the line 'ply'");
    expect_bad_file(state, "noformat.ply", "ply\nelement vertex 1\nend_header\n", NULL, 0,
                    "an element before the format line");
    expect_bad_file(state, "version.ply", "ply\nformat ascii 2.0\nend_header\n", NULL, 0,
                    "needs 'format");
    expect_bad_file(state, "noend.ply",
                    PLY_HEAD "element vertex 1\nproperty float x\n", NULL, 0, "no end_header");
    expect_bad_file(state, "ascii.ply",
                    "ply\nformat ascii 1.0\nelement vertex 5\nproperty float x\nproperty float y\n"
                    "property float z\nend_header\n1 2 3\n",
                    NULL, 0, "ascii data");
}


/* ---- the reader parses the bytes it checked ------------------------------------------------- */

/* Every PCD/PLY file of the shared data read from its path, and from its bytes handed to the
 * reader under the path of a different file: both give the same cloud, so what is parsed is the
 * buffer that was checked, never the path opened again (as PCL once did after the check). */
static void test_parse_the_checked_bytes(void **state) {
    static const char *const files[] = {"bunny.pcd", "cturtle.pcd", "office1.pcd", "cube.ply"};
    char decoy[PATH_CAP];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; ++i) {
        char *path = spconv_test_data_path(files[i]);
        if (path == NULL) continue;
        if (refused_without_pcl(path)) {
            free(path);
            continue;
        }
        spconv_point_cloud *from_path = read_cloud(path, 0);
        size_t n = 0;
        char *bytes = spconv_test_read_bytes(path, &n);
        assert_non_null(bytes);
        const int ply = strstr(files[i], ".ply") != NULL;
        /* the decoy is a valid file of the same format with one other point */
        write_text(scratch_path(state, ply ? "decoy.ply" : "decoy.pcd", decoy),
                   ply ? "ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\n"
                         "property float y\nproperty float z\nend_header\n9 9 9\n"
                       : "FIELDS x y z\nPOINTS 1\nDATA ascii\n9 9 9\n");
        spconv_point_cloud *from_bytes = NULL;
        SPCONV_ASSERT_OK(spconv__cloud_read_text("test", decoy, ply ? SPCONV_CLOUD_PLY
                                                                    : SPCONV_CLOUD_PCD,
                                                 bytes, n, &from_bytes));
        const int fields = spconv_point_cloud_num_fields(from_path);
        assert_int_equal(spconv_point_cloud_num_fields(from_bytes), fields);
        for (int f = 0; f < fields; ++f)
            assert_string_equal(spconv_point_cloud_field_name(from_bytes, f),
                                spconv_point_cloud_field_name(from_path, f));
        const int64_t rows = spconv_point_cloud_num_points(from_path);
        assert_true(rows > 1);
        assert_int_equal(spconv_point_cloud_num_points(from_bytes), rows);
        assert_int_equal(spconv_point_cloud_dropped_nonfinite(from_bytes),
                         spconv_point_cloud_dropped_nonfinite(from_path));
        assert_memory_equal(cloud_data(from_bytes), cloud_data(from_path),
                            (size_t)rows * (size_t)fields * sizeof(float));
        assert_string_equal(spconv_point_cloud_format_detail(from_bytes),
                            spconv_point_cloud_format_detail(from_path));
        spconv_point_cloud_destroy(from_bytes);
        spconv_point_cloud_destroy(from_path);
        free(bytes);
        free(path);
    }
}

/* PCL's own rejection (here a header our check would have refused first: WIDTH x HEIGHT !=
 * POINTS) is our one message, and PCL prints nothing: the CLI's contract is one line on stderr. */
static void test_pcl_rejection_is_silent(void **state) {
#if !SPCONV_HAVE_PCL
    (void)state;
    skip();
#else
    char path[PATH_CAP];
    scratch_path(state, "stderr.txt", path);
    static const char text[] = "FIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nWIDTH 3\nHEIGHT 1\n"
                               "POINTS 5\nDATA binary\n0123456789012345678901234567890123456789"
                               "01234567890123456789";
    const char *data = strstr(text, "DATA binary\n") + strlen("DATA binary\n");
    fflush(stderr);
    int saved = dup(2);
    FILE *capture = fopen(path, "w");
    assert_true(saved >= 0 && capture != NULL);
    assert_true(dup2(fileno(capture), 2) >= 0);
    spconv__raw_cloud raw;
    spconv_status st = spconv__pcl_read_pcd("test", "mem.pcd", text, sizeof text - 1,
                                            (uint64_t)(data - text), &raw);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fclose(capture);
    SPCONV_ASSERT_STATUS(st, SPCONV_ERR_FORMAT);
    SPCONV_ASSERT_ERROR_CONTAINS("PCL's PCD reader rejected its header of 'mem.pcd'");
    size_t n = 1;
    char *printed = spconv_test_read_bytes(path, &n);
    assert_non_null(printed);
    assert_int_equal(n, 0);
    free(printed);
#endif
}

/* cube.ply (binary, with a face list the reader skips): the vertices are the floats right after
 * end_header. */
static void test_cube_ply_values(void **state) {
    (void)state;
    char *path = data_file_or_skip("cube.ply");
    spconv_point_cloud *pc = read_cloud(path, 0);
    size_t n = 0;
    char *bytes = spconv_test_read_bytes(path, &n);
    assert_non_null(bytes);
    const char *end = strstr(bytes, "end_header\n");
    assert_non_null(end);
    end += strlen("end_header\n");
    assert_true((size_t)(end - bytes) + 24 * 12 <= n);
    assert_memory_equal(cloud_data(pc), end, 24 * 12);
    free(bytes);
    spconv_point_cloud_destroy(pc);
    free(path);
}

/* ---- inputs that are not regular files: refused at once, never waited on -------------------- */

static void expect_not_regular(const char *path, const char *kind) {
    spconv_point_cloud *pc = NULL;
    SPCONV_ASSERT_FAILS(spconv_point_cloud_read(path, SPCONV_CLOUD_AUTO, 0, &pc), SPCONV_ERR_IO,
                        kind);
    SPCONV_ASSERT_ERROR_CONTAINS("is not a regular file");
    SPCONV_ASSERT_ERROR_CONTAINS(path);
    assert_null(pc);
    for (int f = SPCONV_CLOUD_BIN; f <= SPCONV_CLOUD_PLY; ++f)
        SPCONV_ASSERT_FAILS(spconv_point_cloud_read(path, (spconv_cloud_format)f, 0, &pc),
                            SPCONV_ERR_IO, kind);
    spconv_tensor *t = NULL;
    SPCONV_ASSERT_FAILS(spconv_npy_read(path, &t), SPCONV_ERR_IO, kind);
    SPCONV_ASSERT_ERROR_CONTAINS("is not a regular file");
    assert_null(t);
}

/* A named pipe without a writer made every reader block forever in fopen(); the alarm turns that
 * hang into a failure of this test (SIGALRM ends the program). */
static void test_non_regular_inputs(void **state) {
    char path[PATH_CAP];
    alarm(60);
    static const char *const pipes[] = {"pipe.bin", "pipe.pcd.bin", "pipe.pcd", "pipe.ply",
                                        "pipe.npy", "pipe"};
    for (size_t i = 0; i < sizeof pipes / sizeof pipes[0]; ++i) {
        assert_int_equal(mkfifo(scratch_path(state, pipes[i], path), 0600), 0);
        expect_not_regular(path, "(a named pipe)");
    }
    expect_not_regular("/dev/null", "(a character device)");
    if (access("/dev/zero", R_OK) == 0) expect_not_regular("/dev/zero", "(a character device)");
    expect_not_regular((const char *)*state, "(a directory)");
    alarm(0);
}

/* ---- ASCII data: every value parses and fits, every line has its values ---------------------- */

/* Reading @p text (as a file @p name) must fail with SPCONV_ERR_FORMAT and @p substring, whose
 * path the message names. */
static void expect_read_fails(void **state, const char *name, const char *text,
                              const char *substring) {
    char path[PATH_CAP];
    write_text(scratch_path(state, name, path), text);
    spconv_point_cloud *pc = NULL;
    SPCONV_ASSERT_FAILS(spconv_point_cloud_read(path, SPCONV_CLOUD_AUTO, 0, &pc), SPCONV_ERR_FORMAT,
                        substring);
    SPCONV_ASSERT_ERROR_CONTAINS(path);
    assert_null(pc);
}

#define PCD_XYZI(points)                                                                       \
    "VERSION 0.7\nFIELDS x y z intensity\nSIZE 4 4 4 1\nTYPE F F F I\nCOUNT 1 1 1 1\nWIDTH " \
    points "\nHEIGHT 1\nPOINTS " points "\nDATA ascii\n"

static void test_pcd_ascii_errors(void **state) {
    /* the header is 9 lines: the first point is line 10 */
    expect_read_fails(state, "int8.pcd", PCD_XYZI("3") "1 2 3 4\n1 2 3 4\n1 2 3 300\n",
                      "line 12: field 'intensity' value '300' does not fit I1 (int8)");
    expect_read_fails(state, "int8neg.pcd", PCD_XYZI("2") "1 2 3 -129\n1 2 3 4\n",
                      "line 10: field 'intensity' value '-129' does not fit I1 (int8)");
    expect_read_fails(state, "garbage.pcd", PCD_XYZI("2") "1 2 3 4\n1 abc 3 4\n",
                      "line 11: field 'y' value 'abc' is not a number of type F4 (float32)");
    expect_read_fails(state, "trail.pcd", PCD_XYZI("2") "1 2 3 4\n1 2x 3 4\n",
                      "line 11: field 'y' value '2x' is not a number");
    expect_read_fails(state, "real.pcd", PCD_XYZI("2") "1 2 3 4\n1 2 3 4.5\n",
                      "field 'intensity' value '4.5' is not an integer of type I1 (int8)");
    expect_read_fails(state, "short.pcd", PCD_XYZI("3") "1 2 3 4\n1 2 3\n1 2 3 4\n1 2 3 4\n",
                      "line 11 has 3 values but a point has 4");
    expect_read_fails(state, "long.pcd", PCD_XYZI("2") "1 2 3 4 5\n1 2 3 4\n",
                      "line 10 has 5 values but a point has 4");
    expect_read_fails(state, "few.pcd", PCD_XYZI("3") "1 2 3 4\n\n1000 2000 3000 4\n",
                      "has 2 point lines after DATA ascii but POINTS is 3");
    expect_read_fails(state, "many.pcd", PCD_XYZI("1") "1 2 3 4\n1 2 3 4\n",
                      "line 11: one point more than POINTS 1");
    expect_read_fails(state, "f4.pcd", PCD_XYZI("1") "1 1e39 3 4\n",
                      "field 'y' value '1e39' does not fit F4 (float32)");
    const char *types = "FIELDS x y z u1 u2 i2 u4 i4 u8 i8 f8 b\nSIZE 4 4 4 1 2 2 4 4 8 8 8 1\n"
                        "TYPE F F F U U I U I U I F B\nPOINTS 1\nDATA ascii\n";
    static const struct {
        const char *values, *message;
    } bad[] = {
        {"1 2 3 -1 0 0 0 0 0 0 0 0", "field 'u1' value '-1' does not fit U1 (uint8)"},
        {"1 2 3 256 0 0 0 0 0 0 0 0", "field 'u1' value '256' does not fit U1 (uint8)"},
        {"1 2 3 0 65536 0 0 0 0 0 0 0", "field 'u2' value '65536' does not fit U2 (uint16)"},
        {"1 2 3 0 0 32768 0 0 0 0 0 0", "field 'i2' value '32768' does not fit I2 (int16)"},
        {"1 2 3 0 0 0 4294967296 0 0 0 0 0", "value '4294967296' does not fit U4 (uint32)"},
        {"1 2 3 0 0 0 0 -2147483649 0 0 0 0", "value '-2147483649' does not fit I4 (int32)"},
        {"1 2 3 0 0 0 0 0 18446744073709551616 0 0 0", "does not fit U8 (uint64)"},
        {"1 2 3 0 0 0 0 0 0 9223372036854775808 0 0", "does not fit I8 (int64)"},
        {"1 2 3 0 0 0 0 0 0 0 1e309 0", "field 'f8' value '1e309' does not fit F8 (float64)"},
        {"1 2 3 0 0 0 0 0 0 0 0 2", "field 'b' value '2' is not 0 or 1 for B1 (bool)"},
        {"1 2 3 0x10 0 0 0 0 0 0 0 0", "field 'u1' value '0x10' is not an integer"},
        {"1 2 3 0 0 0 0 0 0 0 nan nan", "field 'b' value 'nan' is not 0 or 1"},
        {"1 2 3 nan 0 0 0 0 0 0 0 0", "field 'u1' value 'nan' is not an integer"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        char text[512];
        snprintf(text, sizeof text, "%s%s\n", types, bad[i].values);
        expect_read_fails(state, "types.pcd", text, bad[i].message);
        SPCONV_ASSERT_ERROR_CONTAINS("line 6:");
    }
    expect_read_fails(state, "count.pcd",
                      "FIELDS x y z n\nSIZE 4 4 4 4\nTYPE F F F F\nCOUNT 1 1 1 3\nPOINTS 1\n"
                      "DATA ascii\n1 2 3 0 1 x\n", "line 7: field 'n[2]' value 'x' is not a number");
}

static void test_pcd_ascii_values(void **state) {
    char path[PATH_CAP];
    write_text(scratch_path(state, "ok.pcd", path),
               "FIELDS x y z u8 i8 f8 b n\nSIZE 4 4 4 8 8 8 1 2\nTYPE F F F U I F B I\n"
               "COUNT 1 1 1 1 1 1 1 2\nPOINTS 4\nDATA ascii\n"
               "1 -2.5 +3 18446744073709551615 -9223372036854775808 1e-300 1 -32768 32767\n"
               "\n  \t\r\n"
               "-0 1e-50 0x1p3 0 9223372036854775807 -inf 0 +7 -7\r\n"
               "nan 1 1 1 1 1 1 1 1\n"
               "4 5 6 7 8 nan 0 1 2");
    spconv_point_cloud *pc = read_cloud(path, 0);
    static const char *const names[] = {"x", "y", "z", "u8", "i8", "f8", "b", "n_0", "n_1"};
    assert_fields(pc, names, 9);
    assert_int_equal(spconv_point_cloud_num_points(pc), 3);
    assert_int_equal(spconv_point_cloud_dropped_nonfinite(pc), 1);
    const float *d = cloud_data(pc);
    const float want[27] = {1, -2.5f, 3, 18446744073709551615.0f, -9223372036854775808.0f,
                            (float)1e-300, 1, -32768, 32767,
                            0, 0, 8, 0, 9223372036854775807.0f, -INFINITY, 0, 7, -7,
                            4, 5, 6, 7, 8, NAN, 0, 1, 2};
    for (int i = 0; i < 27; ++i) {
        if (isnan(want[i])) assert_true(isnan(d[i]));
        else assert_true(d[i] == want[i]);
    }
    assert_true(signbit(d[9])); /* -0 stays negative zero */
    spconv_point_cloud_destroy(pc);
}

#define PLY_ASCII_XYZ(n)                                                                     \
    "ply\nformat ascii 1.0\nelement vertex " n "\nproperty float x\nproperty float y\n" \
    "property float z\n"

static void test_ply_ascii_errors(void **state) {
    /* the headers below are 7 lines and a line per extra property (the first vertex is line 8
     * or 9) */
    expect_read_fails(state, "int8.ply", PLY_ASCII_XYZ("2") "property char c\nend_header\n"
                      "1 2 3 4\n1 2 3 300\n", "line 10: property 'c' value '300' does not fit "
                      "char (int8)");
    expect_read_fails(state, "uchar.ply", PLY_ASCII_XYZ("1") "property uchar red\nend_header\n"
                      "1 2 3 -1\n", "line 9: property 'red' value '-1' does not fit uchar");
    expect_read_fails(state, "garbage.ply", PLY_ASCII_XYZ("2") "property float i\nend_header\n"
                      "1 2 3 4\n1 abc 3 4\n", "line 10: property 'y' value 'abc' is not a number"
                      " of type float (float32)");
    expect_read_fails(state, "short.ply", PLY_ASCII_XYZ("2") "property float i\nend_header\n"
                      "1000 2000 3000\n1 2 3 4\n", "line 9: a row of element 'vertex' with fewer values");
    expect_read_fails(state, "long.ply", PLY_ASCII_XYZ("2") "end_header\n1 2 3\n1 2 3 4\n",
                      "line 9: a row of element 'vertex' with more values");
    expect_read_fails(state, "rows.ply", PLY_ASCII_XYZ("2") "end_header\n"
                      "100000 200000 300000\n", "the data ends after 1 of the 2 rows of element "
                      "'vertex'");
    expect_read_fails(state, "extra.ply", PLY_ASCII_XYZ("1") "end_header\n1 2 3\n4 5 6\n",
                      "line 9: values after the last row");
    const char *faces = PLY_ASCII_XYZ("3") "element face 1\nproperty list uchar int vertex_indices\n"
                        "end_header\n1 2 3\n4 5 6\n7 8 9\n";
    char text[512];
    snprintf(text, sizeof text, "%s3 0 1 x\n", faces);
    expect_read_fails(state, "face.ply", text, "line 13: property 'vertex_indices' value 'x' is "
                      "not an integer of type int (int32)");
    snprintf(text, sizeof text, "%s3 0 1\n", faces);
    expect_read_fails(state, "face2.ply", text, "line 13: a row of element 'face' with fewer");
    snprintf(text, sizeof text, "%s2 0 1 2\n", faces);
    expect_read_fails(state, "face3.ply", text, "line 13: a row of element 'face' with more");
    snprintf(text, sizeof text, "%s300 0 1 2\n", faces);
    expect_read_fails(state, "face4.ply", text, "value '300' does not fit list (uint8)");
}

/* ---- PLY lists: refused in the vertex element (PCL aborted the process on them), read past in
 * every other element ----------------------------------------------------------------------- */

static void test_ply_vertex_lists_refused(void **state) {
    static const struct {
        const char *list, *data;
    } cases[] = {
        {"uint float", "1 2 3 2 0.5 0.5\n4 5 6 2 1 1\n"},
        {"uchar int", "1 2 3 1 5\n4 5 6 1 7\n"},
        {"uchar int", "1 2 3 1 5\n4 5 6 3 7 8 9\n"}, /* a length that varies: PCL asserted */
        {"ushort int", "1 2 3 1 5\n4 5 6 1 7\n"},
        {"int double", "1 2 3 0\n4 5 6 0\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        char text[512];
        snprintf(text, sizeof text, PLY_ASCII_XYZ("2") "property list %s foo\nend_header\n%s",
                 cases[i].list, cases[i].data);
        expect_bad_file(state, "list.ply", text, NULL, 0,
                        "line 7: property list 'foo' in element 'vertex' is not supported");
    }
    /* binary, the list before x */
    static const unsigned char rows[] = {1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                         3, 1, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    expect_bad_file(state, "blist.ply",
                    "ply\nformat binary_little_endian 1.0\nelement vertex 2\n"
                    "property list uchar uchar foo\nproperty float x\nproperty float y\n"
                    "property float z\nend_header\n", rows, sizeof rows,
                    "line 4: property list 'foo' in element 'vertex' is not supported");
}

static void put_le32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; ++i) p[i] = (unsigned char)(v >> (8 * i));
}

static void test_ply_lists_in_other_elements(void **state) {
    char path[PATH_CAP];
    /* ascii: faces, a list-only element of its own, a camera with a ushort-counted list, and an
     * indented obj_info line (PCL asserted on that one) */
    write_text(scratch_path(state, "mesh.ply", path),
               "ply\nformat ascii 1.0\n obj_info made by test_io\nelement vertex 3\n"
               "property float x\nproperty float y\nproperty float z\n"
               "element face 2\nproperty list uchar int vertex_indices\nproperty uchar flags\n"
               "element thing 1\nproperty list int float values\n"
               "element camera 1\nproperty list ushort double k\nproperty float f\n"
               "end_header\n1 2 3\n4 5 6\n7 8 9\n3 0 1 2 7\n0 255\n4 1.5 nan -2 1e3\n0 1\n");
    spconv_point_cloud *pc = read_cloud(path, 0);
    static const char *const xyz[] = {"x", "y", "z"};
    assert_fields(pc, xyz, 3);
    const float want[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    assert_int_equal(spconv_point_cloud_num_points(pc), 3);
    assert_memory_equal(cloud_data(pc), want, sizeof want);
    spconv_point_cloud_destroy(pc);
    /* binary little-endian: a face with a uint-counted list, an edge with a char-counted list,
     * then the vertices, so that the lists must be read past exactly */
    static const char header[] = "ply\nformat binary_little_endian 1.0\n"
                                 "element face 1\nproperty list uint int vertex_indices\n"
                                 "element edge 1\nproperty list char short v\nproperty uchar n\n"
                                 "element vertex 2\nproperty float x\nproperty float y\n"
                                 "property float z\nproperty uchar red\nend_header\n";
    unsigned char file[sizeof header - 1 + 16 + 6 + 2 * 13];
    unsigned char *p = file;
    memcpy(p, header, sizeof header - 1);
    p += sizeof header - 1;
    put_le32(p, 3);
    put_le32(p + 4, 0);
    put_le32(p + 8, 1);
    put_le32(p + 12, 1);
    p += 16;
    const unsigned char edge[6] = {2, 1, 0, 2, 0, 9};
    memcpy(p, edge, sizeof edge);
    p += sizeof edge;
    const float v[6] = {1.5f, -2, 3, 4, 5, -6.25f};
    for (int i = 0; i < 2; ++i, p += 13) {
        memcpy(p, v + 3 * i, 12);
        p[12] = (unsigned char)(100 + i);
    }
    assert_int_equal((size_t)(p - file), sizeof file);
    assert_int_equal(spconv_test_write_bytes(scratch_path(state, "bin.ply", path), file,
                                             sizeof file), 0);
    pc = read_cloud(path, 0);
    static const char *const xyzr[] = {"x", "y", "z", "r"};
    assert_fields(pc, xyzr, 4);
    const float want_bin[8] = {1.5f, -2, 3, 100, 4, 5, -6.25f, 101};
    assert_int_equal(spconv_point_cloud_num_points(pc), 2);
    assert_memory_equal(cloud_data(pc), want_bin, sizeof want_bin);
    spconv_point_cloud_destroy(pc);
    /* the same file cut inside the edge's list */
    assert_int_equal(spconv_test_write_bytes(path, file, sizeof header - 1 + 16 + 3), 0);
    SPCONV_ASSERT_FAILS(spconv_point_cloud_read(path, SPCONV_CLOUD_AUTO, 0, &pc),
                        SPCONV_ERR_FORMAT, "need at least");
    /* a negative list length */
    file[sizeof header - 1 + 16] = 0xFF;
    assert_int_equal(spconv_test_write_bytes(path, file, sizeof file), 0);
    SPCONV_ASSERT_FAILS(spconv_point_cloud_read(path, SPCONV_CLOUD_AUTO, 0, &pc),
                        SPCONV_ERR_FORMAT, "list 'v' of row 0 of element 'edge' has a negative "
                        "length -1");
    /* a list longer than the data */
    file[sizeof header - 1 + 16] = 100;
    assert_int_equal(spconv_test_write_bytes(path, file, sizeof file), 0);
    SPCONV_ASSERT_FAILS(spconv_point_cloud_read(path, SPCONV_CLOUD_AUTO, 0, &pc),
                        SPCONV_ERR_FORMAT, "the data ends inside list 'v' of row 0 of element "
                        "'edge'");
    assert_null(pc);
}

/* ---- everything else that can go wrong ------------------------------------------------------ */

static void test_read_errors(void **state) {
    char path[PATH_CAP];
    spconv_point_cloud *pc = NULL;
    scratch_path(state, "missing.bin", path);
    SPCONV_ASSERT_FAILS(spconv_point_cloud_read(path, SPCONV_CLOUD_AUTO, 0, &pc), SPCONV_ERR_IO,
                        "cannot open");
    SPCONV_ASSERT_ERROR_CONTAINS("missing.bin");
    SPCONV_ASSERT_FAILS(spconv_point_cloud_read((const char *)*state, SPCONV_CLOUD_BIN, 0, &pc),
                        SPCONV_ERR_IO, "not a regular file");
    SPCONV_ASSERT_FAILS(spconv_point_cloud_read("", SPCONV_CLOUD_AUTO, 0, &pc), SPCONV_ERR_IO,
                        "empty");
    SPCONV_ASSERT_FAILS(spconv_point_cloud_read(NULL, SPCONV_CLOUD_AUTO, 0, &pc),
                        SPCONV_ERR_NULL_POINTER, "path");
    SPCONV_ASSERT_FAILS(spconv_point_cloud_read(path, SPCONV_CLOUD_AUTO, 0, NULL),
                        SPCONV_ERR_NULL_POINTER, "out");
    /* truncated: 10 KITTI points and 3 bytes */
    char bytes[10 * 16 + 3] = {0};
    assert_int_equal(spconv_test_write_bytes(scratch_path(state, "cut.bin", path), bytes,
                                             sizeof bytes), 0);
    SPCONV_ASSERT_FAILS(spconv_point_cloud_read(path, SPCONV_CLOUD_AUTO, 0, &pc),
                        SPCONV_ERR_FORMAT, "163 bytes, not a whole number of 16-byte records");
    SPCONV_ASSERT_FAILS(spconv_point_cloud_read(path, SPCONV_CLOUD_AUTO, 2, &pc),
                        SPCONV_ERR_INVALID_ARGUMENT, "bin_columns = 2");
    SPCONV_ASSERT_FAILS(spconv_point_cloud_read(path, SPCONV_CLOUD_AUTO, -1, &pc),
                        SPCONV_ERR_INVALID_ARGUMENT, "bin_columns = -1");
    SPCONV_ASSERT_FAILS(spconv_point_cloud_read(path, (spconv_cloud_format)9, 0, &pc),
                        SPCONV_ERR_INVALID_ARGUMENT, "unknown format 9");
    write_text(scratch_path(state, "a.pcd", path), PCD_XYZ "WIDTH 1\nPOINTS 1\nDATA ascii\n1 2 3\n");
    SPCONV_ASSERT_FAILS(spconv_point_cloud_read(path, SPCONV_CLOUD_AUTO, 4, &pc),
                        SPCONV_ERR_INVALID_ARGUMENT, "only for .bin files");
    write_text(scratch_path(state, "notes.txt", path), "just some text\n");
    SPCONV_ASSERT_FAILS(spconv_point_cloud_read(path, SPCONV_CLOUD_AUTO, 0, &pc),
                        SPCONV_ERR_FORMAT, "cannot tell the format");
    assert_null(pc);
    /* an empty scan is valid */
    assert_int_equal(spconv_test_write_bytes(scratch_path(state, "empty.bin", path), "", 0), 0);
    pc = read_cloud(path, 0);
    assert_int_equal(spconv_point_cloud_num_points(pc), 0);
    float lo[3], hi[3];
    SPCONV_ASSERT_FAILS(spconv_point_cloud_bounds(pc, lo, hi), SPCONV_ERR_INVALID_ARGUMENT,
                        "no points");
    spconv_point_cloud_destroy(pc);
}

/* Files without a telling name are recognised by their first bytes. */
static void test_sniffed_formats(void **state) {
    char path[PATH_CAP];
    write_text(scratch_path(state, "cloud.txt", path),
               "# .PCD v0.7\n" PCD_XYZ "WIDTH 2\nPOINTS 2\nDATA ascii\n1 2 3\n4 5 6\n");
    spconv_point_cloud *pc = NULL;
    if (!refused_without_pcl(path)) {
        pc = read_cloud(path, 0);
        assert_int_equal(spconv_point_cloud_format(pc), SPCONV_CLOUD_PCD);
        const float want[6] = {1, 2, 3, 4, 5, 6};
        assert_memory_equal(cloud_data(pc), want, sizeof want);
        spconv_point_cloud_destroy(pc);
    }
    write_text(scratch_path(state, "crlf.pcd", path),
               "# .PCD v0.7\r\nFIELDS x y z\r\nWIDTH 1\r\nPOINTS 1\r\nDATA ascii\r\n1 2 3\r\n");
    if (!refused_without_pcl(path)) {
        pc = read_cloud(path, 0);
        const float want[3] = {1, 2, 3};
        assert_memory_equal(cloud_data(pc), want, sizeof want);
        spconv_point_cloud_destroy(pc);
    }
    write_text(scratch_path(state, "mesh.dat", path),
               "ply\nformat ascii 1.0\nelement vertex 1\nproperty double x\nproperty double y\n"
               "property double z\nend_header\n7 8 9\n");
    if (!refused_without_pcl(path)) {
        pc = read_cloud(path, 0);
        assert_int_equal(spconv_point_cloud_format(pc), SPCONV_CLOUD_PLY);
        const float want[3] = {7, 8, 9};
        assert_memory_equal(cloud_data(pc), want, sizeof want);
        spconv_point_cloud_destroy(pc);
    }
}

static void test_write_errors(void **state) {
    char path[PATH_CAP];
    spconv_tensor *t = random_cloud(5, 4, 0), *ints = NULL, *flat = NULL;
    scratch_path(state, "out.pcd", path);
    static const char *const spaced[] = {"x", "y", "z", "my field"};
    SPCONV_ASSERT_FAILS(spconv_pcd_write(NULL, path, t, spaced), SPCONV_ERR_INVALID_ARGUMENT,
                        "white space");
    static const char *const holes[] = {"x", "y", NULL, "i"};
    SPCONV_ASSERT_FAILS(spconv_pcd_write(NULL, path, t, holes), SPCONV_ERR_INVALID_ARGUMENT,
                        "field name 2 is NULL");
    SPCONV_ASSERT_OK(spconv_tensor_empty(spconv_cpu(), SPCONV_I32, 2, (int64_t[]){5, 4}, &ints));
    SPCONV_ASSERT_FAILS(spconv_pcd_write(NULL, path, ints, NULL), SPCONV_ERR_DTYPE_MISMATCH,
                        "floating");
    SPCONV_ASSERT_FAILS(spconv_bin_write(NULL, path, ints), SPCONV_ERR_DTYPE_MISMATCH, "floating");
    SPCONV_ASSERT_OK(spconv_tensor_view(t, 1, (int64_t[]){20}, &flat));
    SPCONV_ASSERT_FAILS(spconv_bin_write(NULL, path, flat), SPCONV_ERR_SHAPE_MISMATCH, "[P, F]");
    SPCONV_ASSERT_FAILS(spconv_pcd_write(NULL, path, NULL, NULL), SPCONV_ERR_NULL_POINTER, "points");
    assert_int_equal(spconv_test_count_entries((const char *)*state), 0);
    scratch_path(state, "no/such/dir/x.bin", path);
    SPCONV_ASSERT_FAILS(spconv_bin_write(NULL, path, t), SPCONV_ERR_IO, "cannot create");
    spconv_point_cloud *pc = NULL;
    SPCONV_ASSERT_FAILS(spconv_point_cloud_create(NULL, ints, NULL, &pc), SPCONV_ERR_DTYPE_MISMATCH,
                        "f32");
    spconv_tensor *narrow = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_narrow(t, 1, 0, 2, &narrow));
    SPCONV_ASSERT_FAILS(spconv_point_cloud_create(NULL, narrow, NULL, &pc),
                        SPCONV_ERR_SHAPE_MISMATCH, "F >= 3");
    SPCONV_ASSERT_FAILS(spconv_point_cloud_create(NULL, t, holes, &pc), SPCONV_ERR_INVALID_ARGUMENT,
                        "field name 2 is NULL");
    assert_null(pc);
    spconv_tensor_release(narrow);
    spconv_tensor_release(flat);
    spconv_tensor_release(ints);
    spconv_tensor_release(t);
}

int main(void) {
    spconv_test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kitti_bin),
        cmocka_unit_test(test_nuscenes_bin),
        cmocka_unit_test(test_benchmark_bin),
        cmocka_unit_test(test_bunny_pcd),
        cmocka_unit_test(test_cturtle_pcd),
        cmocka_unit_test(test_office1_pcd),
        cmocka_unit_test(test_cube_ply),
        cmocka_unit_test_setup_teardown(test_bin_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bin_write_any_layout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pcd_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pcd_default_names_and_create, setup, teardown),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test_setup_teardown(test_ply_ascii_colour, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ply_big_endian, setup, teardown),
        cmocka_unit_test(test_raw_convert_types),
        cmocka_unit_test(test_raw_convert_errors),
        cmocka_unit_test_setup_teardown(test_pcd_header_lies, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pcd_header_malformed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ply_header_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sniffed_formats, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_parse_the_checked_bytes, setup, teardown),
        cmocka_unit_test(test_cube_ply_values),
        cmocka_unit_test_setup_teardown(test_pcl_rejection_is_silent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_non_regular_inputs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pcd_ascii_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pcd_ascii_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ply_ascii_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ply_vertex_lists_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ply_lists_in_other_elements, setup, teardown),
    };
    return cmocka_run_group_tests_name("io", tests, NULL, NULL);
}
