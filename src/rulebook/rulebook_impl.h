/* The fields of a rulebook: private to the library (rulebook builders and conv executors). */
#ifndef SPCONV_RULEBOOK_IMPL_H
#define SPCONV_RULEBOOK_IMPL_H

#include <stdint.h>

#include "spconv/rulebook.h"

struct spconv_rulebook {
    int64_t refcount;             /* atomic, as tensors */
    spconv_conv_params params;    /* kind INVERSE for an inverse rulebook; the rest as given */
    int64_t in_shape[3];          /* spatial shape (D, H, W) of the input */
    int64_t out_shape[3];
    int64_t batch_size;
    int64_t kernel_volume;        /* KD*KH*KW */
    int64_t num_in, num_out;      /* rows of in_indices / out_indices, each <= INT32_MAX */
    int64_t *offsets;             /* host, kernel_volume + 1 prefix sums of the pair counts */
    spconv_tensor *pairs_in;      /* int32 [offsets[kernel_volume]] input rows, grouped by offset */
    spconv_tensor *pairs_out;     /* int32 [offsets[kernel_volume]] output rows */
    spconv_tensor *in_indices;    /* int32 [num_in, 4], retained */
    spconv_tensor *out_indices;   /* int32 [num_out, 4]; the same tensor as in_indices for subm */
    int center_is_identity;       /* 1 when offset kernel_volume/2 maps row r to row r for every
                                     row (subm): executors may use a plain GEMM there */
};

#endif /* SPCONV_RULEBOOK_IMPL_H */
