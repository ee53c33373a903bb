/* Argument checks shared by the conv, pooling and dense-helper entry points (fast paths and
 * references alike), and the dispatch to a non-CPU backend. Every check records a message
 * "func: what is wrong (values)" and returns its status. */
#ifndef SPCONV_CONV_CHECK_H
#define SPCONV_CONV_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "spconv/conv.h"

/* Text of a tensor's sizes ("[27, 32, 64]") or of a device ("cpu", "cuda:1"), as a struct so that
 * it can be formatted straight into a message (the temporary lives to the end of the call). */
typedef struct spconv__conv_text {
    char text[SPCONV_MAX_DIMS * 22 + 4];
} spconv__conv_text;

spconv__conv_text spconv__shape_text(const spconv_tensor *t);
spconv__conv_text spconv__device_text(spconv_device device);

/* The sizes of a checked conv call. */
typedef struct spconv__conv_dims {
    int64_t num_in, num_out; /* rows of the rulebook's input and output sites */
    int64_t kernel_volume;
    int64_t c_in, c_out;
    spconv_dtype dtype;   /* shared by every operand */
    spconv_device device; /* shared by every operand */
} spconv__conv_dims;

/* Check a conv call: features [num_in, C_in]; weight [KV, C_in, C_out] or
 * [KD, KH, KW, C_in, C_out] matching the rulebook's kernel; bias [C_out] (may be NULL); grad_out
 * [num_out, C_out] (NULL in forward); one dtype and one device for all; channel counts that a
 * product can take. rb, features and weight must not be NULL (the caller checked). */
spconv_status spconv__conv_check(const char *func, const spconv_rulebook *rb,
                                 const spconv_tensor *features, const spconv_tensor *weight,
                                 const spconv_tensor *bias, const spconv_tensor *grad_out,
                                 spconv__conv_dims *dims);

/* @p other has the dtype and device of @p ref (names are the arguments' names in messages). */
spconv_status spconv__check_same_kind(const char *func, const spconv_tensor *ref,
                                      const char *ref_name, const spconv_tensor *other,
                                      const char *other_name);

/* @p t is 2-d [rows, cols] with the given sizes; -1 accepts any size for that dim. */
spconv_status spconv__check_matrix(const char *func, const spconv_tensor *t, const char *name,
                                   int64_t rows, int64_t cols);

/* The CPU kernels compute in f32 or f64 only (the entry points widen f16 / bf16 operands to f32
 * first, conv/half.h): anything else is SPCONV_ERR_NOT_SUPPORTED. */
spconv_status spconv__check_cpu_float(const char *func, spconv_dtype dtype);

/* Max pooling forward: @p rb is a REGULAR rulebook and @p features is [num_in, C]. */
spconv_status spconv__pool_check_forward(const char *func, const spconv_rulebook *rb,
                                         const spconv_tensor *features);

/* Max pooling backward: @p argmax int32 [num_out, C] and @p grad_out [num_out, C] on one device,
 * @p rb REGULAR. */
spconv_status spconv__pool_check_backward(const char *func, const spconv_rulebook *rb,
                                          const spconv_tensor *argmax,
                                          const spconv_tensor *grad_out);

/* Each of the @p rows x @p cols entries of the contiguous @p argmax is -1 or an input row
 * < @p num_in (<= INT32_MAX); SPCONV_ERR_OUT_OF_RANGE names the first that is not. Checked on
 * @p threads threads. */
/* spconv_maxpool_backward for an argmax that the max pool forward made on the same rulebook (the
 * network's): a device argmax is not copied to the host to check its rows (a wait). */
spconv_status spconv__maxpool_backward_trusted(spconv_context *ctx, const spconv_rulebook *rb,
                                               const spconv_tensor *argmax,
                                               const spconv_tensor *grad_out,
                                               spconv_tensor **grad_features);

spconv_status spconv__check_argmax_rows(const char *func, const int32_t *argmax, int64_t rows,
                                        int64_t cols, int64_t num_in, int threads);

/* Contiguous int32 pair lists of @p rb in host memory, for the CPU executors (new references,
 * which may be the rulebook's own tensors; copies of a rulebook built on a device, as the CUDA
 * executors copy a CPU rulebook's pairs there); both NULL on failure. */
spconv_status spconv__rulebook_pairs(spconv_context *ctx, const spconv_rulebook *rb,
                                     spconv_tensor **pairs_in, spconv_tensor **pairs_out);

#endif /* SPCONV_CONV_CHECK_H */
