/* POSIX client: open + read/pread/readv/lseek/fstat/stat/lstat/dup/mmap/access.
 * usage: c_posix ROOT LISTFILE */
#include "common.h"
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: %s ROOT LIST\n", argv[0]); return 2; }
    const char *root = argv[1];
    char **files; size_t n = read_list(argv[2], &files);
    static char buf[65536];
    for (size_t i = 0; i < n; i++) {
        char *p = join(root, files[i]);
        struct stat sp, sl, sf;
        int rs = stat(p, &sp), rl = lstat(p, &sl);
        int acc = access(p, R_OK);
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd < 0) { printf("%s open %s\n", files[i], errname(errno)); free(p); continue; }
        int rf = fstat(fd, &sf);
        /* sequential read */
        uint64_t h = FNV0; ssize_t k; size_t total = 0;
        while ((k = read(fd, buf, sizeof buf)) > 0) { h = fnv(h, buf, k); total += k; }
        int rerr = k < 0 ? errno : 0;
        off_t end = lseek(fd, 0, SEEK_END);
        /* pread at a few offsets, past EOF too */
        off_t offs[5] = {0, end / 3, end / 2 + 1, end > 10 ? end - 10 : 0, end + 100};
        uint64_t hp = FNV0; long pn = 0;
        for (int j = 0; j < 5; j++) { k = pread(fd, buf, 16, offs[j]); if (k > 0) { hp = fnv(hp, buf, k); pn += k; } }
        /* readv from the start after lseek */
        lseek(fd, 0, SEEK_SET);
        char a[7], b[300]; struct iovec iov[2] = {{a, sizeof a}, {b, sizeof b}};
        k = readv(fd, iov, 2); uint64_t hv = FNV0;
        if (k > 0) { hv = fnv(hv, a, k < 7 ? k : 7); if (k > 7) hv = fnv(hv, b, k - 7); }
        /* dup shares the offset */
        int d = dup(fd); off_t od = lseek(d, 0, SEEK_CUR); lseek(d, 1, SEEK_SET); off_t of = lseek(fd, 0, SEEK_CUR);
        close(d);
        /* mmap */
        uint64_t hmm = FNV0; const char *mres = "empty";
        if (sf.st_size > 0) {
            void *m = mmap(NULL, sf.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
            if (m == MAP_FAILED) mres = errname(errno);
            else { hmm = fnv(hmm, m, sf.st_size); mres = "ok"; munmap(m, sf.st_size); }
        }
        /* a second open has its own offset */
        int fd2 = open(p, O_RDONLY); lseek(fd, 5, SEEK_SET);
        off_t o2 = lseek(fd2, 0, SEEK_CUR); close(fd2);
        close(fd);
        printf("%s rs=%d rl=%d rf=%d acc=%d size=%lld/%lld/%lld mode=%o/%o/%o mtime=%lld.%09ld/%lld nlink=%ld "
               "read=%zu/%016llx rerr=%s end=%lld pread=%ld/%016llx readv=%zd/%016llx dup=%lld/%lld mmap=%s/%016llx off2=%lld\n",
               files[i], rs, rl, rf, acc, (long long)sp.st_size, (long long)sl.st_size, (long long)sf.st_size,
               sp.st_mode, sl.st_mode, sf.st_mode, (long long)sp.st_mtim.tv_sec, sp.st_mtim.tv_nsec,
               (long long)sf.st_mtim.tv_sec, (long)sp.st_nlink, total, (unsigned long long)h, errname(rerr),
               (long long)end, pn, (unsigned long long)hp, k, (unsigned long long)hv, (long long)od, (long long)of,
               mres, (unsigned long long)hmm, (long long)o2);
        free(p);
    }
    /* errors: ENOENT, ENOTDIR, EISDIR (write on a directory), reading a directory */
    struct { const char *rel; int flags; } bad[] = {
        {"does-not-exist", O_RDONLY}, {"own/edge/one/child", O_RDONLY},
        {"own", O_WRONLY}, {"own/edge", O_RDWR}, {"own/edge/deep/missing/x", O_RDONLY},
    };
    for (size_t j = 0; j < sizeof bad / sizeof bad[0]; j++) {
        char *p = join(root, bad[j].rel);
        errno = 0; int fd = open(p, bad[j].flags);
        printf("open %s %d -> %s\n", bad[j].rel, bad[j].flags, fd >= 0 ? "opened" : errname(errno));
        if (fd >= 0) close(fd);
        struct stat s; errno = 0; int r = stat(p, &s);
        printf("stat %s -> %s\n", bad[j].rel, r == 0 ? (S_ISDIR(s.st_mode) ? "dir" : "file") : errname(errno));
        free(p);
    }
    char *dp = join(root, "own/edge");
    int dfd = open(dp, O_RDONLY | O_DIRECTORY);
    if (dfd < 0) printf("open dir -> %s\n", errname(errno));
    else {
        char c; errno = 0; ssize_t k = read(dfd, &c, 1);
        struct stat s; fstat(dfd, &s);
        printf("open dir ok, read -> %s, fstat dir=%d mode=%o\n", k < 0 ? errname(errno) : "data", S_ISDIR(s.st_mode), s.st_mode);
        close(dfd);
    }
    char *fp = join(root, "own/edge/one");
    errno = 0; int r = open(fp, O_RDONLY | O_DIRECTORY);
    printf("O_DIRECTORY on file -> %s\n", r >= 0 ? "opened" : errname(errno));
    fflush(stdout);
    return 0;
}
