/* PCD and PLY files, from all of their bytes read once (pointcloud.c): the header is validated
 * here, in C, and the points are parsed from the same buffer, so a file swapped on disk between
 * the check and the parse cannot bypass the check. PLY and ASCII PCD are parsed in C
 * (pointcloud_ply_read.c, pointcloud_pcd_ascii.c; see there why PCL is not used for them); binary
 * and binary_compressed PCD go to PCL's PCD reader as the same bytes in memory (the shim in
 * pointcloud_pcl.cpp), never as a path PCL would open again. The records become float32 in
 * pointcloud_raw.c either way. */
#include <inttypes.h>
#include <stdlib.h>

#include "core/error.h"
#include "io/pointcloud_impl.h"
#include "io/pointcloud_native.h"
#include "io/pointcloud_pcd.h"
#include "io/pointcloud_pcl.h"
#include "io/pointcloud_ply.h"
#include "spconv/config.h"

/* Convert @p raw and name the format; @p expected is the header's point count, which the records
 * must match (PCL may read fewer points than a header announces). */
static spconv_status convert(const char *func, const char *path, spconv_cloud_format format,
                             const spconv__raw_cloud *raw, uint64_t expected, const char *detail,
                             spconv_point_cloud **out) {
    SPCONV_RETURN_ERROR_IF(raw->width * raw->height != expected, SPCONV_ERR_FORMAT,
                           "%s: '%s': its header announces %" PRIu64 " points but %" PRIu64
                           " x %" PRIu64 " were read", func, path, expected, raw->width,
                           raw->height);
    SPCONV_FORWARD_IF_ERROR(spconv__raw_cloud_convert(func, path, raw, out));
    (*out)->format = format;
    snprintf((*out)->format_detail, sizeof (*out)->format_detail, "%s", detail);
    return SPCONV_OK;
}

static spconv_status read_pcd_binary(const char *func, const char *path, const char *text,
                                     size_t len, const spconv__pcd_header *h, const char *detail,
                                     spconv_point_cloud **out) {
#if SPCONV_HAVE_PCL
    spconv__raw_cloud raw;
    SPCONV_FORWARD_IF_ERROR(spconv__pcl_read_pcd(func, path, text, len, h->data_offset, &raw));
    spconv_status st = convert(func, path, SPCONV_CLOUD_PCD, &raw, h->points, detail, out);
    spconv__pcl_free(&raw);
    return st;
#else
    (void)text;
    (void)len;
    (void)out;
    SPCONV_RETURN_ERROR(SPCONV_ERR_NOT_SUPPORTED,
                        "%s: this build of spconv has no PCL, so it cannot read the %s PCD file "
                        "'%s' (%s; install libpcl-dev and rebuild)", func,
                        spconv__pcd_data_name(h->data), path, detail);
#endif
}

static spconv_status read_pcd(const char *func, const char *path, const char *text, size_t len,
                              spconv_point_cloud **out) {
    spconv__pcd_header h;
    spconv__pcd_field *fields;
    /* The header must end within the first SPCONV_PCD_MAX_HEADER bytes (+ the compressed sizes). */
    size_t head_len = len < SPCONV_PCD_MAX_HEADER + 8 ? len : SPCONV_PCD_MAX_HEADER + 8;
    SPCONV_FORWARD_IF_ERROR(
        spconv__pcd_check_fields(func, path, text, head_len, len, &h, &fields));
    char detail[96];
    snprintf(detail, sizeof detail, "PCD%s%s, DATA %s", h.version[0] ? " v" : "", h.version,
             spconv__pcd_data_name(h.data));
    spconv_status st;
    if (h.data == SPCONV__PCD_ASCII) {
        spconv__native_cloud cloud;
        st = spconv__pcd_read_ascii(func, path, text, len, &h, fields, &cloud);
        if (st == SPCONV_OK) {
            st = convert(func, path, SPCONV_CLOUD_PCD, &cloud.raw, h.points, detail, out);
            spconv__native_cloud_free(&cloud);
        }
    } else {
        st = read_pcd_binary(func, path, text, len, &h, detail, out);
    }
    free(fields);
    return st;
}

static spconv_status read_ply(const char *func, const char *path, const char *text, size_t len,
                              spconv_point_cloud **out) {
    spconv__ply_header h;
    spconv__ply_layout *layout;
    size_t head_len = len < SPCONV_PLY_MAX_HEADER + 8 ? len : SPCONV_PLY_MAX_HEADER + 8;
    SPCONV_FORWARD_IF_ERROR(
        spconv__ply_check_layout(func, path, text, head_len, len, &h, &layout));
    char detail[96];
    snprintf(detail, sizeof detail, "PLY %s", h.format);
    spconv__native_cloud cloud;
    spconv_status st = spconv__ply_read(func, path, text, len, &h, layout, &cloud);
    if (st == SPCONV_OK) {
        st = convert(func, path, SPCONV_CLOUD_PLY, &cloud.raw, h.vertices, detail, out);
        spconv__native_cloud_free(&cloud);
    }
    spconv__ply_layout_free(layout);
    return st;
}

spconv_status spconv__cloud_read_text(const char *func, const char *path,
                                      spconv_cloud_format format, const char *text, size_t len,
                                      spconv_point_cloud **out) {
    *out = NULL;
    return format == SPCONV_CLOUD_PCD ? read_pcd(func, path, text, len, out)
                                      : read_ply(func, path, text, len, out);
}
