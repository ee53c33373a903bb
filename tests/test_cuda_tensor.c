/* The CUDA memory backend through the public tensor API: transfers, strided copies between every
 * pair of dtypes, fill, the context's stream and workspace, copies across devices and allocation
 * failure. Every GPU result is compared bit for bit with the same operation done by the CPU
 * backend, the reference. Without a GPU (or without the CUDA backend) the GPU tests skip; the
 * checks that a missing device is reported as an error still run. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"

#define CPU spconv_cpu()
#define GPU spconv_cuda(0)

static const spconv_dtype all_dtypes[SPCONV_DTYPE_COUNT] = {
    SPCONV_F16, SPCONV_BF16, SPCONV_F32, SPCONV_F64, SPCONV_I32, SPCONV_I64, SPCONV_U8};

static int gpu_present(void) { return spconv_has_cuda() && spconv_cuda_device_count() > 0; }

#define SKIP_WITHOUT_GPU()          \
    do {                            \
        if (!gpu_present()) skip(); \
    } while (0)

/* ---- helpers --------------------------------------------------------------------------------- */

/* A tensor's elements in row-major order, read back from any device with @p ctx; free() it. */
static unsigned char *read_back(spconv_context *ctx, const spconv_tensor *t, size_t *nbytes) {
    *nbytes = (size_t)spconv_tensor_numel(t) * spconv_dtype_size(spconv_tensor_dtype(t));
    unsigned char *bytes = malloc(*nbytes > 0 ? *nbytes : 1);
    assert_non_null(bytes);
    SPCONV_ASSERT_OK(spconv_tensor_copy_to_host(ctx, t, bytes, *nbytes));
    return bytes;
}

/* Fail, naming the first differing element, unless @p gpu holds the same bits as @p cpu. */
static void assert_same_bits(spconv_context *ctx, const spconv_tensor *gpu,
                             const spconv_tensor *cpu, const char *what) {
    assert_int_equal(spconv_tensor_dtype(gpu), spconv_tensor_dtype(cpu));
    assert_int_equal(spconv_tensor_numel(gpu), spconv_tensor_numel(cpu));
    size_t gpu_bytes, cpu_bytes;
    unsigned char *from_gpu = read_back(ctx, gpu, &gpu_bytes);
    unsigned char *from_cpu = read_back(NULL, cpu, &cpu_bytes);
    assert_int_equal(gpu_bytes, cpu_bytes);
    if (memcmp(from_gpu, from_cpu, gpu_bytes) != 0) {
        size_t element = spconv_dtype_size(spconv_tensor_dtype(cpu)), i = 0;
        while (memcmp(from_gpu + i * element, from_cpu + i * element, element) == 0) ++i;
        char description[256];
        spconv_tensor_describe(gpu, description, sizeof description);
        print_error("%s: element %zu of %s differs from the CPU:", what, i, description);
        for (size_t b = 0; b < element; ++b) print_error(" %02x", from_gpu[i * element + b]);
        print_error(" (GPU) vs");
        for (size_t b = 0; b < element; ++b) print_error(" %02x", from_cpu[i * element + b]);
        print_error(" (CPU)\n");
        free(from_gpu);
        free(from_cpu);
        fail();
    }
    free(from_gpu);
    free(from_cpu);
}

/* Values that exercise every conversion rule: fractions to truncate, ties to round, magnitudes
 * beyond each integer range and beyond f16, NaN, infinities, signed zero, subnormals. */
static double interesting_value(void) {
    static const double specials[] = {
        0.0, -0.0, 0.5, -0.5, 1.5, -2.5, 255.0, 255.9, 256.0, -1.0, -0.99, 65504.0, 65519.99,
        65520.0, 1e-8, 6e-8, 1e-40, 2147483647.0, 2147483647.5, 2147483648.0, -2147483648.0,
        -2147483649.0, 9.2233720368547758e18, -9.2233720368547758e18, 1e20, -1e20, 1e300,
        16777217.0, 1.0 + 0x1p-12, 1.0 + 0x1p-8, NAN, -NAN, INFINITY, -INFINITY};
    int64_t pick = spconv_test_rand_int(0, 3);
    if (pick == 0)
        return specials[spconv_test_rand_int(0, sizeof specials / sizeof specials[0] - 1)];
    if (pick == 1) return spconv_test_rand_double(-1e6, 1e6);
    return spconv_test_rand_double(-300.0, 300.0);
}

/* A contiguous CPU tensor of @p dtype: either converted interesting values, or raw random bits
 * (which reach every NaN payload and every integer). */
static spconv_tensor *random_cpu_tensor(spconv_dtype dtype, int ndim, const int64_t *sizes) {
    int64_t numel = 1;
    for (int d = 0; d < ndim; ++d) numel *= sizes[d];
    spconv_tensor *t = NULL;
    if (spconv_test_rand_int(0, 2) == 0) {
        size_t nbytes = (size_t)numel * spconv_dtype_size(dtype);
        unsigned char *bits = malloc(nbytes > 0 ? nbytes : 1);
        assert_non_null(bits);
        for (size_t i = 0; i < nbytes; ++i) bits[i] = (unsigned char)spconv_test_rand_u64();
        SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, CPU, dtype, ndim, sizes, bits, &t));
        free(bits);
        return t;
    }
    double *values = malloc((size_t)(numel > 0 ? numel : 1) * sizeof *values);
    assert_non_null(values);
    for (int64_t i = 0; i < numel; ++i) values[i] = interesting_value();
    spconv_tensor *f64 = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, CPU, SPCONV_F64, ndim, sizes, values, &f64));
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, f64, dtype, &t));
    spconv_tensor_release(f64);
    free(values);
    return t;
}

static void random_permutation(int n, int *perm) {
    for (int i = 0; i < n; ++i) perm[i] = i;
    for (int i = n - 1; i > 0; --i) {
        int j = (int)spconv_test_rand_int(0, i);
        int kept = perm[i];
        perm[i] = perm[j];
        perm[j] = kept;
    }
}

/* How to turn a contiguous base into a source view: permute, slice every dim with a start and a
 * step, expand dims of size 1 and maybe a new leading dim. Drawn once, applied on both devices. */
typedef struct source_recipe {
    int ndim;
    int64_t base_sizes[4];
    int perm[4];
    int64_t start[4], step[4];
    int64_t expand_to[4]; /* for a dim that is 1 after slicing: its expanded size (1: keep) */
    int64_t lead;         /* > 0: expand to a new leading dim of this size */
} source_recipe;

static source_recipe random_source_recipe(void) {
    source_recipe r;
    memset(&r, 0, sizeof r);
    r.ndim = (int)spconv_test_rand_int(1, 4);
    for (int d = 0; d < r.ndim; ++d)
        r.base_sizes[d] = spconv_test_rand_int(0, 3) == 0 ? 1 : spconv_test_rand_int(2, 9);
    random_permutation(r.ndim, r.perm);
    for (int d = 0; d < r.ndim; ++d) {
        int64_t size = r.base_sizes[r.perm[d]];
        r.start[d] = spconv_test_rand_int(0, size - 1);
        r.step[d] = spconv_test_rand_int(1, 3);
        r.expand_to[d] = spconv_test_rand_int(1, 4);
    }
    r.lead = spconv_test_rand_int(0, 2) == 0 ? spconv_test_rand_int(2, 3) : 0;
    return r;
}

static spconv_tensor *apply_source_recipe(const spconv_tensor *base, const source_recipe *r) {
    spconv_tensor *view = NULL, *next = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_permute(base, r->perm, &view));
    for (int d = 0; d < r->ndim; ++d) {
        SPCONV_ASSERT_OK(spconv_tensor_slice(view, d, r->start[d], spconv_tensor_size(view, d),
                                             r->step[d], &next));
        spconv_tensor_release(view);
        view = next;
    }
    int64_t sizes[5];
    int lead = r->lead > 0;
    if (lead) sizes[0] = r->lead;
    for (int d = 0; d < r->ndim; ++d)
        sizes[lead + d] = spconv_tensor_size(view, d) == 1 ? r->expand_to[d] : -1;
    SPCONV_ASSERT_OK(spconv_tensor_expand(view, r->ndim + lead, sizes, &next));
    spconv_tensor_release(view);
    return next;
}

/* A strided destination of @p sizes: every other element of a base laid out in the dim order
 * @p perm. `*base` (filled with a sentinel) lets the caller check nothing outside the view was
 * written. */
static spconv_tensor *strided_destination(spconv_context *ctx, spconv_device device,
                                          spconv_dtype dtype, int ndim, const int64_t *sizes,
                                          const int *perm, spconv_tensor **base) {
    int64_t base_sizes[SPCONV_MAX_DIMS] = {0};
    int inverse[SPCONV_MAX_DIMS] = {0};
    for (int k = 0; k < ndim; ++k) {
        base_sizes[k] = 2 * sizes[perm[k]];
        inverse[perm[k]] = k;
    }
    SPCONV_ASSERT_OK(spconv_tensor_full(ctx, device, dtype, ndim, base_sizes, 42.0, base));
    spconv_tensor *view = NULL, *next = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_permute(*base, inverse, &view));
    for (int d = 0; d < ndim; ++d) {
        SPCONV_ASSERT_OK(spconv_tensor_slice(view, d, 0, 2 * sizes[d], 2, &next));
        spconv_tensor_release(view);
        view = next;
    }
    return view;
}

/* ---- runs everywhere: a missing device is an error with a message ---------------------------- */

static void test_missing_device_is_reported(void **state) {
    (void)state;
    /* With no GPU this is spconv_cuda(0) itself; with GPUs, the first ordinal past them. */
    int count = spconv_cuda_device_count();
    spconv_device missing = spconv_cuda(count);
    const char *why = spconv_has_cuda() ? "is not present" : "no CUDA backend";
    const int64_t sizes[1] = {4};

    spconv_tensor *t = NULL;
    SPCONV_ASSERT_FAILS(spconv_tensor_empty(missing, SPCONV_F32, 1, sizes, &t),
                        SPCONV_ERR_NO_DEVICE, why);
    assert_null(t);
    spconv_context *ctx = NULL;
    SPCONV_ASSERT_FAILS(spconv_context_create(missing, &ctx), SPCONV_ERR_NO_DEVICE, why);
    assert_null(ctx);
    spconv_storage *storage = NULL;
    SPCONV_ASSERT_FAILS(spconv_storage_create(missing, 64, &storage), SPCONV_ERR_NO_DEVICE, why);
    assert_null(storage);
    SPCONV_ASSERT_FAILS(spconv_context_create(spconv_cuda(-1), &ctx), SPCONV_ERR_NO_DEVICE, "CUDA");

    spconv_tensor *host = NULL, *moved = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_zeros(NULL, CPU, SPCONV_F32, 1, sizes, &host));
    SPCONV_ASSERT_FAILS(spconv_tensor_to_device(NULL, host, missing, &moved), SPCONV_ERR_NO_DEVICE,
                        why);
    assert_null(moved);
    spconv_tensor_release(host);

    char report[1024];
    spconv_build_report(report, sizeof report);
    assert_non_null(strstr(report, spconv_has_cuda() ? "CUDA backend: built" : "not built"));
}

/* ---- GPU: transfers -------------------------------------------------------------------------- */

/* Host -> device -> host, and device -> device, keep every bit, for each dtype, on the default
 * stream and on a context's stream. */
static void test_round_trips_keep_every_bit(void **state) {
    (void)state;
    SKIP_WITHOUT_GPU();
    spconv_context *stream_ctx = NULL;
    SPCONV_ASSERT_OK(spconv_context_create(GPU, &stream_ctx));
    spconv_context *contexts[2] = {NULL, stream_ctx};
    for (int c = 0; c < 2; ++c) {
        spconv_context *ctx = contexts[c];
        for (int k = 0; k < SPCONV_DTYPE_COUNT; ++k) {
            /* Sizes cover an empty tensor, one element and more than one grid of threads. */
            const int64_t numels[] = {0, 1, 1000 + spconv_test_rand_int(0, 999), 3000000};
            for (size_t n = 0; n < sizeof numels / sizeof numels[0]; ++n) {
                spconv_tensor *host = random_cpu_tensor(all_dtypes[k], 1, &numels[n]);
                spconv_tensor *device = NULL, *copy = NULL, *back = NULL;
                SPCONV_ASSERT_OK(spconv_tensor_to_device(ctx, host, GPU, &device));
                assert_true(spconv_device_equal(spconv_tensor_device(device), GPU));
                assert_same_bits(ctx, device, host, "host -> device");
                SPCONV_ASSERT_OK(spconv_tensor_clone(ctx, device, &copy));
                assert_ptr_not_equal(spconv_tensor_storage(copy), spconv_tensor_storage(device));
                assert_same_bits(ctx, copy, host, "device -> device");
                SPCONV_ASSERT_OK(spconv_tensor_to_device(ctx, copy, CPU, &back));
                assert_same_bits(NULL, back, host, "device -> host");
                spconv_tensor_release(host);
                spconv_tensor_release(device);
                spconv_tensor_release(copy);
                spconv_tensor_release(back);
            }
        }
    }
    spconv_context_destroy(stream_ctx);
}

/* ---- GPU: strided copy, every dtype pair ----------------------------------------------------- */

/* One random strided copy from @p src_dtype to @p dst_dtype, done on the GPU and on the CPU. */
static void check_strided_copy(spconv_context *ctx, spconv_dtype dst_dtype,
                               spconv_dtype src_dtype) {
    source_recipe recipe = random_source_recipe();
    spconv_tensor *cpu_base = random_cpu_tensor(src_dtype, recipe.ndim, recipe.base_sizes);
    spconv_tensor *gpu_base = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_to_device(ctx, cpu_base, GPU, &gpu_base));
    spconv_tensor *cpu_src = apply_source_recipe(cpu_base, &recipe);
    spconv_tensor *gpu_src = apply_source_recipe(gpu_base, &recipe);

    int ndim = spconv_tensor_ndim(cpu_src);
    int perm[SPCONV_MAX_DIMS];
    random_permutation(ndim, perm);
    spconv_tensor *cpu_dst_base = NULL, *gpu_dst_base = NULL;
    spconv_tensor *cpu_dst = strided_destination(NULL, CPU, dst_dtype, ndim,
                                                 spconv_tensor_sizes(cpu_src), perm, &cpu_dst_base);
    spconv_tensor *gpu_dst = strided_destination(ctx, GPU, dst_dtype, ndim,
                                                 spconv_tensor_sizes(cpu_src), perm, &gpu_dst_base);
    SPCONV_ASSERT_OK(spconv_tensor_copy_(NULL, cpu_dst, cpu_src));
    SPCONV_ASSERT_OK(spconv_tensor_copy_(ctx, gpu_dst, gpu_src));
    char what[64];
    snprintf(what, sizeof what, "strided copy %s -> %s", spconv_dtype_name(src_dtype),
             spconv_dtype_name(dst_dtype));
    assert_same_bits(ctx, gpu_dst_base, cpu_dst_base, what);

    /* And into a fresh contiguous tensor, the layout most copies produce. */
    spconv_tensor *cpu_packed = NULL, *gpu_packed = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, cpu_src, dst_dtype, &cpu_packed));
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(ctx, gpu_src, dst_dtype, &gpu_packed));
    assert_same_bits(ctx, gpu_packed, cpu_packed, what);

    spconv_tensor *tensors[] = {cpu_base, gpu_base, cpu_src, gpu_src, cpu_dst_base, gpu_dst_base,
                                cpu_dst, gpu_dst, cpu_packed, gpu_packed};
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; ++i)
        spconv_tensor_release(tensors[i]);
}

static void test_strided_copy_matches_cpu_for_every_dtype_pair(void **state) {
    (void)state;
    SKIP_WITHOUT_GPU();
    spconv_context *stream_ctx = NULL;
    SPCONV_ASSERT_OK(spconv_context_create(GPU, &stream_ctx));
    for (int d = 0; d < SPCONV_DTYPE_COUNT; ++d)
        for (int s = 0; s < SPCONV_DTYPE_COUNT; ++s)
            for (int trial = 0; trial < 8; ++trial)
                check_strided_copy(trial % 2 ? stream_ctx : NULL, all_dtypes[d], all_dtypes[s]);
    spconv_context_destroy(stream_ctx);
}

/* NaN payloads and signs, signalling NaNs, infinities, signed zeros and subnormals of every
 * floating dtype, converted to every dtype: the bit patterns where hardware and compilers most
 * often disagree (a GPU has one canonical NaN; a compiler may drop a float -> double -> float
 * round trip), so the shared conversion rules must not leave them to either. */
static void test_special_floating_bits_convert_as_on_cpu(void **state) {
    (void)state;
    SKIP_WITHOUT_GPU();
    static const uint16_t half_bits[] = {0x7C01, 0xFC01, 0x7E00, 0xFE55, 0x7C00, 0xFC00, 0x8000,
                                         0x0001, 0x83FF, 0x7BFF};
    static const uint16_t bfloat_bits[] = {0x7F81, 0xFF81, 0x7FC0, 0xFFD5, 0x7F80, 0xFF80, 0x8000,
                                           0x0001, 0x807F, 0x7F7F};
    static const uint32_t float_bits[] = {0x7F800001, 0xFF800001, 0x7FC00000, 0xFFE00001,
                                          0x7FA00000, 0x7F800000, 0xFF800000, 0x80000000,
                                          0x00000001, 0x807FFFFF, 0x7F7FFFFF, 0x33000001};
    static const uint64_t double_bits[] = {
        0x7FF0000000000001, 0xFFF0000000000001, 0x7FF8000000000000, 0xFFFC000020000000,
        0x7FF4000000000000, 0x7FF0000000000000, 0xFFF0000000000000, 0x8000000000000000,
        0x0000000000000001, 0x36A0000000000001, 0x47EFFFFFE0000000, 0xC7EFFFFFF0000000};
    const struct {
        spconv_dtype dtype;
        const void *bits;
        int64_t count;
    } sources[] = {
        {SPCONV_F16, half_bits, sizeof half_bits / sizeof half_bits[0]},
        {SPCONV_BF16, bfloat_bits, sizeof bfloat_bits / sizeof bfloat_bits[0]},
        {SPCONV_F32, float_bits, sizeof float_bits / sizeof float_bits[0]},
        {SPCONV_F64, double_bits, sizeof double_bits / sizeof double_bits[0]},
    };
    for (size_t s = 0; s < sizeof sources / sizeof sources[0]; ++s) {
        spconv_tensor *cpu = NULL, *gpu = NULL;
        SPCONV_ASSERT_OK(spconv_tensor_from_host(NULL, CPU, sources[s].dtype, 1, &sources[s].count,
                                                 sources[s].bits, &cpu));
        SPCONV_ASSERT_OK(spconv_tensor_to_device(NULL, cpu, GPU, &gpu));
        for (int d = 0; d < SPCONV_DTYPE_COUNT; ++d) {
            spconv_tensor *cpu_out = NULL, *gpu_out = NULL;
            SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, cpu, all_dtypes[d], &cpu_out));
            SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, gpu, all_dtypes[d], &gpu_out));
            char what[64];
            snprintf(what, sizeof what, "special %s values -> %s",
                     spconv_dtype_name(sources[s].dtype), spconv_dtype_name(all_dtypes[d]));
            assert_same_bits(NULL, gpu_out, cpu_out, what);
            spconv_tensor_release(cpu_out);
            spconv_tensor_release(gpu_out);
        }
        spconv_tensor_release(cpu);
        spconv_tensor_release(gpu);
    }
}

/* A transpose big enough that the grid-stride loop goes round many times. */
static void test_large_transposing_copy_matches_cpu(void **state) {
    (void)state;
    SKIP_WITHOUT_GPU();
    const int64_t sizes[2] = {1531, 2999};
    const int swap[2] = {1, 0};
    spconv_tensor *cpu = random_cpu_tensor(SPCONV_F32, 2, sizes);
    spconv_tensor *gpu = NULL, *cpu_t = NULL, *gpu_t = NULL, *cpu_out = NULL, *gpu_out = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_to_device(NULL, cpu, GPU, &gpu));
    SPCONV_ASSERT_OK(spconv_tensor_permute(cpu, swap, &cpu_t));
    SPCONV_ASSERT_OK(spconv_tensor_permute(gpu, swap, &gpu_t));
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, cpu_t, SPCONV_BF16, &cpu_out));
    SPCONV_ASSERT_OK(spconv_tensor_to_dtype(NULL, gpu_t, SPCONV_BF16, &gpu_out));
    assert_same_bits(NULL, gpu_out, cpu_out, "large transposing copy f32 -> bf16");
    spconv_tensor *tensors[] = {cpu, gpu, cpu_t, gpu_t, cpu_out, gpu_out};
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; ++i)
        spconv_tensor_release(tensors[i]);
}

/* ---- GPU: fill ------------------------------------------------------------------------------- */

static void test_fill_matches_cpu(void **state) {
    (void)state;
    SKIP_WITHOUT_GPU();
    static const double values[] = {0.0,   -0.0,     1.0,       -1.5,         2.75,  255.9,
                                    256.0, -1.0,     1e10,      -1e10,        65520, 1e-8,
                                    NAN,   INFINITY, -INFINITY, 2147483648.0, 1e300, 0.1};
    spconv_context *stream_ctx = NULL;
    SPCONV_ASSERT_OK(spconv_context_create(GPU, &stream_ctx));
    for (int k = 0; k < SPCONV_DTYPE_COUNT; ++k) {
        for (size_t v = 0; v < sizeof values / sizeof values[0]; ++v) {
            spconv_context *ctx = v % 2 ? stream_ctx : NULL;
            int ndim = (int)spconv_test_rand_int(0, 4);
            int64_t sizes[4];
            for (int d = 0; d < ndim; ++d) sizes[d] = spconv_test_rand_int(1, 9);
            int perm[4];
            random_permutation(ndim, perm);
            spconv_tensor *cpu_base = NULL, *gpu_base = NULL;
            spconv_tensor *cpu = strided_destination(NULL, CPU, all_dtypes[k], ndim, sizes, perm,
                                                     &cpu_base);
            spconv_tensor *gpu = strided_destination(ctx, GPU, all_dtypes[k], ndim, sizes, perm,
                                                     &gpu_base);
            SPCONV_ASSERT_OK(spconv_tensor_fill(NULL, cpu, values[v]));
            SPCONV_ASSERT_OK(spconv_tensor_fill(ctx, gpu, values[v]));
            char what[64];
            snprintf(what, sizeof what, "fill %s with %g", spconv_dtype_name(all_dtypes[k]),
                     values[v]);
            assert_same_bits(ctx, gpu_base, cpu_base, what);

            spconv_tensor *cpu_full = NULL, *gpu_full = NULL;
            SPCONV_ASSERT_OK(spconv_tensor_full(NULL, CPU, all_dtypes[k], ndim, sizes, values[v],
                                                &cpu_full));
            SPCONV_ASSERT_OK(spconv_tensor_full(ctx, GPU, all_dtypes[k], ndim, sizes, values[v],
                                                &gpu_full));
            assert_same_bits(ctx, gpu_full, cpu_full, what);
            spconv_tensor *tensors[] = {cpu_base, gpu_base, cpu, gpu, cpu_full, gpu_full};
            for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; ++i)
                spconv_tensor_release(tensors[i]);
        }
    }
    spconv_context_destroy(stream_ctx);
}

/* ---- GPU: contexts --------------------------------------------------------------------------- */

static void test_context_stream_handle_and_workspace(void **state) {
    (void)state;
    SKIP_WITHOUT_GPU();
    spconv_context *ctx = NULL;
    SPCONV_ASSERT_OK(spconv_context_create(GPU, &ctx));
    assert_true(spconv_device_equal(spconv_context_device(ctx), GPU));
    assert_non_null(spconv_context_cuda_stream(ctx));
    assert_non_null(spconv_context_cublas_handle(ctx));

    void *small = NULL, *again = NULL, *large = NULL;
    SPCONV_ASSERT_OK(spconv_context_workspace(ctx, 100, &small));
    assert_non_null(small);
    SPCONV_ASSERT_OK(spconv_context_workspace(ctx, 60, &again));
    assert_ptr_equal(again, small);
    const int64_t nbytes = (int64_t)1 << 22;
    SPCONV_ASSERT_OK(spconv_context_workspace(ctx, (size_t)nbytes, &large));
    assert_non_null(large);

    /* The workspace is device memory: ops on the context's stream can use it. */
    spconv_tensor *view = NULL;
    SPCONV_ASSERT_OK(
        spconv_tensor_wrap(GPU, SPCONV_U8, 1, &nbytes, NULL, large, NULL, NULL, &view));
    SPCONV_ASSERT_OK(spconv_tensor_fill(ctx, view, 7.0));
    size_t read_bytes;
    unsigned char *bytes = read_back(ctx, view, &read_bytes);
    assert_int_equal(read_bytes, (size_t)nbytes);
    for (int64_t i = 0; i < nbytes; ++i)
        if (bytes[i] != 7) fail_msg("workspace byte %" PRId64 " is %d, not 7", i, bytes[i]);
    free(bytes);
    spconv_tensor_release(view);

    /* Misaligned caller memory is refused with a message when it is wrapped, never handed to a
     * kernel (where it would be a device fault that breaks every later CUDA call): directly, and
     * through a storage (whose bytes are still usable as bytes). */
    const int64_t four = 4;
    spconv_tensor *misaligned = NULL, *as_bytes = NULL;
    SPCONV_ASSERT_FAILS(spconv_tensor_wrap(GPU, SPCONV_F32, 1, &four, NULL, (char *)large + 2,
                                           NULL, NULL, &misaligned),
                        SPCONV_ERR_INVALID_ARGUMENT, "is not aligned to the 4-byte elements");
    assert_null(misaligned);
    spconv_storage *storage = NULL;
    SPCONV_ASSERT_OK(spconv_storage_wrap(GPU, (char *)large + 2, 16, NULL, NULL, &storage));
    SPCONV_ASSERT_FAILS(
        spconv_tensor_from_storage(storage, 0, SPCONV_F32, 1, &four, NULL, &misaligned),
        SPCONV_ERR_INVALID_ARGUMENT, "is not aligned to the 4-byte elements");
    const int64_t sixteen = 16;
    SPCONV_ASSERT_OK(
        spconv_tensor_from_storage(storage, 0, SPCONV_U8, 1, &sixteen, NULL, &as_bytes));
    SPCONV_ASSERT_OK(spconv_tensor_fill(ctx, as_bytes, 3.0));
    spconv_tensor_release(as_bytes);
    spconv_storage_release(storage);

    SPCONV_ASSERT_FAILS(spconv_context_workspace(ctx, (size_t)1 << 60, &large),
                        SPCONV_ERR_OUT_OF_MEMORY, "1152921504606846976 bytes");
    SPCONV_ASSERT_OK(spconv_context_synchronize(ctx));
    spconv_context_destroy(ctx);
}

/* ---- GPU: across devices --------------------------------------------------------------------- */

/* copy_ between a strided tensor on one device and a strided tensor of another dtype on the other,
 * both ways, against the same copy between two CPU tensors. */
static void test_cross_device_copies_of_strided_tensors(void **state) {
    (void)state;
    SKIP_WITHOUT_GPU();
    spconv_context *stream_ctx = NULL;
    SPCONV_ASSERT_OK(spconv_context_create(GPU, &stream_ctx));
    for (int trial = 0; trial < 40; ++trial) {
        spconv_context *ctx = trial % 2 ? stream_ctx : NULL;
        spconv_dtype src_dtype = all_dtypes[spconv_test_rand_int(0, SPCONV_DTYPE_COUNT - 1)];
        spconv_dtype dst_dtype = all_dtypes[spconv_test_rand_int(0, SPCONV_DTYPE_COUNT - 1)];
        int upload = trial % 4 < 2;
        source_recipe recipe = random_source_recipe();
        spconv_tensor *cpu_base = random_cpu_tensor(src_dtype, recipe.ndim, recipe.base_sizes);
        spconv_tensor *far_base = cpu_base;
        if (!upload) SPCONV_ASSERT_OK(spconv_tensor_to_device(ctx, cpu_base, GPU, &far_base));
        spconv_tensor *cpu_src = apply_source_recipe(cpu_base, &recipe);
        spconv_tensor *src = apply_source_recipe(far_base, &recipe);

        int ndim = spconv_tensor_ndim(cpu_src);
        int perm[SPCONV_MAX_DIMS];
        random_permutation(ndim, perm);
        spconv_tensor *expected_base = NULL, *dst_base = NULL;
        spconv_tensor *expected = strided_destination(NULL, CPU, dst_dtype, ndim,
                                                      spconv_tensor_sizes(cpu_src), perm,
                                                      &expected_base);
        spconv_tensor *dst = strided_destination(ctx, upload ? GPU : CPU, dst_dtype, ndim,
                                                 spconv_tensor_sizes(cpu_src), perm, &dst_base);
        SPCONV_ASSERT_OK(spconv_tensor_copy_(NULL, expected, cpu_src));
        SPCONV_ASSERT_OK(spconv_tensor_copy_(ctx, dst, src));
        char what[80];
        snprintf(what, sizeof what, "%s copy %s -> %s", upload ? "CPU -> GPU" : "GPU -> CPU",
                 spconv_dtype_name(src_dtype), spconv_dtype_name(dst_dtype));
        assert_same_bits(ctx, dst_base, expected_base, what);

        if (far_base != cpu_base) spconv_tensor_release(far_base);
        spconv_tensor *tensors[] = {cpu_base, cpu_src, src, expected_base, expected, dst_base, dst};
        for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; ++i)
            spconv_tensor_release(tensors[i]);
    }
    spconv_context_destroy(stream_ctx);
}

/* ---- GPU: allocation failure ----------------------------------------------------------------- */

static void test_absurd_allocation_is_out_of_memory(void **state) {
    (void)state;
    SKIP_WITHOUT_GPU();
    const int64_t absurd[1] = {(int64_t)1 << 60};
    spconv_tensor *t = NULL;
    SPCONV_ASSERT_FAILS(spconv_tensor_empty(GPU, SPCONV_U8, 1, absurd, &t),
                        SPCONV_ERR_OUT_OF_MEMORY, "1152921504606846976 bytes");
    assert_null(t);
    spconv_storage *storage = NULL;
    SPCONV_ASSERT_FAILS(spconv_storage_create(GPU, (size_t)1 << 50, &storage),
                        SPCONV_ERR_OUT_OF_MEMORY, "CUDA device 0");
    assert_null(storage);

    /* The failure must not linger in the runtime and break the next, unrelated launch. */
    const int64_t sizes[2] = {33, 17};
    spconv_tensor *gpu = NULL, *cpu = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_full(NULL, GPU, SPCONV_F32, 2, sizes, 3.25, &gpu));
    SPCONV_ASSERT_OK(spconv_tensor_full(NULL, CPU, SPCONV_F32, 2, sizes, 3.25, &cpu));
    assert_same_bits(NULL, gpu, cpu, "fill after a failed allocation");
    spconv_tensor_release(gpu);
    spconv_tensor_release(cpu);
}

int main(void) {
    spconv_test_seed();
    if (!gpu_present())
        printf("skipped: no CUDA device (%s); only the missing-device checks run\n",
               spconv_has_cuda() ? "the CUDA backend is built, but no driver or GPU was found"
                                 : "this build has no CUDA backend");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_missing_device_is_reported),
        cmocka_unit_test(test_round_trips_keep_every_bit),
        cmocka_unit_test(test_strided_copy_matches_cpu_for_every_dtype_pair),
        cmocka_unit_test(test_special_floating_bits_convert_as_on_cpu),
        cmocka_unit_test(test_large_transposing_copy_matches_cpu),
        cmocka_unit_test(test_fill_matches_cpu),
        cmocka_unit_test(test_context_stream_handle_and_workspace),
        cmocka_unit_test(test_cross_device_copies_of_strided_tensors),
        cmocka_unit_test(test_absurd_allocation_is_out_of_memory),
    };
    return cmocka_run_group_tests_name("cuda_tensor", tests, NULL, NULL);
}
