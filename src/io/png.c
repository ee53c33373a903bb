/* PNG files of RGB images through libpng, written under a temporary name and renamed. */
#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "io/pointcloud_file.h"
#include "spconv/config.h"
#include "spconv/image.h"

#if SPCONV_HAVE_PNG
#include <png.h>

/* libpng reports errors through a callback that must not return; the message is kept here for
 * the status, and the jump lands in encode(). */
typedef struct png_failure {
    char message[256];
} png_failure;

static void on_png_error(png_structp png, png_const_charp message) {
    png_failure *failure = png_get_error_ptr(png);
    snprintf(failure->message, sizeof failure->message, "%s", message);
    png_longjmp(png, 1);
}

/* Warnings (for example about unusual chunk data) do not stop a write we fully control. */
static void on_png_warning(png_structp png, png_const_charp message) {
    (void)png;
    (void)message;
}

/* Everything between setjmp and the end of the encoding lives here, with no local state that
 * changes after setjmp, so the jump needs no volatile variables. Returns 0 on success. */
static int encode(png_structp png, png_infop info, const spconv_image *image, FILE *file) {
    if (setjmp(png_jmpbuf(png))) return -1;
    png_init_io(png, file);
    png_set_IHDR(png, info, (png_uint_32)image->width, (png_uint_32)image->height, 8,
                 PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int64_t y = 0; y < image->height; ++y)
        png_write_row(png, image->rgb + 3 * y * image->width);
    png_write_end(png, NULL);
    return 0;
}

spconv_status spconv_png_write(const char *path, const spconv_image *image) {
    static const char func[] = "spconv_png_write";
    SPCONV_CHECK_NOT_NULL(func, path);
    SPCONV_CHECK_NOT_NULL(func, image);
    SPCONV_RETURN_ERROR_IF(image->rgb == NULL || image->width < 1 || image->height < 1 ||
                               image->width > SPCONV_IMAGE_MAX_SIDE ||
                               image->height > SPCONV_IMAGE_MAX_SIDE,
                           SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: '%s': image of %lld x %lld pixels (each side must be in [1, %d], "
                           "pixels not NULL)",
                           func, path, (long long)image->width, (long long)image->height,
                           SPCONV_IMAGE_MAX_SIDE);
    spconv__file_writer writer;
    SPCONV_FORWARD_IF_ERROR(spconv__file_writer_open(func, path, &writer));
    png_failure failure = {""};
    png_structp png =
        png_create_write_struct(PNG_LIBPNG_VER_STRING, &failure, on_png_error, on_png_warning);
    png_infop info = png != NULL ? png_create_info_struct(png) : NULL;
    if (info == NULL) {
        png_destroy_write_struct(&png, NULL);
        spconv__file_writer_abort(&writer);
        SPCONV_RETURN_ERROR(SPCONV_ERR_OUT_OF_MEMORY, "%s: '%s': libpng could not start", func,
                            path);
    }
    int failed = encode(png, info, image, writer.file);
    png_destroy_write_struct(&png, &info);
    if (failed) {
        spconv__file_writer_abort(&writer);
        SPCONV_RETURN_ERROR(SPCONV_ERR_IO, "%s: writing '%s' failed: libpng: %s", func, path,
                            failure.message);
    }
    return spconv__file_writer_commit(func, &writer);
}

#else

spconv_status spconv_png_write(const char *path, const spconv_image *image) {
    (void)image;
    SPCONV_RETURN_ERROR(SPCONV_ERR_NOT_SUPPORTED,
                        "spconv_png_write: '%s': this build of spconv has no libpng (install "
                        "libpng-dev and configure again)",
                        path != NULL ? path : "(null)");
}

#endif
