/* Copies between tensors of any layout, dtype and device, and the conversions built on them. */
#include <inttypes.h>

#include "core/backend.h"
#include "core/error.h"
#include "tensor/geometry.h"
#include "tensor/tensor_impl.h"

static spconv_status device_copy_strided(const char *func, spconv_context *ctx, spconv_tensor *dst,
                                         const spconv_tensor *src) {
    const spconv_backend *backend = NULL;
    SPCONV_FORWARD_IF_ERROR(spconv__backend_check(func, dst->storage->device, &backend));
    SPCONV_FORWARD_IF_ERROR(spconv__check_context(func, ctx, dst->storage->device));
    SPCONV_RETURN_ERROR_IF(backend->copy_strided == NULL, SPCONV_ERR_NOT_SUPPORTED,
                           "%s: the %s backend has no strided copy", func, backend->name);
    return backend->copy_strided(ctx, dst, src);
}

/* A contiguous host tensor with the values and dtype of `src`, which may live anywhere. */
static spconv_status to_host_contiguous(const char *func, spconv_context *ctx,
                                        const spconv_tensor *src, spconv_tensor **out) {
    *out = NULL;
    spconv_device device = src->storage->device;
    if (device.type == SPCONV_DEVICE_CPU) return spconv_tensor_contiguous(ctx, src, out);
    const spconv_backend *backend = NULL;
    SPCONV_FORWARD_IF_ERROR(spconv__backend_check(func, device, &backend));
    spconv_tensor *packed = NULL, *host = NULL;
    spconv_status st;
    SPCONV_TRY_GOTO(st, spconv_tensor_contiguous(ctx, src, &packed), done);
    SPCONV_TRY_GOTO(st, spconv_tensor_empty(spconv_cpu(), src->dtype, src->ndim, src->sizes, &host),
                    done);
    SPCONV_TRY_GOTO(st, backend->copy_to_host(ctx, device.index, spconv_tensor_data(host),
                                              spconv_tensor_data(packed),
                                              (size_t)src->numel * spconv__tensor_element_size(src)),
                    done);
    *out = host;
    host = NULL;
done:
    spconv_tensor_release(packed);
    spconv_tensor_release(host);
    return st;
}

/* Copy from contiguous host memory into `dst` on a device, through a contiguous device buffer
 * when dst itself is strided. */
static spconv_status upload(const char *func, spconv_context *ctx, spconv_tensor *dst,
                            const spconv_tensor *host) {
    spconv_device device = dst->storage->device;
    const spconv_backend *backend = NULL;
    SPCONV_FORWARD_IF_ERROR(spconv__backend_check(func, device, &backend));
    spconv_tensor *staged = dst;
    if (!dst->is_contiguous)
        SPCONV_FORWARD_IF_ERROR(
            spconv__tensor_empty_in(func, ctx, device, dst->dtype, dst->ndim, dst->sizes, &staged));
    spconv_status st = backend->copy_to_device(ctx, device.index, spconv_tensor_data(staged),
                                               spconv_tensor_data(host),
                                               (size_t)dst->numel * spconv__tensor_element_size(dst));
    if (staged != dst) {
        if (st == SPCONV_OK) st = device_copy_strided(func, ctx, dst, staged);
        spconv_tensor_release(staged);
    }
    return st;
}

/* Devices differ: bring src to the host, convert there, and send the result to dst's device. */
static spconv_status copy_across_devices(const char *func, spconv_context *ctx, spconv_tensor *dst,
                                         const spconv_tensor *src) {
    /* Fail before any transfer when either device is missing or foreign to the context. */
    const spconv_backend *present = NULL;
    SPCONV_FORWARD_IF_ERROR(spconv__backend_check(func, dst->storage->device, &present));
    SPCONV_FORWARD_IF_ERROR(spconv__backend_check(func, src->storage->device, &present));
    SPCONV_FORWARD_IF_ERROR(spconv__check_context(func, ctx, dst->storage->device));
    SPCONV_FORWARD_IF_ERROR(spconv__check_context(func, ctx, src->storage->device));
    spconv_tensor *host_src = NULL, *host_dst = NULL;
    spconv_status st;
    SPCONV_TRY_GOTO(st, to_host_contiguous(func, ctx, src, &host_src), done);
    if (dst->storage->device.type == SPCONV_DEVICE_CPU) {
        st = spconv__cpu_backend.copy_strided(ctx, dst, host_src);
        goto done;
    }
    SPCONV_TRY_GOTO(st, spconv_tensor_to_dtype(ctx, host_src, dst->dtype, &host_dst), done);
    st = upload(func, ctx, dst, host_dst);
done:
    spconv_tensor_release(host_src);
    spconv_tensor_release(host_dst);
    return st;
}

/* First and last byte of the storage that a non-empty tensor touches. */
static void byte_span(const spconv_tensor *t, int64_t *first, int64_t *last) {
    int64_t element = (int64_t)spconv__tensor_element_size(t), reach = 0;
    for (int i = 0; i < t->ndim; ++i) reach += (t->sizes[i] - 1) * t->strides[i];
    *first = t->offset * element;
    *last = (t->offset + reach) * element + element - 1;
}

/* Where a tensor's first element lies: storages are compared by address, not by identity, since
 * two storages may wrap the same memory (two wrapped views of one torch tensor). */
static uintptr_t start_address(const spconv_tensor *t) {
    return (uintptr_t)t->storage->data +
           (uintptr_t)(t->offset * (int64_t)spconv__tensor_element_size(t));
}

static int same_view(const spconv_tensor *a, const spconv_tensor *b) {
    if (!spconv_device_equal(a->storage->device, b->storage->device) ||
        start_address(a) != start_address(b) || a->dtype != b->dtype)
        return 0;
    for (int i = 0; i < a->ndim; ++i)
        if (a->strides[i] != b->strides[i]) return 0;
    return 1;
}

/* Whether the bytes the two (non-empty) tensors span meet, in one storage or in two that wrap
 * overlapping memory of one device. */
static int storage_overlaps(const spconv_tensor *a, const spconv_tensor *b) {
    if (!spconv_device_equal(a->storage->device, b->storage->device)) return 0;
    int64_t a_first, a_last, b_first, b_last;
    byte_span(a, &a_first, &a_last);
    byte_span(b, &b_first, &b_last);
    const uintptr_t a_base = (uintptr_t)a->storage->data, b_base = (uintptr_t)b->storage->data;
    return a_base + (uintptr_t)a_first <= b_base + (uintptr_t)b_last &&
           b_base + (uintptr_t)b_first <= a_base + (uintptr_t)a_last;
}

static spconv_status check_copy_args(const char *func, const spconv_tensor *dst,
                                     const spconv_tensor *src) {
    int same_shape = dst->ndim == src->ndim;
    for (int i = 0; same_shape && i < dst->ndim; ++i) same_shape = dst->sizes[i] == src->sizes[i];
    SPCONV_RETURN_ERROR_IF(!same_shape, SPCONV_ERR_SHAPE_MISMATCH,
                           "%s: dst has sizes %s but src has sizes %s", func,
                           spconv__dims_str(dst->ndim, dst->sizes).text,
                           spconv__dims_str(src->ndim, src->sizes).text);
    for (int i = 0; i < dst->ndim && dst->numel > 0; ++i) {
        SPCONV_RETURN_ERROR_IF(dst->sizes[i] > 1 && dst->strides[i] == 0, SPCONV_ERR_INVALID_ARGUMENT,
                               "%s: dst is an expanded view (dim %d has size %" PRId64
                               " and stride 0), so its elements share memory",
                               func, i, dst->sizes[i]);
    }
    return SPCONV_OK;
}

spconv_status spconv_tensor_copy_(spconv_context *ctx, spconv_tensor *dst, const spconv_tensor *src) {
    static const char func[] = "spconv_tensor_copy_";
    SPCONV_CHECK_NOT_NULL(func, dst);
    SPCONV_CHECK_NOT_NULL(func, src);
    SPCONV_FORWARD_IF_ERROR(check_copy_args(func, dst, src));
    if (dst->numel == 0 || same_view(dst, src)) return SPCONV_OK;
    if (storage_overlaps(dst, src)) {
        /* Reading and writing the same bytes in one pass would read values already overwritten:
         * take a private copy of src first. */
        spconv_tensor *private_src = NULL;
        SPCONV_FORWARD_IF_ERROR(spconv_tensor_clone(ctx, src, &private_src));
        spconv_status st = spconv_tensor_copy_(ctx, dst, private_src);
        spconv_tensor_release(private_src);
        return st;
    }
    if (spconv_device_equal(dst->storage->device, src->storage->device))
        return device_copy_strided(func, ctx, dst, src);
    return copy_across_devices(func, ctx, dst, src);
}

/* A new contiguous tensor on `device` of `dtype` holding t's values. */
static spconv_status converted_copy(const char *func, spconv_context *ctx, const spconv_tensor *t,
                                    spconv_device device, spconv_dtype dtype, spconv_tensor **out) {
    spconv_tensor *fresh = NULL;
    SPCONV_FORWARD_IF_ERROR(
        spconv__tensor_empty_in(func, ctx, device, dtype, t->ndim, t->sizes, &fresh));
    spconv_status st = spconv_tensor_copy_(ctx, fresh, t);
    if (st != SPCONV_OK) {
        spconv_tensor_release(fresh);
        return st;
    }
    *out = fresh;
    return SPCONV_OK;
}

/* Hand back t itself: the caller gets a new reference, which it may use to write. */
static spconv_status same_tensor(const spconv_tensor *t, spconv_tensor **out) {
    spconv_tensor *self = (spconv_tensor *)t;
    spconv_tensor_retain(self);
    *out = self;
    return SPCONV_OK;
}

spconv_status spconv_tensor_contiguous(spconv_context *ctx, const spconv_tensor *t,
                                       spconv_tensor **out) {
    SPCONV_CHECK_NOT_NULL("spconv_tensor_contiguous", out);
    *out = NULL;
    SPCONV_CHECK_NOT_NULL("spconv_tensor_contiguous", t);
    if (t->is_contiguous) return same_tensor(t, out);
    return converted_copy("spconv_tensor_contiguous", ctx, t, t->storage->device, t->dtype, out);
}

spconv_status spconv_tensor_clone(spconv_context *ctx, const spconv_tensor *t, spconv_tensor **out) {
    SPCONV_CHECK_NOT_NULL("spconv_tensor_clone", out);
    *out = NULL;
    SPCONV_CHECK_NOT_NULL("spconv_tensor_clone", t);
    return converted_copy("spconv_tensor_clone", ctx, t, t->storage->device, t->dtype, out);
}

spconv_status spconv_tensor_to_device(spconv_context *ctx, const spconv_tensor *t,
                                      spconv_device device, spconv_tensor **out) {
    static const char func[] = "spconv_tensor_to_device";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    SPCONV_CHECK_NOT_NULL(func, t);
    const spconv_backend *backend = NULL;
    SPCONV_FORWARD_IF_ERROR(spconv__backend_check(func, device, &backend));
    if (t->is_contiguous && spconv_device_equal(device, t->storage->device))
        return same_tensor(t, out);
    return converted_copy(func, ctx, t, device, t->dtype, out);
}

spconv_status spconv_tensor_to_dtype(spconv_context *ctx, const spconv_tensor *t,
                                     spconv_dtype dtype, spconv_tensor **out) {
    static const char func[] = "spconv_tensor_to_dtype";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    SPCONV_CHECK_NOT_NULL(func, t);
    SPCONV_FORWARD_IF_ERROR(spconv__check_dtype(func, dtype));
    if (t->is_contiguous && t->dtype == dtype) return same_tensor(t, out);
    return converted_copy(func, ctx, t, t->storage->device, dtype, out);
}

spconv_status spconv_tensor_fill(spconv_context *ctx, spconv_tensor *t, double value) {
    static const char func[] = "spconv_tensor_fill";
    SPCONV_CHECK_NOT_NULL(func, t);
    const spconv_backend *backend = NULL;
    SPCONV_FORWARD_IF_ERROR(spconv__backend_check(func, t->storage->device, &backend));
    SPCONV_FORWARD_IF_ERROR(spconv__check_context(func, ctx, t->storage->device));
    SPCONV_RETURN_ERROR_IF(backend->fill == NULL, SPCONV_ERR_NOT_SUPPORTED,
                           "%s: the %s backend has no fill", func, backend->name);
    if (t->numel == 0) return SPCONV_OK;
    return backend->fill(ctx, t, value);
}

spconv_status spconv_tensor_copy_to_host(spconv_context *ctx, const spconv_tensor *t, void *dst,
                                         size_t nbytes) {
    static const char func[] = "spconv_tensor_copy_to_host";
    SPCONV_CHECK_NOT_NULL(func, t);
    size_t need = 0;
    SPCONV_RETURN_ERROR_IF(__builtin_mul_overflow((size_t)t->numel,
                                                  spconv__tensor_element_size(t), &need),
                           SPCONV_ERR_OVERFLOW,
                           "%s: the tensor's %" PRId64 " elements take more than SIZE_MAX bytes",
                           func, t->numel);
    SPCONV_RETURN_ERROR_IF(nbytes != need, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: nbytes = %zu but the %s tensor %s needs %zu", func, nbytes,
                           spconv_dtype_name(t->dtype), spconv__dims_str(t->ndim, t->sizes).text,
                           need);
    if (need == 0) return SPCONV_OK;
    SPCONV_CHECK_NOT_NULL(func, dst);
    spconv_tensor *host = NULL;
    SPCONV_FORWARD_IF_ERROR(
        spconv_tensor_wrap(spconv_cpu(), t->dtype, t->ndim, t->sizes, NULL, dst, NULL, NULL, &host));
    spconv_status st = spconv_tensor_copy_(ctx, host, t);
    spconv_tensor_release(host);
    return st;
}
