/* OpenMP in one place: SPCONV_OMP(omp parallel for ...) is the pragma when the library is built
 * with OpenMP and nothing otherwise, so every parallel loop also compiles, warning-free, to a
 * plain loop. */
#ifndef SPCONV_CORE_PARALLEL_H
#define SPCONV_CORE_PARALLEL_H

#include "spconv/config.h"

#if SPCONV_HAVE_OPENMP
#include <omp.h>
#define SPCONV_OMP(...) _Pragma(#__VA_ARGS__)
#else
#define SPCONV_OMP(...)
#endif

#endif /* SPCONV_CORE_PARALLEL_H */
