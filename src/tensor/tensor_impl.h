/* The fields of storages and tensors: private to the library and its backends (C and CUDA).
 * Kept C/C++-neutral (no _Atomic) so that .cu files can include it; reference counts use the
 * GCC/Clang __atomic builtins. */
#ifndef SPCONV_TENSOR_IMPL_H
#define SPCONV_TENSOR_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "spconv/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct spconv_storage {
    int64_t refcount;       /* atomic: relaxed increments, acq_rel decrements (see tensor.c) */
    spconv_device device;
    void *data;             /* NULL only when nbytes == 0 */
    size_t nbytes;
    spconv_deleter deleter; /* wrapped memory: called on the last release; NULL otherwise */
    void *deleter_user;
    int owns_data;          /* 1: data came from spconv__context_alloc and goes back through
                               hook_free (when set) or the backend's free */
    spconv_free_fn hook_free; /* a context's allocator hook made data: its free, and user data */
    void *hook_user;
};

struct spconv_tensor {
    int64_t refcount;
    spconv_storage *storage;       /* never NULL; retained by the tensor */
    int64_t offset;                /* element offset of element (0, ..., 0) in storage */
    int ndim;                      /* 0 .. SPCONV_MAX_DIMS */
    int64_t sizes[SPCONV_MAX_DIMS];   /* sizes[i] >= 0 */
    int64_t strides[SPCONV_MAX_DIMS]; /* in elements, >= 0; contiguous: strides[i] = strides[i+1] * sizes[i+1] */
    spconv_dtype dtype;
    int64_t numel;                 /* cached: product of sizes */
    int is_contiguous;             /* cached: row-major without gaps */
};

/* spconv_storage_create, with errors reported as coming from `func`. */
spconv_status spconv__storage_create(const char *func, spconv_device device, size_t nbytes,
                                     spconv_storage **out);

/* The same for a call made with @p ctx: the memory comes from the context's allocator hook when
 * it has one and @p device is its device (context.h), and the storage gives it back there. */
spconv_status spconv__storage_create_in(const char *func, spconv_context *ctx,
                                        spconv_device device, size_t nbytes,
                                        spconv_storage **out);

/* A new contiguous tensor for a call named @p func made with @p ctx (NULL: the library's
 * allocator), uninitialised, with the checks of spconv_tensor_empty: how ops allocate outputs so
 * that a context's allocator hook provides them. */
spconv_status spconv__tensor_empty_in(const char *func, spconv_context *ctx, spconv_device device,
                                      spconv_dtype dtype, int ndim, const int64_t *sizes,
                                      spconv_tensor **out);

/* spconv__tensor_empty_in, then zeroed (on the context's stream for a device tensor). */
spconv_status spconv__tensor_zeros_in(const char *func, spconv_context *ctx, spconv_device device,
                                      spconv_dtype dtype, int ndim, const int64_t *sizes,
                                      spconv_tensor **out);

/* Element size of a tensor in bytes. */
size_t spconv__tensor_element_size(const spconv_tensor *t);

/* CPU storage bytes held now and at most since the last reset (0 where the C library cannot tell
 * a block's size); for benchmarks. */
void spconv__cpu_memory_usage(size_t *live, size_t *peak);
void spconv__cpu_memory_reset_peak(void);

/* Recompute numel and is_contiguous after sizes/strides changed. */
void spconv__tensor_update_cache(spconv_tensor *t);

/* A new tensor over `storage` (retained) with the given geometry, without bounds checks: for
 * internal callers that derived the geometry from a valid tensor. */
spconv_status spconv__tensor_make(spconv_storage *storage, int64_t offset, spconv_dtype dtype,
                                  int ndim, const int64_t *sizes, const int64_t *strides,
                                  spconv_tensor **out);

#ifdef __cplusplus
}
#endif
#endif /* SPCONV_TENSOR_IMPL_H */
