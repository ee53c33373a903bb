/* The fields of a rulebook: private to the library (rulebook builders and conv executors). */
#ifndef SPCONV_RULEBOOK_IMPL_H
#define SPCONV_RULEBOOK_IMPL_H

#include <stdint.h>

#include "spconv/rulebook.h"

struct spconv_rulebook {
    int64_t refcount;             /* atomic, as tensors */
    spconv_conv_params params;    /* kind INVERSE for an inverse rulebook; the rest as given */
    spconv_conv_kind inverts;     /* INVERSE: the kind of the rulebook it inverts (REGULAR or
                                     TRANSPOSED), whose geometry params holds */
    int64_t in_shape[3];          /* spatial shape (D, H, W) of the input */
    int64_t out_shape[3];
    int64_t batch_size;
    int64_t kernel_volume;        /* KD*KH*KW */
    int64_t num_in, num_out;      /* rows of in_indices / out_indices, each <= INT32_MAX */
    int64_t num_pairs;
    int64_t num_active;           /* kernel offsets with at least one pair */
    int64_t *active_offsets;      /* host [num_active]: those offsets, increasing */
    int64_t *active_starts;       /* host [num_active + 1]: prefix sums of their pair counts */
    spconv_tensor *pairs_in;      /* int32 [num_pairs] input rows, grouped by offset */
    spconv_tensor *pairs_out;     /* int32 [num_pairs] output rows */
    spconv_tensor *in_indices;    /* int32 [num_in, 4], retained */
    spconv_tensor *out_indices;   /* int32 [num_out, 4]; the same tensor as in_indices for subm */
    int center_is_identity;       /* 1 when offset kernel_volume/2 maps row r to row r for every
                                     row (subm): executors may use a plain GEMM there */
    int rows_order[2];            /* SPCONV__ORDER_* of the in rows [0] and the out rows [1]:
                                     whether they increase within every offset. Recorded at build
                                     or learnt on first use (atomically: a cache in a rulebook
                                     that is otherwise immutable, as its pair lists are) */
};

/* What rows_order holds: not yet known, increasing within every offset, or not. */
enum { SPCONV__ORDER_UNKNOWN = 0, SPCONV__ORDER_SORTED = 1, SPCONV__ORDER_UNSORTED = 2 };
enum { SPCONV__SIDE_IN = 0, SPCONV__SIDE_OUT = 1 };

#endif /* SPCONV_RULEBOOK_IMPL_H */
