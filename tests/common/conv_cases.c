/* Randomly drawn conv problems with their dense oracles (see conv_cases.h). */
#include "common/conv_cases.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/conv_helpers.h"

static void *case_alloc(size_t count, size_t size) {
    void *p = calloc(count == 0 ? 1 : count, size);
    assert_non_null(p);
    return p;
}

const char *conv_case_text(const conv_case *c, char *buf, size_t size) {
    static const char *const kinds[] = {"regular", "subm", "transposed", "inverse"};
    const spconv_conv_params *p = &c->params;
    snprintf(buf, size,
             "%s k(%lld,%lld,%lld) s(%lld,%lld,%lld) p(%lld,%lld,%lld) d(%lld,%lld,%lld) "
             "op(%lld,%lld,%lld) batch %lld shape (%lld,%lld,%lld) %lld sites/batch C %lld->%lld",
             kinds[p->kind], (long long)p->kernel[0], (long long)p->kernel[1],
             (long long)p->kernel[2], (long long)p->stride[0], (long long)p->stride[1],
             (long long)p->stride[2], (long long)p->padding[0], (long long)p->padding[1],
             (long long)p->padding[2], (long long)p->dilation[0], (long long)p->dilation[1],
             (long long)p->dilation[2], (long long)p->output_padding[0],
             (long long)p->output_padding[1], (long long)p->output_padding[2], (long long)c->batch,
             (long long)c->shape[0], (long long)c->shape[1], (long long)c->shape[2],
             (long long)c->n_per_batch, (long long)c->c_in, (long long)c->c_out);
    return buf;
}

spconv_conv_params conv_case_random_params(spconv_conv_kind kind, const int64_t shape[3],
                                           int odd_subm_kernels) {
    spconv_conv_params p = spconv_conv_params_default(kind);
    int64_t out_shape[3];
    int ok;
    do {
        for (int a = 0; a < 3; ++a) {
            p.kernel[a] = odd_subm_kernels && kind == SPCONV_CONV_SUBM
                              ? 2 * spconv_test_rand_int(0, 2) + 1
                              : spconv_test_rand_int(1, 4);
            p.stride[a] = spconv_test_rand_int(1, 3);
            p.padding[a] = spconv_test_rand_int(0, 2);
            p.dilation[a] = spconv_test_rand_int(1, 3);
            int64_t limit = p.stride[a] > p.dilation[a] ? p.stride[a] : p.dilation[a];
            p.output_padding[a] =
                kind == SPCONV_CONV_TRANSPOSED ? spconv_test_rand_int(0, limit - 1) : 0;
        }
        oracle_geometry g = oracle_geometry_from_params(&p);
        ok = kind == SPCONV_CONV_TRANSPOSED ? oracle_transposed_shape(&g, shape, out_shape)
                                            : oracle_regular_shape(&g, shape, out_shape);
    } while (!ok);
    return p;
}

void conv_case_expect_close(const conv_case *c, const char *what, const double *got,
                            const double *expected, int64_t n, double tolerance) {
    double err = oracle_rel_error(got, expected, n);
    if (!(err <= tolerance)) {
        char text[512];
        fail_msg("%s: %s: normalised error %.3g > %.3g", conv_case_text(c, text, sizeof text), what,
                 err, tolerance);
    }
}

void conv_case_expect_close_tensors(const conv_case *c, const char *what, spconv_tensor **got,
                                    spconv_tensor **want, int count, double tolerance) {
    for (int j = 0; j < count; ++j) {
        int64_t n;
        double *a = conv_read(got[j], &n), *b = conv_read(want[j], NULL);
        conv_case_expect_close(c, what, a, b, n, tolerance);
        free(a);
        free(b);
        spconv_tensor_release(got[j]);
        spconv_tensor_release(want[j]);
    }
}

spconv_tensor *conv_case_features(const conv_case *c, spconv_dtype dtype) {
    int64_t sizes[2] = {c->n_in, c->c_in};
    return conv_tensor(dtype, 2, sizes, c->x);
}

spconv_tensor *conv_case_weight(const conv_case *c, spconv_dtype dtype) {
    int64_t sizes[3] = {c->kernel_volume, c->c_in, c->c_out};
    return conv_tensor(dtype, 3, sizes, c->w);
}

spconv_tensor *conv_case_grad_out(const conv_case *c, spconv_dtype dtype, const double *dy) {
    int64_t sizes[2] = {c->n_out, c->c_out};
    return conv_tensor(dtype, 2, sizes, dy);
}

conv_case conv_case_make(spconv_conv_params params, const int64_t shape[3], int64_t batch,
                         int64_t n_per_batch, int64_t c_in, int64_t c_out) {
    conv_case c;
    memset(&c, 0, sizeof c);
    c.params = params;
    memcpy(c.shape, shape, sizeof c.shape);
    c.batch = batch;
    c.n_per_batch = n_per_batch;
    c.c_in = c_in;
    c.c_out = c_out;
    return c;
}

/* Rows of a rulebook's index tensor and their cells in a grid of @p shape. */
static int32_t *read_sites(const spconv_tensor *t, const int64_t shape[3], int64_t **cells) {
    int32_t *rows = conv_read_i32(t);
    int64_t n = spconv_tensor_size(t, 0);
    *cells = case_alloc((size_t)n, sizeof(int64_t));
    for (int64_t i = 0; i < n; ++i) (*cells)[i] = oracle_cell(rows + i * 4, shape);
    return rows;
}

/* The library's output sites must be the oracle's active output cells, sorted by (b, z, y, x). */
static void check_sorted_sites(const conv_case *c) {
    int64_t active = 0, cells = c->batch * oracle_cells(c->links.out_shape);
    for (int64_t i = 0; i < cells; ++i) active += c->links.out_active[i];
    char text[512];
    if (active != c->n_out)
        fail_msg("%s: the rulebook has %lld output sites, the dense oracle %lld",
                 conv_case_text(c, text, sizeof text), (long long)c->n_out, (long long)active);
    for (int64_t o = 0; o < c->n_out; ++o) {
        if (!c->links.out_active[c->out_cells[o]])
            fail_msg("%s: output row %lld is not an active cell of the oracle",
                     conv_case_text(c, text, sizeof text), (long long)o);
        if (o > 0 && c->out_cells[o] <= c->out_cells[o - 1])
            fail_msg("%s: output rows %lld and %lld are not in increasing (b, z, y, x) order",
                     conv_case_text(c, text, sizeof text), (long long)o - 1, (long long)o);
    }
}

static void check_same_rows(const conv_case *c, const int32_t *a, const int32_t *b, int64_t n,
                            const char *what) {
    char text[512];
    if (memcmp(a, b, (size_t)n * 4 * sizeof(int32_t)) != 0)
        fail_msg("%s: %s", conv_case_text(c, text, sizeof text), what);
}

static void check_out_shape(const conv_case *c, const int64_t expected[3]) {
    int64_t got[3];
    spconv_rulebook_out_shape(c->rb, got);
    char text[512];
    if (memcmp(got, expected, sizeof got) != 0)
        fail_msg("%s: rulebook out shape (%lld, %lld, %lld), oracle (%lld, %lld, %lld)",
                 conv_case_text(c, text, sizeof text), (long long)got[0], (long long)got[1],
                 (long long)got[2], (long long)expected[0], (long long)expected[1],
                 (long long)expected[2]);
}

/* Rulebook, sites and oracle links of an INVERSE case: the regular conv R on random sites X,
 * its inverse; inputs are R's outputs Y, outputs are X again. */
static void setup_inverse(conv_case *c, spconv_context *ctx, const int32_t *sites, int64_t n) {
    spconv_conv_params regular = c->params;
    regular.kind = SPCONV_CONV_REGULAR;
    spconv_rulebook *forward = conv_build(ctx, sites, n, c->shape, c->batch, &regular);
    SPCONV_ASSERT_OK(spconv_rulebook_inverse(forward, &c->rb));
    int64_t y_shape[3];
    spconv_rulebook_out_shape(forward, y_shape);
    spconv_rulebook_release(forward);
    c->in_rows = read_sites(spconv_rulebook_in_indices(c->rb), y_shape, &c->in_cells);
    c->out_rows = read_sites(spconv_rulebook_out_indices(c->rb), c->shape, &c->out_cells);
    c->n_in = spconv_rulebook_num_in(c->rb);
    c->n_out = spconv_rulebook_num_out(c->rb);
    assert_int_equal(c->n_out, n);
    check_same_rows(c, c->out_rows, sites, n, "inverse outputs differ from the original sites");
    unsigned char *active = case_alloc((size_t)(c->batch * oracle_cells(y_shape)), 1);
    for (int64_t i = 0; i < c->n_in; ++i) active[c->in_cells[i]] = 1;
    oracle_geometry g = oracle_geometry_from_params(&regular);
    oracle_links_build(&c->links, 1, &g, c->batch, y_shape, c->shape, active);
    free(active);
}

/* Rulebook, sites and oracle links of a REGULAR, SUBM or TRANSPOSED case on sites X. */
static void setup_direct(conv_case *c, spconv_context *ctx, const int32_t *sites, int64_t n) {
    c->rb = conv_build(ctx, sites, n, c->shape, c->batch, &c->params);
    oracle_geometry g = oracle_geometry_from_params(&c->params);
    int transposed = c->params.kind == SPCONV_CONV_TRANSPOSED, ok;
    int64_t out_shape[3];
    ok = transposed ? oracle_transposed_shape(&g, c->shape, out_shape)
                    : oracle_regular_shape(&g, c->shape, out_shape);
    assert_true(ok);
    check_out_shape(c, out_shape);
    c->in_rows = read_sites(spconv_rulebook_in_indices(c->rb), c->shape, &c->in_cells);
    c->out_rows = read_sites(spconv_rulebook_out_indices(c->rb), out_shape, &c->out_cells);
    c->n_in = spconv_rulebook_num_in(c->rb);
    c->n_out = spconv_rulebook_num_out(c->rb);
    assert_int_equal(c->n_in, n);
    check_same_rows(c, c->in_rows, sites, n, "rulebook inputs differ from the sites given");
    unsigned char *active = case_alloc((size_t)(c->batch * oracle_cells(c->shape)), 1);
    for (int64_t i = 0; i < n; ++i) active[c->in_cells[i]] = 1;
    oracle_links_build(&c->links, transposed, &g, c->batch, c->shape, out_shape, active);
    free(active);
    if (c->params.kind == SPCONV_CONV_SUBM) {
        assert_int_equal(c->n_out, n);
        check_same_rows(c, c->out_rows, sites, n, "subm outputs differ from the input sites");
    } else {
        check_sorted_sites(c);
    }
}

/* Cell -> row map of @p n rows at @p cells in a grid of @p grid_cells cells. */
static int64_t *row_map(const int64_t *cells, int64_t n, int64_t grid_cells) {
    int64_t *map = case_alloc((size_t)grid_cells, sizeof(int64_t));
    for (int64_t i = 0; i < grid_cells; ++i) map[i] = -1;
    for (int64_t i = 0; i < n; ++i) map[cells[i]] = i;
    return map;
}

void conv_case_setup(conv_case *c, spconv_context *ctx) {
    int64_t n = c->batch * c->n_per_batch;
    int32_t *sites = oracle_random_sites(c->batch, c->shape, c->n_per_batch);
    /* Rulebooks do not depend on threads (the rulebook tests check that); one thread keeps
     * thousands of small builds from spinning OpenMP workers. */
    spconv_context *single = ctx == NULL ? conv_context(1) : NULL;
    if (c->params.kind == SPCONV_CONV_INVERSE)
        setup_inverse(c, ctx != NULL ? ctx : single, sites, n);
    else
        setup_direct(c, ctx != NULL ? ctx : single, sites, n);
    spconv_context_destroy(single);
    free(sites);
    c->kernel_volume = spconv_rulebook_kernel_volume(c->rb);
    c->in_row_of_cell = row_map(c->in_cells, c->n_in, c->batch * oracle_cells(c->links.in_shape));
    c->out_row_of_cell =
        row_map(c->out_cells, c->n_out, c->batch * oracle_cells(c->links.out_shape));
    c->x = conv_random_values(c->n_in * c->c_in, -1.0, 1.0);
    c->w = conv_random_values(c->kernel_volume * c->c_in * c->c_out, -1.0, 1.0);
    c->bias = conv_random_values(c->c_out, -1.0, 1.0);
}

void conv_case_free(conv_case *c) {
    spconv_rulebook_release(c->rb);
    free(c->in_rows);
    free(c->out_rows);
    free(c->in_cells);
    free(c->out_cells);
    free(c->in_row_of_cell);
    free(c->out_row_of_cell);
    free(c->x);
    free(c->w);
    free(c->bias);
    oracle_links_free(&c->links);
    c->rb = NULL;
    c->in_rows = c->out_rows = NULL;
    c->in_cells = c->out_cells = c->in_row_of_cell = c->out_row_of_cell = NULL;
    c->x = c->w = c->bias = NULL;
}

void conv_case_oracle_forward(const conv_case *c, double *y) {
    oracle_conv_forward(&c->links, c->c_in, c->c_out, c->x, c->in_row_of_cell, c->w, c->bias,
                        c->out_row_of_cell, c->n_out, y);
}

void conv_case_oracle_backward(const conv_case *c, const double *dy, double *dx, double *dw,
                               double *db) {
    oracle_conv_backward(&c->links, c->c_in, c->c_out, c->x, c->in_row_of_cell, c->n_in, c->w, dy,
                         c->out_row_of_cell, c->n_out, dx, dw, db);
}
