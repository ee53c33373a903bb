/* indice_conv backward: d_features, d_weight, d_bias against the dense oracle's hand-derived
 * gradients, against central finite differences of the forward in f64, against the pair-loop
 * reference, and the backward-specific contracts (zeros for offsets without pairs, optional
 * outputs, the weight's shape, bad inputs). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/conv_cases.h"
#include "common/conv_helpers.h"
#include "conv/conv_exec.h"
#include "conv/conv_ref.h"
#include "conv/fused.h"

static double *alloc_doubles(int64_t n) {
    double *p = calloc((size_t)n + 1, sizeof(double));
    assert_non_null(p);
    return p;
}

/* Backward of the case in @p dtype for grad_out rows @p dy; grads[0..2] = d_features, d_weight,
 * d_bias (new tensors). */
static void run_backward(spconv_context *ctx, const conv_case *c, spconv_dtype dtype,
                         const double *dy, spconv_tensor *grads[3]) {
    spconv_tensor *x = conv_case_features(c, dtype), *w = conv_case_weight(c, dtype);
    spconv_tensor *g = conv_case_grad_out(c, dtype, dy);
    SPCONV_ASSERT_OK(spconv_conv_backward(ctx, c->rb, x, w, g, &grads[0], &grads[1], &grads[2]));
    spconv_tensor_release(x);
    spconv_tensor_release(w);
    spconv_tensor_release(g);
}

/* Set up @p c (unless it is already), draw grad_out and hold the three gradients to the dense
 * oracle, in f32 and f64. */
static void check_backward(conv_case *c) {
    spconv_context *ctx = conv_context(1); /* threads: see test_conv.c check_forward */
    if (c->rb == NULL) conv_case_setup(c, ctx);
    double *dy = conv_random_values(c->n_out * c->c_out, -1.0, 1.0);
    double *want[3] = {alloc_doubles(c->n_in * c->c_in),
                       alloc_doubles(c->kernel_volume * c->c_in * c->c_out),
                       alloc_doubles(c->c_out)};
    int64_t counts[3] = {c->n_in * c->c_in, c->kernel_volume * c->c_in * c->c_out, c->c_out};
    static const char *const names[3] = {"d_features", "d_weight", "d_bias"};
    conv_case_oracle_backward(c, dy, want[0], want[1], want[2]);
    for (int d = 0; d < 2; ++d) {
        spconv_dtype dtype = d == 0 ? SPCONV_F32 : SPCONV_F64;
        spconv_tensor *grads[3];
        run_backward(ctx, c, dtype, dy, grads);
        for (int j = 0; j < 3; ++j) {
            int64_t n;
            double *got = conv_read(grads[j], &n);
            assert_int_equal(n, counts[j]);
            char what[64];
            snprintf(what, sizeof what, "%s %s", names[j], spconv_dtype_name(dtype));
            conv_case_expect_close(c, what, got, want[j], n, conv_tolerance(dtype));
            free(got);
            spconv_tensor_release(grads[j]);
        }
    }
    for (int j = 0; j < 3; ++j) free(want[j]);
    free(dy);
    conv_case_free(c);
    spconv_context_destroy(ctx);
}

/* The kernel/stride/padding/dilation grid of test_conv.c at batch 2 with C_in 32. The backward
 * oracle costs twice the forward one, so instead of every C_out per geometry the combinations
 * cycle through C_out {32, 48, 64} (each geometry once, each C_out on a third of them). */
static void test_backward_grid(void **state) {
    (void)state;
    static const int64_t c_outs[3] = {32, 48, 64};
    int combo = 0;
    for (int64_t k = 2; k <= 3; ++k)
        for (int64_t s = 1; s <= 3; ++s)
            for (int64_t p = 0; p <= 2; ++p)
                for (int64_t d = 1; d <= 3; ++d, ++combo) {
                    conv_case c =
                        conv_case_make(conv_params_iso(SPCONV_CONV_REGULAR, k, s, p, d),
                                       (int64_t[3]){19, 18, 17}, 2, 1500, 32, c_outs[combo % 3]);
                    check_backward(&c);
                }
}

/* A random small case of @p kind with anisotropic geometry (as in test_conv.c). */
static conv_case random_case(spconv_conv_kind kind) {
    int64_t shape[3];
    for (int a = 0; a < 3; ++a) shape[a] = spconv_test_rand_int(3, 14);
    spconv_conv_params p = conv_case_random_params(kind, shape, 1);
    return conv_case_make(p, shape, spconv_test_rand_int(1, 2),
                          spconv_test_rand_int(1, oracle_cells(shape) / 3 + 1),
                          spconv_test_rand_int(1, 13), spconv_test_rand_int(1, 11));
}

static void test_backward_kinds(void **state) {
    (void)state;
    for (int64_t d = 1; d <= 3; ++d) {
        conv_case c = conv_case_make(conv_params_iso(SPCONV_CONV_SUBM, 3, 1, 0, d),
                                     (int64_t[3]){19, 18, 17}, 2, 1500, 32, 16 * (d + 1));
        check_backward(&c);
    }
    conv_case t = conv_case_make(conv_params_iso(SPCONV_CONV_TRANSPOSED, 3, 2, 1, 1),
                                 (int64_t[3]){12, 11, 10}, 2, 500, 32, 48);
    for (int a = 0; a < 3; ++a) t.params.output_padding[a] = 1;
    check_backward(&t);
    conv_case inv = conv_case_make(conv_params_iso(SPCONV_CONV_INVERSE, 3, 2, 1, 1),
                                   (int64_t[3]){19, 18, 17}, 2, 1500, 48, 32);
    check_backward(&inv);
    /* Channel counts of 0 and an empty input: the gradients that exist are zeros. */
    int64_t channels[3][2] = {{0, 5}, {4, 0}, {3, 2}};
    for (int i = 0; i < 3; ++i) {
        conv_case c =
            conv_case_make(conv_params_iso(SPCONV_CONV_SUBM, 3, 1, 0, 1), (int64_t[3]){6, 6, 6}, 1,
                           i == 2 ? 0 : 20, channels[i][0], channels[i][1]);
        check_backward(&c);
    }
    static const spconv_conv_kind kinds[4] = {SPCONV_CONV_REGULAR, SPCONV_CONV_SUBM,
                                              SPCONV_CONV_TRANSPOSED, SPCONV_CONV_INVERSE};
    for (int i = 0; i < 80; ++i) {
        spconv_conv_kind kind = kinds[i % 4];
        conv_case c = random_case(kind == SPCONV_CONV_INVERSE ? SPCONV_CONV_REGULAR : kind);
        c.params.kind = kind;
        check_backward(&c);
    }
}

/* Wide inputs make short blocks of input rows (1024 channels: 256 rows in f32, 128 in f64), so
 * d_features is cut into dozens of blocks and the weight gradient into up to 16 groups of one or
 * more blocks, summed in group order. */
static void test_backward_many_blocks(void **state) {
    (void)state;
    static const spconv_conv_kind kinds[4] = {SPCONV_CONV_REGULAR, SPCONV_CONV_SUBM,
                                              SPCONV_CONV_TRANSPOSED, SPCONV_CONV_INVERSE};
    for (int i = 0; i < 4; ++i) {
        int transposed = kinds[i] == SPCONV_CONV_TRANSPOSED;
        conv_case c = conv_case_make(conv_params_iso(kinds[i], 3, i == 1 ? 1 : 2, 1, 1),
                                     (int64_t[3]){20, 20, 20}, 1, transposed ? 1000 : 3000,
                                     transposed ? 256 : 1024, 3);
        check_backward(&c);
    }
}

/* Each gradient asked for alone has the bits it has in the full call (f32 and f64, 2 threads). */
static void check_alone_as_in_full(conv_case *c) {
    spconv_context *ctx = conv_context(2);
    conv_case_setup(c, ctx);
    double *dy = conv_random_values(c->n_out * c->c_out, -1.0, 1.0);
    for (int d = 0; d < 2; ++d) {
        spconv_dtype dtype = d == 0 ? SPCONV_F32 : SPCONV_F64;
        spconv_tensor *x = conv_case_features(c, dtype), *w = conv_case_weight(c, dtype);
        spconv_tensor *g = conv_case_grad_out(c, dtype, dy), *full[3], *alone[3];
        SPCONV_ASSERT_OK(spconv_conv_backward(ctx, c->rb, x, w, g, &full[0], &full[1], &full[2]));
        SPCONV_ASSERT_OK(spconv_conv_backward(ctx, c->rb, x, w, g, &alone[0], NULL, NULL));
        SPCONV_ASSERT_OK(spconv_conv_backward(ctx, c->rb, x, w, g, NULL, &alone[1], NULL));
        SPCONV_ASSERT_OK(spconv_conv_backward(ctx, c->rb, x, w, g, NULL, NULL, &alone[2]));
        char text[512];
        for (int j = 0; j < 3; ++j) {
            if (!conv_same_bits(alone[j], full[j]))
                fail_msg("%s %s: gradient %d alone differs from the full call",
                         conv_case_text(c, text, sizeof text), spconv_dtype_name(dtype), j);
            spconv_tensor_release(alone[j]);
            spconv_tensor_release(full[j]);
        }
        spconv_tensor_release(x);
        spconv_tensor_release(w);
        spconv_tensor_release(g);
    }
    free(dy);
    conv_case_free(c);
    spconv_context_destroy(ctx);
}

/* Inputs of more than 8192 rows: with the fused kernels the weight gradient is computed inside
 * the data gradient's blocks (joint mode, conv_backward.c), in up to 7 segments of blocks and a
 * tail, summed in order (wider channels make shorter blocks, so more of them per segment);
 * every kind, the subm centre offset and its mirrored pairs included. The cases are checked to
 * take that mode where the machine has the fused kernels; d_weight asked for alone takes it too
 * and has the full call's bits. */
static void test_backward_joint(void **state) {
    (void)state;
    const int64_t shape[3] = {24, 24, 24};
    conv_case cases[5] = {
        conv_case_make(conv_params_iso(SPCONV_CONV_SUBM, 3, 1, 0, 1), shape, 1, 10000, 5, 6),
        conv_case_make(conv_params_iso(SPCONV_CONV_SUBM, 3, 1, 0, 2), shape, 2, 6000, 40, 48),
        conv_case_make(conv_params_iso(SPCONV_CONV_REGULAR, 3, 1, 1, 1), shape, 1, 9000, 24, 32),
        conv_case_make(conv_params_iso(SPCONV_CONV_TRANSPOSED, 3, 2, 1, 1), shape, 1, 9000, 6, 3),
        /* the inverse of a stride-1 conv: its input is that conv's output, ~13,000 rows */
        conv_case_make(conv_params_iso(SPCONV_CONV_INVERSE, 3, 1, 1, 1), shape, 1, 6000, 32, 16),
    };
    for (int i = 0; i < 5; ++i) {
        if (spconv__fused_available()) {
            conv_case_setup(&cases[i], NULL);
            char text[512];
            for (int d = 0; d < 2; ++d)
                if (!spconv__conv_backward_joint(cases[i].rb, d ? SPCONV_F64 : SPCONV_F32,
                                                 cases[i].c_in, cases[i].c_out))
                    fail_msg("%s: not in joint mode", conv_case_text(&cases[i], text, sizeof text));
        }
        check_backward(&cases[i]);
    }
    for (int i = 0; i < 2; ++i) {
        conv_case c = conv_case_make(conv_params_iso(i ? SPCONV_CONV_REGULAR : SPCONV_CONV_SUBM, 3,
                                                     1, i, 1),
                                     shape, 1, 10000, 24, 32);
        check_alone_as_in_full(&c);
    }
}

/* L = sum(forward(x, w, b) * r) in f64 through the public forward. */
static double loss(const conv_case *c, const double *x, const double *w, const double *b,
                   const double *r) {
    int64_t x_sizes[2] = {c->n_in, c->c_in}, w_sizes[3] = {c->kernel_volume, c->c_in, c->c_out};
    spconv_tensor *xt = conv_tensor(SPCONV_F64, 2, x_sizes, x);
    spconv_tensor *wt = conv_tensor(SPCONV_F64, 3, w_sizes, w);
    spconv_tensor *bt = conv_tensor(SPCONV_F64, 1, &c->c_out, b), *out = NULL;
    SPCONV_ASSERT_OK(spconv_conv_forward(NULL, c->rb, xt, wt, bt, &out));
    int64_t n;
    double *y = conv_read(out, &n), sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += y[i] * r[i];
    free(y);
    spconv_tensor_release(out);
    spconv_tensor_release(xt);
    spconv_tensor_release(wt);
    spconv_tensor_release(bt);
    return sum;
}

/* Central differences of L in every entry of @p param (one of c->x, c->w, c->bias). L is linear
 * in each of them, so the difference is exact up to rounding (about eps * |L| / h). */
static void finite_differences(conv_case *c, double *param, int64_t n, const double *r,
                               double *out) {
    const double h = 1e-3;
    for (int64_t i = 0; i < n; ++i) {
        double saved = param[i];
        param[i] = saved + h;
        double up = loss(c, c->x, c->w, c->bias, r);
        param[i] = saved - h;
        double down = loss(c, c->x, c->w, c->bias, r);
        param[i] = saved;
        out[i] = (up - down) / (2 * h);
    }
}

/* Small f64 cases of every kind: every entry of d_features, d_weight and d_bias against central
 * finite differences of the forward. */
static void test_backward_finite_differences(void **state) {
    (void)state;
    static const spconv_conv_kind kinds[4] = {SPCONV_CONV_REGULAR, SPCONV_CONV_SUBM,
                                              SPCONV_CONV_TRANSPOSED, SPCONV_CONV_INVERSE};
    for (int i = 0; i < 8; ++i) {
        conv_case c = conv_case_make(conv_params_iso(kinds[i % 4], 3, 2, 1, 1 + i / 4),
                                     (int64_t[3]){5, 6, 7}, 2, 12, 3, 4);
        c.params.kernel[2] = kinds[i % 4] == SPCONV_CONV_SUBM ? 1 : 2;
        conv_case_setup(&c, NULL);
        double *r = conv_random_values(c.n_out * c.c_out, -1.0, 1.0);
        spconv_tensor *grads[3];
        run_backward(NULL, &c, SPCONV_F64, r, grads);
        double *params[3] = {c.x, c.w, c.bias};
        int64_t counts[3] = {c.n_in * c.c_in, c.kernel_volume * c.c_in * c.c_out, c.c_out};
        static const char *const names[3] = {"d_features", "d_weight", "d_bias"};
        for (int j = 0; j < 3; ++j) {
            double *fd = alloc_doubles(counts[j]), *got = conv_read(grads[j], NULL);
            finite_differences(&c, params[j], counts[j], r, fd);
            /* rounding of L (|L| ~ 10, eps 2.2e-16) over 2h = 2e-3 leaves ~1e-12 */
            conv_case_expect_close(&c, names[j], got, fd, counts[j], 1e-9);
            free(fd);
            free(got);
            spconv_tensor_release(grads[j]);
        }
        free(r);
        conv_case_free(&c);
    }
}

/* The fast backward against the pair-loop reference on every kind, f32 and f64. */
static void test_backward_matches_reference(void **state) {
    (void)state;
    static const spconv_conv_kind kinds[4] = {SPCONV_CONV_REGULAR, SPCONV_CONV_SUBM,
                                              SPCONV_CONV_TRANSPOSED, SPCONV_CONV_INVERSE};
    for (int i = 0; i < 4; ++i) {
        conv_case c = conv_case_make(conv_params_iso(kinds[i], 3, 2, 1, 1),
                                     (int64_t[3]){15, 14, 13}, 2, 600, 21, 17);
        conv_case_setup(&c, NULL);
        double *dy = conv_random_values(c.n_out * c.c_out, -1.0, 1.0);
        for (int d = 0; d < 2; ++d) {
            spconv_dtype dtype = d == 0 ? SPCONV_F32 : SPCONV_F64;
            spconv_tensor *x = conv_case_features(&c, dtype), *w = conv_case_weight(&c, dtype);
            spconv_tensor *g = conv_case_grad_out(&c, dtype, dy);
            spconv_tensor *fast[3], *ref[3];
            SPCONV_ASSERT_OK(
                spconv_conv_backward(NULL, c.rb, x, w, g, &fast[0], &fast[1], &fast[2]));
            SPCONV_ASSERT_OK(
                spconv__conv_backward_ref(NULL, c.rb, x, w, g, &ref[0], &ref[1], &ref[2]));
            conv_case_expect_close_tensors(&c, "fast vs reference", fast, ref, 3,
                                           conv_tolerance(dtype));
            spconv_tensor_release(x);
            spconv_tensor_release(w);
            spconv_tensor_release(g);
        }
        free(dy);
        conv_case_free(&c);
    }
}

/* Offsets without pairs get exact zeros even when the context's workspace holds the leftovers
 * of a larger call, and the optional outputs are the same bits as in the full call. */
static void test_backward_contracts(void **state) {
    (void)state;
    spconv_context *ctx = conv_context(2);
    conv_case dirty = conv_case_make(conv_params_iso(SPCONV_CONV_SUBM, 3, 1, 0, 1),
                                     (int64_t[3]){19, 18, 17}, 1, 1500, 8, 8);
    conv_case_setup(&dirty, ctx);
    double *dy_dirty = conv_random_values(dirty.n_out * dirty.c_out, -1.0, 1.0);
    spconv_tensor *junk[3];
    run_backward(ctx, &dirty, SPCONV_F32, dy_dirty, junk);
    for (int j = 0; j < 3; ++j) spconv_tensor_release(junk[j]);

    /* One site: only the centre offset has a pair. */
    conv_case one = conv_case_make(conv_params_iso(SPCONV_CONV_SUBM, 3, 1, 0, 1),
                                   (int64_t[3]){5, 5, 5}, 1, 1, 8, 8);
    conv_case_setup(&one, ctx);
    double *dy = conv_random_values(8, -1.0, 1.0);
    spconv_tensor *full[3];
    run_backward(ctx, &one, SPCONV_F32, dy, full);
    double *gw = conv_read(full[1], NULL);
    for (int64_t k = 0; k < 27; ++k)
        for (int64_t i = 0; i < 64; ++i) {
            double want = k == 13 ? (double)(float)(one.x[i / 8] * dy[i % 8]) : 0.0;
            if (gw[k * 64 + i] != want)
                fail_msg("d_weight[%lld] entry %lld = %g, expected %g", (long long)k, (long long)i,
                         gw[k * 64 + i], want);
        }
    free(gw);

    /* Each output alone matches the full call bit for bit. */
    int64_t x_sizes[2] = {1, 8}, w_sizes[3] = {27, 8, 8}, g_sizes[2] = {1, 8};
    spconv_tensor *x = conv_tensor(SPCONV_F32, 2, x_sizes, one.x);
    spconv_tensor *w = conv_tensor(SPCONV_F32, 3, w_sizes, one.w);
    spconv_tensor *g = conv_tensor(SPCONV_F32, 2, g_sizes, dy), *single = NULL;
    SPCONV_ASSERT_OK(spconv_conv_backward(ctx, one.rb, x, w, g, &single, NULL, NULL));
    assert_true(conv_same_bits(single, full[0]));
    spconv_tensor_release(single);
    SPCONV_ASSERT_OK(spconv_conv_backward(ctx, one.rb, x, w, g, NULL, &single, NULL));
    assert_true(conv_same_bits(single, full[1]));
    spconv_tensor_release(single);
    SPCONV_ASSERT_OK(spconv_conv_backward(ctx, one.rb, x, w, g, NULL, NULL, &single));
    assert_true(conv_same_bits(single, full[2]));
    spconv_tensor_release(single);
    SPCONV_ASSERT_OK(spconv_conv_backward(ctx, one.rb, x, w, g, NULL, NULL, NULL));

    /* A 5-d weight gets a 5-d gradient with the same values. */
    int64_t w5_sizes[5] = {3, 3, 3, 8, 8};
    spconv_tensor *w5 = conv_tensor(SPCONV_F32, 5, w5_sizes, one.w);
    SPCONV_ASSERT_OK(spconv_conv_backward(ctx, one.rb, x, w5, g, NULL, &single, NULL));
    assert_int_equal(spconv_tensor_ndim(single), 5);
    assert_true(conv_same_bits(single, full[1]));
    spconv_tensor_release(single);

    for (int j = 0; j < 3; ++j) spconv_tensor_release(full[j]);
    spconv_tensor_release(w5);
    spconv_tensor_release(x);
    spconv_tensor_release(w);
    spconv_tensor_release(g);
    free(dy);
    free(dy_dirty);
    conv_case_free(&one);
    conv_case_free(&dirty);
    spconv_context_destroy(ctx);
}

static void test_backward_errors(void **state) {
    (void)state;
    conv_case c = conv_case_make(conv_params_iso(SPCONV_CONV_REGULAR, 3, 2, 1, 1),
                                 (int64_t[3]){7, 7, 7}, 1, 20, 4, 3);
    conv_case_setup(&c, NULL);
    int64_t x_sizes[2] = {c.n_in, 4}, w_sizes[3] = {27, 4, 3}, g_sizes[2] = {c.n_out, 3};
    int64_t bad_sizes[2] = {c.n_out, 2};
    spconv_tensor *x = conv_tensor(SPCONV_F32, 2, x_sizes, c.x);
    spconv_tensor *w = conv_tensor(SPCONV_F32, 3, w_sizes, c.w);
    double *dy = conv_random_values(c.n_out * 3, -1.0, 1.0);
    spconv_tensor *g = conv_tensor(SPCONV_F32, 2, g_sizes, dy);
    spconv_tensor *g64 = conv_tensor(SPCONV_F64, 2, g_sizes, dy);
    spconv_tensor *g_bad = conv_tensor(SPCONV_F32, 2, bad_sizes, dy);
    spconv_tensor *gx = NULL, *gw = NULL, *gb = NULL;
    SPCONV_ASSERT_FAILS(spconv_conv_backward(NULL, c.rb, x, w, NULL, &gx, &gw, &gb),
                        SPCONV_ERR_NULL_POINTER, "spconv_conv_backward: 'grad_out' is NULL");
    SPCONV_ASSERT_FAILS(spconv_conv_backward(NULL, NULL, x, w, g, &gx, &gw, &gb),
                        SPCONV_ERR_NULL_POINTER, "'rb'");
    char expected[128];
    snprintf(expected, sizeof expected,
             "grad_out must be [num_out, C_out] = [%lld, 3], got [%lld, 2]", (long long)c.n_out,
             (long long)c.n_out);
    SPCONV_ASSERT_FAILS(spconv_conv_backward(NULL, c.rb, x, w, g_bad, &gx, &gw, &gb),
                        SPCONV_ERR_SHAPE_MISMATCH, expected);
    SPCONV_ASSERT_FAILS(spconv_conv_backward(NULL, c.rb, x, w, g64, &gx, &gw, &gb),
                        SPCONV_ERR_DTYPE_MISMATCH, "features is f32 but grad_out is f64");
    SPCONV_ASSERT_FAILS(spconv_conv_backward(NULL, c.rb, x, w, g_bad, &gx, &gw, &gb),
                        SPCONV_ERR_SHAPE_MISMATCH, "spconv_conv_backward: grad_out");
    SPCONV_ASSERT_FAILS(spconv__conv_backward_ref(NULL, c.rb, x, w, g_bad, &gx, &gw, &gb),
                        SPCONV_ERR_SHAPE_MISMATCH, "spconv__conv_backward_ref: grad_out");
    assert_null(gx);
    assert_null(gw);
    assert_null(gb);
    spconv_tensor_release(x);
    spconv_tensor_release(w);
    spconv_tensor_release(g);
    spconv_tensor_release(g64);
    spconv_tensor_release(g_bad);
    free(dy);
    conv_case_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backward_grid),
        cmocka_unit_test(test_backward_kinds),
        cmocka_unit_test(test_backward_many_blocks),
        cmocka_unit_test(test_backward_joint),
        cmocka_unit_test(test_backward_finite_differences),
        cmocka_unit_test(test_backward_matches_reference),
        cmocka_unit_test(test_backward_contracts),
        cmocka_unit_test(test_backward_errors),
    };
    spconv_test_seed();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
