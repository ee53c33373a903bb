/* Parallel LSD radix sort (see radix_sort.h). Each pass: per-chunk digit histograms, one prefix
 * sum in (digit, chunk) order, and a stable scatter where every chunk writes its own ranges. */
#include <inttypes.h>
#include <stdlib.h>

#include "core/error.h"
#include "core/parallel.h"
#include "rulebook/internal.h"
#include "rulebook/radix_sort.h"

/* 2^11 counters per chunk stay in L1 while a chunk is histogrammed; 3 passes cover the 29-bit
 * keys of a typical LiDAR grid. */
#define RADIX_BITS 11
#define RADIX_SIZE (1 << RADIX_BITS)
/* Spare chunks let the other threads go on when the OS preempts one. */
#define CHUNKS_PER_THREAD 4

static uint32_t digit_of(uint64_t key, uint32_t shift) {
    return (uint32_t)(key >> shift) & (RADIX_SIZE - 1);
}

static void histogram_chunk(const uint64_t *keys, int64_t begin, int64_t end, uint32_t shift,
                            int64_t *hist) {
    for (int d = 0; d < RADIX_SIZE; ++d) hist[d] = 0;
    for (int64_t i = begin; i < end; ++i) ++hist[digit_of(keys[i], shift)];
}

/* Turn the counts into each chunk's first output position per digit; returns 1 when one digit
 * holds every key, so the pass would not move anything. */
static int exclusive_scan(int64_t *hist, int64_t num_chunks, int64_t n) {
    int64_t running = 0;
    int single_digit = 0;
    for (int d = 0; d < RADIX_SIZE; ++d) {
        int64_t digit_total = 0;
        for (int64_t c = 0; c < num_chunks; ++c) {
            const int64_t count = hist[c * RADIX_SIZE + d];
            hist[c * RADIX_SIZE + d] = running;
            running += count;
            digit_total += count;
        }
        if (digit_total == n) single_digit = 1;
    }
    return single_digit;
}

static void scatter_chunk(const uint64_t *keys, const uint64_t *values, int64_t begin, int64_t end,
                          uint32_t shift, int64_t *next, uint64_t *out_keys, uint64_t *out_values) {
    for (int64_t i = begin; i < end; ++i) {
        const int64_t pos = next[digit_of(keys[i], shift)]++;
        out_keys[pos] = keys[i];
        out_values[pos] = values[i];
    }
}

spconv_status spconv__radix_sort(const char *func, int num_threads, int64_t n, uint32_t key_bits,
                                 uint64_t *keys, uint64_t *values, uint64_t *tmp_keys,
                                 uint64_t *tmp_values, uint64_t **sorted_keys,
                                 uint64_t **sorted_values) {
    const int64_t num_chunks = (int64_t)num_threads * CHUNKS_PER_THREAD;
    int64_t *hist = malloc((size_t)num_chunks * RADIX_SIZE * sizeof *hist);
    SPCONV_RETURN_ERROR_IF(hist == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "%s: out of host memory for radix sort histograms", func);
    uint64_t *src_keys = keys, *src_values = values, *dst_keys = tmp_keys, *dst_values = tmp_values;
    for (uint32_t shift = 0; shift < key_bits; shift += RADIX_BITS) {
        SPCONV_OMP(omp parallel for num_threads(num_threads) schedule(dynamic, 1))
        for (int64_t c = 0; c < num_chunks; ++c) {
            int64_t begin, end;
            spconv__chunk_bounds(n, num_chunks, c, &begin, &end);
            histogram_chunk(src_keys, begin, end, shift, hist + c * RADIX_SIZE);
        }
        if (exclusive_scan(hist, num_chunks, n)) continue;
        SPCONV_OMP(omp parallel for num_threads(num_threads) schedule(dynamic, 1))
        for (int64_t c = 0; c < num_chunks; ++c) {
            int64_t begin, end;
            spconv__chunk_bounds(n, num_chunks, c, &begin, &end);
            scatter_chunk(src_keys, src_values, begin, end, shift, hist + c * RADIX_SIZE, dst_keys,
                          dst_values);
        }
        uint64_t *swap_keys = src_keys, *swap_values = src_values;
        src_keys = dst_keys;
        src_values = dst_values;
        dst_keys = swap_keys;
        dst_values = swap_values;
    }
    free(hist);
    *sorted_keys = src_keys;
    *sorted_values = src_values;
    return SPCONV_OK;
}
