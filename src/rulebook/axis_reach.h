/* Which offsets of one kernel axis take an input coordinate to an output, worked out by
 * arithmetic rather than by trying every offset: the regular and transposed builders of the CPU
 * (build_strided.c) and of the CUDA backend (cuda/rulebook.cu) both walk exactly these, so their
 * work follows the candidates, not the kernel (a 2 x 10^9 kernel padded to one output per row
 * once took a second per row, trying each offset). Must stay valid C11 and C++ (nvcc). */
#ifndef SPCONV_RULEBOOK_AXIS_REACH_H
#define SPCONV_RULEBOOK_AXIS_REACH_H

#include <stdint.h>

#include "tensor/convert.h" /* SPCONV_HD */

/* One axis of a regular or transposed conv (docs/design.md, "Geometry"). Every field is in
 * [0, 2^31) (the geometry checks), so the products below stay far inside int64. */
typedef struct spconv__axis_geometry {
    int64_t kernel, stride, padding, dilation, out_size;
    int transposed;
} spconv__axis_geometry;

/* x in [0, m) with a * x = 1 (mod m), for a and m >= 1 coprime (0 when m is 1): the extended
 * Euclidean algorithm. */
static inline SPCONV_HD int64_t spconv__inverse_mod(int64_t a, int64_t m) {
    int64_t r0 = m, r1 = a % m, t0 = 0, t1 = 1;
    while (r1 != 0) {
        const int64_t q = r0 / r1, r = r0 - q * r1, t = t0 - q * t1;
        r0 = r1, r1 = r;
        t0 = t1, t1 = t;
    }
    return t0 < 0 ? t0 + m : t0;
}

static inline SPCONV_HD int64_t spconv__gcd(int64_t a, int64_t b) {
    while (b != 0) {
        const int64_t r = a % b;
        a = b, b = r;
    }
    return a;
}

/* The offsets k through which coordinate @p c reaches an output on axis @p a: *first, then every
 * *step up to *last (all inclusive, increasing), or none (returns 0). The output of k is
 * spconv__axis_output. Regular: c + padding - k * dilation = o * stride with 0 <= o < out_size,
 * so k lies in a window and in one residue class modulo stride / gcd(stride, dilation).
 * Transposed: o = c * stride - padding + k * dilation with 0 <= o < out_size, a window. */
static inline SPCONV_HD int spconv__axis_reach(const spconv__axis_geometry *a, int64_t c,
                                               int64_t *first, int64_t *last, int64_t *step) {
    const int64_t d = a->dilation, s = a->stride;
    int64_t lo, hi;
    *step = 1;
    if (a->transposed) {
        const int64_t base = c * s - a->padding; /* the output of k = 0 */
        const int64_t top = a->out_size - 1 - base;
        if (top < 0) return 0;
        lo = base >= 0 ? 0 : (-base + d - 1) / d;
        hi = top / d;
    } else {
        const int64_t t = c + a->padding;       /* the span c + padding - k * dilation at k = 0 */
        const int64_t below = t - a->out_size * s; /* spans must be above it (o < out_size) */
        const int64_t g = spconv__gcd(d, s);
        if (t % g != 0) return 0; /* no k makes the span a multiple of the stride */
        const int64_t m = s / g;  /* k * (d / g) = t / g (mod m) */
        const int64_t residue = (t / g) % m * spconv__inverse_mod(d / g % m, m) % m;
        lo = below < 0 ? 0 : below / d + 1;
        hi = t / d; /* span >= 0 */
        lo += ((residue - lo % m) % m + m) % m;
        *step = m;
    }
    if (hi > a->kernel - 1) hi = a->kernel - 1;
    if (lo > hi) return 0;
    *first = lo;
    *last = hi;
    return 1;
}

/* The output that coordinate @p c reaches through offset @p k, one of spconv__axis_reach's. */
static inline SPCONV_HD int64_t spconv__axis_output(const spconv__axis_geometry *a, int64_t c,
                                                    int64_t k) {
    return a->transposed ? c * a->stride - a->padding + k * a->dilation
                         : (c + a->padding - k * a->dilation) / a->stride;
}

#endif /* SPCONV_RULEBOOK_AXIS_REACH_H */
