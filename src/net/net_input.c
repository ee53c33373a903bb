/* From a scan to a network's input: voxelize with the network's settings, then wrap the mean
 * features and batch-0 coordinates as a sparse tensor of the network's shape. */
#include <inttypes.h>

#include "core/error.h"
#include "spconv/net.h"

spconv_status spconv_net_input_from_points(spconv_context *ctx, const spconv_net_input *input,
                                           const spconv_tensor *points, spconv_dtype dtype,
                                           spconv_sparse_tensor **out,
                                           spconv_voxelize_stats *stats) {
    static const char func[] = "spconv_net_input_from_points";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    SPCONV_CHECK_NOT_NULL(func, input);
    SPCONV_CHECK_NOT_NULL(func, points);
    const int64_t columns = input->point_columns;
    SPCONV_RETURN_ERROR_IF(columns < 3 || columns != input->channels, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: point_columns (%" PRId64
                           ") must be >= 3 and equal channels (%" PRId64 ")",
                           func, columns, input->channels);
    SPCONV_RETURN_ERROR_IF(
        spconv_tensor_ndim(points) != 2 || spconv_tensor_size(points, 1) < columns,
        SPCONV_ERR_SHAPE_MISMATCH,
        "%s: points must be [P, F] with F >= %" PRId64 " columns (got %d dims, F = %" PRId64 ")",
        func, columns, spconv_tensor_ndim(points), spconv_tensor_size(points, 1));
    spconv_voxelize_params params = {.max_points = input->max_points_per_voxel,
                                     .max_voxels = input->max_voxels,
                                     .outputs = SPCONV_VOXELIZE_MEAN};
    for (int a = 0; a < 3; ++a) params.voxel_size[a] = (float)input->voxel_size[a];
    for (int a = 0; a < 6; ++a) params.range[a] = (float)input->point_range[a];
    spconv_tensor *used = NULL, *features = NULL;
    spconv_voxels voxels = {0};
    SPCONV_FORWARD_IF_ERROR(spconv_tensor_narrow(points, 1, 0, columns, &used));
    const spconv_tensor *scans[1] = {used};
    spconv_status st = spconv_voxelize_batch(ctx, scans, 1, &params, &voxels);
    if (st == SPCONV_OK) st = spconv_tensor_to_dtype(ctx, voxels.features, dtype, &features);
    if (st == SPCONV_OK)
        st = spconv_sparse_create(features, voxels.coords, input->spatial_shape, 1, out);
    if (st == SPCONV_OK && stats != NULL) *stats = voxels.stats;
    spconv_tensor_release(features);
    spconv_tensor_release(used);
    spconv_voxels_release(&voxels);
    return st;
}
