/* The fields of a point cloud and the helpers shared by the readers: private to src/io. */
#ifndef SPCONV_IO_POINTCLOUD_IMPL_H
#define SPCONV_IO_POINTCLOUD_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "spconv/io.h"

struct spconv_point_cloud {
    spconv_tensor *points;     /* f32 CPU contiguous [P, F], F = num_fields >= 3 */
    int num_fields;
    char **field_names;        /* num_fields owned strings; columns 0, 1, 2 are x, y, z when read */
    int64_t dropped_nonfinite; /* rows removed because x, y or z was not finite */
    spconv_cloud_format format;
    char format_detail[96];
    int64_t width, height;     /* as stored; height > 1 for organized clouds */
};

/* A cloud owning @p points (one reference taken over, released on failure too) with copies of
 * @p names (NULL: x, y, z, f3, f4, ...). Rows are kept as they are. */
spconv_status spconv__cloud_make(const char *func, spconv_tensor *points,
                                 const char *const *names, spconv_point_cloud **out);

/* Move the rows of the row-major float matrix @p data [rows, cols] whose first three values are
 * finite to the front, keeping their order; returns how many were kept. */
int64_t spconv__cloud_compact_finite(float *data, int64_t rows, int64_t cols);

/* Shrink pc->points to its first @p rows rows (a view of the same storage). */
spconv_status spconv__cloud_keep_rows(spconv_point_cloud *pc, int64_t rows);

/* @p points (2-d floating, any layout and device) as a contiguous f32 CPU tensor: the input of
 * the writers. Errors name @p func. */
spconv_status spconv__cloud_host_f32(spconv_context *ctx, const char *func,
                                     const spconv_tensor *points, spconv_tensor **out);

/* Readers: each fills a new cloud from @p path, or returns a status with a message. */
spconv_status spconv__cloud_read_bin(const char *path, int columns, spconv_point_cloud **out);
/* A PCD or PLY file from all of its bytes @p text (@p len of them, NUL after them), as read
 * once from @p path; messages name @p func and @p path. */
spconv_status spconv__cloud_read_text(const char *func, const char *path,
                                      spconv_cloud_format format, const char *text, size_t len,
                                      spconv_point_cloud **out);

#endif /* SPCONV_IO_POINTCLOUD_IMPL_H */
