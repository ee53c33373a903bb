/* The context's fields: private to the library and its backends. */
#ifndef SPCONV_CORE_CONTEXT_IMPL_H
#define SPCONV_CORE_CONTEXT_IMPL_H

#include <stddef.h>

#include "spconv/context.h"

struct spconv_context {
    spconv_device device;
    int num_threads;         /* 0: all cores */
    void *cuda_stream;       /* cudaStream_t, owned; NULL on the CPU */
    void *cublas_handle;     /* cublasHandle_t, owned; NULL on the CPU */
    void *workspace;         /* on `device`, owned; grows, never shrinks */
    size_t workspace_bytes;
};

#endif /* SPCONV_CORE_CONTEXT_IMPL_H */
