"""Helpers of the daemon tests (tests/test_daemon_*.py): a small source tree,
its datasets packed per module, and checks over the wire protocol.

    from fs_daemon import pack, source  # noqa: F401 (fixtures)
    ds = pack("zstd")                   # the module's source packed with zstd (cached)
    check_every_rank_serves_every_file(cluster, ds, source)
    c, ds_id, remote = remote_pair(bins, pack, tmp_path, *extra_args)   # 2 ranks, files only rank 1 holds
"""
import os
import random
import stat
import subprocess
from pathlib import Path

import pytest

import fs_cluster
import fs_prep
from fs_cluster import read_index, node_state, start_cluster

NRANKS = 4
SIZES = [0, 1, 100, 4096, 65536, 128 << 10, 1 << 20, 3 << 20, 5 << 20]


def make_source(root: Path) -> Path:
    """A small tree: many sizes, random and compressible, nested, plus val/ (the replicate dir)."""
    rng = random.Random(7)
    for i, size in enumerate(SIZES):
        d = root / "train" / f"c{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"rand{i}.bin").write_bytes(rng.randbytes(size))
        (d / f"text{i}.txt").write_bytes((b"fanstore %d " % i) * (size // 11 + 1))
    (root / "val").mkdir()
    for i in range(6):
        (root / "val" / f"v{i}.bin").write_bytes(rng.randbytes(1000 * (i + 1)))
    (root / "top.txt").write_text("hello\n")
    os.chmod(root / "top.txt", 0o600)
    return root


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return make_source(tmp_path_factory.mktemp("daemon-src"))


@pytest.fixture(scope="module")
def pack(bins, source, tmp_path_factory):
    """get(codec="none", replicate=True, partitions=8) -> the dataset of `source`
    packed so (--replicate-dir val when `replicate`), packed once per module."""
    packed = {}

    def get(codec="none", replicate=True, partitions=8):
        key = (codec, replicate, partitions)
        if key not in packed:
            out = tmp_path_factory.mktemp("daemon-ds") / f"ds-{codec}".replace(":", "")
            args = ["--partitions", str(partitions), "--compress", codec]
            if replicate:
                args += ["--replicate-dir", "val"]
            fs_prep.pack(bins, source, out, *args)
            packed[key] = out
        return packed[key]
    return get


def files_of(dataset: Path):
    ds_id, nodes = read_index(dataset / "manifest.fsm")
    return ds_id, {p: n for p, n in nodes.items() if n["kind"] == fs_cluster.KIND_FILE}


def shm_files_of(cluster) -> list:
    return [node_state(cluster.runtime, r)["index_path"] for r in range(cluster.nranks)]


def check_every_rank_serves_every_file(cluster, dataset: Path, source: Path):
    ds_id, files = files_of(dataset)
    manifest = (dataset / "manifest.fsm").read_bytes()
    assert len(files) == 2 * len(SIZES) + 7
    for r in range(cluster.nranks):
        st = node_state(cluster.runtime, r)
        assert st["status"] == 1 and st["nranks"] == cluster.nranks and st["dataset_id"] == ds_id
        idx = Path(st["index_path"])
        assert idx.parent == Path("/dev/shm")
        # Private to the daemon's user; readable by all when root runs it
        # (it then serves every uid: docs/posix.md, ownership and permissions).
        assert stat.S_IMODE(idx.stat().st_mode) == (0o644 if os.geteuid() == 0 else 0o600)
        assert idx.read_bytes() == manifest, "the index is the verified manifest"
        _, inodes = read_index(idx)
        with cluster.client(r) as c:
            assert c.ping() == r
            for path, n in sorted(files.items()):
                src = source / path
                s = src.stat()
                # stat fields as the index records them
                assert (inodes[path]["size"], inodes[path]["mode"], inodes[path]["mtime_ns"]) == \
                    (s.st_size, s.st_mode, s.st_mtime_ns), path
                fd = c.open_fd(n["id"], ds_id)
                try:
                    assert os.fstat(fd).st_size == s.st_size, path
                    assert fs_cluster.read_fd(fd) == src.read_bytes(), f"rank {r}: {path}"
                finally:
                    os.close(fd)
            status = c.status()
            assert status["status"] == "ready" and int(status["errors"]) == 0, status
    return files


def remote_pair(bins, pack, tmp_path, *extra):
    """2 ranks, no node cache, no replication on read: (cluster, dataset id,
    [(path, node)] of the non-empty files only rank 1 holds, remote for rank 0)."""
    ds = pack("none", replicate=False)
    ds_id, files = files_of(ds)
    c = start_cluster(bins, ds, tmp_path, nranks=2,
                      extra_args=["--cache-mem", "0", "--replicate-on-read", "off", *extra])
    try:
        held = set(node_state(c.runtime, 1)["local"])
    except BaseException:
        c.stop()
        raise
    return c, ds_id, [(p, n) for p, n in files.items() if n["partition"] in held and n["size"] > 0]


def remote_reads_then_status(c, remote, source, reads):
    """`cat` on node 0 reads the small remote files back to back (OPEN, read,
    close of each, a few µs apart) until `reads` reads; (status of rank 0, of rank 1)."""
    small = [(p, n) for p, n in remote if n["size"] <= 128 << 10]
    assert small, "rank 1 holds no file of 128 KiB or less"
    order = (small * (reads // len(small) + 1))[:reads]
    # Into a file, not a pipe: a test process reading the pipe would be one
    # more runnable thread.
    out = c.local.parent / "cat.out"
    with open(out, "wb") as f:
        subprocess.run(["cat", *(f"{c.mount}/{p}" for p, _ in order)], env=c.env(0), stdout=f, check=True)
    assert out.read_bytes() == b"".join((source / p).read_bytes() for p, _ in order), "cat read other bytes"
    with c.client(0) as cl0, c.client(1) as cl1:
        return cl0.status(), cl1.status()
