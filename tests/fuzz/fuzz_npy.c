/* Fuzz target: .npy reading (spconv_npy_read). A successful read must give a CPU tensor whose
 * bytes can all be touched. */
#include <stdint.h>
#include <stdlib.h>

#include "scratch_file.h"
#include "spconv/spconv.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    spconv_tensor *t = NULL;
    if (spconv_npy_read(fuzz_write_input(".npy", data, size), &t) != SPCONV_OK) {
        if (t != NULL) abort();
        return 0;
    }
    const unsigned char *bytes = spconv_tensor_data(t);
    size_t n = (size_t)spconv_tensor_numel(t) * spconv_dtype_size(spconv_tensor_dtype(t));
    volatile unsigned char sink = 0;
    for (size_t i = 0; i < n; ++i) sink ^= bytes[i]; /* ASan checks every byte is allocated */
    (void)sink;
    spconv_tensor_release(t);
    return 0;
}
