"""Client matrix, Python 3: the standard library reads /fanstore exactly as the source tree.

Each script runs as a subprocess with argv[1] = root. Results are compared with
values computed here from the source tree, or with the same script run natively
on the source directory (paths normalised to <ROOT>).
"""
import errno
import json
import os

import pytest

from conftest import run
from fs_clients import short_tmp, start_fs  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def fs(bins, tmp_path_factory):
    yield from start_fs(bins, tmp_path_factory, "python", codec="lz4")


READ = r'''
import hashlib, io, json, mmap, os, sys
root, listfile = sys.argv[1], sys.argv[2]
out = {}
for rel in open(listfile, encoding='utf-8', errors='surrogateescape').read().splitlines():
    p = os.path.join(root, rel)
    r = {}
    with open(p, "rb") as f:
        r["read"] = hashlib.md5(f.read()).hexdigest()
        r["tell"] = f.tell()
        f.seek(0)
        h = hashlib.md5()
        while True:
            b = f.read(1000)          # buffered chunks
            if not b:
                break
            h.update(b)
        r["chunks"] = h.hexdigest()
        f.seek(-min(5, r["tell"]), io.SEEK_END)
        r["tail"] = f.read().hex()
    with open(p, "rb", buffering=0) as f:   # raw FileIO + readinto
        buf = bytearray(4096); h = hashlib.md5()
        while (n := f.readinto(buf)):
            h.update(buf[:n])
        r["readinto"] = h.hexdigest()
        r["fstat"] = os.fstat(f.fileno()).st_size
        if r["fstat"]:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                r["mmap"] = hashlib.md5(m[:]).hexdigest()
        else:
            r["mmap"] = hashlib.md5(b"").hexdigest()
    fd = os.open(p, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        r["pread"] = os.pread(fd, 64, size // 2).hex()
        os.lseek(fd, 0, os.SEEK_SET)
        h = hashlib.md5()
        while (b := os.read(fd, 65536)):
            h.update(b)
        r["os.read"] = h.hexdigest()
    finally:
        os.close(fd)
    if rel.endswith((".txt", ".nums")):
        with open(p, encoding="utf-8", errors="surrogateescape") as f:
            lines = f.readlines()
        r["lines"] = [len(lines), sum(map(len, lines))]
    out[rel] = r
print(json.dumps(out))
'''


@pytest.mark.parametrize("node", [0, 3])
def test_open_read(fs, node):
    res = fs.py_json(READ, fs.file_list(), node=node)
    assert sorted(res) == fs.src.files
    for rel, r in res.items():
        data = fs.src.bytes(rel)
        md5 = fs.src.md5(rel)
        want = {"read": md5, "tell": len(data), "chunks": md5, "tail": data[-5:].hex(), "readinto": md5,
                "fstat": len(data), "mmap": md5, "pread": data[len(data) // 2:len(data) // 2 + 64].hex(), "os.read": md5}
        if rel.endswith((".txt", ".nums")):
            text = data.decode("utf-8", "surrogateescape")
            lines = text.splitlines(keepends=True)
            want["lines"] = [len(lines), sum(map(len, lines))]
        assert r == want, f"{rel} read on node {node}"


TREE = r'''
import json, os, stat, sys
root = sys.argv[1]
def rel(p):
    r = os.path.relpath(p, root)
    return r
out = {"listdir": {}, "scandir": {}, "walk": [], "walk_up": [], "fwalk": []}
for dirpath, dirnames, filenames in os.walk(root):
    out["walk"].append([rel(dirpath), sorted(dirnames), sorted(filenames),
                        sorted([f, os.stat(os.path.join(dirpath, f)).st_size] for f in filenames)])
    out["listdir"][rel(dirpath)] = sorted(os.listdir(dirpath))
    with os.scandir(dirpath) as it:
        ents = []
        for e in it:
            s = e.stat(follow_symlinks=False)
            ents.append([e.name, e.path == os.path.join(dirpath, e.name), e.is_dir(), e.is_file(), e.is_symlink(),
                         s.st_size if e.is_file() else None, oct(s.st_mode), s.st_mtime_ns if e.is_file() else None])
        out["scandir"][rel(dirpath)] = sorted(ents)
for dirpath, dirnames, filenames in os.walk(root, topdown=False):
    out["walk_up"].append([rel(dirpath), sorted(dirnames), sorted(filenames)])
for dirpath, dirnames, filenames, dfd in os.fwalk(root):
    out["fwalk"].append([rel(dirpath), sorted(dirnames), sorted([f, os.stat(f, dir_fd=dfd).st_size] for f in filenames)])
out["walk"].sort(); out["walk_up"].sort(); out["fwalk"].sort()
print(json.dumps(out, sort_keys=True))
'''


def test_listdir_scandir_walk(fs):
    nat, vir = fs.py_both(TREE, node=1)
    n, v = json.loads(nat), json.loads(vir)
    for key in ("listdir", "scandir", "walk", "walk_up", "fwalk"):
        assert v[key] == n[key], f"{key} differs from the source tree"
    # and against the source tree computed here: names and st_size (os.walk lists file symlinks as files)
    want = sorted(fs.src.files + fs.src.link_files)
    files = sorted(os.path.normpath(os.path.join(d, f)) for d, _, fl, _ in v["walk"] for f in fl)
    assert files == want
    sizes = {os.path.normpath(os.path.join(d, f)): s for d, _, _, fs_ in v["walk"] for f, s in fs_}
    assert sizes == {f: os.stat(fs.src.path(f)).st_size for f in want}
    assert len(v["walk"]) == len(fs.src.dirs) + 1


PATHLIB = r'''
import hashlib, json, sys
from pathlib import Path
root = Path(sys.argv[1])
out = {}
out["rglob"] = sorted([str(p.relative_to(root)), p.is_dir(), p.is_file(), p.stat().st_size if p.is_file() else None]
                      for p in root.rglob("*"))
out["glob_npy"] = sorted(str(p.relative_to(root)) for p in root.glob("own/*/*.npy"))
out["rglob_png"] = sorted(str(p.relative_to(root)) for p in root.rglob("*.png"))
out["iterdir"] = sorted(p.name for p in (root / "own" / "edge").iterdir())
out["read_bytes"] = {str(p.relative_to(root)): hashlib.md5(p.read_bytes()).hexdigest() for p in (root / "own" / "text").iterdir()}
out["read_text"] = len((root / "own/text/lines_00.txt").read_text())
out["exists"] = [(root / x).exists() for x in ("own", "own/edge/one", "nope", "own/edge/one/x")]
out["resolve"] = str((root / "own/./edge/../edge//deep").resolve())
out["owner_ok"] = (root / "own/edge/one").stat().st_uid >= 0
print(json.dumps(out, sort_keys=True))
'''


def test_pathlib(fs):
    nat, vir = fs.py_both(PATHLIB, node=2)
    n, v = json.loads(nat), json.loads(vir)
    assert v == n
    assert [r[0] for r in v["rglob"] if r[2]] == sorted(fs.src.files + fs.src.link_files)
    assert v["resolve"] == "<ROOT>/own/edge/deep"


EXISTS = r'''
import json, os, sys
root = sys.argv[1]
out = {}
for rel in ["", "own", "own/edge", "own/edge/one", "own/edge/empty", "own/edge/emptydir", "own/big/random_2m.bin",
            "missing", "own/missing", "own/edge/one/x", "own/edge/./one", "own/edge/../edge/one", "own//edge///one",
            "own/edge/deep/a/b/../../a/b/c", "own/edge/with space.txt", "own/edge/.hidden", "own/edge/exec.sh", "own/edge/readonly.txt",
            "own/edge/private.bin", "a/link_to_file", "link_to_dir", "link_to_dir/c"]:
    p = os.path.join(root, rel) if rel else root
    r = [os.path.exists(p), os.path.isdir(p), os.path.isfile(p), os.path.islink(p), os.path.lexists(p),
         os.access(p, os.R_OK), os.access(p, os.W_OK), os.access(p, os.X_OK)]
    try:
        r.append(os.path.getsize(p) if os.path.isfile(p) else "dir-or-missing")
        r.append(int(os.path.getmtime(p)))
    except OSError as e:
        r.append(e.errno)
    out[rel] = r
print(json.dumps(out, sort_keys=True))
'''


def test_exists_isdir_getsize(fs):
    nat, vir = fs.py_both(EXISTS, node=0)
    n, v = json.loads(nat), json.loads(vir)
    for rel in n:
        got, want = v[rel], n[rel]
        # W_OK: an input is read-only on /fanstore (EROFS); natively root may write anything
        assert got[6] is False, f"access(W_OK) on {rel!r} must be False on a read-only dataset"
        assert got[:6] + got[7:] == want[:6] + want[7:], f"{rel!r}: {got} != {want}"
    assert v["own/big/random_2m.bin"][8] == fs.src.size("own/big/random_2m.bin")


SHUTIL = r'''
import os, shutil, sys
root, dest = sys.argv[1], sys.argv[2]
os.makedirs(dest, exist_ok=True)
for rel in ["own/big/random_2m.bin", "own/big/text_3m.txt", "own/pics/large.png", "own/edge/empty", "own/arrays/pair_c.npz"]:
    shutil.copyfile(os.path.join(root, rel), os.path.join(dest, rel.replace("/", "__")))   # sendfile on Linux
shutil.copy2(os.path.join(root, "own/edge/exec.sh"), os.path.join(dest, "exec.sh"))
shutil.copytree(os.path.join(root, "own"), os.path.join(dest, "tree"))
with open(os.path.join(root, "own/text/lines_05.txt"), "rb") as src, open(os.path.join(dest, "fileobj"), "wb") as dst:
    shutil.copyfileobj(src, dst, 333)
print("ok")
'''


def test_shutil_copy(fs, short_tmp):
    dest = short_tmp / "d"
    fs.py(SHUTIL, str(dest), node=3)
    for rel in ["own/big/random_2m.bin", "own/big/text_3m.txt", "own/pics/large.png", "own/edge/empty", "own/arrays/pair_c.npz"]:
        assert (dest / rel.replace("/", "__")).read_bytes() == fs.src.bytes(rel), f"shutil.copyfile {rel}"
    a, b = os.stat(dest / "exec.sh"), os.stat(fs.src.path("own/edge/exec.sh"))
    assert (dest / "exec.sh").read_bytes() == fs.src.bytes("own/edge/exec.sh")
    assert (a.st_mode, a.st_mtime_ns) == (b.st_mode, b.st_mtime_ns), "shutil.copy2 keeps mode and mtime"
    r = run(["diff", "-r", str(dest / "tree"), str(fs.src.path("own"))], check=False, errors="surrogateescape")
    assert r.returncode == 0, f"shutil.copytree:\n{r.stdout[:3000]}"
    assert (dest / "fileobj").read_bytes() == fs.src.bytes("own/text/lines_05.txt")


GLOB = r'''
import glob, json, os, sys
root = sys.argv[1]
out = {}
out["recursive"] = sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(glob.escape(root), "**"), recursive=True))
out["recursive_files"] = sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(glob.escape(root), "**", "*.*"), recursive=True))
out["root_dir"] = sorted(glob.glob("**/*.png", root_dir=root, recursive=True))
out["iglob"] = sorted(os.path.relpath(p, root) for p in glob.iglob(os.path.join(root, "own", "many", "d[2-4]", "f0?.dat")))
out["hidden"] = sorted(glob.glob(".*", root_dir=os.path.join(root, "own", "edge")))
out["dirs_only"] = sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "*", "*", "")))
out["none"] = glob.glob(os.path.join(root, "nope", "*"))
print(json.dumps(out, sort_keys=True))
'''


def test_glob(fs):
    nat, vir = fs.py_both(GLOB, node=1)
    n, v = json.loads(nat), json.loads(vir)
    assert v == n
    visible = {f for f in fs.src.files if not any(part.startswith(".") for part in f.split("/"))}
    assert visible <= set(v["recursive"]) and visible < set(fs.src.files)
    assert v["iglob"] and v["hidden"] == [".hidden"]


CHDIR = r'''
import hashlib, json, os, sys
root = sys.argv[1]
out = {}
os.chdir(os.path.join(root, "own"))
out["cwd1"] = os.getcwd()
out["one"] = open("edge/one", "rb").read().decode()
out["listdir_dot"] = sorted(os.listdir("."))
out["listdir_default"] = sorted(os.listdir())
out["stat_rel"] = os.stat("../own/edge/page_4096.bin").st_size
out["abspath"] = os.path.abspath("edge/x")
os.chdir("edge")
out["cwd2"] = os.getcwd()
out["with_space"] = open("with space.txt").read()
out["big"] = hashlib.md5(open("../big/text_3m.txt", "rb").read()).hexdigest()
out["exists"] = [os.path.exists("deep/a/b"), os.path.isfile("one"), os.path.exists("nope")]
os.chdir("..")
out["cwd3"] = os.getcwd()
os.chdir("./edge/deep/a/../a/b")
out["cwd4"] = os.getcwd()
out["walk"] = sorted([d, sorted(ds), sorted(fs)] for d, ds, fs in os.walk("."))
fd = os.open(os.path.join(root, "own", "text"), os.O_RDONLY | os.O_DIRECTORY)
os.fchdir(fd)
os.close(fd)
out["cwd5"] = os.getcwd()
out["n_0"] = hashlib.md5(open("n_0.nums", "rb").read()).hexdigest()
os.chdir(root)
out["cwd6"] = os.getcwd()
out["rel_root"] = sorted(os.listdir("own"))
try:
    os.chdir("own/edge/one")
except OSError as e:
    out["chdir_file"] = e.errno
try:
    os.chdir("nope")
except OSError as e:
    out["chdir_missing"] = e.errno
out["cwd7"] = os.getcwd()
os.chdir("/tmp")
out["tmp"] = os.getcwd()
print(json.dumps(out, sort_keys=True))
'''


def test_chdir_relative_open(fs):
    nat, vir = fs.py_both(CHDIR, node=2)
    n, v = json.loads(nat), json.loads(vir)
    assert v == n
    assert v["cwd2"] == "<ROOT>/own/edge" and v["chdir_file"] == errno.ENOTDIR and v["chdir_missing"] == errno.ENOENT
    assert v["big"] == fs.src.md5("own/big/text_3m.txt")


DIRFD = r'''
import hashlib, json, os, stat, sys
root = sys.argv[1]
out = {}
fd = os.open(os.path.join(root, "own", "edge"), os.O_RDONLY | os.O_DIRECTORY)
s = os.fstat(fd)
out["fstat_dir"] = stat.S_ISDIR(s.st_mode)
out["stat_one"] = [os.stat("one", dir_fd=fd).st_size, oct(os.stat("exec.sh", dir_fd=fd).st_mode)]
out["stat_deep"] = stat.S_ISDIR(os.stat("deep/a", dir_fd=fd).st_mode)
out["lstat"] = os.stat("page_4097.bin", dir_fd=fd, follow_symlinks=False).st_size
f = os.open("page_4097.bin", os.O_RDONLY, dir_fd=fd)
data = b""
while (b := os.read(f, 1000)):
    data += b
os.close(f)
out["read"] = hashlib.md5(data).hexdigest()
f = os.open("deep/a/b/c/d/e/leaf.txt", os.O_RDONLY, dir_fd=fd)
out["leaf"] = os.read(f, 100).decode()
os.close(f)
out["access"] = [os.access("one", os.R_OK, dir_fd=fd), os.access("nope", os.R_OK, dir_fd=fd)]
out["listdir_fd"] = sorted(os.listdir(fd))
with os.scandir(fd) as it:
    out["scandir_fd"] = sorted([e.name, e.is_dir(), e.stat().st_size if e.is_file() else None] for e in it)
out["listdir_fd_again"] = sorted(os.listdir(fd))   # rewinds the same fd
for name in ["nope", "one/x"]:
    try:
        os.stat(name, dir_fd=fd)
    except OSError as e:
        out["stat_" + name] = e.errno
    try:
        os.open(name, os.O_RDONLY, dir_fd=fd)
    except OSError as e:
        out["open_" + name] = e.errno
sub = os.open("deep", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
out["sub"] = sorted(os.listdir(sub))
up = os.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=sub)
out["up"] = sorted(os.listdir(up))
for x in (sub, up, fd):
    os.close(x)
print(json.dumps(out, sort_keys=True))
'''


def test_dir_fd(fs):
    nat, vir = fs.py_both(DIRFD, node=3)
    n, v = json.loads(nat), json.loads(vir)
    assert v == n
    assert v["read"] == fs.src.md5("own/edge/page_4097.bin")
    assert v["stat_nope"] == errno.ENOENT and v["stat_one/x"] == errno.ENOTDIR


def test_realpath_and_normalisation(fs):
    code = r'''
import json, os, sys
root = sys.argv[1]
out = {}
for p in ["own/./edge/../edge//one", "own/edge/deep/a/b/c/../../../../one", "./own/edge/", "own/edge/deep/a/b/c/d/e/../../../../../..",
          "own/..", "own/../own/big"]:
    full = root + "/" + p
    out[p] = [os.path.realpath(full), os.path.exists(full), os.path.isdir(full)]
    try:
        out[p].append(os.stat(full).st_size if os.path.isfile(full) else "dir")
    except OSError as e:
        out[p].append(e.errno)
print(json.dumps(out, sort_keys=True))
'''
    nat, vir = fs.py_both(code, node=0)
    assert json.loads(vir) == json.loads(nat)


SYMLINKS = r"""
import errno, json, os, sys
root = sys.argv[1]
out = {}
def attempt(name, fn):
    try:
        r = fn()
        out[name] = ["OK", r if not isinstance(r, bytes) else "%d bytes" % len(r)]
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, str(e.errno))
J = lambda p: os.path.join(root, p)
for link in ["a/link_to_file", "link_to_dir", "d/e/up_link", "a/b/c/link_to_marker"]:
    attempt("readlink " + link, lambda: os.readlink(J(link)))
    attempt("lstat " + link, lambda: [oct(os.lstat(J(link)).st_mode)[:4], os.lstat(J(link)).st_size])
    attempt("stat " + link, lambda: [oct(os.stat(J(link)).st_mode), os.stat(J(link)).st_size if os.path.isfile(J(link)) else "dir"])
    attempt("realpath " + link, lambda: os.path.realpath(J(link)))
    attempt("islink " + link, lambda: [os.path.islink(J(link)), os.path.isfile(J(link)), os.path.isdir(J(link))])
    attempt("nofollow " + link, lambda: os.open(J(link), os.O_RDONLY | os.O_NOFOLLOW) and "opened")
attempt("read through link", lambda: len(open(J("a/link_to_file"), "rb").read()))
attempt("read through up_link", lambda: len(open(J("d/e/up_link"), "rb").read()))
attempt("listdir through dir link", lambda: sorted(os.listdir(J("link_to_dir"))))
attempt("read via dir link", lambda: len(open(J("link_to_dir/c/compressible.txt"), "rb").read()))
attempt("dotdot after dir link", lambda: sorted(os.listdir(J("link_to_dir/.."))))
attempt("walk followlinks", lambda: sorted([os.path.relpath(d, root), sorted(f)] for d, _, f in os.walk(root, followlinks=True)
                                          if "deep-" not in d))
attempt("readlink of a file", lambda: os.readlink(J("own/edge/one")))
"""
O_PATH_TAIL = r"""
attempt("o_path fstat", lambda: os.fstat(os.open(J("own/edge/page_4096.bin"), os.O_PATH)).st_size)
attempt("o_path nofollow lstat", lambda: oct(os.fstat(os.open(J("a/link_to_file"), os.O_PATH | os.O_NOFOLLOW)).st_mode)[:4])
attempt("o_path read", lambda: os.read(os.open(J("own/edge/page_4096.bin"), os.O_PATH), 10))
"""
PRINT = """
print(json.dumps(out, sort_keys=True))
"""


def test_symlinks(fs):
    nat, vir = fs.py_both(SYMLINKS + PRINT, node=1)
    n, v = json.loads(nat), json.loads(vir)
    assert n["readlink a/link_to_file"] == ["OK", "b/c/compressible.txt"] and n["nofollow a/link_to_file"] == "ELOOP"
    diffs = {k: (v.get(k), n[k]) for k in n if v.get(k) != n[k]}
    assert not diffs, "symlinks differ from the source directory (fanstore, native): " + json.dumps(diffs)


def test_o_path(fs):
    """O_PATH: fstat works, read fails with EBADF, O_NOFOLLOW gives the link itself (as natively)."""
    nat, vir = fs.py_both(SYMLINKS.split("for link in")[0] + O_PATH_TAIL + PRINT, node=2)
    n, v = json.loads(nat), json.loads(vir)
    assert n["o_path read"] == "EBADF"
    diffs = {k: (v.get(k), n[k]) for k in n if v.get(k) != n[k]}
    assert not diffs, "O_PATH differs from the source directory (fanstore, native): " + json.dumps(diffs)
