/* The C interface of the PCL shim (pointcloud_pcl.cpp, built only with PCL): binary PCD data read
 * by PCL into pcl::PCLPointCloud2, described as raw bytes plus fields, so that the conversion to
 * float (pointcloud_raw.c) is plain C that is built, tested and fuzzed everywhere; the C readers
 * of PLY and ASCII PCD (pointcloud_native.h) produce the same raw clouds. */
#ifndef SPCONV_IO_POINTCLOUD_PCL_H
#define SPCONV_IO_POINTCLOUD_PCL_H

#include <stddef.h>
#include <stdint.h>

#include "spconv/io.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Scalar types of PCL's point fields. */
typedef enum spconv__scalar {
    SPCONV__BOOL,
    SPCONV__I8,
    SPCONV__U8,
    SPCONV__I16,
    SPCONV__U16,
    SPCONV__I32,
    SPCONV__U32,
    SPCONV__I64,
    SPCONV__U64,
    SPCONV__F32,
    SPCONV__F64
} spconv__scalar;

typedef struct spconv__raw_field {
    const char *name;
    spconv__scalar type;
    uint64_t offset; /* bytes from the start of a point */
    uint64_t count;  /* values of this field in a point */
} spconv__raw_field;

/* Points stored row by row: point i starts at data + i * point_step (host byte order). */
typedef struct spconv__raw_cloud {
    const unsigned char *data;
    uint64_t data_bytes;
    uint64_t width, height;
    uint64_t point_step;
    const spconv__raw_field *fields;
    size_t num_fields;
    void *owner; /* what the shim allocated; freed by spconv__pcl_free */
} spconv__raw_cloud;

/* Parse the binary or binary_compressed PCD file whose @p len bytes are @p text (all of it, as
 * read once by the caller, which validated the header and that the data is long enough; the data
 * starts at @p data_offset) with PCL's PCD reader into *out. PCL opens nothing and prints nothing.
 * Every C++ exception is caught and becomes a status with a message naming @p func and @p path;
 * PCL's own failure codes become SPCONV_ERR_FORMAT. */
spconv_status spconv__pcl_read_pcd(const char *func, const char *path, const char *text,
                                   size_t len, uint64_t data_offset, spconv__raw_cloud *out);

/* Free what spconv__pcl_read_pcd allocated; a zeroed cloud is a no-op. */
void spconv__pcl_free(spconv__raw_cloud *cloud);

/* Bytes of one value of @p type. */
size_t spconv__scalar_size(spconv__scalar type);

/* Convert @p raw into a float32 [P, F] cloud: x, y, z first, the other fields after them in
 * order, COUNT > 1 expanded to name_0.., rgb/rgba unpacked to r, g, b(, a), "_" padding skipped,
 * points with non-finite x/y/z dropped and counted. Checks every field against point_step and
 * the data size against width * height points. */
spconv_status spconv__raw_cloud_convert(const char *func, const char *path,
                                        const spconv__raw_cloud *raw, spconv_point_cloud **out);

#ifdef __cplusplus
}
#endif
#endif /* SPCONV_IO_POINTCLOUD_PCL_H */
