/* Helpers shared by every CMocka test program: a seeded random generator (the seed is printed so
 * that a failure can be repeated), the data folder, and status/message assertions. Include after
 * <cmocka.h>'s prerequisites (<stdarg.h>, <stddef.h>, <stdint.h>, <setjmp.h>), or just this. */
#ifndef SPCONV_TEST_UTIL_H
#define SPCONV_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "spconv/spconv.h"

/* ---- random numbers --------------------------------------------------------------------------
 * One generator per test program, seeded on first use from SPCONV_TEST_SEED or else the clock;
 * the first use prints "seed = N (set SPCONV_TEST_SEED=N to repeat)". */

/** The seed of this run (seeds the generator if that has not happened yet). */
uint64_t spconv_test_seed(void);
/** 64 random bits (splitmix64). */
uint64_t spconv_test_rand_u64(void);
/** Uniform integer in [lo, hi], both included; lo <= hi. */
int64_t spconv_test_rand_int(int64_t lo, int64_t hi);
/** Uniform double in [lo, hi). */
double spconv_test_rand_double(double lo, double hi);
/** Uniform float in [lo, hi). */
float spconv_test_rand_float(float lo, float hi);

/* ---- data files ------------------------------------------------------------------------------ */

/** Path of @p name inside the data folder (env SPCONV_DATA_DIR, which CTest sets), or NULL after
 *  printing why the caller should skip (folder not set, file missing). free() the result. */
char *spconv_test_data_path(const char *name);

/* ---- assertions ------------------------------------------------------------------------------ */

void spconv_test_assert_status(spconv_status actual, spconv_status expected, const char *expr,
                               const char *file, int line);
void spconv_test_assert_error_contains(const char *substring, const char *file, int line);

/** Fail (printing spconv_last_error()) unless @p expr returns @p expected. */
#define SPCONV_ASSERT_STATUS(expr, expected) \
    spconv_test_assert_status((expr), (expected), #expr, __FILE__, __LINE__)
/** Fail (printing spconv_last_error()) unless @p expr returns SPCONV_OK. */
#define SPCONV_ASSERT_OK(expr) SPCONV_ASSERT_STATUS(expr, SPCONV_OK)
/** Fail unless the calling thread's spconv_last_error() contains @p substring. */
#define SPCONV_ASSERT_ERROR_CONTAINS(substring) \
    spconv_test_assert_error_contains((substring), __FILE__, __LINE__)
/** Both at once: the status of @p expr is @p expected and the message contains @p substring. */
#define SPCONV_ASSERT_FAILS(expr, expected, substring) \
    do {                                               \
        SPCONV_ASSERT_STATUS(expr, expected);          \
        SPCONV_ASSERT_ERROR_CONTAINS(substring);       \
    } while (0)

#endif /* SPCONV_TEST_UTIL_H */
