/* What the map builders of the CUDA backend (voxelize.cu, rulebook.cu) share: scratch arrays on
 * the device, the Thrust execution policy of a stream, grid sizes of grid-stride launches, and
 * filling an open-addressing table of packed 64-bit keys with a checked capacity.
 *
 * Thrust: under nvcc the CUDA system on the context's stream (thrust::cuda::par.on); in the host
 * emulation its CPP system on the calling thread (CMake defines THRUST_DEVICE_SYSTEM there), after
 * the work queued on the stream has run, which is where the CUDA system's algorithm would run. */
#ifndef SPCONV_CUDA_MAPS_COMMON_H
#define SPCONV_CUDA_MAPS_COMMON_H

#include <stdint.h>
#include <stdio.h>

#include "spconv/config.h"

#if SPCONV_CUDA_EMULATION
/* CCCL takes a <cuda_runtime_api.h> on the include path for the CUDA toolkit and then mixes the
 * real runtime's declarations with the emulation's. This build has no toolkit: skip CCCL's
 * detection header and say so, and Thrust stays on its CPP system. */
#define __CCCL_CUDA_TOOLKIT_H
#define _CCCL_HAS_CTK() 0
#define _CCCL_CTK() (0, 0)
#define _CCCL_CTK_MAKE_VERSION(major, minor) ((major) * 1000 + (minor) * 10)
#define _CCCL_CTK_AT_LEAST(...) 0
#define _CCCL_CTK_BELOW(...) 1
#endif
#include <thrust/execution_policy.h>
#include <thrust/iterator/constant_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/reduce.h>
#include <thrust/scan.h>
#include <thrust/sort.h>

#include "core/error.h"
#include "cuda_check.h"
#include "cuda_common.h"
#include "rulebook/hash.h"

#if SPCONV_CUDA_EMULATION
/* Thrust's CUDA system runs an algorithm after the stream's earlier work and returns when it is
 * done; the emulation runs the stream's queued work, then the algorithm on the calling thread. */
#define SPCONV_THRUST_ON(stream) (spconv__emu::run_queued(stream), thrust::cpp::par)
#else
#define SPCONV_THRUST_ON(stream) thrust::cuda::par.on(stream)
#endif

/* Threads per block of the map kernels (all grid-stride loops). */
#define SPCONV_CUDA_MAP_THREADS 256

/* A device array of n elements on the current device that frees itself. Its memory comes from
 * the call's context (its allocator hook when it has one and the current device is its device,
 * cudaMalloc otherwise: context.h); alloc() reports failure as a status naming @p what. Copying is
 * not allowed (one owner). */
template <typename T> class spconv__device_array {
public:
    spconv__device_array() = default;
    spconv__device_array(const spconv__device_array &) = delete;
    spconv__device_array &operator=(const spconv__device_array &) = delete;
    ~spconv__device_array() { release(); }

    spconv_status alloc(const spconv_context *ctx, const char *func, int64_t n,
                        const char *what) {
        release();
        const size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(T);
        int device = 0;
        CUDA_TRY(cudaGetDevice(&device));
        const spconv_status st =
            spconv__context_alloc(func, ctx, spconv_cuda(device), bytes, &memory_);
        if (st != SPCONV_OK) {
            /* Copy the detail first: the new message overwrites the same buffer. */
            char detail[320];
            snprintf(detail, sizeof detail, "%s", spconv_last_error());
            return spconv__error(st, "%s (for %s)", detail, what);
        }
        return SPCONV_OK;
    }
    void release() {
        spconv__context_free(&memory_);
        memory_ = spconv__allocation();
    }
    T *get() const { return (T *)memory_.data; }

private:
    spconv__allocation memory_ = {};
};

/* Blocks of SPCONV_CUDA_MAP_THREADS for a grid-stride loop over n elements: enough to fill the
 * device, no more than the elements need, at least one. */
static inline spconv_status spconv__cuda_map_blocks(int64_t n, int *blocks) {
    int resident = 1;
    SPCONV_FORWARD_IF_ERROR(spconv__cuda_resident_blocks(SPCONV_CUDA_MAP_THREADS, &resident));
    const int64_t needed = (n + SPCONV_CUDA_MAP_THREADS - 1) / SPCONV_CUDA_MAP_THREADS;
    *blocks = needed < 1 ? 1 : needed < resident ? (int)needed : resident;
    return SPCONV_OK;
}

/* The grid-stride loop of a map kernel over [0, n). */
#define SPCONV_CUDA_GRID_LOOP(i, n)                                                          \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);               \
         i += (int64_t)gridDim.x * blockDim.x)

/* Counters a map kernel raises and the host reads back once (the build's one synchronisation
 * point besides the sizes it must know to allocate). */
typedef struct spconv__map_counters {
    unsigned long long values[8];
} spconv__map_counters;

/* A device hash table of the layout of rulebook/hash.h: @p capacity slots (a power of two), the
 * host's seed, every slot free (key SPCONV_HASH_EMPTY, value INT32_MAX). Its slots, and the
 * counters of an insert, come from @p ctx's allocator (NULL: cudaMalloc). */
spconv_status spconv__cuda_hash_table_init(const char *func, const spconv_context *ctx,
                                           cudaStream_t stream, uint64_t capacity,
                                           spconv__device_array<spconv__hash_slot> *slots,
                                           spconv__hash_table *table);

/* Insert keys[i] -> i for every i < n with keys[i] != SPCONV_HASH_EMPTY, concurrently (the
 * smallest index of a repeated key wins). *repeated gets how many inserts found their key there
 * already. A table that runs out of free slots is SPCONV_ERR_CAPACITY naming @p func: never a
 * hang, since every probe visits each slot at most once. Synchronises to read the counts. */
spconv_status spconv__cuda_hash_insert_all(const char *func, const spconv_context *ctx,
                                           cudaStream_t stream, const spconv__hash_table *table,
                                           const uint64_t *keys, int64_t n, int64_t *repeated);

#endif /* SPCONV_CUDA_MAPS_COMMON_H */
