/* The host emulation of the CUDA runtime (cuda_runtime.h says what it models). Like the real
 * runtime it keeps process-wide state: the device allocations, the live streams and events. That
 * state is what lets a wrong pointer or a dead handle fail here as it would on a GPU, instead of
 * working by accident because everything is host memory. */
#include "cuda_runtime.h"

#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <mutex>
#include <set>

struct spconv__emu_stream {
    unsigned int flags;
};

struct spconv__emu_event {
    bool recorded;
    std::chrono::steady_clock::time_point when;
};

namespace {

/* The emulated device's limits: those of current NVIDIA GPUs where a launch can exceed them, and
 * one multiprocessor, honestly, since the blocks run one after the other; grid-stride loops
 * then launch a few blocks and loop, which keeps the emulation fast. */
constexpr int max_threads_per_block = 1024;
constexpr int max_block_dim[3] = {1024, 1024, 64};
constexpr int max_grid_dim[3] = {2147483647, 65535, 65535};
constexpr size_t max_shared_bytes_per_block = 48 * 1024;
constexpr int multiprocessors = 1;
constexpr int max_threads_per_multiprocessor = 2048;
constexpr size_t device_alignment = 256;

thread_local cudaError_t last_error = cudaSuccess;
thread_local int current_device = 0;

/* The result of every call goes through here: an error also becomes the thread's last error
 * (the first one stays until read, as in the runtime). */
cudaError_t record(cudaError_t error) {
    if (error != cudaSuccess && last_error == cudaSuccess) last_error = error;
    return error;
}

struct runtime_state {
    std::mutex mutex;
    std::map<uintptr_t, size_t> allocations; /* base address -> bytes asked for */
    std::set<cudaStream_t> streams;
    std::set<cudaEvent_t> events;
};

runtime_state &state() {
    static runtime_state the_state; /* built on first use, so static initialisation order is moot */
    return the_state;
}

size_t host_bytes(int pages_name) {
    long pages = sysconf(pages_name), page_size = sysconf(_SC_PAGESIZE);
    return pages > 0 && page_size > 0 ? (size_t)pages * (size_t)page_size : 0;
}

/* Whether [ptr, ptr + count) lies inside one device allocation. */
bool is_device_range(const void *ptr, size_t count) {
    uintptr_t begin = (uintptr_t)ptr;
    runtime_state &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    auto after = s.allocations.upper_bound(begin);
    if (after == s.allocations.begin()) return false;
    auto at = std::prev(after);
    return begin - at->first <= at->second && count <= at->second - (begin - at->first);
}

/* The legacy and per-thread default streams always exist; others from creation to destruction. */
bool is_live_stream(cudaStream_t stream) {
    if (stream == NULL || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return true;
    runtime_state &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    return s.streams.count(stream) != 0;
}

bool is_live_event(cudaEvent_t event) {
    runtime_state &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    return event != NULL && s.events.count(event) != 0;
}

/* Which sides of a copy must be device memory, from its kind. cudaMemcpyDefault and host to host
 * accept any pointers (with unified addressing the runtime looks them up itself). */
bool copy_sides_valid(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    switch (kind) {
    case cudaMemcpyHostToHost:
    case cudaMemcpyDefault: return true;
    case cudaMemcpyHostToDevice: return is_device_range(dst, count);
    case cudaMemcpyDeviceToHost: return is_device_range(src, count);
    case cudaMemcpyDeviceToDevice:
        return is_device_range(dst, count) && is_device_range(src, count);
    }
    return false;
}

} // namespace

/* ---- errors -------------------------------------------------------------------------------- */

cudaError_t cudaGetLastError(void) {
    cudaError_t error = last_error;
    last_error = cudaSuccess;
    return error;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char *cudaGetErrorName(cudaError_t error) {
    switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t error) {
    switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    }
    return "unknown error";
}

/* ---- the device ---------------------------------------------------------------------------- */

cudaError_t cudaGetDeviceCount(int *count) {
    if (count == NULL) return record(cudaErrorInvalidValue);
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    if (device == NULL) return record(cudaErrorInvalidValue);
    *device = current_device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    if (device != 0) return record(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (prop == NULL) return record(cudaErrorInvalidValue);
    if (device != 0) return record(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    /* Compute capability 0.0: no GPU architecture's features may be assumed. */
    strncpy(prop->name, "spconv host emulation (no GPU: kernels run on the CPU)",
            sizeof prop->name - 1);
    prop->totalGlobalMem = host_bytes(_SC_PHYS_PAGES);
    prop->sharedMemPerBlock = max_shared_bytes_per_block;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = max_threads_per_block;
    for (int d = 0; d < 3; ++d) {
        prop->maxThreadsDim[d] = max_block_dim[d];
        prop->maxGridSize[d] = max_grid_dim[d];
    }
    prop->multiProcessorCount = multiprocessors;
    prop->maxThreadsPerMultiProcessor = max_threads_per_multiprocessor;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
    if (value == NULL) return record(cudaErrorInvalidValue);
    struct cudaDeviceProp prop;
    cudaError_t error = cudaGetDeviceProperties(&prop, device);
    if (error != cudaSuccess) return error;
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = prop.maxThreadsPerBlock; break;
    case cudaDevAttrMaxBlockDimX: *value = prop.maxThreadsDim[0]; break;
    case cudaDevAttrMaxBlockDimY: *value = prop.maxThreadsDim[1]; break;
    case cudaDevAttrMaxBlockDimZ: *value = prop.maxThreadsDim[2]; break;
    case cudaDevAttrMaxGridDimX: *value = prop.maxGridSize[0]; break;
    case cudaDevAttrMaxGridDimY: *value = prop.maxGridSize[1]; break;
    case cudaDevAttrMaxGridDimZ: *value = prop.maxGridSize[2]; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)prop.sharedMemPerBlock; break;
    case cudaDevAttrWarpSize: *value = prop.warpSize; break;
    case cudaDevAttrMultiProcessorCount: *value = prop.multiProcessorCount; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = prop.maxThreadsPerMultiProcessor; break;
    case cudaDevAttrComputeCapabilityMajor: *value = prop.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = prop.minor; break;
    default: return record(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

/* ---- memory -------------------------------------------------------------------------------- */

cudaError_t cudaMalloc(void **ptr, size_t size) {
    if (ptr == NULL) return record(cudaErrorInvalidValue);
    *ptr = NULL;
    if (size == 0) return cudaSuccess;
    if (size > host_bytes(_SC_PHYS_PAGES)) return record(cudaErrorMemoryAllocation);
    size_t rounded = (size + device_alignment - 1) / device_alignment * device_alignment;
    void *memory = aligned_alloc(device_alignment, rounded);
    if (memory == NULL) return record(cudaErrorMemoryAllocation);
    runtime_state &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.allocations[(uintptr_t)memory] = size;
    *ptr = memory;
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr) {
    if (ptr == NULL) return cudaSuccess;
    {
        runtime_state &s = state();
        std::lock_guard<std::mutex> lock(s.mutex);
        if (s.allocations.erase((uintptr_t)ptr) == 0) return record(cudaErrorInvalidValue);
    }
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    if (free_bytes == NULL || total_bytes == NULL) return record(cudaErrorInvalidValue);
    *free_bytes = host_bytes(_SC_AVPHYS_PAGES);
    *total_bytes = host_bytes(_SC_PHYS_PAGES);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
    if (!is_live_stream(stream)) return record(cudaErrorInvalidResourceHandle);
    if (count == 0) return cudaSuccess;
    if (dst == NULL || src == NULL || !copy_sides_valid(dst, src, count, kind))
        return record(cudaErrorInvalidValue);
    /* memcpy, not memmove: overlapping ranges are undefined for cudaMemcpy too, and the
     * sanitizer build then says so. */
    memcpy(dst, src, count);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    return cudaMemcpyAsync(dst, src, count, kind, cudaStreamLegacy);
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t count, cudaStream_t stream) {
    if (!is_live_stream(stream)) return record(cudaErrorInvalidResourceHandle);
    if (count == 0) return cudaSuccess;
    if (!is_device_range(dst, count)) return record(cudaErrorInvalidValue);
    memset(dst, value, count);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *dst, int value, size_t count) {
    return cudaMemsetAsync(dst, value, count, cudaStreamLegacy);
}

/* ---- streams ------------------------------------------------------------------------------- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
    if (stream == NULL || (flags & ~(unsigned int)cudaStreamNonBlocking) != 0)
        return record(cudaErrorInvalidValue);
    cudaStream_t created = new spconv__emu_stream{flags};
    runtime_state &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.streams.insert(created);
    *stream = created;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) {
    return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    {
        runtime_state &s = state();
        std::lock_guard<std::mutex> lock(s.mutex);
        if (stream == NULL || s.streams.erase(stream) == 0)
            return record(cudaErrorInvalidResourceHandle);
    }
    delete stream;
    return cudaSuccess;
}

/* Work finished when it was queued, so a live stream is always idle. */
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    return is_live_stream(stream) ? cudaSuccess : record(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaStreamQuery(cudaStream_t stream) { return cudaStreamSynchronize(stream); }

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    if (!is_live_stream(stream) || !is_live_event(event))
        return record(cudaErrorInvalidResourceHandle);
    return flags == 0 ? cudaSuccess : record(cudaErrorInvalidValue);
}

/* ---- events -------------------------------------------------------------------------------- */

cudaError_t cudaEventCreate(cudaEvent_t *event) {
    if (event == NULL) return record(cudaErrorInvalidValue);
    cudaEvent_t created = new spconv__emu_event{false, {}};
    runtime_state &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.events.insert(created);
    *event = created;
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    {
        runtime_state &s = state();
        std::lock_guard<std::mutex> lock(s.mutex);
        if (event == NULL || s.events.erase(event) == 0)
            return record(cudaErrorInvalidResourceHandle);
    }
    delete event;
    return cudaSuccess;
}

/* The stream's earlier work is done, so the event is reached now: elapsed times between events
 * are the host time the emulated work took. */
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    if (!is_live_event(event) || !is_live_stream(stream))
        return record(cudaErrorInvalidResourceHandle);
    event->recorded = true;
    event->when = std::chrono::steady_clock::now();
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    return is_live_event(event) ? cudaSuccess : record(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventQuery(cudaEvent_t event) { return cudaEventSynchronize(event); }

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (ms == NULL) return record(cudaErrorInvalidValue);
    if (!is_live_event(start) || !is_live_event(end) || !start->recorded || !end->recorded)
        return record(cudaErrorInvalidResourceHandle);
    *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
    return cudaSuccess;
}

/* ---- launches ------------------------------------------------------------------------------ */

bool spconv__emu::launch_allowed(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream) {
    if (!is_live_stream(stream)) {
        record(cudaErrorInvalidResourceHandle);
        return false;
    }
    const unsigned int grid_dims[3] = {grid.x, grid.y, grid.z};
    const unsigned int block_dims[3] = {block.x, block.y, block.z};
    bool valid = shared_bytes <= max_shared_bytes_per_block;
    unsigned long long threads = 1;
    for (int d = 0; d < 3; ++d) {
        valid = valid && grid_dims[d] >= 1 && grid_dims[d] <= (unsigned int)max_grid_dim[d] &&
                block_dims[d] >= 1 && block_dims[d] <= (unsigned int)max_block_dim[d];
        threads *= block_dims[d];
    }
    valid = valid && threads <= (unsigned long long)max_threads_per_block;
    if (!valid) record(cudaErrorInvalidConfiguration);
    return valid;
}
