/* f16 and bf16 networks. Their contract (docs/design.md, "Accumulation"): every layer computes in
 * f32 on its 16-bit operands widened exactly, and rounds each tensor result once to the network's
 * dtype; batch norm keeps its parameters, running statistics and their gradients in f32.
 *
 * So a network of one layer (or of layers that only move values) must give exactly the rounding
 * of the f32 network with the same (widened) parameters on the same (widened) input: forward,
 * input gradient, parameter gradients and running statistics, bit for bit. That is what is held
 * here, for every layer kind, in training and inference mode; the accuracy of the f32 arithmetic
 * underneath is the f32 tests' (test_net, test_conv_half for the 16-bit conv bound). */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rulebook_testing.h"
#include "common/test_files.h"
#include "common/test_util.h"
#include "spconv/net.h"

static const int64_t SHAPE[3] = {9, 10, 8};

static spconv_tensor *convert(const spconv_tensor *t, spconv_dtype dtype) {
    spconv_tensor *out = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, t, dtype, &out));
    return out;
}

static int same_bits(const spconv_tensor *a, const spconv_tensor *b) {
    if (spconv_tensor_dtype(a) != spconv_tensor_dtype(b)) return 0;
    if (spconv_tensor_numel(a) != spconv_tensor_numel(b)) return 0;
    const size_t bytes =
        (size_t)spconv_tensor_numel(a) * spconv_dtype_size(spconv_tensor_dtype(a));
    return bytes == 0 || memcmp(spconv_tensor_data(a), spconv_tensor_data(b), bytes) == 0;
}

/* @p got (16-bit) must be the rounding of @p wide (f32) to got's dtype. */
static void assert_rounding_of(const char *layer, const char *what, const spconv_tensor *got,
                               const spconv_tensor *wide) {
    spconv_tensor *want = convert(wide, spconv_tensor_dtype(got));
    if (!same_bits(got, want))
        fail_msg("%s: %s is not the rounding of the f32 network's", layer, what);
    spconv_tensor_release(want);
}

/* Uniform values in [lo, hi) of @p dtype. */
static spconv_tensor *random_values(spconv_dtype dtype, int ndim, const int64_t *sizes, double lo,
                                    double hi) {
    spconv_tensor *t = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_empty(spconv_cpu(), SPCONV_F64, ndim, sizes, &t));
    double *v = spconv_tensor_data(t);
    for (int64_t i = 0; i < spconv_tensor_numel(t); ++i) v[i] = spconv_test_rand_double(lo, hi);
    spconv_tensor *out = convert(t, dtype);
    spconv_tensor_release(t);
    return out;
}

static spconv_sparse_tensor *random_input(spconv_dtype dtype, int64_t channels, int64_t n) {
    int32_t *rows = spconv_test_random_sites(2, SHAPE, n);
    spconv_tensor *indices = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_I32, 2,
                                             (const int64_t[]){2 * n, 4}, rows, &indices));
    free(rows);
    spconv_tensor *f = random_values(dtype, 2, (const int64_t[]){2 * n, channels}, -1.0, 1.0);
    spconv_sparse_tensor *sp = NULL;
    SPCONV_ASSERT_OK(spconv_sparse_create(f, indices, SHAPE, 2, &sp));
    spconv_tensor_release(f);
    spconv_tensor_release(indices);
    return sp;
}

/* A copy of @p sp with its features in @p dtype (and an empty rulebook cache). */
static spconv_sparse_tensor *input_as(const spconv_sparse_tensor *sp, spconv_dtype dtype) {
    spconv_tensor *f = convert(spconv_sparse_features(sp), dtype);
    int64_t shape[3];
    spconv_sparse_spatial_shape(sp, shape);
    spconv_sparse_tensor *out = NULL;
    SPCONV_ASSERT_OK(spconv_sparse_create(f, spconv_sparse_indices(sp), shape,
                                          spconv_sparse_batch_size(sp), &out));
    spconv_tensor_release(f);
    return out;
}

/* Layers that each must round exactly once; the last three move values only. */
static const spconv_layer_desc subm[] = {{.kind = SPCONV_LAYER_SUBM, .name = "c", .in_channels = 5,
                                          .out_channels = 17, .kernel = {3, 3, 3}, .bias = 1}};
static const spconv_layer_desc conv[] = {{.kind = SPCONV_LAYER_CONV, .name = "c", .in_channels = 5,
                                          .out_channels = 4, .kernel = {3, 3, 3},
                                          .stride = {2, 2, 2}, .padding = {1, 1, 1}, .bias = 1}};
static const spconv_layer_desc transposed[] = {
    {.kind = SPCONV_LAYER_TRANSPOSED, .name = "t", .in_channels = 5, .out_channels = 3,
     .kernel = {2, 2, 2}, .stride = {2, 2, 2}}};
static const spconv_layer_desc pool[] = {
    {.kind = SPCONV_LAYER_MAXPOOL, .name = "p", .kernel = {2, 2, 2}, .stride = {2, 2, 2}}};
static const spconv_layer_desc batchnorm[] = {
    {.kind = SPCONV_LAYER_BATCHNORM, .name = "bn", .in_channels = 5, .eps = 1e-3}};
static const spconv_layer_desc batchnorm_relu[] = {
    {.kind = SPCONV_LAYER_BATCHNORM, .name = "bn", .in_channels = 5},
    {.kind = SPCONV_LAYER_RELU, .name = "r"}};
static const spconv_layer_desc relu_skip[] = {{.kind = SPCONV_LAYER_SAVE, .name = "s", .key = "k"},
                                              {.kind = SPCONV_LAYER_RELU, .name = "r"},
                                              {.kind = SPCONV_LAYER_CONCAT, .name = "j", .key = "k"}};
static const spconv_layer_desc to_dense[] = {{.kind = SPCONV_LAYER_TO_DENSE, .name = "d"}};

typedef struct net_case {
    const char *name;
    const spconv_layer_desc *layers;
    int count;
} net_case;

#define CASE(a) {#a, a, (int)(sizeof(a) / sizeof((a)[0]))}
static const net_case cases[] = {CASE(subm),           CASE(conv),      CASE(transposed),
                                 CASE(pool),           CASE(batchnorm), CASE(batchnorm_relu),
                                 CASE(relu_skip),      CASE(to_dense)};

/* Random parameters for the 16-bit network (batch norm's running variance positive), copied
 * into the f32 one, which then holds the same values. */
static void same_random_params(spconv_net *half, spconv_net *wide) {
    assert_int_equal(spconv_net_num_params(half), spconv_net_num_params(wide));
    for (int p = 0; p < spconv_net_num_params(half); ++p) {
        spconv_tensor *t = spconv_net_param(half, p);
        const int is_var = strstr(spconv_net_param_name(half, p), "running_var") != NULL;
        const int is_bn = strstr(spconv_net_param_name(half, p), "bn.") != NULL;
        /* batch norm's parameters are f32 in a 16-bit network, the others its dtype */
        assert_int_equal(spconv_tensor_dtype(t), is_bn ? SPCONV_F32 : spconv_net_dtype(half));
        spconv_tensor *r = random_values(spconv_tensor_dtype(t), spconv_tensor_ndim(t),
                                         spconv_tensor_sizes(t), is_var ? 0.5 : -1.0,
                                         is_var ? 2.0 : 1.0);
        SPCONV_ASSERT_OK(spconv_tensor_copy_(NULL, t, r));
        SPCONV_ASSERT_OK(spconv_tensor_copy_(NULL, spconv_net_param(wide, p), r));
        spconv_tensor_release(r);
    }
}

static void check_case(const net_case *c, spconv_dtype dtype, spconv_net_mode mode, int threads) {
    const uint64_t seed = spconv_test_rand_u64();
    spconv_net *half = NULL, *wide = NULL;
    SPCONV_ASSERT_OK(spconv_net_create(dtype, 5, c->layers, c->count, seed, &half));
    SPCONV_ASSERT_OK(spconv_net_create(SPCONV_F32, 5, c->layers, c->count, seed, &wide));
    same_random_params(half, wide);
    spconv_context *ctx = NULL;
    SPCONV_ASSERT_OK(spconv_context_create(spconv_cpu(), &ctx));
    SPCONV_ASSERT_OK(spconv_context_set_num_threads(ctx, threads));
    spconv_sparse_tensor *in = random_input(dtype, 5, spconv_test_rand_int(1, 200));
    spconv_sparse_tensor *in_wide = input_as(in, SPCONV_F32);
    spconv_tensor *y = NULL, *y_wide = NULL;
    SPCONV_ASSERT_OK(spconv_net_forward(ctx, half, in, mode, &y, NULL));
    SPCONV_ASSERT_OK(spconv_net_forward(ctx, wide, in_wide, mode, &y_wide, NULL));
    assert_int_equal(spconv_tensor_dtype(y), dtype);
    assert_rounding_of(c->name, "the output", y, y_wide);
    if (mode == SPCONV_NET_TRAINING) {
        spconv_tensor *g = random_values(dtype, spconv_tensor_ndim(y), spconv_tensor_sizes(y),
                                         -1.0, 1.0);
        spconv_tensor *g_wide = convert(g, SPCONV_F32), *dx = NULL, *dx_wide = NULL;
        SPCONV_ASSERT_OK(spconv_net_backward(ctx, half, g, &dx));
        SPCONV_ASSERT_OK(spconv_net_backward(ctx, wide, g_wide, &dx_wide));
        assert_rounding_of(c->name, "the input gradient", dx, dx_wide);
        for (int p = 0; p < spconv_net_num_params(half); ++p) {
            const char *name = spconv_net_param_name(half, p);
            /* running statistics (updated by the forward) and parameter gradients */
            assert_rounding_of(name, "the value", spconv_net_param(half, p),
                               spconv_net_param(wide, p));
            if (spconv_net_param_grad(half, p) != NULL)
                assert_rounding_of(name, "the gradient", spconv_net_param_grad(half, p),
                                   spconv_net_param_grad(wide, p));
            else
                assert_null(spconv_net_param_grad(wide, p));
        }
        spconv_tensor *all[] = {g, g_wide, dx, dx_wide};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) spconv_tensor_release(all[i]);
    }
    spconv_tensor_release(y);
    spconv_tensor_release(y_wide);
    spconv_sparse_release(in);
    spconv_sparse_release(in_wide);
    spconv_context_destroy(ctx);
    spconv_net_destroy(half);
    spconv_net_destroy(wide);
}

static void test_layers_round_once(void **state) {
    (void)state;
    const spconv_dtype dtypes[2] = {SPCONV_F16, SPCONV_BF16};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
        for (int d = 0; d < 2; ++d) {
            print_message("%s %s\n", cases[i].name, spconv_dtype_name(dtypes[d]));
            check_case(&cases[i], dtypes[d], SPCONV_NET_TRAINING, 1 + d);
            check_case(&cases[i], dtypes[d], SPCONV_NET_INFERENCE, 2 - d);
        }
}

/* A zoo network in 16 bits: created, weights saved and loaded back unchanged (bf16 files hold
 * f32 values), a file value beyond the dtype's range refused, and its input must have its
 * dtype. */
static void test_zoo_half_weights_and_input(void **state) {
    (void)state;
    const spconv_dtype dtypes[2] = {SPCONV_F16, SPCONV_BF16};
    for (int d = 0; d < 2; ++d) {
        spconv_net *a = NULL, *b = NULL;
        SPCONV_ASSERT_OK(spconv_zoo_create("basic", dtypes[d], 7, &a));
        SPCONV_ASSERT_OK(spconv_zoo_create("basic", dtypes[d], 8, &b));
        char dir[] = "/tmp/spconv-net-half-XXXXXX";
        assert_non_null(mkdtemp(dir));
        SPCONV_ASSERT_OK(spconv_net_save_weights(NULL, a, dir, SPCONV_NET_LAYOUT_KRSC));
        SPCONV_ASSERT_OK(spconv_net_load_weights(NULL, b, dir, SPCONV_NET_LAYOUT_KRSC));
        for (int p = 0; p < spconv_net_num_params(a); ++p)
            assert_true(same_bits(spconv_net_param(a, p), spconv_net_param(b, p)));
        assert_int_equal(spconv_test_remove_tree(dir), 0);
        /* f32 files with a value beyond the dtype's range: refused, naming it, nothing loaded */
        spconv_net *wide = NULL;
        SPCONV_ASSERT_OK(spconv_zoo_create("basic", SPCONV_F32, 9, &wide));
        ((float *)spconv_tensor_data(spconv_net_param(wide, 3)))[5] =
            dtypes[d] == SPCONV_F16 ? 1e5f : 3.4e38f;
        char dir2[] = "/tmp/spconv-net-half-XXXXXX";
        assert_non_null(mkdtemp(dir2));
        SPCONV_ASSERT_OK(spconv_net_save_weights(NULL, wide, dir2, SPCONV_NET_LAYOUT_RSCK));
        char message[256];
        snprintf(message, sizeof message, "parameter '%s' in", spconv_net_param_name(wide, 3));
        SPCONV_ASSERT_FAILS(spconv_net_load_weights(NULL, b, dir2, SPCONV_NET_LAYOUT_RSCK),
                            SPCONV_ERR_OUT_OF_RANGE, message);
        SPCONV_ASSERT_FAILS(spconv_net_load_weights(NULL, b, dir2, SPCONV_NET_LAYOUT_RSCK),
                            SPCONV_ERR_OUT_OF_RANGE, "element 5 = ");
        for (int p = 0; p < spconv_net_num_params(a); ++p)
            assert_true(same_bits(spconv_net_param(a, p), spconv_net_param(b, p)));
        assert_int_equal(spconv_test_remove_tree(dir2), 0);
        spconv_net_destroy(wide);
        spconv_sparse_tensor *in = random_input(SPCONV_F32, 4, 10);
        spconv_tensor *y = NULL;
        SPCONV_ASSERT_FAILS(spconv_net_forward(NULL, a, in, SPCONV_NET_INFERENCE, &y, NULL),
                            SPCONV_ERR_DTYPE_MISMATCH, "f32");
        assert_null(y);
        spconv_sparse_release(in);
        spconv_net_destroy(a);
        spconv_net_destroy(b);
    }
}

int main(void) {
    spconv_test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layers_round_once),
        cmocka_unit_test(test_zoo_half_weights_and_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
