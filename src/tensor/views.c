/* Views: new tensor handles over the same storage with another geometry. A view takes the base's
 * storage and offset, never the tensor itself, so a view of a view does not chain. */
#include <inttypes.h>

#include "core/error.h"
#include "tensor/geometry.h"
#include "tensor/tensor_impl.h"

#define CHECK_VIEW_ARGS(func, t, out)  \
    SPCONV_CHECK_NOT_NULL(func, out);  \
    *(out) = NULL;                     \
    SPCONV_CHECK_NOT_NULL(func, t)

static spconv_status make_view(const spconv_tensor *t, int64_t offset, int ndim,
                               const int64_t *sizes, const int64_t *strides, spconv_tensor **out) {
    return spconv__tensor_make(t->storage, offset, t->dtype, ndim, sizes, strides, out);
}

/* The offset of a view that starts @p start elements of stride @p stride into @p t's dim: that
 * of @p t when the view addresses no element (an empty tensor's strides are not checked, so the
 * product may not even fit in int64), else within the extent the strides were checked for. */
static int64_t view_offset(const spconv_tensor *t, int ndim, const int64_t *sizes, int64_t start,
                           int64_t stride) {
    for (int i = 0; i < ndim; ++i)
        if (sizes[i] == 0) return t->offset;
    return t->offset + start * stride;
}

spconv_status spconv_tensor_narrow(const spconv_tensor *t, int dim, int64_t start,
                                   int64_t length, spconv_tensor **out) {
    static const char func[] = "spconv_tensor_narrow";
    CHECK_VIEW_ARGS(func, t, out);
    int d = 0;
    SPCONV_FORWARD_IF_ERROR(spconv__wrap_dim(func, dim, t->ndim, &d));
    int64_t size = t->sizes[d];
    SPCONV_RETURN_ERROR_IF(start < 0 || start > size, SPCONV_ERR_OUT_OF_RANGE,
                           "%s: start %" PRId64 " is outside [0, %" PRId64 "] for dim %d of size %" PRId64,
                           func, start, size, d, size);
    SPCONV_RETURN_ERROR_IF(length < 0 || length > size - start, SPCONV_ERR_OUT_OF_RANGE,
                           "%s: start %" PRId64 " + length %" PRId64 " is outside dim %d of size %" PRId64,
                           func, start, length, d, size);
    int64_t sizes[SPCONV_MAX_DIMS];
    for (int i = 0; i < t->ndim; ++i) sizes[i] = t->sizes[i];
    sizes[d] = length;
    return make_view(t, view_offset(t, t->ndim, sizes, start, t->strides[d]), t->ndim, sizes,
                     t->strides, out);
}

/* Python's rule for a slice bound: negative counts from the end, then clamp to [0, size]. */
static int64_t clamp_slice_bound(int64_t bound, int64_t size) {
    if (bound < 0) bound += size;
    if (bound < 0) return 0;
    return bound > size ? size : bound;
}

spconv_status spconv_tensor_slice(const spconv_tensor *t, int dim, int64_t start, int64_t end,
                                  int64_t step, spconv_tensor **out) {
    static const char func[] = "spconv_tensor_slice";
    CHECK_VIEW_ARGS(func, t, out);
    int d = 0;
    SPCONV_FORWARD_IF_ERROR(spconv__wrap_dim(func, dim, t->ndim, &d));
    SPCONV_RETURN_ERROR_IF(step < 1, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: step %" PRId64 " must be >= 1", func, step);
    int64_t size = t->sizes[d];
    start = clamp_slice_bound(start, size);
    end = clamp_slice_bound(end, size);
    int64_t length = end > start ? (end - start - 1) / step + 1 : 0;
    int64_t sizes[SPCONV_MAX_DIMS], strides[SPCONV_MAX_DIMS];
    for (int i = 0; i < t->ndim; ++i) {
        sizes[i] = t->sizes[i];
        strides[i] = t->strides[i];
    }
    sizes[d] = length;
    /* With two or more elements step < size, so the product stays inside the extent; a single
     * element keeps its stride, which then never matters, and a huge step cannot overflow. */
    if (length > 1) strides[d] *= step;
    return make_view(t, view_offset(t, t->ndim, sizes, start, t->strides[d]), t->ndim, sizes,
                     strides, out);
}

spconv_status spconv_tensor_select(const spconv_tensor *t, int dim, int64_t index,
                                   spconv_tensor **out) {
    static const char func[] = "spconv_tensor_select";
    CHECK_VIEW_ARGS(func, t, out);
    int d = 0;
    SPCONV_FORWARD_IF_ERROR(spconv__wrap_dim(func, dim, t->ndim, &d));
    int64_t size = t->sizes[d];
    SPCONV_RETURN_ERROR_IF(index < -size || index >= size, SPCONV_ERR_OUT_OF_RANGE,
                           "%s: index %" PRId64 " is out of range for dim %d of size %" PRId64,
                           func, index, d, size);
    if (index < 0) index += size;
    int64_t sizes[SPCONV_MAX_DIMS], strides[SPCONV_MAX_DIMS];
    for (int i = 0, j = 0; i < t->ndim; ++i) {
        if (i == d) continue;
        sizes[j] = t->sizes[i];
        strides[j++] = t->strides[i];
    }
    return make_view(t, t->offset + index * t->strides[d], t->ndim - 1, sizes, strides, out);
}

spconv_status spconv_tensor_permute(const spconv_tensor *t, const int *dims, spconv_tensor **out) {
    static const char func[] = "spconv_tensor_permute";
    CHECK_VIEW_ARGS(func, t, out);
    SPCONV_RETURN_ERROR_IF(dims == NULL && t->ndim > 0, SPCONV_ERR_NULL_POINTER,
                           "%s: 'dims' is NULL for a %d-d tensor", func, t->ndim);
    int seen[SPCONV_MAX_DIMS] = {0};
    int64_t sizes[SPCONV_MAX_DIMS], strides[SPCONV_MAX_DIMS];
    for (int i = 0; i < t->ndim; ++i) {
        SPCONV_RETURN_ERROR_IF(dims[i] < 0 || dims[i] >= t->ndim, SPCONV_ERR_OUT_OF_RANGE,
                               "%s: dims[%d] = %d is outside [0, %d)", func, i, dims[i], t->ndim);
        SPCONV_RETURN_ERROR_IF(seen[dims[i]], SPCONV_ERR_INVALID_ARGUMENT,
                               "%s: dim %d appears twice in dims (not a permutation)", func, dims[i]);
        seen[dims[i]] = 1;
        sizes[i] = t->sizes[dims[i]];
        strides[i] = t->strides[dims[i]];
    }
    return make_view(t, t->offset, t->ndim, sizes, strides, out);
}

spconv_status spconv_tensor_transpose(const spconv_tensor *t, int dim0, int dim1,
                                      spconv_tensor **out) {
    static const char func[] = "spconv_tensor_transpose";
    CHECK_VIEW_ARGS(func, t, out);
    int d0 = 0, d1 = 0;
    SPCONV_FORWARD_IF_ERROR(spconv__wrap_dim(func, dim0, t->ndim, &d0));
    SPCONV_FORWARD_IF_ERROR(spconv__wrap_dim(func, dim1, t->ndim, &d1));
    int dims[SPCONV_MAX_DIMS];
    for (int i = 0; i < t->ndim; ++i) dims[i] = i;
    dims[d0] = d1;
    dims[d1] = d0;
    return spconv_tensor_permute(t, dims, out);
}

spconv_status spconv_tensor_squeeze(const spconv_tensor *t, int dim, spconv_tensor **out) {
    static const char func[] = "spconv_tensor_squeeze";
    CHECK_VIEW_ARGS(func, t, out);
    int d = -1;
    if (dim != SPCONV_ALL_DIMS) SPCONV_FORWARD_IF_ERROR(spconv__wrap_dim(func, dim, t->ndim, &d));
    int64_t sizes[SPCONV_MAX_DIMS], strides[SPCONV_MAX_DIMS];
    int ndim = 0;
    for (int i = 0; i < t->ndim; ++i) {
        int drop = t->sizes[i] == 1 && (dim == SPCONV_ALL_DIMS || i == d);
        if (drop) continue;
        sizes[ndim] = t->sizes[i];
        strides[ndim++] = t->strides[i];
    }
    return make_view(t, t->offset, ndim, sizes, strides, out);
}

spconv_status spconv_tensor_unsqueeze(const spconv_tensor *t, int dim, spconv_tensor **out) {
    static const char func[] = "spconv_tensor_unsqueeze";
    CHECK_VIEW_ARGS(func, t, out);
    SPCONV_RETURN_ERROR_IF(t->ndim == SPCONV_MAX_DIMS, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: the tensor already has the maximum of %d dims", func,
                           SPCONV_MAX_DIMS);
    int d = 0;
    SPCONV_FORWARD_IF_ERROR(spconv__wrap_dim(func, dim, t->ndim + 1, &d));
    int64_t sizes[SPCONV_MAX_DIMS], strides[SPCONV_MAX_DIMS];
    for (int i = 0, j = 0; i <= t->ndim; ++i) {
        if (i == d) {
            sizes[i] = 1;
            /* Any stride is valid for a size-1 dim; this one keeps contiguous tensors so (and 1
             * where the product does not fit, as an empty tensor's unchecked strides allow). */
            int64_t stride = 1;
            if (d < t->ndim && __builtin_mul_overflow(t->sizes[d], t->strides[d], &stride))
                stride = 1;
            strides[i] = stride;
        } else {
            sizes[i] = t->sizes[j];
            strides[i] = t->strides[j++];
        }
    }
    return make_view(t, t->offset, t->ndim + 1, sizes, strides, out);
}

spconv_status spconv_tensor_expand(const spconv_tensor *t, int ndim, const int64_t *sizes,
                                   spconv_tensor **out) {
    static const char func[] = "spconv_tensor_expand";
    CHECK_VIEW_ARGS(func, t, out);
    SPCONV_RETURN_ERROR_IF(ndim < t->ndim || ndim > SPCONV_MAX_DIMS, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: ndim = %d is outside [%d, %d] for a %d-d tensor", func, ndim,
                           t->ndim, SPCONV_MAX_DIMS, t->ndim);
    SPCONV_RETURN_ERROR_IF(sizes == NULL && ndim > 0, SPCONV_ERR_NULL_POINTER,
                           "%s: 'sizes' is NULL with ndim = %d", func, ndim);
    int lead = ndim - t->ndim;
    int64_t new_sizes[SPCONV_MAX_DIMS], strides[SPCONV_MAX_DIMS], numel = 0;
    for (int i = 0; i < ndim; ++i) {
        int64_t old = i < lead ? 1 : t->sizes[i - lead];
        int64_t want = sizes[i] == -1 && i >= lead ? old : sizes[i];
        SPCONV_RETURN_ERROR_IF(want < 0, SPCONV_ERR_INVALID_ARGUMENT,
                               "%s: sizes[%d] = %" PRId64 " is invalid (-1 only keeps an existing dim)",
                               func, i, sizes[i]);
        SPCONV_RETURN_ERROR_IF(old != want && old != 1, SPCONV_ERR_SHAPE_MISMATCH,
                               "%s: cannot expand dim %d of size %" PRId64 " to %" PRId64
                               " (only size-1 dims broadcast; tensor %s, sizes %s)",
                               func, i - lead, old, want, spconv__dims_str(t->ndim, t->sizes).text,
                               spconv__dims_str(ndim, sizes).text);
        new_sizes[i] = want;
        strides[i] = i < lead || old != want ? 0 : t->strides[i - lead];
    }
    SPCONV_FORWARD_IF_ERROR(spconv__check_sizes(func, ndim, new_sizes, &numel));
    return make_view(t, t->offset, ndim, new_sizes, strides, out);
}
