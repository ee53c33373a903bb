/* Shared by the voxelizer's fast path (voxelize.c) and its reference (voxelize_ref.c). */
#ifndef SPCONV_VOXEL_VOXELIZE_IMPL_H
#define SPCONV_VOXEL_VOXELIZE_IMPL_H

#include <stdint.h>

#include "core/parallel.h"
#include "spconv/config.h"
#include "spconv/voxelize.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Voxel keys pack (z, y, x) into the bits of an int64, x lowest: decoding is shifts and masks.
 * Bits needed for the coordinates 0 .. extent - 1 of one axis: */
static inline unsigned spconv__voxel_key_bits(int64_t extent) {
    unsigned bits = 0;
    while (bits < 63 && ((uint64_t)(extent - 1) >> bits) != 0) ++bits;
    return bits;
}
/* At most this many key bits in all, so that keys stay positive with room to spare. */
#define SPCONV_VOXEL_KEY_MAX_BITS 62

/* Check @p params and compute the grid size (x, y, z), with messages naming @p func. */
spconv_status spconv__voxel_grid(const char *func, const spconv_voxelize_params *params,
                                 int64_t grid[3]);

/* A scan's points as the voxelizer reads them: contiguous f32 [num_points, num_features]. */
typedef struct spconv__voxel_input {
    spconv_tensor *tensor; /* the reference that keeps `points` alive */
    const float *points;
    int64_t num_points;
    int64_t num_features;
} spconv__voxel_input;

/* Check @p points (2-d, F >= 3, f32 or f64, at most INT32_MAX rows) and make it contiguous f32 on
 * @p device (copied there when it is on another CUDA device or, for a CUDA device, on the CPU; a
 * CUDA scan for the CPU voxelizer is an error). Messages name @p func and, for a batch, the scan
 * @p index (-1 for a single scan). */
spconv_status spconv__voxel_input_prepare(spconv_context *ctx, const char *func, int64_t index,
                                          const spconv_tensor *points, spconv_device device,
                                          spconv__voxel_input *in);

/* The obviously-correct reference: one scan, a linear search over the voxels found so far for
 * each point. The same outputs as spconv_voxelize (coords [M, 3]); for tests. */
spconv_status spconv__voxelize_ref(const spconv_tensor *points,
                                   const spconv_voxelize_params *params, spconv_voxels *out);

#ifdef __cplusplus
}
#endif
#endif /* SPCONV_VOXEL_VOXELIZE_IMPL_H */
