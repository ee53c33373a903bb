/* The host emulation of the CUDA runtime (cuda_runtime.h says what it models). Like the real
 * runtime it keeps process-wide state: the device allocations, the live streams and events. That
 * state is what lets a wrong pointer or a dead handle fail here as it would on a GPU, instead of
 * working by accident because everything is host memory. */
#include "cuda_runtime.h"

#include <execinfo.h>
#include <sanitizer/asan_interface.h> /* ASAN_(UN)POISON_MEMORY_REGION: no-ops without ASan */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

/* A stream's queue: work[k] is the (done + k + 1)-th item ever queued on it. Ids are never
 * reused, so a wait on a destroyed stream (whose work all ran when it was destroyed) is seen to
 * be satisfied, even when a new stream has its address. */
struct spconv__emu_stream {
    unsigned int flags;
    uint64_t id;
    std::deque<std::function<void()>> work;
    uint64_t queued = 0, done = 0;
    bool running = false;
    bool destroyed = false; /* by cudaStreamDestroy: freed once its queued work has run */
};

/* The record that completes the event: (stream id, its item count after the record); 0 when it
 * was never recorded. Destroying an event whose record is still queued frees it when the record
 * runs, as the runtime does. */
struct spconv__emu_event {
    bool recorded;
    std::chrono::steady_clock::time_point when;
    uint64_t stream_id = 0, item = 0;
    int records_queued = 0;
    uint64_t generation = 0; /* of the latest record: only it completes the event */
    bool destroyed = false;
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

/* spconv__cuda_emulation_host_waits */
std::atomic<unsigned long long> host_waits{0};
void count_host_wait() { host_waits.fetch_add(1, std::memory_order_relaxed); }

/* spconv__cuda_emulation_launches */
std::atomic<unsigned long long> launches{0};

/* The result of every call goes through here: an error also becomes the thread's last error
 * (the first one stays until read, as in the runtime). */
cudaError_t record(cudaError_t error) {
    if (error != cudaSuccess && last_error == cudaSuccess) last_error = error;
    return error;
}

/* A device allocation. In the separate memory model (the default) it is a mapping of its own:
 * [map, map + mapped) holds the block at its end, followed by one page that is never accessible,
 * so a read or write past the block's 256-byte rounding faults; the block's pages are accessible
 * only while the device runs (device_access below). Under ASan the bytes before the block and
 * after its size are poisoned as well. A freed mapping is kept inaccessible for a while (the
 * quarantine), so that a use after the free faults and is named instead of reaching whatever the
 * address holds next. In the shared model a block is aligned_alloc'd. */
struct allocation {
    size_t bytes;         /* asked for */
    void *map;            /* the mapping (separate model), or NULL */
    size_t mapped;        /* the mapping's bytes, guard page included */
    bool freeing = false; /* cudaFreeAsync was called: no longer usable by later work */
};

/* Freed mappings kept inaccessible (their pages given back to the system), oldest first. */
constexpr size_t quarantine_mappings = 4096;

struct runtime_state {
    std::mutex mutex;
    std::map<uintptr_t, allocation> allocations; /* by base address */
    std::map<uintptr_t, allocation> quarantine;  /* freed, by base address */
    std::deque<uintptr_t> quarantine_order;
    std::set<cudaStream_t> streams;
    std::set<cudaEvent_t> events;
    int device_depth = 0; /* device_access scopes open: the blocks are accessible while > 0 */
};

/* ---- queued work ----------------------------------------------------------------------------
 * One lock for every queue, held while work runs (work queued from several host threads runs one
 * item at a time); recursive, since running an item that waits runs other streams' items. The
 * legacy default stream and the per-thread default stream (one for the whole process here) are
 * blocking streams that always exist. */
struct queue_state {
    std::recursive_mutex mutex;
    spconv__emu_stream legacy{cudaStreamDefault, 1, {}, 0, 0, false};
    spconv__emu_stream per_thread{cudaStreamDefault, 2, {}, 0, 0, false};
    std::map<uint64_t, spconv__emu_stream *> by_id{{1, &legacy}, {2, &per_thread}};
    uint64_t next_id = 3;
    bool eager = false;
};

queue_state &queues() {
    static queue_state *the_queues = [] {
        queue_state *q = new queue_state; /* never destroyed: work may be queued at exit */
        const char *mode = getenv("SPCONV_CUDA_EMULATION_STREAMS");
        if (mode != NULL && strcmp(mode, "eager") == 0) {
            q->eager = true;
        } else if (mode != NULL && *mode != '\0' && strcmp(mode, "deferred") != 0) {
            fprintf(stderr, "spconv CUDA emulation: SPCONV_CUDA_EMULATION_STREAMS=%s is neither "
                            "\"deferred\" nor \"eager\"\n", mode);
            exit(2);
        }
        return q;
    }();
    return *the_queues;
}

spconv__emu_stream *resolve(cudaStream_t stream) {
    queue_state &q = queues();
    if (stream == NULL || stream == cudaStreamLegacy) return &q.legacy;
    if (stream == cudaStreamPerThread) return &q.per_thread;
    return stream;
}

void run_until(spconv__emu_stream *s, uint64_t item);

/* Runs, in order, the items of stream @p id up to its @p item-th (all of them, if it is gone). */
void run_stream_until(uint64_t id, uint64_t item) {
    queue_state &q = queues();
    auto found = q.by_id.find(id);
    if (found != q.by_id.end()) run_until(found->second, item);
}

/* Runs, in order, the items of @p s up to its @p item-th. A destroyed stream is freed once its
 * work has all run, so @p s may be gone when this returns. */
void run_until(spconv__emu_stream *s, uint64_t item) {
    /* The device's memory is open to the device's work (one scope for the run, not per item). */
    std::unique_ptr<spconv__emu::device_access> scope;
    if (s->done < item && !s->work.empty()) scope.reset(new spconv__emu::device_access);
    while (s->done < item && !s->work.empty()) {
        if (s->running) {
            /* Work only ever waits for work queued before it, so this cannot happen. */
            fprintf(stderr, "spconv CUDA emulation: stream %llu waits for itself\n",
                    (unsigned long long)s->id);
            abort();
        }
        std::function<void()> next = std::move(s->work.front());
        s->work.pop_front();
        s->running = true;
        next();
        s->running = false;
        ++s->done;
    }
    if (s->destroyed && s->work.empty()) {
        queues().by_id.erase(s->id);
        delete s;
    }
}

void run_all(spconv__emu_stream *s) { run_until(s, s->queued); }

/* Every stream, destroyed ones with work left included (which are then freed). */
void run_every_stream() {
    queue_state &q = queues();
    std::vector<uint64_t> ids;
    for (const auto &entry : q.by_id) ids.push_back(entry.first);
    for (uint64_t id : ids) run_stream_until(id, UINT64_MAX);
}

/* The implicit order of the legacy default stream: its work waits for the work queued before it
 * on every blocking stream, and a blocking stream's work waits for the legacy stream's. Queued as
 * waits, so that nothing runs before it must. */
void queue_implicit_waits(spconv__emu_stream *s) {
    queue_state &q = queues();
    std::vector<std::pair<uint64_t, uint64_t>> before;
    if (s == &q.legacy) {
        for (auto &entry : q.by_id)
            if (entry.second != s && (entry.second->flags & cudaStreamNonBlocking) == 0 &&
                entry.second->queued > entry.second->done)
                before.emplace_back(entry.first, entry.second->queued);
    } else if ((s->flags & cudaStreamNonBlocking) == 0 && q.legacy.queued > q.legacy.done) {
        before.emplace_back(q.legacy.id, q.legacy.queued);
    }
    for (const auto &wait : before) {
        s->work.push_back([wait] { run_stream_until(wait.first, wait.second); });
        ++s->queued;
    }
}

void push(spconv__emu_stream *s, std::function<void()> work) {
    queue_state &q = queues();
    queue_implicit_waits(s);
    s->work.push_back(std::move(work));
    ++s->queued;
    if (q.eager) run_all(s);
}

runtime_state &state() {
    static runtime_state the_state; /* built on first use, so static initialisation order is moot */
    return the_state;
}

/* ---- the memory model --------------------------------------------------------------------
 * SPCONV_CUDA_EMULATION_MEMORY names it: `separate` (the default) keeps device memory out of the
 * host's reach, as a GPU's is: every block is a mapping of its own that only the device's work
 * (kernels, copies, memsets, cuBLAS products, Thrust algorithms) may read or write, and a host
 * access faults with a message that names the allocation; its pages start filled with 0xff bytes
 * (a NaN in every float type), so a kernel that reads what nothing wrote computes NaNs here.
 * `shared` makes device memory plain host memory (for debugging). */
bool separate_memory() {
    static const bool separate = [] {
        const char *mode = getenv("SPCONV_CUDA_EMULATION_MEMORY");
        if (mode == NULL || *mode == '\0' || strcmp(mode, "separate") == 0) return true;
        if (strcmp(mode, "shared") == 0) return false;
        fprintf(stderr, "spconv CUDA emulation: SPCONV_CUDA_EMULATION_MEMORY=%s is neither "
                        "\"separate\" nor \"shared\"\n", mode);
        exit(2);
    }();
    return separate;
}

size_t page_bytes() {
    static const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return page;
}

/* Opens or closes a block's pages (never its guard page). */
void set_access(const allocation &a, bool accessible) {
    if (a.map == NULL) return;
    if (mprotect(a.map, a.mapped - page_bytes(), accessible ? PROT_READ | PROT_WRITE : PROT_NONE) !=
        0) {
        perror("spconv CUDA emulation: mprotect");
        abort();
    }
}

/* The fault handler of the separate model. A fault inside a device allocation's mapping (live or
 * in the quarantine) is the host touching device memory, or the device running past a block's
 * end or using a freed block: it is named with a backtrace and the process ends there (a test
 * framework's handler would jump out of the emulation's queue with its locks held). Any other
 * fault goes to the handler that was there before (ASan's, a test framework's, or the default). */
struct sigaction previous_segv;
thread_local bool in_segv_handler = false;

/* Writes @p text to stderr with write(2), which a signal handler may call. */
void say(const char *text, int len, size_t capacity) {
    if (len <= 0) return;
    ssize_t ignored = write(STDERR_FILENO, text, (size_t)len < capacity ? (size_t)len : capacity - 1);
    (void)ignored;
}

/* The message for a fault at @p at in @p a (block at @p base), or false when it is not there. */
bool describe_fault(uintptr_t at, uintptr_t base, const allocation &a, bool freed) {
    const uintptr_t map = (uintptr_t)a.map;
    if (a.map == NULL || at < map || at >= map + a.mapped) return false;
    char line[400];
    int len;
    if (freed)
        len = snprintf(line, sizeof line,
                       "spconv CUDA emulation: an access at %p uses the %zu-byte device allocation "
                       "at %p after it was freed\n", (void *)at, a.bytes, (void *)base);
    else if (at >= map + a.mapped - page_bytes())
        len = snprintf(line, sizeof line,
                       "spconv CUDA emulation: an access at %p runs past the end of the %zu-byte "
                       "device allocation at %p\n", (void *)at, a.bytes, (void *)base);
    else if (at < base)
        len = snprintf(line, sizeof line,
                       "spconv CUDA emulation: an access at %p runs before the start of the "
                       "%zu-byte device allocation at %p\n", (void *)at, a.bytes, (void *)base);
    else
        len = snprintf(line, sizeof line,
                       "spconv CUDA emulation: the host touched device memory at %p, in the "
                       "%zu-byte device allocation at %p: a GPU's memory is not the host's; copy "
                       "it to the host first\n", (void *)at, a.bytes, (void *)base);
    say(line, len, sizeof line);
    return true;
}

void on_segv(int signo, siginfo_t *info, void *context) {
    if (in_segv_handler) { /* a handler that chains back to this one: end it here */
        signal(SIGSEGV, SIG_DFL);
        return;
    }
    in_segv_handler = true;
    /* No lock: the process is failing, and the faulting thread may hold it. */
    const uintptr_t at = (uintptr_t)info->si_addr;
    bool named = false;
    for (const auto &entry : state().allocations)
        if ((named = describe_fault(at, entry.first, entry.second, false))) break;
    if (!named)
        for (const auto &entry : state().quarantine)
            if ((named = describe_fault(at, entry.first, entry.second, true))) break;
    if (named) {
        /* Where: binary and offset per frame (addr2line -e BINARY OFFSET names the line). */
        void *frames[32];
        backtrace_symbols_fd(frames, backtrace(frames, 32), STDERR_FILENO);
        signal(SIGSEGV, SIG_DFL);
        raise(SIGSEGV); /* delivered when the handler returns, if the retried access is not first */
        return;
    }
    in_segv_handler = false;
    if (previous_segv.sa_flags & SA_SIGINFO) {
        previous_segv.sa_sigaction(signo, info, context);
    } else if (previous_segv.sa_handler != SIG_DFL && previous_segv.sa_handler != SIG_IGN) {
        previous_segv.sa_handler(signo);
    } else {
        signal(SIGSEGV, SIG_DFL);
        raise(SIGSEGV);
    }
}

/* Puts on_segv in front of whatever handles SIGSEGV now, unless it is there already. Called at
 * every allocation and whenever the device's memory closes, since others replace handlers as
 * they go (CMocka installs its own around each test and puts the old one back after it, with
 * signal(), which drops SA_SIGINFO: that case is reinstalled, keeping the handler behind it).
 * on_segv is never its own previous handler. */
void ensure_segv_handler() {
    static std::mutex installing;
    static const int loaded = [] { /* backtrace() loads its library on first use: not in a handler */
        void *frame;
        return backtrace(&frame, 1);
    }();
    (void)loaded;
    std::lock_guard<std::mutex> lock(installing);
    struct sigaction current;
    if (sigaction(SIGSEGV, NULL, &current) != 0) return;
    if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_segv) return;
    const bool ours = (void *)current.sa_handler == (void *)on_segv;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_segv;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, ours ? NULL : &previous_segv);
}

size_t host_bytes(int pages_name) {
    long pages = sysconf(pages_name), page_size = sysconf(_SC_PAGESIZE);
    return pages > 0 && page_size > 0 ? (size_t)pages * (size_t)page_size : 0;
}

/* Whether [ptr, ptr + count) lies inside one device allocation that is not being freed. */
bool is_device_range(const void *ptr, size_t count) {
    uintptr_t begin = (uintptr_t)ptr;
    runtime_state &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    auto after = s.allocations.upper_bound(begin);
    if (after == s.allocations.begin()) return false;
    auto at = std::prev(after);
    if (at->second.freeing) return false;
    const size_t bytes = at->second.bytes;
    return begin - at->first <= bytes && count <= bytes - (begin - at->first);
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
    case cudaDevAttrMemoryPoolsSupported: *value = 1; break;
    default: return record(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    count_host_wait();
    std::lock_guard<std::recursive_mutex> lock(queues().mutex);
    run_every_stream();
    return cudaSuccess;
}

/* ---- memory -------------------------------------------------------------------------------- */

namespace {

/* Device memory: 256-byte aligned, registered as an allocation; in the separate model a mapping
 * of its own, filled with 0xff bytes, open only while the device runs. */
cudaError_t allocate_device(void **ptr, size_t size) {
    if (ptr == NULL) return record(cudaErrorInvalidValue);
    *ptr = NULL;
    if (size == 0) return cudaSuccess;
    if (size > host_bytes(_SC_PHYS_PAGES)) return record(cudaErrorMemoryAllocation);
    size_t rounded = (size + device_alignment - 1) / device_alignment * device_alignment;
    allocation a = {size, NULL, 0};
    void *memory = NULL;
    if (separate_memory()) {
        ensure_segv_handler();
        const size_t page = page_bytes(), body = (rounded + page - 1) / page * page;
        a.mapped = body + page;
        a.map = mmap(NULL, a.mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (a.map == MAP_FAILED) return record(cudaErrorMemoryAllocation);
        memset(a.map, 0xff, body);
        if (mprotect((char *)a.map + body, page, PROT_NONE) != 0) {
            munmap(a.map, a.mapped);
            return record(cudaErrorMemoryAllocation);
        }
        memory = (char *)a.map + body - rounded; /* the block ends where the guard page starts */
        /* under ASan, the bytes of the mapping around the block too */
        ASAN_POISON_MEMORY_REGION(a.map, body - rounded);
        ASAN_POISON_MEMORY_REGION((char *)memory + size, rounded - size);
    } else {
        memory = aligned_alloc(device_alignment, rounded);
        if (memory == NULL) return record(cudaErrorMemoryAllocation);
    }
    runtime_state &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.device_depth == 0) set_access(a, false);
    s.allocations[(uintptr_t)memory] = a;
    *ptr = memory;
    return cudaSuccess;
}

/* Forgets the allocation at @p ptr and gives its memory back (a mapping to the quarantine, whose
 * oldest one is then unmapped); false if there is none. */
bool release_device(void *ptr) {
    allocation a;
    void *evicted = NULL;
    size_t evicted_bytes = 0;
    {
        runtime_state &s = state();
        std::lock_guard<std::mutex> lock(s.mutex);
        auto found = s.allocations.find((uintptr_t)ptr);
        if (found == s.allocations.end()) return false;
        a = found->second;
        s.allocations.erase(found);
        if (a.map != NULL) {
            /* inaccessible, its pages dropped (they read as zeros if ever opened again) */
            if (mprotect(a.map, a.mapped, PROT_NONE) != 0 ||
                madvise(a.map, a.mapped, MADV_DONTNEED) != 0) {
                perror("spconv CUDA emulation: quarantining a freed block");
                abort();
            }
            s.quarantine[(uintptr_t)ptr] = a;
            s.quarantine_order.push_back((uintptr_t)ptr);
            if (s.quarantine_order.size() > quarantine_mappings) {
                auto oldest = s.quarantine.find(s.quarantine_order.front());
                s.quarantine_order.pop_front();
                evicted = oldest->second.map;
                evicted_bytes = oldest->second.mapped;
                s.quarantine.erase(oldest);
            }
        }
    }
    if (a.map == NULL) {
        free(ptr);
    } else if (evicted != NULL) {
        ASAN_UNPOISON_MEMORY_REGION(evicted, evicted_bytes);
        munmap(evicted, evicted_bytes);
    }
    return true;
}

} // namespace

/* Device access scopes nest and may be opened by several host threads: the blocks are open while
 * any is. */
void spconv__emu::device_access_begin() {
    runtime_state &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.device_depth++ == 0)
        for (const auto &entry : s.allocations) set_access(entry.second, true);
}

void spconv__emu::device_access_end() {
    runtime_state &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    if (--s.device_depth == 0) {
        for (const auto &entry : s.allocations) set_access(entry.second, false);
        if (separate_memory()) ensure_segv_handler();
    }
}

cudaError_t cudaMalloc(void **ptr, size_t size) { return allocate_device(ptr, size); }

/* cudaFree waits for the whole device first, as the runtime's does. */
cudaError_t cudaFree(void *ptr) {
    if (ptr == NULL) return cudaSuccess;
    count_host_wait();
    {
        std::lock_guard<std::recursive_mutex> lock(queues().mutex);
        run_every_stream();
    }
    {
        runtime_state &s = state();
        std::lock_guard<std::mutex> lock(s.mutex);
        auto found = s.allocations.find((uintptr_t)ptr);
        if (found == s.allocations.end() || found->second.freeing)
            return record(cudaErrorInvalidValue);
    }
    return release_device(ptr) ? cudaSuccess : record(cudaErrorInvalidValue);
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    if (free_bytes == NULL || total_bytes == NULL) return record(cudaErrorInvalidValue);
    *free_bytes = host_bytes(_SC_AVPHYS_PAGES);
    *total_bytes = host_bytes(_SC_PHYS_PAGES);
    return cudaSuccess;
}

namespace {

enum copy_direction { host_to_host, to_device_from_host, to_host_from_device, device_to_device };

copy_direction direction_of(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    switch (kind) {
    case cudaMemcpyHostToHost: return host_to_host;
    case cudaMemcpyHostToDevice: return to_device_from_host;
    case cudaMemcpyDeviceToHost: return to_host_from_device;
    case cudaMemcpyDeviceToDevice: return device_to_device;
    case cudaMemcpyDefault: break;
    }
    const bool dst_device = is_device_range(dst, count), src_device = is_device_range(src, count);
    return dst_device ? (src_device ? device_to_device : to_device_from_host)
                      : (src_device ? to_host_from_device : host_to_host);
}

/* The copy of cudaMemcpy(Async): checked now, then done as the header says. Returns the
 * direction, for cudaMemcpy's wait. */
cudaError_t queue_copy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                       cudaStream_t stream, copy_direction *direction) {
    *direction = host_to_host;
    if (!is_live_stream(stream)) return record(cudaErrorInvalidResourceHandle);
    if (count == 0) return cudaSuccess;
    if (dst == NULL || src == NULL || !copy_sides_valid(dst, src, count, kind))
        return record(cudaErrorInvalidValue);
    *direction = direction_of(dst, src, count, kind);
    if (*direction != host_to_host) spconv__emu::count_launch();
    /* memcpy, not memmove: overlapping ranges are undefined for cudaMemcpy too, and the
     * sanitizer build then says so. */
    switch (*direction) {
    case host_to_host: memcpy(dst, src, count); break;
    case to_device_from_host: {
        auto staged = std::make_shared<std::vector<unsigned char>>(
            (const unsigned char *)src, (const unsigned char *)src + count);
        spconv__emu::enqueue(stream, [dst, staged] { memcpy(dst, staged->data(), staged->size()); });
        break;
    }
    case to_host_from_device:
        /* Undefined until the copy is done: a host that reads it too early sees this. */
        memset(dst, 0xa5, count);
        spconv__emu::enqueue(stream, [dst, src, count] { memcpy(dst, src, count); });
        break;
    case device_to_device:
        spconv__emu::enqueue(stream, [dst, src, count] { memcpy(dst, src, count); });
        break;
    }
    return cudaSuccess;
}

} // namespace

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
    copy_direction direction;
    const cudaError_t error = queue_copy(dst, src, count, kind, stream, &direction);
    if (error == cudaSuccess && direction == to_host_from_device) count_host_wait();
    return error;
}

/* On the legacy default stream; a copy from the host waits for the stream's earlier work before
 * staging its source, a copy to the host makes the caller wait for the copy itself. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    count_host_wait();
    /* From pageable host memory the runtime waits for the stream before staging the source. */
    if (count > 0 && dst != NULL && src != NULL &&
        direction_of(dst, src, count, kind) == to_device_from_host)
        spconv__emu::run_queued(cudaStreamLegacy);
    copy_direction direction;
    cudaError_t error = queue_copy(dst, src, count, kind, cudaStreamLegacy, &direction);
    if (error == cudaSuccess && direction == to_host_from_device)
        spconv__emu::run_queued(cudaStreamLegacy);
    return error;
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t count, cudaStream_t stream) {
    if (!is_live_stream(stream)) return record(cudaErrorInvalidResourceHandle);
    if (count == 0) return cudaSuccess;
    if (!is_device_range(dst, count)) return record(cudaErrorInvalidValue);
    spconv__emu::count_launch();
    spconv__emu::enqueue(stream, [dst, value, count] { memset(dst, value, count); });
    return cudaSuccess;
}

cudaError_t cudaMemset(void *dst, int value, size_t count) {
    return cudaMemsetAsync(dst, value, count, cudaStreamLegacy);
}

/* ---- stream-ordered memory ----------------------------------------------------------------- */

struct spconv__emu_mem_pool {
    int device;
};

cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool, const struct cudaMemPoolProps *props) {
    if (pool == NULL || props == NULL || props->allocType != cudaMemAllocationTypePinned ||
        props->location.type != cudaMemLocationTypeDevice || props->location.id != 0)
        return record(cudaErrorInvalidValue);
    *pool = new spconv__emu_mem_pool{props->location.id};
    return cudaSuccess;
}

cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool) {
    if (pool == NULL) return record(cudaErrorInvalidValue);
    delete pool;
    return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value) {
    if (pool == NULL || value == NULL) return record(cudaErrorInvalidValue);
    switch (attr) { /* the emulated pool never reuses a block, so every setting holds */
    case cudaMemPoolReuseFollowEventDependencies:
    case cudaMemPoolReuseAllowOpportunistic:
    case cudaMemPoolReuseAllowInternalDependencies:
    case cudaMemPoolAttrReleaseThreshold: return cudaSuccess;
    }
    return record(cudaErrorInvalidValue);
}

cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t) {
    return pool == NULL ? record(cudaErrorInvalidValue) : cudaSuccess;
}

cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t pool,
                                    cudaStream_t stream) {
    if (pool == NULL) return record(cudaErrorInvalidValue);
    if (!is_live_stream(stream)) return record(cudaErrorInvalidResourceHandle);
    return allocate_device(ptr, size);
}

/* Checked now; the block is poisoned and freed when @p stream reaches this point. */
cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream) {
    if (ptr == NULL) return cudaSuccess;
    if (!is_live_stream(stream)) return record(cudaErrorInvalidResourceHandle);
    size_t bytes = 0;
    {
        runtime_state &s = state();
        std::lock_guard<std::mutex> lock(s.mutex);
        auto found = s.allocations.find((uintptr_t)ptr);
        /* a second free of the block is refused, as is later work on it (is_device_range) */
        if (found == s.allocations.end() || found->second.freeing)
            return record(cudaErrorInvalidValue);
        found->second.freeing = true;
        bytes = found->second.bytes;
    }
    spconv__emu::enqueue(stream, [ptr, bytes] {
        memset(ptr, 0xfe, bytes);
        release_device(ptr);
    });
    return cudaSuccess;
}

void spconv__emu::count_launch() { launches.fetch_add(1, std::memory_order_relaxed); }

extern "C" unsigned long long spconv__cuda_emulation_launches(void) {
    return launches.load(std::memory_order_relaxed);
}

extern "C" unsigned long long spconv__cuda_emulation_host_waits(void) {
    return host_waits.load(std::memory_order_relaxed);
}

/* ---- streams ------------------------------------------------------------------------------- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
    if (stream == NULL || (flags & ~(unsigned int)cudaStreamNonBlocking) != 0)
        return record(cudaErrorInvalidValue);
    queue_state &q = queues();
    std::lock_guard<std::recursive_mutex> queue_lock(q.mutex);
    cudaStream_t created = new spconv__emu_stream{flags, q.next_id++, {}, 0, 0, false};
    q.by_id[created->id] = created;
    runtime_state &s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    s.streams.insert(created);
    *stream = created;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) {
    return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

/* As the runtime: the call returns at once and the stream's queued work still runs later (when
 * the host waits for the device, or for an event recorded on it); the handle is dead now. */
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    queue_state &q = queues();
    std::lock_guard<std::recursive_mutex> queue_lock(q.mutex);
    {
        runtime_state &s = state();
        std::lock_guard<std::mutex> lock(s.mutex);
        if (stream == NULL || s.streams.erase(stream) == 0)
            return record(cudaErrorInvalidResourceHandle);
    }
    stream->destroyed = true;
    run_until(stream, 0); /* frees it now when nothing is queued */
    return cudaSuccess;
}

/* The legacy default stream's synchronisation also waits for the blocking streams. */
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    if (!is_live_stream(stream)) return record(cudaErrorInvalidResourceHandle);
    count_host_wait();
    queue_state &q = queues();
    std::lock_guard<std::recursive_mutex> lock(q.mutex);
    spconv__emu_stream *s = resolve(stream);
    if (s == &q.legacy) {
        std::vector<uint64_t> blocking; /* running one may free a destroyed one: ids first */
        for (const auto &entry : q.by_id)
            if ((entry.second->flags & cudaStreamNonBlocking) == 0) blocking.push_back(entry.first);
        for (uint64_t id : blocking) run_stream_until(id, UINT64_MAX);
    }
    run_all(s);
    return cudaSuccess;
}

cudaError_t cudaStreamGetFlags(cudaStream_t stream, unsigned int *flags) {
    if (flags == NULL) return record(cudaErrorInvalidValue);
    if (!is_live_stream(stream)) return record(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lock(queues().mutex);
    *flags = resolve(stream)->flags;
    return cudaSuccess;
}

/* Nothing runs unless someone waits, so a query waits: a host polling for completion ends. */
cudaError_t cudaStreamQuery(cudaStream_t stream) { return cudaStreamSynchronize(stream); }

/* An event never recorded is complete: the wait is a no-op, as in the runtime. */
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    if (!is_live_stream(stream) || !is_live_event(event))
        return record(cudaErrorInvalidResourceHandle);
    if (flags != 0) return record(cudaErrorInvalidValue);
    queue_state &q = queues();
    std::lock_guard<std::recursive_mutex> lock(q.mutex);
    if (event->stream_id != 0) {
        const uint64_t id = event->stream_id, item = event->item;
        spconv__emu::enqueue(stream, [id, item] { run_stream_until(id, item); });
    }
    return cudaSuccess;
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
    queue_state &q = queues();
    std::lock_guard<std::recursive_mutex> queue_lock(q.mutex);
    {
        runtime_state &s = state();
        std::lock_guard<std::mutex> lock(s.mutex);
        if (event == NULL || s.events.erase(event) == 0)
            return record(cudaErrorInvalidResourceHandle);
    }
    if (event->records_queued == 0)
        delete event;
    else
        event->destroyed = true;
    return cudaSuccess;
}

/* The event is reached when the stream's earlier work has run: elapsed times between events are
 * the host time the emulated work between them took. */
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    if (!is_live_event(event) || !is_live_stream(stream))
        return record(cudaErrorInvalidResourceHandle);
    queue_state &q = queues();
    std::lock_guard<std::recursive_mutex> lock(q.mutex);
    event->recorded = false;
    ++event->records_queued;
    const uint64_t generation = ++event->generation;
    spconv__emu_stream *s = resolve(stream);
    spconv__emu::enqueue(stream, [event, generation] {
        if (generation == event->generation) { /* an older record completes nothing */
            event->recorded = true;
            event->when = std::chrono::steady_clock::now();
        }
        if (--event->records_queued == 0 && event->destroyed) delete event;
    });
    event->stream_id = s->id;
    event->item = s->queued;
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    if (!is_live_event(event)) return record(cudaErrorInvalidResourceHandle);
    count_host_wait();
    queue_state &q = queues();
    std::lock_guard<std::recursive_mutex> lock(q.mutex);
    if (event->stream_id != 0) run_stream_until(event->stream_id, event->item);
    return cudaSuccess;
}

/* As cudaStreamQuery: the query waits. */
cudaError_t cudaEventQuery(cudaEvent_t event) { return cudaEventSynchronize(event); }

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (ms == NULL) return record(cudaErrorInvalidValue);
    if (!is_live_event(start) || !is_live_event(end) || start->stream_id == 0 ||
        end->stream_id == 0)
        return record(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lock(queues().mutex);
    /* not recorded as the last error: the runtime's "not ready" is a state, not a failure */
    if (!start->recorded || !end->recorded) return cudaErrorNotReady;
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

void spconv__emu::check_kernel_pointer(const char *kernel, int index, const void *pointer) {
    if (pointer == NULL || is_device_range(pointer, 0)) return;
    fprintf(stderr, "spconv CUDA emulation: %s's argument %d (%p) is not device memory: a GPU "
                    "cannot read the host's memory\n", kernel, index, pointer);
    abort();
}

/* ---- queued work and schedules ------------------------------------------------------------- */

void spconv__emu::enqueue(cudaStream_t stream, std::function<void()> work) {
    queue_state &q = queues();
    std::lock_guard<std::recursive_mutex> lock(q.mutex);
    if (!is_live_stream(stream)) {
        /* The runtime calls check their stream first; this is cuBLAS on a destroyed stream. */
        fprintf(stderr, "spconv CUDA emulation: work queued on destroyed stream %p\n",
                (void *)stream);
        abort();
    }
    push(resolve(stream), std::move(work));
}

void spconv__emu::run_queued(cudaStream_t stream) {
    queue_state &q = queues();
    std::lock_guard<std::recursive_mutex> lock(q.mutex);
    run_all(resolve(stream));
}

namespace {

/* The thread order of SPCONV_CUDA_EMULATION_SCHEDULE. A shuffled launch visits flat thread i at
 * step (a * i + b) mod total, with a coprime to total, both drawn from a generator seeded by
 * SEED and advanced by every launch: neighbouring threads run far apart, in another order at each
 * launch, and the same orders come again for the same seed. */
struct schedule {
    enum { forward, reverse, shuffle } kind = forward;
    uint64_t state = 0;
};

schedule &the_schedule() {
    static schedule *chosen = [] {
        schedule *s = new schedule;
        const char *name = getenv("SPCONV_CUDA_EMULATION_SCHEDULE");
        char *end = NULL;
        if (name == NULL || *name == '\0' || strcmp(name, "forward") == 0) {
            s->kind = schedule::forward;
        } else if (strcmp(name, "reverse") == 0) {
            s->kind = schedule::reverse;
        } else if (strncmp(name, "shuffle:", 8) == 0 && name[8] != '\0' &&
                   (s->state = strtoull(name + 8, &end, 10), *end == '\0')) {
            s->kind = schedule::shuffle;
        } else {
            fprintf(stderr, "spconv CUDA emulation: SPCONV_CUDA_EMULATION_SCHEDULE=%s is not "
                            "forward, reverse or shuffle:SEED\n", name);
            exit(2);
        }
        return s;
    }();
    return *chosen;
}

/* splitmix64: a well-mixed 64-bit value per call. */
uint64_t next_random(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t gcd(uint64_t a, uint64_t b) {
    while (b != 0) {
        const uint64_t r = a % b;
        a = b;
        b = r;
    }
    return a;
}

} // namespace

void spconv__emu::run_grid(dim3 grid, dim3 block, const std::function<void()> &thread) {
    const uint64_t per_block = (uint64_t)block.x * block.y * block.z;
    const uint64_t total = (uint64_t)grid.x * grid.y * grid.z * per_block;
    schedule &order = the_schedule();
    uint64_t a = 1, b = 0;
    if (order.kind == schedule::shuffle && total > 1) {
        std::lock_guard<std::recursive_mutex> lock(queues().mutex);
        do a = next_random(&order.state) % total; while (a == 0 || gcd(a, total) != 1);
        b = next_random(&order.state) % total;
    }
    thread_position &at = position;
    at.grid_dim = grid;
    at.block_dim = block;
    for (uint64_t step = 0; step < total; ++step) {
        uint64_t i = step;
        if (order.kind == schedule::reverse) i = total - 1 - step;
        /* (a * step + b) mod total, in 128 bits so that nothing overflows. */
        if (order.kind == schedule::shuffle)
            i = (uint64_t)(((unsigned __int128)a * step + b) % total);
        const uint64_t t = i % per_block, blk = i / per_block;
        at.thread_idx = uint3{(unsigned)(t % block.x), (unsigned)(t / block.x % block.y),
                              (unsigned)(t / block.x / block.y)};
        at.block_idx = uint3{(unsigned)(blk % grid.x), (unsigned)(blk / grid.x % grid.y),
                             (unsigned)(blk / grid.x / grid.y)};
        thread();
    }
}
