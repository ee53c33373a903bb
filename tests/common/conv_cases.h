/* One randomly drawn conv problem with its rulebook (built by the library) and its dense oracle
 * (built from the geometry alone), shared by the forward and gradient tests.
 *
 * Setup draws unique random sites, builds the rulebook with spconv_rulebook_build (and
 * spconv_rulebook_inverse for INVERSE), and checks the rulebook's output sites against the
 * oracle before anything else: for a regular or transposed conv they must be exactly the
 * oracle's active output cells in (b, z, y, x) order; for subm the input sites in input order;
 * for inverse the original input sites in their order. */
#ifndef SPCONV_TEST_CONV_CASES_H
#define SPCONV_TEST_CONV_CASES_H

#include <stddef.h>
#include <stdint.h>

#include "common/conv_oracle.h"
#include "common/test_util.h"

typedef struct conv_case {
    /* chosen by the test; for INVERSE, params are those of the regular conv being inverted
     * (kind INVERSE) and c_in / c_out the inverse conv's own channels */
    spconv_conv_params params;
    int64_t shape[3], batch, n_per_batch, c_in, c_out;

    /* filled by conv_case_setup */
    spconv_rulebook *rb;
    int64_t n_in, n_out, kernel_volume;
    int32_t *in_rows, *out_rows;   /* sites of the conv's input and output rows */
    int64_t *in_cells, *out_cells; /* their cells in the oracle's grids */
    int64_t *in_row_of_cell;       /* [batch * input grid cells]: row of a cell, or -1 */
    int64_t *out_row_of_cell;      /* [batch * output grid cells] */
    double *x, *w, *bias;          /* random operands [n_in, C_in], [KV, C_in, C_out], [C_out] */
    oracle_links links;
} conv_case;

/* A case to set up (every filled-in field empty). */
conv_case conv_case_make(spconv_conv_params params, const int64_t shape[3], int64_t batch,
                         int64_t n_per_batch, int64_t c_in, int64_t c_out);

/* A random geometry for a case of @p kind over @p shape: per axis kernel 1..4 (odd 1..5 for a
 * subm conv when @p odd_subm_kernels), stride 1..3, padding 0..2, dilation 1..3, and for a
 * transposed conv output padding below max(stride, dilation); redrawn until the output of
 * @p shape is not empty. */
spconv_conv_params conv_case_random_params(spconv_conv_kind kind, const int64_t shape[3],
                                           int odd_subm_kernels);

/* Draw sites and operands, build the rulebook with @p ctx (may be NULL), check its sites. */
void conv_case_setup(conv_case *c, spconv_context *ctx);
void conv_case_free(conv_case *c);

/* "regular k(3,3,3) s(2,2,2) p(1,1,1) d(1,1,1) op(0,0,0) batch 2 shape (19,18,17) C 32->64". */
const char *conv_case_text(const conv_case *c, char *buf, size_t size);

/* Fails the running test, naming the case and @p what, when the normalised error of @p got
 * against @p expected (n values) exceeds @p tolerance. */
void conv_case_expect_close(const conv_case *c, const char *what, const double *got,
                            const double *expected, int64_t n, double tolerance);

/* Holds each of the @p count tensors in @p got to the one in @p want with conv_case_expect_close,
 * then releases both. */
void conv_case_expect_close_tensors(const conv_case *c, const char *what, spconv_tensor **got,
                                    spconv_tensor **want, int count, double tolerance);

/* The case's operands as new tensors of @p dtype: features [n_in, C_in] from c->x, weight
 * [KV, C_in, C_out] from c->w, grad_out [n_out, C_out] from @p dy. */
spconv_tensor *conv_case_features(const conv_case *c, spconv_dtype dtype);
spconv_tensor *conv_case_weight(const conv_case *c, spconv_dtype dtype);
spconv_tensor *conv_case_grad_out(const conv_case *c, spconv_dtype dtype, const double *dy);

/* Oracle output rows [n_out, C_out] (bias included). */
void conv_case_oracle_forward(const conv_case *c, double *y);

/* Oracle gradients for grad_out rows @p dy [n_out, C_out]: dx [n_in, C_in], dw [KV, C_in, C_out],
 * db [C_out]. */
void conv_case_oracle_backward(const conv_case *c, const double *dy, double *dx, double *dw,
                               double *db);

#endif /* SPCONV_TEST_CONV_CASES_H */
