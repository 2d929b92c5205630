/*
 * clock.h — the clocks the engine, the store, the daemon and the tools read: the
 * monotonic clock for durations, timeouts and deadlines, the wall clock for times that
 * are stored or shown. It lives in the lowest layer so that every layer above shares it
 * (ARCHITECTURE.md: includes point downwards only).
 *
 * clock_gettime cannot fail for these two clocks on Linux, so none of these report an
 * error.
 */
#ifndef LLMS_CLOCK_H
#define LLMS_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Nanoseconds on CLOCK_MONOTONIC. */
static inline int64_t clock_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Milliseconds on CLOCK_MONOTONIC, with their fraction (for durations measured in ms). */
static inline double clock_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Seconds on CLOCK_MONOTONIC, with their fraction. */
static inline double clock_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Milliseconds since the Unix epoch (CLOCK_REALTIME). */
static inline int64_t clock_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#endif
