/* Seeded hashing for the open-addressing tables of the voxelizer and the rulebook builders.
 *
 * Why: a fixed mix (the tables used murmur3's finaliser and Fibonacci hashing) lets anyone search
 * the coordinate space offline for cells that share one window of slots; under linear probing
 * every insert and lookup then walks one run and a build turns quadratic (65,536 crafted points
 * took 2 s to voxelize instead of 13 ms). Each table now draws a seed when it is built, so such
 * a search has nothing fixed to aim at.
 *
 * The mix: key ^ salt, one xorshift-multiply round (a fixed bijection that spreads the few low
 * bits neighbouring coordinates differ in), then multiply-shift: times a random odd 64-bit
 * multiplier, keep the TOP bits. Multiply-shift with a random odd multiplier is a universal
 * family (two distinct inputs share a b-bit home with probability <= 2 / 2^b), and the bijection
 * keeps distinct keys distinct, so the family stays universal over keys; the low bits of a
 * product would not be (they depend only on the low bits of the input).
 *
 * Results never depend on the seed: every table only maps keys to rows, and output order comes
 * from sorting or first appearance, never from slot order.
 *
 * SPCONV_HD and plain C11/C++ so that CUDA kernels can hash with the seed the host drew. */
#ifndef SPCONV_CORE_HASH_SEED_H
#define SPCONV_CORE_HASH_SEED_H

#include <stdint.h>

#ifdef __CUDACC__
#define SPCONV_HASH_HD __host__ __device__
#else
#define SPCONV_HASH_HD
#endif

typedef struct spconv__hash_seed {
    uint64_t salt;       /* xored into every key */
    uint64_t multiplier; /* odd */
} spconv__hash_seed;

/* Home of @p key in a table of 2^bits slots, 1 <= bits <= 63. */
static inline SPCONV_HASH_HD uint64_t spconv__hash_seeded(const spconv__hash_seed *seed,
                                                          uint64_t key, uint32_t bits) {
    uint64_t h = key ^ seed->salt;
    h ^= h >> 32;
    h *= UINT64_C(0xd6e8feb86659fd93);
    h ^= h >> 32;
    return (h * seed->multiplier) >> (64 - bits);
}

#ifdef __cplusplus
extern "C" {
#endif
/* A fresh seed: getrandom(2) without blocking, or (where that fails) a mix of the clocks and
 * addresses of this process. Tests may force one with the environment variable SPCONV_HASH_SEED
 * (an unsigned integer, any base strtoull reads), to check that results do not depend on it.
 * Host code only; the CUDA backend draws on the host and hands the seed to its kernels. */
void spconv__hash_seed_draw(spconv__hash_seed *seed);
#ifdef __cplusplus
}
#endif

#endif /* SPCONV_CORE_HASH_SEED_H */
