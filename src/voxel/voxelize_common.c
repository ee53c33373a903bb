/* Parameter and input checks of the voxelizer, the grid size, and releasing results. */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "voxel/voxelize_impl.h"

static spconv_status check_params(const char *func, const spconv_voxelize_params *p) {
    static const char axis[3] = {'x', 'y', 'z'};
    for (int a = 0; a < 3; ++a) {
        float size = p->voxel_size[a], lo = p->range[a], hi = p->range[a + 3];
        SPCONV_RETURN_ERROR_IF(!(size > 0.0f) || !isfinite(size), SPCONV_ERR_INVALID_ARGUMENT,
                               "%s: voxel size %c = %g must be positive and finite", func,
                               axis[a], (double)size);
        SPCONV_RETURN_ERROR_IF(!isfinite(lo) || !isfinite(hi), SPCONV_ERR_INVALID_ARGUMENT,
                               "%s: range %c = [%g, %g] must be finite", func, axis[a],
                               (double)lo, (double)hi);
        SPCONV_RETURN_ERROR_IF(!(lo < hi), SPCONV_ERR_INVALID_ARGUMENT,
                               "%s: range %c = [%g, %g] needs min < max", func, axis[a],
                               (double)lo, (double)hi);
    }
    SPCONV_RETURN_ERROR_IF(p->max_points < 1, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: max_points = %lld must be >= 1", func, (long long)p->max_points);
    SPCONV_RETURN_ERROR_IF(p->max_voxels < 1, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: max_voxels = %lld must be >= 1", func, (long long)p->max_voxels);
    SPCONV_RETURN_ERROR_IF((p->outputs & ~(SPCONV_VOXELIZE_VOXELS | SPCONV_VOXELIZE_MEAN)) != 0,
                           SPCONV_ERR_INVALID_ARGUMENT, "%s: unknown output bits 0x%x", func,
                           (unsigned)p->outputs);
    return SPCONV_OK;
}

static spconv_status grid_size_checked(const char *func, const spconv_voxelize_params *p,
                                       int64_t grid[3]) {
    SPCONV_FORWARD_IF_ERROR(check_params(func, p));
    static const char axis[3] = {'x', 'y', 'z'};
    for (int a = 0; a < 3; ++a) {
        /* float arithmetic, as spconv's std::round((max - min) / size) on floats */
        float g = roundf((p->range[a + 3] - p->range[a]) / p->voxel_size[a]);
        SPCONV_RETURN_ERROR_IF(g >= 2147483648.0f, SPCONV_ERR_OVERFLOW,
                               "%s: the grid has %g cells along %c, more than int32 coordinates "
                               "hold (range [%g, %g], voxel size %g)", func, (double)g, axis[a],
                               (double)p->range[a], (double)p->range[a + 3],
                               (double)p->voxel_size[a]);
        SPCONV_RETURN_ERROR_IF(g < 1.0f, SPCONV_ERR_INVALID_ARGUMENT,
                               "%s: the grid has 0 cells along %c (range [%g, %g] is less than "
                               "half a voxel of %g)", func, axis[a], (double)p->range[a],
                               (double)p->range[a + 3], (double)p->voxel_size[a]);
        grid[a] = (int64_t)g;
    }
    unsigned bits = spconv__voxel_key_bits(grid[0]) + spconv__voxel_key_bits(grid[1]) +
                    spconv__voxel_key_bits(grid[2]);
    SPCONV_RETURN_ERROR_IF(bits > SPCONV_VOXEL_KEY_MAX_BITS, SPCONV_ERR_OVERFLOW,
                           "%s: the grid of %lld x %lld x %lld cells (x, y, z) needs %u bits of "
                           "voxel key, more than %d", func, (long long)grid[0], (long long)grid[1],
                           (long long)grid[2], bits, SPCONV_VOXEL_KEY_MAX_BITS);
    return SPCONV_OK;
}

spconv_status spconv_voxelize_grid_size(const spconv_voxelize_params *params,
                                        int64_t grid_size[3]) {
    static const char func[] = "spconv_voxelize_grid_size";
    SPCONV_CHECK_NOT_NULL(func, params);
    SPCONV_CHECK_NOT_NULL(func, grid_size);
    return grid_size_checked(func, params, grid_size);
}

spconv_status spconv__voxel_input_prepare(spconv_context *ctx, const char *func, int64_t index,
                                          const spconv_tensor *points, spconv_device device,
                                          spconv__voxel_input *in) {
    memset(in, 0, sizeof *in);
    char which[48] = "points";
    if (index >= 0) snprintf(which, sizeof which, "scan %lld", (long long)index);
    SPCONV_RETURN_ERROR_IF(points == NULL, SPCONV_ERR_NULL_POINTER, "%s: %s is NULL", func, which);
    SPCONV_RETURN_ERROR_IF(spconv_tensor_ndim(points) != 2 || spconv_tensor_size(points, 1) < 3,
                           SPCONV_ERR_SHAPE_MISMATCH,
                           "%s: %s must be [P, F] with F >= 3 columns (x, y, z first), got %d "
                           "dims and %lld columns", func, which, spconv_tensor_ndim(points),
                           (long long)spconv_tensor_size(points, -1));
    spconv_dtype dtype = spconv_tensor_dtype(points);
    SPCONV_RETURN_ERROR_IF(dtype != SPCONV_F32 && dtype != SPCONV_F64, SPCONV_ERR_DTYPE_MISMATCH,
                           "%s: %s must be f32 or f64, got %s", func, which,
                           spconv_dtype_name(dtype));
    /* A CUDA voxelizer copies points from elsewhere to its device; the CPU one does not reach
     * into device memory (the first scan's device chose the backend). */
    SPCONV_RETURN_ERROR_IF(device.type == SPCONV_DEVICE_CPU &&
                               spconv_tensor_device(points).type != SPCONV_DEVICE_CPU,
                           SPCONV_ERR_NOT_SUPPORTED,
                           "%s: %s is on a CUDA device but the first scan is on the CPU, where "
                           "this batch is voxelized (copy the points with spconv_tensor_to_device)",
                           func, which);
    SPCONV_RETURN_ERROR_IF(spconv_tensor_size(points, 0) > INT32_MAX, SPCONV_ERR_OVERFLOW,
                           "%s: %s has %lld points, more than 2^31 - 1", func, which,
                           (long long)spconv_tensor_size(points, 0));
    spconv_tensor *on_device;
    SPCONV_FORWARD_IF_ERROR(spconv_tensor_to_device(ctx, points, device, &on_device));
    const spconv_status st = spconv_tensor_to_dtype(ctx, on_device, SPCONV_F32, &in->tensor);
    spconv_tensor_release(on_device);
    SPCONV_FORWARD_IF_ERROR(st);
    in->points = spconv_tensor_data(in->tensor);
    in->num_points = spconv_tensor_size(in->tensor, 0);
    in->num_features = spconv_tensor_size(in->tensor, 1);
    return SPCONV_OK;
}

void spconv_voxels_release(spconv_voxels *v) {
    if (v == NULL) return;
    spconv_tensor_release(v->voxels);
    spconv_tensor_release(v->features);
    spconv_tensor_release(v->coords);
    spconv_tensor_release(v->num_points);
    spconv_tensor_release(v->point_voxel);
    memset(v, 0, sizeof *v);
}

/* Shared by both implementations: the checks and grid of spconv_voxelize_grid_size, with
 * messages naming the caller. */
spconv_status spconv__voxel_grid(const char *func, const spconv_voxelize_params *params,
                                 int64_t grid[3]) {
    SPCONV_CHECK_NOT_NULL(func, params);
    return grid_size_checked(func, params, grid);
}
