/* The CUDA side of a context that a framework configures (context.h), on whatever runs the
 * kernels: a GPU in the nvcc build, the CPU in the host emulation (cuda/emulation/). An external
 * stream set on the context carries its work and its cuBLAS handle, gives the same bits as the
 * context's own stream, and is neither destroyed nor broken by the context; f32 products are
 * cuBLAS's full-f32 product by default (bit for bit what cublasSgemm gives on the same operands),
 * and TF32 products only when the context allows them: then within the TF32 rounding bound of the
 * exact product and, for operands with full 24-bit significands, different from the f32 one.
 * Compiled as cuda/ is, so that a GPU run (tools/gpu-check.sh) checks the same promises. Skips
 * without a device. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* CMocka's header declares C functions without saying so to C++. */
extern "C" {
#include <cmocka.h>
}
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "spconv/config.h"
#include "spconv/spconv.h"

#define CHECK_CUDA(call) assert_int_equal((call), cudaSuccess)
#define CHECK_CUBLAS(call) assert_int_equal((call), CUBLAS_STATUS_SUCCESS)
#define CHECK_OK(call)                                                               \
    do {                                                                             \
        spconv_status st_ = (call);                                                  \
        if (st_ != SPCONV_OK) fail_msg("%s: %s", #call, spconv_last_error());        \
    } while (0)

static int device_present(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return count > 0;
}

#define SKIP_WITHOUT_DEVICE()                                         \
    do {                                                              \
        if (!device_present()) {                                      \
            printf("no CUDA device (nor the emulation): skipped\n");  \
            skip();                                                   \
        }                                                             \
    } while (0)

/* A fixed generator: the checks below hold for any inputs of the stated ranges. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double next_uniform(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1p-53;
}

/* f32 tensor on the device with values in [lo, hi). */
static spconv_tensor *device_floats(int ndim, const int64_t *sizes, double lo, double hi,
                                    float **host_copy) {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= sizes[i];
    float *v = (float *)malloc((size_t)n * sizeof *v);
    assert_non_null(v);
    for (int64_t i = 0; i < n; ++i) v[i] = (float)(lo + (hi - lo) * next_uniform());
    spconv_tensor *t = NULL;
    CHECK_OK(spconv_tensor_from_host(NULL, spconv_cuda(0), SPCONV_F32, ndim, sizes, v, &t));
    if (host_copy != NULL)
        *host_copy = v;
    else
        free(v);
    return t;
}

/* A dense block of sites, (0, z, y, x) for every cell of @p shape, on the device. */
static spconv_tensor *block_sites(const int64_t shape[3]) {
    const int64_t n = shape[0] * shape[1] * shape[2];
    int32_t *rows = (int32_t *)malloc((size_t)n * 4 * sizeof *rows);
    assert_non_null(rows);
    for (int64_t i = 0; i < n; ++i) {
        rows[4 * i] = 0;
        rows[4 * i + 1] = (int32_t)(i / (shape[1] * shape[2]));
        rows[4 * i + 2] = (int32_t)(i / shape[2] % shape[1]);
        rows[4 * i + 3] = (int32_t)(i % shape[2]);
    }
    const int64_t sizes[2] = {n, 4};
    spconv_tensor *t = NULL;
    CHECK_OK(spconv_tensor_from_host(NULL, spconv_cuda(0), SPCONV_I32, 2, sizes, rows, &t));
    free(rows);
    return t;
}

static spconv_rulebook *subm_rulebook(spconv_context *ctx, const spconv_tensor *sites,
                                      const int64_t shape[3], int64_t kernel) {
    spconv_conv_params p = spconv_conv_params_default(SPCONV_CONV_SUBM);
    for (int i = 0; i < 3; ++i) p.kernel[i] = kernel;
    spconv_rulebook *rb = NULL;
    CHECK_OK(spconv_rulebook_build(ctx, sites, shape, 1, &p, &rb));
    return rb;
}

/* A dense block of sites of @p shape with random features [n, c_in] and weights
 * [kernel_volume, c_in, c_out] in [-1, 1), all on the device. */
struct conv_operands {
    spconv_tensor *sites, *x, *w;
};

static conv_operands make_conv_operands(const int64_t shape[3], int64_t kernel_volume,
                                        int64_t c_in, int64_t c_out) {
    conv_operands o;
    o.sites = block_sites(shape);
    const int64_t n = spconv_tensor_size(o.sites, 0);
    const int64_t f_sizes[2] = {n, c_in}, w_sizes[3] = {kernel_volume, c_in, c_out};
    o.x = device_floats(2, f_sizes, -1, 1, NULL);
    o.w = device_floats(3, w_sizes, -1, 1, NULL);
    return o;
}

static void release_conv_operands(conv_operands *o) {
    spconv_tensor_release(o->sites);
    spconv_tensor_release(o->x);
    spconv_tensor_release(o->w);
}

static float *to_host(const spconv_tensor *t) {
    const size_t bytes = (size_t)spconv_tensor_numel(t) * sizeof(float);
    float *v = (float *)malloc(bytes > 0 ? bytes : 1);
    assert_non_null(v);
    CHECK_OK(spconv_tensor_copy_to_host(NULL, t, v, bytes));
    return v;
}

static void assert_same_bits(const spconv_tensor *a, const spconv_tensor *b) {
    assert_int_equal(spconv_tensor_numel(a), spconv_tensor_numel(b));
    float *x = to_host(a), *y = to_host(b);
    assert_memory_equal(x, y, (size_t)spconv_tensor_numel(a) * sizeof(float));
    free(x);
    free(y);
}

/* ---- an external stream ---------------------------------------------------------------------- */

static void test_external_stream_carries_the_work(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    spconv_context *ctx = NULL;
    CHECK_OK(spconv_context_create(spconv_cuda(0), &ctx));
    cudaStream_t own = (cudaStream_t)spconv_context_cuda_stream(ctx);
    cublasHandle_t handle = (cublasHandle_t)spconv_context_cublas_handle(ctx);
    assert_non_null(own);
    assert_non_null(handle);
    const int64_t shape[3] = {5, 4, 6};
    conv_operands o = make_conv_operands(shape, 27, 7, 5);
    spconv_tensor *x = o.x, *w = o.w;
    spconv_rulebook *rb = subm_rulebook(ctx, o.sites, shape, 3);
    spconv_tensor *y_own = NULL;
    CHECK_OK(spconv_conv_forward(ctx, rb, x, w, NULL, &y_own));

    cudaStream_t external = NULL;
    CHECK_CUDA(cudaStreamCreateWithFlags(&external, cudaStreamNonBlocking));
    CHECK_OK(spconv_context_set_cuda_stream(ctx, external));
    assert_ptr_equal(spconv_context_cuda_stream(ctx), external);
    cudaStream_t bound = NULL;
    CHECK_CUBLAS(cublasGetStream(handle, &bound));
    assert_ptr_equal(bound, external);
    spconv_tensor *y_ext = NULL, *dx = NULL;
    CHECK_OK(spconv_conv_forward(ctx, rb, x, w, NULL, &y_ext));
    CHECK_OK(spconv_conv_backward(ctx, rb, x, w, y_ext, &dx, NULL, NULL));
    CHECK_CUDA(cudaStreamSynchronize(external));
    assert_same_bits(y_own, y_ext);

    /* NULL goes back to the context's own stream, and the handle with it. */
    CHECK_OK(spconv_context_set_cuda_stream(ctx, NULL));
    assert_ptr_equal(spconv_context_cuda_stream(ctx), own);
    CHECK_CUBLAS(cublasGetStream(handle, &bound));
    assert_ptr_equal(bound, own);

    /* The context never destroys a stream it was given. */
    CHECK_OK(spconv_context_set_cuda_stream(ctx, external));
    spconv_rulebook_release(rb);
    spconv_context_destroy(ctx);
    CHECK_CUDA(cudaStreamSynchronize(external));
    CHECK_CUDA(cudaStreamDestroy(external));

    spconv_tensor *held[] = {y_own, y_ext, dx};
    for (size_t i = 0; i < sizeof held / sizeof held[0]; ++i) spconv_tensor_release(held[i]);
    release_conv_operands(&o);
}

/* The context's cuBLAS handle is the caller's to use too (spconv_context_cublas_handle): a caller
 * who binds it to a stream of their own, the device pointer mode, TF32 math or atomics for
 * products of their own does not move the context's products off its stream (where they would
 * race the gathers that feed them), make it read alpha and beta from device memory or change its
 * sums: each conv sets what it needs, and puts the caller's settings back when it ends. In the
 * emulation, work on a stream nobody waits for has not run, so products on the caller's stream
 * would leave the output unwritten, and TF32 math rounds the operands. */
static void test_a_caller_reconfigured_handle_does_not_move_the_products(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    spconv_context *ctx = NULL;
    CHECK_OK(spconv_context_create(spconv_cuda(0), &ctx));
    cublasHandle_t handle = (cublasHandle_t)spconv_context_cublas_handle(ctx);
    const int64_t shape[3] = {5, 4, 6};
    conv_operands o = make_conv_operands(shape, 27, 7, 5);
    spconv_rulebook *rb = subm_rulebook(ctx, o.sites, shape, 3);
    spconv_tensor *before = NULL, *after = NULL, *dx_before = NULL, *dx_after = NULL;
    CHECK_OK(spconv_conv_forward(ctx, rb, o.x, o.w, NULL, &before));
    CHECK_OK(spconv_conv_backward(ctx, rb, o.x, o.w, before, &dx_before, NULL, NULL));

    cudaStream_t mine = NULL;
    CHECK_CUDA(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking));
    CHECK_CUBLAS(cublasSetStream(handle, mine));
    CHECK_CUBLAS(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_DEVICE));
    CHECK_CUBLAS(cublasSetMathMode(handle, CUBLAS_TF32_TENSOR_OP_MATH));
    CHECK_CUBLAS(cublasSetAtomicsMode(handle, CUBLAS_ATOMICS_ALLOWED));
    CHECK_OK(spconv_conv_forward(ctx, rb, o.x, o.w, NULL, &after));
    CHECK_OK(spconv_conv_backward(ctx, rb, o.x, o.w, before, &dx_after, NULL, NULL));
    assert_same_bits(before, after);
    assert_same_bits(dx_before, dx_after);
    /* and the caller's settings are theirs again */
    cudaStream_t bound = NULL;
    cublasPointerMode_t pointer_mode = CUBLAS_POINTER_MODE_HOST;
    cublasMath_t math = CUBLAS_DEFAULT_MATH;
    cublasAtomicsMode_t atomics = CUBLAS_ATOMICS_NOT_ALLOWED;
    CHECK_CUBLAS(cublasGetStream(handle, &bound));
    CHECK_CUBLAS(cublasGetPointerMode(handle, &pointer_mode));
    CHECK_CUBLAS(cublasGetMathMode(handle, &math));
    CHECK_CUBLAS(cublasGetAtomicsMode(handle, &atomics));
    assert_ptr_equal(bound, mine);
    assert_int_equal(pointer_mode, CUBLAS_POINTER_MODE_DEVICE);
    assert_int_equal(math, CUBLAS_TF32_TENSOR_OP_MATH);
    assert_int_equal(atomics, CUBLAS_ATOMICS_ALLOWED);

    spconv_rulebook_release(rb);
    spconv_context_destroy(ctx);
    CHECK_CUDA(cudaStreamSynchronize(mine));
    CHECK_CUDA(cudaStreamDestroy(mine));
    spconv_tensor *held[] = {before, after, dx_before, dx_after};
    for (size_t i = 0; i < sizeof held / sizeof held[0]; ++i) spconv_tensor_release(held[i]);
    release_conv_operands(&o);
}

/* The ops do not wait for their work before returning, so that a network's layers only queue;
 * calls with a context and calls without one (the legacy default stream) are still ordered both
 * ways, since the context's own stream is a blocking one: a value written by a call without a
 * context is what a context's conv reads, and a context's output is what a copy without a context
 * reads. (In the emulation work runs only when waited for, so a missing order shows here; on a GPU
 * such small kernels usually finish in time anyway, so there it mostly guards the emulation.) */
static void test_context_and_null_context_calls_are_ordered(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    spconv_context *ctx = NULL;
    CHECK_OK(spconv_context_create(spconv_cuda(0), &ctx));
    const int64_t shape[3] = {3, 4, 5};
    conv_operands o = make_conv_operands(shape, 27, 3, 3);
    spconv_tensor *x = o.x, *w = o.w;
    spconv_rulebook *rb = subm_rulebook(ctx, o.sites, shape, 3);
    /* y for an input of ones; an input of v = 2^k gives v * y exactly. */
    CHECK_OK(spconv_tensor_fill(NULL, x, 1.0));
    spconv_tensor *y_ones = NULL;
    CHECK_OK(spconv_conv_forward(NULL, rb, x, w, NULL, &y_ones));
    float *ones = to_host(y_ones);
    const int64_t count = spconv_tensor_numel(y_ones);
    spconv_tensor_release(y_ones);
    for (int k = 1; k <= 3; ++k) {
        const float value = (float)(1 << k);
        CHECK_OK(spconv_tensor_fill(NULL, x, value)); /* written without a context */
        spconv_tensor *y = NULL;
        CHECK_OK(spconv_conv_forward(ctx, rb, x, w, NULL, &y)); /* read with one */
        float *got = to_host(y);                                /* read back without one */
        for (int64_t i = 0; i < count; ++i)
            if (got[i] != value * ones[i])
                fail_msg("input %g, element %lld: %g, not %g", (double)value, (long long)i,
                         (double)got[i], (double)(value * ones[i]));
        free(got);
        spconv_tensor_release(y);
    }
    free(ones);
    spconv_rulebook_release(rb);
    spconv_context_destroy(ctx);
    release_conv_operands(&o);
}

/* ---- a stream-ordered pool as the allocator hook ---------------------------------------------
 * What context.h asks of a CUDA hook, and no more: a freed block may still be in use by work
 * queued on the context's stream, and may be handed out again at once to work queued after it.
 * This pool does exactly that, and queues a fill of 0xff bytes on the context's stream when a
 * block comes back, so any work that reads a block after the library gave it back (or that runs
 * on another stream, unordered with the fill) sees garbage. The ops' results must not change. */
#define POOL_BLOCKS 512
typedef struct stream_pool {
    spconv_context *ctx;
    void *blocks[POOL_BLOCKS];
    size_t sizes[POOL_BLOCKS];
    int in_use[POOL_BLOCKS];
    int count, reused;
} stream_pool;

static void *pool_alloc(size_t nbytes, spconv_device device, void *user) {
    stream_pool *p = (stream_pool *)user;
    (void)device;
    for (int i = 0; i < p->count; ++i)
        if (!p->in_use[i] && p->sizes[i] >= nbytes) {
            p->in_use[i] = 1;
            p->reused++;
            return p->blocks[i];
        }
    if (p->count == POOL_BLOCKS) return NULL;
    void *block = NULL;
    if (cudaMalloc(&block, nbytes > 0 ? nbytes : 1) != cudaSuccess) return NULL;
    p->blocks[p->count] = block;
    p->sizes[p->count] = nbytes;
    p->in_use[p->count++] = 1;
    return block;
}

static void pool_free(void *ptr, size_t nbytes, spconv_device device, void *user) {
    stream_pool *p = (stream_pool *)user;
    (void)device;
    for (int i = 0; i < p->count; ++i)
        if (p->blocks[i] == ptr) {
            (void)cudaMemsetAsync(ptr, 0xff, nbytes,
                                  (cudaStream_t)spconv_context_cuda_stream(p->ctx));
            p->in_use[i] = 0;
            return;
        }
    fail_msg("pool_free: %p is not a block of the pool", ptr);
}

static void test_ops_are_right_with_a_stream_ordered_pool(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    stream_pool pool;
    memset(&pool, 0, sizeof pool);
    CHECK_OK(spconv_context_create(spconv_cuda(0), &pool.ctx));
    CHECK_OK(spconv_context_set_allocator(pool.ctx, pool_alloc, pool_free, &pool));
    const int64_t shape[3] = {6, 5, 7};
    conv_operands o = make_conv_operands(shape, 27, 5, 6);
    spconv_tensor *sites = o.sites, *x = o.x, *w = o.w;
    spconv_conv_params params = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    for (int i = 0; i < 3; ++i) params.kernel[i] = 3, params.stride[i] = 2, params.padding[i] = 1;
    for (int round = 0; round < 3; ++round) { /* later rounds run on reused, poisoned blocks */
        spconv_rulebook *rb = NULL, *rb_plain = NULL;
        CHECK_OK(spconv_rulebook_build(pool.ctx, sites, shape, 1, &params, &rb));
        CHECK_OK(spconv_rulebook_build(NULL, sites, shape, 1, &params, &rb_plain));
        assert_same_bits(spconv_rulebook_out_indices(rb), spconv_rulebook_out_indices(rb_plain));
        spconv_tensor *y = NULL, *y_plain = NULL, *dx = NULL, *dx_plain = NULL, *dw = NULL,
                      *dw_plain = NULL, *m = NULL, *m_plain = NULL, *arg = NULL, *arg_plain = NULL;
        CHECK_OK(spconv_conv_forward(pool.ctx, rb, x, w, NULL, &y));
        CHECK_OK(spconv_conv_forward(NULL, rb_plain, x, w, NULL, &y_plain));
        CHECK_OK(spconv_conv_backward(pool.ctx, rb, x, w, y, &dx, &dw, NULL));
        CHECK_OK(spconv_conv_backward(NULL, rb_plain, x, w, y_plain, &dx_plain, &dw_plain, NULL));
        CHECK_OK(spconv_maxpool_forward(pool.ctx, rb, x, &m, &arg));
        CHECK_OK(spconv_maxpool_forward(NULL, rb_plain, x, &m_plain, &arg_plain));
        spconv_tensor *dense = NULL, *f = NULL, *idx = NULL, *f_plain = NULL, *idx_plain = NULL;
        CHECK_OK(spconv_sparse_to_dense(pool.ctx, x, sites, shape, 1, &dense));
        CHECK_OK(spconv_dense_to_sparse(pool.ctx, dense, &f, &idx));
        CHECK_OK(spconv_dense_to_sparse(NULL, dense, &f_plain, &idx_plain));
        const spconv_tensor *got[] = {y, dx, dw, m, f};
        const spconv_tensor *want[] = {y_plain, dx_plain, dw_plain, m_plain, f_plain};
        for (size_t i = 0; i < sizeof got / sizeof got[0]; ++i) assert_same_bits(got[i], want[i]);
        spconv_tensor *all[] = {y, y_plain, dx, dx_plain, dw, dw_plain, m, m_plain, arg,
                                arg_plain, dense, f, idx, f_plain, idx_plain};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) spconv_tensor_release(all[i]);
        spconv_rulebook_release(rb);
        spconv_rulebook_release(rb_plain);
    }
    assert_true(pool.reused > 0);
    spconv_context_destroy(pool.ctx);
    for (int i = 0; i < pool.count; ++i) {
        if (pool.in_use[i]) fail_msg("block %d of the pool was never given back", i);
        CHECK_CUDA(cudaFree(pool.blocks[i]));
    }
    release_conv_operands(&o);
}

/* ---- the backend's own stream-ordered pool ----------------------------------------------------
 * Without a hook, the memory of calls comes from the backend's pool and goes back on the legacy
 * stream, after the work queued before on every blocking stream: an input released while a conv
 * that reads it is still queued is not overwritten under it (the emulation fills a block with
 * 0xfe when its free is reached), and neither the op nor the releases make the host wait (the
 * emulation counts waits). A context on a caller's non-blocking stream, which the legacy stream
 * does not order, gets cudaMalloc / cudaFree, which waits; while it works there, every pool free
 * waits for the device too (a pool block may be in use on that stream), and once it has left the
 * stream, pool frees are stream-ordered again. */
static unsigned long long host_waits(void) {
#if SPCONV_CUDA_EMULATION
    return spconv__cuda_emulation_host_waits();
#else
    return 0; /* a GPU run checks the results only */
#endif
}

static void test_the_backends_pool_gives_memory_back_in_stream_order(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    spconv_context *ctx = NULL;
    CHECK_OK(spconv_context_create(spconv_cuda(0), &ctx));
    const int64_t shape[3] = {5, 6, 4};
    conv_operands o = make_conv_operands(shape, 27, 4, 5);
    spconv_rulebook *rb = subm_rulebook(ctx, o.sites, shape, 3);
    spconv_tensor *want = NULL;
    CHECK_OK(spconv_conv_forward(ctx, rb, o.x, o.w, NULL, &want));
    CHECK_OK(spconv_context_synchronize(ctx));
    for (int round = 0; round < 3; ++round) {
        spconv_tensor *x = NULL; /* a copy of the features, released while the conv is queued */
        CHECK_OK(spconv_tensor_clone(ctx, o.x, &x));
        const unsigned long long before = host_waits();
        spconv_tensor *y = NULL;
        CHECK_OK(spconv_conv_forward(ctx, rb, x, o.w, NULL, &y));
        spconv_tensor_release(x);
        spconv_tensor *scratch = NULL; /* more blocks taken and given back, queued after it */
        CHECK_OK(spconv_tensor_clone(ctx, y, &scratch));
        spconv_tensor_release(scratch);
        assert_int_equal(host_waits() - before, 0);
        assert_same_bits(y, want);
        spconv_tensor_release(y);
    }
    /* A non-blocking stream of the caller's: its blocks go back through cudaFree, and a pool
     * block (made without a context) that its conv reads waits for the device when released. */
    cudaStream_t external = NULL;
    CHECK_CUDA(cudaStreamCreateWithFlags(&external, cudaStreamNonBlocking));
    CHECK_OK(spconv_context_set_cuda_stream(ctx, external));
    spconv_tensor *x = NULL, *y = NULL, *pooled = NULL;
    CHECK_OK(spconv_tensor_clone(ctx, o.x, &x));
    CHECK_OK(spconv_tensor_clone(NULL, o.x, &pooled));
    CHECK_OK(spconv_conv_forward(ctx, rb, x, o.w, NULL, &y));
    spconv_tensor *y_pooled = NULL;
    CHECK_OK(spconv_conv_forward(ctx, rb, pooled, o.w, NULL, &y_pooled));
    unsigned long long before = host_waits();
    spconv_tensor_release(x);
    if (SPCONV_CUDA_EMULATION) assert_true(host_waits() - before > 0);
    before = host_waits();
    spconv_tensor_release(pooled);
    if (SPCONV_CUDA_EMULATION) assert_true(host_waits() - before > 0);
    CHECK_OK(spconv_context_synchronize(ctx));
    assert_same_bits(y, want);
    assert_same_bits(y_pooled, want);
    spconv_tensor_release(y);
    spconv_tensor_release(y_pooled);
    CHECK_OK(spconv_context_set_cuda_stream(ctx, NULL));
    CHECK_OK(spconv_tensor_clone(NULL, o.x, &pooled)); /* ordered again: no wait */
    before = host_waits();
    spconv_tensor_release(pooled);
    assert_int_equal(host_waits() - before, 0);
    spconv_tensor_release(want);
    spconv_rulebook_release(rb);
    spconv_context_destroy(ctx);
    CHECK_CUDA(cudaStreamDestroy(external));
    release_conv_operands(&o);
}

static void test_a_dead_stream_is_refused(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    spconv_context *ctx = NULL;
    CHECK_OK(spconv_context_create(spconv_cuda(0), &ctx));
    void *own = spconv_context_cuda_stream(ctx);
    cudaStream_t gone = NULL;
    CHECK_CUDA(cudaStreamCreate(&gone));
    CHECK_CUDA(cudaStreamDestroy(gone));
    /* Only the emulation can say that a destroyed handle is dead; a GPU may not notice. */
#if SPCONV_CUDA_EMULATION
    assert_int_equal(spconv_context_set_cuda_stream(ctx, gone), SPCONV_ERR_CUDA);
    assert_non_null(strstr(spconv_last_error(), "spconv_context_set_cuda_stream: stream"));
    assert_ptr_equal(spconv_context_cuda_stream(ctx), own);
#endif
    (void)own;
    spconv_context_destroy(ctx);
}

/* ---- f32 products: full f32 by default, TF32 when allowed ---------------------------------- */

/* A 1x1x1 submanifold conv is one product, out = x @ W[0], on the features themselves: what it
 * gives is exactly what the context's product gives. */
struct product_case {
    spconv_tensor *sites, *x, *w;
    float *x_host, *w_host;
    spconv_rulebook *rb;
    int64_t n, c_in, c_out;
};

static product_case make_product_case(spconv_context *ctx, const int64_t shape[3], int64_t c_in,
                                      int64_t c_out, double lo, double hi) {
    product_case p = {};
    p.sites = block_sites(shape);
    p.n = spconv_tensor_size(p.sites, 0);
    p.c_in = c_in;
    p.c_out = c_out;
    const int64_t f_sizes[2] = {p.n, c_in}, w_sizes[3] = {1, c_in, c_out};
    p.x = device_floats(2, f_sizes, lo, hi, &p.x_host);
    p.w = device_floats(3, w_sizes, lo, hi, &p.w_host);
    p.rb = subm_rulebook(ctx, p.sites, shape, 1);
    return p;
}

static void release_product_case(product_case *p) {
    spconv_rulebook_release(p->rb);
    spconv_tensor_release(p->sites);
    spconv_tensor_release(p->x);
    spconv_tensor_release(p->w);
    free(p->x_host);
    free(p->w_host);
}

static void test_f32_products_by_default_are_sgemm_bit_for_bit(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    spconv_context *ctx = NULL;
    CHECK_OK(spconv_context_create(spconv_cuda(0), &ctx));
    assert_int_equal(spconv_context_allow_tf32(ctx), 0);
    const int64_t shape[3] = {3, 5, 7};
    product_case p = make_product_case(ctx, shape, 19, 23, -1, 1);
    spconv_tensor *y = NULL, *y_default = NULL;
    CHECK_OK(spconv_conv_forward(ctx, p.rb, p.x, p.w, NULL, &y));
    CHECK_OK(spconv_conv_forward(NULL, p.rb, p.x, p.w, NULL, &y_default));
    assert_same_bits(y, y_default);

    /* cublasSgemm on the same operands, accumulated into zeros as the executor does: row-major
     * y [n, c_out] = x [n, c_in] W [c_in, c_out] is column-major y^T = W^T x^T. */
    float *c = NULL;
    const size_t bytes = (size_t)(p.n * p.c_out) * sizeof(float);
    CHECK_CUDA(cudaMalloc((void **)&c, bytes));
    CHECK_CUDA(cudaMemset(c, 0, bytes));
    cublasHandle_t h = NULL;
    CHECK_CUBLAS(cublasCreate(&h));
    const float one = 1.0f;
    CHECK_CUBLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)p.c_out, (int)p.n, (int)p.c_in,
                             &one, (const float *)spconv_tensor_data(p.w), (int)p.c_out,
                             (const float *)spconv_tensor_data(p.x), (int)p.c_in, &one, c,
                             (int)p.c_out));
    CHECK_CUDA(cudaDeviceSynchronize());
    float *expected = (float *)malloc(bytes);
    assert_non_null(expected);
    CHECK_CUDA(cudaMemcpy(expected, c, bytes, cudaMemcpyDeviceToHost));
    float *got = to_host(y);
    assert_memory_equal(got, expected, bytes);
    free(got);
    free(expected);
    CHECK_CUBLAS(cublasDestroy(h));
    CHECK_CUDA(cudaFree(c));
    spconv_tensor_release(y);
    spconv_tensor_release(y_default);
    release_product_case(&p);
    spconv_context_destroy(ctx);
}

/* 1 when cuBLAS's own TF32 product of p's operands (cublasGemmEx, CUBLAS_COMPUTE_32F_FAST_TF32,
 * as the executor calls it) has the bits of @p f32 (the f32 product, host). */
static int tf32_gemm_equals(const product_case *p, const float *f32) {
    float *c = NULL;
    const size_t bytes = (size_t)(p->n * p->c_out) * sizeof(float);
    CHECK_CUDA(cudaMalloc((void **)&c, bytes));
    CHECK_CUDA(cudaMemset(c, 0, bytes));
    cublasHandle_t h = NULL;
    CHECK_CUBLAS(cublasCreate(&h));
    const float one = 1.0f;
    CHECK_CUBLAS(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)p->c_out, (int)p->n, (int)p->c_in,
                              &one, spconv_tensor_data(p->w), CUDA_R_32F, (int)p->c_out,
                              spconv_tensor_data(p->x), CUDA_R_32F, (int)p->c_in, &one, c,
                              CUDA_R_32F, (int)p->c_out, CUBLAS_COMPUTE_32F_FAST_TF32,
                              CUBLAS_GEMM_DEFAULT));
    CHECK_CUDA(cudaDeviceSynchronize());
    float *host = (float *)malloc(bytes);
    assert_non_null(host);
    CHECK_CUDA(cudaMemcpy(host, c, bytes, cudaMemcpyDeviceToHost));
    const int same = memcmp(host, f32, bytes) == 0;
    free(host);
    CHECK_CUBLAS(cublasDestroy(h));
    CHECK_CUDA(cudaFree(c));
    return same;
}

static void test_tf32_products_only_when_allowed(void **state) {
    (void)state;
    SKIP_WITHOUT_DEVICE();
    spconv_context *ctx = NULL;
    CHECK_OK(spconv_context_create(spconv_cuda(0), &ctx));
    /* Sizes a tensor core takes (multiples of 16, large enough that cuBLAS's heuristics pick
     * one), operands in [1, 2) with full significands, which TF32 cannot hold. */
    const int64_t shape[3] = {8, 8, 8}, k = 64;
    product_case p = make_product_case(ctx, shape, k, 64, 1, 2);
    spconv_tensor *y_f32 = NULL, *y_tf32 = NULL, *y_off_again = NULL;
    CHECK_OK(spconv_conv_forward(ctx, p.rb, p.x, p.w, NULL, &y_f32));
    CHECK_OK(spconv_context_set_allow_tf32(ctx, 1));
    CHECK_OK(spconv_conv_forward(ctx, p.rb, p.x, p.w, NULL, &y_tf32));
    CHECK_OK(spconv_context_set_allow_tf32(ctx, 0));
    CHECK_OK(spconv_conv_forward(ctx, p.rb, p.x, p.w, NULL, &y_off_again));
    assert_same_bits(y_f32, y_off_again);

    /* Each term a b with a and b rounded to 10 mantissa bits is within (2u + u^2) |a b| of the
     * exact one (u = 2^-10 covers rounding to nearest and truncation), and the f32 sum of the k
     * terms adds at most gamma_k of their absolute sum. */
    float *f32 = to_host(y_f32), *tf32 = to_host(y_tf32);
    const double u = ldexp(1.0, -10), uf = ldexp(1.0, -24);
    const double gamma_k = (double)k * uf / (1.0 - (double)k * uf);
    int64_t differing = 0;
    for (int64_t r = 0; r < p.n; ++r)
        for (int64_t j = 0; j < p.c_out; ++j) {
            double exact = 0.0, absolute = 0.0;
            for (int64_t q = 0; q < k; ++q) {
                const double term = (double)p.x_host[r * k + q] * (double)p.w_host[q * p.c_out + j];
                exact += term;
                absolute += fabs(term);
            }
            const double bound = (2 * u + u * u + gamma_k * (1 + u) * (1 + u)) * absolute;
            const float got = tf32[r * p.c_out + j];
            if (fabs((double)got - exact) > bound)
                fail_msg("row %lld column %lld: TF32 product %.9g, exact %.9g, bound %.3g",
                         (long long)r, (long long)j, (double)got, exact, bound);
            /* The f32 product holds the tighter bound. */
            assert_true(fabs((double)f32[r * p.c_out + j] - exact) <= gamma_k * absolute);
            if (got != f32[r * p.c_out + j]) ++differing;
        }
    /* cuBLAS only may use TF32: where its own TF32 product of these operands equals the f32 one
     * too, it chose no TF32 kernel and the setting cannot be seen here. */
    const int no_tf32_kernel = differing == 0 && tf32_gemm_equals(&p, f32);
    free(f32);
    free(tf32);
    spconv_tensor_release(y_f32);
    spconv_tensor_release(y_tf32);
    spconv_tensor_release(y_off_again);
    release_product_case(&p);
    spconv_context_destroy(ctx);
    if (no_tf32_kernel) {
        print_message("cuBLAS chose no TF32 kernel for this product on this device: skipped\n");
        skip();
    }
    if (differing == 0)
        fail_msg("TF32 products equal the f32 ones: the setting did not reach cuBLAS");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_external_stream_carries_the_work),
        cmocka_unit_test(test_a_caller_reconfigured_handle_does_not_move_the_products),
        cmocka_unit_test(test_context_and_null_context_calls_are_ordered),
        cmocka_unit_test(test_ops_are_right_with_a_stream_ordered_pool),
        cmocka_unit_test(test_the_backends_pool_gives_memory_back_in_stream_order),
        cmocka_unit_test(test_a_dead_stream_is_refused),
        cmocka_unit_test(test_f32_products_by_default_are_sgemm_bit_for_bit),
        cmocka_unit_test(test_tf32_products_only_when_allowed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
