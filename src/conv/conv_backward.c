/* indice_conv backward on the CPU, and the dispatcher of spconv_conv_backward:
 *   grad_features = sum over k, increasing, of scatter(gather(grad_out, out rows) @ W[k]^T,
 *                   in rows)
 *   grad_weight[k] = gather(features, in rows)^T @ gather(grad_out, out rows)
 *   grad_bias = column sums of grad_out.
 * Two phases, each parallel on its own terms:
 *  - the data gradient is target-stationary (conv_cpu.h) over blocks of input rows, with the pairs
 *    sorted by in row: with the fused kernels (fused.h) an element's value does not depend on its
 *    block, so blocks follow the thread count; unfused, they follow the sizes alone;
 *  - the weight gradient is one task per (offset, segment of its pairs), segments of a fixed
 *    number of pairs: a task sums its segment in pair order, chunk by chunk, into its own buffer
 *    (segment 0 straight into grad_weight[k]), and after a barrier each offset adds its other
 *    segments in order. Bounds depend on the sizes alone, so the sums do not depend on the thread
 *    count, and small layers with big kernels still keep every core busy.
 * Joint mode (fused kernels, a weight gradient, many input rows): the weight gradient is computed
 * inside the data gradient's blocks, offset by offset right after the block's data-gradient
 * product, from the same pairs: their grad_out rows have just been read and their feature rows
 * are the block's own, still in cache for the next offset. Gathering those rows from memory was
 * half of the separate weight gradient's gather. When only d_weight is asked for, the same
 * blocks run without the data gradient, so that its bits do not depend on whether d_features is
 * computed beside it. Blocks and segments (runs of consecutive blocks,
 * one task each) are fixed by the sizes alone; a segment sums its blocks in order into its own
 * buffers. The last eighth of the rows is not a segment but small tasks that any thread takes
 * (its data-gradient blocks, and per offset the weight gradient of its pairs, read from memory),
 * so that the threads finish the layer together rather than one waiting for the other's last
 * segment. After a barrier the segments and the tail are added in order, so the sums still do
 * not depend on the thread count. */
#include <string.h>

#include "conv/conv_check.h"
#include "conv/conv_cpu.h"
#include "conv/half.h"
#include "conv/fused.h"
#include "core/backend.h"
#include "core/cpu_kernels.h"
#include "core/error.h"
#include "tensor/tensor_impl.h"

/* Rows per block of the bias-gradient column sums, and elements per block of the reductions. */
#define BIAS_BLOCK_ROWS 4096
#define REDUCE_BLOCK 4096
/* Pairs per weight-gradient segment: one offset of a 125k-site subm layer is one segment, and a
 * 1x1 conv over many rows still splits into a few tasks. */
#define SEGMENT_PAIRS 32768
/* Fewest input rows per data-gradient block with the fused kernels (see the forward's). */
#define FUSED_MIN_BLOCK_ROWS 64
/* Joint mode: from this many input rows on, in JOINT_SEGMENTS segments and a tail of
 * 1 / JOINT_TAIL of the blocks; the partial sums take at most JOINT_PARTIAL_BYTES (fewer
 * segments otherwise). It saves about half of the rows the weight gradient gathers (c_in + c_out
 * elements a pair) and costs zeroing and adding the partial sums (segments x active offsets x
 * c_in x c_out elements), which goes to memory when they outgrow the caches: measured on
 * `basic` (AMD EPYC, 8 MiB L3, 2 threads), its 128-channel layers (23x more of the first than of
 * the second) gained 6-10 ms each, its 160-channel layers (7x) less than 1 ms (gather -3.6 ms,
 * zeroing and adding +2.8 ms): joint mode needs JOINT_MIN_GAIN times more, just above those. */
#define JOINT_MIN_ROWS 8192
#define JOINT_SEGMENTS 7
#define JOINT_TAIL 8
#define JOINT_PARTIAL_BYTES ((size_t)32 << 20)
#define JOINT_MIN_GAIN 8
#define JOINT_MIN_BLOCKS 64

typedef struct backward_args {
    const spconv__conv_plan *plan;
    spconv__pair_lists pairs; /* data gradient: source = out rows, target = in rows (sorted) */
    const int32_t *rb_in, *rb_out; /* the rulebook's own pairs, by active offset: weight gradient */
    const int64_t *rb_starts;
    const char *features;     /* [num_in, C_in] contiguous */
    const char *weight;       /* [KV, C_in, C_out] contiguous (unfused data gradient) */
    spconv__weight_view w;    /* the weight as the fused data gradient reads it (conv_cpu.h) */
    const char *grad_out;     /* [num_out, C_out] contiguous */
    char *grad_in;            /* [num_in, C_in] or NULL */
    char *grad_weight;        /* [KV, C_in, C_out] or NULL */
    char *grad_bias;          /* [C_out] or NULL */
    double *bias_partials;    /* [bias blocks, C_out] */
    int64_t block_rows, blocks;
    int joint;                /* the weight gradient inside the data gradient's blocks */
    /* joint: segment s < segments is blocks [s * segment_blocks, ...) below tail_block; the
     * tail, blocks [tail_block, blocks), sums its weight gradient as segment `segments` */
    int64_t segments, segment_blocks, tail_block;
    int64_t *task_first;      /* [num_active + 1]: offset j's weight tasks are
                                 [task_first[j], task_first[j + 1]) */
    int64_t num_tasks;
    char *partials;           /* [num_tasks - num_active][C_in, C_out]: segments 1..; joint:
                                 [segments][num_active][C_in, C_out], segments 1.. and tail */
    char *workspace; /* thread t owns [t * thread_bytes, (t + 1) * thread_bytes) */
    size_t thread_bytes;
    char *packed; /* fused data gradient: W[k]^T of active offset j packed at j * packed_bytes */
    size_t packed_bytes;
    int64_t bounds_entries;  /* of pairs.bounds, 0 without one */
    int64_t *bounds_scratch; /* with pairs.bounds: the searches' upper ends, the same layout */
} backward_args;

static void add_into(spconv_dtype dtype, void *dst, const void *src, int64_t n) {
    if (dtype == SPCONV_F32) {
        float *restrict d = dst;
        const float *restrict s = src;
        for (int64_t i = 0; i < n; ++i) d[i] += s[i];
    } else {
        double *restrict d = dst;
        const double *restrict s = src;
        for (int64_t i = 0; i < n; ++i) d[i] += s[i];
    }
}

/* Column sums of grad_out in double: blocks of rows in parallel, then the blocks in order. */
static void bias_gradient(const backward_args *a) {
    const spconv__conv_plan *plan = a->plan;
    const int64_t cols = plan->c_out,
                  blocks = (plan->num_out + BIAS_BLOCK_ROWS - 1) / BIAS_BLOCK_ROWS;
    SPCONV_OMP(omp for schedule(static))
    for (int64_t blk = 0; blk < blocks; ++blk) {
        double *sums = a->bias_partials + blk * cols;
        for (int64_t j = 0; j < cols; ++j) sums[j] = 0.0;
        int64_t end = (blk + 1) * BIAS_BLOCK_ROWS < plan->num_out ? (blk + 1) * BIAS_BLOCK_ROWS
                                                                  : plan->num_out;
        for (int64_t r = blk * BIAS_BLOCK_ROWS; r < end; ++r) {
            const char *row = a->grad_out + (size_t)(r * cols) * plan->elem;
            if (plan->dtype == SPCONV_F32)
                for (int64_t j = 0; j < cols; ++j) sums[j] += ((const float *)row)[j];
            else
                for (int64_t j = 0; j < cols; ++j) sums[j] += ((const double *)row)[j];
        }
    }
    SPCONV_OMP(omp single)
    for (int64_t j = 0; j < cols; ++j) {
        double total = 0.0;
        for (int64_t blk = 0; blk < blocks; ++blk) total += a->bias_partials[blk * cols + j];
        if (plan->dtype == SPCONV_F32)
            ((float *)a->grad_bias)[j] = (float)total;
        else
            ((double *)a->grad_bias)[j] = total;
    }
}

/* ---- data gradient ------------------------------------------------------------------------------ */

/* Sorted pairs [first, first + rows), all of offset k, unfused: gather their grad_out rows,
 * multiply by W[k]^T, add into their d_features rows. */
static void data_chunk(const backward_args *a, int64_t k, int64_t first, int64_t rows,
                       spconv__phase_clock *clock, char *buffer) {
    const spconv__conv_plan *plan = a->plan;
    const size_t in_row = (size_t)plan->c_in * plan->elem,
                 out_row = (size_t)plan->c_out * plan->elem;
    const char *w_k = a->weight + (size_t)k * in_row * (size_t)plan->c_out;
    const int32_t *out_rows = a->pairs.source + first, *in_rows = a->pairs.target + first;
    char *g_buf = buffer, *d_buf = g_buf + spconv__align_line((size_t)plan->chunk * out_row);
    double mark = spconv__clock_start(clock);
    spconv__gather_rows(g_buf, a->grad_out, out_rows, rows, out_row);
    spconv__clock_lap(clock, &mark, &clock->gather_s);
    spconv__gemm(plan->dtype, plan->gemm, 0, 1, rows, plan->c_in, plan->c_out, g_buf, plan->c_out,
                 w_k, plan->c_out, 0, d_buf, plan->c_in);
    spconv__clock_lap(clock, &mark, &clock->gemm_s);
    spconv__scatter_add_rows(plan->dtype, a->grad_in, in_rows, d_buf, rows, plan->c_in);
    spconv__clock_lap(clock, &mark, &clock->scatter_s);
}

/* Joint mode: where segment @p segment sums active offset j's weight gradient. */
static char *joint_sums(const backward_args *a, int64_t segment, int64_t j) {
    const size_t sum_bytes = (size_t)(a->plan->c_in * a->plan->c_out) * a->plan->elem;
    if (segment == 0) return a->grad_weight + (size_t)a->pairs.active[j] * sum_bytes;
    return a->partials + (size_t)((segment - 1) * a->pairs.num_active + j) * sum_bytes;
}

/* Joint mode: sums += x[t_i]^T g[s_i] over @p count pairs (t_i = target[i], or t_base + i when
 * @p target is NULL; s_i likewise), chunk by chunk in order. */
static void joint_weight(const backward_args *a, int64_t count, const int32_t *target,
                         int64_t t_base, const int32_t *source, int64_t s_base, char *sums,
                         spconv__phase_clock *clock, char *buffer) {
    const spconv__conv_plan *plan = a->plan;
    for (int64_t i = 0; i < count; i += plan->chunk) {
        const int64_t rows = count - i < plan->chunk ? count - i : plan->chunk;
        double mark = spconv__clock_start(clock);
        spconv__fused_weight_gather(plan->dtype, rows, a->features,
                                    target != NULL ? target + i : NULL, t_base + i, a->grad_out,
                                    source != NULL ? source + i : NULL, s_base + i, plan->c_in,
                                    plan->c_out, buffer);
        spconv__clock_lap(clock, &mark, &clock->gather_s);
        spconv__fused_weight_product(plan->dtype, rows, a->features,
                                     target != NULL ? target + i : NULL, t_base + i, plan->c_in,
                                     plan->c_out, buffer, sums);
        spconv__clock_lap(clock, &mark, &clock->gemm_s);
    }
}

/* In rows [r0, r1) of d_features: from zero through every offset in increasing k; in joint mode
 * (@p segment >= 0) each offset's weight gradient over the same pairs too, into the segment's
 * sums (and only that when no d_features is asked for). */
static void data_block(const backward_args *a, int64_t r0, int64_t r1, int64_t segment,
                       spconv__phase_clock *clock, char *buffer) {
    const spconv__conv_plan *plan = a->plan;
    const size_t in_row = (size_t)plan->c_in * plan->elem,
                 out_row = (size_t)plan->c_out * plan->elem;
    const int data = a->grad_in != NULL;
    double mark = spconv__clock_start(clock);
    if (data) memset(a->grad_in + (size_t)r0 * in_row, 0, (size_t)(r1 - r0) * in_row);
    spconv__clock_lap(clock, &mark, &clock->scatter_s);
    /* Without channels on either side every product is empty: zeros are the answer. */
    for (int64_t j = 0; j < a->pairs.num_active && plan->c_in > 0 && plan->c_out > 0; ++j) {
        const int64_t k = a->pairs.active[j];
        const char *packed = a->packed + (size_t)j * a->packed_bytes;
        if (k == plan->identity_k) { /* the same rows of both: no gather or scatter */
            mark = spconv__clock_start(clock);
            if (!data)
                ; /* joint mode, weight gradient only */
            else if (plan->fused)
                spconv__fused_rows(plan->dtype, r1 - r0, a->grad_out, NULL, r0, a->grad_in, NULL,
                                   r0, plan->c_out, plan->c_in, packed, 0);
            else
                spconv__gemm(plan->dtype, plan->gemm, 0, 1, r1 - r0, plan->c_in, plan->c_out,
                             a->grad_out + (size_t)r0 * out_row, plan->c_out,
                             a->weight + (size_t)k * in_row * (size_t)plan->c_out, plan->c_out, 1,
                             a->grad_in + (size_t)r0 * in_row, plan->c_in);
            spconv__clock_lap(clock, &mark, &clock->gemm_s);
            if (segment >= 0)
                joint_weight(a, r1 - r0, NULL, r0, NULL, r0, joint_sums(a, segment, j), clock,
                             buffer);
            continue;
        }
        int64_t first, end;
        spconv__pairs_range(&a->pairs, j, r0, r1, &first, &end);
        if (plan->fused) {
            mark = spconv__clock_start(clock);
            if (data)
                spconv__fused_rows(plan->dtype, end - first, a->grad_out,
                                   a->pairs.source + first, 0, a->grad_in,
                                   a->pairs.target + first, 0, plan->c_out, plan->c_in, packed, 0);
            spconv__clock_lap(clock, &mark, &clock->gemm_s);
            if (segment >= 0)
                joint_weight(a, end - first, a->pairs.target + first, 0, a->pairs.source + first,
                             0, joint_sums(a, segment, j), clock, buffer);
            continue;
        }
        for (; first < end; first += plan->chunk)
            data_chunk(a, k, first, end - first < plan->chunk ? end - first : plan->chunk, clock,
                       buffer);
    }
}

/* ---- weight gradient ---------------------------------------------------------------------------- */

/* Task t of active offset j: pairs [p0, p1) of the offset's rulebook segment summed into @p sums
 * (zeroed first), chunk by chunk in pair order. */
static void weight_task(const backward_args *a, int64_t j, int64_t p0, int64_t p1, char *sums,
                        spconv__phase_clock *clock, char *buffer) {
    const spconv__conv_plan *plan = a->plan;
    const size_t in_row = (size_t)plan->c_in * plan->elem,
                 out_row = (size_t)plan->c_out * plan->elem;
    double mark = spconv__clock_start(clock);
    memset(sums, 0, (size_t)(plan->c_in * plan->c_out) * plan->elem);
    spconv__clock_lap(clock, &mark, &clock->scatter_s);
    if (plan->fused) { /* chunks gathered and multiplied by the fused kernels (fused.h) */
        const int identity = a->pairs.active[j] == plan->identity_k;
        for (int64_t first = p0; first < p1; first += plan->chunk) {
            const int64_t rows = p1 - first < plan->chunk ? p1 - first : plan->chunk;
            const int64_t row = first - a->rb_starts[j]; /* identity: pairs (r, r) */
            spconv__fused_weight_gather(plan->dtype, rows, a->features,
                                        identity ? NULL : a->rb_in + first, row, a->grad_out,
                                        identity ? NULL : a->rb_out + first, row, plan->c_in,
                                        plan->c_out, buffer);
            spconv__clock_lap(clock, &mark, &clock->gather_s);
            spconv__fused_weight_product(plan->dtype, rows, a->features,
                                         identity ? NULL : a->rb_in + first, row, plan->c_in,
                                         plan->c_out, buffer, sums);
            spconv__clock_lap(clock, &mark, &clock->gemm_s);
        }
        return;
    }
    if (a->pairs.active[j] == plan->identity_k) { /* pairs (r, r): rows [p0, p1) of both */
        const int64_t r0 = p0 - a->rb_starts[j], r1 = p1 - a->rb_starts[j];
        spconv__gemm(plan->dtype, plan->gemm, 1, 0, plan->c_in, plan->c_out, r1 - r0,
                     a->features + (size_t)r0 * in_row, plan->c_in,
                     a->grad_out + (size_t)r0 * out_row, plan->c_out, 1, sums, plan->c_out);
        spconv__clock_lap(clock, &mark, &clock->gemm_s);
        return;
    }
    char *x_buf = buffer, *g_buf = x_buf + spconv__align_line((size_t)plan->chunk * in_row);
    for (int64_t first = p0; first < p1; first += plan->chunk) {
        const int64_t rows = p1 - first < plan->chunk ? p1 - first : plan->chunk;
        mark = spconv__clock_start(clock);
        spconv__gather_rows(x_buf, a->features, a->rb_in + first, rows, in_row);
        spconv__gather_rows(g_buf, a->grad_out, a->rb_out + first, rows, out_row);
        spconv__clock_lap(clock, &mark, &clock->gather_s);
        spconv__gemm(plan->dtype, plan->gemm, 1, 0, plan->c_in, plan->c_out, rows, x_buf,
                     plan->c_in, g_buf, plan->c_out, 1, sums, plan->c_out);
        spconv__clock_lap(clock, &mark, &clock->gemm_s);
    }
}

/* Offset j of task t (task_first is increasing). */
static int64_t task_offset(const backward_args *a, int64_t t) {
    int64_t lo = 0, hi = a->pairs.num_active; /* last j with task_first[j] <= t */
    while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (a->task_first[mid] <= t)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Offsets without pairs have no task: their gradient is zero (the others' tasks write all of
 * theirs). The active offsets are in increasing order. */
static void zero_inactive_offsets(const backward_args *a, spconv__phase_clock *clock) {
    const spconv__conv_plan *plan = a->plan;
    const size_t sum_bytes = (size_t)(plan->c_in * plan->c_out) * plan->elem;
    if (a->pairs.num_active < plan->kernel_volume) {
        double zero_mark = spconv__clock_start(clock);
        SPCONV_OMP(omp for schedule(static) nowait)
        for (int64_t k = 0; k < plan->kernel_volume; ++k) {
            int64_t lo = 0, hi = a->pairs.num_active; /* first active offset >= k */
            while (lo < hi) {
                const int64_t mid = lo + (hi - lo) / 2;
                if (a->pairs.active[mid] < k)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            if (lo == a->pairs.num_active || a->pairs.active[lo] != k)
                memset(a->grad_weight + (size_t)k * sum_bytes, 0, sum_bytes);
        }
        spconv__clock_lap(clock, &zero_mark, &clock->scatter_s);
    }
}

/* Each active offset's partial sums 1.. (@p segments of them, partial s of offset j at
 * @p partial(s, j)) added into grad_weight[k] in order, elements in parallel. */
#define ADD_SEGMENTS(segments, partial)                                                            \
    do {                                                                                           \
        const int64_t n_ = plan->c_in * plan->c_out,                                               \
                      blocks_ = (n_ + REDUCE_BLOCK - 1) / REDUCE_BLOCK;                            \
        for (int64_t j = 0; j < a->pairs.num_active; ++j) {                                        \
            if ((segments) <= 1) continue;                                                         \
            char *total = a->grad_weight + (size_t)a->pairs.active[j] * sum_bytes;                 \
            SPCONV_OMP(omp for schedule(static))                                                   \
            for (int64_t blk = 0; blk < blocks_; ++blk) {                                          \
                const int64_t start = blk * REDUCE_BLOCK,                                          \
                              len = n_ - start < REDUCE_BLOCK ? n_ - start : REDUCE_BLOCK;         \
                for (int64_t s = 1; s < (segments); ++s)                                           \
                    add_into(plan->dtype, total + (size_t)start * plan->elem,                      \
                             (partial) + (size_t)start * plan->elem, len);                         \
            }                                                                                      \
        }                                                                                          \
    } while (0)

static void weight_tasks(const backward_args *a, spconv__phase_clock *clock, char *buffer) {
    const spconv__conv_plan *plan = a->plan;
    const size_t sum_bytes = (size_t)(plan->c_in * plan->c_out) * plan->elem;
    zero_inactive_offsets(a, clock);
    SPCONV_OMP(omp for schedule(dynamic, 1))
    for (int64_t t = 0; t < a->num_tasks; ++t) {
        const int64_t j = task_offset(a, t), s = t - a->task_first[j];
        const int64_t p0 = a->rb_starts[j] + s * SEGMENT_PAIRS,
                      p1 = p0 + SEGMENT_PAIRS < a->rb_starts[j + 1] ? p0 + SEGMENT_PAIRS
                                                                    : a->rb_starts[j + 1];
        char *sums = s == 0 ? a->grad_weight + (size_t)a->pairs.active[j] * sum_bytes
                            : a->partials + (size_t)(t - j - 1) * sum_bytes;
        weight_task(a, j, p0, p1, sums, clock, buffer);
    }
    /* Each offset's segments 1.. into segment 0, in order, elements in parallel. */
    double mark = spconv__clock_start(clock);
    ADD_SEGMENTS(a->task_first[j + 1] - a->task_first[j],
                 a->partials + (size_t)(a->task_first[j] + s - j - 1) * sum_bytes);
    spconv__clock_lap(clock, &mark, &clock->scatter_s);
}

/* Joint mode, one dynamic loop over: the segments (each its blocks in order, both gradients),
 * then the tail's weight gradient, one task per active offset, then the tail's data-gradient
 * blocks; after it the segments' and the tail's weight sums are added in order. */
static void joint_segments(const backward_args *a, spconv__phase_clock *clock, char *buffer) {
    const spconv__conv_plan *plan = a->plan;
    const size_t sum_bytes = (size_t)(plan->c_in * plan->c_out) * plan->elem;
    const int64_t active = a->pairs.num_active, tail_row = a->tail_block * a->block_rows;
    const int64_t tasks =
        a->segments + active + (a->grad_in != NULL ? a->blocks - a->tail_block : 0);
    zero_inactive_offsets(a, clock);
    SPCONV_OMP(omp for schedule(dynamic, 1))
    for (int64_t t = 0; t < tasks; ++t) {
        double mark = spconv__clock_start(clock);
        if (t < a->segments) {
            for (int64_t j = 0; j < active; ++j) memset(joint_sums(a, t, j), 0, sum_bytes);
            spconv__clock_lap(clock, &mark, &clock->scatter_s);
            const int64_t b0 = t * a->segment_blocks,
                          b1 = b0 + a->segment_blocks < a->tail_block ? b0 + a->segment_blocks
                                                                      : a->tail_block;
            for (int64_t b = b0; b < b1; ++b)
                data_block(a, b * a->block_rows, (b + 1) * a->block_rows, t, clock, buffer);
        } else if (t < a->segments + active) { /* the tail's pairs of one offset */
            const int64_t j = t - a->segments;
            char *sums = joint_sums(a, a->segments, j);
            memset(sums, 0, sum_bytes);
            spconv__clock_lap(clock, &mark, &clock->scatter_s);
            if (a->pairs.active[j] == plan->identity_k) {
                joint_weight(a, plan->num_in - tail_row, NULL, tail_row, NULL, tail_row, sums,
                             clock, buffer);
                continue;
            }
            int64_t first, end;
            spconv__pairs_range(&a->pairs, j, tail_row, plan->num_in, &first, &end);
            joint_weight(a, end - first, a->pairs.target + first, 0, a->pairs.source + first, 0,
                         sums, clock, buffer);
        } else {
            const int64_t r0 = (a->tail_block + t - a->segments - active) * a->block_rows;
            data_block(a, r0, r0 + a->block_rows < plan->num_in ? r0 + a->block_rows : plan->num_in,
                       -1, clock, buffer);
        }
    }
    double mark = spconv__clock_start(clock);
    ADD_SEGMENTS(a->segments + 1, joint_sums(a, s, j));
    spconv__clock_lap(clock, &mark, &clock->scatter_s);
}

static void backward_run(const backward_args *a, int threads, spconv__conv_timing *timing) {
    const spconv__conv_plan *plan = a->plan;
    spconv__gemm_prepare();
    SPCONV_OMP(omp parallel num_threads(threads)) {
        spconv__phase_clock clock = {timing != NULL, 0.0, 0.0, 0.0};
        char *buffer = a->workspace + (size_t)spconv__omp_thread() * a->thread_bytes;
        double mark = spconv__clock_start(&clock);
        if (a->grad_bias != NULL) bias_gradient(a);
        spconv__clock_lap(&clock, &mark, &clock.scatter_s);
        if (a->grad_in != NULL || a->joint) {
            if ((plan->fused && a->grad_in != NULL) || a->pairs.bounds != NULL) {
                /* per offset: W[k]^T packed (B: element (co, ci) at co * co_stride + ci *
                 * ci_stride), and where its pairs split at the blocks */
                const spconv__weight_view *w = &a->w;
                const int trans = w->ci_stride != 1; /* then co_stride is 1 */
                SPCONV_OMP(omp for schedule(dynamic, 1))
                for (int64_t j = 0; j < a->pairs.num_active; ++j) {
                    if (plan->fused && a->grad_in != NULL)
                        spconv__fused_pack(
                            plan->dtype,
                            w->data + (size_t)(a->pairs.active[j] * w->k_stride) * plan->elem,
                            trans ? w->ci_stride : w->co_stride, trans, plan->c_out, plan->c_in,
                            a->packed + (size_t)j * a->packed_bytes);
                    if (a->pairs.bounds != NULL)
                        spconv__pair_bounds(&a->pairs, j,
                                            a->bounds_scratch +
                                                spconv__omp_thread() * (a->blocks + 1));
                }
                spconv__clock_lap(&clock, &mark, &clock.gather_s);
            }
            if (a->joint) {
                joint_segments(a, &clock, buffer);
            } else {
                SPCONV_OMP(omp for schedule(dynamic, 1) nowait)
                for (int64_t b = 0; b < a->blocks; ++b) {
                    const int64_t r0 = b * a->block_rows;
                    data_block(a, r0,
                               r0 + a->block_rows < plan->num_in ? r0 + a->block_rows
                                                                 : plan->num_in,
                               -1, &clock, buffer);
                }
            }
        }
        /* The weight tasks read only the operands, so they may start while blocks of the data
         * gradient are still running (nowait above). */
        if (a->grad_weight != NULL && !a->joint) weight_tasks(a, &clock, buffer);
        if (timing != NULL) spconv__clock_merge(&clock, timing);
    }
    if (timing != NULL) timing->threads = threads;
}

/* Byte offsets of the workspace's parts. */
typedef struct backward_layout_t {
    size_t partials_at, tasks_at, threads_at, packed_at, bounds_at, sort_at, total;
} backward_layout_t;

/* Blocks and tasks of @p a, and the workspace: bias partials, segment buffers, the task table,
 * per-thread buffers, packed weights, the data gradient's bounds table and its scratch (when
 * a->bounds_entries), then (unless @p sorted) room to sort the pairs by in row. */
/* Joint mode's segments for a weight gradient of @p plan's sizes, 0 where it does not apply: the
 * sizes alone decide, not which gradients are asked for, so that d_weight has the same bits
 * whether d_features is computed beside it or not. */
static int64_t joint_segments_for(const spconv__conv_plan *plan, int64_t num_active,
                                  int64_t num_pairs) {
    const size_t sum_bytes = (size_t)(plan->c_in * plan->c_out) * plan->elem;
    if (!plan->fused || num_active <= 0 || sum_bytes == 0 || plan->num_in < JOINT_MIN_ROWS)
        return 0;
    /* partials: segments 1.. and the tail */
    const size_t per_segment = (size_t)num_active * sum_bytes;
    int64_t segments = JOINT_SEGMENTS;
    if ((size_t)segments * per_segment > JOINT_PARTIAL_BYTES)
        segments = (int64_t)(JOINT_PARTIAL_BYTES / per_segment);
    const double gathered = (double)num_pairs * (double)(plan->c_in + plan->c_out),
                 partial =
                     (double)segments * (double)num_active * (double)(plan->c_in * plan->c_out);
    return segments >= 1 && gathered >= JOINT_MIN_GAIN * partial ? segments : 0;
}

static backward_layout_t backward_layout(backward_args *a, int threads, int sorted,
                                         int64_t num_pairs, int64_t num_active,
                                         const int64_t *starts) {
    const spconv__conv_plan *plan = a->plan;
    const size_t sum_bytes = (size_t)(plan->c_in * plan->c_out) * plan->elem;
    a->block_rows = spconv__block_rows(plan, plan->c_in);
    /* Joint mode (a->joint, set by backward_prepare): blocks of at most a chunk of rows (so an
     * offset's pairs in a block fit one weight chunk) and at least JOINT_MIN_BLOCKS of them, so
     * that the tail is several; segments by the sizes alone. */
    if (a->joint) {
        const int64_t segments = joint_segments_for(plan, num_active, starts[num_active]);
        int64_t rows = (plan->num_in + JOINT_MIN_BLOCKS - 1) / JOINT_MIN_BLOCKS;
        if (rows < FUSED_MIN_BLOCK_ROWS) rows = FUSED_MIN_BLOCK_ROWS;
        if (rows > plan->chunk) rows = plan->chunk;
        if (a->block_rows > rows) a->block_rows = rows;
        a->blocks = (plan->num_in + a->block_rows - 1) / a->block_rows;
        const int64_t tail = a->blocks / JOINT_TAIL > 0 ? a->blocks / JOINT_TAIL : 1;
        a->tail_block = a->blocks - tail;
        a->segment_blocks = (a->tail_block + segments - 1) / segments;
        a->segments = (a->tail_block + a->segment_blocks - 1) / a->segment_blocks;
    }
    if (plan->fused && !a->joint) {
        /* many blocks per thread, taken dynamically: little idle time at the end; one thread
         * needs no split (as forward) */
        const int64_t parts = threads > 1 ? 16 * (int64_t)threads : 1;
        int64_t balanced = (plan->num_in + parts - 1) / parts;
        if (balanced < FUSED_MIN_BLOCK_ROWS) balanced = FUSED_MIN_BLOCK_ROWS;
        if (balanced < a->block_rows) a->block_rows = balanced;
    }
    a->blocks = (plan->num_in + a->block_rows - 1) / a->block_rows;
    a->bounds_entries = a->grad_in != NULL || a->joint
                            ? spconv__pair_bounds_entries(&a->pairs, a->block_rows, a->blocks)
                            : 0;
    a->num_tasks = 0;
    for (int64_t j = 0; j < num_active; ++j) {
        const int64_t count = starts[j + 1] - starts[j];
        a->num_tasks += count > 0 ? (count + SEGMENT_PAIRS - 1) / SEGMENT_PAIRS : 1;
    }
    const size_t in_row = (size_t)plan->c_in * plan->elem,
                 out_row = (size_t)plan->c_out * plan->elem;
    const size_t data_bytes = plan->fused ? 0
                                          : spconv__align_line((size_t)plan->chunk * out_row) +
                                                spconv__align_line((size_t)plan->chunk * in_row);
    size_t weight_bytes = 0;
    if (a->grad_weight != NULL && plan->fused)
        weight_bytes = spconv__align_line(spconv__fused_weight_scratch_bytes(
            plan->dtype, plan->chunk, plan->c_in, plan->c_out));
    else if (a->grad_weight != NULL)
        weight_bytes = spconv__align_line((size_t)plan->chunk * in_row) +
                       spconv__align_line((size_t)plan->chunk * out_row);
    a->thread_bytes = data_bytes > weight_bytes ? data_bytes : weight_bytes;
    if (plan->fused && a->grad_in != NULL)
        a->packed_bytes =
            spconv__align_line(spconv__fused_packed_bytes(plan->dtype, plan->c_out, plan->c_in));
    int64_t bias_blocks = (plan->num_out + BIAS_BLOCK_ROWS - 1) / BIAS_BLOCK_ROWS;
    backward_layout_t l;
    l.partials_at = a->grad_bias == NULL
                        ? 0
                        : spconv__align_line((size_t)(bias_blocks * plan->c_out) * sizeof(double));
    const size_t partial_bytes =
        a->grad_weight == NULL ? 0
        : a->joint             ? (size_t)a->segments * (size_t)num_active * sum_bytes
                               : (size_t)(a->num_tasks - num_active) * sum_bytes;
    l.tasks_at = l.partials_at + spconv__align_line(partial_bytes);
    l.threads_at =
        l.tasks_at + spconv__align_line((size_t)(num_active + 1) * sizeof(int64_t));
    l.packed_at = l.threads_at + (size_t)threads * a->thread_bytes;
    l.bounds_at = l.packed_at + (size_t)num_active * a->packed_bytes;
    l.sort_at = l.bounds_at + spconv__pair_bounds_bytes(a->bounds_entries, a->blocks, threads);
    l.total = l.sort_at + (sorted ? 0
                                  : 2 * spconv__align_line((size_t)num_pairs * sizeof(int32_t)) +
                                        (size_t)spconv__sort_threads(threads) *
                                            (size_t)plan->num_in * sizeof(int32_t));
    return l;
}

/* Lay out the workspace and point @p a at the pairs sorted by in row: a subm rulebook's mirrored
 * offsets when its out rows are sorted (spconv__pair_lists), the rulebook's own order when it is
 * sorted by in row, else copies sorted in the workspace. The weight gradient reads the
 * rulebook's own order. */
static spconv_status backward_prepare(spconv_context *ctx, const spconv_rulebook *rb,
                                      const int32_t *in_rows, const int32_t *out_rows, int threads,
                                      backward_args *a, spconv_context **temp) {
    const int64_t active = spconv_rulebook_num_active_offsets(rb),
                  pairs = spconv_rulebook_num_pairs(rb);
    const int64_t *starts = spconv_rulebook_active_starts(rb);
    a->joint = a->grad_weight != NULL &&
               joint_segments_for(a->plan, active, spconv_rulebook_num_pairs(rb)) > 0;
    const int need_pairs = a->grad_in != NULL || a->joint;
    const int mirrored = need_pairs && spconv_rulebook_params(rb)->kind == SPCONV_CONV_SUBM &&
                         spconv__rulebook_rows_sorted(rb, SPCONV__SIDE_OUT, out_rows, threads);
    const int sorted = !need_pairs || mirrored ||
                       spconv__rulebook_rows_sorted(rb, SPCONV__SIDE_IN, in_rows, threads);
    a->pairs.num_active = active;
    a->pairs.starts = starts;
    backward_layout_t l = backward_layout(a, threads, sorted, pairs, active, starts);
    void *workspace;
    SPCONV_FORWARD_IF_ERROR(spconv__cpu_workspace(ctx, l.total, &workspace, temp));
    char *base = workspace;
    a->bias_partials = (double *)base;
    a->partials = base + l.partials_at;
    a->task_first = (int64_t *)(base + l.tasks_at);
    a->workspace = base + l.threads_at;
    a->packed = base + l.packed_at;
    a->task_first[0] = 0;
    for (int64_t j = 0; j < active; ++j) {
        const int64_t count = starts[j + 1] - starts[j];
        a->task_first[j + 1] =
            a->task_first[j] + (count > 0 ? (count + SEGMENT_PAIRS - 1) / SEGMENT_PAIRS : 1);
    }
    a->rb_in = in_rows;
    a->rb_out = out_rows;
    a->rb_starts = starts;
    a->pairs.active = spconv_rulebook_active_offsets(rb);
    a->pairs.source = mirrored ? in_rows : out_rows;
    a->pairs.target = mirrored ? out_rows : in_rows;
    a->pairs.mirrored = mirrored;
    if (a->bounds_entries > 0) {
        a->pairs.bounds = (int64_t *)(base + l.bounds_at);
        a->bounds_scratch = spconv__pair_bounds_scratch(a->pairs.bounds, a->bounds_entries);
        a->pairs.block_rows = a->block_rows;
        a->pairs.blocks = a->blocks;
    }
    if (!sorted) {
        const size_t list = spconv__align_line((size_t)pairs * sizeof(int32_t)) / sizeof(int32_t);
        int32_t *source = (int32_t *)(base + l.sort_at), *target = source + list;
        spconv__sort_by_target(starts, active, out_rows, in_rows, a->plan->num_in, target + list,
                               source, target, spconv__sort_threads(threads));
        a->pairs.source = source;
        a->pairs.target = target;
    }
    return SPCONV_OK;
}

static spconv_status new_output(spconv_context *ctx, const spconv_tensor *like, int ndim,
                                const int64_t *sizes, spconv_tensor **result, char **data) {
    SPCONV_FORWARD_IF_ERROR(spconv__tensor_empty_in("spconv_conv_backward", ctx, spconv_cpu(),
                                                    spconv_tensor_dtype(like), ndim, sizes,
                                                    result));
    *data = spconv_tensor_data(*result);
    return SPCONV_OK;
}

static spconv_status backward_cpu(spconv_context *ctx, const spconv_rulebook *rb,
                                  const spconv__conv_dims *dims, const spconv_tensor *features,
                                  const spconv_tensor *weight, const spconv_tensor *grad_out,
                                  const spconv__conv_options *options,
                                  spconv_tensor **grad_features, spconv_tensor **grad_weight,
                                  spconv_tensor **grad_bias) {
    spconv_tensor *f = NULL, *w = NULL, *g = NULL, *pairs_in = NULL, *pairs_out = NULL;
    spconv_tensor *d_in = NULL, *d_w = NULL, *d_b = NULL;
    spconv_context *temp = NULL;
    backward_args a = {0};
    spconv_status st;
    spconv__conv_plan plan;
    spconv__conv_plan_init(&plan, rb, dims->dtype, dims->c_in, dims->c_out,
                           dims->c_out + 2 * dims->c_in,
                           options != NULL ? options->gemm : SPCONV__GEMM_AUTO);
    SPCONV_TRY_GOTO(st, spconv_tensor_contiguous(ctx, features, &f), done);
    /* only the data gradient reads the weight: the fused path packs it from where it lies */
    if (grad_features != NULL && (!plan.fused || !spconv__weight_view_of(weight, &a.w))) {
        SPCONV_TRY_GOTO(st, spconv_tensor_contiguous(ctx, weight, &w), done);
        a.weight = spconv_tensor_data(w);
        a.w = (spconv__weight_view){a.weight, dims->c_in * dims->c_out, dims->c_out, 1};
    }
    SPCONV_TRY_GOTO(st, spconv_tensor_contiguous(ctx, grad_out, &g), done);
    SPCONV_TRY_GOTO(st, spconv__rulebook_pairs(ctx, rb, &pairs_in, &pairs_out), done);
    int64_t in_sizes[2] = {dims->num_in, dims->c_in}, bias_size = dims->c_out;
    if (grad_features != NULL)
        SPCONV_TRY_GOTO(st, new_output(ctx, features, 2, in_sizes, &d_in, &a.grad_in), done);
    if (grad_weight != NULL)
        SPCONV_TRY_GOTO(st,
                        new_output(ctx, weight, spconv_tensor_ndim(weight), spconv_tensor_sizes(weight),
                                   &d_w, &a.grad_weight),
                        done);
    if (grad_bias != NULL)
        SPCONV_TRY_GOTO(st, new_output(ctx, grad_out, 1, &bias_size, &d_b, &a.grad_bias), done);

    a.plan = &plan;
    a.features = spconv_tensor_data(f);
    a.grad_out = spconv_tensor_data(g);
    int threads = spconv_context_num_threads(ctx);
    SPCONV_TRY_GOTO(st,
                    backward_prepare(ctx, rb, spconv_tensor_data(pairs_in),
                                     spconv_tensor_data(pairs_out), threads, &a, &temp),
                    done);
    backward_run(&a, threads, options != NULL ? options->timing : NULL);
    if (grad_features != NULL) *grad_features = d_in, d_in = NULL;
    if (grad_weight != NULL) *grad_weight = d_w, d_w = NULL;
    if (grad_bias != NULL) *grad_bias = d_b, d_b = NULL;
done:
    spconv_tensor_release(d_b);
    spconv_tensor_release(d_w);
    spconv_tensor_release(d_in);
    spconv_tensor_release(pairs_out);
    spconv_tensor_release(pairs_in);
    spconv_tensor_release(g);
    spconv_tensor_release(w);
    spconv_tensor_release(f);
    spconv_context_destroy(temp);
    return st;
}

int spconv__conv_backward_joint(const spconv_rulebook *rb, spconv_dtype dtype, int64_t c_in,
                                int64_t c_out) {
    spconv__conv_plan plan;
    spconv__conv_plan_init(&plan, rb, dtype, c_in, c_out, c_out + 2 * c_in, SPCONV__GEMM_AUTO);
    return joint_segments_for(&plan, spconv_rulebook_num_active_offsets(rb),
                              spconv_rulebook_num_pairs(rb)) > 0;
}

spconv_status spconv__conv_backward_ex(spconv_context *ctx, const spconv_rulebook *rb,
                                       const spconv_tensor *features, const spconv_tensor *weight,
                                       const spconv_tensor *grad_out,
                                       const spconv__conv_options *options,
                                       spconv_tensor **grad_features, spconv_tensor **grad_weight,
                                       spconv_tensor **grad_bias) {
    static const char func[] = "spconv_conv_backward";
    if (grad_features != NULL) *grad_features = NULL;
    if (grad_weight != NULL) *grad_weight = NULL;
    if (grad_bias != NULL) *grad_bias = NULL;
    SPCONV_CHECK_NOT_NULL(func, rb);
    SPCONV_CHECK_NOT_NULL(func, features);
    SPCONV_CHECK_NOT_NULL(func, weight);
    SPCONV_CHECK_NOT_NULL(func, grad_out);
    spconv__conv_dims dims;
    SPCONV_FORWARD_IF_ERROR(spconv__conv_check(func, rb, features, weight, NULL, grad_out, &dims));
    const spconv_backend *backend;
    SPCONV_DISPATCH(func, dims.device, conv_backward, "sparse conv backward", &backend);
    if (grad_features == NULL && grad_weight == NULL && grad_bias == NULL) return SPCONV_OK;
    if (spconv__is_half_dtype(dims.dtype) && !backend->conv_half_native)
        return spconv__half_conv_backward(backend, ctx, rb, features, weight, grad_out, options,
                                          grad_features, grad_weight, grad_bias);
    return backend->conv_backward(ctx, rb, features, weight, grad_out, options, grad_features,
                                  grad_weight, grad_bias);
}

/* The CPU backend's slot (operands checked by the entry point, as for the forward). */
spconv_status spconv__cpu_conv_backward(spconv_context *ctx, const spconv_rulebook *rb,
                                        const spconv_tensor *features, const spconv_tensor *weight,
                                        const spconv_tensor *grad_out,
                                        const spconv__conv_options *options,
                                        spconv_tensor **grad_features, spconv_tensor **grad_weight,
                                        spconv_tensor **grad_bias) {
    static const char func[] = "spconv_conv_backward";
    spconv__conv_dims dims;
    SPCONV_FORWARD_IF_ERROR(spconv__conv_check(func, rb, features, weight, NULL, grad_out, &dims));
    SPCONV_FORWARD_IF_ERROR(spconv__check_cpu_float(func, dims.dtype));
    return backward_cpu(ctx, rb, &dims, features, weight, grad_out, options, grad_features,
                        grad_weight, grad_bias);
}

spconv_status spconv_conv_backward(spconv_context *ctx, const spconv_rulebook *rb,
                                   const spconv_tensor *features, const spconv_tensor *weight,
                                   const spconv_tensor *grad_out, spconv_tensor **grad_features,
                                   spconv_tensor **grad_weight, spconv_tensor **grad_bias) {
    return spconv__conv_backward_ex(ctx, rb, features, weight, grad_out, NULL, grad_features,
                                    grad_weight, grad_bias);
}
