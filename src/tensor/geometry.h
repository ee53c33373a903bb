/* Validation and arithmetic on sizes and strides, shared by the tensor module's files. Every
 * check records a message "func: what is wrong (values)" and returns its status. */
#ifndef SPCONV_TENSOR_GEOMETRY_H
#define SPCONV_TENSOR_GEOMETRY_H

#include <stdint.h>

#include "spconv/tensor.h"

/* Text of an int64 list such as "[2, 3]"; a struct so that it can be formatted straight into a
 * message argument (the temporary lives until the end of the full expression). */
typedef struct spconv__dims_text {
    char text[SPCONV_MAX_DIMS * 22 + 4];
} spconv__dims_text;

spconv__dims_text spconv__dims_str(int ndim, const int64_t *values);

spconv_status spconv__check_dtype(const char *func, spconv_dtype dtype);

/* ndim in [0, SPCONV_MAX_DIMS], sizes not NULL when ndim > 0, every size >= 0, and the product
 * of max(size, 1) fits int64 (so contiguous strides can be formed); *numel gets the product. */
spconv_status spconv__check_sizes(const char *func, int ndim, const int64_t *sizes, int64_t *numel);

/* numel elements of dtype as a byte count that fits int64 (and so size_t). */
spconv_status spconv__check_nbytes(const char *func, int64_t numel, spconv_dtype dtype,
                                   int64_t *nbytes);

/* Strides (>= 0) of a user geometry and the largest element index it addresses relative to its
 * offset, sum of (size - 1) * stride; 0 when the tensor is empty. */
spconv_status spconv__check_strides(const char *func, int ndim, const int64_t *sizes,
                                    const int64_t *strides, int64_t *max_index);

/* Row-major strides; a size of 0 counts as 1 so that empty tensors keep distinct strides. */
void spconv__contiguous_strides(int ndim, const int64_t *sizes, int64_t *strides);

/* A CUDA context drives one GPU: reject it for work on another GPU (NULL and CPU contexts fit
 * every device). */
spconv_status spconv__check_context(const char *func, const spconv_context *ctx,
                                    spconv_device device);

/* Map a dim that may count from the end (-1 is the last of `ndim`) onto [0, ndim). */
spconv_status spconv__wrap_dim(const char *func, int dim, int ndim, int *out);

#endif /* SPCONV_TENSOR_GEOMETRY_H */
