/* What the benchmark programs of tools/ (bench_*.c) share. */
#ifndef SPCONV_TOOLS_BENCH_COMMON_H
#define SPCONV_TOOLS_BENCH_COMMON_H

#include <stdlib.h>

static inline int bench_compare_doubles(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of @p n > 0 values, which it sorts in place (values[0] is then the least). */
static inline double bench_median(double *values, int n) {
    qsort(values, (size_t)n, sizeof *values, bench_compare_doubles);
    return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

#endif /* SPCONV_TOOLS_BENCH_COMMON_H */
