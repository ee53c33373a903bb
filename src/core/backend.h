/* Backends are plain C tables of function pointers, one labelled slot per line (after ggml).
 * The dispatcher picks the table from a tensor's device; an empty slot means "not supported"
 * and the caller answers SPCONV_ERR_NOT_SUPPORTED, never a crash. Later issues add op slots. */
#ifndef SPCONV_CORE_BACKEND_H
#define SPCONV_CORE_BACKEND_H

#include <stddef.h>

#include "spconv/config.h"
#include "spconv/context.h"
#include "spconv/rulebook.h"
#include "spconv/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spconv_backend {
    const char *name;

    /* devices and contexts */
    int (*device_count)(void);                                /* 0 when none, never an error */
    spconv_status (*context_init)(spconv_context *ctx);       /* stream, handles */
    void (*context_destroy)(spconv_context *ctx);
    spconv_status (*synchronize)(spconv_context *ctx);

    /* memory on this backend's device number device_index */
    spconv_status (*alloc)(int device_index, size_t nbytes, void **ptr);
    void (*free)(int device_index, void *ptr);
    /* Contiguous bytes between the host and this device, or within this device. For the CPU
     * backend all three are memcpy. Ordered on ctx's stream; the host side is synchronous. */
    spconv_status (*copy_to_device)(spconv_context *ctx, int device_index, void *dst,
                                    const void *src_host, size_t nbytes);
    spconv_status (*copy_to_host)(spconv_context *ctx, int device_index, void *dst_host,
                                  const void *src, size_t nbytes);
    spconv_status (*copy_on_device)(spconv_context *ctx, int device_index, void *dst,
                                    const void *src, size_t nbytes);

    /* element-wise ops, both tensors on this backend's device (same shape, any layouts/dtypes) */
    spconv_status (*copy_strided)(spconv_context *ctx, spconv_tensor *dst, const spconv_tensor *src);
    spconv_status (*fill)(spconv_context *ctx, spconv_tensor *dst, double value);

    /* sparse convolution (conv.h), operands already checked by the dispatcher in src/conv/; the
     * CPU kernels live there and are called directly, so the CPU table leaves these empty */
    spconv_status (*conv_forward)(spconv_context *ctx, const spconv_rulebook *rb,
                                  const spconv_tensor *features, const spconv_tensor *weight,
                                  const spconv_tensor *bias, spconv_tensor **out);
    spconv_status (*conv_backward)(spconv_context *ctx, const spconv_rulebook *rb,
                                   const spconv_tensor *features, const spconv_tensor *weight,
                                   const spconv_tensor *grad_out, spconv_tensor **grad_features,
                                   spconv_tensor **grad_weight, spconv_tensor **grad_bias);
    spconv_status (*maxpool_forward)(spconv_context *ctx, const spconv_rulebook *rb,
                                     const spconv_tensor *features, spconv_tensor **out,
                                     spconv_tensor **argmax);
    spconv_status (*maxpool_backward)(spconv_context *ctx, const spconv_rulebook *rb,
                                      const spconv_tensor *argmax, const spconv_tensor *grad_out,
                                      spconv_tensor **grad_features);
    spconv_status (*sparse_to_dense)(spconv_context *ctx, const spconv_tensor *features,
                                     const spconv_tensor *indices, const int64_t spatial_shape[3],
                                     int64_t batch_size, spconv_tensor **out);
    spconv_status (*dense_to_sparse)(spconv_context *ctx, const spconv_tensor *dense,
                                     spconv_tensor **features, spconv_tensor **indices);
} spconv_backend;

extern const spconv_backend spconv__cpu_backend;
#if SPCONV_HAVE_CUDA
extern const spconv_backend spconv__cuda_backend;
#endif

/** The backend of @p device, or NULL when it is not built in. */
const spconv_backend *spconv__backend_for(spconv_device device);

/** As above, but records SPCONV_ERR_NO_DEVICE naming @p func when the backend is missing or the
 *  device index is not present. */
spconv_status spconv__backend_check(const char *func, spconv_device device,
                                    const spconv_backend **out);

#ifdef __cplusplus
}
#endif
#endif /* SPCONV_CORE_BACKEND_H */
