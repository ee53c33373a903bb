/* What the CUDA backend's .cu files share: choosing the device and the stream of a call, the
 * launch macro (launch.h) and the launch limit of grid-stride loops, and the op entry points that
 * backend.cu puts in the table. */
#ifndef SPCONV_CUDA_COMMON_H
#define SPCONV_CUDA_COMMON_H

#include <cuda_runtime.h>

#include "core/backend.h"
#include "core/context_impl.h"
#include "cuda_check.h"
#include "launch.h"
#include "spconv/rulebook.h"
#include "spconv/tensor.h"
#include "spconv/voxelize.h"
#include "tensor/tensor_impl.h"

/* Makes a device current for the guard's lifetime and then restores the caller's choice, so a
 * library call never leaves the calling thread on another device than it found it. */
class spconv__cuda_device_guard {
public:
    spconv__cuda_device_guard() = default;
    spconv__cuda_device_guard(const spconv__cuda_device_guard &) = delete;
    spconv__cuda_device_guard &operator=(const spconv__cuda_device_guard &) = delete;

    spconv_status enter(int device_index) {
        int current = 0;
        CUDA_TRY(cudaGetDevice(&current));
        if (current != device_index) {
            CUDA_TRY(cudaSetDevice(device_index));
            previous_ = current;
        }
        return SPCONV_OK;
    }

    /* Restoring cannot be reported from a destructor; a failure here would mean the runtime is
     * already broken, and the next checked call says so. */
    ~spconv__cuda_device_guard() {
        if (previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
    }

private:
    int previous_ = -1; /* -1: the device was already current, nothing to restore */
};

/* The stream that orders work on @p device_index for @p ctx: the context's own stream when ctx
 * is a CUDA context of that device, otherwise (NULL or a CPU context) the legacy default
 * stream, which the caller's own default-stream work is ordered against. */
static inline cudaStream_t spconv__cuda_stream_for(const spconv_context *ctx, int device_index) {
    if (ctx != NULL && ctx->device.type == SPCONV_DEVICE_CUDA &&
        ctx->device.index == device_index && ctx->cuda_stream != NULL)
        return (cudaStream_t)ctx->cuda_stream;
    return cudaStreamLegacy;
}

/* One range to read back to the host: bytes at device address src into host memory dst. */
typedef struct spconv__host_read {
    void *dst;
    const void *src;
    size_t bytes;
} spconv__host_read;

/* Queue the @p count copies of @p reads to the host on @p stream and wait for the stream. The wait
 * comes even when a copy cannot be queued, so that no copy into the caller's memory (often its
 * stack) is still queued when this returns; the first error is the result. */
static inline cudaError_t spconv__cuda_read_back(cudaStream_t stream,
                                                 const spconv__host_read *reads, int count) {
    cudaError_t err = cudaSuccess;
    for (int i = 0; i < count && err == cudaSuccess; ++i)
        if (reads[i].bytes > 0)
            err = cudaMemcpyAsync(reads[i].dst, reads[i].src, reads[i].bytes,
                                  cudaMemcpyDeviceToHost, stream);
    const cudaError_t waited = cudaStreamSynchronize(stream);
    return err != cudaSuccess ? err : waited;
}

/* Scratch memory of one call, carved into pieces: the context's workspace when the call's context
 * is a CUDA context of its device (calls on one context are ordered on its stream, so the next
 * call may reuse the workspace at once), otherwise memory the call allocates and frees. Ask for
 * the total first (the sum of piece_bytes of every piece), then take the pieces: nothing else may
 * ask the context for its workspace in between, since a larger one would replace it. */
class spconv__cuda_scratch {
public:
    spconv__cuda_scratch() = default;
    spconv__cuda_scratch(const spconv__cuda_scratch &) = delete;
    spconv__cuda_scratch &operator=(const spconv__cuda_scratch &) = delete;
    ~spconv__cuda_scratch() { spconv__context_free(&own_); }

    /* Bytes a piece of @p nbytes takes: pieces start on the allocator alignment (context.h). */
    static size_t piece_bytes(size_t nbytes) {
        const size_t align = SPCONV_ALLOCATOR_ALIGNMENT;
        return (nbytes + align - 1) / align * align;
    }

    spconv_status reserve(const char *func, spconv_context *ctx, spconv_device device,
                          size_t nbytes) {
        void *base = NULL;
        if (ctx != NULL && spconv_device_equal(ctx->device, device)) {
            SPCONV_FORWARD_IF_ERROR(spconv_context_workspace(ctx, nbytes, &base));
        } else {
            SPCONV_FORWARD_IF_ERROR(spconv__context_alloc(func, ctx, device, nbytes, &own_));
            base = own_.data;
        }
        base_ = (char *)base;
        size_ = nbytes;
        used_ = 0;
        return SPCONV_OK;
    }

    /* The next piece of @p nbytes (within what was reserved). */
    void *take(size_t nbytes) {
        if (base_ == NULL || used_ + piece_bytes(nbytes) > size_) return NULL;
        void *piece = base_ + used_;
        used_ += piece_bytes(nbytes);
        return piece;
    }

    /* Start carving again from the first byte: for work ordered after everything that used the
     * earlier pieces (the next step on the same stream). */
    void rewind() { used_ = 0; }

private:
    spconv__allocation own_ = {};
    char *base_ = NULL;
    size_t size_ = 0, used_ = 0;
};

/* Threads per block of the element-wise kernels. */
#define SPCONV_CUDA_ELEMENTWISE_THREADS 256

/* How many blocks of @p threads_per_block the current device keeps resident at once: the most a
 * grid-stride loop needs to keep every SM busy. */
spconv_status spconv__cuda_resident_blocks(int threads_per_block, int *blocks);

/* The element-wise slots of the backend table (elementwise.cu). */
spconv_status spconv__cuda_copy_strided(spconv_context *ctx, spconv_tensor *dst,
                                        const spconv_tensor *src);
spconv_status spconv__cuda_fill(spconv_context *ctx, spconv_tensor *dst, double value);

/* The conv and pooling slots (conv.cu). */
extern "C" {
spconv_status spconv__cuda_conv_forward(spconv_context *ctx, const spconv_rulebook *rb,
                                        const spconv_tensor *features, const spconv_tensor *weight,
                                        const spconv_tensor *bias,
                                        const spconv__conv_options *options, spconv_tensor **out);
spconv_status spconv__cuda_conv_backward(spconv_context *ctx, const spconv_rulebook *rb,
                                         const spconv_tensor *features,
                                         const spconv_tensor *weight,
                                         const spconv_tensor *grad_out,
                                         const spconv__conv_options *options,
                                         spconv_tensor **grad_features,
                                         spconv_tensor **grad_weight, spconv_tensor **grad_bias);
spconv_status spconv__cuda_maxpool_forward(spconv_context *ctx, const spconv_rulebook *rb,
                                           const spconv_tensor *features, spconv_tensor **out,
                                           spconv_tensor **argmax);
spconv_status spconv__cuda_maxpool_backward(spconv_context *ctx, const spconv_rulebook *rb,
                                            const spconv_tensor *argmax,
                                            const spconv_tensor *grad_out,
                                            spconv_tensor **grad_features);

/* Sparse <-> dense [B, C, D, H, W] (dense.cu). */
spconv_status spconv__cuda_sparse_to_dense(spconv_context *ctx, const spconv_tensor *features,
                                           const spconv_tensor *indices,
                                           const int64_t spatial_shape[3], int64_t batch_size,
                                           spconv_tensor **out);
spconv_status spconv__cuda_dense_to_sparse(spconv_context *ctx, const spconv_tensor *dense,
                                           spconv_tensor **features, spconv_tensor **indices);

/* The network's layers (net.cu). */
spconv_status spconv__cuda_batchnorm_stats(spconv_context *ctx, const spconv_tensor *x,
                                           double eps, double *stats);
spconv_status spconv__cuda_batchnorm_terms(spconv_context *ctx, const spconv_tensor *x,
                                           const double *affine, const double *stats,
                                           double *terms);
spconv_status spconv__cuda_batchnorm_apply(spconv_context *ctx, const spconv_tensor *x,
                                           const double *scale, const double *shift, int relu,
                                           spconv_tensor *y);
spconv_status spconv__cuda_batchnorm_backward(spconv_context *ctx, const spconv_tensor *x,
                                              const spconv_tensor *dy, const double *stats,
                                              const double *gamma, spconv_tensor *dx,
                                              double *sums);
spconv_status spconv__cuda_relu_forward(spconv_context *ctx, const spconv_tensor *x,
                                        spconv_tensor *y);
spconv_status spconv__cuda_relu_backward(spconv_context *ctx, const spconv_tensor *y,
                                         const spconv_tensor *dy, spconv_tensor *dx);
spconv_status spconv__cuda_axpy(spconv_context *ctx, double alpha, const spconv_tensor *x,
                                spconv_tensor *y);
spconv_status spconv__cuda_to_dense_scatter(spconv_context *ctx, const spconv_tensor *features,
                                            const spconv_tensor *indices, spconv_tensor *dense);
spconv_status spconv__cuda_to_dense_gather(spconv_context *ctx, const spconv_tensor *dense,
                                           const spconv_tensor *indices, spconv_tensor *features);
}

/* The map slots: points to voxels (voxelize.cu) and rulebooks (rulebook.cu), arguments checked by
 * the entry points as for the CPU backend. */
spconv_status spconv__cuda_voxelize(spconv_context *ctx, const char *func,
                                    const spconv_tensor *const *scans, int64_t num_scans,
                                    const spconv_voxelize_params *params, int batch_column,
                                    spconv_voxels *out);
spconv_status spconv__cuda_rulebook_build(spconv_context *ctx, const spconv_tensor *indices,
                                          const int64_t spatial_shape[3], int64_t batch_size,
                                          const spconv_conv_params *params,
                                          spconv_rulebook **out);

#endif /* SPCONV_CUDA_COMMON_H */
