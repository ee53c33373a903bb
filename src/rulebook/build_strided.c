/* Regular and transposed rulebooks, found from the input side without probing:
 *  1. every (input row r, offset k) that reaches an output site o is a candidate with key
 *     pack(o) and value r << 32 | k;
 *  2. a stable radix sort on the keys brings each output site's candidates together, in
 *     (b, z, y, x) order;
 *  3. the distinct keys are the outputs, numbered in that order; per-(chunk, offset) counts and
 *     prefix sums place every pair, so each offset's pairs come out in increasing out_row (with
 *     more offsets than candidates, only the offsets that occur are counted).
 * An output and an offset determine the input, so the candidates of one output have distinct
 * offsets and no offset meets an output twice. The sorted candidates are a function of the input
 * rows alone, hence the rulebook is the same for any thread count. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/parallel.h"
#include "rulebook/axis_reach.h"
#include "rulebook/build.h"
#include "rulebook/radix_sort.h"
#include "spconv/tensor.h"

/* More chunks than threads, taken dynamically, so that a thread the OS preempts or a dense region
 * does not hold the others up; the chunking never changes the result. */
#define CHUNKS_PER_THREAD 4

typedef struct axis_rule {
    spconv__axis_geometry geo;
    /* Where the axis is short enough (AXIS_TABLE_MAX entries), the (k, o) lists of every input
     * coordinate, worked out once: count[c], then ks / os at c * room. NULL otherwise. */
    int64_t room;
    int32_t *count, *ks, *os;
} axis_rule;

#define AXIS_TABLE_MAX (INT64_C(1) << 20)
#define AXIS_TABLE_ROOM 64 /* widest kernel (in reachable outputs) given a table */

typedef struct strided_plan {
    const spconv__build_input *in;
    axis_rule axes[3];
    spconv__key_layout out_layout;
    int64_t num_chunks;
    int64_t *scratch;      /* per chunk: (k, o) lists of the three axes */
    int64_t scratch_len;   /* entries per chunk */
    int64_t *chunk_starts; /* [num_chunks + 1]: candidates per chunk, then their prefix sums */
    int64_t num_candidates;
    uint64_t *buffers[4]; /* keys, values and the sort's scratch copies */
    /* Every axis has at most one (k, o) per coordinate (a regular conv or pool whose windows do
     * not overlap: dilation 1, kernel <= stride), worked out by arithmetic, not lists. */
    int single;
    int64_t num_rows; /* rows that give candidates: [0, num_rows) */
} strided_plan;

/* The one (k, o) of coordinate c on an axis of a plan with `single`, or 0 where c reaches no
 * output: c + padding = o * stride + k with 0 <= k < kernel and o < out_size. */
static int axis_single_target(const axis_rule *rule, int64_t c, int64_t *k, int64_t *o) {
    const int64_t t = c + rule->geo.padding;
    *o = t / rule->geo.stride;
    *k = t - *o * rule->geo.stride;
    return *k < rule->geo.kernel && *o < rule->geo.out_size;
}

/* axis_single_target from the axis table where there is one: three loads instead of a
 * division (some 40 cycles for 64 bits), which was most of a pool's candidate generation. */
static int axis_single_lookup(const axis_rule *rule, int64_t c, int64_t *k, int64_t *o) {
    if (rule->count == NULL) return axis_single_target(rule, c, k, o);
    *k = rule->ks[c * rule->room];
    *o = rule->os[c * rule->room];
    return rule->count[c] != 0;
}

/* row_candidates for a plan with `single`: the row's one candidate, or none. */
static int64_t row_candidate_single(const strided_plan *plan, int64_t r, uint64_t *key,
                                    uint64_t *value) {
    const int32_t *row = plan->in->rows + 4 * r;
    int64_t k[3], o[3];
    if (!(axis_single_lookup(&plan->axes[0], row[1], &k[0], &o[0]) &
          axis_single_lookup(&plan->axes[1], row[2], &k[1], &o[1]) &
          axis_single_lookup(&plan->axes[2], row[3], &k[2], &o[2])))
        return 0;
    if (key != NULL) {
        *key = spconv__key_pack(&plan->out_layout, row[0], o[0], o[1], o[2]);
        const int64_t kh = plan->axes[1].geo.kernel, kw = plan->axes[2].geo.kernel;
        *value = (uint64_t)r << 32 | (uint64_t)((k[0] * kh + k[1]) * kw + k[2]);
    }
    return 1;
}

/* Most (k, o) pairs one coordinate can have on an axis: o moves strictly with k, so distinct
 * offsets reach distinct outputs, and there are no more than the kernel or the outputs. Sizing the
 * per-chunk scratch by this keeps a kernel far wider than the grid from costing its width. */
static int64_t axis_max_targets(const axis_rule *rule) {
    return rule->geo.kernel < rule->geo.out_size ? rule->geo.kernel : rule->geo.out_size;
}

/* The (k, o) pairs through which coordinate c reaches an output on one axis, in increasing k;
 * returns how many. */
static int64_t axis_targets(const axis_rule *rule, int64_t c, int64_t *ks, int64_t *os) {
    int64_t first, last, step, count = 0;
    if (!spconv__axis_reach(&rule->geo, c, &first, &last, &step)) return 0;
    for (int64_t k = first; k <= last; k += step) {
        ks[count] = k;
        os[count] = spconv__axis_output(&rule->geo, c, k);
        ++count;
    }
    return count;
}

/* The candidates of row r: counted only when keys is NULL, written otherwise. */
/* The (k, o) lists of coordinate c on every axis (from the tables where they exist, else into
 * @p scratch), as int64 in ks / os; returns the product of the counts. */
static int64_t row_targets(const strided_plan *plan, const int32_t *row, int64_t *scratch,
                           int64_t *ks[3], int64_t *os[3], int64_t counts[3]) {
    int64_t *cursor = scratch;
    for (int axis = 0; axis < 3; ++axis) {
        const axis_rule *rule = &plan->axes[axis];
        const int64_t room = axis_max_targets(rule);
        ks[axis] = cursor;
        os[axis] = cursor + room;
        cursor += 2 * room;
        if (rule->count != NULL) {
            const int64_t c = row[1 + axis];
            counts[axis] = rule->count[c];
            for (int64_t i = 0; i < counts[axis]; ++i) {
                ks[axis][i] = rule->ks[c * rule->room + i];
                os[axis][i] = rule->os[c * rule->room + i];
            }
        } else {
            counts[axis] = axis_targets(rule, row[1 + axis], ks[axis], os[axis]);
        }
    }
    return counts[0] * counts[1] * counts[2];
}

static int64_t row_candidates(const strided_plan *plan, int64_t r, int64_t *scratch, uint64_t *keys,
                              uint64_t *values) {
    const int32_t *row = plan->in->rows + 4 * r;
    int64_t *ks[3], *os[3], counts[3];
    if (keys == NULL) {
        /* Counting needs only the counts: three lookups where the tables exist. */
        if (plan->axes[0].count != NULL && plan->axes[1].count != NULL &&
            plan->axes[2].count != NULL)
            return (int64_t)plan->axes[0].count[row[1]] * plan->axes[1].count[row[2]] *
                   plan->axes[2].count[row[3]];
        return row_targets(plan, row, scratch, ks, os, counts);
    }
    const int64_t kh = plan->axes[1].geo.kernel, kw = plan->axes[2].geo.kernel;
    if (plan->axes[0].count != NULL && plan->axes[1].count != NULL &&
        plan->axes[2].count != NULL) {
        /* Straight from the tables: no copies of the lists. */
        const axis_rule *az = &plan->axes[0], *ay = &plan->axes[1], *ax = &plan->axes[2];
        const int32_t nz = az->count[row[1]], ny = ay->count[row[2]], nx = ax->count[row[3]];
        const int32_t *kzs = az->ks + row[1] * az->room, *ozs = az->os + row[1] * az->room;
        const int32_t *kys = ay->ks + row[2] * ay->room, *oys = ay->os + row[2] * ay->room;
        const int32_t *kxs = ax->ks + row[3] * ax->room, *oxs = ax->os + row[3] * ax->room;
        const uint64_t high = (uint64_t)r << 32;
        int64_t written = 0;
        for (int32_t a = 0; a < nz; ++a)
            for (int32_t b = 0; b < ny; ++b) {
                const uint64_t line_key =
                    spconv__key_pack(&plan->out_layout, row[0], ozs[a], oys[b], 0);
                const int64_t k_line = ((int64_t)kzs[a] * kh + kys[b]) * kw;
                for (int32_t c = 0; c < nx; ++c) {
                    keys[written] = line_key | spconv__key_pack(&plan->out_layout, 0, 0, 0, oxs[c]);
                    values[written] = high | (uint64_t)(k_line + kxs[c]);
                    ++written;
                }
            }
        return written;
    }
    row_targets(plan, row, scratch, ks, os, counts);
    int64_t written = 0;
    for (int64_t a = 0; a < counts[0]; ++a)
        for (int64_t b = 0; b < counts[1]; ++b)
            for (int64_t c = 0; c < counts[2]; ++c) {
                keys[written] =
                    spconv__key_pack(&plan->out_layout, row[0], os[0][a], os[1][b], os[2][c]);
                values[written] =
                    (uint64_t)r << 32 | (uint64_t)((ks[0][a] * kh + ks[1][b]) * kw + ks[2][c]);
                ++written;
            }
    return written;
}

static void chunk_candidates(const strided_plan *plan, int64_t chunk, int write) {
    int64_t begin, end;
    spconv__chunk_bounds(plan->num_rows, plan->num_chunks, chunk, &begin, &end);
    if (plan->single) {
        if (!write) {
            int64_t total = 0;
            for (int64_t r = begin; r < end; ++r) total += row_candidate_single(plan, r, NULL, NULL);
            plan->chunk_starts[chunk] = total;
            return;
        }
        int64_t pos = plan->chunk_starts[chunk];
        for (int64_t r = begin; r < end; ++r)
            pos += row_candidate_single(plan, r, plan->buffers[0] + pos, plan->buffers[1] + pos);
        return;
    }
    int64_t *scratch = plan->scratch + chunk * plan->scratch_len;
    if (!write) {
        int64_t total = 0;
        for (int64_t r = begin; r < end; ++r) total += row_candidates(plan, r, scratch, NULL, NULL);
        plan->chunk_starts[chunk] = total;
        return;
    }
    int64_t pos = plan->chunk_starts[chunk];
    for (int64_t r = begin; r < end; ++r)
        pos += row_candidates(plan, r, scratch, plan->buffers[0] + pos, plan->buffers[1] + pos);
}

static spconv_status generate_candidates(strided_plan *plan) {
    const char *func = plan->in->func;
    const int num_threads = plan->in->num_threads;
    (void)num_threads; /* only the OpenMP pragmas read it */
    SPCONV_OMP(omp parallel for num_threads(num_threads) schedule(dynamic, 1))
    for (int64_t c = 0; c < plan->num_chunks; ++c) chunk_candidates(plan, c, 0);
    int64_t total = 0;
    for (int64_t c = 0; c <= plan->num_chunks; ++c) {
        const int64_t count = c < plan->num_chunks ? plan->chunk_starts[c] : 0;
        plan->chunk_starts[c] = total;
        total += count;
    }
    plan->num_candidates = total;
    SPCONV_RETURN_ERROR_IF((uint64_t)total > SIZE_MAX / sizeof(uint64_t), SPCONV_ERR_OVERFLOW,
                           "%s: %" PRId64 " candidate pairs are too many", func, total);
    for (int b = 0; b < 4; ++b) {
        plan->buffers[b] = malloc((size_t)(total > 0 ? total : 1) * sizeof(uint64_t));
        SPCONV_RETURN_ERROR_IF(plan->buffers[b] == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                               "%s: out of host memory for %" PRId64 " candidate pairs", func,
                               total);
    }
    SPCONV_OMP(omp parallel for num_threads(num_threads) schedule(dynamic, 1))
    for (int64_t c = 0; c < plan->num_chunks; ++c) chunk_candidates(plan, c, 1);
    return SPCONV_OK;
}

static int is_head(const uint64_t *keys, int64_t j) { return j == 0 || keys[j] != keys[j - 1]; }

/* Most offsets whose repeats check_sorted_sites tracks with one bit each. */
#define SORTED_CHECK_MAX_OFFSETS 64

/* In a plan with `single`, two rows of one site give the same (output, offset), so they lie in
 * that output's run of the sorted candidates, in increasing row (the sort is stable), the
 * site's smallest row first. Over the runs whose head is in [begin, end): the smallest row that
 * repeats an earlier one (*repeat, unchanged when none is smaller) and that site's first row
 * (*owner). Linear: a run is read once, whatever its length. */
static void chunk_repeats(const uint64_t *keys, const uint64_t *values, int64_t n, int64_t begin,
                          int64_t end, int64_t *repeat, int64_t *owner) {
    int64_t j = begin;
    while (j < end && !is_head(keys, j)) ++j;
    while (j < end) {
        uint64_t seen = 0;
        int64_t first[SORTED_CHECK_MAX_OFFSETS];
        int64_t t = j;
        do {
            const uint64_t k = values[t] & UINT32_MAX;
            const int64_t r = (int64_t)(values[t] >> 32);
            if (seen >> k & 1) {
                if (r < *repeat) {
                    *repeat = r;
                    *owner = first[k];
                }
            } else {
                seen |= UINT64_C(1) << k;
                first[k] = r;
            }
            ++t;
        } while (t < n && keys[t] == keys[j]);
        j = t;
    }
}

/* The rows' checks for a plan with `single` whose every row gave a candidate: the first
 * repeated row, else the first out-of-range row (rows [num_rows, num_in) were left out), with
 * the site table's messages; the same row is named whatever the thread count. */
static spconv_status check_sorted_sites(const strided_plan *plan, const uint64_t *keys,
                                        const uint64_t *values) {
    const spconv__build_input *in = plan->in;
    const int num_threads = in->num_threads;
    (void)num_threads; /* only the OpenMP pragmas read it */
    const int64_t n = plan->num_candidates;
    int64_t repeat = n, owner = -1;
    SPCONV_OMP(omp parallel num_threads(num_threads) if(n > 16384))
    {
        int64_t mine = n, my_owner = -1;
        SPCONV_OMP(omp for schedule(dynamic, 1))
        for (int64_t c = 0; c < plan->num_chunks; ++c) {
            int64_t begin, end;
            spconv__chunk_bounds(n, plan->num_chunks, c, &begin, &end);
            chunk_repeats(keys, values, n, begin, end, &mine, &my_owner);
        }
        SPCONV_OMP(omp critical(spconv_strided_repeat))
        if (mine < repeat) {
            repeat = mine;
            owner = my_owner;
        }
    }
    if (repeat < n) return spconv__report_duplicate(in->func, in->rows + 4 * repeat, repeat, owner);
    if (plan->num_rows < in->num_in)
        return spconv__report_out_of_range(in->func, in->rows + 4 * plan->num_rows,
                                           plan->num_rows, in->shape, in->batch_size);
    return SPCONV_OK;
}

static void count_sorted_chunk(const uint64_t *keys, const uint64_t *values, int64_t begin,
                               int64_t end, int64_t *heads, int64_t *pair_counts) {
    int64_t count = 0;
    for (int64_t j = begin; j < end; ++j) {
        count += is_head(keys, j);
        ++pair_counts[values[j] & UINT32_MAX];
    }
    *heads = count;
}

/* heads[c] becomes the number of outputs before chunk c, next[c * row + slot] the position of
 * chunk c's first pair of that slot, starts[slot] the slot's first pair (starts[num_slots]: all
 * pairs); fills rb->num_out. */
static void place_pairs(int64_t num_chunks, int64_t num_slots, int64_t row, int64_t *heads,
                        int64_t *next, int64_t *starts, spconv_rulebook *rb) {
    int64_t outputs = 0;
    for (int64_t c = 0; c < num_chunks; ++c) {
        const int64_t count = heads[c];
        heads[c] = outputs;
        outputs += count;
    }
    rb->num_out = outputs;
    int64_t running = 0;
    for (int64_t k = 0; k < num_slots; ++k) {
        starts[k] = running;
        for (int64_t c = 0; c < num_chunks; ++c) {
            const int64_t count = next[c * row + k];
            next[c * row + k] = running;
            running += count;
        }
    }
    starts[num_slots] = running;
}

static void write_sorted_chunk(const strided_plan *plan, const uint64_t *keys,
                               const uint64_t *values, int64_t begin, int64_t end,
                               int64_t outputs_before, int64_t *next, spconv_rulebook *rb) {
    int32_t *out_rows = spconv_tensor_data(rb->out_indices);
    int32_t *pairs_in = spconv_tensor_data(rb->pairs_in);
    int32_t *pairs_out = spconv_tensor_data(rb->pairs_out);
    int64_t out_row = outputs_before - 1; /* a chunk may start inside the previous output */
    for (int64_t j = begin; j < end; ++j) {
        if (is_head(keys, j))
            spconv__key_unpack(&plan->out_layout, keys[j], out_rows + 4 * ++out_row);
        const int64_t pos = next[values[j] & UINT32_MAX]++;
        pairs_in[pos] = (int32_t)(values[j] >> 32);
        pairs_out[pos] = (int32_t)out_row;
    }
}

/* A kernel with more offsets than candidates (255^3 on a few sites) would make even one counter
 * per offset outweigh the pairs. Number the offsets that occur instead: sort the candidates'
 * offsets, list the distinct ones in *slot_offsets (increasing), and replace each candidate's
 * offset by its number, so that the counters below have one entry per occurring offset. */
static spconv_status number_offsets(const strided_plan *plan, int64_t kernel_volume,
                                    uint64_t *values, int64_t n, int64_t **slot_offsets,
                                    int64_t *num_slots) {
    const char *func = plan->in->func;
    uint64_t *buffers[4];
    spconv_status st = SPCONV_OK;
    for (int b = 0; b < 4; ++b) buffers[b] = malloc((size_t)(n > 0 ? n : 1) * sizeof(uint64_t));
    *slot_offsets = malloc((size_t)(n > 0 ? n : 1) * sizeof **slot_offsets);
    if (buffers[0] == NULL || buffers[1] == NULL || buffers[2] == NULL || buffers[3] == NULL ||
        *slot_offsets == NULL)
        SPCONV_FAIL_GOTO(st, done, SPCONV_ERR_OUT_OF_MEMORY,
                         "%s: out of host memory for the offsets of %" PRId64 " candidates", func,
                         n);
    for (int64_t j = 0; j < n; ++j) {
        buffers[0][j] = values[j] & UINT32_MAX;
        buffers[1][j] = (uint64_t)j;
    }
    uint64_t *ks, *where;
    SPCONV_TRY_GOTO(st,
                    spconv__radix_sort(func, plan->in->num_threads, n,
                                       spconv__key_bits_for(kernel_volume),
                                       buffers[0], buffers[1], buffers[2], buffers[3], &ks,
                                       &where),
                    done);
    int64_t slots = 0;
    for (int64_t t = 0; t < n; ++t) {
        if (t == 0 || ks[t] != ks[t - 1]) (*slot_offsets)[slots++] = (int64_t)ks[t];
        values[where[t]] = (values[where[t]] & ~(uint64_t)UINT32_MAX) | (uint64_t)(slots - 1);
    }
    *num_slots = slots;
done:
    for (int b = 0; b < 4; ++b) free(buffers[b]);
    return st;
}

static spconv_status emit_rulebook(const strided_plan *plan, const uint64_t *keys,
                                   uint64_t *values, spconv_rulebook *rb) {
    const char *func = plan->in->func;
    const int num_threads = plan->in->num_threads;
    (void)num_threads; /* only the OpenMP pragmas read it */
    const int64_t kv = rb->kernel_volume, n = plan->num_candidates;
    int64_t num_slots = kv, *slot_offsets = NULL, *heads = NULL, *next = NULL, *starts = NULL;
    spconv_status st = SPCONV_OK;
    if (kv > n) SPCONV_TRY_GOTO(st, number_offsets(plan, kv, values, n, &slot_offsets, &num_slots), done);
    /* Per-(chunk, slot) counters are num_chunks x slots: with one set per chunk of every thread
     * a 255^3 kernel on 5 sites asked for 0.5 GB per thread. Fewer chunks when the slots are many
     * against the candidates keep them within the candidates' count, whatever the thread count
     * (slots <= candidates, from number_offsets). */
    int64_t num_chunks = plan->num_chunks;
    const int64_t per_slot = num_slots > 0 ? n / num_slots : 1;
    if (num_chunks > per_slot) num_chunks = per_slot > 1 ? per_slot : 1;
    /* Each chunk's counters on cache lines of their own: two threads counting into one line
     * (the 8 counters of a pool's 2x2x2 kernel span two lines where they fall) pass it back and
     * forth on every pair. */
    const int64_t row = (num_slots + 7) / 8 * 8;
    const size_t next_bytes = ((size_t)(num_chunks * row) + 1) * sizeof *next;
    heads = malloc((size_t)num_chunks * sizeof *heads);
    next = aligned_alloc(64, (next_bytes + 63) & ~(size_t)63);
    if (next != NULL) memset(next, 0, next_bytes);
    starts = malloc((size_t)(num_slots + 1) * sizeof *starts);
    if (heads == NULL || next == NULL || starts == NULL)
        SPCONV_FAIL_GOTO(st, done, SPCONV_ERR_OUT_OF_MEMORY,
                         "%s: out of host memory for pair counts", func);
    SPCONV_OMP(omp parallel for num_threads(num_threads) schedule(dynamic, 1))
    for (int64_t c = 0; c < num_chunks; ++c) {
        int64_t begin, end;
        spconv__chunk_bounds(n, num_chunks, c, &begin, &end);
        count_sorted_chunk(keys, values, begin, end, heads + c, next + c * row);
    }
    place_pairs(num_chunks, num_slots, row, heads, next, starts, rb);
    if (rb->num_out > INT32_MAX)
        SPCONV_FAIL_GOTO(st, done, SPCONV_ERR_OVERFLOW,
                         "%s: %" PRId64 " output sites exceed int32 row numbers", func,
                         rb->num_out);
    SPCONV_TRY_GOTO(st, spconv__rulebook_set_offsets(func, rb, num_slots, slot_offsets, starts),
                    done);
    const int64_t out_sizes[2] = {rb->num_out, 4};
    SPCONV_TRY_GOTO(
        st, spconv_tensor_empty(spconv_cpu(), SPCONV_I32, 2, out_sizes, &rb->out_indices), done);
    SPCONV_TRY_GOTO(st, spconv__rulebook_alloc_pairs(rb), done);
    SPCONV_OMP(omp parallel for num_threads(num_threads) schedule(dynamic, 1))
    for (int64_t c = 0; c < num_chunks; ++c) {
        int64_t begin, end;
        spconv__chunk_bounds(n, num_chunks, c, &begin, &end);
        write_sorted_chunk(plan, keys, values, begin, end, heads[c], next + c * row, rb);
    }
done:
    free(slot_offsets);
    free(heads);
    free(next);
    free(starts);
    return st;
}

/* The (k, o) lists of every coordinate of an input axis of @p size, when they fit the table. */
static spconv_status axis_table(const char *func, int64_t size, axis_rule *rule) {
    rule->room = axis_max_targets(rule);
    rule->count = rule->ks = rule->os = NULL;
    if (size <= 0 || rule->room <= 0 || rule->room > AXIS_TABLE_ROOM ||
        size > AXIS_TABLE_MAX / rule->room)
        return SPCONV_OK;
    /* Zeroed: a coordinate of no target still has defined (unused) first entries. */
    rule->count = malloc((size_t)size * sizeof *rule->count);
    rule->ks = calloc((size_t)(size * rule->room), sizeof *rule->ks);
    rule->os = calloc((size_t)(size * rule->room), sizeof *rule->os);
    SPCONV_RETURN_ERROR_IF(rule->count == NULL || rule->ks == NULL || rule->os == NULL,
                           SPCONV_ERR_OUT_OF_MEMORY,
                           "%s: out of host memory for an axis table of %" PRId64 " coordinates",
                           func, size);
    int64_t ks[AXIS_TABLE_ROOM], os[AXIS_TABLE_ROOM];
    for (int64_t c = 0; c < size; ++c) {
        const int64_t count = axis_targets(rule, c, ks, os);
        rule->count[c] = (int32_t)count;
        for (int64_t i = 0; i < count; ++i) {
            rule->ks[c * rule->room + i] = (int32_t)ks[i];
            rule->os[c * rule->room + i] = (int32_t)os[i];
        }
    }
    return SPCONV_OK;
}

static spconv_status plan_init(const spconv__build_input *in, const spconv_rulebook *rb,
                               strided_plan *plan) {
    const spconv_conv_params *params = &rb->params;
    plan->in = in;
    plan->scratch_len = 0;
    plan->single = params->kind != SPCONV_CONV_TRANSPOSED;
    for (int axis = 0; axis < 3; ++axis) {
        const spconv__axis_geometry geo = {params->kernel[axis],   params->stride[axis],
                                           params->padding[axis],  params->dilation[axis],
                                           rb->out_shape[axis],
                                           params->kind == SPCONV_CONV_TRANSPOSED};
        plan->axes[axis] = (axis_rule){geo, 0, NULL, NULL, NULL};
        plan->scratch_len += 2 * axis_max_targets(&plan->axes[axis]);
        plan->single &= params->dilation[axis] == 1 && params->kernel[axis] <= params->stride[axis];
        SPCONV_FORWARD_IF_ERROR(axis_table(in->func, in->shape[axis], &plan->axes[axis]));
    }
    SPCONV_FORWARD_IF_ERROR(
        spconv__key_layout_checked(in->func, "output", rb->batch_size, rb->out_shape,
                                   &plan->out_layout));
    plan->num_chunks = (int64_t)in->num_threads * CHUNKS_PER_THREAD;
    if (plan->num_chunks > in->num_in) plan->num_chunks = in->num_in > 0 ? in->num_in : 1;
    plan->scratch = malloc((size_t)(plan->num_chunks * plan->scratch_len) * sizeof *plan->scratch);
    plan->chunk_starts = malloc((size_t)(plan->num_chunks + 1) * sizeof *plan->chunk_starts);
    SPCONV_RETURN_ERROR_IF(plan->scratch == NULL || plan->chunk_starts == NULL,
                           SPCONV_ERR_OUT_OF_MEMORY,
                           "%s: out of host memory for the per-axis (offset, output) lists of "
                           "%" PRId64 " chunks of rows (%" PRId64 " entries each)",
                           in->func, plan->num_chunks, plan->scratch_len);
    return SPCONV_OK;
}

static void plan_free(strided_plan *plan) {
    for (int axis = 0; axis < 3; ++axis) {
        free(plan->axes[axis].count);
        free(plan->axes[axis].ks);
        free(plan->axes[axis].os);
    }
    free(plan->scratch);
    free(plan->chunk_starts);
    for (int b = 0; b < 4; ++b) free(plan->buffers[b]);
}

spconv_status spconv__build_strided(const spconv__build_input *in, spconv_rulebook *rb) {
    strided_plan plan = {0};
    spconv_status st;
    SPCONV_TRY_GOTO(st, plan_init(in, rb, &plan), done);
    /* Windows that do not overlap (a pool of kernel == stride) make each in-range row exactly one
     * candidate or none, and a repeated site a repeated (output, offset) in the sorted
     * candidates: the rows are checked there, in one pass over what the sort leaves, instead of
     * in an index of their own. Otherwise, or where some row reaches no output (it would go
     * unchecked), they are validated first. */
    int validated = in->rows_valid;
    plan.num_rows = in->num_in;
    if (validated) {
        /* Known valid (the sites of a rulebook built before, spconv_rulebook_build_on), so the
         * index that finds repeats is skipped; the range is still checked, one pass over the
         * rows: a caller that wrote into them anyway (a binding cannot see every write) gets the
         * range error, not keys packed from coordinates outside the shape. A repeat left unseen
         * repeats pairs, within the arrays. */
        const int64_t bad = spconv__first_out_of_range(in->num_threads, in->rows, in->num_in,
                                                       in->shape, in->batch_size);
        if (bad < in->num_in) {
            st = spconv__report_out_of_range(in->func, in->rows + 4 * bad, bad, in->shape,
                                             in->batch_size);
            goto done;
        }
    } else if (plan.single && rb->kernel_volume <= SORTED_CHECK_MAX_OFFSETS) {
        plan.num_rows = spconv__first_out_of_range(in->num_threads, in->rows, in->num_in,
                                                   in->shape, in->batch_size);
    } else {
        SPCONV_TRY_GOTO(st, spconv__validate_rows(in), done);
        validated = 1;
    }
    SPCONV_TRY_GOTO(st, generate_candidates(&plan), done);
    if (!validated && plan.num_candidates < plan.num_rows) {
        SPCONV_TRY_GOTO(st, spconv__validate_rows(in), done);
        validated = 1;
    }
    uint64_t *keys, *values;
    SPCONV_TRY_GOTO(st,
                    spconv__radix_sort(in->func, in->num_threads, plan.num_candidates,
                                       plan.out_layout.total_bits, plan.buffers[0], plan.buffers[1],
                                       plan.buffers[2], plan.buffers[3], &keys, &values),
                    done);
    if (!validated) SPCONV_TRY_GOTO(st, check_sorted_sites(&plan, keys, values), done);
    st = emit_rulebook(&plan, keys, values, rb);
done:
    plan_free(&plan);
    return st;
}
