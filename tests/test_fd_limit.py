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


OUTPUTS_WRITER = r"""
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = '%s/d%02d' % (root, i % 10)
    if i < 10:
        os.makedirs(d)
    with open('%s/o%05d.txt' % (d, i), 'w') as f:
        f.write('output %d\n' % i)
print('wrote', n)
"""

OUTPUTS_READER = r"""
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
errors = mismatches = 0
for i in range(n):
    try:
        with open('%s/d%02d/o%05d.txt' % (root, i % 10, i)) as f:
            if f.read() != 'output %d\n' % i:
                mismatches += 1
    except OSError as e:
        errors += 1
        if errors < 3:
            print(i, e, file=sys.stderr)
print('files=%d errors=%d mismatches=%d' % (n, errors, mismatches))
"""


def test_reading_more_outputs_of_another_node_than_the_fd_limit(cluster_factory, fd_dataset):
    """Node 0 writes 1,200 small outputs; node 1 reads every one, twice, its daemon under
    `ulimit -n 256`. Each remote output read is a copy (a memfd) the reading node keeps for later
    opens: their count must stay within the fd limit (it was capped at 4,096 whatever the limit,
    and the daemon ran out of fds: EIO from about the 250th)."""
    _, ds, _ = fd_dataset
    c = cluster_factory(ds, nranks=2, nofile=256)
    n = 1200
    w = subprocess.run([sys.executable, "-c", OUTPUTS_WRITER, "/fanstore/outs", str(n)], env=c.env(0),
                       capture_output=True, text=True, timeout=600)
    assert w.returncode == 0 and w.stdout.strip() == f"wrote {n}", (w.stdout, w.stderr, c.log()[-3000:])
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", OUTPUTS_READER, "/fanstore/outs", str(n)], env=c.env(1),
                           capture_output=True, text=True, timeout=600)
        assert r.stdout.strip() == f"files={n} errors=0 mismatches=0", (r.stdout, r.stderr, c.log()[-3000:])
    assert "Too many open files" not in c.log(), c.log()[-3000:]
    st = c.client(1).status()
    assert int(st["remote_sent"]) >= n, st  # node 1 fetched them from node 0: the remote path ran


OUTPUTS_CHURN = r"""
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
os.makedirs(d, exist_ok=True)
errors = 0
for phase in ("create", "stat", "read", "remove"):
    for i in range(n):
        p = f"{d}/f{i}"
        try:
            if phase == "create":
                with open(p, "wb") as f:
                    f.write(b"%099d" % i)
            elif phase == "stat":
                errors += os.stat(p).st_size != 99
            elif phase == "read":
                with open(p, "rb") as f:
                    errors += f.read() != b"%099d" % i
            else:
                os.unlink(p)
        except OSError as e:
            errors += 1
            if errors < 5:
                print(phase, p, e, file=sys.stderr)
print(f"errors={errors} left={len(os.listdir(d))}")
"""


def test_many_outputs_made_and_removed_under_the_fd_limit(cluster_factory, fd_dataset):
    """mdtest's pattern at the fd limit: 3 processes on one node, each under `ulimit -n 256`, their
    daemon under `ulimit -n 96`, create 4,000 small outputs each, stat, read and remove them, at once. No error, no
    file left, and the daemon never runs out of fds (its fds of removed outputs, freed in the
    background, were capped at 1,024 whatever the limit: mdtest's remove phase under `ulimit -n
    1024` left the daemon EMFILE)."""
    _, ds, _ = fd_dataset
    c = cluster_factory(ds, nranks=1, nofile=96)
    n = 4000
    procs = [subprocess.Popen([sys.executable, "-c", OUTPUTS_CHURN, f"/fanstore/churn{k}", str(n)], env=c.env(0),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=limit_fds(256))
             for k in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0 and out.strip() == "errors=0 left=0", (out, err, c.log()[-3000:])
    assert "Too many open files" not in c.log(), c.log()[-3000:]
