/* Submanifold rulebooks. Outputs are the input sites. A neighbour table nbr[k][o] (input row
 * reaching output o through offset k, or -1) is filled by probing the hash table, then compacted
 * offset by offset in increasing o, so the result does not depend on the thread count.
 *
 * Symmetry halves the probes: the offsets of an odd kernel pair up as k and KV-1-k with opposite
 * displacements, so "input i reaches o through k" is "input o reaches i through KV-1-k". Only
 * k < KV/2 is probed and each hit fills both cells. The centre offset maps every row to itself
 * and needs no table. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/parallel.h"
#include "rulebook/build.h"
#include "spconv/tensor.h"

/* More chunks than threads, taken dynamically, evens out regions of different density. */
#define CHUNKS_PER_THREAD 8

typedef struct subm_plan {
    const spconv__build_input *in;
    const int64_t *shape;
    int64_t kernel_volume;
    int64_t *displacements; /* [KV / 2][3]: (z, y, x) step of each probed offset */
    int32_t *nbr;           /* [KV][num_in]; the centre row is unused */
} subm_plan;

static spconv_status plan_alloc(const char *func, const spconv_rulebook *rb, subm_plan *plan) {
    const int64_t kv = rb->kernel_volume, n = rb->num_in;
    SPCONV_RETURN_ERROR_IF(
        n > 0 && (uint64_t)kv > SIZE_MAX / sizeof(int32_t) / (uint64_t)n, SPCONV_ERR_OVERFLOW,
        "%s: a neighbour table of %" PRId64 " offsets x %" PRId64 " sites is too large", func, kv,
        n);
    plan->nbr = malloc((size_t)kv * (size_t)n * sizeof *plan->nbr);
    plan->displacements =
        plan->nbr == NULL ? NULL : malloc(((size_t)kv / 2 + 1) * 3 * sizeof *plan->displacements);
    if (plan->displacements == NULL || plan->nbr == NULL) {
        free(plan->displacements);
        free(plan->nbr);
        SPCONV_RETURN_ERROR(SPCONV_ERR_OUT_OF_MEMORY,
                            "%s: out of host memory for a neighbour table of %" PRId64
                            " offsets x %" PRId64 " sites",
                            func, kv, n);
    }
    const spconv_conv_params *params = &rb->params;
    for (int64_t k = 0; k < kv / 2; ++k) {
        int64_t split[3];
        spconv__kernel_offset_split(params->kernel, k, split);
        for (int axis = 0; axis < 3; ++axis)
            plan->displacements[3 * k + axis] =
                (split[axis] - params->kernel[axis] / 2) * params->dilation[axis];
    }
    return SPCONV_OK;
}

/* Start loading the slots that output o will probe. Issued one site ahead, their cache misses
 * overlap instead of each stalling the probe loop (a fifth less probe time on the real scan).
 * Coordinates outside the shape give meaningless keys, but still addresses inside the table. */
static void prefetch_probes(const subm_plan *plan, int64_t o) {
    const spconv__site_table *sites = plan->in->sites;
    const int32_t *row = plan->in->rows + 4 * o;
    for (int64_t k = 0; k < plan->kernel_volume / 2; ++k) {
        const int64_t *step = plan->displacements + 3 * k;
        const uint64_t key = spconv__key_pack(&sites->layout, row[0], row[1] + step[0],
                                              row[2] + step[1], row[3] + step[2]);
        __builtin_prefetch(&sites->hash.slots[spconv__hash_home(&sites->hash, key)]);
    }
}

/* Probe outputs [begin, end) at the offsets below the centre; counts[k] gets the hits of k and
 * of its mirror. */
static void probe_chunk(const subm_plan *plan, int64_t begin, int64_t end, int64_t *counts) {
    const spconv__site_table *sites = plan->in->sites;
    const int64_t kv = plan->kernel_volume, n = plan->in->num_in;
    const int64_t *shape = plan->shape;
    for (int64_t o = begin; o < end; ++o) {
        if (o + 1 < end) prefetch_probes(plan, o + 1);
        const int32_t *row = plan->in->rows + 4 * o;
        for (int64_t k = 0; k < kv / 2; ++k) {
            const int64_t *step = plan->displacements + 3 * k;
            const int64_t z = row[1] + step[0], y = row[2] + step[1], x = row[3] + step[2];
            if (z < 0 || z >= shape[0] || y < 0 || y >= shape[1] || x < 0 || x >= shape[2])
                continue;
            const int32_t i =
                spconv__hash_find(&sites->hash, spconv__key_pack(&sites->layout, row[0], z, y, x));
            if (i < 0) continue;
            plan->nbr[k * n + o] = i;
            plan->nbr[(kv - 1 - k) * n + i] = (int32_t)o;
            ++counts[k];
            ++counts[kv - 1 - k];
        }
    }
}

static void compact_offset(const subm_plan *plan, int64_t k, spconv_rulebook *rb) {
    const int64_t n = rb->num_in;
    int32_t *pairs_in = (int32_t *)spconv_tensor_data(rb->pairs_in) + rb->offsets[k];
    int32_t *pairs_out = (int32_t *)spconv_tensor_data(rb->pairs_out) + rb->offsets[k];
    if (k == plan->kernel_volume / 2) {
        for (int64_t o = 0; o < n; ++o) pairs_in[o] = pairs_out[o] = (int32_t)o;
        return;
    }
    const int32_t *column = plan->nbr + k * n;
    const int64_t count = rb->offsets[k + 1] - rb->offsets[k];
    int64_t o = 0, written = 0;
    /* Hits follow no pattern, so every cell is stored and only a hit advances; that is 3x faster
     * than a branch. It stops one hit short, as the store past the last hit would land in the
     * next offset's pairs, which another thread may be writing. */
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

/* Sum the per-chunk counts into rb->offsets (the centre has one pair per site). */
static void offsets_from_counts(const int64_t *counts, int64_t num_chunks, spconv_rulebook *rb) {
    const int64_t kv = rb->kernel_volume;
    rb->offsets[0] = 0;
    for (int64_t k = 0; k < kv; ++k) {
        int64_t total = k == kv / 2 ? rb->num_in : 0;
        for (int64_t c = 0; c < num_chunks; ++c) total += counts[c * kv + k];
        rb->offsets[k + 1] = rb->offsets[k] + total;
    }
}

static spconv_status fill_pairs(subm_plan *plan, spconv_rulebook *rb) {
    const int num_threads = plan->in->num_threads;
    const int64_t kv = rb->kernel_volume, n = rb->num_in;
    const int64_t num_chunks = (int64_t)num_threads * CHUNKS_PER_THREAD;
    int64_t *counts = calloc((size_t)(num_chunks * kv), sizeof *counts);
    SPCONV_RETURN_ERROR_IF(counts == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "%s: out of host memory for pair counts", plan->in->func);
    SPCONV_OMP(omp parallel for num_threads(num_threads) schedule(static))
    for (int64_t k = 0; k < kv; ++k)
        if (k != kv / 2) memset(plan->nbr + k * n, 0xff, (size_t)n * sizeof *plan->nbr);
    SPCONV_OMP(omp parallel for num_threads(num_threads) schedule(dynamic, 1))
    for (int64_t c = 0; c < num_chunks; ++c) {
        int64_t begin, end;
        spconv__chunk_bounds(n, num_chunks, c, &begin, &end);
        probe_chunk(plan, begin, end, counts + c * kv);
    }
    offsets_from_counts(counts, num_chunks, rb);
    free(counts);
    SPCONV_FORWARD_IF_ERROR(spconv__rulebook_alloc_pairs(rb));
    SPCONV_OMP(omp parallel for num_threads(num_threads) schedule(dynamic, 1))
    for (int64_t k = 0; k < kv; ++k) compact_offset(plan, k, rb);
    return SPCONV_OK;
}

spconv_status spconv__build_subm(const spconv__build_input *in, spconv_rulebook *rb) {
    rb->out_indices = rb->in_indices;
    spconv_tensor_retain(rb->out_indices);
    rb->num_out = rb->num_in;
    rb->center_is_identity = 1;
    if (rb->num_in == 0) return spconv__rulebook_alloc_pairs(rb); /* offsets are all zero */
    subm_plan plan = {in, rb->in_shape, rb->kernel_volume, NULL, NULL};
    SPCONV_FORWARD_IF_ERROR(plan_alloc(in->func, rb, &plan));
    const spconv_status st = fill_pairs(&plan, rb);
    free(plan.displacements);
    free(plan.nbr);
    return st;
}
