/* Tensor plumbing for the conv tests (see conv_helpers.h). */
#include "common/conv_helpers.h"

#include <stdlib.h>
#include <string.h>

static void *helper_alloc(size_t count, size_t size) {
    void *p = calloc(count == 0 ? 1 : count, size);
    assert_non_null(p);
    return p;
}

spconv_conv_params conv_params_iso(spconv_conv_kind kind, int64_t kernel, int64_t stride,
                                   int64_t padding, int64_t dilation) {
    spconv_conv_params p = spconv_conv_params_default(kind);
    for (int a = 0; a < 3; ++a) {
        p.kernel[a] = kernel;
        p.stride[a] = stride;
        p.padding[a] = padding;
        p.dilation[a] = dilation;
    }
    return p;
}

double *conv_random_values(int64_t n, double lo, double hi) {
    double *v = helper_alloc((size_t)n, sizeof(double));
    for (int64_t i = 0; i < n; ++i) v[i] = spconv_test_rand_float((float)lo, (float)hi);
    return v;
}

spconv_tensor *conv_tensor(spconv_dtype dtype, int ndim, const int64_t *sizes,
                           const double *values) {
    spconv_tensor *t64 = NULL, *t = NULL;
    SPCONV_ASSERT_OK(
        spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_F64, ndim, sizes, values, &t64));
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, t64, dtype, &t));
    spconv_tensor_release(t64);
    return t;
}

spconv_tensor *conv_indices_tensor(const int32_t *rows, int64_t n) {
    int64_t sizes[2] = {n, 4};
    spconv_tensor *t = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_I32, 2, sizes, rows, &t));
    return t;
}

double *conv_read(const spconv_tensor *t, int64_t *n) {
    spconv_tensor *t64 = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, t, SPCONV_F64, &t64));
    int64_t count = spconv_tensor_numel(t64);
    double *v = helper_alloc((size_t)count, sizeof(double));
    SPCONV_ASSERT_OK(spconv_tensor_copy_to_host(NULL, t64, v, (size_t)count * sizeof(double)));
    spconv_tensor_release(t64);
    if (n != NULL) *n = count;
    return v;
}

int32_t *conv_read_i32(const spconv_tensor *t) {
    assert_int_equal(spconv_tensor_dtype(t), SPCONV_I32);
    int64_t count = spconv_tensor_numel(t);
    int32_t *v = helper_alloc((size_t)count, sizeof(int32_t));
    SPCONV_ASSERT_OK(spconv_tensor_copy_to_host(NULL, t, v, (size_t)count * sizeof(int32_t)));
    return v;
}

spconv_rulebook *conv_build(spconv_context *ctx, const int32_t *rows, int64_t n,
                            const int64_t shape[3], int64_t batch,
                            const spconv_conv_params *params) {
    spconv_tensor *idx = conv_indices_tensor(rows, n);
    spconv_rulebook *rb = NULL;
    SPCONV_ASSERT_OK(spconv_rulebook_build(ctx, idx, shape, batch, params, &rb));
    spconv_tensor_release(idx);
    return rb;
}

spconv_context *conv_context(int threads) {
    spconv_context *ctx = NULL;
    SPCONV_ASSERT_OK(spconv_context_create(spconv_cpu(), &ctx));
    SPCONV_ASSERT_OK(spconv_context_set_num_threads(ctx, threads));
    return ctx;
}

int conv_same_bits(const spconv_tensor *a, const spconv_tensor *b) {
    if (spconv_tensor_dtype(a) != spconv_tensor_dtype(b)) return 0;
    if (spconv_tensor_numel(a) != spconv_tensor_numel(b)) return 0;
    size_t bytes = (size_t)spconv_tensor_numel(a) * spconv_dtype_size(spconv_tensor_dtype(a));
    char *x = helper_alloc(bytes, 1), *y = helper_alloc(bytes, 1);
    SPCONV_ASSERT_OK(spconv_tensor_copy_to_host(NULL, a, x, bytes));
    SPCONV_ASSERT_OK(spconv_tensor_copy_to_host(NULL, b, y, bytes));
    int same = memcmp(x, y, bytes) == 0;
    free(x);
    free(y);
    return same;
}
