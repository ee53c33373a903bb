/* Obviously-correct references for the conv and pooling executors: one loop over the pairs of
 * each offset, every sum accumulated in double and rounded once to the operands' dtype. Same
 * arguments, checks and outputs as the public functions (CPU tensors, f32 or f64); slow, for
 * tests only. They use none of the fast paths' machinery: no chunks, no GEMM, no identity
 * shortcut for the subm centre offset (whose pairs they read like any other). */
#ifndef SPCONV_CONV_REF_H
#define SPCONV_CONV_REF_H

#include "spconv/conv.h"

spconv_status spconv__conv_forward_ref(spconv_context *ctx, const spconv_rulebook *rb,
                                       const spconv_tensor *features, const spconv_tensor *weight,
                                       const spconv_tensor *bias, spconv_tensor **out);

spconv_status spconv__conv_backward_ref(spconv_context *ctx, const spconv_rulebook *rb,
                                        const spconv_tensor *features, const spconv_tensor *weight,
                                        const spconv_tensor *grad_out,
                                        spconv_tensor **grad_features, spconv_tensor **grad_weight,
                                        spconv_tensor **grad_bias);

spconv_status spconv__maxpool_forward_ref(spconv_context *ctx, const spconv_rulebook *rb,
                                          const spconv_tensor *features, spconv_tensor **out,
                                          spconv_tensor **argmax);

spconv_status spconv__maxpool_backward_ref(spconv_context *ctx, const spconv_rulebook *rb,
                                           const spconv_tensor *argmax,
                                           const spconv_tensor *grad_out,
                                           spconv_tensor **grad_features);

#endif /* SPCONV_CONV_REF_H */
