/* Host emulation of the part of the CUDA runtime that the CUDA backend uses, so that the same
 * .cu sources of cuda/, compiled by the host C++ compiler (-DSPCONV_CUDA_EMULATION=ON), execute
 * their kernels on the CPU where CI has no GPU, and the CUDA tests compare them with the CPU
 * backend. docs/cuda.md says what this can and cannot show.
 *
 * The model: one device ("host emulation", no GPU); device memory is kept from the host's code
 * (mappings of their own, open only while the device's work runs: cuda_runtime.cpp, "the memory
 * model"), registered so that transfers, frees and kernel arguments that are not device memory
 * fail as they would on a GPU.
 * Work queued on a stream (kernels, copies, memsets, cuBLAS products, event records, waits) is
 * checked when it is queued and *run as late as CUDA allows*: when the host waits for it
 * (cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize, a blocking copy to the
 * host, cudaFree, a Thrust call on the stream) or when work it must precede is run. So a host that
 * reads a result it did not wait for reads stale bytes here too (a device-to-host copy fills its
 * destination with 0xa5 bytes until it runs), and work on one stream that uses what another
 * stream makes without an event wait runs before it. Setting SPCONV_CUDA_EMULATION_STREAMS=eager
 * runs work when it is queued instead (for debugging).
 *
 * A kernel runs every thread of every block on the calling thread, one thread after another, in
 * the order SPCONV_CUDA_EMULATION_SCHEDULE names: `forward` (the default: blocks and threads in
 * index order), `reverse`, or `shuffle:SEED` (a different scrambled order every launch, the same
 * orders again for the same seed). A GPU runs threads in any order, so a kernel whose result
 * depends on the order is wrong, and the other orders show it.
 *
 * What a kernel may use here: the built-in indices, atomics (real atomics, GCC __atomic builtins,
 * relaxed like CUDA's), and any __host__ __device__ code. Deliberately absent, so that a kernel
 * needing them fails to compile here instead of computing something wrong: __syncthreads and
 * __shared__ (threads of a block run one after the other, so a barrier cannot be honoured),
 * warp intrinsics (__shfl_*, __ballot_sync, ...), texture and surface objects. Code behind
 * `#ifdef __CUDA_ARCH__` is device-only and is not compiled here (neither __CUDA_ARCH__ nor
 * __CUDACC__ is defined: system and library headers take them to mean nvcc). Keep such kernels'
 * per-element logic in __host__ __device__ functions, which this build does run.
 *
 * Names and numeric values of the enums follow the CUDA runtime's public headers, so the backend
 * compiles unchanged; only what the backend calls is declared. */
#ifndef SPCONV_CUDA_EMULATION_CUDA_RUNTIME_H
#define SPCONV_CUDA_EMULATION_CUDA_RUNTIME_H

#ifdef __CUDACC__
#error "cuda/emulation/ is the host emulation of the CUDA runtime; nvcc builds use the real one"
#endif

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

/* ---- execution space qualifiers: everything runs on the host ------------------------------- */

#define __global__
#define __device__
#define __host__
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __launch_bounds__(...)
/* __restrict__ is a keyword of g++ and clang++ already. */

/* ---- errors -------------------------------------------------------------------------------- */

enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
};
typedef enum cudaError cudaError_t;

/* The runtime keeps the first error of a failed call as the calling thread's "last error" until
 * cudaGetLastError reads it; kernel launches report only there. */
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorName(cudaError_t error);
const char *cudaGetErrorString(cudaError_t error);

/* ---- the device ---------------------------------------------------------------------------- */

enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxBlockDimX = 2,
    cudaDevAttrMaxBlockDimY = 3,
    cudaDevAttrMaxBlockDimZ = 4,
    cudaDevAttrMaxGridDimX = 5,
    cudaDevAttrMaxGridDimY = 6,
    cudaDevAttrMaxGridDimZ = 7,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrWarpSize = 10,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrMaxThreadsPerMultiProcessor = 39,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrMemoryPoolsSupported = 115,
    cudaDevAttrComputeCapabilityMinor = 76,
};

/* The fields the backend may read; a real cudaDeviceProp has many more. */
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int multiProcessorCount;
    int maxThreadsPerMultiProcessor;
    int major, minor;
};

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceSynchronize(void);

/* ---- memory -------------------------------------------------------------------------------- */

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

/* Device memory is 256-byte aligned (as cudaMalloc aligns), out of the host's reach outside the
 * device's work, no more of it than the host has (a request beyond that fails as it would on a
 * GPU, instead of reaching the host allocator). */
cudaError_t cudaMalloc(void **ptr, size_t size);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);

/* ---- streams and events -------------------------------------------------------------------- */

typedef struct spconv__emu_stream *cudaStream_t;
typedef struct spconv__emu_event *cudaEvent_t;
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)

cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamGetFlags(cudaStream_t stream, unsigned int *flags);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags = 0);

cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

/* As the runtime documents them for pageable host memory: a copy from the host reads its source
 * when it is called (the staging copy), so the caller may reuse that buffer at once; a copy to the
 * host writes its destination only when it runs, which cudaMemcpy waits for and cudaMemcpyAsync
 * does not; device-to-device copies and memsets are queued (cudaMemcpy and cudaMemset included,
 * which do not wait for those either). Host to host is a plain copy at once. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream = 0);
cudaError_t cudaMemset(void *dst, int value, size_t count);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t count, cudaStream_t stream = 0);

/* ---- stream-ordered memory (memory pools) -------------------------------------------------- */
/* A pool hands out device memory at once (usable by work queued after the call on its stream)
 * and takes it back when the freeing stream reaches cudaFreeAsync: the block is then filled with
 * 0xfe bytes and freed, so work that reads it after its free, in stream order, reads garbage here
 * as it may on a GPU. Only the fields and attributes the backend sets are modelled; a pool keeps
 * nothing cached (trimming has nothing to do). */
typedef struct spconv__emu_mem_pool *cudaMemPool_t;
enum cudaMemAllocationType { cudaMemAllocationTypeInvalid = 0, cudaMemAllocationTypePinned = 1 };
enum cudaMemAllocationHandleType { cudaMemHandleTypeNone = 0 };
enum cudaMemLocationType { cudaMemLocationTypeInvalid = 0, cudaMemLocationTypeDevice = 1 };
struct cudaMemLocation {
    enum cudaMemLocationType type;
    int id;
};
struct cudaMemPoolProps {
    enum cudaMemAllocationType allocType;
    enum cudaMemAllocationHandleType handleTypes;
    struct cudaMemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
};
enum cudaMemPoolAttr {
    cudaMemPoolReuseFollowEventDependencies = 0x1,
    cudaMemPoolReuseAllowOpportunistic = 0x2,
    cudaMemPoolReuseAllowInternalDependencies = 0x3,
    cudaMemPoolAttrReleaseThreshold = 0x4,
};

cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool, const struct cudaMemPoolProps *props);
cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool);
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value);
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t min_bytes_to_keep);
cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t pool,
                                    cudaStream_t stream);
cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream);

/* Emulation only: how many times the host has waited for the device so far (stream, event and
 * device synchronisation, cudaFree, a cudaMemcpy, a device-to-host cudaMemcpyAsync, which waits
 * for the copy on a GPU when its destination is pageable). Thrust calls are not counted: they run
 * queued work here only because the emulation runs them on the host. */
extern "C" unsigned long long spconv__cuda_emulation_host_waits(void);

/* Emulation only: how much work has been queued on streams so far, counted as a GPU pays a launch
 * for it: kernels, cuBLAS products, memsets and copies (not event records, stream waits or
 * frees). Tests bound an op's launches with it; the GPU's cost per launch is what it bounds. */
extern "C" unsigned long long spconv__cuda_emulation_launches(void);

/* ---- built-in variables -------------------------------------------------------------------- */

struct uint3 {
    unsigned int x, y, z;
};

struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
        : x(vx), y(vy), z(vz) {}
};

namespace spconv__emu {

/* Where the calling host thread is in the grid it is running; set by launch() below. */
struct thread_position {
    uint3 thread_idx, block_idx;
    dim3 block_dim, grid_dim;
};
inline thread_local thread_position position;

} // namespace spconv__emu

/* Read-only, as on the GPU: a kernel that assigns to them does not compile. */
#define threadIdx (static_cast<const uint3 &>(spconv__emu::position.thread_idx))
#define blockIdx (static_cast<const uint3 &>(spconv__emu::position.block_idx))
#define blockDim (static_cast<const dim3 &>(spconv__emu::position.block_dim))
#define gridDim (static_cast<const dim3 &>(spconv__emu::position.grid_dim))

/* ---- atomics ------------------------------------------------------------------------------- */
/* Relaxed, as CUDA's atomic* functions are (no ordering beyond the one location). The
 * floating-point add and the integer min/max have no __atomic builtin in GCC: they are
 * compare-and-swap loops over the value's bits, which end because each failed exchange means
 * another thread changed the value. */

namespace spconv__emu {

/* The generic (not _n) builtins, which also take a float. */
template <typename T> inline T atomic_exchange(T *address, T value) {
    T old;
    __atomic_exchange(address, &value, &old, __ATOMIC_RELAXED);
    return old;
}

template <typename T> inline T atomic_compare_swap(T *address, T compare, T value) {
    __atomic_compare_exchange(address, &compare, &value, false, __ATOMIC_RELAXED,
                              __ATOMIC_RELAXED);
    return compare; /* the old value either way */
}

template <typename T, typename Combine> inline T atomic_update(T *address, Combine combine) {
    T seen = __atomic_load_n(address, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(address, &seen, combine(seen), true, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
    }
    return seen;
}

/* A floating-point add on the bits of *address: Bits is the unsigned integer of Float's size. */
template <typename Float, typename Bits>
inline Float atomic_add_floating(Float *address, Float value) {
    static_assert(sizeof(Float) == sizeof(Bits), "Bits must hold a Float");
    Bits *bits = reinterpret_cast<Bits *>(address);
    Bits old = atomic_update(bits, [value](Bits seen) {
        Float sum;
        memcpy(&sum, &seen, sizeof sum);
        sum += value;
        Bits out;
        memcpy(&out, &sum, sizeof out);
        return out;
    });
    Float result;
    memcpy(&result, &old, sizeof result);
    return result;
}

} // namespace spconv__emu

#define SPCONV__EMU_INTEGER_ATOMICS(T)                                                          \
    inline T atomicAdd(T *address, T value) {                                                  \
        return __atomic_fetch_add(address, value, __ATOMIC_RELAXED);                           \
    }                                                                                          \
    inline T atomicSub(T *address, T value) {                                                  \
        return __atomic_fetch_sub(address, value, __ATOMIC_RELAXED);                           \
    }                                                                                          \
    inline T atomicAnd(T *address, T value) {                                                  \
        return __atomic_fetch_and(address, value, __ATOMIC_RELAXED);                           \
    }                                                                                          \
    inline T atomicOr(T *address, T value) {                                                   \
        return __atomic_fetch_or(address, value, __ATOMIC_RELAXED);                            \
    }                                                                                          \
    inline T atomicExch(T *address, T value) {                                                 \
        return spconv__emu::atomic_exchange(address, value);                                   \
    }                                                                                          \
    inline T atomicCAS(T *address, T compare, T value) {                                       \
        return spconv__emu::atomic_compare_swap(address, compare, value);                      \
    }                                                                                          \
    inline T atomicMin(T *address, T value) {                                                  \
        return spconv__emu::atomic_update(address, [value](T seen) {                           \
            return value < seen ? value : seen;                                                \
        });                                                                                    \
    }                                                                                          \
    inline T atomicMax(T *address, T value) {                                                  \
        return spconv__emu::atomic_update(address, [value](T seen) {                           \
            return value > seen ? value : seen;                                                \
        });                                                                                    \
    }

/* The integer types CUDA's atomics take. */
SPCONV__EMU_INTEGER_ATOMICS(int)
SPCONV__EMU_INTEGER_ATOMICS(unsigned int)
SPCONV__EMU_INTEGER_ATOMICS(long long)
SPCONV__EMU_INTEGER_ATOMICS(unsigned long long)
#undef SPCONV__EMU_INTEGER_ATOMICS

inline float atomicAdd(float *address, float value) {
    return spconv__emu::atomic_add_floating<float, uint32_t>(address, value);
}
inline double atomicAdd(double *address, double value) {
    return spconv__emu::atomic_add_floating<double, uint64_t>(address, value);
}
inline float atomicExch(float *address, float value) {
    return spconv__emu::atomic_exchange(address, value);
}

/* ---- kernel launches (used through SPCONV_CUDA_LAUNCH in cuda/launch.h) ------------------- */

namespace spconv__emu {

/* Checks a launch as the runtime does (a block of 1 .. 1024 threads within the block-dimension
 * limits, a grid within the grid limits, dynamic shared memory within the limit, a live stream);
 * on failure records cudaErrorInvalidConfiguration (or cudaErrorInvalidResourceHandle) as the last
 * error and returns false, and the kernel does not run. */
bool launch_allowed(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream);

/* Device memory is open to the host thread's code only inside a device access scope (the
 * separate memory model, cuda_runtime.cpp): queued work runs in one, and so does a Thrust
 * algorithm, which the emulation runs on the host. */
void device_access_begin();
void device_access_end();
struct device_access {
    device_access() { device_access_begin(); }
    ~device_access() { device_access_end(); }
    device_access(const device_access &) = delete;
    device_access &operator=(const device_access &) = delete;
};

/* Aborts, naming @p kernel, argument @p index and what is wrong, unless @p pointer is NULL or
 * points into (or just past) a device allocation: a kernel given host memory faults on a GPU. */
void check_kernel_pointer(const char *kernel, int index, const void *pointer);

template <typename T> inline void check_kernel_argument(const char *, int, const T &) {}
template <typename T> inline void check_kernel_argument(const char *kernel, int index, T *pointer) {
    check_kernel_pointer(kernel, index, (const void *)pointer);
}

/* Counts one launch (spconv__cuda_emulation_launches). */
void count_launch();

/* Queues @p work on @p stream (NULL is the legacy default stream), after the work the stream
 * must wait for, as the runtime orders it; run now in the eager mode. */
void enqueue(cudaStream_t stream, std::function<void()> work);

/* Runs everything queued on @p stream and what it waits for: the host waits for the stream, as
 * Thrust's CUDA system does around each algorithm on it. */
void run_queued(cudaStream_t stream);

/* Runs @p thread once for every thread of a grid x block launch, with the built-in indices set,
 * in the order of SPCONV_CUDA_EMULATION_SCHEDULE. */
void run_grid(dim3 grid, dim3 block, const std::function<void()> &thread);

/* Queues @p kernel (called @p name in messages) as a grid of grid x block threads on @p stream,
 * each thread with its own copy of the arguments (which, as on a GPU, are converted to the
 * parameter types once, at the launch, and whose pointers must be device memory). */
template <typename... Params, typename... Args>
void launch(const char *name, void (*kernel)(Params...), dim3 grid, dim3 block,
            size_t shared_bytes, cudaStream_t stream, Args &&...args) {
    static_assert(sizeof...(Params) == sizeof...(Args), "kernel launched with the wrong arity");
    if (!launch_allowed(grid, block, shared_bytes, stream)) return;
    count_launch();
    std::tuple<std::decay_t<Params>...> parameters(std::forward<Args>(args)...);
    std::apply([name](const auto &...value) {
        int index = 0;
        (check_kernel_argument(name, index++, value), ...);
    }, parameters);
    enqueue(stream, [kernel, grid, block, parameters]() {
        run_grid(grid, block, [&]() { std::apply(kernel, parameters); });
    });
}

} // namespace spconv__emu

#endif /* SPCONV_CUDA_EMULATION_CUDA_RUNTIME_H */
