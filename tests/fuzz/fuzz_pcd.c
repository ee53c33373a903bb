/* Fuzz target: PCD files, through the header check and (with PCL) PCL's reader. */
#include <stdint.h>

#include "fuzz_cloud.h"
#include "scratch_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_read_cloud(fuzz_write_input(".pcd", data, size));
    return 0;
}
