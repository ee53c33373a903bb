/* Dense oracles for the conv tests, in double, written from docs/design.md's geometry alone (no
 * rulebook code): the sparse input is a dense grid that is zero outside the sites, convolved
 * brute-force over the grid, and read at the output sites.
 *
 * A cell index is ((b * D + z) * H + y) * W + x. A dense conv is described by its "links": every
 * (input cell, kernel offset, output cell) it relates, found by walking the whole grid, kept when
 * the input cell is active: inactive cells hold zeros and contribute nothing, so skipping them is
 * exact, and the output cells that some link reaches are the active outputs of the sparse conv.
 * Channel values live in rows (one per site) found through cell -> row maps, so that wide
 * channels on large grids do not need dense buffers of every cell; grids with channels
 * ([B, D, H, W, C], channels last) are used by the max-pooling oracle. */
#ifndef SPCONV_TEST_CONV_ORACLE_H
#define SPCONV_TEST_CONV_ORACLE_H

#include <stdint.h>

#include "spconv/rulebook.h"

typedef struct oracle_geometry {
    int64_t kernel[3], stride[3], padding[3], dilation[3], output_padding[3];
} oracle_geometry;

/* Geometry from rulebook params; for SUBM stride 1 and padding (K/2)*d as the definition says. */
oracle_geometry oracle_geometry_from_params(const spconv_conv_params *params);

/* Output spatial shape of a regular conv (floor division) or a transposed conv; 0 when an axis
 * is empty. */
int oracle_regular_shape(const oracle_geometry *g, const int64_t in[3], int64_t out[3]);
int oracle_transposed_shape(const oracle_geometry *g, const int64_t in[3], int64_t out[3]);

typedef struct oracle_links {
    int64_t batch, in_shape[3], out_shape[3], kernel_volume;
    int64_t count;
    int64_t *in_cell, *out_cell, *offset; /* [count] each */
    unsigned char *out_active;            /* [batch * out cells] */
} oracle_links;

/* Links of the regular conv (gather form: every output cell, every offset, input cell
 * o*s - p + k*d) or the transposed conv (scatter form: every input cell, every offset, output
 * cell i*s - p + k*d) from input cells marked in @p in_active [batch * in cells] into an output
 * grid of @p out_shape. Aborts the test program on allocation failure. */
void oracle_links_build(oracle_links *links, int transposed, const oracle_geometry *g,
                        int64_t batch, const int64_t in_shape[3], const int64_t out_shape[3],
                        const unsigned char *in_active);
void oracle_links_free(oracle_links *links);

static inline int64_t oracle_cells(const int64_t shape[3]) {
    return shape[0] * shape[1] * shape[2];
}

/* Cell of coordinate row (b, z, y, x) in a grid of @p shape. */
static inline int64_t oracle_cell(const int32_t *row, const int64_t shape[3]) {
    return ((row[0] * shape[0] + row[1]) * shape[1] + row[2]) * shape[2] + row[3];
}

/* The dense conv read at the output cells that are rows: y[o] = bias + sum over the links into
 * cell o of x[i] @ W[k]. Rows stand for cells through maps from a cell to its row (-1: no row):
 * x [rows of in_row, C_in] holds the input cells' values (cells without a row are zero, which is
 * why links only start at rows), y [n_out, C_out] receives the cells of out_row (overwritten).
 * w [KV, C_in, C_out], bias [C_out] or NULL. */
void oracle_conv_forward(const oracle_links *links, int64_t c_in, int64_t c_out, const double *x,
                         const int64_t *in_row, const double *w, const double *bias,
                         const int64_t *out_row, int64_t n_out, double *y);

/* Hand-derived gradients of oracle_conv_forward for dy [n_out, C_out] at the cells of out_row
 * (zero elsewhere): dx[i] += dy[o] @ W[k]^T, dw[k] += x[i]^T dy[o], db = sum of dy. dx is
 * [n_in, C_in] at the cells of in_row. Outputs are overwritten; any may be NULL. */
void oracle_conv_backward(const oracle_links *links, int64_t c_in, int64_t c_out, const double *x,
                          const int64_t *in_row, int64_t n_in, const double *w, const double *dy,
                          const int64_t *out_row, int64_t n_out, double *dx, double *dw,
                          double *db);

/* Dense max pooling: y[o, c] = max over the window's in-range cells of x (inactive cells are 0).
 * Only for output cells marked in links->out_active; others are left alone. */
void oracle_dense_maxpool(const oracle_links *links, const oracle_geometry *g, int64_t channels,
                          const double *x, double *y);

/* Brute-force sparse max pooling over sites only: for each output site (rows of out_idx), every
 * input site inside its window per docs/design.md's rule; the maximum, ties to the smallest offset k.
 * y [n_out, C], argmax [n_out, C] (-1 when no input). */
void oracle_sparse_maxpool(const oracle_geometry *g, const int32_t *in_idx, int64_t n_in,
                           const double *x, const int32_t *out_idx, int64_t n_out, int64_t channels,
                           double *y, int32_t *argmax);

/* @p n_per_batch unique random sites per batch in random order: rows (b, z, y, x). The caller
 * frees the result. */
int32_t *oracle_random_sites(int64_t batch, const int64_t shape[3], int64_t n_per_batch);

/* Largest |a[i] - b[i]| over n values divided by max(max |b|, tiny): the normalised error. */
double oracle_rel_error(const double *a, const double *b, int64_t n);

#endif /* SPCONV_TEST_CONV_ORACLE_H */
