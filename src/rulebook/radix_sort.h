/* Parallel LSD radix sort of 64-bit keys carrying 64-bit values (rulebook output sites). */
#ifndef SPCONV_RULEBOOK_RADIX_SORT_H
#define SPCONV_RULEBOOK_RADIX_SORT_H

#include <stdint.h>

#include "spconv/status.h"

/**
 * Sort the @p n (keys[i], values[i]) by the low @p key_bits bits of the keys (higher bits must be
 * zero), stably, so the result depends only on the input order and not on @p num_threads.
 * @p tmp_keys / @p tmp_values are scratch arrays of @p n entries; the sorted arrays end up in
 * either pair of buffers, returned in *sorted_keys / *sorted_values. Fails only for memory.
 */
spconv_status spconv__radix_sort(const char *func, int num_threads, int64_t n, uint32_t key_bits,
                                 uint64_t *keys, uint64_t *values, uint64_t *tmp_keys,
                                 uint64_t *tmp_values, uint64_t **sorted_keys,
                                 uint64_t **sorted_values);

#endif /* SPCONV_RULEBOOK_RADIX_SORT_H */
