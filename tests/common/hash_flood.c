/* Inputs crafted against the old, fixed hash functions (see hash_flood.h). */
#include "common/hash_flood.h"

#include <stdlib.h>
#include <string.h>

/* The rulebook table's old mix (murmur3's 64-bit finaliser), as src/rulebook/hash.h had it. */
static uint64_t old_rulebook_mix(uint64_t key) {
    key ^= key >> 33;
    key *= UINT64_C(0xff51afd7ed558ccd);
    key ^= key >> 33;
    key *= UINT64_C(0xc4ceb9fe1a85ec53);
    key ^= key >> 33;
    return key;
}

static unsigned bits_for(int64_t extent) {
    unsigned bits = 0;
    while (bits < 63 && ((uint64_t)(extent - 1) >> bits) != 0) ++bits;
    return bits;
}

/* Smallest power of two >= max(16, minimum): both old tables sized themselves this way. */
static uint64_t pow2_capacity(uint64_t minimum, unsigned *log2) {
    uint64_t capacity = 16;
    *log2 = 4;
    while (capacity < minimum) {
        capacity <<= 1;
        ++*log2;
    }
    return capacity;
}

/* A window of slots that about 2n of the grid's cells hash into, so that n are found after
 * visiting about half the grid. */
static uint64_t window_for(int64_t n, uint64_t capacity, double cells) {
    const double window = 2.0 * (double)n * (double)capacity / cells + 1.0;
    return window >= (double)capacity ? capacity : (uint64_t)window;
}

int64_t spconv_flood_rulebook_sites(int64_t n, const int64_t shape[3], int32_t *rows) {
    const unsigned bits_x = bits_for(shape[2]), bits_y = bits_for(shape[1]);
    unsigned log2;
    const uint64_t capacity = pow2_capacity(4 * (uint64_t)n, &log2);
    const uint64_t window =
        window_for(n, capacity, (double)shape[0] * (double)shape[1] * (double)shape[2]);
    int64_t found = 0;
    for (int64_t z = 0; z < shape[0] && found < n; ++z)
        for (int64_t y = 0; y < shape[1] && found < n; ++y)
            for (int64_t x = 0; x < shape[2] && found < n; ++x) {
                /* batch 0 of 1: the batch field has no bits */
                const uint64_t key = (uint64_t)z << (bits_x + bits_y) | (uint64_t)y << bits_x |
                                     (uint64_t)x;
                if ((old_rulebook_mix(key) & (capacity - 1)) >= window) continue;
                int32_t *row = rows + 4 * found++;
                row[0] = 0;
                row[1] = (int32_t)z;
                row[2] = (int32_t)y;
                row[3] = (int32_t)x;
            }
    return found;
}

/* The voxelizer's cell of p on one axis, computed as it does (float32 quotient, truncated). */
static int64_t voxel_cell(float p, float min, float size) {
    const float q = (p - min) / size;
    return q >= 0.0f && q < 2147483648.0f ? (int64_t)q : -1;
}

/* The centre of cell c, nudged until the voxelizer's float arithmetic puts it in c. */
static int centre_in_cell(int64_t c, float min, float size, float *p) {
    float v = min + ((float)c + 0.5f) * size;
    for (int tries = 0; tries < 8; ++tries) {
        const int64_t got = voxel_cell(v, min, size);
        if (got == c) {
            *p = v;
            return 1;
        }
        v = got < c ? v + size * 0.125f : v - size * 0.125f;
    }
    return 0;
}

int64_t spconv_flood_voxel_points(int64_t n, int64_t num_features,
                                  const spconv_voxelize_params *params, float *points) {
    int64_t grid[3]; /* x, y, z */
    if (spconv_voxelize_grid_size(params, grid) != SPCONV_OK) return 0;
    const unsigned bits_x = bits_for(grid[0]), bits_y = bits_for(grid[1]);
    const int64_t entries = n < params->max_voxels ? n : params->max_voxels;
    unsigned log2;
    const uint64_t capacity = pow2_capacity(2 * (uint64_t)entries, &log2);
    const uint64_t window =
        window_for(n, capacity, (double)grid[0] * (double)grid[1] * (double)grid[2]);
    int64_t found = 0;
    for (int64_t z = 0; z < grid[2] && found < n; ++z)
        for (int64_t y = 0; y < grid[1] && found < n; ++y)
            for (int64_t x = 0; x < grid[0] && found < n; ++x) {
                const uint64_t key = (uint64_t)z << (bits_x + bits_y) | (uint64_t)y << bits_x |
                                     (uint64_t)x;
                if ((key * UINT64_C(0x9E3779B97F4A7C15)) >> (64 - log2) >= window) continue;
                float *p = points + found * num_features;
                memset(p, 0, (size_t)num_features * sizeof *p);
                if (!centre_in_cell(x, params->range[0], params->voxel_size[0], &p[0]) ||
                    !centre_in_cell(y, params->range[1], params->voxel_size[1], &p[1]) ||
                    !centre_in_cell(z, params->range[2], params->voxel_size[2], &p[2]))
                    continue;
                ++found;
            }
    return found;
}

static uint64_t xorshift(uint64_t *state) {
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

static int compare_u64(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

void spconv_flood_random_sites(int64_t n, const int64_t shape[3], uint64_t seed, int32_t *rows) {
    const uint64_t cells = (uint64_t)shape[0] * (uint64_t)shape[1] * (uint64_t)shape[2];
    uint64_t *picked = malloc((size_t)(n > 0 ? n : 1) * sizeof *picked);
    if (picked == NULL) abort();
    uint64_t state = seed | 1;
    int64_t count = 0;
    while (count < n) { /* draw the missing ones, then drop repeats */
        while (count < n) picked[count++] = xorshift(&state) % cells;
        qsort(picked, (size_t)count, sizeof *picked, compare_u64);
        int64_t unique = 0;
        for (int64_t i = 0; i < count; ++i)
            if (unique == 0 || picked[i] != picked[unique - 1]) picked[unique++] = picked[i];
        count = unique;
    }
    for (int64_t i = 0; i < n; ++i) {
        const uint64_t cell = picked[i];
        rows[4 * i + 0] = 0;
        rows[4 * i + 1] = (int32_t)(cell / ((uint64_t)shape[1] * (uint64_t)shape[2]));
        rows[4 * i + 2] = (int32_t)(cell / (uint64_t)shape[2] % (uint64_t)shape[1]);
        rows[4 * i + 3] = (int32_t)(cell % (uint64_t)shape[2]);
    }
    free(picked);
}

void spconv_flood_random_points(int64_t n, int64_t num_features,
                                const spconv_voxelize_params *params, uint64_t seed,
                                float *points) {
    uint64_t state = seed | 1;
    for (int64_t i = 0; i < n; ++i) {
        float *p = points + i * num_features;
        memset(p, 0, (size_t)num_features * sizeof *p);
        for (int a = 0; a < 3; ++a) {
            const double u = (double)(xorshift(&state) >> 11) * 0x1.0p-53;
            const float lo = params->range[a], hi = params->range[a + 3];
            float v = lo + (float)u * (hi - lo);
            p[a] = v < hi ? v : lo; /* rounding may reach hi, which is outside */
        }
    }
}
