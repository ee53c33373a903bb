/* Submanifold pairs of large kernels through bins, shared by the CPU builder (build_subm.c) and
 * the CUDA one (cuda/rulebook.cu) so that both test the same candidates. Must stay valid C11 and
 * C++ (nvcc).
 *
 * A site pairs only with sites of its batch whose displacement, on every axis, is a multiple of
 * the dilation d within the kernel's reach R = K/2 steps (site_pairs.h). On an axis, a coordinate c
 * is its residue c mod d and its step u = c / d; cut the steps into runs of R + 1 and number the
 * bin of c as residue + d * (u / (R + 1)). Two sites of one bin then differ by a multiple of d of
 * at most R steps on every axis, so they pair, both ways; and a site's partners lie in the at most
 * three bins per axis (27 in all) that its reach [u - R, u + R] meets.
 *
 * So the work is bounded by the pairs, whatever the kernel: with the sites sorted by bin, a site
 * tests the sites of its neighbouring bins, and bins A and B that neighbour each other cost
 * |A| |B| <= (|A|^2 + |B|^2) / 2 tests, while A alone holds |A|^2 pairs. Testing every pair of sites
 * (N^2) or probing every offset (N x KV / 2) can both cost far more than the pairs: 20,001 sites on
 * separate lines under a 1x1x40,001 kernel have one pair each.
 *
 * A bin number never exceeds the coordinate (residue + d * (u / (R + 1)) <= residue + d * u = c),
 * so bin keys pack with the sites' own key layout, in (b, z, y, x) order. */
#ifndef SPCONV_RULEBOOK_SITE_BINS_H
#define SPCONV_RULEBOOK_SITE_BINS_H

#include <stdint.h>

#include "rulebook/hash.h"
#include "rulebook/site_pairs.h"
#include "tensor/convert.h" /* SPCONV_HD */

/* Kernels probing more offsets than this go through bins. Between 5^3 (62 probes) and 7^3 (171):
 * on the 125,562 sites of spconv's test scan, at 2 CPU threads, bins took 141 ms against 66-94
 * for probing at 5^3, and 200 ms against 226-301 at 7^3 (docs/benchmarks.md). */
#ifndef SPCONV_SUBM_BINS_ABOVE_PROBES /* a build may set it, to time either side of it */
#define SPCONV_SUBM_BINS_ABOVE_PROBES 127
#endif

/* Whether a submanifold build of @p num_sites sites and @p kernel_volume offsets goes through bins
 * rather than probing KV / 2 offsets per site: no more sites than probes, or probes that could
 * far outnumber the pairs. Both backends take this rule. */
static inline SPCONV_HD int spconv__subm_by_bins(int64_t num_sites, int64_t kernel_volume) {
    const int64_t probes = kernel_volume / 2;
    return num_sites <= probes || probes > SPCONV_SUBM_BINS_ABOVE_PROBES;
}

typedef struct spconv__bin_geometry {
    int64_t kernel[3], dilation[3], shape[3]; /* (z, y, x); kernel odd */
    spconv__key_layout layout;                /* the sites' */
} spconv__bin_geometry;

/* Bin number, on @p axis, of coordinate @p c (inside the shape). */
static inline SPCONV_HD int64_t spconv__bin_on_axis(const spconv__bin_geometry *g, int axis,
                                                    int64_t c) {
    const int64_t d = g->dilation[axis], side = g->kernel[axis] / 2 + 1;
    return c % d + d * (c / d / side);
}

/* Sort key of the bin of @p row (b, z, y, x), which lies inside the batch and the shape. */
static inline SPCONV_HD uint64_t spconv__bin_key(const spconv__bin_geometry *g,
                                                 const int32_t row[4]) {
    return spconv__key_pack(&g->layout, row[0], spconv__bin_on_axis(g, 0, row[1]),
                            spconv__bin_on_axis(g, 1, row[2]), spconv__bin_on_axis(g, 2, row[3]));
}

/* A walk over the candidates of one site: the sites of the bins its reach meets. */
typedef struct spconv__bin_walk {
    const int32_t *row;         /* the site's (b, z, y, x) */
    int64_t first[3], count[3]; /* per axis: the first neighbouring bin, how many (1 to 3) */
    int64_t bin, bins;          /* the next bin to open, of count[0] * count[1] * count[2] */
    int64_t at, end;            /* the open bin's sites, positions in the sorted arrays */
    int64_t tested;             /* candidates tested so far (tests/test_rulebook.c bounds them) */
} spconv__bin_walk;

static inline SPCONV_HD void spconv__bin_walk_start(const spconv__bin_geometry *g,
                                                    const int32_t row[4], spconv__bin_walk *w) {
    w->row = row;
    w->bins = 1;
    for (int axis = 0; axis < 3; ++axis) {
        const int64_t d = g->dilation[axis], side = g->kernel[axis] / 2 + 1;
        const int64_t reach = g->kernel[axis] / 2, c = row[1 + axis];
        const int64_t residue = c % d, u = c / d, last_step = (g->shape[axis] - 1 - residue) / d;
        const int64_t low = u - reach < 0 ? 0 : u - reach;
        /* reach < last_step - u, not u + reach > last_step: u + reach may pass INT64_MAX. */
        const int64_t high = reach < last_step - u ? u + reach : last_step;
        w->first[axis] = low / side;
        w->count[axis] = high / side - low / side + 1;
        w->bins *= w->count[axis];
    }
    w->bin = 0;
    w->at = w->end = 0;
    w->tested = 0;
}

/* First position in the @p n sorted @p keys whose key is at least @p key. */
static inline SPCONV_HD int64_t spconv__bin_lower_bound(const uint64_t *keys, int64_t n,
                                                        uint64_t key) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (keys[mid] < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The next pair of the walk: 1 with *offset (the kernel offset) and *input (the partner's row),
 * or 0 when the walk is over. @p keys are the @p n sites' bin keys in increasing order and
 * @p bin_rows their rows in that order; @p rows are the sites, [n, 4]. */
static inline SPCONV_HD int spconv__bin_walk_next(const spconv__bin_geometry *g,
                                                  const uint64_t *keys, const int32_t *bin_rows,
                                                  const int32_t *rows, int64_t n,
                                                  spconv__bin_walk *w, int64_t *offset,
                                                  int32_t *input) {
    for (;;) {
        while (w->at < w->end) {
            const int32_t i = bin_rows[w->at++];
            ++w->tested;
            const int64_t k =
                spconv__site_pair_offset(g->kernel, g->dilation, w->row, rows + 4 * (int64_t)i);
            if (k >= 0) {
                *offset = k;
                *input = i;
                return 1;
            }
        }
        if (w->bin == w->bins) return 0;
        const int64_t bin = w->bin++;
        const int64_t qx = bin % w->count[2], qy = bin / w->count[2] % w->count[1],
                      qz = bin / (w->count[2] * w->count[1]);
        const int64_t q[3] = {qz, qy, qx};
        int64_t id[3];
        for (int axis = 0; axis < 3; ++axis) {
            const int64_t d = g->dilation[axis];
            id[axis] = w->row[1 + axis] % d + d * (w->first[axis] + q[axis]);
        }
        const uint64_t key = spconv__key_pack(&g->layout, w->row[0], id[0], id[1], id[2]);
        w->at = spconv__bin_lower_bound(keys, n, key);
        w->end = w->at;
        while (w->end < n && keys[w->end] == key) ++w->end;
    }
}

#endif /* SPCONV_RULEBOOK_SITE_BINS_H */
