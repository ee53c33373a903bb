/* Device hash tables of packed 64-bit keys for the voxelizer and the rulebook builders: the slot
 * layout, seeded home and probing of rulebook/hash.h (the code the CPU tests run), filled by one
 * thread per key with atomicCAS on the key and atomicMin on the value. */
#include "core/hash_seed.h"
#include "hash_table.h"
#include "maps_common.h"

__global__ void hash_clear_kernel(spconv__hash_slot *slots, int64_t capacity) {
    SPCONV_CUDA_GRID_LOOP(s, capacity) {
        slots[s].key = SPCONV_HASH_EMPTY;
        slots[s].value = INT32_MAX;
    }
}

/* counters[0]: inserts that found no free slot; counters[1]: inserts of a key already there.
 * Only keys before *limit go in (every key when limit is NULL). */
__global__ void hash_insert_kernel(spconv__hash_table table, const uint64_t *keys, int64_t n,
                                   const unsigned long long *limit,
                                   unsigned long long *counters) {
    SPCONV_CUDA_GRID_LOOP(i, n) {
        const uint64_t key = keys[i];
        if (key == SPCONV_HASH_EMPTY) continue;
        if (limit != NULL && (unsigned long long)i >= *limit) continue;
        const int outcome = spconv__hash_insert(&table, key, (int32_t)i);
        if (outcome == SPCONV_HASH_FULL) atomicAdd(&counters[0], 1ULL);
        if (outcome == SPCONV_HASH_REPEATED) atomicAdd(&counters[1], 1ULL);
    }
}

spconv_status spconv__cuda_hash_table_init(const char *func, const spconv_context *ctx,
                                           cudaStream_t stream, uint64_t capacity,
                                           spconv__device_array<spconv__hash_slot> *slots,
                                           spconv__hash_table *table) {
    SPCONV_RETURN_ERROR_IF(capacity < 2 || (capacity & (capacity - 1)) != 0 ||
                               capacity > (UINT64_C(1) << 40),
                           SPCONV_ERR_OVERFLOW, "%s: a hash table of %llu slots is not possible",
                           func, (unsigned long long)capacity);
    SPCONV_FORWARD_IF_ERROR(slots->alloc(ctx, func, (int64_t)capacity, "a hash table"));
    table->slots = slots->get();
    table->capacity = capacity;
    table->bits = spconv__hash_bits_for(capacity);
    spconv__hash_seed_draw(&table->seed);
    int blocks;
    SPCONV_FORWARD_IF_ERROR(spconv__cuda_map_blocks((int64_t)capacity, &blocks));
    SPCONV_CUDA_LAUNCH(hash_clear_kernel, blocks, SPCONV_CUDA_MAP_THREADS, 0, stream,
                       table->slots, (int64_t)capacity);
    CUDA_TRY(cudaGetLastError());
    return SPCONV_OK;
}

spconv_status spconv__cuda_hash_insert_queued(cudaStream_t stream, const spconv__hash_table *table,
                                              const uint64_t *keys, int64_t n,
                                              const unsigned long long *limit,
                                              unsigned long long *counters) {
    if (n == 0) return SPCONV_OK;
    int blocks;
    SPCONV_FORWARD_IF_ERROR(spconv__cuda_map_blocks(n, &blocks));
    SPCONV_CUDA_LAUNCH(hash_insert_kernel, blocks, SPCONV_CUDA_MAP_THREADS, 0, stream, *table,
                       keys, n, limit, counters);
    CUDA_TRY(cudaGetLastError());
    return SPCONV_OK;
}

spconv_status spconv__cuda_hash_insert_all(const char *func, const spconv_context *ctx,
                                           cudaStream_t stream, const spconv__hash_table *table,
                                           const uint64_t *keys, int64_t n, int64_t *repeated) {
    *repeated = 0;
    if (n == 0) return SPCONV_OK;
    spconv__device_array<unsigned long long> counters;
    SPCONV_FORWARD_IF_ERROR(counters.alloc(ctx, func, 2, "insert counters"));
    CUDA_TRY(cudaMemsetAsync(counters.get(), 0, 2 * sizeof(unsigned long long), stream));
    SPCONV_FORWARD_IF_ERROR(
        spconv__cuda_hash_insert_queued(stream, table, keys, n, NULL, counters.get()));
    unsigned long long host[2];
    CUDA_TRY(cudaMemcpyAsync(host, counters.get(), sizeof host, cudaMemcpyDeviceToHost, stream));
    CUDA_TRY(cudaStreamSynchronize(stream));
    SPCONV_RETURN_ERROR_IF(host[0] > 0, SPCONV_ERR_CAPACITY,
                           "%s: hash table of %llu slots is full (%lld keys, %llu found no slot)",
                           func, (unsigned long long)table->capacity, (long long)n, host[0]);
    *repeated = (int64_t)host[1];
    return SPCONV_OK;
}

spconv_status spconv__cuda_hash_fill_check(int device_index, const uint64_t *keys, int64_t n,
                                           uint64_t capacity) {
    const char *func = "spconv__cuda_hash_fill_check";
    spconv__cuda_device_guard guard;
    SPCONV_FORWARD_IF_ERROR(guard.enter(device_index));
    const cudaStream_t stream = cudaStreamLegacy;
    spconv__device_array<uint64_t> device_keys;
    SPCONV_FORWARD_IF_ERROR(device_keys.alloc(NULL, func, n, "keys"));
    CUDA_TRY(cudaMemcpy(device_keys.get(), keys, (size_t)n * sizeof *keys,
                        cudaMemcpyHostToDevice));
    spconv__device_array<spconv__hash_slot> slots;
    spconv__hash_table table;
    SPCONV_FORWARD_IF_ERROR(
        spconv__cuda_hash_table_init(func, NULL, stream, capacity, &slots, &table));
    int64_t repeated;
    return spconv__cuda_hash_insert_all(func, NULL, stream, &table, device_keys.get(), n,
                                        &repeated);
}
