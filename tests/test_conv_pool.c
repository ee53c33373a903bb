/* Sparse max pooling: positive inputs against dense max pooling, negative inputs and ties against
 * a brute-force sparse reference (which also gives the argmax), backward from that argmax, the
 * pair-loop reference, thread counts, NaN and -inf inputs, and bad inputs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/conv_cases.h"
#include "common/conv_helpers.h"
#include "conv/conv_cpu.h"
#include "conv/conv_ref.h"

/* How the pooled values are drawn from the case's uniform [-1, 1) features. */
typedef enum value_kind { POSITIVE, NEGATIVE, FEW_LEVELS } value_kind;

static void shape_values(conv_case *c, value_kind kind) {
    for (int64_t i = 0; i < c->n_in * c->c_in; ++i) {
        double u = c->x[i];
        c->x[i] = kind == POSITIVE   ? 0.5 + 0.5 * u
                  : kind == NEGATIVE ? -0.5 - 0.5 * u
                                     : floor(2.0 * u) - 1.0;
    }
}

/* Rows [n, channels] at @p cells scattered into a zeroed grid of @p grid_cells cells (caller
 * frees), and the reverse. */
static double *rows_to_grid(const double *rows, const int64_t *cells, int64_t n, int64_t channels,
                            int64_t grid_cells) {
    double *grid = calloc((size_t)(grid_cells * channels) + 1, sizeof(double));
    assert_non_null(grid);
    for (int64_t i = 0; i < n; ++i)
        memcpy(grid + cells[i] * channels, rows + i * channels, (size_t)channels * sizeof(double));
    return grid;
}

static void grid_to_rows(const double *grid, const int64_t *cells, int64_t n, int64_t channels,
                         double *rows) {
    for (int64_t i = 0; i < n; ++i)
        memcpy(rows + i * channels, grid + cells[i] * channels, (size_t)channels * sizeof(double));
}

static void fail_case(const conv_case *c, const char *what, int64_t index) {
    char text[512];
    fail_msg("%s: %s differs at element %lld", conv_case_text(c, text, sizeof text), what,
             (long long)index);
}

/* Without an argmax (inference) the forward keeps values only, by another kernel: the same
 * bytes as with it, NaN and -inf included. */
static void assert_values_only_same(spconv_context *ctx, const spconv_rulebook *rb,
                                    const spconv_tensor *x, const spconv_tensor *with_argmax) {
    spconv_tensor *y = NULL;
    SPCONV_ASSERT_OK(spconv_maxpool_forward(ctx, rb, x, &y, NULL));
    const size_t bytes = (size_t)spconv_tensor_numel(y) * spconv_dtype_size(spconv_tensor_dtype(y));
    assert_int_equal(spconv_tensor_numel(y), spconv_tensor_numel(with_argmax));
    if (bytes > 0)
        assert_memory_equal(spconv_tensor_data(y), spconv_tensor_data(with_argmax), bytes);
    spconv_tensor_release(y);
}

/* Pool the case in @p dtype with @p ctx; values and argmax as host arrays (caller frees). */
static void run_pool(spconv_context *ctx, const conv_case *c, spconv_dtype dtype, double **values,
                     int32_t **argmax) {
    int64_t sizes[2] = {c->n_in, c->c_in};
    spconv_tensor *x = conv_tensor(dtype, 2, sizes, c->x), *y = NULL, *arg = NULL;
    SPCONV_ASSERT_OK(spconv_maxpool_forward(ctx, c->rb, x, &y, &arg));
    assert_int_equal(spconv_tensor_size(y, 0), c->n_out);
    assert_int_equal(spconv_tensor_size(arg, 1), c->c_in);
    *values = conv_read(y, NULL);
    *argmax = conv_read_i32(arg);
    assert_values_only_same(ctx, c->rb, x, y);
    spconv_tensor_release(x);
    spconv_tensor_release(y);
    spconv_tensor_release(arg);
}

/* Forward (and backward from the oracle's argmax) of one case against the brute-force sparse
 * reference and, for positive values, dense max pooling. Max pooling selects values, so both
 * dtypes must match exactly. */
static void check_pool(conv_case *c, value_kind kind) {
    spconv_context *ctx = conv_context(1); /* threads: test_pool_reference_and_threads */
    conv_case_setup(c, ctx);
    shape_values(c, kind);
    const int64_t n = c->n_out * c->c_in;
    double *want = calloc((size_t)n + 1, sizeof(double));
    int32_t *want_arg = calloc((size_t)n + 1, sizeof(int32_t));
    assert_true(want != NULL && want_arg != NULL);
    oracle_geometry g = oracle_geometry_from_params(&c->params);
    oracle_sparse_maxpool(&g, c->in_rows, c->n_in, c->x, c->out_rows, c->n_out, c->c_in, want,
                          want_arg);
    if (kind == POSITIVE) {
        int64_t in_cells = c->batch * oracle_cells(c->links.in_shape);
        int64_t out_cells = c->batch * oracle_cells(c->links.out_shape);
        double *x_grid = rows_to_grid(c->x, c->in_cells, c->n_in, c->c_in, in_cells);
        double *y_grid = calloc((size_t)(out_cells * c->c_in) + 1, sizeof(double));
        assert_non_null(y_grid);
        oracle_dense_maxpool(&c->links, &g, c->c_in, x_grid, y_grid);
        double *dense = calloc((size_t)n + 1, sizeof(double));
        assert_non_null(dense);
        grid_to_rows(y_grid, c->out_cells, c->n_out, c->c_in, dense);
        for (int64_t i = 0; i < n; ++i)
            if (dense[i] != want[i]) fail_case(c, "brute force vs dense pooling", i);
        free(dense);
        free(x_grid);
        free(y_grid);
    }
    for (int d = 0; d < 2; ++d) {
        double *got;
        int32_t *got_arg;
        run_pool(ctx, c, d == 0 ? SPCONV_F32 : SPCONV_F64, &got, &got_arg);
        for (int64_t i = 0; i < n; ++i) {
            if (got[i] != want[i]) fail_case(c, "max", i);
            if (got_arg[i] != want_arg[i]) fail_case(c, "argmax", i);
        }
        free(got);
        free(got_arg);
    }
    free(want);
    free(want_arg);
    conv_case_free(c);
    spconv_context_destroy(ctx);
}

/* Every combination of kernel {2, 3}, stride {1, 2, 3}, padding {0, 1, 2}, dilation {1, 2, 3}
 * on spconv's test sizes, batch 1 and 2, 16 channels (pooling cost is per channel and the
 * channels are independent, so more would only repeat the same checks). */
static void pool_grid(value_kind kind) {
    for (int64_t batch = 1; batch <= 2; ++batch)
        for (int64_t k = 2; k <= 3; ++k)
            for (int64_t s = 1; s <= 3; ++s)
                for (int64_t p = 0; p <= 2; ++p)
                    for (int64_t d = 1; d <= 3; ++d) {
                        conv_case c =
                            conv_case_make(conv_params_iso(SPCONV_CONV_REGULAR, k, s, p, d),
                                           (int64_t[3]){19, 18, 17}, batch, 1500, 16, 0);
                        check_pool(&c, kind);
                    }
}

static void test_pool_positive_vs_dense(void **state) {
    (void)state;
    pool_grid(POSITIVE);
}

static void test_pool_negative_vs_brute_force(void **state) {
    (void)state;
    pool_grid(NEGATIVE);
}

/* Values on four levels tie often: the argmax must be the input of the smallest offset k. Also
 * anisotropic windows and channel counts that are not multiples of 4. */
static void test_pool_ties_and_anisotropic(void **state) {
    (void)state;
    for (int i = 0; i < 40; ++i) {
        int64_t shape[3] = {spconv_test_rand_int(4, 14), spconv_test_rand_int(4, 14),
                            spconv_test_rand_int(4, 14)};
        spconv_conv_params p = spconv_conv_params_default(SPCONV_CONV_REGULAR);
        int64_t out_shape[3];
        oracle_geometry g;
        do { /* redraw until the output is not empty */
            for (int a = 0; a < 3; ++a) {
                p.kernel[a] = spconv_test_rand_int(1, 3);
                p.stride[a] = spconv_test_rand_int(1, 3);
                p.padding[a] = spconv_test_rand_int(0, 1);
                p.dilation[a] = spconv_test_rand_int(1, 2);
            }
            g = oracle_geometry_from_params(&p);
        } while (!oracle_regular_shape(&g, shape, out_shape));
        conv_case c = conv_case_make(p, shape, spconv_test_rand_int(1, 2),
                                     spconv_test_rand_int(1, oracle_cells(shape) / 2),
                                     spconv_test_rand_int(1, 7), 0);
        check_pool(&c, i % 2 == 0 ? FEW_LEVELS : NEGATIVE);
    }
}

/* Backward: grad_in[argmax[o, c], c] += grad_out[o, c]; several outputs can share an input. */
static void test_pool_backward(void **state) {
    (void)state;
    /* The last three do not overlap their windows (kernel == stride), so each input has one pair
     * at most; with padding 0 on these odd axes the far rows have none. */
    for (int i = 0; i < 9; ++i) {
        const spconv_conv_params p = i < 6 ? conv_params_iso(SPCONV_CONV_REGULAR, 3, 1 + i % 3, 1, 1)
                                           : conv_params_iso(SPCONV_CONV_REGULAR, 2, 2, i % 2, 1);
        conv_case c = conv_case_make(p, (int64_t[3]){19, 18, 17}, 2, 1500, 13, 0);
        conv_case_setup(&c, NULL);
        const int64_t n_out = c.n_out * c.c_in;
        double *y = calloc((size_t)n_out + 1, sizeof(double));
        int32_t *arg = calloc((size_t)n_out + 1, sizeof(int32_t));
        double *want = calloc((size_t)(c.n_in * c.c_in) + 1, sizeof(double));
        assert_true(y != NULL && arg != NULL && want != NULL);
        oracle_geometry g = oracle_geometry_from_params(&c.params);
        oracle_sparse_maxpool(&g, c.in_rows, c.n_in, c.x, c.out_rows, c.n_out, c.c_in, y, arg);
        double *dy = conv_random_values(n_out, -1.0, 1.0);
        for (int64_t j = 0; j < n_out; ++j) want[arg[j] * c.c_in + j % c.c_in] += dy[j];
        for (int d = 0; d < 2; ++d) {
            spconv_dtype dtype = d == 0 ? SPCONV_F32 : SPCONV_F64;
            int64_t x_sizes[2] = {c.n_in, c.c_in}, y_sizes[2] = {c.n_out, c.c_in};
            spconv_tensor *x = conv_tensor(dtype, 2, x_sizes, c.x), *yt = NULL, *at = NULL;
            spconv_tensor *g_out = conv_tensor(dtype, 2, y_sizes, dy), *gx = NULL, *gx_ref = NULL;
            SPCONV_ASSERT_OK(spconv_maxpool_forward(NULL, c.rb, x, &yt, &at));
            SPCONV_ASSERT_OK(spconv_maxpool_backward(NULL, c.rb, at, g_out, &gx));
            SPCONV_ASSERT_OK(spconv__maxpool_backward_ref(NULL, c.rb, at, g_out, &gx_ref));
            double *got = conv_read(gx, NULL), *got_ref = conv_read(gx_ref, NULL);
            /* Each input collects at most KV terms, added in the same output order by all. */
            char text[512];
            double err = oracle_rel_error(got, want, c.n_in * c.c_in);
            double err_ref = oracle_rel_error(got_ref, want, c.n_in * c.c_in);
            if (err > (d == 0 ? 1e-6 : 0.0) || err_ref > (d == 0 ? 1e-6 : 0.0))
                fail_msg("%s: pool backward error %.3g (reference %.3g)",
                         conv_case_text(&c, text, sizeof text), err, err_ref);
            free(got);
            free(got_ref);
            spconv_tensor_release(x);
            spconv_tensor_release(yt);
            spconv_tensor_release(at);
            spconv_tensor_release(g_out);
            spconv_tensor_release(gx);
            spconv_tensor_release(gx_ref);
        }
        free(dy);
        free(y);
        free(arg);
        free(want);
        conv_case_free(&c);
    }
}

/* The fast path equals the pair-loop reference bit for bit (a selection has no rounding), and
 * 1 and 2 threads agree, forward and backward. */
static void test_pool_reference_and_threads(void **state) {
    (void)state;
    spconv_context *one = conv_context(1), *two = conv_context(2);
    /* Overlapping windows, then a pool of kernel == stride (one pair per input at most, so the
     * reference's bits), whose gradient has zeros of both signs; then the same pool with an
     * output of over 4 MiB at 161 channels, so that blocks start off the 16-byte grid. Each
     * twice: the outputs kept in the caches, then streamed out of them (the threshold lowered
     * from its 64 MiB, spconv__pool_stream_min_bytes). */
    const size_t stream_default = spconv__pool_stream_min_bytes(0);
    for (int run = 0; run < 6; ++run) {
    const int kind = run % 3;
    spconv__pool_stream_min_bytes(run < 3 ? stream_default : 1);
    conv_case c = conv_case_make(kind == 0 ? conv_params_iso(SPCONV_CONV_REGULAR, 3, 2, 1, 1)
                                           : conv_params_iso(SPCONV_CONV_REGULAR, 2, 2, 0, 1),
                                 kind < 2 ? (int64_t[3]){19, 18, 17} : (int64_t[3]){40, 41, 42},
                                 2, kind < 2 ? 1500 : 12000, kind < 2 ? 64 : 161, 0);
    conv_case_setup(&c, NULL);
    if (kind == 2) assert_true(c.n_out * c.c_in * (int64_t)sizeof(float) >= INT64_C(4) << 20);
    int64_t x_sizes[2] = {c.n_in, c.c_in}, y_sizes[2] = {c.n_out, c.c_in};
    double *dy = conv_random_values(c.n_out * c.c_in, -1.0, 1.0);
    for (int64_t j = 0; j < c.n_out * c.c_in; j += 3) dy[j] = j % 2 ? -0.0 : 0.0;
    for (int d = 0; d < 2; ++d) {
        spconv_dtype dtype = d == 0 ? SPCONV_F32 : SPCONV_F64;
        spconv_tensor *x = conv_tensor(dtype, 2, x_sizes, c.x),
                      *g = conv_tensor(dtype, 2, y_sizes, dy);
        spconv_tensor *y[3], *a[3], *gx[2];
        SPCONV_ASSERT_OK(spconv_maxpool_forward(one, c.rb, x, &y[0], &a[0]));
        SPCONV_ASSERT_OK(spconv_maxpool_forward(two, c.rb, x, &y[1], &a[1]));
        SPCONV_ASSERT_OK(spconv__maxpool_forward_ref(NULL, c.rb, x, &y[2], &a[2]));
        for (int j = 1; j < 3; ++j) {
            assert_true(conv_same_bits(y[0], y[j]));
            assert_true(conv_same_bits(a[0], a[j]));
        }
        SPCONV_ASSERT_OK(spconv_maxpool_backward(one, c.rb, a[0], g, &gx[0]));
        SPCONV_ASSERT_OK(spconv_maxpool_backward(two, c.rb, a[0], g, &gx[1]));
        assert_true(conv_same_bits(gx[0], gx[1]));
        if (kind >= 1) { /* one term per input: no order of summation, the reference's bits */
            spconv_tensor *gx_ref = NULL;
            SPCONV_ASSERT_OK(spconv__maxpool_backward_ref(NULL, c.rb, a[0], g, &gx_ref));
            assert_true(conv_same_bits(gx[0], gx_ref));
            spconv_tensor_release(gx_ref);
        }
        for (int j = 0; j < 3; ++j) {
            spconv_tensor_release(y[j]);
            spconv_tensor_release(a[j]);
        }
        spconv_tensor_release(gx[0]);
        spconv_tensor_release(gx[1]);
        spconv_tensor_release(x);
        spconv_tensor_release(g);
    }
    free(dy);
    conv_case_free(&c);
    }
    spconv__pool_stream_min_bytes(stream_default);
    spconv_context_destroy(one);
    spconv_context_destroy(two);
}

/* Sites (0,0,0,0) and (0,0,0,1) pooled by one 1x1x2 window: NaN wins and propagates; -inf
 * inputs still name an argmax; an empty input gives an empty output. */
static void test_pool_special_values(void **state) {
    (void)state;
    int32_t rows[8] = {0, 0, 0, 0, 0, 0, 0, 1};
    spconv_conv_params p = conv_params_iso(SPCONV_CONV_REGULAR, 1, 1, 0, 1);
    p.kernel[2] = 2;
    p.stride[2] = 2;
    spconv_rulebook *rb = conv_build(NULL, rows, 2, (int64_t[3]){1, 1, 2}, 1, &p);
    assert_int_equal(spconv_rulebook_num_out(rb), 1);
    double values[6] = {1.0, -INFINITY, NAN, /* row 0 */ 2.0, -INFINITY, 5.0 /* row 1 */};
    int64_t sizes[2] = {2, 3};
    spconv_tensor *x = conv_tensor(SPCONV_F32, 2, sizes, values), *y = NULL, *a = NULL;
    SPCONV_ASSERT_OK(spconv_maxpool_forward(NULL, rb, x, &y, &a));
    assert_values_only_same(NULL, rb, x, y);
    double *got = conv_read(y, NULL);
    int32_t *arg = conv_read_i32(a);
    assert_true(got[0] == 2.0 && arg[0] == 1);
    assert_true(isinf(got[1]) && got[1] < 0 && arg[1] == 0);
    assert_true(isnan(got[2]) && arg[2] == 0);
    free(got);
    free(arg);
    spconv_tensor_release(y);
    spconv_tensor_release(a);
    spconv_tensor_release(x);
    spconv_rulebook_release(rb);

    conv_case empty = conv_case_make(conv_params_iso(SPCONV_CONV_REGULAR, 2, 2, 0, 1),
                                     (int64_t[3]){4, 4, 4}, 1, 0, 5, 0);
    check_pool(&empty, NEGATIVE);
}

static void test_pool_errors(void **state) {
    (void)state;
    int64_t shape[3] = {6, 6, 6};
    int32_t *sites = oracle_random_sites(1, shape, 10);
    spconv_conv_params regular = conv_params_iso(SPCONV_CONV_REGULAR, 2, 2, 0, 1);
    spconv_conv_params subm = conv_params_iso(SPCONV_CONV_SUBM, 3, 1, 0, 1);
    spconv_rulebook *rb = conv_build(NULL, sites, 10, shape, 1, &regular);
    spconv_rulebook *rb_subm = conv_build(NULL, sites, 10, shape, 1, &subm);
    int64_t n_out = spconv_rulebook_num_out(rb);
    int64_t x_sizes[2] = {10, 3}, x_bad[2] = {9, 3}, y_sizes[2] = {n_out, 3};
    int64_t g_sizes[2] = {n_out + 1, 3};
    spconv_tensor *x = NULL, *x9 = NULL, *x_int = NULL, *y = NULL, *a = NULL, *a_f32 = NULL;
    spconv_tensor *a_bad = NULL, *g_bad = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_full(NULL, spconv_cpu(), SPCONV_F32, 2, x_sizes, 1.0, &x));
    SPCONV_ASSERT_OK(spconv_tensor_full(NULL, spconv_cpu(), SPCONV_F32, 2, x_bad, 1.0, &x9));
    SPCONV_ASSERT_OK(spconv_tensor_full(NULL, spconv_cpu(), SPCONV_I32, 2, x_sizes, 1.0, &x_int));
    SPCONV_ASSERT_OK(spconv_tensor_full(NULL, spconv_cpu(), SPCONV_F32, 2, y_sizes, 1.0, &a_f32));
    SPCONV_ASSERT_OK(spconv_tensor_full(NULL, spconv_cpu(), SPCONV_I32, 2, y_sizes, 10.0, &a_bad));
    SPCONV_ASSERT_OK(spconv_tensor_full(NULL, spconv_cpu(), SPCONV_F32, 2, g_sizes, 1.0, &g_bad));

    SPCONV_ASSERT_FAILS(spconv_maxpool_forward(NULL, rb, x, NULL, &a), SPCONV_ERR_NULL_POINTER,
                        "spconv_maxpool_forward: 'out' is NULL");
    SPCONV_ASSERT_FAILS(spconv_maxpool_forward(NULL, rb_subm, x, &y, &a),
                        SPCONV_ERR_INVALID_ARGUMENT, "max pooling needs a REGULAR rulebook");
    SPCONV_ASSERT_FAILS(spconv_maxpool_forward(NULL, rb, x9, &y, &a), SPCONV_ERR_SHAPE_MISMATCH,
                        "features has 9 rows, expected 10");
    SPCONV_ASSERT_FAILS(spconv_maxpool_forward(NULL, rb, x_int, &y, &a), SPCONV_ERR_NOT_SUPPORTED,
                        "not i32");
    assert_null(y);
    assert_null(a);
    SPCONV_ASSERT_OK(spconv_maxpool_forward(NULL, rb, x, &y, &a));
    spconv_tensor *gx = NULL;
    SPCONV_ASSERT_FAILS(spconv_maxpool_backward(NULL, rb, a_f32, y, &gx), SPCONV_ERR_DTYPE_MISMATCH,
                        "argmax must be i32, got f32");
    char expected[96];
    snprintf(expected, sizeof expected,
             "spconv_maxpool_backward: grad_out has %lld rows, expected %lld", (long long)n_out + 1,
             (long long)n_out);
    SPCONV_ASSERT_FAILS(spconv_maxpool_backward(NULL, rb, a, g_bad, &gx), SPCONV_ERR_SHAPE_MISMATCH,
                        expected);
    SPCONV_ASSERT_FAILS(spconv_maxpool_backward(NULL, rb, a_bad, y, &gx), SPCONV_ERR_OUT_OF_RANGE,
                        "argmax[0, 0] = 10 is not -1 or an input row below 10");
    SPCONV_ASSERT_FAILS(spconv__maxpool_backward_ref(NULL, rb, a_bad, y, &gx),
                        SPCONV_ERR_OUT_OF_RANGE, "argmax[0, 0] = 10");
    /* The last row bad, then an earlier column of it: the first bad element in row-major order
     * is named, whichever end of int32 it lies at (-1 itself is allowed: an empty window). */
    spconv_tensor *a_edge = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_clone(NULL, a, &a_edge));
    int32_t *edge = spconv_tensor_data(a_edge);
    edge[3 * (n_out - 1)] = -1;
    SPCONV_ASSERT_OK(spconv_maxpool_backward(NULL, rb, a_edge, y, &gx));
    spconv_tensor_release(gx);
    gx = NULL;
    const int32_t bad_values[3] = {-2, INT32_MAX, INT32_MIN};
    for (int v = 0; v < 3; ++v) {
        edge[3 * (n_out - 1) + 2] = bad_values[v];
        snprintf(expected, sizeof expected, "argmax[%lld, 2] = %d is not -1", (long long)n_out - 1,
                 (int)bad_values[v]);
        SPCONV_ASSERT_FAILS(spconv_maxpool_backward(NULL, rb, a_edge, y, &gx),
                            SPCONV_ERR_OUT_OF_RANGE, expected);
    }
    edge[3 * (n_out - 1) + 1] = 10;
    snprintf(expected, sizeof expected, "argmax[%lld, 1] = 10 is not -1", (long long)n_out - 1);
    SPCONV_ASSERT_FAILS(spconv_maxpool_backward(NULL, rb, a_edge, y, &gx), SPCONV_ERR_OUT_OF_RANGE,
                        expected);
    spconv_tensor_release(a_edge);
    SPCONV_ASSERT_FAILS(spconv_maxpool_backward(NULL, rb, NULL, y, &gx), SPCONV_ERR_NULL_POINTER,
                        "'argmax'");
    assert_null(gx);

    spconv_tensor *tensors[8] = {x, x9, x_int, y, a, a_f32, a_bad, g_bad};
    for (int i = 0; i < 8; ++i) spconv_tensor_release(tensors[i]);
    spconv_rulebook_release(rb);
    spconv_rulebook_release(rb_subm);
    free(sites);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_positive_vs_dense),
        cmocka_unit_test(test_pool_negative_vs_brute_force),
        cmocka_unit_test(test_pool_ties_and_anisotropic),
        cmocka_unit_test(test_pool_backward),
        cmocka_unit_test(test_pool_reference_and_threads),
        cmocka_unit_test(test_pool_special_values),
        cmocka_unit_test(test_pool_errors),
    };
    spconv_test_seed();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
