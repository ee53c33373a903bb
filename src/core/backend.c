/* Choosing a backend from a device, and the device clocks over the backends' mark slots. */
#include <stdlib.h>

#include "core/backend.h"
#include "core/device_clock.h"
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

/* ---- device clocks (device_clock.h) ---------------------------------------------------------
 * Here rather than in a file of their own: the CUDA backend's conv (a static library linked after
 * this one) marks phases on them, and every program that reaches a backend links this file. */

typedef struct clock_span {
    int start, end;
    double *dest;
} clock_span;

struct spconv__device_clock {
    const spconv_backend *backend;
    spconv_device device;
    void **marks; /* created on first use, reused after each resolve or reset */
    int num_marks, used_marks, cap_marks;
    clock_span *spans;
    int num_spans, cap_spans;
};

spconv_status spconv__device_clock_create(spconv_device device, spconv__device_clock **out) {
    *out = NULL;
    const spconv_backend *backend = spconv__backend_for(device);
    if (backend == NULL || backend->mark_create == NULL) return SPCONV_OK;
    spconv__device_clock *clock = calloc(1, sizeof *clock);
    SPCONV_RETURN_ERROR_IF(clock == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                           "out of host memory for a device clock");
    clock->backend = backend;
    clock->device = device;
    *out = clock;
    return SPCONV_OK;
}

void spconv__device_clock_destroy(spconv__device_clock *clock) {
    if (clock == NULL) return;
    for (int i = 0; i < clock->num_marks; ++i)
        clock->backend->mark_destroy(clock->device.index, clock->marks[i]);
    free(clock->marks);
    free(clock->spans);
    free(clock);
}

spconv_device spconv__device_clock_device(const spconv__device_clock *clock) {
    return clock->device;
}

spconv_status spconv__device_clock_mark(spconv__device_clock *clock, spconv_context *ctx,
                                        int *mark) {
    *mark = -1;
    if (clock == NULL) return SPCONV_OK;
    if (clock->used_marks == clock->num_marks) {
        if (clock->num_marks == clock->cap_marks) {
            const int cap = clock->cap_marks > 0 ? 2 * clock->cap_marks : 64;
            void **grown = realloc(clock->marks, (size_t)cap * sizeof *grown);
            SPCONV_RETURN_ERROR_IF(grown == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                                   "out of host memory for %d clock marks", cap);
            clock->marks = grown;
            clock->cap_marks = cap;
        }
        SPCONV_FORWARD_IF_ERROR(clock->backend->mark_create(clock->device.index,
                                                            &clock->marks[clock->num_marks]));
        clock->num_marks++;
    }
    SPCONV_FORWARD_IF_ERROR(clock->backend->mark_record(ctx, clock->device.index,
                                                        clock->marks[clock->used_marks]));
    *mark = clock->used_marks++;
    return SPCONV_OK;
}

spconv_status spconv__device_clock_span(spconv__device_clock *clock, int start, int end,
                                        double *dest) {
    if (clock == NULL || start < 0 || end < 0 || dest == NULL) return SPCONV_OK;
    if (clock->num_spans == clock->cap_spans) {
        const int cap = clock->cap_spans > 0 ? 2 * clock->cap_spans : 64;
        clock_span *grown = realloc(clock->spans, (size_t)cap * sizeof *grown);
        SPCONV_RETURN_ERROR_IF(grown == NULL, SPCONV_ERR_OUT_OF_MEMORY,
                               "out of host memory for %d clock spans", cap);
        clock->spans = grown;
        clock->cap_spans = cap;
    }
    clock->spans[clock->num_spans++] = (clock_span){start, end, dest};
    return SPCONV_OK;
}

int spconv__device_clock_pending(const spconv__device_clock *clock) {
    return clock != NULL && clock->num_spans > 0;
}

spconv_status spconv__device_clock_resolve(spconv__device_clock *clock) {
    if (clock == NULL) return SPCONV_OK;
    spconv_status st = SPCONV_OK;
    for (int i = 0; i < clock->num_spans && st == SPCONV_OK; ++i) {
        const clock_span *s = &clock->spans[i];
        double ms = 0.0;
        st = clock->backend->mark_elapsed_ms(clock->device.index, clock->marks[s->start],
                                             clock->marks[s->end], &ms);
        if (st == SPCONV_OK) *s->dest += ms;
    }
    spconv__device_clock_reset(clock);
    return st;
}

void spconv__device_clock_reset(spconv__device_clock *clock) {
    if (clock == NULL) return;
    clock->used_marks = 0;
    clock->num_spans = 0;
}
