/* gensmall ROOT N DIRS SIZE: writes N files of SIZE bytes as
 * ROOT/dDDDD/fNNNNNNN.bin, file i in directory i % DIRS. Even files are
 * pseudo-random bytes seeded by i (incompressible, like JPEGs), odd files
 * a repeated text line (lz4 shrinks them), so both paths of a compressing
 * pack are exercised. For the scale benchmark (bench/scale_bench.py):
 * Python takes ~1 minute per 100k files here, this takes seconds.
 * Exits 1 naming the path on any error. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void die(const char *what, const char *path) {
    fprintf(stderr, "gensmall: %s: %s: %s\n", path, what, strerror(errno));
    exit(1);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: gensmall ROOT N DIRS SIZE\n");
        return 2;
    }
    const char *root = argv[1];
    long n = atol(argv[2]), dirs = atol(argv[3]), size = atol(argv[4]);
    if (n < 0 || dirs < 1 || size < 0 || size > (1 << 20)) {
        fprintf(stderr, "gensmall: bad arguments\n");
        return 2;
    }
    char path[4096];
    if (mkdir(root, 0755) != 0 && errno != EEXIST) die("mkdir", root);
    for (long d = 0; d < dirs; d++) {
        snprintf(path, sizeof path, "%s/d%04ld", root, d);
        if (mkdir(path, 0755) != 0 && errno != EEXIST) die("mkdir", path);
    }
    unsigned char *buf = malloc(size ? size : 1);
    if (!buf) die("malloc", root);
    for (long i = 0; i < n; i++) {
        if (i % 2 == 0) {
            uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15ull + 1;
            for (long k = 0; k < size; k++) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                buf[k] = (unsigned char)x;
            }
        } else {
            char line[64];
            int len = snprintf(line, sizeof line, "sample %07ld label %03ld\n", i, i % dirs);
            for (long k = 0; k < size; k++) buf[k] = (unsigned char)line[k % len];
        }
        snprintf(path, sizeof path, "%s/d%04ld/f%07ld.bin", root, i % dirs, i);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) die("open", path);
        if (write(fd, buf, size) != size) die("write", path);
        if (close(fd) != 0) die("close", path);
    }
    free(buf);
    return 0;
}
