/**
 * @file status.h
 * @brief Status codes and error messages of the spconv C API.
 *
 * Every fallible function returns a ::spconv_status; SPCONV_OK is zero. On failure a precise,
 * human-readable message is kept per thread and returned by spconv_last_error() until the next
 * failure on that thread (e.g. "indices row 17 = (0, 3, 40, 2000) is outside spatial shape
 * (41, 1600, 1408)"). The numbers are stable: they are grouped by category and never reused.
 */
#ifndef SPCONV_STATUS_H
#define SPCONV_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum spconv_status {
    SPCONV_OK = 0,

    /* 1xx: the caller passed something wrong. */
    SPCONV_ERR_INVALID_ARGUMENT = 100, /**< a parameter has a value that makes no sense */
    SPCONV_ERR_NULL_POINTER = 101,     /**< a required pointer is NULL */
    SPCONV_ERR_SHAPE_MISMATCH = 102,   /**< sizes or ndim do not agree */
    SPCONV_ERR_DTYPE_MISMATCH = 103,   /**< element types do not agree or are not allowed */
    SPCONV_ERR_DEVICE_MISMATCH = 104,  /**< tensors live on different devices */
    SPCONV_ERR_OUT_OF_RANGE = 105,     /**< an index, dim or view is outside its bounds */
    SPCONV_ERR_OVERFLOW = 106,         /**< a size or count does not fit its integer type */
    SPCONV_ERR_DUPLICATE_INDEX = 107,  /**< a coordinate row appears twice */
    SPCONV_ERR_GEOMETRY_MISMATCH = 108,/**< a cached rulebook is reused with another geometry */
    SPCONV_ERR_NOT_FOUND = 109,        /**< a named thing (indice_key, parameter) does not exist */

    /* 2xx: resources. */
    SPCONV_ERR_OUT_OF_MEMORY = 200, /**< an allocation failed; nothing was leaked */
    SPCONV_ERR_CAPACITY = 201,      /**< a fixed-capacity structure (hash table) is full */

    /* 3xx: files and formats. */
    SPCONV_ERR_IO = 300,     /**< a file could not be opened, read or written */
    SPCONV_ERR_FORMAT = 301, /**< a file's content is malformed or lies about its size */

    /* 4xx: backends and support. */
    SPCONV_ERR_NOT_SUPPORTED = 400, /**< valid request, but this build/backend has no kernel for it */
    SPCONV_ERR_NO_DEVICE = 401,     /**< the device is not built in or not present */
    SPCONV_ERR_CUDA = 402,          /**< the CUDA runtime reported an error */
    SPCONV_ERR_CUBLAS = 403,        /**< cuBLAS reported an error */

    /* 5xx: bugs in spconv itself. */
    SPCONV_ERR_INTERNAL = 500
} spconv_status;

/** Name of a status ("SPCONV_ERR_OUT_OF_RANGE"); never NULL, "unknown status" for others. */
const char *spconv_status_string(spconv_status status);

/** Detail of the last failure on the calling thread; "" when none. Valid until the next failure
 *  on this thread. */
const char *spconv_last_error(void);

/** Forget the calling thread's last error message. */
void spconv_clear_error(void);

#ifdef __cplusplus
}
#endif
#endif /* SPCONV_STATUS_H */
