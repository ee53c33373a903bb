/* spconv_conv_forward_affine: the conv followed by y = fma(y, scale, shift) and an optional ReLU,
 * held bitwise to spconv_conv_forward's output mapped element by element here with libm's fma /
 * fmaf (the spec, written independently of the library's vectorised epilogue), on random
 * geometries of every kind, f32 and f64, both product paths and several thread counts, with
 * zeros, negative zeros and NaNs among the values; and every bad input. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/conv_cases.h"
#include "common/conv_helpers.h"
#include "conv/conv_exec.h"
#include "conv/fused.h"
#include "core/cpu_kernels.h"

/* Equal bits, except that a NaN only has to meet a NaN (x86 picks which NaN operand an fma
 * returns by operand order, which the compiler chooses). */
static void expect_same(const char *what, const spconv_tensor *got, const void *want,
                        int64_t n) {
    const int f32 = spconv_tensor_dtype(got) == SPCONV_F32;
    const char *g = spconv_tensor_data(got), *w = want;
    const size_t size = f32 ? 4 : 8;
    for (int64_t i = 0; i < n; ++i) {
        const double gv = f32 ? ((const float *)(const void *)g)[i] : ((const double *)(const void *)g)[i];
        const double wv = f32 ? ((const float *)want)[i] : ((const double *)want)[i];
        if (isnan(gv) && isnan(wv)) continue;
        if (memcmp(g + (size_t)i * size, w + (size_t)i * size, size) != 0)
            fail_msg("%s: element %lld is %.9g (sign %d), expected %.9g (sign %d)", what,
                     (long long)i, gv, signbit(gv) != 0, wv, signbit(wv) != 0);
    }
}

/* A per-channel vector of @p dtype: random in [-2, 2), with exact zeros and negative zeros
 * (scale 0 with shift -0 turns a negative output into -0, which the ReLU must keep). */
static spconv_tensor *channel_vector(spconv_dtype dtype, int64_t c, double *values, int zeros) {
    for (int64_t j = 0; j < c; ++j) {
        values[j] = (double)spconv_test_rand_float(-2.0f, 2.0f);
        if (zeros && j % 5 == 1) values[j] = 0.0;
        if (zeros && j % 5 == 3) values[j] = -0.0;
    }
    return conv_tensor(dtype, 1, &c, values);
}

/* @p plain mapped by the spec: fma(y, scale, shift), then y < 0 ? 0 : y; or, @p wide, as the
 * network's inference batch norm (+ ReLU) maps a conv's output: the product and the sum each
 * rounded in double, then to the dtype, a NaN as the default NaN, then y < 0 ? 0 : y. */
static void *map_rows(const spconv_tensor *plain, int64_t rows, int64_t c, const double *scale,
                      const double *shift, int relu, int wide) {
    const int f32 = spconv_tensor_dtype(plain) == SPCONV_F32;
    void *out = malloc((size_t)(rows * c + 1) * (f32 ? 4 : 8));
    assert_non_null(out);
    for (int64_t i = 0; i < rows * c; ++i) {
        const int64_t j = i % c;
        if (wide) {
            const double y = f32 ? (double)((const float *)spconv_tensor_data(plain))[i]
                                 : ((const double *)spconv_tensor_data(plain))[i];
            const double product = y * scale[j], sum = product + shift[j];
            if (f32) {
                const float v = isnan(sum) ? NAN : (float)sum;
                ((float *)out)[i] = relu && v < 0 ? 0.0f : v;
            } else {
                const double v = isnan(sum) ? NAN : sum;
                ((double *)out)[i] = relu && v < 0 ? 0.0 : v;
            }
        } else if (f32) {
            float v = ((const float *)spconv_tensor_data(plain))[i];
            if (scale != NULL) v = fmaf(v, (float)scale[j], (float)shift[j]);
            ((float *)out)[i] = relu && v < 0 ? 0.0f : v;
        } else {
            double v = ((const double *)spconv_tensor_data(plain))[i];
            if (scale != NULL) v = fma(v, scale[j], shift[j]);
            ((double *)out)[i] = relu && v < 0 ? 0.0 : v;
        }
    }
    return out;
}

/* The wide epilogue (spconv__conv_epilogue.wide: double scale and shift, what the network folds
 * its batch norms with) on both product paths: the map above of the plain output bit for bit,
 * and the network's own batch-norm kernel run on the plain output. */
static void check_wide(spconv_context *ctx, const conv_case *c, const spconv_tensor *x,
                       const spconv_tensor *w, const spconv_tensor *bias,
                       const spconv_tensor *plain, const spconv_tensor *plain_unfused,
                       const double *scale, const double *shift, int relu, const char *what) {
    const spconv__conv_epilogue we = {scale, shift, relu, 1};
    char text[700];
    for (int path = 0; path < 2; ++path) {
        const spconv_tensor *base = path == 0 ? plain : plain_unfused;
        const spconv__conv_options o = {path == 0 ? SPCONV__GEMM_AUTO : SPCONV__GEMM_UNFUSED,
                                        NULL, &we};
        spconv_tensor *got = NULL, *layer = NULL;
        SPCONV_ASSERT_OK(spconv__conv_forward_ex(ctx, c->rb, x, w, bias, &o, &got));
        void *want = map_rows(base, c->n_out, c->c_out, scale, shift, relu, 1);
        snprintf(text, sizeof text, "%s, wide epilogue%s", what, path ? " (unfused)" : "");
        expect_same(text, got, want, c->n_out * c->c_out);
        SPCONV_ASSERT_OK(spconv_tensor_clone(NULL, base, &layer));
        SPCONV_ASSERT_OK(spconv__cpu_batchnorm_apply(ctx, base, scale, shift, relu, layer));
        if (!conv_same_bits(got, layer))
            fail_msg("%s: differs from the network's batch-norm layer on the conv output", text);
        free(want);
        spconv_tensor_release(got);
        spconv_tensor_release(layer);
    }
}

/* One case: every dtype, bias / no bias, map / ReLU alone / both, through the public entry point
 * with @p threads threads and through the unfused product path. */
static void check_case(conv_case *c, int threads, int with_nan) {
    spconv_context *ctx = conv_context(threads);
    conv_case_setup(c, NULL);
    if (with_nan && c->n_in > 0) c->x[(c->n_in / 2) * c->c_in] = NAN; /* one input element */
    double *scale = malloc((size_t)c->c_out * sizeof(double));
    double *shift = malloc((size_t)c->c_out * sizeof(double));
    assert_non_null(scale);
    assert_non_null(shift);
    char text[512], what[640];
    conv_case_text(c, text, sizeof text);
    for (int d = 0; d < 2; ++d) {
        const spconv_dtype dtype = d == 0 ? SPCONV_F32 : SPCONV_F64;
        spconv_tensor *x = conv_case_features(c, dtype), *w = conv_case_weight(c, dtype);
        spconv_tensor *b = conv_tensor(dtype, 1, &c->c_out, c->bias);
        spconv_tensor *sc = channel_vector(dtype, c->c_out, scale, 1);
        spconv_tensor *sh = channel_vector(dtype, c->c_out, shift, 1);
        for (int mode = 0; mode < 6; ++mode) {
            const int relu = mode % 2, affine = mode < 4;
            spconv_tensor *bias = mode / 2 == 1 ? NULL : b;
            spconv_tensor *plain = NULL, *got = NULL, *unfused = NULL;
            SPCONV_ASSERT_OK(spconv_conv_forward(ctx, c->rb, x, w, bias, &plain));
            void *want = map_rows(plain, c->n_out, c->c_out, affine ? scale : NULL,
                                  affine ? shift : NULL, relu, 0);
            SPCONV_ASSERT_OK(spconv_conv_forward_affine(ctx, c->rb, x, w, bias,
                                                        affine ? sc : NULL, affine ? sh : NULL,
                                                        relu, &got));
            snprintf(what, sizeof what, "%s %s bias %d affine %d relu %d, %d threads", text,
                     spconv_dtype_name(dtype), bias != NULL, affine, relu, threads);
            expect_same(what, got, want, c->n_out * c->c_out);
            /* the unfused gather + product + scatter path, with the same epilogue */
            const spconv__conv_epilogue e = {affine ? spconv_tensor_data(sc) : NULL,
                                             affine ? spconv_tensor_data(sh) : NULL, relu, 0};
            const spconv__conv_options o = {SPCONV__GEMM_UNFUSED, NULL, &e};
            SPCONV_ASSERT_OK(spconv__conv_forward_ex(ctx, c->rb, x, w, bias, &o, &unfused));
            spconv_tensor *plain_unfused = NULL;
            const spconv__conv_options po = {SPCONV__GEMM_UNFUSED, NULL, NULL};
            SPCONV_ASSERT_OK(spconv__conv_forward_ex(ctx, c->rb, x, w, bias, &po, &plain_unfused));
            void *want_unfused = map_rows(plain_unfused, c->n_out, c->c_out,
                                          affine ? scale : NULL, affine ? shift : NULL, relu, 0);
            strncat(what, " (unfused)", sizeof what - strlen(what) - 1);
            expect_same(what, unfused, want_unfused, c->n_out * c->c_out);
            if (affine) /* the network's batch norm folded into the conv: terms in double */
                check_wide(ctx, c, x, w, bias, plain, plain_unfused, scale, shift, relu, what);
            free(want);
            free(want_unfused);
            spconv_tensor_release(plain);
            spconv_tensor_release(plain_unfused);
            spconv_tensor_release(got);
            spconv_tensor_release(unfused);
        }
        spconv_tensor_release(x);
        spconv_tensor_release(w);
        spconv_tensor_release(b);
        spconv_tensor_release(sc);
        spconv_tensor_release(sh);
    }
    free(scale);
    free(shift);
    conv_case_free(c);
    spconv_context_destroy(ctx);
}

static conv_case random_case(spconv_conv_kind kind) {
    conv_case c;
    memset(&c, 0, sizeof c);
    for (int a = 0; a < 3; ++a) c.shape[a] = spconv_test_rand_int(3, 14);
    c.batch = spconv_test_rand_int(1, 2);
    c.n_per_batch = spconv_test_rand_int(1, oracle_cells(c.shape) / 3 + 1);
    c.c_in = spconv_test_rand_int(1, 19);
    c.c_out = spconv_test_rand_int(1, 37);
    c.params = conv_case_random_params(kind, c.shape, 1);
    return c;
}

static void test_affine_random(void **state) {
    (void)state;
    static const spconv_conv_kind kinds[4] = {SPCONV_CONV_REGULAR, SPCONV_CONV_SUBM,
                                              SPCONV_CONV_TRANSPOSED, SPCONV_CONV_INVERSE};
    for (int i = 0; i < 24; ++i) {
        conv_case c = random_case(kinds[i % 4]);
        check_case(&c, 1 + i % 3, i % 2);
    }
}

/* Many row blocks (the fused path's bulk and its smaller last blocks) on 1, 2 and 3 threads,
 * C_out with full vectors and a tail in both dtypes. */
static void test_affine_many_blocks(void **state) {
    (void)state;
    for (int threads = 1; threads <= 3; ++threads) {
        conv_case c = conv_case_make(conv_params_iso(SPCONV_CONV_SUBM, 3, 1, 0, 1),
                                     (int64_t[3]){19, 18, 17}, 2, 1500, 32, 37);
        check_case(&c, threads, threads == 2);
        conv_case r = conv_case_make(conv_params_iso(SPCONV_CONV_REGULAR, 3, 2, 1, 1),
                                     (int64_t[3]){19, 18, 17}, 1, 2000, 16, 64);
        check_case(&r, threads, 0);
    }
}

static void test_affine_errors(void **state) {
    (void)state;
    int64_t shape[3] = {6, 6, 6};
    int32_t *sites = oracle_random_sites(1, shape, 10);
    spconv_conv_params p = conv_params_iso(SPCONV_CONV_SUBM, 3, 1, 0, 1);
    spconv_rulebook *rb = conv_build(NULL, sites, 10, shape, 1, &p);
    free(sites);
    int64_t xs[2] = {10, 4}, ws[3] = {27, 4, 3}, three = 3, four = 4, m[2] = {3, 1};
    spconv_tensor *x, *w, *s, *s4, *s64, *s2d, *out = (spconv_tensor *)&p;
    SPCONV_ASSERT_OK(spconv_tensor_full(NULL, spconv_cpu(), SPCONV_F32, 2, xs, 0.5, &x));
    SPCONV_ASSERT_OK(spconv_tensor_full(NULL, spconv_cpu(), SPCONV_F32, 3, ws, 0.25, &w));
    SPCONV_ASSERT_OK(spconv_tensor_full(NULL, spconv_cpu(), SPCONV_F32, 1, &three, 2.0, &s));
    SPCONV_ASSERT_OK(spconv_tensor_full(NULL, spconv_cpu(), SPCONV_F32, 1, &four, 2.0, &s4));
    SPCONV_ASSERT_OK(spconv_tensor_full(NULL, spconv_cpu(), SPCONV_F64, 1, &three, 2.0, &s64));
    SPCONV_ASSERT_OK(spconv_tensor_full(NULL, spconv_cpu(), SPCONV_F32, 2, m, 2.0, &s2d));
    SPCONV_ASSERT_FAILS(spconv_conv_forward_affine(NULL, rb, x, w, NULL, s, s, 1, NULL),
                        SPCONV_ERR_NULL_POINTER, "'out'");
    SPCONV_ASSERT_FAILS(spconv_conv_forward_affine(NULL, NULL, x, w, NULL, s, s, 1, &out),
                        SPCONV_ERR_NULL_POINTER, "spconv_conv_forward_affine: 'rb' is NULL");
    assert_null(out);
    SPCONV_ASSERT_FAILS(spconv_conv_forward_affine(NULL, rb, x, w, NULL, s, NULL, 0, &out),
                        SPCONV_ERR_INVALID_ARGUMENT,
                        "scale and shift go together (both or neither), got scale only");
    SPCONV_ASSERT_FAILS(spconv_conv_forward_affine(NULL, rb, x, w, NULL, NULL, s, 0, &out),
                        SPCONV_ERR_INVALID_ARGUMENT, "got shift only");
    SPCONV_ASSERT_FAILS(spconv_conv_forward_affine(NULL, rb, x, w, NULL, s4, s, 0, &out),
                        SPCONV_ERR_SHAPE_MISMATCH, "scale must be [C_out] = [3], got [4]");
    SPCONV_ASSERT_FAILS(spconv_conv_forward_affine(NULL, rb, x, w, NULL, s, s2d, 0, &out),
                        SPCONV_ERR_SHAPE_MISMATCH, "shift must be [C_out] = [3], got [3, 1]");
    SPCONV_ASSERT_FAILS(spconv_conv_forward_affine(NULL, rb, x, w, NULL, s, s64, 0, &out),
                        SPCONV_ERR_DTYPE_MISMATCH, "shift is f64, the features are f32");
    /* the conv's own checks come first, under this function's name */
    SPCONV_ASSERT_FAILS(spconv_conv_forward_affine(NULL, rb, w, w, NULL, s, s, 0, &out),
                        SPCONV_ERR_SHAPE_MISMATCH, "spconv_conv_forward_affine: features must");
    assert_null(out);
    /* f16 features: the conv itself takes them, the epilogue does not */
    spconv_tensor *xh, *wh, *sh;
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, x, SPCONV_F16, &xh));
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, w, SPCONV_F16, &wh));
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, s, SPCONV_F16, &sh));
    SPCONV_ASSERT_FAILS(spconv_conv_forward_affine(NULL, rb, xh, wh, NULL, sh, sh, 1, &out),
                        SPCONV_ERR_NOT_SUPPORTED, "f32 and f64 features only, not f16");
    const spconv__conv_epilogue e = {NULL, NULL, 1, 0};
    const spconv__conv_options o = {SPCONV__GEMM_AUTO, NULL, &e};
    SPCONV_ASSERT_FAILS(spconv__conv_forward_ex(NULL, rb, xh, wh, NULL, &o, &out),
                        SPCONV_ERR_NOT_SUPPORTED, "the affine epilogue runs on f32 / f64 CPU");
    assert_null(out);
    /* CUDA features (a device, or the host emulation of the CUDA build) */
    spconv_tensor *xc = NULL, *wc = NULL;
    if (spconv_tensor_to_device(NULL, x, spconv_cuda(0), &xc) == SPCONV_OK) {
        SPCONV_ASSERT_OK(spconv_tensor_to_device(NULL, w, spconv_cuda(0), &wc));
        SPCONV_ASSERT_FAILS(spconv_conv_forward_affine(NULL, rb, xc, wc, NULL, NULL, NULL, 1,
                                                       &out),
                            SPCONV_ERR_NOT_SUPPORTED,
                            "runs on the CPU backend only; the features are on cuda:0");
        assert_null(out);
    } else {
        print_message("(no CUDA device: the CUDA refusal is not exercised: %s)\n",
                      spconv_last_error());
    }
    spconv_tensor_release(xc);
    spconv_tensor_release(wc);
    spconv_tensor *list[] = {x, w, s, s4, s64, s2d, xh, wh, sh};
    for (size_t i = 0; i < sizeof list / sizeof list[0]; ++i) spconv_tensor_release(list[i]);
    spconv_rulebook_release(rb);
}

int main(void) {
    printf("epilogue: %s\n", spconv__fused_available() ? "AVX2 + FMA" : "scalar fma");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_affine_random),
        cmocka_unit_test(test_affine_many_blocks),
        cmocka_unit_test(test_affine_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
