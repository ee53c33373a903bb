/* Validating hash tables of active sites (see sites.h). */
#include <inttypes.h>
#include <stdlib.h>

#include "core/error.h"
#include "core/parallel.h"
#include "rulebook/sites.h"

/* Rows are handed out in blocks on demand, so a thread that the OS preempts does not hold the
 * others up. */
#define ROWS_PER_TASK 4096

spconv_status spconv__key_layout_checked(const char *func, const char *which, int64_t batch_size,
                                         const int64_t shape[3], spconv__key_layout *layout) {
    SPCONV_RETURN_ERROR_IF(!spconv__key_layout_init(layout, batch_size, shape), SPCONV_ERR_OVERFLOW,
                           "%s: batch size %" PRId64 " and %s spatial shape (%" PRId64 ", %" PRId64
                           ", %" PRId64 ") need %u key bits; a 64-bit site key holds at most %d",
                           func, batch_size, which, shape[0], shape[1], shape[2],
                           (unsigned)layout->total_bits, SPCONV_KEY_MAX_BITS);
    return SPCONV_OK;
}

static int row_in_range(const int32_t *row, const int64_t shape[3], int64_t batch_size) {
    return row[0] >= 0 && row[0] < batch_size && row[1] >= 0 && row[1] < shape[0] && row[2] >= 0 &&
           row[2] < shape[1] && row[3] >= 0 && row[3] < shape[2];
}

int64_t spconv__first_out_of_range(int num_threads, const int32_t *rows, int64_t num_rows,
                                   const int64_t shape[3], int64_t batch_size) {
    int64_t first = num_rows;
    SPCONV_OMP(omp parallel for num_threads(num_threads) schedule(dynamic, ROWS_PER_TASK) reduction(min : first))
    for (int64_t r = 0; r < num_rows; ++r)
        if (r < first && !row_in_range(rows + 4 * r, shape, batch_size)) first = r;
    return first;
}

spconv_status spconv__report_out_of_range(const char *func, const int32_t row[4], int64_t r,
                                          const int64_t shape[3], int64_t batch_size) {
    SPCONV_RETURN_ERROR_IF(row[0] < 0 || row[0] >= batch_size, SPCONV_ERR_OUT_OF_RANGE,
                           "%s: indices row %" PRId64 " = (%d, %d, %d, %d) has batch index %d "
                           "outside batch size %" PRId64,
                           func, r, row[0], row[1], row[2], row[3], row[0], batch_size);
    SPCONV_RETURN_ERROR(SPCONV_ERR_OUT_OF_RANGE,
                        "%s: indices row %" PRId64
                        " = (%d, %d, %d, %d) is outside spatial shape (%" PRId64 ", %" PRId64
                        ", %" PRId64 ")",
                        func, r, row[0], row[1], row[2], row[3], shape[0], shape[1], shape[2]);
}

spconv_status spconv__report_duplicate(const char *func, const int32_t row[4], int64_t r,
                                       int64_t owner) {
    SPCONV_RETURN_ERROR(SPCONV_ERR_DUPLICATE_INDEX,
                        "%s: indices row %" PRId64 " = (%d, %d, %d, %d) duplicates row %" PRId64,
                        func, r, row[0], row[1], row[2], row[3], owner);
}

static uint64_t row_key(const spconv__key_layout *layout, const int32_t *row) {
    return spconv__key_pack(layout, row[0], row[1], row[2], row[3]);
}

/* Inserts rows [0, num_rows); *refused counts rows that found the table full, *repeated rows
 * whose key was there already. */
static void insert_rows(int num_threads, const spconv__site_table *table, const int32_t *rows,
                        int64_t num_rows, int64_t *refused, int64_t *repeated) {
    int64_t full = 0, again = 0;
    SPCONV_OMP(omp parallel for num_threads(num_threads) schedule(dynamic, ROWS_PER_TASK) reduction(+ : full, again))
    for (int64_t r = 0; r < num_rows; ++r) {
        const int outcome =
            spconv__hash_insert(&table->hash, row_key(&table->layout, rows + 4 * r), (int32_t)r);
        full += outcome == SPCONV_HASH_FULL;
        again += outcome == SPCONV_HASH_REPEATED;
    }
    *refused = full;
    *repeated = again;
}

/* The table keeps the smallest row of each key, so a row that does not find itself repeats an
 * earlier one; returns the first such row, or num_rows. Only run when some key repeated: which
 * row is first depends on the order of rows, not on the order the threads inserted them. */
static int64_t first_duplicate(int num_threads, const spconv__site_table *table,
                               const int32_t *rows, int64_t num_rows) {
    int64_t first = num_rows;
    SPCONV_OMP(omp parallel for num_threads(num_threads) schedule(dynamic, ROWS_PER_TASK) reduction(min : first))
    for (int64_t r = 0; r < num_rows; ++r) {
        if (r >= first) continue;
        const int32_t owner = spconv__hash_find(&table->hash, row_key(&table->layout, rows + 4 * r));
        if (owner != r) first = r;
    }
    return first;
}

static spconv_status table_alloc(const char *func, int num_threads, int64_t num_rows,
                                 spconv__hash_table *hash) {
    hash->capacity = spconv__hash_capacity_for(num_rows);
    SPCONV_RETURN_ERROR_IF(
        hash->capacity == 0 || hash->capacity > SIZE_MAX / sizeof *hash->slots,
        SPCONV_ERR_OVERFLOW, "%s: a hash table for %" PRId64 " sites is too large", func, num_rows);
    hash->bits = spconv__hash_bits_for(hash->capacity);
    spconv__hash_seed_draw(&hash->seed);
    hash->slots = malloc(hash->capacity * sizeof *hash->slots);
    SPCONV_RETURN_ERROR_IF(hash->slots == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "%s: out of host memory for a hash table of %" PRIu64 " slots", func,
                           hash->capacity);
    spconv__hash_slot *slots = hash->slots;
    const int64_t capacity = (int64_t)hash->capacity;
    SPCONV_OMP(omp parallel for num_threads(num_threads) schedule(static))
    for (int64_t s = 0; s < capacity; ++s) {
        slots[s].key = SPCONV_HASH_EMPTY;
        slots[s].value = INT32_MAX;
    }
    return SPCONV_OK;
}

spconv_status spconv__site_table_build(const char *func, int num_threads, const int32_t *rows,
                                       int64_t num_rows, const int64_t shape[3], int64_t batch_size,
                                       spconv__site_table *table) {
    table->hash.slots = NULL;
    table->hash.capacity = 0;
    SPCONV_FORWARD_IF_ERROR(spconv__key_layout_checked(func, "input", batch_size, shape, &table->layout));
    /* Rows before the first out-of-range one still go in, so that a duplicate before it is
     * reported first: the message always names the first offending row. */
    const int64_t bad_row =
        spconv__first_out_of_range(num_threads, rows, num_rows, shape, batch_size);
    SPCONV_FORWARD_IF_ERROR(table_alloc(func, num_threads, num_rows, &table->hash));
    spconv_status st = SPCONV_OK;
    int64_t refused, repeated;
    insert_rows(num_threads, table, rows, bad_row, &refused, &repeated);
    if (refused > 0)
        SPCONV_FAIL_GOTO(st, fail, SPCONV_ERR_CAPACITY,
                         "%s: hash table of %" PRIu64 " slots is full (%" PRId64 " sites)", func,
                         table->hash.capacity, bad_row);
    const int64_t duplicate =
        repeated > 0 ? first_duplicate(num_threads, table, rows, bad_row) : bad_row;
    if (duplicate < bad_row) {
        const int32_t *row = rows + 4 * duplicate;
        const int32_t owner = spconv__hash_find(&table->hash, row_key(&table->layout, row));
        st = spconv__report_duplicate(func, row, duplicate, owner);
        goto fail;
    }
    if (bad_row < num_rows) {
        st = spconv__report_out_of_range(func, rows + 4 * bad_row, bad_row, shape, batch_size);
        goto fail;
    }
    return SPCONV_OK;
fail:
    spconv__site_table_free(table);
    return st;
}

void spconv__site_table_free(spconv__site_table *table) {
    free(table->hash.slots);
    table->hash.slots = NULL;
    table->hash.capacity = 0;
}
