/* Shared pieces of the CPU conv executors (see conv_cpu.h). */
#include "conv/conv_cpu.h"
#include "conv/fused.h"
#include "conv/gemm.h"

#include <stdlib.h>
#include <string.h>

#include "core/context_impl.h"
#include "core/error.h"
#include "rulebook/rulebook_impl.h"

/* Bytes of gathered operands per thread and chunk: small enough that a chunk's operands and the
 * packed panels of the product stay in a core's L2 (2 MiB on the development machine), large
 * enough that a product has hundreds of rows to amortise its packing of W[k]. */
#define SPCONV__CHUNK_BYTES (512 * 1024)
#define SPCONV__CHUNK_MIN 16
#define SPCONV__CHUNK_MAX 4096

/* Bytes of target rows per block: with a chunk's operands the block still fits the L2, so the
 * scatter-adds of all offsets hit cache; and a block of 64-channel f32 rows holds 4096 rows, so
 * that a subm offset (about a quarter of the sites each, on LiDAR scans) still gives its GEMM
 * about a thousand rows. */
#define SPCONV__BLOCK_BYTES (1024 * 1024)
#define SPCONV__BLOCK_MIN 64
#define SPCONV__BLOCK_MAX 16384

void spconv__clock_merge(const spconv__phase_clock *clock, spconv__conv_timing *timing) {
    if (!clock->on) return;
    SPCONV_OMP(omp critical(spconv_conv_timing)) {
        timing->gather_s += clock->gather_s;
        timing->gemm_s += clock->gemm_s;
        timing->scatter_s += clock->scatter_s;
    }
}

void spconv__conv_plan_init(spconv__conv_plan *plan, const spconv_rulebook *rb, spconv_dtype dtype,
                            int64_t c_in, int64_t c_out, int64_t chunk_row_elems,
                            spconv__gemm_impl gemm) {
    plan->dtype = dtype;
    plan->elem = spconv_dtype_size(dtype);
    plan->kernel_volume = spconv_rulebook_kernel_volume(rb);
    plan->c_in = c_in;
    plan->c_out = c_out;
    plan->num_in = spconv_rulebook_num_in(rb);
    plan->num_out = spconv_rulebook_num_out(rb);
    plan->identity_k = rb->center_is_identity ? plan->kernel_volume / 2 : -1;
    int64_t row_bytes = chunk_row_elems * (int64_t)plan->elem;
    int64_t chunk = row_bytes > 0 ? SPCONV__CHUNK_BYTES / row_bytes : SPCONV__CHUNK_MAX;
    if (chunk < SPCONV__CHUNK_MIN) chunk = SPCONV__CHUNK_MIN;
    if (chunk > SPCONV__CHUNK_MAX) chunk = SPCONV__CHUNK_MAX;
    plan->chunk = chunk;
    plan->gemm = gemm;
    plan->fused = gemm == SPCONV__GEMM_AUTO && spconv__fused_available() &&
                  (dtype == SPCONV_F32 || dtype == SPCONV_F64);
}

int64_t spconv__block_rows(const spconv__conv_plan *plan, int64_t row_elems) {
    int64_t row_bytes = row_elems * (int64_t)plan->elem;
    int64_t rows = row_bytes > 0 ? SPCONV__BLOCK_BYTES / row_bytes : SPCONV__BLOCK_MAX;
    if (rows < SPCONV__BLOCK_MIN) rows = SPCONV__BLOCK_MIN;
    if (rows > SPCONV__BLOCK_MAX) rows = SPCONV__BLOCK_MAX;
    return rows;
}

int spconv__rows_sorted(const int64_t *starts, int64_t num_segments, const int32_t *rows,
                        int threads) {
    int unsorted = 0;
    SPCONV_OMP(omp parallel for schedule(dynamic, 1) num_threads(threads) reduction(| : unsorted))
    for (int64_t k = 0; k < num_segments; ++k) {
        int bad = 0; /* no early exit: a branch-free loop vectorises, and sorted is the usual case */
        for (int64_t p = starts[k] + 1; p < starts[k + 1]; ++p) bad |= rows[p - 1] >= rows[p];
        unsorted |= bad;
    }
    return !unsorted;
}

int spconv__rulebook_rows_sorted(const spconv_rulebook *rb, int side, const int32_t *rows,
                                 int threads) {
    /* The order is a property of pair lists nobody changes after the build, so it is learnt
     * once; a rulebook shared between threads may learn it twice, with the same answer. */
    int *order = (int *)&rb->rows_order[side];
    const int known = __atomic_load_n(order, __ATOMIC_RELAXED);
    if (known != SPCONV__ORDER_UNKNOWN) return known == SPCONV__ORDER_SORTED;
    const int sorted = spconv__rows_sorted(rb->active_starts, rb->num_active, rows, threads);
    __atomic_store_n(order, sorted ? SPCONV__ORDER_SORTED : SPCONV__ORDER_UNSORTED,
                     __ATOMIC_RELAXED);
    return sorted;
}

void spconv__sort_by_target(const int64_t *starts, int64_t num_segments, const int32_t *source,
                            const int32_t *target, int64_t num_targets, int32_t *slots,
                            int32_t *sorted_source, int32_t *sorted_target, int threads) {
    SPCONV_OMP(omp parallel num_threads(threads)) {
        int32_t *slot = slots + (size_t)spconv__omp_thread() * (size_t)num_targets;
        for (int64_t r = 0; r < num_targets; ++r) slot[r] = -1;
        SPCONV_OMP(omp for schedule(dynamic, 1))
        for (int64_t k = 0; k < num_segments; ++k) {
            int64_t out = starts[k];
            for (int64_t p = starts[k]; p < starts[k + 1]; ++p) slot[target[p]] = source[p];
            /* Read back in row order, leaving every slot at -1 for the next offset. */
            for (int64_t r = 0; r < num_targets && out < starts[k + 1]; ++r) {
                if (slot[r] < 0) continue;
                sorted_source[out] = slot[r];
                sorted_target[out++] = (int32_t)r;
                slot[r] = -1;
            }
        }
    }
}

int64_t spconv__pair_bounds_entries(const spconv__pair_lists *lists, int64_t block_rows,
                                    int64_t blocks) {
    if (blocks < 2 || block_rows < 1) return 0; /* one block: its range is the segment */
    const int64_t active = lists->num_active;
    /* at most pairs + active entries: (blocks + 1) * active <= limit, checked by division so
     * that nothing overflows */
    const int64_t limit = lists->starts[active] + active;
    if (active < 1 || blocks >= limit / active) return 0;
    return active * (blocks + 1);
}

size_t spconv__pair_bounds_bytes(int64_t entries, int64_t blocks, int threads) {
    if (entries == 0) return 0;
    return spconv__align_line((size_t)entries * sizeof(int64_t)) +
           spconv__align_line((size_t)threads * (size_t)(blocks + 1) * sizeof(int64_t));
}

int64_t *spconv__pair_bounds_scratch(int64_t *table, int64_t entries) {
    return table + spconv__align_line((size_t)entries * sizeof(int64_t)) / sizeof(int64_t);
}

void spconv__pair_bounds(const spconv__pair_lists *lists, int64_t j, int64_t *scratch) {
    const int64_t blocks = lists->blocks, block_rows = lists->block_rows;
    const int64_t segment = lists->mirrored ? lists->num_active - 1 - j : j;
    const int32_t *target = lists->target;
    int64_t *lo = lists->bounds + j * (blocks + 1), *hi = scratch;
    lo[0] = lists->starts[segment];
    lo[blocks] = lists->starts[segment + 1];
    for (int64_t b = 1; b < blocks; ++b) {
        lo[b] = lo[0];
        hi[b] = lo[blocks];
    }
    /* Every search halves its range per round; the searches of one round are independent. */
    for (int more = 1; more;) {
        more = 0;
        for (int64_t b = 1; b < blocks; ++b) {
            if (lo[b] >= hi[b]) continue;
            const int64_t mid = lo[b] + (hi[b] - lo[b]) / 2;
            const int below = target[mid] < b * block_rows;
            lo[b] = below ? mid + 1 : lo[b];
            hi[b] = below ? hi[b] : mid;
            more = 1;
        }
    }
}

int64_t *spconv__pair_bounds_alloc(spconv__pair_lists *lists, int64_t block_rows, int64_t blocks,
                                   int threads, void **memory) {
    *memory = NULL;
    lists->bounds = NULL;
    const int64_t entries = spconv__pair_bounds_entries(lists, block_rows, blocks);
    if (entries == 0) return NULL;
    int64_t *table = malloc(spconv__pair_bounds_bytes(entries, blocks, threads));
    if (table == NULL) return NULL;
    *memory = table;
    lists->bounds = table;
    lists->block_rows = block_rows;
    lists->blocks = blocks;
    return spconv__pair_bounds_scratch(table, entries);
}

int64_t spconv__lower_bound(const int32_t *rows, int64_t lo, int64_t hi, int64_t value) {
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (rows[mid] < value)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Rows gathered ahead of the copy: their cache misses then overlap instead of each stalling it
 * (the rows follow no pattern the hardware prefetcher could follow). */
#define GATHER_AHEAD 8

void spconv__gather_rows(void *dst, const void *src, const int32_t *rows, int64_t n,
                         size_t row_bytes) {
    char *d = dst;
    const char *s = src;
    for (int64_t i = 0; i < n; ++i) {
        if (i + GATHER_AHEAD < n) {
            const char *ahead = s + (size_t)rows[i + GATHER_AHEAD] * row_bytes;
            for (size_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(ahead + b);
        }
        memcpy(d + (size_t)i * row_bytes, s + (size_t)rows[i] * row_bytes, row_bytes);
    }
}

/* The scatter-adds stream every pair's product row through the cache once: wide vectors pay
 * off (SPCONV__VECTOR_CLONES, gemm.h). */
SPCONV__VECTOR_CLONES
static void scatter_add_f32(float *dst, const int32_t *rows, const float *src, int64_t n,
                            int64_t cols) {
    for (int64_t i = 0; i < n; ++i) {
        float *restrict d = dst + (int64_t)rows[i] * cols;
        const float *restrict s = src + i * cols;
        for (int64_t j = 0; j < cols; ++j) d[j] += s[j];
    }
}

SPCONV__VECTOR_CLONES
static void scatter_add_f64(double *dst, const int32_t *rows, const double *src, int64_t n,
                            int64_t cols) {
    for (int64_t i = 0; i < n; ++i) {
        double *restrict d = dst + (int64_t)rows[i] * cols;
        const double *restrict s = src + i * cols;
        for (int64_t j = 0; j < cols; ++j) d[j] += s[j];
    }
}

void spconv__scatter_add_rows(spconv_dtype dtype, void *dst, const int32_t *rows, const void *src,
                              int64_t n, int64_t cols) {
    if (dtype == SPCONV_F32)
        scatter_add_f32(dst, rows, src, n, cols);
    else
        scatter_add_f64(dst, rows, src, n, cols);
}

spconv_status spconv__cpu_workspace(spconv_context *ctx, size_t nbytes, void **ptr,
                                    spconv_context **temp) {
    *ptr = NULL;
    *temp = NULL;
    if (ctx == NULL || ctx->device.type != SPCONV_DEVICE_CPU) {
        SPCONV_FORWARD_IF_ERROR(spconv_context_create(spconv_cpu(), temp));
        ctx = *temp;
    }
    spconv_status st = spconv_context_workspace(ctx, nbytes, ptr);
    if (st != SPCONV_OK) {
        spconv_context_destroy(*temp);
        *temp = NULL;
    }
    return st;
}

int spconv__weight_view_of(const spconv_tensor *weight, spconv__weight_view *view) {
    const int nd = spconv_tensor_ndim(weight);
    if (nd < 2) return 0;
    const int64_t *sizes = spconv_tensor_sizes(weight), *strides = spconv_tensor_strides(weight);
    const int64_t ci = strides[nd - 2], co = strides[nd - 1];
    if (!(ci == 1 || co == 1)) return 0;
    /* the kernel dims, innermost first, must step by one stride: size-1 dims do not count */
    int64_t k_stride = -1, expect = -1;
    for (int d = nd - 3; d >= 0; --d) {
        if (sizes[d] == 1) continue;
        if (k_stride < 0)
            k_stride = strides[d], expect = strides[d] * sizes[d];
        else if (strides[d] != expect)
            return 0;
        else
            expect *= sizes[d];
    }
    view->data = spconv_tensor_data(weight);
    view->k_stride = k_stride < 0 ? 0 : k_stride;
    view->ci_stride = ci;
    view->co_stride = co;
    return 1;
}
