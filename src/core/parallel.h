/* OpenMP in one place: SPCONV_OMP(omp parallel for ...) is the pragma when the library is built
 * with OpenMP and nothing otherwise, so every parallel loop also compiles, warning-free, to a
 * plain loop. */
#ifndef SPCONV_CORE_PARALLEL_H
#define SPCONV_CORE_PARALLEL_H

#include <time.h>

#include "spconv/config.h"

#if SPCONV_HAVE_OPENMP
#include <omp.h>
#define SPCONV_OMP(...) _Pragma(#__VA_ARGS__)
#else
#define SPCONV_OMP(...)
#endif

/* Wall-clock seconds for phase timings: omp_get_wtime with OpenMP (the clock the parallel
 * regions share), C11's timespec_get otherwise. */
static inline double spconv__now_s(void) {
#if SPCONV_HAVE_OPENMP
    return omp_get_wtime();
#else
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#endif
}

#endif /* SPCONV_CORE_PARALLEL_H */
