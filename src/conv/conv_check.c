/* Argument checks shared by the conv, pooling and dense-helper entry points. */
#include "conv/conv_check.h"

#include <stdio.h>

#include "conv/gemm.h"
#include "core/error.h"
#include "core/parallel.h"

spconv__conv_text spconv__shape_text(const spconv_tensor *t) {
    spconv__conv_text out;
    size_t used = 0;
    int ndim = spconv_tensor_ndim(t);
    out.text[used++] = '[';
    for (int i = 0; i < ndim; ++i)
        used += (size_t)snprintf(out.text + used, sizeof out.text - used, "%s%lld",
                                 i == 0 ? "" : ", ", (long long)spconv_tensor_size(t, i));
    snprintf(out.text + used, sizeof out.text - used, "]");
    return out;
}

spconv__conv_text spconv__device_text(spconv_device device) {
    spconv__conv_text out;
    if (device.type == SPCONV_DEVICE_CPU)
        snprintf(out.text, sizeof out.text, "cpu");
    else
        snprintf(out.text, sizeof out.text, "cuda:%d", device.index);
    return out;
}

spconv_status spconv__check_same_kind(const char *func, const spconv_tensor *ref,
                                      const char *ref_name, const spconv_tensor *other,
                                      const char *other_name) {
    spconv_dtype ref_dtype = spconv_tensor_dtype(ref), other_dtype = spconv_tensor_dtype(other);
    SPCONV_RETURN_ERROR_IF(
        ref_dtype != other_dtype, SPCONV_ERR_DTYPE_MISMATCH, "%s: %s is %s but %s is %s", func,
        ref_name, spconv_dtype_name(ref_dtype), other_name, spconv_dtype_name(other_dtype));
    spconv_device ref_device = spconv_tensor_device(ref);
    spconv_device other_device = spconv_tensor_device(other);
    SPCONV_RETURN_ERROR_IF(!spconv_device_equal(ref_device, other_device),
                           SPCONV_ERR_DEVICE_MISMATCH, "%s: %s is on %s but %s is on %s", func,
                           ref_name, spconv__device_text(ref_device).text, other_name,
                           spconv__device_text(other_device).text);
    return SPCONV_OK;
}

spconv_status spconv__check_matrix(const char *func, const spconv_tensor *t, const char *name,
                                   int64_t rows, int64_t cols) {
    SPCONV_RETURN_ERROR_IF(spconv_tensor_ndim(t) != 2, SPCONV_ERR_SHAPE_MISMATCH,
                           "%s: %s must be 2-d, got %d-d %s", func, name, spconv_tensor_ndim(t),
                           spconv__shape_text(t).text);
    int64_t t_rows = spconv_tensor_size(t, 0), t_cols = spconv_tensor_size(t, 1);
    SPCONV_RETURN_ERROR_IF(rows >= 0 && t_rows != rows, SPCONV_ERR_SHAPE_MISMATCH,
                           "%s: %s has %lld rows, expected %lld", func, name, (long long)t_rows,
                           (long long)rows);
    SPCONV_RETURN_ERROR_IF(cols >= 0 && t_cols != cols, SPCONV_ERR_SHAPE_MISMATCH,
                           "%s: %s has %lld columns, expected %lld", func, name, (long long)t_cols,
                           (long long)cols);
    return SPCONV_OK;
}

spconv_status spconv__check_cpu_float(const char *func, spconv_dtype dtype) {
    SPCONV_RETURN_ERROR_IF(dtype != SPCONV_F32 && dtype != SPCONV_F64, SPCONV_ERR_NOT_SUPPORTED,
                           "%s: the CPU kernels compute on floating-point features (f16, bf16, f32, f64), not %s", func,
                           spconv_dtype_name(dtype));
    return SPCONV_OK;
}

/* Weight [KV, C_in, C_out] or [KD, KH, KW, C_in, C_out] against the rulebook's kernel. */
static spconv_status check_weight(const char *func, const spconv_rulebook *rb,
                                  const spconv_tensor *weight) {
    int ndim = spconv_tensor_ndim(weight);
    SPCONV_RETURN_ERROR_IF(ndim != 3 && ndim != 5, SPCONV_ERR_SHAPE_MISMATCH,
                           "%s: weight must be [KV, C_in, C_out] or [KD, KH, KW, C_in, C_out], "
                           "got %d-d %s",
                           func, ndim, spconv__shape_text(weight).text);
    int64_t rb_kv = spconv_rulebook_kernel_volume(rb);
    const int64_t *kernel = spconv_rulebook_params(rb)->kernel;
    if (ndim == 3) {
        SPCONV_RETURN_ERROR_IF(spconv_tensor_size(weight, 0) != rb_kv, SPCONV_ERR_SHAPE_MISMATCH,
                               "%s: weight %s has KV = %lld kernel offsets but the rulebook has "
                               "%lld",
                               func, spconv__shape_text(weight).text,
                               (long long)spconv_tensor_size(weight, 0), (long long)rb_kv);
    } else {
        for (int axis = 0; axis < 3; ++axis)
            SPCONV_RETURN_ERROR_IF(
                spconv_tensor_size(weight, axis) != kernel[axis], SPCONV_ERR_SHAPE_MISMATCH,
                "%s: weight %s has kernel (%lld, %lld, %lld) but the rulebook "
                "has (%lld, %lld, %lld)",
                func, spconv__shape_text(weight).text, (long long)spconv_tensor_size(weight, 0),
                (long long)spconv_tensor_size(weight, 1), (long long)spconv_tensor_size(weight, 2),
                (long long)kernel[0], (long long)kernel[1], (long long)kernel[2]);
    }
    return SPCONV_OK;
}

spconv_status spconv__conv_check(const char *func, const spconv_rulebook *rb,
                                 const spconv_tensor *features, const spconv_tensor *weight,
                                 const spconv_tensor *bias, const spconv_tensor *grad_out,
                                 spconv__conv_dims *dims) {
    SPCONV_FORWARD_IF_ERROR(spconv__check_same_kind(func, features, "features", weight, "weight"));
    if (bias != NULL)
        SPCONV_FORWARD_IF_ERROR(spconv__check_same_kind(func, features, "features", bias, "bias"));
    if (grad_out != NULL)
        SPCONV_FORWARD_IF_ERROR(
            spconv__check_same_kind(func, features, "features", grad_out, "grad_out"));
    SPCONV_FORWARD_IF_ERROR(check_weight(func, rb, weight));
    int wdim = spconv_tensor_ndim(weight);
    dims->num_in = spconv_rulebook_num_in(rb);
    dims->num_out = spconv_rulebook_num_out(rb);
    dims->kernel_volume = spconv_rulebook_kernel_volume(rb);
    dims->c_in = spconv_tensor_size(weight, wdim - 2);
    dims->c_out = spconv_tensor_size(weight, wdim - 1);
    dims->dtype = spconv_tensor_dtype(features);
    dims->device = spconv_tensor_device(features);
    SPCONV_RETURN_ERROR_IF(spconv_tensor_ndim(features) != 2, SPCONV_ERR_SHAPE_MISMATCH,
                           "%s: features must be 2-d [num_in, C_in], got %d-d %s", func,
                           spconv_tensor_ndim(features), spconv__shape_text(features).text);
    SPCONV_RETURN_ERROR_IF(
        spconv_tensor_size(features, 0) != dims->num_in, SPCONV_ERR_SHAPE_MISMATCH,
        "%s: features have %lld rows but the rulebook has %lld input sites", func,
        (long long)spconv_tensor_size(features, 0), (long long)dims->num_in);
    SPCONV_RETURN_ERROR_IF(spconv_tensor_size(features, 1) != dims->c_in, SPCONV_ERR_SHAPE_MISMATCH,
                           "%s: features have C_in = %lld channels but weight %s expects C_in = "
                           "%lld",
                           func, (long long)spconv_tensor_size(features, 1),
                           spconv__shape_text(weight).text, (long long)dims->c_in);
    SPCONV_RETURN_ERROR_IF(bias != NULL && (spconv_tensor_ndim(bias) != 1 ||
                                            spconv_tensor_size(bias, 0) != dims->c_out),
                           SPCONV_ERR_SHAPE_MISMATCH, "%s: bias must be [C_out] = [%lld], got %s",
                           func, (long long)dims->c_out, spconv__shape_text(bias).text);
    SPCONV_RETURN_ERROR_IF(
        grad_out != NULL && (spconv_tensor_ndim(grad_out) != 2 ||
                             spconv_tensor_size(grad_out, 0) != dims->num_out ||
                             spconv_tensor_size(grad_out, 1) != dims->c_out),
        SPCONV_ERR_SHAPE_MISMATCH, "%s: grad_out must be [num_out, C_out] = [%lld, %lld], got %s",
        func, (long long)dims->num_out, (long long)dims->c_out, spconv__shape_text(grad_out).text);
    SPCONV_RETURN_ERROR_IF(dims->c_in > SPCONV__GEMM_MAX_DIM || dims->c_out > SPCONV__GEMM_MAX_DIM,
                           SPCONV_ERR_OVERFLOW,
                           "%s: weight %s has more channels than a GEMM can take (%lld)", func,
                           spconv__shape_text(weight).text, SPCONV__GEMM_MAX_DIM);
    return SPCONV_OK;
}

spconv_status spconv__rulebook_pairs(spconv_context *ctx, const spconv_rulebook *rb,
                                     spconv_tensor **pairs_in, spconv_tensor **pairs_out) {
    *pairs_in = NULL;
    *pairs_out = NULL;
    SPCONV_FORWARD_IF_ERROR(
        spconv_tensor_to_device(ctx, spconv_rulebook_pairs_in(rb), spconv_cpu(), pairs_in));
    spconv_status st =
        spconv_tensor_to_device(ctx, spconv_rulebook_pairs_out(rb), spconv_cpu(), pairs_out);
    if (st != SPCONV_OK) {
        spconv_tensor_release(*pairs_in);
        *pairs_in = NULL;
    }
    return st;
}

static spconv_status check_pool_rulebook(const char *func, const spconv_rulebook *rb) {
    spconv_conv_kind kind = spconv_rulebook_params(rb)->kind;
    SPCONV_RETURN_ERROR_IF(kind != SPCONV_CONV_REGULAR, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: max pooling needs a REGULAR rulebook, got kind %d", func,
                           (int)kind);
    return SPCONV_OK;
}

spconv_status spconv__pool_check_forward(const char *func, const spconv_rulebook *rb,
                                         const spconv_tensor *features) {
    SPCONV_FORWARD_IF_ERROR(check_pool_rulebook(func, rb));
    SPCONV_FORWARD_IF_ERROR(
        spconv__check_matrix(func, features, "features", spconv_rulebook_num_in(rb), -1));
    return SPCONV_OK;
}

spconv_status spconv__pool_check_backward(const char *func, const spconv_rulebook *rb,
                                          const spconv_tensor *argmax,
                                          const spconv_tensor *grad_out) {
    SPCONV_FORWARD_IF_ERROR(check_pool_rulebook(func, rb));
    SPCONV_RETURN_ERROR_IF(spconv_tensor_dtype(argmax) != SPCONV_I32, SPCONV_ERR_DTYPE_MISMATCH,
                           "%s: argmax must be i32, got %s", func,
                           spconv_dtype_name(spconv_tensor_dtype(argmax)));
    spconv_device a_dev = spconv_tensor_device(argmax), g_dev = spconv_tensor_device(grad_out);
    SPCONV_RETURN_ERROR_IF(!spconv_device_equal(a_dev, g_dev), SPCONV_ERR_DEVICE_MISMATCH,
                           "%s: argmax is on %s but grad_out is on %s", func,
                           spconv__device_text(a_dev).text, spconv__device_text(g_dev).text);
    int64_t num_out = spconv_rulebook_num_out(rb);
    SPCONV_FORWARD_IF_ERROR(spconv__check_matrix(func, grad_out, "grad_out", num_out, -1));
    SPCONV_FORWARD_IF_ERROR(
        spconv__check_matrix(func, argmax, "argmax", num_out, spconv_tensor_size(grad_out, 1)));
    return SPCONV_OK;
}

spconv_status spconv__check_argmax_rows(const char *func, const int32_t *argmax, int64_t rows,
                                        int64_t cols, int64_t num_in, int threads) {
    const int64_t n = rows * cols;
    /* -1 .. num_in - 1 (num_in <= INT32_MAX) are exactly the values that, as unsigned plus 1,
     * stay <= num_in: one compare per element, in a loop that vectorises. */
    const uint32_t limit = (uint32_t)num_in;
    int bad = 0;
    SPCONV_OMP(omp parallel for schedule(static) num_threads(threads) reduction(| : bad))
    for (int64_t e = 0; e < n; ++e) bad |= (uint32_t)argmax[e] + 1u > limit;
    if (!bad) return SPCONV_OK;
    /* The first bad element in row-major order, for the message. */
    int64_t first = 0;
    while ((uint32_t)argmax[first] + 1u <= limit) ++first;
    SPCONV_RETURN_ERROR_IF(first < n, SPCONV_ERR_OUT_OF_RANGE,
                           "%s: argmax[%lld, %lld] = %d is not -1 or an input row below %lld", func,
                           (long long)(first / cols), (long long)(first % cols),
                           (int)argmax[first], (long long)num_in);
    return SPCONV_OK;
}
