/* Execution contexts: device choice, CPU thread count and a growable workspace; the CUDA
 * backend fills in the stream and cuBLAS handle through its context_init slot. */
#include <stdlib.h>

#include "core/backend.h"
#include "core/context_impl.h"
#include "core/error.h"
#include "spconv/config.h"

#if SPCONV_HAVE_OPENMP
#include <omp.h>
#endif

spconv_status spconv_context_create(spconv_device device, spconv_context **out) {
    SPCONV_CHECK_NOT_NULL("spconv_context_create", out);
    *out = NULL;
    const spconv_backend *backend;
    SPCONV_FORWARD_IF_ERROR(spconv__backend_check("spconv_context_create", device, &backend));
    spconv_context *ctx = calloc(1, sizeof *ctx);
    SPCONV_RETURN_ERROR_IF(ctx == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "spconv_context_create: out of host memory");
    ctx->device = device;
    if (backend->context_init != NULL) {
        spconv_status st = backend->context_init(ctx);
        if (st != SPCONV_OK) {
            free(ctx);
            return st;
        }
    }
    *out = ctx;
    return SPCONV_OK;
}

void spconv_context_destroy(spconv_context *ctx) {
    if (ctx == NULL) return;
    const spconv_backend *backend = spconv__backend_for(ctx->device);
    if (backend != NULL) {
        if (ctx->workspace != NULL) backend->free(ctx->device.index, ctx->workspace);
        if (backend->context_destroy != NULL) backend->context_destroy(ctx);
    }
    free(ctx);
}

spconv_device spconv_context_device(const spconv_context *ctx) {
    return ctx == NULL ? spconv_cpu() : ctx->device;
}

spconv_status spconv_context_set_num_threads(spconv_context *ctx, int num_threads) {
    SPCONV_CHECK_NOT_NULL("spconv_context_set_num_threads", ctx);
    SPCONV_RETURN_ERROR_IF(num_threads < 0 || num_threads > SPCONV_MAX_THREADS,
                           SPCONV_ERR_INVALID_ARGUMENT,
                           "spconv_context_set_num_threads: num_threads = %d is outside [0, %d] "
                           "(0 means all cores)",
                           num_threads, SPCONV_MAX_THREADS);
    ctx->num_threads = num_threads;
    return SPCONV_OK;
}

int spconv_context_num_threads(const spconv_context *ctx) {
    if (ctx != NULL && ctx->num_threads > 0) return ctx->num_threads;
#if SPCONV_HAVE_OPENMP
    /* OMP_NUM_THREADS can ask for more than a context may: keep the same bound. */
    int threads = omp_get_max_threads();
    return threads < SPCONV_MAX_THREADS ? threads : SPCONV_MAX_THREADS;
#else
    return 1;
#endif
}

spconv_status spconv_context_workspace(spconv_context *ctx, size_t nbytes, void **ptr) {
    SPCONV_CHECK_NOT_NULL("spconv_context_workspace", ctx);
    SPCONV_CHECK_NOT_NULL("spconv_context_workspace", ptr);
    *ptr = NULL;
    if (nbytes <= ctx->workspace_bytes && ctx->workspace != NULL) {
        *ptr = ctx->workspace;
        return SPCONV_OK;
    }
    const spconv_backend *backend;
    SPCONV_FORWARD_IF_ERROR(spconv__backend_check("spconv_context_workspace", ctx->device, &backend));
    /* Grow geometrically so that a sequence of slightly larger requests does not reallocate
     * each time. */
    size_t want = nbytes < 64 ? 64 : nbytes;
    if (want < ctx->workspace_bytes + ctx->workspace_bytes / 2)
        want = ctx->workspace_bytes + ctx->workspace_bytes / 2;
    void *fresh = NULL;
    SPCONV_FORWARD_IF_ERROR(backend->alloc(ctx->device.index, want, &fresh));
    if (ctx->workspace != NULL) backend->free(ctx->device.index, ctx->workspace);
    ctx->workspace = fresh;
    ctx->workspace_bytes = want;
    *ptr = fresh;
    return SPCONV_OK;
}

void *spconv_context_cuda_stream(const spconv_context *ctx) {
    return ctx == NULL ? NULL : ctx->cuda_stream;
}

void *spconv_context_cublas_handle(const spconv_context *ctx) {
    return ctx == NULL ? NULL : ctx->cublas_handle;
}

spconv_status spconv_context_synchronize(spconv_context *ctx) {
    if (ctx == NULL) return SPCONV_OK;
    const spconv_backend *backend;
    SPCONV_FORWARD_IF_ERROR(spconv__backend_check("spconv_context_synchronize", ctx->device, &backend));
    return backend->synchronize != NULL ? backend->synchronize(ctx) : SPCONV_OK;
}
