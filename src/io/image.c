/* RGB images in memory: creation, the heat colour scale, and panels side by side. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "spconv/image.h"

static void fill_pixels(uint8_t *rgb, int64_t count, const uint8_t colour[3]) {
    for (int64_t i = 0; i < count; ++i) memcpy(rgb + 3 * i, colour, 3);
}

spconv_status spconv_image_create(int64_t width, int64_t height, const uint8_t fill[3],
                                  spconv_image **out) {
    static const char func[] = "spconv_image_create";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    SPCONV_RETURN_ERROR_IF(width < 1 || width > SPCONV_IMAGE_MAX_SIDE || height < 1 ||
                               height > SPCONV_IMAGE_MAX_SIDE,
                           SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: size %lld x %lld: each side must be in [1, %d]", func,
                           (long long)width, (long long)height, SPCONV_IMAGE_MAX_SIDE);
    /* Both sides are at most 10^6, so the product fits int64; size_t may be 32 bits. */
    const int64_t bytes = 3 * width * height;
    SPCONV_RETURN_ERROR_IF((uint64_t)bytes > (uint64_t)SIZE_MAX, SPCONV_ERR_OVERFLOW,
                           "%s: %lld x %lld pixels do not fit in memory", func, (long long)width,
                           (long long)height);
    spconv_image *image = malloc(sizeof *image);
    uint8_t *rgb = malloc((size_t)bytes);
    if (image == NULL || rgb == NULL) {
        free(image);
        free(rgb);
        SPCONV_RETURN_ERROR(SPCONV_ERR_OUT_OF_MEMORY, "%s: out of memory for %lld x %lld pixels",
                            func, (long long)width, (long long)height);
    }
    static const uint8_t black[3] = {0, 0, 0};
    fill_pixels(rgb, width * height, fill != NULL ? fill : black);
    *image = (spconv_image){.width = width, .height = height, .rgb = rgb};
    *out = image;
    return SPCONV_OK;
}

void spconv_image_destroy(spconv_image *image) {
    if (image == NULL) return;
    free(image->rgb);
    free(image);
}

/* Anchors of the heat scale, evenly spaced over [0, 1]. Chosen for this project so that the
 * luminance (0.21 R + 0.72 G + 0.07 B) rises steadily, about 18 -> 72 -> 118 -> 172 -> 220:
 * a brighter pixel always means a larger value, also for readers who do not see the hues. */
static const uint8_t heat_anchors[][3] = {
    {30, 10, 60}, {55, 70, 140}, {35, 140, 140}, {110, 200, 80}, {250, 230, 40},
};
#define HEAT_SEGMENTS ((int)(sizeof heat_anchors / sizeof heat_anchors[0]) - 1)

void spconv_heat_color(double t, uint8_t rgb[3]) {
    if (!(t > 0.0)) t = 0.0; /* also NaN */
    if (t > 1.0) t = 1.0;
    double position = t * HEAT_SEGMENTS;
    int segment = (int)position;
    if (segment == HEAT_SEGMENTS) segment = HEAT_SEGMENTS - 1;
    const double frac = position - segment;
    for (int c = 0; c < 3; ++c) {
        const double a = heat_anchors[segment][c], b = heat_anchors[segment + 1][c];
        rgb[c] = (uint8_t)lround(a + (b - a) * frac);
    }
}

void spconv_image_fill_heat(spconv_image *image, const float *values, double lo, double hi) {
    const int64_t count = image->width * image->height;
    const double range = hi - lo;
    for (int64_t i = 0; i < count; ++i)
        if (!isnan(values[i]))
            spconv_heat_color(range > 0.0 ? ((double)values[i] - lo) / range : 0.0,
                              image->rgb + 3 * i);
}

spconv_status spconv_image_hstack(const spconv_image *const *panels, int count, int64_t margin,
                                  const uint8_t background[3], spconv_image **out) {
    static const char func[] = "spconv_image_hstack";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    SPCONV_CHECK_NOT_NULL(func, panels);
    SPCONV_RETURN_ERROR_IF(count < 1, SPCONV_ERR_INVALID_ARGUMENT, "%s: %d panels (need >= 1)",
                           func, count);
    SPCONV_RETURN_ERROR_IF(margin < 0 || margin > SPCONV_IMAGE_MAX_SIDE,
                           SPCONV_ERR_INVALID_ARGUMENT, "%s: margin %lld is outside [0, %d]", func,
                           (long long)margin, SPCONV_IMAGE_MAX_SIDE);
    /* Sides are bounded by SPCONV_IMAGE_MAX_SIDE, so these sums cannot overflow for any int count;
     * spconv_image_create rejects a result that is too wide. */
    int64_t width = margin, height = 0;
    for (int i = 0; i < count; ++i) {
        SPCONV_RETURN_ERROR_IF(panels[i] == NULL, SPCONV_ERR_INVALID_ARGUMENT,
                               "%s: panel %d is NULL", func, i);
        width += panels[i]->width + margin;
        if (panels[i]->height > height) height = panels[i]->height;
    }
    spconv_image *image = NULL;
    SPCONV_FORWARD_IF_ERROR(spconv_image_create(width, height + 2 * margin, background, &image));
    int64_t left = margin;
    for (int i = 0; i < count; ++i) {
        const spconv_image *p = panels[i];
        for (int64_t y = 0; y < p->height; ++y)
            memcpy(image->rgb + 3 * ((y + margin) * width + left), p->rgb + 3 * y * p->width,
                   (size_t)(3 * p->width));
        left += p->width + margin;
    }
    *out = image;
    return SPCONV_OK;
}
