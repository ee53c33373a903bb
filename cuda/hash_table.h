/* C entry points of the CUDA backend's hash tables, for tests (the builders use maps_common.h). */
#ifndef SPCONV_CUDA_HASH_TABLE_H
#define SPCONV_CUDA_HASH_TABLE_H

#include <stdint.h>

#include "spconv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Insert the @p n host @p keys (none SPCONV_HASH_EMPTY) into a fresh table of @p capacity slots
 *  (a power of two) on CUDA device @p device_index, as the builders do: SPCONV_ERR_CAPACITY when
 *  the table runs out of slots. For the tests of the full-table path. */
spconv_status spconv__cuda_hash_fill_check(int device_index, const uint64_t *keys, int64_t n,
                                           uint64_t capacity);

#ifdef __cplusplus
}
#endif
#endif /* SPCONV_CUDA_HASH_TABLE_H */
