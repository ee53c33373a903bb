/* Error checks for CUDA library calls, one macro per library (after ggml-cuda), for functions
 * that return spconv_status: a failure becomes SPCONV_ERR_CUDA or SPCONV_ERR_CUBLAS with a
 * message that names the call, where it was made and what the library said about it. */
#ifndef SPCONV_CUDA_CHECK_H
#define SPCONV_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/error.h"

/* The runtime also keeps every error as its "last error" until someone reads it. Reading it
 * here stops a failure that was already reported from resurfacing later, at the
 * cudaGetLastError() check of some unrelated kernel launch. (Sticky errors, which break the
 * whole CUDA context, stay whatever we do.) */
#define CUDA_TRY(call)                                                                      \
    do {                                                                                    \
        cudaError_t spconv_cuda_err_ = (call);                                              \
        if (spconv_cuda_err_ != cudaSuccess) {                                              \
            (void)cudaGetLastError();                                                       \
            return spconv__error(SPCONV_ERR_CUDA, "%s failed at %s:%d: %s (%s)", #call,     \
                                 __FILE__, __LINE__, cudaGetErrorName(spconv_cuda_err_),    \
                                 cudaGetErrorString(spconv_cuda_err_));                     \
        }                                                                                   \
    } while (0)

#define CUBLAS_TRY(call)                                                                    \
    do {                                                                                    \
        cublasStatus_t spconv_cublas_status_ = (call);                                      \
        if (spconv_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                               \
            return spconv__error(SPCONV_ERR_CUBLAS, "%s failed at %s:%d: %s (%s)", #call,   \
                                 __FILE__, __LINE__,                                        \
                                 cublasGetStatusName(spconv_cublas_status_),                \
                                 cublasGetStatusString(spconv_cublas_status_));             \
        }                                                                                   \
    } while (0)

#endif /* SPCONV_CUDA_CHECK_H */
