/* The voxelizer on the GPU, with the CPU voxelizer's output bit for bit (src/voxel/voxelize.c;
 * semantics in include/spconv/voxelize.h). Per scan:
 *  1. keys: each point's voxel key (z, y, x packed, x lowest, as the CPU's) or a drop mark, with
 *     the same float32 arithmetic; drops are counted;
 *  2. a seeded hash table of the keys (hash_table.cu): atomicCAS claims a key's slot, atomicMin
 *     keeps its first point, so each distinct key ends up with the index of its first point
 *     whatever the order the threads ran in;
 *  3. the occupied slots are gathered and sorted by first point: that order is the CPU's order of
 *     first appearance, so a voxel's row is its rank, and ranks >= max_voxels are the voxels the
 *     CPU would not have created (their points are the voxel overflow);
 *  4. a stable sort of the point indices by row lists each voxel's points in point order: a
 *     point's place in its voxel is its position in that run, so the first max_points are kept;
 *  5. one thread per voxel writes its coords, count, points and mean (a double sum in point
 *     order, as the CPU's, then the same rounding).
 * The host synchronises to learn each scan's number of voxels (it sizes the outputs) and once
 * at the end for the drop counts. */
#include <math.h>
#include <stdint.h>

#include <new>

#include "core/backend.h"
#include "maps_common.h"
#include "voxel/voxelize_impl.h"

/* counters of a batch */
enum { COUNT_NONFINITE, COUNT_OUTSIDE, COUNT_VOXEL_OVERFLOW, COUNT_POINT_OVERFLOW, NUM_COUNTS };

/* Sort key of a point that belongs to no voxel: after every row. */
#define NO_ROW INT32_MAX

typedef struct voxel_grid_args {
    float min[3], size[3];
    int64_t grid[3];
    uint32_t shift_y, shift_z;
} voxel_grid_args;

/* floor((p - min) / size) or -1 outside [0, grid): the CPU's axis_cell, operation for operation
 * (one IEEE float subtraction and division, no contraction possible). */
static __device__ __forceinline__ int64_t axis_cell(float p, float min, float size, int64_t grid) {
    const float q = (p - min) / size;
    if (!(q >= 0.0f && q < 2147483648.0f)) return -1;
    const int64_t cell = (int64_t)q;
    return cell < grid ? cell : -1;
}

__global__ void voxel_keys_kernel(const float *points, int64_t num_points, int64_t num_features,
                                  voxel_grid_args g, uint64_t *keys,
                                  unsigned long long *counts) {
    SPCONV_CUDA_GRID_LOOP(i, num_points) {
        const float *p = points + i * num_features;
        if (!isfinite(p[0]) || !isfinite(p[1]) || !isfinite(p[2])) {
            keys[i] = SPCONV_HASH_EMPTY;
            atomicAdd(&counts[COUNT_NONFINITE], 1ULL);
            continue;
        }
        const int64_t x = axis_cell(p[0], g.min[0], g.size[0], g.grid[0]);
        const int64_t y = axis_cell(p[1], g.min[1], g.size[1], g.grid[1]);
        const int64_t z = axis_cell(p[2], g.min[2], g.size[2], g.grid[2]);
        if (x < 0 || y < 0 || z < 0) {
            keys[i] = SPCONV_HASH_EMPTY;
            atomicAdd(&counts[COUNT_OUTSIDE], 1ULL);
            continue;
        }
        keys[i] = (uint64_t)z << g.shift_z | (uint64_t)y << g.shift_y | (uint64_t)x;
    }
}

/* The occupied slots, in whatever order the atomic counter hands out places: sorted next. */
__global__ void gather_voxels_kernel(const spconv__hash_slot *slots, int64_t capacity,
                                     int32_t *first_points, uint64_t *voxel_keys,
                                     unsigned long long *count) {
    SPCONV_CUDA_GRID_LOOP(s, capacity) {
        if (slots[s].key == SPCONV_HASH_EMPTY) continue;
        const unsigned long long at = atomicAdd(count, 1ULL);
        first_points[at] = slots[s].value;
        voxel_keys[at] = slots[s].key;
    }
}

/* rank_of_first[first point of voxel v] = v: only first points are ever read back. */
__global__ void rank_voxels_kernel(const int32_t *first_points, int64_t num_distinct,
                                   int32_t *rank_of_first) {
    SPCONV_CUDA_GRID_LOOP(v, num_distinct) rank_of_first[first_points[v]] = (int32_t)v;
}

__global__ void point_rows_kernel(spconv__hash_table table, const uint64_t *keys,
                                  int64_t num_points, const int32_t *rank_of_first,
                                  int64_t num_voxels, int32_t *point_row, int32_t *sort_rows,
                                  int32_t *members, unsigned long long *counts) {
    SPCONV_CUDA_GRID_LOOP(i, num_points) {
        int32_t row = NO_ROW;
        if (keys[i] != SPCONV_HASH_EMPTY) {
            const int32_t v = rank_of_first[spconv__hash_find(&table, keys[i])];
            if (v < num_voxels)
                row = v;
            else
                atomicAdd(&counts[COUNT_VOXEL_OVERFLOW], 1ULL);
        }
        point_row[i] = row;
        sort_rows[i] = row;
        members[i] = (int32_t)i;
    }
}

/* starts[v] .. starts[v + 1]: voxel v's run of the sorted points (starts zeroed beforehand, so an
 * empty batch keeps starts[0] = 0). Two neighbours write the same value to a shared bound. */
__global__ void voxel_starts_kernel(const int32_t *sorted_rows, int64_t num_points,
                                    int32_t *starts) {
    SPCONV_CUDA_GRID_LOOP(j, num_points) {
        const int32_t row = sorted_rows[j];
        if (row == NO_ROW) continue;
        if (j == 0 || sorted_rows[j - 1] != row) starts[row] = (int32_t)j;
        if (j + 1 == num_points || sorted_rows[j + 1] != row) starts[row + 1] = (int32_t)(j + 1);
    }
}

__global__ void point_voxel_kernel(const int32_t *point_row, int64_t num_points,
                                   int64_t first_row, int64_t *point_voxel) {
    SPCONV_CUDA_GRID_LOOP(i, num_points)
    point_voxel[i] = point_row[i] == NO_ROW ? -1 : first_row + point_row[i];
}

typedef struct voxel_fill_args {
    const float *points;
    int64_t num_features, max_points;
    const int32_t *members, *starts;
    const uint64_t *voxel_keys;
    int64_t num_voxels, first_row, batch;
    uint32_t shift_y, shift_z;
    int coord_cols;
    int32_t *coords, *num_points;
    float *voxels, *features; /* NULL when not asked for */
} voxel_fill_args;

#if SPCONV_CUDA_EMULATION
/* The emulation's launch check (cuda_runtime.h) sees through these too. */
inline void check_kernel_argument(const char *kernel, int index, const voxel_fill_args &a) {
    const void *pointers[] = {a.points, a.members, a.starts, a.voxel_keys,
                              a.coords, a.num_points, a.voxels, a.features};
    for (const void *p : pointers) spconv__emu::check_kernel_pointer(kernel, index, p);
}
#endif

__global__ void voxel_fill_kernel(voxel_fill_args a, unsigned long long *counts) {
    SPCONV_CUDA_GRID_LOOP(v, a.num_voxels) {
        const int64_t F = a.num_features, row = a.first_row + v;
        const int32_t *members = a.members + a.starts[v];
        const int64_t all = a.starts[v + 1] - a.starts[v];
        const int64_t n = all < a.max_points ? all : a.max_points;
        if (all > n) atomicAdd(&counts[COUNT_POINT_OVERFLOW], (unsigned long long)(all - n));
        const uint64_t key = a.voxel_keys[v];
        int32_t *c = a.coords + row * a.coord_cols;
        if (a.coord_cols == 4) *c++ = (int32_t)a.batch;
        c[0] = (int32_t)(key >> a.shift_z);
        c[1] = (int32_t)((key & ((UINT64_C(1) << a.shift_z) - 1)) >> a.shift_y);
        c[2] = (int32_t)(key & ((UINT64_C(1) << a.shift_y) - 1));
        a.num_points[row] = (int32_t)n;
        if (a.voxels != NULL) {
            float *dst = a.voxels + row * a.max_points * F;
            for (int64_t k = 0; k < n; ++k)
                for (int64_t f = 0; f < F; ++f)
                    dst[k * F + f] = a.points[(int64_t)members[k] * F + f];
            for (int64_t e = n * F; e < a.max_points * F; ++e) dst[e] = 0.0f;
        }
        if (a.features != NULL && n == 1) {
            /* The mean of one point is the point, bit for bit as on the CPU: a sum from 0.0 would
             * turn -0.0 into +0.0 and quiet a signalling NaN. */
            const uint32_t *point = (const uint32_t *)(a.points + (int64_t)members[0] * F);
            uint32_t *out = (uint32_t *)(a.features + row * F);
            for (int64_t f = 0; f < F; ++f) out[f] = point[f];
        } else if (a.features != NULL) {
            for (int64_t f = 0; f < F; ++f) {
                double sum = 0.0;
                for (int64_t k = 0; k < n; ++k) sum += a.points[(int64_t)members[k] * F + f];
                a.features[row * F + f] = (float)(sum / (double)n);
            }
        }
    }
}

/* ---- the host side ----------------------------------------------------------------------- */

/* One scan between its assignment (steps 1-4) and its fill (step 5). */
struct voxel_scan {
    spconv__voxel_input in = {};
    spconv__device_array<int32_t> members;       /* [P] point indices sorted by voxel row */
    spconv__device_array<int32_t> starts;        /* [M + 1] */
    spconv__device_array<uint64_t> voxel_keys;   /* [D] keys by first appearance */
    int64_t num_voxels = 0, first_row = 0, first_point = 0;
    ~voxel_scan() { spconv_tensor_release(in.tensor); }
};

struct voxel_batch {
    const char *func;
    const spconv_context *ctx; /* scratch arrays come from its allocator */
    cudaStream_t stream;
    voxel_grid_args grid;
    const spconv_voxelize_params *params;
    unsigned long long *counts; /* device [NUM_COUNTS] */
};

#define LAUNCH_GRID(n, kernel, ...)                                                          \
    do {                                                                                      \
        int blocks_;                                                                          \
        SPCONV_FORWARD_IF_ERROR(spconv__cuda_map_blocks((n), &blocks_));                      \
        SPCONV_CUDA_LAUNCH(kernel, blocks_, SPCONV_CUDA_MAP_THREADS, 0, b->stream,            \
                           __VA_ARGS__);                                                      \
        CUDA_TRY(cudaGetLastError());                                                         \
    } while (0)

/* Steps 1-4 for scan s, whose voxels start at batch row s->first_row; point_voxel is the batch's
 * i64 [total points] on the device. */
static spconv_status assign_scan(const voxel_batch *b, voxel_scan *s, int64_t *point_voxel) {
    const char *func = b->func;
    const int64_t P = s->in.num_points;
    spconv__device_array<uint64_t> keys;
    SPCONV_FORWARD_IF_ERROR(keys.alloc(b->ctx, func, P, "voxel keys"));
    if (P > 0)
        LAUNCH_GRID(P, voxel_keys_kernel, s->in.points, P, s->in.num_features, b->grid,
                    keys.get(), b->counts);

    /* load <= 0.5, as the CPU voxelizer's table */
    uint64_t capacity = SPCONV_HASH_MIN_CAPACITY;
    while (capacity < 2 * (uint64_t)P) capacity <<= 1;
    spconv__device_array<spconv__hash_slot> slots;
    spconv__hash_table table;
    SPCONV_FORWARD_IF_ERROR(
        spconv__cuda_hash_table_init(func, b->ctx, b->stream, capacity, &slots, &table));
    /* counters [0] the voxel count, [1] inserts that found no free slot, [2] repeated keys (the
     * points after a voxel's first: not an error here), read back together */
    spconv__device_array<unsigned long long> counters;
    SPCONV_FORWARD_IF_ERROR(counters.alloc(b->ctx, func, 3, "voxel counters"));
    CUDA_TRY(cudaMemsetAsync(counters.get(), 0, 3 * sizeof(unsigned long long), b->stream));
    SPCONV_FORWARD_IF_ERROR(spconv__cuda_hash_insert_queued(b->stream, &table, keys.get(), P,
                                                            NULL, counters.get() + 1));

    spconv__device_array<int32_t> first_points;
    SPCONV_FORWARD_IF_ERROR(first_points.alloc(b->ctx, func, P, "first points of voxels"));
    SPCONV_FORWARD_IF_ERROR(s->voxel_keys.alloc(b->ctx, func, P, "voxel keys"));
    LAUNCH_GRID((int64_t)capacity, gather_voxels_kernel, table.slots, (int64_t)capacity,
                first_points.get(), s->voxel_keys.get(), counters.get());
    unsigned long long host[3] = {0, 0, 0};
    const spconv__host_read read = {host, counters.get(), sizeof host};
    CUDA_TRY(spconv__cuda_read_back(b->stream, &read, 1));
    SPCONV_RETURN_ERROR_IF(host[1] > 0, SPCONV_ERR_CAPACITY,
                           "%s: hash table of %llu slots is full (%lld keys, %llu found no slot)",
                           func, (unsigned long long)capacity, (long long)P, host[1]);
    const int64_t D = (int64_t)host[0];
    SPCONV_FORWARD_IF_ERROR(SPCONV_THRUST(b->ctx, func, b->stream,
                                          "ordering voxels by their first point",
                                          thrust::sort_by_key, first_points.get(),
                                          first_points.get() + D, s->voxel_keys.get()));
    s->num_voxels = D < b->params->max_voxels ? D : b->params->max_voxels;

    spconv__device_array<int32_t> rank_of_first, point_row, sort_rows;
    SPCONV_FORWARD_IF_ERROR(rank_of_first.alloc(b->ctx, func, P, "voxel ranks"));
    SPCONV_FORWARD_IF_ERROR(point_row.alloc(b->ctx, func, P, "voxel rows"));
    SPCONV_FORWARD_IF_ERROR(sort_rows.alloc(b->ctx, func, P, "voxel rows"));
    SPCONV_FORWARD_IF_ERROR(s->members.alloc(b->ctx, func, P, "voxel members"));
    SPCONV_FORWARD_IF_ERROR(s->starts.alloc(b->ctx, func, s->num_voxels + 1, "voxel starts"));
    CUDA_TRY(cudaMemsetAsync(s->starts.get(), 0, (size_t)(s->num_voxels + 1) * sizeof(int32_t),
                             b->stream));
    if (P == 0) return SPCONV_OK;
    if (D > 0) LAUNCH_GRID(D, rank_voxels_kernel, first_points.get(), D, rank_of_first.get());
    LAUNCH_GRID(P, point_rows_kernel, table, keys.get(), P, rank_of_first.get(), s->num_voxels,
                point_row.get(), sort_rows.get(), s->members.get(), b->counts);
    SPCONV_FORWARD_IF_ERROR(SPCONV_THRUST(b->ctx, func, b->stream, "grouping points by voxel",
                                          thrust::stable_sort_by_key, sort_rows.get(),
                                          sort_rows.get() + P, s->members.get()));
    LAUNCH_GRID(P, voxel_starts_kernel, sort_rows.get(), P, s->starts.get());
    LAUNCH_GRID(P, point_voxel_kernel, point_row.get(), P, s->first_row,
                point_voxel + s->first_point);
    return SPCONV_OK;
}

static spconv_status make_outputs(spconv_context *ctx, const char *func,
                                  const spconv_voxelize_params *params, spconv_device device,
                                  int64_t M, int64_t F, int batch_column, spconv_voxels *out) {
    const int64_t coord_sizes[2] = {M, batch_column ? 4 : 3};
    SPCONV_FORWARD_IF_ERROR(
        spconv__tensor_empty_in(func, ctx, device, SPCONV_I32, 2, coord_sizes, &out->coords));
    SPCONV_FORWARD_IF_ERROR(
        spconv__tensor_empty_in(func, ctx, device, SPCONV_I32, 1, &M, &out->num_points));
    if (params->outputs & SPCONV_VOXELIZE_VOXELS) {
        const int64_t sizes[3] = {M, params->max_points, F};
        SPCONV_FORWARD_IF_ERROR(
            spconv__tensor_empty_in(func, ctx, device, SPCONV_F32, 3, sizes, &out->voxels));
    }
    if (params->outputs & SPCONV_VOXELIZE_MEAN) {
        const int64_t sizes[2] = {M, F};
        SPCONV_FORWARD_IF_ERROR(
            spconv__tensor_empty_in(func, ctx, device, SPCONV_F32, 2, sizes, &out->features));
    }
    return SPCONV_OK;
}

static spconv_status fill_scan(const voxel_batch *b, const voxel_scan *s, int64_t batch,
                               int batch_column, const spconv_voxels *out) {
    if (s->num_voxels == 0) return SPCONV_OK;
    voxel_fill_args a;
    a.points = s->in.points;
    a.num_features = s->in.num_features;
    a.max_points = b->params->max_points;
    a.members = s->members.get();
    a.starts = s->starts.get();
    a.voxel_keys = s->voxel_keys.get();
    a.num_voxels = s->num_voxels;
    a.first_row = s->first_row;
    a.batch = batch;
    a.shift_y = b->grid.shift_y;
    a.shift_z = b->grid.shift_z;
    a.coord_cols = batch_column ? 4 : 3;
    a.coords = (int32_t *)spconv_tensor_data(out->coords);
    a.num_points = (int32_t *)spconv_tensor_data(out->num_points);
    a.voxels = out->voxels != NULL ? (float *)spconv_tensor_data(out->voxels) : NULL;
    a.features = out->features != NULL ? (float *)spconv_tensor_data(out->features) : NULL;
    LAUNCH_GRID(s->num_voxels, voxel_fill_kernel, a, b->counts);
    return SPCONV_OK;
}

static spconv_status voxelize_scans(spconv_context *ctx, voxel_batch *b,
                                    const spconv_tensor *const *scans, int64_t num_scans,
                                    int batch_column, spconv_device device, voxel_scan *states,
                                    spconv_voxels *out) {
    const char *func = b->func;
    const spconv_voxelize_params *params = b->params;
    SPCONV_FORWARD_IF_ERROR(spconv__voxel_grid(func, params, out->grid_size));
    for (int a = 0; a < 3; ++a) {
        b->grid.min[a] = params->range[a];
        b->grid.size[a] = params->voxel_size[a];
        b->grid.grid[a] = out->grid_size[a];
    }
    b->grid.shift_y = spconv__voxel_key_bits(out->grid_size[0]);
    b->grid.shift_z = b->grid.shift_y + spconv__voxel_key_bits(out->grid_size[1]);
    int64_t total_points = 0, total_voxels = 0;
    for (int64_t i = 0; i < num_scans; ++i) {
        SPCONV_FORWARD_IF_ERROR(spconv__voxel_input_prepare(ctx, func, batch_column ? i : -1,
                                                            scans[i], device, &states[i].in));
        SPCONV_RETURN_ERROR_IF(states[i].in.num_features != states[0].in.num_features,
                               SPCONV_ERR_SHAPE_MISMATCH,
                               "%s: scan %lld has %lld features per point, scan 0 has %lld", func,
                               (long long)i, (long long)states[i].in.num_features,
                               (long long)states[0].in.num_features);
        states[i].first_point = total_points;
        total_points += states[i].in.num_points;
    }
    SPCONV_FORWARD_IF_ERROR(
        spconv__tensor_empty_in(func, ctx, device, SPCONV_I64, 1, &total_points,
                                &out->point_voxel));
    spconv__device_array<unsigned long long> counts;
    SPCONV_FORWARD_IF_ERROR(counts.alloc(b->ctx, func, NUM_COUNTS, "drop counters"));
    CUDA_TRY(cudaMemsetAsync(counts.get(), 0, NUM_COUNTS * sizeof(unsigned long long), b->stream));
    b->counts = counts.get();
    int64_t *point_voxel = (int64_t *)spconv_tensor_data(out->point_voxel);
    for (int64_t i = 0; i < num_scans; ++i) {
        states[i].first_row = total_voxels;
        SPCONV_FORWARD_IF_ERROR(assign_scan(b, &states[i], point_voxel));
        total_voxels += states[i].num_voxels;
    }
    SPCONV_FORWARD_IF_ERROR(make_outputs(ctx, func, params, device, total_voxels,
                                         states[0].in.num_features, batch_column, out));
    for (int64_t i = 0; i < num_scans; ++i)
        SPCONV_FORWARD_IF_ERROR(fill_scan(b, &states[i], i, batch_column, out));
    unsigned long long host[NUM_COUNTS];
    CUDA_TRY(cudaMemcpyAsync(host, counts.get(), sizeof host, cudaMemcpyDeviceToHost, b->stream));
    CUDA_TRY(cudaStreamSynchronize(b->stream));
    spconv_voxelize_stats *stats = &out->stats;
    stats->points_in = total_points;
    stats->dropped_nonfinite = (int64_t)host[COUNT_NONFINITE];
    stats->dropped_range = (int64_t)host[COUNT_OUTSIDE];
    stats->dropped_voxel_overflow = (int64_t)host[COUNT_VOXEL_OVERFLOW];
    stats->dropped_point_overflow = (int64_t)host[COUNT_POINT_OVERFLOW];
    stats->voxelized = stats->points_in - stats->dropped_nonfinite - stats->dropped_range -
                       stats->dropped_voxel_overflow;
    return SPCONV_OK;
}

spconv_status spconv__cuda_voxelize(spconv_context *ctx, const char *func,
                                    const spconv_tensor *const *scans, int64_t num_scans,
                                    const spconv_voxelize_params *params, int batch_column,
                                    spconv_voxels *out) {
    const spconv_device device = spconv_tensor_device(scans[0]);
    spconv__cuda_device_guard guard;
    SPCONV_FORWARD_IF_ERROR(guard.enter(device.index));
    voxel_batch b = {};
    b.func = func;
    b.ctx = ctx;
    b.stream = spconv__cuda_stream_for(ctx, device.index);
    b.params = params;
    voxel_scan *states = new (std::nothrow) voxel_scan[(size_t)num_scans];
    SPCONV_RETURN_ERROR_IF(states == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "%s: out of host memory for %lld scans", func, (long long)num_scans);
    const spconv_status st =
        voxelize_scans(ctx, &b, scans, num_scans, batch_column, device, states, out);
    delete[] states;
    if (st != SPCONV_OK) spconv_voxels_release(out);
    return st;
}
