/* f16 and bf16 operands of the conv and max-pool entry points on the CPU, against the dense
 * oracle (conv) and the pair-loop reference (pool), both in double on the 16-bit values, on fresh
 * random geometries of every conv kind.
 *
 * The bound, from the contract of conv/half.h: each result y is a sum of n products (plus the
 * bias) accumulated in f32, then rounded once to the 16-bit dtype of unit roundoff u_h (2^-11 for
 * f16, 2^-8 for bf16). With S the same sum over absolute values and gamma_n = n u / (1 - n u) for
 * f32's u = 2^-24, the f32 sum is within gamma_n S of the exact y, and the rounding adds at most
 * u_h times its magnitude, or half the spacing of the 16-bit subnormals below their range
 * (eta: 2^-25 for f16, under 2^-133 for bf16). So
 *     |result - y| <= u_h |y| + (1 + u_h) gamma_n S + eta,
 * plus the oracle's own f64 error, gamma_n(f64) S. Accumulating in the 16-bit dtype, rounding to
 * the wrong one or rounding twice breaks it for sums of more than a few terms. Max pooling only
 * picks values, so its outputs are the 16-bit inputs themselves, bit for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/conv_cases.h"
#include "common/conv_helpers.h"
#include "conv/conv_ref.h"

static const spconv_dtype HALVES[2] = {SPCONV_F16, SPCONV_BF16};
static const int64_t SHAPE[3] = {9, 8, 7};
static const int64_t CHANNELS[4] = {1, 3, 17, 64};

static double unit_roundoff(spconv_dtype dtype) {
    return dtype == SPCONV_F16 ? ldexp(1.0, -11) : ldexp(1.0, -8);
}

static double subnormal_half_spacing(spconv_dtype dtype) {
    return dtype == SPCONV_F16 ? ldexp(1.0, -25) : ldexp(1.0, -134);
}

static double gamma_n(double u, int64_t n) {
    return (double)n * u / (1.0 - (double)n * u);
}

/* Round the n doubles at @p v to @p dtype in place (through the library's conversion, which the
 * CPU and CUDA backends share). */
static void round_values(double *v, int64_t n, spconv_dtype dtype) {
    if (n == 0) return;
    spconv_tensor *t = conv_tensor(dtype, 1, &n, v);
    int64_t count;
    double *back = conv_read(t, &count);
    assert_int_equal(count, n);
    memcpy(v, back, (size_t)n * sizeof *v);
    free(back);
    spconv_tensor_release(t);
}

static double *abs_copy(const double *v, int64_t n) {
    double *a = malloc((size_t)(n + 1) * sizeof *a);
    assert_non_null(a);
    for (int64_t i = 0; i < n; ++i) a[i] = fabs(v[i]);
    return a;
}

/* @p got (a tensor of @p dtype) against the exact values @p want, with S = @p sums and n terms. */
static void expect_within(const conv_case *c, const char *what, const spconv_tensor *got,
                          const double *want, const double *sums, int64_t n, spconv_dtype dtype) {
    assert_int_equal(spconv_tensor_dtype(got), dtype);
    int64_t count;
    double *g = conv_read(got, &count);
    const double u = unit_roundoff(dtype), eta = subnormal_half_spacing(dtype);
    const double accumulated = (1.0 + u) * gamma_n(ldexp(1.0, -24), n) + gamma_n(ldexp(1.0, -53), n);
    for (int64_t i = 0; i < count; ++i) {
        const double allowed = u * fabs(want[i]) + accumulated * sums[i] + eta;
        if (!(fabs(g[i] - want[i]) <= allowed)) {
            char text[256];
            fail_msg("%s %s: %s element %lld is %.9g, exact %.9g, allowed error %.3g",
                     conv_case_text(c, text, sizeof text), spconv_dtype_name(dtype), what,
                     (long long)i, g[i], want[i], allowed);
        }
    }
    free(g);
}

/* The case's oracle forward and backward over absolute operands: the sums S of the bound. */
static void absolute_sums(conv_case *c, const double *dy, double *sy, double *sdx, double *sdw,
                          double *sdb) {
    double *x = c->x, *w = c->w, *b = c->bias;
    const int64_t nx = c->n_in * c->c_in, nw = c->kernel_volume * c->c_in * c->c_out;
    c->x = abs_copy(x, nx), c->w = abs_copy(w, nw), c->bias = abs_copy(b, c->c_out);
    double *ady = abs_copy(dy, c->n_out * c->c_out);
    conv_case_oracle_forward(c, sy);
    conv_case_oracle_backward(c, ady, sdx, sdw, sdb);
    free(ady);
    free(c->x), free(c->w), free(c->bias);
    c->x = x, c->w = w, c->bias = b;
}

static double *doubles(int64_t n) {
    double *p = calloc((size_t)n + 1, sizeof(double));
    assert_non_null(p);
    return p;
}

static void check_conv(spconv_conv_kind kind, spconv_dtype dtype, int threads) {
    conv_case c = conv_case_make(conv_case_random_params(kind, SHAPE, 1), SHAPE,
                                 spconv_test_rand_int(1, 2), spconv_test_rand_int(1, 60),
                                 CHANNELS[spconv_test_rand_int(0, 3)],
                                 CHANNELS[spconv_test_rand_int(0, 3)]);
    spconv_context *ctx = conv_context(threads);
    conv_case_setup(&c, ctx);
    const int64_t kv = c.kernel_volume, nx = c.n_in * c.c_in, ny = c.n_out * c.c_out;
    const int64_t nw = kv * c.c_in * c.c_out;
    round_values(c.x, nx, dtype);
    round_values(c.w, nw, dtype);
    round_values(c.bias, c.c_out, dtype);
    double *dy = conv_random_values(ny, -1.0, 1.0);
    round_values(dy, ny, dtype);

    spconv_tensor *x = conv_case_features(&c, dtype), *w = conv_case_weight(&c, dtype);
    spconv_tensor *b = conv_tensor(dtype, 1, &c.c_out, c.bias);
    spconv_tensor *g = conv_case_grad_out(&c, dtype, dy);
    spconv_tensor *y = NULL, *dx = NULL, *dw = NULL, *db = NULL;
    SPCONV_ASSERT_OK(spconv_conv_forward(ctx, c.rb, x, w, b, &y));
    SPCONV_ASSERT_OK(spconv_conv_backward(ctx, c.rb, x, w, g, &dx, &dw, &db));

    double *ey = doubles(ny), *edx = doubles(nx), *edw = doubles(nw), *edb = doubles(c.c_out);
    double *sy = doubles(ny), *sdx = doubles(nx), *sdw = doubles(nw), *sdb = doubles(c.c_out);
    conv_case_oracle_forward(&c, ey);
    conv_case_oracle_backward(&c, dy, edx, edw, edb);
    absolute_sums(&c, dy, sy, sdx, sdw, sdb);
    /* Terms per result: KV * C_in products and the bias; KV * C_out for a feature gradient; at
     * most one pair per output row per offset for a weight gradient; a row each for the bias. */
    const int64_t rows = c.n_out > c.n_in ? c.n_out : c.n_in;
    expect_within(&c, "output", y, ey, sy, kv * c.c_in + 1, dtype);
    expect_within(&c, "grad features", dx, edx, sdx, kv * c.c_out, dtype);
    expect_within(&c, "grad weight", dw, edw, sdw, rows, dtype);
    expect_within(&c, "grad bias", db, edb, sdb, c.n_out, dtype);

    spconv_tensor *all[] = {x, w, b, g, y, dx, dw, db};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) spconv_tensor_release(all[i]);
    double *arrays[] = {dy, ey, edx, edw, edb, sy, sdx, sdw, sdb};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; ++i) free(arrays[i]);
    conv_case_free(&c);
    spconv_context_destroy(ctx);
}

static void test_conv_half_against_oracle(void **state) {
    (void)state;
    const spconv_conv_kind kinds[4] = {SPCONV_CONV_REGULAR, SPCONV_CONV_SUBM,
                                       SPCONV_CONV_TRANSPOSED, SPCONV_CONV_INVERSE};
    for (int trial = 0; trial < 32; ++trial)
        check_conv(kinds[trial % 4], HALVES[(trial / 4) % 2], 1 + trial % 2);
}

/* Outputs and gradients do not depend on the thread count, in 16 bits as in f32. */
static void test_conv_half_threads_bitwise(void **state) {
    (void)state;
    for (int d = 0; d < 2; ++d) {
        conv_case c = conv_case_make(conv_case_random_params(SPCONV_CONV_SUBM, SHAPE, 1), SHAPE,
                                     2, 150, 17, 64);
        conv_case_setup(&c, NULL);
        spconv_tensor *x = conv_case_features(&c, HALVES[d]), *w = conv_case_weight(&c, HALVES[d]);
        spconv_tensor *got[2][3] = {{NULL}};
        for (int t = 0; t < 2; ++t) {
            spconv_context *ctx = conv_context(t + 1);
            spconv_tensor *y = NULL;
            SPCONV_ASSERT_OK(spconv_conv_forward(ctx, c.rb, x, w, NULL, &y));
            SPCONV_ASSERT_OK(spconv_conv_backward(ctx, c.rb, x, w, y, &got[t][1], &got[t][2], NULL));
            got[t][0] = y;
            spconv_context_destroy(ctx);
        }
        for (int k = 0; k < 3; ++k) {
            assert_true(conv_same_bits(got[0][k], got[1][k]));
            spconv_tensor_release(got[0][k]);
            spconv_tensor_release(got[1][k]);
        }
        spconv_tensor_release(x);
        spconv_tensor_release(w);
        conv_case_free(&c);
    }
}

/* Max pooling: the outputs and argmax of the reference on the same values in f64, bit for bit
 * once rounded back; the gradient sums (one per output that picked the input) within the bound. */
static void test_maxpool_half(void **state) {
    (void)state;
    for (int trial = 0; trial < 8; ++trial) {
        const spconv_dtype dtype = HALVES[trial % 2];
        conv_case c = conv_case_make(conv_case_random_params(SPCONV_CONV_REGULAR, SHAPE, 1), SHAPE,
                                     spconv_test_rand_int(1, 2), spconv_test_rand_int(1, 80),
                                     CHANNELS[spconv_test_rand_int(0, 3)], 1);
        spconv_context *ctx = conv_context(1 + trial % 2);
        conv_case_setup(&c, ctx);
        const int64_t nx = c.n_in * c.c_in, ny = c.n_out * c.c_in;
        round_values(c.x, nx, dtype);
        if (trial == 2 && nx > 0) c.x[0] = NAN; /* NaN propagates, as in f32 */
        double *dy = conv_random_values(ny, -1.0, 1.0);
        round_values(dy, ny, dtype);
        spconv_tensor *x = conv_case_features(&c, dtype), *x64 = conv_case_features(&c, SPCONV_F64);
        const int64_t gsizes[2] = {c.n_out, c.c_in};
        spconv_tensor *g = conv_tensor(dtype, 2, gsizes, dy), *g64 = conv_tensor(SPCONV_F64, 2, gsizes, dy);
        double *ady = abs_copy(dy, ny);
        spconv_tensor *ag64 = conv_tensor(SPCONV_F64, 2, gsizes, ady);
        spconv_tensor *y = NULL, *arg = NULL, *ry = NULL, *rarg = NULL, *dx = NULL, *rdx = NULL;
        spconv_tensor *sdx = NULL, *want = NULL;
        SPCONV_ASSERT_OK(spconv_maxpool_forward(ctx, c.rb, x, &y, &arg));
        SPCONV_ASSERT_OK(spconv__maxpool_forward_ref(ctx, c.rb, x64, &ry, &rarg));
        SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, ry, dtype, &want));
        assert_int_equal(spconv_tensor_dtype(y), dtype);
        assert_true(conv_same_bits(y, want));
        assert_true(conv_same_bits(arg, rarg));
        SPCONV_ASSERT_OK(spconv_maxpool_backward(ctx, c.rb, arg, g, &dx));
        SPCONV_ASSERT_OK(spconv__maxpool_backward_ref(ctx, c.rb, rarg, g64, &rdx));
        SPCONV_ASSERT_OK(spconv__maxpool_backward_ref(ctx, c.rb, rarg, ag64, &sdx));
        int64_t n;
        double *e = conv_read(rdx, &n), *s = conv_read(sdx, &n);
        expect_within(&c, "pool grad", dx, e, s, c.kernel_volume, dtype);
        free(e);
        free(s);
        spconv_tensor *all[] = {x, x64, g, g64, ag64, y, arg, ry, rarg, dx, rdx, sdx, want};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) spconv_tensor_release(all[i]);
        free(dy);
        free(ady);
        conv_case_free(&c);
        spconv_context_destroy(ctx);
    }
}

/* Mixed dtypes are refused as in f32, naming both, and nothing is returned. */
static void test_half_mismatch(void **state) {
    (void)state;
    conv_case c = conv_case_make(conv_case_random_params(SPCONV_CONV_SUBM, SHAPE, 1), SHAPE, 1,
                                 20, 3, 2);
    conv_case_setup(&c, NULL);
    spconv_tensor *x = conv_case_features(&c, SPCONV_F16), *w = conv_case_weight(&c, SPCONV_BF16);
    spconv_tensor *y = NULL;
    SPCONV_ASSERT_FAILS(spconv_conv_forward(NULL, c.rb, x, w, NULL, &y), SPCONV_ERR_DTYPE_MISMATCH,
                        "features is f16 but weight is bf16");
    assert_null(y);
    spconv_tensor_release(x);
    spconv_tensor_release(w);
    conv_case_free(&c);
}

int main(void) {
    spconv_test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_half_against_oracle),
        cmocka_unit_test(test_conv_half_threads_bitwise),
        cmocka_unit_test(test_maxpool_half),
        cmocka_unit_test(test_half_mismatch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
