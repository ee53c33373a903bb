/* Sparse tensors: creation, checks, reference counting and accessors. The rulebook cache side is
 * in sparse_rulebook.c. */
#include <inttypes.h>
#include <stdlib.h>

#include "core/error.h"
#include "rulebook/internal.h"
#include "rulebook/sites.h"
#include "rulebook/sparse_impl.h"
#include "spconv/tensor.h"

static spconv_status check_features(const char *func, const spconv_tensor *features,
                                    const spconv_tensor *indices) {
    SPCONV_RETURN_ERROR_IF(!spconv_dtype_is_floating(spconv_tensor_dtype(features)),
                           SPCONV_ERR_DTYPE_MISMATCH, "%s: features must be floating, got %s", func,
                           spconv_dtype_name(spconv_tensor_dtype(features)));
    SPCONV_RETURN_ERROR_IF(spconv_tensor_ndim(features) != 2, SPCONV_ERR_SHAPE_MISMATCH,
                           "%s: features must be [N, C], got %d dims", func,
                           spconv_tensor_ndim(features));
    SPCONV_RETURN_ERROR_IF(spconv_tensor_size(features, 0) != spconv_tensor_size(indices, 0),
                           SPCONV_ERR_SHAPE_MISMATCH,
                           "%s: features have %" PRId64 " rows but indices have %" PRId64, func,
                           spconv_tensor_size(features, 0), spconv_tensor_size(indices, 0));
    SPCONV_RETURN_ERROR_IF(
        !spconv_device_equal(spconv_tensor_device(features), spconv_tensor_device(indices)),
        SPCONV_ERR_DEVICE_MISMATCH, "%s: features and indices are on different devices", func);
    return SPCONV_OK;
}

spconv_status spconv__sparse_make(const char *func, spconv_tensor *features, spconv_tensor *indices,
                                  const int64_t spatial_shape[3], int64_t batch_size,
                                  spconv__rulebook_cache *cache, spconv_sparse_tensor **out) {
    SPCONV_FORWARD_IF_ERROR(check_features(func, features, indices));
    spconv_sparse_tensor *sp = calloc(1, sizeof *sp);
    SPCONV_RETURN_ERROR_IF(sp == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "%s: out of host memory for a sparse tensor", func);
    sp->refcount = 1;
    sp->features = features;
    sp->indices = indices;
    for (int axis = 0; axis < 3; ++axis) sp->spatial_shape[axis] = spatial_shape[axis];
    sp->batch_size = batch_size;
    sp->cache = cache;
    spconv_tensor_retain(features);
    spconv_tensor_retain(indices);
    spconv__rulebook_cache_retain(cache);
    *out = sp;
    return SPCONV_OK;
}

/* 1 + the largest batch index (at least 1), read from any device. */
static spconv_status batch_size_from_indices(const char *func, const spconv_tensor *indices,
                                             int64_t *batch_size) {
    const int64_t n = spconv_tensor_size(indices, 0);
    *batch_size = 1;
    if (n == 0) return SPCONV_OK;
    int32_t *batch = malloc((size_t)n * sizeof *batch);
    SPCONV_RETURN_ERROR_IF(batch == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "%s: out of host memory for %" PRId64 " batch indices", func, n);
    spconv_tensor *column = NULL;
    spconv_status st = spconv_tensor_select(indices, 1, 0, &column);
    if (st == SPCONV_OK)
        st = spconv_tensor_copy_to_host(NULL, column, batch, (size_t)n * sizeof *batch);
    for (int64_t r = 0; st == SPCONV_OK && r < n; ++r)
        if (batch[r] >= *batch_size) *batch_size = (int64_t)batch[r] + 1;
    spconv_tensor_release(column);
    free(batch);
    return st;
}

spconv_status spconv_sparse_create(spconv_tensor *features, spconv_tensor *indices,
                                   const int64_t spatial_shape[3], int64_t batch_size,
                                   spconv_sparse_tensor **out) {
    const char *func = "spconv_sparse_create";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    SPCONV_CHECK_NOT_NULL(func, features);
    SPCONV_CHECK_NOT_NULL(func, indices);
    SPCONV_CHECK_NOT_NULL(func, spatial_shape);
    SPCONV_FORWARD_IF_ERROR(spconv__check_indices(func, indices));
    SPCONV_FORWARD_IF_ERROR(check_features(func, features, indices));
    for (int axis = 0; axis < 3; ++axis)
        SPCONV_RETURN_ERROR_IF(spatial_shape[axis] < 1 || spatial_shape[axis] > INT32_MAX,
                               SPCONV_ERR_INVALID_ARGUMENT,
                               "%s: spatial shape (%" PRId64 ", %" PRId64 ", %" PRId64
                               ") has axis %d (%c) outside [1, %d]",
                               func, spatial_shape[0], spatial_shape[1], spatial_shape[2], axis,
                               SPCONV__AXIS_NAME(axis), INT32_MAX);
    if (batch_size <= 0)
        SPCONV_FORWARD_IF_ERROR(batch_size_from_indices(func, indices, &batch_size));
    SPCONV_FORWARD_IF_ERROR(spconv__check_batch_size(func, batch_size));
    spconv__rulebook_cache *cache;
    SPCONV_FORWARD_IF_ERROR(spconv__rulebook_cache_create(func, &cache));
    const spconv_status st =
        spconv__sparse_make(func, features, indices, spatial_shape, batch_size, cache, out);
    spconv__rulebook_cache_release(cache);
    return st;
}

spconv_status spconv_sparse_with_features(const spconv_sparse_tensor *like, spconv_tensor *features,
                                          spconv_sparse_tensor **out) {
    const char *func = "spconv_sparse_with_features";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    SPCONV_CHECK_NOT_NULL(func, like);
    SPCONV_CHECK_NOT_NULL(func, features);
    return spconv__sparse_make(func, features, like->indices, like->spatial_shape, like->batch_size,
                               like->cache, out);
}

spconv_status spconv_sparse_validate(spconv_context *ctx, const spconv_sparse_tensor *sp) {
    const char *func = "spconv_sparse_validate";
    SPCONV_CHECK_NOT_NULL(func, sp);
    spconv_tensor *rows;
    SPCONV_FORWARD_IF_ERROR(spconv_tensor_to_device(ctx, sp->indices, spconv_cpu(), &rows));
    spconv__site_table sites;
    const spconv_status st = spconv__site_table_build(
        func, spconv_context_num_threads(ctx), spconv_tensor_data(rows),
        spconv_tensor_size(rows, 0), sp->spatial_shape, sp->batch_size, &sites);
    if (st == SPCONV_OK) spconv__site_table_free(&sites);
    spconv_tensor_release(rows);
    return st;
}

/* Same orderings as tensors (see tensor.c). */
void spconv_sparse_retain(spconv_sparse_tensor *sp) {
    if (sp != NULL) __atomic_fetch_add(&sp->refcount, 1, __ATOMIC_RELAXED);
}

void spconv_sparse_release(spconv_sparse_tensor *sp) {
    if (sp == NULL) return;
    if (__atomic_sub_fetch(&sp->refcount, 1, __ATOMIC_ACQ_REL) != 0) return;
    spconv_tensor_release(sp->features);
    spconv_tensor_release(sp->indices);
    spconv__rulebook_cache_release(sp->cache);
    free(sp);
}

spconv_tensor *spconv_sparse_features(const spconv_sparse_tensor *sp) { return sp->features; }
spconv_tensor *spconv_sparse_indices(const spconv_sparse_tensor *sp) { return sp->indices; }

void spconv_sparse_spatial_shape(const spconv_sparse_tensor *sp, int64_t shape[3]) {
    for (int axis = 0; axis < 3; ++axis) shape[axis] = sp->spatial_shape[axis];
}

int64_t spconv_sparse_batch_size(const spconv_sparse_tensor *sp) { return sp->batch_size; }

int64_t spconv_sparse_num_sites(const spconv_sparse_tensor *sp) {
    return spconv_tensor_size(sp->indices, 0);
}
