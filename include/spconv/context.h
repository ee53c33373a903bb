/**
 * @file context.h
 * @brief Execution context: device, CPU thread count, CUDA stream, cuBLAS handle, workspace.
 *
 * A context is not thread-safe: use one context per thread. Every op that does work takes a
 * context; passing NULL uses a default CPU context (all cores, no CUDA stream), which is fine
 * for CPU tensors and for CUDA tensors on the legacy default stream.
 */
#ifndef SPCONV_CONTEXT_H
#define SPCONV_CONTEXT_H

#include <stddef.h>

#include "spconv/status.h"
#include "spconv/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spconv_context spconv_context;

/**
 * Create a context for @p device. For CUDA this selects the device, creates a non-blocking
 * stream and a cuBLAS handle bound to it. Returns SPCONV_ERR_NO_DEVICE when the device is not
 * built in or not present. *out is returned owned by the caller (free with
 * spconv_context_destroy).
 */
spconv_status spconv_context_create(spconv_device device, spconv_context **out);

/** Destroy a context and its workspace, stream and handle; NULL is a no-op. */
void spconv_context_destroy(spconv_context *ctx);

/** The context's device (the CPU for NULL). */
spconv_device spconv_context_device(const spconv_context *ctx);

/** The most CPU threads a context accepts. OpenMP runtimes fail inside their own code (libgomp
 *  crashes or calls exit) when asked for tens of thousands of threads, and no machine this
 *  engine targets has more than a few hundred cores. */
#define SPCONV_MAX_THREADS 1024

/** CPU threads used by ops run with this context; 0 (the default) means all cores. A count
 *  outside [0, SPCONV_MAX_THREADS] is SPCONV_ERR_INVALID_ARGUMENT and leaves the context as it
 *  was. */
spconv_status spconv_context_set_num_threads(spconv_context *ctx, int num_threads);
/** Effective CPU thread count (>= 1) of @p ctx (NULL: the default). */
int spconv_context_num_threads(const spconv_context *ctx);

/**
 * A scratch buffer of at least @p nbytes on the context's device, owned by the context. It grows
 * when asked for more and stays valid until the next call of this function or destroy.
 */
spconv_status spconv_context_workspace(spconv_context *ctx, size_t nbytes, void **ptr);

/** The context's cudaStream_t as an opaque pointer (NULL for the CPU or the default stream). */
void *spconv_context_cuda_stream(const spconv_context *ctx);
/** The context's cublasHandle_t as an opaque pointer (NULL for the CPU). */
void *spconv_context_cublas_handle(const spconv_context *ctx);

/** Wait until all work queued on the context's stream is done (no-op on the CPU). */
spconv_status spconv_context_synchronize(spconv_context *ctx);

#ifdef __cplusplus
}
#endif
#endif /* SPCONV_CONTEXT_H */
