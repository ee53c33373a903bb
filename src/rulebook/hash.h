/* Coordinate hash table of active sites: packed 64-bit keys of (b, z, y, x), the seeded mix of
 * core/hash_seed.h (a seed drawn per table, so that no input can be crafted to pile into one run
 * of slots), open addressing with linear probing over a power-of-two slot array kept at load
 * factor <= 0.25. Every function is SPCONV_HD so that the CUDA backend probes with exactly the
 * code the CPU tests exercise. Must stay valid C11 and C++ (nvcc).
 *
 * Concurrency: inserts may run concurrently (compare-and-swap on the key, atomic min on the
 * value, so the smallest row of a repeated key wins whatever the interleaving); finds must not
 * overlap inserts (the builders separate the two phases by a barrier). */
#ifndef SPCONV_RULEBOOK_HASH_H
#define SPCONV_RULEBOOK_HASH_H

#include <stdint.h>

#include "core/hash_seed.h"
#include "tensor/convert.h" /* SPCONV_HD */

/* No packed key reaches it because keys are limited to SPCONV_KEY_MAX_BITS bits. */
#define SPCONV_HASH_EMPTY UINT64_MAX
#define SPCONV_KEY_MAX_BITS 63
/* Even an empty table keeps a few free slots, so that every probe meets one and stops early. */
#define SPCONV_HASH_MIN_CAPACITY 16

/* Field i of a key (0 = batch, 1 = z, 2 = y, 3 = x) occupies bits [shift[i], shift[i] + bits[i]);
 * x is lowest and batch highest, so numeric key order is (b, z, y, x) order. */
typedef struct spconv__key_layout {
    uint32_t bits[4];
    uint32_t shift[4];
    uint32_t total_bits;
} spconv__key_layout;

typedef struct spconv__hash_slot {
    uint64_t key;  /* SPCONV_HASH_EMPTY when free */
    int32_t value; /* row of the key; INT32_MAX until the first insert of the key lands */
} spconv__hash_slot;

/* A table as every probe needs it. The seed is a field, not drawn here, so that a CUDA backend
 * can probe with the seed the host drew for the same table. */
typedef struct spconv__hash_table {
    spconv__hash_slot *slots;
    uint64_t capacity; /* power of two: 2^bits */
    uint32_t bits;
    spconv__hash_seed seed;
} spconv__hash_table;

/* Bits needed for the values 0 .. extent-1 (0 for an extent of 1). */
static inline SPCONV_HD uint32_t spconv__key_bits_for(int64_t extent) {
    uint32_t bits = 0;
    while (bits < 64 && ((uint64_t)(extent - 1) >> bits) != 0) ++bits;
    return bits;
}

/* Layout for batch indices < batch_size and coordinates < shape; returns 0 when the fields need
 * more than SPCONV_KEY_MAX_BITS bits (the caller reports it), 1 otherwise. */
static inline SPCONV_HD int spconv__key_layout_init(spconv__key_layout *layout, int64_t batch_size,
                                                    const int64_t shape[3]) {
    const int64_t extents[4] = {batch_size, shape[0], shape[1], shape[2]};
    uint32_t shift = 0;
    for (int field = 3; field >= 0; --field) {
        layout->bits[field] = spconv__key_bits_for(extents[field]);
        layout->shift[field] = shift;
        shift += layout->bits[field];
    }
    layout->total_bits = shift;
    return shift <= SPCONV_KEY_MAX_BITS;
}

/* Coordinates must lie inside the layout's extents (callers check before packing). */
static inline SPCONV_HD uint64_t spconv__key_pack(const spconv__key_layout *layout, int64_t b,
                                                  int64_t z, int64_t y, int64_t x) {
    return ((uint64_t)b << layout->shift[0]) | ((uint64_t)z << layout->shift[1]) |
           ((uint64_t)y << layout->shift[2]) | ((uint64_t)x << layout->shift[3]);
}

static inline SPCONV_HD void spconv__key_unpack(const spconv__key_layout *layout, uint64_t key,
                                                int32_t coords[4]) {
    for (int field = 0; field < 4; ++field) {
        const uint64_t mask = (UINT64_C(1) << layout->bits[field]) - 1;
        coords[field] = (int32_t)((key >> layout->shift[field]) & mask);
    }
}

/* The slot where the probe for key starts: the top bits of the seeded multiply-shift. */
static inline SPCONV_HD uint64_t spconv__hash_home(const spconv__hash_table *table, uint64_t key) {
    return spconv__hash_seeded(&table->seed, key, table->bits);
}

/* Smallest power of two >= 4 * entries (and >= SPCONV_HASH_MIN_CAPACITY); 0 when it would not
 * fit 63 bits. Most rulebook probes look for absent neighbours, and at a load factor <= 0.25
 * those usually stop at the first slot: on the real 125k-site scan a 3x3x3 probe pass took a third
 * less time than at the 0.5 that plain correctness would allow. */
static inline SPCONV_HD uint64_t spconv__hash_capacity_for(int64_t entries) {
    uint64_t capacity = SPCONV_HASH_MIN_CAPACITY;
    while (capacity < 4 * (uint64_t)entries) {
        if (capacity >> 62) return 0;
        capacity <<= 1;
    }
    return capacity;
}

/* log2 of a power-of-two capacity: the number of home bits. */
static inline SPCONV_HD uint32_t spconv__hash_bits_for(uint64_t capacity) {
    uint32_t bits = 0;
    while ((UINT64_C(1) << bits) < capacity) ++bits;
    return bits;
}

/* Returns the key that was in the slot before (SPCONV_HASH_EMPTY when this call claimed it). */
static inline SPCONV_HD uint64_t spconv__hash_claim(uint64_t *slot_key, uint64_t key) {
#ifdef __CUDA_ARCH__
    return (uint64_t)atomicCAS((unsigned long long *)slot_key,
                               (unsigned long long)SPCONV_HASH_EMPTY, (unsigned long long)key);
#else
    uint64_t seen = __atomic_load_n(slot_key, __ATOMIC_RELAXED);
    if (seen != SPCONV_HASH_EMPTY) return seen;
    __atomic_compare_exchange_n(slot_key, &seen, key, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return seen;
#endif
}

static inline SPCONV_HD void spconv__hash_min_value(int32_t *slot_value, int32_t value) {
#ifdef __CUDA_ARCH__
    atomicMin((int *)slot_value, (int)value);
#else
    /* Each failed exchange means another thread stored a smaller value, so this ends. */
    int32_t seen = __atomic_load_n(slot_value, __ATOMIC_RELAXED);
    while (value < seen && !__atomic_compare_exchange_n(slot_value, &seen, value, 1,
                                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
#endif
}

/* What spconv__hash_insert found. */
#define SPCONV_HASH_FULL 0     /* every slot holds another key: nothing was stored */
#define SPCONV_HASH_ADDED 1    /* the key was new */
#define SPCONV_HASH_REPEATED 2 /* the key was there already; its value is now the smaller one */

/* Insert key -> value, keeping the smallest value of a repeated key. Slots must start with
 * key SPCONV_HASH_EMPTY and value INT32_MAX. The probe visits each slot at most once. Returns
 * one of the SPCONV_HASH_ codes above. */
static inline SPCONV_HD int spconv__hash_insert(const spconv__hash_table *table, uint64_t key,
                                                int32_t value) {
    spconv__hash_slot *slots = table->slots;
    const uint64_t capacity = table->capacity, mask = capacity - 1;
    uint64_t pos = spconv__hash_home(table, key);
    for (uint64_t probe = 0; probe < capacity; ++probe) {
        const uint64_t seen = spconv__hash_claim(&slots[pos].key, key);
        if (seen == SPCONV_HASH_EMPTY || seen == key) {
            spconv__hash_min_value(&slots[pos].value, value);
            return seen == key ? SPCONV_HASH_REPEATED : SPCONV_HASH_ADDED;
        }
        pos = (pos + 1) & mask;
    }
    return SPCONV_HASH_FULL;
}

/* Value stored for key, or -1 when absent. */
static inline SPCONV_HD int32_t spconv__hash_find(const spconv__hash_table *table, uint64_t key) {
    const spconv__hash_slot *slots = table->slots;
    const uint64_t capacity = table->capacity, mask = capacity - 1;
    uint64_t pos = spconv__hash_home(table, key);
    for (uint64_t probe = 0; probe < capacity; ++probe) {
        const uint64_t seen = slots[pos].key;
        if (seen == key) return slots[pos].value;
        if (seen == SPCONV_HASH_EMPTY) return -1;
        pos = (pos + 1) & mask;
    }
    return -1;
}

#endif /* SPCONV_RULEBOOK_HASH_H */
