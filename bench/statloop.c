/* A syscall-heavy loop outside the FanStore prefix: stat/open/read/close of
 * the files named in argv, ITER times. Prints seconds. Run with and without
 * LD_PRELOAD to measure what the library costs paths it does not serve. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    long iters = atol(argv[1]);
    char buf[4096];
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < iters; i++) {
        for (int k = 2; k < argc; k++) {
            struct stat st;
            if (stat(argv[k], &st)) return 1;
            int fd = open(argv[k], O_RDONLY);
            if (fd < 0) return 1;
            if (read(fd, buf, sizeof buf) < 0) return 1;
            close(fd);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.6f\n", (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9);
    return 0;
}
