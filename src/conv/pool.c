/* Sparse max pooling over a REGULAR rulebook, forward and backward, on the CPU, and the
 * dispatchers of spconv_maxpool_forward / spconv_maxpool_backward.
 *
 * Forward: every output starts at -inf with argmax -1; offsets run in increasing k; the first
 * pair of an output always takes it (so an output of -inf inputs still names one), later ones only
 * when strictly greater, so a tie keeps the smallest k. A NaN input beats any number (the first
 * NaN stays), so NaNs propagate as in PyTorch. Within an offset the pairs are split into fixed
 * chunks across threads (each out row appears once per offset); a barrier separates offsets.
 * Backward: grad_in[argmax[o, c], c] += grad_out[o, c] over o in increasing order; threads take
 * blocks of channels, so every sum keeps that order whatever the thread count. */
#include <math.h>
#include <string.h>

#include "conv/conv_check.h"
#include "conv/conv_cpu.h"
#include "core/backend.h"
#include "core/cpu_kernels.h"
#include "core/error.h"

#define POOL_CHUNK 1024
#define POOL_CHANNEL_BLOCK 16
/* Out rows per block of the output-stationary forward: a block's rows stay in L1/L2 while every
 * offset visits them, so each out row goes to memory once. */
#define POOL_BLOCK_BYTES (32 * 1024)
#define POOL_BLOCK_MIN 16

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
        const T *x = (const T *)a->features + (int64_t)a->pairs_in[p] * a->channels;               \
        T *y = (T *)a->out + (int64_t)a->pairs_out[p] * a->channels;                               \
        int32_t *arg = a->argmax + (int64_t)a->pairs_out[p] * a->channels;                         \
        for (int64_t c = 0; c < a->channels; ++c)                                                  \
            if (arg[c] < 0 || x[c] > y[c] || (isnan(x[c]) && !isnan(y[c]))) {                      \
                y[c] = x[c];                                                                       \
                arg[c] = a->pairs_in[p];                                                           \
            }                                                                                      \
    }

/* Without argmax (inference) only the values: from -inf, "take v when v > y or v is the first
 * NaN" gives the same bits as the rule above (its first pair's unconditional take only differs
 * when v is -inf, which leaves y at -inf too), and as a select it vectorises: no branch per
 * element on data. */
#define SPCONV_POOL_VALUES(T)                                                                      \
    for (int64_t p = first; p < end; ++p) {                                                        \
        const T *restrict x = (const T *)a->features + (int64_t)a->pairs_in[p] * a->channels;      \
        T *restrict y = (T *)a->out + (int64_t)a->pairs_out[p] * a->channels;                      \
        for (int64_t c = 0; c < a->channels; ++c) {                                                \
            const T v = x[c], m = y[c];                                                            \
            y[c] = (v > m || (v != v && m == m)) ? v : m;                                          \
        }                                                                                          \
    }

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

/* Elements [begin, end) of out (and argmax) start at -inf (and -1). */
static void pool_init_range(const pool_args *a, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
        if (a->dtype == SPCONV_F32)
            ((float *)a->out)[i] = -INFINITY;
        else
            ((double *)a->out)[i] = -INFINITY;
        if (a->argmax != NULL) a->argmax[i] = -1;
    }
}

/* Output-stationary: blocks of out rows, each initialised and then visited by every offset in
 * increasing k (its pairs found by binary search), so each out row sees its pairs in the same
 * order as the offset-by-offset loop below, and the same bits come out. */
static void pool_run_blocks(const pool_args *a, int threads) {
    const spconv__pair_lists lists = {a->num_active, a->active, a->starts,
                                      a->pairs_in,   a->pairs_out, 0};
    const int64_t row_bytes = a->channels * (int64_t)spconv_dtype_size(a->dtype);
    int64_t rows = POOL_BLOCK_BYTES / (row_bytes > 0 ? row_bytes : 1);
    if (rows < POOL_BLOCK_MIN) rows = POOL_BLOCK_MIN;
    const int64_t blocks = (a->num_out + rows - 1) / rows;
    SPCONV_OMP(omp parallel for num_threads(threads) schedule(dynamic, 1))
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

static void pool_run(const pool_args *a, int threads) {
    if (a->sorted) {
        pool_run_blocks(a, threads);
        return;
    }
    SPCONV_OMP(omp parallel num_threads(threads)) {
        const int64_t n = a->num_out * a->channels;
        SPCONV_OMP(omp for schedule(static))
        for (int64_t i = 0; i < n; ++i) pool_init_range(a, i, i + 1);
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
    SPCONV_TRY_GOTO(st, spconv_tensor_empty(spconv_cpu(), a.dtype, 2, sizes, &y), done);
    /* Only a caller that goes backward needs the argmax: without it the kernel keeps values. */
    if (argmax != NULL)
        SPCONV_TRY_GOTO(st, spconv_tensor_empty(spconv_cpu(), SPCONV_I32, 2, sizes, &arg), done);
    a.pairs_in = spconv_tensor_data(pairs_in);
    a.pairs_out = spconv_tensor_data(pairs_out);
    a.features = spconv_tensor_data(f);
    a.out = spconv_tensor_data(y);
    a.argmax = arg != NULL ? spconv_tensor_data(arg) : NULL;
    a.sorted = spconv__rows_sorted(a.starts, a.num_active, a.pairs_out,
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

#define SPCONV_POOL_GRAD(T)                                                                        \
    for (int64_t o = 0; o < num_out; ++o)                                                          \
        for (int64_t c = c0; c < c1; ++c) {                                                        \
            int32_t i = argmax[o * channels + c];                                                  \
            if (i >= 0)                                                                            \
                ((T *)grad_in)[(int64_t)i * channels + c] +=                                       \
                    ((const T *)grad_out)[o * channels + c];                                       \
        }

static void pool_grad_run(spconv_dtype dtype, int64_t num_out, int64_t channels,
                          const int32_t *argmax, const void *grad_out, void *grad_in, int threads) {
    const int64_t blocks = (channels + POOL_CHANNEL_BLOCK - 1) / POOL_CHANNEL_BLOCK;
    SPCONV_OMP(omp parallel for schedule(static) num_threads(threads))
    for (int64_t blk = 0; blk < blocks; ++blk) {
        int64_t c0 = blk * POOL_CHANNEL_BLOCK;
        int64_t c1 = c0 + POOL_CHANNEL_BLOCK < channels ? c0 + POOL_CHANNEL_BLOCK : channels;
        if (dtype == SPCONV_F32) {
            SPCONV_POOL_GRAD(float)
        } else {
            SPCONV_POOL_GRAD(double)
        }
    }
}

static spconv_status maxpool_backward_cpu(spconv_context *ctx, const spconv_rulebook *rb,
                                          const spconv_tensor *argmax,
                                          const spconv_tensor *grad_out,
                                          spconv_tensor **grad_features) {
    static const char func[] = "spconv_maxpool_backward";
    const int64_t num_out = spconv_rulebook_num_out(rb), channels = spconv_tensor_size(grad_out, 1);
    int64_t sizes[2] = {spconv_rulebook_num_in(rb), channels};
    spconv_tensor *arg = NULL, *g = NULL, *gx = NULL;
    spconv_status st;
    SPCONV_TRY_GOTO(st, spconv_tensor_contiguous(ctx, argmax, &arg), done);
    SPCONV_TRY_GOTO(
        st, spconv__check_argmax_rows(func, spconv_tensor_data(arg), num_out, channels, sizes[0]),
        done);
    SPCONV_TRY_GOTO(st, spconv_tensor_contiguous(ctx, grad_out, &g), done);
    SPCONV_TRY_GOTO(
        st, spconv_tensor_zeros(ctx, spconv_cpu(), spconv_tensor_dtype(grad_out), 2, sizes, &gx),
        done);
    if (num_out > 0 && channels > 0)
        pool_grad_run(spconv_tensor_dtype(grad_out), num_out, channels, spconv_tensor_data(arg),
                      spconv_tensor_data(g), spconv_tensor_data(gx),
                      spconv_context_num_threads(ctx));
    *grad_features = gx, gx = NULL;
done:
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
