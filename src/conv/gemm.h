/* Dense matrix products for the conv executors: row-major C = op(A) @ op(B) + beta * C.
 *
 * Every function here is single-threaded. The executors parallelise themselves: they split the
 * rows of a product into blocks whose sizes do not depend on the thread count and hand each block
 * to one OpenMP thread. That keeps results bitwise identical for any thread count, and it keeps
 * one thread pool on the cores instead of two. For the second reason OpenBLAS's own pool is set
 * to one thread by spconv__gemm_prepare (OpenBLAS's thread count is process-wide: a program that
 * wants multi-threaded BLAS for its own products must set it again after calling spconv).
 *
 * With SPCONV_HAVE_BLAS the products go to CBLAS (OpenBLAS); the plain-C blocked fallback is used
 * otherwise, or when a caller asks for it (tests compare the two). */
#ifndef SPCONV_CONV_GEMM_H
#define SPCONV_CONV_GEMM_H

#include <stdint.h>

#include "spconv/types.h"

/* The library is built for the baseline ISA; on x86-64 with GCC or Clang and glibc (whose
 * loader resolves the ifuncs behind it), functions marked with this get AVX2 and AVX-512 versions
 * too and the loader picks one for the machine (target_clones). Without -ffast-math each version
 * adds in the same order, so all give the same bits. */
#if defined(__GNUC__) && defined(__x86_64__) && defined(__GLIBC__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define SPCONV__VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef SPCONV__VECTOR_CLONES
#define SPCONV__VECTOR_CLONES
#endif

typedef enum spconv__gemm_impl {
    SPCONV__GEMM_AUTO = 0,     /* executors: the fused kernels (fused.h) where the machine has
                                  them, else as UNFUSED; products here: as UNFUSED */
    SPCONV__GEMM_FALLBACK = 1, /* unfused, products by the plain-C fallback */
    SPCONV__GEMM_UNFUSED = 2   /* gather + product + scatter, products by BLAS when built in, else
                                  by the fallback: the reference of the fused kernels */
} spconv__gemm_impl;

/* Largest m, n, k or leading dimension a product may have (CBLAS takes int). Callers check their
 * sizes against it before they start. */
#define SPCONV__GEMM_MAX_DIM 2147483647LL

/* C[m, n] = op(A)[m, k] @ op(B)[k, n] + beta * C with beta 0 or 1; @p impl FALLBACK or not. op(A) is A [m, k] (lda >= k),
 * or A^T for trans_a with A stored [k, m] (lda >= m); likewise B. beta 0 overwrites C without
 * reading it (NaN in C does not leak through). Sizes may be 0. */
void spconv__sgemm(spconv__gemm_impl impl, int trans_a, int trans_b, int64_t m, int64_t n,
                   int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                   float *c, int64_t ldc);
void spconv__dgemm(spconv__gemm_impl impl, int trans_a, int trans_b, int64_t m, int64_t n,
                   int64_t k, const double *a, int64_t lda, const double *b, int64_t ldb,
                   double beta, double *c, int64_t ldc);

/* The plain-C blocked products behind SPCONV__GEMM_FALLBACK, same contract. */
void spconv__sgemm_fallback(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                            const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                            float *c, int64_t ldc);
void spconv__dgemm_fallback(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                            const double *a, int64_t lda, const double *b, int64_t ldb, double beta,
                            double *c, int64_t ldc);

/* The product for a dtype of SPCONV_F32 or SPCONV_F64, on untyped pointers. */
void spconv__gemm(spconv_dtype dtype, spconv__gemm_impl impl, int trans_a, int trans_b, int64_t m,
                  int64_t n, int64_t k, const void *a, int64_t lda, const void *b, int64_t ldb,
                  int beta_one, void *c, int64_t ldc);

/* Call once before a parallel region that runs products: makes the BLAS single-threaded (see
 * the top of this file). A no-op without BLAS. */
void spconv__gemm_prepare(void);

/* 1 when products with SPCONV__GEMM_AUTO go to a BLAS library. */
int spconv__gemm_has_blas(void);

#endif /* SPCONV_CONV_GEMM_H */
