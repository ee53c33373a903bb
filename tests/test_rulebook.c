/* Rulebooks: the coordinate hash table, conv geometry, the fast builder against the brute-force
 * reference on random inputs, invariants, determinism across thread counts, inverse rulebooks,
 * every bad input, hash flooding and seeds, and the real scan of ../shared/data when present. */
#define _POSIX_C_SOURCE 200809L /* setenv, fork, execv, kill, nanosleep */

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/hash_flood.h"
#include "common/rulebook_testing.h"
#include "common/test_util.h"
#include "conv/conv_cpu.h"
#include "core/parallel.h"
#include "rulebook/axis_reach.h"
#include "rulebook/hash.h"
#include "rulebook/sites.h"
#include "rulebook/rulebook_impl.h"
#include "rulebook/rulebook_ref.h"
#include "rulebook/site_bins.h"
#include "rulebook/site_lines.h"

/* spconv's own test grid. */
static const int64_t GRID[3] = {19, 18, 17};

static spconv_conv_params make_params(spconv_conv_kind kind, int64_t kernel, int64_t stride,
                                      int64_t padding, int64_t dilation) {
    spconv_conv_params params = spconv_conv_params_default(kind);
    for (int axis = 0; axis < 3; ++axis) {
        params.kernel[axis] = kernel;
        params.stride[axis] = stride;
        params.padding[axis] = padding;
        params.dilation[axis] = dilation;
    }
    return params;
}

static spconv_context *context_with_threads(int threads) {
    spconv_context *ctx = NULL;
    SPCONV_ASSERT_OK(spconv_context_create(spconv_cpu(), &ctx));
    SPCONV_ASSERT_OK(spconv_context_set_num_threads(ctx, threads));
    return ctx;
}

/* Fast builder against the reference on the same rows; returns the number of pairs. */
static int64_t check_against_reference(spconv_context *ctx, const int32_t *rows, int64_t n,
                                       const int64_t shape[3], int64_t batch,
                                       const spconv_conv_params *params) {
    spconv_tensor *indices = spconv_test_indices_tensor(rows, n);
    spconv_rulebook *fast = NULL, *ref = NULL;
    SPCONV_ASSERT_OK(spconv_rulebook_build(ctx, indices, shape, batch, params, &fast));
    SPCONV_ASSERT_OK(spconv__rulebook_build_ref(indices, shape, batch, params, &ref));
    spconv_test_assert_rulebooks_equal(fast, ref);
    spconv_test_check_rulebook(fast);
    assert_int_equal(fast->center_is_identity, params->kind == SPCONV_CONV_SUBM);
    const int64_t pairs = spconv_rulebook_num_pairs(fast);
    spconv_rulebook_release(fast);
    spconv_rulebook_release(ref);
    spconv_tensor_release(indices);
    return pairs;
}

/* Random sites on GRID (between 1 and max_per_batch per batch), then check_against_reference. */
static int64_t random_case(spconv_context *ctx, int64_t batch, int64_t max_per_batch,
                           const spconv_conv_params *params) {
    const int64_t per_batch = spconv_test_rand_int(1, max_per_batch);
    int32_t *rows = spconv_test_random_sites(batch, GRID, per_batch);
    const int64_t pairs =
        check_against_reference(ctx, rows, batch * per_batch, GRID, batch, params);
    free(rows);
    return pairs;
}

/* ---- hash table ---------------------------------------------------------------------------- */

static int compare_rows(const int32_t *a, const int32_t *b) {
    for (int f = 0; f < 4; ++f)
        if (a[f] != b[f]) return a[f] < b[f] ? -1 : 1;
    return 0;
}

static void test_key_packing_roundtrip_and_order(void **state) {
    (void)state;
    for (int trial = 0; trial < 200; ++trial) {
        const int64_t shape[3] = {spconv_test_rand_int(1, 1 << 20), spconv_test_rand_int(1, 3000),
                                  spconv_test_rand_int(1, 1 << 16)};
        const int64_t batch = spconv_test_rand_int(1, 64);
        spconv__key_layout layout;
        assert_true(spconv__key_layout_init(&layout, batch, shape));
        int32_t a[4], b[4], back[4];
        for (int f = 0; f < 4; ++f) {
            const int64_t extent = f == 0 ? batch : shape[f - 1];
            a[f] = (int32_t)spconv_test_rand_int(0, extent - 1);
            b[f] = (int32_t)spconv_test_rand_int(0, extent - 1);
        }
        const uint64_t ka = spconv__key_pack(&layout, a[0], a[1], a[2], a[3]);
        const uint64_t kb = spconv__key_pack(&layout, b[0], b[1], b[2], b[3]);
        spconv__key_unpack(&layout, ka, back);
        assert_memory_equal(a, back, sizeof a);
        assert_true(ka < (UINT64_C(1) << SPCONV_KEY_MAX_BITS));
        assert_int_equal(compare_rows(a, b), ka == kb ? 0 : ka < kb ? -1 : 1);
    }
    const int64_t huge[3] = {INT32_MAX, INT32_MAX, 2};
    spconv__key_layout layout;
    assert_false(spconv__key_layout_init(&layout, 2, huge)); /* 1 + 31 + 31 + 1 bits */
    assert_int_equal(layout.total_bits, 64);
}

/* An empty table of @p capacity slots with a freshly drawn seed; free table.slots. */
static spconv__hash_table empty_table(uint64_t capacity) {
    spconv__hash_table table = {malloc(capacity * sizeof *table.slots), capacity,
                                spconv__hash_bits_for(capacity), {0, 1}};
    assert_non_null(table.slots);
    spconv__hash_seed_draw(&table.seed);
    for (uint64_t s = 0; s < capacity; ++s) {
        table.slots[s].key = SPCONV_HASH_EMPTY;
        table.slots[s].value = INT32_MAX;
    }
    return table;
}

static void test_hash_insert_find(void **state) {
    (void)state;
    const int64_t n = 5000;
    const uint64_t capacity = spconv__hash_capacity_for(n);
    assert_true(capacity >= 2 * (uint64_t)n && (capacity & (capacity - 1)) == 0);
    spconv__hash_table table = empty_table(capacity);
    uint64_t *keys = malloc((size_t)n * sizeof *keys);
    assert_non_null(keys);
    int64_t added = 0;
    for (int64_t i = 0; i < n; ++i) {
        keys[i] = spconv_test_rand_u64() >> 2 & ~UINT64_C(1); /* even keys; odd ones stay absent */
        const int outcome = spconv__hash_insert(&table, keys[i], (int32_t)i);
        assert_true(outcome == SPCONV_HASH_ADDED || outcome == SPCONV_HASH_REPEATED);
        added += outcome == SPCONV_HASH_ADDED;
    }
    for (int64_t i = n - 1; i >= 0; --i) /* repeats keep the smallest row */
        assert_int_equal(spconv__hash_insert(&table, keys[i], (int32_t)(i + n)),
                         SPCONV_HASH_REPEATED);
    int64_t occupied = 0;
    for (uint64_t slot = 0; slot < capacity; ++slot)
        occupied += table.slots[slot].key != SPCONV_HASH_EMPTY;
    assert_int_equal(occupied, added);
    for (int64_t i = 0; i < n; ++i) {
        const int32_t found = spconv__hash_find(&table, keys[i]);
        assert_true(found >= 0 && keys[found] == keys[i] && found <= i);
        assert_int_equal(spconv__hash_find(&table, keys[i] | 1), -1);
    }
    free(keys);
    free(table.slots);
}

static void test_hash_full_table_is_bounded(void **state) {
    (void)state;
    const uint64_t capacity = SPCONV_HASH_MIN_CAPACITY;
    spconv__hash_table table = empty_table(capacity);
    for (uint64_t key = 0; key < capacity; ++key)
        assert_int_equal(spconv__hash_insert(&table, key * 7, (int32_t)key),
                         SPCONV_HASH_ADDED);
    /* No free slot is left: a new key is refused and a missing key is not found, both after
     * visiting each slot once instead of probing forever; a present key is still found. */
    assert_int_equal(spconv__hash_insert(&table, 5, 99), SPCONV_HASH_FULL);
    assert_int_equal(spconv__hash_insert(&table, 21, 1), SPCONV_HASH_REPEATED);
    assert_int_equal(spconv__hash_find(&table, 5), -1);
    assert_int_equal(spconv__hash_find(&table, 14), 2);
    assert_int_equal(spconv__hash_find(&table, 21), 1);
    free(table.slots);
}

/* ---- hash flooding ------------------------------------------------------------------------- */

/* Sites crafted against the old fixed mix (tests/common/hash_flood.c): 16,384 of them in a
 * 10.7M-cell grid all started probing in one ~200-slot window of the old table. */
#define FLOOD_SITES 16384
static const int64_t FLOOD_SHAPE[3] = {41, 512, 512};

static int32_t *flood_sites(void) {
    int32_t *rows = malloc((size_t)FLOOD_SITES * 4 * sizeof *rows);
    assert_non_null(rows);
    assert_int_equal(spconv_flood_rulebook_sites(FLOOD_SITES, FLOOD_SHAPE, rows), FLOOD_SITES);
    return rows;
}

/* Sum over the stored keys of how far each sits from its home slot: the extra slots that every
 * insert and every successful lookup of the table walks. */
static uint64_t total_displacement(const spconv__hash_table *hash) {
    uint64_t total = 0;
    for (uint64_t slot = 0; slot < hash->capacity; ++slot)
        if (hash->slots[slot].key != SPCONV_HASH_EMPTY)
            total += (slot - spconv__hash_home(hash, hash->slots[slot].key)) & (hash->capacity - 1);
    return total;
}

/* The probe work of a site table is linear for crafted sites. At load <= 1/4 linear probing
 * leaves a key about 1/6 slot from home on average (Knuth: (1/(1-a) - 1) / 2), so 2 per key is a
 * bound a working seeded table exceeds with negligible probability, while the old fixed mix put
 * these sites about n/2 = 8,192 slots from home each. */
static void test_crafted_sites_stay_near_home(void **state) {
    (void)state;
    int32_t *crafted = flood_sites();
    int32_t *random = malloc((size_t)FLOOD_SITES * 4 * sizeof *random);
    assert_non_null(random);
    spconv_flood_random_sites(FLOOD_SITES, FLOOD_SHAPE, 7, random);
    const int32_t *inputs[2] = {crafted, random};
    for (int which = 0; which < 2; ++which) {
        spconv__site_table sites;
        SPCONV_ASSERT_OK(spconv__site_table_build("test", 2, inputs[which], FLOOD_SITES,
                                                  FLOOD_SHAPE, 1, &sites));
        const uint64_t displacement = total_displacement(&sites.hash);
        if (displacement > 2 * (uint64_t)FLOOD_SITES)
            fail_msg("%s sites: total displacement %llu for %d keys (bound %d)",
                     which == 0 ? "crafted" : "random", (unsigned long long)displacement,
                     FLOOD_SITES, 2 * FLOOD_SITES);
        spconv__site_table_free(&sites);
    }
    free(random);
    free(crafted);
}

/* One submanifold build, in seconds. */
static double subm_build_seconds(spconv_context *ctx, const spconv_tensor *indices,
                                 const int64_t shape[3]) {
    const spconv_conv_params p = make_params(SPCONV_CONV_SUBM, 3, 1, 0, 1);
    spconv_rulebook *rb = NULL;
    const double t0 = spconv__now_s();
    SPCONV_ASSERT_OK(spconv_rulebook_build(ctx, indices, shape, 1, &p, &rb));
    const double t = spconv__now_s() - t0;
    spconv_rulebook_release(rb);
    return t;
}

/* End to end through the public API: crafted sites build about as fast as random ones. The old
 * fixed mix made this ~100-300x slower (quadratic probing); 20x plus 20 ms leaves room for a
 * loaded machine and sanitizers and still fails the quadratic case. A timing bound, so a
 * generous one, on the fastest of five builds of each, taken in turns after a warm-up, on one
 * thread: a load spike must then slow all five crafted builds and none of the random ones to
 * fail it (with two threads on two busy cores, each OpenMP barrier could wait out a time slice,
 * which once made all three crafted builds take 88 ms). test_crafted_sites_stay_near_home is the
 * exact measure. */
static void test_crafted_sites_build_in_linear_time(void **state) {
    (void)state;
    int32_t *crafted = flood_sites();
    int32_t *random = malloc((size_t)FLOOD_SITES * 4 * sizeof *random);
    assert_non_null(random);
    spconv_flood_random_sites(FLOOD_SITES, FLOOD_SHAPE, 7, random);
    spconv_tensor *crafted_t = spconv_test_indices_tensor(crafted, FLOOD_SITES);
    spconv_tensor *random_t = spconv_test_indices_tensor(random, FLOOD_SITES);
    spconv_context *ctx = context_with_threads(1);
    double random_s = 1e30, crafted_s = 1e30;
    for (int run = 0; run < 6; ++run) {
        const double r = subm_build_seconds(ctx, random_t, FLOOD_SHAPE);
        const double c = subm_build_seconds(ctx, crafted_t, FLOOD_SHAPE);
        if (run == 0) continue; /* warm-up */
        random_s = r < random_s ? r : random_s;
        crafted_s = c < crafted_s ? c : crafted_s;
    }
    print_message("fastest of five on one thread: random %.2f ms, crafted %.2f ms\n",
                  random_s * 1e3, crafted_s * 1e3);
    if (crafted_s > 20.0 * random_s + 0.020)
        fail_msg("crafted sites took %.1f ms, random ones %.1f ms", crafted_s * 1e3,
                 random_s * 1e3);
    spconv_context_destroy(ctx);
    spconv_tensor_release(random_t);
    spconv_tensor_release(crafted_t);
    free(random);
    free(crafted);
}

static void set_hash_seed(const char *seed) { assert_int_equal(setenv("SPCONV_HASH_SEED", seed, 1), 0); }

/* Rulebooks and error messages are the same whatever seed the site table drew (SPCONV_HASH_SEED
 * forces one, for this test), and the seed does move the keys, so the comparison means something. */
static void test_hash_seed_does_not_change_rulebooks(void **state) {
    (void)state;
    const int64_t shape[3] = {40, 60, 50};
    int32_t *rows = spconv_test_random_sites(2, shape, 15000);
    spconv_tensor *indices = spconv_test_indices_tensor(rows, 30000);
    spconv_context *ctx = context_with_threads(2);
    const spconv_conv_params cases[4] = {make_params(SPCONV_CONV_SUBM, 3, 1, 0, 1),
                                         make_params(SPCONV_CONV_REGULAR, 3, 2, 1, 1),
                                         make_params(SPCONV_CONV_TRANSPOSED, 2, 2, 0, 1),
                                         make_params(SPCONV_CONV_SUBM, 5, 1, 0, 2)};
    for (int c = 0; c < 4; ++c) {
        spconv_rulebook *first = NULL, *second = NULL;
        set_hash_seed("1");
        SPCONV_ASSERT_OK(spconv_rulebook_build(ctx, indices, shape, 2, &cases[c], &first));
        set_hash_seed("0x9e3779b97f4a7c15");
        SPCONV_ASSERT_OK(spconv_rulebook_build(ctx, indices, shape, 2, &cases[c], &second));
        spconv_test_assert_rulebooks_equal(first, second);
        spconv_rulebook_release(first);
        spconv_rulebook_release(second);
    }
    uint64_t first_slot_key[2];
    for (int s = 0; s < 2; ++s) {
        set_hash_seed(s == 0 ? "1" : "0x9e3779b97f4a7c15");
        spconv__site_table sites;
        SPCONV_ASSERT_OK(spconv__site_table_build("test", 2, rows, 30000, shape, 2, &sites));
        uint64_t slot = 0;
        while (sites.hash.slots[slot].key == SPCONV_HASH_EMPTY) ++slot;
        first_slot_key[s] = sites.hash.slots[slot].key;
        spconv__site_table_free(&sites);
    }
    assert_true(first_slot_key[0] != first_slot_key[1]);
    /* A repeated row is reported as the same pair of rows under any seed. */
    memcpy(rows + 4 * 20000, rows + 4 * 123, 4 * sizeof *rows);
    spconv_tensor *repeated = spconv_test_indices_tensor(rows, 30000);
    char messages[2][256];
    for (int s = 0; s < 2; ++s) {
        set_hash_seed(s == 0 ? "1" : "2");
        spconv_rulebook *rb = NULL;
        SPCONV_ASSERT_STATUS(spconv_rulebook_build(ctx, repeated, shape, 2, &cases[0], &rb),
                             SPCONV_ERR_DUPLICATE_INDEX);
        snprintf(messages[s], sizeof messages[s], "%s", spconv_last_error());
    }
    assert_string_equal(messages[0], messages[1]);
    assert_non_null(strstr(messages[0], "row 20000"));
    assert_int_equal(unsetenv("SPCONV_HASH_SEED"), 0);
    spconv_tensor_release(repeated);
    spconv_context_destroy(ctx);
    spconv_tensor_release(indices);
    free(rows);
}

/* ---- memory that follows the pairs, not the kernel ------------------------------------------ */

#define MEMORY_CAP_FLAG "--memory-capped-builds"
/* Address space the builds below may add to what the process has mapped once its libraries are
 * loaded and its 8 OpenMP threads (stacks, malloc arenas) exist. A rulebook lists only the
 * offsets that have pairs, so kernel 255 on 5 sites needs a few KB; the dense per-offset layout
 * before it took 133 MB (255^3 + 1 int64) and the builders before that 4.2 GB (regular:
 * per-chunk offset counters, 32 chunks at 8 threads) and 2.3 GB (subm: a 255^3 x 5 neighbour
 * table). The margin covers a malloc arena growing by a heap (64 MiB of address space). */
#define MEMORY_MARGIN (INT64_C(96) << 20)

/* Five sites, each alone in its 255^3 block of [255, 1600, 1600]. */
static const int32_t FEW_SITES[5][4] = {
    {0, 3, 10, 20}, {0, 100, 400, 300}, {0, 200, 900, 1500}, {0, 254, 1400, 700}, {0, 128, 1200, 1100}};

/* Bytes of address space this process has mapped (VmSize), or -1. */
static int64_t mapped_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (f == NULL) return -1;
    char line[256];
    long long kb = -1;
    while (fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "VmSize: %lld kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : (int64_t)kb << 10;
}

/* Build @p params on @p n rows; 1 when it succeeds with @p pairs pairs, @p outputs outputs and
 * (subm) the centre pairing every site. */
static int capped_build(spconv_context *ctx, const int32_t (*rows)[4], int64_t n,
                        const int64_t shape[3], const spconv_conv_params *params, int64_t pairs,
                        int64_t outputs, const char *what) {
    spconv_tensor *indices = NULL;
    spconv_rulebook *rb = NULL;
    if (spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_I32, 2, (const int64_t[]){n, 4}, rows,
                                &indices) != SPCONV_OK ||
        spconv_rulebook_build(ctx, indices, shape, 1, params, &rb) != SPCONV_OK) {
        fprintf(stderr, "capped child: %s failed: %s\n", what, spconv_last_error());
        spconv_tensor_release(indices);
        return 0;
    }
    int64_t begin, end;
    spconv_rulebook_offset_range(rb, spconv_rulebook_kernel_volume(rb) / 2, &begin, &end);
    const int ok = spconv_rulebook_num_pairs(rb) == pairs && spconv_rulebook_num_out(rb) == outputs &&
                   (params->kind != SPCONV_CONV_SUBM || end - begin == n);
    if (!ok)
        fprintf(stderr, "capped child: %s: %lld pairs, %lld outputs (expected %lld, %lld)\n", what,
                (long long)spconv_rulebook_num_pairs(rb), (long long)spconv_rulebook_num_out(rb),
                (long long)pairs, (long long)outputs);
    spconv_rulebook_release(rb);
    spconv_tensor_release(indices);
    return ok;
}

/* Runs in a fresh exec of this program: once the libraries are loaded and 8 threads have run a
 * small build, the address space is capped at what is mapped plus MEMORY_MARGIN, then kernel 255
 * rulebooks on 5 sites (regular with stride 255: one output per site; submanifold: only the
 * centre pairs) and a 1001^3 submanifold kernel on 200 sites (10^9 offsets) must build.
 * Exit status 0 when all is as expected. */
static int memory_capped_builds(void) {
    const int64_t shape[3] = {255, 1600, 1600};
    spconv_context *ctx = NULL;
    if (spconv_context_create(spconv_cpu(), &ctx) != SPCONV_OK ||
        spconv_context_set_num_threads(ctx, 8) != SPCONV_OK) {
        fprintf(stderr, "capped child: set-up failed: %s\n", spconv_last_error());
        return 1;
    }
    int32_t rows[1000][4];
    for (int r = 0; r < 1000; ++r) {
        const int cell = 5 * r; /* distinct cells of GRID (19 x 18 x 17 = 5814) */
        rows[r][0] = 0;
        rows[r][1] = cell / (18 * 17);
        rows[r][2] = cell / 17 % 18;
        rows[r][3] = cell % 17;
    }
    const spconv_conv_params warm_regular = make_params(SPCONV_CONV_REGULAR, 3, 1, 1, 1);
    const spconv_conv_params warm_subm = make_params(SPCONV_CONV_SUBM, 3, 1, 0, 1);
    spconv_rulebook *rb = NULL;
    spconv_tensor *warm = NULL;
    if (spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_I32, 2, (const int64_t[]){1000, 4}, rows,
                                &warm) != SPCONV_OK)
        return 1;
    for (int pass = 0; pass < 2; ++pass) {
        if (spconv_rulebook_build(ctx, warm, GRID, 1, pass ? &warm_subm : &warm_regular, &rb) !=
            SPCONV_OK)
            return 1;
        spconv_rulebook_release(rb);
    }
    spconv_tensor_release(warm);
    const int64_t mapped = mapped_bytes();
    const struct rlimit cap = {(rlim_t)(mapped + MEMORY_MARGIN), (rlim_t)(mapped + MEMORY_MARGIN)};
    if (mapped < 0 || setrlimit(RLIMIT_AS, &cap) != 0) {
        fprintf(stderr, "capped child: cannot read VmSize or set RLIMIT_AS\n");
        return 1;
    }
    const spconv_conv_params regular = make_params(SPCONV_CONV_REGULAR, 255, 255, 0, 1);
    const spconv_conv_params subm = make_params(SPCONV_CONV_SUBM, 255, 1, 0, 1);
    const spconv_conv_params huge = make_params(SPCONV_CONV_SUBM, 1001, 1, 0, 1);
    const int ok = capped_build(ctx, FEW_SITES, 5, shape, &regular, 5, 5, "kernel 255 regular") &&
                   capped_build(ctx, FEW_SITES, 5, shape, &subm, 5, 5, "kernel 255 subm") &&
                   /* every pair of 200 sites of GRID lies within a 1001^3 window */
                   capped_build(ctx, (const int32_t(*)[4])rows, 200, GRID, &huge, 200 * 200, 200,
                                "kernel 1001 subm on 200 sites");
    spconv_context_destroy(ctx);
    return ok ? 0 : 1;
}

#if defined(__SANITIZE_ADDRESS__)
#define SPCONV_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SPCONV_TEST_ASAN 1
#endif
#endif

/* Builders take memory for the pairs they make and the sites, not for kernel volume x threads
 * nor kernel volume alone: kernel 255 on 5 sites at 8 threads and a 10^9-offset kernel on 200
 * sites fit in MEMORY_MARGIN of address space. The cap is set in a fresh exec of this program
 * (after a fork), so that no OpenMP state of this process crosses the fork. */
static void test_large_kernel_few_sites_fits_memory_cap(void **state) {
    (void)state;
#ifdef SPCONV_TEST_ASAN
    print_message("skip: AddressSanitizer reserves terabytes of address space, so RLIMIT_AS "
                  "cannot cap this build\n");
    skip();
#else
    fflush(NULL);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* OpenBLAS's worker threads take their buffers lazily: one that does so after the cap
         * spins in malloc for ever and the child then hangs at exit joining it. The child makes no
         * BLAS call, so it runs OpenBLAS single-threaded (no worker threads at all). */
        setenv("OPENBLAS_NUM_THREADS", "1", 1);
        char *const args[] = {"test_rulebook", MEMORY_CAP_FLAG, NULL};
        execv("/proc/self/exe", args);
        _exit(127);
    }
    /* The builds take milliseconds; a child still running after a minute hangs, and is failed
     * here with a message rather than left to CTest's timeout. */
    int status = 0;
    for (int waited_ms = 0;; waited_ms += 10) {
        const pid_t done = waitpid(pid, &status, WNOHANG);
        assert_true(done >= 0);
        if (done == pid) break;
        if (waited_ms >= 60 * 1000) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            fail_msg("the memory-capped child still ran after 60 s (a hang)");
        }
        const struct timespec pause = {0, 10 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("large-kernel builds on few sites failed within %lld MiB of added address space "
                 "(status %d)",
                 (long long)(MEMORY_MARGIN >> 20), status);
#endif
}

/* ---- geometry ------------------------------------------------------------------------------ */

static void test_params_default_and_kernel_volume(void **state) {
    (void)state;
    const spconv_conv_params p = spconv_conv_params_default(SPCONV_CONV_TRANSPOSED);
    assert_int_equal(p.kind, SPCONV_CONV_TRANSPOSED);
    for (int axis = 0; axis < 3; ++axis) {
        assert_int_equal(p.kernel[axis], 3);
        assert_int_equal(p.stride[axis], 1);
        assert_int_equal(p.padding[axis], 0);
        assert_int_equal(p.dilation[axis], 1);
        assert_int_equal(p.output_padding[axis], 0);
    }
    spconv_conv_params q = p;
    q.kernel[0] = 2;
    q.kernel[2] = 5;
    assert_int_equal(spconv_conv_kernel_volume(&q), 2 * 3 * 5);
    assert_int_equal(spconv_conv_kernel_volume(NULL), 0);
    /* Products past int64 saturate; wrapped, they were 0 or a plausible 2,145,385,471, and the
     * builders took them (a division by zero on the device, a rulebook with no pairs). */
    const int64_t wraps[3][3] = {{1 << 22, 1 << 21, 1 << 21},     /* 2^64: wrapped to 0 */
                                 {2096129, 2097151, 4196353},     /* wrapped to 2^31 - 2177 */
                                 {4194305, 2097151, 2097153}};    /* odd, for subm */
    const spconv_conv_kind kinds[3] = {SPCONV_CONV_REGULAR, SPCONV_CONV_TRANSPOSED,
                                       SPCONV_CONV_SUBM};
    spconv_tensor *indices = spconv_test_indices_tensor((const int32_t[]){0, 0, 0, 0}, 1);
    const int64_t shape[3] = {1, 1, 1};
    for (int w = 0; w < 3; ++w) {
        for (int a = 0; a < 3; ++a) q.kernel[a] = wraps[w][a], q.padding[a] = wraps[w][a] / 2;
        assert_int_equal(spconv_conv_kernel_volume(&q), INT64_MAX);
        for (int k = w < 2 ? 0 : 2; k < (w < 2 ? 2 : 3); ++k) {
            q.kind = kinds[k];
            int64_t out[3];
            SPCONV_ASSERT_FAILS(spconv_conv_output_shape(&q, shape, out),
                                SPCONV_ERR_INVALID_ARGUMENT, "has more than 2147483647 offsets");
            spconv_rulebook *rb = NULL;
            SPCONV_ASSERT_FAILS(spconv_rulebook_build(NULL, indices, shape, 1, &q, &rb),
                                SPCONV_ERR_INVALID_ARGUMENT, "has more than 2147483647 offsets");
            assert_null(rb);
        }
    }
    spconv_tensor_release(indices);
}

/* Output extent of a regular conv by counting the windows that fit the padded input. */
static int64_t counted_regular_extent(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
    int64_t count = 0;
    while (count * s + d * (k - 1) <= in - 1 + 2 * p) ++count;
    return count;
}

static void test_output_shape_regular_and_transposed(void **state) {
    (void)state;
    for (int trial = 0; trial < 500; ++trial) {
        spconv_conv_params p = spconv_conv_params_default(SPCONV_CONV_REGULAR);
        int64_t in[3], out[3], expected[3];
        int empty = 0;
        for (int axis = 0; axis < 3; ++axis) {
            in[axis] = spconv_test_rand_int(1, 40);
            p.kernel[axis] = spconv_test_rand_int(1, 5);
            p.stride[axis] = spconv_test_rand_int(1, 4);
            p.padding[axis] = spconv_test_rand_int(0, 3);
            p.dilation[axis] = spconv_test_rand_int(1, 3);
            expected[axis] = counted_regular_extent(in[axis], p.kernel[axis], p.stride[axis],
                                                    p.padding[axis], p.dilation[axis]);
            empty |= expected[axis] == 0;
        }
        if (empty) {
            SPCONV_ASSERT_FAILS(spconv_conv_output_shape(&p, in, out), SPCONV_ERR_INVALID_ARGUMENT,
                                "output spatial shape is empty on axis");
            continue;
        }
        SPCONV_ASSERT_OK(spconv_conv_output_shape(&p, in, out));
        assert_memory_equal(out, expected, sizeof out);
        /* A transposed conv with the same parameters maps those outputs back onto the input
         * extent, up to the stride remainder that output padding restores; that can leave
         * nothing only where the input is shorter than the stride. */
        p.kind = SPCONV_CONV_TRANSPOSED;
        int64_t back[3];
        if (spconv_conv_output_shape(&p, out, back) != SPCONV_OK) {
            SPCONV_ASSERT_ERROR_CONTAINS("output spatial shape is empty");
            assert_true(in[0] < p.stride[0] || in[1] < p.stride[1] || in[2] < p.stride[2]);
        } else {
            for (int axis = 0; axis < 3; ++axis)
                assert_true(back[axis] <= in[axis] && back[axis] > in[axis] - p.stride[axis]);
        }
        p.kind = SPCONV_CONV_SUBM;
        for (int axis = 0; axis < 3; ++axis) p.kernel[axis] |= 1;
        SPCONV_ASSERT_OK(spconv_conv_output_shape(&p, in, out));
        assert_memory_equal(out, in, sizeof out);
    }
}

static void expect_param_error(const spconv_conv_params *p, const char *substring) {
    int64_t out[3];
    SPCONV_ASSERT_FAILS(spconv_conv_output_shape(p, GRID, out), SPCONV_ERR_INVALID_ARGUMENT,
                        substring);
}

static void test_output_shape_errors(void **state) {
    (void)state;
    spconv_conv_params p = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    p.kernel[1] = 0;
    expect_param_error(&p, "kernel[1] = 0 must be in [1,");
    p = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    p.stride[2] = -1;
    expect_param_error(&p, "stride[2] = -1");
    p = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    p.padding[0] = -2;
    expect_param_error(&p, "padding[0] = -2 must be in [0,");
    p = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    p.dilation[1] = 0;
    expect_param_error(&p, "dilation[1] = 0");
    p = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    p.output_padding[2] = 1;
    expect_param_error(&p, "output_padding[2] = 1 is only allowed for transposed conv");
    p = spconv_conv_params_default(SPCONV_CONV_TRANSPOSED);
    p.stride[0] = 2;
    p.output_padding[0] = 2;
    expect_param_error(&p, "output_padding[0] = 2 must be in [0, max(stride 2, dilation 1))");
    p = spconv_conv_params_default(SPCONV_CONV_SUBM);
    p.kernel[1] = 2;
    expect_param_error(&p, "kernel[1] = 2 is even; submanifold conv needs odd kernels");
    p = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    p.kernel[1] = 20;
    expect_param_error(&p, "output spatial shape is empty on axis 1 (y)");
    p = spconv_conv_params_default(SPCONV_CONV_INVERSE);
    expect_param_error(&p, "INVERSE");
    p.kind = (spconv_conv_kind)7;
    expect_param_error(&p, "kind 7 is not a conv kind");
    p = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    const int64_t zero_shape[3] = {4, 0, 4};
    int64_t out[3];
    SPCONV_ASSERT_FAILS(spconv_conv_output_shape(&p, zero_shape, out), SPCONV_ERR_INVALID_ARGUMENT,
                        "axis 1 (y) outside [1,");
    SPCONV_ASSERT_FAILS(spconv_conv_output_shape(NULL, GRID, out), SPCONV_ERR_NULL_POINTER,
                        "'params'");
    SPCONV_ASSERT_FAILS(spconv_conv_output_shape(&p, NULL, out), SPCONV_ERR_NULL_POINTER,
                        "'in_shape'");
    SPCONV_ASSERT_FAILS(spconv_conv_output_shape(&p, GRID, NULL), SPCONV_ERR_NULL_POINTER,
                        "'out_shape'");
}

/* ---- builder against the reference --------------------------------------------------------- */

static void test_regular_grid_matches_reference(void **state) {
    (void)state;
    spconv_context *ctx = context_with_threads(2);
    int64_t cases = 0, pairs = 0;
    for (int64_t batch = 1; batch <= 2; ++batch)
        for (int64_t kernel = 2; kernel <= 3; ++kernel)
            for (int64_t stride = 1; stride <= 3; ++stride)
                for (int64_t padding = 0; padding <= 2; ++padding)
                    for (int64_t dilation = 1; dilation <= 3; ++dilation) {
                        const spconv_conv_params p =
                            make_params(SPCONV_CONV_REGULAR, kernel, stride, padding, dilation);
                        pairs += random_case(ctx, batch, 150, &p);
                        ++cases;
                    }
    printf("regular grid: %lld cases, %lld pairs\n", (long long)cases, (long long)pairs);
    spconv_context_destroy(ctx);
}

/* spconv's density: 1500 sites per batch on the 19x18x17 grid. */
static void test_dense_inputs_match_reference(void **state) {
    (void)state;
    spconv_context *ctx = context_with_threads(2);
    const int64_t configs[][4] = {
        {3, 2, 1, 1}, {2, 2, 0, 1}, {3, 1, 1, 2}, {3, 3, 2, 3}, {3, 2, 0, 2}};
    for (size_t c = 0; c < sizeof configs / sizeof configs[0]; ++c) {
        int32_t *rows = spconv_test_random_sites(2, GRID, 1500);
        const spconv_conv_params regular = make_params(SPCONV_CONV_REGULAR, configs[c][0],
                                                       configs[c][1], configs[c][2], configs[c][3]);
        const spconv_conv_params subm =
            make_params(SPCONV_CONV_SUBM, configs[c][0] | 1, 1, 0, configs[c][3]);
        check_against_reference(ctx, rows, 3000, GRID, 2, &regular);
        check_against_reference(ctx, rows, 3000, GRID, 2, &subm);
        free(rows);
    }
    spconv_context_destroy(ctx);
    /* Every site of a 16^3 block, on one thread: its 8 chunks of 512 output rows each hold far
     * more than 255 rows with all 26 neighbours, past what one byte of the line build's pair
     * counters holds before it is emptied (count_lines_chunk). */
    const int64_t block[3] = {16, 16, 16};
    int32_t *rows = spconv_test_random_sites(1, block, 16 * 16 * 16);
    spconv_context *one = context_with_threads(1);
    const spconv_conv_params subm = make_params(SPCONV_CONV_SUBM, 3, 1, 0, 1);
    assert_true(spconv__site_lines_fit(16 * 16 * 16, 1, block));
    check_against_reference(one, rows, 16 * 16 * 16, block, 1, &subm);
    spconv_context_destroy(one);
    free(rows);
}

static void test_transposed_grid_matches_reference(void **state) {
    (void)state;
    spconv_context *ctx = context_with_threads(2);
    int64_t cases = 0;
    for (int64_t kernel = 2; kernel <= 3; ++kernel)
        for (int64_t stride = 1; stride <= 3; ++stride)
            for (int64_t padding = 0; padding <= 1; ++padding)
                for (int64_t dilation = 1; dilation <= 2; ++dilation)
                    for (int extra = 0; extra <= 1; ++extra) {
                        spconv_conv_params p =
                            make_params(SPCONV_CONV_TRANSPOSED, kernel, stride, padding, dilation);
                        const int64_t limit = stride > dilation ? stride : dilation;
                        for (int axis = 0; axis < 3; ++axis)
                            p.output_padding[axis] = extra * (limit - 1);
                        random_case(ctx, 1 + cases % 2, 60, &p);
                        ++cases;
                    }
    spconv_context_destroy(ctx);
}

static void test_subm_matches_reference(void **state) {
    (void)state;
    spconv_context *ctx = context_with_threads(2);
    for (int64_t batch = 1; batch <= 2; ++batch)
        for (int64_t kernel = 1; kernel <= 5; kernel += 2)
            for (int64_t dilation = 1; dilation <= 3; ++dilation) {
                /* stride and padding are ignored by a submanifold conv */
                const spconv_conv_params p =
                    make_params(SPCONV_CONV_SUBM, kernel, spconv_test_rand_int(1, 3),
                                spconv_test_rand_int(0, 2), dilation);
                random_case(ctx, batch, 400, &p);
            }
    /* The builder's ways, chosen by size: a 5 x 5 x 9 kernel (112 probed offsets) on 2400 sites
     * takes two groups of probed offsets (2^19 column cells hold 109 offsets of 2400 sites),
     * kernel 5 on 800 sites probes in one group; kernels 7 and 9 probe more than
     * SPCONV_SUBM_BINS_ABOVE_PROBES offsets and go through bins, as kernel 9 on 300 sites does
     * with N <= KV/2 (test_subm_bins_* for more). Sizes: kernel (z, y, x), sites. */
    const int64_t sizes[5][4] = {
        {5, 5, 9, 2400}, {5, 5, 5, 800}, {7, 7, 7, 800}, {9, 9, 9, 800}, {9, 9, 9, 300}};
    for (int c = 0; c < 5; ++c)
        for (int64_t dilation = 1; dilation <= 2; ++dilation) {
            spconv_conv_params p = make_params(SPCONV_CONV_SUBM, 1, 1, 0, dilation);
            for (int axis = 0; axis < 3; ++axis) p.kernel[axis] = sizes[c][axis];
            int32_t *rows = spconv_test_random_sites(2, GRID, sizes[c][3] / 2);
            check_against_reference(ctx, rows, sizes[c][3], GRID, 2, &p);
            free(rows);
        }
    spconv_context_destroy(ctx);
}

/* Submanifold builds through bins (rulebook/site_bins.h) against the reference: kernels of more
 * than SPCONV_SUBM_BINS_ABOVE_PROBES probes, per axis up to 41 wide, dilations up to 4 (some past
 * the shape, so every residue is its own bin), on grids from 1 to 40 wide per axis, sparse and
 * dense (so bins hold many sites), 1 to 3 batches, at 1 and 3 threads. */
static void test_subm_bins_match_reference(void **state) {
    (void)state;
    for (int threads = 1; threads <= 3; threads += 2) {
        spconv_context *ctx = context_with_threads(threads);
        for (int trial = 0; trial < 40; ++trial) {
            spconv_conv_params p = spconv_conv_params_default(SPCONV_CONV_SUBM);
            int64_t shape[3], volume = 1;
            do {
                for (int axis = 0; axis < 3; ++axis) {
                    p.kernel[axis] = 2 * spconv_test_rand_int(0, 20) + 1;
                    p.dilation[axis] = spconv_test_rand_int(1, 4);
                }
            } while (p.kernel[0] * p.kernel[1] * p.kernel[2] / 2 <= SPCONV_SUBM_BINS_ABOVE_PROBES);
            for (int axis = 0; axis < 3; ++axis) {
                shape[axis] = spconv_test_rand_int(1, 40);
                volume *= shape[axis];
            }
            const int64_t batch = spconv_test_rand_int(1, 3);
            /* up to every site of the grid (dense) or a few hundred of it */
            const int64_t most = volume < 400 ? volume : 400;
            const int64_t per_batch = spconv_test_rand_int(1, most);
            int32_t *rows = spconv_test_random_sites(batch, shape, per_batch);
            assert_true(spconv__subm_by_bins(batch * per_batch, spconv_conv_kernel_volume(&p)));
            check_against_reference(ctx, rows, batch * per_batch, shape, batch, &p);
            free(rows);
        }
        spconv_context_destroy(ctx);
    }
}

/* The sites of @p rows sorted by bin (keys and rows in that order, for spconv__bin_walk_next). */
typedef struct sorted_bins {
    uint64_t key;
    int32_t row;
} sorted_bins;

static int compare_bins(const void *a, const void *b) {
    const sorted_bins *x = a, *y = b;
    return x->key < y->key ? -1 : x->key > y->key;
}

/* Candidates tested by every site's walk over the bins of @p rows, and the pairs found. */
static void walk_every_site(const spconv__bin_geometry *g, const int32_t *rows, int64_t n,
                            int64_t *tested, int64_t *pairs) {
    sorted_bins *sorted = malloc((size_t)n * sizeof *sorted);
    uint64_t *keys = malloc((size_t)n * sizeof *keys);
    int32_t *order = malloc((size_t)n * sizeof *order);
    assert_true(sorted != NULL && keys != NULL && order != NULL);
    for (int64_t r = 0; r < n; ++r) {
        sorted[r].key = spconv__bin_key(g, rows + 4 * r);
        sorted[r].row = (int32_t)r;
    }
    qsort(sorted, (size_t)n, sizeof *sorted, compare_bins);
    for (int64_t r = 0; r < n; ++r) {
        keys[r] = sorted[r].key;
        order[r] = sorted[r].row;
    }
    *tested = *pairs = 0;
    for (int64_t o = 0; o < n; ++o) {
        spconv__bin_walk walk;
        spconv__bin_walk_start(g, rows + 4 * o, &walk);
        int64_t k;
        int32_t i;
        while (spconv__bin_walk_next(g, keys, order, rows, n, &walk, &k, &i)) ++*pairs;
        *tested += walk.tested;
    }
    free(sorted);
    free(keys);
    free(order);
}

/* The bins' claim (site_bins.h): the candidates a build tests are at most 27 times its pairs,
 * whatever the kernel. Checked on the inputs that cost the other ways N^2 or N x KV / 2: sites on
 * separate lines under a 1x1xK kernel (one pair each), sites strung along one line at a spacing
 * just past the reach, a dense block, and random sites under random kernels and dilations. */
static void test_subm_bins_work_is_bounded_by_pairs(void **state) {
    (void)state;
    enum { SITES = 3000 };
    int32_t *rows = malloc((size_t)SITES * 4 * sizeof *rows);
    assert_non_null(rows);
    for (int layout = 0; layout < 24; ++layout) {
        spconv__bin_geometry g;
        int64_t n = SITES;
        const int64_t shapes[3][3] = {{60, 50, 100001}, {1, 1, 1 << 24}, {15, 15, 15}};
        const int64_t *shape = shapes[layout < 3 ? layout : 2];
        for (int axis = 0; axis < 3; ++axis) {
            g.shape[axis] = shape[axis];
            g.kernel[axis] = 1;
            g.dilation[axis] = 1;
        }
        if (layout == 0) { /* separate lines, 1x1x100001 */
            g.kernel[2] = 100001;
            for (int64_t r = 0; r < n; ++r) {
                const int32_t row[4] = {0, (int32_t)(r / 50), (int32_t)(r % 50),
                                        (int32_t)spconv_test_rand_int(0, 100000)};
                memcpy(rows + 4 * r, row, sizeof row);
            }
        } else if (layout == 1) { /* one line, sites just out of each other's reach */
            g.kernel[2] = 4001;
            for (int64_t r = 0; r < n; ++r) {
                const int32_t row[4] = {0, 0, 0, (int32_t)(r * 2001)};
                memcpy(rows + 4 * r, row, sizeof row);
            }
        } else {
            if (layout == 2) { /* the whole block, 15^3 kernel */
                n = 15 * 15 * 15 < SITES ? 15 * 15 * 15 : SITES;
                for (int axis = 0; axis < 3; ++axis) g.kernel[axis] = 15;
            } else {
                for (int axis = 0; axis < 3; ++axis) {
                    g.kernel[axis] = 2 * spconv_test_rand_int(0, 10) + 1;
                    g.dilation[axis] = spconv_test_rand_int(1, 5);
                }
                n = spconv_test_rand_int(1, SITES);
            }
            int32_t *random = spconv_test_random_sites(1, shape, n);
            memcpy(rows, random, (size_t)n * 4 * sizeof *rows);
            free(random);
        }
        assert_true(spconv__key_layout_init(&g.layout, 1, shape));
        int64_t tested, pairs;
        walk_every_site(&g, rows, n, &tested, &pairs);
        assert_true(pairs >= n); /* every site pairs with itself */
        if (tested > 27 * pairs)
            fail_msg("layout %d: %" PRId64 " sites tested %" PRId64 " candidates for %" PRId64
                     " pairs",
                     layout, n, tested, pairs);
        if (layout < 2) assert_int_equal(pairs, n); /* only the centre pairs */
    }
    free(rows);
}

/* The subm builder finds neighbours through a line index (rulebook/site_lines.h) when the grid's
 * lines are few next to the sites, else through the hash table: both against the reference, on
 * the same sites placed in a small grid (lines) and far out in a huge one (table), and on lines
 * of hundreds of sites (searched, not walked). */
static void test_subm_line_index_and_table_agree(void **state) {
    (void)state;
    spconv_context *ctx = context_with_threads(2);
    const int64_t small[3] = {12, 12, 12}, huge[3] = {2048, 2048, 12}, long_lines[3] = {3, 3, 4000};
    for (int trial = 0; trial < 6; ++trial) {
        const int64_t n = 2 * spconv_test_rand_int(25, 600), dilation = 1 + trial % 3;
        const spconv_conv_params p = make_params(SPCONV_CONV_SUBM, 3, 1, 0, dilation);
        int32_t *rows = spconv_test_random_sites(2, small, n / 2);
        assert_true(spconv__site_lines_fit(n, 2, small));
        check_against_reference(ctx, rows, n, small, 2, &p);
        for (int64_t r = 0; r < n; ++r) rows[4 * r + 1] += 1000, rows[4 * r + 2] += 2035;
        assert_false(spconv__site_lines_fit(n, 2, huge));
        check_against_reference(ctx, rows, n, huge, 2, &p);
        free(rows);
    }
    int32_t *rows = spconv_test_random_sites(1, long_lines, 8000);
    assert_true(spconv__site_lines_fit(8000, 1, long_lines));
    for (int64_t dilation = 1; dilation <= 2; ++dilation) {
        const spconv_conv_params p = make_params(SPCONV_CONV_SUBM, 3, 1, 0, dilation);
        check_against_reference(ctx, rows, 8000, long_lines, 1, &p);
    }
    free(rows);
    spconv_context_destroy(ctx);
}

/* qsort order of rows (b, z, y, x). */
static int compare_row_keys(const void *a, const void *b) { return compare_rows(a, b); }

/* The line build walks a line's neighbours through rows of cells indexed by x, or with cursors
 * when x is too wide for such rows (over 16384, or rows of over 2^18 cells in all): both against
 * the reference, for kernels of 1, 3 or 5 per axis and of 63 and 65 offsets (up to 65 offsets
 * take this build), dilations 1 to 3, rows in random order and sorted, on 1 and 3 threads. */
static void test_subm_line_walks_agree(void **state) {
    (void)state;
    const int64_t narrow[3] = {6, 7, 300}, wide[3] = {6, 7, 40000};
    for (int threads = 1; threads <= 3; threads += 2) {
        spconv_context *ctx = context_with_threads(threads);
        for (int trial = 0; trial < 16; ++trial) {
            spconv_conv_params p = spconv_conv_params_default(SPCONV_CONV_SUBM);
            do {
                for (int axis = 0; axis < 3; ++axis) {
                    p.kernel[axis] = 2 * spconv_test_rand_int(0, 2) + 1;
                    p.dilation[axis] = spconv_test_rand_int(1, 3);
                }
            } while (spconv_conv_kernel_volume(&p) - 1 > 64 || spconv_conv_kernel_volume(&p) == 1);
            const int64_t n = spconv_test_rand_int(200, 1500);
            const int64_t *shape = trial % 2 ? wide : narrow;
            int32_t *rows = spconv_test_random_sites(2, shape, n);
            if (trial % 4 >= 2) qsort(rows, (size_t)(2 * n), 4 * sizeof *rows, compare_row_keys);
            assert_true(spconv__site_lines_fit(2 * n, 2, shape));
            check_against_reference(ctx, rows, 2 * n, shape, 2, &p);
            free(rows);
        }
        /* Kernels of 63 and 65 offsets: the line walk keeps a site's hits in one 64-bit mask
         * per line for at most 64 offsets (the centre's bit dropped at the end) and bit by bit
         * above that; long lines (kx up to 65) on either side of the bound, dilated too. */
        static const int64_t edge[][3] = {{1, 5, 13}, {5, 13, 1}, {13, 1, 5}, {65, 1, 1},
                                          {1, 1, 65}, {1, 3, 21}, {1, 1, 63}, {7, 9, 1}};
        for (size_t e = 0; e < sizeof edge / sizeof edge[0]; ++e) {
            spconv_conv_params p = spconv_conv_params_default(SPCONV_CONV_SUBM);
            for (int axis = 0; axis < 3; ++axis) {
                p.kernel[axis] = edge[e][axis];
                p.dilation[axis] = edge[e][axis] > 1 ? spconv_test_rand_int(1, 2) : 1;
            }
            const int64_t grid[3] = {edge[e][0] > 9 ? 70 : 8, edge[e][1] > 9 ? 70 : 9,
                                     e % 2 ? 40000 : 200};
            int32_t *rows = spconv_test_random_sites(2, grid, 1200);
            assert_true(spconv__site_lines_fit(2400, 2, grid));
            check_against_reference(ctx, rows, 2400, grid, 2, &p);
            free(rows);
        }
        /* 5 x 5 (z, y) steps of rows of 12,000 cells pass the cells' cap (2^18): cursors too. */
        const int64_t tall[3] = {7, 7, 12000};
        spconv_conv_params p = spconv_conv_params_default(SPCONV_CONV_SUBM);
        p.kernel[0] = p.kernel[1] = 5;
        p.kernel[2] = 1;
        int32_t *rows = spconv_test_random_sites(2, tall, 900);
        assert_true(spconv__site_lines_fit(1800, 2, tall));
        check_against_reference(ctx, rows, 1800, tall, 2, &p);
        free(rows);
        spconv_context_destroy(ctx);
    }
}


static void test_anisotropic_matches_reference(void **state) {
    (void)state;
    spconv_context *ctx = context_with_threads(2);
    const spconv_conv_kind kinds[3] = {SPCONV_CONV_REGULAR, SPCONV_CONV_SUBM,
                                       SPCONV_CONV_TRANSPOSED};
    for (int trial = 0; trial < 45; ++trial) {
        const spconv_conv_params p = spconv_test_random_params(kinds[trial % 3], GRID);
        random_case(ctx, spconv_test_rand_int(1, 3),
                    kinds[trial % 3] == SPCONV_CONV_TRANSPOSED ? 60 : 200, &p);
    }
    spconv_context_destroy(ctx);
}

static void test_empty_input(void **state) {
    (void)state;
    const spconv_conv_kind kinds[3] = {SPCONV_CONV_REGULAR, SPCONV_CONV_SUBM,
                                       SPCONV_CONV_TRANSPOSED};
    for (int i = 0; i < 3; ++i) {
        spconv_conv_params p = make_params(kinds[i], 3, 2, 1, 1);
        if (kinds[i] == SPCONV_CONV_TRANSPOSED) p.output_padding[0] = 1;
        check_against_reference(NULL, NULL, 0, GRID, 2, &p);
        spconv_tensor *indices = spconv_test_indices_tensor(NULL, 0);
        spconv_rulebook *rb = NULL;
        SPCONV_ASSERT_OK(spconv_rulebook_build(NULL, indices, GRID, 2, &p, &rb));
        assert_int_equal(spconv_rulebook_num_in(rb), 0);
        assert_int_equal(spconv_rulebook_num_out(rb), 0);
        assert_int_equal(spconv_rulebook_num_pairs(rb), 0);
        assert_int_equal(spconv_rulebook_num_active_offsets(rb), 0);
        assert_int_equal(spconv_rulebook_active_starts(rb)[0], 0);
        for (int64_t k = 0; k < spconv_rulebook_kernel_volume(rb); ++k) {
            int64_t begin = -1, end = -1;
            spconv_rulebook_offset_range(rb, k, &begin, &end);
            assert_int_equal(begin, end);
        }
        spconv_rulebook_release(rb);
        spconv_tensor_release(indices);
    }
}

/* The offsets of one axis that reach an output, found from the output side: for each output o
 * the one k that lands on it, where that k is whole and inside the kernel. Increasing k means
 * decreasing o for a regular conv and increasing o for a transposed one. */
static int64_t reach_from_outputs(const spconv__axis_geometry *a, int64_t c, int64_t *ks) {
    int64_t count = 0;
    for (int64_t i = 0; i < a->out_size; ++i) {
        const int64_t o = a->transposed ? i : a->out_size - 1 - i;
        const int64_t span = a->transposed ? o - c * a->stride + a->padding
                                           : c + a->padding - o * a->stride;
        if (span < 0 || span % a->dilation != 0 || span / a->dilation >= a->kernel) continue;
        ks[count++] = span / a->dilation;
    }
    return count;
}

static void expect_reach(const spconv__axis_geometry *a, int64_t c) {
    int64_t want[64], first = 0, last = -1, step = 1, got = 0;
    assert_true(a->out_size <= 64);
    const int64_t n = reach_from_outputs(a, c, want);
    if (spconv__axis_reach(a, c, &first, &last, &step)) {
        assert_true(step >= 1 && first <= last);
        for (int64_t k = first; k <= last; k += step) {
            if (got >= n || want[got] != k || spconv__axis_output(a, c, k) < 0 ||
                spconv__axis_output(a, c, k) >= a->out_size)
                fail_msg("axis (kernel %" PRId64 ", stride %" PRId64 ", padding %" PRId64
                         ", dilation %" PRId64 ", outputs %" PRId64 ", %s), c = %" PRId64
                         ": offset %" PRId64 " is not the oracle's",
                         a->kernel, a->stride, a->padding, a->dilation, a->out_size,
                         a->transposed ? "transposed" : "regular", c, k);
            ++got;
        }
    }
    if (got != n)
        fail_msg("axis (kernel %" PRId64 ", stride %" PRId64 ", padding %" PRId64
                 ", dilation %" PRId64 ", outputs %" PRId64 ", %s), c = %" PRId64
                 ": %" PRId64 " offsets, the oracle %" PRId64,
                 a->kernel, a->stride, a->padding, a->dilation, a->out_size,
                 a->transposed ? "transposed" : "regular", c, got, n);
}

/* spconv__axis_reach against the output-side oracle: every small geometry, then random ones with
 * parameters up to 2^31 and few outputs (the windows the builders once walked offset by offset). */
static void test_axis_reach_matches_outputs(void **state) {
    (void)state;
    for (int transposed = 0; transposed < 2; ++transposed)
        for (int64_t kernel = 1; kernel <= 6; ++kernel)
            for (int64_t stride = 1; stride <= 5; ++stride)
                for (int64_t padding = 0; padding <= 4; ++padding)
                    for (int64_t dilation = 1; dilation <= 4; ++dilation)
                        for (int64_t size = 1; size <= 9; ++size) {
                            const int64_t out =
                                transposed ? (size - 1) * stride - 2 * padding +
                                                 dilation * (kernel - 1) + 1
                                           : (size + 2 * padding - dilation * (kernel - 1) - 1) /
                                                     stride + 1;
                            if (out < 1 || size + 2 * padding < dilation * (kernel - 1) + 1)
                                continue;
                            const spconv__axis_geometry a = {kernel,   stride, padding,
                                                             dilation, out,    transposed};
                            for (int64_t c = 0; c < size; ++c) expect_reach(&a, c);
                        }
    const int64_t big = INT32_MAX;
    for (int trial = 0; trial < 20000; ++trial) {
        spconv__axis_geometry a;
        a.transposed = (int)spconv_test_rand_int(0, 1);
        a.kernel = spconv_test_rand_int(1, big);
        a.stride = trial % 3 == 0 ? spconv_test_rand_int(1, 7) : spconv_test_rand_int(1, big);
        a.dilation = trial % 3 == 1 ? spconv_test_rand_int(1, 7) : spconv_test_rand_int(1, big);
        a.padding = spconv_test_rand_int(0, big);
        a.out_size = spconv_test_rand_int(1, 64);
        expect_reach(&a, spconv_test_rand_int(0, big));
    }
    /* The hostile case: a 2,000,000,001-wide kernel padded so that each row has one output. */
    const spconv__axis_geometry wide = {2000000001, 1, 1000000000, 1, 1, 0};
    int64_t first, last, step;
    assert_true(spconv__axis_reach(&wide, 0, &first, &last, &step));
    assert_int_equal(first, 1000000000);
    assert_int_equal(last, 1000000000);
}

/* Kernels with more offsets than the candidates they produce (few random sites, kernels up to
 * 15^3 on GRID, per-axis kernels, dilation, both strided kinds and subm): the strided builder
 * numbers the offsets that occur, subm goes through bins; both against the reference,
 * at 1 and 3 threads. */
static void test_kernel_larger_than_its_pairs(void **state) {
    (void)state;
    int64_t total = 0;
    for (int threads = 1; threads <= 3; threads += 2) {
        spconv_context *ctx = context_with_threads(threads);
        for (int trial = 0; trial < 24; ++trial) {
            const spconv_conv_kind kind = trial % 3 == 0   ? SPCONV_CONV_REGULAR
                                          : trial % 3 == 1 ? SPCONV_CONV_TRANSPOSED
                                                           : SPCONV_CONV_SUBM;
            spconv_conv_params p = spconv_conv_params_default(kind);
            for (int axis = 0; axis < 3; ++axis) {
                p.kernel[axis] = 2 * spconv_test_rand_int(1, 7) + 1; /* odd, for subm too */
                p.dilation[axis] = spconv_test_rand_int(1, 2);
                p.stride[axis] = kind == SPCONV_CONV_SUBM ? 1 : spconv_test_rand_int(1, 3);
                p.padding[axis] =
                    kind == SPCONV_CONV_REGULAR ? (p.kernel[axis] - 1) * p.dilation[axis] : 0;
            }
            const int64_t n = spconv_test_rand_int(1, 4);
            int32_t *rows = spconv_test_random_sites(1, GRID, n);
            const int64_t pairs = check_against_reference(ctx, rows, n, GRID, 1, &p);
            if (kind == SPCONV_CONV_SUBM) assert_true(pairs >= n); /* the centre pairs */
            total += pairs;
            free(rows);
        }
        spconv_context_destroy(ctx);
    }
    assert_true(total > 0); /* a strided site can miss every output (stride vs dilation) */
}

static void test_single_voxel(void **state) {
    (void)state;
    const int64_t shape[3] = {11, 12, 13};
    const int32_t site[4] = {1, 5, 6, 7};
    spconv_tensor *indices = spconv_test_indices_tensor(site, 1);
    /* Away from the borders a 3x3x3 conv with padding 1 spreads one voxel to its 27 neighbours,
     * one pair each; a submanifold conv keeps it with its centre pair only. */
    const spconv_conv_params regular = make_params(SPCONV_CONV_REGULAR, 3, 1, 1, 1);
    const spconv_conv_params subm = make_params(SPCONV_CONV_SUBM, 3, 1, 0, 1);
    spconv_rulebook *rb = NULL;
    SPCONV_ASSERT_OK(spconv_rulebook_build(NULL, indices, shape, 2, &regular, &rb));
    assert_int_equal(spconv_rulebook_num_out(rb), 27);
    assert_int_equal(spconv_rulebook_num_active_offsets(rb), 27);
    for (int64_t k = 0; k < 27; ++k) {
        int64_t begin, end;
        spconv_rulebook_offset_range(rb, k, &begin, &end);
        assert_int_equal(begin, k);
        assert_int_equal(end, k + 1);
    }
    spconv_test_check_rulebook(rb);
    spconv_rulebook_release(rb);
    SPCONV_ASSERT_OK(spconv_rulebook_build(NULL, indices, shape, 2, &subm, &rb));
    assert_int_equal(spconv_rulebook_num_pairs(rb), 1);
    assert_int_equal(spconv_rulebook_num_active_offsets(rb), 1);
    assert_int_equal(spconv_rulebook_active_offsets(rb)[0], 13);
    assert_int_equal(spconv_rulebook_active_starts(rb)[1], 1);
    spconv_rulebook_release(rb);
    check_against_reference(NULL, site, 1, shape, 2, &regular);
    check_against_reference(NULL, site, 1, shape, 2, &subm);
    spconv_tensor_release(indices);
}

/* ---- determinism, layouts, inverse --------------------------------------------------------- */

static void test_thread_count_does_not_change_rulebooks(void **state) {
    (void)state;
    const int64_t shape[3] = {40, 60, 50};
    int32_t *rows = spconv_test_random_sites(2, shape, 15000);
    spconv_tensor *indices = spconv_test_indices_tensor(rows, 30000);
    spconv_context *contexts[3] = {context_with_threads(1), context_with_threads(2),
                                   context_with_threads(3)};
    spconv_conv_params cases[4] = {make_params(SPCONV_CONV_SUBM, 3, 1, 0, 1),
                                   make_params(SPCONV_CONV_REGULAR, 3, 2, 1, 1),
                                   make_params(SPCONV_CONV_TRANSPOSED, 2, 2, 0, 1),
                                   make_params(SPCONV_CONV_REGULAR, 3, 1, 1, 2)};
    for (int c = 0; c < 4; ++c) {
        spconv_rulebook *one = NULL;
        SPCONV_ASSERT_OK(spconv_rulebook_build(contexts[0], indices, shape, 2, &cases[c], &one));
        spconv_test_check_rulebook(one);
        for (int t = 1; t < 3; ++t) {
            spconv_rulebook *many = NULL;
            SPCONV_ASSERT_OK(
                spconv_rulebook_build(contexts[t], indices, shape, 2, &cases[c], &many));
            spconv_test_assert_rulebooks_equal(one, many);
            spconv_rulebook_release(many);
        }
        spconv_rulebook_release(one);
    }
    for (int t = 0; t < 3; ++t) spconv_context_destroy(contexts[t]);
    spconv_tensor_release(indices);
    free(rows);
}

static void test_any_indices_layout(void **state) {
    (void)state;
    const int64_t n = 500;
    int32_t *rows = spconv_test_random_sites(1, GRID, n);
    /* The same rows stored column-major: a [4, N] tensor viewed transposed. */
    int32_t *columns = malloc((size_t)n * 4 * sizeof *columns);
    assert_non_null(columns);
    for (int64_t r = 0; r < n; ++r)
        for (int f = 0; f < 4; ++f) columns[f * n + r] = rows[4 * r + f];
    const int64_t sizes[2] = {4, n};
    spconv_tensor *by_column = NULL, *strided = NULL;
    SPCONV_ASSERT_OK(
        spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_I32, 2, sizes, columns, &by_column));
    SPCONV_ASSERT_OK(spconv_tensor_transpose(by_column, 0, 1, &strided));
    assert_false(spconv_tensor_is_contiguous(strided));
    spconv_tensor *contiguous = spconv_test_indices_tensor(rows, n);
    const spconv_conv_params p = make_params(SPCONV_CONV_REGULAR, 3, 2, 1, 1);
    spconv_rulebook *a = NULL, *b = NULL;
    SPCONV_ASSERT_OK(spconv_rulebook_build(NULL, strided, GRID, 1, &p, &a));
    SPCONV_ASSERT_OK(spconv_rulebook_build(NULL, contiguous, GRID, 1, &p, &b));
    spconv_test_assert_rulebooks_equal(a, b);
    /* A contiguous input is kept by reference, and outlives the caller's reference. */
    assert_ptr_equal(spconv_rulebook_in_indices(b), contiguous);
    spconv_tensor_release(contiguous);
    spconv_tensor_release(strided);
    spconv_tensor_release(by_column);
    spconv_test_check_rulebook(b);
    spconv_rulebook_release(a);
    spconv_rulebook_release(b);
    free(columns);
    free(rows);
}

static void check_inverse(const spconv_rulebook *fwd) {
    spconv_rulebook *inv = NULL;
    SPCONV_ASSERT_OK(spconv_rulebook_inverse(fwd, &inv));
    assert_int_equal(spconv_rulebook_params(inv)->kind, SPCONV_CONV_INVERSE);
    assert_int_equal(spconv_rulebook_forward_kind(inv), spconv_rulebook_params(fwd)->kind);
    assert_int_equal(spconv_rulebook_forward_kind(fwd), spconv_rulebook_params(fwd)->kind);
    assert_int_equal(spconv_rulebook_num_in(inv), spconv_rulebook_num_out(fwd));
    assert_int_equal(spconv_rulebook_num_out(inv), spconv_rulebook_num_in(fwd));
    int64_t a[3], b[3];
    spconv_rulebook_in_shape(inv, a);
    spconv_rulebook_out_shape(fwd, b);
    assert_memory_equal(a, b, sizeof a);
    /* Outputs are the forward's input sites in their order; pairs are swapped, and so is what
     * the forward recorded (or learnt) of their order. */
    assert_ptr_equal(spconv_rulebook_out_indices(inv), spconv_rulebook_in_indices(fwd));
    assert_int_equal(inv->rows_order[SPCONV__SIDE_IN], fwd->rows_order[SPCONV__SIDE_OUT]);
    assert_int_equal(inv->rows_order[SPCONV__SIDE_OUT], fwd->rows_order[SPCONV__SIDE_IN]);
    const int64_t active = spconv_rulebook_num_active_offsets(fwd),
                  pairs = spconv_rulebook_num_pairs(fwd);
    assert_int_equal(spconv_rulebook_num_active_offsets(inv), active);
    if (active > 0)
        assert_memory_equal(spconv_rulebook_active_offsets(inv),
                            spconv_rulebook_active_offsets(fwd), (size_t)active * sizeof(int64_t));
    assert_memory_equal(spconv_rulebook_active_starts(inv), spconv_rulebook_active_starts(fwd),
                        (size_t)(active + 1) * sizeof(int64_t));
    if (pairs > 0) {
        assert_memory_equal(spconv_tensor_data(spconv_rulebook_pairs_in(inv)),
                            spconv_tensor_data(spconv_rulebook_pairs_out(fwd)), (size_t)pairs * 4);
        assert_memory_equal(spconv_tensor_data(spconv_rulebook_pairs_out(inv)),
                            spconv_tensor_data(spconv_rulebook_pairs_in(fwd)), (size_t)pairs * 4);
    }
    spconv_test_check_rulebook(inv);
    spconv_rulebook_release(inv);
}

static void test_inverse_rulebook(void **state) {
    (void)state;
    for (int trial = 0; trial < 12; ++trial) {
        const spconv_conv_params p = spconv_test_random_params(SPCONV_CONV_REGULAR, GRID);
        const int64_t per_batch = spconv_test_rand_int(0, 300);
        int32_t *rows = spconv_test_random_sites(2, GRID, per_batch);
        /* Rows in order give in rows in order too; learnt, that order passes to the inverse. */
        if (trial % 4 >= 2)
            qsort(rows, (size_t)(2 * per_batch), 4 * sizeof *rows, compare_row_keys);
        spconv_tensor *indices = spconv_test_indices_tensor(rows, 2 * per_batch);
        spconv_rulebook *fwd = NULL;
        SPCONV_ASSERT_OK(spconv_rulebook_build(NULL, indices, GRID, 2, &p, &fwd));
        spconv_tensor_release(indices);
        assert_int_equal(fwd->rows_order[SPCONV__SIDE_IN], SPCONV__ORDER_UNKNOWN);
        if (trial % 2) {
            const int sorted = spconv__rulebook_rows_sorted(
                fwd, SPCONV__SIDE_IN, spconv_tensor_data(spconv_rulebook_pairs_in(fwd)), 2);
            assert_int_equal(fwd->rows_order[SPCONV__SIDE_IN],
                             sorted ? SPCONV__ORDER_SORTED : SPCONV__ORDER_UNSORTED);
            /* sites in order give pairs in order (trials 3, 7, 11) */
            if (trial % 4 == 3) assert_true(sorted);
        }
        check_inverse(fwd);
        spconv_rulebook_release(fwd);
        free(rows);
    }
    /* A transposed conv's rulebook inverts the same way (spconv 2.x allows it). */
    for (int trial = 0; trial < 8; ++trial) {
        const spconv_conv_params p = spconv_test_random_params(SPCONV_CONV_TRANSPOSED, GRID);
        const int64_t per_batch = spconv_test_rand_int(0, 200);
        int32_t *rows = spconv_test_random_sites(2, GRID, per_batch);
        spconv_tensor *indices = spconv_test_indices_tensor(rows, 2 * per_batch);
        spconv_rulebook *fwd = NULL;
        SPCONV_ASSERT_OK(spconv_rulebook_build(NULL, indices, GRID, 2, &p, &fwd));
        spconv_tensor_release(indices);
        check_inverse(fwd);
        spconv_rulebook_release(fwd);
        free(rows);
    }
    int32_t site[4] = {0, 1, 2, 3};
    spconv_tensor *indices = spconv_test_indices_tensor(site, 1);
    const spconv_conv_params subm = spconv_conv_params_default(SPCONV_CONV_SUBM);
    spconv_rulebook *rb = NULL, *inv = NULL;
    SPCONV_ASSERT_OK(spconv_rulebook_build(NULL, indices, GRID, 1, &subm, &rb));
    SPCONV_ASSERT_FAILS(spconv_rulebook_inverse(rb, &inv), SPCONV_ERR_INVALID_ARGUMENT,
                        "only a REGULAR (conv or pool) or TRANSPOSED rulebook can be inverted");
    assert_null(inv);
    SPCONV_ASSERT_FAILS(spconv_rulebook_inverse(NULL, &inv), SPCONV_ERR_NULL_POINTER, "'forward'");
    SPCONV_ASSERT_FAILS(spconv_rulebook_inverse(rb, NULL), SPCONV_ERR_NULL_POINTER, "'out'");
    spconv_rulebook_release(rb);
    spconv_tensor_release(indices);
    spconv_rulebook_release(NULL);
}

/* ---- bad input ----------------------------------------------------------------------------- */

/* Build on both thread counts and with the reference, expecting @p status and a message with
 * @p substring each time; nothing may be returned. */
static void expect_build_error(const int32_t *rows, int64_t n, int64_t batch,
                               const spconv_conv_params *p, spconv_status status,
                               const char *substring) {
    spconv_tensor *indices = spconv_test_indices_tensor(rows, n);
    for (int threads = 1; threads <= 2; ++threads) {
        spconv_context *ctx = context_with_threads(threads);
        spconv_rulebook *rb = (spconv_rulebook *)indices; /* any non-NULL value: must be reset */
        SPCONV_ASSERT_FAILS(spconv_rulebook_build(ctx, indices, GRID, batch, p, &rb), status,
                            substring);
        assert_null(rb);
        spconv_context_destroy(ctx);
    }
    spconv_rulebook *rb = NULL;
    SPCONV_ASSERT_FAILS(spconv__rulebook_build_ref(indices, GRID, batch, p, &rb), status,
                        substring);
    spconv_tensor_release(indices);
}

/* Row @p r of @p rows gets an out-of-range value in a random field; returns the expected message.
 */
static void break_row(int32_t *rows, int64_t r, char *message, size_t size) {
    const int field = (int)spconv_test_rand_int(0, 3);
    const int64_t limit = field == 0 ? 2 : GRID[field - 1];
    int32_t *row = rows + 4 * r;
    row[field] = spconv_test_rand_int(0, 1) ? (int32_t)-spconv_test_rand_int(1, 5)
                                            : (int32_t)(limit + spconv_test_rand_int(0, 5));
    if (field == 0)
        snprintf(message, size,
                 "indices row %lld = (%d, %d, %d, %d) has batch index %d outside batch size 2",
                 (long long)r, row[0], row[1], row[2], row[3], row[0]);
    else
        snprintf(message, size,
                 "indices row %lld = (%d, %d, %d, %d) is outside spatial shape (19, 18, 17)",
                 (long long)r, row[0], row[1], row[2], row[3]);
}

/* Row @p r becomes a copy of the earlier row @p first; returns the expected message. */
static void duplicate_row(int32_t *rows, int64_t r, int64_t first, char *message, size_t size) {
    memcpy(rows + 4 * r, rows + 4 * first, 4 * sizeof *rows);
    const int32_t *row = rows + 4 * r;
    snprintf(message, size, "indices row %lld = (%d, %d, %d, %d) duplicates row %lld", (long long)r,
             row[0], row[1], row[2], row[3], (long long)first);
}

static void test_bad_rows(void **state) {
    (void)state;
    const int64_t n = 400;
    const size_t bytes = (size_t)n * 4 * sizeof(int32_t);
    /* The last three do not overlap their windows, so the strided build checks the rows in its
     * sorted candidates: on this grid a 2^3 window of stride 2 reaches an output from every row
     * with padding 1 (checked there alone), not with padding 0 (rows at the odd far edges reach
     * none, so the rows are validated first), and a 1^3 one from every row. */
    const spconv_conv_params kinds[6] = {make_params(SPCONV_CONV_SUBM, 3, 1, 0, 1),
                                         make_params(SPCONV_CONV_REGULAR, 3, 2, 1, 1),
                                         make_params(SPCONV_CONV_TRANSPOSED, 3, 2, 0, 1),
                                         make_params(SPCONV_CONV_REGULAR, 2, 2, 1, 1),
                                         make_params(SPCONV_CONV_REGULAR, 2, 2, 0, 1),
                                         make_params(SPCONV_CONV_REGULAR, 1, 1, 0, 1)};
    int32_t *rows = malloc(bytes);
    assert_non_null(rows);
    for (int trial = 0; trial < 18; ++trial) {
        const spconv_conv_params *p = &kinds[trial % 6];
        int32_t *valid = spconv_test_random_sites(2, GRID, n / 2);
        /* Three distinct rows: early < first < bad, and a later one. */
        const int64_t bad = spconv_test_rand_int(2, n - 2),
                      first = spconv_test_rand_int(1, bad - 1);
        const int64_t early = spconv_test_rand_int(0, first - 1),
                      later = spconv_test_rand_int(bad + 1, n - 1);
        char message[160], unused[160];

        memcpy(rows, valid, bytes);
        break_row(rows, bad, message, sizeof message);
        expect_build_error(rows, n, 2, p, SPCONV_ERR_OUT_OF_RANGE, message);

        memcpy(rows, valid, bytes);
        duplicate_row(rows, bad, first, message, sizeof message);
        expect_build_error(rows, n, 2, p, SPCONV_ERR_DUPLICATE_INDEX, message);
        /* The first offending row is named, whatever its kind of fault. */
        break_row(rows, later, unused, sizeof unused);
        expect_build_error(rows, n, 2, p, SPCONV_ERR_DUPLICATE_INDEX, message);
        break_row(rows, early, message, sizeof message);
        expect_build_error(rows, n, 2, p, SPCONV_ERR_OUT_OF_RANGE, message);
        free(valid);
    }
    free(rows);
}

/* Enough sites that the line index sorts its lines on a team of threads (over 16384): two repeats
 * far apart are still named by the first, with its owner, on 1 and 3 threads. */
static void test_many_sites_first_repeat_named(void **state) {
    (void)state;
    const int64_t n = 40000, shape[3] = {40, 600, 6}; /* 24,000 lines */
    /* The pool's rows are checked in its sorted candidates, by a team of threads here. */
    const spconv_conv_params kinds[3] = {make_params(SPCONV_CONV_SUBM, 3, 1, 0, 1),
                                         make_params(SPCONV_CONV_REGULAR, 3, 2, 1, 1),
                                         make_params(SPCONV_CONV_REGULAR, 2, 2, 0, 1)};
    for (int trial = 0; trial < 6; ++trial) {
        int32_t *rows = spconv_test_random_sites(1, shape, n);
        assert_true(spconv__site_lines_fit(n, 1, shape));
        const int64_t owner = spconv_test_rand_int(0, 9999), first = spconv_test_rand_int(10000, 19999);
        const int64_t other = spconv_test_rand_int(20000, 29999), later = spconv_test_rand_int(30000, n - 1);
        memcpy(rows + 4 * first, rows + 4 * owner, 4 * sizeof *rows);
        memcpy(rows + 4 * later, rows + 4 * other, 4 * sizeof *rows);
        char want[96], owned[64];
        snprintf(want, sizeof want, "indices row %lld = ", (long long)first);
        snprintf(owned, sizeof owned, "duplicates row %lld", (long long)owner);
        spconv_tensor *indices = spconv_test_indices_tensor(rows, n);
        for (int threads = 1; threads <= 3; threads += 2) {
            spconv_context *ctx = context_with_threads(threads);
            spconv_rulebook *rb = NULL;
            SPCONV_ASSERT_FAILS(spconv_rulebook_build(ctx, indices, shape, 1, &kinds[trial % 3], &rb),
                                SPCONV_ERR_DUPLICATE_INDEX, want);
            assert_non_null(strstr(spconv_last_error(), owned));
            spconv_context_destroy(ctx);
        }
        spconv_tensor_release(indices);
        free(rows);
    }
}

/* A site repeated three times and another repeated twice: the validation through the line index
 * (small grid) and through the table (the same rows far out in a huge grid) name the same first
 * repeat and its owner, for subm, regular and transposed builds on 1 and 2 threads. */
static void test_repeats_named_alike(void **state) {
    (void)state;
    const int64_t n = 300, small[3] = {12, 12, 12}, huge[3] = {2048, 2048, 12};
    /* And the pools, whose rows the strided build checks in its sorted candidates (2^3 of
     * stride 2: every row reaches an output on these even grids) or validates first (2^3 of
     * stride 3, padding 1: a third of the coordinates reach none). */
    const spconv_conv_params kinds[5] = {make_params(SPCONV_CONV_SUBM, 3, 1, 0, 1),
                                         make_params(SPCONV_CONV_REGULAR, 3, 2, 1, 1),
                                         make_params(SPCONV_CONV_TRANSPOSED, 3, 2, 0, 1),
                                         make_params(SPCONV_CONV_REGULAR, 2, 2, 0, 1),
                                         make_params(SPCONV_CONV_REGULAR, 2, 3, 1, 1)};
    for (int trial = 0; trial < 15; ++trial) {
        const spconv_conv_params p = kinds[trial % 5];
        int32_t *rows = spconv_test_random_sites(1, small, n);
        const int64_t owner = spconv_test_rand_int(0, 99), second = spconv_test_rand_int(100, 199),
                      third = spconv_test_rand_int(200, n - 1);
        memcpy(rows + 4 * second, rows + 4 * owner, 4 * sizeof *rows);
        memcpy(rows + 4 * third, rows + 4 * owner, 4 * sizeof *rows);
        const int64_t other = spconv_test_rand_int(owner + 1, second - 1);
        const int64_t other_repeat = spconv_test_rand_int(second + 1, n - 1);
        if (other_repeat != third) memcpy(rows + 4 * other_repeat, rows + 4 * other, 4 * sizeof *rows);
        const int64_t first = other_repeat != third && other_repeat < second ? other_repeat : second;
        const int64_t first_owner = first == second ? owner : other;
        char want[96];
        snprintf(want, sizeof want, "indices row %lld = ", (long long)first);
        char owned[64];
        snprintf(owned, sizeof owned, "duplicates row %lld", (long long)first_owner);
        for (int grid = 0; grid < 2; ++grid) {
            if (grid == 1)
                for (int64_t r = 0; r < n; ++r) rows[4 * r + 1] += 1000, rows[4 * r + 2] += 2035;
            const int64_t *shape = grid == 0 ? small : huge;
            assert_int_equal(spconv__site_lines_fit(n, 1, shape), grid == 0);
            spconv_tensor *indices = spconv_test_indices_tensor(rows, n);
            for (int threads = 1; threads <= 2; ++threads) {
                spconv_context *ctx = context_with_threads(threads);
                spconv_rulebook *rb = NULL;
                SPCONV_ASSERT_FAILS(spconv_rulebook_build(ctx, indices, shape, 1, &p, &rb),
                                    SPCONV_ERR_DUPLICATE_INDEX, want);
                assert_non_null(strstr(spconv_last_error(), owned));
                spconv_context_destroy(ctx);
            }
            spconv_tensor_release(indices);
        }
        free(rows);
    }
}

static void test_bad_arguments(void **state) {
    (void)state;
    const int32_t rows[8] = {0, 1, 2, 3, 0, 4, 5, 6};
    spconv_tensor *indices = spconv_test_indices_tensor(rows, 2);
    const spconv_conv_params p = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    spconv_rulebook *rb = NULL;
    SPCONV_ASSERT_FAILS(spconv_rulebook_build(NULL, NULL, GRID, 1, &p, &rb),
                        SPCONV_ERR_NULL_POINTER, "spconv_rulebook_build: 'indices' is NULL");
    SPCONV_ASSERT_FAILS(spconv_rulebook_build(NULL, indices, NULL, 1, &p, &rb),
                        SPCONV_ERR_NULL_POINTER, "'spatial_shape' is NULL");
    SPCONV_ASSERT_FAILS(spconv_rulebook_build(NULL, indices, GRID, 1, NULL, &rb),
                        SPCONV_ERR_NULL_POINTER, "'params' is NULL");
    SPCONV_ASSERT_FAILS(spconv_rulebook_build(NULL, indices, GRID, 1, &p, NULL),
                        SPCONV_ERR_NULL_POINTER, "'out' is NULL");
    SPCONV_ASSERT_FAILS(spconv_rulebook_build(NULL, indices, GRID, 0, &p, &rb),
                        SPCONV_ERR_INVALID_ARGUMENT, "batch_size = 0 must be in [1, 2^31]");
    const int64_t flat[3] = {19, 0, 17};
    SPCONV_ASSERT_FAILS(spconv_rulebook_build(NULL, indices, flat, 1, &p, &rb),
                        SPCONV_ERR_INVALID_ARGUMENT, "axis 1 (y) outside");
    const int64_t huge[3] = {1 << 30, 1 << 30, 1 << 10};
    SPCONV_ASSERT_FAILS(spconv_rulebook_build(NULL, indices, huge, 1, &p, &rb), SPCONV_ERR_OVERFLOW,
                        "and output spatial shape (1073741822, 1073741822, 1022) need 70 key bits");
    /* An input that fits the key but whose transposed output does not: the message says which. */
    const int64_t fits[3] = {1 << 20, 1 << 20, 1 << 20};
    spconv_conv_params up = spconv_conv_params_default(SPCONV_CONV_TRANSPOSED);
    for (int a = 0; a < 3; ++a) up.stride[a] = 16;
    SPCONV_ASSERT_FAILS(spconv_rulebook_build(NULL, indices, fits, 1, &up, &rb), SPCONV_ERR_OVERFLOW,
                        "and output spatial shape (");
    spconv_conv_params even = spconv_conv_params_default(SPCONV_CONV_SUBM);
    even.kernel[2] = 4;
    SPCONV_ASSERT_FAILS(spconv_rulebook_build(NULL, indices, GRID, 1, &even, &rb),
                        SPCONV_ERR_INVALID_ARGUMENT, "kernel[2] = 4 is even");
    spconv_conv_params wide = p;
    wide.kernel[0] = 21;
    SPCONV_ASSERT_FAILS(spconv_rulebook_build(NULL, indices, GRID, 1, &wide, &rb),
                        SPCONV_ERR_INVALID_ARGUMENT, "output spatial shape is empty on axis 0 (z)");
    const spconv_conv_params inverse = spconv_conv_params_default(SPCONV_CONV_INVERSE);
    SPCONV_ASSERT_FAILS(spconv_rulebook_build(NULL, indices, GRID, 1, &inverse, &rb),
                        SPCONV_ERR_INVALID_ARGUMENT, "INVERSE");
    assert_null(rb);
    spconv_tensor_release(indices);

    /* An input grid whose keys cannot be formed fails whatever the rows: here every row reaches
     * an output of a 1^3 window of stride 1024 (whose rows are checked from the sorted
     * candidates, without input keys), and then one does not (checked through the table). */
    const int64_t vast[3] = {INT64_C(1) << 30, INT64_C(1) << 30, INT64_C(1) << 30};
    spconv_conv_params sparse_grid = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    for (int a = 0; a < 3; ++a) sparse_grid.stride[a] = 1024;
    for (int reach = 1; reach >= 0; --reach) {
        const int32_t far[8] = {0, 0, 1024, 3072, 0, 2048, 0, reach ? 1024 : 5};
        spconv_tensor *far_rows = spconv_test_indices_tensor(far, 2);
        SPCONV_ASSERT_FAILS(spconv_rulebook_build(NULL, far_rows, vast, 1, &sparse_grid, &rb),
                            SPCONV_ERR_OVERFLOW,
                            "input spatial shape (1073741824, 1073741824, 1073741824) need 90 "
                            "key bits");
        spconv_tensor_release(far_rows);
    }

    spconv_tensor *wrong = NULL;
    const int64_t sizes[2] = {2, 4}, narrow[2] = {2, 3}, flat_sizes[1] = {8};
    SPCONV_ASSERT_OK(spconv_tensor_zeros(NULL, spconv_cpu(), SPCONV_I64, 2, sizes, &wrong));
    SPCONV_ASSERT_FAILS(spconv_rulebook_build(NULL, wrong, GRID, 1, &p, &rb),
                        SPCONV_ERR_DTYPE_MISMATCH, "indices must be int32, got i64");
    spconv_tensor_release(wrong);
    SPCONV_ASSERT_OK(spconv_tensor_zeros(NULL, spconv_cpu(), SPCONV_I32, 2, narrow, &wrong));
    SPCONV_ASSERT_FAILS(spconv_rulebook_build(NULL, wrong, GRID, 1, &p, &rb),
                        SPCONV_ERR_SHAPE_MISMATCH, "indices must be [N, 4] rows (b, z, y, x), got [2, 3]");
    spconv_tensor_release(wrong);
    SPCONV_ASSERT_OK(spconv_tensor_zeros(NULL, spconv_cpu(), SPCONV_I32, 1, flat_sizes, &wrong));
    SPCONV_ASSERT_FAILS(spconv_rulebook_build(NULL, wrong, GRID, 1, &p, &rb),
                        SPCONV_ERR_SHAPE_MISMATCH, "got a 1-d tensor");
    spconv_tensor_release(wrong);
    assert_null(rb);
}

/* A kernel of 1001^3 offsets over 1000 sites needs a 4 TB neighbour table: refused cleanly. */

/* ---- real data ----------------------------------------------------------------------------- */

/* int32 rows of the real scan, or NULL (after saying why) when it is absent. */
static int32_t *load_real_sites(int64_t *n) {
    char *path = spconv_test_data_path("spconv_test_indices.i32");
    if (path == NULL) return NULL;
    FILE *file = fopen(path, "rb");
    assert_non_null(file);
    assert_int_equal(fseek(file, 0, SEEK_END), 0);
    const long bytes = ftell(file);
    assert_true(bytes > 0 && bytes % 16 == 0);
    rewind(file);
    int32_t *rows = malloc((size_t)bytes);
    assert_non_null(rows);
    assert_int_equal(fread(rows, 1, (size_t)bytes, file), (size_t)bytes);
    fclose(file);
    free(path);
    *n = bytes / 16;
    return rows;
}

/* A crop of the real scan: input box [lo, hi), with lo a multiple of the stride. */
typedef struct crop {
    const spconv_conv_params *params;
    int64_t lo[3], hi[3];
} crop;

/* 1 when output coordinate o's whole receptive field lies inside the crop. */
static int interior(const crop *c, const int32_t *o) {
    const spconv_conv_params *p = c->params;
    for (int axis = 0; axis < 3; ++axis) {
        const int64_t d = p->dilation[axis], span = d * (p->kernel[axis] - 1);
        const int64_t first = p->kind == SPCONV_CONV_SUBM
                                  ? o[1 + axis] - span / 2
                                  : o[1 + axis] * p->stride[axis] - p->padding[axis];
        if (first < c->lo[axis] || first + span >= c->hi[axis]) return 0;
    }
    return 1;
}

static int64_t out_shift(const crop *c, int axis) {
    return c->params->kind == SPCONV_CONV_SUBM ? c->lo[axis]
                                               : c->lo[axis] / c->params->stride[axis];
}

typedef struct pair_tuple {
    int32_t values[8]; /* output z, y, x, offset, input z, y, x, 0: in crop coordinates */
} pair_tuple;

static int compare_tuples(const void *a, const void *b) { return memcmp(a, b, sizeof(pair_tuple)); }

/* Pairs of rb whose output is interior, in crop coordinates, sorted. @p in_crop says whether rb's
 * coordinates are already relative to the crop. */
static pair_tuple *interior_pairs(const crop *c, const spconv_rulebook *rb, int in_crop,
                                  int64_t *count) {
    const int32_t *in_rows = spconv_tensor_data(spconv_rulebook_in_indices(rb));
    const int32_t *out_rows = spconv_tensor_data(spconv_rulebook_out_indices(rb));
    const int32_t *pairs_in = spconv_tensor_data(spconv_rulebook_pairs_in(rb));
    const int32_t *pairs_out = spconv_tensor_data(spconv_rulebook_pairs_out(rb));
    const int64_t *ks = spconv_rulebook_active_offsets(rb);
    const int64_t *starts = spconv_rulebook_active_starts(rb);
    pair_tuple *tuples = calloc((size_t)spconv_rulebook_num_pairs(rb) + 1, sizeof *tuples);
    assert_non_null(tuples);
    *count = 0;
    for (int64_t a = 0; a < spconv_rulebook_num_active_offsets(rb); ++a)
        for (int64_t j = starts[a], k = ks[a]; j < starts[a + 1]; ++j) {
            const int32_t *in = in_rows + 4 * pairs_in[j], *out = out_rows + 4 * pairs_out[j];
            int32_t global_out[4] = {out[0], out[1], out[2], out[3]};
            for (int axis = 0; axis < 3 && in_crop; ++axis)
                global_out[1 + axis] += (int32_t)out_shift(c, axis);
            if (!interior(c, global_out)) continue;
            pair_tuple *t = &tuples[(*count)++];
            for (int axis = 0; axis < 3; ++axis) {
                t->values[axis] = global_out[1 + axis] - (int32_t)out_shift(c, axis);
                t->values[4 + axis] = in[1 + axis] - (in_crop ? 0 : (int32_t)c->lo[axis]);
            }
            t->values[3] = (int32_t)k;
        }
    qsort(tuples, (size_t)*count, sizeof *tuples, compare_tuples);
    return tuples;
}

/* The reference on the sites inside the crop must give the full rulebook's interior pairs. */
static void check_crop(const crop *c, const spconv_rulebook *full, const int32_t *rows, int64_t n) {
    int32_t *inside = malloc((size_t)n * 4 * sizeof *inside);
    assert_non_null(inside);
    int64_t m = 0;
    for (int64_t r = 0; r < n; ++r) {
        const int32_t *row = rows + 4 * r;
        int keep = row[0] == 0;
        for (int axis = 0; axis < 3; ++axis)
            keep &= row[1 + axis] >= c->lo[axis] && row[1 + axis] < c->hi[axis];
        if (!keep) continue;
        inside[4 * m] = 0;
        for (int axis = 0; axis < 3; ++axis)
            inside[4 * m + 1 + axis] = row[1 + axis] - (int32_t)c->lo[axis];
        ++m;
    }
    const int64_t shape[3] = {c->hi[0] - c->lo[0], c->hi[1] - c->lo[1], c->hi[2] - c->lo[2]};
    spconv_tensor *indices = spconv_test_indices_tensor(inside, m);
    spconv_rulebook *ref = NULL;
    SPCONV_ASSERT_OK(spconv__rulebook_build_ref(indices, shape, 1, c->params, &ref));
    int64_t expected_count, actual_count;
    pair_tuple *expected = interior_pairs(c, ref, 1, &expected_count);
    pair_tuple *actual = interior_pairs(c, full, 0, &actual_count);
    printf("crop %lld sites: %lld interior pairs\n", (long long)m, (long long)actual_count);
    assert_true(actual_count > 0);
    assert_int_equal(actual_count, expected_count);
    assert_memory_equal(actual, expected, (size_t)actual_count * sizeof *actual);
    free(expected);
    free(actual);
    spconv_rulebook_release(ref);
    spconv_tensor_release(indices);
    free(inside);
}

static void check_real_rulebook(const spconv_conv_params *p) {
    int64_t n;
    int32_t *rows = load_real_sites(&n);
    if (rows == NULL) {
        skip();
        return;
    }
    const int64_t shape[3] = {80, 1600, 1600};
    spconv_tensor *indices = spconv_test_indices_tensor(rows, n);
    spconv_context *one = context_with_threads(1), *two = context_with_threads(2);
    spconv_rulebook *rb = NULL, *rb_one = NULL;
    SPCONV_ASSERT_OK(spconv_rulebook_build(two, indices, shape, 1, p, &rb));
    SPCONV_ASSERT_OK(spconv_rulebook_build(one, indices, shape, 1, p, &rb_one));
    spconv_test_assert_rulebooks_equal(rb, rb_one);
    spconv_test_check_rulebook(rb);
    printf("real scan: %lld sites -> %lld outputs, %lld pairs\n", (long long)n,
           (long long)spconv_rulebook_num_out(rb), (long long)spconv_rulebook_num_pairs(rb));
    for (int box = 0; box < 3; ++box) {
        /* A box of 16 x 80 x 80 voxels around a random site, aligned to the stride. */
        const int32_t *center = rows + 4 * spconv_test_rand_int(0, n - 1);
        const int64_t size[3] = {16, 80, 80};
        crop c = {p, {0, 0, 0}, {0, 0, 0}};
        for (int axis = 0; axis < 3; ++axis) {
            int64_t lo = center[1 + axis] - size[axis] / 2;
            lo = lo < 0 ? 0 : lo > shape[axis] - size[axis] ? shape[axis] - size[axis] : lo;
            c.lo[axis] = lo - lo % p->stride[axis];
            c.hi[axis] = c.lo[axis] + size[axis];
        }
        check_crop(&c, rb, rows, n);
    }
    spconv_rulebook_release(rb);
    spconv_rulebook_release(rb_one);
    spconv_context_destroy(one);
    spconv_context_destroy(two);
    spconv_tensor_release(indices);
    free(rows);
}

static void test_real_scan_subm(void **state) {
    (void)state;
    const spconv_conv_params p = make_params(SPCONV_CONV_SUBM, 3, 1, 0, 1);
    check_real_rulebook(&p);
}

static void test_real_scan_stride2(void **state) {
    (void)state;
    const spconv_conv_params p = make_params(SPCONV_CONV_REGULAR, 3, 2, 1, 1);
    check_real_rulebook(&p);
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], MEMORY_CAP_FLAG) == 0) return memory_capped_builds();
    spconv_test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_packing_roundtrip_and_order),
        cmocka_unit_test(test_hash_insert_find),
        cmocka_unit_test(test_hash_full_table_is_bounded),
        cmocka_unit_test(test_crafted_sites_stay_near_home),
        cmocka_unit_test(test_crafted_sites_build_in_linear_time),
        cmocka_unit_test(test_hash_seed_does_not_change_rulebooks),
        cmocka_unit_test(test_large_kernel_few_sites_fits_memory_cap),
        cmocka_unit_test(test_params_default_and_kernel_volume),
        cmocka_unit_test(test_output_shape_regular_and_transposed),
        cmocka_unit_test(test_output_shape_errors),
        cmocka_unit_test(test_regular_grid_matches_reference),
        cmocka_unit_test(test_dense_inputs_match_reference),
        cmocka_unit_test(test_transposed_grid_matches_reference),
        cmocka_unit_test(test_subm_matches_reference),
        cmocka_unit_test(test_subm_bins_match_reference),
        cmocka_unit_test(test_subm_bins_work_is_bounded_by_pairs),
        cmocka_unit_test(test_subm_line_index_and_table_agree),
        cmocka_unit_test(test_subm_line_walks_agree),
        cmocka_unit_test(test_anisotropic_matches_reference),
        cmocka_unit_test(test_empty_input),
        cmocka_unit_test(test_axis_reach_matches_outputs),
        cmocka_unit_test(test_kernel_larger_than_its_pairs),
        cmocka_unit_test(test_single_voxel),
        cmocka_unit_test(test_thread_count_does_not_change_rulebooks),
        cmocka_unit_test(test_any_indices_layout),
        cmocka_unit_test(test_inverse_rulebook),
        cmocka_unit_test(test_bad_rows),
        cmocka_unit_test(test_repeats_named_alike),
        cmocka_unit_test(test_many_sites_first_repeat_named),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_real_scan_subm),
        cmocka_unit_test(test_real_scan_stride2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
