/* Submanifold rulebooks. Outputs are the input sites. Neighbour columns nbr[k][o] (input row
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
 * With fewer sites than probed offsets (N <= KV/2: a 255^3 kernel on a handful of sites) the
 * build checks every pair of sites instead: N^2 displacement tests rather than N x KV/2 lookups,
 * a stable radix sort of the hits by offset, the same rulebook. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/parallel.h"
#include "rulebook/build.h"
#include "rulebook/radix_sort.h"
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

/* ---- few sites: every pair of sites -------------------------------------------------------- */

/* The offset through which input row @p in reaches output row @p out, or -1. */
static int64_t site_pair_offset(const spconv_conv_params *params, const int32_t *out,
                                const int32_t *in) {
    if (in[0] != out[0]) return -1;
    int64_t k = 0;
    for (int axis = 0; axis < 3; ++axis) {
        const int64_t d = (int64_t)in[1 + axis] - out[1 + axis], dil = params->dilation[axis];
        if (d % dil != 0) return -1;
        const int64_t q = d / dil + params->kernel[axis] / 2;
        if (q < 0 || q >= params->kernel[axis]) return -1;
        k = k * params->kernel[axis] + q;
    }
    return k;
}

/* Hits of outputs [begin, end): counted when keys is NULL, else written as (offset, out << 32 |
 * in) in increasing out, then in. */
static int64_t site_pairs_chunk(const spconv__build_input *in, const spconv_conv_params *params,
                                int64_t begin, int64_t end, uint64_t *keys, uint64_t *values) {
    int64_t hits = 0;
    for (int64_t o = begin; o < end; ++o)
        for (int64_t i = 0; i < in->num_in; ++i) {
            const int64_t k = site_pair_offset(params, in->rows + 4 * o, in->rows + 4 * i);
            if (k < 0) continue;
            if (keys != NULL) {
                keys[hits] = (uint64_t)k;
                values[hits] = (uint64_t)o << 32 | (uint64_t)i;
            }
            ++hits;
        }
    return hits;
}

static spconv_status build_from_site_pairs(const spconv__build_input *in, spconv_rulebook *rb) {
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
        starts[c] = site_pairs_chunk(in, &rb->params, begin, end, NULL, NULL);
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
        site_pairs_chunk(in, &rb->params, begin, end, buffers[0] + starts[c],
                         buffers[1] + starts[c]);
    }
    /* Stable by offset: within an offset the pairs keep their increasing output rows. */
    uint64_t *keys, *values;
    SPCONV_TRY_GOTO(st,
                    spconv__radix_sort(in->func, num_threads, total, spconv__key_bits_for(kv),
                                       buffers[0], buffers[1], buffers[2], buffers[3], &keys,
                                       &values),
                    done);
    /* The offsets that occur, with where their pairs start: no array of the kernel's size. */
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

/* The builds that probe the hash table (or check every pair of sites), over rows it validates. */
static spconv_status build_with_table(const spconv__build_input *in, spconv_rulebook *rb) {
    spconv__site_table sites;
    SPCONV_FORWARD_IF_ERROR(spconv__site_table_build(in->func, in->num_threads, in->rows,
                                                     in->num_in, in->shape, in->batch_size,
                                                     &sites));
    spconv__build_input with = *in;
    with.sites = &sites;
    spconv_status st = SPCONV_OK;
    if (rb->num_in <= rb->kernel_volume / 2) {
        st = build_from_site_pairs(&with, rb);
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
 * whether a site is there, and the cells are emptied again. On grids too wide for such rows, a
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

/* The neighbouring lines of @p line that lie in the grid and hold sites, in kernel order: their
 * entries [at, stop) and the offset of their x = 0 step; returns how many. */
static int64_t neighbour_lines(const lines_plan *plan, int64_t line, int64_t *at, int64_t *stop,
                               int64_t *k_line) {
    const spconv__site_lines *lines = plan->lines;
    const int64_t *shape = plan->shape, *kernel = plan->kernel, *dil = plan->dilation;
    const int64_t b = line / lines->lines_per_batch;
    const int64_t z = line % lines->lines_per_batch / lines->height, y = line % lines->height;
    int64_t used = 0;
    for (int64_t q = 0; q < kernel[0] * kernel[1]; ++q) {
        const int64_t nz = z + (q / kernel[1] - kernel[0] / 2) * dil[0];
        const int64_t ny = y + (q % kernel[1] - kernel[1] / 2) * dil[1];
        if (nz < 0 || nz >= shape[0] || ny < 0 || ny >= shape[1]) continue;
        const int64_t other = b * lines->lines_per_batch + nz * lines->height + ny;
        if (lines->starts[other] == lines->starts[other + 1]) continue;
        at[used] = lines->starts[other];
        stop[used] = lines->starts[other + 1];
        k_line[used] = q * kernel[2];
        ++used;
    }
    return used;
}

/* Sites [begin, end) of a line against rows of cells of @p width (x - reach at cell x), kx cells a
 * row step cells apart: inlined with constants for the common 3-wide undilated kernel. */
static inline __attribute__((always_inline)) int64_t
read_cells(const lines_plan *plan, int64_t begin, int64_t end, int64_t used, const int64_t *k_line,
           const int32_t *cells, int64_t width, int64_t pos, int64_t kx, int64_t step) {
    const uint64_t *entries = plan->lines->entries;
    const int64_t centre = plan->kernel_volume / 2;
    int32_t *found = plan->found;
    uint64_t *masks = plan->masks;
    int64_t *where = plan->where;
    for (int64_t e = begin; e < end; ++e) {
        const int64_t x = (int64_t)(entries[e] >> 32), o = (int64_t)(entries[e] & UINT32_MAX);
        uint64_t mask = 0;
        where[o] = pos;
        for (int64_t u = 0; u < used; ++u) {
            const int32_t *row = cells + u * width + x;
            const int64_t k0 = k_line[u];
            for (int64_t q = 0; q < kx; ++q) {
                const int64_t k = k0 + q;
                if (k == centre) continue; /* the site itself */
                const int32_t v = row[q * step];
                const uint64_t hit = v >= 0;
                found[pos] = v; /* stored either way, kept only on a hit */
                pos += (int64_t)hit;
                mask |= hit << (k < centre ? k : k - 1);
            }
        }
        masks[o] = mask;
    }
    return pos;
}

/* One line's sites through rows of cells of @p width, x + reach at cell x (-1: no site). */
static void walk_line_cells(const lines_plan *plan, int64_t begin, int64_t end, int64_t used,
                            const int64_t *at, const int64_t *stop, const int64_t *k_line,
                            int32_t *cells, int64_t width, int64_t *written) {
    const uint64_t *entries = plan->lines->entries;
    const int64_t kx = plan->kernel[2], step = plan->dilation[2], reach = kx / 2 * step;
    for (int64_t u = 0; u < used; ++u)
        for (int64_t e = at[u]; e < stop[u]; ++e)
            cells[u * width + (int64_t)(entries[e] >> 32) + reach] = (int32_t)(entries[e] & UINT32_MAX);
    if (kx == 3 && step == 1)
        *written = read_cells(plan, begin, end, used, k_line, cells, width, *written, 3, 1);
    else
        *written = read_cells(plan, begin, end, used, k_line, cells, width, *written, kx, step);
    for (int64_t u = 0; u < used; ++u)
        for (int64_t e = at[u]; e < stop[u]; ++e)
            cells[u * width + (int64_t)(entries[e] >> 32) + reach] = -1;
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

/* Cells in a thread's rows: one row of width cells per (z, y) step of the kernel. */
static int64_t cells_width(const lines_plan *plan) {
    return plan->shape[2] + 2 * (plan->kernel[2] / 2 * plan->dilation[2]);
}

/* A thread's rows of cells, all empty (-1), or NULL where the walk uses cursors: a grid wider
 * than DENSE_MAX_WIDTH, rows of more than DENSE_MAX_CELLS cells in all (a kernel of many (z, y)
 * steps), or no memory for them. Walks leave them empty again, so one set serves a thread's
 * walks. */
static int32_t *cells_alloc(const lines_plan *plan) {
    const int64_t cells = plan->kernel[0] * plan->kernel[1] * cells_width(plan);
    if (plan->shape[2] > DENSE_MAX_WIDTH || cells > DENSE_MAX_CELLS) return NULL;
    int32_t *rows = malloc((size_t)cells * sizeof *rows);
    if (rows != NULL) memset(rows, 0xff, (size_t)cells * sizeof *rows);
    return rows;
}

static void walk_lines(const lines_plan *plan, int64_t walk, int32_t *cells) {
    const spconv__site_lines *lines = plan->lines;
    const int64_t width = cells_width(plan);
    const int64_t first = plan->walk_lines[walk], last = plan->walk_lines[walk + 1];
    int64_t written = (int64_t)lines->starts[first] * plan->kernel_volume;
    int64_t at[LINES_MAX_OFFSETS + 1], stop[LINES_MAX_OFFSETS + 1], k_line[LINES_MAX_OFFSETS + 1];
    for (int64_t line = first; line < last; ++line) {
        const int64_t begin = lines->starts[line], end = lines->starts[line + 1];
        if (begin == end) continue;
        const int64_t used = neighbour_lines(plan, line, at, stop, k_line);
        if (cells != NULL)
            walk_line_cells(plan, begin, end, used, at, stop, k_line, cells, width, &written);
        else
            walk_line_cursors(plan, begin, end, used, at, stop, k_line, &written);
    }
}

/* Pairs per offset of output rows [begin, end), from their masks. */
static void count_lines_chunk(const lines_plan *plan, int64_t begin, int64_t end, int64_t *counts) {
    const int64_t kv = plan->kernel_volume, centre = kv / 2;
    for (int64_t k = 0; k < kv; ++k) counts[k] = 0;
    for (int64_t o = begin; o < end; ++o)
        for (uint64_t mask = plan->masks[o]; mask != 0; mask &= mask - 1) {
            const int64_t j = __builtin_ctzll(mask);
            ++counts[j < centre ? j : j + 1];
        }
}

/* Write the pairs of output rows [begin, end) at the chunk's cursors @p next (one per offset). */
static void emit_lines_chunk(const lines_plan *plan, int64_t begin, int64_t end, int64_t *next,
                             int32_t *pairs_in, int32_t *pairs_out) {
    const int64_t centre = plan->kernel_volume / 2;
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
    if (rb->num_in <= rb->kernel_volume / 2 || rb->kernel_volume == 1 ||
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
