/* scale_readers P < LIST: P forked readers split the paths of LIST (one per
 * line; reader p takes lines p, p+P, ...) and each opens, reads whole and
 * closes its files. Unlike readfiles.c a failed open or read does not stop
 * a reader: it is counted. Prints one line:
 *   files bytes seconds errors eio emfile
 * (files = opens that read to the end; errors = failed opens or reads, of
 * which eio had errno EIO and emfile EMFILE or ENFILE). The first failure
 * of each reader, and its first one with another errno, are reported on
 * stderr with their paths. Used by bench/scale_bench.py. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "monotonic.h"

int main(int argc, char **argv) {
    int procs = argc > 1 ? atoi(argv[1]) : 1;
    if (procs < 1) procs = 1;
    size_t cap = 1 << 16, n = 0;
    char **paths = malloc(cap * sizeof *paths);
    char line[8192];
    while (paths && fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        if (n == cap) paths = realloc(paths, (cap *= 2) * sizeof *paths);
        if (paths) paths[n++] = strdup(line);
    }
    if (!paths) return 2;
    int pipefd[2];
    if (pipe(pipefd)) return 2;
    double t0 = now();
    for (int p = 0; p < procs; p++) {
        pid_t pid = fork();
        if (pid < 0) return 2;
        if (pid == 0) {
            static char buf[1 << 16];
            long long v[5] = {0, 0, 0, 0, 0}; /* files, bytes, errors, eio, emfile */
            int first_err = 0;
            for (size_t i = p; i < n; i += procs) {
                int fd = open(paths[i], O_RDONLY);
                int err = 0;
                if (fd < 0) {
                    err = errno;
                } else {
                    ssize_t r;
                    while ((r = read(fd, buf, sizeof buf)) > 0) v[1] += r;
                    if (r < 0) err = errno;
                    close(fd);
                }
                if (err) {
                    v[2]++;
                    if (err == EIO) v[3]++;
                    if (err == EMFILE || err == ENFILE) v[4]++;
                    if (!first_err || (first_err > 0 && err != first_err)) {
                        fprintf(stderr, "scale_readers: %s: %s\n", paths[i], strerror(err));
                        first_err = first_err ? -1 : err;
                    }
                } else {
                    v[0]++;
                }
            }
            if (write(pipefd[1], v, sizeof v) != sizeof v) _exit(1);
            _exit(0);
        }
    }
    close(pipefd[1]);
    long long tot[5] = {0, 0, 0, 0, 0}, v[5];
    while (read(pipefd[0], v, sizeof v) == sizeof v)
        for (int k = 0; k < 5; k++) tot[k] += v[k];
    int status, bad = 0;
    while (wait(&status) > 0)
        if (!WIFEXITED(status) || WEXITSTATUS(status)) bad = 1;
    printf("%lld %lld %.6f %lld %lld %lld\n", tot[0], tot[1], now() - t0, tot[2], tot[3], tot[4]);
    return bad;
}
