/**
 * @file voxelize.h
 * @brief Points to voxels on the CPU or a GPU, with the semantics of spconv's Point2VoxelCPU3d.
 *
 * Geometry, in float32 arithmetic exactly as spconv computes it:
 *  - grid size per axis: round((max - min) / size) (x, y, z);
 *  - a point's voxel: c = floor((p - min) / size) per axis; the point is in range iff
 *    0 <= c < grid on all three axes. Points with a NaN or infinite x, y or z are dropped and
 *    counted separately.
 * Voxels are numbered in order of the first point that falls in them (deterministic, and the
 * same for every thread count). A new voxel beyond max_voxels is not created: its points are
 * dropped and counted. A voxel keeps its first max_points points; later ones are counted as
 * point overflow but still map to the voxel in point_voxel (as spconv's pc_voxel_id), so
 * per-point results can be read back from the voxel.
 *
 * Outputs, M voxels, P input points with F features each (x, y, z first):
 *  - voxels     f32 [M, max_points, F]: the kept points, unused slots zero (optional);
 *  - features   f32 [M, F]: mean of the voxel's kept points, SECOND's MeanVFE (optional);
 *  - coords     i32 [M, 3] (z, y, x), or [M, 4] (b, z, y, x) from spconv_voxelize_batch;
 *  - num_points i32 [M]: kept points per voxel (1 .. max_points);
 *  - point_voxel i64 [P]: the voxel row of each point, -1 when it is out of range, not finite or
 *    its voxel was not created.
 * The sparse tensor's spatial shape (D, H, W) is (grid_size[2], grid_size[1], grid_size[0]).
 */
#ifndef SPCONV_VOXELIZE_H
#define SPCONV_VOXELIZE_H

#include <stdint.h>

#include "spconv/context.h"
#include "spconv/status.h"
#include "spconv/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Which optional outputs to compute (coords, num_points and point_voxel always are). */
typedef enum spconv_voxelize_output {
    SPCONV_VOXELIZE_VOXELS = 1, /**< voxels [M, max_points, F] */
    SPCONV_VOXELIZE_MEAN = 2    /**< features [M, F] */
} spconv_voxelize_output;

typedef struct spconv_voxelize_params {
    float voxel_size[3]; /**< x, y, z; each > 0 and finite */
    float range[6];      /**< xmin, ymin, zmin, xmax, ymax, zmax; min < max, finite */
    int64_t max_points;  /**< points kept per voxel, >= 1 */
    int64_t max_voxels;  /**< voxels per scan, >= 1 (INT64_MAX: no limit) */
    int outputs;         /**< bitwise or of spconv_voxelize_output values */
} spconv_voxelize_params;

/** What happened to the input points: points_in = voxelized + dropped_nonfinite +
 *  dropped_range + dropped_voxel_overflow. The point overflow is part of voxelized: those points
 *  map to a voxel but are not stored in it. */
typedef struct spconv_voxelize_stats {
    int64_t points_in;              /**< points given */
    int64_t voxelized;              /**< points that map to an output voxel */
    int64_t dropped_nonfinite;      /**< x, y or z NaN or infinite */
    int64_t dropped_range;          /**< outside the grid */
    int64_t dropped_voxel_overflow; /**< their voxel would have been beyond max_voxels */
    int64_t dropped_point_overflow; /**< in a voxel that already held max_points points */
} spconv_voxelize_stats;

/** The result. Free the tensors with spconv_voxels_release. */
typedef struct spconv_voxels {
    spconv_tensor *voxels;      /**< f32 [M, max_points, F], or NULL when not asked for */
    spconv_tensor *features;    /**< f32 [M, F], or NULL when not asked for */
    spconv_tensor *coords;      /**< i32 [M, 3] (z, y, x) or [M, 4] (b, z, y, x) */
    spconv_tensor *num_points;  /**< i32 [M] */
    spconv_tensor *point_voxel; /**< i64 [P] (a batch: the scans' points one after another) */
    int64_t grid_size[3];       /**< x, y, z */
    spconv_voxelize_stats stats;
} spconv_voxels;

/**
 * Check @p params and compute the grid size (x, y, z). Errors: a voxel size <= 0 or not finite,
 * a range with min >= max or not finite (SPCONV_ERR_INVALID_ARGUMENT); a grid axis of 0 cells
 * (SPCONV_ERR_INVALID_ARGUMENT); a grid axis beyond INT32_MAX cells, or a grid whose three
 * coordinates need more than 62 bits together (SPCONV_ERR_OVERFLOW: voxels are hashed by a 64-bit
 * key; real grids need about 30); max_points or max_voxels < 1; unknown output bits.
 */
spconv_status spconv_voxelize_grid_size(const spconv_voxelize_params *params,
                                        int64_t grid_size[3]);

/**
 * Voxelize @p points (float32 or float64 [P, F], F >= 3, x, y, z first, any layout; float64
 * is converted to float32 first) on their device: the CPU (spconv_context_num_threads(ctx)
 * threads; the result does not depend on it) or a CUDA device, where the outputs stay, bit for
 * bit the CPU's. In a batch the first scan's device decides; a CUDA batch copies other scans
 * there, a CPU batch refuses CUDA scans. On success every tensor in @p out is new (one reference each); on failure
 * @p out is zeroed.
 */
spconv_status spconv_voxelize(spconv_context *ctx, const spconv_tensor *points,
                              const spconv_voxelize_params *params, spconv_voxels *out);

/**
 * Voxelize @p num_scans scans (each as for spconv_voxelize, all with the same F) into one batch:
 * each scan is voxelized on its own (max_voxels applies per scan), and the results are
 * concatenated in scan order with coords [M, 4] = (b, z, y, x). point_voxel holds the rows for
 * the points of scan 0, then scan 1, and so on; stats are summed.
 */
spconv_status spconv_voxelize_batch(spconv_context *ctx, const spconv_tensor *const *scans,
                                    int64_t num_scans, const spconv_voxelize_params *params,
                                    spconv_voxels *out);

/** Release every tensor of @p v and zero it; NULL and a zeroed struct are no-ops. */
void spconv_voxels_release(spconv_voxels *v);

#ifdef __cplusplus
}
#endif
#endif /* SPCONV_VOXELIZE_H */
