/**
 * @file image.h
 * @brief Small RGB pictures of results: images of 8-bit RGB pixels, a heat-map colour scale,
 * panels composed side by side, and PNG files written through libpng.
 *
 * An image is width x height pixels of three bytes (red, green, blue), rows from top to bottom
 * with no padding: pixel (x, y) starts at rgb[3 * (y * width + x)]. Both sizes are in
 * [1, SPCONV_IMAGE_MAX_SIDE].
 *
 * PNG files need libpng at build time (SPCONV_HAVE_PNG in spconv/config.h); without it
 * spconv_png_write returns SPCONV_ERR_NOT_SUPPORTED. Everything else is always available.
 *
 * Thread rules: an image is plain memory; use one from one thread at a time.
 */
#ifndef SPCONV_IMAGE_H
#define SPCONV_IMAGE_H

#include <stdint.h>

#include "spconv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Largest width or height of an image: libpng's default limit on either side of a PNG. */
#define SPCONV_IMAGE_MAX_SIDE 1000000

typedef struct spconv_image {
    int64_t width;
    int64_t height;
    uint8_t *rgb; /**< 3 * width * height bytes, owned by the image; rows top to bottom */
} spconv_image;

/**
 * A new image of @p width x @p height pixels, each set to @p fill (three bytes r, g, b; NULL
 * gives black). A side outside [1, SPCONV_IMAGE_MAX_SIDE] is SPCONV_ERR_INVALID_ARGUMENT, a
 * pixel count whose bytes do not fit in memory SPCONV_ERR_OVERFLOW / SPCONV_ERR_OUT_OF_MEMORY.
 * *out is owned by the caller (spconv_image_destroy).
 */
spconv_status spconv_image_create(int64_t width, int64_t height, const uint8_t fill[3],
                                  spconv_image **out);

/** Free the image and its pixels; NULL is a no-op. */
void spconv_image_destroy(spconv_image *image);

/**
 * The colour of @p t on the heat scale: from a dark indigo at 0 through blue, teal and green to
 * a light yellow at 1, with brightness rising all the way, so that the scale reads in grey too.
 * @p t is clamped to [0, 1]; NaN gives the colour of 0.
 */
void spconv_heat_color(double t, uint8_t rgb[3]);

/**
 * Colour pixel (x, y) of @p image by values[y * width + x] (width and height are the image's) on
 * the heat scale, with @p lo at 0 and @p hi at 1: t = (v - lo) / (hi - lo). With hi <= lo every
 * pixel gets the colour of 0. A NaN value leaves its pixel as it is, so NaN marks "no data" and
 * a background drawn before shows through.
 */
void spconv_image_fill_heat(spconv_image *image, const float *values, double lo, double hi);

/**
 * One image holding @p count panels side by side, in order from left to right, aligned at the
 * top, with @p margin pixels (>= 0) of @p background (NULL: black) around and between them:
 * width = sum of the widths + (count + 1) * margin, height = the tallest + 2 * margin.
 * count < 1, a NULL panel or a negative margin is SPCONV_ERR_INVALID_ARGUMENT. *out is owned by
 * the caller.
 */
spconv_status spconv_image_hstack(const spconv_image *const *panels, int count, int64_t margin,
                                  const uint8_t background[3], spconv_image **out);

/**
 * Write @p image to @p path as a PNG file of 8-bit RGB (no alpha, not interlaced). The file
 * appears whole or not at all (written under a temporary name beside it, then renamed).
 * SPCONV_ERR_IO naming the path when it cannot be written; SPCONV_ERR_NOT_SUPPORTED in a build
 * without libpng.
 */
spconv_status spconv_png_write(const char *path, const spconv_image *image);

#ifdef __cplusplus
}
#endif
#endif /* SPCONV_IMAGE_H */
