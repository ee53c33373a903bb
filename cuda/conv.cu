/* indice_conv and max pooling on the GPU, in f32 and f64, and the conv in f16 and bf16 as well
 * (below): per active kernel offset, in increasing
 * k, gather the source rows of a chunk of its pairs, one cuBLAS product with W[k], scatter-add
 * into the target rows; the subm centre offset (pairs (r, r)) is one product on the features
 * themselves. Within an offset every target row appears at most once, so a scatter needs no
 * atomics, and offsets and chunks run in a fixed order on one stream: the same inputs give the
 * same bits on the same GPU, run after run (no floating-point atomics anywhere).
 *
 * A rulebook built on the CPU has its pairs in host memory; they are copied to the device for
 * the call (a rulebook built on the device is used in place). The per-offset counts are host
 * arrays in every rulebook, since the host sizes each launch.
 *
 * What a call uses comes from its context (context.h): the stream, the cuBLAS handle, the
 * workspace for the gathered operands and products, the allocator for the outputs, and whether
 * f32 products may use TF32.
 *
 * f16 and bf16 convs keep their operands in 16 bits: rows are gathered as they are, the products
 * take the 16-bit values (cublasGemmEx, CUBLAS_COMPUTE_32F: tensor cores, sums in f32) into f32
 * results, which are scatter-added into f32 outputs and gradients, and each of those is rounded
 * once to the operands' dtype at the end (conv/half.h's contract: the numbers of converting the
 * operands to f32 first, with half the gather traffic and 16-bit products). Max pooling in 16
 * bits goes through conv/half.c. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include <vector>

#include "core/backend.h"
#include "core/context_impl.h"
#include "core/device_clock.h"
#include "core/error.h"
#include "cuda_check.h"
#include "cuda_common.h"
#include "rulebook/rulebook_impl.h"
#include "tensor/convert.h"
#include "tensor/tensor_impl.h"

extern "C" {
#include "conv/conv_check.h"
}

#define CONV_THREADS 256
/* Bytes of gathered operands per chunk: large enough for long products, small enough that the
 * workspace stays modest whatever the layer. */
#define CONV_CHUNK_BYTES ((size_t)64 << 20)

/* ---- element types ---------------------------------------------------------------------------
 * The 16-bit dtypes as distinct types holding their bits, so that the overloads below pick the
 * cuBLAS data type: the kernels only move them, and read their values through tensor/convert.h. */
struct f16_bits {
    uint16_t bits;
};
struct bf16_bits {
    uint16_t bits;
};

static __device__ __forceinline__ double as_double(float v) { return (double)v; }
static __device__ __forceinline__ double as_double(double v) { return v; }
static __device__ __forceinline__ double as_double(f16_bits v) {
    return (double)spconv__f16_to_f32(v.bits);
}
static __device__ __forceinline__ double as_double(bf16_bits v) {
    return (double)spconv__bf16_to_f32(v.bits);
}

/* The dtype of the accumulation type. */
template <typename A> static spconv_dtype dtype_of();
template <> spconv_dtype dtype_of<float>() { return SPCONV_F32; }
template <> spconv_dtype dtype_of<double>() { return SPCONV_F64; }

/* ---- kernels (grid-stride loops) ------------------------------------------------------------ */

/* dst[i, :] = src[rows[i], :] for i < n. */
template <typename T>
__global__ void gather_rows_kernel(T *__restrict__ dst, const T *__restrict__ src,
                                   const int32_t *__restrict__ rows, int64_t n, int64_t cols) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * cols; i += step) {
        const int64_t r = i / cols, c = i % cols;
        dst[i] = src[(int64_t)rows[r] * cols + c];
    }
}

/* dst[rows[i], :] += src[i, :] for i < n; the rows are distinct. */
template <typename T>
__global__ void scatter_add_rows_kernel(T *__restrict__ dst, const int32_t *__restrict__ rows,
                                        const T *__restrict__ src, int64_t n, int64_t cols) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * cols; i += step) {
        const int64_t r = i / cols, c = i % cols;
        dst[(int64_t)rows[r] * cols + c] += src[i];
    }
}

/* Every row of dst [n, cols] := bias (or 0 when bias is NULL). */
template <typename T>
__global__ void init_rows_kernel(T *__restrict__ dst, const T *__restrict__ bias, int64_t n,
                                 int64_t cols) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * cols; i += step)
        dst[i] = bias != NULL ? bias[i % cols] : (T)0;
}

/* out[c] = sum over rows r, in increasing r, of src[r, c]: one thread per column, in double. */
template <typename Out, typename In>
__global__ void column_sums_kernel(Out *__restrict__ out, const In *__restrict__ src, int64_t n,
                                   int64_t cols) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += step) {
        double sum = 0.0;
        for (int64_t r = 0; r < n; ++r) sum += as_double(src[r * cols + c]);
        out[c] = (Out)sum;
    }
}

/* Max pooling, one offset's pairs: the CPU's rule (first pair takes the output, later ones only
 * when strictly greater, a NaN wins over a number and the first NaN stays). */
template <typename T>
__global__ void pool_pairs_kernel(T *__restrict__ out, int32_t *__restrict__ argmax,
                                  const T *__restrict__ x, const int32_t *__restrict__ pairs_in,
                                  const int32_t *__restrict__ pairs_out, int64_t n, int64_t cols) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * cols; i += step) {
        const int64_t p = i / cols, c = i % cols;
        const int64_t o = (int64_t)pairs_out[p] * cols + c;
        const T v = x[(int64_t)pairs_in[p] * cols + c];
        if (argmax[o] < 0 || v > out[o] || (isnan(v) && !isnan(out[o]))) {
            out[o] = v;
            argmax[o] = pairs_in[p];
        }
    }
}

template <typename T>
__global__ void pool_init_kernel(T *__restrict__ out, int32_t *__restrict__ argmax, int64_t n) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        out[i] = (T)-INFINITY;
        argmax[i] = -1;
    }
}

/* One offset's pairs of the pool backward: d_in[i, c] += d_out[o, c] where the pair (i, o) won
 * channel c. Each input row appears once per offset, so no two threads add to one element. */
template <typename T>
__global__ void pool_backward_kernel(T *__restrict__ d_in, const T *__restrict__ d_out,
                                     const int32_t *__restrict__ argmax,
                                     const int32_t *__restrict__ pairs_in,
                                     const int32_t *__restrict__ pairs_out, int64_t n,
                                     int64_t cols) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * cols; i += step) {
        const int64_t p = i / cols, c = i % cols;
        const int64_t o = (int64_t)pairs_out[p] * cols + c;
        if (argmax[o] == pairs_in[p]) d_in[(int64_t)pairs_in[p] * cols + c] += d_out[o];
    }
}

/* ---- the call's resources ------------------------------------------------------------------- */

/* The cuBLAS handles of calls made without a context of their device (ctx NULL, or a context of
 * another device): one per thread and device, made on first use, bound to the legacy default
 * stream and destroyed when the thread ends. Per thread, since a handle must not be used by two
 * threads at once; kept, since making a handle costs more than most products. */
struct default_blas_handles {
    std::vector<cublasHandle_t> by_device;
    ~default_blas_handles() {
        for (cublasHandle_t h : by_device)
            if (h != NULL) (void)cublasDestroy(h);
    }
};

static spconv_status default_blas(int device, cublasHandle_t *out) {
    static thread_local default_blas_handles handles;
    if ((size_t)device >= handles.by_device.size()) handles.by_device.resize((size_t)device + 1);
    cublasHandle_t &h = handles.by_device[(size_t)device];
    if (h == NULL) {
        CUBLAS_TRY(cublasCreate(&h));
        CUBLAS_TRY(cublasSetStream(h, cudaStreamLegacy));
    }
    *out = h;
    return SPCONV_OK;
}

/* Device, stream, cuBLAS handle, product precision and launch size of one call, its scratch
 * memory and what it must release. */
struct conv_call {
    int device = 0;
    cudaStream_t stream = NULL;
    cublasHandle_t blas = NULL;
    cublasComputeType_t f32_compute = CUBLAS_COMPUTE_32F;
    int blocks = 1;
    spconv__cuda_device_guard guard;
    spconv__cuda_scratch scratch;
    spconv_tensor *held[12] = {};
    int num_held = 0;
    spconv__lap_timer laps = {}; /* phase times on the device clock, when asked for */

    conv_call() = default;
    conv_call(const conv_call &) = delete;
    conv_call &operator=(const conv_call &) = delete;
    ~conv_call() {
        for (int i = 0; i < num_held; ++i) spconv_tensor_release(held[i]);
    }

    /* The context's stream, handle and TF32 setting when it is a context of this device,
     * otherwise the legacy default stream, this thread's default handle and full f32. */
    spconv_status enter(spconv_context *ctx, spconv_device dev) {
        device = dev.index;
        SPCONV_FORWARD_IF_ERROR(guard.enter(device));
        stream = spconv__cuda_stream_for(ctx, device);
        if (ctx != NULL && spconv_device_equal(ctx->device, dev) && ctx->cublas_handle != NULL) {
            blas = (cublasHandle_t)ctx->cublas_handle;
            if (ctx->allow_tf32) f32_compute = CUBLAS_COMPUTE_32F_FAST_TF32;
        } else {
            SPCONV_FORWARD_IF_ERROR(default_blas(device, &blas));
        }
        int resident = 0;
        SPCONV_FORWARD_IF_ERROR(spconv__cuda_resident_blocks(CONV_THREADS, &resident));
        blocks = resident > 0 ? resident : 1;
        return SPCONV_OK;
    }

    /* Time the phases on the device clock the options give, if any. */
    void time_phases(spconv_context *ctx, const spconv__conv_options *options) {
        const spconv__conv_timing *t = options != NULL ? options->timing : NULL;
        if (t != NULL && t->clock != NULL)
            spconv__lap_init(&laps, t->clock, ctx, t->device_ms[0], t->device_ms[1],
                             t->device_ms[2]);
    }

    /* End the running phase and start @p phase (PHASE_END: none). */
    spconv_status lap(int phase) { return spconv__lap(&laps, phase); }

    /* Keep @p t until the call ends and return its data. */
    void *hold(spconv_tensor *t) {
        held[num_held++] = t;
        return spconv_tensor_data(t);
    }

    /* @p t contiguous on this device (a reference, or a copy), held. */
    spconv_status operand(spconv_context *ctx, const spconv_tensor *t, spconv_device dev,
                          const void **data) {
        spconv_tensor *c = NULL;
        SPCONV_FORWARD_IF_ERROR(spconv_tensor_to_device(ctx, t, dev, &c));
        *data = hold(c);
        return SPCONV_OK;
    }

    /* Blocks for a grid-stride loop over @p work elements. */
    int grid(int64_t work) const {
        const int64_t needed = (work + CONV_THREADS - 1) / CONV_THREADS;
        return (int)(needed < blocks ? (needed > 0 ? needed : 1) : blocks);
    }
};

template <typename T>
static spconv_status launch_gather(conv_call &call, T *dst, const T *src, const int32_t *rows,
                                   int64_t n, int64_t cols) {
    if (n * cols == 0) return SPCONV_OK;
    SPCONV_CUDA_LAUNCH((gather_rows_kernel<T>), call.grid(n * cols), CONV_THREADS, 0, call.stream,
                       dst, src, rows, n, cols);
    CUDA_TRY(cudaGetLastError());
    return SPCONV_OK;
}

template <typename T>
static spconv_status launch_scatter_add(conv_call &call, T *dst, const int32_t *rows, const T *src,
                                        int64_t n, int64_t cols) {
    if (n * cols == 0) return SPCONV_OK;
    SPCONV_CUDA_LAUNCH((scatter_add_rows_kernel<T>), call.grid(n * cols), CONV_THREADS, 0,
                       call.stream, dst, rows, src, n, cols);
    CUDA_TRY(cudaGetLastError());
    return SPCONV_OK;
}

/* Row-major C [m, n] = op(A) [m, k] op(B) [k, n] + beta C: cuBLAS is column-major, where a
 * row-major matrix is its transpose, so it computes C^T = op(B)^T op(A)^T. f32 goes through
 * cublasGemmEx so that the compute type is explicit: CUBLAS_COMPUTE_32F (full f32) unless the
 * context allows TF32. */
static cublasStatus_t gemm_rm(const conv_call &call, int ta, int tb, int64_t m, int64_t n,
                              int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb,
                              float beta, float *c, int64_t ldc) {
    const float one = 1.0f;
    return cublasGemmEx(call.blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                        (int)n, (int)m, (int)k, &one, b, CUDA_R_32F, (int)ldb, a, CUDA_R_32F,
                        (int)lda, &beta, c, CUDA_R_32F, (int)ldc, call.f32_compute,
                        CUBLAS_GEMM_DEFAULT);
}

/* 16-bit operands, f32 results: CUBLAS_COMPUTE_32F, so the products accumulate in f32. */
static cublasStatus_t gemm_rm_16(const conv_call &call, cudaDataType type, int ta, int tb,
                                 int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                                 const void *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    const float one = 1.0f;
    return cublasGemmEx(call.blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                        (int)n, (int)m, (int)k, &one, b, type, (int)ldb, a, type, (int)lda, &beta,
                        c, CUDA_R_32F, (int)ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

static cublasStatus_t gemm_rm(const conv_call &call, int ta, int tb, int64_t m, int64_t n,
                              int64_t k, const f16_bits *a, int64_t lda, const f16_bits *b,
                              int64_t ldb, float beta, float *c, int64_t ldc) {
    return gemm_rm_16(call, CUDA_R_16F, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);
}

static cublasStatus_t gemm_rm(const conv_call &call, int ta, int tb, int64_t m, int64_t n,
                              int64_t k, const bf16_bits *a, int64_t lda, const bf16_bits *b,
                              int64_t ldb, float beta, float *c, int64_t ldc) {
    return gemm_rm_16(call, CUDA_R_16BF, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc);
}

static cublasStatus_t gemm_rm(const conv_call &call, int ta, int tb, int64_t m, int64_t n,
                              int64_t k, const double *a, int64_t lda, const double *b,
                              int64_t ldb, double beta, double *c, int64_t ldc) {
    cublasHandle_t h = call.blas;
    const double one = 1.0;
    return cublasDgemm(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n,
                       (int)m, (int)k, &one, b, (int)ldb, a, (int)lda, &beta, c, (int)ldc);
}

/* Products whose sizes cuBLAS's int arguments cannot hold are refused, not truncated. */
static spconv_status check_gemm_sizes(const char *func, int64_t rows, int64_t c_in, int64_t c_out) {
    SPCONV_RETURN_ERROR_IF(rows > INT32_MAX || c_in > INT32_MAX || c_out > INT32_MAX ||
                               c_in * c_out > INT32_MAX,
                           SPCONV_ERR_OVERFLOW,
                           "%s: a product of %lld rows x %lld x %lld channels exceeds cuBLAS's "
                           "int sizes",
                           func, (long long)rows, (long long)c_in, (long long)c_out);
    return SPCONV_OK;
}

static spconv_status check_dtype(const char *func, spconv_dtype dtype) {
    SPCONV_RETURN_ERROR_IF(dtype != SPCONV_F32 && dtype != SPCONV_F64 && dtype != SPCONV_F16 &&
                               dtype != SPCONV_BF16,
                           SPCONV_ERR_NOT_SUPPORTED,
                           "%s: the cuda backend's conv kernels compute on floating-point features (f16, bf16, "
                           "f32, f64), not %s",
                           func, spconv_dtype_name(dtype));
    return SPCONV_OK;
}

/* The rulebook's pairs on the device (held by @p call). */
static spconv_status device_pairs(conv_call &call, spconv_context *ctx, const spconv_rulebook *rb,
                                  spconv_device dev, const int32_t **pairs_in,
                                  const int32_t **pairs_out) {
    const void *a = NULL, *b = NULL;
    SPCONV_FORWARD_IF_ERROR(call.operand(ctx, rb->pairs_in, dev, &a));
    SPCONV_FORWARD_IF_ERROR(call.operand(ctx, rb->pairs_out, dev, &b));
    *pairs_in = (const int32_t *)a;
    *pairs_out = (const int32_t *)b;
    return SPCONV_OK;
}

/* Most pairs per chunk for @p row_elems elements per pair: the largest offset, capped by the
 * chunk budget. */
static int64_t chunk_pairs(const spconv_rulebook *rb, int64_t row_elems, size_t elem) {
    int64_t most = 1;
    for (int64_t j = 0; j < rb->num_active; ++j) {
        const int64_t count = rb->active_starts[j + 1] - rb->active_starts[j];
        if (count > most) most = count;
    }
    const int64_t budget = (int64_t)(CONV_CHUNK_BYTES / ((size_t)(row_elems > 0 ? row_elems : 1) * elem));
    return most < budget ? most : (budget > 1 ? budget : 1);
}

/* Bytes of a scratch buffer of @p elems elements of @p elem bytes (at least one element). */
static size_t scratch_bytes(int64_t elems, size_t elem) {
    return (size_t)(elems > 0 ? elems : 1) * elem;
}

/* The call's gathered operands and products, @p count buffers of elems[i] elements of elem[i]
 * bytes, in the call's scratch (the context's workspace). */
static spconv_status scratch_buffers(const char *func, conv_call &call, spconv_context *ctx,
                                     spconv_device dev, const size_t *elem, int count,
                                     const int64_t *elems, void **buffers) {
    size_t total = 0;
    for (int i = 0; i < count; ++i)
        total += spconv__cuda_scratch::piece_bytes(scratch_bytes(elems[i], elem[i]));
    SPCONV_FORWARD_IF_ERROR(call.scratch.reserve(func, ctx, dev, total));
    for (int i = 0; i < count; ++i)
        buffers[i] = call.scratch.take(scratch_bytes(elems[i], elem[i]));
    return SPCONV_OK;
}

/* Replace the result *t (if any) by its rounding to @p dtype (tensor/convert.h's rules, on the
 * call's stream); on failure *t is released and set to NULL. */
static spconv_status narrow_result(spconv_context *ctx, spconv_dtype dtype, spconv_tensor **t) {
    if (*t == NULL || spconv_tensor_dtype(*t) == dtype) return SPCONV_OK;
    spconv_tensor *rounded = NULL;
    const spconv_status st = spconv_tensor_to_dtype(ctx, *t, dtype, &rounded);
    spconv_tensor_release(*t);
    *t = rounded;
    return st;
}

/* ---- forward ------------------------------------------------------------------------------- */

/* Phases of conv_call::lap, as spconv__conv_timing counts them. */
enum { PHASE_GATHER = 0, PHASE_GEMM = 1, PHASE_SCATTER = 2, PHASE_END = 3 };

/* S: the operands' element type; A: the products' and sums' (S itself, or f32 for 16 bits). */
template <typename S, typename A>
static spconv_status forward_offsets(conv_call &call, const spconv_rulebook *rb,
                                     const spconv__conv_dims &d, const S *x, const S *w,
                                     const int32_t *pin, const int32_t *pout, S *gathered,
                                     A *product, int64_t chunk, A *out) {
    const char *func = "spconv_conv_forward";
    const int64_t identity = rb->center_is_identity ? d.kernel_volume / 2 : -1;
    for (int64_t j = 0; j < rb->num_active && d.c_in > 0; ++j) {
        const int64_t k = rb->active_offsets[j];
        const S *w_k = w + k * d.c_in * d.c_out;
        if (k == identity) {
            SPCONV_FORWARD_IF_ERROR(check_gemm_sizes(func, d.num_out, d.c_in, d.c_out));
            SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_GEMM));
            CUBLAS_TRY(gemm_rm(call, 0, 0, d.num_out, d.c_out, d.c_in, x, d.c_in, w_k,
                               d.c_out, (A)1, out, d.c_out));
            continue;
        }
        for (int64_t first = rb->active_starts[j]; first < rb->active_starts[j + 1];
             first += chunk) {
            const int64_t rows = rb->active_starts[j + 1] - first < chunk
                                     ? rb->active_starts[j + 1] - first
                                     : chunk;
            SPCONV_FORWARD_IF_ERROR(check_gemm_sizes(func, rows, d.c_in, d.c_out));
            SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_GATHER));
            SPCONV_FORWARD_IF_ERROR(launch_gather(call, gathered, x, pin + first, rows, d.c_in));
            SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_GEMM));
            CUBLAS_TRY(gemm_rm(call, 0, 0, rows, d.c_out, d.c_in, gathered, d.c_in, w_k,
                               d.c_out, (A)0, product, d.c_out));
            SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_SCATTER));
            SPCONV_FORWARD_IF_ERROR(
                launch_scatter_add(call, out, pout + first, product, rows, d.c_out));
        }
    }
    return SPCONV_OK;
}

template <typename S, typename A>
static spconv_status forward_typed(spconv_context *ctx, const spconv_rulebook *rb,
                                   const spconv__conv_dims &d, const spconv_tensor *features,
                                   const spconv_tensor *weight, const spconv_tensor *bias,
                                   const spconv__conv_options *options, spconv_tensor **out) {
    conv_call call;
    SPCONV_FORWARD_IF_ERROR(call.enter(ctx, d.device));
    call.time_phases(ctx, options);
    const void *x = NULL, *w = NULL, *b = NULL;
    SPCONV_FORWARD_IF_ERROR(call.operand(ctx, features, d.device, &x));
    SPCONV_FORWARD_IF_ERROR(call.operand(ctx, weight, d.device, &w));
    if (bias != NULL) {
        /* a 16-bit bias starts the f32 sums exactly (every 16-bit value is an f32 one) */
        spconv_tensor *wide = NULL;
        SPCONV_FORWARD_IF_ERROR(spconv_tensor_to_dtype(ctx, bias, dtype_of<A>(), &wide));
        b = call.hold(wide);
    }
    const int32_t *pin = NULL, *pout = NULL;
    SPCONV_FORWARD_IF_ERROR(device_pairs(call, ctx, rb, d.device, &pin, &pout));
    const int64_t chunk = chunk_pairs(rb, d.c_in + d.c_out, sizeof(A));
    const int64_t elems[2] = {chunk * d.c_in, chunk * d.c_out};
    const size_t elem[2] = {sizeof(S), sizeof(A)};
    void *buffers[2] = {};
    SPCONV_FORWARD_IF_ERROR(
        scratch_buffers("spconv_conv_forward", call, ctx, d.device, elem, 2, elems, buffers));
    void *gathered = buffers[0], *product = buffers[1];
    const int64_t sizes[2] = {d.num_out, d.c_out};
    spconv_tensor *result = NULL;
    SPCONV_FORWARD_IF_ERROR(spconv__tensor_empty_in("spconv_conv_forward", ctx, d.device,
                                                    dtype_of<A>(), 2, sizes, &result));
    A *y = (A *)spconv_tensor_data(result);
    spconv_status st = SPCONV_OK;
    if (d.num_out * d.c_out > 0) {
        st = call.lap(PHASE_SCATTER); /* output initialisation counts as scatter, as on the CPU */
        SPCONV_CUDA_LAUNCH((init_rows_kernel<A>), call.grid(d.num_out * d.c_out), CONV_THREADS, 0,
                           call.stream, y, (const A *)b, d.num_out, d.c_out);
        const cudaError_t err = cudaGetLastError();
        if (st == SPCONV_OK && err != cudaSuccess)
            st = spconv__error(SPCONV_ERR_CUDA, "spconv_conv_forward: %s",
                               cudaGetErrorString(err));
        if (st == SPCONV_OK)
            st = forward_offsets<S, A>(call, rb, d, (const S *)x, (const S *)w, pin, pout,
                                       (S *)gathered, (A *)product, chunk, y);
        if (st == SPCONV_OK) st = call.lap(PHASE_END);
    }
    if (st == SPCONV_OK) st = narrow_result(ctx, d.dtype, &result);
    /* No wait for the stream: what the call releases (operand copies, the widened bias, scratch
     * of a call without a context of this device) goes back stream-ordered, through the context's
     * hook (context.h) or the backend's pool (backend.cu), or through cudaFree, which waits for
     * the device itself (a context on a caller's stream), and the workspace
     * stays for the next call on the stream. Layer after layer, the host only queues. */
    if (st != SPCONV_OK) {
        spconv_tensor_release(result);
        return st;
    }
    *out = result;
    return SPCONV_OK;
}

extern "C" spconv_status spconv__cuda_conv_forward(spconv_context *ctx, const spconv_rulebook *rb,
                                                   const spconv_tensor *features,
                                                   const spconv_tensor *weight,
                                                   const spconv_tensor *bias,
                                                   const spconv__conv_options *options,
                                                   spconv_tensor **out) {
    static const char func[] = "spconv_conv_forward";
    spconv__conv_dims d;
    SPCONV_FORWARD_IF_ERROR(spconv__conv_check(func, rb, features, weight, bias, NULL, &d));
    SPCONV_FORWARD_IF_ERROR(check_dtype(func, d.dtype));
    switch (d.dtype) {
    case SPCONV_F32: return forward_typed<float, float>(ctx, rb, d, features, weight, bias, options, out);
    case SPCONV_F16: return forward_typed<f16_bits, float>(ctx, rb, d, features, weight, bias, options, out);
    case SPCONV_BF16:
        return forward_typed<bf16_bits, float>(ctx, rb, d, features, weight, bias, options, out);
    default: return forward_typed<double, double>(ctx, rb, d, features, weight, bias, options, out);
    }
}

/* ---- backward ------------------------------------------------------------------------------ */

template <typename S, typename A>
static spconv_status backward_offsets(conv_call &call, const spconv_rulebook *rb,
                                      const spconv__conv_dims &d, const S *x, const S *w,
                                      const S *g, const int32_t *pin, const int32_t *pout,
                                      S *g_buf, S *x_buf, A *d_buf, int64_t chunk, A *dx, A *dw) {
    const char *func = "spconv_conv_backward";
    const int64_t identity = rb->center_is_identity ? d.kernel_volume / 2 : -1;
    for (int64_t j = 0; j < rb->num_active && d.c_in > 0 && d.c_out > 0; ++j) {
        const int64_t k = rb->active_offsets[j];
        const S *w_k = w + k * d.c_in * d.c_out;
        A *dw_k = dw != NULL ? dw + k * d.c_in * d.c_out : NULL;
        if (k == identity) {
            SPCONV_FORWARD_IF_ERROR(check_gemm_sizes(func, d.num_in, d.c_in, d.c_out));
            SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_GEMM));
            if (dx != NULL)
                CUBLAS_TRY(gemm_rm(call, 0, 1, d.num_in, d.c_in, d.c_out, g, d.c_out, w_k,
                                   d.c_out, (A)1, dx, d.c_in));
            if (dw_k != NULL)
                CUBLAS_TRY(gemm_rm(call, 1, 0, d.c_in, d.c_out, d.num_in, x, d.c_in, g,
                                   d.c_out, (A)1, dw_k, d.c_out));
            continue;
        }
        for (int64_t first = rb->active_starts[j]; first < rb->active_starts[j + 1];
             first += chunk) {
            const int64_t rows = rb->active_starts[j + 1] - first < chunk
                                     ? rb->active_starts[j + 1] - first
                                     : chunk;
            SPCONV_FORWARD_IF_ERROR(check_gemm_sizes(func, rows, d.c_in, d.c_out));
            SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_GATHER));
            SPCONV_FORWARD_IF_ERROR(launch_gather(call, g_buf, g, pout + first, rows, d.c_out));
            if (dx != NULL) {
                SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_GEMM));
                CUBLAS_TRY(gemm_rm(call, 0, 1, rows, d.c_in, d.c_out, g_buf, d.c_out, w_k,
                                   d.c_out, (A)0, d_buf, d.c_in));
                SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_SCATTER));
                SPCONV_FORWARD_IF_ERROR(
                    launch_scatter_add(call, dx, pin + first, d_buf, rows, d.c_in));
            }
            if (dw_k != NULL) {
                SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_GATHER));
                SPCONV_FORWARD_IF_ERROR(launch_gather(call, x_buf, x, pin + first, rows, d.c_in));
                SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_GEMM));
                CUBLAS_TRY(gemm_rm(call, 1, 0, d.c_in, d.c_out, rows, x_buf, d.c_in, g_buf,
                                   d.c_out, (A)1, dw_k, d.c_out));
            }
        }
    }
    return SPCONV_OK;
}

template <typename S, typename A>
static spconv_status backward_typed(spconv_context *ctx, const spconv_rulebook *rb,
                                    const spconv__conv_dims &d, const spconv_tensor *features,
                                    const spconv_tensor *weight, const spconv_tensor *grad_out,
                                    const spconv__conv_options *options,
                                    spconv_tensor **grad_features, spconv_tensor **grad_weight,
                                    spconv_tensor **grad_bias) {
    conv_call call;
    SPCONV_FORWARD_IF_ERROR(call.enter(ctx, d.device));
    call.time_phases(ctx, options);
    const void *x = NULL, *w = NULL, *g = NULL;
    SPCONV_FORWARD_IF_ERROR(call.operand(ctx, features, d.device, &x));
    SPCONV_FORWARD_IF_ERROR(call.operand(ctx, weight, d.device, &w));
    SPCONV_FORWARD_IF_ERROR(call.operand(ctx, grad_out, d.device, &g));
    const int32_t *pin = NULL, *pout = NULL;
    SPCONV_FORWARD_IF_ERROR(device_pairs(call, ctx, rb, d.device, &pin, &pout));
    const int64_t chunk = chunk_pairs(rb, d.c_out + 2 * d.c_in, sizeof(A));
    const int64_t elems[3] = {chunk * d.c_out, chunk * d.c_in, chunk * d.c_in};
    const size_t elem[3] = {sizeof(S), sizeof(S), sizeof(A)};
    void *buffers[3] = {};
    SPCONV_FORWARD_IF_ERROR(
        scratch_buffers("spconv_conv_backward", call, ctx, d.device, elem, 3, elems, buffers));
    void *g_buf = buffers[0], *x_buf = buffers[1], *d_buf = buffers[2];
    spconv_tensor *dx = NULL, *dw = NULL, *db = NULL;
    const int64_t in_sizes[2] = {d.num_in, d.c_in}, bias_size = d.c_out;
    /* zeroed outputs and the bias gradient's column sums count as scatter, as on the CPU */
    spconv_status st = call.lap(PHASE_SCATTER);
    const spconv_dtype wide = dtype_of<A>();
    if (st == SPCONV_OK && grad_features != NULL) st = spconv_tensor_zeros(ctx, d.device, wide, 2, in_sizes, &dx);
    if (st == SPCONV_OK && grad_weight != NULL)
        st = spconv_tensor_zeros(ctx, d.device, wide, spconv_tensor_ndim(weight),
                                 spconv_tensor_sizes(weight), &dw);
    if (st == SPCONV_OK && grad_bias != NULL)
        st = spconv__tensor_empty_in("spconv_conv_backward", ctx, d.device, wide, 1, &bias_size,
                                     &db);
    if (st == SPCONV_OK && db != NULL && d.c_out > 0) {
        SPCONV_CUDA_LAUNCH((column_sums_kernel<A, S>), call.grid(d.c_out), CONV_THREADS, 0,
                           call.stream, (A *)spconv_tensor_data(db), (const S *)g, d.num_out,
                           d.c_out);
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess)
            st = spconv__error(SPCONV_ERR_CUDA, "spconv_conv_backward: %s",
                               cudaGetErrorString(err));
    }
    if (st == SPCONV_OK && (dx != NULL || dw != NULL))
        st = backward_offsets<S, A>(call, rb, d, (const S *)x, (const S *)w, (const S *)g, pin,
                                    pout, (S *)g_buf, (S *)x_buf, (A *)d_buf, chunk,
                                    dx != NULL ? (A *)spconv_tensor_data(dx) : NULL,
                                    dw != NULL ? (A *)spconv_tensor_data(dw) : NULL);
    if (st == SPCONV_OK) st = call.lap(PHASE_END);
    if (st == SPCONV_OK) st = narrow_result(ctx, d.dtype, &dx);
    if (st == SPCONV_OK) st = narrow_result(ctx, d.dtype, &dw);
    if (st == SPCONV_OK) st = narrow_result(ctx, d.dtype, &db);
    /* No wait: as in the forward. */
    if (st != SPCONV_OK) {
        spconv_tensor_release(dx);
        spconv_tensor_release(dw);
        spconv_tensor_release(db);
        return st;
    }
    if (grad_features != NULL) *grad_features = dx;
    if (grad_weight != NULL) *grad_weight = dw;
    if (grad_bias != NULL) *grad_bias = db;
    return SPCONV_OK;
}

extern "C" spconv_status spconv__cuda_conv_backward(
    spconv_context *ctx, const spconv_rulebook *rb, const spconv_tensor *features,
    const spconv_tensor *weight, const spconv_tensor *grad_out,
    const spconv__conv_options *options, spconv_tensor **grad_features,
    spconv_tensor **grad_weight, spconv_tensor **grad_bias) {
    static const char func[] = "spconv_conv_backward";
    spconv__conv_dims d;
    SPCONV_FORWARD_IF_ERROR(spconv__conv_check(func, rb, features, weight, NULL, grad_out, &d));
    SPCONV_FORWARD_IF_ERROR(check_dtype(func, d.dtype));
    switch (d.dtype) {
    case SPCONV_F32:
        return backward_typed<float, float>(ctx, rb, d, features, weight, grad_out, options,
                                            grad_features, grad_weight, grad_bias);
    case SPCONV_F16:
        return backward_typed<f16_bits, float>(ctx, rb, d, features, weight, grad_out, options,
                                               grad_features, grad_weight, grad_bias);
    case SPCONV_BF16:
        return backward_typed<bf16_bits, float>(ctx, rb, d, features, weight, grad_out, options,
                                                grad_features, grad_weight, grad_bias);
    default:
        return backward_typed<double, double>(ctx, rb, d, features, weight, grad_out, options,
                                              grad_features, grad_weight, grad_bias);
    }
}

/* ---- max pooling --------------------------------------------------------------------------- */

template <typename T>
static spconv_status pool_forward_typed(spconv_context *ctx, const spconv_rulebook *rb,
                                        const spconv_tensor *features, spconv_tensor **out,
                                        spconv_tensor **argmax) {
    const spconv_device dev = spconv_tensor_device(features);
    const spconv_dtype dtype = spconv_tensor_dtype(features);
    const int64_t c = spconv_tensor_size(features, 1), n_out = rb->num_out;
    conv_call call;
    SPCONV_FORWARD_IF_ERROR(call.enter(ctx, dev));
    const void *x = NULL;
    SPCONV_FORWARD_IF_ERROR(call.operand(ctx, features, dev, &x));
    const int32_t *pin = NULL, *pout = NULL;
    SPCONV_FORWARD_IF_ERROR(device_pairs(call, ctx, rb, dev, &pin, &pout));
    const int64_t sizes[2] = {n_out, c};
    spconv_tensor *y = NULL, *arg = NULL;
    spconv_status st =
        spconv__tensor_empty_in("spconv_maxpool_forward", ctx, dev, dtype, 2, sizes, &y);
    if (st == SPCONV_OK)
        st = spconv__tensor_empty_in("spconv_maxpool_forward", ctx, dev, SPCONV_I32, 2, sizes,
                                     &arg);
    if (st == SPCONV_OK && n_out * c > 0) {
        T *yd = (T *)spconv_tensor_data(y);
        int32_t *ad = (int32_t *)spconv_tensor_data(arg);
        SPCONV_CUDA_LAUNCH((pool_init_kernel<T>), call.grid(n_out * c), CONV_THREADS, 0,
                           call.stream, yd, ad, n_out * c);
        cudaError_t err = cudaGetLastError();
        for (int64_t j = 0; err == cudaSuccess && j < rb->num_active; ++j) {
            const int64_t first = rb->active_starts[j], count = rb->active_starts[j + 1] - first;
            SPCONV_CUDA_LAUNCH((pool_pairs_kernel<T>), call.grid(count * c), CONV_THREADS, 0,
                               call.stream, yd, ad, (const T *)x, pin + first, pout + first,
                               count, c);
            err = cudaGetLastError();
        }
        if (err != cudaSuccess) { /* no wait: as in the conv forward */
            (void)cudaGetLastError();
            st = spconv__error(SPCONV_ERR_CUDA, "spconv_maxpool_forward: %s",
                               cudaGetErrorString(err));
        }
    }
    if (st != SPCONV_OK) {
        spconv_tensor_release(y);
        spconv_tensor_release(arg);
        return st;
    }
    *out = y;
    if (argmax != NULL)
        *argmax = arg;
    else
        spconv_tensor_release(arg);
    return SPCONV_OK;
}

extern "C" spconv_status spconv__cuda_maxpool_forward(spconv_context *ctx,
                                                      const spconv_rulebook *rb,
                                                      const spconv_tensor *features,
                                                      spconv_tensor **out,
                                                      spconv_tensor **argmax) {
    const spconv_dtype dtype = spconv_tensor_dtype(features);
    SPCONV_FORWARD_IF_ERROR(check_dtype("spconv_maxpool_forward", dtype));
    return dtype == SPCONV_F32 ? pool_forward_typed<float>(ctx, rb, features, out, argmax)
                               : pool_forward_typed<double>(ctx, rb, features, out, argmax);
}

template <typename T>
static spconv_status pool_backward_typed(spconv_context *ctx, const spconv_rulebook *rb,
                                         const spconv_tensor *argmax,
                                         const spconv_tensor *grad_out,
                                         spconv_tensor **grad_features) {
    const spconv_device dev = spconv_tensor_device(grad_out);
    const spconv_dtype dtype = spconv_tensor_dtype(grad_out);
    const int64_t c = spconv_tensor_size(grad_out, 1);
    conv_call call;
    SPCONV_FORWARD_IF_ERROR(call.enter(ctx, dev));
    const void *g = NULL, *a = NULL;
    SPCONV_FORWARD_IF_ERROR(call.operand(ctx, grad_out, dev, &g));
    SPCONV_FORWARD_IF_ERROR(call.operand(ctx, argmax, dev, &a));
    const int32_t *pin = NULL, *pout = NULL;
    SPCONV_FORWARD_IF_ERROR(device_pairs(call, ctx, rb, dev, &pin, &pout));
    const int64_t sizes[2] = {rb->num_in, c};
    spconv_tensor *dx = NULL;
    spconv_status st = spconv_tensor_zeros(ctx, dev, dtype, 2, sizes, &dx);
    if (st == SPCONV_OK && c > 0) {
        T *dd = (T *)spconv_tensor_data(dx);
        cudaError_t err = cudaSuccess;
        for (int64_t j = 0; err == cudaSuccess && j < rb->num_active; ++j) {
            const int64_t first = rb->active_starts[j], count = rb->active_starts[j + 1] - first;
            SPCONV_CUDA_LAUNCH((pool_backward_kernel<T>), call.grid(count * c), CONV_THREADS, 0,
                               call.stream, dd, (const T *)g, (const int32_t *)a, pin + first,
                               pout + first, count, c);
            err = cudaGetLastError();
        }
        if (err != cudaSuccess) { /* no wait: as in the conv forward */
            (void)cudaGetLastError();
            st = spconv__error(SPCONV_ERR_CUDA, "spconv_maxpool_backward: %s",
                               cudaGetErrorString(err));
        }
    }
    if (st != SPCONV_OK) {
        spconv_tensor_release(dx);
        return st;
    }
    *grad_features = dx;
    return SPCONV_OK;
}

extern "C" spconv_status spconv__cuda_maxpool_backward(spconv_context *ctx,
                                                       const spconv_rulebook *rb,
                                                       const spconv_tensor *argmax,
                                                       const spconv_tensor *grad_out,
                                                       spconv_tensor **grad_features) {
    const spconv_dtype dtype = spconv_tensor_dtype(grad_out);
    SPCONV_FORWARD_IF_ERROR(check_dtype("spconv_maxpool_backward", dtype));
    return dtype == SPCONV_F32
               ? pool_backward_typed<float>(ctx, rb, argmax, grad_out, grad_features)
               : pool_backward_typed<double>(ctx, rb, argmax, grad_out, grad_features);
}
