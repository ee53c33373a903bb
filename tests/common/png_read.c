/* PNG decoding for tests through libpng's simplified API (see png_read.h). */
#include "common/png_read.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spconv/config.h"

#if SPCONV_HAVE_PNG
#include <png.h>

int spconv_test_png_available(void) { return 1; }

int spconv_test_png_read(const char *path, int64_t *width, int64_t *height, uint8_t **rgb,
                         int *color_type, int *bit_depth) {
    png_image image;
    memset(&image, 0, sizeof image);
    image.version = PNG_IMAGE_VERSION;
    *rgb = NULL;
    if (!png_image_begin_read_from_file(&image, path)) {
        fprintf(stderr, "png_read: '%s': %s\n", path, image.message);
        return -1;
    }
    /* The simplified API converts; the file's own colour type is kept in image.format's flags,
     * but the exact type and depth need the low-level header, read here from the IHDR bytes. */
    FILE *file = fopen(path, "rb");
    unsigned char header[33];
    if (file == NULL || fread(header, 1, sizeof header, file) != sizeof header) {
        if (file != NULL) fclose(file);
        png_image_free(&image);
        fprintf(stderr, "png_read: '%s': cannot read the IHDR chunk\n", path);
        return -1;
    }
    fclose(file);
    *bit_depth = header[24]; /* 8 signature bytes, 4 length, 4 "IHDR", 4 width, 4 height */
    *color_type = header[25];
    image.format = PNG_FORMAT_RGB;
    size_t bytes = PNG_IMAGE_SIZE(image);
    *rgb = malloc(bytes);
    if (*rgb == NULL || !png_image_finish_read(&image, NULL, *rgb, 0, NULL)) {
        fprintf(stderr, "png_read: '%s': %s\n", path,
                *rgb == NULL ? "out of memory" : image.message);
        free(*rgb);
        *rgb = NULL;
        png_image_free(&image);
        return -1;
    }
    *width = image.width;
    *height = image.height;
    return 0;
}

#else

int spconv_test_png_available(void) { return 0; }

int spconv_test_png_read(const char *path, int64_t *width, int64_t *height, uint8_t **rgb,
                         int *color_type, int *bit_depth) {
    (void)width, (void)height, (void)color_type, (void)bit_depth;
    *rgb = NULL;
    fprintf(stderr, "png_read: '%s': this build has no libpng\n", path);
    return -1;
}

#endif
