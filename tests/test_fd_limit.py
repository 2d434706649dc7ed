"""Reading more files than the fd limit allows, as ImageNet-sized jobs do on
nodes with the common `ulimit -n 1024` (here lower, so the test stays small).

The daemons and the readers run under a low RLIMIT_NOFILE; every file of a
dataset several times larger than the limit is read, compressed and raw,
local and remote, by several processes in random order, and must come back
exact with no error. A daemon pushed into EMFILE by a flood of connections
must keep serving afterwards and still remove everything at stop.
"""
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from fs_cluster import cluster_factory, limit_fds  # noqa: F401 (fixture)
from fs_prep import pack

N_FILES = 1500


def make_dataset(root: Path) -> list:
    rng = random.Random(18)
    rels = []
    for i in range(N_FILES):
        d = root / f"d{i % 30:02d}"
        d.mkdir(parents=True, exist_ok=True)
        size = rng.randrange(1, 3000)
        if i % 2:
            data = (f"line {i} " * (size // 8 + 1)).encode()[:size]  # compresses: stored lz4
        else:
            data = rng.randbytes(size)  # does not: stored raw
        (d / f"f{i}.bin").write_bytes(data)
        rels.append(f"d{i % 30:02d}/f{i}.bin")
    for i in range(6):  # larger files: raw ones are extracted to the local disk on first open
        data = rng.randbytes(300_000) if i % 2 else b"x" * 300_000
        (root / f"big{i}.bin").write_bytes(data)
        rels.append(f"big{i}.bin")
    return rels


READER = r"""
import os, random, sys
mount, native, seed, keep_open = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rels = [l.strip() for l in sys.stdin if l.strip()]
random.Random(seed).shuffle(rels)
errors = mismatches = 0
def native_bytes(rel):
    with open(os.path.join(native, rel), "rb") as f:
        return f.read()
if keep_open:
    held = []
    for rel in rels[:keep_open]:
        try:
            held.append((rel, os.open(os.path.join(mount, rel), os.O_RDONLY)))
        except OSError as e:
            errors += 1
            print("open", rel, e, file=sys.stderr)
    for rel, fd in held:
        if os.pread(fd, 1 << 20, 0) != native_bytes(rel):
            mismatches += 1
        os.close(fd)
else:
    for rel in rels:
        try:
            with open(os.path.join(mount, rel), "rb") as f:
                got = f.read()
        except OSError as e:
            errors += 1
            if errors < 5:
                print("read", rel, e, file=sys.stderr)
            continue
        if got != native_bytes(rel):
            mismatches += 1
print(f"files={len(rels) if not keep_open else keep_open} errors={errors} mismatches={mismatches}")
"""


def run_reader(cluster, node, native, rels, seed, nofile, keep_open=0):
    return subprocess.Popen(
        [sys.executable, "-c", READER, cluster.mount, str(native), str(seed), str(keep_open)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=cluster.env(node=node), preexec_fn=limit_fds(nofile))


def finish(p, rels):
    out, err = p.communicate("\n".join(rels), timeout=600)
    assert p.returncode == 0, err
    return out.strip(), err


@pytest.fixture(scope="module")
def fd_dataset(bins, tmp_path_factory):
    base = tmp_path_factory.mktemp("fdlimit")
    native = base / "tree"
    rels = make_dataset(native)
    ds = base / "ds"
    pack(bins, native, ds, "--partitions", "8", "--compress", "lz4")
    return native, ds, rels


def test_reads_beyond_the_fd_limit(cluster_factory, fd_dataset):
    """2 daemons and 3 readers under `ulimit -n 256`, 1,506 files each: no error, exact bytes."""
    native, ds, rels = fd_dataset
    c = cluster_factory(ds, nranks=2, nofile=256, extra_args=["--cache-mem", "64M"])
    readers = [run_reader(c, node, native, rels, seed, 256) for node, seed in [(0, 1), (1, 2), (0, 3)]]
    for p in readers:
        out, err = finish(p, rels)
        assert out == f"files={len(rels)} errors=0 mismatches=0", (out, err, c.log())
    # A second pass (now warm) gives the same.
    out, err = finish(run_reader(c, 1, native, rels, 9, 256), rels)
    assert out == f"files={len(rels)} errors=0 mismatches=0", (out, err, c.log())
    assert "Too many open files" not in c.log()


def test_a_program_keeps_many_files_open(cluster_factory, fd_dataset):
    """A reader under `ulimit -n 256` holds 220 /fanstore files open at once, then reads them all."""
    native, ds, rels = fd_dataset
    c = cluster_factory(ds, nranks=2, nofile=256)
    out, err = finish(run_reader(c, 0, native, rels, 5, 256, keep_open=220), rels)
    assert out == "files=220 errors=0 mismatches=0", (out, err, c.log())


def test_fd_exhaustion_then_stop_removes_everything(cluster_factory, fd_dataset):
    """A daemon started with a soft limit below its hard one raises it (and says so); a flood of
    connections beyond the limit puts it in EMFILE; afterwards it serves every file again, and
    `fanstore stop` still removes its local directory and its shared memory."""
    native, ds, rels = fd_dataset
    c = cluster_factory(ds, nranks=1, nofile=(64, 160))
    assert "RLIMIT_NOFILE soft 64 hard 160: raised the soft limit to 160" in c.log(), c.log()
    flood = []
    try:
        # Each connection is pinged before the next is opened, so the daemon
        # really holds it; past ~160 fds it cannot accept and the ping times out.
        for _ in range(300):
            try:
                cl = c.client(0, timeout=2)
                flood.append(cl)
                cl.ping()
            except OSError:
                break
        assert 100 < len(flood) < 300, len(flood)
    finally:
        for cl in flood:
            cl.close()
    out, err = finish(run_reader(c, 0, native, rels, 7, 256), rels)
    assert out == f"files={len(rels)} errors=0 mismatches=0", (out, err, c.log())
    index = c.index_path(0)
    stem = index.name[:-len(".index")]
    ours = {n for n in os.listdir("/dev/shm") if n.startswith(stem)}
    assert {index.name, stem + ".tiers", stem + ".copies"} <= ours, ours
    assert os.listdir(f"/dev/shm/{stem}.copies"), "small files are served from copies in shared memory"
    c.stop()
    assert not (c.local / "rank-0").exists(), list((c.local / "rank-0").rglob("*"))[:20]
    left = {n for n in os.listdir("/dev/shm") if n.startswith(stem)}
    assert not left, left
    assert "accepting a connection: Too many open files" in c.log(), c.log()
