/* Raw system calls from this program's own text (inline `syscall`, as
 * rustix and Go issue them), ITER times: getppid (no file, re-issued by the
 * SIGSYS handler) or stat of a path outside the prefix (served by the stat
 * hook, which hands it to libc). Prints seconds. Run with and without
 * LD_PRELOAD: with the library, every one of these traps (syscall user
 * dispatch), so the difference divided by ITER is the cost of one trap.
 * usage: rawloop getppid|stat ITER [PATH] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>

static long raw2(long nr, long a, long b) {
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(nr), "D"(a), "S"(b) : "rcx", "r11", "memory");
    return r;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: %s getppid|stat ITER [PATH]\n", argv[0]); return 2; }
    int is_stat = strcmp(argv[1], "stat") == 0;
    long iters = atol(argv[2]);
    const char *path = argc > 3 ? argv[3] : "/";
    struct stat st;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < iters; i++) {
        long r = is_stat ? raw2(SYS_stat, (long)path, (long)&st) : raw2(SYS_getppid, 0, 0);
        if (r < 0) return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.6f\n", (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9);
    return 0;
}
