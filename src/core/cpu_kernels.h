/* The CPU backend's op kernels, gathered into its table (src/tensor/cpu_backend.c). Each kernel
 * stays in its module, next to that module's reference implementation and private helpers (the
 * conv executors share the gather / scatter / GEMM plan of conv_cpu.h with the backward pass and
 * the tests); this header is the list the table is made from, the counterpart of cuda/'s
 * cuda_common.h. Operands were checked by the op's entry point before the table is reached. */
#ifndef SPCONV_CORE_CPU_KERNELS_H
#define SPCONV_CORE_CPU_KERNELS_H

#include "core/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* src/voxel/voxelize.c */
spconv_status spconv__cpu_voxelize(spconv_context *ctx, const char *func,
                                   const spconv_tensor *const *scans, int64_t num_scans,
                                   const spconv_voxelize_params *params, int batch_column,
                                   spconv_voxels *out);

/* src/rulebook/build.c */
spconv_status spconv__cpu_rulebook_build(spconv_context *ctx, const spconv_tensor *indices,
                                         const int64_t spatial_shape[3], int64_t batch_size,
                                         const spconv_conv_params *params, spconv_rulebook **out);

/* src/conv/conv_forward.c, conv_backward.c */
spconv_status spconv__cpu_conv_forward(spconv_context *ctx, const spconv_rulebook *rb,
                                       const spconv_tensor *features, const spconv_tensor *weight,
                                       const spconv_tensor *bias,
                                       const spconv__conv_options *options, spconv_tensor **out);
spconv_status spconv__cpu_conv_backward(spconv_context *ctx, const spconv_rulebook *rb,
                                        const spconv_tensor *features, const spconv_tensor *weight,
                                        const spconv_tensor *grad_out,
                                        const spconv__conv_options *options,
                                        spconv_tensor **grad_features, spconv_tensor **grad_weight,
                                        spconv_tensor **grad_bias);

/* src/conv/pool.c */
spconv_status spconv__cpu_maxpool_forward(spconv_context *ctx, const spconv_rulebook *rb,
                                          const spconv_tensor *features, spconv_tensor **out,
                                          spconv_tensor **argmax);
spconv_status spconv__cpu_maxpool_backward(spconv_context *ctx, const spconv_rulebook *rb,
                                           const spconv_tensor *argmax,
                                           const spconv_tensor *grad_out,
                                           spconv_tensor **grad_features);

/* src/conv/dense.c */
spconv_status spconv__cpu_sparse_to_dense(spconv_context *ctx, const spconv_tensor *features,
                                          const spconv_tensor *indices,
                                          const int64_t spatial_shape[3], int64_t batch_size,
                                          spconv_tensor **out);
spconv_status spconv__cpu_dense_to_sparse(spconv_context *ctx, const spconv_tensor *dense,
                                          spconv_tensor **features, spconv_tensor **indices);

/* src/net/net_kernels.c: the network's own layers */
spconv_status spconv__cpu_batchnorm_stats(spconv_context *ctx, const spconv_tensor *x, double eps,
                                          double *stats);
spconv_status spconv__cpu_batchnorm_terms(spconv_context *ctx, const spconv_tensor *x,
                                          const double *affine, const double *stats,
                                          double *terms);
spconv_status spconv__cpu_batchnorm_apply(spconv_context *ctx, const spconv_tensor *x,
                                          const double *scale, const double *shift, int relu,
                                          spconv_tensor *y);
/* Rows [begin, end) of the contiguous [*, c] f32 / f64 @p src into @p dst (may be @p src): the
 * inference batch norm of spconv__cpu_batchnorm_apply on one thread, which the conv forward also
 * runs as its epilogue on each block of output rows (spconv__conv_epilogue.wide). */
void spconv__cpu_bn_rows(spconv_dtype dtype, const void *src, void *dst, int64_t begin,
                         int64_t end, int64_t c, const double *scale, const double *shift,
                         int relu);
spconv_status spconv__cpu_batchnorm_backward(spconv_context *ctx, const spconv_tensor *x,
                                             const spconv_tensor *dy, const double *stats,
                                             const double *gamma, spconv_tensor *dx,
                                             double *sums);
spconv_status spconv__cpu_relu_forward(spconv_context *ctx, const spconv_tensor *x,
                                       spconv_tensor *y);
spconv_status spconv__cpu_relu_backward(spconv_context *ctx, const spconv_tensor *y,
                                        const spconv_tensor *dy, spconv_tensor *dx);
spconv_status spconv__cpu_axpy(spconv_context *ctx, double alpha, const spconv_tensor *x,
                               spconv_tensor *y);
/* src/conv/dense.c: rows [n, channels] of @p elem-byte elements into a zeroed [B, channels, cells]
 * map (every element of @p dst written), row i at at[i] = b * channels * cells + cell (distinct
 * cells); zeroes and fills tile by tile on @p threads, moving elements as bits. */
void spconv__cpu_scatter_channels(int threads, size_t elem, const void *src, int64_t n,
                                  int64_t channels, const int64_t *at, int64_t cells,
                                  int64_t batch_size, void *dst);
spconv_status spconv__cpu_to_dense_scatter(spconv_context *ctx, const spconv_tensor *features,
                                           const spconv_tensor *indices, spconv_tensor *dense);
spconv_status spconv__cpu_to_dense_gather(spconv_context *ctx, const spconv_tensor *dense,
                                          const spconv_tensor *indices, spconv_tensor *features);

#ifdef __cplusplus
}
#endif
#endif /* SPCONV_CORE_CPU_KERNELS_H */
