/* KITTI / nuScenes .bin scans: raw little-endian float32 records, read and written natively.
 * The records are copied as they are, so this assumes a little-endian host (x86-64, AArch64). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/error.h"
#include "io/pointcloud_file.h"
#include "io/pointcloud_impl.h"

/* Field names by the conventions of the two datasets; other widths get generic names. */
static void bin_field_names(int columns, const char **names, char (*generated)[16]) {
    static const char *const known[5] = {"x", "y", "z", "intensity", "ring"};
    for (int i = 0; i < columns; ++i) {
        if (i < 3 || (columns == 4 && i == 3) || (columns == 5 && i < 5)) {
            names[i] = known[i];
        } else {
            snprintf(generated[i], sizeof generated[i], "f%d", i);
            names[i] = generated[i];
        }
    }
}

static spconv_status make_bin_cloud(spconv_tensor *points, int columns, int64_t rows,
                                    spconv_point_cloud **out) {
    static const char func[] = "spconv_point_cloud_read";
    const char **names = malloc((size_t)columns * sizeof *names);
    char (*generated)[16] = malloc((size_t)columns * sizeof *generated);
    if (names == NULL || generated == NULL) {
        free(names);
        free(generated);
        spconv_tensor_release(points);
        SPCONV_RETURN_ERROR(SPCONV_ERR_OUT_OF_MEMORY, "%s: out of memory for field names", func);
    }
    bin_field_names(columns, names, generated);
    spconv_status st = spconv__cloud_make(func, points, names, out);
    free(names);
    free(generated);
    SPCONV_FORWARD_IF_ERROR(st);
    spconv_point_cloud *pc = *out;
    float *data = spconv_tensor_data(pc->points);
    int64_t kept = spconv__cloud_compact_finite(data, rows, columns);
    pc->dropped_nonfinite = rows - kept;
    pc->format = SPCONV_CLOUD_BIN;
    snprintf(pc->format_detail, sizeof pc->format_detail, "%s .bin, %d float32 per point",
             columns == 4 ? "KITTI" : columns == 5 ? "nuScenes" : "raw", columns);
    st = spconv__cloud_keep_rows(pc, kept);
    if (st != SPCONV_OK) {
        spconv_point_cloud_destroy(pc);
        *out = NULL;
    }
    return st;
}

spconv_status spconv__cloud_read_bin(const char *path, int columns, spconv_point_cloud **out) {
    static const char func[] = "spconv_point_cloud_read";
    *out = NULL;
    FILE *f;
    uint64_t size;
    SPCONV_FORWARD_IF_ERROR(spconv__file_open_read(func, path, &f, &size));
    uint64_t record = 4u * (uint64_t)columns;
    if (size % record != 0) {
        fclose(f);
        SPCONV_RETURN_ERROR(SPCONV_ERR_FORMAT,
                            "%s: '%s' has %" PRIu64 " bytes, not a whole number of %" PRIu64
                            "-byte records (%d float32 per point): truncated, or the wrong "
                            "column count", func, path, size, record, columns);
    }
    int64_t rows = (int64_t)(size / record);
    spconv_tensor *points = NULL;
    spconv_status st = spconv_tensor_empty(spconv_cpu(), SPCONV_F32, 2,
                                           (const int64_t[]){rows, columns}, &points);
    if (st == SPCONV_OK)
        st = spconv__file_read_exact(func, path, f, spconv_tensor_data(points), (size_t)size);
    fclose(f);
    if (st != SPCONV_OK) {
        spconv_tensor_release(points);
        return st;
    }
    return make_bin_cloud(points, columns, rows, out);
}

spconv_status spconv__cloud_host_f32(spconv_context *ctx, const char *func,
                                     const spconv_tensor *points, spconv_tensor **out) {
    *out = NULL;
    SPCONV_CHECK_NOT_NULL(func, points);
    SPCONV_RETURN_ERROR_IF(spconv_tensor_ndim(points) != 2 || spconv_tensor_size(points, 1) < 1,
                           SPCONV_ERR_SHAPE_MISMATCH,
                           "%s: points must be [P, F] with F >= 1, got %d dims", func,
                           spconv_tensor_ndim(points));
    SPCONV_RETURN_ERROR_IF(!spconv_dtype_is_floating(spconv_tensor_dtype(points)),
                           SPCONV_ERR_DTYPE_MISMATCH, "%s: points must be floating, got %s", func,
                           spconv_dtype_name(spconv_tensor_dtype(points)));
    spconv_tensor *host;
    SPCONV_FORWARD_IF_ERROR(spconv_tensor_to_device(ctx, points, spconv_cpu(), &host));
    spconv_status st = spconv_tensor_to_dtype(ctx, host, SPCONV_F32, out);
    spconv_tensor_release(host);
    return st;
}

spconv_status spconv_bin_write(spconv_context *ctx, const char *path, const spconv_tensor *points) {
    static const char func[] = "spconv_bin_write";
    spconv_tensor *host;
    SPCONV_FORWARD_IF_ERROR(spconv__cloud_host_f32(ctx, func, points, &host));
    spconv__file_writer w;
    spconv_status st = spconv__file_writer_open(func, path, &w);
    if (st == SPCONV_OK) {
        spconv__file_writer_put(&w, spconv_tensor_data(host),
                                (size_t)spconv_tensor_numel(host) * sizeof(float));
        st = spconv__file_writer_commit(func, &w);
    }
    spconv_tensor_release(host);
    return st;
}
