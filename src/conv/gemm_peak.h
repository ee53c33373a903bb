/* This machine's sgemm peak as the conv executors can use it: the yardstick for the "share of
 * peak" that benchmarks (tools/bench_layer.c, `spconv bench`) report for the GEMM phase. */
#ifndef SPCONV_CONV_GEMM_PEAK_H
#define SPCONV_CONV_GEMM_PEAK_H

#include <stdint.h>

#include "spconv/status.h"

/* GFLOP/s (2 n^3 flops per product) of an n x n x n float32 product run the way the executors run
 * theirs: @p threads OpenMP threads (0: all), each on its own block of rows, by the faster of the
 * two ways the executors multiply: one single-threaded GEMM call per block (SPCONV__GEMM_AUTO:
 * BLAS when built in), or the fused kernels (conv/fused.h) where the machine has them, over
 * 256 x 256 blocks of B (as a GEMM library blocks; a conv layer's K and N are at most that). A BLAS that
 * does not know the CPU runs generic kernels (OpenBLAS 0.3.21 takes a 2023 Xeon for a Prescott),
 * so either one alone can understate what the machine does. The fastest of @p repeat (>= 1)
 * timed products after one warm-up, on fixed pseudo-random matrices: a peak is what the machine
 * can do, so a run slowed down by other processes must not lower it. n in [1, 16384].
 * SPCONV_ERR_OUT_OF_MEMORY when the matrices do not fit. */
spconv_status spconv__sgemm_peak(int threads, int64_t n, int repeat, double *gflops);

/* The two parts of that peak: the BLAS (or fallback) products and the fused kernels' (0 where the
 * machine has none). */
spconv_status spconv__sgemm_peak_parts(int threads, int64_t n, int repeat, double *blas_gflops,
                                       double *fused_gflops);

/* The BLAS the products go to, for reports: "OpenBLAS 0.3.21 (SkylakeX kernels)", or the
 * fallback's name. */
const char *spconv__blas_name(void);

#endif /* SPCONV_CONV_GEMM_PEAK_H */
