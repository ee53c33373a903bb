/* A line index of active sites for submanifold rulebooks: the sites grouped by line (b, z, y),
 * each line's x sorted. A neighbour at (b, z + dz, y + dy, x + dx) is then a short search in one
 * small array instead of a probe of the hash table: the index of a LiDAR scan (a few entries per
 * line) takes about a fifth of the memory of the table, and the searches for the offsets that
 * share a line land on the same cache lines.
 *
 * The index has a start for every line of the grid (batch_size * D * H of them), so it is only
 * built when that count is small next to the sites (spconv__site_lines_fit); sparse grids with
 * huge shapes keep the hash table. */
#ifndef SPCONV_RULEBOOK_SITE_LINES_H
#define SPCONV_RULEBOOK_SITE_LINES_H

#include <stdint.h>

#include "spconv/status.h"

typedef struct spconv__site_lines {
    int64_t num_lines; /* batch_size * D * H */
    int64_t lines_per_batch, height;
    int32_t *starts;   /* [num_lines + 1]: line l's entries are [starts[l], starts[l + 1]) */
    uint64_t *entries; /* [num_sites]: x << 32 | row, increasing within each line */
} spconv__site_lines;

/* 1 when an index of @p num_sites sites over (batch_size, shape) is worth building: its starts
 * array is no larger than a few entries per site. */
int spconv__site_lines_fit(int64_t num_sites, int64_t batch_size, const int64_t shape[3]);

/* Build the index of the @p num_sites rows (b, z, y, x) of @p rows, checking them as the site
 * table does (sites.h) and with its messages: a row outside the batch or the shape is
 * SPCONV_ERR_OUT_OF_RANGE, a repeated row SPCONV_ERR_DUPLICATE_INDEX, the first offending row
 * named whatever the thread count; SPCONV_ERR_OUT_OF_MEMORY naming @p func when the arrays cannot
 * be had. On failure nothing is left to free. */
spconv_status spconv__site_lines_build(const char *func, int num_threads, const int32_t *rows,
                                       int64_t num_sites, int64_t batch_size,
                                       const int64_t shape[3], spconv__site_lines *lines);

void spconv__site_lines_free(spconv__site_lines *lines);

/* Row of the site (b, z, y, x), or -1. z and y must lie inside the shape; x may be anything. */
static inline int32_t spconv__site_lines_find(const spconv__site_lines *lines, int64_t b,
                                              int64_t z, int64_t y, int64_t x) {
    const int64_t line = b * lines->lines_per_batch + z * lines->height + y;
    int64_t lo = lines->starts[line], hi = lines->starts[line + 1];
    const uint64_t want = (uint64_t)x << 32;
    while (lo < hi) { /* first entry >= want */
        const int64_t mid = lo + (hi - lo) / 2;
        if (lines->entries[mid] < want)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < lines->starts[line + 1] && lines->entries[lo] >> 32 == (uint64_t)x)
        return (int32_t)(lines->entries[lo] & UINT32_MAX);
    return -1;
}

#endif /* SPCONV_RULEBOOK_SITE_LINES_H */
