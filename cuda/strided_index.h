/* Index arithmetic of the CUDA element-wise kernels (strided copy, fill): which storage elements
 * a linear element number touches, and how many blocks a grid-stride loop launches. Plain C with
 * SPCONV_HD, so that tests/test_cuda_logic.c runs on the CPU exactly what the kernels run on the
 * GPU, and CI without a GPU still checks it. */
#ifndef SPCONV_CUDA_STRIDED_INDEX_H
#define SPCONV_CUDA_STRIDED_INDEX_H

#include <stdint.h>

#include "spconv/tensor.h"
#include "tensor/convert.h" /* SPCONV_HD */

/* Kernels walk the dims with compile-time indices, so the layout stays in registers and the
 * kernel parameter space instead of being copied to per-thread local memory. */
#ifdef __CUDA_ARCH__
#define SPCONV_UNROLL _Pragma("unroll")
#else
#define SPCONV_UNROLL
#endif

/* Two tensors of one shape, a destination and a source, walked together; passed to kernels by
 * value. Dims are stored innermost first: dim 0 varies fastest as the linear element number
 * (row-major over the shape) goes up. Offsets and strides count elements. */
typedef struct spconv__strided_pair {
    int ndim;                                /* 1 .. SPCONV_MAX_DIMS */
    int64_t sizes[SPCONV_MAX_DIMS];          /* >= 1 */
    int64_t strides[2][SPCONV_MAX_DIMS];     /* [0]: destination, [1]: source */
} spconv__strided_pair;

/* Fill `pair` from row-major sizes and strides of @p ndim dims (0 .. SPCONV_MAX_DIMS), for a
 * non-empty shape. Dims of size 1 are dropped and neighbours that both tensors step through
 * evenly (outer stride = inner stride * inner size) are merged, so contiguous tensors become a
 * single dim and each element costs fewer 64-bit divisions. @p src_strides may be NULL (fill):
 * it then counts as all zero and never prevents a merge. */
static inline void spconv__strided_pair_init(spconv__strided_pair *pair, int ndim,
                                             const int64_t *sizes, const int64_t *dst_strides,
                                             const int64_t *src_strides) {
    int n = 0;
    for (int d = ndim - 1; d >= 0; --d) {
        if (sizes[d] == 1) continue;
        int64_t dst_stride = dst_strides[d];
        int64_t src_stride = src_strides != NULL ? src_strides[d] : 0;
        if (n > 0 && dst_stride == pair->strides[0][n - 1] * pair->sizes[n - 1] &&
            src_stride == pair->strides[1][n - 1] * pair->sizes[n - 1]) {
            pair->sizes[n - 1] *= sizes[d];
            continue;
        }
        pair->sizes[n] = sizes[d];
        pair->strides[0][n] = dst_stride;
        pair->strides[1][n] = src_stride;
        ++n;
    }
    if (n == 0) { /* a single element */
        pair->sizes[0] = 1;
        pair->strides[0][0] = pair->strides[1][0] = 0;
        n = 1;
    }
    for (int d = n; d < SPCONV_MAX_DIMS; ++d) {
        pair->sizes[d] = 1;
        pair->strides[0][d] = pair->strides[1][d] = 0;
    }
    pair->ndim = n;
}

/* Storage offsets (relative to each tensor's first element) of element number @p linear, in
 * [0, product of sizes). The outermost dim takes the quotient left over, so it needs no
 * division, and a single-dim pair costs none at all. */
static inline SPCONV_HD void spconv__strided_pair_offsets(const spconv__strided_pair *pair,
                                                          int64_t linear, int64_t *dst_offset,
                                                          int64_t *src_offset) {
    int64_t dst = 0, src = 0;
    SPCONV_UNROLL
    for (int d = 0; d < SPCONV_MAX_DIMS; ++d) {
        if (d == pair->ndim - 1) {
            dst += linear * pair->strides[0][d];
            src += linear * pair->strides[1][d];
            break;
        }
        int64_t outer = linear / pair->sizes[d];
        int64_t index = linear - outer * pair->sizes[d];
        dst += index * pair->strides[0][d];
        src += index * pair->strides[1][d];
        linear = outer;
    }
    *dst_offset = dst;
    *src_offset = src;
}

/* Blocks for a grid-stride loop over @p n elements with @p threads_per_block threads: enough to
 * give every element a thread, but no more than @p max_blocks (what the GPU keeps resident at
 * once); extra elements are taken by the loop. At least 1 block; @p n > 0. */
static inline int spconv__grid_blocks(int64_t n, int threads_per_block, int max_blocks) {
    int64_t wanted = (n + threads_per_block - 1) / threads_per_block;
    if (max_blocks < 1) max_blocks = 1;
    return wanted < max_blocks ? (int)wanted : max_blocks;
}

#endif /* SPCONV_CUDA_STRIDED_INDEX_H */
