/* Host emulation of the part of cuBLAS that the CUDA backend uses (see cuda_runtime.h beside it):
 * a handle bound to a stream. The backend calls no cuBLAS routine yet; when it does, each one
 * joins this file as a call of the same CBLAS routine (cuBLAS is column-major: swap the operands
 * or pass CblasColMajor), so that the emulated build runs it too. */
#ifndef SPCONV_CUDA_EMULATION_CUBLAS_V2_H
#define SPCONV_CUDA_EMULATION_CUBLAS_V2_H

#include "cuda_runtime.h"

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
} cublasStatus_t;

typedef struct spconv__emu_cublas *cublasHandle_t;

cublasStatus_t cublasCreate(cublasHandle_t *handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t *stream);
const char *cublasGetStatusName(cublasStatus_t status);
const char *cublasGetStatusString(cublasStatus_t status);

#endif /* SPCONV_CUDA_EMULATION_CUBLAS_V2_H */
