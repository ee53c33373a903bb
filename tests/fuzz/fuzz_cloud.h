/* Shared by the PCD and PLY fuzz targets: read a file through the full reader (header check, PCL,
 * conversion) and check what a successful read promises. */
#ifndef SPCONV_FUZZ_CLOUD_H
#define SPCONV_FUZZ_CLOUD_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "spconv/spconv.h"

static inline void fuzz_read_cloud(const char *path) {
    spconv_point_cloud *pc = NULL;
    spconv_status st = spconv_point_cloud_read(path, SPCONV_CLOUD_AUTO, 0, &pc);
    if (st != SPCONV_OK) {
        if (pc != NULL || spconv_last_error()[0] == '\0') abort(); /* failures leave a message */
        return;
    }
    const spconv_tensor *t = spconv_point_cloud_points(pc);
    const float *d = spconv_tensor_data(t);
    const int64_t rows = spconv_point_cloud_num_points(pc), cols = spconv_point_cloud_num_fields(pc);
    if (cols < 3 || strcmp(spconv_point_cloud_field_name(pc, 0), "x") != 0) abort();
    for (int64_t r = 0; r < rows; ++r)
        if (!isfinite(d[r * cols]) || !isfinite(d[r * cols + 1]) || !isfinite(d[r * cols + 2]))
            abort();
    spconv_point_cloud_destroy(pc);
}

#endif
