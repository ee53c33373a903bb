/* Inputs crafted against the hash functions this project used before its tables were seeded
 * (before commit "Seeded hashing"): they show that the seeded tables stay linear where the old,
 * fixed ones went quadratic. Shared by the tests and tools/bench_hash_flood.c.
 *
 * Both old functions were public knowledge and fixed, so an attacker could search the coordinate
 * space offline for cells whose home slot falls in a small window: every such cell then joins one
 * run of occupied slots under linear probing, and each insert or lookup walks that run. The
 * search enumerates cells in key order and keeps those whose old home is below `window`, with
 * the window sized so that about twice the wanted count exists; it costs one hash per cell
 * visited (at most the whole grid). */
#ifndef SPCONV_TEST_HASH_FLOOD_H
#define SPCONV_TEST_HASH_FLOOD_H

#include <stdint.h>

#include "spconv/voxelize.h"

/**
 * Fill @p rows (int32 [n, 4], batch 0) with @p n distinct sites inside @p shape (z, y, x) whose
 * keys, as the rulebook's old table packed and hashed them (murmur3's 64-bit finaliser, low bits
 * of a power-of-two capacity >= 4n), all start probing in one small window of slots. Returns how
 * many sites it found (n unless the grid has too few cells for the window).
 */
int64_t spconv_flood_rulebook_sites(int64_t n, const int64_t shape[3], int32_t *rows);

/**
 * Fill @p points (float [n, num_features], extra features 0) with @p n points, one per voxel of
 * @p params' grid, whose voxel keys all start probing in one small window of the voxelizer's old
 * table (Fibonacci hashing: top bits of key * 0x9E3779B97F4A7C15, capacity the power of two
 * >= 2 * min(n, max_voxels)). Points sit at cell centres, checked to fall in their cell the way
 * the voxelizer computes it. Returns how many it found.
 */
int64_t spconv_flood_voxel_points(int64_t n, int64_t num_features,
                                  const spconv_voxelize_params *params, float *points);

/** @p n random distinct sites inside @p shape (batch 0), from a fixed xorshift seed. */
void spconv_flood_random_sites(int64_t n, const int64_t shape[3], uint64_t seed, int32_t *rows);

/** @p n random points inside @p params' range (extra features 0), from a fixed seed. */
void spconv_flood_random_points(int64_t n, int64_t num_features,
                                const spconv_voxelize_params *params, uint64_t seed,
                                float *points);

#endif /* SPCONV_TEST_HASH_FLOOD_H */
