/* A device's own clock for timing work queued on a stream (CUDA events), for benchmarks and the
 * network's per-layer statistics. Marks are queued on a context's stream as the host goes; spans
 * between two marks are read only later, when the caller resolves them (which waits for the last
 * mark), so timing adds no host wait to the work it times. A backend without such a clock (the
 * CPU, whose host clock is the device's) has no device clock: create gives NULL, and every other
 * call takes NULL as "do nothing". Not for concurrent use. Implemented in backend.c. */
#ifndef SPCONV_CORE_DEVICE_CLOCK_H
#define SPCONV_CORE_DEVICE_CLOCK_H

#include "spconv/context.h"
#include "spconv/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spconv__device_clock spconv__device_clock;

/* The clock of @p device, or *out NULL when its backend has none. */
spconv_status spconv__device_clock_create(spconv_device device, spconv__device_clock **out);
void spconv__device_clock_destroy(spconv__device_clock *clock);
spconv_device spconv__device_clock_device(const spconv__device_clock *clock);

/* Queue a mark on @p ctx's stream (the legacy stream without a context of the clock's device);
 * *mark is its number, -1 without a clock. */
spconv_status spconv__device_clock_mark(spconv__device_clock *clock, spconv_context *ctx,
                                        int *mark);
/* When resolved, add the milliseconds from mark @p start to mark @p end into *dest. */
spconv_status spconv__device_clock_span(spconv__device_clock *clock, int start, int end,
                                        double *dest);
/* 1 when spans wait to be resolved. */
int spconv__device_clock_pending(const spconv__device_clock *clock);
/* Wait for the marks, add every span into its destination, then forget marks and spans (the
 * events are kept for the next ones). */
spconv_status spconv__device_clock_resolve(spconv__device_clock *clock);
/* Forget marks and spans without adding anything. */
void spconv__device_clock_reset(spconv__device_clock *clock);

/* A stopwatch over phases: lap(p) ends the running phase (its time goes to dest[running]) and
 * starts phase p; phase < 0 or a NULL destination counts nowhere. */
typedef struct spconv__lap_timer {
    spconv__device_clock *clock; /* NULL: no timing */
    spconv_context *ctx;
    double *dest[4];
    int last_mark;
    int phase;
} spconv__lap_timer;

static inline void spconv__lap_init(spconv__lap_timer *t, spconv__device_clock *clock,
                                    spconv_context *ctx, double *d0, double *d1, double *d2) {
    t->clock = clock;
    t->ctx = ctx;
    t->dest[0] = d0;
    t->dest[1] = d1;
    t->dest[2] = d2;
    t->dest[3] = 0;
    t->last_mark = -1;
    t->phase = -1;
}

static inline spconv_status spconv__lap(spconv__lap_timer *t, int phase) {
    if (t->clock == 0 || phase == t->phase) return SPCONV_OK;
    int mark = -1;
    spconv_status st = spconv__device_clock_mark(t->clock, t->ctx, &mark);
    if (st == SPCONV_OK && t->last_mark >= 0 && t->phase >= 0 && t->phase < 4 &&
        t->dest[t->phase] != 0)
        st = spconv__device_clock_span(t->clock, t->last_mark, mark, t->dest[t->phase]);
    t->last_mark = mark;
    t->phase = phase;
    return st;
}

#ifdef __cplusplus
}
#endif
#endif /* SPCONV_CORE_DEVICE_CLOCK_H */
