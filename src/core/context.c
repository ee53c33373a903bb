/* Execution contexts: device choice, CPU thread count, a growable workspace, the allocator hook
 * that the library's allocations for calls made with the context go through, and the TF32
 * setting; the CUDA backend fills in the stream and cuBLAS handle through its context_init slot
 * and switches streams through context_set_stream. */
#define _GNU_SOURCE /* pthread_getattr_default_np */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#if defined(__linux__)
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>
#endif

#include "core/backend.h"
#include "core/context_impl.h"
#include "core/error.h"
#include "spconv/config.h"

#if SPCONV_HAVE_OPENMP
#include <omp.h>
#endif

static void release_workspace(spconv_context *ctx);

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
        release_workspace(ctx);
        if (backend->context_destroy != NULL) backend->context_destroy(ctx);
    }
    free(ctx);
}

spconv_device spconv_context_device(const spconv_context *ctx) {
    return ctx == NULL ? spconv_cpu() : ctx->device;
}

/* The address space @p num_threads OpenMP threads' stacks take beyond what the process has now
 * (*need) and what the address-space limit (ulimit -v) leaves (*left), in bytes; 0 when there is
 * no limit to check against. A worker gets a stack of the threads' default size (RLIMIT_STACK
 * at start), and when one cannot be created libgomp ends the process with its own message, so
 * a count whose stacks cannot fit is refused before any thread starts. An OMP_STACKSIZE or
 * GOMP_STACKSIZE setting, or a platform without these calls, skips the check. */
static int stacks_to_check(int num_threads, double *need, double *left) {
#if defined(__linux__) && SPCONV_HAVE_OPENMP
    struct rlimit limit;
    if (num_threads <= 1 || getenv("OMP_STACKSIZE") != NULL || getenv("GOMP_STACKSIZE") != NULL ||
        getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY)
        return 0;
    pthread_attr_t attr;
    size_t stack = 0;
    if (pthread_getattr_default_np(&attr) != 0) return 0;
    const int got = pthread_attr_getstacksize(&attr, &stack);
    pthread_attr_destroy(&attr);
    unsigned long pages = 0;
    FILE *statm = fopen("/proc/self/statm", "r");
    if (got != 0 || statm == NULL) {
        if (statm != NULL) fclose(statm);
        return 0;
    }
    const int read = fscanf(statm, "%lu", &pages);
    fclose(statm);
    if (read != 1) return 0;
    const double page = (double)sysconf(_SC_PAGESIZE);
    *need = (double)(num_threads - 1) * ((double)stack + page); /* a guard page each */
    *left = (double)limit.rlim_cur - (double)pages * page;
    return 1;
#else
    (void)num_threads, (void)need, (void)left;
    return 0;
#endif
}

spconv_status spconv_context_set_num_threads(spconv_context *ctx, int num_threads) {
    SPCONV_CHECK_NOT_NULL("spconv_context_set_num_threads", ctx);
    SPCONV_RETURN_ERROR_IF(num_threads < 0 || num_threads > SPCONV_MAX_THREADS,
                           SPCONV_ERR_INVALID_ARGUMENT,
                           "spconv_context_set_num_threads: num_threads = %d is outside [0, %d] "
                           "(0 means all cores)",
                           num_threads, SPCONV_MAX_THREADS);
    double need = 0.0, left = 0.0;
    SPCONV_RETURN_ERROR_IF(stacks_to_check(num_threads, &need, &left) && need > left,
                           SPCONV_ERR_INVALID_ARGUMENT,
                           "spconv_context_set_num_threads: %d threads need %.1f MiB of stack, "
                           "more than the %.1f MiB the address-space limit (ulimit -v) leaves",
                           num_threads, need / 1048576.0, left > 0.0 ? left / 1048576.0 : 0.0);
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

spconv_status spconv__context_alloc(const char *func, const spconv_context *ctx,
                                    spconv_device device, size_t nbytes,
                                    spconv__allocation *out) {
    *out = (spconv__allocation){.device = device};
    if (nbytes == 0) return SPCONV_OK;
    const int hooked =
        ctx != NULL && ctx->alloc_fn != NULL && spconv_device_equal(ctx->device, device);
    if (!hooked) {
        const spconv_backend *backend = NULL;
        SPCONV_FORWARD_IF_ERROR(spconv__backend_check(func, device, &backend));
        spconv_status st =
            backend->alloc_ordered != NULL
                ? backend->alloc_ordered(ctx, device.index, nbytes, &out->data, &out->free_fn)
                : backend->alloc(device.index, nbytes, &out->data);
        if (st != SPCONV_OK) {
            out->data = NULL;
            /* Copy the backend's detail first: the new message overwrites the same buffer. */
            char detail[256];
            snprintf(detail, sizeof detail, "%s", spconv_last_error());
            SPCONV_RETURN_ERROR(st, "%s: cannot allocate %zu bytes on the %s backend (%s)", func,
                                nbytes, backend->name, detail);
        }
        out->nbytes = nbytes;
        return SPCONV_OK;
    }
    char where[32];
    if (device.type == SPCONV_DEVICE_CPU)
        snprintf(where, sizeof where, "cpu");
    else
        snprintf(where, sizeof where, "cuda:%d", device.index);
    void *data = ctx->alloc_fn(nbytes, device, ctx->alloc_user);
    SPCONV_RETURN_ERROR_IF(data == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "%s: the context's allocator hook (spconv_context_set_allocator) "
                           "returned NULL for %zu bytes on %s",
                           func, nbytes, where);
    if ((uintptr_t)data % SPCONV_ALLOCATOR_ALIGNMENT != 0) {
        ctx->free_fn(data, nbytes, device, ctx->alloc_user);
        SPCONV_RETURN_ERROR(SPCONV_ERR_INVALID_ARGUMENT,
                            "%s: the context's allocator hook (spconv_context_set_allocator) "
                            "returned %p for %zu bytes on %s, which is not aligned to %d bytes",
                            func, data, nbytes, where, SPCONV_ALLOCATOR_ALIGNMENT);
    }
    *out = (spconv__allocation){.data = data, .nbytes = nbytes, .device = device,
                                .free_fn = ctx->free_fn, .free_user = ctx->alloc_user};
    return SPCONV_OK;
}

void spconv__context_free(const spconv__allocation *allocation) {
    if (allocation->data == NULL) return;
    if (allocation->free_fn != NULL) {
        allocation->free_fn(allocation->data, allocation->nbytes, allocation->device,
                            allocation->free_user);
        return;
    }
    /* The backend allocated this memory, so it is built in: the lookup cannot fail. */
    spconv__backend_for(allocation->device)->free(allocation->device.index, allocation->data);
}

/* Give the workspace back to the allocator that made it, once the work that may still use it
 * (queued on the context's stream) is done. */
static void release_workspace(spconv_context *ctx) {
    if (ctx->workspace == NULL) return;
    const spconv_backend *backend = spconv__backend_for(ctx->device);
    /* A failed wait means a broken device, which the next checked call reports; freeing is all
     * that is left to do. */
    if (backend->synchronize != NULL) (void)backend->synchronize(ctx);
    const spconv__allocation old = {.data = ctx->workspace, .nbytes = ctx->workspace_bytes,
                                    .device = ctx->device, .free_fn = ctx->workspace_free,
                                    .free_user = ctx->workspace_free_user};
    spconv__context_free(&old);
    ctx->workspace = NULL;
    ctx->workspace_bytes = 0;
    ctx->workspace_free = NULL;
    ctx->workspace_free_user = NULL;
}

spconv_status spconv_context_workspace(spconv_context *ctx, size_t nbytes, void **ptr) {
    SPCONV_CHECK_NOT_NULL("spconv_context_workspace", ctx);
    SPCONV_CHECK_NOT_NULL("spconv_context_workspace", ptr);
    *ptr = NULL;
    if (nbytes <= ctx->workspace_bytes && ctx->workspace != NULL) {
        *ptr = ctx->workspace;
        return SPCONV_OK;
    }
    /* Grow geometrically so that a sequence of slightly larger requests does not reallocate
     * each time. */
    size_t want = nbytes < 64 ? 64 : nbytes;
    if (want < ctx->workspace_bytes + ctx->workspace_bytes / 2)
        want = ctx->workspace_bytes + ctx->workspace_bytes / 2;
    spconv__allocation fresh;
    SPCONV_FORWARD_IF_ERROR(
        spconv__context_alloc("spconv_context_workspace", ctx, ctx->device, want, &fresh));
    release_workspace(ctx);
    ctx->workspace = fresh.data;
    ctx->workspace_bytes = want;
    ctx->workspace_free = fresh.free_fn;
    ctx->workspace_free_user = fresh.free_user;
    *ptr = fresh.data;
    return SPCONV_OK;
}

spconv_status spconv_context_set_allocator(spconv_context *ctx, spconv_alloc_fn alloc_fn,
                                           spconv_free_fn free_fn, void *user_data) {
    static const char func[] = "spconv_context_set_allocator";
    SPCONV_CHECK_NOT_NULL(func, ctx);
    SPCONV_RETURN_ERROR_IF((alloc_fn == NULL) != (free_fn == NULL), SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: alloc_fn is %s but free_fn is %s (give both, or both NULL for the "
                           "library's own allocator)",
                           func, alloc_fn == NULL ? "NULL" : "set",
                           free_fn == NULL ? "NULL" : "set");
    release_workspace(ctx);
    ctx->alloc_fn = alloc_fn;
    ctx->free_fn = free_fn;
    ctx->alloc_user = alloc_fn != NULL ? user_data : NULL;
    return SPCONV_OK;
}

spconv_status spconv_context_set_cuda_stream(spconv_context *ctx, void *stream) {
    static const char func[] = "spconv_context_set_cuda_stream";
    SPCONV_CHECK_NOT_NULL(func, ctx);
    const spconv_backend *backend = spconv__backend_for(ctx->device);
    SPCONV_RETURN_ERROR_IF(backend == NULL || backend->context_set_stream == NULL,
                           SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: the context is on the %s backend, which has no CUDA stream", func,
                           backend != NULL ? backend->name : "missing");
    return backend->context_set_stream(ctx, stream);
}

spconv_status spconv_context_set_allow_tf32(spconv_context *ctx, int allow) {
    SPCONV_CHECK_NOT_NULL("spconv_context_set_allow_tf32", ctx);
    ctx->allow_tf32 = allow != 0;
    return SPCONV_OK;
}

int spconv_context_allow_tf32(const spconv_context *ctx) {
    return ctx != NULL && ctx->allow_tf32;
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
