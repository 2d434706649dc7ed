"""`tar -x` into /fanstore: directories, files, modes, modification times and
symlinks come out as `tar -x` into a native directory makes them, seen from
every node; then `tar -c` of the extracted tree reads them back."""
import hashlib
import json
import os
import subprocess

from fs_cluster import cluster_fixture, run_json

MOUNT = "/fanstore"

# Every entry under argv[1] by lstat: kind, mode, size, mtime, link target, md5.
LISTING = r"""
import hashlib, json, os, stat, sys
root = sys.argv[1]
out = {}
for d, dirs, files in os.walk(root):
    for name in dirs + files:
        p = os.path.join(d, name)
        s = os.lstat(p)
        e = [stat.S_IFMT(s.st_mode), oct(stat.S_IMODE(s.st_mode)), s.st_mtime_ns]
        if stat.S_ISLNK(s.st_mode):
            e.append(os.readlink(p))
        elif stat.S_ISREG(s.st_mode):
            e += [s.st_size, hashlib.md5(open(p, "rb").read()).hexdigest()]
        out[os.path.relpath(p, root)] = e
print(json.dumps(out, sort_keys=True))
"""


cl = cluster_fixture("tar", seed=6, n_files=6, mount=MOUNT)


def make_tarball(tmp_path):
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    (src / "c").mkdir()
    (src / "a" / "f.txt").write_text("hello\n")
    (src / "a" / "b" / "big.bin").write_bytes(os.urandom(300_000))
    (src / "a" / "empty").write_bytes(b"")
    os.symlink("../a/f.txt", src / "c" / "link")
    os.symlink("b", src / "a" / "blink")
    os.symlink("/nowhere", src / "dangling")
    os.chmod(src / "a" / "f.txt", 0o640)
    os.chmod(src / "a" / "b" / "big.bin", 0o755)
    for p, t in [("a/f.txt", 1_577_934_245), ("a/b/big.bin", 1_577_934_246), ("a/empty", 1_500_000_000)]:
        os.utime(src / p, (t, t))
    os.utime(src / "c" / "link", (1_557_032_705, 1_557_032_705), follow_symlinks=False)
    os.chmod(src / "c", 0o700)
    for p in ("a/b", "c", "a"):
        os.utime(src / p, (1_514_764_800, 1_514_764_800))
    tarball = tmp_path / "x.tar"
    subprocess.run(["tar", "-cf", str(tarball), "-C", str(src), "a", "c", "dangling"], check=True)
    return tarball


def listing(c, node, root):
    """LISTING's JSON of `root` on `node` of `c` (natively when `c` is None)."""
    return run_json(c, node, LISTING, root)


def test_tar_extracts_into_fanstore_as_into_a_native_directory(cl, tmp_path):
    tarball = make_tarball(tmp_path)
    native = tmp_path / "native"
    native.mkdir()
    subprocess.run(["tar", "-xf", str(tarball), "-C", str(native)], check=True)
    want = listing(None, 0, str(native))
    assert want["c/link"][3] == "../a/f.txt" and want["a/b/big.bin"][1] == "0o755"
    subprocess.run(["mkdir", "-p", f"{MOUNT}/untar"], env=cl.env(0), check=True)
    r = subprocess.run(["tar", "-xf", str(tarball), "-C", f"{MOUNT}/untar"], env=cl.env(0), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr + cl.log()[-2000:]
    for node in (0, 3):
        got = listing(cl, node, f"{MOUNT}/untar")
        diffs = {k: (got.get(k), want.get(k)) for k in set(want) | set(got) if got.get(k) != want.get(k)}
        assert not diffs, f"node {node} (fanstore, native): {json.dumps(diffs)}"
    # tar -c of the extracted tree (another node) archives the same members.
    r = subprocess.run(["tar", "-cf", "-", "-C", f"{MOUNT}/untar", "a", "c", "dangling"], env=cl.env(2),
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    back = tmp_path / "back"
    back.mkdir()
    subprocess.run(["tar", "-xf", "-", "-C", str(back)], input=r.stdout, check=True)
    assert listing(None, 0, str(back)) == want
    assert hashlib.md5((back / "a" / "b" / "big.bin").read_bytes()).hexdigest() == want["a/b/big.bin"][4]
