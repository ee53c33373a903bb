/* The per-element logic of the CUDA element-wise kernels (cuda/strided_index.h), run on the CPU:
 * offsets of every element of random permuted / sliced / expanded layouts against a brute-force
 * multi-index computation, dim merging, 64-bit offsets and the grid size. Needs no GPU and no
 * CUDA build, so CI always checks what the kernels compute. */
#include <inttypes.h>
#include <stdio.h>

#include "common/test_util.h"
#include "cuda/strided_index.h"

/* Random strides for `sizes`: a random dim order laid out contiguously over a base whose dims
 * are 1..3 times larger (slicing with a step), plus some stride-0 (expanded) dims. */
static void random_strides(int ndim, const int64_t *sizes, int64_t *strides) {
    int order[SPCONV_MAX_DIMS];
    for (int d = 0; d < ndim; ++d) order[d] = d;
    for (int d = ndim - 1; d > 0; --d) {
        int other = (int)spconv_test_rand_int(0, d);
        int kept = order[d];
        order[d] = order[other];
        order[other] = kept;
    }
    int64_t stride = spconv_test_rand_int(1, 2);
    for (int k = ndim - 1; k >= 0; --k) {
        int d = order[k];
        strides[d] = stride;
        stride *= sizes[d] * spconv_test_rand_int(1, 3);
    }
    for (int d = 0; d < ndim; ++d)
        if (spconv_test_rand_int(0, 4) == 0) strides[d] = 0;
}

/* Offset of the element at row-major number `linear`, by decomposing it into a multi-index. */
static int64_t brute_force_offset(int ndim, const int64_t *sizes, const int64_t *strides,
                                  int64_t linear) {
    int64_t offset = 0;
    for (int d = ndim - 1; d >= 0; --d) {
        offset += (linear % sizes[d]) * strides[d];
        linear /= sizes[d];
    }
    return offset;
}

static int64_t product(int ndim, const int64_t *sizes) {
    int64_t numel = 1;
    for (int d = 0; d < ndim; ++d) numel *= sizes[d];
    return numel;
}

static void check_every_offset(int ndim, const int64_t *sizes, const int64_t *dst_strides,
                               const int64_t *src_strides) {
    spconv__strided_pair pair;
    spconv__strided_pair_init(&pair, ndim, sizes, dst_strides, src_strides);
    assert_true(pair.ndim >= 1 && pair.ndim <= (ndim > 0 ? ndim : 1));
    int64_t numel = product(ndim, sizes);
    assert_int_equal(product(pair.ndim, pair.sizes), numel);
    for (int64_t i = 0; i < numel; ++i) {
        int64_t dst, src;
        spconv__strided_pair_offsets(&pair, i, &dst, &src);
        int64_t want_dst = brute_force_offset(ndim, sizes, dst_strides, i);
        int64_t want_src =
            src_strides != NULL ? brute_force_offset(ndim, sizes, src_strides, i) : 0;
        if (dst != want_dst || src != want_src) {
            print_error("element %" PRId64 " of %d-d shape: offsets (%" PRId64 ", %" PRId64
                        ") but brute force says (%" PRId64 ", %" PRId64 ")\n",
                        i, ndim, dst, src, want_dst, want_src);
            fail();
        }
    }
}

static void test_offsets_match_brute_force_on_random_layouts(void **state) {
    (void)state;
    for (int trial = 0; trial < 2000; ++trial) {
        int ndim = (int)spconv_test_rand_int(0, SPCONV_MAX_DIMS);
        int64_t sizes[SPCONV_MAX_DIMS], dst_strides[SPCONV_MAX_DIMS], src_strides[SPCONV_MAX_DIMS];
        /* Keep numel small enough to visit every element: at most 4 dims larger than 1. */
        for (int d = 0; d < ndim; ++d)
            sizes[d] = d < 4 ? spconv_test_rand_int(1, 6) : spconv_test_rand_int(1, 2);
        random_strides(ndim, sizes, dst_strides);
        random_strides(ndim, sizes, src_strides);
        check_every_offset(ndim, sizes, dst_strides, src_strides);
        check_every_offset(ndim, sizes, dst_strides, NULL);
    }
}

static void test_contiguous_pair_becomes_one_dim(void **state) {
    (void)state;
    const int64_t sizes[4] = {2, 1, 3, 5}, strides[4] = {15, 15, 5, 1};
    spconv__strided_pair pair;
    spconv__strided_pair_init(&pair, 4, sizes, strides, strides);
    assert_int_equal(pair.ndim, 1);
    assert_int_equal(pair.sizes[0], 30);
    assert_int_equal(pair.strides[0][0], 1);
    assert_int_equal(pair.strides[1][0], 1);
    /* A fill has no source; a contiguous destination is still one run. */
    spconv__strided_pair_init(&pair, 4, sizes, strides, NULL);
    assert_int_equal(pair.ndim, 1);
    assert_int_equal(pair.sizes[0], 30);
}

static void test_dims_merge_only_where_both_tensors_allow(void **state) {
    (void)state;
    /* dst contiguous [4, 6]; src is the transpose of a contiguous [6, 4]: no merge possible. */
    const int64_t sizes[2] = {4, 6}, dst_strides[2] = {6, 1}, src_strides[2] = {1, 4};
    spconv__strided_pair pair;
    spconv__strided_pair_init(&pair, 2, sizes, dst_strides, src_strides);
    assert_int_equal(pair.ndim, 2);
    assert_int_equal(pair.sizes[0], 6); /* innermost first */
    assert_int_equal(pair.sizes[1], 4);
    assert_int_equal(pair.strides[1][0], 4);
    assert_int_equal(pair.strides[1][1], 1);
    /* An expanded source (stride 0 in both dims) merges along with a contiguous destination. */
    const int64_t expanded[2] = {0, 0};
    spconv__strided_pair_init(&pair, 2, sizes, dst_strides, expanded);
    assert_int_equal(pair.ndim, 1);
    assert_int_equal(pair.sizes[0], 24);
    assert_int_equal(pair.strides[1][0], 0);
}

static void test_scalar_and_all_ones_are_one_element(void **state) {
    (void)state;
    spconv__strided_pair pair;
    spconv__strided_pair_init(&pair, 0, NULL, NULL, NULL);
    assert_int_equal(pair.ndim, 1);
    assert_int_equal(pair.sizes[0], 1);
    int64_t dst = -1, src = -1;
    spconv__strided_pair_offsets(&pair, 0, &dst, &src);
    assert_int_equal(dst, 0);
    assert_int_equal(src, 0);
    const int64_t ones[3] = {1, 1, 1}, strides[3] = {7, 100, 3};
    spconv__strided_pair_init(&pair, 3, ones, strides, strides);
    assert_int_equal(pair.ndim, 1);
    spconv__strided_pair_offsets(&pair, 0, &dst, &src);
    assert_int_equal(dst, 0);
    assert_int_equal(src, 0);
}

/* Offsets beyond 2^32 elements must not wrap: the kernels index with 64 bits. */
static void test_offsets_past_32_bits(void **state) {
    (void)state;
    const int64_t sizes[3] = {3, 1 << 20, 5000};
    const int64_t dst_strides[3] = {(int64_t)5000 << 20, 5000, 1};
    const int64_t src_strides[3] = {1, 3, (int64_t)3 << 20}; /* the reversed layout */
    spconv__strided_pair pair;
    spconv__strided_pair_init(&pair, 3, sizes, dst_strides, src_strides);
    int64_t numel = product(3, sizes);
    assert_true(numel > ((int64_t)1 << 33));
    const int64_t probes[] = {0, 1, 4999, 5000, ((int64_t)1 << 32) + 12345, numel / 2, numel - 1};
    for (size_t k = 0; k < sizeof probes / sizeof probes[0]; ++k) {
        int64_t dst, src;
        spconv__strided_pair_offsets(&pair, probes[k], &dst, &src);
        assert_int_equal(dst, brute_force_offset(3, sizes, dst_strides, probes[k]));
        assert_int_equal(src, brute_force_offset(3, sizes, src_strides, probes[k]));
    }
}

static void test_grid_blocks(void **state) {
    (void)state;
    assert_int_equal(spconv__grid_blocks(1, 256, 1056), 1);
    assert_int_equal(spconv__grid_blocks(256, 256, 1056), 1);
    assert_int_equal(spconv__grid_blocks(257, 256, 1056), 2);
    assert_int_equal(spconv__grid_blocks((int64_t)1 << 40, 256, 1056), 1056);
    assert_int_equal(spconv__grid_blocks((int64_t)1 << 40, 256, 0), 1);
}

int main(void) {
    spconv_test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_offsets_match_brute_force_on_random_layouts),
        cmocka_unit_test(test_contiguous_pair_becomes_one_dim),
        cmocka_unit_test(test_dims_merge_only_where_both_tensors_allow),
        cmocka_unit_test(test_scalar_and_all_ones_are_one_element),
        cmocka_unit_test(test_offsets_past_32_bits),
        cmocka_unit_test(test_grid_blocks),
    };
    return cmocka_run_group_tests_name("cuda_logic", tests, NULL, NULL);
}
