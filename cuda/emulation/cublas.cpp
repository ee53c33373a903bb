/* The host emulation of cuBLAS handles (cublas_v2.h). */
#include "cublas_v2.h"

#include <stdint.h>
#include <string.h>

#include <new>

#include "tensor/convert.h"

struct spconv__emu_cublas {
    cudaStream_t stream;
    cublasPointerMode_t pointer_mode;
    cublasMath_t math;
    cublasAtomicsMode_t atomics;
};

cublasStatus_t cublasCreate(cublasHandle_t *handle) {
    if (handle == NULL) return CUBLAS_STATUS_INVALID_VALUE;
    *handle = new (std::nothrow)
        spconv__emu_cublas{NULL, CUBLAS_POINTER_MODE_HOST, CUBLAS_DEFAULT_MATH,
                           CUBLAS_ATOMICS_NOT_ALLOWED};
    return *handle != NULL ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
    if (handle == NULL) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
    if (handle == NULL) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t *stream) {
    if (handle == NULL) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (stream == NULL) return CUBLAS_STATUS_INVALID_VALUE;
    *stream = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode) {
    if (handle == NULL) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->pointer_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetPointerMode(cublasHandle_t handle, cublasPointerMode_t *mode) {
    if (handle == NULL) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode == NULL) return CUBLAS_STATUS_INVALID_VALUE;
    *mode = handle->pointer_mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    if (handle == NULL) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode) {
    if (handle == NULL) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode == NULL) return CUBLAS_STATUS_INVALID_VALUE;
    *mode = handle->math;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetAtomicsMode(cublasHandle_t handle, cublasAtomicsMode_t mode) {
    if (handle == NULL) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode != CUBLAS_ATOMICS_NOT_ALLOWED && mode != CUBLAS_ATOMICS_ALLOWED)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->atomics = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetAtomicsMode(cublasHandle_t handle, cublasAtomicsMode_t *mode) {
    if (handle == NULL) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode == NULL) return CUBLAS_STATUS_INVALID_VALUE;
    *mode = handle->atomics;
    return CUBLAS_STATUS_SUCCESS;
}

/* The element as the product reads it: unchanged, rounded to TF32, or a 16-bit value widened. */
struct exact_input {
    template <typename T> T operator()(T v) const { return v; }
};

struct f16_input {
    float operator()(uint16_t bits) const { return spconv__f16_to_f32(bits); }
};

struct bf16_input {
    float operator()(uint16_t bits) const { return spconv__bf16_to_f32(bits); }
};

/* Round to the nearest float with a 10-bit mantissa, ties to even; infinities and NaN stay. The
 * exponent range is f32's, so nothing overflows except values within half a TF32 step of
 * FLT_MAX, which round to infinity as the carry into the exponent says. */
struct tf32_input {
    float operator()(float v) const {
        uint32_t bits;
        memcpy(&bits, &v, sizeof bits);
        if ((bits & 0x7f800000u) == 0x7f800000u) return v;
        const uint32_t dropped = 13, half = (1u << (dropped - 1)) - 1;
        bits += half + ((bits >> dropped) & 1u);
        bits &= ~((1u << dropped) - 1u);
        memcpy(&v, &bits, sizeof v);
        return v;
    }
};

/* C = alpha op(A) op(B) + beta C, column-major; beta 0 ignores C's old contents (NaN included),
 * as cuBLAS does. Arguments are checked as cuBLAS checks them, and alpha and beta read, when it
 * is called (host pointer mode); the product itself is queued on the handle's stream. */
template <typename T, typename In = T, typename Input = exact_input>
static cublasStatus_t gemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const T *alpha,
                           const In *A, int lda, const In *B, int ldb, const T *beta, T *C, int ldc,
                           Input input = Input()) {
    if (handle == NULL) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (handle->pointer_mode != CUBLAS_POINTER_MODE_HOST) return CUBLAS_STATUS_NOT_SUPPORTED;
    const int a_rows = transa == CUBLAS_OP_N ? m : k, b_rows = transb == CUBLAS_OP_N ? k : n;
    if (m < 0 || n < 0 || k < 0 || lda < (a_rows > 1 ? a_rows : 1) ||
        ldb < (b_rows > 1 ? b_rows : 1) || ldc < (m > 1 ? m : 1) || alpha == NULL || beta == NULL)
        return CUBLAS_STATUS_INVALID_VALUE;
    const T al = *alpha, be = *beta;
    spconv__emu::check_kernel_pointer("cuBLAS gemm", 6, A);
    spconv__emu::check_kernel_pointer("cuBLAS gemm", 8, B);
    spconv__emu::check_kernel_pointer("cuBLAS gemm", 11, C);
    spconv__emu::count_launch();
    spconv__emu::enqueue(handle->stream, [=] {
        for (int j = 0; j < n; ++j)
            for (int i = 0; i < m; ++i) {
                T sum = 0;
                for (int p = 0; p < k; ++p) {
                    const T a = input(transa == CUBLAS_OP_N ? A[i + (size_t)p * lda]
                                                            : A[p + (size_t)i * lda]);
                    const T b = input(transb == CUBLAS_OP_N ? B[p + (size_t)j * ldb]
                                                            : B[j + (size_t)p * ldb]);
                    sum += a * b;
                }
                T *c = &C[i + (size_t)j * ldc];
                *c = be == 0 ? al * sum : al * sum + be * *c;
            }
    });
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float *alpha,
                           const float *A, int lda, const float *B, int ldb, const float *beta,
                           float *C, int ldc) {
    if (handle != NULL && handle->math == CUBLAS_TF32_TENSOR_OP_MATH)
        return gemm(handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc,
                    tf32_input());
    return gemm(handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

cublasStatus_t cublasDgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const double *alpha,
                           const double *A, int lda, const double *B, int ldb, const double *beta,
                           double *C, int ldc) {
    return gemm(handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo) {
    if (handle == NULL) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (Atype != Btype || Ctype != CUDA_R_32F || algo != CUBLAS_GEMM_DEFAULT)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    const float *al = (const float *)alpha, *be = (const float *)beta;
    float *c = (float *)C;
    if (Atype == CUDA_R_16F || Atype == CUDA_R_16BF) {
        if (computeType != CUBLAS_COMPUTE_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
        const uint16_t *a16 = (const uint16_t *)A, *b16 = (const uint16_t *)B;
        if (Atype == CUDA_R_16F)
            return gemm(handle, transa, transb, m, n, k, al, a16, lda, b16, ldb, be, c, ldc,
                        f16_input());
        return gemm(handle, transa, transb, m, n, k, al, a16, lda, b16, ldb, be, c, ldc,
                    bf16_input());
    }
    if (Atype != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    const float *a = (const float *)A, *b = (const float *)B;
    switch (computeType) {
    case CUBLAS_COMPUTE_32F:
        /* the handle's TF32 math mode lets the device use TF32 for this compute type too */
        if (handle->math == CUBLAS_TF32_TENSOR_OP_MATH)
            return gemm(handle, transa, transb, m, n, k, al, a, lda, b, ldb, be, c, ldc,
                        tf32_input());
        return gemm(handle, transa, transb, m, n, k, al, a, lda, b, ldb, be, c, ldc);
    case CUBLAS_COMPUTE_32F_FAST_TF32:
        return gemm(handle, transa, transb, m, n, k, al, a, lda, b, ldb, be, c, ldc, tf32_input());
    default:
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
}

const char *cublasGetStatusName(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasGetStatusString(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    }
    return "unknown error";
}
