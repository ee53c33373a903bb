/* Internal entry points of the conv executors with knobs that the public API does not expose:
 * which GEMM runs (tests hold BLAS against the fallback) and per-phase timing (tools/bench_layer).
 * spconv_conv_forward / spconv_conv_backward are these with options NULL. */
#ifndef SPCONV_CONV_EXEC_H
#define SPCONV_CONV_EXEC_H

#include "conv/gemm.h"
#include "core/backend.h"
#include "spconv/conv.h"

/* spconv__conv_timing and spconv__conv_options are plain descriptors of core/backend.h, since
 * they travel through the backend table's conv slots. */

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

/* 1 when the CPU backward's weight gradient of @p rb in @p dtype with these channels runs in
 * joint mode (inside the data gradient's blocks, conv_backward.c), whichever gradients are asked
 * for; for the tests that must reach that mode. */
int spconv__conv_backward_joint(const spconv_rulebook *rb, spconv_dtype dtype, int64_t c_in,
                                int64_t c_out);

#endif /* SPCONV_CONV_EXEC_H */
