"""Everyday file idioms of training code on outputs, each compared with a
native directory: tempfile (TemporaryFile's O_TMPFILE, NamedTemporaryFile +
os.replace, mkdtemp), pathlib touch/rename/unlink/rglob, shutil.copyfile
(copy_file_range/sendfile), posix_fallocate + fdatasync, mmap writes,
makedirs(exist_ok), rmtree, glob, scandir, disk_usage, samefile, realpath."""
import json

from fs_diff import differences, run_script, script
from fs_cluster import cluster_fixture
MOUNT = "/fanstore"
SCRIPT = script(r'''
import errno, glob, json, os, pathlib, shutil, sys, tempfile
root = sys.argv[1]
os.makedirs(root, exist_ok=True)
J = lambda *p: os.path.join(root, *p)
def tmpfile():
    with tempfile.TemporaryFile(dir=root) as f:
        f.write(b"abc"); f.seek(0); return f.read().decode()
attempt("TemporaryFile", tmpfile)
attempt("listing after TemporaryFile", lambda: sorted(os.listdir(root)))
def named():
    f = tempfile.NamedTemporaryFile(dir=root, delete=False, suffix=".tmp")
    f.write(b"named"); f.flush(); os.fsync(f.fileno()); f.close()
    os.replace(f.name, J("named.bin"))
    return open(J("named.bin")).read()
attempt("NamedTemporaryFile + replace", named)
attempt("mkdtemp", lambda: os.path.isdir(tempfile.mkdtemp(dir=root)))
attempt("touch", lambda: (pathlib.Path(J("t")).touch(), pathlib.Path(J("t")).touch(exist_ok=True), os.path.getsize(J("t")))[2])
attempt("touch exist_ok False", lambda: pathlib.Path(J("t")).touch(exist_ok=False))
attempt("copyfile", lambda: (shutil.copyfile(J("named.bin"), J("copy.bin")), open(J("copy.bin")).read())[1])
def fallocate():
    fd = os.open(J("fa.bin"), os.O_CREAT | os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, 4096); os.fdatasync(fd); return os.fstat(fd).st_size
    finally:
        os.close(fd)
attempt("posix_fallocate fdatasync", fallocate)
attempt("size after close", lambda: os.path.getsize(J("fa.bin")))
def sendfile():
    a = os.open(J("named.bin"), os.O_RDONLY); b = os.open(J("sent.bin"), os.O_CREAT | os.O_WRONLY)
    n = os.sendfile(b, a, 0, 100); os.close(a); os.close(b); return [n, open(J("sent.bin")).read()]
attempt("sendfile", sendfile)
attempt("glob", lambda: sorted(os.path.basename(p) for p in glob.glob(J("*.bin"))))
attempt("rglob", lambda: len(list(pathlib.Path(root).rglob("*"))))
attempt("scandir stat", lambda: sorted((e.name, e.is_file(), e.stat().st_size) for e in os.scandir(root) if e.name.endswith(".bin")))
attempt("Path.rename", lambda: (pathlib.Path(J("t")).rename(J("t2")), os.path.exists(J("t2")))[1])
attempt("Path.unlink missing_ok", lambda: pathlib.Path(J("nope")).unlink(missing_ok=True))
attempt("makedirs exist_ok", lambda: (os.makedirs(J("a", "b")), os.makedirs(J("a", "b"), exist_ok=True))[1])
attempt("makedirs over file", lambda: os.makedirs(J("t2", "x")))
attempt("rmtree", lambda: (shutil.rmtree(J("a")), os.path.exists(J("a")))[1])
def mm():
    import mmap
    fd = os.open(J("mm.bin"), os.O_CREAT | os.O_RDWR); os.ftruncate(fd, 8192)
    m = mmap.mmap(fd, 8192); m[:5] = b"hello"; m.flush(); m.close(); os.close(fd)
    return open(J("mm.bin"), "rb").read(5).decode()
attempt("mmap write", mm)
attempt("disk_usage", lambda: shutil.disk_usage(root).total > 0)
attempt("samefile", lambda: os.path.samefile(J("named.bin"), J(".", "named.bin")))
attempt("realpath", lambda: os.path.relpath(os.path.realpath(J("a2", "..", "named.bin")), root))
print(json.dumps(out, sort_keys=True))
''')


cl = cluster_fixture("idioms", seed=11, n_files=6, mount=MOUNT)


def test_everyday_idioms_match_a_native_directory(cl, tmp_path):
    native = run_script(None, 0, SCRIPT, str(tmp_path / "n"))
    ours = run_script(cl, 1, SCRIPT, f"{MOUNT}/idioms")
    assert native["NamedTemporaryFile + replace"] == ["OK", "named"] and native["touch exist_ok False"] == "EEXIST"
    diffs = differences(ours, native)
    assert not diffs, json.dumps(diffs, indent=1)
