/* The CPU backend: aligned host memory, memcpy transfers, and strided copy and fill by walking
 * the elements with an odometer over the dims. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/sysinfo.h>
#endif
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "core/backend.h"
#include "core/cpu_kernels.h"
#include "core/error.h"
#include "core/parallel.h"
#include "tensor/convert.h"
#include "tensor/tensor_impl.h"

/* 64 bytes: a cache line, and the widest SIMD load (AVX-512) never straddles two. */
#define CPU_ALIGNMENT ((size_t)64)

static int cpu_device_count(void) { return 1; }

/* Memory plus swap of this machine in bytes (SIZE_MAX where unknown). Linux overcommits: a
 * request far beyond the machine succeeds and the process is killed when it touches the pages,
 * so a size that can never fit is refused up front with a message instead. */
static size_t machine_memory_bytes(void) {
#if defined(__linux__)
    struct sysinfo info;
    if (sysinfo(&info) == 0) {
        unsigned long long total =
            ((unsigned long long)info.totalram + info.totalswap) * info.mem_unit;
        return total > SIZE_MAX ? SIZE_MAX : (size_t)total;
    }
#endif
    return SIZE_MAX;
}

/* Bytes of CPU storage allocated by this backend and not yet freed, and the most since the last
 * reset (benchmarks report them against the process's peak resident memory). Counted by the
 * allocator's usable size, so they are exact where glibc tells it and absent elsewhere. */
static size_t live_bytes, peak_bytes;

static size_t usable_bytes(void *memory) {
#if defined(__GLIBC__)
    return malloc_usable_size(memory);
#else
    (void)memory;
    return 0;
#endif
}

static void count_alloc(void *memory) {
    const size_t bytes = usable_bytes(memory);
    const size_t now = __atomic_add_fetch(&live_bytes, bytes, __ATOMIC_RELAXED);
    size_t peak = __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED);
    while (now > peak && !__atomic_compare_exchange_n(&peak_bytes, &peak, now, 1,
                                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

void spconv__cpu_memory_usage(size_t *live, size_t *peak) {
    *live = __atomic_load_n(&live_bytes, __ATOMIC_RELAXED);
    *peak = __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED);
}

void spconv__cpu_memory_reset_peak(void) {
    __atomic_store_n(&peak_bytes, __atomic_load_n(&live_bytes, __ATOMIC_RELAXED),
                     __ATOMIC_RELAXED);
}

static spconv_status cpu_alloc(int device_index, size_t nbytes, void **ptr) {
    *ptr = NULL;
    if (nbytes == 0) return SPCONV_OK;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    const size_t machine = machine_memory_bytes();
    SPCONV_RETURN_ERROR_IF(nbytes > machine, SPCONV_ERR_OUT_OF_MEMORY,
                           "out of host memory: %zu bytes (%.3g GiB) are more than this machine's "
                           "memory and swap (%.3g GiB)",
                           nbytes, (double)nbytes / gib, (double)machine / gib);
    /* aligned_alloc wants the size to be a multiple of the alignment. */
    size_t rounded = nbytes > SIZE_MAX - (CPU_ALIGNMENT - 1)
                         ? 0
                         : (nbytes + CPU_ALIGNMENT - 1) & ~(CPU_ALIGNMENT - 1);
    void *memory = rounded == 0 ? NULL : aligned_alloc(CPU_ALIGNMENT, rounded);
    SPCONV_RETURN_ERROR_IF(memory == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "out of host memory allocating %zu bytes (%.3g GiB)", nbytes,
                           (double)nbytes / gib);
    count_alloc(memory);
    *ptr = memory;
    return SPCONV_OK;
}

static void cpu_free(int device_index, void *ptr) {
    if (ptr != NULL) __atomic_sub_fetch(&live_bytes, usable_bytes(ptr), __ATOMIC_RELAXED);
    free(ptr);
}

/* Host and device are the same memory, so all three transfers are memcpy. */
static spconv_status cpu_memcpy(spconv_context *ctx, int device_index, void *dst, const void *src,
                                size_t nbytes) {
    if (nbytes > 0) memcpy(dst, src, nbytes);
    return SPCONV_OK;
}

/* ---- walking two strided operands together -------------------------------------------------- */

typedef struct walk {
    int ndim;                          /* >= 1; the last dim is walked by the run functions */
    int64_t sizes[SPCONV_MAX_DIMS];
    int64_t steps[2][SPCONV_MAX_DIMS]; /* byte strides of the destination and the source */
} walk;

/* Drop dims of size 1 and merge neighbours that both operands step through evenly, so that two
 * contiguous tensors become one long run (a single memcpy for equal dtypes). */
static void walk_init(walk *w, const spconv_tensor *dst, const spconv_tensor *src) {
    const spconv_tensor *operands[2] = {dst, src};
    w->ndim = 0;
    for (int i = 0; i < dst->ndim; ++i) {
        if (dst->sizes[i] == 1) continue;
        int n = w->ndim;
        int merge = n > 0;
        for (int k = 0; k < 2 && merge; ++k)
            merge = w->steps[k][n - 1] == operands[k]->strides[i] * dst->sizes[i];
        if (merge) {
            w->sizes[n - 1] *= dst->sizes[i];
        } else {
            w->sizes[n] = dst->sizes[i];
            w->ndim = n + 1;
        }
        for (int k = 0; k < 2; ++k) w->steps[k][w->ndim - 1] = operands[k]->strides[i];
    }
    if (w->ndim == 0) {
        w->ndim = 1;
        w->sizes[0] = 1;
        w->steps[0][0] = w->steps[1][0] = 0;
    }
    for (int k = 0; k < 2; ++k) {
        int64_t element = (int64_t)spconv__tensor_element_size(operands[k]);
        for (int d = 0; d < w->ndim; ++d) w->steps[k][d] *= element;
    }
}

typedef struct run_args {
    spconv_dtype dst_dtype, src_dtype;
    size_t element;         /* bytes per element when the dtypes are equal */
    unsigned char pattern[8]; /* fill: the value in the destination's dtype */
} run_args;

typedef void (*run_fn)(char *dst, int64_t dst_step, const char *src, int64_t src_step, int64_t n,
                       const run_args *args);

static void walk_runs(const walk *w, char *dst, const char *src, run_fn run, const run_args *args) {
    int inner = w->ndim - 1;
    int64_t index[SPCONV_MAX_DIMS] = {0};
    for (;;) {
        run(dst, w->steps[0][inner], src, w->steps[1][inner], w->sizes[inner], args);
        int d = inner - 1;
        while (d >= 0 && ++index[d] == w->sizes[d]) {
            index[d] = 0;
            dst -= w->steps[0][d] * (w->sizes[d] - 1);
            src -= w->steps[1][d] * (w->sizes[d] - 1);
            --d;
        }
        if (d < 0) return;
        dst += w->steps[0][d];
        src += w->steps[1][d];
    }
}

/* ---- runs: one row of elements ---------------------------------------------------------------- */

/* Fixed-size memcpy per element, so the compiler turns each into one load and one store. */
#define COPY_EACH(bytes, from, from_step)                                                    \
    for (int64_t i = 0; i < n; ++i) memcpy(dst + i * dst_step, (from) + i * (from_step), bytes)

static void run_copy_same(char *dst, int64_t dst_step, const char *src, int64_t src_step,
                          int64_t n, const run_args *args) {
    if (dst_step == (int64_t)args->element && src_step == dst_step) {
        memcpy(dst, src, (size_t)n * args->element);
        return;
    }
    switch (args->element) {
    case 1: COPY_EACH(1, src, src_step); break;
    case 2: COPY_EACH(2, src, src_step); break;
    case 4: COPY_EACH(4, src, src_step); break;
    default: COPY_EACH(8, src, src_step); break;
    }
}

static void run_copy_convert(char *dst, int64_t dst_step, const char *src, int64_t src_step,
                             int64_t n, const run_args *args) {
    for (int64_t i = 0; i < n; ++i)
        spconv__convert_element(dst + i * dst_step, args->dst_dtype, src + i * src_step,
                                args->src_dtype);
}

static void run_fill(char *dst, int64_t dst_step, const char *src, int64_t src_step, int64_t n,
                     const run_args *args) {
    const char *pattern = (const char *)args->pattern;
    switch (args->element) {
    case 1: COPY_EACH(1, pattern, 0); break;
    case 2: COPY_EACH(2, pattern, 0); break;
    case 4: COPY_EACH(4, pattern, 0); break;
    default: COPY_EACH(8, pattern, 0); break;
    }
}

#undef COPY_EACH

/* ---- contiguous 16-bit <-> f32: the conversions around every 16-bit conv and layer ---------- */

/* Above this many elements a conversion is split over the context's threads. */
#define CONVERT_PARALLEL_MIN ((int64_t)1 << 18)

typedef void (*convert_fn)(void *dst, const void *src, int64_t begin, int64_t end);

/* The same functions of convert.h as the element-wise path (so the same bits), without the
 * per-element dtype dispatch and the trip through double. That trip makes a signalling NaN
 * quiet, so widening does it here too. */
static float quiet(float value) {
    const uint32_t bits = spconv__f32_bits(value);
    return (bits & 0x7FFFFFFFu) > 0x7F800000u ? spconv__f32_from_bits(bits | 0x00400000u) : value;
}
static void f16_to_f32(void *dst, const void *src, int64_t begin, int64_t end) {
    const uint16_t *s = src;
    float *d = dst;
    for (int64_t i = begin; i < end; ++i) d[i] = quiet(spconv__f16_to_f32(s[i]));
}
static void bf16_to_f32(void *dst, const void *src, int64_t begin, int64_t end) {
    const uint16_t *s = src;
    float *d = dst;
    for (int64_t i = begin; i < end; ++i) d[i] = quiet(spconv__bf16_to_f32(s[i]));
}
static void f32_to_f16(void *dst, const void *src, int64_t begin, int64_t end) {
    const float *s = src;
    uint16_t *d = dst;
    for (int64_t i = begin; i < end; ++i) d[i] = spconv__f32_to_f16(s[i]);
}
static void f32_to_bf16(void *dst, const void *src, int64_t begin, int64_t end) {
    const float *s = src;
    uint16_t *d = dst;
    for (int64_t i = begin; i < end; ++i) d[i] = spconv__f32_to_bf16(s[i]);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
/* The F16C instructions convert 8 values at a time with the same rules: round to nearest even,
 * overflow to inf, subnormals exact, NaN made quiet with the top payload bits kept (held
 * bit for bit against the element-wise path by tests/test_tensor.c on every f16 and on 2^20
 * f32 patterns), also with MXCSR's denormals-are-zero / flush-to-zero set, which they ignore.
 * Compiled for F16C only here, chosen when the machine has it. */
#define F16C_TARGET __attribute__((target("avx,f16c")))
#define HAVE_F16C_PATH 1

/* AVX (which also checks that the OS saves the YMM registers) and the F16C bit of CPUID leaf 1;
 * clang's __builtin_cpu_supports knows no "f16c". */
static int have_f16c(void) {
    static int available = -1;
    if (available < 0) {
        unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
        __builtin_cpu_init();
        available = __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) &&
                    (ecx & bit_F16C) != 0;
    }
    return available;
}

F16C_TARGET static void f16_to_f32_f16c(void *dst, const void *src, int64_t begin, int64_t end) {
    const uint16_t *s = src;
    float *d = dst;
    int64_t i = begin;
    for (; i + 8 <= end; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    f16_to_f32(dst, src, i, end);
}

F16C_TARGET static void f32_to_f16_f16c(void *dst, const void *src, int64_t begin, int64_t end) {
    const float *s = src;
    uint16_t *d = dst;
    int64_t i = begin;
    for (; i + 8 <= end; i += 8)
        _mm_storeu_si128((__m128i *)(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(s + i),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    f32_to_f16(dst, src, i, end);
}
#else
#define HAVE_F16C_PATH 0
#endif

static convert_fn contiguous_convert(spconv_dtype dst, spconv_dtype src) {
#if HAVE_F16C_PATH
    if (have_f16c()) {
        if (dst == SPCONV_F32 && src == SPCONV_F16) return f16_to_f32_f16c;
        if (dst == SPCONV_F16 && src == SPCONV_F32) return f32_to_f16_f16c;
    }
#endif
    if (dst == SPCONV_F32 && src == SPCONV_F16) return f16_to_f32;
    if (dst == SPCONV_F32 && src == SPCONV_BF16) return bf16_to_f32;
    if (dst == SPCONV_F16 && src == SPCONV_F32) return f32_to_f16;
    if (dst == SPCONV_BF16 && src == SPCONV_F32) return f32_to_bf16;
    return NULL;
}

static void convert_contiguous(spconv_context *ctx, convert_fn fn, void *dst, const void *src,
                               int64_t n) {
    const int threads = n >= CONVERT_PARALLEL_MIN ? spconv_context_num_threads(ctx) : 1;
    if (threads <= 1) {
        fn(dst, src, 0, n);
        return;
    }
    SPCONV_OMP(omp parallel for num_threads(threads) schedule(static))
    for (int t = 0; t < threads; ++t) fn(dst, src, n * t / threads, n * (t + 1) / threads);
}

/* ---- slots ------------------------------------------------------------------------------------ */

static spconv_status cpu_copy_strided(spconv_context *ctx, spconv_tensor *dst,
                                      const spconv_tensor *src) {
    if (dst->numel == 0) return SPCONV_OK;
    const convert_fn fast = contiguous_convert(dst->dtype, src->dtype);
    if (fast != NULL && dst->is_contiguous && src->is_contiguous) {
        convert_contiguous(ctx, fast, spconv_tensor_data(dst), spconv_tensor_data(src), dst->numel);
        return SPCONV_OK;
    }
    walk w;
    walk_init(&w, dst, src);
    run_args args = {dst->dtype, src->dtype, spconv__tensor_element_size(dst), {0}};
    walk_runs(&w, spconv_tensor_data(dst), spconv_tensor_data(src),
              dst->dtype == src->dtype ? run_copy_same : run_copy_convert, &args);
    return SPCONV_OK;
}

static spconv_status cpu_fill(spconv_context *ctx, spconv_tensor *dst, double value) {
    if (dst->numel == 0) return SPCONV_OK;
    walk w;
    /* The destination doubles as the source operand: run_fill ignores it, and the walk never
     * does arithmetic on a NULL pointer. */
    walk_init(&w, dst, dst);
    run_args args = {dst->dtype, dst->dtype, spconv__tensor_element_size(dst), {0}};
    spconv__store_from_floating(args.pattern, dst->dtype, value);
    walk_runs(&w, spconv_tensor_data(dst), spconv_tensor_data(dst), run_fill, &args);
    return SPCONV_OK;
}

/* An empty slot means "not needed": the CPU has no stream or handles to set up or wait for. */
const spconv_backend spconv__cpu_backend = {
    .name            = "cpu",
    .device_count    = cpu_device_count,
    .context_init    = NULL,
    .context_destroy = NULL,
    .context_set_stream = NULL,
    .synchronize     = NULL,
    .mark_create     = NULL,
    .mark_destroy    = NULL,
    .mark_record     = NULL,
    .mark_elapsed_ms = NULL,
    .alloc           = cpu_alloc,
    .alloc_ordered   = NULL,
    .free            = cpu_free,
    .copy_to_device  = cpu_memcpy,
    .copy_to_host    = cpu_memcpy,
    .copy_on_device  = cpu_memcpy,
    .copy_strided    = cpu_copy_strided,
    .fill            = cpu_fill,
    .voxelize        = spconv__cpu_voxelize,
    .rulebook_build  = spconv__cpu_rulebook_build,
    .conv_forward    = spconv__cpu_conv_forward,
    .conv_backward   = spconv__cpu_conv_backward,
    .maxpool_forward = spconv__cpu_maxpool_forward,
    .maxpool_backward = spconv__cpu_maxpool_backward,
    .sparse_to_dense = spconv__cpu_sparse_to_dense,
    .dense_to_sparse = spconv__cpu_dense_to_sparse,
    .batchnorm_stats = spconv__cpu_batchnorm_stats,
    .batchnorm_terms = spconv__cpu_batchnorm_terms,
    .batchnorm_apply = spconv__cpu_batchnorm_apply,
    .batchnorm_backward = spconv__cpu_batchnorm_backward,
    .relu_forward    = spconv__cpu_relu_forward,
    .relu_backward   = spconv__cpu_relu_backward,
    .axpy            = spconv__cpu_axpy,
    .to_dense_scatter = spconv__cpu_to_dense_scatter,
    .to_dense_gather = spconv__cpu_to_dense_gather,
};
