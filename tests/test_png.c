/* Images and PNG files (spconv/image.h): random pictures written by spconv_png_write and decoded
 * by libpng itself come back pixel for pixel; the heat scale's ends, clamping and rising
 * brightness; panels side by side at the right offsets; and every error path. */
#define _XOPEN_SOURCE 700

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/png_read.h"
#include "common/test_files.h"
#include "common/test_util.h"

#define PATH_CAP 1024

static int setup(void **state) {
    char *dir = spconv_test_make_scratch("spconv_png");
    *state = dir;
    return dir != NULL ? 0 : -1;
}

static int teardown(void **state) {
    char *dir = *state;
    int rc = spconv_test_remove_tree(dir);
    free(dir);
    return rc;
}

static spconv_image *random_image(int64_t width, int64_t height) {
    spconv_image *image = NULL;
    SPCONV_ASSERT_OK(spconv_image_create(width, height, NULL, &image));
    for (int64_t i = 0; i < 3 * width * height; ++i)
        image->rgb[i] = (uint8_t)spconv_test_rand_int(0, 255);
    return image;
}

static void skip_without_png(void) {
    if (!spconv_test_png_available()) {
        print_message("skip: this build has no libpng\n");
        skip();
    }
}

/* Write, decode with libpng, compare: sizes, colour type RGB (2), depth 8, every byte. */
static void round_trip(const char *dir, int64_t width, int64_t height) {
    char path[PATH_CAP];
    spconv_test_join(dir, "round_trip.png", path, sizeof path);
    spconv_image *image = random_image(width, height);
    SPCONV_ASSERT_OK(spconv_png_write(path, image));
    int64_t w = 0, h = 0;
    int color_type = -1, depth = -1;
    uint8_t *rgb = NULL;
    assert_int_equal(spconv_test_png_read(path, &w, &h, &rgb, &color_type, &depth), 0);
    assert_int_equal(w, width);
    assert_int_equal(h, height);
    assert_int_equal(color_type, 2);
    assert_int_equal(depth, 8);
    assert_memory_equal(rgb, image->rgb, (size_t)(3 * width * height));
    free(rgb);
    spconv_image_destroy(image);
}

static void test_png_round_trip(void **state) {
    skip_without_png();
    const char *dir = *state;
    round_trip(dir, 1, 1);
    round_trip(dir, 1, 7);
    round_trip(dir, spconv_test_rand_int(2, 300), spconv_test_rand_int(2, 200));
    /* Only the final file is left: the temporary was renamed, the first files replaced. */
    assert_int_equal(spconv_test_count_entries(dir), 1);
}

static void test_png_write_errors(void **state) {
    skip_without_png();
    const char *dir = *state;
    char path[PATH_CAP], missing[PATH_CAP];
    spconv_image *image = random_image(4, 3);
    spconv_test_join(dir, "no_such_folder/picture.png", missing, sizeof missing);
    SPCONV_ASSERT_FAILS(spconv_png_write(missing, image), SPCONV_ERR_IO, "no_such_folder");
    /* A folder where the file should go: the final rename fails and the temporary is removed. */
    spconv_test_join(dir, "taken.png", path, sizeof path);
    assert_int_equal(mkdir(path, 0777), 0);
    SPCONV_ASSERT_FAILS(spconv_png_write(path, image), SPCONV_ERR_IO, "taken.png");
    assert_int_equal(spconv_test_count_entries(dir), 1);
    assert_int_equal(rmdir(path), 0);
    SPCONV_ASSERT_FAILS(spconv_png_write("", image), SPCONV_ERR_IO, "empty");
    SPCONV_ASSERT_STATUS(spconv_png_write(NULL, image), SPCONV_ERR_NULL_POINTER);
    SPCONV_ASSERT_STATUS(spconv_png_write(path, NULL), SPCONV_ERR_NULL_POINTER);
    spconv_image broken = {.width = 0, .height = 3, .rgb = image->rgb};
    SPCONV_ASSERT_FAILS(spconv_png_write(path, &broken), SPCONV_ERR_INVALID_ARGUMENT, "0 x 3");
    assert_int_equal(spconv_test_count_entries(dir), 0);
    spconv_image_destroy(image);
}

static void test_png_without_libpng(void **state) {
    (void)state;
    if (spconv_test_png_available()) {
        print_message("skip: this build has libpng (the NOT_SUPPORTED path is not compiled)\n");
        skip();
    }
    spconv_image *image = random_image(2, 2);
    SPCONV_ASSERT_FAILS(spconv_png_write("x.png", image), SPCONV_ERR_NOT_SUPPORTED, "libpng");
    spconv_image_destroy(image);
}

static void test_image_create(void **state) {
    (void)state;
    const uint8_t fill[3] = {12, 200, 7};
    spconv_image *image = NULL;
    SPCONV_ASSERT_OK(spconv_image_create(5, 4, fill, &image));
    assert_int_equal(image->width, 5);
    assert_int_equal(image->height, 4);
    for (int i = 0; i < 20; ++i) assert_memory_equal(image->rgb + 3 * i, fill, 3);
    spconv_image_destroy(image);
    SPCONV_ASSERT_OK(spconv_image_create(1, 1, NULL, &image));
    assert_int_equal(image->rgb[0] | image->rgb[1] | image->rgb[2], 0);
    spconv_image_destroy(image);
    SPCONV_ASSERT_FAILS(spconv_image_create(0, 4, NULL, &image), SPCONV_ERR_INVALID_ARGUMENT,
                        "0 x 4");
    assert_null(image);
    SPCONV_ASSERT_FAILS(spconv_image_create(3, SPCONV_IMAGE_MAX_SIDE + 1, NULL, &image),
                        SPCONV_ERR_INVALID_ARGUMENT, "each side");
    SPCONV_ASSERT_STATUS(spconv_image_create(-1, 2, NULL, &image), SPCONV_ERR_INVALID_ARGUMENT);
    SPCONV_ASSERT_STATUS(spconv_image_create(1, 1, NULL, NULL), SPCONV_ERR_NULL_POINTER);
    spconv_image_destroy(NULL);
}

static double luminance(const uint8_t rgb[3]) {
    return 0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2];
}

static void test_heat_scale(void **state) {
    (void)state;
    uint8_t lo[3], hi[3], c[3];
    spconv_heat_color(0.0, lo);
    spconv_heat_color(1.0, hi);
    assert_true(luminance(hi) > luminance(lo) + 150.0);
    spconv_heat_color(-3.0, c);
    assert_memory_equal(c, lo, 3);
    spconv_heat_color(NAN, c);
    assert_memory_equal(c, lo, 3);
    spconv_heat_color(7.5, c);
    assert_memory_equal(c, hi, 3);
    /* Brightness rises along the scale; rounding each channel to a byte may move the luminance
     * of neighbouring steps by up to 0.5 either way, never more. */
    double previous = luminance(lo);
    int distinct = 0;
    uint8_t last[3] = {lo[0], lo[1], lo[2]};
    for (int i = 1; i <= 1000; ++i) {
        spconv_heat_color(i / 1000.0, c);
        assert_true(luminance(c) >= previous - 1.0);
        previous = luminance(c);
        distinct += memcmp(c, last, 3) != 0;
        memcpy(last, c, 3);
    }
    assert_true(distinct > 100);
}

static void test_fill_heat(void **state) {
    (void)state;
    const uint8_t background[3] = {9, 8, 7};
    spconv_image *image = NULL;
    SPCONV_ASSERT_OK(spconv_image_create(3, 2, background, &image));
    const float values[6] = {2.0f, 4.0f, 6.0f, -10.0f, 100.0f, NAN};
    spconv_image_fill_heat(image, values, 2.0, 6.0);
    uint8_t expected[3];
    const double t[5] = {0.0, 0.5, 1.0, 0.0, 1.0};
    for (int i = 0; i < 5; ++i) {
        spconv_heat_color(t[i], expected);
        assert_memory_equal(image->rgb + 3 * i, expected, 3);
    }
    assert_memory_equal(image->rgb + 15, background, 3); /* NaN: no data, left alone */
    spconv_image_fill_heat(image, values, 5.0, 5.0); /* empty range: everything at 0 */
    spconv_heat_color(0.0, expected);
    for (int i = 0; i < 5; ++i) assert_memory_equal(image->rgb + 3 * i, expected, 3);
    assert_memory_equal(image->rgb + 15, background, 3);
    spconv_image_destroy(image);
}

static void test_hstack(void **state) {
    (void)state;
    const int64_t margin = spconv_test_rand_int(0, 5);
    spconv_image *a = random_image(spconv_test_rand_int(1, 20), spconv_test_rand_int(1, 20));
    spconv_image *b = random_image(spconv_test_rand_int(1, 20), spconv_test_rand_int(1, 20));
    const spconv_image *panels[2] = {a, b};
    const uint8_t background[3] = {1, 2, 3};
    spconv_image *out = NULL;
    SPCONV_ASSERT_OK(spconv_image_hstack(panels, 2, margin, background, &out));
    const int64_t tallest = a->height > b->height ? a->height : b->height;
    assert_int_equal(out->width, a->width + b->width + 3 * margin);
    assert_int_equal(out->height, tallest + 2 * margin);
    /* Every output pixel is the panel pixel that should be there, or the background. */
    for (int64_t y = 0; y < out->height; ++y) {
        for (int64_t x = 0; x < out->width; ++x) {
            const uint8_t *expected = background;
            const int64_t py = y - margin, ax = x - margin, bx = x - 2 * margin - a->width;
            if (ax >= 0 && ax < a->width && py >= 0 && py < a->height)
                expected = a->rgb + 3 * (py * a->width + ax);
            if (bx >= 0 && bx < b->width && py >= 0 && py < b->height)
                expected = b->rgb + 3 * (py * b->width + bx);
            assert_memory_equal(out->rgb + 3 * (y * out->width + x), expected, 3);
        }
    }
    spconv_image_destroy(out);
    SPCONV_ASSERT_FAILS(spconv_image_hstack(panels, 0, 1, NULL, &out),
                        SPCONV_ERR_INVALID_ARGUMENT, "0 panels");
    SPCONV_ASSERT_FAILS(spconv_image_hstack(panels, 2, -1, NULL, &out),
                        SPCONV_ERR_INVALID_ARGUMENT, "margin -1");
    const spconv_image *with_null[2] = {a, NULL};
    SPCONV_ASSERT_FAILS(spconv_image_hstack(with_null, 2, 1, NULL, &out),
                        SPCONV_ERR_INVALID_ARGUMENT, "panel 1");
    assert_null(out);
    spconv_image_destroy(a);
    spconv_image_destroy(b);
}

int main(void) {
    spconv_test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_png_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_png_write_errors, setup, teardown),
        cmocka_unit_test(test_png_without_libpng),
        cmocka_unit_test(test_image_create),
        cmocka_unit_test(test_heat_scale),
        cmocka_unit_test(test_fill_heat),
        cmocka_unit_test(test_hstack),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
