/* Tensor plumbing for the conv tests: random operands as host doubles plus their f32/f64
 * tensors, reading results back as doubles, and rulebooks for parameter sets. Every helper fails
 * the running CMocka test (with spconv_last_error()) when a library call fails. */
#ifndef SPCONV_TEST_CONV_HELPERS_H
#define SPCONV_TEST_CONV_HELPERS_H

#include <stdint.h>

#include "common/test_util.h"

/* Conv parameters with the same value on every axis (output padding 0). */
spconv_conv_params conv_params_iso(spconv_conv_kind kind, int64_t kernel, int64_t stride,
                                   int64_t padding, int64_t dilation);

/* n values uniform in [lo, hi), each exactly representable in f32 (so f32 and f64 tensors made
 * from them hold the same numbers). The caller frees the result. */
double *conv_random_values(int64_t n, double lo, double hi);

/* A new contiguous CPU tensor of @p dtype (f32 or f64) holding @p values [sizes]. */
spconv_tensor *conv_tensor(spconv_dtype dtype, int ndim, const int64_t *sizes,
                           const double *values);

/* A new int32 [n, 4] CPU tensor of coordinate rows. */
spconv_tensor *conv_indices_tensor(const int32_t *rows, int64_t n);

/* All elements of @p t as doubles in row-major order (caller frees); *n gets the count. */
double *conv_read(const spconv_tensor *t, int64_t *n);

/* The int32 rows of an int32 tensor (caller frees). */
int32_t *conv_read_i32(const spconv_tensor *t);

/* spconv_rulebook_build with a context of @p ctx (may be NULL). */
spconv_rulebook *conv_build(spconv_context *ctx, const int32_t *rows, int64_t n,
                            const int64_t shape[3], int64_t batch,
                            const spconv_conv_params *params);

/* A CPU context with @p threads threads (0: all cores). */
spconv_context *conv_context(int threads);

/* Bitwise equality of two tensors' contents (same dtype and numel). */
int conv_same_bits(const spconv_tensor *a, const spconv_tensor *b);

/* Tolerances against a double oracle, normalised by the oracle's largest magnitude: f32 keeps
 * ~7 digits, so after sums of up to a few thousand terms 1e-4 has a wide margin; f64 sums of the
 * same length stay within ~1e-13. */
#define CONV_TOL_F32 1e-4
#define CONV_TOL_F64 1e-12

static inline double conv_tolerance(spconv_dtype dtype) {
    return dtype == SPCONV_F32 ? CONV_TOL_F32 : CONV_TOL_F64;
}

#endif /* SPCONV_TEST_CONV_HELPERS_H */
