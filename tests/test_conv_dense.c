/* Dense helpers (sparse -> dense [B, C, D, H, W] and back) and the weight layout converters
 * (RSCK, KRSC, OIDHW), element by element against their definitions, round trips, and bad
 * inputs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/conv_helpers.h"
#include "common/conv_oracle.h"
#include "core/cpu_kernels.h"

/* Element [b, c, z, y, x] of a contiguous dense grid read back as doubles. */
static double dense_at(const double *d, const int64_t s[5], int64_t b, int64_t c,
                       const int32_t *r) {
    return d[(((b * s[1] + c) * s[2] + r[1]) * s[3] + r[2]) * s[4] + r[3]];
}

/* Every element size (u8, f16, f32, f64) moves as bits, on 1 and 2 threads, in maps large enough
 * that the scatter runs in parallel (2 x 3 x 180,000 elements, over its 2^20): each site's
 * channels where the definition puts them, and zero bytes everywhere else. */
static void test_sparse_to_dense_all_sizes_in_parallel(void **state) {
    (void)state;
    const spconv_dtype dtypes[4] = {SPCONV_U8, SPCONV_F16, SPCONV_F32, SPCONV_F64};
    const int64_t shape[3] = {10, 120, 150}, batch = 2, channels = 3, per_batch = 5000;
    const int64_t n = batch * per_batch, cells = shape[0] * shape[1] * shape[2];
    int32_t *rows = oracle_random_sites(batch, shape, per_batch);
    for (int d = 0; d < 4; ++d) {
        const size_t elem = spconv_dtype_size(dtypes[d]);
        unsigned char *bytes = malloc((size_t)(n * channels) * elem);
        assert_non_null(bytes);
        for (int64_t i = 0; i < n * channels * (int64_t)elem; ++i)
            bytes[i] = (unsigned char)spconv_test_rand_int(1, 255); /* no zero byte */
        const int64_t f_sizes[2] = {n, channels};
        for (int threads = 1; threads <= 2; ++threads) {
            spconv_context *ctx = NULL;
            SPCONV_ASSERT_OK(spconv_context_create(spconv_cpu(), &ctx));
            SPCONV_ASSERT_OK(spconv_context_set_num_threads(ctx, threads));
            spconv_tensor *f = NULL, *dense = NULL;
            SPCONV_ASSERT_OK(spconv_tensor_from_host(ctx, spconv_cpu(), dtypes[d], 2, f_sizes,
                                                     bytes, &f));
            spconv_tensor *idx = conv_indices_tensor(rows, n);
            SPCONV_ASSERT_OK(spconv_sparse_to_dense(ctx, f, idx, shape, batch, &dense));
            const unsigned char *got = spconv_tensor_data(dense);
            unsigned char *want = calloc((size_t)(batch * channels * cells), elem);
            assert_non_null(want);
            for (int64_t i = 0; i < n; ++i) {
                const int32_t *r = rows + 4 * i;
                const int64_t cell = ((int64_t)r[1] * shape[1] + r[2]) * shape[2] + r[3];
                for (int64_t c = 0; c < channels; ++c)
                    memcpy(want + ((r[0] * channels + c) * cells + cell) * elem,
                           bytes + (i * channels + c) * elem, elem);
            }
            assert_memory_equal(got, want, (size_t)(batch * channels * cells) * elem);
            free(want);
            spconv_tensor_release(dense);
            spconv_tensor_release(idx);
            spconv_tensor_release(f);
            spconv_context_destroy(ctx);
        }
        free(bytes);
    }
    free(rows);
}

static void test_sparse_to_dense_definition(void **state) {
    (void)state;
    for (int t = 0; t < 20; ++t) {
        int64_t shape[3] = {spconv_test_rand_int(1, 9), spconv_test_rand_int(1, 9),
                            spconv_test_rand_int(1, 9)};
        int64_t batch = spconv_test_rand_int(1, 3), channels = spconv_test_rand_int(1, 6);
        int64_t per_batch = spconv_test_rand_int(0, oracle_cells(shape));
        int64_t n = batch * per_batch;
        int32_t *rows = oracle_random_sites(batch, shape, per_batch);
        double *values = conv_random_values(n * channels, 0.5, 1.0); /* never zero */
        int64_t f_sizes[2] = {n, channels};
        spconv_dtype dtype = t % 2 == 0 ? SPCONV_F32 : SPCONV_F64;
        spconv_tensor *f = conv_tensor(dtype, 2, f_sizes, values);
        spconv_tensor *idx = conv_indices_tensor(rows, n), *dense = NULL;
        SPCONV_ASSERT_OK(spconv_sparse_to_dense(NULL, f, idx, shape, batch, &dense));
        int64_t s[5] = {batch, channels, shape[0], shape[1], shape[2]};
        assert_int_equal(spconv_tensor_ndim(dense), 5);
        for (int a = 0; a < 5; ++a) assert_int_equal(spconv_tensor_size(dense, a), s[a]);
        int64_t total;
        double *d = conv_read(dense, &total);
        int64_t nonzero = 0;
        for (int64_t i = 0; i < total; ++i) nonzero += d[i] != 0.0;
        assert_int_equal(nonzero, n * channels);
        for (int64_t i = 0; i < n; ++i)
            for (int64_t c = 0; c < channels; ++c)
                assert_true(dense_at(d, s, rows[i * 4], c, rows + i * 4) ==
                            values[i * channels + c]);

        /* back: the same sites sorted by (b, z, y, x), each with its own features */
        spconv_tensor *f2 = NULL, *idx2 = NULL;
        SPCONV_ASSERT_OK(spconv_dense_to_sparse(NULL, dense, &f2, &idx2));
        assert_int_equal(spconv_tensor_size(idx2, 0), n);
        assert_int_equal(spconv_tensor_dtype(f2), dtype);
        int32_t *rows2 = conv_read_i32(idx2);
        double *values2 = conv_read(f2, NULL);
        for (int64_t i = 0; i < n; ++i) {
            const int32_t *r = rows2 + i * 4;
            if (i > 0) assert_true(oracle_cell(r - 4, shape) < oracle_cell(r, shape));
            for (int64_t c = 0; c < channels; ++c)
                assert_true(values2[i * channels + c] == dense_at(d, s, r[0], c, r));
        }
        free(rows2);
        free(values2);
        free(d);
        free(rows);
        free(values);
        spconv_tensor_release(f);
        spconv_tensor_release(f2);
        spconv_tensor_release(idx);
        spconv_tensor_release(idx2);
        spconv_tensor_release(dense);
    }
}

/* A site is active when any channel is non-zero: -0.0 is zero, NaN is not; integers work too. */
static void test_dense_to_sparse_rules(void **state) {
    (void)state;
    int64_t sizes[5] = {2, 2, 1, 1, 3};
    /* [b][c][x]: b0 = {0, -0, 3 | 0, 0, 0}, b1 = {0, NaN, 0 | 0, 0, -2} */
    double v[12] = {0.0, -0.0, 3.0, 0.0, 0.0, 0.0, 0.0, NAN, 0.0, 0.0, 0.0, -2.0};
    static const spconv_dtype dtypes[3] = {SPCONV_F32, SPCONV_F64, SPCONV_I32};
    for (int t = 0; t < 3; ++t) {
        spconv_tensor *dense = conv_tensor(dtypes[t], 5, sizes, v), *f = NULL, *idx = NULL;
        SPCONV_ASSERT_OK(spconv_dense_to_sparse(NULL, dense, &f, &idx));
        int32_t *rows = conv_read_i32(idx);
        double *feat = conv_read(f, NULL);
        /* i32: the NaN converted to 0, so b1 keeps only x = 2 */
        int64_t want_n = dtypes[t] == SPCONV_I32 ? 2 : 3;
        assert_int_equal(spconv_tensor_size(idx, 0), want_n);
        int32_t want_rows[12] = {0, 0, 0, 2, 1, 0, 0, 1, 1, 0, 0, 2};
        if (want_n == 2) memmove(want_rows + 4, want_rows + 8, 4 * sizeof(int32_t));
        assert_memory_equal(rows, want_rows, (size_t)want_n * 4 * sizeof(int32_t));
        assert_true(feat[0] == 3.0 && feat[1] == 0.0);
        assert_true(feat[(want_n - 1) * 2 + 1] == -2.0);
        free(rows);
        free(feat);
        spconv_tensor_release(dense);
        spconv_tensor_release(f);
        spconv_tensor_release(idx);
    }
}

static void test_dense_errors(void **state) {
    (void)state;
    int64_t shape[3] = {4, 5, 6}, f_sizes[2] = {3, 2}, f_bad[2] = {2, 2}, i3[2] = {3, 3};
    int32_t rows[12] = {0, 1, 2, 3, 0, 3, 4, 5, 0, 1, 2, 3};
    int32_t outside[12] = {0, 1, 2, 3, 0, 4, 4, 5, 0, 0, 0, 0};
    int32_t batch1[12] = {0, 1, 2, 3, 1, 3, 4, 5, 0, 0, 0, 0};
    double values[6] = {1, 2, 3, 4, 5, 6};
    spconv_tensor *f = conv_tensor(SPCONV_F32, 2, f_sizes, values);
    spconv_tensor *f2 = conv_tensor(SPCONV_F32, 2, f_bad, values);
    spconv_tensor *dup = conv_indices_tensor(rows, 3),
                  *out_of_range = conv_indices_tensor(outside, 3);
    spconv_tensor *bad_batch = conv_indices_tensor(batch1, 3), *i64 = NULL, *narrow = NULL;
    spconv_tensor *dense = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, dup, SPCONV_I64, &i64));
    SPCONV_ASSERT_OK(spconv_tensor_zeros(NULL, spconv_cpu(), SPCONV_I32, 2, i3, &narrow));
    SPCONV_ASSERT_FAILS(spconv_sparse_to_dense(NULL, f, dup, shape, 1, &dense),
                        SPCONV_ERR_DUPLICATE_INDEX, "indices rows 0 and 2 are both (0, 1, 2, 3)");
    SPCONV_ASSERT_FAILS(spconv_sparse_to_dense(NULL, f, out_of_range, shape, 1, &dense),
                        SPCONV_ERR_OUT_OF_RANGE,
                        "indices row 1 = (0, 4, 4, 5) is outside batch size 1 and spatial shape "
                        "(4, 5, 6)");
    SPCONV_ASSERT_FAILS(spconv_sparse_to_dense(NULL, f, bad_batch, shape, 1, &dense),
                        SPCONV_ERR_OUT_OF_RANGE, "indices row 1 = (1, 3, 4, 5)");
    SPCONV_ASSERT_FAILS(spconv_sparse_to_dense(NULL, f, dup, shape, 0, &dense),
                        SPCONV_ERR_INVALID_ARGUMENT, "batch_size = 0 must be positive");
    int64_t zero_shape[3] = {4, 0, 6}, huge[3] = {INT64_MAX / 2, 4, 4};
    SPCONV_ASSERT_FAILS(spconv_sparse_to_dense(NULL, f, dup, zero_shape, 1, &dense),
                        SPCONV_ERR_INVALID_ARGUMENT, "spatial shape (4, 0, 6) must be positive");
    SPCONV_ASSERT_FAILS(spconv_sparse_to_dense(NULL, f, dup, huge, 1, &dense), SPCONV_ERR_OVERFLOW,
                        "overflows int64");
    SPCONV_ASSERT_FAILS(spconv_sparse_to_dense(NULL, f, i64, shape, 1, &dense),
                        SPCONV_ERR_DTYPE_MISMATCH, "indices must be i32, got i64");
    SPCONV_ASSERT_FAILS(spconv_sparse_to_dense(NULL, f, narrow, shape, 1, &dense),
                        SPCONV_ERR_SHAPE_MISMATCH, "indices has 3 columns, expected 4");
    SPCONV_ASSERT_FAILS(spconv_sparse_to_dense(NULL, f2, dup, shape, 1, &dense),
                        SPCONV_ERR_SHAPE_MISMATCH, "indices has 3 rows, expected 2");
    SPCONV_ASSERT_FAILS(spconv_sparse_to_dense(NULL, f, NULL, shape, 1, &dense),
                        SPCONV_ERR_NULL_POINTER, "'indices'");
    assert_null(dense);
    spconv_tensor *feat = NULL, *idx = NULL;
    SPCONV_ASSERT_FAILS(spconv_dense_to_sparse(NULL, f, &feat, &idx), SPCONV_ERR_SHAPE_MISMATCH,
                        "dense must be 5-d [B, C, D, H, W], got 2-d [3, 2]");
    SPCONV_ASSERT_FAILS(spconv_dense_to_sparse(NULL, NULL, &feat, &idx), SPCONV_ERR_NULL_POINTER,
                        "'dense'");
    assert_null(feat);
    assert_null(idx);
    spconv_tensor *all[7] = {f, f2, dup, out_of_range, bad_batch, i64, narrow};
    for (int i = 0; i < 7; ++i) spconv_tensor_release(all[i]);
}

/* Flat offset of a 5-d index in a contiguous tensor of sizes @p s. */
static int64_t at5(const int64_t s[5], int64_t a, int64_t b, int64_t c, int64_t d, int64_t e) {
    return (((a * s[1] + b) * s[2] + c) * s[3] + d) * s[4] + e;
}

/* KRSC and OIDHW weights converted to RSCK hold out[k, ci, co] = w[co, kd, kh, kw, ci] and
 * w[co, ci, kd, kh, kw] with k = (kd*KH + kh)*KW + kw; from_rsck inverts to_rsck. */
static void test_weight_layouts(void **state) {
    (void)state;
    for (int t = 0; t < 10; ++t) {
        int64_t kd = spconv_test_rand_int(1, 3), kh = spconv_test_rand_int(1, 3);
        int64_t kw = spconv_test_rand_int(1, 3), ci = spconv_test_rand_int(1, 5);
        int64_t co = spconv_test_rand_int(1, 5), kv = kd * kh * kw;
        int64_t krsc[5] = {co, kd, kh, kw, ci}, oidhw[5] = {co, ci, kd, kh, kw};
        int64_t rsck[5] = {kd, kh, kw, ci, co};
        const int64_t *sizes[3] = {rsck, krsc, oidhw};
        double *w = conv_random_values(kv * ci * co, -1.0, 1.0);
        for (int layout = 0; layout < 3; ++layout) {
            spconv_dtype dtype = layout == 1 ? SPCONV_F64 : SPCONV_F32;
            spconv_tensor *src = conv_tensor(dtype, 5, sizes[layout], w), *out = NULL, *back = NULL;
            int64_t kernel[3] = {0, 0, 0};
            SPCONV_ASSERT_OK(
                spconv_weight_to_rsck(NULL, src, (spconv_weight_layout)layout, kernel, &out));
            assert_true(kernel[0] == kd && kernel[1] == kh && kernel[2] == kw);
            assert_int_equal(spconv_tensor_ndim(out), 3);
            assert_true(spconv_tensor_storage(out) != spconv_tensor_storage(src));
            double *r = conv_read(out, NULL);
            for (int64_t a = 0; a < kd; ++a)
                for (int64_t b = 0; b < kh; ++b)
                    for (int64_t c = 0; c < kw; ++c)
                        for (int64_t i = 0; i < ci; ++i)
                            for (int64_t o = 0; o < co; ++o) {
                                int64_t k = (a * kh + b) * kw + c;
                                int64_t from = layout == 0   ? at5(rsck, a, b, c, i, o)
                                               : layout == 1 ? at5(krsc, o, a, b, c, i)
                                                             : at5(oidhw, o, i, a, b, c);
                                assert_true(r[(k * ci + i) * co + o] == w[from]);
                            }
            SPCONV_ASSERT_OK(
                spconv_weight_from_rsck(NULL, out, kernel, (spconv_weight_layout)layout, &back));
            assert_true(conv_same_bits(back, src));
            for (int a = 0; a < 5; ++a)
                assert_int_equal(spconv_tensor_size(back, a), sizes[layout][a]);
            free(r);
            spconv_tensor_release(src);
            spconv_tensor_release(out);
            spconv_tensor_release(back);
        }
        free(w);
    }
}

/* A strided (permuted) weight converts like its contiguous copy. */
static void test_weight_layout_views(void **state) {
    (void)state;
    int64_t sizes[5] = {4, 3, 3, 3, 2}; /* OIDHW, viewed through a permutation */
    double *w = conv_random_values(4 * 3 * 3 * 3 * 2, -1.0, 1.0);
    spconv_tensor *src = conv_tensor(SPCONV_F32, 5, sizes, w), *view = NULL, *view_back = NULL;
    int dims[5] = {1, 0, 2, 3, 4};
    SPCONV_ASSERT_OK(spconv_tensor_permute(src, dims, &view));
    SPCONV_ASSERT_OK(spconv_tensor_permute(view, dims, &view_back)); /* same order, strided path */
    spconv_tensor *a = NULL, *b = NULL;
    SPCONV_ASSERT_OK(spconv_weight_to_rsck(NULL, src, SPCONV_WEIGHT_OIDHW, NULL, &a));
    SPCONV_ASSERT_OK(spconv_weight_to_rsck(NULL, view_back, SPCONV_WEIGHT_OIDHW, NULL, &b));
    assert_true(conv_same_bits(a, b));
    spconv_tensor_release(a);
    spconv_tensor_release(b);
    spconv_tensor_release(view);
    spconv_tensor_release(view_back);
    spconv_tensor_release(src);
    free(w);
}

static void test_weight_layout_errors(void **state) {
    (void)state;
    int64_t s3[3] = {27, 4, 5}, s5[5] = {3, 3, 3, 4, 5};
    spconv_tensor *w3 = NULL, *w5 = NULL, *out = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_zeros(NULL, spconv_cpu(), SPCONV_F32, 3, s3, &w3));
    SPCONV_ASSERT_OK(spconv_tensor_zeros(NULL, spconv_cpu(), SPCONV_F32, 5, s5, &w5));
    SPCONV_ASSERT_FAILS(spconv_weight_to_rsck(NULL, w3, SPCONV_WEIGHT_KRSC, NULL, &out),
                        SPCONV_ERR_SHAPE_MISMATCH,
                        "a weight in layout KRSC [C_out, KD, KH, KW, C_in] must be 5-d, got 3-d");
    SPCONV_ASSERT_FAILS(spconv_weight_to_rsck(NULL, w5, (spconv_weight_layout)7, NULL, &out),
                        SPCONV_ERR_INVALID_ARGUMENT, "unknown weight layout 7");
    int64_t k333[3] = {3, 3, 3}, k332[3] = {3, 3, 2}, k0[3] = {3, 0, 3};
    SPCONV_ASSERT_FAILS(spconv_weight_from_rsck(NULL, w3, k332, SPCONV_WEIGHT_OIDHW, &out),
                        SPCONV_ERR_SHAPE_MISMATCH,
                        "weight [27, 4, 5] is not RSCK [18, C_in, C_out]");
    SPCONV_ASSERT_FAILS(spconv_weight_from_rsck(NULL, w5, k332, SPCONV_WEIGHT_KRSC, &out),
                        SPCONV_ERR_SHAPE_MISMATCH, "for kernel (3, 3, 2)");
    SPCONV_ASSERT_FAILS(spconv_weight_from_rsck(NULL, w3, k0, SPCONV_WEIGHT_KRSC, &out),
                        SPCONV_ERR_INVALID_ARGUMENT, "kernel (3, 0, 3) must be positive");
    SPCONV_ASSERT_FAILS(spconv_weight_from_rsck(NULL, w3, NULL, SPCONV_WEIGHT_KRSC, &out),
                        SPCONV_ERR_NULL_POINTER, "'kernel'");
    /* 2^32 x 2^32 x 1 wrapped to 0 offsets, which a [0, C_in, C_out] weight then matched. */
    int64_t k_wraps[3] = {INT64_C(1) << 32, INT64_C(1) << 32, 1}, s_empty[3] = {0, 4, 5};
    spconv_tensor *w_empty = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_zeros(NULL, spconv_cpu(), SPCONV_F32, 3, s_empty, &w_empty));
    SPCONV_ASSERT_FAILS(spconv_weight_from_rsck(NULL, w_empty, k_wraps, SPCONV_WEIGHT_KRSC, &out),
                        SPCONV_ERR_OVERFLOW, "has more offsets than int64 holds");
    spconv_tensor_release(w_empty);
    SPCONV_ASSERT_FAILS(spconv_weight_to_rsck(NULL, NULL, SPCONV_WEIGHT_KRSC, NULL, &out),
                        SPCONV_ERR_NULL_POINTER, "'weight'");
    assert_null(out);
    SPCONV_ASSERT_OK(spconv_weight_from_rsck(NULL, w3, k333, SPCONV_WEIGHT_RSCK, &out));
    assert_int_equal(spconv_tensor_ndim(out), 5);
    spconv_tensor_release(out);
    spconv_tensor_release(w3);
    spconv_tensor_release(w5);
}

/* The scatter itself into a poisoned map: rows in random order (the tiles list their rows
 * themselves), cells that end inside a tile, channel counts below, at and past a block of 16,
 * every element size, 1 and 2 threads, large enough to run in parallel. Every element is the
 * site's value or zero bytes. */
static void test_scatter_channels_tiles(void **state) {
    (void)state;
    /* 40 and 70 channels make maps of over 2^20 elements, which the scatter runs in parallel */
    const int64_t cells = 4 * 4096 + 5, batch = 2;
    const int64_t channels_cases[5] = {1, 16, 17, 40, 70};
    const size_t elems[4] = {1, 2, 4, 8};
    assert_true(batch * 40 * cells > (1 << 20));
    for (int ci = 0; ci < 5; ++ci)
        for (int e = 0; e < 4; ++e)
            for (int threads = 1; threads <= 2; ++threads) {
                const int64_t channels = channels_cases[ci];
                const size_t elem = elems[e];
                const int64_t n = spconv_test_rand_int(0, 3000);
                /* distinct sites: a random sample of the batch x cells grid, shuffled */
                int64_t *site = malloc((size_t)(batch * cells) * sizeof *site);
                int64_t *at = malloc((size_t)(n > 0 ? n : 1) * sizeof *at);
                unsigned char *src = malloc((size_t)(n * channels) * elem + 1);
                const size_t bytes = (size_t)(batch * channels * cells) * elem;
                unsigned char *dst = malloc(bytes), *want = calloc(bytes, 1);
                assert_true(site && at && src && dst && want);
                for (int64_t i = 0; i < batch * cells; ++i) site[i] = i;
                for (int64_t i = 0; i < n; ++i) {
                    const int64_t j = i + spconv_test_rand_int(0, (int)(batch * cells - 1 - i));
                    const int64_t t = site[i];
                    site[i] = site[j];
                    site[j] = t;
                    at[i] = site[i] / cells * channels * cells + site[i] % cells;
                }
                for (int64_t i = 0; i < n * channels * (int64_t)elem; ++i)
                    src[i] = (unsigned char)spconv_test_rand_int(1, 255);
                memset(dst, 0xab, bytes);
                for (int64_t i = 0; i < n; ++i)
                    for (int64_t c = 0; c < channels; ++c)
                        memcpy(want + (size_t)(at[i] + c * cells) * elem,
                               src + (size_t)(i * channels + c) * elem, elem);
                spconv__cpu_scatter_channels(threads, elem, src, n, channels, at, cells, batch,
                                             dst);
                assert_memory_equal(dst, want, bytes);
                free(site);
                free(at);
                free(src);
                free(dst);
                free(want);
            }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sparse_to_dense_definition),
        cmocka_unit_test(test_sparse_to_dense_all_sizes_in_parallel),
        cmocka_unit_test(test_scatter_channels_tiles),
        cmocka_unit_test(test_dense_to_sparse_rules),
        cmocka_unit_test(test_dense_errors),
        cmocka_unit_test(test_weight_layouts),
        cmocka_unit_test(test_weight_layout_views),
        cmocka_unit_test(test_weight_layout_errors),
    };
    spconv_test_seed();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
