/* Host emulation of the part of cuBLAS that the CUDA backend uses (see cuda_runtime.h beside it):
 * a handle bound to a stream, and the products cublasSgemm / cublasDgemm and cublasGemmEx on f32
 * (column-major, host pointer mode), computed by a plain loop in the element type: an
 * implementation independent of the CPU backend's BLAS, so the tests that compare the two compare
 * two computations. cublasGemmEx with CUBLAS_COMPUTE_32F is the loop of cublasSgemm (the same
 * bits); with CUBLAS_COMPUTE_32F_FAST_TF32 it first rounds every element of A and B to TF32 (a
 * 10-bit mantissa, to nearest even) and then runs that loop, which is what a tensor core's TF32
 * product does to its inputs; f16 and bf16 operands are widened to f32 and run that loop too. */
#ifndef SPCONV_CUDA_EMULATION_CUBLAS_V2_H
#define SPCONV_CUDA_EMULATION_CUBLAS_V2_H

#include "cuda_runtime.h"

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;

typedef struct spconv__emu_cublas *cublasHandle_t;

/* The values of the CUDA toolkit's headers (library_types.h, cublas_api.h); only the ones used
 * here are declared. */
typedef enum cudaDataType_t {
    CUDA_R_32F = 0,
    CUDA_R_64F = 1,
    CUDA_R_16F = 2,
    CUDA_R_16BF = 14,
} cudaDataType;
typedef enum {
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_64F = 70,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
} cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
/* Only the host pointer mode is modelled: a product in device mode is CUBLAS_STATUS_NOT_SUPPORTED
 * here (a real cuBLAS would read alpha and beta from device memory). */
typedef enum { CUBLAS_POINTER_MODE_HOST = 0, CUBLAS_POINTER_MODE_DEVICE = 1 } cublasPointerMode_t;
/* Math modes: CUBLAS_TF32_TENSOR_OP_MATH makes f32 products with CUBLAS_COMPUTE_32F round their
 * inputs to TF32 (as the device may); the others are accepted and change nothing here. */
typedef enum {
    CUBLAS_DEFAULT_MATH = 0,
    CUBLAS_PEDANTIC_MATH = 2,
    CUBLAS_TF32_TENSOR_OP_MATH = 3,
} cublasMath_t;
typedef enum { CUBLAS_ATOMICS_NOT_ALLOWED = 0, CUBLAS_ATOMICS_ALLOWED = 1 } cublasAtomicsMode_t;

cublasStatus_t cublasCreate(cublasHandle_t *handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t *stream);
cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode);
cublasStatus_t cublasGetPointerMode(cublasHandle_t handle, cublasPointerMode_t *mode);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode);
cublasStatus_t cublasSetAtomicsMode(cublasHandle_t handle, cublasAtomicsMode_t mode);
cublasStatus_t cublasGetAtomicsMode(cublasHandle_t handle, cublasAtomicsMode_t *mode);
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float *alpha,
                           const float *A, int lda, const float *B, int ldb, const float *beta,
                           float *C, int ldc);
cublasStatus_t cublasDgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const double *alpha,
                           const double *A, int lda, const double *B, int ldb, const double *beta,
                           double *C, int ldc);
/* A and B both f32, f16 or bf16, C f32, compute type CUBLAS_COMPUTE_32F (or, for f32 operands,
 * CUBLAS_COMPUTE_32F_FAST_TF32), alpha and beta float; anything else is
 * CUBLAS_STATUS_NOT_SUPPORTED. 16-bit operands are widened exactly to f32 (tensor/convert.h) and
 * the product is then cublasSgemm's loop. */
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo);
const char *cublasGetStatusName(cublasStatus_t status);
const char *cublasGetStatusString(cublasStatus_t status);

#endif /* SPCONV_CUDA_EMULATION_CUBLAS_V2_H */
