/* What a framework sets on a context (context.h): the allocator hook (the tensors made with the
 * context and, on the CUDA backend, op outputs and temporaries come from it and go back to it,
 * every one by the time they are released; NULL from the hook is SPCONV_ERR_OUT_OF_MEMORY naming
 * it), the external CUDA stream's argument checks and the TF32 setting. The CPU cases run
 * everywhere; the CUDA cases run on a GPU or in the host emulation (tools/test.sh
 * --emulate-cuda) and skip elsewhere. Streams and TF32 products on the device are checked by
 * tests/test_cuda_context.cu, which can make streams and call cuBLAS itself. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "spconv/spconv.h"

/* ---- a counting allocator -------------------------------------------------------------------- */

#define MAX_BLOCKS 256

/* What the hook saw, through its user data. Memory comes from the library's own allocator of the
 * device (a storage), so that the hook works on the CPU and on CUDA alike. */
typedef struct counting_allocator {
    int allocs, frees;
    size_t live_bytes;
    int fail;                        /* 1: return NULL */
    int fail_at;                     /* > 0: the fail_at-th request (from 1) returns NULL */
    int requests;                    /* requests seen, failed ones included */
    int misalign;                    /* 1: return a pointer 8 bytes past an aligned block */
    int bad_frees;                   /* frees of a pointer the hook did not hand out, or twice */
    spconv_device last_device;
    void *ptrs[MAX_BLOCKS];          /* what was handed out, NULL once freed */
    spconv_storage *blocks[MAX_BLOCKS];
    size_t sizes[MAX_BLOCKS];
} counting_allocator;

static void *counting_alloc(size_t nbytes, spconv_device device, void *user) {
    counting_allocator *a = user;
    a->last_device = device;
    a->requests++;
    if (a->fail || a->requests == a->fail_at || a->allocs == MAX_BLOCKS) return NULL;
    spconv_storage *block = NULL;
    /* Spare bytes to align the block's start to 256 (CPU storages are 64-byte aligned) and to
     * hand out a misaligned pointer when asked. */
    const size_t align = SPCONV_ALLOCATOR_ALIGNMENT;
    if (spconv_storage_create(device, nbytes + align + 8, &block) != SPCONV_OK) return NULL;
    const uintptr_t start = (uintptr_t)spconv_storage_data(block);
    char *p = (char *)spconv_storage_data(block) + (align - start % align) % align;
    if (a->misalign) p += 8;
    a->blocks[a->allocs] = block;
    a->ptrs[a->allocs] = p;
    a->sizes[a->allocs] = nbytes;
    a->allocs++;
    a->live_bytes += nbytes;
    return p;
}

static void counting_free(void *ptr, size_t nbytes, spconv_device device, void *user) {
    counting_allocator *a = user;
    for (int i = 0; i < a->allocs; ++i) {
        if (a->ptrs[i] == ptr && a->sizes[i] == nbytes &&
            spconv_device_equal(device, a->last_device)) {
            spconv_storage_release(a->blocks[i]);
            a->ptrs[i] = NULL;
            a->blocks[i] = NULL;
            a->frees++;
            a->live_bytes -= nbytes;
            return;
        }
    }
    a->bad_frees++;
}

/* 1 when @p data is a block the hook handed out and has not had back. */
static int from_hook(const counting_allocator *a, const void *data) {
    for (int i = 0; i < a->allocs; ++i)
        if (a->ptrs[i] != NULL && a->ptrs[i] == data) return 1;
    return 0;
}

static void assert_all_returned(const counting_allocator *a) {
    assert_int_equal(a->bad_frees, 0);
    assert_int_equal(a->frees, a->allocs);
    assert_int_equal(a->live_bytes, 0);
}

static int have_cuda(void) {
    spconv_tensor *t = NULL;
    const int64_t one = 1;
    if (spconv_tensor_empty(spconv_cuda(0), SPCONV_F32, 1, &one, &t) != SPCONV_OK) return 0;
    spconv_tensor_release(t);
    return 1;
}

/* ---- the hook on a CPU context ------------------------------------------------------------- */

static void test_cpu_tensors_come_from_the_hook(void **state) {
    (void)state;
    counting_allocator a = {0};
    spconv_context *ctx = NULL;
    SPCONV_ASSERT_OK(spconv_context_create(spconv_cpu(), &ctx));
    SPCONV_ASSERT_OK(spconv_context_set_allocator(ctx, counting_alloc, counting_free, &a));
    const int64_t sizes[2] = {3, 5};
    const float host[15] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    spconv_tensor *z = NULL, *h = NULL, *c = NULL, *d = NULL, *r = NULL, *t = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_zeros(ctx, spconv_cpu(), SPCONV_F32, 2, sizes, &z));
    SPCONV_ASSERT_OK(spconv_tensor_from_host(ctx, spconv_cpu(), SPCONV_F32, 2, sizes, host, &h));
    SPCONV_ASSERT_OK(spconv_tensor_clone(ctx, h, &c));
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(ctx, h, SPCONV_F64, &d));
    SPCONV_ASSERT_OK(spconv_tensor_arange(ctx, spconv_cpu(), SPCONV_I32, 0, 7, 1, &r));
    SPCONV_ASSERT_OK(spconv_tensor_transpose(h, 0, 1, &t));
    spconv_tensor *packed = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_contiguous(ctx, t, &packed));
    spconv_tensor *made[] = {z, h, c, d, r, packed};
    for (size_t i = 0; i < sizeof made / sizeof made[0]; ++i)
        assert_true(from_hook(&a, spconv_tensor_data(made[i])));
    assert_int_equal(a.last_device.type, SPCONV_DEVICE_CPU);
    assert_true(spconv_tensor_data(h) != NULL &&
                ((uintptr_t)spconv_tensor_data(h) % SPCONV_ALLOCATOR_ALIGNMENT) == 0);
    assert_memory_equal(spconv_tensor_data(c), host, sizeof host);
    assert_int_equal(((const int32_t *)spconv_tensor_data(r))[6], 6);
    /* The workspace too; it goes back when the context does. */
    void *ws = NULL;
    SPCONV_ASSERT_OK(spconv_context_workspace(ctx, 1000, &ws));
    assert_true(from_hook(&a, ws));
    const int before_destroy = a.frees;
    spconv_context_destroy(ctx);
    assert_int_equal(a.frees, before_destroy + 1);
    /* Tensors outlive the context and still go back through the hook. */
    assert_int_equal(a.allocs, 7);
    for (size_t i = 0; i < sizeof made / sizeof made[0]; ++i) spconv_tensor_release(made[i]);
    spconv_tensor_release(t);
    assert_all_returned(&a);
}

static void test_calls_without_the_context_do_not_use_the_hook(void **state) {
    (void)state;
    counting_allocator a = {0};
    spconv_context *ctx = NULL;
    SPCONV_ASSERT_OK(spconv_context_create(spconv_cpu(), &ctx));
    SPCONV_ASSERT_OK(spconv_context_set_allocator(ctx, counting_alloc, counting_free, &a));
    const int64_t n = 4;
    spconv_tensor *e = NULL, *z = NULL, *empty = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_empty(spconv_cpu(), SPCONV_F32, 1, &n, &e));
    SPCONV_ASSERT_OK(spconv_tensor_zeros(NULL, spconv_cpu(), SPCONV_F32, 1, &n, &z));
    /* Zero bytes: no memory, so no call. */
    const int64_t none = 0;
    SPCONV_ASSERT_OK(spconv_tensor_zeros(ctx, spconv_cpu(), SPCONV_F32, 1, &none, &empty));
    assert_int_equal(a.allocs, 0);
    spconv_tensor_release(e);
    spconv_tensor_release(z);
    spconv_tensor_release(empty);
    /* Both NULL restore the library's allocator. */
    SPCONV_ASSERT_OK(spconv_context_set_allocator(ctx, NULL, NULL, NULL));
    SPCONV_ASSERT_OK(spconv_tensor_zeros(ctx, spconv_cpu(), SPCONV_F32, 1, &n, &z));
    assert_int_equal(a.allocs, 0);
    spconv_tensor_release(z);
    spconv_context_destroy(ctx);
}

static void test_hook_returning_null_is_out_of_memory(void **state) {
    (void)state;
    counting_allocator a = {0};
    a.fail = 1;
    spconv_context *ctx = NULL;
    SPCONV_ASSERT_OK(spconv_context_create(spconv_cpu(), &ctx));
    SPCONV_ASSERT_OK(spconv_context_set_allocator(ctx, counting_alloc, counting_free, &a));
    const int64_t sizes[2] = {10, 10};
    spconv_tensor *z = (spconv_tensor *)&a;
    SPCONV_ASSERT_FAILS(spconv_tensor_zeros(ctx, spconv_cpu(), SPCONV_F64, 2, sizes, &z),
                        SPCONV_ERR_OUT_OF_MEMORY,
                        "spconv_tensor_zeros: the context's allocator hook "
                        "(spconv_context_set_allocator) returned NULL for 800 bytes on cpu");
    assert_null(z);
    void *ws = &a;
    SPCONV_ASSERT_FAILS(spconv_context_workspace(ctx, 64, &ws), SPCONV_ERR_OUT_OF_MEMORY,
                        "spconv_context_workspace: the context's allocator hook");
    assert_null(ws);
    spconv_context_destroy(ctx);
    assert_int_equal(a.allocs, 0);
}

static void test_misaligned_memory_is_given_back_and_refused(void **state) {
    (void)state;
    counting_allocator a = {0};
    a.misalign = 1;
    spconv_context *ctx = NULL;
    SPCONV_ASSERT_OK(spconv_context_create(spconv_cpu(), &ctx));
    SPCONV_ASSERT_OK(spconv_context_set_allocator(ctx, counting_alloc, counting_free, &a));
    const int64_t n = 3;
    spconv_tensor *z = NULL;
    SPCONV_ASSERT_FAILS(spconv_tensor_zeros(ctx, spconv_cpu(), SPCONV_F32, 1, &n, &z),
                        SPCONV_ERR_INVALID_ARGUMENT, "which is not aligned to 256 bytes");
    assert_null(z);
    assert_int_equal(a.allocs, 1);
    assert_all_returned(&a);
    spconv_context_destroy(ctx);
}

static void test_setter_arguments(void **state) {
    (void)state;
    counting_allocator a = {0};
    spconv_context *ctx = NULL;
    SPCONV_ASSERT_OK(spconv_context_create(spconv_cpu(), &ctx));
    SPCONV_ASSERT_FAILS(spconv_context_set_allocator(NULL, counting_alloc, counting_free, &a),
                        SPCONV_ERR_NULL_POINTER, "'ctx' is NULL");
    SPCONV_ASSERT_FAILS(spconv_context_set_allocator(ctx, counting_alloc, NULL, &a),
                        SPCONV_ERR_INVALID_ARGUMENT, "alloc_fn is set but free_fn is NULL");
    SPCONV_ASSERT_FAILS(spconv_context_set_allocator(ctx, NULL, counting_free, &a),
                        SPCONV_ERR_INVALID_ARGUMENT, "alloc_fn is NULL but free_fn is set");
    /* A refused setting changes nothing. */
    const int64_t n = 2;
    spconv_tensor *z = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_zeros(ctx, spconv_cpu(), SPCONV_F32, 1, &n, &z));
    assert_int_equal(a.allocs, 0);
    spconv_tensor_release(z);
    /* Changing the allocator gives the workspace back to the one that made it. */
    void *ws = NULL;
    SPCONV_ASSERT_OK(spconv_context_set_allocator(ctx, counting_alloc, counting_free, &a));
    SPCONV_ASSERT_OK(spconv_context_workspace(ctx, 100, &ws));
    assert_int_equal(a.allocs, 1);
    SPCONV_ASSERT_OK(spconv_context_set_allocator(ctx, NULL, NULL, NULL));
    assert_all_returned(&a);
    SPCONV_ASSERT_OK(spconv_context_workspace(ctx, 100, &ws));
    assert_int_equal(a.allocs, 1);

    SPCONV_ASSERT_FAILS(spconv_context_set_cuda_stream(ctx, NULL), SPCONV_ERR_INVALID_ARGUMENT,
                        "spconv_context_set_cuda_stream: the context is on the cpu backend");
    SPCONV_ASSERT_FAILS(spconv_context_set_cuda_stream(NULL, NULL), SPCONV_ERR_NULL_POINTER,
                        "'ctx' is NULL");
    assert_null(spconv_context_cuda_stream(ctx));

    assert_int_equal(spconv_context_allow_tf32(ctx), 0);
    assert_int_equal(spconv_context_allow_tf32(NULL), 0);
    SPCONV_ASSERT_OK(spconv_context_set_allow_tf32(ctx, 5));
    assert_int_equal(spconv_context_allow_tf32(ctx), 1);
    SPCONV_ASSERT_OK(spconv_context_set_allow_tf32(ctx, 0));
    assert_int_equal(spconv_context_allow_tf32(ctx), 0);
    SPCONV_ASSERT_FAILS(spconv_context_set_allow_tf32(NULL, 1), SPCONV_ERR_NULL_POINTER,
                        "'ctx' is NULL");
    spconv_context_destroy(ctx);
}

/* ---- the hook on a CUDA context ------------------------------------------------------------ */

/* Distinct random sites of a small grid on the host, int32 [n, 4]. */
static spconv_tensor *random_sites(int64_t batch, const int64_t shape[3], double density) {
    const int64_t cells = batch * shape[0] * shape[1] * shape[2];
    int32_t *rows = malloc((size_t)cells * 4 * sizeof *rows);
    assert_non_null(rows);
    int64_t n = 0;
    for (int64_t b = 0; b < batch; ++b)
        for (int64_t z = 0; z < shape[0]; ++z)
            for (int64_t y = 0; y < shape[1]; ++y)
                for (int64_t x = 0; x < shape[2]; ++x)
                    if (spconv_test_rand_double(0, 1) < density || n == 0) {
                        int32_t *r = rows + 4 * n++;
                        r[0] = (int32_t)b, r[1] = (int32_t)z, r[2] = (int32_t)y, r[3] = (int32_t)x;
                    }
    const int64_t sizes[2] = {n, 4};
    spconv_tensor *t = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_I32, 2, sizes, rows, &t));
    free(rows);
    return t;
}

static spconv_tensor *random_floats(spconv_device device, int ndim, const int64_t *sizes) {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= sizes[i];
    float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    assert_non_null(v);
    for (int64_t i = 0; i < n; ++i) v[i] = spconv_test_rand_float(-1, 1);
    spconv_tensor *t = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, device, SPCONV_F32, ndim, sizes, v, &t));
    free(v);
    return t;
}

/* The CPU executors' outputs (conv forward and backward, max pooling forward and backward) come
 * from a CPU context's hook, and all go back. */
static void test_cpu_op_outputs_come_from_the_hook(void **state) {
    (void)state;
    counting_allocator a = {0};
    spconv_context *ctx = NULL;
    SPCONV_ASSERT_OK(spconv_context_create(spconv_cpu(), &ctx));
    SPCONV_ASSERT_OK(spconv_context_set_allocator(ctx, counting_alloc, counting_free, &a));
    const int64_t shape[3] = {5, 6, 7};
    spconv_tensor *sites = random_sites(1, shape, 0.3);
    const int64_t n = spconv_tensor_size(sites, 0), f_sizes[2] = {n, 3}, w_sizes[3] = {27, 3, 4};
    spconv_tensor *features = random_floats(spconv_cpu(), 2, f_sizes);
    spconv_tensor *weight = random_floats(spconv_cpu(), 3, w_sizes);
    spconv_conv_params p = spconv_conv_params_default(SPCONV_CONV_SUBM);
    for (int i = 0; i < 3; ++i) p.kernel[i] = 3;
    spconv_rulebook *rb = NULL, *pool_rb = NULL;
    SPCONV_ASSERT_OK(spconv_rulebook_build(ctx, sites, shape, 1, &p, &rb));
    spconv_tensor *y = NULL, *gx = NULL, *gw = NULL, *gb = NULL;
    SPCONV_ASSERT_OK(spconv_conv_forward(ctx, rb, features, weight, NULL, &y));
    SPCONV_ASSERT_OK(spconv_conv_backward(ctx, rb, features, weight, y, &gx, &gw, &gb));
    spconv_conv_params pool = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    for (int i = 0; i < 3; ++i) pool.kernel[i] = 2, pool.stride[i] = 2;
    SPCONV_ASSERT_OK(spconv_rulebook_build(ctx, sites, shape, 1, &pool, &pool_rb));
    spconv_tensor *m = NULL, *arg = NULL, *gm = NULL;
    SPCONV_ASSERT_OK(spconv_maxpool_forward(ctx, pool_rb, features, &m, &arg));
    SPCONV_ASSERT_OK(spconv_maxpool_backward(ctx, pool_rb, arg, m, &gm));
    spconv_tensor *outs[] = {y, gx, gw, gb, m, arg, gm};
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; ++i)
        assert_true(from_hook(&a, spconv_tensor_data(outs[i])));
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; ++i) spconv_tensor_release(outs[i]);
    spconv_rulebook_release(rb);
    spconv_rulebook_release(pool_rb);
    spconv_tensor_release(features);
    spconv_tensor_release(weight);
    spconv_tensor_release(sites);
    spconv_context_destroy(ctx);
    assert_all_returned(&a);
}

static void test_cuda_op_outputs_come_from_the_hook(void **state) {
    (void)state;
    if (!have_cuda()) {
        printf("no CUDA device (nor the emulation): skipped\n");
        skip();
    }
    const spconv_device dev = spconv_cuda(0);
    counting_allocator a = {0};
    spconv_context *ctx = NULL;
    SPCONV_ASSERT_OK(spconv_context_create(dev, &ctx));
    SPCONV_ASSERT_OK(spconv_context_set_allocator(ctx, counting_alloc, counting_free, &a));
    const int64_t shape[3] = {5, 6, 7};
    spconv_tensor *host_sites = random_sites(2, shape, 0.3);
    const int64_t n = spconv_tensor_size(host_sites, 0), c_in = 3, c_out = 4;
    spconv_tensor *sites = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_to_device(ctx, host_sites, dev, &sites));
    assert_true(from_hook(&a, spconv_tensor_data(sites)));
    assert_int_equal(a.last_device.type, SPCONV_DEVICE_CUDA);
    const int64_t f_sizes[2] = {n, c_in}, w_sizes[3] = {27, c_in, c_out};
    spconv_tensor *features = random_floats(dev, 2, f_sizes);
    spconv_tensor *weight = random_floats(dev, 3, w_sizes);

    spconv_conv_params p = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    for (int i = 0; i < 3; ++i) p.kernel[i] = 3, p.stride[i] = 2, p.padding[i] = 1;
    spconv_rulebook *rb = NULL;
    const int allocs_before = a.allocs, frees_before = a.frees;
    SPCONV_ASSERT_OK(spconv_rulebook_build(ctx, sites, shape, 2, &p, &rb));
    assert_true(from_hook(&a, spconv_tensor_data(spconv_rulebook_out_indices(rb))));
    /* Its scratch arrays (keys, hash table, counts, ...) came from the hook and went back; what
     * stays is the output sites and the two pair lists. */
    assert_true(a.allocs - allocs_before > 3);
    assert_int_equal((a.allocs - allocs_before) - (a.frees - frees_before), 3);
    spconv_tensor *y = NULL, *pooled = NULL, *argmax = NULL;
    SPCONV_ASSERT_OK(spconv_conv_forward(ctx, rb, features, weight, NULL, &y));
    assert_true(from_hook(&a, spconv_tensor_data(y)));
    /* The gathered operands live in the workspace, which came from the hook too. */
    void *ws = NULL;
    SPCONV_ASSERT_OK(spconv_context_workspace(ctx, 1, &ws));
    assert_true(from_hook(&a, ws));
    SPCONV_ASSERT_OK(spconv_maxpool_forward(ctx, rb, features, &pooled, &argmax));
    assert_true(from_hook(&a, spconv_tensor_data(pooled)));
    assert_true(from_hook(&a, spconv_tensor_data(argmax)));
    spconv_tensor *dx = NULL, *dw = NULL, *db = NULL;
    SPCONV_ASSERT_OK(spconv_conv_backward(ctx, rb, features, weight, y, &dx, &dw, &db));
    assert_true(from_hook(&a, spconv_tensor_data(dx)));
    assert_true(from_hook(&a, spconv_tensor_data(dw)));
    assert_true(from_hook(&a, spconv_tensor_data(db)));
    spconv_tensor *dense = NULL;
    SPCONV_ASSERT_OK(spconv_sparse_to_dense(ctx, features, sites, shape, 2, &dense));
    assert_true(from_hook(&a, spconv_tensor_data(dense)));

    /* The same results as without the hook, bit for bit. */
    spconv_tensor *y_plain = NULL, *y_host = NULL, *y_plain_host = NULL;
    SPCONV_ASSERT_OK(spconv_conv_forward(NULL, rb, features, weight, NULL, &y_plain));
    assert_false(from_hook(&a, spconv_tensor_data(y_plain)));
    SPCONV_ASSERT_OK(spconv_tensor_to_device(NULL, y, spconv_cpu(), &y_host));
    SPCONV_ASSERT_OK(spconv_tensor_to_device(NULL, y_plain, spconv_cpu(), &y_plain_host));
    assert_memory_equal(spconv_tensor_data(y_host), spconv_tensor_data(y_plain_host),
                        (size_t)spconv_tensor_numel(y_host) * sizeof(float));
    spconv_tensor_release(y_host);
    spconv_tensor_release(y_plain_host);
    spconv_tensor_release(y_plain);

    spconv_tensor *outs[] = {y, pooled, argmax, dx, dw, db, dense, sites};
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; ++i) spconv_tensor_release(outs[i]);
    spconv_rulebook_release(rb);
    spconv_context_destroy(ctx);
    assert_true(a.allocs >= 12);
    assert_all_returned(&a);
    spconv_tensor_release(features);
    spconv_tensor_release(weight);
    spconv_tensor_release(host_sites);
}

static void test_cuda_hook_returning_null_is_out_of_memory(void **state) {
    (void)state;
    if (!have_cuda()) {
        printf("no CUDA device (nor the emulation): skipped\n");
        skip();
    }
    const spconv_device dev = spconv_cuda(0);
    counting_allocator a = {0};
    spconv_context *ctx = NULL;
    SPCONV_ASSERT_OK(spconv_context_create(dev, &ctx));
    const int64_t shape[3] = {4, 4, 4};
    spconv_tensor *host_sites = random_sites(1, shape, 0.4);
    const int64_t n = spconv_tensor_size(host_sites, 0);
    spconv_tensor *sites = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_to_device(ctx, host_sites, dev, &sites));
    const int64_t f_sizes[2] = {n, 2}, w_sizes[3] = {27, 2, 2};
    spconv_tensor *features = random_floats(dev, 2, f_sizes);
    spconv_tensor *weight = random_floats(dev, 3, w_sizes);
    spconv_conv_params p = spconv_conv_params_default(SPCONV_CONV_SUBM);
    for (int i = 0; i < 3; ++i) p.kernel[i] = 3;
    spconv_rulebook *rb = NULL;
    SPCONV_ASSERT_OK(spconv_rulebook_build(ctx, sites, shape, 1, &p, &rb));

    a.fail = 1;
    SPCONV_ASSERT_OK(spconv_context_set_allocator(ctx, counting_alloc, counting_free, &a));
    spconv_tensor *y = (spconv_tensor *)&a;
    SPCONV_ASSERT_FAILS(spconv_conv_forward(ctx, rb, features, weight, NULL, &y),
                        SPCONV_ERR_OUT_OF_MEMORY,
                        "the context's allocator hook (spconv_context_set_allocator) returned "
                        "NULL for");
    SPCONV_ASSERT_ERROR_CONTAINS("on cuda:0");
    assert_null(y);
    spconv_rulebook *rb2 = (spconv_rulebook *)&a;
    SPCONV_ASSERT_FAILS(spconv_rulebook_build(ctx, sites, shape, 1, &p, &rb2),
                        SPCONV_ERR_OUT_OF_MEMORY,
                        "spconv_rulebook_build: the context's allocator hook");
    assert_null(rb2);
    /* Once it succeeds again, so does the op. */
    a.fail = 0;
    SPCONV_ASSERT_OK(spconv_conv_forward(ctx, rb, features, weight, NULL, &y));
    assert_true(from_hook(&a, spconv_tensor_data(y)));
    spconv_tensor_release(y);
    spconv_rulebook_release(rb);
    spconv_context_destroy(ctx);
    assert_all_returned(&a);
    spconv_tensor_release(features);
    spconv_tensor_release(weight);
    spconv_tensor_release(sites);
    spconv_tensor_release(host_sites);
}

/* The CUDA map builders (rulebooks of every kind, the voxelizer, dense to sparse) allocate scratch
 * as they go, and
 * Thrust's sorts and scans their temporary storage from the same hook. Whichever request fails
 * first, the call must end with SPCONV_ERR_OUT_OF_MEMORY, no output and every block given back:
 * never an exception escaping into C, a leak or a crash. Each build is run once to count its
 * requests, then once per request with that one failing. */
typedef struct map_build_case {
    const char *name;
    spconv_conv_kind type;
    int kernel, stride;
} map_build_case;

static spconv_status run_map_build(spconv_context *ctx, const map_build_case *c,
                                   const spconv_tensor *sites, const spconv_tensor *points,
                                   const spconv_tensor *dense, const int64_t shape[3],
                                   int *outputs) {
    if (c->kernel < 0) {
        spconv_tensor *f = (spconv_tensor *)ctx, *i = (spconv_tensor *)ctx;
        const spconv_status st = spconv_dense_to_sparse(ctx, dense, &f, &i);
        *outputs = f != NULL || i != NULL;
        spconv_tensor_release(f);
        spconv_tensor_release(i);
        return st;
    }
    if (c->kernel == 0) {
        spconv_voxelize_params vp = {{0.5f, 0.5f, 0.5f}, {0, 0, 0, 4, 4, 4}, 3, 1000,
                                     SPCONV_VOXELIZE_VOXELS | SPCONV_VOXELIZE_MEAN};
        spconv_voxels v;
        memset(&v, 0xff, sizeof v);
        const spconv_status st = spconv_voxelize(ctx, points, &vp, &v);
        *outputs = v.voxels != NULL || v.features != NULL || v.coords != NULL ||
                   v.num_points != NULL || v.point_voxel != NULL;
        spconv_voxels_release(&v);
        return st;
    }
    spconv_conv_params p = spconv_conv_params_default(c->type);
    for (int i = 0; i < 3; ++i) p.kernel[i] = c->kernel, p.stride[i] = c->stride;
    spconv_rulebook *rb = (spconv_rulebook *)&p;
    const spconv_status st = spconv_rulebook_build(ctx, sites, shape, 2, &p, &rb);
    *outputs = rb != NULL;
    spconv_rulebook_release(rb);
    return st;
}

static void test_cuda_map_builds_survive_every_failed_allocation(void **state) {
    (void)state;
    if (!have_cuda()) {
        printf("no CUDA device (nor the emulation): skipped\n");
        skip();
    }
    const spconv_device dev = spconv_cuda(0);
    const int64_t shape[3] = {6, 7, 8};
    spconv_tensor *host_sites = random_sites(2, shape, 0.3), *sites = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_to_device(NULL, host_sites, dev, &sites));
    const int64_t point_sizes[2] = {300, 4};
    spconv_tensor *points = random_floats(dev, 2, point_sizes);
    spconv_tensor *scaled = NULL; /* points in [0, 4)^3 and beyond, some voxels shared */
    SPCONV_ASSERT_OK(spconv_tensor_to_device(NULL, points, spconv_cpu(), &scaled));
    float *xyz = spconv_tensor_data(scaled);
    for (int64_t i = 0; i < 300 * 4; ++i) xyz[i] = xyz[i] * 2.5f + 2.0f;
    spconv_tensor_release(points);
    points = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_to_device(NULL, scaled, dev, &points));
    const int64_t feature_sizes[2] = {spconv_tensor_size(sites, 0), 3};
    spconv_tensor *site_features = random_floats(dev, 2, feature_sizes), *dense = NULL;
    SPCONV_ASSERT_OK(spconv_sparse_to_dense(NULL, site_features, sites, shape, 2, &dense));
    const map_build_case cases[] = {
        {"subm 3", SPCONV_CONV_SUBM, 3, 1},
        {"regular 3 stride 2", SPCONV_CONV_REGULAR, 3, 2},
        {"transposed 2 stride 2", SPCONV_CONV_TRANSPOSED, 2, 2},
        {"voxelize", SPCONV_CONV_REGULAR, 0, 0},
        {"dense to sparse", SPCONV_CONV_REGULAR, -1, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; ++c) {
        int requests = 0;
        for (int fail_at = 0; fail_at == 0 || fail_at <= requests; ++fail_at) {
            counting_allocator a = {0};
            a.fail_at = fail_at;
            spconv_context *ctx = NULL;
            SPCONV_ASSERT_OK(spconv_context_create(dev, &ctx));
            SPCONV_ASSERT_OK(spconv_context_set_allocator(ctx, counting_alloc, counting_free, &a));
            int outputs = 0;
            const spconv_status st =
                run_map_build(ctx, &cases[c], sites, points, dense, shape, &outputs);
            spconv_context_destroy(ctx);
            if (fail_at == 0) {
                if (st != SPCONV_OK) fail_msg("%s: %s", cases[c].name, spconv_last_error());
                requests = a.requests;
                assert_true(requests > 1);
            } else {
                if (st != SPCONV_ERR_OUT_OF_MEMORY)
                    fail_msg("%s, request %d of %d failing: status %d (%s)", cases[c].name,
                             fail_at, requests, (int)st, spconv_last_error());
                if (strstr(spconv_last_error(), "allocator hook") == NULL)
                    fail_msg("%s, request %d failing: message \"%s\" does not name the hook",
                             cases[c].name, fail_at, spconv_last_error());
                assert_false(outputs);
            }
            assert_all_returned(&a);
        }
        printf("%s: each of its %d allocations failed in turn, cleanly\n", cases[c].name,
               requests);
    }
    spconv_tensor_release(dense);
    spconv_tensor_release(site_features);
    spconv_tensor_release(points);
    spconv_tensor_release(scaled);
    spconv_tensor_release(sites);
    spconv_tensor_release(host_sites);
}

static void test_cuda_stream_setter_round_trip(void **state) {
    (void)state;
    if (!have_cuda()) {
        printf("no CUDA device (nor the emulation): skipped\n");
        skip();
    }
    spconv_context *ctx = NULL;
    SPCONV_ASSERT_OK(spconv_context_create(spconv_cuda(0), &ctx));
    void *own = spconv_context_cuda_stream(ctx);
    assert_non_null(own);
    /* NULL is the context's own stream, whatever was set before. */
    SPCONV_ASSERT_OK(spconv_context_set_cuda_stream(ctx, NULL));
    assert_ptr_equal(spconv_context_cuda_stream(ctx), own);
    SPCONV_ASSERT_OK(spconv_context_set_cuda_stream(ctx, own));
    assert_ptr_equal(spconv_context_cuda_stream(ctx), own);
    spconv_context_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_tensors_come_from_the_hook),
        cmocka_unit_test(test_calls_without_the_context_do_not_use_the_hook),
        cmocka_unit_test(test_hook_returning_null_is_out_of_memory),
        cmocka_unit_test(test_misaligned_memory_is_given_back_and_refused),
        cmocka_unit_test(test_setter_arguments),
        cmocka_unit_test(test_cpu_op_outputs_come_from_the_hook),
        cmocka_unit_test(test_cuda_op_outputs_come_from_the_hook),
        cmocka_unit_test(test_cuda_hook_returning_null_is_out_of_memory),
        cmocka_unit_test(test_cuda_map_builds_survive_every_failed_allocation),
        cmocka_unit_test(test_cuda_stream_setter_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
