/* indice_conv forward: out = bias + sum over offsets k, in increasing order, of
 * scatter(gather(features, in rows of k) @ W[k], out rows of k). The dispatcher sends CUDA
 * tensors to their backend; the CPU executor is below. */
#include <string.h>

#include "conv/conv_check.h"
#include "conv/conv_cpu.h"
#include "conv/half.h"
#include "conv/fused.h"
#include "core/backend.h"
#include "core/cpu_kernels.h"
#include "core/error.h"
#include "tensor/tensor_impl.h"

/* Fewest out rows per block with the fused kernels: enough rows that finding a block's pairs
 * (two binary searches per offset) stays small next to its products. */
#define FUSED_MIN_BLOCK_ROWS 64
/* Blocks per thread with the fused kernels, taken dynamically. */
#define FUSED_BLOCKS_PER_THREAD 16
/* With the fused kernels on 2+ threads, the last threads x block_rows rows go in blocks this
 * many times smaller, so that the threads' last blocks end close together. */
#define FUSED_TAIL_SPLIT 4
/* Most input channels for which the fused forward sums each out row in registers over its
 * offsets (spconv__fused_out_rows) instead of adding every offset's products into the out rows:
 * with so few terms per product, reading and writing a 64-channel out row for every pair cost
 * more than the products (basic's 3 -> 64 first layer). Rulebooks of more active offsets than a
 * mask has bits take the per-offset way. */
#define OUT_ROWS_MAX_C_IN 4
/* Fewest pairs per active offset for which a W[k] wider than a kernel block is packed rather
 * than read in place (see forward_cpu). */
#define IN_PLACE_MAX_PAIRS 256
#define OUT_ROWS_MAX_OFFSETS 64

typedef struct forward_args {
    const spconv__conv_plan *plan;
    spconv__pair_lists pairs; /* source = in rows, target = out rows (sorted) */
    const char *features;     /* [num_in, C_in] contiguous */
    const char *weight;       /* [KV, C_in, C_out] contiguous (unfused path) */
    spconv__weight_view w;    /* the weight as the fused path reads it (conv_cpu.h) */
    const char *bias;         /* [C_out] or NULL */
    char *out;                /* [num_out, C_out] */
    /* blocks: [0, split) in blocks of block_rows, then [split, num_out) in blocks of tail_rows
     * (block_rows is a multiple of tail_rows; a bounds table has blocks of block_rows) */
    int64_t block_rows, tail_rows, split;
    char *workspace; /* thread t owns [t * thread_bytes, (t + 1) * thread_bytes) */
    size_t thread_bytes;
    char *packed; /* fused: W[k] of active offset j packed at j * packed_bytes */
    size_t packed_bytes;
    /* fused: > 0 when the kernels read W[k] where it lies, its rows ldb elements apart (no
     * packing); 0 when they read the packed copies */
    int64_t ldb;
    int out_rows; /* fused: by spconv__fused_out_rows (forward_block_out_rows) */
    int64_t *bounds_scratch; /* with pairs.bounds: the searches' upper ends, the same layout */
    const spconv__conv_epilogue *epilogue; /* or NULL */
} forward_args;

/* out[r0, r1) starts as the bias (or zero). */
static void forward_init(const forward_args *a, int64_t r0, int64_t r1) {
    size_t row_bytes = (size_t)a->plan->c_out * a->plan->elem;
    for (int64_t r = r0; r < r1; ++r) {
        if (a->bias != NULL)
            memcpy(a->out + (size_t)r * row_bytes, a->bias, row_bytes);
        else
            memset(a->out + (size_t)r * row_bytes, 0, row_bytes);
    }
}

/* Pairs [first, first + rows) of the sorted lists, all of offset k: gather, multiply by W[k],
 * add into their out rows. */
static void forward_chunk(const forward_args *a, int64_t k, int64_t first, int64_t rows,
                          spconv__phase_clock *clock, char *buffer) {
    const spconv__conv_plan *plan = a->plan;
    const size_t in_row = (size_t)plan->c_in * plan->elem;
    const char *w_k = a->weight + (size_t)k * in_row * (size_t)plan->c_out;
    char *gathered = buffer;
    char *product = buffer + spconv__align_line((size_t)plan->chunk * in_row);
    double mark = spconv__clock_start(clock);
    spconv__gather_rows(gathered, a->features, a->pairs.source + first, rows, in_row);
    spconv__clock_lap(clock, &mark, &clock->gather_s);
    spconv__gemm(plan->dtype, plan->gemm, 0, 0, rows, plan->c_out, plan->c_in, gathered, plan->c_in,
                 w_k, plan->c_out, 0, product, plan->c_out);
    spconv__clock_lap(clock, &mark, &clock->gemm_s);
    spconv__scatter_add_rows(plan->dtype, a->out, a->pairs.target + first, product, rows,
                             plan->c_out);
    spconv__clock_lap(clock, &mark, &clock->scatter_s);
}

/* Out rows [r0, r1): bias, then every offset in increasing k. The identity offset multiplies
 * the same rows of features in place and accumulates straight into out. */
static void forward_block(const forward_args *a, int64_t r0, int64_t r1, spconv__phase_clock *clock,
                          char *buffer) {
    const spconv__conv_plan *plan = a->plan;
    const size_t in_row = (size_t)plan->c_in * plan->elem,
                 out_row = (size_t)plan->c_out * plan->elem;
    double mark = spconv__clock_start(clock);
    forward_init(a, r0, r1);
    spconv__clock_lap(clock, &mark, &clock->scatter_s);
    /* Without input channels every product is empty: out is the bias alone. */
    for (int64_t j = 0; j < a->pairs.num_active && plan->c_in > 0; ++j) {
        const int64_t k = a->pairs.active[j];
        if (k == plan->identity_k) {
            mark = spconv__clock_start(clock);
            spconv__gemm(plan->dtype, plan->gemm, 0, 0, r1 - r0, plan->c_out, plan->c_in,
                         a->features + (size_t)r0 * in_row, plan->c_in,
                         a->weight + (size_t)k * in_row * (size_t)plan->c_out, plan->c_out, 1,
                         a->out + (size_t)r0 * out_row, plan->c_out);
            spconv__clock_lap(clock, &mark, &clock->gemm_s);
            continue;
        }
        int64_t first, end;
        spconv__pairs_range(&a->pairs, j, r0, r1, &first, &end);
        for (; first < end; first += plan->chunk)
            forward_chunk(a, k, first, end - first < plan->chunk ? end - first : plan->chunk, clock,
                          buffer);
    }
}

/* W[k] of active offset j as the fused kernels read it: in place, or its packed copy. */
static const char *fused_weight(const forward_args *a, int64_t j) {
    if (a->ldb > 0)
        return a->w.data + (size_t)(a->pairs.active[j] * a->w.k_stride) * a->plan->elem;
    return a->packed + (size_t)j * a->packed_bytes;
}

/* forward_block by the fused kernels: each offset's pairs (the identity's rows in place) go
 * straight from the feature rows into the out rows. A subm layer's identity offset reaches every
 * out row, so it goes first and writes the rows (bias + product) instead of adding to a zero
 * fill; the other offsets follow in increasing k. */
static void forward_block_fused(const forward_args *a, int64_t r0, int64_t r1,
                                spconv__phase_clock *clock) {
    const spconv__conv_plan *plan = a->plan;
    int64_t identity_j = -1;
    for (int64_t j = 0; j < a->pairs.num_active && plan->c_in > 0; ++j)
        if (a->pairs.active[j] == plan->identity_k) identity_j = j;
    double mark = spconv__clock_start(clock);
    if (identity_j < 0) {
        forward_init(a, r0, r1);
        spconv__clock_lap(clock, &mark, &clock->scatter_s);
    } else {
        spconv__fused_rows_set(plan->dtype, r1 - r0, a->features, NULL, r0, a->out, NULL, r0,
                               plan->c_in, plan->c_out, fused_weight(a, identity_j), a->ldb,
                               a->bias);
    }
    for (int64_t j = 0; j < a->pairs.num_active && plan->c_in > 0; ++j) {
        if (j == identity_j) continue;
        int64_t first, end;
        spconv__pairs_range(&a->pairs, j, r0, r1, &first, &end);
        spconv__fused_rows(plan->dtype, end - first, a->features, a->pairs.source + first, 0,
                           a->out, a->pairs.target + first, 0, plan->c_in, plan->c_out,
                           fused_weight(a, j), a->ldb);
    }
    spconv__clock_lap(clock, &mark, &clock->gemm_s);
}

/* forward_block by the out-row kernels: the block's pairs listed per out row first (a mask of
 * the offsets that reach it, and their in rows, in the thread's buffer), then each out row
 * summed over its offsets in registers and written once: the same bits as
 * forward_block_fused (fused.h). */
static void forward_block_out_rows(const forward_args *a, int64_t r0, int64_t r1,
                                   spconv__phase_clock *clock, char *buffer) {
    const spconv__conv_plan *plan = a->plan;
    const int64_t rows = r1 - r0, active = a->pairs.num_active;
    uint64_t *masks = (uint64_t *)buffer;
    int32_t *sources =
        (int32_t *)(buffer + spconv__align_line((size_t)a->block_rows * sizeof *masks));
    const void *w[OUT_ROWS_MAX_OFFSETS];
    const void *w_self = NULL;
    double mark = spconv__clock_start(clock);
    memset(masks, 0, (size_t)rows * sizeof *masks);
    for (int64_t j = 0; j < active; ++j) {
        w[j] = fused_weight(a, j);
        if (a->pairs.active[j] == plan->identity_k) { /* its pairs are (r, r): no list */
            w_self = w[j];
            continue;
        }
        int64_t first, end;
        spconv__pairs_range(&a->pairs, j, r0, r1, &first, &end);
        const uint64_t bit = UINT64_C(1) << j;
        for (int64_t q = first; q < end; ++q) {
            const int64_t i = a->pairs.target[q] - r0;
            masks[i] |= bit;
            sources[i * active + j] = a->pairs.source[q];
        }
    }
    spconv__clock_lap(clock, &mark, &clock->gather_s);
    spconv__fused_out_rows(plan->dtype, rows, a->features, r0, w_self, masks, sources, active, w,
                           a->ldb, plan->c_in, plan->c_out, a->bias,
                           a->out + (size_t)(r0 * plan->c_out) * plan->elem);
    spconv__clock_lap(clock, &mark, &clock->gemm_s);
}

static int64_t run_blocks(const forward_args *a) {
    return a->split / a->block_rows + (a->plan->num_out - a->split + a->tail_rows - 1) / a->tail_rows;
}

/* Out rows [*r0, *r1) of block @p b of the run. */
static void block_range(const forward_args *a, int64_t b, int64_t *r0, int64_t *r1) {
    const int64_t bulk = a->split / a->block_rows;
    const int64_t lo = b < bulk ? b * a->block_rows : a->split + (b - bulk) * a->tail_rows;
    const int64_t hi = lo + (b < bulk ? a->block_rows : a->tail_rows);
    *r0 = lo;
    *r1 = hi < a->plan->num_out ? hi : a->plan->num_out;
}

static void forward_run(const forward_args *a, int threads, spconv__conv_timing *timing) {
    const int64_t blocks = run_blocks(a);
    spconv__gemm_prepare();
    SPCONV_OMP(omp parallel num_threads(threads)) {
        spconv__phase_clock clock = {timing != NULL, 0.0, 0.0, 0.0};
        char *buffer = a->workspace + (size_t)spconv__omp_thread() * a->thread_bytes;
        if (a->plan->fused || a->pairs.bounds != NULL) {
            /* per offset: its packed weight, and where its pairs split at the blocks */
            double mark = spconv__clock_start(&clock);
            const spconv__weight_view *w = &a->w;
            const int trans = w->co_stride != 1; /* then ci_stride is 1 */
            SPCONV_OMP(omp for schedule(dynamic, 1))
            for (int64_t j = 0; j < a->pairs.num_active; ++j) {
                if (a->plan->fused && a->ldb == 0)
                    spconv__fused_pack(
                        a->plan->dtype,
                        w->data + (size_t)(a->pairs.active[j] * w->k_stride) * a->plan->elem,
                        trans ? w->co_stride : w->ci_stride, trans, a->plan->c_in,
                        a->plan->c_out, a->packed + (size_t)j * a->packed_bytes);
                if (a->pairs.bounds != NULL)
                    spconv__pair_bounds(&a->pairs, j,
                                        a->bounds_scratch +
                                            spconv__omp_thread() * (a->pairs.blocks + 1));
            }
            spconv__clock_lap(&clock, &mark, &clock.gather_s);
        }
        SPCONV_OMP(omp for schedule(dynamic, 1))
        for (int64_t b = 0; b < blocks; ++b) {
            int64_t r0, r1;
            block_range(a, b, &r0, &r1);
            if (a->out_rows)
                forward_block_out_rows(a, r0, r1, &clock, buffer);
            else if (a->plan->fused)
                forward_block_fused(a, r0, r1, &clock);
            else
                forward_block(a, r0, r1, &clock, buffer);
            if (a->epilogue != NULL) { /* the block's rows are final: while they are in cache */
                double mark = spconv__clock_start(&clock);
                const spconv__conv_epilogue *e = a->epilogue;
                char *rows = a->out + (size_t)(r0 * a->plan->c_out) * a->plan->elem;
                if (e->wide)
                    spconv__cpu_bn_rows(a->plan->dtype, rows, rows, 0, r1 - r0, a->plan->c_out,
                                        e->scale, e->shift, e->relu);
                else
                    spconv__affine_rows(a->plan->dtype, rows, r1 - r0, a->plan->c_out, e->scale,
                                        e->shift, e->relu);
                spconv__clock_lap(&clock, &mark, &clock.scatter_s);
            }
        }
        if (timing != NULL) spconv__clock_merge(&clock, timing);
    }
    if (timing != NULL) timing->threads = threads;
}

/* The rulebook's pairs sorted by out row: its own arrays for a built rulebook, sorted copies in
 * the workspace (after the per-thread buffers) otherwise. Sizes the workspace first. */
static spconv_status forward_pairs(spconv_context *ctx, const spconv_rulebook *rb,
                                   const int32_t *in_rows, const int32_t *out_rows, int threads,
                                   forward_args *a, spconv_context **temp) {
    const int64_t active = spconv_rulebook_num_active_offsets(rb),
                  pairs = spconv_rulebook_num_pairs(rb);
    const int64_t *starts = spconv_rulebook_active_starts(rb);
    const int sorted = spconv__rulebook_rows_sorted(rb, SPCONV__SIDE_OUT, out_rows, threads);
    a->pairs.num_active = active;
    a->pairs.starts = starts;
    const int64_t blocks = (a->plan->num_out + a->block_rows - 1) / a->block_rows;
    const int64_t entries = spconv__pair_bounds_entries(&a->pairs, a->block_rows, blocks);
    const size_t bounds_bytes = spconv__pair_bounds_bytes(entries, blocks, threads);
    size_t per_threads = (size_t)threads * a->thread_bytes;
    size_t packed_bytes = a->plan->fused ? (size_t)active * a->packed_bytes : 0;
    size_t sort_bytes = sorted ? 0
                               : 2 * spconv__align_line((size_t)pairs * sizeof(int32_t)) +
                                     (size_t)spconv__sort_threads(threads) *
                                         (size_t)a->plan->num_out * sizeof(int32_t);
    void *workspace;
    SPCONV_FORWARD_IF_ERROR(
        spconv__cpu_workspace(ctx, per_threads + packed_bytes + bounds_bytes + sort_bytes,
                              &workspace, temp));
    a->workspace = workspace;
    a->packed = a->workspace + per_threads;
    if (entries > 0) {
        a->pairs.bounds = (int64_t *)(a->packed + packed_bytes);
        a->bounds_scratch = spconv__pair_bounds_scratch(a->pairs.bounds, entries);
        a->pairs.block_rows = a->block_rows;
        a->pairs.blocks = blocks;
    }
    a->pairs.active = spconv_rulebook_active_offsets(rb);
    a->pairs.source = in_rows;
    a->pairs.target = out_rows;
    a->pairs.mirrored = 0;
    if (!sorted) {
        const size_t list = spconv__align_line((size_t)pairs * sizeof(int32_t)) / sizeof(int32_t);
        int32_t *source = (int32_t *)(a->packed + packed_bytes + bounds_bytes),
                *target = source + list;
        spconv__sort_by_target(starts, active, in_rows, out_rows, a->plan->num_out, target + list,
                               source, target, spconv__sort_threads(threads));
        a->pairs.source = source;
        a->pairs.target = target;
    }
    return SPCONV_OK;
}

static spconv_status forward_cpu(spconv_context *ctx, const spconv_rulebook *rb,
                                 const spconv__conv_dims *dims, const spconv_tensor *features,
                                 const spconv_tensor *weight, const spconv_tensor *bias,
                                 const spconv__conv_options *options, spconv_tensor **out) {
    spconv_tensor *f = NULL, *w = NULL, *b = NULL, *pairs_in = NULL, *pairs_out = NULL;
    spconv_tensor *result = NULL;
    spconv_context *temp = NULL;
    spconv_status st;
    spconv__conv_plan plan;
    spconv__conv_plan_init(&plan, rb, dims->dtype, dims->c_in, dims->c_out,
                           dims->c_in + dims->c_out,
                           options != NULL ? options->gemm : SPCONV__GEMM_AUTO);
    forward_args a;
    memset(&a, 0, sizeof a);
    SPCONV_TRY_GOTO(st, spconv_tensor_contiguous(ctx, features, &f), done);
    /* the fused path packs W[k] from where it lies (a permuted view too); the unfused one
     * multiplies from contiguous W[k] */
    if (!plan.fused || !spconv__weight_view_of(weight, &a.w)) {
        SPCONV_TRY_GOTO(st, spconv_tensor_contiguous(ctx, weight, &w), done);
        a.weight = spconv_tensor_data(w);
        a.w = (spconv__weight_view){a.weight, dims->c_in * dims->c_out, dims->c_out, 1};
    }
    if (bias != NULL) SPCONV_TRY_GOTO(st, spconv_tensor_contiguous(ctx, bias, &b), done);
    SPCONV_TRY_GOTO(st, spconv__rulebook_pairs(ctx, rb, &pairs_in, &pairs_out), done);
    int64_t sizes[2] = {dims->num_out, dims->c_out};
    SPCONV_TRY_GOTO(st,
                    spconv__tensor_empty_in("spconv_conv_forward", ctx, spconv_cpu(), dims->dtype, 2,
                                            sizes, &result),
                    done);

    a.plan = &plan;
    a.epilogue = options != NULL ? options->epilogue : NULL;
    a.features = spconv_tensor_data(f);
    a.bias = b != NULL ? spconv_tensor_data(b) : NULL;
    a.out = spconv_tensor_data(result);
    a.block_rows = spconv__block_rows(&plan, dims->c_out);
    /* W[k] of whole tiles is read where it lies when a kernel block reads its rows whole, or
     * when its offsets have few pairs: packing costs a pass over the weight, and reading wide
     * rows in strips costs little where W[k] is met by few blocks of rows (basic's last layers,
     * 62 pairs an offset, 256 channels: 0.3 ms more product time, 0.7 ms less packing) and more
     * than the packing where it is met by many (its 160- to 224-channel layers, 500-4,000 pairs
     * an offset: 8-13% more product time). W^T, other widths and broadcast rows are packed. */
    const int64_t active = spconv_rulebook_num_active_offsets(rb);
    const int64_t per_offset = active > 0 ? spconv_rulebook_num_pairs(rb) / active : 0;
    if (plan.fused && a.w.co_stride == 1 && spconv__fused_reads_b(dims->dtype, dims->c_out) &&
        (dims->c_out <= spconv__fused_block_columns(dims->dtype) ||
         per_offset < IN_PLACE_MAX_PAIRS) &&
        (a.w.ci_stride > 0 || dims->c_in <= 1))
        a.ldb = a.w.ci_stride > 0 ? a.w.ci_stride : 1;
    else if (plan.fused)
        a.packed_bytes = spconv__align_line(
            spconv__fused_packed_bytes(dims->dtype, dims->c_in, dims->c_out));
    else
        a.thread_bytes =
            spconv__align_line((size_t)plan.chunk * (size_t)dims->c_in * plan.elem) +
            spconv__align_line((size_t)plan.chunk * (size_t)dims->c_out * plan.elem);
    int threads = spconv_context_num_threads(ctx);
    if (plan.fused) {
        /* An element's value does not depend on its block here (fused.h), so blocks may follow
         * the thread count: many per thread, so that small layers use every core too and the
         * last blocks leave little idle time at the end of a layer. One thread needs no split:
         * each extra block streams every W[k] through the cache once more. */
        const int64_t parts = threads > 1 ? FUSED_BLOCKS_PER_THREAD * threads : 1;
        int64_t balanced = (dims->num_out + parts - 1) / parts;
        if (balanced < FUSED_MIN_BLOCK_ROWS) balanced = FUSED_MIN_BLOCK_ROWS;
        if (balanced < a.block_rows) a.block_rows = balanced;
    }
    a.tail_rows = a.block_rows;
    if (plan.fused && threads > 1 && a.block_rows / FUSED_TAIL_SPLIT >= FUSED_MIN_BLOCK_ROWS) {
        a.tail_rows = a.block_rows / FUSED_TAIL_SPLIT;
        a.block_rows = a.tail_rows * FUSED_TAIL_SPLIT;
    }
    if (plan.fused && dims->c_in >= 1 && dims->c_in <= OUT_ROWS_MAX_C_IN &&
        spconv_rulebook_num_active_offsets(rb) <= OUT_ROWS_MAX_OFFSETS) {
        a.out_rows = 1; /* each thread lists a block's pairs per out row in its buffer */
        a.thread_bytes = spconv__align_line((size_t)a.block_rows * sizeof(uint64_t)) +
                         spconv__align_line((size_t)a.block_rows *
                                            (size_t)spconv_rulebook_num_active_offsets(rb) *
                                            sizeof(int32_t));
    }
    {
        const int64_t tail_span = a.tail_rows < a.block_rows ? (int64_t)threads * a.block_rows : 0;
        const int64_t bulk_rows = dims->num_out > tail_span ? dims->num_out - tail_span : 0;
        a.split = bulk_rows / a.block_rows * a.block_rows;
    }
    SPCONV_TRY_GOTO(st,
                    forward_pairs(ctx, rb, spconv_tensor_data(pairs_in),
                                  spconv_tensor_data(pairs_out), threads, &a, &temp),
                    done);
    if (dims->num_out > 0 && dims->c_out > 0) /* else out has no elements (and no data) */
        forward_run(&a, threads, options != NULL ? options->timing : NULL);
    *out = result;
    result = NULL;
done:
    spconv_tensor_release(result);
    spconv_tensor_release(pairs_out);
    spconv_tensor_release(pairs_in);
    spconv_tensor_release(b);
    spconv_tensor_release(w);
    spconv_tensor_release(f);
    spconv_context_destroy(temp);
    return st;
}

/* What every forward entry point checks first, under its own name: the pointers and the
 * operands (spconv__conv_check), whose sizes come back in @p dims. */
static spconv_status check_entry(const char *func, const spconv_rulebook *rb,
                                 const spconv_tensor *features, const spconv_tensor *weight,
                                 const spconv_tensor *bias, spconv_tensor **out,
                                 spconv__conv_dims *dims) {
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    SPCONV_CHECK_NOT_NULL(func, rb);
    SPCONV_CHECK_NOT_NULL(func, features);
    SPCONV_CHECK_NOT_NULL(func, weight);
    return spconv__conv_check(func, rb, features, weight, bias, NULL, dims);
}

/* The checked call to the backend of @p dims's device (16-bit features through f32 unless the
 * backend takes them as they are). */
static spconv_status dispatch_forward(const char *func, spconv_context *ctx,
                                      const spconv_rulebook *rb, const spconv_tensor *features,
                                      const spconv_tensor *weight, const spconv_tensor *bias,
                                      const spconv__conv_options *options,
                                      const spconv__conv_dims *dims, spconv_tensor **out) {
    /* spconv_conv_forward_affine checks this for its callers; internal ones get the same */
    SPCONV_RETURN_ERROR_IF(options != NULL && options->epilogue != NULL &&
                               (dims->device.type != SPCONV_DEVICE_CPU ||
                                spconv__is_half_dtype(dims->dtype)),
                           SPCONV_ERR_NOT_SUPPORTED,
                           "%s: the affine epilogue runs on f32 / f64 CPU features only", func);
    const spconv_backend *backend;
    SPCONV_DISPATCH(func, dims->device, conv_forward, "sparse conv forward", &backend);
    if (spconv__is_half_dtype(dims->dtype) && !backend->conv_half_native)
        return spconv__half_conv_forward(backend, ctx, rb, features, weight, bias, options, out);
    return backend->conv_forward(ctx, rb, features, weight, bias, options, out);
}

spconv_status spconv__conv_forward_ex(spconv_context *ctx, const spconv_rulebook *rb,
                                      const spconv_tensor *features, const spconv_tensor *weight,
                                      const spconv_tensor *bias,
                                      const spconv__conv_options *options, spconv_tensor **out) {
    static const char func[] = "spconv_conv_forward";
    spconv__conv_dims dims;
    SPCONV_FORWARD_IF_ERROR(check_entry(func, rb, features, weight, bias, out, &dims));
    return dispatch_forward(func, ctx, rb, features, weight, bias, options, &dims, out);
}

/* @p t (may be NULL) is 1-d [c_out] of the features' dtype, on the CPU. */
static spconv_status check_channel_vector(const char *func, const spconv_tensor *t,
                                          const char *name, const spconv__conv_dims *dims) {
    if (t == NULL) return SPCONV_OK;
    SPCONV_RETURN_ERROR_IF(spconv_tensor_ndim(t) != 1 || spconv_tensor_size(t, 0) != dims->c_out,
                           SPCONV_ERR_SHAPE_MISMATCH, "%s: %s must be [C_out] = [%lld], got %s",
                           func, name, (long long)dims->c_out, spconv__shape_text(t).text);
    SPCONV_RETURN_ERROR_IF(spconv_tensor_dtype(t) != dims->dtype, SPCONV_ERR_DTYPE_MISMATCH,
                           "%s: %s is %s, the features are %s", func, name,
                           spconv_dtype_name(spconv_tensor_dtype(t)),
                           spconv_dtype_name(dims->dtype));
    SPCONV_RETURN_ERROR_IF(spconv_tensor_device(t).type != SPCONV_DEVICE_CPU,
                           SPCONV_ERR_DEVICE_MISMATCH, "%s: %s is on %s, the features on cpu",
                           func, name, spconv__device_text(spconv_tensor_device(t)).text);
    return SPCONV_OK;
}

spconv_status spconv_conv_forward_affine(spconv_context *ctx, const spconv_rulebook *rb,
                                         const spconv_tensor *features,
                                         const spconv_tensor *weight, const spconv_tensor *bias,
                                         const spconv_tensor *scale, const spconv_tensor *shift,
                                         int relu, spconv_tensor **out) {
    static const char func[] = "spconv_conv_forward_affine";
    spconv__conv_dims dims;
    SPCONV_FORWARD_IF_ERROR(check_entry(func, rb, features, weight, bias, out, &dims));
    SPCONV_RETURN_ERROR_IF(dims.device.type != SPCONV_DEVICE_CPU, SPCONV_ERR_NOT_SUPPORTED,
                           "%s: runs on the CPU backend only; the features are on %s", func,
                           spconv__device_text(dims.device).text);
    SPCONV_RETURN_ERROR_IF(dims.dtype != SPCONV_F32 && dims.dtype != SPCONV_F64,
                           SPCONV_ERR_NOT_SUPPORTED,
                           "%s: f32 and f64 features only, not %s (an f16 / bf16 batch norm "
                           "rounds the conv's output first)",
                           func, spconv_dtype_name(dims.dtype));
    SPCONV_RETURN_ERROR_IF((scale == NULL) != (shift == NULL), SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: scale and shift go together (both or neither), got %s only",
                           func, scale != NULL ? "scale" : "shift");
    SPCONV_FORWARD_IF_ERROR(check_channel_vector(func, scale, "scale", &dims));
    SPCONV_FORWARD_IF_ERROR(check_channel_vector(func, shift, "shift", &dims));
    spconv_tensor *sc = NULL, *sh = NULL;
    spconv_status st = SPCONV_OK;
    if (scale != NULL) {
        SPCONV_TRY_GOTO(st, spconv_tensor_contiguous(ctx, scale, &sc), done);
        SPCONV_TRY_GOTO(st, spconv_tensor_contiguous(ctx, shift, &sh), done);
    }
    {
        const spconv__conv_epilogue epilogue = {sc != NULL ? spconv_tensor_data(sc) : NULL,
                                                sh != NULL ? spconv_tensor_data(sh) : NULL,
                                                relu != 0, 0};
        const spconv__conv_options options = {SPCONV__GEMM_AUTO, NULL, &epilogue};
        st = dispatch_forward(func, ctx, rb, features, weight, bias, &options, &dims, out);
    }
done:
    spconv_tensor_release(sh);
    spconv_tensor_release(sc);
    return st;
}

/* The CPU backend's slot: the entry point checked the operands (all on the CPU), so the sizes
 * come back from the same check without a failure. */
spconv_status spconv__cpu_conv_forward(spconv_context *ctx, const spconv_rulebook *rb,
                                       const spconv_tensor *features, const spconv_tensor *weight,
                                       const spconv_tensor *bias,
                                       const spconv__conv_options *options, spconv_tensor **out) {
    static const char func[] = "spconv_conv_forward";
    spconv__conv_dims dims;
    SPCONV_FORWARD_IF_ERROR(spconv__conv_check(func, rb, features, weight, bias, NULL, &dims));
    SPCONV_FORWARD_IF_ERROR(spconv__check_cpu_float(func, dims.dtype));
    return forward_cpu(ctx, rb, &dims, features, weight, bias, options, out);
}

spconv_status spconv_conv_forward(spconv_context *ctx, const spconv_rulebook *rb,
                                  const spconv_tensor *features, const spconv_tensor *weight,
                                  const spconv_tensor *bias, spconv_tensor **out) {
    return spconv__conv_forward_ex(ctx, rb, features, weight, bias, NULL, out);
}
