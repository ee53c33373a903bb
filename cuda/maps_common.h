/* What the map builders of the CUDA backend (voxelize.cu, rulebook.cu) share: scratch arrays on
 * the device, the Thrust execution policy of a stream, grid sizes of grid-stride launches, and
 * filling an open-addressing table of packed 64-bit keys with a checked capacity.
 *
 * Thrust (SPCONV_THRUST): under nvcc the CUDA system on the context's stream without a host wait
 * where none is needed (thrust::cuda::par_nosync), in the host emulation its CPP system on the
 * calling thread (CMake defines THRUST_DEVICE_SYSTEM there) after the work queued on the stream
 * has run: one order the GPU may take, though not the latest (docs/cuda.md says what that leaves
 * unchecked). Either way its temporary storage
 * comes from the call's context, as the builders' own arrays do, and whatever it throws comes back
 * as a status: an exception never crosses into C. */
#ifndef SPCONV_CUDA_MAPS_COMMON_H
#define SPCONV_CUDA_MAPS_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <exception>
#include <new>
#include <vector>

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

/* Threads per block of the map kernels (all grid-stride loops). */
#define SPCONV_CUDA_MAP_THREADS 256

/* A device array of n elements on the current device that frees itself. Its memory comes from
 * the call's context (its allocator hook when it has one and the current device is its device,
 * the backend's stream-ordered pool otherwise: context.h, backend.cu); alloc() reports failure as a status naming @p what. Copying is
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

/* Thrust's temporary storage for one algorithm, from the call's context: its allocator hook
 * when it has one for the current device (stream-ordered, context.h, so it may be handed back
 * before the algorithm's kernels are done), the backend's stream-ordered pool otherwise (or
 * cudaMalloc, whose cudaFree waits for the device, for a context on a caller's stream). A request that fails is remembered and thrown as std::bad_alloc, which
 * spconv__thrust_run turns back into its status; whatever Thrust does not hand back is freed at
 * the end. */
class spconv__thrust_scratch {
public:
    typedef char value_type;

    spconv__thrust_scratch(const spconv_context *ctx, const char *func) : ctx_(ctx), func_(func) {}
    spconv__thrust_scratch(const spconv__thrust_scratch &) = delete;
    spconv__thrust_scratch &operator=(const spconv__thrust_scratch &) = delete;
    ~spconv__thrust_scratch() {
        for (const spconv__allocation &a : live_) spconv__context_free(&a);
    }

    char *allocate(std::ptrdiff_t n) {
        int device = 0;
        const cudaError_t err = cudaGetDevice(&device);
        if (err != cudaSuccess) {
            (void)cudaGetLastError();
            failure_ = spconv__error(SPCONV_ERR_CUDA, "%s: no current CUDA device: %s", func_,
                                     cudaGetErrorString(err));
            throw std::bad_alloc();
        }
        live_.reserve(live_.size() + 1); /* may throw, before anything is allocated */
        spconv__allocation a = {};
        failure_ = spconv__context_alloc(func_, ctx_, spconv_cuda(device),
                                         (size_t)(n > 0 ? n : 1), &a);
        if (failure_ != SPCONV_OK) throw std::bad_alloc();
        live_.push_back(a);
        return (char *)a.data;
    }

    void deallocate(char *p, size_t) {
        for (size_t i = 0; i < live_.size(); ++i)
            if (live_[i].data == p) {
                spconv__context_free(&live_[i]);
                live_.erase(live_.begin() + (std::ptrdiff_t)i);
                return;
            }
    }

    spconv_status failure() const { return failure_; }

private:
    const spconv_context *ctx_;
    const char *func_;
    std::vector<spconv__allocation> live_;
    spconv_status failure_ = SPCONV_OK;
};

#if SPCONV_CUDA_EMULATION
#define SPCONV__THRUST_POLICY(scratch, stream)                                                   \
    (spconv__emu::run_queued(stream), thrust::cpp::par(scratch))
#else
#define SPCONV__THRUST_POLICY(scratch, stream) thrust::cuda::par_nosync(scratch).on(stream)
#endif

/* Runs algorithm(policy) with a policy on @p stream whose temporary storage comes from @p ctx;
 * what it throws becomes a status naming @p func and @p what (the step). */
template <typename Algorithm>
static inline spconv_status spconv__thrust_run(const spconv_context *ctx, const char *func,
                                               cudaStream_t stream, const char *what,
                                               Algorithm &&algorithm) {
    spconv__thrust_scratch scratch(ctx, func);
    try {
#if SPCONV_CUDA_EMULATION
        spconv__emu::device_access scope; /* the host runs the algorithm on device memory here */
#endif
        algorithm(SPCONV__THRUST_POLICY(scratch, stream));
    } catch (const std::bad_alloc &) {
        if (scratch.failure() == SPCONV_OK)
            return spconv__error(SPCONV_ERR_OUT_OF_MEMORY, "%s: out of host memory while %s", func,
                                 what);
        char detail[320];
        snprintf(detail, sizeof detail, "%s", spconv_last_error());
        return spconv__error(scratch.failure(), "%s (while %s)", detail, what);
    } catch (const std::exception &e) {
        (void)cudaGetLastError();
        return spconv__error(SPCONV_ERR_CUDA, "%s: %s failed: %s", func, what, e.what());
    } catch (...) {
        (void)cudaGetLastError();
        return spconv__error(SPCONV_ERR_CUDA, "%s: %s failed (an unknown exception)", func, what);
    }
    return SPCONV_OK;
}

/* One Thrust algorithm on the call's stream with the context's memory, as a status:
 * SPCONV_THRUST(ctx, func, stream, "sorting the keys", thrust::sort_by_key, k, k + n, v). */
#define SPCONV_THRUST(ctx, func, stream, what, algorithm, ...)                                  \
    spconv__thrust_run((ctx), (func), (stream), (what),                                          \
                       [&](const auto &policy) { algorithm(policy, __VA_ARGS__); })

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

#if SPCONV_CUDA_EMULATION
/* The emulation's launch check (cuda_runtime.h) sees through a table passed by value: its slots
 * must be device memory. Found by argument-dependent lookup. */
inline void check_kernel_argument(const char *kernel, int index, const spconv__hash_table &t) {
    spconv__emu::check_kernel_pointer(kernel, index, t.slots);
}
#endif

/* A device hash table of the layout of rulebook/hash.h: @p capacity slots (a power of two), the
 * host's seed, every slot free (key SPCONV_HASH_EMPTY, value INT32_MAX). Its slots, and the
 * counters of an insert, come from @p ctx's allocator (NULL: the backend's pool). */
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

/* Queue the insert of keys[i] -> i for every i < n (and i < *limit, a device value, unless
 * limit is NULL) with keys[i] != SPCONV_HASH_EMPTY, adding to the device counters [2] (zeroed
 * by the caller): [0] inserts that found no free slot, [1] inserts of a key already there. No
 * wait: the caller reads the counters when it reads anything else. */
spconv_status spconv__cuda_hash_insert_queued(cudaStream_t stream, const spconv__hash_table *table,
                                              const uint64_t *keys, int64_t n,
                                              const unsigned long long *limit,
                                              unsigned long long *counters);

#endif /* SPCONV_CUDA_MAPS_COMMON_H */
