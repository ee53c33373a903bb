/* Sparse max pooling over a REGULAR rulebook, forward and backward, on the CPU, and the
 * dispatchers of spconv_maxpool_forward / spconv_maxpool_backward.
 *
 * Forward: every output starts at -inf with argmax -1; offsets run in increasing k; the first
 * pair of an output always takes it (so an output of -inf inputs still names one), later ones only
 * when strictly greater, so a tie keeps the smallest k. A NaN input beats any number (the first
 * NaN stays), so NaNs propagate as in PyTorch. A rulebook whose pairs are sorted by out row (as
 * every one built here is) is pooled in blocks of out rows, each in a thread's own buffer that
 * stays in L1/L2 and is copied out once; otherwise, within an offset the pairs are split into
 * fixed chunks across threads (each out row appears once per offset) and a barrier separates
 * offsets.
 * Backward: grad_in[i, c] = the sum of grad_out[o, c] over the pairs (i, o) whose argmax[o, c] is
 * i, offsets in increasing k; threads take blocks of input rows, so every sum keeps that order
 * whatever the thread count. Where the windows are disjoint (no input row in two pairs: 2x2x2
 * stride 2 and the like) each sum has one term, and the backward runs output-stationary as the
 * forward does, writing each input row once. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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
/* Outputs (values and argmax; the backward's input gradient) of at least this many bytes are
 * copied out of the blocks by streaming stores, which do not read each output line in before
 * writing it but leave it out of every cache. The next layer reads the output at once, and a
 * large L3 still holds a pool output of tens of MB then: on a 2-core Xeon, streaming basic's
 * first pools (17 and 11 MB) made the pools 0.1-0.4 ms faster and the conv after the first
 * 0.7 ms slower, 3 ms a forward pass in all, and the backward 2 ms slower. So only outputs
 * beyond what an L3 share keeps are streamed. */
#define POOL_STREAM_MIN_BYTES ((size_t)64 << 20)
static size_t pool_stream_min_bytes = POOL_STREAM_MIN_BYTES;

size_t spconv__pool_stream_min_bytes(size_t bytes) {
    const size_t previous = pool_stream_min_bytes;
    if (bytes > 0) pool_stream_min_bytes = bytes;
    return previous;
}

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
    int64_t row0; /* out and argmax hold rows [row0, ...): 0, or a block's own rows */
} pool_args;

/* The pairs of ranges [first[j], end[j]), j < count, in that order. Input rows are prefetched
 * POOL_AHEAD pairs ahead by a cursor that runs on across the ranges, so that an offset's first
 * rows are on their way while the previous offset's last ones are pooled. */
#define SPCONV_POOL_RANGES(...)                                                                    \
    pool_cursor ahead = {0, count > 0 ? first[0] : 0};                                             \
    for (int i = 0; i < POOL_AHEAD; ++i) pool_prefetch_next(a, first, end, count, &ahead);         \
    for (int64_t j = 0; j < count; ++j)                                                            \
        for (int64_t p = first[j]; p < end[j]; ++p) {                                              \
            pool_prefetch_next(a, first, end, count, &ahead);                                      \
            __VA_ARGS__                                                                            \
        }

#define SPCONV_POOL_PAIRS(T)                                                                       \
    SPCONV_POOL_RANGES(                                                                            \
        const T *restrict x = (const T *)a->features + (int64_t)a->pairs_in[p] * a->channels;      \
        T *restrict y = (T *)a->out + ((int64_t)a->pairs_out[p] - a->row0) * a->channels;          \
        int32_t *restrict arg = a->argmax + ((int64_t)a->pairs_out[p] - a->row0) * a->channels;    \
        const int32_t row = a->pairs_in[p];                                                        \
        for (int64_t c = 0; c < a->channels; ++c) { /* selects, no branch on data */               \
            const T v = x[c], m = y[c];                                                            \
            const int take = (arg[c] < 0) | (v > m) | ((v != v) & (m == m));                       \
            y[c] = take ? v : m;                                                                   \
            arg[c] = take ? row : arg[c];                                                          \
        })

/* Without argmax (inference) only the values: from -inf, "take v when v > y or v is the first
 * NaN" gives the same bits as the rule above (its first pair's unconditional take only differs
 * when v is -inf, which leaves y at -inf too), and as a select it vectorises: no branch per
 * element on data. */
#define SPCONV_POOL_VALUES(T)                                                                      \
    SPCONV_POOL_RANGES(                                                                            \
        const T *restrict x = (const T *)a->features + (int64_t)a->pairs_in[p] * a->channels;      \
        T *restrict y = (T *)a->out + ((int64_t)a->pairs_out[p] - a->row0) * a->channels;          \
        for (int64_t c = 0; c < a->channels; ++c) {                                                \
            const T v = x[c], m = y[c];                                                            \
            y[c] = (v > m || (v != v && m == m)) ? v : m;                                          \
        })

static inline void prefetch_row(const pool_args *a, int32_t row) {
    const char *x = (const char *)a->features +
                    (size_t)row * (size_t)a->channels * spconv_dtype_size(a->dtype);
    const size_t bytes = (size_t)a->channels * spconv_dtype_size(a->dtype);
    for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(x + b);
}

/* The next pair to prefetch: range j, pair p (j == count: none left). */
typedef struct pool_cursor {
    int64_t j, p;
} pool_cursor;

static inline void pool_prefetch_next(const pool_args *a, const int64_t *first, const int64_t *end,
                                      int64_t count, pool_cursor *c) {
    while (c->j < count && c->p >= end[c->j])
        if (++c->j < count) c->p = first[c->j];
    if (c->j == count) return;
    prefetch_row(a, a->pairs_in[c->p]);
    ++c->p;
}

/* Whole rows of selects: wide vectors pay off (SPCONV__VECTOR_CLONES, gemm.h). */
SPCONV__VECTOR_CLONES
static void pool_pairs(const pool_args *a, const int64_t *first, const int64_t *end,
                       int64_t count) {
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

/* @p bytes from @p src to @p dst, by stores that bypass the caches when @p stream is set and the
 * target has them (SSE2): a large output is not read again before it has left the caches, and
 * such stores need not first read in the lines they fill. */
static void copy_rows(int stream, void *dst, const void *src, size_t bytes) {
#if defined(__SSE2__)
    if (stream) {
        char *d = dst;
        const char *s = src;
        size_t head = (16 - ((uintptr_t)d & 15)) & 15;
        if (head > bytes) head = bytes;
        memcpy(d, s, head);
        d += head, s += head, bytes -= head;
        for (; bytes >= 16; bytes -= 16, d += 16, s += 16)
            _mm_stream_si128((__m128i *)(void *)d, _mm_loadu_si128((const __m128i *)(const void *)s));
        memcpy(d, s, bytes);
        return;
    }
#else
    (void)stream;
#endif
    memcpy(dst, src, bytes);
}

static size_t round_up_64(size_t bytes) { return (bytes + 63) / 64 * 64; }

/* Output-stationary: blocks of out rows, each pooled in a thread's own buffer (initialised, then
 * visited by every offset in increasing k, its pairs found by binary search) and copied out once,
 * so each out row sees its pairs in the same order as the offset-by-offset loop below, and the
 * same bits come out. */
static spconv_status pool_run_blocks(const pool_args *a, int threads) {
    spconv__pair_lists lists = {a->num_active, a->active, a->starts, a->pairs_in,
                                a->pairs_out, 0, NULL, 0, 0};
    const size_t esize = spconv_dtype_size(a->dtype);
    const int64_t row_bytes = a->channels * (int64_t)esize;
    int64_t rows = POOL_BLOCK_BYTES / (row_bytes > 0 ? row_bytes : 1);
    if (rows < POOL_BLOCK_MIN) rows = POOL_BLOCK_MIN;
    if (rows > a->num_out) rows = a->num_out;
    const int64_t blocks = (a->num_out + rows - 1) / rows;
    /* A thread's block of values, of argmax, and its ranges of the block's pairs per offset. */
    const size_t value_bytes = round_up_64((size_t)(rows * a->channels) * esize);
    const size_t arg_bytes =
        a->argmax != NULL ? round_up_64((size_t)(rows * a->channels) * sizeof(int32_t)) : 0;
    const size_t thread_bytes =
        value_bytes + arg_bytes + round_up_64((size_t)(2 * a->num_active) * sizeof(int64_t));
    char *work = aligned_alloc(64, (size_t)threads * thread_bytes);
    SPCONV_RETURN_ERROR_IF(work == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "spconv_maxpool_forward: out of host memory for %d blocks of %lld "
                           "output rows",
                           threads, (long long)rows);
    const int stream =
        (size_t)a->num_out * (size_t)a->channels * (esize + (a->argmax != NULL ? 4 : 0)) >=
        pool_stream_min_bytes;
    void *table;
    int64_t *scratch = spconv__pair_bounds_alloc(&lists, rows, blocks, threads, &table);
    SPCONV_OMP(omp parallel num_threads(threads)) {
        char *mine = work + (size_t)spconv__omp_thread() * thread_bytes;
        pool_args block = *a;
        block.out = mine;
        block.argmax = a->argmax != NULL ? (int32_t *)(void *)(mine + value_bytes) : NULL;
        int64_t *first = (int64_t *)(void *)(mine + value_bytes + arg_bytes);
        int64_t *end = first + a->num_active;
        if (lists.bounds != NULL) { /* where each offset's pairs split at the blocks */
            SPCONV_OMP(omp for schedule(dynamic, 1))
            for (int64_t j = 0; j < a->num_active; ++j)
                spconv__pair_bounds(&lists, j, scratch + spconv__omp_thread() * (blocks + 1));
        }
        SPCONV_OMP(omp for schedule(dynamic, 1))
        for (int64_t b = 0; b < blocks; ++b) {
            const int64_t r0 = b * rows, r1 = r0 + rows < a->num_out ? r0 + rows : a->num_out;
            const int64_t elements = (r1 - r0) * a->channels;
            block.row0 = r0;
            pool_init_range(&block, 0, elements);
            for (int64_t j = 0; j < a->num_active; ++j)
                spconv__pairs_range(&lists, j, r0, r1, first + j, end + j);
            pool_pairs(&block, first, end, a->num_active);
            copy_rows(stream, (char *)a->out + (size_t)(r0 * a->channels) * esize, block.out,
                      (size_t)elements * esize);
            if (a->argmax != NULL)
                copy_rows(stream, a->argmax + r0 * a->channels, block.argmax,
                          (size_t)elements * sizeof(int32_t));
        }
#if defined(__SSE2__)
        if (stream) _mm_sfence(); /* the streamed rows are in memory before the region ends */
#endif
    }
    free(table);
    free(work);
    return SPCONV_OK;
}

static spconv_status pool_run(const pool_args *a, int threads) {
    if (a->sorted) return pool_run_blocks(a, threads);
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
                const int64_t first = start + i * POOL_CHUNK;
                const int64_t end =
                    first + POOL_CHUNK < start + count ? first + POOL_CHUNK : start + count;
                pool_pairs(a, &first, &end, 1);
            }
        }
    }
    return SPCONV_OK;
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
                   spconv_rulebook_active_offsets(rb),
                   0};
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
        SPCONV_TRY_GOTO(st, pool_run(&a, spconv_context_num_threads(ctx)), done);
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
#define SPCONV_POOL_GRAD_ROWS(T, U)                                                                \
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
        for (int64_t c = 0; c < channels; ++c) { /* += g or +0, by a mask: it vectorises */       \
            U bits;                                                                                \
            memcpy(&bits, g + c, sizeof bits);                                                     \
            bits &= (U)0 - (U)(arg[c] == i);                                                       \
            T term;                                                                                \
            memcpy(&term, &bits, sizeof term);                                                     \
            gi[c] += term;                                                                         \
        }                                                                                          \
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
                    SPCONV_POOL_GRAD_ROWS(float, uint32_t)
                } else {
                    SPCONV_POOL_GRAD_ROWS(double, uint64_t)
                }
            }
        }
    }
    lists->bounds = NULL;
    free(table);
}

/* Disjoint windows (every input row in at most one pair, as with 2x2x2 stride 2): output-
 * stationary like the forward, each input row written once, whole, from its one pair:
 * grad_in[i, c] = argmax[o, c] == i ? grad_out[o, c] + 0 : +0, the bits the blocks above give a
 * row with one pair (0 + g there, g + 0 here: both turn -0 into +0), and rows with no pair are
 * zeroed. A block of out rows stays in cache while its offsets visit it, so grad_out
 * and argmax are read once and grad_in written once, with no zero-fill first; a large grad_in
 * goes out by streaming stores, which do not read its lines in before writing them. */
#define SPCONV_POOL_GRAD_DISJOINT(T, U)                                                            \
    for (int64_t j = 0; j < lists->num_active; ++j)                                                \
        for (int64_t p = first[j]; p < end[j]; ++p) {                                              \
            const int32_t i = lists->source[p];                                                    \
            const int64_t o = lists->target[p];                                                    \
            const int32_t *restrict arg = argmax + o * channels;                                   \
            const T *restrict g = (const T *)grad_out + o * channels;                              \
            T *restrict gi = stream ? (T *)row_buffer : (T *)grad_in + (int64_t)i * channels;      \
            for (int64_t c = 0; c < channels; ++c) { /* a mask, not a select: it vectorises */   \
                const T v = g[c] + (T)0;                                                           \
                U bits;                                                                            \
                memcpy(&bits, &v, sizeof bits);                                                    \
                bits &= (U)0 - (U)(arg[c] == i);                                                   \
                memcpy(gi + c, &bits, sizeof bits);                                                \
            }                                                                                      \
            if (stream)                                                                            \
                copy_rows(1, (T *)grad_in + (int64_t)i * channels, row_buffer, (size_t)row_bytes); \
        }

SPCONV__VECTOR_CLONES
static void pool_grad_disjoint_rows(spconv_dtype dtype, int64_t channels, int64_t row_bytes,
                                    const spconv__pair_lists *lists, const int64_t *first,
                                    const int64_t *end, const int32_t *argmax,
                                    const void *grad_out, void *grad_in, int stream,
                                    void *row_buffer) {
    if (dtype == SPCONV_F32) {
        SPCONV_POOL_GRAD_DISJOINT(float, uint32_t)
    } else {
        SPCONV_POOL_GRAD_DISJOINT(double, uint64_t)
    }
}

/* Whether every input row has at most one pair; then @p covered[i] says whether row i has one. */
static int pairs_disjoint(const int32_t *pairs_in, int64_t pairs, uint8_t *covered) {
    for (int64_t p = 0; p < pairs; ++p) {
        if (covered[pairs_in[p]]) return 0;
        covered[pairs_in[p]] = 1;
    }
    return 1;
}

/* The disjoint case (see SPCONV_POOL_GRAD_DISJOINT): out rows sorted within each offset, and
 * @p covered from pairs_disjoint. */
static spconv_status pool_grad_disjoint(spconv_dtype dtype, int64_t num_in, int64_t num_out,
                                        int64_t channels, const spconv_rulebook *rb,
                                        const int32_t *pairs_in, const int32_t *pairs_out,
                                        const uint8_t *covered, const int32_t *argmax,
                                        const void *grad_out, void *grad_in, int threads) {
    spconv__pair_lists lists = {spconv_rulebook_num_active_offsets(rb),
                                spconv_rulebook_active_offsets(rb),
                                spconv_rulebook_active_starts(rb),
                                pairs_in,
                                pairs_out,
                                0,
                                NULL,
                                0,
                                0};
    const int64_t row_bytes = channels * (int64_t)spconv_dtype_size(dtype);
    int64_t rows = POOL_BLOCK_BYTES / row_bytes;
    if (rows < POOL_BLOCK_MIN) rows = POOL_BLOCK_MIN;
    if (rows > num_out) rows = num_out > 0 ? num_out : 1;
    const int64_t blocks = (num_out + rows - 1) / rows;
    const int stream = (size_t)(num_in * row_bytes) >= pool_stream_min_bytes;
    const size_t ranges_bytes = round_up_64((size_t)(2 * lists.num_active) * sizeof(int64_t)),
                 thread_bytes = ranges_bytes + round_up_64((size_t)row_bytes);
    char *work = aligned_alloc(64, (size_t)threads * thread_bytes);
    SPCONV_RETURN_ERROR_IF(work == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "spconv_maxpool_backward: out of host memory for %d threads' "
                           "buffers of %lld bytes",
                           threads, (long long)thread_bytes);
    void *table;
    int64_t *scratch = spconv__pair_bounds_alloc(&lists, rows, blocks, threads, &table);
    SPCONV_OMP(omp parallel num_threads(threads)) {
        char *mine = work + (size_t)spconv__omp_thread() * thread_bytes;
        int64_t *first = (int64_t *)(void *)mine, *end = first + lists.num_active;
        if (lists.bounds != NULL) {
            SPCONV_OMP(omp for schedule(dynamic, 1))
            for (int64_t j = 0; j < lists.num_active; ++j)
                spconv__pair_bounds(&lists, j, scratch + spconv__omp_thread() * (blocks + 1));
        }
        SPCONV_OMP(omp for schedule(dynamic, 1) nowait)
        for (int64_t b = 0; b < blocks; ++b) {
            const int64_t r0 = b * rows, r1 = r0 + rows < num_out ? r0 + rows : num_out;
            for (int64_t j = 0; j < lists.num_active; ++j)
                spconv__pairs_range(&lists, j, r0, r1, first + j, end + j);
            pool_grad_disjoint_rows(dtype, channels, row_bytes, &lists, first, end, argmax,
                                    grad_out, grad_in, stream, mine + ranges_bytes);
        }
        SPCONV_OMP(omp for schedule(static, 4096))
        for (int64_t i = 0; i < num_in; ++i)
            if (!covered[i]) memset((char *)grad_in + (size_t)(i * row_bytes), 0, (size_t)row_bytes);
#if defined(__SSE2__)
        if (stream) _mm_sfence();
#endif
    }
    free(table);
    free(work);
    return SPCONV_OK;
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
    const int threads = spconv_context_num_threads(ctx);
    const int32_t *in_rows = spconv_tensor_data(pairs_in), *out_rows = spconv_tensor_data(pairs_out);
    if (sizes[0] > 0 && channels > 0 &&
        spconv__rulebook_rows_sorted(rb, SPCONV__SIDE_OUT, out_rows, threads)) {
        uint8_t *covered = calloc((size_t)sizes[0], 1);
        SPCONV_TRY_GOTO(st,
                        covered != NULL ? SPCONV_OK
                                        : spconv__error(SPCONV_ERR_OUT_OF_MEMORY,
                                                        "%s: out of host memory for %lld row "
                                                        "flags",
                                                        func, (long long)sizes[0]),
                        done);
        if (pairs_disjoint(in_rows, spconv_rulebook_num_pairs(rb), covered)) {
            st = pool_grad_disjoint(spconv_tensor_dtype(grad_out), sizes[0], num_out, channels, rb,
                                    in_rows, out_rows, covered, spconv_tensor_data(arg),
                                    spconv_tensor_data(g), spconv_tensor_data(gx), threads);
            free(covered);
            if (st == SPCONV_OK) *grad_features = gx, gx = NULL;
            goto done;
        }
        free(covered);
    }
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

/* The argmax rows of a device argmax, checked on the host as the CPU backend checks its own: a
 * device kernel never indexes with them (it compares them with input rows), so a bad one would
 * only give a silently wrong gradient. The copy is a wait, which a caller passing the argmax of
 * its own forward (the network) skips through spconv__maxpool_backward_trusted. */
static spconv_status check_device_argmax(spconv_context *ctx, const spconv_rulebook *rb,
                                         const spconv_tensor *argmax,
                                         const spconv_tensor *grad_out) {
    static const char func[] = "spconv_maxpool_backward";
    spconv_tensor *host = NULL, *contiguous = NULL;
    spconv_status st;
    SPCONV_TRY_GOTO(st, spconv_tensor_to_device(ctx, argmax, spconv_cpu(), &host), done);
    SPCONV_TRY_GOTO(st, spconv_tensor_contiguous(NULL, host, &contiguous), done);
    st = spconv__check_argmax_rows(func, spconv_tensor_data(contiguous),
                                   spconv_rulebook_num_out(rb), spconv_tensor_size(grad_out, 1),
                                   spconv_rulebook_num_in(rb), spconv_context_num_threads(NULL));
done:
    spconv_tensor_release(contiguous);
    spconv_tensor_release(host);
    return st;
}

static spconv_status maxpool_backward_entry(spconv_context *ctx, const spconv_rulebook *rb,
                                            const spconv_tensor *argmax,
                                            const spconv_tensor *grad_out,
                                            spconv_tensor **grad_features, int trusted) {
    static const char func[] = "spconv_maxpool_backward";
    SPCONV_CHECK_NOT_NULL(func, grad_features);
    *grad_features = NULL;
    SPCONV_CHECK_NOT_NULL(func, rb);
    SPCONV_CHECK_NOT_NULL(func, argmax);
    SPCONV_CHECK_NOT_NULL(func, grad_out);
    SPCONV_FORWARD_IF_ERROR(spconv__pool_check_backward(func, rb, argmax, grad_out));
    if (!trusted && spconv_tensor_device(argmax).type != SPCONV_DEVICE_CPU)
        SPCONV_FORWARD_IF_ERROR(check_device_argmax(ctx, rb, argmax, grad_out));
    const spconv_backend *backend;
    SPCONV_DISPATCH(func, spconv_tensor_device(grad_out), maxpool_backward,
                    "max pooling backward", &backend);
    if (spconv__is_half_dtype(spconv_tensor_dtype(grad_out)))
        return spconv__half_maxpool_backward(backend, ctx, rb, argmax, grad_out, grad_features);
    return backend->maxpool_backward(ctx, rb, argmax, grad_out, grad_features);
}

spconv_status spconv_maxpool_backward(spconv_context *ctx, const spconv_rulebook *rb,
                                      const spconv_tensor *argmax, const spconv_tensor *grad_out,
                                      spconv_tensor **grad_features) {
    return maxpool_backward_entry(ctx, rb, argmax, grad_out, grad_features, 0);
}

spconv_status spconv__maxpool_backward_trusted(spconv_context *ctx, const spconv_rulebook *rb,
                                               const spconv_tensor *argmax,
                                               const spconv_tensor *grad_out,
                                               spconv_tensor **grad_features) {
    return maxpool_backward_entry(ctx, rb, argmax, grad_out, grad_features, 1);
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
