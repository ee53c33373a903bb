/* fp16 and bf16 operands of the conv and pooling entry points, on every backend.
 *
 * The executors compute in f32 or f64. A call whose operands are f16 or bf16 is run by these
 * adapters instead: each operand is converted to f32 on its own device (exactly, since every f16
 * and bf16 value is an f32 value), the backend's f32 slot runs (so products and sums accumulate
 * in f32), and each result is rounded once, to nearest even, back to the operands' dtype. Max
 * pooling is therefore exact (a maximum of rounded values is one of them) and its argmax is the
 * f32 run's. The conversions are the copy kernels of the backend, with the rules of
 * tensor/convert.h, so the CPU and the CUDA backend round alike.
 *
 * The operands were checked by the entry point (one dtype, one device, shapes); @p backend is the
 * table the entry point dispatched to. */
#ifndef SPCONV_CONV_HALF_H
#define SPCONV_CONV_HALF_H

#include "core/backend.h"

/* f16 or bf16: the dtypes these adapters take. */
int spconv__is_half_dtype(spconv_dtype dtype);

spconv_status spconv__half_conv_forward(const spconv_backend *backend, spconv_context *ctx,
                                        const spconv_rulebook *rb, const spconv_tensor *features,
                                        const spconv_tensor *weight, const spconv_tensor *bias,
                                        const spconv__conv_options *options, spconv_tensor **out);

spconv_status spconv__half_conv_backward(const spconv_backend *backend, spconv_context *ctx,
                                         const spconv_rulebook *rb, const spconv_tensor *features,
                                         const spconv_tensor *weight,
                                         const spconv_tensor *grad_out,
                                         const spconv__conv_options *options,
                                         spconv_tensor **grad_features,
                                         spconv_tensor **grad_weight, spconv_tensor **grad_bias);

spconv_status spconv__half_maxpool_forward(const spconv_backend *backend, spconv_context *ctx,
                                           const spconv_rulebook *rb,
                                           const spconv_tensor *features, spconv_tensor **out,
                                           spconv_tensor **argmax);

spconv_status spconv__half_maxpool_backward(const spconv_backend *backend, spconv_context *ctx,
                                            const spconv_rulebook *rb, const spconv_tensor *argmax,
                                            const spconv_tensor *grad_out,
                                            spconv_tensor **grad_features);

#endif /* SPCONV_CONV_HALF_H */
