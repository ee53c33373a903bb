/* Element-wise layer kernels on contiguous CPU features [n, c] of f32 or f64: batch norm,
 * ReLU, axpy, and the gather of a dense gradient at the sites (to_dense backward).
 *
 * Per-channel sums (batch statistics and their gradients) run over fixed blocks of rows whose
 * partial sums are added in block order, so they do not depend on the thread count; they
 * accumulate in double whatever the dtype. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu_kernels.h"
#include "conv/gemm.h" /* SPCONV__VECTOR_CLONES */
#include "core/error.h"
#include "net/net_internal.h"
#include "tensor/convert.h"

#define BLOCK_ROWS 1024
/* Below this many elements a loop is not worth waking threads for: these loops are bound by
 * memory bandwidth, which one core nearly saturates, and waking a team costs more than a few
 * hundred thousand elements take. */
#define PARALLEL_MIN (1 << 20)
/* A parallel loop over @p work elements on the caller's `threads`, serial below PARALLEL_MIN. */
#define PARALLEL_FOR(work)                                                                         \
    SPCONV_OMP(omp parallel for num_threads(threads) schedule(static)                         \
                        if((work) > PARALLEL_MIN))

/* Rows begin..end of x: acc[ch] += x (center NULL) or (x - center[ch])^2. */
static void sum_rows(const spconv_tensor *x, int64_t begin, int64_t end, const double *center,
                     double *acc) {
    const int64_t c = spconv_tensor_size(x, 1);
#define SUM_ROWS(T)                                                                                \
    do {                                                                                           \
        const T *row = (const T *)spconv_tensor_data(x) + begin * c;                               \
        for (int64_t r = begin; r < end; ++r, row += c)                                            \
            for (int64_t ch = 0; ch < c; ++ch) {                                                   \
                double v = center != NULL ? row[ch] - center[ch] : row[ch];                        \
                acc[ch] += center != NULL ? v * v : v;                                             \
            }                                                                                      \
    } while (0)
    if (spconv_tensor_dtype(x) == SPCONV_F32)
        SUM_ROWS(float);
    else
        SUM_ROWS(double);
#undef SUM_ROWS
}

/* Rows begin..end: acc[ch] += dy and acc[c + ch] += dy * xhat with xhat = (x - mean) * invstd. */
static void sum_grad_rows(const spconv_tensor *x, const spconv_tensor *dy, int64_t begin,
                          int64_t end, const double *mean, const double *invstd, double *acc) {
    const int64_t c = spconv_tensor_size(x, 1);
#define SUM_GRAD_ROWS(T)                                                                           \
    do {                                                                                           \
        const T *xr = (const T *)spconv_tensor_data(x) + begin * c;                                \
        const T *gr = (const T *)spconv_tensor_data(dy) + begin * c;                               \
        for (int64_t r = begin; r < end; ++r, xr += c, gr += c)                                    \
            for (int64_t ch = 0; ch < c; ++ch) {                                                   \
                acc[ch] += gr[ch];                                                                 \
                acc[c + ch] += gr[ch] * ((xr[ch] - mean[ch]) * invstd[ch]);                        \
            }                                                                                      \
    } while (0)
    if (spconv_tensor_dtype(x) == SPCONV_F32)
        SUM_GRAD_ROWS(float);
    else
        SUM_GRAD_ROWS(double);
#undef SUM_GRAD_ROWS
}

/* Per-channel sums of @p width values per row over every row of x: a pass of sum_rows (width c)
 * or sum_grad_rows (width 2c), block by block, reduced in block order into total[width]. */
static spconv_status blocked_sums(const spconv_tensor *x, const spconv_tensor *dy, const double *a,
                                  const double *b, int64_t width, int threads, double *total) {
    const int64_t n = spconv_tensor_size(x, 0);
    const int64_t blocks = (n + BLOCK_ROWS - 1) / BLOCK_ROWS;
    double *partial = calloc((size_t)(blocks > 0 ? blocks : 1) * (size_t)width, sizeof *partial);
    SPCONV_RETURN_ERROR_IF(partial == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "out of host memory for %" PRId64 " x %" PRId64 " partial sums", blocks,
                           width);
    PARALLEL_FOR(n * width)
    for (int64_t blk = 0; blk < blocks; ++blk) {
        int64_t begin = blk * BLOCK_ROWS, end = begin + BLOCK_ROWS < n ? begin + BLOCK_ROWS : n;
        if (dy == NULL)
            sum_rows(x, begin, end, a, partial + blk * width);
        else
            sum_grad_rows(x, dy, begin, end, a, b, partial + blk * width);
    }
    for (int64_t ch = 0; ch < width; ++ch) total[ch] = 0.0;
    for (int64_t blk = 0; blk < blocks; ++blk)
        for (int64_t ch = 0; ch < width; ++ch) total[ch] += partial[blk * width + ch];
    free(partial);
    return SPCONV_OK;
}

spconv_status spconv__cpu_batchnorm_stats(spconv_context *ctx, const spconv_tensor *x, double eps,
                                          double *stats) {
    const int threads = spconv_context_num_threads(ctx);
    const int64_t n = spconv_tensor_size(x, 0), c = spconv_tensor_size(x, 1);
    double *mean = stats, *invstd = stats + c, *var_unbiased = stats + 2 * c;
    SPCONV_FORWARD_IF_ERROR(blocked_sums(x, NULL, NULL, NULL, c, threads, mean));
    for (int64_t ch = 0; ch < c; ++ch) mean[ch] = n > 0 ? mean[ch] / (double)n : 0.0;
    /* Two passes (mean, then squared deviations) keep the variance accurate in f32 data. */
    SPCONV_FORWARD_IF_ERROR(blocked_sums(x, NULL, mean, NULL, c, threads, invstd));
    for (int64_t ch = 0; ch < c; ++ch) {
        double squares = invstd[ch];
        var_unbiased[ch] = n > 1 ? squares / (double)(n - 1) : 0.0;
        invstd[ch] = 1.0 / sqrt((n > 0 ? squares / (double)n : 0.0) + eps);
    }
    return SPCONV_OK;
}

spconv_status spconv__cpu_batchnorm_terms(spconv_context *ctx, const spconv_tensor *x,
                                          const double *affine, const double *stats,
                                          double *terms) {
    (void)ctx;
    const int64_t c = spconv_tensor_size(x, 1);
    for (int64_t ch = 0; ch < c; ++ch) {
        terms[ch] = affine[ch] * stats[c + ch];
        terms[c + ch] = affine[c + ch] - stats[ch] * terms[ch];
    }
    return SPCONV_OK;
}

/* Rows [begin, end) of [*, c]: y = x * scale + shift in double, rounded to T, then with relu
 * y < 0 ? 0 : y (NaN kept, as in spconv__cpu_relu_forward). Every version of the clones rounds
 * the product and the sum each (no contraction in ISO C), so all give the same bits. A NaN y is
 * stored as the default quiet NaN: which of two NaN operands an add returns is unspecified (the
 * compiler may swap them), so without this the fused and the plain loop could differ. */
#define BN_ROWS(NAME, T)                                                                           \
    SPCONV__VECTOR_CLONES                                                                          \
    static void NAME(const T *src, T *dst, int64_t begin, int64_t end, int64_t c,                 \
                     const double *restrict scale, const double *restrict shift, int relu) {       \
        for (int64_t r = begin; r < end; ++r) {                                                    \
            const T *in = src + r * c;                                                             \
            T *out = dst + r * c;                                                                  \
            if (relu)                                                                              \
                for (int64_t ch = 0; ch < c; ++ch) {                                               \
                    const T v = (T)(in[ch] * scale[ch] + shift[ch]);                               \
                    out[ch] = v != v ? (T)NAN : v < 0 ? 0 : v;                                     \
                }                                                                                  \
            else                                                                                   \
                for (int64_t ch = 0; ch < c; ++ch) {                                               \
                    const T v = (T)(in[ch] * scale[ch] + shift[ch]);                               \
                    out[ch] = v != v ? (T)NAN : v;                                                 \
                }                                                                                  \
        }                                                                                          \
    }
BN_ROWS(bn_rows_f32, float)
BN_ROWS(bn_rows_f64, double)
#undef BN_ROWS

void spconv__cpu_bn_rows(spconv_dtype dtype, const void *src, void *dst, int64_t begin,
                         int64_t end, int64_t c, const double *scale, const double *shift,
                         int relu) {
    if (dtype == SPCONV_F32)
        bn_rows_f32(src, dst, begin, end, c, scale, shift, relu);
    else
        bn_rows_f64(src, dst, begin, end, c, scale, shift, relu);
}

/* The affine pass does a few operations per element in double, more than bandwidth alone: worth
 * a team from fewer elements than the pure copies. */
#define BN_PARALLEL_MIN (1 << 17)

spconv_status spconv__cpu_batchnorm_apply(spconv_context *ctx, const spconv_tensor *x,
                                          const double *scale, const double *shift, int relu,
                                          spconv_tensor *y) {
    const int threads = spconv_context_num_threads(ctx);
    (void)threads; /* only the OpenMP pragmas read it */
    const int64_t n = spconv_tensor_size(x, 0), c = spconv_tensor_size(x, 1);
    const int64_t blocks = (n + BLOCK_ROWS - 1) / BLOCK_ROWS;
    const int f32 = spconv_tensor_dtype(x) == SPCONV_F32;
    const void *src = spconv_tensor_data(x);
    void *dst = spconv_tensor_data(y);
    SPCONV_OMP(omp parallel for num_threads(threads) schedule(static) if(n * c > BN_PARALLEL_MIN))
    for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t begin = blk * BLOCK_ROWS, end = begin + BLOCK_ROWS < n ? begin + BLOCK_ROWS : n;
        if (f32)
            bn_rows_f32(src, dst, begin, end, c, scale, shift, relu);
        else
            bn_rows_f64(src, dst, begin, end, c, scale, shift, relu);
    }
    return SPCONV_OK;
}

spconv_status spconv__cpu_batchnorm_backward(spconv_context *ctx, const spconv_tensor *x,
                                             const spconv_tensor *dy, const double *stats,
                                             const double *gamma, spconv_tensor *dx,
                                             double *out_sums) {
    const int threads = spconv_context_num_threads(ctx);
    const int64_t n = spconv_tensor_size(x, 0), c = spconv_tensor_size(x, 1);
    const double *mean = stats, *invstd = stats + c;
    double *dgamma = out_sums, *dbeta = out_sums + c;
    double *sums = malloc((size_t)(2 * c) * sizeof *sums);
    SPCONV_RETURN_ERROR_IF(sums == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "out of host memory for batch norm sums");
    spconv_status st = blocked_sums(x, dy, mean, invstd, 2 * c, threads, sums);
    if (st != SPCONV_OK) {
        free(sums);
        return st;
    }
    for (int64_t ch = 0; ch < c; ++ch) {
        dbeta[ch] = sums[ch];
        dgamma[ch] = sums[c + ch];
    }
    free(sums);
    /* dx = gamma * invstd / n * (n * dy - sum(dy) - xhat * sum(dy * xhat)). */
    const double inv_n = n > 0 ? 1.0 / (double)n : 0.0;
#define BN_BACKWARD(T)                                                                             \
    do {                                                                                           \
        const T *xs = spconv_tensor_data(x), *gs = spconv_tensor_data(dy);                         \
        T *out = spconv_tensor_data(dx);                                                           \
        PARALLEL_FOR(n *c)                                                                         \
        for (int64_t r = 0; r < n; ++r)                                                            \
            for (int64_t ch = 0; ch < c; ++ch) {                                                   \
                double xhat = (xs[r * c + ch] - mean[ch]) * invstd[ch];                            \
                double g = (double)gs[r * c + ch] - (dbeta[ch] + xhat * dgamma[ch]) * inv_n;       \
                out[r * c + ch] = (T)(gamma[ch] * invstd[ch] * g);                                 \
            }                                                                                      \
    } while (0)
    if (spconv_tensor_dtype(x) == SPCONV_F32)
        BN_BACKWARD(float);
    else
        BN_BACKWARD(double);
#undef BN_BACKWARD
    return SPCONV_OK;
}

spconv_status spconv__cpu_relu_forward(spconv_context *ctx, const spconv_tensor *x,
                                       spconv_tensor *y) {
    const int threads = spconv_context_num_threads(ctx);
    (void)threads; /* only the OpenMP pragmas read it */
    const int64_t n = spconv_tensor_numel(x);
    /* "v < 0 ? 0 : v" lets NaN through, as PyTorch's relu does. */
#define RELU(T)                                                                                    \
    do {                                                                                           \
        const T *src = spconv_tensor_data(x);                                                      \
        T *dst = spconv_tensor_data(y);                                                            \
        PARALLEL_FOR(n)                                                                            \
        for (int64_t i = 0; i < n; ++i) dst[i] = src[i] < 0 ? 0 : src[i];                          \
    } while (0)
    if (spconv_tensor_dtype(x) == SPCONV_F32)
        RELU(float);
    else
        RELU(double);
#undef RELU
    return SPCONV_OK;
}

spconv_status spconv__cpu_relu_backward(spconv_context *ctx, const spconv_tensor *y,
                                        const spconv_tensor *dy, spconv_tensor *dx) {
    const int threads = spconv_context_num_threads(ctx);
    (void)threads; /* only the OpenMP pragmas read it */
    const int64_t n = spconv_tensor_numel(y);
#define RELU_BACKWARD(T)                                                                           \
    do {                                                                                           \
        const T *out = spconv_tensor_data(y), *g = spconv_tensor_data(dy);                         \
        T *dst = spconv_tensor_data(dx);                                                           \
        PARALLEL_FOR(n)                                                                            \
        for (int64_t i = 0; i < n; ++i) {                                                          \
            const T gi = g[i]; /* read always: a select, not a branch per element */               \
            dst[i] = out[i] > 0 ? gi : 0;                                                          \
        }                                                                                          \
    } while (0)
    if (spconv_tensor_dtype(y) == SPCONV_F32)
        RELU_BACKWARD(float);
    else
        RELU_BACKWARD(double);
#undef RELU_BACKWARD
    return SPCONV_OK;
}

spconv_status spconv__cpu_axpy(spconv_context *ctx, double alpha, const spconv_tensor *x,
                               spconv_tensor *y) {
    const int threads = spconv_context_num_threads(ctx);
    (void)threads; /* only the OpenMP pragmas read it */
    const int64_t n = spconv_tensor_numel(x);
#define AXPY(T)                                                                                    \
    do {                                                                                           \
        const T *src = spconv_tensor_data(x);                                                      \
        T *dst = spconv_tensor_data(y);                                                            \
        PARALLEL_FOR(n)                                                                            \
        for (int64_t i = 0; i < n; ++i) dst[i] = (T)(dst[i] + alpha * src[i]);                     \
    } while (0)
    if (spconv_tensor_dtype(x) == SPCONV_F32)
        AXPY(float);
    else
        AXPY(double);
#undef AXPY
    return SPCONV_OK;
}

spconv_status spconv__cpu_to_dense_gather(spconv_context *ctx, const spconv_tensor *dense,
                                          const spconv_tensor *indices, spconv_tensor *features) {
    const int threads = spconv_context_num_threads(ctx);
    (void)threads; /* only the OpenMP pragmas read it */
    const int64_t n = spconv_tensor_size(features, 0), c = spconv_tensor_size(features, 1);
    /* dense is [B, C*D, H, W] with channel c*D + z (HeightCompression's order). */
    const int64_t cd = spconv_tensor_size(dense, 1), h = spconv_tensor_size(dense, 2),
                  w = spconv_tensor_size(dense, 3), d = cd / c;
    const int32_t *idx = spconv_tensor_data(indices);
#define GATHER(T)                                                                                  \
    do {                                                                                           \
        const T *src = spconv_tensor_data(dense);                                                  \
        T *dst = spconv_tensor_data(features);                                                     \
        PARALLEL_FOR(n *c)                                                                         \
        for (int64_t r = 0; r < n; ++r) {                                                          \
            const int32_t *site = idx + 4 * r;                                                     \
            int64_t base =                                                                         \
                ((int64_t)site[0] * cd + site[1]) * h * w + (int64_t)site[2] * w + site[3];        \
            for (int64_t ch = 0; ch < c; ++ch) dst[r * c + ch] = src[base + ch * d * h * w];       \
        }                                                                                          \
    } while (0)
    if (spconv_tensor_dtype(features) == SPCONV_F32)
        GATHER(float);
    else
        GATHER(double);
#undef GATHER
    return SPCONV_OK;
}

void spconv__net_to_doubles(const spconv_tensor *t, double *dst) {
    const int64_t n = spconv_tensor_numel(t);
    const spconv_dtype dtype = spconv_tensor_dtype(t);
    const size_t size = spconv_dtype_size(dtype);
    const char *src = spconv_tensor_data(t);
    for (int64_t i = 0; i < n; ++i) dst[i] = spconv__load_floating(src + (size_t)i * size, dtype);
}

void spconv__net_from_doubles(const double *src, spconv_tensor *t) {
    const int64_t n = spconv_tensor_numel(t);
    const spconv_dtype dtype = spconv_tensor_dtype(t);
    const size_t size = spconv_dtype_size(dtype);
    char *dst = spconv_tensor_data(t);
    for (int64_t i = 0; i < n; ++i) spconv__store_from_floating(dst + (size_t)i * size, dtype, src[i]);
}

/* Row @p r's site, checked against the map's batch and spatial sizes, and not seen before. */
static spconv_status check_site(const int32_t *q, int64_t r, const int64_t dims[4],
                                unsigned char *seen) {
    int inside = q[0] >= 0 && q[0] < dims[0] && q[1] >= 0 && q[1] < dims[1] && q[2] >= 0 &&
                 q[2] < dims[2] && q[3] >= 0 && q[3] < dims[3];
    SPCONV_RETURN_ERROR_IF(!inside, SPCONV_ERR_OUT_OF_RANGE,
                           "indices row %" PRId64 " = (%d, %d, %d, %d) is outside batch size "
                           "%" PRId64 " and spatial shape (%" PRId64 ", %" PRId64 ", %" PRId64 ")",
                           r, q[0], q[1], q[2], q[3], dims[0], dims[1], dims[2], dims[3]);
    int64_t cell = ((q[0] * dims[1] + q[1]) * dims[2] + q[2]) * dims[3] + q[3];
    SPCONV_RETURN_ERROR_IF(seen[cell / 8] & (1u << (cell % 8)), SPCONV_ERR_DUPLICATE_INDEX,
                           "indices row %" PRId64 " = (%d, %d, %d, %d) repeats an earlier row", r,
                           q[0], q[1], q[2], q[3]);
    seen[cell / 8] |= (unsigned char)(1u << (cell % 8));
    return SPCONV_OK;
}

/* Check every site of @p idx ([n, 4]) against dims (B, D, H, W) before anything is written (the
 * sites of a to_dense that follows no conv come straight from the caller), and give each row's
 * element offset at[r] in a [B, C*D, H, W] map with @p c channels. */
static spconv_status site_offsets(const int32_t *idx, int64_t n, const int64_t dims[4], int64_t c,
                                  int64_t *at) {
    const int64_t cells = dims[0] * dims[1] * dims[2] * dims[3];
    unsigned char *seen = calloc((size_t)(cells / 8 + 1), 1);
    SPCONV_RETURN_ERROR_IF(seen == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "out of host memory for the occupancy bitmap of the dense map");
    spconv_status st = SPCONV_OK;
    const int64_t plane = dims[2] * dims[3];
    for (int64_t r = 0; r < n && st == SPCONV_OK; ++r) {
        const int32_t *q = idx + 4 * r;
        st = check_site(q, r, dims, seen);
        at[r] = ((int64_t)q[0] * c * dims[1] + q[1]) * plane + (int64_t)q[2] * dims[3] + q[3];
    }
    free(seen);
    return st;
}

spconv_status spconv__cpu_to_dense_scatter(spconv_context *ctx, const spconv_tensor *features,
                                           const spconv_tensor *indices, spconv_tensor *dense) {
    const int threads = spconv_context_num_threads(ctx);
    const int64_t n = spconv_tensor_size(features, 0), c = spconv_tensor_size(features, 1);
    const int64_t dims[4] = {spconv_tensor_size(dense, 0), spconv_tensor_size(dense, 1) / c,
                             spconv_tensor_size(dense, 2), spconv_tensor_size(dense, 3)};
    int64_t *at = malloc((size_t)(n > 0 ? n : 1) * sizeof *at);
    SPCONV_RETURN_ERROR_IF(at == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "out of host memory for %" PRId64 " site offsets", n);
    spconv_status st = site_offsets(spconv_tensor_data(indices), n, dims, c, at);
    if (st != SPCONV_OK) {
        free(at);
        return st;
    }
    /* [B, C * D, H, W] is [B, C, cells] with cells = D * H * W, as spconv_sparse_to_dense's map. */
    spconv__cpu_scatter_channels(threads, spconv_dtype_size(spconv_tensor_dtype(dense)),
                                 spconv_tensor_data(features), n, c, at,
                                 dims[1] * dims[2] * dims[3], dims[0], spconv_tensor_data(dense));
    free(at);
    return SPCONV_OK;
}
