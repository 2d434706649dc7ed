"""Smoke tests of the preload library against a real singleton daemon.

A small tree (raw and lz4-compressed files, a symlink, empty dir and file)
is packed, served by `fanstore-daemon` with no launcher, and read through
LD_PRELOAD by coreutils, python, forked workers and a C program; results are
compared with the source tree. The broad client matrix lives in
tests/test_clients_*.py.
"""
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fs_cluster import start_cluster
from fs_prep import pack

MOUNT = "/fanstore"
TIMEOUT = 60


def _write(p: Path, data: bytes):
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)


def make_src(root: Path) -> Path:
    rnd = __import__("random").Random(4)
    for i in range(12):
        _write(root / "train" / f"c{i % 3}" / f"img{i:03d}.bin", rnd.randbytes(131072 if i % 4 == 0 else 1000 + 777 * i))
    _write(root / "text" / "big.txt", b"the quick brown fox\n" * 20000)  # compresses: served by the daemon
    _write(root / "text" / "small.txt", b"hello\n")
    _write(root / "empty.bin", b"")
    (root / "emptydir").mkdir()
    os.symlink("../text/small.txt", root / "train" / "link")
    return root


@pytest.fixture(scope="module")
def served(bins, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("preload")
    src = make_src(tmp / "src")
    data = tmp / "data"
    pack(bins, src, data, "--partitions", "3", "--compress", "lz4")
    c = start_cluster(bins, data, tmp / "cl", nranks=0, mount=MOUNT)
    yield c, src
    c.stop()


def run(cmd, env, **kw):
    return subprocess.run(cmd, env=env, capture_output=True, timeout=TIMEOUT, **kw)


def files_of(src: Path):
    out = {}
    for d, ds, fs in os.walk(src):
        for f in fs:
            p = Path(d) / f
            out[str(p.relative_to(src))] = p
    return out


def test_cat_every_file(served):
    c, src = served
    env = c.env()
    for rel, p in files_of(src).items():
        r = run(["cat", f"{MOUNT}/{rel}"], env)
        assert r.returncode == 0, r.stderr
        assert r.stdout == p.read_bytes(), rel


def test_ls_stat_find_du(served):
    c, src = served
    env = c.env()
    r = run(["ls", "-l", f"{MOUNT}/train/c0"], env, text=True)
    assert r.returncode == 0, r.stderr
    names = sorted(line.split()[-1] for line in r.stdout.splitlines()[1:])
    assert names == sorted(os.listdir(src / "train/c0"))
    r = run(["stat", "-c", "%s %F %a", f"{MOUNT}/text/big.txt"], env, text=True)
    st = os.stat(src / "text/big.txt")
    assert r.stdout.split() == [str(st.st_size), "regular", "file", oct(st.st_mode & 0o777)[2:]]
    r = run(["find", MOUNT, "-type", "f"], env, text=True)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == sorted(f"{MOUNT}/{k}" for k, p in files_of(src).items() if not p.is_symlink())
    r = run(["ls", "-R", MOUNT], env, text=True)
    assert r.returncode == 0 and "img011.bin" in r.stdout, r.stderr
    r = run(["cp", "-r", f"{MOUNT}/train", str(src.parent / "copy")], env)
    assert r.returncode == 0, r.stderr
    assert run(["diff", "-r", "--no-dereference", str(src / "train"), str(src.parent / "copy")], None).returncode == 0


PY = textwrap.dedent(r'''
    import errno, os, sys
    M, S = sys.argv[1], sys.argv[2]
    def tree(r):
        out = {}
        for d, ds, fs in os.walk(r):
            for f in fs:
                p = os.path.join(d, f)
                out[os.path.relpath(p, r)] = os.path.getsize(p)
        return out
    assert tree(M) == tree(S), (tree(M), tree(S))
    for rel in tree(S):
        a, b = os.path.join(M, rel), os.path.join(S, rel)
        assert open(a, "rb").read() == open(b, "rb").read(), rel
        st = os.stat(a)
        with open(a, "rb") as f:
            fs = os.fstat(f.fileno())
        assert (fs.st_dev, fs.st_ino, fs.st_size, fs.st_mtime_ns, fs.st_mode) == \
               (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode), rel
    os.chdir(M + "/train")
    assert os.getcwd() == M + "/train"
    assert open("c1/img001.bin", "rb").read() == open(S + "/train/c1/img001.bin", "rb").read()
    assert open("link").read() == "hello\n"
    fd = os.open("c2", os.O_RDONLY | os.O_DIRECTORY)
    assert sorted(os.listdir(fd)) == sorted(os.listdir(S + "/train/c2"))
    assert os.stat("img002.bin", dir_fd=fd).st_size == os.path.getsize(S + "/train/c2/img002.bin")
    os.close(fd)
    os.chdir("../..")
    assert os.getcwd() == os.path.dirname(M) or os.getcwd() == "/"
    def err(f):
        try:
            f()
        except OSError as e:
            return errno.errorcode[e.errno]
        return "ok"
    assert err(lambda: open(M + "/text/small.txt", "w")) == "EROFS"
    assert err(lambda: open(M + "/text/small.txt", "r+")) == "EROFS"
    assert err(lambda: os.truncate(M + "/text/small.txt", 0)) == "EROFS"
    assert err(lambda: os.chmod(M + "/text/small.txt", 0o600)) == "EROFS"
    assert err(lambda: os.unlink(M + "/text/small.txt")) == "EROFS"
    assert err(lambda: os.rename(M + "/text/small.txt", M + "/text/x")) == "EROFS"
    # new names are outputs (write path, tests/test_write.py); inputs stay read-only
    assert err(lambda: os.mkdir(M + "/newdir")) == "ok" and os.path.isdir(M + "/newdir")
    assert err(lambda: open(M + "/newfile", "w").close()) == "ok" and os.path.getsize(M + "/newfile") == 0
    assert err(lambda: os.mkdir(M + "/text")) == "EEXIST"
    os.unlink(M + "/newfile")
    os.rmdir(M + "/newdir")  # the module's other tests compare the tree with the source
    assert not os.path.exists(M + "/newfile") and not os.path.exists(M + "/newdir")
    assert err(lambda: open(M + "/nope")) == "ENOENT"
    assert err(lambda: os.stat(M + "/text/small.txt/x")) == "ENOTDIR"
    assert err(lambda: open(M + "/text", "w")) == "EISDIR"
    assert err(lambda: os.rmdir(M + "/emptydir")) == "EROFS"
    assert os.path.realpath(M + "/train/link") == M + "/text/small.txt"
    assert os.readlink(M + "/train/link") == "../text/small.txt"
    assert os.listdir(M + "/emptydir") == []
    assert os.path.getsize(M + "/empty.bin") == 0
    import glob
    assert len(glob.glob(M + "/train/*/*.bin")) == 12
    print("ok")
''')


def test_python(served, tmp_path):
    c, src = served
    script = tmp_path / "t.py"
    script.write_text(PY)
    r = run([sys.executable, str(script), MOUNT, str(src)], c.env(), text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


FORK = textwrap.dedent(r'''
    import multiprocessing as mp, os, sys, hashlib
    M, S = sys.argv[1], sys.argv[2]
    files = sorted(os.path.relpath(os.path.join(d, f), M) for d, _, fs in os.walk(M) for f in fs)
    held = open(M + "/text/big.txt", "rb")       # parent holds a virtual file across the fork
    held.read(10)
    def work(rel):
        with open(os.path.join(M, rel), "rb") as f:
            return rel, hashlib.md5(f.read()).hexdigest()
    if __name__ == "__main__":
        ctx = mp.get_context("fork")
        with ctx.Pool(4) as p:
            for epoch in range(3):
                for rel, h in p.map(work, files):
                    assert h == hashlib.md5(open(os.path.join(S, rel), "rb").read()).hexdigest(), rel
        assert held.read(10) == open(S + "/text/big.txt", "rb").read()[10:20]
        r = os.system(f"/bin/sh -c 'cat {M}/text/small.txt > /dev/null'")
        assert r == 0
        print("ok", len(files))
''')


def test_forked_workers(served, tmp_path):
    c, src = served
    script = tmp_path / "f.py"
    script.write_text(FORK)
    r = run([sys.executable, str(script), MOUNT, str(src)], c.env(), text=True)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stderr


C_PROG = r'''
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int nfiles, ndirs;
static long long bytes;
static int cb(const char *p, const struct stat *st, int flag, struct FTW *f) {
    (void)p; (void)f;
    if (flag == FTW_F) { nfiles++; bytes += st->st_size; }
    if (flag == FTW_D) ndirs++;
    return 0;
}
int main(int argc, char **argv) {
    const char *m = argv[1];
    char p[4096];
    if (nftw(m, cb, 8, FTW_PHYS) != 0) { perror("nftw"); return 1; }
    printf("nftw %d %d %lld\n", nfiles, ndirs, bytes);
    glob_t g;
    snprintf(p, sizeof p, "%s/train/*/*.bin", m);
    if (glob(p, 0, NULL, &g) != 0) { perror("glob"); return 1; }
    printf("glob %zu\n", g.gl_pathc);
    globfree(&g);
    struct dirent **nl;
    snprintf(p, sizeof p, "%s/train", m);
    int n = scandir(p, &nl, NULL, alphasort);
    printf("scandir %d %s %s\n", n, n > 0 ? nl[0]->d_name : "", n > 2 ? nl[2]->d_name : "");
    for (int i = 0; i < n; i++) free(nl[i]);
    free(nl);
    snprintf(p, sizeof p, "%s/text/big.txt", m);
    FILE *f = fopen(p, "r");
    if (!f) { perror("fopen"); return 1; }
    char line[256]; int lines = 0;
    while (fgets(line, sizeof line, f)) lines++;
    fseek(f, 4, SEEK_SET);
    printf("fgets %d %ld %c\n", lines, ftell(f), fgetc(f));
    fclose(f);
    int fd = open(p, O_RDONLY);
    struct stat st; fstat(fd, &st);
    char *map = mmap(NULL, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    char buf[5] = {0};
    pread(fd, buf, 4, 4);
    printf("mmap %c%c%c pread %s\n", map[0], map[1], map[2], buf);
    close(fd);
    snprintf(p, sizeof p, "%s/nope", m);
    errno = 0;
    printf("missing %d %s\n", open(p, O_RDONLY), strerror(errno));
    return 0;
}
'''


def test_c_program(served, tmp_path):
    c, src = served
    if not shutil.which("cc"):
        pytest.skip("no C compiler")
    (tmp_path / "t.c").write_text(C_PROG)
    exe = tmp_path / "t"
    subprocess.run(["cc", "-O1", "-o", str(exe), str(tmp_path / "t.c")], check=True)
    native = run([str(exe), str(src)], None, text=True)
    virt = run([str(exe), MOUNT], c.env(), text=True)
    assert virt.returncode == 0, virt.stderr
    # nftw's directory count and bytes, glob, scandir, stdio, mmap, pread and errno match the original tree.
    assert virt.stdout == native.stdout


def test_outside_prefix_unchanged(served, tmp_path):
    c, src = served
    script = textwrap.dedent(r'''
        import errno, os, sys
        out = []
        for p in ["/tmp", "/nonexistent/x", "/etc/hostname/x", "/fanstorex", "relative-missing", "/tmp/../etc/hostname"]:
            try:
                st = os.stat(p)
                out.append((p, "ok", st.st_ino))
            except OSError as e:
                out.append((p, errno.errorcode[e.errno]))
        try:
            open("/proc/self/nonexistent")
        except OSError as e:
            out.append(errno.errorcode[e.errno])
        out.append(sorted(os.listdir(sys.argv[1])))
        print(out)
    ''')
    (tmp_path / "o.py").write_text(script)
    a = run([sys.executable, str(tmp_path / "o.py"), str(src)], c.env(), text=True, cwd=tmp_path)
    b = run([sys.executable, str(tmp_path / "o.py"), str(src)], c.env(preload=False), text=True, cwd=tmp_path)
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout


def test_daemon_killed_gives_eio(bins, tmp_path):
    src = make_src(tmp_path / "src")
    data = tmp_path / "data"
    pack(bins, src, data, "--partitions", "2", "--compress", "lz4")
    c = start_cluster(bins, data, tmp_path / "cl", nranks=0, mount=MOUNT)
    script = textwrap.dedent(r'''
        import errno, os, sys, time
        M = sys.argv[1]
        assert open(M + "/text/big.txt", "rb").read(5) == b"the q"   # works while the daemon lives
        sys.stdout.write("ready\n"); sys.stdout.flush()
        sys.stdin.readline()                                          # the test kills the daemon now
        t = time.time()
        try:
            open(M + "/text/small.txt", "rb").read()   # never opened: needs the daemon
            print("no error")
        except OSError as e:
            print(errno.errorcode[e.errno], round(time.time() - t, 1))
        print(os.path.getsize(M + "/text/small.txt"))                # metadata still answers from the index
    ''')
    (tmp_path / "k.py").write_text(script)
    p = subprocess.Popen([sys.executable, str(tmp_path / "k.py"), MOUNT], env=c.env(), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
        c.kill()
        time.sleep(0.5)
        out, err = p.communicate("go\n", timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    lines = out.split()
    assert lines[0] == "EIO", (out, err)
    assert float(lines[1]) < 10
    assert lines[2] == "6"


def test_shell_cd_then_children(served):
    """`cd /fanstore/x` in a shell, then child programs use relative paths."""
    c, src = served
    script = f"cd {MOUNT}/train/c1 && /bin/pwd && ls && cat ../link && md5sum img001.bin && cd ../.. && find . -type f | sort"
    r = run(["bash", "-c", script], c.env(), text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"{MOUNT}/train/c1"
    names = sorted(os.listdir(src / "train/c1"))
    assert lines[1:1 + len(names)] == names
    assert lines[1 + len(names)] == "hello"
    import hashlib
    assert lines[2 + len(names)].split()[0] == hashlib.md5((src / "train/c1/img001.bin").read_bytes()).hexdigest()
    want = sorted("./" + k for k, p in files_of(src).items() if not p.is_symlink())
    assert lines[3 + len(names):] == want


def test_remote_reads_with_four_ranks(bins, tmp_path):
    """mpiexec -n 4 daemons: every client node reads every file, most of them remote."""
    src = make_src(tmp_path / "src")
    data = tmp_path / "data"
    pack(bins, src, data, "--partitions", "8", "--compress", "lz4")
    c = start_cluster(bins, data, tmp_path / "cl", nranks=4, mount=MOUNT)
    try:
        files = {k: p for k, p in files_of(src).items() if not p.is_symlink()}
        for node in range(4):
            r = run(["cat", *[f"{MOUNT}/{k}" for k in sorted(files)]], c.env(node))
            assert r.returncode == 0, r.stderr
            assert r.stdout == b"".join(files[k].read_bytes() for k in sorted(files)), node
    finally:
        c.stop()


def test_debug_report(served):
    """FANSTORE_DEBUG=1 lists the hooked symbols and each virtual call, and does not hang."""
    c, src = served
    env = dict(c.env(), FANSTORE_DEBUG="1")
    r = run(["bash", "-c", f"cat {MOUNT}/text/small.txt; echo > {MOUNT}/text/small.txt"], env, text=True)
    assert r.stdout == "hello\n"
    assert "hooked open [" in r.stderr and "0 missing" in r.stderr, r.stderr
    assert f"open({MOUNT}/text/small.txt) ok" in r.stderr, r.stderr
    assert f"open({MOUNT}/text/small.txt) = EROFS" in r.stderr, r.stderr
    quiet = run(["cat", f"{MOUNT}/text/small.txt"], c.env(), text=True)
    assert quiet.stderr == ""
