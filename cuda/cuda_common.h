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
#include "spconv/tensor.h"

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
}

#endif /* SPCONV_CUDA_COMMON_H */
