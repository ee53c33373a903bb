/* The voxelizer's fast path. Per scan:
 *  1. keys (parallel): each point's voxel key (z, y, x packed into bits), or a drop marker;
 *  2. assign (sequential, because voxel rows are numbered by first appearance): an open-addressing
 *     hash table over the keys gives each point its voxel row and its slot in that voxel;
 *  3. fill (parallel over voxels): coordinates, counts, the voxels' points and their means, read
 *     through a per-voxel list of point indices so that every output has one writer.
 * Only step 2 is serial; it touches one table entry per point (prefetched ahead) and a run of
 * points in the same voxel skips the table. The result does not depend on the thread count:
 * steps 1 and 3 write disjoint outputs and sum each mean in slot order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"
#include "core/cpu_kernels.h"
#include "core/error.h"
#include "core/hash_seed.h"
#include "tensor/tensor_impl.h"
#include "voxel/voxelize_impl.h"

#define KEY_OUTSIDE (-1)
#define KEY_NONFINITE (-2)
/* Loops shorter than this run on one thread: starting a team costs more than they take. */
#define PARALLEL_MIN 16384
#define PARALLEL_MIN_VOXELS 2048
/* Points ahead whose table entry is prefetched during assignment (enough to cover a cache
 * miss at a few nanoseconds per point). */
#define PREFETCH_DISTANCE 16

/* ---- one scan ------------------------------------------------------------------------------- */

typedef struct scan_state {
    spconv__voxel_input in;
    int64_t *keys;       /* [P] voxel key, KEY_OUTSIDE or KEY_NONFINITE */
    int32_t *slot;       /* [P] the point's place in its voxel, -1 when not stored */
    int64_t *voxel_keys; /* [M] key of each voxel */
    int32_t *counts;     /* [M] stored points of each voxel */
    int64_t num_voxels;
    int64_t first_row;   /* row of this scan's voxel 0 in the batch */
    int64_t first_point; /* index of this scan's point 0 in the batch */
} scan_state;

/* floor((p - min) / size) in float32 as spconv computes it, or -1 outside [0, grid). A negative
 * quotient is outside whatever its floor, and for q >= 0 the conversion's truncation is the floor,
 * so no call to floorf is needed (baseline x86-64 has no instruction for it). */
static inline int64_t axis_cell(float p, float min, float size, int64_t grid) {
    float q = (p - min) / size;
    if (!(q >= 0.0f && q < 2147483648.0f)) return -1;
    int64_t cell = (int64_t)q;
    return cell < grid ? cell : -1;
}

/* Bit positions of y and z in a key (x starts at bit 0). */
typedef struct key_layout {
    unsigned shift_y, shift_z;
} key_layout;

static key_layout layout_of(const int64_t grid[3]) {
    unsigned bits_x = spconv__voxel_key_bits(grid[0]), bits_y = spconv__voxel_key_bits(grid[1]);
    return (key_layout){bits_x, bits_x + bits_y};
}

static void compute_keys(scan_state *s, const spconv_voxelize_params *params,
                         const int64_t grid[3], int num_threads, spconv_voxelize_stats *stats) {
    const key_layout layout = layout_of(grid);
    const float *points = s->in.points;
    const int64_t P = s->in.num_points, F = s->in.num_features;
    int64_t *keys = s->keys;
    int64_t nonfinite = 0, outside = 0;
    SPCONV_OMP(omp parallel for num_threads(num_threads) if (P >= PARALLEL_MIN)
                     schedule(static) reduction(+ : nonfinite, outside))
    for (int64_t i = 0; i < P; ++i) {
        const float *p = points + i * F;
        if (!isfinite(p[0]) || !isfinite(p[1]) || !isfinite(p[2])) {
            keys[i] = KEY_NONFINITE;
            ++nonfinite;
            continue;
        }
        int64_t x = axis_cell(p[0], params->range[0], params->voxel_size[0], grid[0]);
        int64_t y = axis_cell(p[1], params->range[1], params->voxel_size[1], grid[1]);
        int64_t z = axis_cell(p[2], params->range[2], params->voxel_size[2], grid[2]);
        if (x < 0 || y < 0 || z < 0) {
            keys[i] = KEY_OUTSIDE;
            ++outside;
            continue;
        }
        keys[i] = z << layout.shift_z | y << layout.shift_y | x;
    }
    stats->dropped_nonfinite += nonfinite;
    stats->dropped_range += outside;
}

/* ---- the hash table of step 2 ---------------------------------------------------------------- */

/* key_plus_one = 0 marks a free entry, so that a calloc'ed table needs no initialisation pass. */
typedef struct voxel_entry {
    int64_t key_plus_one;
    int64_t row;
} voxel_entry;

typedef struct voxel_table {
    voxel_entry *entries;
    uint64_t mask;
    uint32_t bits; /* capacity = 2^bits */
    spconv__hash_seed seed; /* drawn per scan: no point list can be crafted to share a run */
} voxel_table;

/* Rows are numbered by first appearance, never by slot, so the seed does not change the output. */
static inline uint64_t table_home(const voxel_table *t, int64_t key) {
    return spconv__hash_seeded(&t->seed, (uint64_t)key, t->bits);
}

static int table_init(voxel_table *t, int64_t max_entries) {
    uint64_t capacity = 16;
    unsigned bits = 4;
    while (capacity < 2 * (uint64_t)max_entries) { /* load factor <= 1/2 */
        capacity <<= 1;
        ++bits;
    }
    t->entries = calloc(capacity, sizeof *t->entries);
    t->mask = capacity - 1;
    t->bits = bits;
    spconv__hash_seed_draw(&t->seed);
    return t->entries != NULL;
}

/* The row of @p key's voxel; a new voxel (row s->num_voxels) when there is room, else -1. */
static int64_t table_find_or_add(const voxel_table *t, scan_state *s, int64_t key,
                                 int64_t max_voxels) {
    uint64_t i = table_home(t, key);
    while (t->entries[i].key_plus_one != 0) { /* ends: at most half the entries are used */
        if (t->entries[i].key_plus_one == key + 1) return t->entries[i].row;
        i = (i + 1) & t->mask;
    }
    if (s->num_voxels == max_voxels) return -1;
    int64_t row = s->num_voxels++;
    t->entries[i] = (voxel_entry){key + 1, row};
    s->voxel_keys[row] = key;
    s->counts[row] = 0;
    return row;
}

/* Step 2: point_voxel (batch rows) and slot of every point, the voxels' keys and counts. */
static void assign_voxels(scan_state *s, const voxel_table *t,
                          const spconv_voxelize_params *params, int64_t *point_voxel,
                          spconv_voxelize_stats *stats) {
    const int64_t P = s->in.num_points, max_points = params->max_points;
    const int64_t *keys = s->keys;
    int64_t last_key = KEY_OUTSIDE, last_row = -1, voxel_overflow = 0, point_overflow = 0;
    for (int64_t i = 0; i < P; ++i) {
        int64_t key = keys[i];
        s->slot[i] = -1;
        point_voxel[i] = -1;
        if (key < 0) continue;
        if (i + PREFETCH_DISTANCE < P)
            __builtin_prefetch(&t->entries[table_home(t, keys[i + PREFETCH_DISTANCE])]);
        if (key != last_key) {
            last_row = table_find_or_add(t, s, key, params->max_voxels);
            last_key = key;
        }
        if (last_row < 0) {
            ++voxel_overflow;
            continue;
        }
        point_voxel[i] = s->first_row + last_row;
        int32_t count = s->counts[last_row];
        if (count < max_points) {
            s->slot[i] = count;
            s->counts[last_row] = count + 1;
        } else {
            ++point_overflow;
        }
    }
    stats->dropped_voxel_overflow += voxel_overflow;
    stats->dropped_point_overflow += point_overflow;
}

/* ---- step 3 ------------------------------------------------------------------------------- */

/* Where the outputs of the whole batch live. */
typedef struct batch_outputs {
    int32_t *coords;      /* [M, coord_cols] */
    int coord_cols;       /* 3: (z, y, x); 4: (b, z, y, x) */
    int32_t *num_points;  /* [M] */
    float *voxels;        /* [M, max_points, F] or NULL */
    float *features;      /* [M, F] or NULL */
    const int64_t *point_voxel;
} batch_outputs;

/* Per-voxel lists of point indices: voxel v's points are members[offsets[v] .. offsets[v+1]),
 * in slot order. */
typedef struct voxel_members {
    int64_t *offsets;
    int32_t *members;
} voxel_members;

static int build_members(const scan_state *s, const int64_t *point_voxel, int num_threads,
                         voxel_members *vm) {
    const int64_t M = s->num_voxels, P = s->in.num_points;
    vm->offsets = malloc((size_t)(M + 1) * sizeof *vm->offsets);
    if (vm->offsets == NULL) return 0;
    vm->offsets[0] = 0;
    for (int64_t v = 0; v < M; ++v) vm->offsets[v + 1] = vm->offsets[v] + s->counts[v];
    vm->members = malloc((size_t)(vm->offsets[M] + 1) * sizeof *vm->members);
    if (vm->members == NULL) return 0;
    const int64_t *offsets = vm->offsets;
    int32_t *members = vm->members;
    const int32_t *slot = s->slot;
    const int64_t first_row = s->first_row;
    SPCONV_OMP(omp parallel for num_threads(num_threads) if (P >= PARALLEL_MIN)
                     schedule(static))
    for (int64_t i = 0; i < P; ++i)
        if (slot[i] >= 0) members[offsets[point_voxel[i] - first_row] + slot[i]] = (int32_t)i;
    return 1;
}

static void fill_voxel(const scan_state *s, const voxel_members *vm,
                       const spconv_voxelize_params *params, key_layout layout, int64_t batch,
                       int64_t v, const batch_outputs *o) {
    const int64_t F = s->in.num_features, mp = params->max_points, row = s->first_row + v;
    const int32_t *members = vm->members + vm->offsets[v];
    const int32_t n = s->counts[v];
    const int64_t key = s->voxel_keys[v];
    int32_t *c = o->coords + row * o->coord_cols;
    if (o->coord_cols == 4) *c++ = (int32_t)batch;
    c[0] = (int32_t)(key >> layout.shift_z);
    c[1] = (int32_t)((key & ((INT64_C(1) << layout.shift_z) - 1)) >> layout.shift_y);
    c[2] = (int32_t)(key & ((INT64_C(1) << layout.shift_y) - 1));
    o->num_points[row] = n;
    if (o->voxels != NULL) {
        float *dst = o->voxels + row * mp * F;
        for (int32_t k = 0; k < n; ++k)
            memcpy(dst + k * F, s->in.points + (int64_t)members[k] * F, (size_t)F * sizeof *dst);
        memset(dst + n * F, 0, (size_t)((mp - n) * F) * sizeof *dst);
    }
    if (o->features != NULL && n == 1) { /* most voxels of a fine grid: the mean is the point */
        memcpy(o->features + row * F, s->in.points + (int64_t)members[0] * F,
               (size_t)F * sizeof *o->features);
    } else if (o->features != NULL) {
        for (int64_t f = 0; f < F; ++f) {
            double sum = 0.0;
            for (int32_t k = 0; k < n; ++k) sum += s->in.points[(int64_t)members[k] * F + f];
            o->features[row * F + f] = (float)(sum / n);
        }
    }
}

static spconv_status fill_scan(const scan_state *s, const spconv_voxelize_params *params,
                               const int64_t grid[3], int64_t batch, int num_threads,
                               const batch_outputs *o) {
    voxel_members vm = {NULL, NULL};
    if (!build_members(s, o->point_voxel + s->first_point, num_threads, &vm)) {
        free(vm.offsets);
        SPCONV_RETURN_ERROR(SPCONV_ERR_OUT_OF_MEMORY, "spconv_voxelize: out of memory for the "
                            "member lists of %lld voxels", (long long)s->num_voxels);
    }
    const int64_t M = s->num_voxels;
    const key_layout layout = layout_of(grid);
    SPCONV_OMP(omp parallel for num_threads(num_threads) if (M >= PARALLEL_MIN_VOXELS)
                     schedule(static))
    for (int64_t v = 0; v < M; ++v) fill_voxel(s, &vm, params, layout, batch, v, o);
    free(vm.offsets);
    free(vm.members);
    return SPCONV_OK;
}

/* ---- the batch --------------------------------------------------------------------------- */

static void scan_free(scan_state *s) {
    spconv_tensor_release(s->in.tensor);
    free(s->keys);
    free(s->slot);
    free(s->voxel_keys);
    free(s->counts);
    memset(s, 0, sizeof *s);
}

/* Steps 1 and 2 for one scan whose voxels start at batch row s->first_row. */
static spconv_status assign_scan(scan_state *s, const spconv_voxelize_params *params,
                                 const int64_t grid[3], int num_threads, int64_t *point_voxel,
                                 spconv_voxelize_stats *stats) {
    const int64_t P = s->in.num_points;
    const int64_t cap = P < params->max_voxels ? P : params->max_voxels;
    voxel_table table = {NULL, 0, 0, {0, 1}};
    s->keys = malloc((size_t)(P + 1) * sizeof *s->keys);
    s->slot = malloc((size_t)(P + 1) * sizeof *s->slot);
    s->voxel_keys = malloc((size_t)(cap + 1) * sizeof *s->voxel_keys);
    s->counts = malloc((size_t)(cap + 1) * sizeof *s->counts);
    if (s->keys == NULL || s->slot == NULL || s->voxel_keys == NULL || s->counts == NULL ||
        !table_init(&table, cap)) {
        free(table.entries);
        SPCONV_RETURN_ERROR(SPCONV_ERR_OUT_OF_MEMORY,
                            "spconv_voxelize: out of memory for a scan of %lld points",
                            (long long)P);
    }
    compute_keys(s, params, grid, num_threads, stats);
    assign_voxels(s, &table, params, point_voxel, stats);
    free(table.entries);
    stats->points_in += P;
    return SPCONV_OK;
}

/* The output tensors for @p num_voxels rows; views of their data in @p o. */
static spconv_status make_outputs(const char *func, const spconv_voxelize_params *params,
                                  int64_t num_voxels, int64_t F, int batch_column,
                                  spconv_voxels *out, batch_outputs *o) {
    const spconv_device cpu = spconv_cpu();
    const int64_t M = num_voxels;
    o->coord_cols = batch_column ? 4 : 3;
    const int64_t coord_sizes[2] = {M, o->coord_cols};
    SPCONV_FORWARD_IF_ERROR(
        spconv__tensor_empty_in(func, NULL, cpu, SPCONV_I32, 2, coord_sizes, &out->coords));
    SPCONV_FORWARD_IF_ERROR(
        spconv__tensor_empty_in(func, NULL, cpu, SPCONV_I32, 1, &M, &out->num_points));
    o->coords = spconv_tensor_data(out->coords);
    o->num_points = spconv_tensor_data(out->num_points);
    o->voxels = o->features = NULL;
    if (params->outputs & SPCONV_VOXELIZE_VOXELS) {
        const int64_t sizes[3] = {M, params->max_points, F};
        SPCONV_FORWARD_IF_ERROR(
            spconv__tensor_empty_in(func, NULL, cpu, SPCONV_F32, 3, sizes, &out->voxels));
        o->voxels = spconv_tensor_data(out->voxels);
    }
    if (params->outputs & SPCONV_VOXELIZE_MEAN) {
        const int64_t sizes[2] = {M, F};
        SPCONV_FORWARD_IF_ERROR(
            spconv__tensor_empty_in(func, NULL, cpu, SPCONV_F32, 2, sizes, &out->features));
        o->features = spconv_tensor_data(out->features);
    }
    return SPCONV_OK;
}

/* Inputs checked and converted, all with the same F; the batch's point count. */
static spconv_status prepare_scans(spconv_context *ctx, const char *func,
                                   const spconv_tensor *const *scans, int64_t num_scans,
                                   int batch_column, scan_state *states, int64_t *total_points) {
    *total_points = 0;
    for (int64_t b = 0; b < num_scans; ++b) {
        SPCONV_FORWARD_IF_ERROR(spconv__voxel_input_prepare(ctx, func, batch_column ? b : -1,
                                                            scans[b], spconv_cpu(), &states[b].in));
        SPCONV_RETURN_ERROR_IF(states[b].in.num_features != states[0].in.num_features,
                               SPCONV_ERR_SHAPE_MISMATCH,
                               "%s: scan %lld has %lld features per point, scan 0 has %lld", func,
                               (long long)b, (long long)states[b].in.num_features,
                               (long long)states[0].in.num_features);
        states[b].first_point = *total_points;
        *total_points += states[b].in.num_points;
    }
    return SPCONV_OK;
}

static spconv_status voxelize_scans(spconv_context *ctx, const char *func,
                                    const spconv_tensor *const *scans, int64_t num_scans,
                                    const spconv_voxelize_params *params, int batch_column,
                                    scan_state *states, spconv_voxels *out) {
    SPCONV_FORWARD_IF_ERROR(spconv__voxel_grid(func, params, out->grid_size));
    const int num_threads = spconv_context_num_threads(ctx);
    int64_t total_points, total_voxels = 0;
    SPCONV_FORWARD_IF_ERROR(
        prepare_scans(ctx, func, scans, num_scans, batch_column, states, &total_points));
    SPCONV_FORWARD_IF_ERROR(
        spconv__tensor_empty_in(func, NULL, spconv_cpu(), SPCONV_I64, 1, &total_points,
                                &out->point_voxel));
    int64_t *point_voxel = spconv_tensor_data(out->point_voxel);
    for (int64_t b = 0; b < num_scans; ++b) {
        states[b].first_row = total_voxels;
        SPCONV_FORWARD_IF_ERROR(assign_scan(&states[b], params, out->grid_size, num_threads,
                                            point_voxel + states[b].first_point, &out->stats));
        total_voxels += states[b].num_voxels;
        free(states[b].keys); /* no longer needed: keep the peak memory down */
        states[b].keys = NULL;
    }
    out->stats.voxelized = out->stats.points_in - out->stats.dropped_nonfinite -
                           out->stats.dropped_range - out->stats.dropped_voxel_overflow;
    batch_outputs o = {.point_voxel = point_voxel};
    SPCONV_FORWARD_IF_ERROR(make_outputs(func, params, total_voxels, states[0].in.num_features,
                                         batch_column, out, &o));
    for (int64_t b = 0; b < num_scans; ++b)
        SPCONV_FORWARD_IF_ERROR(fill_scan(&states[b], params, out->grid_size, b, num_threads, &o));
    return SPCONV_OK;
}

static spconv_status voxelize_entry(spconv_context *ctx, const char *func,
                                    const spconv_tensor *const *scans, int64_t num_scans,
                                    const spconv_voxelize_params *params, int batch_column,
                                    spconv_voxels *out) {
    SPCONV_CHECK_NOT_NULL(func, out);
    memset(out, 0, sizeof *out);
    SPCONV_CHECK_NOT_NULL(func, params);
    SPCONV_CHECK_NOT_NULL(func, scans);
    SPCONV_RETURN_ERROR_IF(num_scans < 1 || num_scans > INT32_MAX, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: num_scans = %lld must be in [1, 2^31 - 1]", func,
                           (long long)num_scans);
    /* The first scan's device picks the backend; the kernel checks that the others match. A
     * NULL scan is named by the kernel's own check of each scan. */
    const spconv_device device = scans[0] != NULL ? spconv_tensor_device(scans[0]) : spconv_cpu();
    const spconv_backend *backend;
    SPCONV_DISPATCH(func, device, voxelize, "voxelizer", &backend);
    return backend->voxelize(ctx, func, scans, num_scans, params, batch_column, out);
}

/* The CPU backend's slot: @p out is zeroed, the count checked by the entry point. */
spconv_status spconv__cpu_voxelize(spconv_context *ctx, const char *func,
                                   const spconv_tensor *const *scans, int64_t num_scans,
                                   const spconv_voxelize_params *params, int batch_column,
                                   spconv_voxels *out) {
    scan_state *states = calloc((size_t)num_scans, sizeof *states);
    SPCONV_RETURN_ERROR_IF(states == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "%s: out of memory for %lld scans", func, (long long)num_scans);
    spconv_status st = voxelize_scans(ctx, func, scans, num_scans, params, batch_column, states, out);
    for (int64_t b = 0; b < num_scans; ++b) scan_free(&states[b]);
    free(states);
    if (st != SPCONV_OK) spconv_voxels_release(out);
    return st;
}

spconv_status spconv_voxelize(spconv_context *ctx, const spconv_tensor *points,
                              const spconv_voxelize_params *params, spconv_voxels *out) {
    return voxelize_entry(ctx, "spconv_voxelize", &points, 1, params, 0, out);
}

spconv_status spconv_voxelize_batch(spconv_context *ctx, const spconv_tensor *const *scans,
                                    int64_t num_scans, const spconv_voxelize_params *params,
                                    spconv_voxels *out) {
    return voxelize_entry(ctx, "spconv_voxelize_batch", scans, num_scans, params, 1, out);
}
