/* now(): the monotonic clock in seconds, what the C benchmarks time with.
 * Included by readfiles.c, scale_readers.c and frozen_bound.c (a
 * quoted include resolves next to the source, however it is compiled). */
#ifndef FANSTORE_BENCH_MONOTONIC_H
#define FANSTORE_BENCH_MONOTONIC_H
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
#endif
