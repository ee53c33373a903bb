/**
 * @file conv.h
 * @brief indice_conv (gather, GEMM, scatter-add per kernel offset), max pooling, dense helpers
 * and weight layout converters.
 *
 * Weights are [KV, C_in, C_out] ("RSCK"), so out_rows += in_rows @ W[k]. Forward sums the offsets
 * in increasing k after the bias; the same inputs, device and thread count give bitwise-identical
 * outputs. Dtypes: f32 and f64, and f16 and bf16 (summed in f32, each result rounded once; see
 * conv/half.h in the sources); all operands of one call share a dtype. Tensors may have any
 * layout; outputs are new contiguous tensors on the inputs' device. The CPU results do not depend
 * on the thread count at all: work is cut into pieces fixed by the sizes alone.
 *
 * Threads: the CPU kernels use spconv_context_num_threads(ctx) OpenMP threads and call the BLAS
 * single-threaded from each of them; for that they set OpenBLAS's process-wide thread count to 1
 * (openblas_set_num_threads). A program that also wants multi-threaded OpenBLAS for its own
 * products must set that count again after calling spconv.
 */
#ifndef SPCONV_CONV_H
#define SPCONV_CONV_H

#include <stdint.h>

#include "spconv/context.h"
#include "spconv/rulebook.h"
#include "spconv/status.h"
#include "spconv/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/** out [num_out, C_out] = bias + sum_k scatter(gather(features, in rows of k) @ W[k], out rows).
 *  @p features [num_in, C_in], @p weight [KV, C_in, C_out] (or [KD, KH, KW, C_in, C_out] with
 *  the rulebook's kernel), @p bias [C_out] or NULL. */
spconv_status spconv_conv_forward(spconv_context *ctx, const spconv_rulebook *rb,
                                  const spconv_tensor *features, const spconv_tensor *weight,
                                  const spconv_tensor *bias, spconv_tensor **out);

/**
 * spconv_conv_forward with an inference batch norm and ReLU folded in: each output element y
 * (bias + sum, as spconv_conv_forward computes it) becomes fma(y, scale[c], shift[c]), rounded
 * once, and then with @p relu, y < 0 ? 0 : y (-0 and NaN pass). @p scale and @p shift are
 * [C_out] of the features' dtype on the CPU, both or neither (neither: the ReLU alone). The
 * values are those of spconv_conv_forward followed by that elementwise map; the map is applied
 * to each block of output rows while it is in cache, instead of one more pass over the output.
 * PyTorch's CPU batch norm in eval mode is this map with scale = (1 / sqrt(var + eps)) * weight
 * and shift = bias - mean * scale (one fused multiply-add), each rounded as its kernel rounds
 * them, which is how the PyTorch binding uses it (python/spconv_c/csrc/ops.cpp,
 * python/spconv_c/pytorch/modules.py).
 * CPU, f32 and f64 only: other devices and f16 / bf16 are SPCONV_ERR_NOT_SUPPORTED.
 */
spconv_status spconv_conv_forward_affine(spconv_context *ctx, const spconv_rulebook *rb,
                                         const spconv_tensor *features,
                                         const spconv_tensor *weight, const spconv_tensor *bias,
                                         const spconv_tensor *scale, const spconv_tensor *shift,
                                         int relu, spconv_tensor **out);

/** Gradients of spconv_conv_forward given @p grad_out [num_out, C_out]. Each of @p grad_features
 *  ([num_in, C_in]), @p grad_weight ([KV, C_in, C_out], or the 5-d shape of @p weight when it was
 *  given as [KD, KH, KW, C_in, C_out]; offsets without pairs get zeros) and @p grad_bias
 *  ([C_out]) may be NULL when not wanted. */
spconv_status spconv_conv_backward(spconv_context *ctx, const spconv_rulebook *rb,
                                   const spconv_tensor *features, const spconv_tensor *weight,
                                   const spconv_tensor *grad_out, spconv_tensor **grad_features,
                                   spconv_tensor **grad_weight, spconv_tensor **grad_bias);

/** Max pooling over the pairs of @p rb (a REGULAR rulebook): out [num_out, C] starts from -inf;
 *  ties go to the pair of the smallest offset k; a NaN input wins (NaNs propagate). @p argmax
 *  (may be NULL) receives int32 [num_out, C]: the input row that gave each maximum (-1 if an
 *  output has no pair). */
spconv_status spconv_maxpool_forward(spconv_context *ctx, const spconv_rulebook *rb,
                                     const spconv_tensor *features, spconv_tensor **out,
                                     spconv_tensor **argmax);

/** Gradient of max pooling: grad_in [num_in, C] gets grad_out at each argmax position. Every
 *  argmax element must be -1 or an input row (SPCONV_ERR_OUT_OF_RANGE naming the first that is
 *  not); a device argmax is copied to the host for that check, so the call waits for it (the
 *  network's own backward, whose argmax its forward made, does not). */
spconv_status spconv_maxpool_backward(spconv_context *ctx, const spconv_rulebook *rb,
                                      const spconv_tensor *argmax, const spconv_tensor *grad_out,
                                      spconv_tensor **grad_features);

/** Dense [B, C, D, H, W] from features [N, C] at indices [N, 4]; empty sites are zero. */
spconv_status spconv_sparse_to_dense(spconv_context *ctx, const spconv_tensor *features,
                                     const spconv_tensor *indices, const int64_t spatial_shape[3],
                                     int64_t batch_size, spconv_tensor **out);

/** Sites of dense [B, C, D, H, W] where any channel is non-zero, sorted by (b, z, y, x):
 *  features [N, C] and indices int32 [N, 4]. */
spconv_status spconv_dense_to_sparse(spconv_context *ctx, const spconv_tensor *dense,
                                     spconv_tensor **features, spconv_tensor **indices);

/** Weight layouts. RSCK is ours: [KV, C_in, C_out] (also accepted as [KD, KH, KW, C_in, C_out]).
 *  KRSC is spconv 2.x: [C_out, KD, KH, KW, C_in]. OIDHW is PyTorch's dense conv3d:
 *  [C_out, C_in, KD, KH, KW]. */
typedef enum spconv_weight_layout {
    SPCONV_WEIGHT_RSCK = 0,
    SPCONV_WEIGHT_KRSC = 1,
    SPCONV_WEIGHT_OIDHW = 2
} spconv_weight_layout;

/** Convert a weight in @p layout (5-d) to RSCK [KV, C_in, C_out]; kernel dims come from the
 *  weight itself and are returned in @p kernel (may be NULL). */
spconv_status spconv_weight_to_rsck(spconv_context *ctx, const spconv_tensor *weight,
                                    spconv_weight_layout layout, int64_t kernel[3],
                                    spconv_tensor **out);
/** Convert RSCK [KV, C_in, C_out] with kernel dims @p kernel to @p layout (5-d). */
spconv_status spconv_weight_from_rsck(spconv_context *ctx, const spconv_tensor *weight,
                                      const int64_t kernel[3], spconv_weight_layout layout,
                                      spconv_tensor **out);

#ifdef __cplusplus
}
#endif
#endif /* SPCONV_CONV_H */
