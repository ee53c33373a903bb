/* Status names and the per-thread last-error message. */
#include <stdarg.h>
#include <stdio.h>

#include "core/error.h"

#define SPCONV_ERROR_MESSAGE_BYTES 1024

static _Thread_local char last_error[SPCONV_ERROR_MESSAGE_BYTES];

const char *spconv_status_string(spconv_status status) {
    switch (status) {
    case SPCONV_OK: return "SPCONV_OK";
    case SPCONV_ERR_INVALID_ARGUMENT: return "SPCONV_ERR_INVALID_ARGUMENT";
    case SPCONV_ERR_NULL_POINTER: return "SPCONV_ERR_NULL_POINTER";
    case SPCONV_ERR_SHAPE_MISMATCH: return "SPCONV_ERR_SHAPE_MISMATCH";
    case SPCONV_ERR_DTYPE_MISMATCH: return "SPCONV_ERR_DTYPE_MISMATCH";
    case SPCONV_ERR_DEVICE_MISMATCH: return "SPCONV_ERR_DEVICE_MISMATCH";
    case SPCONV_ERR_OUT_OF_RANGE: return "SPCONV_ERR_OUT_OF_RANGE";
    case SPCONV_ERR_OVERFLOW: return "SPCONV_ERR_OVERFLOW";
    case SPCONV_ERR_DUPLICATE_INDEX: return "SPCONV_ERR_DUPLICATE_INDEX";
    case SPCONV_ERR_GEOMETRY_MISMATCH: return "SPCONV_ERR_GEOMETRY_MISMATCH";
    case SPCONV_ERR_NOT_FOUND: return "SPCONV_ERR_NOT_FOUND";
    case SPCONV_ERR_OUT_OF_MEMORY: return "SPCONV_ERR_OUT_OF_MEMORY";
    case SPCONV_ERR_CAPACITY: return "SPCONV_ERR_CAPACITY";
    case SPCONV_ERR_IO: return "SPCONV_ERR_IO";
    case SPCONV_ERR_FORMAT: return "SPCONV_ERR_FORMAT";
    case SPCONV_ERR_NOT_SUPPORTED: return "SPCONV_ERR_NOT_SUPPORTED";
    case SPCONV_ERR_NO_DEVICE: return "SPCONV_ERR_NO_DEVICE";
    case SPCONV_ERR_CUDA: return "SPCONV_ERR_CUDA";
    case SPCONV_ERR_CUBLAS: return "SPCONV_ERR_CUBLAS";
    case SPCONV_ERR_INTERNAL: return "SPCONV_ERR_INTERNAL";
    }
    return "unknown status";
}

const char *spconv_last_error(void) { return last_error; }

void spconv_clear_error(void) { last_error[0] = '\0'; }

spconv_status spconv__error(spconv_status status, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, args);
    va_end(args);
    return status;
}
