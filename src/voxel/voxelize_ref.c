/* The voxelizer's reference: the definition of spconv_voxelize written as plainly as possible,
 * one point at a time with a linear search over the voxels found so far. Quadratic; for tests. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "voxel/voxelize_impl.h"

typedef struct ref_state {
    int32_t *coords;     /* [cap, 3] (z, y, x) */
    int32_t *counts;     /* [cap] */
    float *voxels;       /* [cap, max_points, F], zero-filled */
    int64_t *point_voxel;/* [P] */
    int64_t num_voxels;
} ref_state;

/* The voxel (z, y, x) of point @p p, or 0 when it is outside the grid. */
static int ref_cell(const float *p, const spconv_voxelize_params *params, const int64_t grid[3],
                    int32_t zyx[3]) {
    for (int a = 0; a < 3; ++a) {
        float c = floorf((p[a] - params->range[a]) / params->voxel_size[a]);
        if (!((double)c >= 0.0 && (double)c < (double)grid[a])) return 0;
        zyx[2 - a] = (int32_t)c;
    }
    return 1;
}

static int64_t ref_find(const ref_state *s, const int32_t zyx[3]) {
    for (int64_t v = 0; v < s->num_voxels; ++v)
        if (memcmp(&s->coords[v * 3], zyx, 3 * sizeof *zyx) == 0) return v;
    return -1;
}

static void ref_assign(ref_state *s, const spconv__voxel_input *in,
                       const spconv_voxelize_params *params, const int64_t grid[3],
                       spconv_voxelize_stats *stats) {
    const int64_t F = in->num_features, max_points = params->max_points;
    for (int64_t i = 0; i < in->num_points; ++i) {
        const float *p = in->points + i * F;
        int32_t zyx[3];
        s->point_voxel[i] = -1;
        if (!isfinite(p[0]) || !isfinite(p[1]) || !isfinite(p[2])) {
            ++stats->dropped_nonfinite;
            continue;
        }
        if (!ref_cell(p, params, grid, zyx)) {
            ++stats->dropped_range;
            continue;
        }
        int64_t v = ref_find(s, zyx);
        if (v < 0 && s->num_voxels == params->max_voxels) {
            ++stats->dropped_voxel_overflow;
            continue;
        }
        if (v < 0) {
            v = s->num_voxels++;
            memcpy(&s->coords[v * 3], zyx, sizeof zyx);
        }
        s->point_voxel[i] = v;
        ++stats->voxelized;
        if (s->counts[v] == max_points) {
            ++stats->dropped_point_overflow;
            continue;
        }
        memcpy(&s->voxels[(v * max_points + s->counts[v]) * F], p, (size_t)F * sizeof *p);
        ++s->counts[v];
    }
}

/* Mean of each voxel's stored points, summed in double in storage order. */
static void ref_means(const ref_state *s, int64_t max_points, int64_t F, float *features) {
    for (int64_t v = 0; v < s->num_voxels; ++v)
        for (int64_t f = 0; f < F; ++f) {
            double sum = 0.0;
            for (int64_t k = 0; k < s->counts[v]; ++k) sum += s->voxels[(v * max_points + k) * F + f];
            features[v * F + f] = (float)(sum / s->counts[v]);
        }
}

static spconv_status ref_outputs(const ref_state *s, const spconv__voxel_input *in,
                                 const spconv_voxelize_params *params, spconv_voxels *out) {
    const int64_t M = s->num_voxels, F = in->num_features, mp = params->max_points;
    const spconv_device cpu = spconv_cpu();
    SPCONV_FORWARD_IF_ERROR(spconv_tensor_from_host(NULL, cpu, SPCONV_I32, 2, (const int64_t[]){M, 3},
                                                    s->coords, &out->coords));
    SPCONV_FORWARD_IF_ERROR(spconv_tensor_from_host(NULL, cpu, SPCONV_I32, 1, &M, s->counts,
                                                    &out->num_points));
    SPCONV_FORWARD_IF_ERROR(spconv_tensor_from_host(NULL, cpu, SPCONV_I64, 1, &in->num_points,
                                                    s->point_voxel, &out->point_voxel));
    if (params->outputs & SPCONV_VOXELIZE_VOXELS)
        SPCONV_FORWARD_IF_ERROR(spconv_tensor_from_host(NULL, cpu, SPCONV_F32, 3,
                                                        (const int64_t[]){M, mp, F}, s->voxels,
                                                        &out->voxels));
    if (params->outputs & SPCONV_VOXELIZE_MEAN) {
        SPCONV_FORWARD_IF_ERROR(spconv_tensor_empty(cpu, SPCONV_F32, 2, (const int64_t[]){M, F},
                                                    &out->features));
        ref_means(s, mp, F, spconv_tensor_data(out->features));
    }
    return SPCONV_OK;
}

spconv_status spconv__voxelize_ref(const spconv_tensor *points,
                                   const spconv_voxelize_params *params, spconv_voxels *out) {
    static const char func[] = "spconv__voxelize_ref";
    SPCONV_CHECK_NOT_NULL(func, out);
    memset(out, 0, sizeof *out);
    int64_t grid[3];
    SPCONV_FORWARD_IF_ERROR(spconv__voxel_grid(func, params, grid));
    spconv__voxel_input in;
    SPCONV_FORWARD_IF_ERROR(spconv__voxel_input_prepare(NULL, func, -1, points, spconv_cpu(), &in));
    const int64_t P = in.num_points, F = in.num_features;
    const int64_t cap = P < params->max_voxels ? P : params->max_voxels;
    ref_state s = {0};
    spconv_status st = SPCONV_OK;
    if (cap > 0 && params->max_points > INT64_MAX / 8 / F / cap)
        st = spconv__error(SPCONV_ERR_OUT_OF_MEMORY, "%s: %lld voxels of %lld points do not fit "
                           "in memory", func, (long long)cap, (long long)params->max_points);
    if (st == SPCONV_OK) {
        s.coords = malloc((size_t)(cap * 3 + 1) * sizeof *s.coords);
        s.counts = calloc((size_t)cap + 1, sizeof *s.counts);
        s.voxels = calloc((size_t)(cap * params->max_points * F + 1), sizeof *s.voxels);
        s.point_voxel = malloc((size_t)(P + 1) * sizeof *s.point_voxel);
        if (s.coords == NULL || s.counts == NULL || s.voxels == NULL || s.point_voxel == NULL)
            st = spconv__error(SPCONV_ERR_OUT_OF_MEMORY, "%s: out of memory", func);
    }
    if (st == SPCONV_OK) {
        out->stats.points_in = P;
        ref_assign(&s, &in, params, grid, &out->stats);
        st = ref_outputs(&s, &in, params, out);
    }
    memcpy(out->grid_size, grid, sizeof grid);
    free(s.coords);
    free(s.counts);
    free(s.voxels);
    free(s.point_voxel);
    spconv_tensor_release(in.tensor);
    if (st != SPCONV_OK) spconv_voxels_release(out);
    return st;
}
