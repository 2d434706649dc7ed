"""Reuse of decoded files' pages (fanstore-preload/src/memfd_pool.rs).

A compressed file of a partition the node holds is decoded by the client
into a memfd. Once the program closed it, the next decode writes into the
same memfd's pages (fresh pages cost more than the decode here), but only
when nothing else can see them: not while a mapping, a dup or a forked
child still holds the file, and never after the fd went through sendfile
(a socket may still hold references to its pages).
"""
import hashlib
import json
import subprocess
import sys

from fs_cluster import cluster_factory  # noqa: F401 (fixture)
from fs_prep import pack

N = 12

SCRIPT = r'''
import hashlib, json, mmap, os, socket, sys
root = sys.argv[1]
names = sys.argv[2:]
md5 = lambda b: hashlib.md5(b).hexdigest()
def real_ino(fd):
    return os.stat(f"/proc/self/fd/{fd}").st_ino      # the memfd behind the fd, not the virtual inode
def read(name):
    fd = os.open(os.path.join(root, name), os.O_RDONLY)
    data = b""
    while (b := os.read(fd, 1 << 20)):
        data += b
    return fd, data
out = {"read": {}}
# 1. closed and unmapped: the next decode reuses the memfd
fd, data = read(names[0]); out["read"][names[0]] = md5(data); a = real_ino(fd); os.close(fd)
fd, data = read(names[1]); out["read"][names[1]] = md5(data); out["reused"] = real_ino(fd) == a; os.close(fd)
# 2. mapped after the close: not reused, the mapping keeps its bytes
fd, data = read(names[2]); out["read"][names[2]] = md5(data); c = real_ino(fd)
m = mmap.mmap(fd, 0, access=mmap.ACCESS_READ); os.close(fd)
fd, data = read(names[3]); out["read"][names[3]] = md5(data); out["mapped_reused"] = real_ino(fd) == c; os.close(fd)
out["mapping"] = md5(m[:]); m.close()
# 3. sent to a socket nobody read yet: its pages are never reused
s1, s2 = socket.socketpair()
s1.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
fd = os.open(os.path.join(root, names[4]), os.O_RDONLY)
size = os.fstat(fd).st_size
sent = 0
while sent < size:
    sent += os.sendfile(s1.fileno(), fd, sent, size - sent)
os.close(fd)
for n in names[5:9]:
    fd, data = read(n); out["read"][n] = md5(data); os.close(fd)
got = b""
while len(got) < size:
    got += s2.recv(1 << 20)
out["sent"] = md5(got)
# 4. a forked child still reading: not reused under it
fd, data = read(names[9]); out["read"][names[9]] = md5(data); g = real_ino(fd)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.read(r, 1)
    os._exit(0 if md5(os.pread(fd, 1 << 24, 0)) == out["read"][names[9]] else 1)
os.close(fd)
fd, data = read(names[10]); out["read"][names[10]] = md5(data); out["fork_reused"] = real_ino(fd) == g; os.close(fd)
os.write(w, b"x")
out["child_ok"] = os.waitpid(pid, 0)[1] == 0
print(json.dumps(out))
'''


def test_pages_of_closed_decoded_files_are_reused_only_when_nothing_else_sees_them(cluster_factory, bins, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    names = [f"c{i:02d}.txt" for i in range(N)]
    for i, n in enumerate(names):
        (src / n).write_bytes((f"file {i} " * (9000 + 500 * i)).encode())  # 60-140 KB, lz4 compresses it
    ds = tmp_path / "ds"
    pack(bins, src, ds, "--partitions", "2", "--compress", "lz4")
    # No copies of decoded files: every open decodes.
    c = cluster_factory(ds, nranks=1, extra_args=["--cache-mem", "0", "--cache-disk", "0", "--prefill-mem", "0"])
    r = subprocess.run([sys.executable, "-c", SCRIPT, c.mount, *names], env=c.env(node=0),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    want = {n: hashlib.md5((src / n).read_bytes()).hexdigest() for n in names}
    assert out["read"] == {n: want[n] for n in out["read"]}, "a decoded file has wrong bytes"
    assert out["reused"], "the memfd of a closed file was not reused"
    assert not out["mapped_reused"], "a memfd still mapped was reused"
    assert out["mapping"] == want[names[2]], "a mapping's bytes changed after its fd was closed"
    assert out["sent"] == want[names[4]], "bytes sent with sendfile changed before the peer read them"
    assert not out["fork_reused"], "a memfd a forked child still held was reused"
    assert out["child_ok"], "the child read other bytes than the file's"


SCRIPT_TAKEN_NUMBERS = r'''
import hashlib, json, os, sys
root, mine = sys.argv[1], sys.argv[2]
names = sys.argv[3:]
md5 = lambda b: hashlib.md5(b).hexdigest()
def read(name):
    fd = os.open(os.path.join(root, name), os.O_RDONLY)
    data = b""
    while (b := os.read(fd, 1 << 20)):
        data += b
    os.close(fd)
    return md5(data)
out = {"read": {}}
for n in names[:3]:
    out["read"][n] = read(n)
# The library's own fds: memfds it keeps for the next decodes.
def link(f):
    try:
        return os.readlink(f"/proc/self/fd/{f}")
    except FileNotFoundError:  # the fd listdir itself used
        return ""
pool = [int(f) for f in os.listdir("/proc/self/fd") if link(f).startswith("/memfd:fanstore")]
out["pool"] = len(pool)
# The program takes those numbers for files of its own (dup2 onto them,
# as a shell's `exec N>file` does), then reads on.
own = os.open(mine, os.O_RDWR)
for n in pool:
    os.dup2(own, n)
for n in names[3:]:
    out["read"][n] = read(n)
for n in pool:
    os.close(n)
os.close(own)
print(json.dumps(out))
'''


def test_numbers_the_program_takes_over_are_never_written(cluster_factory, bins, tmp_path):
    """A pooled memfd's fd number that the program closes or dup2s onto
    leaves the pool: the library never writes a decoded file into what the
    program put at that number."""
    src = tmp_path / "src"
    src.mkdir()
    names = [f"c{i:02d}.txt" for i in range(8)]
    for i, n in enumerate(names):
        (src / n).write_bytes((f"file {i} " * (9000 + 500 * i)).encode())
    ds = tmp_path / "ds"
    pack(bins, src, ds, "--partitions", "2", "--compress", "lz4")
    mine = tmp_path / "mine.txt"
    mine.write_bytes(b"the program's own bytes\n" * 100)
    before = mine.read_bytes()
    c = cluster_factory(ds, nranks=1, extra_args=["--cache-mem", "0", "--cache-disk", "0", "--prefill-mem", "0"])
    r = subprocess.run([sys.executable, "-c", SCRIPT_TAKEN_NUMBERS, c.mount, str(mine), *names], env=c.env(node=0),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    want = {n: hashlib.md5((src / n).read_bytes()).hexdigest() for n in names}
    assert out["read"] == want, "a decoded file has wrong bytes"
    assert out["pool"] >= 1, "no pooled memfd to take over: the test checks nothing"
    assert mine.read_bytes() == before, "a decode wrote into the program's own file"
