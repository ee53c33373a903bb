/* The network's own layers on the GPU (the slots of core/backend.h after dense_to_sparse): batch
 * norm (statistics, apply, backward), ReLU, axpy and the TO_DENSE scatter / gather, in f32 and
 * f64, with the CPU kernels' arithmetic (src/net/net_kernels.c): per-channel sums in double over
 * fixed blocks of BLOCK_ROWS rows, the blocks' partial sums added in block order by one thread per
 * channel, on the device: batch statistics, terms and parameter gradients stay there (the slots'
 * contract), so no layer waits for the device. No floating-point atomics. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/backend.h"
#include "core/error.h"
#include "cuda_check.h"
#include "cuda_common.h"
#include "site_check.h"

#define NET_THREADS 256
#define BLOCK_ROWS 1024 /* the CPU's block of rows (net_kernels.c) */

/* ---- kernels -------------------------------------------------------------------------------- */

/* A product, a sum and a difference in double, each rounded on its own as the CPU computes them
 * (GCC does not contract in ISO C mode): nvcc would otherwise fuse a product into the sum that
 * follows it (one fma, one rounding) and change last bits. The emulation compiles the plain
 * operators, as the CPU does. */
static __device__ __forceinline__ double mul_rn(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}

static __device__ __forceinline__ double add_rn(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}

static __device__ __forceinline__ double sub_rn(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dsub_rn(a, b);
#else
    return a - b;
#endif
}

/* partial[blk, ch] = sum over the block's rows of x (center NULL) or (x - center)^2. */
template <typename T>
__global__ void sum_rows_kernel(double *__restrict__ partial, const T *__restrict__ x,
                                const double *__restrict__ center, int64_t n, int64_t c,
                                int64_t blocks) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < blocks * c; i += step) {
        const int64_t blk = i / c, ch = i % c;
        const int64_t end = (blk + 1) * BLOCK_ROWS < n ? (blk + 1) * BLOCK_ROWS : n;
        double acc = 0.0;
        for (int64_t r = blk * BLOCK_ROWS; r < end; ++r) {
            const double v = center != NULL ? x[r * c + ch] - center[ch] : x[r * c + ch];
            acc = add_rn(acc, center != NULL ? mul_rn(v, v) : v);
        }
        partial[i] = acc;
    }
}

/* partial[blk, ch] = sum dy * xhat (dgamma's), partial[blk, c + ch] = sum dy (dbeta's) over the
 * block's rows. */
template <typename T>
__global__ void sum_grad_rows_kernel(double *__restrict__ partial, const T *__restrict__ x,
                                     const T *__restrict__ dy, const double *__restrict__ mean,
                                     const double *__restrict__ invstd, int64_t n, int64_t c,
                                     int64_t blocks) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < blocks * c; i += step) {
        const int64_t blk = i / c, ch = i % c;
        const int64_t end = (blk + 1) * BLOCK_ROWS < n ? (blk + 1) * BLOCK_ROWS : n;
        double sum_dy = 0.0, sum_dy_xhat = 0.0;
        for (int64_t r = blk * BLOCK_ROWS; r < end; ++r) {
            sum_dy += dy[r * c + ch];
            sum_dy_xhat = add_rn(sum_dy_xhat,
                                 mul_rn(dy[r * c + ch], (x[r * c + ch] - mean[ch]) * invstd[ch]));
        }
        partial[blk * 2 * c + ch] = sum_dy_xhat;
        partial[blk * 2 * c + c + ch] = sum_dy;
    }
}

template <typename T>
__global__ void bn_apply_kernel(T *y, const T *x,
                                const double *scale, const double *shift,
                                int relu, int64_t n, int64_t c) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * c; i += step) {
        const T v = (T)add_rn(mul_rn((double)x[i], scale[i % c]), shift[i % c]);
        /* a NaN as the default quiet NaN, as on the CPU (which NaN an add returns varies) */
        y[i] = v != v ? (T)NAN : relu && v < 0 ? (T)0 : v;
    }
}

/* total[ch] = the sum over blocks, in block order from 0, of partial[blk, ch] ([blocks, width]):
 * one thread per column, as the CPU adds its blocks' sums. Then, by @p finish:
 *   FINISH_MEAN:   total / n (0 when n is 0), the batch mean;
 *   FINISH_SPREAD: the squared deviations' total into invstd = 1 / sqrt(total / n + eps) and the
 *                  unbiased variance total / (n - 1) (0 for n < 2), at total + width and + 2 width;
 *   FINISH_SUMS:   the total as it is (a backward's dbeta and dgamma sums). */
enum { FINISH_MEAN, FINISH_SPREAD, FINISH_SUMS };

__global__ void finish_sums_kernel(double *__restrict__ total, const double *__restrict__ partial,
                                   int64_t blocks, int64_t width, int64_t n, double eps,
                                   int finish) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t ch = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; ch < width; ch += step) {
        double sum = 0.0;
        for (int64_t blk = 0; blk < blocks; ++blk) sum = add_rn(sum, partial[blk * width + ch]);
        if (finish == FINISH_MEAN) {
            total[ch] = n > 0 ? sum / (double)n : 0.0;
        } else if (finish == FINISH_SPREAD) {
            total[width + ch] = 1.0 / sqrt(add_rn(n > 0 ? sum / (double)n : 0.0, eps));
            total[2 * width + ch] = n > 1 ? sum / (double)(n - 1) : 0.0;
        } else {
            total[ch] = sum;
        }
    }
}

/* terms[ch] = scale = gamma * invstd, terms[c + ch] = shift = beta - mean * scale: each product
 * and difference rounded on its own, as on the CPU. */
__global__ void bn_terms_kernel(double *__restrict__ terms, const double *__restrict__ affine,
                                const double *__restrict__ stats, int64_t c) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t ch = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; ch < c; ch += step) {
        const double scale = mul_rn(affine[ch], stats[c + ch]);
        terms[ch] = scale;
        terms[c + ch] = sub_rn(affine[c + ch], mul_rn(stats[ch], scale));
    }
}

/* dx = gamma * invstd * (dy - (dbeta + xhat * dgamma) / n), with stats [3c] (mean, invstd, ...)
 * and sums [2c] (dgamma, dbeta). */
template <typename T>
__global__ void bn_backward_kernel(T *dx, const T *x,
                                   const T *dy, const double *gammas, const double *stats,
                                   const double *sums, double inv_n, int64_t n, int64_t c) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * c; i += step) {
        const int64_t ch = i % c;
        const double gamma = gammas[ch], invstd = stats[c + ch], mean = stats[ch];
        const double dbeta = sums[c + ch], dgamma = sums[ch];
        const double xhat = (x[i] - mean) * invstd;
        const double g = sub_rn((double)dy[i], mul_rn(add_rn(dbeta, mul_rn(xhat, dgamma)), inv_n));
        dx[i] = (T)(gamma * invstd * g);
    }
}

/* "v < 0 ? 0 : v" lets NaN through, as the CPU kernel and PyTorch do. These kernels (and the
 * batch-norm ones) may run in place, so their operands are not __restrict__. */
template <typename T>
__global__ void relu_kernel(T *y, const T *x, int64_t n) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
        y[i] = x[i] < 0 ? (T)0 : x[i];
}

template <typename T>
__global__ void relu_backward_kernel(T *dx, const T *y,
                                     const T *dy, int64_t n) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
        dx[i] = y[i] > 0 ? dy[i] : (T)0;
}

template <typename T>
__global__ void axpy_kernel(T *__restrict__ y, const T *__restrict__ x, double alpha, int64_t n) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
        y[i] = (T)add_rn((double)y[i], mul_rn(alpha, (double)x[i]));
}

struct grid_dims {
    int64_t d[4];
};

/* dense[b, ch * D + z, y, x] = features[r, ch]; rows are distinct cells (checked). */
template <typename T>
__global__ void to_dense_kernel(T *__restrict__ dense, const T *__restrict__ features,
                                const int32_t *__restrict__ idx, grid_dims dims, int64_t n,
                                int64_t c) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    const int64_t plane = dims.d[2] * dims.d[3], block = dims.d[1] * plane;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * c; i += step) {
        const int64_t r = i / c, ch = i % c;
        const int32_t *q = idx + 4 * r;
        const int64_t at = ((int64_t)q[0] * c * dims.d[1] + q[1]) * plane + (int64_t)q[2] * dims.d[3] + q[3];
        dense[at + ch * block] = features[i];
    }
}

template <typename T>
__global__ void from_dense_kernel(T *__restrict__ features, const T *__restrict__ dense,
                                  const int32_t *__restrict__ idx, int64_t cd, int64_t h,
                                  int64_t w, int64_t n, int64_t c) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    const int64_t d = cd / c;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * c; i += step) {
        const int64_t r = i / c, ch = i % c;
        const int32_t *q = idx + 4 * r;
        const int64_t base = ((int64_t)q[0] * cd + q[1]) * h * w + (int64_t)q[2] * w + q[3];
        features[i] = dense[base + ch * d * h * w];
    }
}

/* ---- host side ------------------------------------------------------------------------------ */

/* Device, stream, launch size and temporaries of one call. */
struct net_call {
    spconv__cuda_device_guard guard;
    cudaStream_t stream = NULL;
    int blocks = 1;
    spconv_device device = {};
    spconv__cuda_scratch scratch;

    /* No wait at the end: scratch of the call's own (a call without a context of this device)
     * comes from the backend's pool or a hook and goes back stream-ordered, after the kernels
     * queued here; the context's workspace stays, and the next call is queued behind this one. */
    net_call() = default;
    net_call(const net_call &) = delete;
    net_call &operator=(const net_call &) = delete;

    spconv_status enter(spconv_context *ctx, const spconv_tensor *t) {
        device = spconv_tensor_device(t);
        SPCONV_FORWARD_IF_ERROR(guard.enter(device.index));
        stream = spconv__cuda_stream_for(ctx, device.index);
        int resident = 0;
        SPCONV_FORWARD_IF_ERROR(spconv__cuda_resident_blocks(NET_THREADS, &resident));
        blocks = resident > 0 ? resident : 1;
        return SPCONV_OK;
    }

    int grid(int64_t work) const {
        const int64_t needed = (work + NET_THREADS - 1) / NET_THREADS;
        return (int)(needed < blocks ? (needed > 0 ? needed : 1) : blocks);
    }

    /* Scratch for @p count arrays of doubles of lengths[i] elements (in the context's workspace),
     * before any of them is taken with doubles(). */
    spconv_status reserve_doubles(spconv_context *ctx, int count, const int64_t *lengths) {
        size_t total = 0;
        for (int i = 0; i < count; ++i)
            total += spconv__cuda_scratch::piece_bytes(array_bytes(lengths[i]));
        return scratch.reserve("the cuda backend's network layers", ctx, device, total);
    }

    /* The next scratch array of @p n doubles. */
    double *doubles(int64_t n) { return (double *)scratch.take(array_bytes(n)); }

private:
    static size_t array_bytes(int64_t n) { return (size_t)(n > 0 ? n : 1) * sizeof(double); }
};

#define NET_LAUNCH(call, kernel, work, ...)                                                        \
    do {                                                                                           \
        if ((work) > 0) {                                                                          \
            SPCONV_CUDA_LAUNCH(kernel, (call).grid(work), NET_THREADS, 0, (call).stream,          \
                               __VA_ARGS__);                                                       \
            CUDA_TRY(cudaGetLastError());                                                          \
        }                                                                                          \
    } while (0)

/* finish_sums_kernel over @p width columns. */
static spconv_status launch_finish(net_call &call, double *total, const double *partial,
                                   int64_t blocks, int64_t width, int64_t n, double eps,
                                   int finish) {
    NET_LAUNCH(call, finish_sums_kernel, width, total, partial, blocks, width, n, eps, finish);
    return SPCONV_OK;
}

template <typename T>
static spconv_status bn_stats_typed(spconv_context *ctx, const spconv_tensor *x, double eps,
                                    double *stats) {
    net_call call;
    SPCONV_FORWARD_IF_ERROR(call.enter(ctx, x));
    const int64_t n = spconv_tensor_size(x, 0), c = spconv_tensor_size(x, 1);
    const int64_t blocks = (n + BLOCK_ROWS - 1) / BLOCK_ROWS;
    const int64_t length = blocks * c;
    SPCONV_FORWARD_IF_ERROR(call.reserve_doubles(ctx, 1, &length));
    double *partial = call.doubles(blocks * c);
    const T *xd = (const T *)spconv_tensor_data(x);
    /* Two passes (mean, then squared deviations), as the CPU computes them. */
    NET_LAUNCH(call, (sum_rows_kernel<T>), blocks * c, partial, xd, (const double *)NULL, n, c,
               blocks);
    SPCONV_FORWARD_IF_ERROR(launch_finish(call, stats, partial, blocks, c, n, eps, FINISH_MEAN));
    NET_LAUNCH(call, (sum_rows_kernel<T>), blocks * c, partial, xd, (const double *)stats, n, c,
               blocks);
    SPCONV_FORWARD_IF_ERROR(
        launch_finish(call, stats, partial, blocks, c, n, eps, FINISH_SPREAD));
    return SPCONV_OK;
}

static spconv_status check_float(const char *what, const spconv_tensor *t) {
    const spconv_dtype dtype = spconv_tensor_dtype(t);
    SPCONV_RETURN_ERROR_IF(dtype != SPCONV_F32 && dtype != SPCONV_F64, SPCONV_ERR_NOT_SUPPORTED,
                           "the cuda backend's %s kernel computes in f32 or f64, not %s", what,
                           spconv_dtype_name(dtype));
    return SPCONV_OK;
}

extern "C" spconv_status spconv__cuda_batchnorm_stats(spconv_context *ctx, const spconv_tensor *x,
                                                      double eps, double *stats) {
    SPCONV_FORWARD_IF_ERROR(check_float("batch-norm statistics", x));
    return spconv_tensor_dtype(x) == SPCONV_F32 ? bn_stats_typed<float>(ctx, x, eps, stats)
                                                : bn_stats_typed<double>(ctx, x, eps, stats);
}

extern "C" spconv_status spconv__cuda_batchnorm_terms(spconv_context *ctx, const spconv_tensor *x,
                                                      const double *affine, const double *stats,
                                                      double *terms) {
    net_call call;
    SPCONV_FORWARD_IF_ERROR(call.enter(ctx, x));
    const int64_t c = spconv_tensor_size(x, 1);
    NET_LAUNCH(call, bn_terms_kernel, c, terms, affine, stats, c);
    return SPCONV_OK;
}

template <typename T>
static spconv_status bn_apply_typed(spconv_context *ctx, const spconv_tensor *x,
                                    const double *scale, const double *shift, int relu,
                                    spconv_tensor *y) {
    net_call call;
    SPCONV_FORWARD_IF_ERROR(call.enter(ctx, x));
    const int64_t n = spconv_tensor_size(x, 0), c = spconv_tensor_size(x, 1);
    /* scale and shift are device arrays (the slot's contract): nothing to upload, no wait. */
    NET_LAUNCH(call, (bn_apply_kernel<T>), n * c, (T *)spconv_tensor_data(y),
               (const T *)spconv_tensor_data(x), scale, shift, relu, n, c);
    return SPCONV_OK;
}

extern "C" spconv_status spconv__cuda_batchnorm_apply(spconv_context *ctx, const spconv_tensor *x,
                                                      const double *scale, const double *shift,
                                                      int relu, spconv_tensor *y) {
    SPCONV_FORWARD_IF_ERROR(check_float("batch norm", x));
    return spconv_tensor_dtype(x) == SPCONV_F32
               ? bn_apply_typed<float>(ctx, x, scale, shift, relu, y)
               : bn_apply_typed<double>(ctx, x, scale, shift, relu, y);
}

template <typename T>
static spconv_status bn_backward_typed(spconv_context *ctx, const spconv_tensor *x,
                                       const spconv_tensor *dy, const double *stats,
                                       const double *gamma, spconv_tensor *dx, double *sums) {
    net_call call;
    SPCONV_FORWARD_IF_ERROR(call.enter(ctx, x));
    const int64_t n = spconv_tensor_size(x, 0), c = spconv_tensor_size(x, 1);
    const int64_t blocks = (n + BLOCK_ROWS - 1) / BLOCK_ROWS;
    const int64_t length = blocks * 2 * c;
    SPCONV_FORWARD_IF_ERROR(call.reserve_doubles(ctx, 1, &length));
    double *partial = call.doubles(length);
    const T *xd = (const T *)spconv_tensor_data(x), *gd = (const T *)spconv_tensor_data(dy);
    /* partial [blocks, 2c]: sum dy xhat (dgamma) then sum dy (dbeta), finished into sums */
    NET_LAUNCH(call, (sum_grad_rows_kernel<T>), blocks * c, partial, xd, gd, stats, stats + c, n,
               c, blocks);
    SPCONV_FORWARD_IF_ERROR(launch_finish(call, sums, partial, blocks, 2 * c, n, 0.0,
                                          FINISH_SUMS));
    NET_LAUNCH(call, (bn_backward_kernel<T>), n * c, (T *)spconv_tensor_data(dx), xd, gd, gamma,
               stats, (const double *)sums, n > 0 ? 1.0 / (double)n : 0.0, n, c);
    return SPCONV_OK;
}

extern "C" spconv_status spconv__cuda_batchnorm_backward(spconv_context *ctx,
                                                         const spconv_tensor *x,
                                                         const spconv_tensor *dy,
                                                         const double *stats, const double *gamma,
                                                         spconv_tensor *dx, double *sums) {
    SPCONV_FORWARD_IF_ERROR(check_float("batch-norm backward", x));
    return spconv_tensor_dtype(x) == SPCONV_F32
               ? bn_backward_typed<float>(ctx, x, dy, stats, gamma, dx, sums)
               : bn_backward_typed<double>(ctx, x, dy, stats, gamma, dx, sums);
}

extern "C" spconv_status spconv__cuda_relu_forward(spconv_context *ctx, const spconv_tensor *x,
                                                   spconv_tensor *y) {
    SPCONV_FORWARD_IF_ERROR(check_float("ReLU", x));
    net_call call;
    SPCONV_FORWARD_IF_ERROR(call.enter(ctx, x));
    const int64_t n = spconv_tensor_numel(x);
    if (spconv_tensor_dtype(x) == SPCONV_F32)
        NET_LAUNCH(call, relu_kernel<float>, n, (float *)spconv_tensor_data(y),
                   (const float *)spconv_tensor_data(x), n);
    else
        NET_LAUNCH(call, relu_kernel<double>, n, (double *)spconv_tensor_data(y),
                   (const double *)spconv_tensor_data(x), n);
    return SPCONV_OK;
}

extern "C" spconv_status spconv__cuda_relu_backward(spconv_context *ctx, const spconv_tensor *y,
                                                    const spconv_tensor *dy, spconv_tensor *dx) {
    SPCONV_FORWARD_IF_ERROR(check_float("ReLU backward", y));
    net_call call;
    SPCONV_FORWARD_IF_ERROR(call.enter(ctx, y));
    const int64_t n = spconv_tensor_numel(y);
    if (spconv_tensor_dtype(y) == SPCONV_F32)
        NET_LAUNCH(call, relu_backward_kernel<float>, n, (float *)spconv_tensor_data(dx),
                   (const float *)spconv_tensor_data(y), (const float *)spconv_tensor_data(dy), n);
    else
        NET_LAUNCH(call, relu_backward_kernel<double>, n, (double *)spconv_tensor_data(dx),
                   (const double *)spconv_tensor_data(y), (const double *)spconv_tensor_data(dy),
                   n);
    return SPCONV_OK;
}

extern "C" spconv_status spconv__cuda_axpy(spconv_context *ctx, double alpha,
                                           const spconv_tensor *x, spconv_tensor *y) {
    SPCONV_FORWARD_IF_ERROR(check_float("axpy", y));
    net_call call;
    SPCONV_FORWARD_IF_ERROR(call.enter(ctx, y));
    const int64_t n = spconv_tensor_numel(x);
    if (spconv_tensor_dtype(y) == SPCONV_F32)
        NET_LAUNCH(call, axpy_kernel<float>, n, (float *)spconv_tensor_data(y),
                   (const float *)spconv_tensor_data(x), alpha, n);
    else
        NET_LAUNCH(call, axpy_kernel<double>, n, (double *)spconv_tensor_data(y),
                   (const double *)spconv_tensor_data(x), alpha, n);
    return SPCONV_OK;
}

extern "C" spconv_status spconv__cuda_to_dense_scatter(spconv_context *ctx,
                                                       const spconv_tensor *features,
                                                       const spconv_tensor *indices,
                                                       spconv_tensor *dense) {
    SPCONV_FORWARD_IF_ERROR(check_float("to-dense", features));
    net_call call;
    SPCONV_FORWARD_IF_ERROR(call.enter(ctx, features));
    const int64_t n = spconv_tensor_size(features, 0), c = spconv_tensor_size(features, 1);
    grid_dims dims = {{spconv_tensor_size(dense, 0), spconv_tensor_size(dense, 1) / c,
                       spconv_tensor_size(dense, 2), spconv_tensor_size(dense, 3)}};
    const int32_t *idx = (const int32_t *)spconv_tensor_data(indices);
    /* Every site is checked before anything is written, as on the CPU: the first bad row in row
     * order is named, whether outside the map or repeating an earlier row. */
    spconv__site_check bad;
    SPCONV_FORWARD_IF_ERROR(
        spconv__cuda_check_sites("to-dense", ctx, call.stream, call.blocks, idx, n, dims.d,
                                 &bad));
    const int32_t *q = bad.site;
    if (bad.bad_row != INT32_MAX && bad.repeated)
        return spconv__error(SPCONV_ERR_DUPLICATE_INDEX,
                             "indices row %d = (%d, %d, %d, %d) repeats an earlier row",
                             bad.bad_row, q[0], q[1], q[2], q[3]);
    if (bad.bad_row != INT32_MAX)
        return spconv__error(SPCONV_ERR_OUT_OF_RANGE,
                             "indices row %d = (%d, %d, %d, %d) is outside batch size %lld and "
                             "spatial shape (%lld, %lld, %lld)",
                             bad.bad_row, q[0], q[1], q[2], q[3], (long long)dims.d[0],
                             (long long)dims.d[1], (long long)dims.d[2], (long long)dims.d[3]);
    const size_t bytes =
        (size_t)spconv_tensor_numel(dense) * spconv_dtype_size(spconv_tensor_dtype(dense));
    if (bytes > 0) CUDA_TRY(cudaMemsetAsync(spconv_tensor_data(dense), 0, bytes, call.stream));
    if (spconv_tensor_dtype(features) == SPCONV_F32)
        NET_LAUNCH(call, to_dense_kernel<float>, n * c, (float *)spconv_tensor_data(dense),
                   (const float *)spconv_tensor_data(features), idx, dims, n, c);
    else
        NET_LAUNCH(call, to_dense_kernel<double>, n * c, (double *)spconv_tensor_data(dense),
                   (const double *)spconv_tensor_data(features), idx, dims, n, c);
    return SPCONV_OK;
}

extern "C" spconv_status spconv__cuda_to_dense_gather(spconv_context *ctx,
                                                      const spconv_tensor *dense,
                                                      const spconv_tensor *indices,
                                                      spconv_tensor *features) {
    SPCONV_FORWARD_IF_ERROR(check_float("to-dense backward", dense));
    net_call call;
    SPCONV_FORWARD_IF_ERROR(call.enter(ctx, dense));
    const int64_t n = spconv_tensor_size(features, 0), c = spconv_tensor_size(features, 1);
    const int32_t *idx = (const int32_t *)spconv_tensor_data(indices);
    const int64_t cd = spconv_tensor_size(dense, 1), h = spconv_tensor_size(dense, 2),
                  w = spconv_tensor_size(dense, 3);
    if (spconv_tensor_dtype(dense) == SPCONV_F32)
        NET_LAUNCH(call, from_dense_kernel<float>, n * c, (float *)spconv_tensor_data(features),
                   (const float *)spconv_tensor_data(dense), idx, cd, h, w, n, c);
    else
        NET_LAUNCH(call, from_dense_kernel<double>, n * c, (double *)spconv_tensor_data(features),
                   (const double *)spconv_tensor_data(dense), idx, cd, h, w, n, c);
    return SPCONV_OK;
}
