/* view and reshape: the same elements under new sizes, sharing memory when the strides allow. */
#include <inttypes.h>

#include "core/error.h"
#include "tensor/geometry.h"
#include "tensor/tensor_impl.h"

/* Validate the requested sizes against t's numel and resolve a single -1. */
static spconv_status resolve_sizes(const char *func, const spconv_tensor *t, int ndim,
                                   const int64_t *sizes, int64_t *resolved) {
    SPCONV_RETURN_ERROR_IF(ndim < 0 || ndim > SPCONV_MAX_DIMS, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: ndim = %d is outside [0, %d]", func, ndim, SPCONV_MAX_DIMS);
    SPCONV_RETURN_ERROR_IF(sizes == NULL && ndim > 0, SPCONV_ERR_NULL_POINTER,
                           "%s: 'sizes' is NULL with ndim = %d", func, ndim);
    int inferred = -1;
    for (int i = 0; i < ndim; ++i) {
        resolved[i] = sizes[i];
        if (sizes[i] != -1) continue;
        SPCONV_RETURN_ERROR_IF(inferred >= 0, SPCONV_ERR_INVALID_ARGUMENT,
                               "%s: sizes %s has more than one -1", func,
                               spconv__dims_str(ndim, sizes).text);
        inferred = i;
        resolved[i] = 1;
    }
    int64_t known = 0;
    SPCONV_FORWARD_IF_ERROR(spconv__check_sizes(func, ndim, resolved, &known));
    if (inferred >= 0) {
        SPCONV_RETURN_ERROR_IF(known == 0, SPCONV_ERR_INVALID_ARGUMENT,
                               "%s: cannot infer the -1 in sizes %s next to a size of 0", func,
                               spconv__dims_str(ndim, sizes).text);
        SPCONV_RETURN_ERROR_IF(t->numel % known != 0, SPCONV_ERR_SHAPE_MISMATCH,
                               "%s: %" PRId64 " elements of %s do not divide into sizes %s", func,
                               t->numel, spconv__dims_str(t->ndim, t->sizes).text,
                               spconv__dims_str(ndim, sizes).text);
        resolved[inferred] = t->numel / known;
        known = t->numel;
    }
    SPCONV_RETURN_ERROR_IF(known != t->numel, SPCONV_ERR_SHAPE_MISMATCH,
                           "%s: sizes %s hold %" PRId64 " elements but the tensor %s holds %" PRId64,
                           func, spconv__dims_str(ndim, sizes).text, known,
                           spconv__dims_str(t->ndim, t->sizes).text, t->numel);
    return SPCONV_OK;
}

/* Strides that give sizes `sizes` the same elements as t without copying, or 0 when none exist.
 * The old dims are cut into chunks that are each evenly strided; every new dim must fall inside
 * one chunk (after PyTorch's computeStride). */
static int view_strides(const spconv_tensor *t, int ndim, const int64_t *sizes, int64_t *strides) {
    if (t->numel == 0 || t->ndim == 0) {
        spconv__contiguous_strides(ndim, sizes, strides);
        return 1;
    }
    int view_d = ndim - 1;
    int64_t chunk_stride = t->strides[t->ndim - 1], chunk_numel = 1, view_numel = 1;
    for (int d = t->ndim - 1; d >= 0; --d) {
        chunk_numel *= t->sizes[d];
        int chunk_ends = d == 0 || (t->sizes[d - 1] != 1 &&
                                    t->strides[d - 1] != chunk_numel * chunk_stride);
        if (!chunk_ends) continue;
        while (view_d >= 0 && (view_numel < chunk_numel || sizes[view_d] == 1)) {
            strides[view_d] = view_numel * chunk_stride;
            view_numel *= sizes[view_d--];
        }
        if (view_numel != chunk_numel) return 0;
        if (d > 0) {
            chunk_stride = t->strides[d - 1];
            chunk_numel = view_numel = 1;
        }
    }
    return view_d == -1;
}

spconv_status spconv_tensor_view(const spconv_tensor *t, int ndim, const int64_t *sizes,
                                 spconv_tensor **out) {
    static const char func[] = "spconv_tensor_view";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    SPCONV_CHECK_NOT_NULL(func, t);
    int64_t resolved[SPCONV_MAX_DIMS], strides[SPCONV_MAX_DIMS];
    SPCONV_FORWARD_IF_ERROR(resolve_sizes(func, t, ndim, sizes, resolved));
    SPCONV_RETURN_ERROR_IF(!view_strides(t, ndim, resolved, strides), SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: a tensor with sizes %s and strides %s cannot be viewed as %s "
                           "without copying (use spconv_tensor_reshape)",
                           func, spconv__dims_str(t->ndim, t->sizes).text,
                           spconv__dims_str(t->ndim, t->strides).text,
                           spconv__dims_str(ndim, resolved).text);
    return spconv__tensor_make(t->storage, t->offset, t->dtype, ndim, resolved, strides, out);
}

spconv_status spconv_tensor_reshape(spconv_context *ctx, const spconv_tensor *t, int ndim,
                                    const int64_t *sizes, spconv_tensor **out) {
    static const char func[] = "spconv_tensor_reshape";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    SPCONV_CHECK_NOT_NULL(func, t);
    int64_t resolved[SPCONV_MAX_DIMS], strides[SPCONV_MAX_DIMS];
    SPCONV_FORWARD_IF_ERROR(resolve_sizes(func, t, ndim, sizes, resolved));
    if (view_strides(t, ndim, resolved, strides))
        return spconv__tensor_make(t->storage, t->offset, t->dtype, ndim, resolved, strides, out);
    spconv_tensor *copy = NULL;
    SPCONV_FORWARD_IF_ERROR(spconv_tensor_clone(ctx, t, &copy));
    spconv_status st = spconv__tensor_make(copy->storage, 0, t->dtype, ndim, resolved, NULL, out);
    spconv_tensor_release(copy);
    return st;
}
