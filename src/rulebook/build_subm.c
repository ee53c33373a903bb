/* Submanifold rulebooks. Outputs are the input sites. Three builds give the same rulebook: the
 * line walk (build_by_lines, below; kernels of up to LINES_MAX_OFFSETS + 1 offsets on grids whose
 * lines (b, z, y) are few next to the sites, spconv__site_lines_fit), bins (large kernels and
 * tiny inputs, at the end of this comment), and the hash table, which the rest of this comment
 * describes and every other build uses.
 *
 * The table: neighbour columns nbr[k][o] (input row
 * reaching output o through offset k, or -1) are filled by probing the hash table, then compacted
 * column by column in increasing o, so the result does not depend on the thread count.
 *
 * Symmetry halves the probes: the offsets of an odd kernel pair up as k and KV-1-k with opposite
 * displacements, so "input i reaches o through k" is "input o reaches i through KV-1-k". Only
 * k < KV/2 is probed and each hit fills both columns; the two offsets therefore have equal pair
 * counts. The centre offset maps every row to itself and needs no column.
 *
 * Memory follows the pairs, not the kernel: a column per offset for every site would be
 * KV x N cells (1.7 GB for a 15^3 kernel on 125k sites, 0.3 GB for 255^3 on 5 sites, plus
 * per-chunk counters of KV entries each). Instead the probed offsets go in groups whose columns
 * fit a budget of max(SUBM_MIN_CELLS, SUBM_CELLS_PER_SITE x N) cells, reused from group to group.
 * When one group covers the kernel (3x3x3 on any input) the columns compact straight into the
 * rulebook; otherwise each group compacts into blocks of exactly its pairs, which are copied into
 * place once every count is known (twice the pairs at the peak, and no second probing pass).
 *
 * Large kernels (more than SPCONV_SUBM_BINS_ABOVE_PROBES probes), and builds with no more sites
 * than probes (a 255^3 kernel on a handful of sites), go through bins instead (site_bins.h): the
 * sites sorted by bin, each testing those of its at most 27 neighbouring bins, work bounded by the
 * pairs rather than N x KV/2 lookups; the hits are then counted and placed per (chunk, offset)
 * or, for kernels of more than 2^16 offsets, radix-sorted by offset: the same rulebook. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/parallel.h"
#include "rulebook/build.h"
#include "rulebook/radix_sort.h"
#include "rulebook/site_bins.h"
#include "rulebook/site_lines.h"
#include "spconv/tensor.h"

/* More chunks than threads, taken dynamically, evens out regions of different density. */
#define CHUNKS_PER_THREAD 8
/* Column cells of one group: 64 per site keeps 3x3x3 (26 columns) in one group, so the common
 * case is the single-pass build; 2^19 cells (2 MiB) lets few sites take many offsets at once. */
#define SUBM_CELLS_PER_SITE 64
#define SUBM_MIN_CELLS (INT64_C(1) << 19)

typedef struct subm_plan {
    const spconv__build_input *in;
    const int64_t *shape;
    int64_t num_chunks;     /* min(threads * CHUNKS_PER_THREAD, N): more would be empty */
    int64_t group_size;     /* G: probed offsets per group */
    int64_t begin, end;     /* offsets of the current group, [begin, end) below the centre */
    int64_t *displacements; /* [G][3]: (z, y, x) step of each offset of the group */
    int32_t *nbr;           /* [2G][N]: column j for offset begin + j, G + j for its mirror */
    int64_t *counts;        /* [num_chunks][G]: hits of each offset of the group per chunk */
    int64_t *group_counts;  /* [G]: pairs of each offset of the group (and of its mirror) */
    int64_t *starts;        /* [2G]: where each column's pairs go in the group's destination */
    int64_t *offsets;       /* [KV + 1]: pair counts, then prefix sums; KV < 2N on this path */
} subm_plan;

/* One group's pairs: the lower offsets' then (separately) the mirrors', each in offset order. */
typedef struct pair_block {
    int32_t *lower_in, *lower_out, *upper_in, *upper_out;
    int64_t count; /* pairs of each half */
} pair_block;

static spconv_status plan_alloc(const char *func, int num_threads, const spconv_rulebook *rb,
                                subm_plan *plan) {
    const int64_t n = rb->num_in, half = rb->kernel_volume / 2;
    const int64_t budget =
        n <= SUBM_MIN_CELLS / SUBM_CELLS_PER_SITE ? SUBM_MIN_CELLS : SUBM_CELLS_PER_SITE * n;
    int64_t group = budget / (2 * n);
    if (group < 1) group = 1;
    if (group > half) group = half;
    plan->group_size = group;
    plan->num_chunks = (int64_t)num_threads * CHUNKS_PER_THREAD;
    if (plan->num_chunks > n) plan->num_chunks = n;
    /* 2G x N cells fit the budget or are one pair of columns (2N), and N <= INT32_MAX. */
    plan->nbr = malloc((size_t)(2 * group) * (size_t)n * sizeof *plan->nbr);
    plan->displacements = malloc((size_t)group * 3 * sizeof *plan->displacements);
    plan->counts = malloc((size_t)(plan->num_chunks * group) * sizeof *plan->counts);
    plan->group_counts = malloc((size_t)group * sizeof *plan->group_counts);
    plan->starts = malloc((size_t)(2 * group) * sizeof *plan->starts);
    plan->offsets = calloc((size_t)rb->kernel_volume + 1, sizeof *plan->offsets);
    SPCONV_RETURN_ERROR_IF(plan->nbr == NULL || plan->displacements == NULL ||
                               plan->counts == NULL || plan->group_counts == NULL ||
                               plan->starts == NULL || plan->offsets == NULL,
                           SPCONV_ERR_OUT_OF_MEMORY,
                           "%s: out of host memory for neighbour columns of %" PRId64
                           " offsets x %" PRId64 " sites",
                           func, 2 * group, n);
    return SPCONV_OK;
}

static void plan_free(subm_plan *plan) {
    free(plan->nbr);
    free(plan->displacements);
    free(plan->counts);
    free(plan->group_counts);
    free(plan->starts);
    free(plan->offsets);
}

/* Make offsets [begin, end) the current group: their displacements and empty columns. */
static void group_start(subm_plan *plan, const spconv_conv_params *params, int64_t begin,
                        int64_t end) {
    const int num_threads = plan->in->num_threads;
    (void)num_threads; /* only the OpenMP pragmas read it */
    const int64_t n = plan->in->num_in, group = plan->group_size, used = end - begin;
    plan->begin = begin;
    plan->end = end;
    for (int64_t j = 0; j < used; ++j) {
        int64_t split[3];
        spconv__kernel_offset_split(params->kernel, begin + j, split);
        for (int axis = 0; axis < 3; ++axis)
            plan->displacements[3 * j + axis] =
                (split[axis] - params->kernel[axis] / 2) * params->dilation[axis];
    }
    SPCONV_OMP(omp parallel for num_threads(num_threads) schedule(static))
    for (int64_t column = 0; column < 2 * group; ++column)
        if (column % group < used)
            memset(plan->nbr + column * n, 0xff, (size_t)n * sizeof *plan->nbr);
}

/* Start loading the slots that output o will probe. Issued one site ahead, their cache misses
 * overlap instead of each stalling the probe loop (a fifth less probe time on the real scan).
 * Coordinates outside the shape give meaningless keys, but still addresses inside the table. */
static void prefetch_probes(const subm_plan *plan, int64_t o) {
    const spconv__site_table *sites = plan->in->sites;
    const int32_t *row = plan->in->rows + 4 * o;
    for (int64_t j = 0; j < plan->end - plan->begin; ++j) {
        const int64_t *step = plan->displacements + 3 * j;
        const uint64_t key = spconv__key_pack(&sites->layout, row[0], row[1] + step[0],
                                              row[2] + step[1], row[3] + step[2]);
        __builtin_prefetch(&sites->hash.slots[spconv__hash_home(&sites->hash, key)]);
    }
}

/* Probe outputs [begin, end) at the group's offsets; counts[j] gets the hits of offset
 * plan->begin + j (and so of its mirror). */
static void probe_chunk(const subm_plan *plan, int64_t begin, int64_t end, int64_t *counts) {
    const spconv__site_table *sites = plan->in->sites;
    const int64_t n = plan->in->num_in, group = plan->group_size, used = plan->end - plan->begin;
    const int64_t *shape = plan->shape;
    for (int64_t j = 0; j < used; ++j) counts[j] = 0;
    for (int64_t o = begin; o < end; ++o) {
        if (o + 1 < end) prefetch_probes(plan, o + 1);
        const int32_t *row = plan->in->rows + 4 * o;
        for (int64_t j = 0; j < used; ++j) {
            const int64_t *step = plan->displacements + 3 * j;
            const int64_t z = row[1] + step[0], y = row[2] + step[1], x = row[3] + step[2];
            if (z < 0 || z >= shape[0] || y < 0 || y >= shape[1] || x < 0 || x >= shape[2])
                continue;
            const int32_t i =
                spconv__hash_find(&sites->hash, spconv__key_pack(&sites->layout, row[0], z, y, x));
            if (i < 0) continue;
            plan->nbr[j * n + o] = i;
            plan->nbr[(group + j) * n + i] = (int32_t)o;
            ++counts[j];
        }
    }
}

/* The @p count hits of @p column, in increasing output row, to pairs_in / pairs_out. */
static void compact_column(const int32_t *column, int64_t n, int64_t count, int32_t *pairs_in,
                           int32_t *pairs_out) {
    int64_t o = 0, written = 0;
    /* Hits follow no pattern, so every cell is stored and only a hit advances; that is 3x faster
     * than a branch. It stops one hit short, as the store past the last hit would land in the
     * next column's pairs, which another thread may be writing. */
    for (; o < n && written + 1 < count; ++o) {
        const int32_t i = column[o];
        pairs_in[written] = i;
        pairs_out[written] = (int32_t)o;
        written += i >= 0;
    }
    for (; o < n && written < count; ++o) {
        if (column[o] < 0) continue;
        pairs_in[written] = column[o];
        pairs_out[written] = (int32_t)o;
        ++written;
    }
}

/* Probe the current group, record its pair counts in plan->offsets[k + 1] (lower offsets only; a
 * mirror has its partner's count) and return the group's pairs per half. */
static int64_t probe_group(subm_plan *plan) {
    const int num_threads = plan->in->num_threads;
    (void)num_threads; /* only the OpenMP pragmas read it */
    const int64_t n = plan->in->num_in, group = plan->group_size, used = plan->end - plan->begin;
    SPCONV_OMP(omp parallel for num_threads(num_threads) schedule(dynamic, 1))
    for (int64_t c = 0; c < plan->num_chunks; ++c) {
        int64_t begin, end;
        spconv__chunk_bounds(n, plan->num_chunks, c, &begin, &end);
        probe_chunk(plan, begin, end, plan->counts + c * group);
    }
    int64_t total = 0;
    for (int64_t j = 0; j < used; ++j) {
        int64_t count = 0;
        for (int64_t c = 0; c < plan->num_chunks; ++c) count += plan->counts[c * group + j];
        plan->offsets[plan->begin + j + 1] = plan->group_counts[j] = count;
        total += count;
    }
    return total;
}

/* Compact the current group's columns: lower offsets to lower_* in offset order, mirrors to
 * upper_* in their offset order (the mirror of the group's last offset first). */
static void compact_group(subm_plan *plan, int32_t *lower_in, int32_t *lower_out,
                          int32_t *upper_in, int32_t *upper_out) {
    const int num_threads = plan->in->num_threads;
    (void)num_threads; /* only the OpenMP pragmas read it */
    const int64_t n = plan->in->num_in, group = plan->group_size, used = plan->end - plan->begin;
    const int64_t *counts = plan->group_counts;
    int64_t running = 0;
    for (int64_t j = 0; j < used; ++j) {
        plan->starts[j] = running;
        running += counts[j];
    }
    running = 0;
    for (int64_t j = used - 1; j >= 0; --j) {
        plan->starts[group + j] = running;
        running += counts[j];
    }
    SPCONV_OMP(omp parallel for num_threads(num_threads) schedule(dynamic, 1))
    for (int64_t column = 0; column < 2 * used; ++column) {
        const int upper = column >= used;
        const int64_t j = upper ? column - used : column;
        const int64_t start = plan->starts[upper ? group + j : j];
        compact_column(plan->nbr + (upper ? group + j : j) * n, n, counts[j],
                       (upper ? upper_in : lower_in) + start,
                       (upper ? upper_out : lower_out) + start);
    }
}

/* offsets[k + 1] holds the count of each lower offset k: make offsets the prefix sums of every
 * offset (mirrors copy their partner's count, the centre has one pair per site) and set rb's
 * active offsets from them. */
static spconv_status offsets_from_lower_counts(const char *func, spconv_rulebook *rb,
                                               int64_t *offsets) {
    const int64_t kv = rb->kernel_volume, half = kv / 2;
    int64_t running = 0;
    offsets[0] = 0;
    for (int64_t k = 0; k < half; ++k) {
        running += offsets[k + 1];
        offsets[k + 1] = running;
    }
    for (int64_t k = half; k < kv; ++k) {
        const int64_t count =
            k == half ? rb->num_in : offsets[kv - 1 - k + 1] - offsets[kv - 1 - k];
        running += count;
        offsets[k + 1] = running;
    }
    return spconv__rulebook_set_offsets(func, rb, kv, NULL, offsets);
}

/* The centre's pairs (r, r), from pair @p start on. */
static void fill_center(spconv_rulebook *rb, int64_t start) {
    const int64_t n = rb->num_in;
    int32_t *pairs_in = (int32_t *)spconv_tensor_data(rb->pairs_in) + start;
    int32_t *pairs_out = (int32_t *)spconv_tensor_data(rb->pairs_out) + start;
    for (int64_t o = 0; o < n; ++o) pairs_in[o] = pairs_out[o] = (int32_t)o;
}

/* The whole kernel in one group: compact straight into the rulebook. */
static spconv_status build_one_group(subm_plan *plan, spconv_rulebook *rb) {
    const int64_t half = rb->kernel_volume / 2;
    group_start(plan, &rb->params, 0, half);
    probe_group(plan);
    SPCONV_FORWARD_IF_ERROR(offsets_from_lower_counts(plan->in->func, rb, plan->offsets));
    SPCONV_FORWARD_IF_ERROR(spconv__rulebook_alloc_pairs(rb));
    int32_t *pairs_in = spconv_tensor_data(rb->pairs_in);
    int32_t *pairs_out = spconv_tensor_data(rb->pairs_out);
    const int64_t upper = plan->offsets[half + 1];
    compact_group(plan, pairs_in, pairs_out, pairs_in + upper, pairs_out + upper);
    fill_center(rb, plan->offsets[half]);
    return SPCONV_OK;
}

static void blocks_free(pair_block *blocks, int64_t num_blocks) {
    for (int64_t b = 0; b < num_blocks; ++b) free(blocks[b].lower_in);
    free(blocks);
}

/* Group by group into blocks of exactly their pairs, then everything into place. */
static spconv_status build_in_groups(subm_plan *plan, spconv_rulebook *rb) {
    const char *func = plan->in->func;
    const int64_t half = rb->kernel_volume / 2, group = plan->group_size;
    const int64_t num_blocks = (half + group - 1) / group;
    pair_block *blocks = calloc((size_t)num_blocks, sizeof *blocks);
    SPCONV_RETURN_ERROR_IF(blocks == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "%s: out of host memory for %" PRId64 " pair blocks", func, num_blocks);
    spconv_status st = SPCONV_OK;
    for (int64_t b = 0; b < num_blocks; ++b) {
        const int64_t begin = b * group, end = begin + group < half ? begin + group : half;
        group_start(plan, &rb->params, begin, end);
        pair_block *block = &blocks[b];
        block->count = probe_group(plan);
        if (block->count == 0) continue;
        block->lower_in = malloc((size_t)block->count * 4 * sizeof *block->lower_in);
        if (block->lower_in == NULL)
            SPCONV_FAIL_GOTO(st, done, SPCONV_ERR_OUT_OF_MEMORY,
                             "%s: out of host memory for %" PRId64 " pairs", func,
                             2 * block->count);
        block->lower_out = block->lower_in + block->count;
        block->upper_in = block->lower_out + block->count;
        block->upper_out = block->upper_in + block->count;
        compact_group(plan, block->lower_in, block->lower_out, block->upper_in,
                      block->upper_out);
    }
    SPCONV_TRY_GOTO(st, offsets_from_lower_counts(func, rb, plan->offsets), done);
    SPCONV_TRY_GOTO(st, spconv__rulebook_alloc_pairs(rb), done);
    int32_t *pairs_in = spconv_tensor_data(rb->pairs_in);
    int32_t *pairs_out = spconv_tensor_data(rb->pairs_out);
    const int64_t kv = rb->kernel_volume;
    for (int64_t b = 0; b < num_blocks; ++b) {
        const pair_block *block = &blocks[b];
        if (block->count == 0) continue;
        const int64_t end = (b + 1) * group < half ? (b + 1) * group : half;
        /* The block's mirrors start at the mirror of its last offset, kv - end. */
        const int64_t lower = plan->offsets[b * group], upper = plan->offsets[kv - end];
        const size_t bytes = (size_t)block->count * sizeof *pairs_in;
        memcpy(pairs_in + lower, block->lower_in, bytes);
        memcpy(pairs_out + lower, block->lower_out, bytes);
        memcpy(pairs_in + upper, block->upper_in, bytes);
        memcpy(pairs_out + upper, block->upper_out, bytes);
    }
    fill_center(rb, plan->offsets[half]);
done:
    blocks_free(blocks, num_blocks);
    return st;
}

/* ---- large kernels: the candidates of neighbouring bins ------------------------------------ */

/* The sites sorted by bin (rulebook/site_bins.h). */
typedef struct site_bins {
    spconv__bin_geometry geometry;
    const uint64_t *keys; /* [N] bin keys, increasing */
    int32_t *rows;        /* [N] the sites in that order */
} site_bins;

/* Kernels of at most this many offsets place their pairs straight into the rulebook, through a
 * counter per (chunk, offset); larger ones radix-sort the hits by offset instead, with no array
 * of the kernel's size. */
#define BINS_DENSE_OFFSETS (INT64_C(1) << 16)
/* Most (chunk, offset) counters of a dense placement (32 MiB): fewer chunks for wider kernels. */
#define BINS_MAX_COUNTERS (INT64_C(1) << 22)

/* Pairs of outputs [begin, end) per offset into counts[KV], or, when @p pairs_in is set, written
 * there and to @p pairs_out at @p counts (the chunk's cursor per offset, advanced): offset k's
 * pairs in increasing output row. */
static void bins_place_chunk(const spconv__build_input *in, const site_bins *bins, int64_t kv,
                             int64_t begin, int64_t end, int64_t *counts, int32_t *pairs_in,
                             int32_t *pairs_out) {
    if (pairs_in == NULL)
        for (int64_t k = 0; k < kv; ++k) counts[k] = 0;
    for (int64_t o = begin; o < end; ++o) {
        spconv__bin_walk walk;
        spconv__bin_walk_start(&bins->geometry, in->rows + 4 * o, &walk);
        int64_t k;
        int32_t i;
        while (spconv__bin_walk_next(&bins->geometry, bins->keys, bins->rows, in->rows,
                                     in->num_in, &walk, &k, &i)) {
            if (pairs_in == NULL) {
                ++counts[k];
            } else {
                const int64_t at = counts[k]++;
                pairs_in[at] = i;
                pairs_out[at] = (int32_t)o;
            }
        }
    }
}

/* Count, then place: memory is the rulebook's own and the counters, min(chunks, 2^22 / KV) x KV. */
static spconv_status bins_place(const spconv__build_input *in, const site_bins *bins,
                                spconv_rulebook *rb) {
    const int num_threads = in->num_threads;
    (void)num_threads; /* only the OpenMP pragmas read it */
    const int64_t n = rb->num_in, kv = rb->kernel_volume;
    int64_t num_chunks = (int64_t)num_threads * CHUNKS_PER_THREAD;
    if (num_chunks > BINS_MAX_COUNTERS / kv) num_chunks = BINS_MAX_COUNTERS / kv;
    if (num_chunks > n) num_chunks = n;
    int64_t *counts = malloc((size_t)(num_chunks * kv) * sizeof *counts);
    int64_t *offsets = malloc((size_t)(kv + 1) * sizeof *offsets);
    spconv_status st = SPCONV_OK;
    if (counts == NULL || offsets == NULL)
        SPCONV_FAIL_GOTO(st, done, SPCONV_ERR_OUT_OF_MEMORY,
                         "%s: out of host memory for %" PRId64 " pair counters", in->func,
                         num_chunks * kv);
    SPCONV_OMP(omp parallel for num_threads(num_threads) schedule(dynamic, 1))
    for (int64_t c = 0; c < num_chunks; ++c) {
        int64_t begin, end;
        spconv__chunk_bounds(n, num_chunks, c, &begin, &end);
        bins_place_chunk(in, bins, kv, begin, end, counts + c * kv, NULL, NULL);
    }
    /* Offset k's pairs chunk after chunk, so in increasing output row. */
    int64_t running = 0;
    for (int64_t k = 0; k < kv; ++k) {
        offsets[k] = running;
        for (int64_t c = 0; c < num_chunks; ++c) {
            const int64_t count = counts[c * kv + k];
            counts[c * kv + k] = running;
            running += count;
        }
    }
    offsets[kv] = running;
    SPCONV_TRY_GOTO(st, spconv__rulebook_set_offsets(in->func, rb, kv, NULL, offsets), done);
    SPCONV_TRY_GOTO(st, spconv__rulebook_alloc_pairs(rb), done);
    int32_t *pairs_in = spconv_tensor_data(rb->pairs_in);
    int32_t *pairs_out = spconv_tensor_data(rb->pairs_out);
    SPCONV_OMP(omp parallel for num_threads(num_threads) schedule(dynamic, 1))
    for (int64_t c = 0; c < num_chunks; ++c) {
        int64_t begin, end;
        spconv__chunk_bounds(n, num_chunks, c, &begin, &end);
        bins_place_chunk(in, bins, kv, begin, end, counts + c * kv, pairs_in, pairs_out);
    }
done:
    free(counts);
    free(offsets);
    return st;
}

/* Hits of outputs [begin, end): counted when keys is NULL, else written as (offset, out << 32 |
 * in) in increasing out (an output meets an offset at most once, so no order within it matters). */
static int64_t bins_sorted_chunk(const spconv__build_input *in, const site_bins *bins,
                                 int64_t begin, int64_t end, uint64_t *keys, uint64_t *values) {
    int64_t hits = 0;
    for (int64_t o = begin; o < end; ++o) {
        spconv__bin_walk walk;
        spconv__bin_walk_start(&bins->geometry, in->rows + 4 * o, &walk);
        int64_t k;
        int32_t i;
        while (spconv__bin_walk_next(&bins->geometry, bins->keys, bins->rows, in->rows,
                                     in->num_in, &walk, &k, &i)) {
            if (keys != NULL) {
                keys[hits] = (uint64_t)k;
                values[hits] = (uint64_t)o << 32 | (uint64_t)i;
            }
            ++hits;
        }
    }
    return hits;
}

/* Hits as (offset, out << 32 | in), radix-sorted by offset (stable, so increasing out within
 * each), and only the offsets that occur listed: no array of the kernel's size, at 32 bytes a pair
 * while it sorts. */
static spconv_status bins_sorted(const spconv__build_input *in, const site_bins *bins,
                                 spconv_rulebook *rb) {
    const int num_threads = in->num_threads;
    (void)num_threads; /* only the OpenMP pragmas read it */
    const int64_t n = rb->num_in, kv = rb->kernel_volume;
    int64_t num_chunks = (int64_t)num_threads * CHUNKS_PER_THREAD;
    if (num_chunks > n) num_chunks = n;
    int64_t *starts = malloc((size_t)(num_chunks + 1) * sizeof *starts);
    int64_t *slot_offsets = NULL, *slot_starts = NULL;
    uint64_t *buffers[4] = {NULL, NULL, NULL, NULL};
    spconv_status st = SPCONV_OK;
    if (starts == NULL)
        SPCONV_FAIL_GOTO(st, done, SPCONV_ERR_OUT_OF_MEMORY,
                         "%s: out of host memory for pair counts", in->func);
    SPCONV_OMP(omp parallel for num_threads(num_threads) schedule(dynamic, 1))
    for (int64_t c = 0; c < num_chunks; ++c) {
        int64_t begin, end;
        spconv__chunk_bounds(n, num_chunks, c, &begin, &end);
        starts[c] = bins_sorted_chunk(in, bins, begin, end, NULL, NULL);
    }
    int64_t total = 0;
    for (int64_t c = 0; c <= num_chunks; ++c) {
        const int64_t count = c < num_chunks ? starts[c] : 0;
        starts[c] = total;
        total += count;
    }
    for (int b = 0; b < 4; ++b) {
        buffers[b] = malloc((size_t)total * sizeof **buffers);
        if (buffers[b] == NULL)
            SPCONV_FAIL_GOTO(st, done, SPCONV_ERR_OUT_OF_MEMORY,
                             "%s: out of host memory for %" PRId64 " pairs", in->func, total);
    }
    SPCONV_OMP(omp parallel for num_threads(num_threads) schedule(dynamic, 1))
    for (int64_t c = 0; c < num_chunks; ++c) {
        int64_t begin, end;
        spconv__chunk_bounds(n, num_chunks, c, &begin, &end);
        bins_sorted_chunk(in, bins, begin, end, buffers[0] + starts[c], buffers[1] + starts[c]);
    }
    uint64_t *keys, *values;
    SPCONV_TRY_GOTO(st,
                    spconv__radix_sort(in->func, num_threads, total, spconv__key_bits_for(kv),
                                       buffers[0], buffers[1], buffers[2], buffers[3], &keys,
                                       &values),
                    done);
    int64_t distinct = 0;
    for (int64_t j = 0; j < total; ++j) distinct += j == 0 || keys[j] != keys[j - 1];
    slot_offsets = malloc((size_t)(distinct > 0 ? distinct : 1) * sizeof *slot_offsets);
    slot_starts = malloc((size_t)(distinct + 1) * sizeof *slot_starts);
    if (slot_offsets == NULL || slot_starts == NULL)
        SPCONV_FAIL_GOTO(st, done, SPCONV_ERR_OUT_OF_MEMORY,
                         "%s: out of host memory for %" PRId64 " pair offsets", in->func,
                         distinct);
    distinct = 0;
    for (int64_t j = 0; j < total; ++j)
        if (j == 0 || keys[j] != keys[j - 1]) {
            slot_offsets[distinct] = (int64_t)keys[j];
            slot_starts[distinct++] = j;
        }
    slot_starts[distinct] = total;
    SPCONV_TRY_GOTO(
        st, spconv__rulebook_set_offsets(in->func, rb, distinct, slot_offsets, slot_starts), done);
    SPCONV_TRY_GOTO(st, spconv__rulebook_alloc_pairs(rb), done);
    int32_t *pairs_in = spconv_tensor_data(rb->pairs_in);
    int32_t *pairs_out = spconv_tensor_data(rb->pairs_out);
    for (int64_t j = 0; j < total; ++j) {
        pairs_in[j] = (int32_t)(values[j] & UINT32_MAX);
        pairs_out[j] = (int32_t)(values[j] >> 32);
    }
done:
    free(starts);
    free(slot_offsets);
    free(slot_starts);
    for (int b = 0; b < 4; ++b) free(buffers[b]);
    return st;
}

/* The sites of in->sites (validated) sorted by bin into *bins, their keys in @p buffers[0..3]
 * (scratch of N each; bins->keys points into one of them) and their rows in bins->rows. */
static spconv_status sort_into_bins(const spconv__build_input *in, const spconv_rulebook *rb,
                                    uint64_t *buffers[4], site_bins *bins) {
    const int num_threads = in->num_threads;
    (void)num_threads; /* only the OpenMP pragmas read it */
    const int64_t n = rb->num_in;
    spconv__bin_geometry *g = &bins->geometry;
    for (int axis = 0; axis < 3; ++axis) {
        g->kernel[axis] = rb->params.kernel[axis];
        g->dilation[axis] = rb->params.dilation[axis];
        g->shape[axis] = rb->in_shape[axis];
    }
    g->layout = in->sites->layout;
    SPCONV_OMP(omp parallel for num_threads(num_threads) schedule(static))
    for (int64_t r = 0; r < n; ++r) {
        buffers[0][r] = spconv__bin_key(g, in->rows + 4 * r);
        buffers[1][r] = (uint64_t)r;
    }
    uint64_t *keys, *rows;
    SPCONV_FORWARD_IF_ERROR(spconv__radix_sort(in->func, num_threads, n, g->layout.total_bits,
                                               buffers[0], buffers[1], buffers[2], buffers[3],
                                               &keys, &rows));
    bins->keys = keys;
    for (int64_t r = 0; r < n; ++r) bins->rows[r] = (int32_t)rows[r];
    return SPCONV_OK;
}

static spconv_status build_from_bins(const spconv__build_input *in, spconv_rulebook *rb) {
    const int64_t n = rb->num_in;
    uint64_t *buffers[4] = {NULL, NULL, NULL, NULL};
    site_bins bins;
    bins.rows = malloc((size_t)n * sizeof *bins.rows);
    spconv_status st = SPCONV_OK;
    for (int b = 0; b < 4; ++b) buffers[b] = malloc((size_t)n * sizeof **buffers);
    if (bins.rows == NULL || buffers[0] == NULL || buffers[1] == NULL || buffers[2] == NULL ||
        buffers[3] == NULL)
        SPCONV_FAIL_GOTO(st, done, SPCONV_ERR_OUT_OF_MEMORY,
                         "%s: out of host memory for the bins of %" PRId64 " sites", in->func, n);
    SPCONV_TRY_GOTO(st, sort_into_bins(in, rb, buffers, &bins), done);
    /* The sort's scratch pair is free again: only bins.keys' buffer is still read. */
    for (int b = 0; b < 4; ++b)
        if (buffers[b] != bins.keys) {
            free(buffers[b]);
            buffers[b] = NULL;
        }
    st = rb->kernel_volume <= BINS_DENSE_OFFSETS ? bins_place(in, &bins, rb)
                                                 : bins_sorted(in, &bins, rb);
done:
    free(bins.rows);
    for (int b = 0; b < 4; ++b) free(buffers[b]);
    return st;
}

/* The builds that probe the hash table (or go through bins), over rows the table validates. */
static spconv_status build_with_table(const spconv__build_input *in, spconv_rulebook *rb) {
    spconv__site_table sites;
    SPCONV_FORWARD_IF_ERROR(spconv__site_table_build(in->func, in->num_threads, in->rows,
                                                     in->num_in, in->shape, in->batch_size,
                                                     &sites));
    spconv__build_input with = *in;
    with.sites = &sites;
    spconv_status st = SPCONV_OK;
    if (spconv__subm_by_bins(rb->num_in, rb->kernel_volume)) {
        st = build_from_bins(&with, rb);
    } else if (rb->kernel_volume == 1) { /* the centre alone */
        const int64_t starts[2] = {0, rb->num_in};
        st = spconv__rulebook_set_offsets(in->func, rb, 1, NULL, starts);
        if (st == SPCONV_OK) st = spconv__rulebook_alloc_pairs(rb);
        if (st == SPCONV_OK) fill_center(rb, 0);
    } else {
        subm_plan plan = {&with, rb->in_shape, 0, 0, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL};
        st = plan_alloc(in->func, in->num_threads, rb, &plan);
        if (st == SPCONV_OK)
            st = plan.group_size >= rb->kernel_volume / 2 ? build_one_group(&plan, rb)
                                                           : build_in_groups(&plan, rb);
        plan_free(&plan);
    }
    spconv__site_table_free(&sites);
    return st;
}

/* ---- through the line index: every offset at once, written straight into place ------------ *
 *
 * The walk goes line by line, whatever the order of the rows. For a line (b, z, y), the sites of
 * its neighbouring lines (one per (z, y) step of the kernel) are dropped into rows of cells
 * indexed by x; every site of the line then reads the cells its kernel covers, with no branch on
 * whether a site is there. A row keeps its line while the walk goes on to the next lines: row
 * (qz, ny mod KY * DY) holds the line at z step qz and y = ny, so the line (b, z, y + 1) finds
 * its neighbours at y and y + 1 still in place and drops in only those at y + 2, and each line is
 * dropped in about once per z step rather than once per (z, y) step. A row is emptied when
 * another line needs it and at the end of the walk. On grids too wide for such rows, a
 * cursor per neighbouring line moves forward as the line's x increases instead. Either way each
 * site gets a mask of the offsets that reach it and its inputs in offset order (the walk meets
 * the offsets in increasing order: z step, y step, then x). The masks then give the pairs per
 * chunk of output rows and offset, and a last pass over the sites in increasing row writes every
 * pair into place: offset k's pairs in increasing output row, as the table's build gives them. */

/* Offsets besides the centre that the line build takes (a bit each in a site's mask). */
#define LINES_MAX_OFFSETS 64
/* Widest x axis walked through rows of cells (one row per neighbouring line, 4 bytes a cell), and
 * most cells of a thread's rows (1 MiB): beyond either, cursors. */
#define DENSE_MAX_WIDTH 16384
#define DENSE_MAX_CELLS (INT64_C(1) << 18)

typedef struct lines_plan {
    const spconv__site_lines *lines;
    const int64_t *shape, *kernel, *dilation;
    int64_t num_sites, kernel_volume;
    int64_t num_walks;   /* chunks of lines, of about equal sites */
    int64_t *walk_lines; /* [num_walks + 1]: first line of each */
    int64_t num_chunks;  /* chunks of output rows, chunk_len each (the last one shorter) */
    int64_t chunk_len;
    uint64_t *masks;     /* [N]: bit j for non-centre offset j (the centre skipped) */
    int64_t *where;      /* [N]: where site o's inputs start in found */
    int32_t *found;      /* inputs, site after site in walk order: walk w's from its first site
                          * times KV on, which leaves a spare cell per site */
    int64_t *counts;     /* [num_chunks][KV]: pairs, then where the chunk's go */
} lines_plan;

/* Where the walk is: line (b, z, y), and y mod KY * DY (see cells_rows), kept as the walk steps
 * from line to line rather than divided out of the line number each time. */
typedef struct line_at {
    int64_t line, b, z, y, y_mod;
} line_at;

static void line_at_start(const lines_plan *plan, int64_t line, line_at *at) {
    const spconv__site_lines *lines = plan->lines;
    at->line = line;
    at->b = line / lines->lines_per_batch;
    at->z = line % lines->lines_per_batch / lines->height;
    at->y = line % lines->height;
    at->y_mod = at->y % (plan->kernel[1] * plan->dilation[1]);
}

static void line_at_next(const lines_plan *plan, line_at *at) {
    ++at->line;
    if (++at->y_mod == plan->kernel[1] * plan->dilation[1]) at->y_mod = 0;
    if (++at->y < plan->lines->height) return;
    at->y = at->y_mod = 0;
    if (++at->z < plan->shape[0]) return;
    at->z = 0;
    ++at->b;
}

/* The neighbouring lines of the line at @p here that lie in the grid and hold sites, in kernel
 * order: the line, its entries [at, stop), the offset of its x = 0 step and its row of cells (see
 * cells_rows); *own gets the index of the line itself among them. Returns how many. */
static int64_t neighbour_lines(const lines_plan *plan, const line_at *here, int64_t *which,
                               int64_t *at, int64_t *stop, int64_t *k_line, int64_t *slot,
                               int64_t *own) {
    const spconv__site_lines *lines = plan->lines;
    const int64_t *shape = plan->shape, *kernel = plan->kernel, *dil = plan->dilation;
    const int64_t ky = kernel[1], period = ky * dil[1], y_reach = ky / 2 * dil[1];
    /* The row of the y step 0 line: (y - y_reach) mod period, y_reach < period. */
    const int64_t row0 = here->y_mod >= y_reach ? here->y_mod - y_reach
                                                : here->y_mod - y_reach + period;
    int64_t used = 0;
    for (int64_t qz = 0; qz < kernel[0]; ++qz) {
        const int64_t nz = here->z + (qz - kernel[0] / 2) * dil[0];
        if (nz < 0 || nz >= shape[0]) continue;
        for (int64_t qy = 0, row = row0; qy < ky; ++qy) {
            const int64_t ny = here->y + qy * dil[1] - y_reach;
            const int64_t cells_row = qz * period + row;
            row = row + dil[1] < period ? row + dil[1] : row + dil[1] - period;
            if (ny < 0 || ny >= shape[1]) continue;
            const int64_t other = here->b * lines->lines_per_batch + nz * lines->height + ny;
            if (lines->starts[other] == lines->starts[other + 1]) continue;
            if (other == here->line) *own = used;
            which[used] = other;
            at[used] = lines->starts[other];
            stop[used] = lines->starts[other + 1];
            k_line[used] = (qz * ky + qy) * kernel[2];
            slot[used] = cells_row;
            ++used;
        }
    }
    return used;
}

/* Sites [begin, end) of a line against its neighbours' rows of cells (x - reach at cell x), kx
 * cells a row step cells apart, @p own the line's own row: inlined with constants for the common
 * 3-wide undilated kernel. Nothing here branches on the data: a site's own cell is emptied while
 * it reads, so the centre offset finds nothing, and offset k > centre takes mask bit k - 1 (the
 * centre's bit, k itself, only ever receives a 0; with at most 64 offsets the hits go in at bit
 * k and every bit above the centre moves down one at the end). */
static inline __attribute__((always_inline)) int64_t
read_cells(const lines_plan *plan, int64_t begin, int64_t end, int64_t used, const int64_t *k_line,
           const int32_t *const *rows, int32_t *own, int64_t pos, int64_t kx, int64_t step) {
    const uint64_t *entries = plan->lines->entries;
    const int64_t centre = plan->kernel_volume / 2, reach = kx / 2 * step;
    /* Up to 64 offsets, centre included, a line's kx hits go into the mask with one shift (a
     * shift by a count in a register is 3 instructions on x86, 27 of them a site before). */
    const int narrow = plan->kernel_volume <= 64;
    const uint64_t below = (UINT64_C(1) << centre) - 1; /* centre <= 32 */
    int32_t *found = plan->found;
    uint64_t *masks = plan->masks;
    int64_t *where = plan->where;
    for (int64_t e = begin; e < end; ++e) {
        const int64_t x = (int64_t)(entries[e] >> 32), o = (int64_t)(entries[e] & UINT32_MAX);
        uint64_t mask = 0;
        where[o] = pos;
        own[x + reach] = -1; /* a site is not its own neighbour */
        if (narrow) { /* bit k for offset k, the centre's bit dropped once at the end */
            for (int64_t u = 0; u < used; ++u) {
                const int32_t *row = rows[u] + x;
                uint64_t line = 0;
                for (int64_t q = 0; q < kx; ++q) {
                    const int32_t v = row[q * step];
                    const uint64_t hit = v >= 0;
                    found[pos] = v; /* stored either way, kept only on a hit */
                    pos += (int64_t)hit;
                    line |= hit << q;
                }
                mask |= line << k_line[u];
            }
            mask = (mask & below) | (mask >> 1 & ~below);
        } else {
            for (int64_t u = 0; u < used; ++u) {
                const int32_t *row = rows[u] + x;
                const int64_t k0 = k_line[u];
                for (int64_t q = 0; q < kx; ++q) {
                    const int64_t k = k0 + q;
                    const int32_t v = row[q * step];
                    const uint64_t hit = v >= 0;
                    found[pos] = v; /* stored either way, kept only on a hit */
                    pos += (int64_t)hit;
                    mask |= hit << (k - (k > centre));
                }
            }
        }
        own[x + reach] = (int32_t)o;
        masks[o] = mask;
    }
    return pos;
}

/* Line @p line's entries into (value: its rows; -1: out again) the row of cells @p cells. */
static void line_cells(const lines_plan *plan, int64_t line, int32_t *cells, int fill) {
    const uint64_t *entries = plan->lines->entries;
    const int64_t reach = plan->kernel[2] / 2 * plan->dilation[2];
    for (int64_t e = plan->lines->starts[line]; e < plan->lines->starts[line + 1]; ++e)
        cells[(int64_t)(entries[e] >> 32) + reach] = fill ? (int32_t)(entries[e] & UINT32_MAX) : -1;
}

/* One line's sites through rows of cells of @p width, x + reach at cell x (-1: no site); held[r]
 * is the line that row r of @p cells holds (-1: none; lines number below INT32_MAX,
 * spconv__site_lines_fit), updated here. */
static void walk_line_cells(const lines_plan *plan, int64_t begin, int64_t end, int64_t used,
                            const int64_t *which, const int64_t *k_line, const int64_t *slot,
                            int64_t own, int32_t *cells, int64_t width, int32_t *held,
                            int64_t *written) {
    const int64_t kx = plan->kernel[2], step = plan->dilation[2];
    const int32_t *rows[LINES_MAX_OFFSETS + 1];
    for (int64_t u = 0; u < used; ++u) {
        int32_t *row = cells + slot[u] * width;
        if (held[slot[u]] != which[u]) {
            if (held[slot[u]] >= 0) line_cells(plan, held[slot[u]], row, 0);
            line_cells(plan, which[u], row, 1);
            held[slot[u]] = (int32_t)which[u];
        }
        rows[u] = row;
    }
    int32_t *own_row = cells + slot[own] * width;
    if (kx == 3 && step == 1)
        *written = read_cells(plan, begin, end, used, k_line, rows, own_row, *written, 3, 1);
    else
        *written = read_cells(plan, begin, end, used, k_line, rows, own_row, *written, kx, step);
}

/* One line's sites with a cursor per neighbouring line, for grids too wide for rows of cells. */
static void walk_line_cursors(const lines_plan *plan, int64_t begin, int64_t end, int64_t used,
                              int64_t *at, const int64_t *stop, const int64_t *k_line,
                              int64_t *written) {
    const uint64_t *entries = plan->lines->entries;
    const int64_t kx = plan->kernel[2], step = plan->dilation[2], reach = kx / 2 * step;
    const int64_t centre = plan->kernel_volume / 2;
    int64_t pos = *written;
    for (int64_t e = begin; e < end; ++e) {
        const int64_t x = (int64_t)(entries[e] >> 32), o = (int64_t)(entries[e] & UINT32_MAX);
        const uint64_t low = (uint64_t)(x - reach < 0 ? 0 : x - reach) << 32;
        uint64_t mask = 0;
        plan->where[o] = pos;
        for (int64_t u = 0; u < used; ++u) {
            while (at[u] < stop[u] && entries[at[u]] < low) ++at[u];
            for (int64_t f = at[u]; f < stop[u]; ++f) {
                const int64_t d = (int64_t)(entries[f] >> 32) - x;
                if (d > reach) break;
                if (d % step != 0) continue;
                const int64_t k = k_line[u] + (d + reach) / step;
                if (k == centre) continue; /* the site itself: rows are unique */
                mask |= UINT64_C(1) << (k < centre ? k : k - 1);
                plan->found[pos++] = (int32_t)(entries[f] & UINT32_MAX);
            }
        }
        plan->masks[o] = mask;
    }
    *written = pos;
}

/* Cells in a row: the x axis and the kernel's reach on either side. */
static int64_t cells_width(const lines_plan *plan) {
    return plan->shape[2] + 2 * (plan->kernel[2] / 2 * plan->dilation[2]);
}

/* A thread's rows of cells: KZ x KY * DY, row (qz, ny mod KY * DY) for the neighbouring line at
 * z step qz and y = ny (the KY lines of one z step differ by multiples of DY below KY * DY, so
 * they never share a row). */
static int64_t cells_rows(const lines_plan *plan) {
    return plan->kernel[0] * plan->kernel[1] * plan->dilation[1];
}

/* A thread's rows of cells, all empty (-1), or NULL where the walk uses cursors: a grid wider
 * than DENSE_MAX_WIDTH, rows of more than DENSE_MAX_CELLS cells in all (a kernel of many (z, y)
 * steps, or a large y dilation), or no memory for them. Walks leave them empty again, so one set
 * serves a thread's walks. */
static int32_t *cells_alloc(const lines_plan *plan) {
    /* Each factor is checked first: with dilations up to INT32_MAX their product could wrap. */
    if (plan->shape[2] > DENSE_MAX_WIDTH || cells_rows(plan) > DENSE_MAX_CELLS ||
        cells_width(plan) > DENSE_MAX_CELLS)
        return NULL;
    const int64_t cells = cells_rows(plan) * cells_width(plan);
    if (cells > DENSE_MAX_CELLS) return NULL;
    /* After the cells, the line each row holds (-1: none), all -1 between walks too. */
    const size_t bytes = (size_t)(cells + cells_rows(plan)) * sizeof(int32_t);
    int32_t *rows = malloc(bytes);
    if (rows != NULL) memset(rows, 0xff, bytes);
    return rows;
}

static void walk_lines(const lines_plan *plan, int64_t walk, int32_t *cells) {
    const spconv__site_lines *lines = plan->lines;
    const int64_t width = cells_width(plan), num_rows = cells_rows(plan);
    const int64_t first = plan->walk_lines[walk], last = plan->walk_lines[walk + 1];
    int64_t written = (int64_t)lines->starts[first] * plan->kernel_volume;
    int64_t which[LINES_MAX_OFFSETS + 1], at[LINES_MAX_OFFSETS + 1], stop[LINES_MAX_OFFSETS + 1];
    int64_t k_line[LINES_MAX_OFFSETS + 1], slot[LINES_MAX_OFFSETS + 1];
    int32_t *held = cells != NULL ? cells + num_rows * width : NULL; /* see cells_alloc */
    line_at here;
    for (line_at_start(plan, first, &here); here.line < last; line_at_next(plan, &here)) {
        const int64_t begin = lines->starts[here.line], end = lines->starts[here.line + 1];
        if (begin == end) continue;
        int64_t own = 0;
        const int64_t used = neighbour_lines(plan, &here, which, at, stop, k_line, slot, &own);
        if (cells != NULL)
            walk_line_cells(plan, begin, end, used, which, k_line, slot, own, cells, width, held,
                            &written);
        else
            walk_line_cursors(plan, begin, end, used, at, stop, k_line, &written);
    }
    if (cells == NULL) return;
    for (int64_t r = 0; r < num_rows; ++r) /* the rows empty again for the thread's next walk */
        if (held[r] >= 0) {
            line_cells(plan, held[r], cells + r * width, 0);
            held[r] = -1;
        }
}

/* Byte i of the result is bit i of @p byte: the byte copied into all eight, each copy keeping its
 * own bit, then each nonzero byte made 1 (adding 0x7f sets its top bit, and no byte carries). */
static inline uint64_t spread_bits(uint64_t byte) {
    const uint64_t kept = (byte * UINT64_C(0x0101010101010101)) & UINT64_C(0x8040201008040201);
    return ((kept + UINT64_C(0x7f7f7f7f7f7f7f7f)) >> 7) & UINT64_C(0x0101010101010101);
}

/* Pairs per offset of output rows [begin, end), from their masks: each mask adds its bits to
 * byte counters, eight bits to a word (no branch per bit), emptied into counts every 255 rows. */
static void count_lines_chunk(const lines_plan *plan, int64_t begin, int64_t end, int64_t *counts) {
    const int64_t kv = plan->kernel_volume, centre = kv / 2, groups = (kv - 1 + 7) / 8;
    for (int64_t k = 0; k < kv; ++k) counts[k] = 0;
    for (int64_t o = begin; o < end;) {
        uint64_t bytes[LINES_MAX_OFFSETS / 8] = {0};
        const int64_t stop = end - o > 255 ? o + 255 : end;
        for (; o < stop; ++o) {
            const uint64_t mask = plan->masks[o];
            for (int64_t g = 0; g < groups; ++g) bytes[g] += spread_bits(mask >> 8 * g & 0xff);
        }
        for (int64_t j = 0; j < kv - 1; ++j)
            counts[j < centre ? j : j + 1] += (int64_t)(bytes[j / 8] >> 8 * (j % 8) & 0xff);
    }
}

/* Write the pairs of output rows [begin, end) at the chunk's cursors @p cursors (one per offset).
 * They advance in a copy of the thread's own: the chunks' cursors lie side by side, and two
 * threads advancing cursors on one cache line would pass it back and forth on every pair. */
static void emit_lines_chunk(const lines_plan *plan, int64_t begin, int64_t end,
                             const int64_t *cursors, int32_t *pairs_in, int32_t *pairs_out) {
    const int64_t centre = plan->kernel_volume / 2;
    int64_t next[LINES_MAX_OFFSETS + 1];
    for (int64_t k = 0; k < plan->kernel_volume; ++k) next[k] = cursors[k];
    for (int64_t o = begin; o < end; ++o) {
        if (o + 8 < end) __builtin_prefetch(plan->found + plan->where[o + 8]);
        const int32_t *found = plan->found + plan->where[o];
        for (uint64_t mask = plan->masks[o]; mask != 0; mask &= mask - 1) {
            const int64_t j = __builtin_ctzll(mask);
            const int64_t pos = next[j < centre ? j : j + 1]++;
            pairs_in[pos] = *found++;
            pairs_out[pos] = (int32_t)o;
        }
    }
}

/* Split the lines into walks of about equal sites. */
static void plan_walks(lines_plan *plan) {
    const spconv__site_lines *lines = plan->lines;
    int64_t line = 0;
    plan->walk_lines[0] = 0;
    for (int64_t w = 1; w < plan->num_walks; ++w) {
        const int64_t target = plan->num_sites * w / plan->num_walks;
        while (line < lines->num_lines && lines->starts[line] < target) ++line;
        plan->walk_lines[w] = line;
    }
    plan->walk_lines[plan->num_walks] = lines->num_lines;
}

static spconv_status build_by_lines(const spconv__build_input *in,
                                    const spconv__site_lines *lines, spconv_rulebook *rb) {
    const char *func = in->func;
    const int num_threads = in->num_threads;
    (void)num_threads; /* only the OpenMP pragmas read it */
    const int64_t n = rb->num_in, kv = rb->kernel_volume, centre = kv / 2;
    lines_plan plan = {lines, rb->in_shape, rb->params.kernel, rb->params.dilation, n, kv, 0, NULL,
                       0,     0,           NULL,             NULL,                 NULL, NULL};
    plan.num_walks = (int64_t)num_threads * CHUNKS_PER_THREAD;
    if (plan.num_walks > n) plan.num_walks = n;
    plan.chunk_len = (n + plan.num_walks - 1) / plan.num_walks;
    plan.num_chunks = (n + plan.chunk_len - 1) / plan.chunk_len;
    const int64_t num_walks = plan.num_walks, num_chunks = plan.num_chunks;
    spconv_status st = SPCONV_OK;
    int64_t *offsets = malloc((size_t)(kv + 1) * sizeof *offsets);
    plan.walk_lines = malloc((size_t)(num_walks + 1) * sizeof *plan.walk_lines);
    plan.masks = malloc((size_t)n * sizeof *plan.masks);
    plan.where = malloc((size_t)n * sizeof *plan.where);
    /* Room for every offset of every site; only the pages of the hits are touched. */
    plan.found = malloc((size_t)n * (size_t)kv * sizeof *plan.found);
    plan.counts = malloc((size_t)(num_chunks * kv) * sizeof *plan.counts);
    if (offsets == NULL || plan.walk_lines == NULL || plan.masks == NULL || plan.where == NULL ||
        plan.found == NULL || plan.counts == NULL)
        SPCONV_FAIL_GOTO(st, done, SPCONV_ERR_OUT_OF_MEMORY,
                         "%s: out of host memory for the neighbours of %" PRId64 " sites", func,
                         n);
    plan_walks(&plan);
    SPCONV_OMP(omp parallel num_threads(num_threads))
    {
        int32_t *cells = cells_alloc(&plan);
        SPCONV_OMP(omp for schedule(dynamic, 1))
        for (int64_t w = 0; w < num_walks; ++w) walk_lines(&plan, w, cells);
        free(cells);
        SPCONV_OMP(omp for schedule(dynamic, 1))
        for (int64_t c = 0; c < num_chunks; ++c) {
            const int64_t begin = c * plan.chunk_len;
            const int64_t end = begin + plan.chunk_len < n ? begin + plan.chunk_len : n;
            count_lines_chunk(&plan, begin, end, plan.counts + c * kv);
        }
    }
    /* Offset k's pairs chunk after chunk, so in increasing output row; the centre's are (r, r). */
    int64_t running = 0;
    for (int64_t k = 0; k < kv; ++k) {
        offsets[k] = running;
        if (k == centre) {
            running += n;
            continue;
        }
        for (int64_t c = 0; c < num_chunks; ++c) {
            const int64_t count = plan.counts[c * kv + k];
            plan.counts[c * kv + k] = running;
            running += count;
        }
    }
    offsets[kv] = running;
    SPCONV_TRY_GOTO(st, spconv__rulebook_set_offsets(func, rb, kv, NULL, offsets), done);
    SPCONV_TRY_GOTO(st, spconv__rulebook_alloc_pairs(rb), done);
    int32_t *pairs_in = spconv_tensor_data(rb->pairs_in);
    int32_t *pairs_out = spconv_tensor_data(rb->pairs_out);
    SPCONV_OMP(omp parallel for num_threads(num_threads) schedule(dynamic, 1))
    for (int64_t c = 0; c < num_chunks; ++c) {
        const int64_t begin = c * plan.chunk_len;
        const int64_t end = begin + plan.chunk_len < n ? begin + plan.chunk_len : n;
        emit_lines_chunk(&plan, begin, end, plan.counts + c * kv, pairs_in, pairs_out);
    }
    fill_center(rb, offsets[centre]);
done:
    free(offsets);
    free(plan.walk_lines);
    free(plan.masks);
    free(plan.where);
    free(plan.found);
    free(plan.counts);
    return st;
}

spconv_status spconv__build_subm(const spconv__build_input *in, spconv_rulebook *rb) {
    rb->out_indices = rb->in_indices;
    spconv_tensor_retain(rb->out_indices);
    rb->num_out = rb->num_in;
    rb->center_is_identity = 1;
    if (rb->num_in == 0) return spconv__rulebook_alloc_pairs(rb); /* no pairs */
    /* The line walk takes kernels of up to LINES_MAX_OFFSETS + 1 offsets (3x3x3 always) on grids
     * whose lines are few next to the sites; the index validates the rows as the table would. */
    if (spconv__subm_by_bins(rb->num_in, rb->kernel_volume) || rb->kernel_volume == 1 ||
        rb->kernel_volume - 1 > LINES_MAX_OFFSETS ||
        !spconv__site_lines_fit(rb->num_in, rb->batch_size, rb->in_shape))
        return build_with_table(in, rb);
    spconv__site_lines lines = {0, 0, 0, NULL, NULL};
    spconv_status st = spconv__site_lines_build(in->func, in->num_threads, in->rows, rb->num_in,
                                                rb->batch_size, rb->in_shape, &lines);
    if (st == SPCONV_OK) st = build_by_lines(in, &lines, rb);
    spconv__site_lines_free(&lines);
    return st;
}
