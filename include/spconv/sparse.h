/**
 * @file sparse.h
 * @brief Sparse tensors: features [N, C] + indices int32 [N, 4] (b, z, y, x) + spatial shape
 * (D, H, W) + batch size, and the rulebook cache shared along a network (spconv's indice_dict).
 *
 * Rulebook cache, as in spconv: a layer with an `indice_key` stores its rulebook under that key;
 * a later submanifold layer with the same key and the same geometry on the same sites reuses it;
 * an inverse conv finds the rulebook of the conv it inverts by key. Reusing a key with another
 * geometry is SPCONV_ERR_GEOMETRY_MISMATCH, never a silent mismatch. Sparse tensors derived from
 * one another (by convs, pooling, feature replacement) share one cache.
 */
#ifndef SPCONV_SPARSE_H
#define SPCONV_SPARSE_H

#include <stdint.h>

#include "spconv/context.h"
#include "spconv/rulebook.h"
#include "spconv/status.h"
#include "spconv/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spconv_sparse_tensor spconv_sparse_tensor;

/**
 * A sparse tensor over @p features (2-d [N, C], floating) and @p indices (int32 [N, 4]), both
 * retained, on one device. Checks shapes, dtypes, devices, spatial shape > 0 and batch size > 0;
 * the rows themselves are checked by spconv_sparse_validate and by every rulebook build.
 * @p batch_size <= 0 means 1 + the largest batch index. Starts with an empty rulebook cache.
 */
spconv_status spconv_sparse_create(spconv_tensor *features, spconv_tensor *indices,
                                   const int64_t spatial_shape[3], int64_t batch_size,
                                   spconv_sparse_tensor **out);

/** A sparse tensor with the sites, shape and rulebook cache of @p like and new @p features
 *  ([N, C'] with the same N). */
spconv_status spconv_sparse_with_features(const spconv_sparse_tensor *like, spconv_tensor *features,
                                          spconv_sparse_tensor **out);

/** Check every row: in range, batch index < batch size, no duplicates (first bad row named). */
spconv_status spconv_sparse_validate(spconv_context *ctx, const spconv_sparse_tensor *sp);

void spconv_sparse_retain(spconv_sparse_tensor *sp);
void spconv_sparse_release(spconv_sparse_tensor *sp);

spconv_tensor *spconv_sparse_features(const spconv_sparse_tensor *sp); /**< borrowed */
spconv_tensor *spconv_sparse_indices(const spconv_sparse_tensor *sp);  /**< borrowed */
void spconv_sparse_spatial_shape(const spconv_sparse_tensor *sp, int64_t shape[3]);
int64_t spconv_sparse_batch_size(const spconv_sparse_tensor *sp);
int64_t spconv_sparse_num_sites(const spconv_sparse_tensor *sp);

/**
 * The rulebook for a layer with @p params applied to @p in, through the cache:
 *  - SUBM: reuse the rulebook under @p indice_key if its geometry and sites match, else
 *    SPCONV_ERR_GEOMETRY_MISMATCH; build and store it when the key is new;
 *  - REGULAR / TRANSPOSED: build; store under the key (a key already holding a rulebook of
 *    another geometry or other input sites is SPCONV_ERR_GEOMETRY_MISMATCH; the same is reused);
 *  - INVERSE: the inverse of the REGULAR or TRANSPOSED rulebook stored under the key
 *    (SPCONV_ERR_NOT_FOUND when none); its outputs must be @p in's sites and its kernel must
 *    equal params->kernel.
 * @p indice_key NULL or "" means no caching (INVERSE then needs a key). *out has one reference.
 */
spconv_status spconv_sparse_get_rulebook(spconv_context *ctx, const spconv_sparse_tensor *in,
                                         const spconv_conv_params *params, const char *indice_key,
                                         spconv_rulebook **out);

/** A sparse tensor on the output sites of @p rb with @p features, sharing @p in's cache. */
spconv_status spconv_sparse_from_rulebook(const spconv_sparse_tensor *in, const spconv_rulebook *rb,
                                          spconv_tensor *features, spconv_sparse_tensor **out);

#ifdef __cplusplus
}
#endif
#endif /* SPCONV_SPARSE_H */
