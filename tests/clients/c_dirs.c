/* Directory client: opendir/readdir/rewinddir/telldir/seekdir/dirfd/fdopendir,
 * fstatat/openat relative to a directory fd, scandir, nftw, glob, chdir/getcwd.
 * usage: c_dirs ROOT  -- all output sorted and relative to ROOT. */
#include "common.h"
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <glob.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *ROOT;
static size_t ROOTLEN;
static char **lines; static size_t nlines, caplines;

static void add(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void add(const char *fmt, ...) {
    char *s; va_list ap; va_start(ap, fmt);
    if (vasprintf(&s, fmt, ap) < 0) exit(3);
    va_end(ap);
    if (nlines == caplines) { caplines = caplines ? 2 * caplines : 256; lines = realloc(lines, caplines * sizeof *lines); }
    lines[nlines++] = s;
}
static void flush_sorted(const char *title) {
    qsort(lines, nlines, sizeof *lines, cmpstr);
    printf("== %s (%zu)\n", title, nlines);
    for (size_t i = 0; i < nlines; i++) { printf("%s\n", lines[i]); free(lines[i]); }
    nlines = 0;
}
static const char *rel(const char *p) {
    if (!strncmp(p, ROOT, ROOTLEN)) { p += ROOTLEN; while (*p == '/') p++; }
    return *p ? p : ".";
}
static char dtc(unsigned char t) {
    switch (t) { case DT_REG: return 'f'; case DT_DIR: return 'd'; case DT_LNK: return 'l'; case DT_UNKNOWN: return '?'; default: return 'o'; }
}

/* recursive readdir walk; checks . and .., rewinddir, telldir/seekdir, fstatat/openat via dirfd */
static void walk(const char *path) {
    DIR *d = opendir(path);
    if (!d) { add("opendir %s -> %s", rel(path), errname(errno)); return; }
    int dfd = dirfd(d);
    struct dirent *e; int dot = 0, dotdot = 0; long count = 0, real = 0; long mark = -1; char mark_name[256] = "";
    char **subs = NULL; size_t nsubs = 0;
    long before = telldir(d);
    /* the mark is the position of the 2nd real entry, whatever the order of the directory */
    for (; (e = readdir(d)); before = telldir(d)) {
        count++;
        if (!strcmp(e->d_name, ".")) { dot++; continue; }
        if (!strcmp(e->d_name, "..")) { dotdot++; continue; }
        if (++real == 2) { mark = before; snprintf(mark_name, sizeof mark_name, "%s", e->d_name); }
        struct stat s; int r = fstatat(dfd, e->d_name, &s, AT_SYMLINK_NOFOLLOW);
        char kind = r ? '!' : S_ISDIR(s.st_mode) ? 'd' : S_ISREG(s.st_mode) ? 'f' : S_ISLNK(s.st_mode) ? 'l' : 'o';
        char info[160] = "";
        if (kind == 'f') {
            int fd = openat(dfd, e->d_name, O_RDONLY);
            uint64_t h = FNV0; char buf[4096]; ssize_t k; long t = 0;
            if (fd >= 0) { while ((k = read(fd, buf, sizeof buf)) > 0) { h = fnv(h, buf, k); t += k; } close(fd); }
            snprintf(info, sizeof info, "size=%lld mode=%o openat=%s/%ld/%016llx", (long long)s.st_size, s.st_mode,
                     fd >= 0 ? "ok" : errname(errno), t, (unsigned long long)h);
        } else if (kind == 'd') {
            snprintf(info, sizeof info, "mode=%o", s.st_mode);
        }
        add("entry %s/%s dtype=%c stat=%c %s", rel(path), e->d_name, dtc(e->d_type), kind, info);
        if (e->d_type == DT_DIR || (e->d_type == DT_UNKNOWN && kind == 'd')) {
            subs = realloc(subs, (nsubs + 1) * sizeof *subs);
            size_t l = strlen(path) + strlen(e->d_name) + 2;
            subs[nsubs] = malloc(l); snprintf(subs[nsubs], l, "%s/%s", path, e->d_name); nsubs++;
        }
    }
    /* seekdir back to the mark must return the same entry as the first pass */
    const char *seek_ok = "n/a";
    if (mark >= 0 && mark_name[0]) {
        seekdir(d, mark); e = readdir(d);
        seek_ok = e && !strcmp(e->d_name, mark_name) ? "same" : "different";
    }
    rewinddir(d); long again = 0; while (readdir(d)) again++;
    add("dir %s count=%ld dot=%d dotdot=%d rewind=%s seek=%s", rel(path), count, dot, dotdot, again == count ? "same" : "different", seek_ok);
    closedir(d);
    for (size_t i = 0; i < nsubs; i++) { walk(subs[i]); free(subs[i]); }
    free(subs);
}

static int ftw_cb(const char *p, const struct stat *s, int flag, struct FTW *f) {
    char kind = flag == FTW_F ? 'f' : flag == FTW_D ? 'd' : flag == FTW_DP ? 'D' : flag == FTW_SL ? 'l' : flag == FTW_DNR ? 'R' : flag == FTW_NS ? 'S' : '?';
    if (kind == 'f') add("nftw %s %c level=%d size=%lld mode=%o", rel(p), kind, f->level, (long long)s->st_size, s->st_mode);
    else add("nftw %s %c level=%d mode=%o base=%s", rel(p), kind, f->level, s->st_mode, f->level ? p + f->base : "<root>");
    return 0;
}

static int only_png(const struct dirent *e) { size_t l = strlen(e->d_name); return l > 4 && !strcmp(e->d_name + l - 4, ".png"); }

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: %s ROOT\n", argv[0]); return 2; }
    ROOT = argv[1]; ROOTLEN = strlen(ROOT);

    walk(ROOT);
    flush_sorted("readdir");

    if (nftw(ROOT, ftw_cb, 8, FTW_PHYS) != 0) add("nftw failed %s", errname(errno));
    flush_sorted("nftw FTW_PHYS");
    if (nftw(ROOT, ftw_cb, 8, FTW_PHYS | FTW_DEPTH | FTW_CHDIR) != 0) add("nftw failed %s", errname(errno));
    flush_sorted("nftw FTW_DEPTH|FTW_CHDIR");

    const char *pats[] = {"*", "*/*", "own/*/*.png", "own/**/*.npy", "own/edge/.*", "own/many/d[0-3]/f1?.dat", "nomatch/*"};
    for (size_t j = 0; j < sizeof pats / sizeof pats[0]; j++) {
        char *pat = join(ROOT, pats[j]); glob_t g; int r = glob(pat, GLOB_MARK, NULL, &g);
        printf("== glob %s -> %s\n", pats[j], r == 0 ? "ok" : r == GLOB_NOMATCH ? "nomatch" : "error");
        if (r == 0) for (size_t k = 0; k < g.gl_pathc; k++) printf("%s\n", rel(g.gl_pathv[k]));
        if (r == 0) globfree(&g);
        free(pat);
    }
    struct dirent **list; char *pics = join(ROOT, "own/pics");
    int m = scandir(pics, &list, only_png, alphasort);
    printf("== scandir own/pics -> %d\n", m);
    for (int k = 0; k < m; k++) { printf("%s\n", list[k]->d_name); free(list[k]); }
    if (m >= 0) free(list);

    /* fdopendir over open(O_DIRECTORY) */
    char *many = join(ROOT, "own/many/d3");
    int dfd = open(many, O_RDONLY | O_DIRECTORY);
    if (dfd < 0) printf("== fdopendir: open %s\n", errname(errno));
    else {
        DIR *d = fdopendir(dfd); struct dirent *e;
        if (!d) printf("== fdopendir %s\n", errname(errno));
        else { while ((e = readdir(d))) add("%s %c", e->d_name, dtc(e->d_type)); flush_sorted("fdopendir own/many/d3"); closedir(d); }
    }

    /* chdir + relative paths + getcwd */
    char *edge = join(ROOT, "own/edge");
    char cwd[4096];
    if (chdir(edge) != 0) printf("== chdir %s\n", errname(errno));
    else {
        printf("== chdir getcwd=%s\n", getcwd(cwd, sizeof cwd) ? cwd : errname(errno));
        FILE *f = fopen("deep/a/b/../b/c/d/e/leaf.txt", "r"); char line[64] = "";
        if (f) { if (!fgets(line, sizeof line, f)) line[0] = 0; fclose(f); }
        printf("relative fopen -> %s %s", f ? "ok" : errname(errno), f ? line : "\n");
        struct stat s; printf("stat ./one -> %s\n", stat("./one", &s) == 0 ? "ok" : errname(errno));
        printf("stat ../edge//one -> %s size=%lld\n", stat("../edge//one", &s) == 0 ? "ok" : errname(errno), (long long)s.st_size);
        DIR *d = opendir("."); long c = 0; if (d) { while (readdir(d)) c++; closedir(d); }
        printf("opendir . -> %ld entries\n", c);
        if (chdir("deep/a") == 0) printf("chdir deep/a getcwd=%s\n", getcwd(cwd, sizeof cwd) ? cwd : errname(errno));
        else printf("chdir deep/a %s\n", errname(errno));
        if (chdir("..") == 0) printf("chdir .. getcwd=%s\n", getcwd(cwd, sizeof cwd) ? cwd : errname(errno));
        int fd = open("..", O_RDONLY | O_DIRECTORY);
        if (fd >= 0 && fchdir(fd) == 0) printf("fchdir .. getcwd=%s\n", getcwd(cwd, sizeof cwd) ? cwd : errname(errno));
        else printf("fchdir %s\n", errname(errno));
        if (fd >= 0) close(fd);
    }
    char *rp = realpath(edge, NULL);
    printf("realpath own/edge -> %s\n", rp ? rel(rp) : errname(errno));
    char *p2 = join(ROOT, "own/./edge/../edge//deep/a/");
    char *rp2 = realpath(p2, NULL);
    printf("realpath messy -> %s\n", rp2 ? rel(rp2) : errname(errno));
    fflush(stdout);
    return 0;
}
