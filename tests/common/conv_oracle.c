/* Dense oracles for the conv tests (see conv_oracle.h). */
#include "common/conv_oracle.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"

static void *oracle_alloc(size_t count, size_t size) {
    void *p = calloc(count == 0 ? 1 : count, size);
    if (p == NULL) {
        fprintf(stderr, "conv_oracle: out of memory (%zu x %zu bytes)\n", count, size);
        abort();
    }
    return p;
}

oracle_geometry oracle_geometry_from_params(const spconv_conv_params *params) {
    oracle_geometry g;
    for (int a = 0; a < 3; ++a) {
        g.kernel[a] = params->kernel[a];
        g.dilation[a] = params->dilation[a];
        g.output_padding[a] = params->output_padding[a];
        int subm = params->kind == SPCONV_CONV_SUBM;
        g.stride[a] = subm ? 1 : params->stride[a];
        g.padding[a] = subm ? (params->kernel[a] / 2) * params->dilation[a] : params->padding[a];
    }
    return g;
}

static int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

int oracle_regular_shape(const oracle_geometry *g, const int64_t in[3], int64_t out[3]) {
    int ok = 1;
    for (int a = 0; a < 3; ++a) {
        int64_t span = in[a] + 2 * g->padding[a] - g->dilation[a] * (g->kernel[a] - 1) - 1;
        out[a] = floor_div(span, g->stride[a]) + 1;
        ok = ok && out[a] > 0;
    }
    return ok;
}

int oracle_transposed_shape(const oracle_geometry *g, const int64_t in[3], int64_t out[3]) {
    int ok = 1;
    for (int a = 0; a < 3; ++a) {
        out[a] = (in[a] - 1) * g->stride[a] - 2 * g->padding[a] +
                 g->dilation[a] * (g->kernel[a] - 1) + 1 + g->output_padding[a];
        ok = ok && out[a] > 0;
    }
    return ok;
}

static void push_link(oracle_links *l, int64_t *capacity, int64_t in_cell, int64_t out_cell,
                      int64_t k) {
    if (l->count == *capacity) {
        *capacity = *capacity * 2 + 1024;
        l->in_cell = realloc(l->in_cell, (size_t)*capacity * sizeof(int64_t));
        l->out_cell = realloc(l->out_cell, (size_t)*capacity * sizeof(int64_t));
        l->offset = realloc(l->offset, (size_t)*capacity * sizeof(int64_t));
        if (l->in_cell == NULL || l->out_cell == NULL || l->offset == NULL) {
            fprintf(stderr, "conv_oracle: out of memory for %lld links\n", (long long)*capacity);
            abort();
        }
    }
    l->in_cell[l->count] = in_cell;
    l->out_cell[l->count] = out_cell;
    l->offset[l->count] = k;
    ++l->count;
    l->out_active[out_cell] = 1;
}

/* Coordinates of cell @p c (without batch) of @p shape. */
static void cell_coords(int64_t c, const int64_t shape[3], int64_t p[3]) {
    p[2] = c % shape[2];
    p[1] = c / shape[2] % shape[1];
    p[0] = c / (shape[1] * shape[2]);
}

static int inside(const int64_t p[3], const int64_t shape[3]) {
    return p[0] >= 0 && p[0] < shape[0] && p[1] >= 0 && p[1] < shape[1] && p[2] >= 0 &&
           p[2] < shape[2];
}

static int64_t flat(int64_t b, const int64_t p[3], const int64_t shape[3]) {
    return ((b * shape[0] + p[0]) * shape[1] + p[1]) * shape[2] + p[2];
}

/* Kernel offset (kz, ky, kx) of offset number k. */
static void offset_coords(int64_t k, const int64_t kernel[3], int64_t kk[3]) {
    kk[2] = k % kernel[2];
    kk[1] = k / kernel[2] % kernel[1];
    kk[0] = k / (kernel[1] * kernel[2]);
}

void oracle_links_build(oracle_links *l, int transposed, const oracle_geometry *g, int64_t batch,
                        const int64_t in_shape[3], const int64_t out_shape[3],
                        const unsigned char *in_active) {
    memset(l, 0, sizeof *l);
    l->batch = batch;
    memcpy(l->in_shape, in_shape, sizeof l->in_shape);
    memcpy(l->out_shape, out_shape, sizeof l->out_shape);
    l->kernel_volume = g->kernel[0] * g->kernel[1] * g->kernel[2];
    l->out_active = oracle_alloc((size_t)(batch * oracle_cells(out_shape)), 1);
    int64_t capacity = 0;
    /* Regular: walk the output grid and look back at the input; transposed: walk the input grid
     * and push forward. Each form is its definition in docs/design.md. */
    const int64_t *walk_shape = transposed ? in_shape : out_shape;
    const int64_t *other_shape = transposed ? out_shape : in_shape;
    for (int64_t b = 0; b < batch; ++b)
        for (int64_t c = 0; c < oracle_cells(walk_shape); ++c) {
            int64_t p[3], q[3], kk[3];
            cell_coords(c, walk_shape, p);
            if (transposed && !in_active[flat(b, p, in_shape)]) continue;
            for (int64_t k = 0; k < l->kernel_volume; ++k) {
                offset_coords(k, g->kernel, kk);
                for (int a = 0; a < 3; ++a)
                    q[a] = p[a] * g->stride[a] - g->padding[a] + kk[a] * g->dilation[a];
                if (!inside(q, other_shape)) continue;
                int64_t in_cell = transposed ? flat(b, p, in_shape) : flat(b, q, in_shape);
                int64_t out_cell = transposed ? flat(b, q, out_shape) : flat(b, p, out_shape);
                if (in_active[in_cell]) push_link(l, &capacity, in_cell, out_cell, k);
            }
        }
}

void oracle_links_free(oracle_links *l) {
    free(l->in_cell);
    free(l->out_cell);
    free(l->offset);
    free(l->out_active);
    memset(l, 0, sizeof *l);
}

void oracle_conv_forward(const oracle_links *l, int64_t c_in, int64_t c_out, const double *x,
                         const int64_t *in_row, const double *w, const double *bias,
                         const int64_t *out_row, int64_t n_out, double *y) {
    for (int64_t o = 0; o < n_out; ++o)
        for (int64_t co = 0; co < c_out; ++co) y[o * c_out + co] = bias != NULL ? bias[co] : 0.0;
    for (int64_t n = 0; n < l->count; ++n) {
        if (out_row[l->out_cell[n]] < 0) continue; /* a cell nobody reads */
        const double *xi = x + in_row[l->in_cell[n]] * c_in, *wk = w + l->offset[n] * c_in * c_out;
        double *yo = y + out_row[l->out_cell[n]] * c_out;
        for (int64_t ci = 0; ci < c_in; ++ci)
            for (int64_t co = 0; co < c_out; ++co) yo[co] += xi[ci] * wk[ci * c_out + co];
    }
}

void oracle_conv_backward(const oracle_links *l, int64_t c_in, int64_t c_out, const double *x,
                          const int64_t *in_row, int64_t n_in, const double *w, const double *dy,
                          const int64_t *out_row, int64_t n_out, double *dx, double *dw,
                          double *db) {
    if (dx != NULL) memset(dx, 0, (size_t)(n_in * c_in) * sizeof(double));
    if (dw != NULL) memset(dw, 0, (size_t)(l->kernel_volume * c_in * c_out) * sizeof(double));
    if (db != NULL) {
        memset(db, 0, (size_t)c_out * sizeof(double));
        for (int64_t o = 0; o < n_out; ++o)
            for (int64_t co = 0; co < c_out; ++co) db[co] += dy[o * c_out + co];
    }
    for (int64_t n = 0; n < l->count; ++n) {
        if (out_row[l->out_cell[n]] < 0) continue; /* its dy is zero */
        const int64_t i = in_row[l->in_cell[n]];
        const double *xi = x + i * c_in, *wk = w + l->offset[n] * c_in * c_out;
        const double *dyo = dy + out_row[l->out_cell[n]] * c_out;
        for (int64_t ci = 0; ci < c_in; ++ci)
            for (int64_t co = 0; co < c_out; ++co) {
                if (dx != NULL) dx[i * c_in + ci] += dyo[co] * wk[ci * c_out + co];
                if (dw != NULL) dw[(l->offset[n] * c_in + ci) * c_out + co] += xi[ci] * dyo[co];
            }
    }
}

void oracle_dense_maxpool(const oracle_links *l, const oracle_geometry *g, int64_t channels,
                          const double *x, double *y) {
    for (int64_t b = 0; b < l->batch; ++b)
        for (int64_t c = 0; c < oracle_cells(l->out_shape); ++c) {
            int64_t p[3], q[3], kk[3], o = b * oracle_cells(l->out_shape) + c;
            if (!l->out_active[o]) continue;
            cell_coords(c, l->out_shape, p);
            for (int64_t ch = 0; ch < channels; ++ch) y[o * channels + ch] = -INFINITY;
            for (int64_t k = 0; k < l->kernel_volume; ++k) {
                offset_coords(k, g->kernel, kk);
                for (int a = 0; a < 3; ++a)
                    q[a] = p[a] * g->stride[a] - g->padding[a] + kk[a] * g->dilation[a];
                if (!inside(q, l->in_shape)) continue;
                const double *xi = x + flat(b, q, l->in_shape) * channels;
                for (int64_t ch = 0; ch < channels; ++ch)
                    if (xi[ch] > y[o * channels + ch]) y[o * channels + ch] = xi[ch];
            }
        }
}

/* Offset number through which input site @p in reaches output site @p out, or -1. */
static int64_t window_offset(const oracle_geometry *g, const int32_t *in, const int32_t *out) {
    if (in[0] != out[0]) return -1;
    int64_t k = 0;
    for (int a = 0; a < 3; ++a) {
        int64_t t = in[a + 1] + g->padding[a] - (int64_t)out[a + 1] * g->stride[a];
        if (t < 0 || t % g->dilation[a] != 0 || t / g->dilation[a] >= g->kernel[a]) return -1;
        k = k * g->kernel[a] + t / g->dilation[a];
    }
    return k;
}

void oracle_sparse_maxpool(const oracle_geometry *g, const int32_t *in_idx, int64_t n_in,
                           const double *x, const int32_t *out_idx, int64_t n_out, int64_t channels,
                           double *y, int32_t *argmax) {
    int64_t *best_k = oracle_alloc((size_t)channels, sizeof(int64_t));
    for (int64_t o = 0; o < n_out; ++o) {
        for (int64_t ch = 0; ch < channels; ++ch) {
            y[o * channels + ch] = -INFINITY;
            argmax[o * channels + ch] = -1;
            best_k[ch] = -1;
        }
        for (int64_t i = 0; i < n_in; ++i) {
            int64_t k = window_offset(g, in_idx + i * 4, out_idx + o * 4);
            if (k < 0) continue;
            for (int64_t ch = 0; ch < channels; ++ch) {
                double v = x[i * channels + ch], *best = &y[o * channels + ch];
                if (best_k[ch] < 0 || v > *best || (v == *best && k < best_k[ch])) {
                    *best = v;
                    best_k[ch] = k;
                    argmax[o * channels + ch] = (int32_t)i;
                }
            }
        }
    }
    free(best_k);
}

int32_t *oracle_random_sites(int64_t batch, const int64_t shape[3], int64_t n_per_batch) {
    const int64_t cells = oracle_cells(shape), n = batch * n_per_batch;
    int64_t *pool = oracle_alloc((size_t)cells, sizeof(int64_t));
    int32_t *rows = oracle_alloc((size_t)n * 4, sizeof(int32_t));
    for (int64_t b = 0; b < batch; ++b) {
        for (int64_t c = 0; c < cells; ++c) pool[c] = c;
        for (int64_t i = 0; i < n_per_batch; ++i) { /* partial Fisher-Yates: unique cells */
            int64_t j = spconv_test_rand_int(i, cells - 1), t = pool[i];
            pool[i] = pool[j];
            pool[j] = t;
            int64_t p[3];
            cell_coords(pool[i], shape, p);
            int32_t *r = rows + (b * n_per_batch + i) * 4;
            r[0] = (int32_t)b, r[1] = (int32_t)p[0], r[2] = (int32_t)p[1], r[3] = (int32_t)p[2];
        }
    }
    for (int64_t i = n - 1; i > 0; --i) { /* interleave the batches */
        int64_t j = spconv_test_rand_int(0, i);
        int32_t t[4];
        memcpy(t, rows + i * 4, sizeof t);
        memcpy(rows + i * 4, rows + j * 4, sizeof t);
        memcpy(rows + j * 4, t, sizeof t);
    }
    free(pool);
    return rows;
}

double oracle_rel_error(const double *a, const double *b, int64_t n) {
    double diff = 0.0, scale = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        double d = fabs(a[i] - b[i]);
        if (isnan(d)) return INFINITY;
        if (d > diff) diff = d;
        if (fabs(b[i]) > scale) scale = fabs(b[i]);
    }
    return diff / (scale > 1e-300 ? scale : 1e-300);
}
