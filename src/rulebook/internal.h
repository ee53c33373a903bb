/* Shared by the files of the rulebook module (builders, reference, cache, sparse tensors). */
#ifndef SPCONV_RULEBOOK_INTERNAL_H
#define SPCONV_RULEBOOK_INTERNAL_H

#include <stdint.h>

#include "rulebook/rulebook_impl.h"
#include "spconv/rulebook.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Axis letters for messages, indexed like params and shapes (z, y, x). */
#define SPCONV__AXIS_NAME(axis) ((axis) == 0 ? 'z' : (axis) == 1 ? 'y' : 'x')

/* Check params for @p kind-specific rules and compute the output spatial shape (the messages
 * name @p func). For SUBM the output shape is the input shape. */
spconv_status spconv__conv_geometry(const char *func, const spconv_conv_params *params,
                                    const int64_t in_shape[3], int64_t out_shape[3]);

/* Check a batch size for int32 batch indices. */
spconv_status spconv__check_batch_size(const char *func, int64_t batch_size);

/* Check that @p indices is an int32 [N, 4] tensor with N <= INT32_MAX (on any device). */
spconv_status spconv__check_indices(const char *func, const spconv_tensor *indices);

/* Check that @p indices is an int32 [N, 4] tensor on a device of @p device_type with
 * N <= INT32_MAX and return it contiguous (one new reference, possibly @p indices itself). */
spconv_status spconv__indices_contiguous(spconv_context *ctx, const char *func,
                                         const spconv_tensor *indices,
                                         spconv_device_type device_type, spconv_tensor **out);

/* A rulebook with one reference, the given geometry, no pairs, no active offsets and no tensors
 * yet. */
spconv_status spconv__rulebook_alloc(const char *func, const spconv_conv_params *params,
                                     const int64_t in_shape[3], const int64_t out_shape[3],
                                     int64_t batch_size, spconv_rulebook **out);

/* spconv_rulebook_build, where @p rows_valid = 1 says that the caller knows the rows of
 * @p indices to be in range and unique for (spatial_shape, batch_size): on the CPU the strided
 * builders then skip their checks (a subm build checks while it indexes, at no extra cost).
 * Every argument is checked as spconv_rulebook_build checks it; the rulebook is the same. */
spconv_status spconv__rulebook_build_sites(spconv_context *ctx, const spconv_tensor *indices,
                                           const int64_t spatial_shape[3], int64_t batch_size,
                                           const spconv_conv_params *params, int rows_valid,
                                           spconv_rulebook **out);

/* Set rb's active offsets from the prefix sums @p starts [num_slots + 1] of @p num_slots pair
 * groups: group j holds the pairs of kernel offset slot_offsets[j] (increasing in j), or of
 * offset j when @p slot_offsets is NULL. Empty groups are left out; rb->num_pairs becomes
 * starts[num_slots]. */
spconv_status spconv__rulebook_set_offsets(const char *func, spconv_rulebook *rb,
                                           int64_t num_slots, const int64_t *slot_offsets,
                                           const int64_t *starts);

/* Allocate rb->pairs_in and rb->pairs_out as int32 [rb->num_pairs]. */
spconv_status spconv__rulebook_alloc_pairs(spconv_rulebook *rb);

/* The per-axis offset k of a kernel offset index, k = (kz * KH + ky) * KW + kx. */
static inline void spconv__kernel_offset_split(const int64_t kernel[3], int64_t k, int64_t out[3]) {
    out[2] = k % kernel[2];
    out[1] = (k / kernel[2]) % kernel[1];
    out[0] = k / (kernel[2] * kernel[1]);
}

/* Bounds of chunk @p chunk of @p num_chunks nearly equal chunks of [0, n). */
static inline void spconv__chunk_bounds(int64_t n, int64_t num_chunks, int64_t chunk,
                                        int64_t *begin, int64_t *end) {
    const int64_t base = n / num_chunks, extra = n % num_chunks;
    *begin = chunk * base + (chunk < extra ? chunk : extra);
    *end = *begin + base + (chunk < extra ? 1 : 0);
}

#ifdef __cplusplus
}
#endif
#endif /* SPCONV_RULEBOOK_INTERNAL_H */
