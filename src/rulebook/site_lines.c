/* Line index of active sites (see site_lines.h). */
#include "rulebook/site_lines.h"

#include <inttypes.h>
#include <stdlib.h>

#include "core/error.h"
#include "core/parallel.h"
#include "rulebook/sites.h"

/* Most line starts allowed per site (beyond a floor for small inputs): 4 bytes each, so that the
 * index (starts plus 8 bytes of entry per site) stays within the 64 bytes per site of the hash
 * table it replaces (4 slots of 16 bytes per site). */
#define LINES_PER_SITE 14
#define LINES_MIN (INT64_C(1) << 17)
/* Lines up to this long are sorted by insertion; longer ones by qsort (never quadratic). */
#define INSERTION_MAX 32
/* Fewest sites whose lines are sorted by a team of threads. */
#define LINES_PARALLEL_MIN 16384

int spconv__site_lines_fit(int64_t num_sites, int64_t batch_size, const int64_t shape[3]) {
    const int64_t limit = num_sites * LINES_PER_SITE > LINES_MIN ? num_sites * LINES_PER_SITE
                                                                 : LINES_MIN;
    /* One division at a time, so that no product can overflow. */
    if (shape[0] <= 0 || shape[1] <= 0 || batch_size <= 0) return 0;
    return batch_size <= limit / shape[0] / shape[1] && limit < INT32_MAX;
}

static int compare_entries(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static void sort_line(uint64_t *e, int64_t n) {
    if (n > INSERTION_MAX) {
        qsort(e, (size_t)n, sizeof *e, compare_entries);
        return;
    }
    for (int64_t i = 1; i < n; ++i) {
        const uint64_t v = e[i];
        int64_t j = i;
        for (; j > 0 && e[j - 1] > v; --j) e[j] = e[j - 1];
        e[j] = v;
    }
}

/* Sort one line by x; a repeated x there is a repeated site: *first_repeat becomes the smallest
 * row that repeats an earlier one (and *owner the smallest row of its site) when it is smaller
 * than the one held. */
static void sort_line_checked(uint64_t *e, int64_t n, int64_t *first_repeat, int64_t *owner) {
    sort_line(e, n);
    /* Entries of one site are in increasing row: the first of its run is its owner, the second
     * its smallest repeat. */
    for (int64_t start = 0, i = 1; i < n; ++i) {
        if (e[i] >> 32 != e[start] >> 32) {
            start = i;
            continue;
        }
        const int64_t r = (int64_t)(e[i] & UINT32_MAX);
        if (i == start + 1 && r < *first_repeat) {
            *first_repeat = r;
            *owner = (int64_t)(e[start] & UINT32_MAX);
        }
    }
}

spconv_status spconv__site_lines_build(const char *func, int num_threads, const int32_t *rows,
                                       int64_t num_sites, int64_t batch_size,
                                       const int64_t shape[3], spconv__site_lines *lines) {
    lines->starts = NULL;
    lines->entries = NULL;
    spconv__key_layout layout; /* the same size checks as the site table's */
    SPCONV_FORWARD_IF_ERROR(spconv__key_layout_checked(func, "input", batch_size, shape, &layout));
    /* Rows before the first out-of-range one still go in, so that a repeat before it is reported
     * first: the message names the first offending row, as the site table's does. */
    const int64_t all_sites = num_sites;
    num_sites = spconv__first_out_of_range(num_threads, rows, all_sites, shape, batch_size);
    lines->height = shape[1];
    lines->lines_per_batch = shape[0] * shape[1];
    lines->num_lines = batch_size * lines->lines_per_batch;
    lines->starts = calloc((size_t)lines->num_lines + 1, sizeof *lines->starts);
    lines->entries = malloc((size_t)(num_sites > 0 ? num_sites : 1) * sizeof *lines->entries);
    if (lines->starts == NULL || lines->entries == NULL) {
        spconv__site_lines_free(lines);
        SPCONV_RETURN_ERROR(SPCONV_ERR_OUT_OF_MEMORY,
                            "%s: out of host memory for a line index of %" PRId64 " sites",
                            func, num_sites);
    }
    /* Counting sort by line: counts in starts[l + 1], prefix sums, then each row at its line's
     * cursor (starts[l], advanced as rows arrive and shifted back by one line afterwards). */
    int32_t *starts = lines->starts;
    for (int64_t r = 0; r < num_sites; ++r) {
        const int32_t *row = rows + 4 * r;
        ++starts[row[0] * lines->lines_per_batch + row[1] * lines->height + row[2] + 1];
    }
    for (int64_t l = 0; l < lines->num_lines; ++l) starts[l + 1] += starts[l];
    for (int64_t r = 0; r < num_sites; ++r) {
        const int32_t *row = rows + 4 * r;
        const int64_t l = row[0] * lines->lines_per_batch + row[1] * lines->height + row[2];
        lines->entries[starts[l]++] = (uint64_t)(uint32_t)row[3] << 32 | (uint64_t)r;
    }
    for (int64_t l = lines->num_lines; l > 0; --l) starts[l] = starts[l - 1];
    starts[0] = 0;
    /* Lines sort independently; each thread keeps the smallest repeat it met, and the smallest
     * of those is the first repeat whatever the thread count. */
    int64_t first_repeat = num_sites, owner = -1;
    const int64_t num_lines = lines->num_lines;
    SPCONV_OMP(omp parallel num_threads(num_threads) if(num_sites > LINES_PARALLEL_MIN))
    {
        int64_t mine = num_sites, my_owner = -1;
        SPCONV_OMP(omp for schedule(dynamic, 512))
        for (int64_t l = 0; l < num_lines; ++l)
            if (starts[l + 1] - starts[l] > 1)
                sort_line_checked(lines->entries + starts[l], starts[l + 1] - starts[l], &mine,
                                  &my_owner);
        SPCONV_OMP(omp critical(spconv_site_lines_repeat))
        if (mine < first_repeat) {
            first_repeat = mine;
            owner = my_owner;
        }
    }
    spconv_status st = SPCONV_OK;
    if (first_repeat < num_sites)
        st = spconv__report_duplicate(func, rows + 4 * first_repeat, first_repeat, owner);
    else if (num_sites < all_sites)
        st = spconv__report_out_of_range(func, rows + 4 * num_sites, num_sites, shape, batch_size);
    if (st != SPCONV_OK) spconv__site_lines_free(lines);
    return st;
}

void spconv__site_lines_free(spconv__site_lines *lines) {
    free(lines->starts);
    free(lines->entries);
    lines->starts = NULL;
    lines->entries = NULL;
}
