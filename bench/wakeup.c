/* The cost of waking a sleeping thread on this machine: two processes
 * bounce one byte over a pair of pipes, ITER round trips, each side blocked
 * in read() until the other writes (every round trip is two wake-ups of a
 * sleeping process). Pinned to CPUs A and B: A != B measures a wake-up
 * across CPUs (what a daemon's hand-offs between threads pay when the other
 * CPU is idle), A == B one on the same CPU (a context switch only).
 * Prints the median microseconds per round trip over 5 batches.
 * usage: wakeup ITER CPU_A CPU_B */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (sched_setaffinity(0, sizeof s, &s)) { perror("sched_setaffinity"); exit(2); }
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: wakeup ITER CPU_A CPU_B\n"); return 2; }
    int iter = atoi(argv[1]), a = atoi(argv[2]), b = atoi(argv[3]);
    int ping[2], pong[2];
    if (pipe(ping) || pipe(pong)) return 2;
    char x = 0;
    pid_t child = fork();
    if (child == 0) {
        pin(b);
        for (int i = 0; i < 5 * iter; i++)
            if (read(ping[0], &x, 1) != 1 || write(pong[1], &x, 1) != 1) _exit(1);
        _exit(0);
    }
    pin(a);
    double med[5];
    for (int k = 0; k < 5; k++) {
        double t0 = now();
        for (int i = 0; i < iter; i++)
            if (write(ping[1], &x, 1) != 1 || read(pong[0], &x, 1) != 1) return 1;
        med[k] = (now() - t0) / iter;
    }
    int st;
    waitpid(child, &st, 0);
    qsort(med, 5, sizeof med[0], cmp);
    printf("%.1f\n", med[2]);
    return 0;
}
