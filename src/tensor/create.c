/* Creating tensors: new memory (empty, zeros, full, arange, from_host) or existing memory (wrap,
 * from_storage). */
#include <inttypes.h>

#include "core/backend.h"
#include "core/error.h"
#include "tensor/convert.h"
#include "tensor/geometry.h"
#include "tensor/tensor_impl.h"

/* A new contiguous tensor with checked sizes, its memory from ctx's allocator (context.h). */
static spconv_status empty_checked(const char *func, spconv_context *ctx, spconv_device device,
                                   spconv_dtype dtype, int ndim, const int64_t *sizes,
                                   spconv_tensor **out) {
    *out = NULL;
    int64_t numel = 0, nbytes = 0;
    SPCONV_FORWARD_IF_ERROR(spconv__check_dtype(func, dtype));
    SPCONV_FORWARD_IF_ERROR(spconv__check_sizes(func, ndim, sizes, &numel));
    SPCONV_FORWARD_IF_ERROR(spconv__check_nbytes(func, numel, dtype, &nbytes));
    spconv_storage *storage = NULL;
    SPCONV_FORWARD_IF_ERROR(spconv__storage_create_in(func, ctx, device, (size_t)nbytes, &storage));
    spconv_status st = spconv__tensor_make(storage, 0, dtype, ndim, sizes, NULL, out);
    spconv_storage_release(storage);
    return st;
}

spconv_status spconv_tensor_empty(spconv_device device, spconv_dtype dtype, int ndim,
                                  const int64_t *sizes, spconv_tensor **out) {
    SPCONV_CHECK_NOT_NULL("spconv_tensor_empty", out);
    return empty_checked("spconv_tensor_empty", NULL, device, dtype, ndim, sizes, out);
}

spconv_status spconv__tensor_empty_in(const char *func, spconv_context *ctx, spconv_device device,
                                      spconv_dtype dtype, int ndim, const int64_t *sizes,
                                      spconv_tensor **out) {
    return empty_checked(func, ctx, device, dtype, ndim, sizes, out);
}

static spconv_status filled(const char *func, spconv_context *ctx, spconv_device device,
                            spconv_dtype dtype, int ndim, const int64_t *sizes, double value,
                            spconv_tensor **out) {
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    spconv_tensor *t = NULL;
    SPCONV_FORWARD_IF_ERROR(empty_checked(func, ctx, device, dtype, ndim, sizes, &t));
    spconv_status st = spconv_tensor_fill(ctx, t, value);
    if (st != SPCONV_OK) {
        spconv_tensor_release(t);
        return st;
    }
    *out = t;
    return SPCONV_OK;
}

spconv_status spconv_tensor_zeros(spconv_context *ctx, spconv_device device, spconv_dtype dtype,
                                  int ndim, const int64_t *sizes, spconv_tensor **out) {
    return filled("spconv_tensor_zeros", ctx, device, dtype, ndim, sizes, 0.0, out);
}

spconv_status spconv__tensor_zeros_in(const char *func, spconv_context *ctx, spconv_device device,
                                      spconv_dtype dtype, int ndim, const int64_t *sizes,
                                      spconv_tensor **out) {
    return filled(func, ctx, device, dtype, ndim, sizes, 0.0, out);
}

spconv_status spconv_tensor_full(spconv_context *ctx, spconv_device device, spconv_dtype dtype,
                                 int ndim, const int64_t *sizes, double value,
                                 spconv_tensor **out) {
    return filled("spconv_tensor_full", ctx, device, dtype, ndim, sizes, value, out);
}

/* Number of values of start, start+step, ... before end, without overflowing: the distance is
 * taken in uint64, where it always fits. */
static spconv_status arange_length(int64_t start, int64_t end, int64_t step, int64_t *length) {
    uint64_t distance = 0, magnitude;
    if (step > 0) {
        if (end > start) distance = (uint64_t)end - (uint64_t)start;
        magnitude = (uint64_t)step;
    } else {
        if (end < start) distance = (uint64_t)start - (uint64_t)end;
        magnitude = (uint64_t)0 - (uint64_t)step;
    }
    uint64_t count = distance / magnitude + (distance % magnitude != 0);
    SPCONV_RETURN_ERROR_IF(count > (uint64_t)INT64_MAX, SPCONV_ERR_OVERFLOW,
                           "spconv_tensor_arange: %" PRIu64 " values from %" PRId64 " to %" PRId64
                           " overflow int64", count, start, end);
    *length = (int64_t)count;
    return SPCONV_OK;
}

spconv_status spconv_tensor_arange(spconv_context *ctx, spconv_device device, spconv_dtype dtype,
                                   int64_t start, int64_t end, int64_t step, spconv_tensor **out) {
    static const char func[] = "spconv_tensor_arange";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    SPCONV_RETURN_ERROR_IF(step == 0, SPCONV_ERR_INVALID_ARGUMENT, "%s: step is 0", func);
    int64_t length = 0;
    SPCONV_FORWARD_IF_ERROR(arange_length(start, end, step, &length));
    SPCONV_FORWARD_IF_ERROR(spconv__check_dtype(func, dtype));
    const spconv_backend *backend = NULL;
    SPCONV_FORWARD_IF_ERROR(spconv__backend_check(func, device, &backend));
    spconv_tensor *host = NULL;
    SPCONV_FORWARD_IF_ERROR(empty_checked(func, ctx, spconv_cpu(), dtype, 1, &length, &host));
    char *data = spconv_tensor_data(host);
    size_t element = spconv_dtype_size(dtype);
    int64_t value = start;
    for (int64_t i = 0; i < length; ++i) {
        spconv__store_from_integer(data + (size_t)i * element, dtype, value);
        /* Step only to values that are in the sequence, so the sum never overflows. */
        if (i + 1 < length) value += step;
    }
    spconv_status st = spconv_tensor_to_device(ctx, host, device, out);
    spconv_tensor_release(host);
    return st;
}

spconv_status spconv_tensor_from_host(spconv_context *ctx, spconv_device device,
                                      spconv_dtype dtype, int ndim, const int64_t *sizes,
                                      const void *host_data, spconv_tensor **out) {
    static const char func[] = "spconv_tensor_from_host";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    int64_t numel = 0, nbytes = 0;
    SPCONV_FORWARD_IF_ERROR(spconv__check_dtype(func, dtype));
    SPCONV_FORWARD_IF_ERROR(spconv__check_sizes(func, ndim, sizes, &numel));
    SPCONV_FORWARD_IF_ERROR(spconv__check_nbytes(func, numel, dtype, &nbytes));
    SPCONV_RETURN_ERROR_IF(host_data == NULL && nbytes > 0, SPCONV_ERR_NULL_POINTER,
                           "%s: 'host_data' is NULL for %" PRId64 " elements", func, numel);
    SPCONV_FORWARD_IF_ERROR(spconv__check_context(func, ctx, device));
    spconv_tensor *t = NULL;
    SPCONV_FORWARD_IF_ERROR(empty_checked(func, ctx, device, dtype, ndim, sizes, &t));
    if (nbytes > 0) {
        spconv_status st = spconv__backend_for(device)->copy_to_device(
            ctx, device.index, spconv_tensor_data(t), host_data, (size_t)nbytes);
        if (st != SPCONV_OK) {
            spconv_tensor_release(t);
            return st;
        }
    }
    *out = t;
    return SPCONV_OK;
}

/* Checks shared by wrap and from_storage: dtype, sizes, strides (NULL: contiguous, copied into
 * `strides_out`), and the number of elements from the offset that the geometry addresses. */
static spconv_status check_user_geometry(const char *func, spconv_dtype dtype, int ndim,
                                         const int64_t *sizes, const int64_t *strides,
                                         int64_t *strides_out, int64_t *span) {
    int64_t numel = 0, max_index = 0;
    SPCONV_FORWARD_IF_ERROR(spconv__check_dtype(func, dtype));
    SPCONV_FORWARD_IF_ERROR(spconv__check_sizes(func, ndim, sizes, &numel));
    if (strides == NULL) {
        spconv__contiguous_strides(ndim, sizes, strides_out);
    } else {
        for (int i = 0; i < ndim; ++i) strides_out[i] = strides[i];
    }
    SPCONV_FORWARD_IF_ERROR(spconv__check_strides(func, ndim, sizes, strides_out, &max_index));
    SPCONV_RETURN_ERROR_IF(numel > 0 && max_index == INT64_MAX, SPCONV_ERR_OVERFLOW,
                           "%s: sizes %s with strides %s span more than 2^63 elements", func,
                           spconv__dims_str(ndim, sizes).text,
                           spconv__dims_str(ndim, strides_out).text);
    *span = numel > 0 ? max_index + 1 : 0;
    return SPCONV_OK;
}

/* Device memory must hold its elements at multiples of their size: a GPU faults on a misaligned
 * load, and the fault breaks every later call on the device (the CPU's loads tolerate it, and
 * host buffers given to copies may sit anywhere, so host memory is not checked). */
static spconv_status check_device_alignment(const char *func, spconv_device device,
                                            const void *data, spconv_dtype dtype) {
    const size_t element = spconv_dtype_size(dtype);
    SPCONV_RETURN_ERROR_IF(device.type != SPCONV_DEVICE_CPU && data != NULL &&
                               (uintptr_t)data % element != 0,
                           SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: data %p on cuda:%d is not aligned to the %zu-byte elements "
                           "of %s",
                           func, data, device.index, element, spconv_dtype_name(dtype));
    return SPCONV_OK;
}

spconv_status spconv_tensor_wrap(spconv_device device, spconv_dtype dtype, int ndim,
                                 const int64_t *sizes, const int64_t *strides, void *data,
                                 spconv_deleter deleter, void *user, spconv_tensor **out) {
    static const char func[] = "spconv_tensor_wrap";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    int64_t checked_strides[SPCONV_MAX_DIMS], span = 0, nbytes = 0;
    SPCONV_FORWARD_IF_ERROR(
        check_user_geometry(func, dtype, ndim, sizes, strides, checked_strides, &span));
    SPCONV_FORWARD_IF_ERROR(spconv__check_nbytes(func, span, dtype, &nbytes));
    SPCONV_RETURN_ERROR_IF(data == NULL && nbytes > 0, SPCONV_ERR_NULL_POINTER,
                           "%s: 'data' is NULL for sizes %s", func,
                           spconv__dims_str(ndim, sizes).text);
    const spconv_backend *backend = NULL;
    SPCONV_FORWARD_IF_ERROR(spconv__backend_check(func, device, &backend));
    SPCONV_FORWARD_IF_ERROR(check_device_alignment(func, device, data, dtype));
    spconv_storage *storage = NULL;
    SPCONV_FORWARD_IF_ERROR(spconv_storage_wrap(device, data, (size_t)nbytes, deleter, user, &storage));
    spconv_status st = spconv__tensor_make(storage, 0, dtype, ndim, sizes, checked_strides, out);
    /* On failure the caller still owns `data`: drop the storage without calling the deleter. */
    if (st != SPCONV_OK) storage->deleter = NULL;
    spconv_storage_release(storage);
    return st;
}

spconv_status spconv_tensor_from_storage(spconv_storage *storage, int64_t offset,
                                         spconv_dtype dtype, int ndim, const int64_t *sizes,
                                         const int64_t *strides, spconv_tensor **out) {
    static const char func[] = "spconv_tensor_from_storage";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    SPCONV_CHECK_NOT_NULL(func, storage);
    int64_t checked_strides[SPCONV_MAX_DIMS], span = 0;
    SPCONV_FORWARD_IF_ERROR(
        check_user_geometry(func, dtype, ndim, sizes, strides, checked_strides, &span));
    SPCONV_RETURN_ERROR_IF(offset < 0, SPCONV_ERR_OUT_OF_RANGE, "%s: offset %" PRId64 " is negative",
                           func, offset);
    uint64_t available = storage->nbytes / spconv_dtype_size(dtype);
    SPCONV_RETURN_ERROR_IF((uint64_t)offset > available || (uint64_t)span > available - (uint64_t)offset,
                           SPCONV_ERR_OUT_OF_RANGE,
                           "%s: sizes %s strides %s at offset %" PRId64 " need %" PRId64
                           " elements from the offset, but the storage holds %" PRIu64
                           " %s elements (%zu bytes)",
                           func, spconv__dims_str(ndim, sizes).text,
                           spconv__dims_str(ndim, checked_strides).text, offset, span, available,
                           spconv_dtype_name(dtype), storage->nbytes);
    SPCONV_FORWARD_IF_ERROR(check_device_alignment(func, storage->device, storage->data, dtype));
    return spconv__tensor_make(storage, offset, dtype, ndim, sizes, checked_strides, out);
}
