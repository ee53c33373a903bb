/* The CUDA backend's table, and its device, context and memory slots: storage from a
 * stream-ordered pool per device (or cudaMalloc), transfers ordered on the context's stream, and a cuBLAS handle bound to that stream. */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdint.h>
#include <string.h>

#include <atomic>
#include <mutex>

#include "core/backend.h"
#include "core/context_impl.h"
#include "cuda_check.h"
#include "cuda_common.h"

/* ---- devices ------------------------------------------------------------------------------- */

/* No driver, no device or a driver older than the runtime all mean "no GPU here", which is an
 * answer, not an error. The failed query is the runtime's last error until read: read it so that
 * it does not surface at a later, unrelated check. */
static int cuda_device_count(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return count;
}

spconv_status spconv__cuda_resident_blocks(int threads_per_block, int *blocks) {
    int device = 0, multiprocessors = 0, threads_per_multiprocessor = 0;
    CUDA_TRY(cudaGetDevice(&device));
    CUDA_TRY(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device));
    CUDA_TRY(cudaDeviceGetAttribute(&threads_per_multiprocessor,
                                    cudaDevAttrMaxThreadsPerMultiProcessor, device));
    *blocks = multiprocessors * (threads_per_multiprocessor / threads_per_block);
    return SPCONV_OK;
}

/* ---- contexts ------------------------------------------------------------------------------ */

static cudaError_t is_unordered_stream(const spconv_context *ctx, cudaStream_t stream,
                                       int *unordered);
static void enter_unordered_stream(spconv_context *ctx);
static void leave_unordered_stream(spconv_context *ctx);

/* Releases whatever context_init made, so it also cleans up after a half-finished init. An
 * external stream (spconv_context_set_cuda_stream) is the caller's: it is left alone (waited
 * for, when it is non-blocking: see the pool below). */
static void cuda_context_destroy(spconv_context *ctx) {
    spconv__cuda_device_guard guard;
    if (guard.enter(ctx->device.index) != SPCONV_OK) return;
    leave_unordered_stream(ctx);
    if (ctx->cublas_handle != NULL) (void)cublasDestroy((cublasHandle_t)ctx->cublas_handle);
    cudaStream_t stream = (cudaStream_t)ctx->own_cuda_stream;
    if (stream != NULL && cudaStreamDestroy(stream) != cudaSuccess) (void)cudaGetLastError();
    ctx->cublas_handle = NULL;
    ctx->own_cuda_stream = NULL;
    ctx->cuda_stream = NULL;
}

/* The device stays current afterwards (context.h: creating a context selects its device), so
 * the caller's own kernels on spconv_context_cuda_stream() go to the right GPU. */
static spconv_status cuda_context_make_handles(spconv_context *ctx) {
    CUDA_TRY(cudaSetDevice(ctx->device.index));
    /* A blocking stream: work that calls without a context queue on the legacy default stream
     * (and the caller's own default-stream work) is ordered with the context's, both ways, with
     * no host wait. The ops do not wait for their work at the end, so that a network's layers
     * only queue: this ordering is what keeps mixing context and NULL-context calls safe, e.g.
     * reading a context call's output with spconv_tensor_copy_to_host(NULL, ...). */
    cudaStream_t stream = NULL;
    CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamDefault));
    ctx->own_cuda_stream = stream;
    ctx->cuda_stream = stream;
    cublasHandle_t handle = NULL;
    CUBLAS_TRY(cublasCreate(&handle));
    ctx->cublas_handle = handle;
    CUBLAS_TRY(cublasSetStream(handle, stream));
    return SPCONV_OK;
}

/* Work queued so far on the previous stream comes before work queued on the new one (an event,
 * so the host does not wait): the context's calls stay in order across the switch, and the
 * workspace is not reused too early. */
static spconv_status cuda_context_set_stream(spconv_context *ctx, void *stream) {
    spconv__cuda_device_guard guard;
    SPCONV_FORWARD_IF_ERROR(guard.enter(ctx->device.index));
    cudaStream_t previous = (cudaStream_t)ctx->cuda_stream;
    cudaStream_t next = stream != NULL ? (cudaStream_t)stream : (cudaStream_t)ctx->own_cuda_stream;
    if (next == previous) return SPCONV_OK;
    int unordered = 0;
    cudaError_t err = is_unordered_stream(ctx, next, &unordered);
    cudaEvent_t done = NULL;
    if (err == cudaSuccess) err = cudaEventCreate(&done);
    if (err == cudaSuccess) err = cudaEventRecord(done, previous);
    if (err == cudaSuccess) err = cudaStreamWaitEvent(next, done, 0);
    /* Destroying the event does not cancel the wait that was queued on it. */
    if (done != NULL && cudaEventDestroy(done) != cudaSuccess && err == cudaSuccess)
        err = cudaGetLastError();
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return spconv__error(SPCONV_ERR_CUDA,
                             "spconv_context_set_cuda_stream: stream %p cannot be used on CUDA "
                             "device %d: %s (%s)",
                             (void *)next, ctx->device.index, cudaGetErrorName(err),
                             cudaGetErrorString(err));
    }
    CUBLAS_TRY(cublasSetStream((cublasHandle_t)ctx->cublas_handle, next));
    leave_unordered_stream(ctx); /* waits for the previous stream, if it was one */
    ctx->cuda_stream = next;
    if (unordered) enter_unordered_stream(ctx);
    return SPCONV_OK;
}

static spconv_status cuda_context_init(spconv_context *ctx) {
    spconv_status st = cuda_context_make_handles(ctx);
    if (st != SPCONV_OK) cuda_context_destroy(ctx);
    return st;
}

static spconv_status cuda_synchronize(spconv_context *ctx) {
    spconv__cuda_device_guard guard;
    SPCONV_FORWARD_IF_ERROR(guard.enter(ctx->device.index));
    CUDA_TRY(cudaStreamSynchronize(spconv__cuda_stream_for(ctx, ctx->device.index)));
    return SPCONV_OK;
}

/* ---- the device's clock: CUDA events ------------------------------------------------------- */

static spconv_status cuda_mark_create(int device_index, void **mark) {
    *mark = NULL;
    spconv__cuda_device_guard guard;
    SPCONV_FORWARD_IF_ERROR(guard.enter(device_index));
    cudaEvent_t event = NULL;
    CUDA_TRY(cudaEventCreate(&event));
    *mark = event;
    return SPCONV_OK;
}

static void cuda_mark_destroy(int device_index, void *mark) {
    spconv__cuda_device_guard guard;
    if (guard.enter(device_index) != SPCONV_OK) return;
    if (cudaEventDestroy((cudaEvent_t)mark) != cudaSuccess) (void)cudaGetLastError();
}

static spconv_status cuda_mark_record(spconv_context *ctx, int device_index, void *mark) {
    spconv__cuda_device_guard guard;
    SPCONV_FORWARD_IF_ERROR(guard.enter(device_index));
    CUDA_TRY(cudaEventRecord((cudaEvent_t)mark, spconv__cuda_stream_for(ctx, device_index)));
    return SPCONV_OK;
}

static spconv_status cuda_mark_elapsed_ms(int device_index, void *start, void *end, double *ms) {
    spconv__cuda_device_guard guard;
    SPCONV_FORWARD_IF_ERROR(guard.enter(device_index));
    CUDA_TRY(cudaEventSynchronize((cudaEvent_t)end));
    float elapsed = 0.0f;
    CUDA_TRY(cudaEventElapsedTime(&elapsed, (cudaEvent_t)start, (cudaEvent_t)end));
    *ms = (double)elapsed;
    return SPCONV_OK;
}

/* ---- memory -------------------------------------------------------------------------------- */

/* Stream-ordered memory for calls (alloc_ordered). One pool per device, made on first use and
 * kept for the process, which keeps what is given back cached (release threshold: all of it), so
 * that a network's per-layer tensors neither call cudaMalloc nor wait for the device in cudaFree.
 *
 * A block is taken on the call's stream (the context's, or the legacy stream for a call without a
 * CUDA context of that device) and given back on the legacy stream, which waits for the work
 * queued before it on every blocking stream (the contexts' own streams are blocking), whichever
 * context queued it, and needs no stream that may be gone by then. The pool reuses a block only
 * once its free has completed on the device (no reuse through event or internal dependencies),
 * so a reused block is idle, whichever stream first touches it.
 *
 * Work on a non-blocking stream is not ordered with the legacy stream. A context working on a
 * caller's non-blocking stream (spconv_context_set_cuda_stream) allocates with cudaMalloc, and
 * while any such context exists on a device, every pool free there first waits for the whole
 * device, as cudaFree does: blocks may be in use by work on that stream. Leaving such a stream
 * (another stream, or destroying the context) waits for it first. Where the device has no pools,
 * or one cannot be made, calls get cudaMalloc. */
namespace {

const int max_pooled_devices = 64;
std::mutex pool_mutex;
cudaMemPool_t pools[max_pooled_devices];
bool pool_unavailable[max_pooled_devices];
std::atomic<int> unordered_contexts[max_pooled_devices];

/* The pool of @p device_index, or NULL where there is none (then the caller uses cudaMalloc). */
cudaMemPool_t device_pool(int device_index) {
    if (device_index < 0 || device_index >= max_pooled_devices) return NULL;
    std::lock_guard<std::mutex> lock(pool_mutex);
    if (pools[device_index] == NULL && !pool_unavailable[device_index]) {
        int supported = 0;
        cudaError_t err = cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported,
                                                 device_index);
        cudaMemPool_t pool = NULL;
        if (err == cudaSuccess && supported) {
            cudaMemPoolProps props;
            memset(&props, 0, sizeof props);
            props.allocType = cudaMemAllocationTypePinned;
            props.handleTypes = cudaMemHandleTypeNone;
            props.location.type = cudaMemLocationTypeDevice;
            props.location.id = device_index;
            err = cudaMemPoolCreate(&pool, &props);
        }
        uint64_t keep_all = UINT64_MAX;
        int no = 0;
        if (err == cudaSuccess && pool != NULL)
            err = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all);
        if (err == cudaSuccess && pool != NULL)
            err = cudaMemPoolSetAttribute(pool, cudaMemPoolReuseFollowEventDependencies, &no);
        if (err == cudaSuccess && pool != NULL)
            err = cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowInternalDependencies, &no);
        if (err == cudaSuccess && pool != NULL) {
            pools[device_index] = pool;
        } else {
            (void)cudaGetLastError();
            if (pool != NULL) (void)cudaMemPoolDestroy(pool);
            pool_unavailable[device_index] = true;
        }
    }
    return pools[device_index];
}

/* What stays cached in the pool of @p device_index goes back to the driver, once every free
 * queued so far has run: for an allocation that failed. 1 when there was a pool. */
bool trim_pool(int device_index) {
    cudaMemPool_t pool = NULL;
    {
        std::lock_guard<std::mutex> lock(pool_mutex);
        if (device_index >= 0 && device_index < max_pooled_devices) pool = pools[device_index];
    }
    if (pool == NULL) return false;
    if (cudaDeviceSynchronize() != cudaSuccess || cudaMemPoolTrimTo(pool, 0) != cudaSuccess)
        (void)cudaGetLastError();
    return true;
}

void pool_free(void *ptr, size_t, spconv_device device, void *) {
    spconv__cuda_device_guard guard;
    if (guard.enter(device.index) != SPCONV_OK) return;
    if (unordered_contexts[device.index].load(std::memory_order_acquire) > 0 &&
        cudaDeviceSynchronize() != cudaSuccess)
        (void)cudaGetLastError();
    if (cudaFreeAsync(ptr, cudaStreamLegacy) != cudaSuccess) (void)cudaGetLastError();
}

} // namespace

/* Whether @p stream is a caller's stream that the legacy stream does not order (non-blocking). */
static cudaError_t is_unordered_stream(const spconv_context *ctx, cudaStream_t stream,
                                       int *unordered) {
    *unordered = 0;
    if (stream == NULL || stream == (cudaStream_t)ctx->own_cuda_stream ||
        stream == cudaStreamLegacy || stream == cudaStreamPerThread)
        return cudaSuccess;
    unsigned int flags = 0;
    const cudaError_t err = cudaStreamGetFlags(stream, &flags);
    *unordered = err == cudaSuccess && (flags & cudaStreamNonBlocking) != 0;
    return err;
}

/* The context works on a non-blocking stream from now on: pool frees on its device wait. */
static void enter_unordered_stream(spconv_context *ctx) {
    if (ctx->device.index >= 0 && ctx->device.index < max_pooled_devices)
        unordered_contexts[ctx->device.index].fetch_add(1, std::memory_order_acq_rel);
    ctx->cuda_stream_unordered = 1;
}

/* The context stops working on a non-blocking stream: what it queued there is waited for, so
 * that pool frees no longer need to wait for the device on its account. */
static void leave_unordered_stream(spconv_context *ctx) {
    if (!ctx->cuda_stream_unordered) return;
    if (cudaStreamSynchronize((cudaStream_t)ctx->cuda_stream) != cudaSuccess)
        (void)cudaGetLastError();
    if (ctx->device.index >= 0 && ctx->device.index < max_pooled_devices)
        unordered_contexts[ctx->device.index].fetch_sub(1, std::memory_order_acq_rel);
    ctx->cuda_stream_unordered = 0;
}

static spconv_status cuda_alloc(int device_index, size_t nbytes, void **ptr) {
    *ptr = NULL;
    if (nbytes == 0) return SPCONV_OK;
    spconv__cuda_device_guard guard;
    SPCONV_FORWARD_IF_ERROR(guard.enter(device_index));
    cudaError_t err = cudaMalloc(ptr, nbytes);
    if (err == cudaErrorMemoryAllocation && trim_pool(device_index)) {
        (void)cudaGetLastError(); /* the pool's cache may be what is missing */
        err = cudaMalloc(ptr, nbytes);
    }
    if (err == cudaSuccess) return SPCONV_OK;
    (void)cudaGetLastError();
    *ptr = NULL;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    if (err == cudaErrorMemoryAllocation) {
        size_t free_bytes = 0, total_bytes = 0;
        if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
        return spconv__error(SPCONV_ERR_OUT_OF_MEMORY,
                             "cuda backend: out of memory on CUDA device %d allocating %zu bytes "
                             "(%.3g GiB; %.3g GiB free of %.3g GiB)",
                             device_index, nbytes, (double)nbytes / gib,
                             (double)free_bytes / gib, (double)total_bytes / gib);
    }
    return spconv__error(SPCONV_ERR_CUDA,
                         "cuda backend: cudaMalloc of %zu bytes (%.3g GiB) on CUDA device %d "
                         "failed: %s (%s)",
                         nbytes, (double)nbytes / gib, device_index, cudaGetErrorName(err),
                         cudaGetErrorString(err));
}

static spconv_status cuda_alloc_ordered(const spconv_context *ctx, int device_index,
                                        size_t nbytes, void **ptr, spconv_free_fn *free_fn) {
    *ptr = NULL;
    *free_fn = NULL;
    if (nbytes == 0) return SPCONV_OK;
    const int on_unordered_stream = ctx != NULL && ctx->device.type == SPCONV_DEVICE_CUDA &&
                                    ctx->device.index == device_index &&
                                    ctx->cuda_stream_unordered;
    cudaMemPool_t pool = on_unordered_stream ? NULL : device_pool(device_index);
    if (pool == NULL) return cuda_alloc(device_index, nbytes, ptr);
    spconv__cuda_device_guard guard;
    SPCONV_FORWARD_IF_ERROR(guard.enter(device_index));
    const cudaStream_t stream = spconv__cuda_stream_for(ctx, device_index);
    cudaError_t err = cudaMallocFromPoolAsync(ptr, nbytes, pool, stream);
    if (err == cudaErrorMemoryAllocation) {
        /* Blocks given back but not yet reached by their stream, and cached ones, may be what is
         * missing: wait for them, hand the cache back to the driver, and try once more. */
        (void)cudaGetLastError();
        trim_pool(device_index);
        err = cudaMallocFromPoolAsync(ptr, nbytes, pool, stream);
    }
    if (err == cudaSuccess) {
        *free_fn = pool_free;
        return SPCONV_OK;
    }
    (void)cudaGetLastError();
    *ptr = NULL;
    /* cudaMalloc's own account of the failure (free and total memory in the message). */
    return cuda_alloc(device_index, nbytes, ptr);
}

/* The slot cannot report failure; cudaFree only fails when the pointer or the runtime is already
 * broken, and the next checked call reports that. */
static void cuda_free(int device_index, void *ptr) {
    if (ptr == NULL) return;
    spconv__cuda_device_guard guard;
    if (guard.enter(device_index) != SPCONV_OK) return;
    if (cudaFree(ptr) != cudaSuccess) (void)cudaGetLastError();
}

/* One cudaMemcpyAsync on the stream of ctx; copies that read or write host memory wait for it,
 * since the caller may reuse or read its buffer as soon as we return. */
static spconv_status cuda_memcpy(spconv_context *ctx, int device_index, void *dst, const void *src,
                                 size_t nbytes, cudaMemcpyKind kind) {
    if (nbytes == 0) return SPCONV_OK;
    spconv__cuda_device_guard guard;
    SPCONV_FORWARD_IF_ERROR(guard.enter(device_index));
    cudaStream_t stream = spconv__cuda_stream_for(ctx, device_index);
    CUDA_TRY(cudaMemcpyAsync(dst, src, nbytes, kind, stream));
    if (kind != cudaMemcpyDeviceToDevice) CUDA_TRY(cudaStreamSynchronize(stream));
    return SPCONV_OK;
}

static spconv_status cuda_copy_to_device(spconv_context *ctx, int device_index, void *dst,
                                         const void *src_host, size_t nbytes) {
    return cuda_memcpy(ctx, device_index, dst, src_host, nbytes, cudaMemcpyHostToDevice);
}

static spconv_status cuda_copy_to_host(spconv_context *ctx, int device_index, void *dst_host,
                                       const void *src, size_t nbytes) {
    return cuda_memcpy(ctx, device_index, dst_host, src, nbytes, cudaMemcpyDeviceToHost);
}

static spconv_status cuda_copy_on_device(spconv_context *ctx, int device_index, void *dst,
                                         const void *src, size_t nbytes) {
    return cuda_memcpy(ctx, device_index, dst, src, nbytes, cudaMemcpyDeviceToDevice);
}

/* ---- the table ----------------------------------------------------------------------------- */

extern "C" const spconv_backend spconv__cuda_backend = {
    /* .name            = */ "cuda",
    /* .device_count    = */ cuda_device_count,
    /* .context_init    = */ cuda_context_init,
    /* .context_destroy = */ cuda_context_destroy,
    /* .context_set_stream = */ cuda_context_set_stream,
    /* .synchronize     = */ cuda_synchronize,
    /* .mark_create     = */ cuda_mark_create,
    /* .mark_destroy    = */ cuda_mark_destroy,
    /* .mark_record     = */ cuda_mark_record,
    /* .mark_elapsed_ms = */ cuda_mark_elapsed_ms,
    /* .alloc           = */ cuda_alloc,
    /* .alloc_ordered   = */ cuda_alloc_ordered,
    /* .free            = */ cuda_free,
    /* .copy_to_device  = */ cuda_copy_to_device,
    /* .copy_to_host    = */ cuda_copy_to_host,
    /* .copy_on_device  = */ cuda_copy_on_device,
    /* .copy_strided    = */ spconv__cuda_copy_strided,
    /* .fill            = */ spconv__cuda_fill,
    /* .voxelize        = */ spconv__cuda_voxelize,
    /* .rulebook_build  = */ spconv__cuda_rulebook_build,
    /* .conv_forward    = */ spconv__cuda_conv_forward,
    /* .conv_backward   = */ spconv__cuda_conv_backward,
    /* .maxpool_forward = */ spconv__cuda_maxpool_forward,
    /* .maxpool_backward = */ spconv__cuda_maxpool_backward,
    /* .sparse_to_dense = */ spconv__cuda_sparse_to_dense,
    /* .dense_to_sparse = */ spconv__cuda_dense_to_sparse,
    /* .batchnorm_stats = */ spconv__cuda_batchnorm_stats,
    /* .batchnorm_terms = */ spconv__cuda_batchnorm_terms,
    /* .batchnorm_apply = */ spconv__cuda_batchnorm_apply,
    /* .batchnorm_backward = */ spconv__cuda_batchnorm_backward,
    /* .relu_forward    = */ spconv__cuda_relu_forward,
    /* .relu_backward   = */ spconv__cuda_relu_backward,
    /* .axpy            = */ spconv__cuda_axpy,
    /* .to_dense_scatter = */ spconv__cuda_to_dense_scatter,
    /* .to_dense_gather = */ spconv__cuda_to_dense_gather,
    /* .conv_half_native = */ 1,
};
