/* Helpers for the rulebook and sparse-tensor tests: random unique sites, index tensors, and
 * checks of rulebooks against the geometry rule and against each other. Failures go through
 * CMocka's assertions. */
#ifndef SPCONV_TEST_RULEBOOK_TESTING_H
#define SPCONV_TEST_RULEBOOK_TESTING_H

#include <stdint.h>

#include "common/test_util.h"

/** @p per_batch distinct random sites in each batch of [0, @p batch) inside @p shape, all rows in
 *  random order: a malloc'd int32 [batch * per_batch, 4] array. */
int32_t *spconv_test_random_sites(int64_t batch, const int64_t shape[3], int64_t per_batch);

/** A random valid parameter set of @p kind on @p shape, independent per axis: kernel 1-4 (SUBM:
 *  1, 3 or 5), stride 1-3, padding 0-2, dilation 1-3, and for TRANSPOSED an output padding below
 *  max(stride, dilation). */
spconv_conv_params spconv_test_random_params(spconv_conv_kind kind, const int64_t shape[3]);

/** A contiguous CPU int32 [n, 4] tensor holding a copy of @p rows. */
spconv_tensor *spconv_test_indices_tensor(const int32_t *rows, int64_t n);

/** 1 when input coordinates @p in reach output coordinates @p out through kernel offset @p k
 *  under docs/design.md's rule for @p params (INVERSE: the rule of the regular conv, roles swapped). */
int spconv_test_pair_follows_rule(const spconv_conv_params *params, const int32_t *in,
                                  const int32_t *out, int64_t k);

/** Checks that hold for every built rulebook: sizes and offsets consistent, rows in range, every
 *  pair obeys the geometry rule, no out_row twice within an offset; for regular and transposed
 *  convs outputs strictly increasing in (b, z, y, x) and pairs in increasing out_row within an
 *  offset; for subm outputs = inputs and a centre of identity pairs. */
void spconv_test_check_rulebook(const spconv_rulebook *rb);

/** Fail unless @p a and @p b are identical: geometry, sites, offsets and pairs. */
void spconv_test_assert_rulebooks_equal(const spconv_rulebook *a, const spconv_rulebook *b);

#endif /* SPCONV_TEST_RULEBOOK_TESTING_H */
