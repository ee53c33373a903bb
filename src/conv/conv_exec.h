/* Internal entry points of the conv executors with knobs that the public API does not expose:
 * which GEMM runs (tests hold BLAS against the fallback) and per-phase timing (tools/bench_layer).
 * spconv_conv_forward / spconv_conv_backward are these with options NULL. */
#ifndef SPCONV_CONV_EXEC_H
#define SPCONV_CONV_EXEC_H

#include "conv/gemm.h"
#include "spconv/conv.h"

/* Seconds spent per phase, summed over the threads that ran them (divide by `threads` for a
 * wall-clock share). A call adds to the fields, so one struct can collect several calls. */
typedef struct spconv__conv_timing {
    double gather_s;  /* copying rows into the contiguous GEMM operands */
    double gemm_s;    /* the products, including the subm centre offset's direct product */
    double scatter_s; /* scatter-adds, output initialisation, ordered reductions of partials */
    int threads;      /* threads of the last call */
} spconv__conv_timing;

typedef struct spconv__conv_options {
    spconv__gemm_impl gemm;      /* SPCONV__GEMM_AUTO unless a test wants the fallback */
    spconv__conv_timing *timing; /* NULL: no clock is read */
} spconv__conv_options;

spconv_status spconv__conv_forward_ex(spconv_context *ctx, const spconv_rulebook *rb,
                                      const spconv_tensor *features, const spconv_tensor *weight,
                                      const spconv_tensor *bias,
                                      const spconv__conv_options *options, spconv_tensor **out);

spconv_status spconv__conv_backward_ex(spconv_context *ctx, const spconv_rulebook *rb,
                                       const spconv_tensor *features, const spconv_tensor *weight,
                                       const spconv_tensor *grad_out,
                                       const spconv__conv_options *options,
                                       spconv_tensor **grad_features, spconv_tensor **grad_weight,
                                       spconv_tensor **grad_bias);

#endif /* SPCONV_CONV_EXEC_H */
