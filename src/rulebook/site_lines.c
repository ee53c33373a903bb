/* Line index of active sites (see site_lines.h). */
#include "rulebook/site_lines.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

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
/* Fewest sites whose lines are counted, placed and sorted by a team of threads. */
#define LINES_PARALLEL_MIN 16384
/* Most line counters per site that the threads' own counts may take (4 bytes each, one set per
 * thread): beyond, one thread counts and places the rows. */
#define LINES_PARALLEL_CELLS_PER_SITE 32

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

static int64_t line_of(const spconv__site_lines *lines, const int32_t *row) {
    return row[0] * lines->lines_per_batch + row[1] * lines->height + row[2];
}

/* The counting sort by line with a team of threads: each counts the lines of its own block of
 * rows, the counts give every (line, thread) its place, and each thread places its rows there in
 * increasing row. A line's rows thus come block after block, each block in increasing row: the
 * same order as one thread's. Returns 0, having done nothing, when one thread should do it (few
 * sites, one thread, fewer lines than threads, counters beyond LINES_PARALLEL_CELLS_PER_SITE or
 * no memory for them). */
static int place_rows_parallel(int num_threads, const int32_t *rows, int64_t num_sites,
                               spconv__site_lines *lines) {
    const int64_t num_lines = lines->num_lines;
    if (num_threads < 2 || num_sites < LINES_PARALLEL_MIN || num_lines < num_threads ||
        num_lines > LINES_PARALLEL_CELLS_PER_SITE * num_sites / num_threads)
        return 0;
    int32_t *counts = malloc((size_t)num_threads * (size_t)num_lines * sizeof *counts);
    if (counts == NULL) return 0;
    int32_t *starts = lines->starts;
    SPCONV_OMP(omp parallel num_threads(num_threads))
    {
        int t = 0, team = 1;
#if SPCONV_HAVE_OPENMP
        t = omp_get_thread_num();
        team = omp_get_num_threads();
#endif
        /* Blocks follow the team actually given (it may be smaller than asked for). */
        const int64_t begin = num_sites * t / team, end = num_sites * (t + 1) / team;
        int32_t *mine = counts + (size_t)t * (size_t)num_lines;
        memset(mine, 0, (size_t)num_lines * sizeof *mine);
        for (int64_t r = begin; r < end; ++r) ++mine[line_of(lines, rows + 4 * r)];
        SPCONV_OMP(omp barrier)
        /* Each thread takes a range of lines: line l's place for thread t is where the line
         * starts plus the rows of blocks before t. The lines' starts themselves need the counts
         * of every earlier line, so the ranges first sum their own lines, then add what the
         * earlier ranges hold. */
        const int64_t l0 = num_lines * t / team, l1 = num_lines * (t + 1) / team;
        int64_t total = 0;
        for (int64_t l = l0; l < l1; ++l)
            for (int u = 0; u < team; ++u) total += counts[(size_t)u * (size_t)num_lines + l];
        starts[l1] = (int32_t)total; /* this range's rows, for the ranges after it */
        SPCONV_OMP(omp barrier)
        int64_t running = 0;
        for (int u = 0; u < t; ++u) running += starts[num_lines * (u + 1) / team];
        SPCONV_OMP(omp barrier)
        for (int64_t l = l0; l < l1; ++l) {
            starts[l] = (int32_t)running;
            for (int u = 0; u < team; ++u) {
                int32_t *c = counts + (size_t)u * (size_t)num_lines + l;
                const int32_t rows_here = *c;
                *c = (int32_t)running;
                running += rows_here;
            }
        }
        if (t == team - 1) starts[num_lines] = (int32_t)running;
        SPCONV_OMP(omp barrier)
        for (int64_t r = begin; r < end; ++r) {
            const int32_t *row = rows + 4 * r;
            lines->entries[mine[line_of(lines, row)]++] =
                (uint64_t)(uint32_t)row[3] << 32 | (uint64_t)r;
        }
    }
    free(counts);
    return 1;
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
    int32_t *starts = lines->starts;
    if (!place_rows_parallel(num_threads, rows, num_sites, lines)) {
        /* Counting sort by line: counts in starts[l + 1], prefix sums, then each row at its
         * line's cursor (starts[l], advanced as rows arrive and shifted back by one line
         * afterwards). */
        for (int64_t r = 0; r < num_sites; ++r)
            ++starts[line_of(lines, rows + 4 * r) + 1];
        for (int64_t l = 0; l < lines->num_lines; ++l) starts[l + 1] += starts[l];
        for (int64_t r = 0; r < num_sites; ++r) {
            const int32_t *row = rows + 4 * r;
            lines->entries[starts[line_of(lines, row)]++] =
                (uint64_t)(uint32_t)row[3] << 32 | (uint64_t)r;
        }
        for (int64_t l = lines->num_lines; l > 0; --l) starts[l] = starts[l - 1];
        starts[0] = 0;
    }
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
