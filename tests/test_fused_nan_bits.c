/* NaN bits of the fused kernels (conv/fused.h) do not depend on the code path, and so not on the
 * thread count. When a sum and the value it is added to are both NaN with different signs, an
 * x86 add returns one of them depending on its operands' order, which the compiler may swap: a
 * masked column tile of the 6-row block kept y's NaN while the one-row tail kept the product's,
 * and which rows take the tail depends on the blocks, hence on the thread count (found by a
 * hostile-input pass). The kernels now store every NaN result as the default quiet NaN. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "conv/fused.h"
#include "spconv/spconv.h"

static float float_bits(uint32_t b) {
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* Row 0 of a 7-row call goes through the 6-row block, row 6 through the tail: same inputs, so
 * the same bits. x = (inf, -inf) makes the product sum the default NaN (sign set on x86); y
 * holds the positive quiet NaN. */
static void test_fused_block_and_tail_agree_on_nan(void **state) {
    (void)state;
    if (!spconv__fused_available()) skip();
    const int64_t rows = 7, k = 2, n = 1;
    float x[14], y[7], w[2] = {1.0f, 1.0f}, packed[64];
    for (int r = 0; r < rows; ++r) {
        x[2 * r] = INFINITY;
        x[2 * r + 1] = -INFINITY;
        y[r] = float_bits(0x7fc00000u);
    }
    assert_true(spconv__fused_packed_bytes(SPCONV_F32, k, n) <= sizeof packed);
    spconv__fused_pack(SPCONV_F32, w, n, 0, k, n, packed);
    spconv__fused_rows(SPCONV_F32, rows, x, NULL, 0, y, NULL, 0, k, n, packed, 0);
    uint32_t block, tail;
    memcpy(&block, &y[0], sizeof block);
    memcpy(&tail, &y[6], sizeof tail);
    assert_true(isnan(y[0]) && isnan(y[6]));
    assert_int_equal(block, tail);
}

/* The same through the public forward: a (1, 1, 2) kernel of stride 2 over one line of 1200
 * sites; the even site's row (NaN, 0) gives +NaN at offset 0, the odd one's (inf, -inf) the
 * default NaN at offset 1. One thread and two give different blocks of the 600 out rows. */
static void test_forward_nan_bits_do_not_depend_on_threads(void **state) {
    (void)state;
    enum { SITES = 1200 };
    static int32_t rows[SITES * 4];
    static float feats[SITES * 2];
    for (int i = 0; i < SITES; ++i) {
        rows[4 * i] = 0, rows[4 * i + 1] = 0, rows[4 * i + 2] = 0, rows[4 * i + 3] = i;
        feats[2 * i] = i % 2 ? INFINITY : float_bits(0x7fc00000u);
        feats[2 * i + 1] = i % 2 ? -INFINITY : 0.0f;
    }
    const int64_t shape[3] = {1, 1, SITES}, isz[2] = {SITES, 4}, fsz[2] = {SITES, 2},
                  wsz[3] = {2, 2, 1};
    const float wts[4] = {1, 1, 1, 1};
    spconv_tensor *indices = NULL, *features = NULL, *weight = NULL, *out1 = NULL, *out2 = NULL;
    assert_int_equal(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_I32, 2, isz, rows, &indices),
                     SPCONV_OK);
    assert_int_equal(
        spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_F32, 2, fsz, feats, &features),
        SPCONV_OK);
    assert_int_equal(spconv_tensor_from_host(NULL, spconv_cpu(), SPCONV_F32, 3, wsz, wts, &weight),
                     SPCONV_OK);
    spconv_conv_params p = spconv_conv_params_default(SPCONV_CONV_REGULAR);
    p.kernel[0] = p.kernel[1] = 1, p.kernel[2] = 2;
    p.stride[2] = 2;
    spconv_context *c1 = NULL, *c2 = NULL;
    assert_int_equal(spconv_context_create(spconv_cpu(), &c1), SPCONV_OK);
    assert_int_equal(spconv_context_create(spconv_cpu(), &c2), SPCONV_OK);
    assert_int_equal(spconv_context_set_num_threads(c1, 1), SPCONV_OK);
    assert_int_equal(spconv_context_set_num_threads(c2, 2), SPCONV_OK);
    spconv_rulebook *rb = NULL;
    assert_int_equal(spconv_rulebook_build(c1, indices, shape, 1, &p, &rb), SPCONV_OK);
    assert_int_equal(spconv_rulebook_num_out(rb), SITES / 2);
    assert_int_equal(spconv_conv_forward(c1, rb, features, weight, NULL, &out1), SPCONV_OK);
    assert_int_equal(spconv_conv_forward(c2, rb, features, weight, NULL, &out2), SPCONV_OK);
    const float *a = spconv_tensor_data(out1), *b = spconv_tensor_data(out2);
    int differ = 0;
    for (int r = 0; r < SITES / 2; ++r) {
        assert_true(isnan(a[r]) && isnan(b[r]));
        differ += memcmp(&a[r], &b[r], sizeof a[r]) != 0;
    }
    assert_int_equal(differ, 0);
    spconv_tensor_release(out1);
    spconv_tensor_release(out2);
    spconv_rulebook_release(rb);
    spconv_context_destroy(c1);
    spconv_context_destroy(c2);
    spconv_tensor_release(weight);
    spconv_tensor_release(features);
    spconv_tensor_release(indices);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fused_block_and_tail_agree_on_nan),
        cmocka_unit_test(test_forward_nan_bits_do_not_depend_on_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
