/* Internal error helpers: one line per error path at each call site (after zstd's
 * RETURN_ERROR_IF / FORWARD_IF_ERROR). The message goes to the thread's last-error slot. */
#ifndef SPCONV_CORE_ERROR_H
#define SPCONV_CORE_ERROR_H

#include "spconv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define SPCONV_PRINTF_LIKE(fmt_index, first_arg) __attribute__((format(printf, fmt_index, first_arg)))
#else
#define SPCONV_PRINTF_LIKE(fmt_index, first_arg)
#endif

/** Record a printf-style message as the thread's last error and return @p status. */
spconv_status spconv__error(spconv_status status, const char *fmt, ...) SPCONV_PRINTF_LIKE(2, 3);

#ifdef __cplusplus
}
#endif

/** Return @p code with a message when @p cond holds. */
#define SPCONV_RETURN_ERROR_IF(cond, code, ...)       \
    do {                                              \
        if (cond) return spconv__error((code), __VA_ARGS__); \
    } while (0)

/** Return @p code with a message. */
#define SPCONV_RETURN_ERROR(code, ...) return spconv__error((code), __VA_ARGS__)

/** Return the status of @p expr when it is not SPCONV_OK (its message is already recorded). */
#define SPCONV_FORWARD_IF_ERROR(expr)                    \
    do {                                                 \
        spconv_status spconv_fwd_status_ = (expr);       \
        if (spconv_fwd_status_ != SPCONV_OK) return spconv_fwd_status_; \
    } while (0)

/** Store the status of @p expr in @p st and jump to @p label when it failed (for cleanup). */
#define SPCONV_TRY_GOTO(st, expr, label)       \
    do {                                       \
        (st) = (expr);                         \
        if ((st) != SPCONV_OK) goto label;     \
    } while (0)

/** Record a message, store @p code in @p st and jump to @p label. */
#define SPCONV_FAIL_GOTO(st, label, code, ...)       \
    do {                                             \
        (st) = spconv__error((code), __VA_ARGS__);   \
        goto label;                                  \
    } while (0)

/** Null-pointer check that names the argument. */
#define SPCONV_CHECK_NOT_NULL(func, ptr) \
    SPCONV_RETURN_ERROR_IF((ptr) == NULL, SPCONV_ERR_NULL_POINTER, "%s: '%s' is NULL", (func), #ptr)

#endif /* SPCONV_CORE_ERROR_H */
