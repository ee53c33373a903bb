/* The picture of a network run (see net_picture.h). */
#include "net_picture.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static const uint8_t panel_background[3] = {14, 14, 18};
static const uint8_t frame_background[3] = {60, 60, 66};

/* A panel's values, one per pixel, rows top to bottom; NaN marks a pixel without data. */
typedef struct panel {
    int64_t height, width;
    float *values;
} panel;

void picture_panel_size(const spconv_net_input *zin, int64_t *height, int64_t *width) {
    const int64_t h = zin->spatial_shape[1], w = zin->spatial_shape[2];
    const int64_t longest = h > w ? h : w;
    const int64_t f = longest > PICTURE_PANEL_SIDE
                          ? (longest + PICTURE_PANEL_SIDE - 1) / PICTURE_PANEL_SIDE : 1;
    *height = (h + f - 1) / f;
    *width = (w + f - 1) / f;
}

static spconv_status panel_init(panel *p, const spconv_net_input *zin) {
    picture_panel_size(zin, &p->height, &p->width);
    p->values = malloc((size_t)(p->height * p->width) * sizeof *p->values);
    if (p->values == NULL)
        return spconv__error(SPCONV_ERR_OUT_OF_MEMORY, "picture: out of memory for %lld x %lld",
                             (long long)p->height, (long long)p->width);
    for (int64_t i = 0; i < p->height * p->width; ++i) p->values[i] = NAN;
    return SPCONV_OK;
}

/* First and one-past-last pixel of cell @p cell among @p cells spread over @p pixels: at least
 * one pixel, so that a grid finer than the panel still shows every cell. */
static void cell_span(int64_t cell, int64_t cells, int64_t pixels, int64_t *first, int64_t *end) {
    *first = cell * pixels / cells;
    *end = (cell + 1) * pixels / cells;
    if (*end <= *first) *end = *first + 1;
}

/* Raise the pixels of cell (y, x) of a rows x cols grid to @p v; y grows upwards in the panel. */
static void panel_put_max(panel *p, int64_t y, int64_t x, int64_t rows, int64_t cols, float v) {
    int64_t y0, y1, x0, x1;
    cell_span(y, rows, p->height, &y0, &y1);
    cell_span(x, cols, p->width, &x0, &x1);
    for (int64_t py = y0; py < y1; ++py) {
        float *row = p->values + (p->height - 1 - py) * p->width;
        for (int64_t px = x0; px < x1; ++px)
            if (isnan(row[px]) || v > row[px]) row[px] = v;
    }
}

/* Per-cell norms of batch 0 of a dense map [B, C, H, W]; all-zero cells (no site) stay empty. */
static spconv_status heat_from_dense(panel *p, const spconv_tensor *map) {
    const int64_t c = spconv_tensor_size(map, 1), h = spconv_tensor_size(map, 2),
                  w = spconv_tensor_size(map, 3);
    double *sums = calloc((size_t)(h * w), sizeof *sums);
    if (sums == NULL)
        return spconv__error(SPCONV_ERR_OUT_OF_MEMORY, "picture: out of memory for %lld cells",
                             (long long)(h * w));
    const float *v = spconv_tensor_data(map);
    for (int64_t ch = 0; ch < c; ++ch) /* channel planes in memory order */
        for (int64_t i = 0; i < h * w; ++i) sums[i] += (double)v[ch * h * w + i] * v[ch * h * w + i];
    for (int64_t i = 0; i < h * w; ++i)
        if (sums[i] > 0.0) panel_put_max(p, i / w, i % w, h, w, (float)sqrt(sums[i]));
    free(sums);
    return SPCONV_OK;
}

/* Largest feature norm over the sites of batch 0 above each (y, x) cell of a grid of spatial
 * shape @p shape (D, H, W); @p indices holds the sites' rows (b, z, y, x). */
static void heat_from_sparse(panel *p, const spconv_tensor *features, const spconv_tensor *indices,
                             const int64_t shape[3]) {
    const int64_t n = spconv_tensor_size(features, 0), c = spconv_tensor_size(features, 1);
    const float *f = spconv_tensor_data(features);
    const int32_t *rows = spconv_tensor_data(indices);
    for (int64_t i = 0; i < n; ++i) {
        if (rows[4 * i] != 0) continue;
        double sum = 0.0;
        for (int64_t ch = 0; ch < c; ++ch) sum += (double)f[i * c + ch] * f[i * c + ch];
        panel_put_max(p, rows[4 * i + 2], rows[4 * i + 3], shape[1], shape[2], (float)sqrt(sum));
    }
}

/* log(1 + points) per pixel for the points inside the network's range (all three axes). */
static void occupancy(panel *p, const spconv_net_input *zin, const spconv_tensor *points) {
    const int64_t n = spconv_tensor_size(points, 0), f = spconv_tensor_size(points, 1);
    const float *xyz = spconv_tensor_data(points);
    const double *r = zin->point_range;
    for (int64_t i = 0; i < p->height * p->width; ++i) p->values[i] = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
        const float *pt = xyz + i * f;
        int inside = 1;
        for (int a = 0; a < 3; ++a) inside &= pt[a] >= r[a] && pt[a] < r[a + 3];
        if (!inside) continue;
        int64_t px = (int64_t)((pt[0] - r[0]) / (r[3] - r[0]) * (double)p->width);
        int64_t py = (int64_t)((pt[1] - r[1]) / (r[4] - r[1]) * (double)p->height);
        px = px < p->width ? px : p->width - 1; /* rounding at the upper edge */
        py = py < p->height ? py : p->height - 1;
        p->values[(p->height - 1 - py) * p->width + px] += 1.0f;
    }
    for (int64_t i = 0; i < p->height * p->width; ++i)
        p->values[i] = p->values[i] > 0.0f ? log1pf(p->values[i]) : NAN;
}

static int compare_floats(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* The 95th percentile of the panel's values (0 without any): one hot spot does not wash out the
 * rest of the picture. */
static spconv_status robust_max(const panel *p, double *out) {
    const int64_t count = p->height * p->width;
    float *kept = malloc((size_t)count * sizeof *kept);
    if (kept == NULL)
        return spconv__error(SPCONV_ERR_OUT_OF_MEMORY, "picture: out of memory for %lld values",
                             (long long)count);
    int64_t m = 0;
    for (int64_t i = 0; i < count; ++i)
        if (!isnan(p->values[i])) kept[m++] = p->values[i];
    qsort(kept, (size_t)m, sizeof *kept, compare_floats);
    *out = m > 0 ? kept[(m - 1) * 95 / 100] : 0.0;
    if (*out <= 0.0 && m > 0) *out = kept[m - 1];
    free(kept);
    return SPCONV_OK;
}

static spconv_status panel_image(const panel *p, spconv_image **out) {
    double hi = 0.0;
    SPCONV_FORWARD_IF_ERROR(robust_max(p, &hi));
    SPCONV_FORWARD_IF_ERROR(spconv_image_create(p->width, p->height, panel_background, out));
    spconv_image_fill_heat(*out, p->values, 0.0, hi);
    return SPCONV_OK;
}

/* Both panels, from contiguous copies of the outputs when they are not contiguous already. */
static spconv_status draw_panels(const spconv_net_input *zin, const spconv_tensor *points,
                                 const spconv_tensor *output, const spconv_sparse_tensor *out_sparse,
                                 panel *heat, panel *occupied) {
    spconv_tensor *values = NULL, *indices = NULL;
    SPCONV_FORWARD_IF_ERROR(spconv_tensor_contiguous(NULL, output, &values));
    spconv_status st = SPCONV_OK;
    if (spconv_tensor_ndim(values) == 4) {
        st = heat_from_dense(heat, values);
    } else {
        int64_t shape[3];
        spconv_sparse_spatial_shape(out_sparse, shape);
        st = spconv_tensor_contiguous(NULL, spconv_sparse_indices(out_sparse), &indices);
        if (st == SPCONV_OK) heat_from_sparse(heat, values, indices, shape);
    }
    spconv_tensor_release(values);
    spconv_tensor_release(indices);
    if (st == SPCONV_OK) occupancy(occupied, zin, points);
    return st;
}

spconv_status picture_make(const spconv_net_input *zin, const spconv_tensor *points,
                           const spconv_tensor *output, const spconv_sparse_tensor *out_sparse,
                           spconv_image **out) {
    *out = NULL;
    panel heat = {0}, occupied = {0};
    spconv_image *images[2] = {NULL, NULL};
    spconv_status st = panel_init(&heat, zin);
    if (st == SPCONV_OK) st = panel_init(&occupied, zin);
    if (st == SPCONV_OK) st = draw_panels(zin, points, output, out_sparse, &heat, &occupied);
    if (st == SPCONV_OK) st = panel_image(&heat, &images[0]);
    if (st == SPCONV_OK) st = panel_image(&occupied, &images[1]);
    if (st == SPCONV_OK)
        st = spconv_image_hstack((const spconv_image *const *)images, 2, PICTURE_MARGIN,
                                 frame_background, out);
    spconv_image_destroy(images[0]);
    spconv_image_destroy(images[1]);
    free(heat.values);
    free(occupied.values);
    return st;
}
