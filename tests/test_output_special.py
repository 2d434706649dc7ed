"""FIFOs and unix sockets among outputs (issue 55), each call's outcome
compared with the same call in a native temporary directory:

- mkfifo, mknod(S_IFIFO), mknod(S_IFREG): the object's type and mode (the
  umask applied), EEXIST on an existing name; a writer and a reader (two
  processes) through the FIFO; O_NONBLOCK opens (ENXIO for a writer without
  a reader); chmod; rename (the FIFO still works under its new name);
  readdir's d_type; truncate EINVAL; unlink;
- a unix socket bound by a relative name in a working directory under the
  mount: lstat S_IFSOCK with 0777 less the umask, a second bind
  EADDRINUSE, connect (relative, absolute, from another process) and an
  echo, datagrams by sendto, rename, unlink and bind again, open ENXIO,
  connect to a file ECONNREFUSED;
- another node sees the FIFO's and the socket's type and mode; its connect
  to the socket is ECONNREFUSED (as natively once the server is gone, and
  as a socket whose server runs on another machine), and its opens of the
  FIFO behave as a FIFO's (a node-local meeting point).

Device files (S_IFCHR, S_IFBLK) made by root are records (type, mode, device number).
"""
import json
import os
import textwrap
import stat

import pytest

from fs_cluster import cluster_fixture, run_json
from fs_diff import differences, run_script as run, script

MOUNT = "/fanstore"

cl = cluster_fixture("special", seed=7, n_files=4, nranks=2, mount=MOUNT)


def same_as_native(cl, code, tmp_path, name, node=0):
    native = run_json(None, 0, code, str(tmp_path / name), timeout=180)
    ours = run_json(cl, node, code, f"{MOUNT}/{name}", timeout=180)
    diffs = differences(ours, native)
    assert not diffs, "fanstore differs from a native directory (fanstore, native): " + json.dumps(diffs, indent=1)
    return native, ours


FIFO = script(r"""
import stat, subprocess
root = sys.argv[1]
os.makedirs(root)
os.umask(0o022)
J = lambda *p: os.path.join(root, *p)
def kind(p):
    m = os.lstat(p).st_mode
    return [stat.S_IFMT(m), oct(stat.S_IMODE(m)), os.lstat(p).st_size]
attempt("mkfifo 0666", lambda: (os.mkfifo(J("f"), 0o666), kind(J("f")))[1])
attempt("mkfifo again", lambda: os.mkfifo(J("f")))
attempt("mknod S_IFIFO 0640", lambda: (os.mknod(J("n"), stat.S_IFIFO | 0o640), kind(J("n")))[1])
attempt("mknod S_IFREG 0666", lambda: (os.mknod(J("r"), stat.S_IFREG | 0o666), kind(J("r")), open(J("r")).read())[1:])
attempt("mknod type 0", lambda: (os.mknod(J("z"), 0o600), kind(J("z")))[1])
attempt("mknod bad type", lambda: os.mknod(J("bad"), 0o170000 | 0o600))
attempt("mkfifo in a missing directory", lambda: os.mkfifo(J("missing", "f")))
attempt("mkfifo under a fifo", lambda: os.mkfifo(J("f", "x")))
WRITER = "import os, sys; fd = os.open(sys.argv[1], os.O_WRONLY); os.write(fd, b'through the fifo'); os.close(fd)"
def pipe(name):
    w = subprocess.Popen([sys.executable, "-c", WRITER, J(name)])
    fd = os.open(J(name), os.O_RDONLY)
    data = b""
    while True:
        b = os.read(fd, 100)
        if not b:
            break
        data += b
    os.close(fd)
    return [data.decode(), w.wait()]
attempt("a writer and a reader", lambda: pipe("f"))
attempt("O_WRONLY|O_NONBLOCK without a reader", lambda: os.open(J("f"), os.O_WRONLY | os.O_NONBLOCK))
def nonblock_reader():
    r = os.open(J("f"), os.O_RDONLY | os.O_NONBLOCK)
    w = os.open(J("f"), os.O_WRONLY | os.O_NONBLOCK)
    os.write(w, b"x")
    got = os.read(r, 10)
    os.close(w)
    os.close(r)
    return got.decode()
attempt("O_NONBLOCK reader then writer", nonblock_reader)
attempt("O_RDWR", lambda: os.close(os.open(J("f"), os.O_RDWR)))
attempt("O_CREAT of the fifo opens it", lambda: os.close(os.open(J("f"), os.O_RDWR | os.O_CREAT, 0o600)))
attempt("O_CREAT|O_EXCL", lambda: os.open(J("f"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
attempt("O_DIRECTORY", lambda: os.open(J("f"), os.O_RDONLY | os.O_DIRECTORY))
attempt("fifo/", lambda: os.stat(J("f") + "/"))
attempt("chmod 0600", lambda: (os.chmod(J("f"), 0o600), kind(J("f")))[1])
attempt("utime", lambda: (os.utime(J("f"), (5, 7)), [os.lstat(J("f")).st_atime, os.lstat(J("f")).st_mtime])[1])
attempt("truncate", lambda: os.truncate(J("f"), 0))
attempt("rename", lambda: (os.rename(J("f"), J("g")), kind(J("g")))[1])
attempt("old name", lambda: os.lstat(J("f")))
attempt("through the new name", lambda: pipe("g"))
attempt("listing", lambda: sorted([e.name, e.is_file(follow_symlinks=False), e.is_dir(follow_symlinks=False)] for e in os.scandir(root)))
attempt("unlink", lambda: os.unlink(J("g")))
attempt("after unlink", lambda: os.lstat(J("g")))
attempt("mkfifo at the name again", lambda: (os.mkfifo(J("g"), 0o600), kind(J("g")))[1])
print(json.dumps(out, sort_keys=True))
""")


def test_fifo_as_native(cl, tmp_path):
    same_as_native(cl, FIFO, tmp_path, "fifo")


SOCKET = script(r"""
import socket, stat, subprocess, threading
root = sys.argv[1]
os.makedirs(root)
os.umask(0o022)
os.chdir(root)
J = lambda *p: os.path.join(root, *p)
def kind(p):
    m = os.lstat(p).st_mode
    return [stat.S_IFMT(m), oct(stat.S_IMODE(m))]
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
attempt("bind a relative name", lambda: srv.bind("sock"))
attempt("lstat", lambda: kind("sock"))
attempt("lstat by absolute path", lambda: kind(J("sock")))
srv.listen(4)
def echo_once():
    c, _ = srv.accept()
    c.sendall(c.recv(100).upper())
    c.close()
def echo(addr):
    t = threading.Thread(target=echo_once)
    t.start()
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        c.connect(addr)
        c.sendall(b"ping")
        return c.recv(100).decode()
    finally:
        c.close()
        t.join(timeout=1) if t.is_alive() else None
attempt("connect by the relative name", lambda: echo("sock"))
attempt("connect by the absolute path", lambda: echo(J("sock")))
CLIENT = "import socket, sys; c = socket.socket(socket.AF_UNIX); c.connect(sys.argv[1]); c.sendall(b'child'); print(c.recv(100).decode())"
def from_child():
    t = threading.Thread(target=echo_once)
    t.start()
    r = subprocess.run([sys.executable, "-c", CLIENT, J("sock")], capture_output=True, text=True, timeout=60)
    t.join(timeout=10)
    return [r.returncode, r.stdout.strip()]
attempt("connect from another process", from_child)
attempt("a second bind", lambda: socket.socket(socket.AF_UNIX).bind("sock"))
attempt("bind over a file", lambda: (open("file", "w").close(), socket.socket(socket.AF_UNIX).bind("file"))[1])
attempt("connect to a file", lambda: socket.socket(socket.AF_UNIX).connect("file"))
attempt("connect to a directory", lambda: socket.socket(socket.AF_UNIX).connect("."))
attempt("connect to a missing name", lambda: socket.socket(socket.AF_UNIX).connect("missing"))
attempt("bind in a missing directory", lambda: socket.socket(socket.AF_UNIX).bind("missing/s"))
attempt("open the socket", lambda: os.open("sock", os.O_RDONLY))
attempt("chmod", lambda: (os.chmod("sock", 0o700), kind("sock"))[1])
attempt("rename", lambda: (os.rename("sock", "sock2"), kind("sock2"))[1])
attempt("connect by the old name", lambda: socket.socket(socket.AF_UNIX).connect("sock"))
attempt("connect by the new name", lambda: echo("sock2"))
def datagrams():
    d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    d.bind("dg")
    c = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    c.sendto(b"one", "dg")
    c.sendto(b"two", J("dg"))
    return [d.recv(10).decode(), d.recv(10).decode(), kind("dg")]
attempt("datagrams by sendto", datagrams)
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def raw(nr, fd, path):
    # A raw system call (as Go's net package makes), through libc's syscall().
    addr = ctypes.create_string_buffer(2 + 108)
    addr[0:2] = socket.AF_UNIX.to_bytes(2, "little")
    addr[2:2 + len(path)] = path
    if libc.syscall(nr, fd, addr, 2 + len(path) + 1) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
def raw_bind_connect():
    s = socket.socket(socket.AF_UNIX)
    raw(49, s.fileno(), b"raw")  # SYS_bind, x86_64
    s.listen(1)
    c = socket.socket(socket.AF_UNIX)
    raw(42, c.fileno(), b"raw")  # SYS_connect
    a, _ = s.accept()
    c.sendall(b"raw")
    return [kind("raw"), a.recv(10).decode()]
attempt("raw bind and connect", raw_bind_connect)
attempt("listing", lambda: sorted([e.name, e.is_file(follow_symlinks=False), e.is_dir(follow_symlinks=False)] for e in os.scandir(".")))
attempt("unlink", lambda: os.unlink("sock2"))
attempt("lstat after unlink", lambda: os.lstat("sock2"))
attempt("bind the name again", lambda: (socket.socket(socket.AF_UNIX).bind("sock2"), kind("sock2"))[1])
srv.close()
print(json.dumps(out, sort_keys=True))
""")


def test_unix_socket_in_a_cwd_under_the_mount(cl, tmp_path):
    native, _ = same_as_native(cl, SOCKET, tmp_path, "sock")
    assert native["connect by the relative name"] == ["OK", "PING"]
    assert native["a second bind"] == "EADDRINUSE"


OTHER_NODE = script(r"""
import socket, stat
root, step = sys.argv[1], sys.argv[2]
J = lambda *p: os.path.join(root, *p)
def kind(p):
    m = os.lstat(p).st_mode
    return [stat.S_IFMT(m), oct(stat.S_IMODE(m))]
if step == "make":
    os.makedirs(root)
    os.umask(0o027)
    os.mkfifo(J("fifo"), 0o666)
    s = socket.socket(socket.AF_UNIX)
    s.bind(J("sock"))
    s.listen(1)
    attempt("made", lambda: [kind(J("fifo")), kind(J("sock"))])
    s.close()  # the socket file stays; nothing listens on it any more
else:
    attempt("fifo", lambda: kind(J("fifo")))
    attempt("socket", lambda: kind(J("sock")))
    attempt("listing", lambda: sorted([e.name, e.is_file(follow_symlinks=False)] for e in os.scandir(root)))
    attempt("connect", lambda: socket.socket(socket.AF_UNIX).connect(J("sock")))
    attempt("fifo O_WRONLY|O_NONBLOCK", lambda: os.open(J("fifo"), os.O_WRONLY | os.O_NONBLOCK))
    def meet():
        r = os.open(J("fifo"), os.O_RDONLY | os.O_NONBLOCK)
        w = os.open(J("fifo"), os.O_WRONLY)
        os.write(w, b"here")
        got = os.read(r, 10).decode()
        os.close(w)
        os.close(r)
        return got
    attempt("fifo: reader and writer of this node", meet)
print(json.dumps(out, sort_keys=True))
""")


def test_another_node_sees_the_type(cl, tmp_path):
    name = "other"
    made = run(None, 0, OTHER_NODE, str(tmp_path / name), "make")
    assert run(cl, 0, OTHER_NODE, f"{MOUNT}/{name}", "make") == made
    native = run(None, 0, OTHER_NODE, str(tmp_path / name), "check")
    ours = run(cl, 1, OTHER_NODE, f"{MOUNT}/{name}", "check")
    assert ours == native
    assert native["connect"] == "ECONNREFUSED"


DEVICES = script(r"""
import stat
root = sys.argv[1]
os.makedirs(root)
os.chmod(root, 0o777)
J = lambda n: os.path.join(root, n)
def st(n):
    s = os.lstat(J(n))
    return [stat.S_IFMT(s.st_mode), oct(stat.S_IMODE(s.st_mode)), os.major(s.st_rdev), os.minor(s.st_rdev)]
os.umask(0o022)
attempt("S_IFCHR", lambda: (os.mknod(J("c"), stat.S_IFCHR | 0o666, os.makedev(1, 3)), st("c"))[1])
attempt("S_IFBLK", lambda: (os.mknod(J("b"), stat.S_IFBLK | 0o600, os.makedev(7, 0)), st("b"))[1])
attempt("S_IFCHR on an existing name", lambda: (os.mkfifo(J("f")), os.mknod(J("f"), stat.S_IFCHR | 0o600))[1])
attempt("listed", lambda: sorted((e.name, e.is_char_device() if hasattr(e, "is_char_device") else stat.S_ISCHR(e.stat(follow_symlinks=False).st_mode)) for e in os.scandir(root)))
attempt("chmod", lambda: (os.chmod(J("c"), 0o640), st("c"))[1])
attempt("rename", lambda: (os.rename(J("b"), J("b2")), st("b2"))[1])
def as_other():
    pid = os.fork()
    if pid == 0:
        os.setuid(65534)
        try:
            os.mknod(J("u"), stat.S_IFCHR | 0o600, os.makedev(1, 3))
            os._exit(0)
        except OSError as e:
            os._exit(e.errno)
    return errno.errorcode.get(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), "OK")
attempt("not root", as_other)
attempt("unlink", lambda: (os.unlink(J("c")), os.unlink(J("b2")), sorted(os.listdir(root)))[2])
print(json.dumps(out, sort_keys=True))
""")


def test_device_files_are_records_made_by_root(cl, tmp_path):
    """mknod of a character or block device by root: its type, mode (less
    the umask) and device number are seen by lstat and readdir, as natively;
    chmod, rename and unlink work on it; another user gets EPERM. (Opening
    it through the mount is ENXIO: no device is opened there.)"""
    if os.geteuid() != 0:
        pytest.skip("mknod of a device needs root natively")
    import shutil, tempfile
    base = tempfile.mkdtemp(dir="/var/tmp", prefix="fanstore-dev-")  # reachable by the other user
    os.chmod(base, 0o755)
    try:
        native = run_json(None, 0, DEVICES, os.path.join(base, "dev"), timeout=120)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    ours = run_json(cl, 0, DEVICES, f"{MOUNT}/dev", timeout=120)
    assert ours == native
    assert native["S_IFCHR"] == ["OK", [stat.S_IFCHR, "0o644", 1, 3]] and native["not root"] == ["OK", "EPERM"]


def test_fifos_and_sockets_survive_a_kill_a_new_job_and_export(bins, tmp_path):
    """kill -9 and a restart on the same --local: the FIFO and the socket's
    name are registered again (the FIFO works); --persist: a new job sees
    their records, and `fanstore export` makes the FIFO and skips the socket."""
    import stat
    import subprocess
    from fs_cluster import packed_dataset, start_cluster
    packed_dataset(bins, tmp_path, n_files=4, seed=11, partitions=2)
    make = textwrap.dedent(r"""
    import os, socket, sys
    r = sys.argv[1]
    os.makedirs(r)
    os.mkfifo(os.path.join(r, "f.tmp"), 0o640)
    os.rename(os.path.join(r, "f.tmp"), os.path.join(r, "f"))
    socket.socket(socket.AF_UNIX).bind(os.path.join(r, "s"))
    print("{}")
    """)
    check = textwrap.dedent(r"""
    import json, os, stat, subprocess, sys, time
    r = sys.argv[1]
    for _ in range(100):  # recovery runs once the job is ready
        if os.path.lexists(os.path.join(r, "s")):
            break
        time.sleep(0.1)
    kinds = [[stat.S_IFMT(os.lstat(os.path.join(r, n)).st_mode), oct(stat.S_IMODE(os.lstat(os.path.join(r, n)).st_mode))] for n in ("f", "s")]
    got = None
    if len(sys.argv) > 2:
        w = subprocess.Popen([sys.executable, "-c", "import os, sys; fd = os.open(sys.argv[1], os.O_WRONLY); os.write(fd, b'again'); os.close(fd)", os.path.join(r, "f")])
        fd = os.open(os.path.join(r, "f"), os.O_RDONLY)
        got = os.read(fd, 10).decode()
        os.close(fd)
        w.wait()
    print(json.dumps([kinds, got]))
    """)
    umask = os.umask(0o022)
    os.umask(umask)
    kinds = [[stat.S_IFIFO, "0o640"], [stat.S_IFSOCK, oct(0o777 & ~umask)]]
    c = start_cluster(bins, tmp_path / "data", tmp_path / "c1", nranks=2, mount=MOUNT)
    try:
        run(c, 0, make, f"{MOUNT}/k9")
    finally:
        c.local = tmp_path / "not-removed"
        c.kill()
    c2 = start_cluster(bins, tmp_path / "data", tmp_path / "c1", nranks=2, mount=MOUNT)
    try:
        assert run(c2, 0, check, f"{MOUNT}/k9", "pipe") == [kinds, "again"]
    finally:
        c2.stop()
    persist = tmp_path / "persist"
    c3 = start_cluster(bins, tmp_path / "data", tmp_path / "c3", nranks=2, mount=MOUNT, extra_args=["--persist", persist])
    try:
        run(c3, 1, make, f"{MOUNT}/keep")
    finally:
        c3.stop()
    c4 = start_cluster(bins, tmp_path / "data", tmp_path / "c4", nranks=3, mount=MOUNT, extra_args=["--persist", persist])
    try:
        assert run(c4, 2, check, f"{MOUNT}/keep") == [kinds, None]
    finally:
        c4.stop()
    dest = tmp_path / "exported"
    subprocess.run([bins["cli"], "export", str(persist), "--to", str(dest)], check=True, capture_output=True, timeout=120)
    assert stat.S_ISFIFO(os.lstat(dest / "keep" / "f").st_mode)
    assert stat.S_IMODE(os.lstat(dest / "keep" / "f").st_mode) == 0o640
    assert not os.path.lexists(dest / "keep" / "s")
