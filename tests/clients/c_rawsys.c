/* Raw system calls: every file call below is an inline `syscall`
 * instruction in this program's own text (never libc's wrapper), as rustix
 * (safetensors) and Go do. Run once on a plain directory and once on
 * /fanstore with the preload library: the transcripts must be equal.
 *
 * A few calls also go through libc's generic syscall() (hooked by symbol).
 *
 * usage: c_rawsys ROOT INPUT_FILE INPUT_DIR
 *   ROOT        the tree (a plain copy of the dataset, or the mount)
 *   INPUT_FILE  an input file, relative to ROOT
 *   INPUT_DIR   an input directory, relative to ROOT
 * Outputs are written under ROOT/rawsys/<actor>/ by the main thread, four
 * threads, a fork() child and a raw-fork child. Prints one transcript line
 * per call: its result (a value, or -ERRNO) and what was read. */
#include "common.h"
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <sys/wait.h>
#include <sys/resource.h>
#include <unistd.h>

static long raw6(long nr, long a, long b, long c, long d, long e, long f) {
    long r;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    __asm__ volatile("syscall"
                     : "=a"(r)
                     : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return r;
}
#define R(nr, ...) raw_n(nr, __VA_ARGS__, 0, 0, 0, 0, 0, 0)
#define raw_n(nr, a, b, c, d, e, f, ...) raw6(nr, (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), (long)(f))

static const char *ROOT, *IN_FILE, *IN_DIR;

struct out { char buf[16384]; size_t len; };
static void say(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(struct out *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->buf + o->len, sizeof o->buf - o->len, fmt, ap);
    va_end(ap);
    if (n > 0) o->len += (size_t)n < sizeof o->buf - o->len ? (size_t)n : sizeof o->buf - o->len - 1;
}

static void path(char *dst, const char *a, const char *b, const char *c) {
    snprintf(dst, 4096, "%s/%s%s%s", ROOT, a, b ? "/" : "", b ? b : "");
    if (c) { strcat(dst, "/"); strcat(dst, c); }
}

/* Reads a whole fd with raw read: "<size> <fnv>". */
static void slurp(struct out *o, const char *what, long fd) {
    static __thread char buf[65536];
    uint64_t h = FNV0; long total = 0, k;
    while ((k = R(SYS_read, fd, buf, sizeof buf)) > 0) { h = fnv(h, buf, k); total += k; }
    say(o, "%s read=%ld last=%ld fnv=%016llx\n", what, total, k, (unsigned long long)h);
}

static int cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* getdents64 on a raw-opened directory (with libc's generic syscall()
 * when via_libc: it runs inside libc, where dispatch does not trap, and is
 * hooked by symbol): sorted names. */
static void list(struct out *o, const char *what, const char *dir, int via_libc) {
    long fd = R(SYS_openat, AT_FDCWD, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    say(o, "%s open=%s\n", what, fd >= 0 ? "fd" : "err");
    if (fd < 0) { say(o, "%s errno=%ld\n", what, -fd); return; }
    static __thread char buf[32768];
    char *names[512]; int n = 0; long k;
    while ((k = via_libc ? syscall(SYS_getdents64, fd, buf, sizeof buf) : R(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
        for (long off = 0; off < k;) {
            unsigned short reclen = *(unsigned short *)(buf + off + 16);
            char *name = buf + off + 19;
            if (n < 512) names[n++] = strdup(name);
            off += reclen;
        }
    }
    qsort(names, n, sizeof *names, cmp);
    say(o, "%s getdents64%s last=%ld n=%d:", what, via_libc ? "(libc syscall)" : "", k < 0 && via_libc ? -errno : k, n);
    for (int i = 0; i < n; i++) { say(o, " %s", names[i]); free(names[i]); }
    say(o, "\n%s close=%ld\n", what, R(SYS_close, fd));
}

/* The sequence every actor runs. */
static void actor(struct out *o, const char *name) {
    char p[4096], q[4096], d[4096];
    path(p, IN_FILE, NULL, NULL);
    long fd = R(SYS_openat, AT_FDCWD, p, O_RDONLY | O_CLOEXEC);
    say(o, "%s input openat=%s\n", name, fd >= 0 ? "fd" : "err");
    if (fd >= 0) { slurp(o, name, fd); say(o, "%s close=%ld\n", name, R(SYS_close, fd)); }
    else say(o, "%s errno=%ld\n", name, -fd);
    fd = R(SYS_open, p, O_RDONLY);
    if (fd >= 0) { slurp(o, name, fd); R(SYS_close, fd); } else say(o, "%s open errno=%ld\n", name, -fd);
    struct stat st;
    long r = R(SYS_newfstatat, AT_FDCWD, p, &st, 0);
    say(o, "%s newfstatat=%ld size=%ld reg=%d\n", name, r, r ? -1L : (long)st.st_size, r ? 0 : S_ISREG(st.st_mode));
    r = R(SYS_stat, p, &st);
    say(o, "%s stat=%ld size=%ld\n", name, r, r ? -1L : (long)st.st_size);
    struct statx sx;
    r = R(SYS_statx, AT_FDCWD, p, 0, STATX_SIZE | STATX_TYPE, &sx);
    say(o, "%s statx=%ld size=%lld\n", name, r, r ? -1LL : (long long)sx.stx_size);
    say(o, "%s access=%ld\n", name, R(SYS_access, p, R_OK));
    path(q, IN_FILE, "nope", NULL);
    say(o, "%s stat-notdir=%ld\n", name, R(SYS_stat, q, &st));
    path(q, "missing-file", NULL, NULL);
    say(o, "%s stat-missing=%ld\n", name, R(SYS_stat, q, &st));
    path(d, IN_DIR, NULL, NULL);
    list(o, name, d, 0);
    list(o, name, d, 1);

    /* outputs: mkdir, create through a temp name, rename (as safetensors),
     * stat, read back, renameat2, unlink, rmdir */
    path(d, "rawsys", name, NULL);
    say(o, "%s mkdir=%ld\n", name, R(SYS_mkdir, d, 0755));
    path(p, "rawsys", name, "f.tmp");
    fd = R(SYS_openat, AT_FDCWD, p, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
    say(o, "%s create=%s\n", name, fd >= 0 ? "fd" : "err");
    char data[5000];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (char)(i * 7 + name[0]);
    if (fd >= 0) {
        say(o, "%s write=%ld\n", name, R(SYS_write, fd, data, sizeof data));
        say(o, "%s close=%ld\n", name, R(SYS_close, fd));
    }
    path(q, "rawsys", name, "f.bin");
    say(o, "%s rename=%ld\n", name, R(SYS_rename, p, q));
    say(o, "%s stat-old=%ld\n", name, R(SYS_stat, p, &st));
    r = R(SYS_stat, q, &st);
    say(o, "%s stat-new=%ld size=%ld\n", name, r, r ? -1L : (long)st.st_size);
    fd = R(SYS_openat, AT_FDCWD, q, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) { slurp(o, name, fd); R(SYS_close, fd); } else say(o, "%s reopen errno=%ld\n", name, -fd);
    char q2[4096];
    path(q2, "rawsys", name, "g.bin");
    say(o, "%s renameat2=%ld\n", name, R(SYS_renameat2, AT_FDCWD, q, AT_FDCWD, q2, 0));
    /* libc's generic syscall() for the same calls */
    r = syscall(SYS_renameat2, AT_FDCWD, q2, AT_FDCWD, q, 0);
    say(o, "%s libc-syscall renameat2=%ld\n", name, r < 0 ? (long)-errno : r);
    r = syscall(SYS_newfstatat, AT_FDCWD, q, &st, 0);
    say(o, "%s libc-syscall newfstatat=%ld size=%ld\n", name, r < 0 ? (long)-errno : r, r ? -1L : (long)st.st_size);
    say(o, "%s unlink-old=%ld\n", name, R(SYS_unlink, q2));
    say(o, "%s unlinkat=%ld\n", name, R(SYS_unlinkat, AT_FDCWD, q, 0));
    say(o, "%s stat-gone=%ld\n", name, R(SYS_stat, q, &st));
    r = syscall(SYS_unlink, q);
    say(o, "%s libc-syscall unlink-gone=%ld\n", name, r < 0 ? (long)-errno : r);
    say(o, "%s rmdir=%ld\n", name, R(SYS_rmdir, d));
}

static void *thread_main(void *arg) {
    struct out *o = arg;
    char name[16];
    snprintf(name, sizeof name, "t%d", o->buf[0]);
    o->len = 0;
    actor(o, name);
    return NULL;
}

/* A child (fork or raw fork) runs the sequence and sends its transcript. */
static void child_actor(int wfd, const char *name) {
    static struct out o;
    actor(&o, name);
    R(SYS_write, wfd, o.buf, o.len);
    R(SYS_exit_group, 0);
}

static void from_child(int rfd, long pid) {
    char buf[16384]; long k; size_t n = 0;
    while ((k = read(rfd, buf + n, sizeof buf - n)) > 0) n += k;
    int st = 0;
    waitpid((pid_t)pid, &st, 0);
    fwrite(buf, 1, n, stdout);
    printf("child exit=%d\n", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
}

static volatile int usr1_seen;
static void on_usr1(int sig) { (void)sig; usr1_seen = 1; }
/* A restorer of our own, as Go installs: rt_sigreturn from our text. */
__asm__(".text\n.globl my_restorer\nmy_restorer:\n mov $15, %eax\n syscall\n hlt\n");
void my_restorer(void);

static volatile int sys_seen, sys_code;
/* The program's own SIGSYS handler: a seccomp SECCOMP_RET_TRAP answer
 * (si_code SYS_SECCOMP) gets 42 as the syscall's result. */
static void on_sys(int sig, siginfo_t *si, void *uc) {
    (void)sig;
    sys_seen++;
    sys_code = si->si_code;
    if (si->si_code == 1 /* SYS_SECCOMP */) ((ucontext_t *)uc)->uc_mcontext.gregs[REG_RAX] = 42;
}

/* A seccomp filter (no privilege: no_new_privs) trapping getpriority. */
static int trap_getpriority(void) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_getpriority, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) return -errno;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) ? -errno : 0;
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: %s ROOT INPUT_FILE INPUT_DIR\n", argv[0]); return 2; }
    ROOT = argv[1]; IN_FILE = argv[2]; IN_DIR = argv[3];
    setvbuf(stdout, NULL, _IOFBF, 1 << 16);
    char d[4096];
    path(d, "rawsys", NULL, NULL);
    printf("mkdir rawsys=%ld\n", R(SYS_mkdir, d, 0755));
    static struct out mo;
    actor(&mo, "main");
    fwrite(mo.buf, 1, mo.len, stdout);

    static struct out to[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) { to[i].buf[0] = (char)i; pthread_create(&t[i], NULL, thread_main, &to[i]); }
    for (int i = 0; i < 4; i++) { pthread_join(t[i], NULL); fwrite(to[i].buf, 1, to[i].len, stdout); }

    int pfd[2];
    fflush(stdout);
    if (pipe(pfd)) return 3;
    pid_t pid = fork();
    if (pid == 0) { close(pfd[0]); child_actor(pfd[1], "forked"); }
    close(pfd[1]);
    from_child(pfd[0], pid);
    close(pfd[0]);

    fflush(stdout);
    if (pipe(pfd)) return 3;
    long rp = R(SYS_fork, 0);
    if (rp == 0) { close(pfd[0]); child_actor(pfd[1], "rawfork"); }
    close(pfd[1]);
    from_child(pfd[0], rp);
    close(pfd[0]);

    /* the directory is empty again */
    mo.len = 0;
    list(&mo, "end", d, 0);
    list(&mo, "end", d, 1);
    fwrite(mo.buf, 1, mo.len, stdout);
    printf("rmdir rawsys=%ld\n", R(SYS_rmdir, d));

    /* a signal handler returning through our own restorer (raw rt_sigreturn) */
    long ksa[4] = {(long)on_usr1, 0x04000000 /* SA_RESTORER */, (long)my_restorer, 0};
    printf("rt_sigaction=%ld\n", R(SYS_rt_sigaction, SIGUSR1, ksa, 0, 8));
    kill(getpid(), SIGUSR1);
    printf("usr1 handled=%d\n", usr1_seen);

    /* the program's own SIGSYS handler still sees a SIGSYS that is not a trap */
    struct sigaction sa = {0}, old = {0};
    sa.sa_sigaction = on_sys;
    sa.sa_flags = SA_SIGINFO;
    printf("sigaction SIGSYS=%d\n", sigaction(SIGSYS, &sa, NULL));
    sigaction(SIGSYS, NULL, &old);
    printf("sigaction SIGSYS reads back=%d\n", old.sa_sigaction == on_sys);
    kill(getpid(), SIGSYS);
    printf("sigsys handled=%d code=%d\n", sys_seen, sys_code);

    /* raw syscalls with SIGSYS blocked (the kernel would kill a trapping
     * thread that blocks it) */
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGSYS);
    sigprocmask(SIG_BLOCK, &s, NULL);
    char p[4096];
    path(p, IN_FILE, NULL, NULL);
    struct stat st;
    long r = R(SYS_stat, p, &st);
    printf("blocked stat=%ld size=%ld\n", r, r ? -1L : (long)st.st_size);
    sigprocmask(SIG_UNBLOCK, &s, NULL);

    /* a seccomp sandbox's SIGSYS reaches the program's handler, for a libc
     * call and for a raw one (which dispatch traps first; the re-issued call
     * then gets the seccomp SIGSYS inside our handler) */
    printf("seccomp filter=%d\n", trap_getpriority());
    sys_seen = 0;
    errno = 0;
    int prio = getpriority(PRIO_PROCESS, 0);
    printf("libc getpriority=%d seen=%d code=%d\n", prio, sys_seen, sys_code);
    sys_seen = 0;
    r = R(SYS_getpriority, PRIO_PROCESS, 0);
    printf("raw getpriority=%ld seen=%d code=%d\n", r, sys_seen, sys_code);
    printf("done\n");
    return 0;
}
