"""Raw system calls (syscall user dispatch): file calls made with a
`syscall` instruction outside libc reach /fanstore.

tests/clients/c_rawsys.c issues inline-asm syscalls (open/openat, read,
write, close, stat/newfstatat/statx, access, getdents64, mkdir, rename,
renameat2, unlink(at), rmdir) from the main thread, four threads, a fork()
child and a raw-fork child, plus a signal handler returning through its own
restorer, a program SIGSYS handler (kill, and a seccomp SECCOMP_RET_TRAP
filter's SIGSYS for a libc and a raw call); a few calls also go through libc's
generic syscall() (hooked by symbol: dispatch never sees it). Its transcript on a plain copy of
the dataset must equal its transcript on /fanstore.
"""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fs_cluster import packed_cluster
from fs_clients import compile_client

MOUNT = "/fanstore"
TIMEOUT = 120


@pytest.fixture(scope="module")
def cl(bins, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sud")
    with packed_cluster(bins, tmp, n_files=20, seed=11, mount=MOUNT) as (c, src):
        yield c, src, tmp


@pytest.fixture(scope="module")
def rawsys(tmp_path_factory):
    return compile_client(tmp_path_factory.mktemp("rawsys-bin"), "c_rawsys.c")


def an_input(src: Path):
    """(file, its directory) relative to src: a plain ASCII-named file."""
    for d, _, fs in sorted(os.walk(src)):
        for f in sorted(fs):
            p = Path(d) / f
            rel = str(p.relative_to(src))
            if p.is_file() and not p.is_symlink() and rel.isascii() and p.parent != src and len(rel) < 200:
                return str(p.relative_to(src)), str(p.parent.relative_to(src))
    raise AssertionError("no input file in a subdirectory")


def run_client(exe, root, f, d, env):
    r = subprocess.run([exe, str(root), f, d], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    return r.returncode, r.stdout, r.stderr


def native(exe, src, tmp, f, d):
    """The native run, on a copy of the input directory (its entries: files
    copied, subdirectories empty, symlinks as they are)."""
    root = tmp / "native-copy"
    shutil.rmtree(root, ignore_errors=True)
    (root / d).mkdir(parents=True)
    for e in os.scandir(src / d):
        dst = root / d / e.name
        if e.is_symlink():
            os.symlink(os.readlink(e.path), dst)
        elif e.is_dir():
            dst.mkdir()
        else:
            shutil.copy2(e.path, dst)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    rc, out, err = run_client(exe, root, f, d, env)
    assert rc == 0, f"native run failed ({rc}):\n{out}\n{err}"
    return out


def test_raw_syscalls_match_native(cl, rawsys):
    c, src, tmp = cl
    f, d = an_input(src)
    want = native(rawsys, src, tmp, f, d)
    # The native transcript is a success story, not two identical failures.
    for line in ("main input openat=fd", "main rename=0", "main stat-new=0 size=5000", "forked rename=0",
                 "rawfork rename=0", "t3 unlinkat=0", "main libc-syscall renameat2=0", "usr1 handled=1",
                 "sigsys handled=1 code=0", "raw getpriority=42 seen=1 code=1", "done"):
        assert line in want, f"native transcript lacks {line!r}:\n{want}"
    for node in (1, 2):
        rc, got, err = run_client(rawsys, MOUNT, f, d, c.env(node))
        assert rc == 0, f"node {node}: exit {rc}\n{got}\n{err}\n--- daemon log ---\n{c.log()[-3000:]}"
        assert got == want, f"node {node}: transcript differs\n--- native ---\n{want}\n--- fanstore ---\n{got}\n{err}"


def test_raw_output_visible_on_other_node(cl):
    """A file created and renamed with raw syscalls on node 0 is read on node 3."""
    c, _, _ = cl
    blob = os.urandom(70000)
    csrc = c.local.parent / "rawput.c"
    csrc.write_text(r'''
#include <fcntl.h>
#include <string.h>
#include <sys/syscall.h>
static long raw4(long nr, long a, long b, long c, long d) {
    long r; register long r10 __asm__("r10") = d;
    __asm__ volatile("syscall" : "=a"(r) : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10) : "rcx", "r11", "memory");
    return r;
}
static long raw5(long nr, long a, long b, long c, long d, long e) {
    long r; register long r10 __asm__("r10") = d; register long r8 __asm__("r8") = e;
    __asm__ volatile("syscall" : "=a"(r) : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8) : "rcx", "r11", "memory");
    return r;
}
int main(int argc, char **argv) {
    static char buf[1 << 20]; long n = 0, k;
    while ((k = raw4(SYS_read, 0, (long)(buf + n), sizeof buf - n, 0)) > 0) n += k;
    long fd = raw4(SYS_openat, AT_FDCWD, (long)argv[1], O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0) return 10;
    if (raw4(SYS_write, fd, (long)buf, n, 0) != n) return 11;
    if (raw4(SYS_close, fd, 0, 0, 0) != 0) return 12;
    if (raw5(SYS_renameat2, AT_FDCWD, (long)argv[1], AT_FDCWD, (long)argv[2], 0) != 0) return 13;
    return 0;
}
''')
    out = c.local.parent / "rawput"
    subprocess.run(["cc", "-O1", "-o", str(out), str(csrc)], check=True, timeout=120)
    r = subprocess.run([str(out), f"{MOUNT}/rawput.tmp", f"{MOUNT}/rawput.bin"], input=blob, env=c.env(0),
                       capture_output=True, timeout=TIMEOUT)
    assert r.returncode == 0, f"rawput exit {r.returncode}: {r.stderr.decode()}"
    r = subprocess.run(["cat", f"{MOUNT}/rawput.bin"], env=c.env(3), capture_output=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout == blob
    r = subprocess.run(["ls", f"{MOUNT}/"], env=c.env(2), capture_output=True, timeout=TIMEOUT)
    names = r.stdout.split(b"\n")
    assert b"rawput.bin" in names and b"rawput.tmp" not in names, r.stdout


def test_without_sud_raw_calls_miss_the_mount(cl, rawsys):
    """FANSTORE_SUD=0 runs as before: the raw calls go to the kernel, which
    has no /fanstore (so the comparison above can fail)."""
    c, src, tmp = cl
    f, d = an_input(src)
    env = c.env(1)
    env["FANSTORE_SUD"] = "0"
    env["FANSTORE_DEBUG"] = "1"
    rc, got, err = run_client(rawsys, MOUNT, f, d, env)
    assert "main input openat=err" in got and "main errno=2" in got, got
    assert "raw syscalls are not caught: FANSTORE_SUD=0" in err, err[-2000:]


def test_debug_log_says_raw_syscalls_are_caught(cl):
    c, src, _ = cl
    env = c.env(0)
    env["FANSTORE_DEBUG"] = "1"
    r = subprocess.run(["cat", f"{MOUNT}/{an_input(src)[0]}"], env=env, capture_output=True, timeout=TIMEOUT)
    assert r.returncode == 0
    assert b"raw syscalls caught (syscall user dispatch)" in r.stderr, r.stderr[-2000:]


def test_kernel_without_sud_runs_as_before(cl, rawsys, tmp_path):
    """A kernel without syscall user dispatch (simulated: seccomp makes the
    prctl fail with EINVAL, as before 5.11): the library says raw syscalls
    are not caught, libc calls under the mount work as before, raw ones do
    not see the mount."""
    c, src, _ = cl
    f, d = an_input(src)
    nosud = compile_client(tmp_path, "c_nosud_exec.c")
    env = c.env(1)
    env["FANSTORE_DEBUG"] = "1"
    r = subprocess.run([nosud, "cat", f"{MOUNT}/{f}"], env=env, capture_output=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout == (src / f).read_bytes()
    assert b"raw syscalls are not caught: this kernel has no syscall user dispatch (prctl errno 22)" in r.stderr, \
        r.stderr[-2000:]
    r = subprocess.run([nosud, rawsys, MOUNT, f, d], env=c.env(1), capture_output=True, text=True, timeout=TIMEOUT)
    assert "main input openat=err" in r.stdout and "main errno=2" in r.stdout, r.stdout
