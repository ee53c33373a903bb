/* Choosing a backend from a device. */
#include "core/backend.h"
#include "core/error.h"
#include "spconv/config.h"

const spconv_backend *spconv__backend_for(spconv_device device) {
    switch (device.type) {
    case SPCONV_DEVICE_CPU: return &spconv__cpu_backend;
    case SPCONV_DEVICE_CUDA:
#if SPCONV_HAVE_CUDA
        return &spconv__cuda_backend;
#else
        return NULL;
#endif
    }
    return NULL;
}

spconv_status spconv__backend_check(const char *func, spconv_device device,
                                    const spconv_backend **out) {
    *out = NULL;
    const spconv_backend *backend = spconv__backend_for(device);
    if (device.type == SPCONV_DEVICE_CPU) {
        SPCONV_RETURN_ERROR_IF(device.index != 0, SPCONV_ERR_INVALID_ARGUMENT,
                               "%s: CPU device index must be 0, got %d", func, device.index);
    } else if (device.type == SPCONV_DEVICE_CUDA) {
        SPCONV_RETURN_ERROR_IF(backend == NULL, SPCONV_ERR_NO_DEVICE,
                               "%s: this build of spconv has no CUDA backend", func);
        int count = backend->device_count();
        SPCONV_RETURN_ERROR_IF(device.index < 0 || device.index >= count, SPCONV_ERR_NO_DEVICE,
                               "%s: CUDA device %d is not present (%d device%s found)", func,
                               device.index, count, count == 1 ? "" : "s");
    } else {
        SPCONV_RETURN_ERROR(SPCONV_ERR_INVALID_ARGUMENT, "%s: unknown device type %d", func,
                            (int)device.type);
    }
    *out = backend;
    return SPCONV_OK;
}
