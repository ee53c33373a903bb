/**
 * @file npy.h
 * @brief NumPy .npy files (format versions 1.0, 2.0 and 3.0): int32, int64, float32, float64,
 * little-endian, C order. Anything else (Fortran order, big-endian, other dtypes, truncated data,
 * a header that lies about the size) is SPCONV_ERR_FORMAT with a message naming the problem.
 */
#ifndef SPCONV_NPY_H
#define SPCONV_NPY_H

#include "spconv/context.h"
#include "spconv/status.h"
#include "spconv/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Read @p path into a new contiguous CPU tensor. Also reads f16 ("<f2") and u8 ("|u1"). */
spconv_status spconv_npy_read(const char *path, spconv_tensor **out);

/** Write @p t (any layout, any device; dtypes as for reading) to @p path. The file appears
 *  whole or not at all (written to a temporary name, then renamed). */
spconv_status spconv_npy_write(spconv_context *ctx, const char *path, const spconv_tensor *t);

#ifdef __cplusplus
}
#endif
#endif /* SPCONV_NPY_H */
