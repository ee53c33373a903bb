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
    const spconv__site_lines *lines; /* neighbours searched here when built, else in the table */
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

/* probe_chunk through the line index, for a group that holds every offset below the centre:
 * for each (z, y) step of the kernel, one search in that line for the first x the kernel reaches,
 * then a walk along the line's sorted x over the window, each site met giving its offset. */
static void probe_chunk_lines(const subm_plan *plan, const spconv_conv_params *params,
                              int64_t begin, int64_t end, int64_t *counts) {
    const spconv__site_lines *lines = plan->lines;
    const int64_t n = plan->in->num_in, group = plan->group_size, half = plan->end;
    const int64_t *shape = plan->shape, *kernel = params->kernel, *dil = params->dilation;
    const int64_t reach_x = kernel[2] / 2 * dil[2], step_x = dil[2];
    for (int64_t j = 0; j < half; ++j) counts[j] = 0;
    for (int64_t o = begin; o < end; ++o) {
        const int32_t *row = plan->in->rows + 4 * o;
        const int64_t batch_line = row[0] * lines->lines_per_batch;
        for (int64_t qz = 0; qz < kernel[0]; ++qz) {
            const int64_t z = row[1] + (qz - kernel[0] / 2) * dil[0];
            if (z < 0 || z >= shape[0]) continue;
            for (int64_t qy = 0; qy < kernel[1]; ++qy) {
                const int64_t k_line = (qz * kernel[1] + qy) * kernel[2];
                if (k_line >= half) break;
                const int64_t y = row[2] + (qy - kernel[1] / 2) * dil[1];
                if (y < 0 || y >= shape[1]) continue;
                const int64_t line = batch_line + z * lines->height + y;
                int64_t at = lines->starts[line];
                const int64_t stop = lines->starts[line + 1];
                const uint64_t first = (uint64_t)(row[3] - reach_x < 0 ? 0 : row[3] - reach_x) << 32;
                /* Lines of a scan hold a few sites; a long one is searched, never walked. */
                if (stop - at > 16) {
                    int64_t hi = stop;
                    while (at < hi) {
                        const int64_t mid = at + (hi - at) / 2;
                        if (lines->entries[mid] < first)
                            at = mid + 1;
                        else
                            hi = mid;
                    }
                }
                while (at < stop && lines->entries[at] < first) ++at;
                for (; at < stop; ++at) {
                    const int64_t d = (int64_t)(lines->entries[at] >> 32) - row[3];
                    if (d > reach_x) break;
                    /* Undilated x (the common case) needs no division. */
                    if (step_x != 1 && d % step_x != 0) continue;
                    const int64_t k = k_line + (step_x == 1 ? d : d / step_x) + kernel[2] / 2;
                    if (k >= half) break;
                    const int32_t i = (int32_t)(lines->entries[at] & UINT32_MAX);
                    plan->nbr[k * n + o] = i;
                    plan->nbr[(group + k) * n + i] = (int32_t)o;
                    ++counts[k];
                }
            }
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
static int64_t probe_group(subm_plan *plan, const spconv_conv_params *params) {
    const int by_lines = plan->lines != NULL && plan->begin == 0 && plan->end == plan->group_size;
    const int num_threads = plan->in->num_threads;
    (void)num_threads; /* only the OpenMP pragmas read it */
    const int64_t n = plan->in->num_in, group = plan->group_size, used = plan->end - plan->begin;
    SPCONV_OMP(omp parallel for num_threads(num_threads) schedule(dynamic, 1))
    for (int64_t c = 0; c < plan->num_chunks; ++c) {
        int64_t begin, end;
        spconv__chunk_bounds(n, plan->num_chunks, c, &begin, &end);
        if (by_lines)
            probe_chunk_lines(plan, params, begin, end, plan->counts + c * group);
        else
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
    probe_group(plan, &rb->params);
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
        block->count = probe_group(plan, &rb->params);
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
        subm_plan plan = {&with, NULL, rb->in_shape, 0, 0, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL};
        st = plan_alloc(in->func, in->num_threads, rb, &plan);
        if (st == SPCONV_OK)
            st = plan.group_size >= rb->kernel_volume / 2 ? build_one_group(&plan, rb)
                                                           : build_in_groups(&plan, rb);
        plan_free(&plan);
    }
    spconv__site_table_free(&sites);
    return st;
}

spconv_status spconv__build_subm(const spconv__build_input *in, spconv_rulebook *rb) {
    rb->out_indices = rb->in_indices;
    spconv_tensor_retain(rb->out_indices);
    rb->num_out = rb->num_in;
    rb->center_is_identity = 1;
    if (rb->num_in == 0) return spconv__rulebook_alloc_pairs(rb); /* no pairs */
    if (rb->num_in <= rb->kernel_volume / 2 || rb->kernel_volume == 1 ||
        !spconv__site_lines_fit(rb->num_in, rb->batch_size, rb->in_shape))
        return build_with_table(in, rb);
    subm_plan plan = {in, NULL, rb->in_shape, 0, 0, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL};
    spconv_status st = plan_alloc(in->func, in->num_threads, rb, &plan);
    /* The line walk serves a build whose one group holds the whole kernel (3x3x3 always); the
     * index validates the rows as the table would. */
    if (st == SPCONV_OK && plan.group_size < rb->kernel_volume / 2) {
        plan_free(&plan);
        return build_with_table(in, rb);
    }
    spconv__site_lines lines = {0, 0, 0, NULL, NULL};
    if (st == SPCONV_OK)
        st = spconv__site_lines_build(in->func, in->num_threads, in->rows, rb->num_in,
                                      rb->batch_size, rb->in_shape, &lines);
    plan.lines = &lines;
    if (st == SPCONV_OK) st = build_one_group(&plan, rb);
    plan_free(&plan);
    spconv__site_lines_free(&lines);
    return st;
}
