/* stdio client: fopen + fread/fseek/ftell/fgets/fgetc/getline/fscanf, fdopen, freopen.
 * usage: c_stdio ROOT LISTFILE  -- prints one digest line per file (relative paths). */
#include "common.h"
#include <fcntl.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: %s ROOT LIST\n", argv[0]); return 2; }
    const char *root = argv[1];
    char **files; size_t n = read_list(argv[2], &files);
    char buf[8192];
    for (size_t i = 0; i < n; i++) {
        char *p = join(root, files[i]);
        FILE *f = fopen(p, "rb");
        if (!f) { printf("%s fopen %s\n", files[i], errname(errno)); free(p); continue; }
        /* whole file with fread */
        uint64_t h = FNV0; size_t total = 0, k;
        while ((k = fread(buf, 1, sizeof buf, f)) > 0) { h = fnv(h, buf, k); total += k; }
        int err = ferror(f), eof = feof(f);
        /* fseek/ftell */
        fseek(f, 0, SEEK_END); long end = ftell(f);
        long mid = end / 2; fseek(f, mid, SEEK_SET);
        k = fread(buf, 1, 100, f); uint64_t hm = fnv(FNV0, buf, k); long after = ftell(f);
        fseek(f, -3, SEEK_END); int c3 = fgetc(f);
        /* fgets with a small buffer: lines and chunks */
        rewind(f);
        char small[64]; long chunks = 0, nl = 0; uint64_t hg = FNV0;
        while (fgets(small, sizeof small, f)) { chunks++; size_t l = strlen(small); hg = fnv(hg, small, l); if (l && small[l - 1] == '\n') nl++; }
        /* getline */
        rewind(f);
        char *line = NULL; size_t cap = 0; ssize_t len; long lines = 0; size_t longest = 0;
        while ((len = getline(&line, &cap, f)) != -1) { lines++; if ((size_t)len > longest) longest = len; }
        free(line);
        /* fgetc of the first 50 bytes */
        rewind(f);
        uint64_t hc = FNV0; int c;
        for (int j = 0; j < 50 && (c = fgetc(f)) != EOF; j++) { unsigned char u = c; hc = fnv(hc, &u, 1); }
        fclose(f);
        printf("%s size=%zu err=%d eof=%d fnv=%016llx end=%ld mid=%016llx after=%ld c3=%d fgets=%ld/%ld/%016llx lines=%ld longest=%zu fgetc=%016llx",
               files[i], total, err, eof, (unsigned long long)h, end, (unsigned long long)hm, after, c3,
               chunks, nl, (unsigned long long)hg, lines, longest, (unsigned long long)hc);
        /* fscanf over number files */
        size_t pl = strlen(p);
        if (pl > 5 && !strcmp(p + pl - 5, ".nums")) {
            FILE *g = fopen(p, "r"); long long x, sum = 0; long cnt = 0;
            while (fscanf(g, "%lld", &x) == 1) { sum += x; cnt++; }
            fclose(g);
            printf(" fscanf=%ld/%lld", cnt, sum);
        }
        /* fdopen over a plain open(), and freopen */
        int fd = open(p, O_RDONLY);
        if (fd < 0) { printf(" open=%s", errname(errno)); }
        else {
            FILE *g = fdopen(fd, "r"); uint64_t h2 = FNV0; size_t t2 = 0;
            while ((k = fread(buf, 1, sizeof buf, g)) > 0) { h2 = fnv(h2, buf, k); t2 += k; }
            fclose(g);
            printf(" fdopen=%zu/%016llx", t2, (unsigned long long)h2);
        }
        FILE *r = fopen("/dev/null", "r");
        r = freopen(p, "rb", r);
        if (!r) printf(" freopen=%s", errname(errno));
        else { size_t t3 = 0; while ((k = fread(buf, 1, sizeof buf, r)) > 0) t3 += k; fclose(r); printf(" freopen=%zu", t3); }
        printf("\n");
        free(p);
    }
    /* errors */
    const char *bad[] = {"does-not-exist", "own/edge/one/child", "own/edge/deep/missing/x"};
    for (int j = 0; j < 3; j++) {
        char *p = join(root, bad[j]);
        errno = 0; FILE *f = fopen(p, "r");
        printf("fopen %s -> %s\n", bad[j], f ? "opened" : errname(errno));
        if (f) fclose(f);
        free(p);
    }
    fflush(stdout);
    return 0;
}
