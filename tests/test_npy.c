/* .npy reading and writing: round trips of every dtype and shape, the exact bytes np.save writes,
 * hand-made malformed files for every error, and (when python3 has numpy) files exchanged with
 * NumPy itself. */
#define _XOPEN_SOURCE 700

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/test_files.h"
#include "common/test_util.h"

#define PATH_CAP 1024

/* ---- a scratch folder per test --------------------------------------------------------------- */

typedef struct scratch {
    char *dir;
} scratch;

static int setup(void **state) {
    scratch *s = calloc(1, sizeof *s);
    if (s == NULL) return -1;
    s->dir = spconv_test_make_scratch("spconv_npy");
    if (s->dir == NULL) {
        free(s);
        return -1;
    }
    *state = s;
    return 0;
}

static int teardown(void **state) {
    scratch *s = *state;
    int rc = spconv_test_remove_tree(s->dir);
    free(s->dir);
    free(s);
    return rc;
}

static void path_of(const scratch *s, const char *name, char *buf, size_t cap) {
    spconv_test_join(s->dir, name, buf, cap);
}

static void write_file_bytes(const char *path, const void *bytes, size_t n) {
    assert_int_equal(spconv_test_write_bytes(path, bytes, n), 0);
}

static unsigned char *read_file_bytes(const char *path, size_t *n) {
    unsigned char *bytes = (unsigned char *)spconv_test_read_bytes(path, n);
    assert_non_null(bytes);
    return bytes;
}

/* Number of entries in the scratch folder (to prove that failed writes leave nothing). */
static int count_entries(const scratch *s) { return spconv_test_count_entries(s->dir); }

/* ---- round trips ----------------------------------------------------------------------------- */

static spconv_tensor *random_tensor(spconv_dtype dtype, int ndim, const int64_t *sizes) {
    spconv_tensor *t = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_empty(spconv_cpu(), dtype, ndim, sizes, &t));
    unsigned char *bytes = spconv_tensor_data(t);
    size_t n = (size_t)spconv_tensor_numel(t) * spconv_dtype_size(dtype);
    /* Random bits, NaN patterns included: the file must carry them unchanged. */
    for (size_t i = 0; i < n; ++i) bytes[i] = (unsigned char)spconv_test_rand_u64();
    return t;
}

static void assert_same_tensor(const spconv_tensor *a, const spconv_tensor *b) {
    assert_int_equal(spconv_tensor_dtype(a), spconv_tensor_dtype(b));
    assert_int_equal(spconv_tensor_ndim(a), spconv_tensor_ndim(b));
    for (int i = 0; i < spconv_tensor_ndim(a); ++i)
        assert_int_equal(spconv_tensor_size(a, i), spconv_tensor_size(b, i));
    size_t n = (size_t)spconv_tensor_numel(a) * spconv_dtype_size(spconv_tensor_dtype(a));
    unsigned char *ha = malloc(n + 1), *hb = malloc(n + 1);
    assert_non_null(ha);
    assert_non_null(hb);
    SPCONV_ASSERT_OK(spconv_tensor_copy_to_host(NULL, a, ha, n));
    SPCONV_ASSERT_OK(spconv_tensor_copy_to_host(NULL, b, hb, n));
    assert_memory_equal(ha, hb, n);
    free(ha);
    free(hb);
}

static void test_round_trip_every_dtype_and_shape(void **state) {
    const scratch *s = *state;
    const spconv_dtype dtypes[] = {SPCONV_I32, SPCONV_I64, SPCONV_F16,
                                   SPCONV_F32, SPCONV_F64, SPCONV_U8};
    const struct {
        int ndim;
        int64_t sizes[4];
    } shapes[] = {{0, {0}}, {1, {0}}, {1, {7}}, {2, {3, 0}}, {2, {5, 3}}, {4, {2, 3, 4, 5}}};
    char path[PATH_CAP];
    path_of(s, "round.npy", path, sizeof path);
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; ++d) {
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; ++k) {
            spconv_tensor *t = random_tensor(dtypes[d], shapes[k].ndim, shapes[k].sizes);
            SPCONV_ASSERT_OK(spconv_npy_write(NULL, path, t));
            spconv_tensor *back = NULL;
            SPCONV_ASSERT_OK(spconv_npy_read(path, &back));
            assert_true(spconv_tensor_is_contiguous(back));
            assert_same_tensor(t, back);
            spconv_tensor_release(t);
            spconv_tensor_release(back);
        }
    }
    assert_int_equal(count_entries(s), 1); /* no temporaries left beside the file */
}

/* Views with gaps, permuted strides and stride 0 are written in row-major order. */
static void test_round_trip_non_contiguous(void **state) {
    const scratch *s = *state;
    const int64_t sizes[3] = {4, 6, 5};
    spconv_tensor *base = random_tensor(SPCONV_F64, 3, sizes);
    spconv_tensor *views[3] = {NULL, NULL, NULL};
    SPCONV_ASSERT_OK(spconv_tensor_transpose(base, 0, 2, &views[0]));
    SPCONV_ASSERT_OK(spconv_tensor_slice(base, 1, 1, 6, 2, &views[1]));
    spconv_tensor *column = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_select(base, 2, 3, &column));
    const int64_t expanded[3] = {3, 4, 6};
    SPCONV_ASSERT_OK(spconv_tensor_expand(column, 3, expanded, &views[2]));
    char path[PATH_CAP];
    path_of(s, "view.npy", path, sizeof path);
    for (int v = 0; v < 3; ++v) {
        assert_false(spconv_tensor_is_contiguous(views[v]));
        SPCONV_ASSERT_OK(spconv_npy_write(NULL, path, views[v]));
        spconv_tensor *back = NULL;
        SPCONV_ASSERT_OK(spconv_npy_read(path, &back));
        assert_same_tensor(views[v], back);
        /* Spot-check one element by hand, independently of copy_to_host. */
        const double *src = spconv_tensor_data(views[v]);
        const double *dst = spconv_tensor_data(back);
        int64_t last[3], offset = 0, flat = 0;
        for (int i = 0; i < 3; ++i) last[i] = spconv_tensor_size(views[v], i) - 1;
        for (int i = 0; i < 3; ++i) {
            offset += last[i] * spconv_tensor_stride(views[v], i);
            flat = flat * spconv_tensor_size(views[v], i) + last[i];
        }
        assert_memory_equal(&src[offset], &dst[flat], sizeof(double));
        spconv_tensor_release(back);
    }
    for (int v = 0; v < 3; ++v) spconv_tensor_release(views[v]);
    spconv_tensor_release(column);
    spconv_tensor_release(base);
}

/* A tensor on a GPU is written through a host copy; skipped without a device. */
static void test_round_trip_from_cuda(void **state) {
    const scratch *s = *state;
    if (spconv_cuda_device_count() == 0) {
        print_message("skip: no CUDA device (or no CUDA backend in this build)\n");
        skip();
    }
    const int64_t sizes[2] = {7, 3};
    spconv_tensor *host = random_tensor(SPCONV_F32, 2, sizes), *gpu = NULL, *view = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, spconv_cuda(0), SPCONV_F32, 2, sizes,
                                             spconv_tensor_data(host), &gpu));
    SPCONV_ASSERT_OK(spconv_tensor_transpose(gpu, 0, 1, &view));
    char path[PATH_CAP];
    path_of(s, "gpu.npy", path, sizeof path);
    const spconv_tensor *sources[2] = {gpu, view};
    for (int v = 0; v < 2; ++v) {
        SPCONV_ASSERT_OK(spconv_npy_write(NULL, path, sources[v]));
        spconv_tensor *back = NULL;
        SPCONV_ASSERT_OK(spconv_npy_read(path, &back));
        assert_same_tensor(sources[v], back);
        spconv_tensor_release(back);
    }
    spconv_tensor_release(view);
    spconv_tensor_release(gpu);
    spconv_tensor_release(host);
}

/* ---- the exact bytes of the header ----------------------------------------------------------- */

/* The header np.save writes, built from the format description: magic, version 1.0, a uint16
 * little-endian length, the dict with sorted keys and a ", " after each value, then spaces and
 * '\n' so that the whole preamble is a multiple of 64 bytes (a full 64 spaces when it already
 * is). */
static size_t expected_header(const char *descr, const char *shape, unsigned char *out) {
    char dict[256];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                     descr, shape);
    size_t pad = 64 - (10 + (size_t)n + 1) % 64;
    size_t header_len = (size_t)n + pad + 1;
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    out[8] = (unsigned char)(header_len % 256);
    out[9] = (unsigned char)(header_len / 256);
    memcpy(out + 10, dict, (size_t)n);
    memset(out + 10 + n, ' ', pad);
    out[10 + header_len - 1] = '\n';
    return 10 + header_len;
}

static void test_header_bytes_match_numpy_format(void **state) {
    const scratch *s = *state;
    const struct {
        spconv_dtype dtype;
        int ndim;
        int64_t sizes[4];
        const char *descr, *shape;
    } cases[] = {
        {SPCONV_F32, 2, {3, 4}, "<f4", "(3, 4)"},
        {SPCONV_F64, 0, {0}, "<f8", "()"},
        {SPCONV_U8, 1, {0}, "|u1", "(0,)"},
        {SPCONV_F16, 1, {12345}, "<f2", "(12345,)"},
        {SPCONV_I64, 4, {2, 3, 4, 5}, "<i8", "(2, 3, 4, 5)"},
        {SPCONV_I32, 2, {1000000, 0}, "<i4", "(1000000, 0)"},
    };
    char path[PATH_CAP];
    path_of(s, "header.npy", path, sizeof path);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        spconv_tensor *t = random_tensor(cases[c].dtype, cases[c].ndim, cases[c].sizes);
        SPCONV_ASSERT_OK(spconv_npy_write(NULL, path, t));
        unsigned char expected[512];
        size_t header_len = expected_header(cases[c].descr, cases[c].shape, expected);
        assert_int_equal(header_len % 64, 0);
        size_t n;
        unsigned char *bytes = read_file_bytes(path, &n);
        size_t data_len = (size_t)spconv_tensor_numel(t) * spconv_dtype_size(cases[c].dtype);
        assert_int_equal(n, header_len + data_len);
        assert_memory_equal(bytes, expected, header_len);
        if (data_len > 0) assert_memory_equal(bytes + header_len, spconv_tensor_data(t), data_len);
        free(bytes);
        spconv_tensor_release(t);
    }
}

/* ---- valid headers that np.save would not write, but NumPy reads ----------------------------- */

/* A file of version major.0 with @p dict (padded to nothing, just '\n') and @p data_len bytes
 * of data counting up from 1. */
static void write_raw_npy(const char *path, int major, const char *dict, size_t data_len) {
    size_t dict_len = strlen(dict) + 1;
    size_t prefix = major == 1 ? 10 : 12;
    size_t total = prefix + dict_len + data_len;
    unsigned char *bytes = malloc(total);
    assert_non_null(bytes);
    memcpy(bytes, "\x93NUMPY", 6);
    bytes[6] = (unsigned char)major;
    bytes[7] = 0;
    for (size_t i = 0; i < prefix - 8; ++i) bytes[8 + i] = (unsigned char)(dict_len >> (8 * i));
    memcpy(bytes + prefix, dict, dict_len - 1);
    bytes[prefix + dict_len - 1] = '\n';
    for (size_t i = 0; i < data_len; ++i) bytes[prefix + dict_len + i] = (unsigned char)(i + 1);
    write_file_bytes(path, bytes, total);
    free(bytes);
}

static void test_reads_valid_header_variants(void **state) {
    const scratch *s = *state;
    const struct {
        int major;
        const char *dict;
        spconv_dtype dtype;
        int ndim;
        int64_t sizes[3];
    } cases[] = {
        {1, "{'shape': (2, 3), 'fortran_order': False, 'descr': '<i4'}", SPCONV_I32, 2, {2, 3}},
        {1, "{\"descr\": \"<f8\", \"fortran_order\": False, \"shape\": (4,)}", SPCONV_F64, 1, {4}},
        {1, " {\n 'descr' : '<f4' ,\t'fortran_order':False,'shape':( 2 , 3 , ) , }  \n ",
         SPCONV_F32, 2, {2, 3}},
        {1, "{'descr': '<i8', 'fortran_order': False, 'shape': (3L, 1L), }", SPCONV_I64, 2, {3, 1}},
        {2, "{'descr': '<f2', 'fortran_order': False, 'shape': (5,), }", SPCONV_F16, 1, {5}},
        {3, "{'descr': '<u1', 'fortran_order': False, 'shape': (2, 2, 2), }", SPCONV_U8, 3,
         {2, 2, 2}},
        {1, "{'descr': '=u1', 'fortran_order': False, 'shape': (), }", SPCONV_U8, 0, {0}},
        {1, "{'descr': 'u1', 'fortran_order': False, 'shape': (0, 9), }", SPCONV_U8, 2, {0, 9}},
    };
    char path[PATH_CAP];
    path_of(s, "variant.npy", path, sizeof path);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        int64_t numel = 1;
        for (int i = 0; i < cases[c].ndim; ++i) numel *= cases[c].sizes[i];
        size_t data_len = (size_t)numel * spconv_dtype_size(cases[c].dtype);
        write_raw_npy(path, cases[c].major, cases[c].dict, data_len);
        spconv_tensor *t = NULL;
        print_message("case %zu: %s\n", c, cases[c].dict);
        SPCONV_ASSERT_OK(spconv_npy_read(path, &t));
        assert_int_equal(spconv_tensor_dtype(t), cases[c].dtype);
        assert_int_equal(spconv_tensor_ndim(t), cases[c].ndim);
        for (int i = 0; i < cases[c].ndim; ++i)
            assert_int_equal(spconv_tensor_size(t, i), cases[c].sizes[i]);
        const unsigned char *data = spconv_tensor_data(t);
        for (size_t i = 0; i < data_len; ++i) assert_int_equal(data[i], (unsigned char)(i + 1));
        spconv_tensor_release(t);
    }
}

/* ---- malformed files ------------------------------------------------------------------------- */

static void assert_read_fails(const char *path, spconv_status status, const char *substring) {
    spconv_tensor *t = (spconv_tensor *)&t; /* any non-NULL value: the call must reset it */
    SPCONV_ASSERT_FAILS(spconv_npy_read(path, &t), status, substring);
    assert_null(t);
    SPCONV_ASSERT_ERROR_CONTAINS(path);
}

static void test_rejects_malformed_headers(void **state) {
    const scratch *s = *state;
    const struct {
        const char *dict;
        size_t data_len;
        const char *message;
    } cases[] = {
        {"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24, "Fortran"},
        {"{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8, "big-endian"},
        {"{'descr': '>i8', 'fortran_order': False, 'shape': (2,), }", 16, "big-endian"},
        {"{'descr': '<i2', 'fortran_order': False, 'shape': (2,), }", 4, "unsupported dtype '<i2'"},
        {"{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", 16, "unsupported dtype"},
        {"{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }", 2, "unsupported dtype"},
        {"{'descr': '<f04', 'fortran_order': False, 'shape': (2,), }", 8, "unsupported dtype"},
        {"{'descr': '', 'fortran_order': False, 'shape': (2,), }", 8, "unsupported dtype"},
        {"{'descr': '<', 'fortran_order': False, 'shape': (2,), }", 8, "unsupported dtype"},
        {"{'descr': '|f4', 'fortran_order': False, 'shape': (2,), }", 8, "little-endian"},
        {"{'descr': '=f8', 'fortran_order': False, 'shape': (2,), }", 16, "little-endian"},
        {"{'descr': [('x', '<f4')], 'fortran_order': False, 'shape': (2,), }", 8, "structured"},
        {"{'descr': '<f4', 'fortran_order': False, }", 4, "no 'shape' key"},
        {"{'fortran_order': False, 'shape': (1,), }", 4, "no 'descr' key"},
        {"{'descr': '<f4', 'shape': (1,), }", 4, "no 'fortran_order' key"},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", 4, "twice"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", 4,
         "unexpected header key 'x'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,)", 4, "expected ',' or '}'"},
        {"{'descr': '<f4' 'fortran_order': False, 'shape': (1,)}", 4, "expected ',' or '}'"},
        {"{'descr' '<f4', 'fortran_order': False, 'shape': (1,)}", 4, "expected ':'"},
        {"{'descr': '<f4, 'fortran_order': False, 'shape': (1,)}", 4, "unsupported dtype '<f4, '"},
        {"{'descr': '<f4", 4, "unterminated string"},
        {"{'descr': '<f\\x34', 'fortran_order': False, 'shape': (1,)}", 4, "escape sequences"},
        {"{'descr': '<f\t4', 'fortran_order': False, 'shape': (1,)}", 4, "control character"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }, }", 4,
         "after the header dict"},
        {"{'descr': '<f4', 'fortran_order': False, , 'shape': (1,)}", 4,
         "expected a quoted string"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1 2)}", 4, "expected ',' or ')'"},
        {"", 4, "opening the header dict"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1)}", 4, "not a tuple"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': [1]}", 4, "must be a tuple"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}", 4, "non-negative integer"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (,)}", 4, "non-negative integer"},
        {"{'descr': '<f4', 'fortran_order': false, 'shape': (1,)}", 4, "True or False"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x", 4, "after the header dict"},
        {"['descr', '<f4']", 4, "opening the header dict"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1)}", 4,
         "more than 8 dims"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", 4,
         "does not fit in int64"},
        {"{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904, 4)}", 0,
         "overflow"},
        {"{'descr': '<f8', 'fortran_order': False, 'shape': (0, 4611686018427387904, 4)}", 0,
         "overflow"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (10,)}", 39, "truncated"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (10,)}", 41, "is longer"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': ()}", 0, "truncated"},
    };
    char path[PATH_CAP];
    path_of(s, "bad.npy", path, sizeof path);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        print_message("case %zu: %s\n", c, cases[c].dict);
        write_raw_npy(path, 1, cases[c].dict, cases[c].data_len);
        assert_read_fails(path, SPCONV_ERR_FORMAT, cases[c].message);
    }
}

static void test_rejects_bad_preambles(void **state) {
    const scratch *s = *state;
    char path[PATH_CAP];
    path_of(s, "pre.npy", path, sizeof path);
    const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}";

    write_file_bytes(path, "\x93NUMPY\x01", 7);
    assert_read_fails(path, SPCONV_ERR_FORMAT, "too short");
    write_file_bytes(path, "", 0);
    assert_read_fails(path, SPCONV_ERR_FORMAT, "too short");
    write_file_bytes(path, "\x93NUMPZ\x01\x00\x10\x00{}", 12);
    assert_read_fails(path, SPCONV_ERR_FORMAT, "bad magic");
    write_file_bytes(path, "PK\x03\x04 this is a zip file", 24);
    assert_read_fails(path, SPCONV_ERR_FORMAT, "not a .npy file");

    write_raw_npy(path, 4, dict, 4);
    assert_read_fails(path, SPCONV_ERR_FORMAT, "unsupported .npy version 4.0");
    write_raw_npy(path, 1, dict, 4);
    unsigned char *bytes;
    size_t n;
    bytes = read_file_bytes(path, &n);
    bytes[7] = 1; /* version 1.1 */
    write_file_bytes(path, bytes, n);
    assert_read_fails(path, SPCONV_ERR_FORMAT, "unsupported .npy version 1.1");
    bytes[7] = 0;
    bytes[8] = 0xFF; /* header length 255 + 256 * len_hi: past the end of the file */
    write_file_bytes(path, bytes, n);
    assert_read_fails(path, SPCONV_ERR_FORMAT, "runs past the end");
    free(bytes);

    /* A version 2.0 header length of 4 GiB - 1 is refused before anything is allocated. */
    write_file_bytes(path, "\x93NUMPY\x02\x00\xFF\xFF\xFF\xFF{}\n", 15);
    assert_read_fails(path, SPCONV_ERR_FORMAT, "exceeds the limit");
    write_file_bytes(path, "\x93NUMPY\x02\x00\x10\x00", 10);
    assert_read_fails(path, SPCONV_ERR_FORMAT, "ends inside the header length");
}

static void test_io_errors_name_the_path(void **state) {
    const scratch *s = *state;
    char path[PATH_CAP];
    path_of(s, "does_not_exist.npy", path, sizeof path);
    assert_read_fails(path, SPCONV_ERR_IO, strerror(ENOENT));
    assert_read_fails(s->dir, SPCONV_ERR_IO, "is not a regular file (a directory)");
    spconv_tensor *t = NULL;
    SPCONV_ASSERT_FAILS(spconv_npy_read(NULL, &t), SPCONV_ERR_NULL_POINTER, "'path'");
    SPCONV_ASSERT_FAILS(spconv_npy_read(path, NULL), SPCONV_ERR_NULL_POINTER, "'out'");
}

static void test_unreadable_file_names_the_cause(void **state) {
    const scratch *s = *state;
    char path[PATH_CAP];
    if (geteuid() == 0) {
        print_message("skip: root reads files without permission\n");
        skip();
    }
    path_of(s, "locked.npy", path, sizeof path);
    write_raw_npy(path, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", 4);
    assert_int_equal(chmod(path, 0), 0);
    assert_read_fails(path, SPCONV_ERR_IO, strerror(EACCES));
}

/* ---- write errors: nothing half-written is left ---------------------------------------------- */

static void test_write_errors_leave_nothing(void **state) {
    const scratch *s = *state;
    const int64_t sizes[2] = {3, 2};
    spconv_tensor *t = random_tensor(SPCONV_F32, 2, sizes);
    char path[PATH_CAP];

    path_of(s, "missing_folder/x.npy", path, sizeof path);
    SPCONV_ASSERT_FAILS(spconv_npy_write(NULL, path, t), SPCONV_ERR_IO, path);
    SPCONV_ASSERT_ERROR_CONTAINS(strerror(ENOENT));
    /* The message names the file asked for and the folder at fault, never the temporary. */
    char expected[3 * PATH_CAP], folder[PATH_CAP];
    path_of(s, "missing_folder", folder, sizeof folder);
    snprintf(expected, sizeof expected, "cannot create '%s': folder '%s' does not exist", path,
             folder);
    SPCONV_ASSERT_ERROR_CONTAINS(expected);
    assert_null(strstr(spconv_last_error(), ".partial"));
    assert_null(strstr(spconv_last_error(), "beside"));
    /* A file where the folder should be. */
    path_of(s, "plain_file", folder, sizeof folder);
    FILE *plain = fopen(folder, "wb");
    assert_non_null(plain);
    fclose(plain);
    path_of(s, "plain_file/x.npy", path, sizeof path);
    SPCONV_ASSERT_FAILS(spconv_npy_write(NULL, path, t), SPCONV_ERR_IO, path);
    snprintf(expected, sizeof expected, "cannot create '%s': '%s' is not a folder", path, folder);
    SPCONV_ASSERT_ERROR_CONTAINS(expected);
    assert_int_equal(remove(folder), 0);

    /* The target is a folder: the temporary is written, the rename fails, the temporary goes. */
    path_of(s, "folder.npy", path, sizeof path);
    assert_int_equal(mkdir(path, 0777), 0);
    SPCONV_ASSERT_FAILS(spconv_npy_write(NULL, path, t), SPCONV_ERR_IO, "folder.npy");
    assert_int_equal(count_entries(s), 1);

    spconv_tensor *bf16 = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_zeros(NULL, spconv_cpu(), SPCONV_BF16, 2, sizes, &bf16));
    path_of(s, "bf16.npy", path, sizeof path);
    SPCONV_ASSERT_FAILS(spconv_npy_write(NULL, path, bf16), SPCONV_ERR_DTYPE_MISMATCH, "bf16");
    assert_int_equal(count_entries(s), 1);
    SPCONV_ASSERT_FAILS(spconv_npy_write(NULL, NULL, t), SPCONV_ERR_NULL_POINTER, "'path'");
    SPCONV_ASSERT_FAILS(spconv_npy_write(NULL, path, NULL), SPCONV_ERR_NULL_POINTER, "'t'");

    /* Overwriting replaces the old file whole. */
    path_of(s, "over.npy", path, sizeof path);
    write_file_bytes(path, "old contents", 12);
    SPCONV_ASSERT_OK(spconv_npy_write(NULL, path, t));
    spconv_tensor *back = NULL;
    SPCONV_ASSERT_OK(spconv_npy_read(path, &back));
    assert_same_tensor(t, back);
    assert_int_equal(count_entries(s), 2);
    spconv_tensor_release(back);
    spconv_tensor_release(bf16);
    spconv_tensor_release(t);
}

/* ---- NumPy itself, when present -------------------------------------------------------------- */

#define NP_COUNT 6
static const struct {
    const char *name;
    spconv_dtype dtype;
    const char *numpy;
} np_dtypes[NP_COUNT] = {
    {"i4", SPCONV_I32, "int32"},   {"i8", SPCONV_I64, "int64"},   {"f2", SPCONV_F16, "float16"},
    {"f4", SPCONV_F32, "float32"}, {"f8", SPCONV_F64, "float64"}, {"u1", SPCONV_U8, "uint8"},
};

/* The value both sides put at flat index i: small integers, exact in every dtype. */
static double np_value(int64_t i) { return (double)((i * 7) % 23); }

static spconv_tensor *pattern_tensor(spconv_dtype dtype, const int64_t sizes[3]) {
    spconv_tensor *f64 = NULL, *t = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_empty(spconv_cpu(), SPCONV_F64, 3, sizes, &f64));
    double *data = spconv_tensor_data(f64);
    for (int64_t i = 0; i < spconv_tensor_numel(f64); ++i) data[i] = np_value(i);
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, f64, dtype, &t));
    spconv_tensor_release(f64);
    return t;
}

static const char np_script[] =
    "import sys, io, numpy as np\n"
    "d = sys.argv[1]\n"
    "bad = 0\n"
    "for name, dt in [('i4','int32'),('i8','int64'),('f2','float16'),('f4','float32'),"
    "('f8','float64'),('u1','uint8')]:\n"
    "    want = ((np.arange(24) * 7) % 23).astype(dt).reshape(2, 3, 4)\n"
    "    got = np.load(f'{d}/ours_{name}.npy')\n"
    "    if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want):\n"
    "        print('numpy reads ours_' + name + ' wrongly'); bad = 1\n"
    "    b = io.BytesIO(); np.save(b, want)\n"
    "    if open(f'{d}/ours_{name}.npy', 'rb').read() != b.getvalue():\n"
    "        print('ours_' + name + ' differs from np.save bytes'); bad = 1\n"
    "    np.save(f'{d}/numpy_{name}.npy', want)\n"
    "np.save(f'{d}/numpy_big.npy', np.arange(3, dtype='>f4'))\n"
    "np.save(f'{d}/numpy_fortran.npy', np.asfortranarray(np.ones((2, 3), dtype='<f8')))\n"
    "sys.exit(bad)\n";

static void test_numpy_cross_check(void **state) {
    const scratch *s = *state;
    if (system("python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
        print_message("skip: python3 with numpy is not available, no cross-check with NumPy\n");
        skip();
    }
    const int64_t sizes[3] = {2, 3, 4};
    char path[PATH_CAP];
    for (int d = 0; d < NP_COUNT; ++d) {
        spconv_tensor *t = pattern_tensor(np_dtypes[d].dtype, sizes);
        snprintf(path, sizeof path, "%s/ours_%s.npy", s->dir, np_dtypes[d].name);
        SPCONV_ASSERT_OK(spconv_npy_write(NULL, path, t));
        spconv_tensor_release(t);
    }
    path_of(s, "check.py", path, sizeof path);
    write_file_bytes(path, np_script, strlen(np_script));
    char command[3 * PATH_CAP];
    snprintf(command, sizeof command, "python3 '%s' '%s'", path, s->dir);
    assert_int_equal(system(command), 0);
    for (int d = 0; d < NP_COUNT; ++d) {
        snprintf(path, sizeof path, "%s/numpy_%s.npy", s->dir, np_dtypes[d].name);
        spconv_tensor *got = NULL, *want = pattern_tensor(np_dtypes[d].dtype, sizes);
        SPCONV_ASSERT_OK(spconv_npy_read(path, &got));
        assert_same_tensor(want, got);
        spconv_tensor_release(got);
        spconv_tensor_release(want);
    }
    path_of(s, "numpy_big.npy", path, sizeof path);
    assert_read_fails(path, SPCONV_ERR_FORMAT, "big-endian");
    path_of(s, "numpy_fortran.npy", path, sizeof path);
    assert_read_fails(path, SPCONV_ERR_FORMAT, "Fortran");
}

int main(void) {
    spconv_test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip_every_dtype_and_shape, setup, teardown),
        cmocka_unit_test_setup_teardown(test_round_trip_non_contiguous, setup, teardown),
        cmocka_unit_test_setup_teardown(test_round_trip_from_cuda, setup, teardown),
        cmocka_unit_test_setup_teardown(test_header_bytes_match_numpy_format, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reads_valid_header_variants, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rejects_malformed_headers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rejects_bad_preambles, setup, teardown),
        cmocka_unit_test_setup_teardown(test_io_errors_name_the_path, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unreadable_file_names_the_cause, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_errors_leave_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_numpy_cross_check, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
