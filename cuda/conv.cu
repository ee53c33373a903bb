/* indice_conv and max pooling on the GPU, in f32 and f64, and the conv in f16 and bf16 as well
 * (below): per active kernel offset, in increasing k, gather the source rows of its pairs, one
 * cuBLAS product with W[k], add the products into the target rows; the subm centre offset
 * (pairs (r, r)) is a product on the features themselves. Consecutive offsets share a step
 * where the workspace allows (the plan, below): one gather, their products, and one kernel that
 * adds each target row's terms in the offsets' order; an offset alone is scatter-added (within
 * an offset every target row appears at most once). No atomics, and the steps run in a fixed
 * order on one stream: the same inputs give the same bits on the same GPU, run after run (no
 * floating-point atomics anywhere). *
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
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

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

/* ---- kernels --------------------------------------------------------------------------------
 * The row kernels give each row `lanes` threads of a block (every thread of the block when a row
 * has at least as many words), so that a block covers blockDim / lanes rows at a time and a thread
 * divides once, not once per element; rows then go grid-stride, and a row's words lane-stride. */
#define ROW_LOOP(i, n, c, words)                                                                  \
    const int lanes_ = (int)((words) < (int64_t)blockDim.x ? (words) : (int64_t)blockDim.x);     \
    const int rows_per_block_ = (int)blockDim.x / lanes_;                                        \
    const int lane_ = (int)threadIdx.x % lanes_, sub_ = (int)threadIdx.x / lanes_;                \
    if (sub_ < rows_per_block_)                                                                  \
        for (int64_t i = (int64_t)blockIdx.x * rows_per_block_ + sub_; i < (n);                  \
             i += (int64_t)gridDim.x * rows_per_block_)                                         \
            for (int64_t c = lane_; c < (words); c += lanes_)

/* V elements of T moved as one load or store (16 bytes at most: one vector access). */
template <typename T, int V> struct alignas(sizeof(T) * V) vec_t {
    T v[V];
};

/* Bit-moving words of 2, 4, 8 and 16 bytes, for the gathers (which only copy rows). */
typedef uint16_t word2;
typedef uint32_t word4;
typedef vec_t<uint32_t, 2> word8;
typedef vec_t<uint32_t, 4> word16;

/* dst[i, :] = src[rows[p], :] for i < n, rows of `words` words, where pair p is first + i,
 * skipping the hole_len pairs from hole_at (a group's identity offset, whose rows are not
 * gathered). */
template <typename W>
__global__ void gather_rows_kernel(W *__restrict__ dst, const W *__restrict__ src,
                                   const int32_t *__restrict__ rows, int64_t first,
                                   int64_t hole_at, int64_t hole_len, int64_t n, int64_t words) {
    ROW_LOOP(i, n, c, words) {
        const int64_t p = first + i < hole_at ? first + i : first + i + hole_len;
        dst[i * words + c] = src[(int64_t)rows[p] * words + c];
    }
}

/* dst[rows[i], :] += src[i, :] for i < n, V elements at a time (cols = words * V); the rows are
 * distinct. */
template <typename T, int V>
__global__ void scatter_add_rows_kernel(T *__restrict__ dst, const int32_t *__restrict__ rows,
                                        const T *__restrict__ src, int64_t n, int64_t words) {
    typedef vec_t<T, V> vec;
    ROW_LOOP(i, n, c, words) {
        vec *d = (vec *)dst + (int64_t)rows[i] * words + c;
        const vec s = ((const vec *)src)[i * words + c];
        vec sum = *d;
        for (int v = 0; v < V; ++v) sum.v[v] += s.v[v];
        *d = sum;
    }
}

/* Every row of dst [n, cols] := bias (or 0 when bias is NULL). */
template <typename T>
__global__ void init_rows_kernel(T *__restrict__ dst, const T *__restrict__ bias, int64_t n,
                                 int64_t cols) {
    ROW_LOOP(i, n, c, cols) dst[i * cols + c] = bias != NULL ? bias[c] : (T)0;
}

/* Most kernel offsets one group of a conv sums at once (the table's columns). */
#define CONV_GROUP_MAX 32

/* Where a group's pairs and products are (passed by value to the table kernel): the group is the
 * pairs [first, ends[count - 1]) of `count` consecutive active offsets, the g-th ending at
 * ends[g]. Offset g's products are rows of one buffer: a gathered offset's rows packed in pair
 * order (the identity offset's pairs [id_first, id_end) left out), and the identity offset's, if
 * the group has it (at index id_index), from row id_base on, one per target row in row order. */
struct group_layout {
    int64_t first;
    int64_t ends[CONV_GROUP_MAX];
    int64_t id_first, id_end, id_base;
    int32_t count, id_index;
};

/* table[t, g] = the product row offset g adds to target row t (table [targets, count], -1 where
 * g has no pair into t: set before), for every pair of the group; targets: the rows the products
 * are summed into (pairs_out forward, pairs_in for the input gradient). With @p values, the entry
 * is values[p] instead (max pooling: the row on the other side of the pair). */
__global__ void group_table_kernel(int32_t *__restrict__ table,
                                   const int32_t *__restrict__ targets,
                                   const int32_t *__restrict__ values, group_layout L) {
    const int64_t n = L.ends[L.count - 1] - L.first;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        const int64_t p = L.first + i;
        int lo = 0, hi = L.count - 1; /* the offset g: the first with p < ends[g] */
        while (lo < hi) {
            const int mid = (lo + hi) / 2;
            if (p < L.ends[mid])
                hi = mid;
            else
                lo = mid + 1;
        }
        const int64_t t = targets[p];
        int64_t row;
        if (values != NULL)
            row = values[p];
        else if (lo == L.id_index)
            row = L.id_base + t;
        else
            row = i - (p >= L.id_end ? L.id_end - L.id_first : 0);
        table[t * L.count + lo] = (int32_t)row;
    }
}

/* out[t, :] = start + the products table[t, 0], table[t, 1], ... added in that order (the
 * offsets' order), V elements at a time (cols = words * V), where start is the bias (0 when
 * bias is NULL) if init, else out[t, :] itself: the same sums, in the same order, as scatter-adding
 * offset after offset, written once. */
template <typename T, int V>
__global__ void group_sum_kernel(T *__restrict__ out, int init, const T *__restrict__ bias,
                                 const int32_t *__restrict__ table, int count,
                                 const T *__restrict__ products, int64_t n, int64_t words) {
    typedef vec_t<T, V> vec;
    ROW_LOOP(t, n, c, words) {
        vec sum;
        if (init) {
            for (int v = 0; v < V; ++v) sum.v[v] = bias != NULL ? bias[c * V + v] : (T)0;
        } else {
            sum = ((const vec *)out)[t * words + c];
        }
        for (int g = 0; g < count; ++g) {
            const int32_t row = table[t * count + g];
            if (row < 0) continue;
            const vec s = ((const vec *)products)[(int64_t)row * words + c];
            for (int v = 0; v < V; ++v) sum.v[v] += s.v[v];
        }
        ((vec *)out)[t * words + c] = sum;
    }
}

/* Column sums (the bias gradient) as the CPU adds them (conv_backward.c, bias_gradient): in
 * double, over fixed blocks of BIAS_BLOCK_ROWS rows, each block's rows in increasing order, then
 * the blocks' sums in block order. So the result is the CPU's, bit for bit, and the blocks run in
 * parallel: one thread per (block, column), where one thread per column walking every row took
 * milliseconds on a GPU for a few hundred thousand rows. */
#define BIAS_BLOCK_ROWS 4096

/* partial[blk, c] = the sum of src[r, c] over block blk's rows. */
template <typename In>
__global__ void column_block_sums_kernel(double *__restrict__ partial, const In *__restrict__ src,
                                         int64_t n, int64_t cols, int64_t blocks) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < blocks * cols;
         i += step) {
        const int64_t blk = i / cols, c = i % cols;
        const int64_t end = (blk + 1) * BIAS_BLOCK_ROWS < n ? (blk + 1) * BIAS_BLOCK_ROWS : n;
        double sum = 0.0;
        for (int64_t r = blk * BIAS_BLOCK_ROWS; r < end; ++r) sum += as_double(src[r * cols + c]);
        partial[i] = sum;
    }
}

/* out[c] = the blocks' sums partial[blk, c], added in block order from 0. */
template <typename Out>
__global__ void column_total_kernel(Out *__restrict__ out, const double *__restrict__ partial,
                                    int64_t cols, int64_t blocks) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += step) {
        double total = 0.0;
        for (int64_t blk = 0; blk < blocks; ++blk) total += partial[blk * cols + c];
        out[c] = (Out)total;
    }
}

/* Max pooling of a group of offsets, per output row o and channel c: the CPU's rule, pair after
 * pair in the offsets' order (the first pair takes the output, later ones only when strictly
 * greater, a NaN wins over a number and the first NaN stays), over the input rows table[o, g];
 * starting from nothing when init (an output with no pair keeps -inf and argmax -1), else from
 * out and argmax as an earlier group left them. */
template <typename T>
__global__ void pool_fold_kernel(T *__restrict__ out, int32_t *__restrict__ argmax, int init,
                                 const T *__restrict__ x, const int32_t *__restrict__ table,
                                 int count, int64_t n, int64_t cols) {
    ROW_LOOP(o, n, c, cols) {
        T best = (T)-INFINITY;
        int32_t arg = -1;
        if (!init) {
            best = out[o * cols + c];
            arg = argmax[o * cols + c];
        }
        for (int g = 0; g < count; ++g) {
            const int32_t i = table[o * count + g];
            if (i < 0) continue;
            const T v = x[(int64_t)i * cols + c];
            if (arg < 0 || v > best || (isnan(v) && !isnan(best))) {
                best = v;
                arg = i;
            }
        }
        out[o * cols + c] = best;
        argmax[o * cols + c] = arg;
    }
}

/* The pool backward of a group, per input row i and channel c: d_in[i, c] (0 when init) plus,
 * offset after offset, d_out[o, c] where the pair (i, o = table[i, g]) won channel c. */
template <typename T>
__global__ void pool_backward_fold_kernel(T *__restrict__ d_in, int init,
                                          const T *__restrict__ d_out,
                                          const int32_t *__restrict__ argmax,
                                          const int32_t *__restrict__ table, int count, int64_t n,
                                          int64_t cols) {
    ROW_LOOP(i, n, c, cols) {
        T sum = init ? (T)0 : d_in[i * cols + c];
        for (int g = 0; g < count; ++g) {
            const int32_t o = table[i * count + g];
            if (o >= 0 && argmax[(int64_t)o * cols + c] == i) sum += d_out[(int64_t)o * cols + c];
        }
        d_in[i * cols + c] = sum;
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
    /* The handle's settings as the call found them, put back when it ends (bind_blas). */
    cudaStream_t caller_stream = NULL;
    cublasPointerMode_t caller_pointer_mode = CUBLAS_POINTER_MODE_HOST;
    cublasMath_t caller_math = CUBLAS_DEFAULT_MATH;
    cublasAtomicsMode_t caller_atomics = CUBLAS_ATOMICS_NOT_ALLOWED;
    bool bound = false; /* the caller's settings were read: the end puts back those that differ */

    conv_call() = default;
    conv_call(const conv_call &) = delete;
    conv_call &operator=(const conv_call &) = delete;
    ~conv_call() {
        for (int i = 0; i < num_held; ++i) spconv_tensor_release(held[i]);
        /* host-side settings for the caller's later calls; the queued products keep theirs */
        if (!bound) return;
        if (caller_stream != stream) (void)cublasSetStream(blas, caller_stream);
        if (caller_pointer_mode != CUBLAS_POINTER_MODE_HOST)
            (void)cublasSetPointerMode(blas, caller_pointer_mode);
        if (caller_math != CUBLAS_DEFAULT_MATH) (void)cublasSetMathMode(blas, caller_math);
        if (caller_atomics != CUBLAS_ATOMICS_NOT_ALLOWED)
            (void)cublasSetAtomicsMode(blas, caller_atomics);
    }

    /* The handle is the caller's to use too (spconv_context_cublas_handle): whatever stream,
     * pointer mode, math mode or atomics mode they left on it, the products go on this call's
     * stream, read alpha and beta from the host, and compute what the compute type says (no TF32
     * or emulated math they did not ask this call for, no atomics whose order varies); the
     * caller's settings come back when the call ends. Host-side settings only (no launch), and
     * only those that differ are touched: cublasSetStream also drops a workspace set with
     * cublasSetWorkspace. */
    spconv_status bind_blas() {
        CUBLAS_TRY(cublasGetStream(blas, &caller_stream));
        CUBLAS_TRY(cublasGetPointerMode(blas, &caller_pointer_mode));
        CUBLAS_TRY(cublasGetMathMode(blas, &caller_math));
        CUBLAS_TRY(cublasGetAtomicsMode(blas, &caller_atomics));
        bound = true;
        if (caller_stream != stream) CUBLAS_TRY(cublasSetStream(blas, stream));
        if (caller_pointer_mode != CUBLAS_POINTER_MODE_HOST)
            CUBLAS_TRY(cublasSetPointerMode(blas, CUBLAS_POINTER_MODE_HOST));
        if (caller_math != CUBLAS_DEFAULT_MATH)
            CUBLAS_TRY(cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH));
        if (caller_atomics != CUBLAS_ATOMICS_NOT_ALLOWED)
            CUBLAS_TRY(cublasSetAtomicsMode(blas, CUBLAS_ATOMICS_NOT_ALLOWED));
        return SPCONV_OK;
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
        SPCONV_FORWARD_IF_ERROR(bind_blas());
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

    /* @p needed blocks, at least one and at most what the device holds at once. */
    int capped(int64_t needed) const {
        return (int)(needed < blocks ? (needed > 0 ? needed : 1) : blocks);
    }

    /* Blocks for a grid-stride loop over @p work elements. */
    int grid(int64_t work) const { return capped((work + CONV_THREADS - 1) / CONV_THREADS); }

    /* Blocks for a row kernel (ROW_LOOP) over @p n rows of @p words words. */
    int row_grid(int64_t n, int64_t words) const {
        const int64_t lanes = words < CONV_THREADS ? (words > 0 ? words : 1) : CONV_THREADS;
        const int64_t rows_per_block = CONV_THREADS / lanes;
        return capped((n + rows_per_block - 1) / rows_per_block);
    }
};

template <typename W>
static cudaError_t gather_words(conv_call &call, void *dst, const void *src, const int32_t *rows,
                                int64_t first, int64_t hole_at, int64_t hole_len, int64_t n,
                                int64_t words) {
    SPCONV_CUDA_LAUNCH((gather_rows_kernel<W>), call.row_grid(n, words), CONV_THREADS, 0,
                       call.stream, (W *)dst, (const W *)src, rows, first, hole_at, hole_len, n,
                       words);
    return cudaGetLastError();
}

/* dst[i, :] = src[rows[first + i (past the hole)], :] for i < n, rows of @p cols elements of
 * @p elem bytes, moved in the widest words the rows and pointers are aligned to. */
static spconv_status launch_gather(conv_call &call, void *dst, const void *src, size_t elem,
                                   const int32_t *rows, int64_t first, int64_t hole_at,
                                   int64_t hole_len, int64_t n, int64_t cols) {
    if (n * cols == 0) return SPCONV_OK;
    const int64_t bytes = cols * (int64_t)elem;
    const uintptr_t aligned = (uintptr_t)dst | (uintptr_t)src | (uintptr_t)bytes;
    cudaError_t err;
    if (aligned % 16 == 0)
        err = gather_words<word16>(call, dst, src, rows, first, hole_at, hole_len, n, bytes / 16);
    else if (aligned % 8 == 0)
        err = gather_words<word8>(call, dst, src, rows, first, hole_at, hole_len, n, bytes / 8);
    else if (aligned % 4 == 0)
        err = gather_words<word4>(call, dst, src, rows, first, hole_at, hole_len, n, bytes / 4);
    else
        err = gather_words<word2>(call, dst, src, rows, first, hole_at, hole_len, n, bytes / 2);
    CUDA_TRY(err);
    return SPCONV_OK;
}

/* Elements per vector access of the row kernels over rows of @p cols elements of T at these
 * addresses: 16 bytes where the rows and pointers allow, else one. */
template <typename T> static int vector_width(int64_t cols, const void *a, const void *b) {
    const int wide = 16 / (int)sizeof(T);
    const uintptr_t aligned = (uintptr_t)a | (uintptr_t)b;
    return cols % wide == 0 && aligned % 16 == 0 ? wide : 1;
}

template <typename T>
static spconv_status launch_scatter_add(conv_call &call, T *dst, const int32_t *rows, const T *src,
                                        int64_t n, int64_t cols) {
    if (n * cols == 0) return SPCONV_OK;
    const int wide = 16 / (int)sizeof(T);
    if (vector_width<T>(cols, dst, src) == wide)
        SPCONV_CUDA_LAUNCH((scatter_add_rows_kernel<T, 16 / sizeof(T)>),
                           call.row_grid(n, cols / wide), CONV_THREADS, 0, call.stream, dst, rows,
                           src, n, cols / wide);
    else
        SPCONV_CUDA_LAUNCH((scatter_add_rows_kernel<T, 1>), call.row_grid(n, cols), CONV_THREADS,
                           0, call.stream, dst, rows, src, n, cols);
    CUDA_TRY(cudaGetLastError());
    return SPCONV_OK;
}

template <typename T>
static spconv_status launch_init(conv_call &call, T *dst, const T *bias, int64_t n,
                                 int64_t cols) {
    if (n * cols == 0) return SPCONV_OK;
    SPCONV_CUDA_LAUNCH((init_rows_kernel<T>), call.row_grid(n, cols), CONV_THREADS, 0,
                       call.stream, dst, bias, n, cols);
    CUDA_TRY(cudaGetLastError());
    return SPCONV_OK;
}

/* The table of a group (group_table_kernel) and its ordered sum into out [n, cols]
 * (group_sum_kernel), starting from the bias (or 0) when init. */
template <typename T>
static spconv_status launch_group_sum(conv_call &call, int32_t *table, const int32_t *targets,
                                      const group_layout &layout, T *out, int init,
                                      const T *bias, const T *products, int64_t n,
                                      int64_t cols) {
    if (n * cols == 0) return SPCONV_OK;
    CUDA_TRY(cudaMemsetAsync(table, 0xff, (size_t)n * (size_t)layout.count * sizeof(int32_t),
                             call.stream));
    const int64_t pairs = layout.ends[layout.count - 1] - layout.first;
    SPCONV_CUDA_LAUNCH(group_table_kernel, call.grid(pairs), CONV_THREADS, 0, call.stream, table,
                       targets, (const int32_t *)NULL, layout);
    CUDA_TRY(cudaGetLastError());
    const int wide = 16 / (int)sizeof(T);
    if (vector_width<T>(cols, out, products) == wide)
        SPCONV_CUDA_LAUNCH((group_sum_kernel<T, 16 / sizeof(T)>), call.row_grid(n, cols / wide),
                           CONV_THREADS, 0, call.stream, out, init, bias, (const int32_t *)table,
                           layout.count, products, n, cols / wide);
    else
        SPCONV_CUDA_LAUNCH((group_sum_kernel<T, 1>), call.row_grid(n, cols), CONV_THREADS, 0,
                           call.stream, out, init, bias, (const int32_t *)table, layout.count,
                           products, n, cols);
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

/* ---- the plan: which offsets share a step ---------------------------------------------------
 * A conv runs as steps, in the offsets' order, each within the workspace budget:
 *  - a group: two or more consecutive offsets, whole. One gather for all their pairs, one product
 *    per offset into one buffer, then a table [targets, offsets] of which product row each offset
 *    adds to each target row, and one kernel that adds them up row by row, offset after offset.
 *    The identity offset of a subm conv joins a group without a gather (its product reads the
 *    features themselves). Launches: a gather, the products, a memset, the table and the sum,
 *    where an offset on its own costs a gather, a product and a scatter.
 *  - a single offset, or a chunk of one offset too large for the budget: gather, product,
 *    scatter-add (within an offset each target row appears at most once).
 *  - the identity offset alone: one product on the features, added into the result.
 * Every target element gets its terms in the offsets' order either way, so the plan changes how
 * many launches a conv takes, not its sums. */

enum conv_step_kind { STEP_DIRECT, STEP_SINGLE, STEP_GROUP };

struct conv_step {
    conv_step_kind kind;
    int64_t j0, j1;      /* active offsets [j0, j1) */
    int64_t first, last; /* STEP_SINGLE: the pairs [first, last) of offset j0 */
};

/* What a step's rows cost: bytes per gathered pair in each gathered buffer, bytes per product
 * row, and the rows of the summed result (the table's rows). */
struct step_costs {
    size_t gather_row[2];
    size_t product_row;
    int64_t targets;
};

/* Workspace bytes of a step with @p gathered gathered pairs, @p products product rows and a
 * table of @p table_cols columns (0: none). */
static size_t step_bytes(const step_costs &c, int64_t gathered, int64_t products,
                         int64_t table_cols) {
    size_t total = 0;
    for (size_t row : c.gather_row)
        if (row > 0) total += spconv__cuda_scratch::piece_bytes((size_t)gathered * row);
    if (c.product_row > 0)
        total += spconv__cuda_scratch::piece_bytes((size_t)products * c.product_row);
    if (table_cols > 0)
        total += spconv__cuda_scratch::piece_bytes((size_t)c.targets * (size_t)table_cols *
                                                   sizeof(int32_t));
    return total;
}

struct conv_plan {
    std::vector<conv_step> steps;
    size_t scratch = 0; /* the most workspace a step takes */
};

/* The steps of a conv over @p rb: greedy groups of consecutive offsets within @p budget bytes
 * (and CONV_GROUP_MAX offsets); @p identity is the offset computed on the features directly
 * (-1: none); sums: whether products are summed into targets (tables needed). */
static conv_plan make_plan(const spconv_rulebook *rb, int64_t identity, const step_costs &c,
                           size_t budget) {
    conv_plan plan;
    const bool sums = c.product_row > 0;
    int64_t j = 0;
    while (j < rb->num_active) {
        const int64_t j0 = j;
        int64_t gathered = 0, products = 0;
        size_t bytes = 0;
        for (; j < rb->num_active && j - j0 < CONV_GROUP_MAX; ++j) {
            const int64_t count = rb->active_starts[j + 1] - rb->active_starts[j];
            const bool is_identity = rb->active_offsets[j] == identity;
            const int64_t g = gathered + (is_identity ? 0 : count);
            const int64_t p = products + (is_identity ? c.targets : count);
            const size_t b = step_bytes(c, g, p, sums ? j - j0 + 1 : 0);
            /* the table holds product rows as int32, and cuBLAS takes int sizes */
            if (j > j0 && (b > budget || p > INT32_MAX)) break;
            gathered = g;
            products = p;
            bytes = b;
        }
        if (j - j0 >= 2) {
            plan.steps.push_back({STEP_GROUP, j0, j, 0, 0});
            if (bytes > plan.scratch) plan.scratch = bytes;
            continue;
        }
        if (rb->active_offsets[j0] == identity) {
            plan.steps.push_back({STEP_DIRECT, j0, j, 0, 0});
            continue;
        }
        /* one offset: in chunks of as many pairs as the budget holds */
        const size_t per_pair = c.gather_row[0] + c.gather_row[1] + c.product_row;
        const int64_t fit = (int64_t)(budget / (per_pair > 0 ? per_pair : 1));
        const int64_t chunk = fit > INT32_MAX ? INT32_MAX : (fit > 1 ? fit : 1);
        for (int64_t first = rb->active_starts[j0]; first < rb->active_starts[j]; first += chunk) {
            const int64_t rest = rb->active_starts[j] - first;
            const int64_t rows = rest < chunk ? rest : chunk;
            plan.steps.push_back({STEP_SINGLE, j0, j, first, first + rows});
            const size_t b = step_bytes(c, rows, rows, 0);
            if (b > plan.scratch) plan.scratch = b;
        }
    }
    return plan;
}

/* The layout of group step @p s (group_layout), with each gathered offset's first packed row
 * (packed[g]; the identity's is unused). */
static group_layout layout_of(const spconv_rulebook *rb, const conv_step &s, int64_t identity,
                              int64_t *packed) {
    group_layout L = {};
    L.first = rb->active_starts[s.j0];
    L.count = (int32_t)(s.j1 - s.j0);
    L.id_index = -1;
    L.id_first = L.id_end = rb->active_starts[s.j1];
    int64_t rows = 0;
    for (int64_t j = s.j0; j < s.j1; ++j) {
        const int g = (int)(j - s.j0);
        L.ends[g] = rb->active_starts[j + 1];
        packed[g] = rows;
        if (rb->active_offsets[j] == identity) {
            L.id_index = g;
            L.id_first = rb->active_starts[j];
            L.id_end = rb->active_starts[j + 1];
        } else {
            rows += rb->active_starts[j + 1] - rb->active_starts[j];
        }
    }
    L.id_base = rows; /* the identity's products follow the gathered offsets' */
    return L;
}

/* Rows gathered for group step @p L: its pairs but the identity's. */
static int64_t gathered_rows(const group_layout &L) {
    return L.ends[L.count - 1] - L.first - (L.id_end - L.id_first);
}

/* The workspace budget of one step, in bytes: SPCONV_CUDA_CONV_WORKSPACE_KIB if set, else 1/32 of
 * the device's memory, within [64 MiB, 1 GiB]: room for a whole subm layer of a LiDAR network in
 * one group on a data-centre GPU, and a modest share of a small one. */
static spconv_status conv_budget(const char *func, int device, size_t *budget) {
    const char *forced = getenv("SPCONV_CUDA_CONV_WORKSPACE_KIB");
    if (forced != NULL && forced[0] != '\0') {
        char *end = NULL;
        errno = 0;
        const unsigned long long kib = strtoull(forced, &end, 10);
        SPCONV_RETURN_ERROR_IF(errno != 0 || *end != '\0' || forced[0] == '-' || kib == 0 ||
                                   kib > (SIZE_MAX >> 10),
                               SPCONV_ERR_INVALID_ARGUMENT,
                               "%s: SPCONV_CUDA_CONV_WORKSPACE_KIB='%s' is not a positive number "
                               "of KiB",
                               func, forced);
        *budget = (size_t)kib << 10;
        return SPCONV_OK;
    }
    static thread_local std::vector<size_t> by_device;
    if ((size_t)device >= by_device.size()) by_device.resize((size_t)device + 1, 0);
    size_t &cached = by_device[(size_t)device];
    if (cached == 0) {
        size_t free_bytes = 0, total_bytes = 0;
        CUDA_TRY(cudaMemGetInfo(&free_bytes, &total_bytes));
        const size_t lo = (size_t)64 << 20, hi = (size_t)1 << 30;
        const size_t share = total_bytes / 32;
        cached = share < lo ? lo : (share > hi ? hi : share);
    }
    *budget = cached;
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

/* The next @p nbytes of the step's workspace. */
static void *piece(conv_call &call, size_t nbytes) { return call.scratch.take(nbytes); }

/* S: the operands' element type; A: the products' and sums' (S itself, or f32 for 16 bits).
 * out [num_out, c_out] is written by the first step (or set to the bias at the end when no step
 * ran), then added to. */
template <typename S, typename A>
static spconv_status forward_steps(conv_call &call, const spconv_rulebook *rb,
                                   const spconv__conv_dims &d, const conv_plan &plan,
                                   int64_t identity, const S *x, const S *w, const A *bias,
                                   const int32_t *pin, const int32_t *pout, A *out) {
    const char *func = "spconv_conv_forward";
    bool written = false;
    for (const conv_step &s : plan.steps) {
        call.scratch.rewind();
        if (!written && s.kind != STEP_GROUP) {
            SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_SCATTER));
            SPCONV_FORWARD_IF_ERROR(launch_init(call, out, bias, d.num_out, d.c_out));
        }
        if (s.kind == STEP_DIRECT) {
            const S *w_k = w + rb->active_offsets[s.j0] * d.c_in * d.c_out;
            SPCONV_FORWARD_IF_ERROR(check_gemm_sizes(func, d.num_out, d.c_in, d.c_out));
            SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_GEMM));
            CUBLAS_TRY(gemm_rm(call, 0, 0, d.num_out, d.c_out, d.c_in, x, d.c_in, w_k, d.c_out,
                               (A)1, out, d.c_out));
        } else if (s.kind == STEP_SINGLE) {
            const int64_t rows = s.last - s.first;
            const S *w_k = w + rb->active_offsets[s.j0] * d.c_in * d.c_out;
            S *gathered = (S *)piece(call, (size_t)rows * d.c_in * sizeof(S));
            A *product = (A *)piece(call, (size_t)rows * d.c_out * sizeof(A));
            SPCONV_FORWARD_IF_ERROR(check_gemm_sizes(func, rows, d.c_in, d.c_out));
            SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_GATHER));
            SPCONV_FORWARD_IF_ERROR(launch_gather(call, gathered, x, sizeof(S), pin, s.first,
                                                  s.last, 0, rows, d.c_in));
            SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_GEMM));
            CUBLAS_TRY(gemm_rm(call, 0, 0, rows, d.c_out, d.c_in, gathered, d.c_in, w_k,
                               d.c_out, (A)0, product, d.c_out));
            SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_SCATTER));
            SPCONV_FORWARD_IF_ERROR(
                launch_scatter_add(call, out, pout + s.first, product, rows, d.c_out));
        } else {
            int64_t packed[CONV_GROUP_MAX];
            const group_layout L = layout_of(rb, s, identity, packed);
            const int64_t rows = gathered_rows(L);
            const int64_t products = rows + (L.id_index >= 0 ? d.num_out : 0);
            S *gathered = (S *)piece(call, (size_t)rows * d.c_in * sizeof(S));
            A *product = (A *)piece(call, (size_t)products * d.c_out * sizeof(A));
            int32_t *table = (int32_t *)piece(call, (size_t)d.num_out * L.count * sizeof(int32_t));
            SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_GATHER));
            SPCONV_FORWARD_IF_ERROR(launch_gather(call, gathered, x, sizeof(S), pin, L.first,
                                                  L.id_first, L.id_end - L.id_first, rows,
                                                  d.c_in));
            SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_GEMM));
            for (int g = 0; g < L.count; ++g) {
                const int64_t j = s.j0 + g;
                const S *w_k = w + rb->active_offsets[j] * d.c_in * d.c_out;
                const bool direct = g == L.id_index;
                const int64_t m = direct ? d.num_out : rb->active_starts[j + 1] - rb->active_starts[j];
                const S *a = direct ? x : gathered + packed[g] * d.c_in;
                A *c = product + (direct ? L.id_base : packed[g]) * d.c_out;
                SPCONV_FORWARD_IF_ERROR(check_gemm_sizes(func, m, d.c_in, d.c_out));
                CUBLAS_TRY(gemm_rm(call, 0, 0, m, d.c_out, d.c_in, a, d.c_in, w_k, d.c_out,
                                   (A)0, c, d.c_out));
            }
            SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_SCATTER));
            SPCONV_FORWARD_IF_ERROR(launch_group_sum(call, table, pout, L, out, !written, bias,
                                                     (const A *)product, d.num_out, d.c_out));
        }
        written = true;
    }
    if (!written) {
        SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_SCATTER));
        SPCONV_FORWARD_IF_ERROR(launch_init(call, out, bias, d.num_out, d.c_out));
    }
    return SPCONV_OK;
}

/* The plan of a forward: gathered input rows, f32 (or f64) product rows, summed into num_out
 * rows. */
template <typename S, typename A>
static spconv_status forward_plan(const char *func, const conv_call &call,
                                  const spconv_rulebook *rb, const spconv__conv_dims &d,
                                  int64_t identity, conv_plan *plan) {
    size_t budget = 0;
    SPCONV_FORWARD_IF_ERROR(conv_budget(func, call.device, &budget));
    step_costs c = {};
    c.gather_row[0] = (size_t)d.c_in * sizeof(S);
    c.product_row = (size_t)d.c_out * sizeof(A);
    c.targets = d.num_out;
    *plan = make_plan(rb, identity, c, budget);
    return SPCONV_OK;
}

template <typename S, typename A>
static spconv_status forward_typed(spconv_context *ctx, const spconv_rulebook *rb,
                                   const spconv__conv_dims &d, const spconv_tensor *features,
                                   const spconv_tensor *weight, const spconv_tensor *bias,
                                   const spconv__conv_options *options, spconv_tensor **out) {
    static const char func[] = "spconv_conv_forward";
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
    const int64_t identity = rb->center_is_identity ? d.kernel_volume / 2 : -1;
    conv_plan plan;
    if (d.c_in > 0)
        SPCONV_FORWARD_IF_ERROR((forward_plan<S, A>(func, call, rb, d, identity, &plan)));
    if (plan.scratch > 0)
        SPCONV_FORWARD_IF_ERROR(call.scratch.reserve(func, ctx, d.device, plan.scratch));
    const int64_t sizes[2] = {d.num_out, d.c_out};
    spconv_tensor *result = NULL;
    SPCONV_FORWARD_IF_ERROR(
        spconv__tensor_empty_in(func, ctx, d.device, dtype_of<A>(), 2, sizes, &result));
    spconv_status st = SPCONV_OK;
    if (d.num_out * d.c_out > 0) {
        st = forward_steps<S, A>(call, rb, d, plan, identity, (const S *)x, (const S *)w,
                                 (const A *)b, pin, pout, (A *)spconv_tensor_data(result));
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

/* The steps of a backward: per offset k, the output gradient's rows gathered by pairs_out give
 * dx's terms (times W[k]^T, summed into the input rows as the forward sums into the output rows)
 * and, with the input's rows gathered by pairs_in, dW[k] += x^T g (dw zeroed before, so chunks
 * and the identity accumulate). dx [num_in, c_in] is written by the first step that computes
 * terms of it (or zeroed at the end when none did), then added to. */
template <typename S, typename A>
static spconv_status backward_steps(conv_call &call, const spconv_rulebook *rb,
                                    const spconv__conv_dims &d, const conv_plan &plan,
                                    int64_t identity, const S *x, const S *w, const S *g,
                                    const int32_t *pin, const int32_t *pout, A *dx, A *dw) {
    const char *func = "spconv_conv_backward";
    bool written = false;
    for (const conv_step &s : plan.steps) {
        call.scratch.rewind();
        if (dx != NULL && !written && s.kind != STEP_GROUP) {
            SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_SCATTER));
            SPCONV_FORWARD_IF_ERROR(launch_init(call, dx, (const A *)NULL, d.num_in, d.c_in));
        }
        if (s.kind == STEP_DIRECT) {
            const int64_t k = rb->active_offsets[s.j0];
            SPCONV_FORWARD_IF_ERROR(check_gemm_sizes(func, d.num_in, d.c_in, d.c_out));
            SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_GEMM));
            if (dx != NULL)
                CUBLAS_TRY(gemm_rm(call, 0, 1, d.num_in, d.c_in, d.c_out, g, d.c_out,
                                   w + k * d.c_in * d.c_out, d.c_out, (A)1, dx, d.c_in));
            if (dw != NULL)
                CUBLAS_TRY(gemm_rm(call, 1, 0, d.c_in, d.c_out, d.num_in, x, d.c_in, g, d.c_out,
                                   (A)1, dw + k * d.c_in * d.c_out, d.c_out));
        } else if (s.kind == STEP_SINGLE) {
            const int64_t k = rb->active_offsets[s.j0], rows = s.last - s.first;
            S *g_buf = (S *)piece(call, (size_t)rows * d.c_out * sizeof(S));
            S *x_buf = dw != NULL ? (S *)piece(call, (size_t)rows * d.c_in * sizeof(S)) : NULL;
            A *d_buf = dx != NULL ? (A *)piece(call, (size_t)rows * d.c_in * sizeof(A)) : NULL;
            SPCONV_FORWARD_IF_ERROR(check_gemm_sizes(func, rows, d.c_in, d.c_out));
            SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_GATHER));
            SPCONV_FORWARD_IF_ERROR(launch_gather(call, g_buf, g, sizeof(S), pout, s.first,
                                                  s.last, 0, rows, d.c_out));
            if (dw != NULL)
                SPCONV_FORWARD_IF_ERROR(launch_gather(call, x_buf, x, sizeof(S), pin, s.first,
                                                      s.last, 0, rows, d.c_in));
            SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_GEMM));
            if (dx != NULL)
                CUBLAS_TRY(gemm_rm(call, 0, 1, rows, d.c_in, d.c_out, g_buf, d.c_out,
                                   w + k * d.c_in * d.c_out, d.c_out, (A)0, d_buf, d.c_in));
            if (dw != NULL)
                CUBLAS_TRY(gemm_rm(call, 1, 0, d.c_in, d.c_out, rows, x_buf, d.c_in, g_buf,
                                   d.c_out, (A)1, dw + k * d.c_in * d.c_out, d.c_out));
            if (dx != NULL) {
                SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_SCATTER));
                SPCONV_FORWARD_IF_ERROR(
                    launch_scatter_add(call, dx, pin + s.first, d_buf, rows, d.c_in));
            }
        } else {
            int64_t packed[CONV_GROUP_MAX];
            const group_layout L = layout_of(rb, s, identity, packed);
            const int64_t rows = gathered_rows(L);
            const int64_t products = rows + (L.id_index >= 0 ? d.num_in : 0);
            S *g_buf = (S *)piece(call, (size_t)rows * d.c_out * sizeof(S));
            S *x_buf = dw != NULL ? (S *)piece(call, (size_t)rows * d.c_in * sizeof(S)) : NULL;
            A *d_buf = dx != NULL ? (A *)piece(call, (size_t)products * d.c_in * sizeof(A)) : NULL;
            int32_t *table = dx != NULL ? (int32_t *)piece(call, (size_t)d.num_in * L.count *
                                                                      sizeof(int32_t))
                                        : NULL;
            SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_GATHER));
            SPCONV_FORWARD_IF_ERROR(launch_gather(call, g_buf, g, sizeof(S), pout, L.first,
                                                  L.id_first, L.id_end - L.id_first, rows,
                                                  d.c_out));
            if (dw != NULL)
                SPCONV_FORWARD_IF_ERROR(launch_gather(call, x_buf, x, sizeof(S), pin, L.first,
                                                      L.id_first, L.id_end - L.id_first, rows,
                                                      d.c_in));
            SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_GEMM));
            for (int gi = 0; gi < L.count; ++gi) {
                const int64_t j = s.j0 + gi, k = rb->active_offsets[j];
                const bool direct = gi == L.id_index;
                const int64_t m = direct ? d.num_in : rb->active_starts[j + 1] - rb->active_starts[j];
                SPCONV_FORWARD_IF_ERROR(check_gemm_sizes(func, m, d.c_in, d.c_out));
                const S *g_k = direct ? g : g_buf + packed[gi] * d.c_out;
                if (dx != NULL)
                    CUBLAS_TRY(gemm_rm(call, 0, 1, m, d.c_in, d.c_out, g_k, d.c_out,
                                       w + k * d.c_in * d.c_out, d.c_out, (A)0,
                                       d_buf + (direct ? L.id_base : packed[gi]) * d.c_in,
                                       d.c_in));
                if (dw != NULL)
                    CUBLAS_TRY(gemm_rm(call, 1, 0, d.c_in, d.c_out, m,
                                       direct ? x : x_buf + packed[gi] * d.c_in, d.c_in, g_k,
                                       d.c_out, (A)1, dw + k * d.c_in * d.c_out, d.c_out));
            }
            if (dx != NULL) {
                SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_SCATTER));
                SPCONV_FORWARD_IF_ERROR(launch_group_sum(call, table, pin, L, dx, !written,
                                                         (const A *)NULL, (const A *)d_buf,
                                                         d.num_in, d.c_in));
            }
        }
        written = true;
    }
    if (dx != NULL && !written) {
        SPCONV_FORWARD_IF_ERROR(call.lap(PHASE_SCATTER));
        SPCONV_FORWARD_IF_ERROR(launch_init(call, dx, (const A *)NULL, d.num_in, d.c_in));
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
    static const char func[] = "spconv_conv_backward";
    conv_call call;
    SPCONV_FORWARD_IF_ERROR(call.enter(ctx, d.device));
    call.time_phases(ctx, options);
    const void *x = NULL, *w = NULL, *g = NULL;
    SPCONV_FORWARD_IF_ERROR(call.operand(ctx, features, d.device, &x));
    SPCONV_FORWARD_IF_ERROR(call.operand(ctx, weight, d.device, &w));
    SPCONV_FORWARD_IF_ERROR(call.operand(ctx, grad_out, d.device, &g));
    const int32_t *pin = NULL, *pout = NULL;
    SPCONV_FORWARD_IF_ERROR(device_pairs(call, ctx, rb, d.device, &pin, &pout));
    const int64_t identity = rb->center_is_identity ? d.kernel_volume / 2 : -1;
    const bool want_dx = grad_features != NULL, want_dw = grad_weight != NULL;
    conv_plan plan;
    if (d.c_in > 0 && d.c_out > 0 && (want_dx || want_dw)) {
        size_t budget = 0;
        SPCONV_FORWARD_IF_ERROR(conv_budget(func, call.device, &budget));
        step_costs c = {};
        c.gather_row[0] = (size_t)d.c_out * sizeof(S);
        c.gather_row[1] = want_dw ? (size_t)d.c_in * sizeof(S) : 0;
        c.product_row = want_dx ? (size_t)d.c_in * sizeof(A) : 0;
        c.targets = want_dx ? d.num_in : 0;
        plan = make_plan(rb, identity, c, budget);
    }
    /* the bias gradient's block sums (column_block_sums_kernel) take the workspace first; the
     * steps reuse it after them, in stream order */
    const int64_t bias_blocks =
        grad_bias != NULL ? (d.num_out + BIAS_BLOCK_ROWS - 1) / BIAS_BLOCK_ROWS : 0;
    const size_t bias_bytes = (size_t)(bias_blocks * d.c_out) * sizeof(double);
    const size_t reserved = plan.scratch > spconv__cuda_scratch::piece_bytes(bias_bytes)
                                ? plan.scratch
                                : spconv__cuda_scratch::piece_bytes(bias_bytes);
    if (reserved > 0)
        SPCONV_FORWARD_IF_ERROR(call.scratch.reserve(func, ctx, d.device, reserved));
    spconv_tensor *dx = NULL, *dw = NULL, *db = NULL;
    const int64_t in_sizes[2] = {d.num_in, d.c_in}, bias_size = d.c_out;
    /* the zeroed weight gradient and the bias gradient's column sums count as scatter, as on
     * the CPU */
    spconv_status st = call.lap(PHASE_SCATTER);
    const spconv_dtype wide = dtype_of<A>();
    if (st == SPCONV_OK && want_dx)
        st = spconv__tensor_empty_in(func, ctx, d.device, wide, 2, in_sizes, &dx);
    if (st == SPCONV_OK && want_dw)
        st = spconv__tensor_zeros_in(func, ctx, d.device, wide, spconv_tensor_ndim(weight),
                                     spconv_tensor_sizes(weight), &dw);
    if (st == SPCONV_OK && grad_bias != NULL)
        st = spconv__tensor_empty_in(func, ctx, d.device, wide, 1, &bias_size, &db);
    if (st == SPCONV_OK && db != NULL && d.c_out > 0) {
        double *sums = bias_bytes > 0 ? (double *)call.scratch.take(bias_bytes) : NULL;
        if (bias_blocks > 0)
            SPCONV_CUDA_LAUNCH((column_block_sums_kernel<S>), call.grid(bias_blocks * d.c_out),
                               CONV_THREADS, 0, call.stream, sums, (const S *)g, d.num_out,
                               d.c_out, bias_blocks);
        SPCONV_CUDA_LAUNCH((column_total_kernel<A>), call.grid(d.c_out), CONV_THREADS, 0,
                           call.stream, (A *)spconv_tensor_data(db), (const double *)sums,
                           d.c_out, bias_blocks);
        call.scratch.rewind();
        const cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess)
            st = spconv__error(SPCONV_ERR_CUDA, "spconv_conv_backward: %s",
                               cudaGetErrorString(err));
    }
    if (st == SPCONV_OK && (dx != NULL || dw != NULL))
        st = backward_steps<S, A>(call, rb, d, plan, identity, (const S *)x, (const S *)w,
                                  (const S *)g, pin, pout,
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

/* ---- max pooling ---------------------------------------------------------------------------
 * Groups of up to CONV_GROUP_MAX consecutive offsets (fewer when the budget cannot hold the
 * table): per group a table [targets, offsets] of the rows on the other side of each pair, then
 * one kernel that folds each target row's pairs in the offsets' order, the CPU's order. */

/* Offsets per pooling group: CONV_GROUP_MAX, or what a table of @p targets rows fits in the
 * budget (at least one). */
static spconv_status pool_group_size(const char *func, const conv_call &call, int64_t targets,
                                     int *size) {
    size_t budget = 0;
    SPCONV_FORWARD_IF_ERROR(conv_budget(func, call.device, &budget));
    const size_t row = (size_t)(targets > 0 ? targets : 1) * sizeof(int32_t);
    const size_t fit = budget / row;
    *size = fit >= CONV_GROUP_MAX ? CONV_GROUP_MAX : (fit > 1 ? (int)fit : 1);
    return SPCONV_OK;
}

/* The layout of active offsets [j0, j1) for group_table_kernel with values (no identity). */
static group_layout pool_layout(const spconv_rulebook *rb, int64_t j0, int64_t j1) {
    group_layout L = {};
    L.first = rb->active_starts[j0];
    L.count = (int32_t)(j1 - j0);
    L.id_index = -1;
    for (int64_t j = j0; j < j1; ++j) L.ends[j - j0] = rb->active_starts[j + 1];
    L.id_first = L.id_end = L.ends[L.count - 1];
    return L;
}

/* Fill @p table [targets, L.count] for group @p L: -1, then values[p] at [targets[p], g]. */
static spconv_status launch_pool_table(conv_call &call, int32_t *table, const int32_t *targets,
                                       const int32_t *values, const group_layout &L,
                                       int64_t rows) {
    CUDA_TRY(cudaMemsetAsync(table, 0xff, (size_t)rows * (size_t)L.count * sizeof(int32_t),
                             call.stream));
    SPCONV_CUDA_LAUNCH(group_table_kernel, call.grid(L.ends[L.count - 1] - L.first), CONV_THREADS,
                       0, call.stream, table, targets, values, L);
    CUDA_TRY(cudaGetLastError());
    return SPCONV_OK;
}

template <typename T>
static spconv_status pool_forward_groups(conv_call &call, const spconv_rulebook *rb, int group,
                                         const T *x, const int32_t *pin, const int32_t *pout,
                                         int32_t *table, T *y, int32_t *arg, int64_t c) {
    const int64_t n_out = rb->num_out;
    bool written = false;
    for (int64_t j0 = 0; j0 < rb->num_active; j0 += group) {
        const int64_t j1 = j0 + group < rb->num_active ? j0 + group : rb->num_active;
        const group_layout L = pool_layout(rb, j0, j1);
        SPCONV_FORWARD_IF_ERROR(launch_pool_table(call, table, pout, pin, L, n_out));
        SPCONV_CUDA_LAUNCH((pool_fold_kernel<T>), call.row_grid(n_out, c), CONV_THREADS, 0,
                           call.stream, y, arg, (int)!written, x, (const int32_t *)table, L.count,
                           n_out, c);
        CUDA_TRY(cudaGetLastError());
        written = true;
    }
    if (!written) { /* no pairs: every output -inf, argmax -1 */
        SPCONV_CUDA_LAUNCH((pool_fold_kernel<T>), call.row_grid(n_out, c), CONV_THREADS, 0,
                           call.stream, y, arg, 1, x, (const int32_t *)NULL, 0, n_out, c);
        CUDA_TRY(cudaGetLastError());
    }
    return SPCONV_OK;
}

template <typename T>
static spconv_status pool_forward_typed(spconv_context *ctx, const spconv_rulebook *rb,
                                        const spconv_tensor *features, spconv_tensor **out,
                                        spconv_tensor **argmax) {
    static const char func[] = "spconv_maxpool_forward";
    const spconv_device dev = spconv_tensor_device(features);
    const spconv_dtype dtype = spconv_tensor_dtype(features);
    const int64_t c = spconv_tensor_size(features, 1), n_out = rb->num_out;
    conv_call call;
    SPCONV_FORWARD_IF_ERROR(call.enter(ctx, dev));
    const void *x = NULL;
    SPCONV_FORWARD_IF_ERROR(call.operand(ctx, features, dev, &x));
    const int32_t *pin = NULL, *pout = NULL;
    SPCONV_FORWARD_IF_ERROR(device_pairs(call, ctx, rb, dev, &pin, &pout));
    int group = 1;
    SPCONV_FORWARD_IF_ERROR(pool_group_size(func, call, n_out, &group));
    if (n_out * c > 0 && rb->num_active > 0)
        SPCONV_FORWARD_IF_ERROR(call.scratch.reserve(
            func, ctx, dev, spconv__cuda_scratch::piece_bytes((size_t)n_out * group * 4)));
    const int64_t sizes[2] = {n_out, c};
    spconv_tensor *y = NULL, *arg = NULL;
    spconv_status st = spconv__tensor_empty_in(func, ctx, dev, dtype, 2, sizes, &y);
    if (st == SPCONV_OK) st = spconv__tensor_empty_in(func, ctx, dev, SPCONV_I32, 2, sizes, &arg);
    if (st == SPCONV_OK && n_out * c > 0)
        st = pool_forward_groups<T>(call, rb, group, (const T *)x, pin, pout,
                                    (int32_t *)call.scratch.take((size_t)n_out * group * 4),
                                    (T *)spconv_tensor_data(y),
                                    (int32_t *)spconv_tensor_data(arg), c);
    /* no wait: as in the conv forward */
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
static spconv_status pool_backward_groups(conv_call &call, const spconv_rulebook *rb, int group,
                                          const T *g, const int32_t *a, const int32_t *pin,
                                          const int32_t *pout, int32_t *table, T *dx, int64_t c) {
    const int64_t n_in = rb->num_in;
    bool written = false;
    for (int64_t j0 = 0; j0 < rb->num_active; j0 += group) {
        const int64_t j1 = j0 + group < rb->num_active ? j0 + group : rb->num_active;
        const group_layout L = pool_layout(rb, j0, j1);
        SPCONV_FORWARD_IF_ERROR(launch_pool_table(call, table, pin, pout, L, n_in));
        SPCONV_CUDA_LAUNCH((pool_backward_fold_kernel<T>), call.row_grid(n_in, c), CONV_THREADS,
                           0, call.stream, dx, (int)!written, g, a, (const int32_t *)table,
                           L.count, n_in, c);
        CUDA_TRY(cudaGetLastError());
        written = true;
    }
    if (!written) SPCONV_FORWARD_IF_ERROR(launch_init(call, dx, (const T *)NULL, n_in, c));
    return SPCONV_OK;
}

template <typename T>
static spconv_status pool_backward_typed(spconv_context *ctx, const spconv_rulebook *rb,
                                         const spconv_tensor *argmax,
                                         const spconv_tensor *grad_out,
                                         spconv_tensor **grad_features) {
    static const char func[] = "spconv_maxpool_backward";
    const spconv_device dev = spconv_tensor_device(grad_out);
    const spconv_dtype dtype = spconv_tensor_dtype(grad_out);
    const int64_t c = spconv_tensor_size(grad_out, 1), n_in = rb->num_in;
    conv_call call;
    SPCONV_FORWARD_IF_ERROR(call.enter(ctx, dev));
    const void *g = NULL, *a = NULL;
    SPCONV_FORWARD_IF_ERROR(call.operand(ctx, grad_out, dev, &g));
    SPCONV_FORWARD_IF_ERROR(call.operand(ctx, argmax, dev, &a));
    const int32_t *pin = NULL, *pout = NULL;
    SPCONV_FORWARD_IF_ERROR(device_pairs(call, ctx, rb, dev, &pin, &pout));
    int group = 1;
    SPCONV_FORWARD_IF_ERROR(pool_group_size(func, call, n_in, &group));
    if (n_in * c > 0 && rb->num_active > 0)
        SPCONV_FORWARD_IF_ERROR(call.scratch.reserve(
            func, ctx, dev, spconv__cuda_scratch::piece_bytes((size_t)n_in * group * 4)));
    const int64_t sizes[2] = {n_in, c};
    spconv_tensor *dx = NULL;
    spconv_status st = spconv__tensor_empty_in(func, ctx, dev, dtype, 2, sizes, &dx);
    if (st == SPCONV_OK && n_in * c > 0)
        st = pool_backward_groups<T>(call, rb, group, (const T *)g, (const int32_t *)a, pin, pout,
                                     (int32_t *)call.scratch.take((size_t)n_in * group * 4),
                                     (T *)spconv_tensor_data(dx), c);
    /* no wait: as in the conv forward */
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
