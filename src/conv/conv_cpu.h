/* Pieces shared by the CPU conv executors (forward and backward).
 *
 * Both executors are "target-stationary": the rows they accumulate into (out rows in forward,
 * d_features rows in backward) are cut into blocks of consecutive rows, and a thread takes a
 * whole block and runs every offset k on it, in increasing k: gather the source rows of the
 * block's pairs, one GEMM with W[k], scatter-add into the block, which stays in cache across the
 * offsets. Blocks write disjoint rows, so there is no barrier between offsets and no atomic, and
 * a thread that the OS delays holds up only its own block. Finding a block's pairs needs each
 * offset's pairs sorted by target row: the builder's rulebooks are sorted by out row; a subm
 * rulebook sorted by out row is also sorted by in row once its offsets are mirrored (see
 * spconv__pair_lists); other orders (d_features of strided convs, inverse rulebooks) are sorted
 * here, which is cheap because within an offset every row appears at most once.
 *
 * Determinism: blocks, chunks and weight-gradient groups have bounds fixed by the sizes (rows,
 * pairs, channels, dtype) alone, and every block runs the same operations whichever thread takes
 * it, so outputs are bitwise identical for every thread count, not only for a fixed one. */
#ifndef SPCONV_CONV_CPU_H
#define SPCONV_CONV_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "conv/conv_exec.h"
#include "core/parallel.h"
#include "rulebook/rulebook_impl.h"

static inline int spconv__omp_thread(void) {
#if SPCONV_HAVE_OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* Max pooling streams its outputs (values and argmax; the backward's input gradient) out of the
 * caches from this many bytes up (pool.c, POOL_STREAM_MIN_BYTES). Tests lower it to run the
 * streaming path on small outputs: sets it when @p bytes > 0 and returns the value before. Not
 * for concurrent use. */
size_t spconv__pool_stream_min_bytes(size_t bytes);

/* Per-thread phase clocks: `on` is 0 when nobody asked for timings, and then no clock is read. */
typedef struct spconv__phase_clock {
    int on;
    double gather_s, gemm_s, scatter_s;
} spconv__phase_clock;

static inline double spconv__clock_start(const spconv__phase_clock *clock) {
    return clock->on ? spconv__now_s() : 0.0;
}

/* Charge the time since *mark to *phase and move the mark to now. */
static inline void spconv__clock_lap(const spconv__phase_clock *clock, double *mark,
                                     double *phase) {
    if (!clock->on) return;
    double now = spconv__now_s();
    *phase += now - *mark;
    *mark = now;
}

/* Add one thread's clocks to the caller's totals (called once per thread, inside the region). */
void spconv__clock_merge(const spconv__phase_clock *clock, spconv__conv_timing *timing);

/* The pairs of every active offset (the rulebook's offsets that have pairs) as (source, target)
 * row lists, sorted by target row within each offset: source rows are gathered, target rows
 * accumulated into. Executors walk the active offsets, so a kernel's empty offsets cost
 * nothing. */
typedef struct spconv__pair_lists {
    int64_t num_active;
    const int64_t *active; /* [num_active] kernel offsets, increasing */
    const int64_t *starts; /* [num_active + 1] prefix sums: segment j is [starts[j], starts[j+1]) */
    const int32_t *source;
    const int32_t *target;
    /* 1: active offset j's pairs are segment num_active - 1 - j. A subm rulebook pairs i with o
     * through k exactly when it pairs o with i through the mirrored offset KV - 1 - k (odd
     * kernels, centred windows), so its active offsets are symmetric, and its pairs sorted by in
     * row for k are those of the mirrored offset, sorted by out row, with the roles swapped. */
    int mirrored;
    /* Optional (NULL: found by binary search per block): where each segment splits at the
     * target row blocks [b * block_rows, (b + 1) * block_rows), b < blocks; active offset j's
     * pairs in block b are [bounds[j * (blocks + 1) + b], bounds[j * (blocks + 1) + b + 1]).
     * Filled by spconv__pair_bounds, offset by offset. */
    int64_t *bounds;
    int64_t block_rows, blocks;
} spconv__pair_lists;

/* First index in [lo, hi) of the increasing @p rows whose row is >= @p value. */
int64_t spconv__lower_bound(const int32_t *rows, int64_t lo, int64_t hi, int64_t value);

/* Whether @p lists (with num_active, starts set) should get a bounds table for @p blocks of
 * @p block_rows target rows, and if so its entries (0: not worth it). A table has at most one
 * entry per pair and active offset, so it never outgrows the pair lists themselves: a huge
 * kernel over many blocks keeps the per-block search. */
int64_t spconv__pair_bounds_entries(const spconv__pair_lists *lists, int64_t block_rows,
                                    int64_t blocks);

/* Bytes for a table of @p entries (0: none) and the scratch of @p threads threads filling it
 * (blocks + 1 int64 each, after the table's cache lines). */
size_t spconv__pair_bounds_bytes(int64_t entries, int64_t blocks, int threads);

/* The scratch of a table of @p entries starting at @p table, laid out as above. */
int64_t *spconv__pair_bounds_scratch(int64_t *table, int64_t entries);

/* Fill active offset @p j's row of lists->bounds (@p scratch: blocks + 1 int64 of the calling
 * thread's own). The blocks' binary searches advance in step, so their memory loads overlap
 * instead of waiting on one another. */
void spconv__pair_bounds(const spconv__pair_lists *lists, int64_t j, int64_t *scratch);

/* A bounds table for @p lists in its own malloc'd memory (*memory, to free when done), for
 * executors without a workspace of their own; returns the scratch of @p threads threads, thread
 * t's at t * (blocks + 1). Without a table (it does not pay, or no memory: the per-block
 * search is as correct) lists->bounds stays NULL and so does the result. */
int64_t *spconv__pair_bounds_alloc(spconv__pair_lists *lists, int64_t block_rows, int64_t blocks,
                                   int threads, void **memory);

/* [*first, *end): the pairs of active offset @p j whose target row lies in [r0, r1). With a
 * table, ends on its block edges are read from it and others searched for inside their block. */
static inline void spconv__pairs_range(const spconv__pair_lists *lists, int64_t j, int64_t r0,
                                       int64_t r1, int64_t *first, int64_t *end) {
    if (lists->bounds != NULL) {
        const int64_t *row = lists->bounds + j * (lists->blocks + 1);
        const int64_t rows = lists->block_rows, b0 = r0 / rows, b1 = (r1 + rows - 1) / rows;
        *first = r0 % rows == 0 ? row[b0] : spconv__lower_bound(lists->target, row[b0], row[b0 + 1], r0);
        *end = r1 % rows == 0 ? row[b1] : spconv__lower_bound(lists->target, *first, row[b1], r1);
        return;
    }
    const int64_t segment = lists->mirrored ? lists->num_active - 1 - j : j;
    *first = spconv__lower_bound(lists->target, lists->starts[segment], lists->starts[segment + 1],
                                 r0);
    *end = spconv__lower_bound(lists->target, *first, lists->starts[segment + 1], r1);
}

/* 1 when @p rows is increasing within every one of the @p num_segments segments of @p starts. */
int spconv__rows_sorted(const int64_t *starts, int64_t num_segments, const int32_t *rows,
                        int threads);

/* spconv__rows_sorted for the in rows (@p side SPCONV__SIDE_IN) or out rows (SPCONV__SIDE_OUT)
 * of @p rb, whose contiguous data @p rows is: read from the rulebook when its build recorded it
 * or an earlier call learnt it, else checked and recorded. */
int spconv__rulebook_rows_sorted(const spconv_rulebook *rb, int side, const int32_t *rows,
                                 int threads);

/* Threads that sort pairs: each needs a slot array as long as the target rows, so at most a
 * few, whatever the core count (sorting costs little next to the products). */
static inline int spconv__sort_threads(int threads) { return threads < 4 ? threads : 4; }

/* Copy the pairs (source, target) sorted by target within each segment of @p starts (an offset's
 * pairs) into @p sorted_source and
 * @p sorted_target ([num_pairs] each), using @p slots (threads * num_targets int32, contents
 * ignored; threads from spconv__sort_threads) as scratch: each target row appears at most once
 * per offset, so a pair can be put in its target's slot and the slots read back in row order. */
void spconv__sort_by_target(const int64_t *starts, int64_t num_segments, const int32_t *source,
                            const int32_t *target, int64_t num_targets, int32_t *slots,
                            int32_t *sorted_source, int32_t *sorted_target, int threads);

/* Sizes and operands shared by the executors. */
typedef struct spconv__conv_plan {
    spconv_dtype dtype;
    size_t elem; /* bytes per element */
    int64_t kernel_volume;
    int64_t c_in, c_out;
    int64_t num_in, num_out;
    int64_t identity_k; /* offset whose pairs are (r, r) for every row, or -1 */
    int64_t chunk;      /* most pairs gathered into one GEMM operand */
    spconv__gemm_impl gemm;
    int fused; /* 1: products by the fused kernels (fused.h), no gather or scatter buffers */
} spconv__conv_plan;

/* Fill @p plan. @p chunk_row_elems is the number of elements one pair occupies across the
 * per-thread buffers (C_in + C_out in forward), which sizes the chunks. */
void spconv__conv_plan_init(spconv__conv_plan *plan, const spconv_rulebook *rb, spconv_dtype dtype,
                            int64_t c_in, int64_t c_out, int64_t chunk_row_elems,
                            spconv__gemm_impl gemm);

/* Rows per target block for target rows of @p row_elems elements: the block stays in L2 while
 * every offset adds to it. */
int64_t spconv__block_rows(const spconv__conv_plan *plan, int64_t row_elems);

/* dst[i, :] = src[rows[i], :] for i < n, rows of row_bytes bytes. */
void spconv__gather_rows(void *dst, const void *src, const int32_t *rows, int64_t n,
                         size_t row_bytes);

/* dst[rows[i], :] += src[i, :] for i < n, rows of @p cols elements of @p dtype (f32 or f64). */
void spconv__scatter_add_rows(spconv_dtype dtype, void *dst, const int32_t *rows, const void *src,
                              int64_t n, int64_t cols);

/* Where a weight tensor [K..., C_in, C_out] keeps W[k][ci][co]: at data + (k * k_stride +
 * ci * ci_stride + co * co_stride) elements. spconv__weight_view_of fills it for a contiguous weight
 * and for any weight whose kernel dims flatten to one stride with ci_stride or co_stride 1 (the
 * PyTorch binding hands over spconv's KRSC weight permuted to [K..., C_in, C_out], a view with
 * ci_stride 1); the fused kernels' packing reads such a weight where it lies, so it is never
 * copied. Returns 0 (view untouched) for any other layout. */
typedef struct spconv__weight_view {
    const char *data;
    int64_t k_stride, ci_stride, co_stride;
} spconv__weight_view;

int spconv__weight_view_of(const spconv_tensor *weight, spconv__weight_view *view);

/* Round a byte count up to a cache line, so that per-thread buffers never share one. */
static inline size_t spconv__align_line(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

/* A CPU scratch buffer of @p nbytes: the workspace of @p ctx when it is a CPU context, otherwise
 * the workspace of a temporary CPU context returned in *temp (destroy it when done). */
spconv_status spconv__cpu_workspace(spconv_context *ctx, size_t nbytes, void **ptr,
                                    spconv_context **temp);

#endif /* SPCONV_CONV_CPU_H */
