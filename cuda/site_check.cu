/* Site rows checked on the device (site_check.h): every row claims its cell with atomicMin of its
 * row number, so a cell ends up owned by its first row; a row whose cell has an earlier owner
 * repeats it. The smallest such row and the smallest row outside the grid come back with one
 * read, and the earlier of the two is the one the CPU's walk over the rows stops at. */
#include "site_check.h"

#include "core/error.h"
#include "cuda_check.h"
#include "cuda_common.h"
#include "maps_common.h"

#define SITE_THREADS 256

struct site_grid {
    int64_t d[4];
};

static inline __host__ __device__ int64_t site_cell(const int32_t *q, const int64_t *g) {
    if (q[0] < 0 || q[0] >= g[0] || q[1] < 0 || q[1] >= g[1] || q[2] < 0 || q[2] >= g[2] ||
        q[3] < 0 || q[3] >= g[3])
        return -1;
    return (((int64_t)q[0] * g[1] + q[1]) * g[2] + q[2]) * g[3] + q[3];
}

__global__ void site_fill_kernel(int32_t *a, int32_t value, int64_t n) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) a[i] = value;
}

/* flags[0]: first row outside the grid; owner[cell]: first row at each cell. */
__global__ void site_claim_kernel(int32_t *owner, int32_t *flags, const int32_t *idx, site_grid g,
                                  int64_t n) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < n; r += step) {
        const int64_t cell = site_cell(idx + 4 * r, g.d);
        if (cell < 0)
            atomicMin(&flags[0], (int)r);
        else
            atomicMin(&owner[cell], (int)r);
    }
}

/* flags[1]: first row whose cell an earlier row holds. */
__global__ void site_repeat_kernel(const int32_t *owner, int32_t *flags, const int32_t *idx,
                                   site_grid g, int64_t n) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < n; r += step) {
        const int64_t cell = site_cell(idx + 4 * r, g.d);
        if (cell >= 0 && owner[cell] < r) atomicMin(&flags[1], (int)r);
    }
}

static int grid_for(int64_t work, int blocks) {
    const int64_t needed = (work + SITE_THREADS - 1) / SITE_THREADS;
    return (int)(needed < blocks ? (needed > 0 ? needed : 1) : blocks);
}

spconv_status spconv__cuda_check_sites(const char *func, const spconv_context *ctx,
                                       cudaStream_t stream, int blocks,
                                       const int32_t *idx, int64_t n, const int64_t grid[4],
                                       spconv__site_check *out) {
    out->bad_row = INT32_MAX;
    out->repeated = 0;
    out->earlier_row = INT32_MAX;
    if (n == 0) return SPCONV_OK;
    const site_grid g = {{grid[0], grid[1], grid[2], grid[3]}};
    const int64_t cells = grid[0] * grid[1] * grid[2] * grid[3];
    spconv__device_array<int32_t> owner, flags;
    SPCONV_FORWARD_IF_ERROR(owner.alloc(ctx, func, cells, "the first row at each site"));
    SPCONV_FORWARD_IF_ERROR(flags.alloc(ctx, func, 2, "the first bad rows"));
    if (cells > 0)
        SPCONV_CUDA_LAUNCH(site_fill_kernel, grid_for(cells, blocks), SITE_THREADS, 0, stream,
                           owner.get(), INT32_MAX, cells);
    SPCONV_CUDA_LAUNCH(site_fill_kernel, 1, SITE_THREADS, 0, stream, flags.get(), INT32_MAX,
                       (int64_t)2);
    SPCONV_CUDA_LAUNCH(site_claim_kernel, grid_for(n, blocks), SITE_THREADS, 0, stream,
                       owner.get(), flags.get(), idx, g, n);
    SPCONV_CUDA_LAUNCH(site_repeat_kernel, grid_for(n, blocks), SITE_THREADS, 0, stream,
                       owner.get(), flags.get(), idx, g, n);
    CUDA_TRY(cudaGetLastError());
    int32_t bad[2] = {INT32_MAX, INT32_MAX};
    CUDA_TRY(cudaMemcpyAsync(bad, flags.get(), sizeof bad, cudaMemcpyDeviceToHost, stream));
    CUDA_TRY(cudaStreamSynchronize(stream));
    if (bad[0] == INT32_MAX && bad[1] == INT32_MAX) return SPCONV_OK;
    out->repeated = bad[1] < bad[0];
    out->bad_row = out->repeated ? bad[1] : bad[0];
    CUDA_TRY(cudaMemcpyAsync(out->site, idx + 4 * (int64_t)out->bad_row, sizeof out->site,
                             cudaMemcpyDeviceToHost, stream));
    CUDA_TRY(cudaStreamSynchronize(stream));
    if (out->repeated) {
        CUDA_TRY(cudaMemcpyAsync(&out->earlier_row, owner.get() + site_cell(out->site, grid),
                                 sizeof out->earlier_row, cudaMemcpyDeviceToHost, stream));
        CUDA_TRY(cudaStreamSynchronize(stream));
    }
    return SPCONV_OK;
}
