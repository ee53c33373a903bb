/* What the CUDA backend relies on from a kernel launch, checked on whatever runs the kernels: a
 * GPU in the nvcc build, the CPU in the host emulation (cuda/emulation/). Both builds compile this
 * one file, so a GPU run (tools/gpu-check.sh) confirms that the emulation promises only what a GPU
 * does: every thread of a grid runs once and sees its own indices, atomics under contention give
 * exact totals, bad configurations fail through cudaGetLastError without running the kernel,
 * events time a stream and order work across streams. Launches go through SPCONV_CUDA_LAUNCH, as
 * the backend's do. Skips without a device. The emulation's own promises (work runs only when
 * waited for; threads run in the order SPCONV_CUDA_EMULATION_SCHEDULE names) are checked last. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* CMocka's header declares C functions without saying so to C++. */
extern "C" {
#include <cmocka.h>
}
#include <cuda_runtime.h>

#include "launch.h"

#define CHECK_CUDA(call) assert_int_equal((call), cudaSuccess)

static int device_present(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return count > 0;
}

#define SKIP_WITHOUT_DEVICE()          \
    do {                               \
        if (!device_present()) skip(); \
    } while (0)

/* ---- every thread once, with its own indices ------------------------------------------------ */

/* What one thread saw: its place, from its indices, and the launch's shape. */
struct seen_shape {
    unsigned int block_dim[3], grid_dim[3];
};

__global__ void count_threads_kernel(unsigned int *hits, seen_shape *shape) {
    unsigned int block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    unsigned int thread = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    unsigned int threads_per_block = blockDim.x * blockDim.y * blockDim.z;
    atomicAdd(&hits[block * threads_per_block + thread], 1u);
    if (block == 0 && thread == 0) {
        shape->block_dim[0] = blockDim.x, shape->block_dim[1] = blockDim.y;
        shape->block_dim[2] = blockDim.z;
        shape->grid_dim[0] = gridDim.x, shape->grid_dim[1] = gridDim.y;
        shape->grid_dim[2] = gridDim.z;
    }
}

static void test_every_thread_runs_once_with_its_indices(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    const dim3 grid(3, 2, 2), block(8, 3, 2);
    const size_t threads = 3 * 2 * 2 * 8 * 3 * 2;
    unsigned int *hits = NULL;
    seen_shape *shape = NULL;
    CHECK_CUDA(cudaMalloc((void **)&hits, threads * sizeof *hits));
    CHECK_CUDA(cudaMalloc((void **)&shape, sizeof *shape));
    CHECK_CUDA(cudaMemset(hits, 0, threads * sizeof *hits));
    SPCONV_CUDA_LAUNCH(count_threads_kernel, grid, block, 0, cudaStreamLegacy, hits, shape);
    CHECK_CUDA(cudaGetLastError());
    unsigned int host_hits[threads];
    seen_shape host_shape;
    CHECK_CUDA(cudaMemcpy(host_hits, hits, sizeof host_hits, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(&host_shape, shape, sizeof host_shape, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < threads; ++i)
        if (host_hits[i] != 1) fail_msg("thread %zu ran %u times, not once", i, host_hits[i]);
    const unsigned int want_block[3] = {8, 3, 2}, want_grid[3] = {3, 2, 2};
    for (int d = 0; d < 3; ++d) {
        assert_int_equal(host_shape.block_dim[d], want_block[d]);
        assert_int_equal(host_shape.grid_dim[d], want_grid[d]);
    }
    CHECK_CUDA(cudaFree(hits));
    CHECK_CUDA(cudaFree(shape));
}

/* ---- atomics under contention ---------------------------------------------------------------- */

struct atomic_totals {
    int count;                /* atomicAdd(int): one per thread */
    float float_sum;          /* atomicAdd(float) of 1: exact below 2^24 */
    double double_sum;        /* atomicAdd(double) of 0.5 */
    int minimum;              /* atomicMin of -thread */
    unsigned long long maximum; /* atomicMax of thread */
    int owner;                /* atomicCAS from -1: exactly one thread wins */
    int winners;
    unsigned long long exchanged;    /* atomicExch: each thread swaps in its number + 1 */
    unsigned long long exchange_sum; /* what the exchanges returned, summed */
};

__global__ void contend_kernel(atomic_totals *totals, int n) {
    const int step = (int)(gridDim.x * blockDim.x);
    for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += step) {
        atomicAdd(&totals->count, 1);
        atomicAdd(&totals->float_sum, 1.0f);
        atomicAdd(&totals->double_sum, 0.5);
        atomicMin(&totals->minimum, -i);
        atomicMax(&totals->maximum, (unsigned long long)i);
        if (atomicCAS(&totals->owner, -1, i) == -1) atomicAdd(&totals->winners, 1);
        atomicAdd(&totals->exchange_sum, atomicExch(&totals->exchanged, (unsigned long long)i + 1));
    }
}

static void test_atomics_give_exact_totals(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    const int n = 100000;
    atomic_totals start;
    memset(&start, 0, sizeof start);
    start.minimum = 1;
    start.owner = -1;
    atomic_totals *totals = NULL;
    CHECK_CUDA(cudaMalloc((void **)&totals, sizeof *totals));
    CHECK_CUDA(cudaMemcpy(totals, &start, sizeof start, cudaMemcpyHostToDevice));
    SPCONV_CUDA_LAUNCH(contend_kernel, 7, 128, 0, cudaStreamLegacy, totals, n);
    CHECK_CUDA(cudaGetLastError());
    atomic_totals got;
    CHECK_CUDA(cudaMemcpy(&got, totals, sizeof got, cudaMemcpyDeviceToHost));
    assert_int_equal(got.count, n);
    assert_true(got.float_sum == (float)n);
    assert_true(got.double_sum == 0.5 * n);
    assert_int_equal(got.minimum, -(n - 1));
    assert_int_equal(got.maximum, n - 1);
    assert_int_equal(got.winners, 1);
    assert_true(got.owner >= 0 && got.owner < n);
    /* Every value 1..n was swapped in once and came out once (the last one is still there). */
    assert_int_equal(got.exchange_sum + got.exchanged, (unsigned long long)n * (n + 1) / 2);
    CHECK_CUDA(cudaFree(totals));
}

/* ---- bad configurations ---------------------------------------------------------------------- */

__global__ void set_flag_kernel(int *flag) { *flag = 1; }

static void test_bad_configurations_fail_without_running(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    int *flag = NULL;
    CHECK_CUDA(cudaMalloc((void **)&flag, sizeof *flag));
    CHECK_CUDA(cudaMemset(flag, 0, sizeof *flag));
    const struct {
        dim3 grid, block;
        size_t shared_bytes;
        const char *what;
    } bad[] = {
        {dim3(1), dim3(1025), 0, "1025 threads per block"},
        {dim3(1), dim3(32, 32, 2), 0, "2048 threads per block in 3 dims"},
        {dim3(1), dim3(1, 1, 65), 0, "a block 65 deep"},
        {dim3(0), dim3(32), 0, "an empty grid"},
        {dim3(1, 65536), dim3(32), 0, "a grid 65536 high"},
        {dim3(1), dim3(32), (size_t)1 << 30, "1 GiB of shared memory"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        SPCONV_CUDA_LAUNCH(set_flag_kernel, bad[i].grid, bad[i].block, bad[i].shared_bytes,
                           cudaStreamLegacy, flag);
        cudaError_t error = cudaGetLastError();
        if (error == cudaSuccess) fail_msg("a launch with %s did not fail", bad[i].what);
        assert_int_equal(cudaGetLastError(), cudaSuccess); /* read once, then gone */
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    int host_flag = -1;
    CHECK_CUDA(cudaMemcpy(&host_flag, flag, sizeof host_flag, cudaMemcpyDeviceToHost));
    assert_int_equal(host_flag, 0);

    /* The largest legal block and a wide grid do run. */
    SPCONV_CUDA_LAUNCH(set_flag_kernel, dim3(2, 1, 1), dim3(1024), 0, cudaStreamLegacy, flag);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaMemcpy(&host_flag, flag, sizeof host_flag, cudaMemcpyDeviceToHost));
    assert_int_equal(host_flag, 1);
    CHECK_CUDA(cudaFree(flag));
}

/* ---- streams and events ---------------------------------------------------------------------- */

__global__ void fill_values_kernel(float *values, int n, float value) {
    const int step = (int)(gridDim.x * blockDim.x);
    for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += step) values[i] = value;
}

static void test_stream_orders_work_and_events_time_it(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    const int n = 1 << 16;
    cudaStream_t stream = NULL;
    cudaEvent_t start = NULL, end = NULL;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&end));
    float *values = NULL;
    CHECK_CUDA(cudaMalloc((void **)&values, n * sizeof *values));
    CHECK_CUDA(cudaEventRecord(start, stream));
    SPCONV_CUDA_LAUNCH(fill_values_kernel, 4, 256, 0, stream, values, n, 2.5f);
    CHECK_CUDA(cudaGetLastError());
    /* Queued behind the kernel on the same stream, so it reads what the kernel wrote. */
    static float host[1 << 16];
    CHECK_CUDA(cudaMemcpyAsync(host, values, sizeof host, cudaMemcpyDeviceToHost, stream));
    CHECK_CUDA(cudaEventRecord(end, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    for (int i = 0; i < n; ++i)
        if (host[i] != 2.5f) fail_msg("element %d is %g, not 2.5", i, (double)host[i]);
    float ms = -1.0f;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, end));
    assert_true(ms >= 0.0f);
    CHECK_CUDA(cudaFree(values));
    CHECK_CUDA(cudaEventDestroy(start));
    CHECK_CUDA(cudaEventDestroy(end));
    CHECK_CUDA(cudaStreamDestroy(stream));
}

/* Work on one stream that uses what another stream makes waits for it through an event. In the
 * emulation nothing runs until the host waits, so without the wait the copy would read the old
 * values (test_emulation_runs_work_when_waited_for shows that). */
static void test_event_wait_orders_two_streams(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    const int n = 1 << 16;
    cudaStream_t maker = NULL, user = NULL;
    cudaEvent_t made = NULL;
    CHECK_CUDA(cudaStreamCreateWithFlags(&maker, cudaStreamNonBlocking));
    CHECK_CUDA(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking));
    CHECK_CUDA(cudaEventCreate(&made));
    float *values = NULL, *copy = NULL;
    CHECK_CUDA(cudaMalloc((void **)&values, n * sizeof *values));
    CHECK_CUDA(cudaMalloc((void **)&copy, n * sizeof *copy));
    SPCONV_CUDA_LAUNCH(fill_values_kernel, 4, 256, 0, maker, values, n, 1.0f);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaStreamSynchronize(maker));
    SPCONV_CUDA_LAUNCH(fill_values_kernel, 64, 256, 0, maker, values, n, 7.0f);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaEventRecord(made, maker));
    /* Destroyed with its record still queued: the record still runs (and frees it), and the new
     * event below is the one waited for. */
    CHECK_CUDA(cudaEventDestroy(made));
    made = NULL;
    CHECK_CUDA(cudaEventCreate(&made));
    CHECK_CUDA(cudaEventRecord(made, maker));
    CHECK_CUDA(cudaStreamWaitEvent(user, made, 0));
    CHECK_CUDA(cudaMemcpyAsync(copy, values, n * sizeof *copy, cudaMemcpyDeviceToDevice, user));
    static float host[1 << 16];
    CHECK_CUDA(cudaMemcpyAsync(host, copy, sizeof host, cudaMemcpyDeviceToHost, user));
    CHECK_CUDA(cudaStreamSynchronize(user));
    for (int i = 0; i < n; ++i)
        if (host[i] != 7.0f) fail_msg("element %d is %g, not 7: the wait did not order", i,
                                      (double)host[i]);
    CHECK_CUDA(cudaFree(values));
    CHECK_CUDA(cudaFree(copy));
    CHECK_CUDA(cudaEventDestroy(made));
    CHECK_CUDA(cudaStreamDestroy(maker));
    CHECK_CUDA(cudaStreamDestroy(user));
}

/* Each thread takes the next number from a counter: the numbers say in which order the threads
 * ran. Any order is a permutation, whatever runs them. */
__global__ void record_order_kernel(unsigned int *order, unsigned int *counter) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    order[i] = atomicAdd(counter, 1u);
}

static void run_order(unsigned int *host, dim3 grid, dim3 block, size_t threads) {
    unsigned int *order = NULL, *counter = NULL;
    CHECK_CUDA(cudaMalloc((void **)&order, threads * sizeof *order));
    CHECK_CUDA(cudaMalloc((void **)&counter, sizeof *counter));
    CHECK_CUDA(cudaMemset(counter, 0, sizeof *counter));
    SPCONV_CUDA_LAUNCH(record_order_kernel, grid, block, 0, cudaStreamLegacy, order, counter);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaMemcpy(host, order, threads * sizeof *host, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaFree(order));
    CHECK_CUDA(cudaFree(counter));
}

static void test_threads_run_once_in_some_order(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    const dim3 grid(5), block(96);
    enum { threads = 5 * 96 };
    unsigned int host[threads];
    char seen[threads];
    run_order(host, grid, block, threads);
    memset(seen, 0, sizeof seen);
    for (size_t i = 0; i < threads; ++i) {
        if (host[i] >= threads || seen[host[i]])
            fail_msg("thread %zu got turn %u: not a permutation", i, host[i]);
        seen[host[i]] = 1;
    }
}

/* ---- the emulation's own promises ------------------------------------------------------------ */

/* Host memory is not device memory, even where both are host memory: what would fault or fail
 * on a GPU fails here too. And the device says it is no GPU. */
static void test_emulation_keeps_host_and_device_apart(void **state) {
    (void)state;
    if (!SPCONV_CUDA_EMULATION) skip();
    float host[4] = {0}, *device = NULL;
    CHECK_CUDA(cudaMalloc((void **)&device, sizeof host));
    assert_int_equal(cudaMemcpy(host, host + 2, 2 * sizeof *host, cudaMemcpyHostToDevice),
                     cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpy(host, device, 2 * sizeof host, cudaMemcpyDeviceToHost),
                     cudaErrorInvalidValue); /* past the end of the allocation */
    assert_int_equal(cudaMemset(host, 0, sizeof host), cudaErrorInvalidValue);
    assert_int_equal(cudaFree(host), cudaErrorInvalidValue);
    assert_int_equal(cudaFree(device + 1), cudaErrorInvalidValue);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    assert_int_equal(cudaGetLastError(), cudaSuccess);
    CHECK_CUDA(cudaMemcpy(device + 1, host, 3 * sizeof *host, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaFree(device));
    assert_int_equal(cudaFree(device), cudaErrorInvalidValue); /* already freed */
    (void)cudaGetLastError();

    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    assert_non_null(strstr(prop.name, "host emulation"));
    assert_int_equal(cudaSetDevice(1), cudaErrorInvalidDevice);
    (void)cudaGetLastError();
}

/* ---- the separate memory model, case by case in a process of its own ------------------------ */

__global__ void write_values_kernel(float *values, int n) {
    const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) values[i] = (float)i;
}

/* A kernel argument that holds a pointer: the emulation checks it through an overload of
 * check_kernel_argument, found by argument-dependent lookup (as cuda/maps_common.h gives the hash
 * table's). */
struct values_view {
    float *values;
    int n;
};

#if SPCONV_CUDA_EMULATION
inline void check_kernel_argument(const char *kernel, int index, const values_view &v) {
    spconv__emu::check_kernel_pointer(kernel, index, v.values);
}
#endif

__global__ void write_view_kernel(values_view v) {
    const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < v.n) v.values[i] = (float)i;
}

/* One case that must end the process, run by `test_cuda_launch --fault CASE` (main below). */
static int run_fault_case(const char *name) {
    float *device = NULL;
    if (cudaMalloc((void **)&device, 100 * sizeof *device) != cudaSuccess) return 3;
    volatile float sink = 0;
    if (strcmp(name, "host-reads-device") == 0) {
        sink = device[7];
    } else if (strcmp(name, "host-writes-device") == 0) {
        device[7] = 1.0f;
    } else if (strcmp(name, "kernel-gets-host") == 0) {
        static float host[100];
        SPCONV_CUDA_LAUNCH(write_values_kernel, 1, 128, 0, cudaStreamLegacy, host, 100);
    } else if (strcmp(name, "kernel-gets-host-in-struct") == 0) {
        static float host[100];
        values_view view = {host, 100};
        SPCONV_CUDA_LAUNCH(write_view_kernel, 1, 128, 0, cudaStreamLegacy, view);
    } else if (strcmp(name, "kernel-after-free") == 0) {
        /* queued on one stream, the block freed on another that runs first: no event orders
         * them, so the kernel uses freed memory (the emulation runs the free first) */
        cudaStream_t user = NULL, freer = NULL;
        if (cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking) != cudaSuccess ||
            cudaStreamCreateWithFlags(&freer, cudaStreamNonBlocking) != cudaSuccess)
            return 3;
        SPCONV_CUDA_LAUNCH(write_values_kernel, 1, 128, 0, user, device, 100);
        if (cudaFreeAsync(device, freer) != cudaSuccess) return 3;
        (void)cudaStreamSynchronize(freer);
        (void)cudaStreamSynchronize(user);
    } else if (strcmp(name, "kernel-runs-past-the-end") == 0) {
        /* 100 floats round to 512 bytes: element 128 is the first one past the block's rounding */
        SPCONV_CUDA_LAUNCH(write_values_kernel, 1, 256, 0, cudaStreamLegacy, device, 129);
    } else {
        return 4;
    }
    (void)cudaDeviceSynchronize();
    (void)sink;
    return 0; /* the case did not end the process: the caller fails */
}

/* Runs `this program --fault @p name` with its stderr in a file; true when it did not end
 * normally with status 0 and its stderr holds @p message or (when not NULL) @p alternative. */
static int fault_case_fails_saying_either(const char *name, const char *message,
                                          const char *alternative) {
    char err_path[] = "/tmp/spconv-fault-XXXXXX";
    const int err = mkstemp(err_path);
    assert_true(err >= 0);
    close(err);
    char command[512];
    snprintf(command, sizeof command, "/proc/%d/exe --fault %s 2>%s >/dev/null", (int)getpid(),
             name, err_path);
    const int status = system(command);
    FILE *f = fopen(err_path, "r");
    char text[4096] = {0};
    if (f != NULL) {
        size_t got = fread(text, 1, sizeof text - 1, f);
        text[got] = '\0';
        fclose(f);
    }
    unlink(err_path);
    print_message("--fault %s: status %d, stderr: %.300s\n", name, status, text);
    return status != 0 && (strstr(text, message) != NULL ||
                           (alternative != NULL && strstr(text, alternative) != NULL));
}

static int fault_case_fails_saying(const char *name, const char *message) {
    return fault_case_fails_saying_either(name, message, NULL);
}

/* Device memory is the device's, as on a GPU: the host's code cannot read or write it (it faults,
 * naming the allocation), a kernel cannot be given host memory, a kernel that runs past a block's
 * 256-byte rounding or uses a freed block faults, fresh memory reads as 0xff bytes (a NaN in every
 * float type, so a kernel reading what nothing wrote shows it), and a block whose free is queued
 * takes no more work nor a second free. SPCONV_CUDA_EMULATION_MEMORY=shared turns this off. */
static void test_emulation_keeps_device_memory_from_the_host(void **state) {
    (void)state;
    if (!SPCONV_CUDA_EMULATION) skip();
    const char *memory = getenv("SPCONV_CUDA_EMULATION_MEMORY");
    if (memory != NULL && strcmp(memory, "shared") == 0) skip();
    assert_true(fault_case_fails_saying("host-reads-device", "the host touched device memory"));
    assert_true(fault_case_fails_saying("host-writes-device", "the host touched device memory"));
    assert_true(fault_case_fails_saying("kernel-gets-host", "write_values_kernel's argument 0"));
    assert_true(fault_case_fails_saying("kernel-gets-host-in-struct",
                                        "write_view_kernel's argument 0"));
#if defined(__SANITIZE_ADDRESS__)
    /* ASan sees it first where the first write past the block's size lands on its poisoned bytes;
     * where the schedule (shuffled, reversed) runs the thread past the rounding first, the guard
     * page does */
    assert_true(fault_case_fails_saying_either("kernel-runs-past-the-end", "AddressSanitizer",
                                               "runs past the end"));
#else
    assert_true(fault_case_fails_saying("kernel-runs-past-the-end", "runs past the end"));
#endif
    assert_true(fault_case_fails_saying("kernel-after-free", "after it was freed"));

    float *device = NULL;
    CHECK_CUDA(cudaMalloc((void **)&device, 100 * sizeof *device));
    uint32_t bits[100];
    CHECK_CUDA(cudaMemcpy(bits, device, sizeof bits, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 100; ++i) assert_int_equal(bits[i], 0xffffffffu);
    SPCONV_CUDA_LAUNCH(write_values_kernel, 1, 128, 0, cudaStreamLegacy, device, 100);
    CHECK_CUDA(cudaGetLastError());
    float values[100];
    CHECK_CUDA(cudaMemcpy(values, device, sizeof values, cudaMemcpyDeviceToHost));
    assert_true(values[0] == 0.0f && values[99] == 99.0f);
    /* once its free is queued, a block takes no more work and no second free */
    CHECK_CUDA(cudaFreeAsync(device, cudaStreamLegacy));
    assert_int_equal(cudaFreeAsync(device, cudaStreamLegacy), cudaErrorInvalidValue);
    assert_int_equal(cudaMemsetAsync(device, 0, 4, cudaStreamLegacy), cudaErrorInvalidValue);
    assert_int_equal(cudaFree(device), cudaErrorInvalidValue);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_CUDA(cudaDeviceSynchronize());
}

/* The emulation runs queued work as late as CUDA allows: a copy to the host is not there until the
 * host waits for its stream (its bytes are 0xa5 until then), and a stream that does not wait for
 * another's work through an event runs before it. Both would be bugs on a GPU that happen to work
 * when work runs at once; here they show. */
static void test_emulation_runs_work_when_waited_for(void **state) {
    (void)state;
    if (!SPCONV_CUDA_EMULATION) skip();
    const char *mode = getenv("SPCONV_CUDA_EMULATION_STREAMS");
    if (mode != NULL && strcmp(mode, "eager") == 0) skip();
    const int n = 1000;
    cudaStream_t maker = NULL, user = NULL;
    CHECK_CUDA(cudaStreamCreateWithFlags(&maker, cudaStreamNonBlocking));
    CHECK_CUDA(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking));
    float *values = NULL;
    CHECK_CUDA(cudaMalloc((void **)&values, n * sizeof *values));
    CHECK_CUDA(cudaMemset(values, 0, n * sizeof *values));
    CHECK_CUDA(cudaDeviceSynchronize());

    static float host[1000];
    SPCONV_CUDA_LAUNCH(fill_values_kernel, 2, 128, 0, maker, values, n, 3.0f);
    CHECK_CUDA(cudaMemcpyAsync(host, values, sizeof host, cudaMemcpyDeviceToHost, maker));
    uint32_t bits;
    memcpy(&bits, &host[n - 1], sizeof bits);
    assert_int_equal(bits, 0xa5a5a5a5u); /* not waited for: not there */
    CHECK_CUDA(cudaStreamSynchronize(maker));
    assert_true(host[0] == 3.0f && host[n - 1] == 3.0f);

    /* No event: the user stream's copy runs first and reads the 3s, not the 5s. */
    SPCONV_CUDA_LAUNCH(fill_values_kernel, 2, 128, 0, maker, values, n, 5.0f);
    CHECK_CUDA(cudaMemcpyAsync(host, values, sizeof host, cudaMemcpyDeviceToHost, user));
    CHECK_CUDA(cudaStreamSynchronize(user));
    assert_true(host[0] == 3.0f && host[n - 1] == 3.0f);
    /* A destroyed stream's queued work still runs, when the host waits for the device. */
    cudaStream_t doomed = NULL;
    CHECK_CUDA(cudaStreamCreateWithFlags(&doomed, cudaStreamNonBlocking));
    SPCONV_CUDA_LAUNCH(fill_values_kernel, 2, 128, 0, doomed, values, n, 9.0f);
    CHECK_CUDA(cudaMemcpyAsync(host, values, sizeof host, cudaMemcpyDeviceToHost, doomed));
    CHECK_CUDA(cudaStreamDestroy(doomed));
    memcpy(&bits, &host[0], sizeof bits);
    assert_int_equal(bits, 0xa5a5a5a5u);
    CHECK_CUDA(cudaDeviceSynchronize());
    assert_true(host[0] == 9.0f && host[n - 1] == 9.0f);
    /* cudaFree waits for the whole device, so the 5s are written before the memory goes. */
    CHECK_CUDA(cudaFree(values));
    CHECK_CUDA(cudaStreamDestroy(maker));
    CHECK_CUDA(cudaStreamDestroy(user));
}

/* The schedule: forward runs threads in index order, reverse in the opposite one, and a shuffle
 * some permutation (test_threads_run_once_in_some_order). The environment picks it. */
static void test_emulation_follows_its_schedule(void **state) {
    (void)state;
    if (!SPCONV_CUDA_EMULATION) skip();
    const char *schedule = getenv("SPCONV_CUDA_EMULATION_SCHEDULE");
    const int forward = schedule == NULL || *schedule == '\0' || strcmp(schedule, "forward") == 0;
    const int reverse = schedule != NULL && strcmp(schedule, "reverse") == 0;
    if (!forward && !reverse) skip();
    enum { threads = 6 * 16 };
    unsigned int host[threads];
    run_order(host, dim3(6), dim3(16), threads);
    for (unsigned int i = 0; i < threads; ++i)
        assert_int_equal(host[i], forward ? i : threads - 1 - i);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--fault") == 0) return run_fault_case(argv[2]);
    if (!device_present()) printf("skipped: no CUDA device; the launch checks need one\n");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_thread_runs_once_with_its_indices),
        cmocka_unit_test(test_atomics_give_exact_totals),
        cmocka_unit_test(test_bad_configurations_fail_without_running),
        cmocka_unit_test(test_stream_orders_work_and_events_time_it),
        cmocka_unit_test(test_event_wait_orders_two_streams),
        cmocka_unit_test(test_threads_run_once_in_some_order),
        cmocka_unit_test(test_emulation_keeps_host_and_device_apart),
        cmocka_unit_test(test_emulation_keeps_device_memory_from_the_host),
        cmocka_unit_test(test_emulation_runs_work_when_waited_for),
        cmocka_unit_test(test_emulation_follows_its_schedule),
    };
    return cmocka_run_group_tests_name("cuda_launch", tests, NULL, NULL);
}
