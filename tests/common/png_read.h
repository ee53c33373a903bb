/* Decoding PNG files in tests, through libpng itself (not through spconv), so that a picture the
 * library or the CLI wrote is checked by an independent reader. */
#ifndef SPCONV_TEST_PNG_READ_H
#define SPCONV_TEST_PNG_READ_H

#include <stdint.h>

/** 1 when this build can decode PNG files (it has libpng), else 0. */
int spconv_test_png_available(void);

/** Decode @p path as 8-bit RGB: *rgb (malloc'd, free() it) holds *width x *height pixels of three
 *  bytes, rows top to bottom. *color_type gets the file's own PNG colour type and *bit_depth its
 *  depth, so a test can check what was stored. Returns 0 on success, -1 after printing why. */
int spconv_test_png_read(const char *path, int64_t *width, int64_t *height, uint8_t **rgb,
                         int *color_type, int *bit_depth);

#endif /* SPCONV_TEST_PNG_READ_H */
