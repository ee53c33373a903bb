/* The CPU hash table of a set of active sites, built while every row is validated. */
#ifndef SPCONV_RULEBOOK_SITES_H
#define SPCONV_RULEBOOK_SITES_H

#include <stdint.h>

#include "rulebook/hash.h"
#include "spconv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spconv__site_table {
    spconv__key_layout layout; /* for (batch_size, shape) */
    /* capacity: power of two >= 4 * number of rows (spconv__hash_capacity_for); seed drawn
     * afresh for every build (spconv__hash_seed_draw) */
    spconv__hash_table hash;
} spconv__site_table;

/* Key layout for (batch_size, shape), or SPCONV_ERR_OVERFLOW naming @p func and @p which shape
 * it is ("input" or "output": an output shape can outgrow the key where the input did not) when
 * the fields do not fit a 64-bit key. */
spconv_status spconv__key_layout_checked(const char *func, const char *which, int64_t batch_size,
                                         const int64_t shape[3], spconv__key_layout *layout);

/**
 * Hash the @p num_rows rows (b, z, y, x) of @p rows (contiguous int32) to their row numbers with
 * @p num_threads threads, checking each row: batch index outside [0, batch_size) or coordinates
 * outside @p shape is SPCONV_ERR_OUT_OF_RANGE, a repeated row SPCONV_ERR_DUPLICATE_INDEX; the
 * message names the first offending row, whatever the thread count. On failure the table is
 * left empty (nothing to free).
 */
spconv_status spconv__site_table_build(const char *func, int num_threads, const int32_t *rows,
                                       int64_t num_rows, const int64_t shape[3], int64_t batch_size,
                                       spconv__site_table *table);

void spconv__site_table_free(spconv__site_table *table);

/* First row outside the batch or the shape, or @p num_rows when all are inside. */
int64_t spconv__first_out_of_range(int num_threads, const int32_t *rows, int64_t num_rows,
                                   const int64_t shape[3], int64_t batch_size);

/* The errors of a bad row as spconv__site_table_build words them, for builders that validate
 * elsewhere (the CUDA backend): @p row (host copy) is row @p r and lies outside the batch or the
 * shape; or it repeats row @p owner. Both return the status they record. */
spconv_status spconv__report_out_of_range(const char *func, const int32_t row[4], int64_t r,
                                          const int64_t shape[3], int64_t batch_size);
spconv_status spconv__report_duplicate(const char *func, const int32_t row[4], int64_t r,
                                       int64_t owner);

#ifdef __cplusplus
}
#endif
#endif /* SPCONV_RULEBOOK_SITES_H */
