/* Fuzz target: KITTI / nuScenes .bin reading. The first byte picks the column count (0: from the
 * name), the rest is the file. A successful read must give finite x, y, z in every row. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "scratch_file.h"
#include "spconv/spconv.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    int columns = data[0] % 8 == 0 ? 0 : 2 + data[0] % 8; /* 0, or 3 .. 9 */
    const char *path = fuzz_write_input(".pcd.bin", data + 1, size - 1);
    spconv_point_cloud *pc = NULL;
    if (spconv_point_cloud_read(path, SPCONV_CLOUD_AUTO, columns, &pc) != SPCONV_OK) return 0;
    const float *d = spconv_tensor_data(spconv_point_cloud_points(pc));
    const int64_t rows = spconv_point_cloud_num_points(pc), cols = spconv_point_cloud_num_fields(pc);
    for (int64_t r = 0; r < rows; ++r)
        if (!isfinite(d[r * cols]) || !isfinite(d[r * cols + 1]) || !isfinite(d[r * cols + 2]))
            abort();
    spconv_point_cloud_destroy(pc);
    return 0;
}
