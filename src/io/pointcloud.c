/* Point clouds: the object, its accessors and the choice of reader for a file. */
#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/pointcloud_file.h"
#include "io/pointcloud_impl.h"
#include "tensor/tensor_impl.h"

/* Bytes read to recognise a file that has no telling name. */
#define SNIFF_BYTES 256
/* More columns than any real sensor produces; keeps a typo from allocating absurd rows. */
#define MAX_BIN_COLUMNS 4096

static void free_names(char **names, int count) {
    if (names == NULL) return;
    for (int i = 0; i < count; ++i) free(names[i]);
    free(names);
}

static char *copy_string(const char *s) {
    size_t n = strlen(s) + 1;
    char *c = malloc(n);
    if (c != NULL) memcpy(c, s, n);
    return c;
}

spconv_status spconv__cloud_make(const char *func, spconv_tensor *points,
                                 const char *const *names, spconv_point_cloud **out) {
    *out = NULL;
    int count = (int)spconv_tensor_size(points, 1);
    spconv_point_cloud *pc = calloc(1, sizeof *pc);
    char **copies = calloc((size_t)count, sizeof *copies);
    int ok = pc != NULL && copies != NULL;
    for (int i = 0; ok && i < count; ++i) {
        static const char *const xyz[3] = {"x", "y", "z"};
        char generated[16];
        snprintf(generated, sizeof generated, "f%d", i);
        const char *name = names != NULL ? names[i] : i < 3 ? xyz[i] : generated;
        ok = (copies[i] = copy_string(name)) != NULL;
    }
    if (!ok) {
        free_names(copies, count);
        free(pc);
        spconv_tensor_release(points);
        SPCONV_RETURN_ERROR(SPCONV_ERR_OUT_OF_MEMORY, "%s: out of memory for the field names",
                            func);
    }
    pc->points = points;
    pc->num_fields = count;
    pc->field_names = copies;
    pc->format = SPCONV_CLOUD_AUTO;
    snprintf(pc->format_detail, sizeof pc->format_detail, "memory");
    pc->width = spconv_tensor_size(points, 0);
    pc->height = 1;
    *out = pc;
    return SPCONV_OK;
}

int64_t spconv__cloud_compact_finite(float *data, int64_t rows, int64_t cols) {
    int64_t kept = 0;
    for (int64_t r = 0; r < rows; ++r) {
        const float *row = data + r * cols;
        if (!isfinite(row[0]) || !isfinite(row[1]) || !isfinite(row[2])) continue;
        if (kept != r) memmove(data + kept * cols, row, (size_t)cols * sizeof *row);
        ++kept;
    }
    return kept;
}

spconv_status spconv__cloud_keep_rows(spconv_point_cloud *pc, int64_t rows) {
    if (rows == spconv_tensor_size(pc->points, 0)) return SPCONV_OK;
    spconv_tensor *view;
    SPCONV_FORWARD_IF_ERROR(spconv_tensor_narrow(pc->points, 0, 0, rows, &view));
    spconv_tensor_release(pc->points);
    pc->points = view;
    return SPCONV_OK;
}

/* ---- choosing a reader --------------------------------------------------------------------- */

static int ends_with(const char *s, const char *suffix) {
    size_t ls = strlen(s), lx = strlen(suffix);
    if (lx > ls) return 0;
    for (size_t i = 0; i < lx; ++i)
        if (tolower((unsigned char)s[ls - lx + i]) != tolower((unsigned char)suffix[i])) return 0;
    return 1;
}

static int starts_line(const char *head, const char *word) {
    for (const char *p = head; p != NULL && *p != '\0'; p = strchr(p, '\n')) {
        if (*p == '\n') ++p;
        if (strncmp(p, word, strlen(word)) == 0) return 1;
    }
    return 0;
}

/* The format of a file without a telling name, from its first SNIFF_BYTES bytes (of @p len);
 * the search also stops at a NUL byte. */
static spconv_status sniff_format(const char *func, const char *path, const char *text,
                                  size_t len, spconv_cloud_format *format) {
    char first[SNIFF_BYTES + 1];
    size_t n = len < SNIFF_BYTES ? len : SNIFF_BYTES;
    memcpy(first, text, n);
    first[n] = '\0';
    *format = SPCONV_CLOUD_AUTO;
    if (strncmp(first, "ply\n", 4) == 0 || strncmp(first, "ply\r\n", 5) == 0)
        *format = SPCONV_CLOUD_PLY;
    else if (starts_line(first, "# .PCD") || starts_line(first, "VERSION") ||
             starts_line(first, "FIELDS"))
        *format = SPCONV_CLOUD_PCD;
    SPCONV_RETURN_ERROR_IF(*format == SPCONV_CLOUD_AUTO, SPCONV_ERR_FORMAT,
                           "%s: cannot tell the format of '%s' from its name or content (name "
                           "it .bin, .pcd or .ply, or pass the format)", func, path);
    return SPCONV_OK;
}

static void format_from_name(const char *path, spconv_cloud_format *format) {
    if (*format != SPCONV_CLOUD_AUTO) return;
    if (ends_with(path, ".bin")) *format = SPCONV_CLOUD_BIN;
    else if (ends_with(path, ".pcd")) *format = SPCONV_CLOUD_PCD;
    else if (ends_with(path, ".ply")) *format = SPCONV_CLOUD_PLY;
}

/* A PCD or PLY file (or one to recognise): read once, whole, into memory; the format is told,
 * the header checked and the points parsed from those same bytes, so nothing can change the file
 * between the check and the parse. */
static spconv_status read_text_format(const char *func, const char *path,
                                      spconv_cloud_format format, int bin_columns,
                                      spconv_point_cloud **out) {
    SPCONV_RETURN_ERROR_IF(bin_columns != 0 && format != SPCONV_CLOUD_AUTO,
                           SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: bin_columns = %d is only for .bin files, '%s' is %s", func,
                           bin_columns, path, format == SPCONV_CLOUD_PCD ? "PCD" : "PLY");
    char *text;
    size_t len;
    SPCONV_FORWARD_IF_ERROR(spconv__file_read_all(func, path, UINT64_MAX, &text, &len));
    spconv_status st = format == SPCONV_CLOUD_AUTO ? sniff_format(func, path, text, len, &format)
                                                   : SPCONV_OK;
    if (st == SPCONV_OK && bin_columns != 0)
        st = spconv__error(SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: bin_columns = %d is only for .bin files, '%s' is %s", func,
                           bin_columns, path, format == SPCONV_CLOUD_PCD ? "PCD" : "PLY");
    if (st == SPCONV_OK) st = spconv__cloud_read_text(func, path, format, text, len, out);
    free(text);
    return st;
}

spconv_status spconv_point_cloud_read(const char *path, spconv_cloud_format format,
                                      int bin_columns, spconv_point_cloud **out) {
    static const char func[] = "spconv_point_cloud_read";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    SPCONV_CHECK_NOT_NULL(func, path);
    SPCONV_RETURN_ERROR_IF(format < SPCONV_CLOUD_AUTO || format > SPCONV_CLOUD_PLY,
                           SPCONV_ERR_INVALID_ARGUMENT, "%s: unknown format %d", func, (int)format);
    SPCONV_RETURN_ERROR_IF(bin_columns < 0 || (bin_columns > 0 && bin_columns < 3) ||
                               bin_columns > MAX_BIN_COLUMNS,
                           SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: bin_columns = %d must be 0 (from the name) or in [3, %d]: a point "
                           "needs x, y, z", func, bin_columns, MAX_BIN_COLUMNS);
    format_from_name(path, &format);
    if (format == SPCONV_CLOUD_BIN) {
        int columns = bin_columns > 0 ? bin_columns : ends_with(path, ".pcd.bin") ? 5 : 4;
        return spconv__cloud_read_bin(path, columns, out);
    }
    return read_text_format(func, path, format, bin_columns, out);
}

/* ---- clouds made from tensors --------------------------------------------------------------- */

spconv_status spconv_point_cloud_create(spconv_context *ctx, const spconv_tensor *points,
                                        const char *const *field_names, spconv_point_cloud **out) {
    static const char func[] = "spconv_point_cloud_create";
    SPCONV_CHECK_NOT_NULL(func, out);
    *out = NULL;
    SPCONV_CHECK_NOT_NULL(func, points);
    SPCONV_RETURN_ERROR_IF(spconv_tensor_ndim(points) != 2 || spconv_tensor_size(points, 1) < 3,
                           SPCONV_ERR_SHAPE_MISMATCH,
                           "%s: points must be [P, F] with F >= 3 (x, y, z first), got %d dims "
                           "with %lld columns", func, spconv_tensor_ndim(points),
                           (long long)spconv_tensor_size(points, -1));
    SPCONV_RETURN_ERROR_IF(spconv_tensor_dtype(points) != SPCONV_F32, SPCONV_ERR_DTYPE_MISMATCH,
                           "%s: points must be f32, got %s", func,
                           spconv_dtype_name(spconv_tensor_dtype(points)));
    SPCONV_RETURN_ERROR_IF(spconv_tensor_device(points).type != SPCONV_DEVICE_CPU,
                           SPCONV_ERR_DEVICE_MISMATCH, "%s: points must be on the CPU", func);
    SPCONV_RETURN_ERROR_IF(spconv_tensor_size(points, 1) > MAX_BIN_COLUMNS,
                           SPCONV_ERR_INVALID_ARGUMENT, "%s: %lld columns is more than %d", func,
                           (long long)spconv_tensor_size(points, 1), MAX_BIN_COLUMNS);
    int count = (int)spconv_tensor_size(points, 1);
    for (int i = 0; field_names != NULL && i < count; ++i)
        SPCONV_RETURN_ERROR_IF(field_names[i] == NULL || field_names[i][0] == '\0',
                               SPCONV_ERR_INVALID_ARGUMENT, "%s: field name %d is %s", func, i,
                               field_names[i] == NULL ? "NULL" : "empty");
    spconv_tensor *contiguous;
    SPCONV_FORWARD_IF_ERROR(spconv_tensor_contiguous(ctx, points, &contiguous));
    return spconv__cloud_make(func, contiguous, field_names, out);
}

void spconv_point_cloud_destroy(spconv_point_cloud *pc) {
    if (pc == NULL) return;
    spconv_tensor_release(pc->points);
    free_names(pc->field_names, pc->num_fields);
    free(pc);
}

/* ---- accessors ------------------------------------------------------------------------------ */

spconv_tensor *spconv_point_cloud_points(const spconv_point_cloud *pc) { return pc->points; }

int64_t spconv_point_cloud_num_points(const spconv_point_cloud *pc) {
    return spconv_tensor_size(pc->points, 0);
}

int spconv_point_cloud_num_fields(const spconv_point_cloud *pc) { return pc->num_fields; }

const char *spconv_point_cloud_field_name(const spconv_point_cloud *pc, int index) {
    return index < 0 || index >= pc->num_fields ? NULL : pc->field_names[index];
}

int spconv_point_cloud_field_index(const spconv_point_cloud *pc, const char *name) {
    if (name == NULL) return -1;
    for (int i = 0; i < pc->num_fields; ++i)
        if (strcmp(pc->field_names[i], name) == 0) return i;
    return -1;
}

int64_t spconv_point_cloud_dropped_nonfinite(const spconv_point_cloud *pc) {
    return pc->dropped_nonfinite;
}

spconv_cloud_format spconv_point_cloud_format(const spconv_point_cloud *pc) { return pc->format; }

const char *spconv_point_cloud_format_detail(const spconv_point_cloud *pc) {
    return pc->format_detail;
}

void spconv_point_cloud_layout(const spconv_point_cloud *pc, int64_t *width, int64_t *height) {
    if (width != NULL) *width = pc->width;
    if (height != NULL) *height = pc->height;
}

spconv_status spconv_point_cloud_bounds(const spconv_point_cloud *pc, float min_xyz[3],
                                        float max_xyz[3]) {
    static const char func[] = "spconv_point_cloud_bounds";
    SPCONV_CHECK_NOT_NULL(func, pc);
    SPCONV_CHECK_NOT_NULL(func, min_xyz);
    SPCONV_CHECK_NOT_NULL(func, max_xyz);
    int64_t rows = spconv_tensor_size(pc->points, 0);
    SPCONV_RETURN_ERROR_IF(rows == 0, SPCONV_ERR_INVALID_ARGUMENT,
                           "%s: the cloud has no points", func);
    const float *data = spconv_tensor_data(pc->points);
    int64_t cols = pc->num_fields;
    for (int a = 0; a < 3; ++a) min_xyz[a] = max_xyz[a] = data[a];
    for (int64_t r = 1; r < rows; ++r)
        for (int a = 0; a < 3; ++a) {
            float v = data[r * cols + a];
            if (v < min_xyz[a]) min_xyz[a] = v;
            if (v > max_xyz[a]) max_xyz[a] = v;
        }
    return SPCONV_OK;
}
