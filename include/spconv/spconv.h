/**
 * @file spconv.h
 * @brief Sparse 3D convolution engine for point clouds: the umbrella header.
 *
 * Pipeline: points -> voxels (voxelize.h) -> sparse tensor (sparse.h) -> rulebooks (rulebook.h)
 * -> indice_conv forward/backward (conv.h), on the CPU and on CUDA GPUs, over the strided tensor
 * core of tensor.h. Conventions (coordinates (b, z, y, x), weights [KV, C_in, C_out], output
 * order) are fixed in docs/design.md.
 *
 * Stability: the status numbers, dtype numbers and the function names in these headers are the
 * public contract of the 0.x series; struct layouts behind opaque handles are not.
 */
#ifndef SPCONV_SPCONV_H
#define SPCONV_SPCONV_H

#include "spconv/config.h"
#include "spconv/context.h"
#include "spconv/conv.h"
#include "spconv/image.h"
#include "spconv/io.h"
#include "spconv/net.h"
#include "spconv/npy.h"
#include "spconv/rulebook.h"
#include "spconv/sparse.h"
#include "spconv/status.h"
#include "spconv/tensor.h"
#include "spconv/types.h"
#include "spconv/voxelize.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SPCONV_VERSION_NUMBER \
    (SPCONV_VERSION_MAJOR * 10000 + SPCONV_VERSION_MINOR * 100 + SPCONV_VERSION_PATCH)

/** SPCONV_VERSION_NUMBER of the library actually linked. */
unsigned spconv_version(void);
/** "0.1.0" of the library actually linked. */
const char *spconv_version_string(void);
/** 1 when the CUDA backend is compiled into the library (whether or not a GPU is present). */
int spconv_has_cuda(void);
/** Number of usable CUDA devices: 0 without the backend, a driver or a device (not an error). */
int spconv_cuda_device_count(void);
/** Multi-line report of the build (backends, BLAS, PCL) and of the CUDA devices, into @p buf. */
void spconv_build_report(char *buf, size_t buflen);

#ifdef __cplusplus
}
#endif
#endif /* SPCONV_SPCONV_H */
