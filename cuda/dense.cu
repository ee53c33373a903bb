/* Sparse <-> dense [B, C, D, H, W] on the GPU, with the CPU's results and messages
 * (src/conv/dense.c): sparse_to_dense checks every row on the device before anything is written
 * and names the first bad row (outside the grid, or repeating an earlier row, whichever comes
 * first in row order); dense_to_sparse keeps the sites where any channel is non-zero (NaN
 * counts, -0 does not), in (b, z, y, x) order, numbered by a prefix sum. f16, bf16, f32, f64
 * and i32.
 * The row checks are site_check.h's, shared with the network's to-dense. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "core/backend.h"
#include "core/error.h"
#include "cuda_check.h"
#include "cuda_common.h"
#include "maps_common.h"
#include "site_check.h"

#define DENSE_THREADS 256

struct site_grid {
    int64_t batch, d, h, w;
};

template <typename T>
__global__ void to_dense5_kernel(T *dense, const T *features, const int32_t *idx, site_grid g,
                                 int64_t n, int64_t c) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    const int64_t cells = g.d * g.h * g.w;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * c; i += step) {
        const int64_t r = i / c, ch = i % c;
        const int32_t *q = idx + 4 * r;
        const int64_t cell = ((int64_t)q[1] * g.h + q[2]) * g.w + q[3];
        dense[((int64_t)q[0] * c + ch) * cells + cell] = features[i];
    }
}

/* An f16 or bf16 element, moved as its bits. Both keep the sign in the top bit, so a value is
 * zero exactly when the bits below it are (-0 is zero, NaN is not, as for the wider types). */
struct float16_bits {
    uint16_t bits;
};

template <typename T> __device__ inline bool is_nonzero(T value) {
    return value != (T)0;
}
__device__ inline bool is_nonzero(float16_bits value) {
    return (value.bits & 0x7FFFu) != 0;
}

/* mask[site] = 1 where any channel is non-zero. */
template <typename T>
__global__ void mark_sites_kernel(int64_t *mask, const T *dense, int64_t batch, int64_t c,
                                  int64_t cells) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t s = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; s < batch * cells;
         s += step) {
        const int64_t b = s / cells, cell = s % cells;
        int64_t any = 0;
        for (int64_t ch = 0; ch < c && !any; ++ch) any = is_nonzero(dense[(b * c + ch) * cells + cell]);
        mask[s] = any;
    }
}

/* Site s with mask 1 becomes row pos[s] (exclusive prefix sum of the mask). */
template <typename T>
__global__ void gather_sites_kernel(T *features, int32_t *indices, const T *dense,
                                    const int64_t *mask, const int64_t *pos, site_grid g,
                                    int64_t c) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    const int64_t cells = g.d * g.h * g.w;
    for (int64_t s = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; s < g.batch * cells;
         s += step) {
        if (!mask[s]) continue;
        const int64_t b = s / cells, cell = s % cells, row = pos[s];
        int32_t *q = indices + 4 * row;
        q[0] = (int32_t)b;
        q[1] = (int32_t)(cell / (g.h * g.w));
        q[2] = (int32_t)(cell / g.w % g.h);
        q[3] = (int32_t)(cell % g.w);
        for (int64_t ch = 0; ch < c; ++ch)
            features[row * c + ch] = dense[(b * c + ch) * cells + cell];
    }
}

/* ---- host side ------------------------------------------------------------------------------ */

struct dense_call {
    spconv__cuda_device_guard guard;
    const spconv_context *ctx = NULL; /* scratch arrays come from its allocator */
    cudaStream_t stream = NULL;
    int blocks = 1;

    spconv_status enter(spconv_context *call_ctx, spconv_device device) {
        ctx = call_ctx;
        SPCONV_FORWARD_IF_ERROR(guard.enter(device.index));
        stream = spconv__cuda_stream_for(call_ctx, device.index);
        int resident = 0;
        SPCONV_FORWARD_IF_ERROR(spconv__cuda_resident_blocks(DENSE_THREADS, &resident));
        blocks = resident > 0 ? resident : 1;
        return SPCONV_OK;
    }
    int grid(int64_t work) const {
        const int64_t needed = (work + DENSE_THREADS - 1) / DENSE_THREADS;
        return (int)(needed < blocks ? (needed > 0 ? needed : 1) : blocks);
    }
};

#define DENSE_LAUNCH(call, kernel, work, ...)                                                      \
    do {                                                                                           \
        if ((work) > 0) {                                                                          \
            SPCONV_CUDA_LAUNCH(kernel, (call).grid(work), DENSE_THREADS, 0, (call).stream,        \
                               __VA_ARGS__);                                                       \
            CUDA_TRY(cudaGetLastError());                                                          \
        }                                                                                          \
    } while (0)

static spconv_status check_dtype(const char *func, spconv_dtype dtype) {
    SPCONV_RETURN_ERROR_IF(dtype != SPCONV_F16 && dtype != SPCONV_BF16 && dtype != SPCONV_F32 &&
                               dtype != SPCONV_F64 && dtype != SPCONV_I32,
                           SPCONV_ERR_NOT_SUPPORTED,
                           "%s: the cuda backend moves f16, bf16, f32, f64 or i32 elements, not %s "
                           "yet",
                           func, spconv_dtype_name(dtype));
    return SPCONV_OK;
}

/* Every row checked on the device; the first bad one named with the CPU's message. */
static spconv_status check_rows(const char *func, dense_call &call, const int32_t *idx, int64_t n,
                                const site_grid &g) {
    const int64_t grid[4] = {g.batch, g.d, g.h, g.w};
    spconv__site_check bad;
    SPCONV_FORWARD_IF_ERROR(
        spconv__cuda_check_sites(func, call.ctx, call.stream, call.blocks, idx, n, grid, &bad));
    if (bad.bad_row == INT32_MAX) return SPCONV_OK;
    const int32_t *q = bad.site;
    if (bad.repeated)
        return spconv__error(SPCONV_ERR_DUPLICATE_INDEX,
                             "%s: indices rows %lld and %lld are both (%d, %d, %d, %d)", func,
                             (long long)bad.earlier_row, (long long)bad.bad_row, q[0], q[1], q[2],
                             q[3]);
    return spconv__error(SPCONV_ERR_OUT_OF_RANGE,
                         "%s: indices row %lld = (%d, %d, %d, %d) is outside batch size %lld "
                         "and spatial shape (%lld, %lld, %lld)",
                         func, (long long)bad.bad_row, q[0], q[1], q[2], q[3], (long long)g.batch,
                         (long long)g.d, (long long)g.h, (long long)g.w);
}

template <typename T>
static spconv_status scatter_typed(dense_call &call, spconv_tensor *dense, const spconv_tensor *f,
                                   const int32_t *idx, const site_grid &g) {
    const int64_t n = spconv_tensor_size(f, 0), c = spconv_tensor_size(f, 1);
    DENSE_LAUNCH(call, (to_dense5_kernel<T>), n * c, (T *)spconv_tensor_data(dense),
                 (const T *)spconv_tensor_data(f), idx, g, n, c);
    return SPCONV_OK;
}

extern "C" spconv_status spconv__cuda_sparse_to_dense(spconv_context *ctx,
                                                      const spconv_tensor *features,
                                                      const spconv_tensor *indices,
                                                      const int64_t spatial_shape[3],
                                                      int64_t batch_size, spconv_tensor **out) {
    static const char func[] = "spconv_sparse_to_dense";
    const spconv_dtype dtype = spconv_tensor_dtype(features);
    SPCONV_FORWARD_IF_ERROR(check_dtype(func, dtype));
    const spconv_device device = spconv_tensor_device(features);
    dense_call call;
    SPCONV_FORWARD_IF_ERROR(call.enter(ctx, device));
    spconv_tensor *f = NULL, *idx = NULL, *dense = NULL;
    const site_grid g = {batch_size, spatial_shape[0], spatial_shape[1], spatial_shape[2]};
    const int64_t sizes[5] = {batch_size, spconv_tensor_size(features, 1), spatial_shape[0],
                              spatial_shape[1], spatial_shape[2]};
    spconv_status st = spconv_tensor_contiguous(ctx, features, &f);
    if (st == SPCONV_OK) st = spconv_tensor_contiguous(ctx, indices, &idx);
    const int32_t *rows = idx != NULL ? (const int32_t *)spconv_tensor_data(idx) : NULL;
    if (st == SPCONV_OK) st = check_rows(func, call, rows, spconv_tensor_size(idx, 0), g);
    if (st == SPCONV_OK) st = spconv__tensor_zeros_in(func, ctx, device, dtype, 5, sizes, &dense);
    if (st == SPCONV_OK)
        st = dtype == SPCONV_F32   ? scatter_typed<float>(call, dense, f, rows, g)
             : dtype == SPCONV_F64 ? scatter_typed<double>(call, dense, f, rows, g)
             : dtype == SPCONV_I32 ? scatter_typed<int32_t>(call, dense, f, rows, g)
                                   : scatter_typed<float16_bits>(call, dense, f, rows, g);
    /* No wait: the contiguous copies go back stream-ordered, or through cudaFree (conv.cu). */
    spconv_tensor_release(f);
    spconv_tensor_release(idx);
    if (st != SPCONV_OK) {
        spconv_tensor_release(dense);
        return st;
    }
    *out = dense;
    return SPCONV_OK;
}

template <typename T>
static spconv_status gather_typed(spconv_context *ctx, dense_call &call, const spconv_tensor *d,
                                  spconv_tensor **features, spconv_tensor **indices) {
    static const char func[] = "spconv_dense_to_sparse";
    const int64_t *sizes = spconv_tensor_sizes(d);
    const site_grid g = {sizes[0], sizes[2], sizes[3], sizes[4]};
    const int64_t c = sizes[1], cells = g.d * g.h * g.w, sites = g.batch * cells;
    const T *dense = (const T *)spconv_tensor_data(d);
    spconv__device_array<int64_t> mask, pos;
    SPCONV_FORWARD_IF_ERROR(mask.alloc(call.ctx, func, sites, "the site mask"));
    SPCONV_FORWARD_IF_ERROR(pos.alloc(call.ctx, func, sites, "the site rows"));
    DENSE_LAUNCH(call, (mark_sites_kernel<T>), sites, mask.get(), dense, g.batch, c, cells);
    int64_t n = 0;
    if (sites > 0) {
        SPCONV_FORWARD_IF_ERROR(SPCONV_THRUST(call.ctx, func, call.stream,
                                              "numbering the active sites",
                                              thrust::exclusive_scan, mask.get(),
                                              mask.get() + sites, pos.get()));
        int64_t last[2] = {0, 0};
        const spconv__host_read reads[2] = {{&last[0], mask.get() + sites - 1, sizeof last[0]},
                                            {&last[1], pos.get() + sites - 1, sizeof last[1]}};
        CUDA_TRY(spconv__cuda_read_back(call.stream, reads, 2));
        n = last[0] + last[1];
    }
    const spconv_device device = spconv_tensor_device(d);
    const int64_t f_sizes[2] = {n, c}, i_sizes[2] = {n, 4};
    spconv_tensor *f = NULL, *idx = NULL;
    spconv_status st =
        spconv__tensor_empty_in(func, ctx, device, spconv_tensor_dtype(d), 2, f_sizes, &f);
    if (st == SPCONV_OK)
        st = spconv__tensor_empty_in(func, ctx, device, SPCONV_I32, 2, i_sizes, &idx);
    if (st == SPCONV_OK && sites > 0) {
        SPCONV_CUDA_LAUNCH((gather_sites_kernel<T>), call.grid(sites), DENSE_THREADS, 0,
                           call.stream, (T *)spconv_tensor_data(f),
                           (int32_t *)spconv_tensor_data(idx), dense, mask.get(), pos.get(), g, c);
        const cudaError_t err = cudaGetLastError(); /* no wait, as above */
        if (err != cudaSuccess)
            st = spconv__error(SPCONV_ERR_CUDA, "%s: %s", func, cudaGetErrorString(err));
    }
    if (st != SPCONV_OK) {
        spconv_tensor_release(f);
        spconv_tensor_release(idx);
        return st;
    }
    *features = f;
    *indices = idx;
    return SPCONV_OK;
}

extern "C" spconv_status spconv__cuda_dense_to_sparse(spconv_context *ctx,
                                                      const spconv_tensor *dense,
                                                      spconv_tensor **features,
                                                      spconv_tensor **indices) {
    static const char func[] = "spconv_dense_to_sparse";
    const spconv_dtype dtype = spconv_tensor_dtype(dense);
    SPCONV_FORWARD_IF_ERROR(check_dtype(func, dtype));
    dense_call call;
    SPCONV_FORWARD_IF_ERROR(call.enter(ctx, spconv_tensor_device(dense)));
    spconv_tensor *d = NULL;
    SPCONV_FORWARD_IF_ERROR(spconv_tensor_contiguous(ctx, dense, &d));
    const spconv_status st =
        dtype == SPCONV_F32   ? gather_typed<float>(ctx, call, d, features, indices)
        : dtype == SPCONV_F64 ? gather_typed<double>(ctx, call, d, features, indices)
        : dtype == SPCONV_I32 ? gather_typed<int32_t>(ctx, call, d, features, indices)
                              : gather_typed<float16_bits>(ctx, call, d, features, indices);
    spconv_tensor_release(d);
    return st;
}
