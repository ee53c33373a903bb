/* Sparse max pooling over a REGULAR rulebook, forward and backward, on the CPU, and the
 * dispatchers of spconv_maxpool_forward / spconv_maxpool_backward.
 *
 * Forward: every output starts at -inf with argmax -1; offsets run in increasing k; the first
 * pair of an output always takes it (so an output of -inf inputs still names one), later ones only
 * when strictly greater, so a tie keeps the smallest k. A NaN input beats any number (the first
 * NaN stays), so NaNs propagate as in PyTorch. Within an offset the pairs are split into fixed
 * chunks across threads (each out row appears once per offset); a barrier separates offsets.
 * Backward: grad_in[i, c] = the sum of grad_out[o, c] over the pairs (i, o) whose argmax[o, c] is
 * i, offsets in increasing k; threads take blocks of input rows, so every sum keeps that order
 * whatever the thread count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "conv/conv_check.h"
#include "conv/conv_cpu.h"
#include "conv/half.h"
#include "conv/gemm.h"
#include "core/backend.h"
#include "core/cpu_kernels.h"
#include "core/error.h"
#include "tensor/tensor_impl.h"

#define POOL_CHUNK 1024
/* Out rows per block of the output-stationary forward: a block's rows stay in L1/L2 while every
 * offset visits them, so each out row goes to memory once. */
#define POOL_BLOCK_BYTES (32 * 1024)
#define POOL_BLOCK_MIN 16

/* Input rows read ahead of the pair that needs them: a pool's input rows follow no pattern the
 * hardware prefetcher can follow. */
#define POOL_AHEAD 8

typedef struct pool_args {
    spconv_dtype dtype;
    int64_t channels, num_in, num_out;
    int64_t num_active;
    const int64_t *starts; /* pairs of the rulebook's active offsets, in increasing k */
    const int32_t *pairs_in, *pairs_out;
    const void *features; /* [num_in, C] */
    void *out;            /* [num_out, C] */
    int32_t *argmax;      /* [num_out, C] */
    int sorted;           /* 1: each offset's pairs are in increasing out row */
    const int64_t *active;
} pool_args;

#define SPCONV_POOL_PAIRS(T)                                                                       \
    for (int64_t p = first; p < end; ++p) {                                                        \
        if (p + POOL_AHEAD < end) prefetch_row(a, a->pairs_in[p + POOL_AHEAD]);                   \
        const T *restrict x = (const T *)a->features + (int64_t)a->pairs_in[p] * a->channels;      \
        T *restrict y = (T *)a->out + (int64_t)a->pairs_out[p] * a->channels;                      \
        int32_t *restrict arg = a->argmax + (int64_t)a->pairs_out[p] * a->channels;                \
        const int32_t row = a->pairs_in[p];                                                        \
        for (int64_t c = 0; c < a->channels; ++c) { /* selects, no branch on data */               \
            const T v = x[c], m = y[c];                                                            \
            const int take = (arg[c] < 0) | (v > m) | ((v != v) & (m == m));                       \
            y[c] = take ? v : m;                                                                   \
            arg[c] = take ? row : arg[c];                                                          \
        }                                                                                          \
    }

/* Without argmax (inference) only the values: from -inf, "take v when v > y or v is the first
 * NaN" gives the same bits as the rule above (its first pair's unconditional take only differs
 * when v is -inf, which leaves y at -inf too), and as a select it vectorises: no branch per
 * element on data. */
#define SPCONV_POOL_VALUES(T)                                                                      \
    for (int64_t p = first; p < end; ++p) {                                                        \
        if (p + POOL_AHEAD < end) prefetch_row(a, a->pairs_in[p + POOL_AHEAD]);                   \
        const T *restrict x = (const T *)a->features + (int64_t)a->pairs_in[p] * a->channels;      \
        T *restrict y = (T *)a->out + (int64_t)a->pairs_out[p] * a->channels;                      \
        for (int64_t c = 0; c < a->channels; ++c) {                                                \
            const T v = x[c], m = y[c];                                                            \
            y[c] = (v > m || (v != v && m == m)) ? v : m;                                          \
        }                                                                                          \
    }

static inline void prefetch_row(const pool_args *a, int32_t row) {
    const char *x = (const char *)a->features +
                    (size_t)row * (size_t)a->channels * spconv_dtype_size(a->dtype);
    const size_t bytes = (size_t)a->channels * spconv_dtype_size(a->dtype);
    for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(x + b);
}

/* Whole rows of selects: wide vectors pay off (SPCONV__VECTOR_CLONES, gemm.h). */
SPCONV__VECTOR_CLONES
static void pool_pairs(const pool_args *a, int64_t first, int64_t end) {
    if (a->argmax == NULL) {
        if (a->dtype == SPCONV_F32) {
            SPCONV_POOL_VALUES(float)
        } else {
            SPCONV_POOL_VALUES(double)
        }
    } else if (a->dtype == SPCONV_F32) {
        SPCONV_POOL_PAIRS(float)
    } else {
        SPCONV_POOL_PAIRS(double)
    }
}

/* Elements [begin, end) of out (and argmax) start at -inf (and -1): one typed loop each, no
 * test per element, so they vectorise. */
static void pool_init_range(const pool_args *a, int64_t begin, int64_t end) {
    if (a->dtype == SPCONV_F32) {
        float *restrict y = (float *)a->out;
        for (int64_t i = begin; i < end; ++i) y[i] = -INFINITY;
    } else {
        double *restrict y = (double *)a->out;
        for (int64_t i = begin; i < end; ++i) y[i] = -INFINITY;
    }
    if (a->argmax != NULL) {
        int32_t *restrict arg = a->argmax;
        for (int64_t i = begin; i < end; ++i) arg[i] = -1;
    }
}

/* Output-stationary: blocks of out rows, each initialised and then visited by every offset in
 * increasing k (its pairs found by binary search), so each out row sees its pairs in the same
 * order as the offset-by-offset loop below, and the same bits come out. */
static void pool_run_blocks(const pool_args *a, int threads) {
    spconv__pair_lists lists = {a->num_active, a->active, a->starts, a->pairs_in,
                                a->pairs_out, 0, NULL, 0, 0};
    const int64_t row_bytes = a->channels * (int64_t)spconv_dtype_size(a->dtype);
    int64_t rows = POOL_BLOCK_BYTES / (row_bytes > 0 ? row_bytes : 1);
    if (rows < POOL_BLOCK_MIN) rows = POOL_BLOCK_MIN;
    const int64_t blocks = (a->num_out + rows - 1) / rows;
    void *table;
    int64_t *scratch = spconv__pair_bounds_alloc(&lists, rows, blocks, threads, &table);
    SPCONV_OMP(omp parallel num_threads(threads)) {
        if (lists.bounds != NULL) { /* where each offset's pairs split at the blocks */
            SPCONV_OMP(omp for schedule(dynamic, 1))
            for (int64_t j = 0; j < a->num_active; ++j)
                spconv__pair_bounds(&lists, j, scratch + spconv__omp_thread() * (blocks + 1));
        }
        SPCONV_OMP(omp for schedule(dynamic, 1))
        for (int64_t b = 0; b < blocks; ++b) {
            const int64_t r0 = b * rows, r1 = r0 + rows < a->num_out ? r0 + rows : a->num_out;
            pool_init_range(a, r0 * a->channels, r1 * a->channels);
            for (int64_t j = 0; j < a->num_active; ++j) {
                int64_t first, end;
                spconv__pairs_range(&lists, j, r0, r1, &first, &end);
                pool_pairs(a, first, end);
            }
        }
    }
    free(table);
}

static void pool_run(const pool_args *a, int threads) {
    if (a->sorted) {
        pool_run_blocks(a, threads);
        return;
    }
    SPCONV_OMP(omp parallel num_threads(threads)) {
        const int64_t n = a->num_out * a->channels, pieces = (n + POOL_CHUNK - 1) / POOL_CHUNK;
        SPCONV_OMP(omp for schedule(static))
        for (int64_t i = 0; i < pieces; ++i)
            pool_init_range(a, i * POOL_CHUNK, (i + 1) * POOL_CHUNK < n ? (i + 1) * POOL_CHUNK : n);
        for (int64_t j = 0; j < a->num_active; ++j) {
            const int64_t start = a->starts[j], count = a->starts[j + 1] - start;
            const int64_t chunks = (count + POOL_CHUNK - 1) / POOL_CHUNK;
            SPCONV_OMP(omp for schedule(dynamic, 1))
            for (int64_t i = 0; i < chunks; ++i) {
                int64_t first = start + i * POOL_CHUNK;
                pool_pairs(a, first,
                           first + POOL_CHUNK < start + count ? first + POOL_CHUNK : start + count);
            }
        }
    }
}

static spconv_status maxpool_forward_cpu(spconv_context *ctx, const spconv_rulebook *rb,
                                         const spconv_tensor *features, spconv_tensor **out,
                                         spconv_tensor **argmax) {
    pool_args a = {spconv_tensor_dtype(features),
                   spconv_tensor_size(features, 1),
                   spconv_rulebook_num_in(rb),
                   spconv_rulebook_num_out(rb),
                   spconv_rulebook_num_active_offsets(rb),
                   spconv_rulebook_active_starts(rb),
                   NULL,
                   NULL,
                   NULL,
                   NULL,
                   NULL,
                   0,
                   spconv_rulebook_active_offsets(rb)};
    spconv_tensor *f = NULL, *pairs_in = NULL, *pairs_out = NULL, *y = NULL, *arg = NULL;
    int64_t sizes[2] = {a.num_out, a.channels};
    spconv_status st;
    SPCONV_TRY_GOTO(st, spconv_tensor_contiguous(ctx, features, &f), done);
    SPCONV_TRY_GOTO(st, spconv__rulebook_pairs(ctx, rb, &pairs_in, &pairs_out), done);
    SPCONV_TRY_GOTO(st,
                    spconv__tensor_empty_in("spconv_maxpool_forward", ctx, spconv_cpu(), a.dtype, 2,
                                            sizes, &y),
                    done);
    /* Only a caller that goes backward needs the argmax: without it the kernel keeps values. */
    if (argmax != NULL)
        SPCONV_TRY_GOTO(st,
                        spconv__tensor_empty_in("spconv_maxpool_forward", ctx, spconv_cpu(),
                                                SPCONV_I32, 2, sizes, &arg),
                        done);
    a.pairs_in = spconv_tensor_data(pairs_in);
    a.pairs_out = spconv_tensor_data(pairs_out);
    a.features = spconv_tensor_data(f);
    a.out = spconv_tensor_data(y);
    a.argmax = arg != NULL ? spconv_tensor_data(arg) : NULL;
    a.sorted = spconv__rulebook_rows_sorted(rb, SPCONV__SIDE_OUT, a.pairs_out,
                                            spconv_context_num_threads(ctx));
    if (a.num_out > 0 && a.channels > 0) /* else the outputs have no elements (and no data) */
        pool_run(&a, spconv_context_num_threads(ctx));
    *out = y, y = NULL;
    if (argmax != NULL) *argmax = arg, arg = NULL;
done:
    spconv_tensor_release(arg);
    spconv_tensor_release(y);
    spconv_tensor_release(pairs_out);
    spconv_tensor_release(pairs_in);
    spconv_tensor_release(f);
    return st;
}

spconv_status spconv_maxpool_forward(spconv_context *ctx, const spconv_rulebook *rb,
                                     const spconv_tensor *features, spconv_tensor **out,
                                     spconv_tensor **argmax) {
    static const char func[] = "spconv_maxpool_forward";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    if (argmax != NULL) *argmax = NULL;
    SPCONV_CHECK_NOT_NULL(func, rb);
    SPCONV_CHECK_NOT_NULL(func, features);
    SPCONV_FORWARD_IF_ERROR(spconv__pool_check_forward(func, rb, features));
    const spconv_backend *backend;
    SPCONV_DISPATCH(func, spconv_tensor_device(features), maxpool_forward, "max pooling forward",
                    &backend);
    if (spconv__is_half_dtype(spconv_tensor_dtype(features)))
        return spconv__half_maxpool_forward(backend, ctx, rb, features, out, argmax);
    return backend->maxpool_forward(ctx, rb, features, out, argmax);
}

/* The CPU backend's slot (operands checked by the entry point). */
spconv_status spconv__cpu_maxpool_forward(spconv_context *ctx, const spconv_rulebook *rb,
                                          const spconv_tensor *features, spconv_tensor **out,
                                          spconv_tensor **argmax) {
    SPCONV_FORWARD_IF_ERROR(
        spconv__check_cpu_float("spconv_maxpool_forward", spconv_tensor_dtype(features)));
    return maxpool_forward_cpu(ctx, rb, features, out, argmax);
}

/* Input-stationary backward: blocks of input rows, each zeroed and then visited by every offset in
 * increasing k (that offset's pairs sorted by in row, found by binary search): grad_in[i, c] +=
 * grad_out[o, c] where argmax[o, c] is i, as a select, so a block's rows are written in cache
 * and once to memory, and no zero-fill pass goes first. Each (i, c) gets its terms in offset
 * order whatever the thread count. */
#define SPCONV_POOL_GRAD_ROWS(T)                                                                   \
    for (int64_t p = first; p < end; ++p) {                                                        \
        if (p + POOL_AHEAD < end) {                                                                \
            const int64_t ahead = lists->source[p + POOL_AHEAD] * channels;                        \
            for (int64_t c = 0; c < channels; c += 16) {                                           \
                __builtin_prefetch(argmax + ahead + c);                                            \
                __builtin_prefetch((const T *)grad_out + ahead + c);                               \
            }                                                                                      \
        }                                                                                          \
        const int32_t i = lists->target[p];                                                        \
        const int64_t o = lists->source[p];                                                        \
        const int32_t *restrict arg = argmax + o * channels;                                       \
        const T *restrict g = (const T *)grad_out + o * channels;                                  \
        T *restrict gi = (T *)grad_in + (int64_t)i * channels;                                     \
        for (int64_t c = 0; c < channels; ++c) gi[c] += arg[c] == i ? g[c] : (T)0;                 \
    }

SPCONV__VECTOR_CLONES
static void pool_grad_blocks(spconv_dtype dtype, int64_t num_in, int64_t channels,
                             spconv__pair_lists *lists, const int32_t *argmax,
                             const void *grad_out, void *grad_in, int threads) {
    const int64_t row_bytes = channels * (int64_t)spconv_dtype_size(dtype);
    int64_t rows = POOL_BLOCK_BYTES / (row_bytes > 0 ? row_bytes : 1);
    if (rows < POOL_BLOCK_MIN) rows = POOL_BLOCK_MIN;
    const int64_t blocks = (num_in + rows - 1) / rows;
    void *table;
    int64_t *scratch = spconv__pair_bounds_alloc(lists, rows, blocks, threads, &table);
    SPCONV_OMP(omp parallel num_threads(threads)) {
        if (lists->bounds != NULL) { /* where each offset's pairs split at the blocks */
            SPCONV_OMP(omp for schedule(dynamic, 1))
            for (int64_t j = 0; j < lists->num_active; ++j)
                spconv__pair_bounds(lists, j, scratch + spconv__omp_thread() * (blocks + 1));
        }
        SPCONV_OMP(omp for schedule(dynamic, 1))
        for (int64_t b = 0; b < blocks; ++b) {
            const int64_t r0 = b * rows, r1 = r0 + rows < num_in ? r0 + rows : num_in;
            memset((char *)grad_in + (size_t)(r0 * row_bytes), 0,
                   (size_t)((r1 - r0) * row_bytes));
            for (int64_t j = 0; j < lists->num_active; ++j) {
                int64_t first, end;
                spconv__pairs_range(lists, j, r0, r1, &first, &end);
                if (dtype == SPCONV_F32) {
                    SPCONV_POOL_GRAD_ROWS(float)
                } else {
                    SPCONV_POOL_GRAD_ROWS(double)
                }
            }
        }
    }
    lists->bounds = NULL;
    free(table);
}

/* The rulebook's pairs as lists sorted by in row within each offset (source = out rows): its own
 * arrays when they are, else sorted copies in a workspace (*temp: destroy when done). */
static spconv_status pairs_by_in_row(spconv_context *ctx, const spconv_rulebook *rb,
                                     const int32_t *in_rows, const int32_t *out_rows,
                                     spconv__pair_lists *lists, spconv_context **temp) {
    const int threads = spconv_context_num_threads(ctx);
    const int64_t active = spconv_rulebook_num_active_offsets(rb),
                  pairs = spconv_rulebook_num_pairs(rb), num_in = spconv_rulebook_num_in(rb);
    const int64_t *starts = spconv_rulebook_active_starts(rb);
    *lists = (spconv__pair_lists){
        active, spconv_rulebook_active_offsets(rb), starts, out_rows, in_rows, 0, NULL, 0, 0};
    *temp = NULL;
    if (spconv__rulebook_rows_sorted(rb, SPCONV__SIDE_IN, in_rows, threads)) return SPCONV_OK;
    const size_t list = spconv__align_line((size_t)pairs * sizeof(int32_t));
    const int sorters = spconv__sort_threads(threads);
    void *workspace;
    SPCONV_FORWARD_IF_ERROR(spconv__cpu_workspace(
        ctx, 2 * list + (size_t)sorters * (size_t)num_in * sizeof(int32_t), &workspace, temp));
    int32_t *source = workspace, *target = (int32_t *)((char *)workspace + list);
    spconv__sort_by_target(starts, active, out_rows, in_rows, num_in,
                           (int32_t *)((char *)workspace + 2 * list), source, target, sorters);
    lists->source = source;
    lists->target = target;
    return SPCONV_OK;
}

static spconv_status maxpool_backward_cpu(spconv_context *ctx, const spconv_rulebook *rb,
                                          const spconv_tensor *argmax,
                                          const spconv_tensor *grad_out,
                                          spconv_tensor **grad_features) {
    static const char func[] = "spconv_maxpool_backward";
    const int64_t num_out = spconv_rulebook_num_out(rb), channels = spconv_tensor_size(grad_out, 1);
    int64_t sizes[2] = {spconv_rulebook_num_in(rb), channels};
    spconv_tensor *arg = NULL, *g = NULL, *gx = NULL, *pairs_in = NULL, *pairs_out = NULL;
    spconv_context *temp = NULL;
    spconv_status st;
    SPCONV_TRY_GOTO(st, spconv_tensor_contiguous(ctx, argmax, &arg), done);
    SPCONV_TRY_GOTO(
        st, spconv__check_argmax_rows(func, spconv_tensor_data(arg), num_out, channels, sizes[0],
                                      spconv_context_num_threads(ctx)),
        done);
    SPCONV_TRY_GOTO(st, spconv_tensor_contiguous(ctx, grad_out, &g), done);
    SPCONV_TRY_GOTO(st, spconv__rulebook_pairs(ctx, rb, &pairs_in, &pairs_out), done);
    SPCONV_TRY_GOTO(
        st, spconv__tensor_empty_in(func, ctx, spconv_cpu(), spconv_tensor_dtype(grad_out), 2,
                                    sizes, &gx),
        done);
    spconv__pair_lists lists;
    SPCONV_TRY_GOTO(st,
                    pairs_by_in_row(ctx, rb, spconv_tensor_data(pairs_in),
                                    spconv_tensor_data(pairs_out), &lists, &temp),
                    done);
    if (sizes[0] > 0 && channels > 0) /* else grad_features has no elements (and no data) */
        pool_grad_blocks(spconv_tensor_dtype(grad_out), sizes[0], channels, &lists,
                         spconv_tensor_data(arg), spconv_tensor_data(g), spconv_tensor_data(gx),
                         spconv_context_num_threads(ctx));
    *grad_features = gx, gx = NULL;
done:
    spconv_context_destroy(temp);
    spconv_tensor_release(pairs_out);
    spconv_tensor_release(pairs_in);
    spconv_tensor_release(gx);
    spconv_tensor_release(g);
    spconv_tensor_release(arg);
    return st;
}

spconv_status spconv_maxpool_backward(spconv_context *ctx, const spconv_rulebook *rb,
                                      const spconv_tensor *argmax, const spconv_tensor *grad_out,
                                      spconv_tensor **grad_features) {
    static const char func[] = "spconv_maxpool_backward";
    SPCONV_CHECK_NOT_NULL(func, grad_features);
    *grad_features = NULL;
    SPCONV_CHECK_NOT_NULL(func, rb);
    SPCONV_CHECK_NOT_NULL(func, argmax);
    SPCONV_CHECK_NOT_NULL(func, grad_out);
    SPCONV_FORWARD_IF_ERROR(spconv__pool_check_backward(func, rb, argmax, grad_out));
    const spconv_backend *backend;
    SPCONV_DISPATCH(func, spconv_tensor_device(grad_out), maxpool_backward,
                    "max pooling backward", &backend);
    if (spconv__is_half_dtype(spconv_tensor_dtype(grad_out)))
        return spconv__half_maxpool_backward(backend, ctx, rb, argmax, grad_out, grad_features);
    return backend->maxpool_backward(ctx, rb, argmax, grad_out, grad_features);
}

/* The CPU backend's slot (operands checked by the entry point). */
spconv_status spconv__cpu_maxpool_backward(spconv_context *ctx, const spconv_rulebook *rb,
                                           const spconv_tensor *argmax,
                                           const spconv_tensor *grad_out,
                                           spconv_tensor **grad_features) {
    SPCONV_FORWARD_IF_ERROR(
        spconv__check_cpu_float("spconv_maxpool_backward", spconv_tensor_dtype(grad_out)));
    return maxpool_backward_cpu(ctx, rb, argmax, grad_out, grad_features);
}
