/* Conv parameters: defaults, validation and output spatial shapes (docs/design.md, "Geometry"). */
#include <inttypes.h>

#include "core/error.h"
#include "rulebook/internal.h"

/* Bounding every parameter by int32 keeps all geometry arithmetic (products of two parameters
 * plus a coordinate) far inside int64. */
#define PARAM_MAX INT32_MAX

spconv_conv_params spconv_conv_params_default(spconv_conv_kind kind) {
    spconv_conv_params params;
    params.kind = kind;
    for (int axis = 0; axis < 3; ++axis) {
        params.kernel[axis] = 3;
        params.stride[axis] = 1;
        params.padding[axis] = 0;
        params.dilation[axis] = 1;
        params.output_padding[axis] = 0;
    }
    return params;
}

int64_t spconv_conv_kernel_volume(const spconv_conv_params *params) {
    if (params == NULL) return 0;
    int64_t volume = 1;
    for (int axis = 0; axis < 3; ++axis) {
        if (params->kernel[axis] < 1 || params->kernel[axis] > PARAM_MAX) return 0;
        /* Three sizes of up to 2^31 can pass 2^63: saturate instead of wrapping to a small
         * volume (or 0) that every check below would take for a real one. */
        if (volume > INT64_MAX / params->kernel[axis]) return INT64_MAX;
        volume *= params->kernel[axis];
    }
    return volume;
}

static spconv_status check_range(const char *func, const char *name, int axis, int64_t value,
                                 int64_t min) {
    SPCONV_RETURN_ERROR_IF(value < min || value > PARAM_MAX, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: %s[%d] = %" PRId64 " must be in [%" PRId64 ", %d]", func, name,
                           axis, value, min, PARAM_MAX);
    return SPCONV_OK;
}

static spconv_status check_axis_params(const char *func, const spconv_conv_params *params,
                                       int axis) {
    SPCONV_FORWARD_IF_ERROR(check_range(func, "kernel", axis, params->kernel[axis], 1));
    SPCONV_FORWARD_IF_ERROR(check_range(func, "stride", axis, params->stride[axis], 1));
    SPCONV_FORWARD_IF_ERROR(check_range(func, "padding", axis, params->padding[axis], 0));
    SPCONV_FORWARD_IF_ERROR(check_range(func, "dilation", axis, params->dilation[axis], 1));
    const int64_t output_padding = params->output_padding[axis];
    if (params->kind == SPCONV_CONV_TRANSPOSED) {
        const int64_t limit = params->stride[axis] > params->dilation[axis]
                                  ? params->stride[axis]
                                  : params->dilation[axis];
        SPCONV_RETURN_ERROR_IF(
            output_padding < 0 || output_padding >= limit, SPCONV_ERR_INVALID_ARGUMENT,
            "%s: output_padding[%d] = %" PRId64 " must be in [0, max(stride %" PRId64
            ", dilation %" PRId64 "))",
            func, axis, output_padding, params->stride[axis], params->dilation[axis]);
    } else {
        SPCONV_RETURN_ERROR_IF(output_padding != 0, SPCONV_ERR_INVALID_ARGUMENT,
                               "%s: output_padding[%d] = %" PRId64
                               " is only allowed for transposed conv",
                               func, axis, output_padding);
    }
    SPCONV_RETURN_ERROR_IF(params->kind == SPCONV_CONV_SUBM && params->kernel[axis] % 2 == 0,
                           SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: kernel[%d] = %" PRId64
                           " is even; submanifold conv needs odd kernels",
                           func, axis, params->kernel[axis]);
    return SPCONV_OK;
}

static spconv_status check_params(const char *func, const spconv_conv_params *params) {
    SPCONV_CHECK_NOT_NULL(func, params);
    SPCONV_RETURN_ERROR_IF(params->kind == SPCONV_CONV_INVERSE, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: an INVERSE conv takes its geometry from the conv it inverts "
                           "(spconv_rulebook_inverse / spconv_sparse_get_rulebook)",
                           func);
    SPCONV_RETURN_ERROR_IF(
        params->kind != SPCONV_CONV_REGULAR && params->kind != SPCONV_CONV_SUBM &&
            params->kind != SPCONV_CONV_TRANSPOSED,
        SPCONV_ERR_INVALID_ARGUMENT, "%s: kind %d is not a conv kind", func, (int)params->kind);
    for (int axis = 0; axis < 3; ++axis)
        SPCONV_FORWARD_IF_ERROR(check_axis_params(func, params, axis));
    const int64_t volume = spconv_conv_kernel_volume(params);
    SPCONV_RETURN_ERROR_IF(volume > PARAM_MAX, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: kernel (%" PRId64 ", %" PRId64 ", %" PRId64
                           ") has more than %d offsets",
                           func, params->kernel[0], params->kernel[1], params->kernel[2],
                           PARAM_MAX);
    return SPCONV_OK;
}

/* Output extent of one axis, before the emptiness and int32 checks. */
static int64_t axis_output_size(const spconv_conv_params *params, int axis, int64_t in) {
    const int64_t k = params->kernel[axis], s = params->stride[axis], p = params->padding[axis],
                  d = params->dilation[axis];
    switch (params->kind) {
    case SPCONV_CONV_SUBM: return in;
    case SPCONV_CONV_TRANSPOSED:
        return (in - 1) * s - 2 * p + d * (k - 1) + 1 + params->output_padding[axis];
    default: {
        /* Floor division, as PyTorch: C's division would round a negative span up to 0. */
        const int64_t span = in + 2 * p - d * (k - 1) - 1;
        return span < 0 ? 0 : span / s + 1;
    }
    }
}

spconv_status spconv__conv_geometry(const char *func, const spconv_conv_params *params,
                                    const int64_t in_shape[3], int64_t out_shape[3]) {
    SPCONV_FORWARD_IF_ERROR(check_params(func, params));
    SPCONV_CHECK_NOT_NULL(func, in_shape);
    for (int axis = 0; axis < 3; ++axis)
        SPCONV_RETURN_ERROR_IF(
            in_shape[axis] < 1 || in_shape[axis] > PARAM_MAX, SPCONV_ERR_INVALID_ARGUMENT,
            "%s: spatial shape (%" PRId64 ", %" PRId64 ", %" PRId64
            ") has axis %d (%c) outside [1, %d]",
            func, in_shape[0], in_shape[1], in_shape[2], axis, SPCONV__AXIS_NAME(axis), PARAM_MAX);
    for (int axis = 0; axis < 3; ++axis) {
        const int64_t size = axis_output_size(params, axis, in_shape[axis]);
        SPCONV_RETURN_ERROR_IF(
            size <= 0, SPCONV_ERR_INVALID_ARGUMENT,
            "%s: output spatial shape is empty on axis %d (%c): input %" PRId64 ", kernel %" PRId64
            ", stride %" PRId64 ", padding %" PRId64 ", dilation %" PRId64 " give %" PRId64,
            func, axis, SPCONV__AXIS_NAME(axis), in_shape[axis], params->kernel[axis],
            params->stride[axis], params->padding[axis], params->dilation[axis], size);
        SPCONV_RETURN_ERROR_IF(size > PARAM_MAX, SPCONV_ERR_OVERFLOW,
                               "%s: output spatial shape on axis %d (%c) would be %" PRId64
                               ", beyond int32 coordinates",
                               func, axis, SPCONV__AXIS_NAME(axis), size);
        out_shape[axis] = size;
    }
    return SPCONV_OK;
}

spconv_status spconv_conv_output_shape(const spconv_conv_params *params, const int64_t in_shape[3],
                                       int64_t out_shape[3]) {
    const char *func = "spconv_conv_output_shape";
    SPCONV_CHECK_NOT_NULL(func, params);
    SPCONV_CHECK_NOT_NULL(func, in_shape);
    SPCONV_CHECK_NOT_NULL(func, out_shape);
    return spconv__conv_geometry(func, params, in_shape, out_shape);
}

spconv_status spconv__check_batch_size(const char *func, int64_t batch_size) {
    /* Batch indices are int32, so INT32_MAX + 1 batches is the most they can address. */
    SPCONV_RETURN_ERROR_IF(batch_size < 1 || batch_size > (int64_t)INT32_MAX + 1,
                           SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: batch_size = %" PRId64 " must be in [1, 2^31]", func, batch_size);
    return SPCONV_OK;
}
