/* Version and build queries. */
#include <stdio.h>

#include "core/backend.h"
#include "spconv/spconv.h"

#define SPCONV_STR2(x) #x
#define SPCONV_STR(x) SPCONV_STR2(x)

unsigned spconv_version(void) { return SPCONV_VERSION_NUMBER; }

const char *spconv_version_string(void) {
    return SPCONV_STR(SPCONV_VERSION_MAJOR) "." SPCONV_STR(SPCONV_VERSION_MINOR) "." SPCONV_STR(
        SPCONV_VERSION_PATCH);
}

int spconv_has_cuda(void) { return SPCONV_HAVE_CUDA; }

int spconv_cuda_device_count(void) {
    const spconv_backend *cuda = spconv__backend_for(spconv_cuda(0));
    return cuda == NULL ? 0 : cuda->device_count();
}

void spconv_build_report(char *buf, size_t buflen) {
    if (buf == NULL || buflen == 0) return;
    /* The emulated backend has a device, but no GPU: the report must not let it pass for one. */
    const char *cuda = !SPCONV_HAVE_CUDA ? "not built"
                       : SPCONV_CUDA_EMULATION
                           ? "built as the host emulation (its kernels run on the CPU)"
                           : "built";
    snprintf(buf, buflen,
             "spconv %s\n"
             "  CUDA backend: %s (devices: %d%s)\n"
             "  BLAS: %s\n"
             "  PCL (PCD/PLY): %s\n"
             "  OpenMP: %s\n"
             "  PNG: %s\n",
             spconv_version_string(), cuda, spconv_cuda_device_count(),
             SPCONV_CUDA_EMULATION ? ", emulated: no GPU" : "",
             SPCONV_HAVE_BLAS ? "OpenBLAS (CBLAS)" : "plain C GEMM", SPCONV_HAVE_PCL ? "yes" : "no",
             SPCONV_HAVE_OPENMP ? "yes" : "no", SPCONV_HAVE_PNG ? "yes" : "no");
}
