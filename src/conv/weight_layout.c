/* Weight layout converters between RSCK [KD, KH, KW, C_in, C_out] (ours, also [KV, C_in, C_out]),
 * KRSC [C_out, KD, KH, KW, C_in] (spconv 2.x) and OIDHW [C_out, C_in, KD, KH, KW] (PyTorch).
 * Each is a permuted view copied into a new contiguous tensor, on any device and dtype; the
 * result never shares memory with the input. */
#include "conv/conv_check.h"
#include "core/error.h"

/* Permutation from RSCK (dims kd, kh, kw, ci, co = 0..4) to @p layout: out dim i = RSCK dim
 * perm[i]; and its inverse. */
static const int from_rsck_perm[3][5] = {{0, 1, 2, 3, 4}, {4, 0, 1, 2, 3}, {4, 3, 0, 1, 2}};
static const int to_rsck_perm[3][5] = {{0, 1, 2, 3, 4}, {1, 2, 3, 4, 0}, {2, 3, 4, 1, 0}};
static const char *const layout_shapes[3] = {"RSCK [KD, KH, KW, C_in, C_out]",
                                             "KRSC [C_out, KD, KH, KW, C_in]",
                                             "OIDHW [C_out, C_in, KD, KH, KW]"};

static spconv_status check_layout(const char *func, spconv_weight_layout layout) {
    SPCONV_RETURN_ERROR_IF(layout != SPCONV_WEIGHT_RSCK && layout != SPCONV_WEIGHT_KRSC &&
                               layout != SPCONV_WEIGHT_OIDHW,
                           SPCONV_ERR_INVALID_ARGUMENT, "%s: unknown weight layout %d", func,
                           (int)layout);
    return SPCONV_OK;
}

/* A new contiguous copy of @p t with its dims permuted by @p perm; with @p sizes (ndim entries)
 * the copy is then viewed with those sizes. */
static spconv_status permuted_copy(spconv_context *ctx, const spconv_tensor *t, const int *perm,
                                   int ndim, const int64_t *sizes, spconv_tensor **out) {
    spconv_tensor *view = NULL, *copy = NULL;
    SPCONV_FORWARD_IF_ERROR(spconv_tensor_permute(t, perm, &view));
    spconv_status st = spconv_tensor_clone(ctx, view, &copy);
    spconv_tensor_release(view);
    if (st != SPCONV_OK || sizes == NULL) {
        *out = copy;
        return st;
    }
    st = spconv_tensor_view(copy, ndim, sizes, out);
    spconv_tensor_release(copy);
    return st;
}

spconv_status spconv_weight_to_rsck(spconv_context *ctx, const spconv_tensor *weight,
                                    spconv_weight_layout layout, int64_t kernel[3],
                                    spconv_tensor **out) {
    static const char func[] = "spconv_weight_to_rsck";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    SPCONV_CHECK_NOT_NULL(func, weight);
    SPCONV_FORWARD_IF_ERROR(check_layout(func, layout));
    SPCONV_RETURN_ERROR_IF(spconv_tensor_ndim(weight) != 5, SPCONV_ERR_SHAPE_MISMATCH,
                           "%s: a weight in layout %s must be 5-d, got %d-d %s", func,
                           layout_shapes[layout], spconv_tensor_ndim(weight),
                           spconv__shape_text(weight).text);
    const int *perm = to_rsck_perm[layout];
    int64_t k[3], sizes[3];
    for (int axis = 0; axis < 3; ++axis) k[axis] = spconv_tensor_size(weight, perm[axis]);
    sizes[0] = k[0] * k[1] * k[2];
    sizes[1] = spconv_tensor_size(weight, perm[3]);
    sizes[2] = spconv_tensor_size(weight, perm[4]);
    SPCONV_FORWARD_IF_ERROR(permuted_copy(ctx, weight, perm, 3, sizes, out));
    if (kernel != NULL)
        for (int axis = 0; axis < 3; ++axis) kernel[axis] = k[axis];
    return SPCONV_OK;
}

spconv_status spconv_weight_from_rsck(spconv_context *ctx, const spconv_tensor *weight,
                                      const int64_t kernel[3], spconv_weight_layout layout,
                                      spconv_tensor **out) {
    static const char func[] = "spconv_weight_from_rsck";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    SPCONV_CHECK_NOT_NULL(func, weight);
    SPCONV_CHECK_NOT_NULL(func, kernel);
    SPCONV_FORWARD_IF_ERROR(check_layout(func, layout));
    for (int axis = 0; axis < 3; ++axis)
        SPCONV_RETURN_ERROR_IF(kernel[axis] <= 0, SPCONV_ERR_INVALID_ARGUMENT,
                               "%s: kernel (%lld, %lld, %lld) must be positive", func,
                               (long long)kernel[0], (long long)kernel[1], (long long)kernel[2]);
    int64_t kv = 1;
    for (int axis = 0; axis < 3; ++axis) {
        SPCONV_RETURN_ERROR_IF(kernel[axis] > INT64_MAX / kv, SPCONV_ERR_OVERFLOW,
                               "%s: kernel (%lld, %lld, %lld) has more offsets than int64 holds",
                               func, (long long)kernel[0], (long long)kernel[1],
                               (long long)kernel[2]);
        kv *= kernel[axis];
    }
    int ndim = spconv_tensor_ndim(weight);
    int fits = ndim == 3   ? spconv_tensor_size(weight, 0) == kv
               : ndim == 5 ? spconv_tensor_size(weight, 0) == kernel[0] &&
                                 spconv_tensor_size(weight, 1) == kernel[1] &&
                                 spconv_tensor_size(weight, 2) == kernel[2]
                           : 0;
    SPCONV_RETURN_ERROR_IF(!fits, SPCONV_ERR_SHAPE_MISMATCH,
                           "%s: weight %s is not RSCK [%lld, C_in, C_out] or [%lld, %lld, %lld, "
                           "C_in, C_out] for kernel (%lld, %lld, %lld)",
                           func, spconv__shape_text(weight).text, (long long)kv,
                           (long long)kernel[0], (long long)kernel[1], (long long)kernel[2],
                           (long long)kernel[0], (long long)kernel[1], (long long)kernel[2]);
    int64_t sizes5[5] = {kernel[0], kernel[1], kernel[2], spconv_tensor_size(weight, ndim - 2),
                         spconv_tensor_size(weight, ndim - 1)};
    spconv_tensor *rsck5 = NULL;
    SPCONV_FORWARD_IF_ERROR(spconv_tensor_reshape(ctx, weight, 5, sizes5, &rsck5));
    spconv_status st = permuted_copy(ctx, rsck5, from_rsck_perm[layout], 5, NULL, out);
    spconv_tensor_release(rsck5);
    return st;
}
