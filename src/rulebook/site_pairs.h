/* Submanifold rulebooks of large kernels, or of few sites, test candidate pairs of sites (those of
 * neighbouring bins, site_bins.h) instead of probing the table: this is the test, shared by the
 * CPU builder (build_subm.c) and the CUDA one (cuda/rulebook.cu) so that both take the same
 * offsets. Must stay valid C11 and C++ (nvcc). */
#ifndef SPCONV_RULEBOOK_SITE_PAIRS_H
#define SPCONV_RULEBOOK_SITE_PAIRS_H

#include <stdint.h>

#include "tensor/convert.h" /* SPCONV_HD */

/* The offset through which input site @p in (b, z, y, x) reaches output site @p out in a
 * submanifold conv of odd @p kernel and @p dilation per axis (z, y, x), or -1: same batch, and on
 * every axis a displacement that is a multiple of the dilation within half the kernel. Any int32
 * coordinates are safe (64-bit differences), so a builder may test rows it has not validated. */
static inline SPCONV_HD int64_t spconv__site_pair_offset(const int64_t kernel[3],
                                                         const int64_t dilation[3],
                                                         const int32_t *out, const int32_t *in) {
    if (in[0] != out[0]) return -1;
    int64_t k = 0;
    for (int axis = 0; axis < 3; ++axis) {
        const int64_t d = (int64_t)in[1 + axis] - out[1 + axis];
        if (d % dilation[axis] != 0) return -1;
        const int64_t q = d / dilation[axis] + kernel[axis] / 2;
        if (q < 0 || q >= kernel[axis]) return -1;
        k = k * kernel[axis] + q;
    }
    return k;
}

#endif /* SPCONV_RULEBOOK_SITE_PAIRS_H */
