/**
 * @file rulebook.h
 * @brief Rulebooks: for each kernel offset, which input row feeds which output row.
 *
 * Geometry (docs/design.md; cross-correlation like PyTorch conv3d, no kernel flip), per axis with
 * kernel K, stride s, padding p, dilation d:
 *  - regular conv / pooling: output o receives input i through offset k iff i + p - k*d = o*s,
 *    out = (in + 2p - d(K-1) - 1) / s + 1;
 *  - submanifold conv: output sites = input sites in the same order; stride 1, padding (K/2)*d
 *    (the params' stride and padding are ignored), odd K only;
 *  - transposed conv: o = i*s - p + k*d, out = (in-1)*s - 2p + d(K-1) + 1 + output_padding;
 *  - inverse conv: the rulebook of the regular (or transposed) conv it inverts with in and out
 *    swapped (spconv_rulebook_inverse); its outputs are that conv's input sites in their order.
 * Kernel offsets are numbered k = (kz*KH + ky)*KW + kx. Axes are (z, y, x) = (D, H, W).
 *
 * Output sites of a regular or transposed conv are sorted by (b, z, y, x). Pairs are grouped by
 * offset; within an offset each out_row appears at most once and the pairs of a built rulebook are
 * in increasing out_row order. So a rulebook is identical for every thread count, run and backend.
 */
#ifndef SPCONV_RULEBOOK_H
#define SPCONV_RULEBOOK_H

#include <stdint.h>

#include "spconv/context.h"
#include "spconv/status.h"
#include "spconv/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum spconv_conv_kind {
    SPCONV_CONV_REGULAR = 0,    /**< strided sparse conv; also the geometry of max pooling */
    SPCONV_CONV_SUBM = 1,       /**< submanifold: outputs = inputs */
    SPCONV_CONV_TRANSPOSED = 2, /**< transposed (deconvolution) */
    SPCONV_CONV_INVERSE = 3     /**< inverse of a stored regular conv / pool or transposed conv
                                     (by indice_key) */
} spconv_conv_kind;

/** Per-axis parameters, in (z, y, x) order. */
typedef struct spconv_conv_params {
    spconv_conv_kind kind;
    int64_t kernel[3];
    int64_t stride[3];
    int64_t padding[3];
    int64_t dilation[3];
    int64_t output_padding[3]; /**< transposed conv only; each < max(stride, dilation) */
} spconv_conv_params;

/** Kernel 3, stride 1, padding 0, dilation 1, output padding 0, on every axis. */
spconv_conv_params spconv_conv_params_default(spconv_conv_kind kind);

/** Check @p params (positive kernel/stride/dilation, non-negative padding, odd kernel for subm,
 *  output padding rules) and compute the output spatial shape from @p in_shape. An empty output
 *  (some axis <= 0) is SPCONV_ERR_INVALID_ARGUMENT naming the axis. Inverse: not computable from
 *  params alone, SPCONV_ERR_INVALID_ARGUMENT. */
spconv_status spconv_conv_output_shape(const spconv_conv_params *params, const int64_t in_shape[3],
                                       int64_t out_shape[3]);

/** Number of kernel offsets KD*KH*KW: 0 when @p params is NULL or a size is outside
 *  [1, INT32_MAX], INT64_MAX when the product would pass it (the geometry checks refuse any
 *  kernel of more than INT32_MAX offsets). */
int64_t spconv_conv_kernel_volume(const spconv_conv_params *params);

typedef struct spconv_rulebook spconv_rulebook;

/**
 * Build the rulebook of a regular, submanifold or transposed conv (or pooling, with the regular
 * geometry) over the active sites @p indices (int32 [N, 4] rows (b, z, y, x), any layout, on the
 * CPU or a CUDA device: the rulebook is built there, its pairs and sites stay there, its offset
 * lists are on the host, and it is the same rulebook on every device). Validates every row: outside spatial shape or batch size -> SPCONV_ERR_OUT_OF_RANGE, a repeated
 * row -> SPCONV_ERR_DUPLICATE_INDEX, each naming the first offending row. N = 0 is valid.
 * Uses spconv_context_num_threads(ctx) threads; the result does not depend on it.
 * The rulebook keeps a reference to @p indices. *out has one reference.
 */
spconv_status spconv_rulebook_build(spconv_context *ctx, const spconv_tensor *indices,
                                    const int64_t spatial_shape[3], int64_t batch_size,
                                    const spconv_conv_params *params, spconv_rulebook **out);

/**
 * spconv_rulebook_build over the input sites (@p output_side = 0) or the output sites (1) of
 * @p source, on that side's spatial shape and @p source's batch size: what the next layer of a
 * network asks for. Those rows were checked by @p source's build (input) or made in range and
 * unique by it (output), so the check for repeated rows is skipped (on the CPU; a regular or
 * transposed build saves 15-20% of its time); every other argument is checked as
 * spconv_rulebook_build checks it, and the rulebook is the one spconv_rulebook_build gives on
 * those rows. The caller must not have written into that side's indices since @p source was
 * built (a binding that hands them out as its own tensors keeps track, as the PyTorch package
 * does with versions); if it did anyway, a row outside the shape or the batch is still
 * SPCONV_ERR_OUT_OF_RANGE (the range costs one pass), and a repeated row repeats pairs.
 * The rulebook keeps a reference to the sites. *out has one reference.
 */
spconv_status spconv_rulebook_build_on(spconv_context *ctx, const spconv_rulebook *source,
                                       int output_side, const spconv_conv_params *params,
                                       spconv_rulebook **out);

/** The rulebook of the inverse conv of @p forward (a regular conv or pool rulebook, or a
 *  transposed conv's): pairs swapped, outputs = @p forward's input sites in their order. Its
 *  params are @p forward's with kind INVERSE (spconv_rulebook_forward_kind says which kind). */
spconv_status spconv_rulebook_inverse(const spconv_rulebook *forward, spconv_rulebook **out);
/** The kind whose geometry rule the pairs of @p rb follow: for an INVERSE rulebook the kind of
 *  the rulebook it inverts (REGULAR or TRANSPOSED; its pairs follow that rule with the sides
 *  swapped), else its own kind. */
spconv_conv_kind spconv_rulebook_forward_kind(const spconv_rulebook *rb);

void spconv_rulebook_retain(spconv_rulebook *rb);
void spconv_rulebook_release(spconv_rulebook *rb);

/* ---- what a rulebook holds (the rulebook must not be NULL) ------------------------------ */

const spconv_conv_params *spconv_rulebook_params(const spconv_rulebook *rb);
int64_t spconv_rulebook_kernel_volume(const spconv_rulebook *rb);
int64_t spconv_rulebook_num_in(const spconv_rulebook *rb);
int64_t spconv_rulebook_num_out(const spconv_rulebook *rb);
int64_t spconv_rulebook_batch_size(const spconv_rulebook *rb);
void spconv_rulebook_in_shape(const spconv_rulebook *rb, int64_t shape[3]);
void spconv_rulebook_out_shape(const spconv_rulebook *rb, int64_t shape[3]);
/*
 * Pairs are grouped by kernel offset, and only the offsets that have pairs are listed: a 255^3
 * kernel on a handful of sites has 16.6 M offsets but only the few that pair two sites cost
 * memory. Active offset j is kernel offset active_offsets[j] (increasing in j), and its pairs are
 * [active_starts[j], active_starts[j + 1]) of pairs_in / pairs_out. Every offset not listed has
 * no pairs.
 */
/** Number of kernel offsets that have at least one pair (<= kernel volume, <= pairs). */
int64_t spconv_rulebook_num_active_offsets(const spconv_rulebook *rb);
/** Host int64 [num_active]: the kernel offsets that have pairs, increasing. */
const int64_t *spconv_rulebook_active_offsets(const spconv_rulebook *rb);
/** Host int64 [num_active + 1] prefix sums: the pairs of active offset j are
 *  [starts[j], starts[j + 1]); starts[0] = 0 and starts[num_active] = the number of pairs. */
const int64_t *spconv_rulebook_active_starts(const spconv_rulebook *rb);
/** The pairs [*begin, *end) of kernel offset @p k (0 <= k < kernel volume; empty for an offset
 *  without pairs or out of range). A binary search over the active offsets. */
void spconv_rulebook_offset_range(const spconv_rulebook *rb, int64_t k, int64_t *begin,
                                  int64_t *end);
/** Total number of pairs. */
int64_t spconv_rulebook_num_pairs(const spconv_rulebook *rb);
/** Borrowed int32 [num_pairs] tensors of input rows and output rows, grouped by offset. Read
 *  only: the executors rely on what the build recorded about them (their rows in range, their
 *  order within each offset, the centre offset of a subm rulebook), so writing into them is
 *  undefined behaviour. */
spconv_tensor *spconv_rulebook_pairs_in(const spconv_rulebook *rb);
spconv_tensor *spconv_rulebook_pairs_out(const spconv_rulebook *rb);
/** Borrowed int32 [num_in, 4] / [num_out, 4] coordinates. */
spconv_tensor *spconv_rulebook_in_indices(const spconv_rulebook *rb);
spconv_tensor *spconv_rulebook_out_indices(const spconv_rulebook *rb);

#ifdef __cplusplus
}
#endif
#endif /* SPCONV_RULEBOOK_H */
