/* Validation and arithmetic on sizes and strides. */
#include <inttypes.h>
#include <stdio.h>

#include "core/context_impl.h"
#include "core/error.h"
#include "tensor/geometry.h"

spconv__dims_text spconv__dims_str(int ndim, const int64_t *values) {
    spconv__dims_text out;
    size_t used = 0;
    out.text[used++] = '[';
    for (int i = 0; i < ndim && i < SPCONV_MAX_DIMS; ++i) {
        used += (size_t)snprintf(out.text + used, sizeof out.text - used, "%s%" PRId64,
                                 i == 0 ? "" : ", ", values[i]);
    }
    snprintf(out.text + used, sizeof out.text - used, "]");
    return out;
}

spconv_status spconv__check_dtype(const char *func, spconv_dtype dtype) {
    SPCONV_RETURN_ERROR_IF((unsigned)dtype >= SPCONV_DTYPE_COUNT, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: dtype %d is not a spconv_dtype", func, (int)dtype);
    return SPCONV_OK;
}

spconv_status spconv__check_sizes(const char *func, int ndim, const int64_t *sizes, int64_t *numel) {
    SPCONV_RETURN_ERROR_IF(ndim < 0 || ndim > SPCONV_MAX_DIMS, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: ndim = %d is outside [0, %d]", func, ndim, SPCONV_MAX_DIMS);
    SPCONV_RETURN_ERROR_IF(ndim > 0 && sizes == NULL, SPCONV_ERR_NULL_POINTER,
                           "%s: 'sizes' is NULL with ndim = %d", func, ndim);
    int64_t product = 1, nonzero_product = 1;
    for (int i = 0; i < ndim; ++i) {
        SPCONV_RETURN_ERROR_IF(sizes[i] < 0, SPCONV_ERR_INVALID_ARGUMENT,
                               "%s: sizes[%d] = %" PRId64 " is negative (sizes %s)", func, i,
                               sizes[i], spconv__dims_str(ndim, sizes).text);
        int64_t factor = sizes[i] == 0 ? 1 : sizes[i];
        SPCONV_RETURN_ERROR_IF(nonzero_product > INT64_MAX / factor, SPCONV_ERR_OVERFLOW,
                               "%s: the number of elements of sizes %s overflows int64", func,
                               spconv__dims_str(ndim, sizes).text);
        nonzero_product *= factor;
        product *= sizes[i];
    }
    *numel = product;
    return SPCONV_OK;
}

spconv_status spconv__check_nbytes(const char *func, int64_t numel, spconv_dtype dtype,
                                   int64_t *nbytes) {
    int64_t element = (int64_t)spconv_dtype_size(dtype);
    SPCONV_RETURN_ERROR_IF(numel > INT64_MAX / element, SPCONV_ERR_OVERFLOW,
                           "%s: %" PRId64 " elements of %s = more than 2^63 bytes", func, numel,
                           spconv_dtype_name(dtype));
    *nbytes = numel * element;
    return SPCONV_OK;
}

spconv_status spconv__check_strides(const char *func, int ndim, const int64_t *sizes,
                                    const int64_t *strides, int64_t *max_index) {
    int64_t reach = 0;
    int empty = 0;
    for (int i = 0; i < ndim; ++i) {
        SPCONV_RETURN_ERROR_IF(strides[i] < 0, SPCONV_ERR_INVALID_ARGUMENT,
                               "%s: strides[%d] = %" PRId64 " is negative (strides %s)", func, i,
                               strides[i], spconv__dims_str(ndim, strides).text);
        if (sizes[i] == 0) empty = 1;
    }
    for (int i = 0; i < ndim && !empty; ++i) {
        if (sizes[i] <= 1 || strides[i] == 0) continue;
        SPCONV_RETURN_ERROR_IF(strides[i] > (INT64_MAX - reach) / (sizes[i] - 1),
                               SPCONV_ERR_OVERFLOW,
                               "%s: sizes %s with strides %s reach past element 2^63", func,
                               spconv__dims_str(ndim, sizes).text,
                               spconv__dims_str(ndim, strides).text);
        reach += (sizes[i] - 1) * strides[i];
    }
    *max_index = empty ? 0 : reach;
    return SPCONV_OK;
}

void spconv__contiguous_strides(int ndim, const int64_t *sizes, int64_t *strides) {
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; --i) {
        strides[i] = stride;
        stride *= sizes[i] == 0 ? 1 : sizes[i];
    }
}

spconv_status spconv__wrap_dim(const char *func, int dim, int ndim, int *out) {
    SPCONV_RETURN_ERROR_IF(ndim == 0, SPCONV_ERR_OUT_OF_RANGE,
                           "%s: dim %d is out of range for a 0-d tensor (it has no dims)", func, dim);
    SPCONV_RETURN_ERROR_IF(dim < -ndim || dim >= ndim, SPCONV_ERR_OUT_OF_RANGE,
                           "%s: dim %d is out of range for a %d-d tensor (valid: %d .. %d)", func,
                           dim, ndim, -ndim, ndim - 1);
    *out = dim < 0 ? dim + ndim : dim;
    return SPCONV_OK;
}

spconv_status spconv__check_context(const char *func, const spconv_context *ctx,
                                    spconv_device device) {
    SPCONV_RETURN_ERROR_IF(ctx != NULL && ctx->device.type == SPCONV_DEVICE_CUDA &&
                               device.type == SPCONV_DEVICE_CUDA && ctx->device.index != device.index,
                           SPCONV_ERR_DEVICE_MISMATCH,
                           "%s: the context is for CUDA device %d but the tensor is on CUDA device %d",
                           func, ctx->device.index, device.index);
    return SPCONV_OK;
}
