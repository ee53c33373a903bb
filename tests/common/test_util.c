/* Helpers shared by the test programs. */
#include "common/test_util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Tests ask for absurd allocations on purpose to check SPCONV_ERR_OUT_OF_MEMORY; under
 * AddressSanitizer those must return NULL instead of aborting. Harmless without ASan. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* Test programs are single-threaded users of the generator, so plain statics suffice. */
static int seeded;
static uint64_t seed_value;
static uint64_t rng_state;

uint64_t spconv_test_seed(void) {
    if (seeded) return seed_value;
    const char *env = getenv("SPCONV_TEST_SEED");
    char *end = NULL;
    if (env != NULL && *env != '\0') seed_value = strtoull(env, &end, 10);
    if (env == NULL || *env == '\0' || end == NULL || *end != '\0') {
        struct timespec now;
        timespec_get(&now, TIME_UTC);
        seed_value = (uint64_t)now.tv_sec * 1000000007u + (uint64_t)now.tv_nsec;
    }
    rng_state = seed_value;
    seeded = 1;
    printf("seed = %" PRIu64 " (set SPCONV_TEST_SEED=%" PRIu64 " to repeat)\n", seed_value,
           seed_value);
    fflush(stdout);
    return seed_value;
}

uint64_t spconv_test_rand_u64(void) {
    spconv_test_seed();
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15u);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
}

int64_t spconv_test_rand_int(int64_t lo, int64_t hi) {
    uint64_t span = (uint64_t)hi - (uint64_t)lo;
    uint64_t draw = spconv_test_rand_u64();
    /* span + 1 == 0 means the full 64-bit range; the modulo bias is irrelevant for tests. */
    uint64_t offset = span == UINT64_MAX ? draw : draw % (span + 1);
    return (int64_t)((uint64_t)lo + offset);
}

double spconv_test_rand_double(double lo, double hi) {
    double unit = (double)(spconv_test_rand_u64() >> 11) * 0x1.0p-53;
    return lo + (hi - lo) * unit;
}

float spconv_test_rand_float(float lo, float hi) {
    float unit = (float)(spconv_test_rand_u64() >> 40) * 0x1.0p-24f;
    float value = lo + (hi - lo) * unit;
    return value < hi ? value : lo; /* rounding may reach hi; keep the interval half-open */
}

char *spconv_test_data_path(const char *name) {
    const char *dir = getenv("SPCONV_DATA_DIR");
    if (dir == NULL || *dir == '\0') {
        printf("skip: SPCONV_DATA_DIR is not set, so '%s' cannot be found\n", name);
        return NULL;
    }
    size_t length = strlen(dir) + 1 + strlen(name) + 1;
    char *path = malloc(length);
    if (path == NULL) return NULL;
    snprintf(path, length, "%s/%s", dir, name);
    FILE *probe = fopen(path, "rb");
    if (probe != NULL) fclose(probe);
    if (probe == NULL) {
        printf("skip: data file '%s' is not present\n", path);
        free(path);
        return NULL;
    }
    return path;
}

void spconv_test_assert_status(spconv_status actual, spconv_status expected, const char *expr,
                               const char *file, int line) {
    if (actual == expected) return;
    print_error("%s returned %s (%d), expected %s (%d)\n  last error: %s\n", expr,
                spconv_status_string(actual), (int)actual, spconv_status_string(expected),
                (int)expected, spconv_last_error());
    _fail(file, line);
}

void spconv_test_assert_error_contains(const char *substring, const char *file, int line) {
    const char *message = spconv_last_error();
    if (strstr(message, substring) != NULL) return;
    print_error("last error \"%s\"\n  does not contain \"%s\"\n", message, substring);
    _fail(file, line);
}
