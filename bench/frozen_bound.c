/* The fastest an exact checkpoint writer can go when a fraction of the
 * tensors is frozen (bench/ckpt_bench.py, issue 14's "3x native write" goal).
 *
 *   frozen_bound DIR MIB FROZEN_PERCENT ROUNDS
 *
 * Every fd holds exactly the file's bytes, so a frozen byte can be left
 * unwritten only if the file shares the previous checkpoint's blocks
 * (FICLONERANGE: XFS, btrfs). Without that every byte is copied into the
 * file's pages, as native does: the bound is 1x. With it, the writer must
 * still learn which bytes are frozen (the program hands it a buffer and says
 * nothing), so every frozen byte is compared with the previous checkpoint's
 * (memcmp; both in memory here, the best case) and every other byte is
 * written. Measured side by side, interleaved, medians of ROUNDS:
 *   reflink      whether FICLONERANGE works in DIR (errno if not)
 *   write_ms     open + write(1 MiB at a time) + close of MIB MiB in DIR
 *   memcmp_ms    memcmp of MIB MiB against an equal copy, 1 MiB at a time
 *   bound        without reflink 1; with it write_ms / (memcmp of the frozen
 *                part + write of the rest), on one core and with that work
 *                split perfectly over every core
 * Prints one line: frozen_bound mib=.. frozen=.. reflink=yes|errno write_ms=..
 * memcmp_ms=.. bound_1core=..x bound_all_cores=..x cores=..
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "monotonic.h"

/* 0 if DIR's file system clones a 64 KiB range between two files, else the errno. */
static int reflink_errno(const char *dir, const char *buf) {
    char src[4096], dst[4096];
    snprintf(src, sizeof src, "%s/frozen_bound.src.%d", dir, (int)getpid());
    snprintf(dst, sizeof dst, "%s/frozen_bound.dst.%d", dir, (int)getpid());
    int s = open(src, O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, 0600);
    int d = open(dst, O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, 0600);
    int err = 0;
    if (s < 0 || d < 0 || write(s, buf, 65536) != 65536 || fsync(s) != 0) {
        err = errno ? errno : EIO;
    } else {
        struct file_clone_range r = {.src_fd = s, .src_offset = 0, .src_length = 65536, .dest_offset = 0};
        if (ioctl(d, FICLONERANGE, &r) != 0) err = errno;
    }
    if (s >= 0) close(s);
    if (d >= 0) close(d);
    unlink(src);
    unlink(dst);
    return err;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: frozen_bound DIR MIB FROZEN_PERCENT ROUNDS\n");
        return 2;
    }
    const long mib = atol(argv[2]), frozen = atol(argv[3]);
    const int rounds = atoi(argv[4]);
    const size_t len = (size_t)mib << 20, step = 1 << 20;
    if (mib <= 0 || frozen < 0 || frozen > 100 || rounds <= 0 || rounds > 1000) {
        fprintf(stderr, "frozen_bound: bad arguments\n");
        return 2;
    }
    char *a = malloc(len), *b = malloc(len), path[4096];
    double *tw = calloc(rounds, sizeof *tw), *tc = calloc(rounds, sizeof *tc);
    if (!a || !b || !tw || !tc) {
        fprintf(stderr, "frozen_bound: out of memory\n");
        return 1;
    }
    srand(1);
    for (size_t i = 0; i < len; i++) a[i] = (char)rand();
    memcpy(b, a, len);
    snprintf(path, sizeof path, "%s/frozen_bound.%d", argv[1], (int)getpid());
    long equal = 0;
    for (int r = 0; r < rounds; r++) {
        double t = now();
        for (size_t o = 0; o < len; o += step) equal += memcmp(a + o, b + o, step) == 0;
        tc[r] = now() - t;
        t = now();
        int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
        if (fd < 0) {
            perror(path);
            return 1;
        }
        for (size_t o = 0; o < len; o += step)
            if (write(fd, a + o, step) != (ssize_t)step) {
                perror("write");
                return 1;
            }
        close(fd);
        tw[r] = now() - t;
        unlink(path);
    }
    if (equal != (long)(rounds * (len / step))) {
        fprintf(stderr, "frozen_bound: equal buffers compared unequal\n");
        return 1;
    }
    qsort(tw, rounds, sizeof *tw, cmp_double);
    qsort(tc, rounds, sizeof *tc, cmp_double);
    double w = tw[rounds / 2], c = tc[rounds / 2], f = frozen / 100.0;
    double least = f * c + (1 - f) * w;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int rl = reflink_errno(argv[1], a);
    char reflink[64];
    snprintf(reflink, sizeof reflink, "%s", rl == 0 ? "yes" : strerror(rl));
    for (char *q = reflink; *q; q++)
        if (*q == ' ') *q = '_';
    double one = rl == 0 ? w / least : 1.0, all = rl == 0 ? w / least * (cores > 0 ? cores : 1) : 1.0;
    printf("frozen_bound mib=%ld frozen=%ld reflink=%s write_ms=%.1f memcmp_ms=%.1f bound_1core=%.2fx bound_all_cores=%.2fx cores=%ld\n",
           mib, frozen, reflink, w * 1e3, c * 1e3, one, all, cores);
    return 0;
}
