/* This machine's sgemm peak as the conv executors can use it: the yardstick for the "share of
 * peak" that benchmarks (tools/bench_layer.c, `spconv bench`) report for the GEMM phase. */
#ifndef SPCONV_CONV_GEMM_PEAK_H
#define SPCONV_CONV_GEMM_PEAK_H

#include <stdint.h>

#include "spconv/status.h"

/* GFLOP/s (2 n^3 flops per product) of an n x n x n float32 product run the way the executors run
 * theirs: @p threads OpenMP threads (0: all), each making one single-threaded GEMM call
 * (SPCONV__GEMM_AUTO: BLAS when built in) on its own block of rows. The fastest of @p repeat
 * (>= 1) timed products after one warm-up, on fixed pseudo-random matrices: a peak is what the
 * machine can do, so a run slowed down by other processes must not lower it. n in [1, 16384].
 * SPCONV_ERR_OUT_OF_MEMORY when the three matrices do not fit. */
spconv_status spconv__sgemm_peak(int threads, int64_t n, int repeat, double *gflops);

#endif /* SPCONV_CONV_GEMM_PEAK_H */
