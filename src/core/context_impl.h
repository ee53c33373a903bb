/* The context's fields: private to the library and its backends. */
#ifndef SPCONV_CORE_CONTEXT_IMPL_H
#define SPCONV_CORE_CONTEXT_IMPL_H

#include <stddef.h>

#include "spconv/context.h"

#ifdef __cplusplus
extern "C" {
#endif

struct spconv_context {
    spconv_device device;
    int num_threads;         /* 0: all cores */
    void *own_cuda_stream;   /* cudaStream_t made by the backend's context_init, owned; NULL on
                                the CPU */
    void *cuda_stream;       /* the stream work is queued on: own_cuda_stream, or the caller's
                                (spconv_context_set_cuda_stream, not owned) */
    void *cublas_handle;     /* cublasHandle_t, owned, bound to cuda_stream; NULL on the CPU */
    int allow_tf32;          /* 1: f32 products may use TF32 (CUDA backend) */
    int cuda_stream_unordered; /* 1: cuda_stream is a caller's non-blocking stream (the CUDA
                                  backend's pool then waits before it frees: backend.cu) */
    spconv_alloc_fn alloc_fn; /* allocator hook; both NULL: the backend's alloc and free */
    spconv_free_fn free_fn;
    void *alloc_user;
    void *workspace;         /* on `device`, owned, from the allocator set when it was made
                                (changing the allocator gives it back first); grows, never
                                shrinks */
    size_t workspace_bytes;
    spconv_free_fn workspace_free; /* how the workspace goes back (spconv__allocation.free_fn) */
    void *workspace_free_user;
};

/* Memory of one allocation made for a call with a context, and how to give it back. */
typedef struct spconv__allocation {
    void *data;              /* NULL only when nbytes == 0 */
    size_t nbytes;
    spconv_device device;
    spconv_free_fn free_fn;  /* the context's hook when it provided the memory; NULL: the
                                backend of `device` frees it */
    void *free_user;
} spconv__allocation;

/* Allocate @p nbytes on @p device for a call named @p func made with @p ctx: through the
 * context's allocator hook when it has one and @p device is its device, otherwise through the
 * device's backend. Zero bytes allocate nothing (data NULL). Failures are recorded naming @p func
 * (and the hook when it returned NULL). */
spconv_status spconv__context_alloc(const char *func, const spconv_context *ctx,
                                    spconv_device device, size_t nbytes,
                                    spconv__allocation *out);
/* Give back what spconv__context_alloc returned (a zeroed allocation is a no-op). */
void spconv__context_free(const spconv__allocation *allocation);

#ifdef __cplusplus
}
#endif
#endif /* SPCONV_CORE_CONTEXT_IMPL_H */
