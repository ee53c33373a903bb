/* The fields of a sparse tensor: private to the rulebook module's sparse*.c files. */
#ifndef SPCONV_RULEBOOK_SPARSE_IMPL_H
#define SPCONV_RULEBOOK_SPARSE_IMPL_H

#include <stdint.h>

#include "rulebook/rulebook_cache.h"
#include "spconv/sparse.h"

struct spconv_sparse_tensor {
    int64_t refcount;              /* atomic, with the orderings of tensors */
    spconv_tensor *features;       /* [N, C] floating, retained */
    spconv_tensor *indices;        /* int32 [N, 4] on the features' device, retained */
    int64_t spatial_shape[3];      /* each in [1, INT32_MAX] */
    int64_t batch_size;            /* in [1, 2^31] */
    spconv__rulebook_cache *cache; /* shared with every tensor derived from this one; retained */
};

/* A sparse tensor over the given parts, all retained; only checks that features match the
 * indices (callers have checked the rest). */
spconv_status spconv__sparse_make(const char *func, spconv_tensor *features, spconv_tensor *indices,
                                  const int64_t spatial_shape[3], int64_t batch_size,
                                  spconv__rulebook_cache *cache, spconv_sparse_tensor **out);

#endif /* SPCONV_RULEBOOK_SPARSE_IMPL_H */
