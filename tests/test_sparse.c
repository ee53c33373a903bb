/* Sparse tensors and the indice_key rulebook cache: creation and its checks, validation of rows,
 * reuse of submanifold rulebooks, regular rulebooks and their inverses by key, geometry
 * mismatches, missing keys, and lifetimes of shared caches. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rulebook_testing.h"
#include "common/test_util.h"
#include "rulebook/internal.h"
#include "rulebook/sparse_impl.h"

static const int64_t GRID[3] = {19, 18, 17};

static spconv_tensor *features_for(int64_t n, int64_t channels) {
    const int64_t sizes[2] = {n, channels};
    spconv_tensor *t = NULL;
    SPCONV_ASSERT_OK(spconv_tensor_zeros(NULL, spconv_cpu(), SPCONV_F32, 2, sizes, &t));
    return t;
}

/* A sparse tensor over random sites (2 batches of per_batch) with 3 channels. */
static spconv_sparse_tensor *random_sparse(int64_t per_batch) {
    int32_t *rows = spconv_test_random_sites(2, GRID, per_batch);
    spconv_tensor *indices = spconv_test_indices_tensor(rows, 2 * per_batch);
    spconv_tensor *features = features_for(2 * per_batch, 3);
    spconv_sparse_tensor *sp = NULL;
    SPCONV_ASSERT_OK(spconv_sparse_create(features, indices, GRID, 2, &sp));
    spconv_tensor_release(indices);
    spconv_tensor_release(features);
    free(rows);
    return sp;
}

static spconv_conv_params params_of(spconv_conv_kind kind, int64_t kernel, int64_t stride,
                                    int64_t padding) {
    spconv_conv_params p = spconv_conv_params_default(kind);
    for (int axis = 0; axis < 3; ++axis) {
        p.kernel[axis] = kernel;
        p.stride[axis] = stride;
        p.padding[axis] = padding;
    }
    return p;
}

/* The sparse tensor on the outputs of @p rb, with zero features, sharing @p in's cache. */
static spconv_sparse_tensor *outputs_of(const spconv_sparse_tensor *in, const spconv_rulebook *rb) {
    spconv_tensor *features = features_for(spconv_rulebook_num_out(rb), 4);
    spconv_sparse_tensor *out = NULL;
    SPCONV_ASSERT_OK(spconv_sparse_from_rulebook(in, rb, features, &out));
    spconv_tensor_release(features);
    return out;
}

static void test_create_and_accessors(void **state) {
    (void)state;
    const int64_t n = spconv_test_rand_int(1, 300);
    int32_t *rows = spconv_test_random_sites(1, GRID, n);
    int32_t max_batch = 0;
    for (int64_t r = 0; r < n; ++r) {
        rows[4 * r] = (int32_t)spconv_test_rand_int(0, 6);
        max_batch = rows[4 * r] > max_batch ? rows[4 * r] : max_batch;
    }
    spconv_tensor *indices = spconv_test_indices_tensor(rows, n);
    spconv_tensor *features = features_for(n, 5);
    spconv_sparse_tensor *sp = NULL;
    SPCONV_ASSERT_OK(spconv_sparse_create(features, indices, GRID, 0, &sp));
    assert_ptr_equal(spconv_sparse_features(sp), features);
    assert_ptr_equal(spconv_sparse_indices(sp), indices);
    assert_int_equal(spconv_sparse_batch_size(sp), max_batch + 1);
    assert_int_equal(spconv_sparse_num_sites(sp), n);
    int64_t shape[3];
    spconv_sparse_spatial_shape(sp, shape);
    assert_memory_equal(shape, GRID, sizeof shape);
    /* The sparse tensor holds its own references. */
    spconv_tensor_release(indices);
    spconv_tensor_release(features);
    spconv_sparse_retain(sp);
    spconv_sparse_release(sp);
    assert_int_equal(spconv_tensor_size(spconv_sparse_indices(sp), 0), n);
    SPCONV_ASSERT_OK(spconv_sparse_validate(NULL, sp));
    spconv_sparse_release(sp);
    spconv_sparse_release(NULL);
    spconv_sparse_retain(NULL);
    free(rows);

    spconv_tensor *no_rows = spconv_test_indices_tensor(NULL, 0), *no_features = features_for(0, 2);
    SPCONV_ASSERT_OK(spconv_sparse_create(no_features, no_rows, GRID, -1, &sp));
    assert_int_equal(spconv_sparse_batch_size(sp), 1);
    assert_int_equal(spconv_sparse_num_sites(sp), 0);
    spconv_sparse_release(sp);
    spconv_tensor_release(no_rows);
    spconv_tensor_release(no_features);
}

static void test_create_errors(void **state) {
    (void)state;
    const int32_t rows[8] = {0, 1, 2, 3, 1, 4, 5, 6};
    spconv_tensor *indices = spconv_test_indices_tensor(rows, 2);
    spconv_tensor *features = features_for(2, 3), *three = features_for(3, 3), *ints = NULL,
                  *flat = NULL;
    const int64_t two_by_three[2] = {2, 3}, six[1] = {6};
    SPCONV_ASSERT_OK(spconv_tensor_zeros(NULL, spconv_cpu(), SPCONV_I32, 2, two_by_three, &ints));
    SPCONV_ASSERT_OK(spconv_tensor_zeros(NULL, spconv_cpu(), SPCONV_F32, 1, six, &flat));
    spconv_sparse_tensor *sp = NULL;
    SPCONV_ASSERT_FAILS(spconv_sparse_create(NULL, indices, GRID, 2, &sp), SPCONV_ERR_NULL_POINTER,
                        "spconv_sparse_create: 'features' is NULL");
    SPCONV_ASSERT_FAILS(spconv_sparse_create(features, NULL, GRID, 2, &sp), SPCONV_ERR_NULL_POINTER,
                        "'indices' is NULL");
    SPCONV_ASSERT_FAILS(spconv_sparse_create(features, indices, NULL, 2, &sp),
                        SPCONV_ERR_NULL_POINTER, "'spatial_shape' is NULL");
    SPCONV_ASSERT_FAILS(spconv_sparse_create(features, indices, GRID, 2, NULL),
                        SPCONV_ERR_NULL_POINTER, "'out' is NULL");
    SPCONV_ASSERT_FAILS(spconv_sparse_create(ints, indices, GRID, 2, &sp),
                        SPCONV_ERR_DTYPE_MISMATCH, "features must be floating, got i32");
    SPCONV_ASSERT_FAILS(spconv_sparse_create(flat, indices, GRID, 2, &sp),
                        SPCONV_ERR_SHAPE_MISMATCH, "features must be [N, C], got 1 dims");
    SPCONV_ASSERT_FAILS(spconv_sparse_create(three, indices, GRID, 2, &sp),
                        SPCONV_ERR_SHAPE_MISMATCH, "features have 3 rows but indices have 2");
    SPCONV_ASSERT_FAILS(spconv_sparse_create(features, features, GRID, 2, &sp),
                        SPCONV_ERR_DTYPE_MISMATCH, "indices must be int32, got f32");
    SPCONV_ASSERT_FAILS(spconv_sparse_create(features, ints, GRID, 2, &sp),
                        SPCONV_ERR_SHAPE_MISMATCH, "indices must be [N, 4]");
    const int64_t empty_shape[3] = {19, 18, 0};
    SPCONV_ASSERT_FAILS(spconv_sparse_create(features, indices, empty_shape, 2, &sp),
                        SPCONV_ERR_INVALID_ARGUMENT, "axis 2 (x) outside [1,");
    SPCONV_ASSERT_FAILS(spconv_sparse_create(features, indices, GRID, (int64_t)1 << 32, &sp),
                        SPCONV_ERR_INVALID_ARGUMENT, "batch_size = 4294967296");
    assert_null(sp);
    SPCONV_ASSERT_OK(spconv_sparse_create(features, indices, GRID, 2, &sp));
    spconv_sparse_tensor *other = NULL;
    SPCONV_ASSERT_FAILS(spconv_sparse_with_features(sp, three, &other), SPCONV_ERR_SHAPE_MISMATCH,
                        "spconv_sparse_with_features: features have 3 rows but indices have 2");
    SPCONV_ASSERT_FAILS(spconv_sparse_with_features(NULL, features, &other),
                        SPCONV_ERR_NULL_POINTER, "'like'");
    SPCONV_ASSERT_FAILS(spconv_sparse_validate(NULL, NULL), SPCONV_ERR_NULL_POINTER, "'sp'");
    assert_null(other);
    spconv_sparse_release(sp);
    spconv_tensor_release(indices);
    spconv_tensor_release(features);
    spconv_tensor_release(three);
    spconv_tensor_release(ints);
    spconv_tensor_release(flat);
}

static void expect_invalid_sites(const int32_t *rows, int64_t n, int64_t batch,
                                 spconv_status status, const char *substring) {
    spconv_tensor *indices = spconv_test_indices_tensor(rows, n), *features = features_for(n, 1);
    spconv_sparse_tensor *sp = NULL;
    SPCONV_ASSERT_OK(spconv_sparse_create(features, indices, GRID, batch, &sp));
    SPCONV_ASSERT_FAILS(spconv_sparse_validate(NULL, sp), status, substring);
    spconv_sparse_release(sp);
    spconv_tensor_release(indices);
    spconv_tensor_release(features);
}

static void test_validate_names_first_bad_row(void **state) {
    (void)state;
    const int64_t n = 200;
    int32_t *rows = spconv_test_random_sites(2, GRID, n / 2);
    const int64_t bad = spconv_test_rand_int(1, n - 1), first = spconv_test_rand_int(0, bad - 1);
    char message[160];
    const int32_t saved = rows[4 * bad + 2];
    rows[4 * bad + 2] = 18;
    snprintf(message, sizeof message,
             "spconv_sparse_validate: indices row %lld = (%d, %d, 18, %d) is outside spatial shape "
             "(19, 18, 17)",
             (long long)bad, rows[4 * bad], rows[4 * bad + 1], rows[4 * bad + 3]);
    expect_invalid_sites(rows, n, 2, SPCONV_ERR_OUT_OF_RANGE, message);
    rows[4 * bad + 2] = saved;
    /* With one batch only, the first row of batch 1 is out of range. */
    int64_t first_batch1 = 0;
    while (rows[4 * first_batch1] != 1) ++first_batch1;
    snprintf(message, sizeof message, "indices row %lld = (1, ", (long long)first_batch1);
    expect_invalid_sites(rows, n, 1, SPCONV_ERR_OUT_OF_RANGE, message);
    memcpy(rows + 4 * bad, rows + 4 * first, 4 * sizeof *rows);
    snprintf(message, sizeof message, "indices row %lld = (%d, %d, %d, %d) duplicates row %lld",
             (long long)bad, rows[4 * bad], rows[4 * bad + 1], rows[4 * bad + 2], rows[4 * bad + 3],
             (long long)first);
    expect_invalid_sites(rows, n, 2, SPCONV_ERR_DUPLICATE_INDEX, message);
    free(rows);
}

static void test_subm_rulebook_is_reused(void **state) {
    (void)state;
    spconv_sparse_tensor *sp = random_sparse(spconv_test_rand_int(1, 400));
    const spconv_conv_params subm = params_of(SPCONV_CONV_SUBM, 3, 1, 0);
    spconv_rulebook *first = NULL, *again = NULL, *direct = NULL;
    SPCONV_ASSERT_OK(spconv_sparse_get_rulebook(NULL, sp, &subm, "subm1", &first));
    SPCONV_ASSERT_OK(
        spconv_rulebook_build(NULL, spconv_sparse_indices(sp), GRID, 2, &subm, &direct));
    spconv_test_assert_rulebooks_equal(first, direct);
    /* Stride and padding do not matter to a submanifold conv, so they do not block reuse. */
    const spconv_conv_params ignored = params_of(SPCONV_CONV_SUBM, 3, 2, 1);
    SPCONV_ASSERT_OK(spconv_sparse_get_rulebook(NULL, sp, &ignored, "subm1", &again));
    assert_ptr_equal(first, again);
    spconv_rulebook_release(again);
    /* The next layer's tensor (new features, same sites) shares the cache. */
    spconv_sparse_tensor *next = outputs_of(sp, first);
    SPCONV_ASSERT_OK(spconv_sparse_get_rulebook(NULL, next, &subm, "subm1", &again));
    assert_ptr_equal(first, again);
    spconv_rulebook_release(again);
    spconv_tensor *wider = features_for(spconv_sparse_num_sites(sp), 7);
    spconv_sparse_tensor *same_sites = NULL;
    SPCONV_ASSERT_OK(spconv_sparse_with_features(next, wider, &same_sites));
    /* Releasing the first tensors keeps the shared cache alive. */
    spconv_sparse_release(sp);
    spconv_sparse_release(next);
    SPCONV_ASSERT_OK(spconv_sparse_get_rulebook(NULL, same_sites, &subm, "subm1", &again));
    assert_ptr_equal(first, again);
    spconv_rulebook_release(again);
    /* Without a key nothing is cached. */
    SPCONV_ASSERT_OK(spconv_sparse_get_rulebook(NULL, same_sites, &subm, NULL, &again));
    assert_ptr_not_equal(first, again);
    spconv_test_assert_rulebooks_equal(first, again);
    spconv_rulebook_release(again);
    SPCONV_ASSERT_OK(spconv_sparse_get_rulebook(NULL, same_sites, &subm, "", &again));
    assert_ptr_not_equal(first, again);
    spconv_rulebook_release(again);
    spconv_sparse_release(same_sites);
    spconv_tensor_release(wider);
    spconv_rulebook_release(direct);
    spconv_rulebook_release(first);
}

static void test_geometry_mismatch(void **state) {
    (void)state;
    spconv_sparse_tensor *sp = random_sparse(200);
    const spconv_conv_params subm = params_of(SPCONV_CONV_SUBM, 3, 1, 0);
    spconv_rulebook *rb = NULL, *other = NULL;
    SPCONV_ASSERT_OK(spconv_sparse_get_rulebook(NULL, sp, &subm, "subm1", &rb));
    spconv_conv_params changed = subm;
    changed.kernel[1] = 5;
    SPCONV_ASSERT_FAILS(spconv_sparse_get_rulebook(NULL, sp, &changed, "subm1", &other),
                        SPCONV_ERR_GEOMETRY_MISMATCH,
                        "indice_key 'subm1' holds a rulebook for SUBM kernel (3, 3, 3)");
    SPCONV_ASSERT_ERROR_CONTAINS("but this layer asks for SUBM kernel (3, 5, 3)");
    changed = subm;
    changed.dilation[2] = 2;
    SPCONV_ASSERT_FAILS(spconv_sparse_get_rulebook(NULL, sp, &changed, "subm1", &other),
                        SPCONV_ERR_GEOMETRY_MISMATCH, "dilation (1, 1, 2)");
    const spconv_conv_params regular = params_of(SPCONV_CONV_REGULAR, 3, 1, 0);
    SPCONV_ASSERT_FAILS(spconv_sparse_get_rulebook(NULL, sp, &regular, "subm1", &other),
                        SPCONV_ERR_GEOMETRY_MISMATCH, "asks for REGULAR kernel");
    /* Bad parameters are reported as such even under a known key. */
    changed = subm;
    changed.kernel[0] = 2;
    SPCONV_ASSERT_FAILS(spconv_sparse_get_rulebook(NULL, sp, &changed, "subm1", &other),
                        SPCONV_ERR_INVALID_ARGUMENT, "kernel[0] = 2 is even");
    /* Same shape, other sites: a 3x3x3 conv with padding 1 keeps the shape but grows the set. */
    const spconv_conv_params grow = params_of(SPCONV_CONV_REGULAR, 3, 1, 1);
    spconv_rulebook *grown = NULL;
    SPCONV_ASSERT_OK(spconv_sparse_get_rulebook(NULL, sp, &grow, "grow", &grown));
    spconv_sparse_tensor *bigger = outputs_of(sp, grown);
    SPCONV_ASSERT_FAILS(spconv_sparse_get_rulebook(NULL, bigger, &subm, "subm1", &other),
                        SPCONV_ERR_GEOMETRY_MISMATCH,
                        "indice_key 'subm1' holds a rulebook built on other input sites");
    SPCONV_ASSERT_FAILS(spconv_sparse_get_rulebook(NULL, bigger, &grow, "grow", &other),
                        SPCONV_ERR_GEOMETRY_MISMATCH, "built on other input sites");
    assert_null(other);
    spconv_sparse_release(bigger);
    spconv_rulebook_release(grown);
    spconv_rulebook_release(rb);
    spconv_sparse_release(sp);
}

/* @p inv, the inverse rulebook on @p made's sites, is well formed and goes back to @p origin's
 * sites (the same tensor) and spatial shape (GRID). */
static void assert_inverse_goes_back(const spconv_sparse_tensor *made, const spconv_rulebook *inv,
                                     const spconv_sparse_tensor *origin) {
    spconv_test_check_rulebook(inv);
    spconv_sparse_tensor *restored = outputs_of(made, inv);
    assert_ptr_equal(spconv_sparse_indices(restored), spconv_sparse_indices(origin));
    int64_t shape[3];
    spconv_sparse_spatial_shape(restored, shape);
    assert_memory_equal(shape, GRID, sizeof shape);
    spconv_sparse_release(restored);
}

static void test_regular_rulebook_and_inverse_by_key(void **state) {
    (void)state;
    spconv_sparse_tensor *sp = random_sparse(spconv_test_rand_int(1, 300));
    const spconv_conv_params down = params_of(SPCONV_CONV_REGULAR, 3, 2, 1);
    spconv_rulebook *rb = NULL, *again = NULL, *inv = NULL, *direct = NULL;
    SPCONV_ASSERT_OK(spconv_sparse_get_rulebook(NULL, sp, &down, "down1", &rb));
    SPCONV_ASSERT_OK(spconv_sparse_get_rulebook(NULL, sp, &down, "down1", &again));
    assert_ptr_equal(rb, again);
    spconv_rulebook_release(again);
    spconv_sparse_tensor *coarse = outputs_of(sp, rb);
    int64_t shape[3];
    spconv_sparse_spatial_shape(coarse, shape);
    assert_int_equal(shape[0], 10);
    assert_int_equal(spconv_sparse_num_sites(coarse), spconv_rulebook_num_out(rb));

    spconv_conv_params inverse = down;
    inverse.kind = SPCONV_CONV_INVERSE;
    SPCONV_ASSERT_OK(spconv_sparse_get_rulebook(NULL, coarse, &inverse, "down1", &inv));
    SPCONV_ASSERT_OK(spconv_rulebook_inverse(rb, &direct));
    spconv_test_assert_rulebooks_equal(inv, direct);
    assert_ptr_equal(spconv_rulebook_out_indices(inv), spconv_sparse_indices(sp));
    assert_inverse_goes_back(coarse, inv, sp);
    spconv_rulebook_release(inv);
    spconv_rulebook_release(direct);

    /* A transposed conv's key inverts too, back to its input sites and shape. */
    const spconv_conv_params up = params_of(SPCONV_CONV_TRANSPOSED, 3, 2, 1);
    spconv_rulebook *grown = NULL;
    SPCONV_ASSERT_OK(spconv_sparse_get_rulebook(NULL, sp, &up, "up1", &grown));
    spconv_sparse_tensor *fine = outputs_of(sp, grown);
    spconv_conv_params up_inverse = up;
    up_inverse.kind = SPCONV_CONV_INVERSE;
    SPCONV_ASSERT_OK(spconv_sparse_get_rulebook(NULL, fine, &up_inverse, "up1", &inv));
    assert_int_equal(spconv_rulebook_forward_kind(inv), SPCONV_CONV_TRANSPOSED);
    assert_inverse_goes_back(fine, inv, sp);
    spconv_rulebook_release(inv);
    spconv_sparse_release(fine);
    spconv_rulebook_release(grown);

    SPCONV_ASSERT_FAILS(spconv_sparse_get_rulebook(NULL, coarse, &inverse, "nope", &inv),
                        SPCONV_ERR_NOT_FOUND, "no rulebook is stored under indice_key 'nope'");
    SPCONV_ASSERT_FAILS(spconv_sparse_get_rulebook(NULL, coarse, &inverse, NULL, &inv),
                        SPCONV_ERR_INVALID_ARGUMENT, "an INVERSE conv needs the indice_key");
    SPCONV_ASSERT_FAILS(spconv_sparse_get_rulebook(NULL, sp, &inverse, "down1", &inv),
                        SPCONV_ERR_GEOMETRY_MISMATCH,
                        "indice_key 'down1' produced spatial shape (10, 9, 9)");
    spconv_conv_params small = inverse;
    small.kernel[2] = 2;
    SPCONV_ASSERT_FAILS(spconv_sparse_get_rulebook(NULL, coarse, &small, "down1", &inv),
                        SPCONV_ERR_GEOMETRY_MISMATCH,
                        "holds kernel (3, 3, 3) but the INVERSE conv has kernel (3, 3, 2)");
    const spconv_conv_params subm = params_of(SPCONV_CONV_SUBM, 3, 1, 0);
    SPCONV_ASSERT_OK(spconv_sparse_get_rulebook(NULL, coarse, &subm, "subm2", &again));
    spconv_rulebook_release(again);
    SPCONV_ASSERT_FAILS(spconv_sparse_get_rulebook(NULL, coarse, &inverse, "subm2", &inv),
                        SPCONV_ERR_GEOMETRY_MISMATCH,
                        "holds a SUBM rulebook; an INVERSE conv inverts a REGULAR or "
                        "TRANSPOSED one");
    const spconv_conv_params other = params_of(SPCONV_CONV_REGULAR, 2, 2, 0);
    SPCONV_ASSERT_FAILS(spconv_sparse_get_rulebook(NULL, sp, &other, "down1", &again),
                        SPCONV_ERR_GEOMETRY_MISMATCH,
                        "holds a rulebook for REGULAR kernel (3, 3, 3)");
    assert_null(inv);
    assert_null(again);
    spconv_sparse_release(coarse);
    spconv_rulebook_release(rb);
    spconv_sparse_release(sp);
}

/* The inverse compares sites by content when the tensors differ: a rulebook built outside the
 * cache has its own, equal, output tensor. */
static void test_inverse_compares_site_contents(void **state) {
    (void)state;
    spconv_sparse_tensor *sp = random_sparse(150);
    const spconv_conv_params down = params_of(SPCONV_CONV_REGULAR, 2, 2, 0);
    spconv_conv_params inverse = down;
    inverse.kind = SPCONV_CONV_INVERSE;
    spconv_rulebook *cached = NULL, *outside = NULL, *inv = NULL;
    SPCONV_ASSERT_OK(spconv_sparse_get_rulebook(NULL, sp, &down, "down", &cached));
    SPCONV_ASSERT_OK(
        spconv_rulebook_build(NULL, spconv_sparse_indices(sp), GRID, 2, &down, &outside));
    spconv_sparse_tensor *coarse = outputs_of(sp, outside);
    assert_ptr_not_equal(spconv_sparse_indices(coarse), spconv_rulebook_out_indices(cached));
    SPCONV_ASSERT_OK(spconv_sparse_get_rulebook(NULL, coarse, &inverse, "down", &inv));
    spconv_rulebook_release(inv);
    spconv_sparse_release(coarse);
    spconv_rulebook_release(outside);

    /* Other sites with as many rows on the same grid: a different coarse set. */
    spconv_tensor *rows = spconv_sparse_indices(sp);
    int32_t *moved = malloc((size_t)spconv_tensor_numel(rows) * sizeof *moved);
    assert_non_null(moved);
    memcpy(moved, spconv_tensor_data(rows), (size_t)spconv_tensor_numel(rows) * sizeof *moved);
    const int64_t n = spconv_tensor_size(rows, 0);
    for (int64_t r = 0; r < n; ++r) moved[4 * r] = 1 - moved[4 * r]; /* swap the batches */
    spconv_tensor *moved_rows = spconv_test_indices_tensor(moved, n);
    SPCONV_ASSERT_OK(spconv_rulebook_build(NULL, moved_rows, GRID, 2, &down, &outside));
    coarse = outputs_of(sp, outside);
    SPCONV_ASSERT_FAILS(spconv_sparse_get_rulebook(NULL, coarse, &inverse, "down", &inv),
                        SPCONV_ERR_GEOMETRY_MISMATCH, "are not the output sites");
    spconv_sparse_release(coarse);
    spconv_rulebook_release(outside);
    spconv_tensor_release(moved_rows);
    free(moved);
    spconv_rulebook_release(cached);
    spconv_sparse_release(sp);
}

static void test_from_rulebook_errors(void **state) {
    (void)state;
    spconv_sparse_tensor *sp = random_sparse(100), *other = random_sparse(120), *out = NULL;
    const spconv_conv_params down = params_of(SPCONV_CONV_REGULAR, 3, 2, 1);
    spconv_rulebook *rb = NULL;
    SPCONV_ASSERT_OK(spconv_sparse_get_rulebook(NULL, sp, &down, NULL, &rb));
    spconv_tensor *wrong_rows = features_for(spconv_rulebook_num_out(rb) + 1, 2);
    SPCONV_ASSERT_FAILS(spconv_sparse_from_rulebook(sp, rb, wrong_rows, &out),
                        SPCONV_ERR_SHAPE_MISMATCH, "spconv_sparse_from_rulebook: features have");
    spconv_tensor *features = features_for(spconv_rulebook_num_out(rb), 2);
    SPCONV_ASSERT_FAILS(spconv_sparse_from_rulebook(other, rb, features, &out),
                        SPCONV_ERR_GEOMETRY_MISMATCH, "the rulebook was built for 200 sites");
    SPCONV_ASSERT_FAILS(spconv_sparse_from_rulebook(sp, NULL, features, &out),
                        SPCONV_ERR_NULL_POINTER, "'rb'");
    spconv_rulebook *none = NULL;
    SPCONV_ASSERT_FAILS(spconv_sparse_get_rulebook(NULL, NULL, &down, NULL, &none),
                        SPCONV_ERR_NULL_POINTER, "spconv_sparse_get_rulebook: 'in' is NULL");
    SPCONV_ASSERT_FAILS(spconv_sparse_get_rulebook(NULL, sp, NULL, NULL, &none),
                        SPCONV_ERR_NULL_POINTER, "'params' is NULL");
    assert_null(none);
    assert_null(out);
    spconv_rulebook_release(rb);
    spconv_tensor_release(features);
    spconv_tensor_release(wrong_rows);
    spconv_sparse_release(sp);
    spconv_sparse_release(other);
}

/* A cached rulebook reports bad rows like a direct build and is not stored. */
static void test_cache_reports_bad_rows(void **state) {
    (void)state;
    int32_t *rows = spconv_test_random_sites(1, GRID, 50);
    memcpy(rows + 4 * 30, rows + 4 * 10, 4 * sizeof *rows);
    spconv_tensor *indices = spconv_test_indices_tensor(rows, 50), *features = features_for(50, 1);
    spconv_sparse_tensor *sp = NULL;
    SPCONV_ASSERT_OK(spconv_sparse_create(features, indices, GRID, 1, &sp));
    const spconv_conv_params subm = params_of(SPCONV_CONV_SUBM, 3, 1, 0);
    spconv_rulebook *rb = NULL;
    for (int attempt = 0; attempt < 2; ++attempt)
        SPCONV_ASSERT_FAILS(spconv_sparse_get_rulebook(NULL, sp, &subm, "subm1", &rb),
                            SPCONV_ERR_DUPLICATE_INDEX, "indices row 30");
    spconv_conv_params inverse = params_of(SPCONV_CONV_INVERSE, 3, 1, 0);
    SPCONV_ASSERT_FAILS(spconv_sparse_get_rulebook(NULL, sp, &inverse, "subm1", &rb),
                        SPCONV_ERR_NOT_FOUND, "'subm1'");
    assert_null(rb);
    spconv_sparse_release(sp);
    spconv_tensor_release(indices);
    spconv_tensor_release(features);
    free(rows);
}

static spconv_conv_params random_strided(spconv_conv_kind kind) {
    return spconv_test_random_params(kind, GRID);
}

/* Sites the cache knows (the input sites of a stored rulebook, on its geometry, or its output
 * sites on its output geometry) skip the strided builders' checks; the rulebooks must be those
 * of a build that checks. Other tensor objects, shapes or batch sizes are not known. */
static void test_known_sites_give_the_same_rulebooks(void **state) {
    (void)state;
    for (int trial = 0; trial < 12; ++trial) {
        spconv_sparse_tensor *sp = random_sparse(spconv_test_rand_int(1, 250));
        const spconv_tensor *indices = spconv_sparse_indices(sp);
        assert_false(spconv__rulebook_cache_knows_sites(sp->cache, indices, GRID, 2));
        const spconv_conv_params subm = params_of(SPCONV_CONV_SUBM, 3, 1, 0);
        spconv_rulebook *first = NULL;
        SPCONV_ASSERT_OK(spconv_sparse_get_rulebook(NULL, sp, &subm, "s", &first));
        assert_true(spconv__rulebook_cache_knows_sites(sp->cache, indices, GRID, 2));
        const int64_t other_shape[3] = {GRID[0], GRID[1], GRID[2] + 1};
        assert_false(spconv__rulebook_cache_knows_sites(sp->cache, indices, other_shape, 2));
        assert_false(spconv__rulebook_cache_knows_sites(sp->cache, indices, GRID, 3));
        spconv_tensor *copy = NULL;
        SPCONV_ASSERT_OK(spconv_tensor_clone(NULL, indices, &copy));
        assert_false(spconv__rulebook_cache_knows_sites(sp->cache, copy, GRID, 2));
        spconv_tensor_release(copy);

        /* The strided rulebook on the known sites, under a key and without one, against a
         * build that checks the rows; then one more on its outputs, known as such. */
        const spconv_conv_kind kind = trial % 3 == 2 ? SPCONV_CONV_TRANSPOSED : SPCONV_CONV_REGULAR;
        const spconv_conv_params p = random_strided(kind);
        spconv_rulebook *known = NULL, *unkeyed = NULL, *checked = NULL;
        SPCONV_ASSERT_OK(spconv_sparse_get_rulebook(NULL, sp, &p, "down", &known));
        SPCONV_ASSERT_OK(spconv_sparse_get_rulebook(NULL, sp, &p, NULL, &unkeyed));
        SPCONV_ASSERT_OK(spconv_rulebook_build(NULL, indices, GRID, 2, &p, &checked));
        spconv_test_assert_rulebooks_equal(known, checked);
        spconv_test_assert_rulebooks_equal(unkeyed, checked);
        spconv_test_check_rulebook(known);
        spconv_sparse_tensor *coarse = outputs_of(sp, known);
        int64_t coarse_shape[3];
        spconv_sparse_spatial_shape(coarse, coarse_shape);
        assert_true(spconv__rulebook_cache_knows_sites(sp->cache, spconv_sparse_indices(coarse),
                                                       coarse_shape, 2));
        spconv_conv_params next = spconv_conv_params_default(SPCONV_CONV_REGULAR);
        for (int axis = 0; axis < 3; ++axis) {
            next.kernel[axis] = coarse_shape[axis] >= 2 ? 2 : 1;
            next.stride[axis] = next.kernel[axis];
        }
        next.kernel[0] = 1; /* kernel <= stride on two axes, more on the third: both builds */
        next.padding[2] = coarse_shape[2] >= 2 ? 1 : 0;
        next.kernel[2] = coarse_shape[2] >= 2 ? 3 : 1;
        spconv_rulebook *down2 = NULL, *down2_checked = NULL;
        SPCONV_ASSERT_OK(spconv_sparse_get_rulebook(NULL, coarse, &next, "down2", &down2));
        SPCONV_ASSERT_OK(spconv_rulebook_build(NULL, spconv_sparse_indices(coarse), coarse_shape,
                                               2, &next, &down2_checked));
        spconv_test_assert_rulebooks_equal(down2, down2_checked);
        spconv_test_check_rulebook(down2);
        spconv_rulebook_release(down2);
        spconv_rulebook_release(down2_checked);
        spconv_sparse_release(coarse);
        spconv_rulebook_release(known);
        spconv_rulebook_release(unkeyed);
        spconv_rulebook_release(checked);
        spconv_rulebook_release(first);
        spconv_sparse_release(sp);
    }
    /* Known rows skip only the rows' checks: the arguments are still checked. */
    spconv_sparse_tensor *sp = random_sparse(20);
    spconv_rulebook *rb = NULL;
    const spconv_conv_params bad = params_of(SPCONV_CONV_REGULAR, 3, 0, 0);
    SPCONV_ASSERT_FAILS(spconv__rulebook_build_sites(NULL, spconv_sparse_indices(sp), GRID, 2,
                                                     &bad, 1, &rb),
                        SPCONV_ERR_INVALID_ARGUMENT, "stride");
    SPCONV_ASSERT_FAILS(spconv__rulebook_build_sites(NULL, spconv_sparse_indices(sp), GRID, 0,
                                                     &bad, 1, &rb),
                        SPCONV_ERR_INVALID_ARGUMENT, "");
    assert_null(rb);
    spconv_sparse_release(sp);
}

/* spconv_rulebook_build_on: on either side of a source rulebook (regular, subm, transposed or
 * inverse), the rulebook spconv_rulebook_build gives on that side's sites, shape and batch size;
 * and its argument errors. */
static void test_build_on_a_rulebook_side(void **state) {
    (void)state;
    static const spconv_conv_kind kinds[] = {SPCONV_CONV_REGULAR, SPCONV_CONV_SUBM,
                                             SPCONV_CONV_TRANSPOSED};
    for (int trial = 0; trial < 24; ++trial) {
        const int64_t per_batch = spconv_test_rand_int(1, 200);
        int32_t *rows = spconv_test_random_sites(2, GRID, per_batch);
        spconv_tensor *indices = spconv_test_indices_tensor(rows, 2 * per_batch);
        const spconv_conv_params first = spconv_test_random_params(kinds[trial % 3], GRID);
        spconv_rulebook *source = NULL;
        SPCONV_ASSERT_OK(spconv_rulebook_build(NULL, indices, GRID, 2, &first, &source));
        if (trial % 6 == 0 && first.kind == SPCONV_CONV_REGULAR) {
            spconv_rulebook *inverse = NULL;
            SPCONV_ASSERT_OK(spconv_rulebook_inverse(source, &inverse));
            spconv_rulebook_release(source);
            source = inverse;
        }
        for (int side = 0; side <= 1; ++side) {
            int64_t shape[3];
            if (side)
                spconv_rulebook_out_shape(source, shape);
            else
                spconv_rulebook_in_shape(source, shape);
            const spconv_conv_params next =
                spconv_test_random_params(kinds[(trial + side) % 3], shape);
            spconv_rulebook *on = NULL, *built = NULL;
            SPCONV_ASSERT_OK(spconv_rulebook_build_on(NULL, source, side, &next, &on));
            SPCONV_ASSERT_OK(spconv_rulebook_build(
                NULL, side ? spconv_rulebook_out_indices(source) : spconv_rulebook_in_indices(source),
                shape, 2, &next, &built));
            spconv_test_assert_rulebooks_equal(on, built);
            spconv_test_check_rulebook(on);
            spconv_rulebook_release(on);
            spconv_rulebook_release(built);
        }
        spconv_rulebook_release(source);
        spconv_tensor_release(indices);
        free(rows);
    }
    int32_t *rows = spconv_test_random_sites(1, GRID, 30);
    spconv_tensor *indices = spconv_test_indices_tensor(rows, 30);
    const spconv_conv_params subm = params_of(SPCONV_CONV_SUBM, 3, 1, 0);
    spconv_rulebook *source = NULL, *rb = NULL;
    SPCONV_ASSERT_OK(spconv_rulebook_build(NULL, indices, GRID, 1, &subm, &source));
    SPCONV_ASSERT_FAILS(spconv_rulebook_build_on(NULL, NULL, 0, &subm, &rb),
                        SPCONV_ERR_NULL_POINTER, "source");
    SPCONV_ASSERT_FAILS(spconv_rulebook_build_on(NULL, source, 2, &subm, &rb),
                        SPCONV_ERR_INVALID_ARGUMENT, "output_side is 2");
    SPCONV_ASSERT_FAILS(spconv_rulebook_build_on(NULL, source, 0, NULL, &rb),
                        SPCONV_ERR_NULL_POINTER, "params");
    const spconv_conv_params bad = params_of(SPCONV_CONV_REGULAR, 3, 0, 0);
    SPCONV_ASSERT_FAILS(spconv_rulebook_build_on(NULL, source, 1, &bad, &rb),
                        SPCONV_ERR_INVALID_ARGUMENT, "stride");
    const spconv_conv_params inverse = params_of(SPCONV_CONV_INVERSE, 3, 1, 0);
    SPCONV_ASSERT_FAILS(spconv_rulebook_build_on(NULL, source, 1, &inverse, &rb),
                        SPCONV_ERR_INVALID_ARGUMENT, "");
    assert_null(rb);
    /* Rows written after the source was built (the API forbids it; a binding cannot see writes
     * through .data or NumPy): the range is still checked, so a row outside the shape or the
     * batch is the range error, not keys packed from it (a crash once). */
    int32_t *held = spconv_tensor_data(spconv_rulebook_in_indices(source));
    const int32_t bad_rows[3][4] = {{0, -5, 2, 2}, {7, 1, 1, 1}, {0, 1, 100000, 1}};
    const spconv_conv_params next[3] = {params_of(SPCONV_CONV_REGULAR, 3, 2, 1),
                                        params_of(SPCONV_CONV_REGULAR, 2, 2, 0),
                                        params_of(SPCONV_CONV_TRANSPOSED, 3, 2, 0)};
    for (int b = 0; b < 3; ++b) {
        int32_t saved[4];
        memcpy(saved, held + 4 * 3, sizeof saved);
        memcpy(held + 4 * 3, bad_rows[b], sizeof saved);
        for (int k = 0; k < 3; ++k) {
            SPCONV_ASSERT_FAILS(spconv_rulebook_build_on(NULL, source, 0, &next[k], &rb),
                                SPCONV_ERR_OUT_OF_RANGE, "row 3");
            assert_null(rb);
        }
        memcpy(held + 4 * 3, saved, sizeof saved);
    }
    spconv_rulebook_release(source);
    spconv_tensor_release(indices);
    free(rows);
}

int main(void) {
    spconv_test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_and_accessors),
        cmocka_unit_test(test_create_errors),
        cmocka_unit_test(test_validate_names_first_bad_row),
        cmocka_unit_test(test_subm_rulebook_is_reused),
        cmocka_unit_test(test_geometry_mismatch),
        cmocka_unit_test(test_regular_rulebook_and_inverse_by_key),
        cmocka_unit_test(test_inverse_compares_site_contents),
        cmocka_unit_test(test_from_rulebook_errors),
        cmocka_unit_test(test_cache_reports_bad_rows),
        cmocka_unit_test(test_known_sites_give_the_same_rulebooks),
        cmocka_unit_test(test_build_on_a_rulebook_side),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
