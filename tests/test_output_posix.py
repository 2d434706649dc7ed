"""POSIX corners of outputs (issue 55), each call's outcome (value, errno,
mode) through /fanstore on a 2-node cluster compared with the same call in a
native temporary directory (ext4 or tmpfs: the kernel's answer):

- the umask: new files and directories take the process's real umask (read
  from /proc/self/status at first use, then followed through umask(), a raw
  umask system call, fork and exec), not a fixed 022; O_CREAT of an existing
  file keeps its mode;
- O_NOFOLLOW: a symlink as the last component is ELOOP (ENOTDIR with
  O_DIRECTORY, EEXIST with O_EXCL), never followed, nor its target created;
- NAME_MAX and PATH_MAX: a name of 256 bytes is ENAMETOOLONG for every call
  (after the errors of the components before it), a path string of 4096
  bytes or more too, and so is a symlink target of 4096 bytes;
- "." and ".." as the last component: rename EBUSY, rmdir EINVAL /
  ENOTEMPTY, unlink EISDIR, mkdir and symlink EEXIST (after the errors of
  the directory they stand for);
- a symlink loop as a parent: ELOOP for every call, creations included.

Names are made on node 0 and looked up on node 1 where it matters.
"""
import json
import os

from fs_cluster import cluster_fixture, run_json
from fs_diff import differences, run_script as run, script

MOUNT = "/fanstore"

cl = cluster_fixture("posix", seed=5, n_files=6, nranks=2, mount=MOUNT)


def same_as_native(cl, code, tmp_path, name, node=0, **kw):
    """`code` (a fs_diff script taking its root) natively and through the
    mount on `node`: both results, after checking that they are equal."""
    native = run_json(None, 0, code, str(tmp_path / name), timeout=180, **kw)
    ours = run_json(cl, node, code, f"{MOUNT}/{name}", timeout=180, **kw)
    diffs = differences(ours, native)
    assert not diffs, "fanstore differs from a native directory (fanstore, native): " + json.dumps(diffs, indent=1)
    return native, ours


def made_on_0_checked_on_1(cl, code, tmp_path, name):
    """`code` run with "make" natively and through the mount on node 0
    (results equal), then with "check" natively and on node 1: the two checks."""
    made = run(None, 0, code, str(tmp_path / name), "make")
    assert run(cl, 0, code, f"{MOUNT}/{name}", "make") == made
    return run(None, 0, code, str(tmp_path / name), "check"), run(cl, 1, code, f"{MOUNT}/{name}", "check")


UMASK = script(r"""
import ctypes, stat, subprocess, tempfile, threading
root = sys.argv[1]
os.makedirs(root)
J = lambda *p: os.path.join(root, *p)
mode = lambda p: oct(stat.S_IMODE(os.lstat(p).st_mode))
def mkfile(name, m, flags=os.O_CREAT | os.O_WRONLY):
    os.close(os.open(J(name), flags, m))
    return mode(J(name))
def mkdir(name, m):
    os.mkdir(J(name), m)
    return mode(J(name))
# The umask the parent set before exec (027), never changed here yet: read at first use.
attempt("initial: file 0666", lambda: mkfile("init-f", 0o666))
attempt("initial: dir 0777", lambda: mkdir("init-d", 0o777))
attempt("umask() returns the initial one", lambda: oct(os.umask(0o077)))
attempt("077: file 0666", lambda: mkfile("f077", 0o666))
attempt("077: dir 0777", lambda: mkdir("d077", 0o777))
attempt("077: dir 01777 keeps the sticky bit", lambda: mkdir("d077s", 0o1777))
attempt("077: creat 0644", lambda: (os.close(os.open(J("c077"), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)), mode(J("c077")))[1])
attempt("077: fopen w", lambda: (open(J("w077"), "w").close(), mode(J("w077")))[1])
def made(p, name):
    # The mode of temporary `p`, then renamed `name` (the same name in both trees).
    m = mode(p)
    os.rename(p, J(name))
    return m
attempt("077: mkstemp", lambda: made(tempfile.mkstemp(dir=root)[1], "mkstemp"))
attempt("077: mkdtemp", lambda: made(tempfile.mkdtemp(dir=root), "mkdtemp"))
attempt("077: symlink stays 0777", lambda: (os.symlink("f077", J("l077")), mode(J("l077")))[1])
os.umask(0)
attempt("000: file 0666", lambda: mkfile("f000", 0o666))
attempt("000: file 0751", lambda: mkfile("f751", 0o751))
attempt("000: dir 0777", lambda: mkdir("d000", 0o777))
os.umask(0o077)
attempt("O_CREAT of an existing file keeps its mode", lambda: mkfile("f000", 0o600))
attempt("O_CREAT|O_TRUNC of an existing file keeps its mode", lambda: mkfile("f000", 0o600, os.O_CREAT | os.O_WRONLY | os.O_TRUNC))
attempt("O_EXCL on it", lambda: mkfile("f000", 0o600, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
def in_thread():
    t = threading.Thread(target=os.umask, args=(0o026,))
    t.start()
    t.join()
    return mkfile("thread", 0o666)
attempt("umask set by another thread", in_thread)
def forked():
    os.umask(0o007)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(os.open(J("child"), os.O_CREAT | os.O_WRONLY, 0o666))
            os.umask(0o077)  # the child's own: the parent's stays 007
        except OSError:
            code = 1
        os._exit(code)
    os.waitpid(pid, 0)
    return [mode(J("child")), mkfile("parent-after-fork", 0o666)]
attempt("fork: the child inherits it", forked)
CHILD = "import os, sys; os.close(os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o666)); print(oct(os.umask(0)))"
attempt("exec: a new image starts from the kernel's",
        lambda: [subprocess.run([sys.executable, "-c", CHILD, J("exec")], check=True, capture_output=True, text=True).stdout.strip(),
                 mode(J("exec"))])
attempt("subprocess umask= (vfork child) leaves the parent's",
        lambda: [subprocess.run([sys.executable, "-c", CHILD, J("exec2")], check=True, capture_output=True, text=True, umask=0o022).stdout.strip(),
                 mode(J("exec2")), mkfile("parent-after-spawn", 0o666)])
libc = ctypes.CDLL(None, use_errno=True)
def raw():
    old = libc.syscall(95, 0o037)  # SYS_umask, x86_64: libc's syscall(), as a Go or rustix program calls it
    return [oct(old), mkfile("raw", 0o666)]
attempt("umask through syscall()", raw)
print(json.dumps(out, sort_keys=True))
""")

UMASK_OTHER_NODE = r"""
import json, os, stat, sys
root = sys.argv[1]
print(json.dumps({n: oct(stat.S_IMODE(os.lstat(os.path.join(root, n)).st_mode)) for n in sorted(os.listdir(root))}))
"""


def test_new_outputs_take_the_process_umask(cl, tmp_path):
    native, _ = same_as_native(cl, UMASK, tmp_path, "umask", preexec_fn=lambda: os.umask(0o027))
    # What the kernel says (the fixed 022 gave 0644 and 0755 throughout).
    assert native["initial: file 0666"] == ["OK", "0o640"] and native["077: file 0666"] == ["OK", "0o600"]
    assert native["077: dir 0777"] == ["OK", "0o700"] and native["000: file 0666"] == ["OK", "0o666"]
    assert native["O_CREAT of an existing file keeps its mode"] == ["OK", "0o666"]
    assert native["exec: a new image starts from the kernel's"] == ["OK", ["0o7", "0o660"]]
    # Another node sees the modes the creating node gave.
    assert run(cl, 1, UMASK_OTHER_NODE, f"{MOUNT}/umask") == run(None, 0, UMASK_OTHER_NODE, str(tmp_path / "umask"))


NOFOLLOW = script(r"""
import stat
root = sys.argv[1]
os.makedirs(os.path.join(root, "dir"), exist_ok=True)
J = lambda *p: os.path.join(root, *p)
def opened(p, flags, m=0o644):
    fd = os.open(J(p), flags, m)
    try:
        s = os.fstat(fd)
        return [stat.S_IFMT(s.st_mode) == stat.S_IFREG, stat.S_ISDIR(s.st_mode)]
    finally:
        os.close(fd)
if sys.argv[2] == "make":
    with open(J("file"), "w") as f:
        f.write("data")
    os.symlink("missing", J("dangling"))
    os.symlink("file", J("tofile"))
    os.symlink("dir", J("todir"))
    print(json.dumps(out))
    sys.exit(0)
attempt("O_CREAT|O_NOFOLLOW on a dangling link", lambda: opened("dangling", os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW))
attempt("its target was not created", lambda: os.path.lexists(J("missing")))
attempt("O_RDONLY|O_NOFOLLOW on a link to a file", lambda: opened("tofile", os.O_RDONLY | os.O_NOFOLLOW))
attempt("O_CREAT|O_NOFOLLOW on a link to a file", lambda: opened("tofile", os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW))
attempt("O_TRUNC|O_NOFOLLOW on a link to a file", lambda: opened("tofile", os.O_TRUNC | os.O_WRONLY | os.O_NOFOLLOW))
attempt("the file is untouched", lambda: open(J("file")).read())
attempt("O_CREAT|O_EXCL|O_NOFOLLOW on a link", lambda: opened("tofile", os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW))
attempt("O_DIRECTORY|O_NOFOLLOW on a link to a directory", lambda: opened("todir", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW))
attempt("O_NOFOLLOW on link/ follows it", lambda: opened("todir/", os.O_RDONLY | os.O_NOFOLLOW))
attempt("O_NOFOLLOW on a file", lambda: opened("file", os.O_RDONLY | os.O_NOFOLLOW))
attempt("O_NOFOLLOW|O_CREAT on a new name", lambda: opened("new", os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW))
attempt("O_NOFOLLOW through a parent link", lambda: opened("todir/../file", os.O_RDONLY | os.O_NOFOLLOW))
attempt("O_PATH|O_NOFOLLOW on a file", lambda: opened("file", os.O_PATH | os.O_NOFOLLOW))
attempt("without O_NOFOLLOW the link is followed", lambda: opened("tofile", os.O_RDONLY))
print(json.dumps(out, sort_keys=True))
""")


def test_o_nofollow_does_not_follow_the_last_symlink(cl, tmp_path):
    # The links are made on node 0 and opened on node 1.
    native, ours = made_on_0_checked_on_1(cl, NOFOLLOW, tmp_path, "nofollow")
    assert native["O_CREAT|O_NOFOLLOW on a dangling link"] == "ELOOP" and native["its target was not created"] == ["OK", False]
    assert native["O_RDONLY|O_NOFOLLOW on a link to a file"] == "ELOOP"
    diffs = differences(ours, native)
    assert not diffs, "fanstore differs from a native directory (fanstore, native): " + json.dumps(diffs, indent=1)


NAMES = script(r"""
root = sys.argv[1]
J = lambda *p: os.path.join(root, *p)
long, ok = "n" * 256, "k" * 255
if sys.argv[2] == "make":
    os.makedirs(J("d"))
    open(J("file"), "w").close()
    attempt("create 255", lambda: os.close(os.open(J(ok), os.O_CREAT | os.O_WRONLY, 0o644)))
    attempt("mkdir 255 in d", lambda: os.mkdir(J("d", ok)))
    attempt("symlink to a 256-byte name", lambda: os.symlink(long, J("tolong")))
    print(json.dumps(out, sort_keys=True))
    sys.exit(0)
attempt("create 256", lambda: os.close(os.open(J(long), os.O_CREAT | os.O_WRONLY, 0o644)))
attempt("open 256", lambda: os.close(os.open(J(long), os.O_RDONLY)))
attempt("stat 256", lambda: os.stat(J(long)))
attempt("lstat 256", lambda: os.lstat(J(long)))
attempt("access 256", lambda: os.access(J(long), os.F_OK) or os.stat(J(long)))
attempt("mkdir 256", lambda: os.mkdir(J(long)))
attempt("mkdir d/256", lambda: os.mkdir(J("d", long)))
attempt("symlink at 256", lambda: os.symlink("file", J(long)))
attempt("symlink to a 256-byte name is fine", lambda: os.symlink(long, J("tolong2")))
attempt("stat through a link to a 256-byte name", lambda: os.stat(J("tolong")))
attempt("rename to 256", lambda: os.rename(J("file"), J(long)))
attempt("rename from 256", lambda: os.rename(J(long), J("x")))
attempt("link to 256", lambda: os.link(J("file"), J(long)))
attempt("unlink 256", lambda: os.unlink(J(long)))
attempt("rmdir 256", lambda: os.rmdir(J(long)))
attempt("chmod 256", lambda: os.chmod(J(long), 0o600))
attempt("256 under a missing directory", lambda: os.stat(J("nope", long)))
attempt("256 under a file", lambda: os.stat(J("file", long)))
attempt("256 then ..", lambda: os.stat(J(long, "..", "file")))
attempt("stat 255 (made on the other node)", lambda: os.stat(J(ok)).st_size)
attempt("stat d/255 (made on the other node)", lambda: os.path.isdir(J("d", ok)))
attempt("a path of 4096 bytes", lambda: os.stat((root + "/d" * 3000)[:4096]))
attempt("a path of 4095 bytes", lambda: os.stat((root + "/d" * 3000)[:4095]))
attempt("symlink target of 4096 bytes", lambda: os.symlink("t" * 4096, J("big")))
attempt("symlink target of 4095 bytes", lambda: (os.symlink("t" * 4095, J("big")), len(os.readlink(J("big"))))[1])
attempt("listing", lambda: sorted(n if len(n) < 200 else str(len(n)) for n in os.listdir(root)))
print(json.dumps(out, sort_keys=True))
""")


def test_name_max_and_path_max_are_enforced(cl, tmp_path):
    native, ours = made_on_0_checked_on_1(cl, NAMES, tmp_path, "names")
    for k in ("create 256", "mkdir 256", "symlink at 256", "rename to 256", "stat 256", "symlink target of 4096 bytes",
              "stat through a link to a 256-byte name"):
        assert native[k] == "ENAMETOOLONG", (k, native[k])
    assert native["256 under a missing directory"] == "ENOENT" and native["256 under a file"] == "ENOTDIR"
    diffs = differences(ours, native)
    assert not diffs, "fanstore differs from a native directory (fanstore, native): " + json.dumps(diffs, indent=1)


DOTS = script(r"""
import ctypes
root = sys.argv[1]
J = lambda *p: os.path.join(root, *p)
os.makedirs(J("d", "s", "in"))
os.makedirs(J("d", "e"))
open(J("d", "file"), "w").close()
libc = ctypes.CDLL(None, use_errno=True)
def renameat2(a, b, flags):
    if libc.renameat2(-100, J(a).encode(), -100, J(b).encode(), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
for a, b in [("d/s/.", "x"), ("d/s/..", "x"), ("d/s/./", "x"), ("d/e", "d/s/."), ("d/e", "d/s/.."), ("d/s/.", "d/s/."),
             ("nope/.", "x"), ("d/file/.", "x"), ("d/e", "nope/."), ("d/e", "d/file/.")]:
    attempt(f"rename {a} {b}", lambda: os.rename(J(a), J(b)))
attempt("renameat2 NOREPLACE d/e d/s/.", lambda: renameat2("d/e", "d/s/.", 1))
attempt("renameat2 NOREPLACE d/s/. x", lambda: renameat2("d/s/.", "x", 1))
for p in ["d/s/.", "d/s/..", "d/s/in/.", "d/s/in/..", "d/file/.", "nope/.", "."]:
    attempt(f"rmdir {p}", lambda: os.rmdir(J(p)))
for p in ["d/s/.", "d/s/..", "d/file/.", "nope/."]:
    attempt(f"unlink {p}", lambda: os.unlink(J(p)))
for p in ["d/s/.", "d/s/..", "d/new/.", "d/file/."]:
    attempt(f"mkdir {p}", lambda: os.mkdir(J(p)))
    attempt(f"symlink at {p}", lambda: os.symlink("x", J(p)))
    attempt(f"link at {p}", lambda: os.link(J("d", "file"), J(p)))
attempt("tree", lambda: sorted((os.path.relpath(d, root), sorted(ds), sorted(fs)) for d, ds, fs in os.walk(root)))
print(json.dumps(out, sort_keys=True))
""")


def test_dot_and_dotdot_as_the_last_component(cl, tmp_path):
    native, _ = same_as_native(cl, DOTS, tmp_path, "dots", node=1)
    assert native["rename d/s/. x"] == "EBUSY" and native["rmdir d/s/."] == "EINVAL"
    assert native["rmdir d/s/.."] == "ENOTEMPTY" and native["unlink d/s/."] == "EISDIR"


LOOPS = script(r"""
root = sys.argv[1]
J = lambda *p: os.path.join(root, *p)
if sys.argv[2] == "make":
    os.makedirs(J("d", "s"))
    open(J("d", "file"), "w").close()
    os.symlink("la", J("la"))
    os.symlink("lb", J("lc"))
    os.symlink("lc", J("lb"))
    print(json.dumps(out))
    sys.exit(0)
for loop in ["la", "lb"]:
    x = J(loop, "test")
    for name, f in [("symlink", lambda: os.symlink("x", x)), ("create", lambda: os.close(os.open(x, os.O_CREAT | os.O_WRONLY, 0o644))),
                    ("mkdir", lambda: os.mkdir(x)), ("open", lambda: os.close(os.open(x, os.O_RDONLY))),
                    ("stat", lambda: os.stat(x)), ("lstat", lambda: os.lstat(x)), ("unlink", lambda: os.unlink(x)),
                    ("rmdir", lambda: os.rmdir(x)), ("rename from", lambda: os.rename(x, J("y"))),
                    ("rename to", lambda: os.rename(J("d", "s"), x)), ("link to", lambda: os.link(J("d", "file"), x)),
                    ("chmod", lambda: os.chmod(x, 0o600)), ("truncate", lambda: os.truncate(x, 0)),
                    ("readlink", lambda: os.readlink(x)), ("listdir", lambda: os.listdir(x)), ("chdir", lambda: os.chdir(x))]:
        attempt(f"{name} {loop}/test", f)
    attempt(f"stat {loop}", lambda: os.stat(J(loop)))
    attempt(f"lstat {loop} is a link", lambda: __import__("stat").S_ISLNK(os.lstat(J(loop)).st_mode))
print(json.dumps(out, sort_keys=True))
""")


def test_a_symlink_loop_as_a_parent_is_eloop(cl, tmp_path):
    native, ours = made_on_0_checked_on_1(cl, LOOPS, tmp_path, "loops")
    assert native["symlink la/test"] == "ELOOP" and native["mkdir lb/test"] == "ELOOP"
    diffs = differences(ours, native)
    assert not diffs, "fanstore differs from a native directory (fanstore, native): " + json.dumps(diffs, indent=1)


OWNERS = script(r"""
import grp, stat
root = sys.argv[1]
os.makedirs(root)
os.chmod(root, 0o777)
J = lambda *p: os.path.join(root, *p)
def ids(p):
    s = os.lstat(p)
    return [s.st_uid, s.st_gid, oct(stat.S_IMODE(s.st_mode))]
def as_user(key, uid, gids, f):
    # f in a forked child that runs as uid with groups gids (the first is
    # its gid), as pjdfstest's -u/-g do: its result or errno name under key.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.setgroups(gids)
            os.setgid(gids[0])
            os.setuid(uid)
            res = ["OK", f()]
        except OSError as e:
            res = errno.errorcode[e.errno]
        os.write(w, json.dumps(res).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.waitpid(pid, 0)
    out[key] = json.loads(data)
def mkfile(p, m):
    os.close(os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, m))
    return ids(p)
def reads(p):
    with open(p, "rb") as f:
        return f.read().decode()
def writes(p, text):
    with open(p, "w") as f:
        f.write(text)
    return ids(p)
os.umask(0o022)
# Root creates, gives away, and sees the owner it gave.
attempt("root file", lambda: mkfile(J("f"), 0o644))
attempt("root dir", lambda: (os.mkdir(J("d"), 0o755), ids(J("d")))[1])
attempt("chown file", lambda: (os.chown(J("f"), 65534, 65533), ids(J("f")))[1])
attempt("chown -1 keeps the uid", lambda: (os.chown(J("f"), -1, 65534), ids(J("f")))[1])
attempt("lchown of a symlink", lambda: (os.symlink("f", J("l")), os.lchown(J("l"), 65533, 65533), ids(J("l")), ids(J("f")))[2:])
attempt("chown drops set-user-ID", lambda: (mkfile(J("s"), 0o755), os.chmod(J("s"), 0o6755), os.chown(J("s"), 65534, 65534), ids(J("s")))[3])
attempt("fchown while writing", lambda: (mkfile(J("w0"), 0o600), (lambda fd: (os.write(fd, b"x"), os.fchown(fd, 65533, 65532), os.close(fd)))(os.open(J("w0"), os.O_WRONLY)), ids(J("w0")))[2])
# Another user: the kernel's permission checks.
as_user("other creates in a root 0755 dir", 65534, [65534], lambda: mkfile(J("d", "x"), 0o644))
attempt("chown dir to 65534", lambda: (os.chown(J("d"), 65534, 65534), ids(J("d")))[1])
as_user("owner creates in its dir", 65534, [65534], lambda: mkfile(J("d", "x"), 0o640))
as_user("owner writes its file", 65534, [65534], lambda: writes(J("d", "x"), "hello"))
as_user("group member reads", 65533, [65533, 65534], lambda: reads(J("d", "x")))
as_user("others may not read 0640", 65532, [65532], lambda: reads(J("d", "x")))
as_user("group member may not write 0640", 65533, [65533, 65534], lambda: writes(J("d", "x"), "no"))
as_user("non-owner chmod is EPERM", 65533, [65533, 65534], lambda: os.chmod(J("d", "x"), 0o666))
as_user("owner chmod", 65534, [65534], lambda: (os.chmod(J("d", "x"), 0o000), ids(J("d", "x")))[1])
as_user("owner may not read 0000", 65534, [65534], lambda: reads(J("d", "x")))
attempt("root reads 0000", lambda: reads(J("d", "x")))
as_user("owner gives its group to one of its groups", 65534, [65534, 65531], lambda: (os.chown(J("d", "x"), -1, 65531), ids(J("d", "x")))[1])
as_user("owner may not give the group to another", 65534, [65534], lambda: os.chown(J("d", "x"), -1, 65530))
as_user("owner may not give the file away", 65534, [65534], lambda: os.chown(J("d", "x"), 65533, -1))
as_user("chown -1 -1 by anyone", 65532, [65532], lambda: os.chown(J("d", "x"), -1, -1))
as_user("utime now without write permission", 65533, [65533], lambda: os.utime(J("d", "x")))
as_user("explicit utime by a non-owner", 65533, [65533], lambda: os.utime(J("d", "x"), (1, 2)))
attempt("dir 0555", lambda: (os.chmod(J("d"), 0o555), ids(J("d")))[1])
as_user("owner creates in its 0555 dir", 65534, [65534], lambda: mkfile(J("d", "y"), 0o644))
as_user("owner removes from its 0555 dir", 65534, [65534], lambda: os.unlink(J("d", "x")))
as_user("owner mkdir in its 0555 dir", 65534, [65534], lambda: os.mkdir(J("d", "e")))
attempt("dir 0644", lambda: (os.chmod(J("d"), 0o644), ids(J("d")))[1])
as_user("no search permission: stat", 65534, [65534], lambda: ids(J("d", "x")))
as_user("no search permission: open", 65534, [65534], lambda: reads(J("d", "x")))
attempt("dir 01777", lambda: (os.chmod(J("d"), 0o1777), ids(J("d")))[1])
as_user("sticky: another's file stays", 65533, [65533], lambda: os.unlink(J("d", "x")))
as_user("sticky: another's file is not renamed", 65533, [65533], lambda: os.rename(J("d", "x"), J("d", "z")))
as_user("sticky: its own may go", 65533, [65533], lambda: (mkfile(J("d", "m"), 0o600), os.unlink(J("d", "m")))[0])
as_user("a write by a non-root writer drops set-user-ID", 65534, [65534], lambda: (os.chmod(J("d", "x"), 0o4777), writes(J("d", "x"), "w"))[1])
# A set-group-ID directory gives its group to what is made in it, and S_ISGID to a new directory.
attempt("sgid dir", lambda: (os.mkdir(J("sg")), os.chown(J("sg"), 0, 65531), os.chmod(J("sg"), 0o2777), ids(J("sg")))[3])
attempt("file in a sgid dir", lambda: mkfile(J("sg", "f"), 0o644))
attempt("dir in a sgid dir", lambda: (os.mkdir(J("sg", "sub"), 0o755), ids(J("sg", "sub")))[1])
attempt("symlink in a sgid dir", lambda: (os.symlink("f", J("sg", "l")), ids(J("sg", "l")))[1])
as_user("another user's file in a sgid dir", 65534, [65534], lambda: mkfile(J("sg", "g"), 0o644))
print(json.dumps(out))
""")


def test_ownership_and_permission_checks_for_other_users(cl, tmp_path):
    """Files record their owner and group (chown as root, chown of a file
    being written, the owner's group changes), and a daemon run by root
    serves other uids with the kernel's answers: EACCES for mode bits,
    EPERM for chmod/chown/utime by a non-owner, the sticky directory rule,
    search permission of the name's directory. Run natively in a directory
    every user can reach, and through the mount on node 0."""
    if os.geteuid() != 0:
        import pytest
        pytest.skip("needs root: the children switch to other uids")
    import tempfile
    base = tempfile.mkdtemp(dir="/var/tmp", prefix="fanstore-owners-")
    os.chmod(base, 0o755)
    # Other users' processes reach the ranks' local directories (their O_EXCL
    # markers), as they must under a root daemon's --local: the test's own
    # temporary directories above it are opened for them.
    d = cl.local
    while d != d.parent and d.parent != d.anchor and str(d) not in ("/tmp", "/var/tmp"):
        os.chmod(d, os.stat(d).st_mode & 0o7777 | 0o011)
        d = d.parent
    try:
        native = run_json(None, 0, OWNERS, os.path.join(base, "owners"), timeout=180)
        ours = run_json(cl, 0, OWNERS, f"{MOUNT}/owners", timeout=180)
    finally:
        import shutil
        shutil.rmtree(base, ignore_errors=True)
    diffs = differences(ours, native)
    assert not diffs, "fanstore differs from a native directory (fanstore, native): " + json.dumps(diffs, indent=1)
    # The script checks what it says (a run that only failed would compare equal).
    assert native["chown file"] == ["OK", [65534, 65533, "0o644"]]
    assert native["others may not read 0640"] == "EACCES"
    assert native["non-owner chmod is EPERM"] == "EPERM"


REOPENED = r"""
import json, os, sys
root = sys.argv[1]
os.makedirs(root)
J = lambda *p: os.path.join(root, *p)
for n in ("ro", "same", "w", "gone", "moved"):
    with open(J(n), "w") as f:
        f.write("0123456789")
ident = lambda n: [os.stat(J(n)).st_ino, os.stat(J(n)).st_mtime_ns]
before = {n: ident(n) for n in ("ro", "w")}
res = {}
# Opened read-write and only read (mdtest's read phase): no new version.
fd = os.open(J("ro"), os.O_RDWR)
res["read"] = os.read(fd, 100).decode()
os.close(fd)
res["ro unchanged"] = ident("ro") == before["ro"]
# One byte changed at once after the open: a new version with it.
fd = os.open(J("w"), os.O_RDWR)
os.pwrite(fd, b"X", 3)
os.close(fd)
res["w"] = open(J("w")).read()
# unlink, then rename, of an output open O_RDWR (issue 55, bug 5): the name goes now.
fd = os.open(J("gone"), os.O_RDWR)
os.write(fd, b"new")
os.unlink(J("gone"))
res["gone while open"] = os.path.exists(J("gone"))
os.close(fd)
res["gone after close"] = os.path.exists(J("gone"))
fd = os.open(J("moved"), os.O_RDWR)
os.write(fd, b"new")
os.rename(J("moved"), J("moved2"))
res["old name while open"] = os.path.exists(J("moved"))
os.close(fd)
res["after close"] = [os.path.exists(J("moved")), open(J("moved2")).read()]
print(json.dumps(res))
"""


def test_outputs_opened_for_writing_change_only_when_written(cl, tmp_path):
    """An output opened O_RDWR and only read is not committed again (same
    inode number and mtime: mdtest's read phase opens files O_RDWR); one
    byte written is; unlink and rename of an output open O_RDWR take the
    name away at once, and its close does not bring it back (bug 5)."""
    native = run_json(None, 0, REOPENED, str(tmp_path / "reopened"))
    ours = run_json(cl, 0, REOPENED, f"{MOUNT}/reopened")
    assert native == ours
    assert ours["ro unchanged"] is True and ours["w"] == "012X456789"
    assert ours["gone after close"] is False and ours["after close"] == [False, "new3456789"]


COPY_ON_WRITE = script(r"""
import ctypes, fcntl, mmap, stat
root = sys.argv[1]
os.makedirs(root)
J = lambda *p: os.path.join(root, *p)
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.fdopen.restype = ctypes.c_void_p
libc.fwrite.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
def check(r):
    if r == -1 or r is None:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r
def fresh(n):
    with open(J(n), "w") as f:
        f.write("0123456789")
    return os.open(J(n), os.O_RDWR)
def after(n, fd, *rest):
    os.close(fd)
    return [open(J(n)).read(), *rest]
def mode(n):
    return oct(stat.S_IMODE(os.stat(J(n)).st_mode))
# Each case: a committed file opened O_RDWR, read a little (its offset
# moves), then changed in one way; its bytes after the close.
def case(n, change):
    fd = fresh(n)
    os.read(fd, 2)
    r = change(fd)
    return after(n, fd, r)
attempt("F_GETFL says O_RDWR", lambda: case("getfl", lambda fd: fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDWR))
attempt("write at the offset", lambda: case("write", lambda fd: os.write(fd, b"AB")))
attempt("pwrite", lambda: case("pwrite", lambda fd: os.pwrite(fd, b"P", 9)))
attempt("writev", lambda: case("writev", lambda fd: os.writev(fd, [b"V", b"W"])))
attempt("pwritev", lambda: case("pwritev", lambda fd: os.pwritev(fd, [b"Q"], 0)))
attempt("ftruncate", lambda: case("ftruncate", lambda fd: os.ftruncate(fd, 4)))
attempt("posix_fallocate", lambda: case("fallocate", lambda fd: (os.posix_fallocate(fd, 0, 12), os.fstat(fd).st_size)[1]))
attempt("fchmod", lambda: case("fchmod", lambda fd: (os.fchmod(fd, 0o600), mode("fchmod"))[1]) + [mode("fchmod")])
attempt("syscall(SYS_write)", lambda: case("raw", lambda fd: check(libc.syscall(1, fd, b"RAW", 3))))
def via_dup(fd):
    d = os.dup(fd)
    os.write(d, b"D")
    r = os.read(fd, 3)  # the same description: after the dup's write
    os.close(d)
    return r.decode()
attempt("dup shares the offset", lambda: case("dup", via_dup))
def via_dup2(fd):
    d = os.dup2(fd, 100)
    os.write(fd, b"E")
    r = os.pread(d, 4, 0)
    os.close(d)
    return r.decode()
attempt("dup2 sees the original's write", lambda: case("dup2", via_dup2))
def via_mmap(fd):
    p = check(libc.mmap(None, 10, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0))
    ctypes.memmove(p + 5, b"MM", 2)
    libc.munmap(p, 10)
    return os.pread(fd, 10, 0).decode()
attempt("mmap MAP_SHARED", lambda: case("mmap", via_mmap))
def via_private_map(fd):
    p = check(libc.mmap(None, 10, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE, fd, 0))
    ctypes.memmove(p, b"XX", 2)
    libc.munmap(p, 10)
    return os.pread(fd, 10, 0).decode()
attempt("mmap MAP_PRIVATE changes nothing", lambda: case("private", via_private_map))
def via_python_mmap(fd):
    with mmap.mmap(fd, 10) as m:
        m[0:1] = b"Y"
    return True
attempt("python mmap", lambda: case("pymmap", via_python_mmap))
def via_fdopen(fd):
    f = check(libc.fdopen(os.dup(fd), b"r+"))
    libc.fwrite(b"FD", 1, 2, f)
    return libc.fclose(f)
attempt("fdopen r+ and fwrite", lambda: case("fdopen", via_fdopen))
def via_fdopen_direct(fd):
    f = check(libc.fdopen(fd, b"r+"))
    libc.fwrite(b"GG", 1, 2, f)
    libc.fclose(f)
    return open(J("fdopen2")).read()
attempt("fdopen of the fd itself", lambda: (lambda fd: [via_fdopen_direct(fd)])(fresh("fdopen2")))
def via_fopen():
    with open(J("fopen"), "w") as f:
        f.write("0123456789")
    f = check(libc.fopen(J("fopen").encode(), b"r+"))
    libc.fwrite(b"FO", 1, 2, f)
    libc.fclose(f)
    return open(J("fopen")).read()
libc.fopen.restype = ctypes.c_void_p
attempt("fopen r+", via_fopen)
def via_fork(fd):
    pid = os.fork()
    if pid == 0:
        os.write(fd, b"CHILD")
        os._exit(0)
    os.waitpid(pid, 0)
    return os.lseek(fd, 0, os.SEEK_CUR)
attempt("fork: the child writes the shared description", lambda: case("fork", via_fork))
def sendfile(fd):
    with open(J("src"), "wb") as f:
        f.write(b"SF")
    s = os.open(J("src"), os.O_RDONLY)
    r = os.sendfile(fd, s, 0, 2)
    os.close(s)
    return r
attempt("sendfile into it", lambda: case("sendfile", sendfile))
def copy_range(fd):
    s = os.open(J("src"), os.O_RDONLY)
    r = os.copy_file_range(s, fd, 2)
    os.close(s)
    return r
attempt("copy_file_range into it", lambda: case("copyrange", copy_range))
def others_see_old(fd):
    os.write(fd, b"NEW")
    return open(J("others")).read()  # another open, read-only: the committed bytes until the close
attempt("a write is not seen by a new open before the close", lambda: case("others", others_see_old))
EXEC_INNER = ("import os, sys; fd = os.open(sys.argv[1], os.O_RDWR); os.read(fd, 2); os.set_inheritable(fd, True); "
              "os.execv(sys.executable, [sys.executable, '-c', 'import os, sys; os.write(int(sys.argv[1]), bytes([69, 88]))', str(fd)])")
def via_exec():
    with open(J("exec"), "w") as f:
        f.write("0123456789")
    import subprocess
    subprocess.run([sys.executable, "-c", EXEC_INNER, J("exec")], check=True)
    return open(J("exec")).read()
attempt("exec: the new image writes the inherited fd", via_exec)
def only_read(fd):
    ino = os.stat(J("only")).st_ino, os.stat(J("only")).st_mtime_ns
    os.read(fd, 100)
    os.lseek(fd, 0, os.SEEK_SET)
    os.fstat(fd)
    return ino
def unchanged():
    fd = fresh("only")
    before = only_read(fd)
    os.close(fd)
    return before == (os.stat(J("only")).st_ino, os.stat(J("only")).st_mtime_ns)
attempt("only read: the same file after the close", unchanged)
print(json.dumps(out, sort_keys=True))
""")


def test_an_output_opened_read_write_is_copied_at_its_first_write(cl, tmp_path):
    """An output opened O_RDWR is served by its committed file's read-only
    fd until something would change it (ops/lazy_copy.rs): every way of
    changing a file through an fd (write, pwrite, writev, pwritev,
    ftruncate, posix_fallocate, fchmod, a raw syscall, a shared mmap, a
    dup, fdopen, fopen "r+", a fork child, sendfile and copy_file_range into
    it, an exec'd image writing it) behaves as natively, with the offset
    it had; F_GETFL says O_RDWR;
    a file only read is not committed again."""
    native, ours = same_as_native(cl, COPY_ON_WRITE, tmp_path, "cow")
    # The script checks what it says (a run that only failed would compare equal).
    assert native["write at the offset"] == ["OK", ["01AB456789", 2]]
    assert native["dup shares the offset"] == ["OK", ["01D3456789", "345"]]
    assert native["mmap MAP_SHARED"] == ["OK", ["01234MM789", "01234MM789"]]
    assert native["fork: the child writes the shared description"] == ["OK", ["01CHILD789", 7]]
    assert native["exec: the new image writes the inherited fd"] == ["OK", "01EX456789"]
    assert ours["only read: the same file after the close"] == ["OK", True]
    assert all(v[0] == "OK" for v in native.values()), native


WHICH_FILE = r"""
import json, os, sys
p = os.path.join(sys.argv[1], "f")
os.makedirs(sys.argv[1])
with open(p, "w") as f:
    f.write("0123456789")
fd = os.open(p, os.O_RDWR)
link = lambda: os.readlink(f"/proc/self/fd/{fd}")
res = {"open": link(), "read": (os.read(fd, 4).decode(), link())}
os.write(fd, b"x")
res["written"] = link()
os.close(fd)
res["bytes"] = open(p).read()
print(json.dumps(res))
"""


def test_an_output_opened_read_write_is_not_copied_until_written(cl):
    """The copy an O_RDWR open of an output needs is made at the first
    write, not before: the fd is the daemon's own file of the committed
    version (its out/<id>) while it is only read, a memfd once written."""
    r = run_json(cl, 0, WHICH_FILE, f"{MOUNT}/which")
    assert "/out/" in r["open"] and not r["open"].startswith("/memfd:"), r
    assert r["read"] == ["0123", r["open"]], r
    assert r["written"].startswith("/memfd:fanstore-output"), r
    assert r["bytes"] == "0123x56789"


HARDLINKS = script(r"""
import stat
root = sys.argv[1]
os.makedirs(root)
J = lambda *p: os.path.join(root, *p)
def st(n):
    s = os.lstat(J(n))
    return [s.st_nlink, oct(stat.S_IMODE(s.st_mode)), s.st_size]
def same(a, b):
    return os.lstat(J(a)).st_ino == os.lstat(J(b)).st_ino
def write(n, text, flags=os.O_WRONLY | os.O_TRUNC):
    fd = os.open(J(n), flags)
    os.write(fd, text.encode())
    os.close(fd)
read = lambda n: open(J(n)).read()
os.umask(0o022)
write("f", "one", os.O_WRONLY | os.O_CREAT)
attempt("link", lambda: (os.link(J("f"), J("g")), st("f"), st("g"), same("f", "g"))[1:])
attempt("third name", lambda: (os.link(J("g"), J("h")), st("f"))[1])
attempt("write through one name", lambda: (write("g", "two!"), read("f"), read("h"), st("h"))[1:])
attempt("append through another", lambda: (write("h", "+", os.O_WRONLY | os.O_APPEND), read("f"))[1])
attempt("chmod one name", lambda: (os.chmod(J("h"), 0o600), st("f"))[1])
attempt("rename of a name", lambda: (os.rename(J("h"), J("k")), st("k"), same("k", "f"))[1:])
attempt("rename onto another name of it", lambda: (os.rename(J("k"), J("g")), sorted(os.listdir(root)))[1])
attempt("unlink one name", lambda: (os.unlink(J("f")), st("g"), read("g"))[1:])
attempt("link over an existing name", lambda: os.link(J("g"), J("k")))
attempt("link of a directory", lambda: (os.mkdir(J("d")), os.link(J("d"), J("d2")))[1])
attempt("link of a missing file", lambda: os.link(J("nope"), J("n2")))
attempt("link into a missing directory", lambda: os.link(J("g"), J("nodir", "x")))
attempt("last names go", lambda: (os.unlink(J("g")), os.unlink(J("k")), sorted(os.listdir(root)))[2])
attempt("a fifo's links", lambda: (os.mkfifo(J("p")), os.link(J("p"), J("q")), st("q"), stat.S_ISFIFO(os.lstat(J("p")).st_mode))[2:])
# A file or directory keeps its inode number through a rename (issue 55, bug 6).
def keeps_ino(make, a, b):
    make(J(a))
    before = os.lstat(J(a)).st_ino
    os.rename(J(a), J(b))
    return os.lstat(J(b)).st_ino == before
attempt("rename keeps a file's inode", lambda: keeps_ino(lambda p: open(p, "w").write("abc"), "r1", "r2"))
attempt("rename keeps a directory's inode", lambda: keeps_ino(os.mkdir, "d1", "d2"))
attempt("a symlink's and its target's inode", lambda: os.stat(J("r2")).st_ino == (os.symlink("r2", J("s")), os.stat(J("s")).st_ino)[1])
print(json.dumps(out))
""")


def test_hard_links_share_one_file(cl, tmp_path):
    """link(2) of outputs: every name shows the same inode, link count,
    mode and bytes; a write, append or chmod through one name is seen
    through the others; rename moves a name (onto another name of the same
    file: nothing happens); unlink takes one name and the bytes stay until
    the last; errors as natively (EEXIST, EPERM for a directory, ENOENT)."""
    native, ours = same_as_native(cl, HARDLINKS, tmp_path, "hardlinks")
    assert native["link"] == ["OK", [[2, "0o755", 3], [2, "0o755", 3], True]]
    assert native["rename keeps a file's inode"] == native["rename keeps a directory's inode"] == ["OK", True]
    # Another node sees the names of one file too.
    check = f"import os; os.link('{MOUNT}/hardlinks/q', '{MOUNT}/hardlinks/r'); s = os.stat('{MOUNT}/hardlinks/p'); print(s.st_nlink)"
    assert cl.run_python(1, check).stdout.strip() == "3"


def test_another_users_new_output_is_a_file_on_the_local_disk(cl):
    """A process of another uid served by a root daemon writes a new output
    into an unnamed file on the node's local disk (O_TMPFILE in the clients'
    tmp directory), as the daemon's own user does, not into a memfd (the
    read-only directory that refused it O_TMPFILE sent every output of a
    user who is not root to memory)."""
    if os.geteuid() != 0:
        import pytest
        pytest.skip("needs root: the child switches to another uid")
    d = cl.local
    while d != d.parent and d.parent != d.anchor and str(d) not in ("/tmp", "/var/tmp"):
        os.chmod(d, os.stat(d).st_mode & 0o7777 | 0o011)
        d = d.parent
    code = f"""
import os
os.makedirs('{MOUNT}/others', exist_ok=True)
os.chmod('{MOUNT}/others', 0o777)
pid = os.fork()
if pid == 0:
    os.setgid(65534); os.setuid(65534)
    fd = os.open('{MOUNT}/others/f', os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b'x' * 100)
    print(os.readlink('/proc/self/fd/%d' % fd), flush=True)
    os.close(fd)
    os._exit(0)
os.waitpid(pid, 0)
print(os.stat('{MOUNT}/others/f').st_uid)
"""
    out = cl.run_python(0, code).stdout.splitlines()
    assert "/.client/tmp/" in out[0] and "memfd" not in out[0], out
    assert out[1] == "65534"
