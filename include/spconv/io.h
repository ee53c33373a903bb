/**
 * @file io.h
 * @brief Point-cloud files: reading KITTI / nuScenes `.bin`, PCD and PLY into a float32 tensor,
 * writing `.bin` and binary PCD.
 *
 * A point cloud is a CPU float32 tensor [P, F] whose first three columns are x, y, z, followed
 * by the file's other fields (intensity, ring, ...) in file order, plus the names of the F
 * columns. Organized clouds (PCD with HEIGHT > 1) are flattened row by row. Points whose x, y or
 * z is NaN or infinite are dropped and counted; other fields are kept as they are.
 *
 * Formats:
 *  - `.bin`: raw little-endian float32 records, 4 per point for KITTI (x, y, z, intensity) and
 *    5 for nuScenes `.pcd.bin` (x, y, z, intensity, ring). The column count is given, or taken
 *    from the name (".pcd.bin" -> 5, other ".bin" -> 4). A size that is not a whole number of
 *    records is SPCONV_ERR_FORMAT. Read natively, always available.
 *  - PLY (ascii, binary little/big endian) and PCD `DATA ascii` are read natively, always
 *    available; PCD `DATA binary` and `binary_compressed` are parsed by PCL's PCD reader when this
 *    build has PCL (SPCONV_HAVE_PCL in spconv/config.h), otherwise SPCONV_ERR_NOT_SUPPORTED. A
 *    file is read once, whole; its header is validated (counts against the file size, field
 *    sizes and types) and its points are parsed from those same bytes, so a file that lies is
 *    SPCONV_ERR_FORMAT, not a crash. ASCII values must parse as their declared type and fit it
 *    ("nan" and "inf" are real values), and each point (each PLY row) is one line with exactly
 *    its values: anything else is SPCONV_ERR_FORMAT naming the line and the field. PLY lists are
 *    read past in every element but the vertex element, where a list is SPCONV_ERR_FORMAT
 *    (a point is a fixed set of values). Fields of any numeric type become float32; a field with
 *    COUNT n > 1 becomes n columns "name_0" .. "name_{n-1}"; packed colour fields "rgb" /
 *    "rgba" become columns r, g, b (and a) in 0..255, as do PLY's uchar red, green, blue,
 *    alpha; padding fields named "_" are skipped. A cloud without x, y and z fields is
 *    SPCONV_ERR_FORMAT.
 *  - An input that is not a regular file (a named pipe, a device, a directory) is SPCONV_ERR_IO
 *    at once: inputs are opened without blocking and checked before anything is read.
 *
 * Every failure returns a status with a message (spconv_last_error()) naming the file and the
 * problem; nothing is leaked and *out stays NULL.
 */
#ifndef SPCONV_IO_H
#define SPCONV_IO_H

#include <stdint.h>

#include "spconv/context.h"
#include "spconv/status.h"
#include "spconv/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/** File formats of point clouds. The numbers are stable. */
typedef enum spconv_cloud_format {
    SPCONV_CLOUD_AUTO = 0, /**< from the file name (.bin, .pcd, .ply), else from the content */
    SPCONV_CLOUD_BIN = 1,  /**< raw float32 records (KITTI .bin, nuScenes .pcd.bin) */
    SPCONV_CLOUD_PCD = 2,  /**< PCL's PCD (binary data through PCL, ascii natively) */
    SPCONV_CLOUD_PLY = 3   /**< PLY, read natively */
} spconv_cloud_format;

typedef struct spconv_point_cloud spconv_point_cloud;

/**
 * Read the point cloud in @p path. @p format may be SPCONV_CLOUD_AUTO. @p bin_columns is the
 * number of float32 per point of a `.bin` file (>= 3), or 0 to take it from the name; it must be
 * 0 for the other formats. *out is owned by the caller (free with spconv_point_cloud_destroy).
 * Errors: SPCONV_ERR_IO (missing, unreadable or not a regular file), SPCONV_ERR_FORMAT
 * (malformed content, truncated records, counts that disagree with the file size, ASCII values
 * that do not parse or fit), SPCONV_ERR_NOT_SUPPORTED (binary PCD without PCL),
 * SPCONV_ERR_INVALID_ARGUMENT (bad @p format or @p bin_columns).
 */
spconv_status spconv_point_cloud_read(const char *path, spconv_cloud_format format,
                                      int bin_columns, spconv_point_cloud **out);

/**
 * A point cloud over @p points (float32 [P, F], F >= 3, CPU, any layout; copied to a contiguous
 * tensor if needed) named by @p field_names (F strings, copied; NULL gives x, y, z, f3, f4, ...).
 * Non-finite points are kept: this wraps data, it does not filter it. For writing and tests.
 */
spconv_status spconv_point_cloud_create(spconv_context *ctx, const spconv_tensor *points,
                                        const char *const *field_names, spconv_point_cloud **out);

/** Free @p pc and release its tensor; NULL is a no-op. */
void spconv_point_cloud_destroy(spconv_point_cloud *pc);

/* ---- what a cloud holds (the cloud must not be NULL) ------------------------------------- */

/** Borrowed contiguous float32 CPU tensor [P, F]; retain it to keep it beyond the cloud. */
spconv_tensor *spconv_point_cloud_points(const spconv_point_cloud *pc);
int64_t spconv_point_cloud_num_points(const spconv_point_cloud *pc);
int spconv_point_cloud_num_fields(const spconv_point_cloud *pc);
/** Name of column @p index ("x", "intensity", ...); NULL when out of range. */
const char *spconv_point_cloud_field_name(const spconv_point_cloud *pc, int index);
/** Column of the field called @p name, or -1. */
int spconv_point_cloud_field_index(const spconv_point_cloud *pc, const char *name);
/** Points dropped while reading because x, y or z was NaN or infinite. */
int64_t spconv_point_cloud_dropped_nonfinite(const spconv_point_cloud *pc);
/** The format the cloud was read from (SPCONV_CLOUD_AUTO for a created cloud). */
spconv_cloud_format spconv_point_cloud_format(const spconv_point_cloud *pc);
/** One line on the source: "PCD v0.7, DATA binary_compressed", "KITTI .bin, 4 float32 per
 *  point", "PLY binary_little_endian", "memory". */
const char *spconv_point_cloud_format_detail(const spconv_point_cloud *pc);
/** Width and height as stored (height > 1: an organized cloud, before flattening and dropping). */
void spconv_point_cloud_layout(const spconv_point_cloud *pc, int64_t *width, int64_t *height);

/** Smallest and largest x, y, z over the points. SPCONV_ERR_INVALID_ARGUMENT for an empty cloud.
 *  With non-finite coordinates (only possible in a created cloud) the result is unspecified. */
spconv_status spconv_point_cloud_bounds(const spconv_point_cloud *pc, float min_xyz[3],
                                        float max_xyz[3]);

/* ---- writing: the file appears whole or not at all (temporary name, then rename) --------- */

/**
 * Write @p points (2-d [P, F], F >= 1, floating, any layout and device) as raw little-endian
 * float32 records, the `.bin` layout of KITTI (F = 4) and nuScenes (F = 5).
 */
spconv_status spconv_bin_write(spconv_context *ctx, const char *path, const spconv_tensor *points);

/**
 * Write @p points (2-d [P, F], F >= 1, floating, any layout and device) as a PCD v0.7 file with
 * DATA binary and float32 fields named @p field_names (F names without white space; NULL gives
 * x, y, z, f3, ...), unorganized (WIDTH P, HEIGHT 1). PCL, CloudCompare and this reader open it.
 */
spconv_status spconv_pcd_write(spconv_context *ctx, const char *path, const spconv_tensor *points,
                               const char *const *field_names);

#ifdef __cplusplus
}
#endif
#endif /* SPCONV_IO_H */
