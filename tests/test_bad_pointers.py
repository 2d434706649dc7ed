"""Bad pointers given to hooked calls (issue 55, item 1): NULL, 0xDEADC0DE,
an unmapped page and a path that runs into an unmapped page, as paths and
as out-parameters, under the mount and outside it. Every call must answer
as natively (EFAULT, or what libc does), and the program must run to its
end: the library never crashes the program it is loaded into.

The same C program runs natively on a directory and under the preload on
the mount (outputs it creates, an input of the dataset) and outside it;
the lines must be identical. pjdfstest's own calls too (when built), and
the program's own SIGSEGV handler still works behind the library's.
"""
import os
import signal
import subprocess

import pytest

from conftest import run
from fs_cluster import packed_cluster

MOUNT = "/fanstore"


@pytest.fixture(scope="module")
def cl(bins, tmp_path_factory):
    with packed_cluster(bins, tmp_path_factory.mktemp("badptr"), seed=7, n_files=6, mount=MOUNT) as (c, src):
        yield c, src


def compile_c(tmp_path, name, source):
    (tmp_path / f"{name}.c").write_text(source)
    exe = str(tmp_path / name)
    run(["cc", "-O1", "-Wall", "-o", exe, str(tmp_path / f"{name}.c")], timeout=120)
    return exe


@pytest.fixture(scope="module")
def bad_pointers(tmp_path_factory):
    return compile_c(tmp_path_factory.mktemp("bp-bin"), "bad_pointers", BAD_POINTERS_C)


def an_input(src):
    """(relative path, absolute source path) of a regular file of the dataset."""
    for dirpath, _dirs, files in sorted(os.walk(src)):
        for f in sorted(files):
            p = os.path.join(dirpath, f)
            if os.path.isfile(p) and not os.path.islink(p) and p.isascii():
                return os.path.relpath(p, src), p
    pytest.fail("the dataset has no regular file")


def outcome(cmd, env=None, codes=(0,)):
    """stdout of `cmd`, which must exit with one of `codes` (a crash fails with the signal)."""
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    if r.returncode not in codes:
        how = f"killed by {signal.Signals(-r.returncode).name}" if r.returncode < 0 else f"exit {r.returncode}"
        last = r.stdout.strip().splitlines()[-1:] or ["(no output)"]
        pytest.fail(f"{cmd[0]} {how} (env preload={bool(env and env.get('LD_PRELOAD'))}); last line: {last[0]}\n"
                    f"stderr: {r.stderr[-2000:]}")
    return r.stdout


def assert_same(native, ours, where):
    n, o = native.splitlines(), ours.splitlines()
    assert n[-1] == "done" and len(n) > 150, native[-500:]
    diff = [(a, b) for a, b in zip(n, o) if a != b]
    assert not diff and len(n) == len(o), (
        f"{where}: {len(diff)} calls differ (native, fanstore): {diff[:10]}; {len(n)} vs {len(o)} lines")


def test_bad_pointers_under_the_mount(cl, bad_pointers, tmp_path):
    c, src = cl
    rel, abs_in = an_input(src)
    native = outcome([bad_pointers, str(tmp_path / "native"), abs_in])
    ours = outcome([bad_pointers, f"{MOUNT}/bp", f"{MOUNT}/{rel}"], env=c.env(1))
    assert "chmod DEADC0DE -> errno 14" in native and "link-new-in NULL -> errno 14" in native
    assert_same(native, ours, "under the mount")


def test_bad_pointers_outside_the_mount(cl, bad_pointers, tmp_path):
    c, src = cl
    _rel, abs_in = an_input(src)
    native = outcome([bad_pointers, str(tmp_path / "native"), abs_in])
    ours = outcome([bad_pointers, str(tmp_path / "outside"), abs_in], env=c.env(2))
    assert_same(native, ours, "outside the mount")


def pjdfstest_binary():
    """pjdfstest's binary, built once by tests/pjdfstest/run.py's builder
    (the pinned source); skips when there is none, unless CI is set."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("pjdfstest_run", Path(__file__).resolve().parent / "pjdfstest" / "run.py")
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    cache = Path(os.environ.get("FANSTORE_PJDFSTEST_CACHE", "/var/tmp/fanstore-pjdfstest"))
    try:
        harness.check_tools()
        return str(harness.build(harness.find_tarball(cache), cache) / "pjdfstest")
    except harness.HarnessError as e:
        if os.environ.get("CI"):
            pytest.fail(f"pjdfstest cannot be built (CI=true makes this a failure): {e}")
        pytest.skip(f"pjdfstest cannot be built: {e}")


def test_pjdfstest_bad_pointers(cl, tmp_path):
    """pjdfstest's own EFAULT cases (its DEADCODE is 0xdeadc0de), on the mount."""
    c, _src = cl
    pjd = pjdfstest_binary()
    env = c.env(0)
    d = f"{MOUNT}/pjd"
    assert outcome([pjd, "mkdir", d, "0755"], env=env).splitlines()[0] == "0"
    assert outcome([pjd, "create", f"{d}/f", "0644"], env=env).splitlines()[0] == "0"
    cases = [
        ["chmod", "DEADCODE", "0644"], ["chmod", "NULL", "0644"], ["chown", "DEADCODE", "65534", "65534"],
        ["lchown", "NULL", "65534", "65534"], ["link", f"{d}/f", "NULL"], ["link", f"{d}/f", "DEADCODE"],
        ["link", "NULL", f"{d}/g"], ["rename", "NULL", f"{d}/f"], ["rename", f"{d}/f", "DEADCODE"],
        ["rename", "DEADCODE", f"{d}/f"], ["mkdir", "DEADCODE", "0755"], ["rmdir", "NULL"],
        ["open", "DEADCODE", "O_RDONLY"], ["open", "NULL", "O_CREAT", "0644"], ["unlink", "DEADCODE"],
        ["truncate", "NULL", "0"], ["symlink", "DEADCODE", f"{d}/s"], ["symlink", f"{d}/f", "NULL"],
        ["mkfifo", "NULL", "0644"], ["stat", "DEADCODE", "mode"], ["lstat", "NULL", "mode"],
    ]
    nd = tmp_path / "pjd"
    nd.mkdir()
    (nd / "f").write_bytes(b"")
    for args in cases:
        # pjdfstest exits 1 when its call fails; natively on a directory of its own.
        native = outcome([pjd, *[a.replace(d, str(nd)) for a in args]], codes=(0, 1))
        ours = outcome([pjd, *args], env=env, codes=(0, 1))
        assert native.splitlines()[0] == "EFAULT", (args, native)
        assert ours.splitlines()[0] == "EFAULT", (args, ours)


def test_the_programs_own_sigsegv_handler(cl, tmp_path):
    """Behind the library's fault handler the program's own still sees its
    faults (and sigaction reports it), a bad pointer never reaches it, and
    a fault with no handler still kills with SIGSEGV."""
    c, _src = cl
    exe = compile_c(tmp_path, "segv", SEGV_C)
    want = "bad pointer -> errno 14, handler calls 0\nreported ours 1\ncaught 1\nbad pointer -> errno 14, handler calls 1\n"
    assert outcome([exe, f"{MOUNT}/x"]) == want
    assert outcome([exe, f"{MOUNT}/x"], env=c.env(3)) == want
    for env in (None, c.env(3)):
        r = subprocess.run([exe, f"{MOUNT}/x", "die"], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == -signal.SIGSEGV, (env is not None, r.returncode, r.stdout, r.stderr)


SEGV_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
static sigjmp_buf jb;
static volatile int calls;
static void on_segv(int sig, siginfo_t *si, void *ctx) { (void)sig; (void)si; (void)ctx; calls++; siglongjmp(jb, 1); }
int main(int argc, char **argv) {
    struct stat st;
    if (argc > 2) {  /* no handler: a real fault kills */
        errno = 0;
        int r = stat((const char *)0xDEADC0DE, &st);
        printf("bad pointer -> %d errno %d\n", r, errno);
        fflush(stdout);
        *(volatile int *)16 = 1;
        return 0;
    }
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
    errno = 0;
    stat((const char *)0xDEADC0DE, &st);
    printf("bad pointer -> errno %d, handler calls %d\n", errno, calls);
    sigaction(SIGSEGV, NULL, &old);
    printf("reported ours %d\n", old.sa_sigaction == on_segv);
    if (sigsetjmp(jb, 1) == 0)
        *(volatile int *)16 = 1;
    printf("caught %d\n", calls);
    errno = 0;
    stat(argv[1], (struct stat *)0xDEADC0DE);
    open((const char *)0xDEADC0DE, 0);
    printf("bad pointer -> errno %d, handler calls %d\n", errno, calls);
    return 0;
}
"""

BAD_POINTERS_C = r"""/* Hooked calls given bad pointers (NULL, 0xDEADC0DE, an unmapped page, a
 * string that runs into an unmapped page): one line per call with its
 * result (OK or the errno's number), the same natively and under the
 * preload. argv[1]: a writable directory (created here: t/f, t/l -> f,
 * t/d); argv[2]: an existing file (an input under the mount). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/xattr.h>
#include <unistd.h>

static void show(const char *what, const char *kind, long r) {
    if (r < 0)
        printf("%s %s -> errno %d\n", what, kind, errno);
    else
        printf("%s %s -> OK\n", what, kind);
    fflush(stdout);
}

#define TRY(what, kind, expr) do { errno = 0; show(what, kind, (long)(expr)); } while (0)
#define TRYP(what, kind, expr) do { errno = 0; show(what, kind, (expr) ? 0L : -1L); } while (0)

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    char t[4096], f[4096], l[4096], d[4096], nf[4096];
    snprintf(t, sizeof t, "%s/t", argv[1]);
    snprintf(f, sizeof f, "%s/t/f", argv[1]);
    snprintf(l, sizeof l, "%s/t/l", argv[1]);
    snprintf(d, sizeof d, "%s/t/d", argv[1]);
    snprintf(nf, sizeof nf, "%s/t/new", argv[1]);
    const char *in = argv[2];
    if (mkdir(argv[1], 0755) && errno != EEXIST) { perror("mkdir root"); return 3; }
    if (mkdir(t, 0755) || mkdir(d, 0755)) { perror("mkdir"); return 3; }
    int fd = creat(f, 0644);
    if (fd < 0 || write(fd, "data\n", 5) != 5 || close(fd)) { perror("creat"); return 3; }
    if (symlink("f", l)) { perror("symlink"); return 3; }

    long pg = sysconf(_SC_PAGESIZE);
    char *m = mmap(NULL, 2 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 3;
    munmap(m + pg, pg);
    /* "<root>/t/aaaa..." running to the page's end, with no NUL. */
    size_t rl = strlen(t) + 1;
    memset(m, 'a', pg);
    char *runoff = m + pg - rl - 32;
    memcpy(runoff, t, rl - 1);
    runoff[rl - 1] = '/';
    char *gone = mmap(NULL, pg, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(gone, pg);

    struct { const char *kind; char *p; } bad[] = {
        {"NULL", NULL}, {"DEADC0DE", (char *)0xDEADC0DE}, {"unmapped", gone}, {"runoff", runoff},
    };
    struct stat st;
    struct statx stx;
    struct statfs sfs;
    char buf[256];
    int ino = inotify_init1(IN_CLOEXEC);
    for (unsigned i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *k = bad[i].kind;
        char *p = bad[i].p;
        TRY("chmod", k, chmod(p, 0644));
        TRY("chown", k, chown(p, -1, -1));
        TRY("lchown", k, lchown(p, -1, -1));
        TRY("truncate", k, truncate(p, 0));
        TRY("stat", k, stat(p, &st));
        TRY("lstat", k, lstat(p, &st));
        TRY("fstatat", k, fstatat(AT_FDCWD, p, &st, 0));
        TRY("statx", k, statx(AT_FDCWD, p, 0, STATX_BASIC_STATS, &stx));
        TRY("statfs", k, statfs(p, &sfs));
        TRY("open", k, open(p, O_RDONLY));
        TRY("openat", k, openat(AT_FDCWD, p, O_RDONLY));
        TRY("open-creat", k, open(p, O_WRONLY | O_CREAT, 0644));
        TRY("creat", k, creat(p, 0644));
        TRYP("fopen", k, fopen(p, "r"));
        TRY("access", k, access(p, F_OK));
        TRY("faccessat", k, faccessat(AT_FDCWD, p, R_OK, 0));
        TRY("mkdir", k, mkdir(p, 0755));
        TRY("mkdirat", k, mkdirat(AT_FDCWD, p, 0755));
        TRY("rmdir", k, rmdir(p));
        TRY("unlink", k, unlink(p));
        TRY("unlinkat", k, unlinkat(AT_FDCWD, p, 0));
        TRY("mkfifo", k, mkfifo(p, 0644));
        TRY("readlink", k, readlink(p, buf, sizeof buf));
        TRY("utimensat", k, utimensat(AT_FDCWD, p, NULL, 0));
        TRY("chdir", k, chdir(p));
        TRY("getxattr", k, getxattr(p, "user.x", buf, sizeof buf));
        TRY("listxattr", k, listxattr(p, buf, sizeof buf));
        TRY("inotify_add_watch", k, inotify_add_watch(ino, p, IN_ALL_EVENTS));
        TRY("link-old", k, link(p, nf));
        TRY("link-new-out", k, link(f, p));
        TRY("link-new-in", k, link(in, p));
        TRY("linkat-new", k, linkat(AT_FDCWD, f, AT_FDCWD, p, 0));
        TRY("rename-old", k, rename(p, nf));
        TRY("rename-new-out", k, rename(f, p));
        TRY("rename-new-in", k, rename(in, p));
        TRY("renameat-new", k, renameat(AT_FDCWD, f, AT_FDCWD, p));
        TRY("symlink-target", k, symlink(p, nf));
        TRY("symlink-link", k, symlink("f", p));
        /* Good paths, bad out-parameters. */
        TRY("stat-buf-out", k, stat(f, (struct stat *)p));
        TRY("stat-buf-in", k, stat(in, (struct stat *)p));
        TRY("lstat-buf", k, lstat(l, (struct stat *)p));
        TRY("fstatat-buf", k, fstatat(AT_FDCWD, in, (struct stat *)p, 0));
        TRY("statx-buf", k, statx(AT_FDCWD, in, 0, STATX_BASIC_STATS, (struct statx *)p));
        TRY("statfs-buf", k, statfs(in, (struct statfs *)p));
        TRY("readlink-buf", k, readlink(l, p, 100));
        TRY("utimensat-times", k, utimensat(AT_FDCWD, f, (struct timespec *)p, 0));
        fd = open(in, O_RDONLY);
        TRY("fstat-buf", k, fstat(fd, (struct stat *)p));
        TRY("fstatfs-buf", k, fstatfs(fd, (struct statfs *)p));
        close(fd);
        fd = open(d, O_RDONLY | O_DIRECTORY);
        TRY("getdents64-buf", k, getdents64(fd, p, 4096));
        close(fd);
        char here[4096];
        if (getcwd(here, sizeof here) && chdir(d) == 0) {
            TRYP("getcwd-buf", k, getcwd(p, 4096));
            if (chdir(here)) return 4;
        }
    }
    /* Still works after all of that. */
    TRY("stat-after", "good", stat(f, &st));
    TRY("stat-in-after", "good", stat(in, &st));
    printf("done\n");
    return 0;
}
"""
