/**
 * @file context.h
 * @brief Execution context: device, CPU thread count, CUDA stream, cuBLAS handle, workspace,
 * memory allocator and the precision of f32 products.
 *
 * A context is not thread-safe: use one context per thread. Every op that does work takes a
 * context; passing NULL uses a default CPU context (all cores, no CUDA stream, the library's own
 * allocator, full f32 products), which is fine for CPU tensors and for CUDA tensors on the legacy
 * default stream.
 *
 * What a framework such as PyTorch sets on a CUDA context: its allocator
 * (spconv_context_set_allocator), so that outputs come from its memory pool, and its current
 * stream (spconv_context_set_cuda_stream), so that the work is ordered with its own.
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
 * Create a context for @p device. For CUDA this selects the device, creates a stream and a
 * cuBLAS handle bound to it. The stream is a blocking one: the work of calls without a context
 * (queued on the legacy default stream) and the context's work are ordered both ways, with no
 * host wait. Ops return once their work is queued (copies to or from host memory excepted), so
 * an op does not wait for its own work. What is not ordered, as between any two CUDA streams:
 * two contexts' streams, an external non-blocking stream (spconv_context_set_cuda_stream) and
 * the legacy stream, and the per-thread default stream of code built with
 * --default-stream per-thread. Handing a tensor across those, or releasing it while another's
 * queued work still reads it, needs spconv_context_synchronize first; so does a call without a
 * context that reads such a tensor on the host (spconv_sparse_create computing the batch size
 * from CUDA indices is one). Returns SPCONV_ERR_NO_DEVICE when the device is not built in or not
 * present. *out is returned owned by the caller (free with spconv_context_destroy).
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
 * when asked for more and stays valid until the next call of this function, of
 * spconv_context_set_allocator, or destroy. Ops run with the context use it too (the CUDA
 * backend's conv and network layers keep their gathered operands and partial sums there), so
 * its contents do not survive an op. Before a larger buffer replaces it, the context waits for
 * the work queued on its stream, which may still use the old one.
 */
spconv_status spconv_context_workspace(spconv_context *ctx, size_t nbytes, void **ptr);

/* ---- memory allocator hook ------------------------------------------------------------------ */

/** The alignment, in bytes, that memory from an allocator hook must have: the alignment of
 *  cudaMalloc, which kernels and cuBLAS may rely on. */
#define SPCONV_ALLOCATOR_ALIGNMENT 256

/** Returns @p nbytes (> 0) of memory on @p device, aligned to SPCONV_ALLOCATOR_ALIGNMENT, or NULL
 *  when it cannot. For CUDA it is device memory usable by work queued on the context's stream. */
typedef void *(*spconv_alloc_fn)(size_t nbytes, spconv_device device, void *user_data);
/** Gives back @p ptr, which the matching alloc_fn returned for @p nbytes on @p device. */
typedef void (*spconv_free_fn)(void *ptr, size_t nbytes, spconv_device device, void *user_data);

/**
 * Let @p alloc_fn / @p free_fn provide the memory that calls made with @p ctx allocate on the
 * context's device:
 *
 * - the outputs of ops on the CUDA backend (conv forward and backward, max pooling, rulebooks,
 *   voxels, sparse <-> dense) and the temporaries it makes for a call (operands copied to the
 *   device, the scratch arrays of the rulebook builders, the voxelizer and the site checks);
 * - the layer outputs of spconv_net_forward / spconv_net_backward (features and gradients);
 * - the tensors made by the tensor functions that take a context (spconv_tensor_zeros, _full,
 *   _arange, _from_host, _to_device, _clone, _contiguous, _to_dtype, _reshape);
 * - the context's workspace (spconv_context_workspace), where the CUDA backend's conv and network
 *   layers keep their scratch.
 *
 * Not through the hook: memory on other devices (the host staging buffers of a CUDA context),
 * the outputs of the CPU backend's own ops (conv, pooling, rulebooks, voxels, sparse <-> dense:
 * a CPU context's hook sees the tensor functions, the network's layer outputs and the
 * workspace), spconv_tensor_empty and spconv_storage_create (which take no context), and
 * zero-byte tensors (which have no memory). On the CUDA backend Thrust's temporary storage inside
 * sorts and scans does come from the hook, as the builders' other scratch arrays do.
 *
 * Without a hook, CUDA memory comes from the backend's pool (one per device, kept for the
 * process, caching what is given back): taken on the call's stream (the legacy stream for a call
 * without a CUDA context), given back with cudaFreeAsync on the legacy stream, which waits for
 * the work queued before it on every blocking stream, and reused only once that free has run, so
 * that releasing a tensor neither waits for the device nor lets its memory be reused under queued
 * work. Work on a non-blocking stream is not ordered that way: a context working on a caller's
 * non-blocking stream (spconv_context_set_cuda_stream) allocates with cudaMalloc instead, whose
 * cudaFree waits; while one does, every pool free on its device waits for the device first; and
 * leaving such a stream (another stream, or spconv_context_destroy) waits for it. A tensor from
 * the pool that the caller's own non-blocking-stream work uses must be released after that work
 * is waited for.
 *
 * A tensor made through the hook remembers @p free_fn and @p user_data: releasing its last
 * reference calls free_fn, even after the context is destroyed or given another allocator, so
 * @p user_data must stay valid until every such tensor is released.
 *
 * On CUDA the hook must be stream-ordered on the context's stream, as c10's CUDA caching
 * allocator and cudaMallocAsync / cudaFreeAsync are: a block given to free_fn may still be in use
 * by work queued on that stream, and may be handed out again only to work queued after it (or
 * after the stream has been waited for). The library relies on this: it gives back its own
 * scratch blocks as soon as the work that uses them is queued, without waiting, and so may a
 * caller that releases a tensor. A hook that is not stream-ordered must wait for the context's
 * stream (spconv_context_synchronize, or cudaStreamSynchronize on spconv_context_cuda_stream) in
 * free_fn before reusing the block.
 *
 * When alloc_fn returns NULL the call fails with SPCONV_ERR_OUT_OF_MEMORY and a message naming
 * the hook, the size and the device; a pointer that is not aligned to SPCONV_ALLOCATOR_ALIGNMENT
 * is given back through free_fn and the call fails with SPCONV_ERR_INVALID_ARGUMENT.
 *
 * Both functions NULL restore the library's own allocator (64-byte aligned host memory on the
 * CPU; on CUDA a stream-ordered pool per device, below); exactly one NULL is SPCONV_ERR_INVALID_ARGUMENT and changes nothing. The
 * workspace, which came from the previous allocator, is given back to it first.
 */
spconv_status spconv_context_set_allocator(spconv_context *ctx, spconv_alloc_fn alloc_fn,
                                           spconv_free_fn free_fn, void *user_data);

/* ---- CUDA stream, cuBLAS handle and f32 products -------------------------------------------- */

/** The cudaStream_t that the context's work is queued on, as an opaque pointer: its own stream,
 *  or the one given to spconv_context_set_cuda_stream (NULL for the CPU). */
void *spconv_context_cuda_stream(const spconv_context *ctx);

/**
 * Queue the context's work on @p stream (a cudaStream_t of the context's device, e.g.
 * torch.cuda.current_stream().cuda_stream) instead of the context's own stream; the cuBLAS handle
 * follows it (cublasSetStream). NULL goes back to the context's own stream, so the legacy default
 * stream (PyTorch's default stream, whose cuda_stream is 0) is given as cudaStreamLegacy
 * ((void *)0x1). Work queued so far on the previous stream comes before work queued on the new
 * one (an event; the host does not wait).
 *
 * The context does not own an external stream and never destroys it; the stream must outlive its
 * use by the context (set NULL, or destroy the context, before destroying the stream: destroy and
 * a workspace that grows wait for the work queued on the stream in use). Ordering with other
 * streams is the caller's business: the context's calls are ordered on this one stream only
 * (copies to or from the host still wait for it). A CPU context answers
 * SPCONV_ERR_INVALID_ARGUMENT, NULL SPCONV_ERR_NULL_POINTER; a stream the runtime refuses,
 * SPCONV_ERR_CUDA, leaving the context on its previous stream.
 */
spconv_status spconv_context_set_cuda_stream(spconv_context *ctx, void *stream);

/** The context's cublasHandle_t as an opaque pointer (NULL for the CPU). */
void *spconv_context_cublas_handle(const spconv_context *ctx);

/**
 * Let f32 products on the CUDA backend use TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32):
 * inputs are rounded to a 10-bit mantissa before they are multiplied, so results change (a
 * relative error of about 2^-10 per term instead of 2^-24) in exchange for speed on Ampere and
 * later GPUs. Off (0) by default, and then products are computed in full f32
 * (CUBLAS_COMPUTE_32F), as before this setting existed. f64 products and the CPU backend are
 * never affected. Any non-zero @p allow turns it on.
 */
spconv_status spconv_context_set_allow_tf32(spconv_context *ctx, int allow);
/** 1 when the context allows TF32 products, 0 otherwise (and for NULL). */
int spconv_context_allow_tf32(const spconv_context *ctx);

/** Wait until all work queued on the context's stream is done (no-op on the CPU). */
spconv_status spconv_context_synchronize(spconv_context *ctx);

#ifdef __cplusplus
}
#endif
#endif /* SPCONV_CONTEXT_H */
