/* PCD and PLY files: the header is validated here, in C, then PCL reads the file (through the
 * shim in pointcloud_pcl.cpp) and the raw records are converted to float32. */
#include <inttypes.h>
#include <stdlib.h>

#include "core/error.h"
#include "io/pointcloud_file.h"
#include "io/pointcloud_impl.h"
#include "io/pointcloud_pcd.h"
#include "io/pointcloud_pcl.h"
#include "io/pointcloud_ply.h"
#include "spconv/config.h"

#if SPCONV_HAVE_PCL
/* Validate the header, let PCL read the file, convert; @p expected is the header's point count,
 * which PCL's result must match (PCL may read fewer points than a header announces). */
static spconv_status read_checked(const char *func, const char *path, spconv_cloud_format format,
                                  uint64_t expected, const char *detail,
                                  spconv_point_cloud **out) {
    spconv__raw_cloud raw;
    SPCONV_FORWARD_IF_ERROR(spconv__pcl_read(func, path, format, &raw));
    spconv_status st = SPCONV_OK;
    if (raw.width * raw.height != expected)
        st = spconv__error(SPCONV_ERR_FORMAT, "%s: '%s': its header announces %" PRIu64
                           " points but PCL read %" PRIu64 " x %" PRIu64, func, path, expected,
                           raw.width, raw.height);
    if (st == SPCONV_OK) st = spconv__raw_cloud_convert(func, path, &raw, out);
    spconv__pcl_free(&raw);
    if (st != SPCONV_OK) return st;
    (*out)->format = format;
    snprintf((*out)->format_detail, sizeof (*out)->format_detail, "%s", detail);
    return SPCONV_OK;
}

static spconv_status read_with_pcl(const char *func, const char *path, spconv_cloud_format format,
                                   const char *head, size_t head_len, uint64_t file_size,
                                   spconv_point_cloud **out) {
    char detail[96];
    if (format == SPCONV_CLOUD_PCD) {
        spconv__pcd_header h;
        SPCONV_FORWARD_IF_ERROR(spconv__pcd_check(func, path, head, head_len, file_size, &h));
        snprintf(detail, sizeof detail, "PCD%s%s, DATA %s", h.version[0] ? " v" : "", h.version,
                 spconv__pcd_data_name(h.data));
        return read_checked(func, path, format, h.points, detail, out);
    }
    spconv__ply_header h;
    SPCONV_FORWARD_IF_ERROR(spconv__ply_check(func, path, head, head_len, file_size, &h));
    snprintf(detail, sizeof detail, "PLY %s", h.format);
    return read_checked(func, path, format, h.vertices, detail, out);
}
#endif

spconv_status spconv__cloud_read_pcl(const char *path, spconv_cloud_format format,
                                     spconv_point_cloud **out) {
    static const char func[] = "spconv_point_cloud_read";
    *out = NULL;
#if SPCONV_HAVE_PCL
    /* Room for the header and, for compressed PCD, the two size words after it. */
    size_t max_head = (format == SPCONV_CLOUD_PCD ? SPCONV_PCD_MAX_HEADER : SPCONV_PLY_MAX_HEADER) + 8;
    char *head;
    size_t head_len;
    uint64_t file_size;
    SPCONV_FORWARD_IF_ERROR(
        spconv__file_read_head(func, path, max_head, &head, &head_len, &file_size));
    spconv_status st = read_with_pcl(func, path, format, head, head_len, file_size, out);
    free(head);
    return st;
#else
    FILE *file;
    uint64_t file_size;
    SPCONV_FORWARD_IF_ERROR(spconv__file_open_read(func, path, &file, &file_size));
    fclose(file);
    SPCONV_RETURN_ERROR(SPCONV_ERR_NOT_SUPPORTED,
                        "%s: this build of spconv has no PCL, so it cannot read the %s file '%s' "
                        "(install libpcl-dev and rebuild)", func,
                        format == SPCONV_CLOUD_PCD ? "PCD" : "PLY", path);
#endif
}
