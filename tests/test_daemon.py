"""End-to-end tests of fanstore-daemon and the fanstore CLI: real MPICH under
`mpiexec -n 4` (UCX_TLS=tcp), real unix sockets, no preload library.

A wire-protocol client (fs_cluster.Client) asks every rank's daemon for every
file of a generated dataset and compares the bytes with the source tree; the
stat fields are checked in the index the daemons publish."""
import os
import random
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import fs_cluster
import fs_prep
from fs_cluster import read_fd, read_index, node_state, start_cluster, launch

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


_packed = {}


@pytest.fixture(scope="module")
def pack(bins, source, tmp_path_factory):
    def get(codec="none", replicate=True, partitions=8):
        key = (codec, replicate, partitions)
        if key not in _packed:
            out = tmp_path_factory.mktemp("daemon-ds") / f"ds-{codec}".replace(":", "")
            args = ["--partitions", str(partitions), "--compress", codec]
            if replicate:
                args += ["--replicate-dir", "val"]
            fs_prep.pack(bins, source, out, *args)
            _packed[key] = out
        return _packed[key]
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
        assert stat.S_IMODE(idx.stat().st_mode) == 0o600
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


@pytest.mark.parametrize("codec", ["none", "lz4", "zstd"])
def test_every_rank_serves_every_file(bins, pack, source, tmp_path, codec):
    ds = pack(codec)
    c = start_cluster(bins, ds, tmp_path, nranks=NRANKS)
    try:
        check_every_rank_serves_every_file(c, ds, source)
        # Second pass: remote and compressed files now come from each node's cache.
        ds_id, files = files_of(ds)
        with c.client(1) as cl:
            before = cl.status()
            for n in files.values():
                cl.read(n["id"], ds_id)
            after = cl.status()
        assert int(after["cache_hits"]) > int(before["cache_hits"])
        assert int(after["remote_sent"]) == int(before["remote_sent"]), "cached: no new remote reads"
        table = c.cli("status").stdout
        assert len(table.strip().splitlines()) == 1 + NRANKS and "ready" in table, table
        served = []
        for r in range(NRANKS):
            with c.client(r) as cl:
                st = cl.status()
            served.append(int(st["remote_served"]))
            # The wake-up cost each rank measured at start (fanstore_daemon::wake_cost).
            # (Across CPUs only where the rank may use two: a launcher may bind it to one.)
            assert float(st["wake_same_us"]) > 0, st
            if int(st["cpus_usable"]) >= 2:
                assert float(st["wake_across_us"]) > 0, st
            else:
                assert st["wake_across_us"] == "-", st
        assert all(s > 0 for s in served), served
        assert "wake us" in table.splitlines()[0], table
        shm = shm_files_of(c)
        local = c.local
    finally:
        c.stop()
    # stop leaves nothing behind
    assert not any(os.path.exists(p) for p in shm), shm
    assert not c.runtime.exists() or not any(c.runtime.iterdir())
    assert not local.exists() or not any(local.iterdir())


def test_replication_2_and_replicate_dir(bins, pack, source, tmp_path):
    ds = pack("zstd")
    ds_id, files = files_of(ds)
    c = start_cluster(bins, ds, tmp_path, nranks=NRANKS, extra_args=["--replication", "2"])
    try:
        held = {r: set(node_state(c.runtime, r)["local"]) for r in range(NRANKS)}
        replicated = {n["partition"] for p, n in files.items() if p.startswith("val/")}
        assert len(replicated) == 1
        for r in range(NRANKS):
            assert replicated <= held[r], "the replicate-dir partition is on every rank"
        for p in range(9):
            holders = [r for r in range(NRANKS) if p in held[r]]
            assert len(holders) == (NRANKS if p in replicated else 2), (p, holders)
        check_every_rank_serves_every_file(c, ds, source)
        # val/ files are local everywhere: rank 2 never asks another rank for them.
        with c.client(2) as cl:
            before = int(cl.status()["remote_sent"])
            for path, n in files.items():
                if path.startswith("val/"):
                    assert cl.read(n["id"], ds_id) == (source / path).read_bytes()
            assert int(cl.status()["remote_sent"]) == before
        served = []
        for r in range(NRANKS):
            with c.client(r) as cl:
                served.append(int(cl.status()["remote_served"]))
        assert all(s > 0 for s in served), f"reads spread over the replicas: {served}"
    finally:
        c.stop()


def test_files_are_served_from_extracted_files_and_copies(bins, pack, source, tmp_path):
    """Local uncompressed files of 64 KiB and more are extracted to the local dir; smaller and
    remote files become read-only copies in the rank's copy directory; the tier map says which."""
    ds = pack("none")
    ds_id, files = files_of(ds)
    c = start_cluster(bins, ds, tmp_path, nranks=2, extra_args=["--prefill-mem", "0"])
    try:
        st = node_state(c.runtime, 0)
        copies = st["index_path"][:-len(".index")] + ".copies/"
        local = [(p, n) for p, n in files.items() if n["partition"] in st["local"] and n["codec"] == 0]
        big = [(p, n) for p, n in local if n["size"] >= 65536]
        small = [(p, n) for p, n in local if 0 < n["size"] < 65536]
        remote = [(p, n) for p, n in files.items() if n["partition"] not in st["local"] and n["size"] > 0]
        assert big and small and remote
        with c.client(0) as cl:
            for (rel, n), where in [(big[0], st["local_dir"] + "/in/"), (small[0], copies), (remote[0], copies)]:
                fd = cl.open_fd(n["id"], ds_id)
                target = os.readlink(f"/proc/self/fd/{fd}")
                assert target.startswith(where), (rel, target)
                assert read_fd(fd) == (source / rel).read_bytes()
                with pytest.raises(OSError):
                    os.write(fd, b"x")  # read-only
                os.close(fd)
            # The tier map (after the 64-byte header, one byte per node id: 1 extracted, 2 copy).
            tiers = Path(st["index_path"][:-len(".index")] + ".tiers").read_bytes()
            assert tiers[:8] == b"FANSTTM\0"
            assert (tiers[64 + big[0][1]["id"]], tiers[64 + small[0][1]["id"]], tiers[64 + remote[0][1]["id"]]) == (1, 2, 2)
            assert tiers[64 + small[1][1]["id"]] == 0, "not opened yet"
            # every OPEN is its own open file description (own offset), cached or not
            want = (source / remote[0][0]).read_bytes()[:10]
            a = cl.open_fd(remote[0][1]["id"], ds_id)
            b = cl.open_fd(remote[0][1]["id"], ds_id)
            try:
                assert os.read(a, 10) == want
                assert os.read(b, 10) == want, "a second OPEN must not share the first one's offset"
            finally:
                os.close(a)
                os.close(b)
            # a holder whose local copy went bad: the requester's checksum catches it
            victim_path, victim = remote[-1]
            st1 = node_state(c.runtime, 1)
            copy = Path(st1["local_dir"]) / "parts" / f"part-{victim['partition']:06d}.fsp"
            os.chmod(copy, 0o600)
            with open(copy, "r+b") as f:  # the holder serves from its mapped partition copy
                f.seek(victim["payload_offset"])
                first = f.read(1)
                f.seek(victim["payload_offset"])
                f.write(bytes([first[0] ^ 0xFF]))
            with pytest.raises(OSError) as e:
                cl.open_fd(victim["id"], ds_id)
            assert e.value.errno == 5
            # (the launcher forwards the daemon's log asynchronously)
            deadline = time.monotonic() + 10
            while "fails its checksum" not in c.log() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert "fails its checksum" in c.log()
            # errors
            for bad, errno in [((1 << 40, ds_id), 2), ((0, ds_id), 2), ((local[0][1]["id"], ds_id ^ 1), 116)]:
                with pytest.raises(OSError) as e:
                    cl.open_fd(*bad)
                assert e.value.errno == errno
    finally:
        c.stop()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 usable CPUs")
def test_a_daemon_confined_to_one_cpu_says_so(bins, pack, tmp_path):
    """A launcher that binds the daemon to one core confines every thread of
    it: the daemon says so at start and in STATUS, and names the launchers'
    options that unbind it (fanstore_daemon::wake_cost)."""
    ds = pack("none")
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(mine)})  # inherited by the singleton started now
    try:
        c = start_cluster(bins, ds, tmp_path, nranks=0)
    finally:
        os.sched_setaffinity(0, mine)
    try:
        with c.client(0) as cl:
            st = cl.status()
        assert (int(st["cpus_usable"]), int(st["cpus_online"])) == (1, os.cpu_count()), st
        assert st["wake_across_us"] == "-" and float(st["wake_same_us"]) > 0, st
        log = c.log()
        assert f"may run on 1 of the node's {os.cpu_count()} CPUs" in log and "--cpu-bind=none" in log, log[-3000:]
    finally:
        c.stop()
    # Unbound, nothing is said.
    c = start_cluster(bins, ds, tmp_path / "free", nranks=0)
    try:
        with c.client(0) as cl:
            assert int(cl.status()["cpus_usable"]) == len(mine)
        assert "may run on" not in c.log()
    finally:
        c.stop()


def test_singleton_without_launcher(bins, pack, source, tmp_path):
    ds = pack("lz4")
    c = start_cluster(bins, ds, tmp_path, nranks=0)
    try:
        assert c.nranks == 1
        st = node_state(c.runtime, 0)
        assert st["nranks"] == 1 and len(st["local"]) == 9
        check_every_rank_serves_every_file(c, ds, source)
    finally:
        c.stop()


def test_corrupt_partition_aborts_the_job(bins, pack, tmp_path):
    good = pack("none")
    bad = tmp_path / "bad-ds"
    bad.mkdir()
    for f in good.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    part = bad / "part-000002.fsp"
    b = bytearray(part.read_bytes())
    b[len(b) // 2] ^= 0x55  # inside a payload
    part.write_bytes(bytes(b))
    proc, runtime, local, log_path = launch(bins, bad, tmp_path, nranks=NRANKS)
    try:
        rc = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the job kept running with a corrupt partition")
    log = log_path.read_text()
    assert rc != 0, log
    assert "part-000002.fsp" in log and "checksum" in log, log
    w = subprocess.run([bins["cli"], "--runtime-dir", str(runtime), "wait", "--timeout", "5"],
                       capture_output=True, text=True)
    assert w.returncode == 1 and "failed" in w.stderr, w.stderr
    states = [node_state(runtime, r) for r in range(NRANKS)]
    assert all(s["status"] == 3 for s in states), "every rank reports Failed"
    fs_cluster.wait_ranks_gone(runtime, NRANKS)
    assert not any(os.path.exists(s["index_path"]) for s in states), "shm index removed"
    assert not local.exists() or not any(local.iterdir())
    # `fanstore stop` cleans what dead daemons left.
    subprocess.run([bins["cli"], "--runtime-dir", str(runtime), "stop"], check=True, capture_output=True)
    assert not runtime.exists()


def test_a_second_job_on_a_running_jobs_directories_is_refused_and_takes_nothing(bins, pack, source, tmp_path):
    """A second job started with a running job's --local directory (or its
    runtime directory) must not take the running job's rank directories for
    a killed run's (remove them under its readers, set its outputs aside):
    each of its ranks refuses to start, naming the lock file and the pid that
    holds it, and the first job reads and writes on as before."""
    ds = pack("none")
    _, files = files_of(ds)
    paths = sorted(p for p, n in files.items() if n["size"] > 0)
    # (No background replication or extraction: the first job's own work
    # would change its local directory while the test compares it.)
    c = start_cluster(bins, ds, tmp_path / "a", nranks=2,
                      extra_args=["--replicate-on-read", "off", "--extract-ahead", "0"])
    try:
        def read_every_file():
            for node in (0, 1):
                out = tmp_path / f"cat{node}.out"
                with open(out, "wb") as f:
                    subprocess.run(["cat", *(f"{c.mount}/{p}" for p in paths)], env=c.env(node), stdout=f, check=True)
                assert out.read_bytes() == b"".join((source / p).read_bytes() for p in paths), f"node {node} read other bytes"
        subprocess.run(["sh", "-c", f"echo kept > {c.mount}/out.txt"], env=c.env(1), check=True)
        read_every_file()
        pids = c.pids()
        held = {r: sorted(q.relative_to(c.local) for q in (c.local / f"rank-{r}").rglob("*")) for r in (0, 1)}
        # The same --local, a runtime directory of its own; then the first
        # job's runtime directory, a --local of its own.
        for name, kw, lock in (("same-local", dict(local=c.local), lambda r: c.local / f"rank-{r}.lock"),
                               ("same-runtime", dict(runtime=c.runtime), lambda r: c.runtime / f"node-{r}.lock")):
            proc, runtime, _, log_path = launch(bins, ds, tmp_path / name, nranks=2, **kw)
            try:
                rc = proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                pytest.fail(f"{name}: the second job kept running")
            log = log_path.read_text()
            assert rc != 0, log
            for r in (0, 1):
                assert f"{lock(r)}: rank {r} of a running FanStore job (pid {pids[r]})" in log, log
            assert "removing stale" not in log and "killed run" not in log, log
            for r in (0, 1):
                st = node_state(c.runtime, r)
                assert st["status"] == 1 and st["pid"] == pids[r], f"{name}: rank {r}'s state is no longer the first job's"
                # Nothing of it went (a file being fetched, *.fetch, becomes its final name).
                gone = [q for q in held[r] if not (c.local / q).exists() and q.suffix != ".fetch"]
                assert not gone, f"{name}: rank {r}'s local directory lost {gone}"
            assert not list(c.local.glob("recovered-rank-*")), f"{name}: the first job's outputs were set aside"
            read_every_file()
            r = subprocess.run(["cat", f"{c.mount}/out.txt"], env=c.env(0), capture_output=True, text=True, check=True)
            assert r.stdout == "kept\n"
            if name == "same-local":
                # Its own runtime directory says it failed (no lock file left
                # there), and `fanstore stop` clears it.
                assert not list(runtime.glob("*.lock")), list(runtime.iterdir())
                w = subprocess.run([bins["cli"], "--runtime-dir", str(runtime), "wait", "--timeout", "5"],
                                   capture_output=True, text=True)
                assert w.returncode == 1 and "failed" in w.stderr, w.stderr
                fs_cluster.wait_ranks_gone(runtime, 2)  # (OpenMPI's launcher may exit first)
                subprocess.run([bins["cli"], "--runtime-dir", str(runtime), "stop"], check=True, capture_output=True)
                assert not runtime.exists(), list(runtime.iterdir())
    finally:
        c.stop()
    # The first job's stop leaves no lock file behind.
    assert not list(c.local.glob("*.lock")) and not c.runtime.exists()


def test_copy_directories_left_by_killed_ranks_are_swept_at_start(bins, pack, tmp_path):
    """A rank killed while removing its copy directory (renamed
    `*.copies.removing` in /dev/shm) leaves it in memory, under a name no
    later job with another runtime directory meets: a starting daemon
    removes this user's tombs untouched for a minute, and nothing else."""
    uid = os.getuid()
    old = time.time() - 600
    tombs = {}
    for name, age in ((f"fanstore-{uid}-testjob-0badc0de-r0.copies.removing", old),
                      (f"fanstore-{uid}-testjob-0badc0de-r1.copies.removing", None)):
        p = Path("/dev/shm") / name
        p.mkdir()
        (p / "7").write_bytes(b"x" * 4096)
        if age:
            os.utime(p, (age, age))
        tombs[name] = p
    c = start_cluster(bins, pack("none"), tmp_path, nranks=2)
    try:
        old_tomb, fresh_tomb = tombs.values()
        assert not old_tomb.exists(), "an abandoned tomb was left"
        assert fresh_tomb.exists(), "a tomb still being removed (touched within the minute) was swept"
        assert "copy directories in /dev/shm that ranks of earlier jobs were killed while removing" in c.log()
    finally:
        c.stop()
        for p in tombs.values():
            subprocess.run(["rm", "-rf", str(p)])


def test_missing_partition_names_it(bins, pack, tmp_path):
    good = pack("lz4")
    bad = tmp_path / "missing-ds"
    bad.mkdir()
    for f in good.iterdir():
        if f.name != "part-000005.fsp":
            (bad / f.name).write_bytes(f.read_bytes())
    proc, runtime, local, log_path = launch(bins, bad, tmp_path, nranks=0)
    rc = proc.wait(timeout=60)
    log = log_path.read_text()
    assert rc != 0 and "part-000005.fsp" in log, log
    subprocess.run([bins["cli"], "--runtime-dir", str(runtime), "stop"], check=True, capture_output=True)


def test_dead_client_and_hung_holder(bins, pack, source, tmp_path):
    """A client killed mid-request, a client sending garbage, and a holder that
    stops answering (SIGSTOP): the daemon answers EIO in bounded time and keeps serving."""
    ds = pack("none")
    ds_id, files = files_of(ds)
    c = start_cluster(bins, ds, tmp_path, nranks=2, extra_args=["--remote-timeout", "2"])
    try:
        st0 = node_state(c.runtime, 0)
        remote = sorted(((p, n) for p, n in files.items() if n["partition"] not in st0["local"] and n["size"] > 0),
                        key=lambda x: -x[1]["size"])
        assert len(remote) >= 3
        # 1. a client process that dies right after asking for a big remote file
        code = ("import sys; sys.path.insert(0, %r); import fs_cluster, os\n"
                "c = fs_cluster.Client(%r); c.send(fs_cluster.OP_OPEN, %d, %d); os._exit(0)\n"
                % (str(Path(__file__).parent), str(c.socket(0)), remote[0][1]["id"], ds_id))
        for _ in range(3):
            subprocess.run(["python3", "-c", code], check=True, timeout=30)
        # 2. garbage and a half-closed connection
        import socket
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(str(c.socket(0)))
        s.send(b"not a request")
        s.close()
        with c.client(0) as cl:
            assert cl.read(remote[0][1]["id"], ds_id) == (source / remote[0][0]).read_bytes()
        # 3. the holder hangs: a file not yet cached must fail with EIO, in bounded time
        pid1 = node_state(c.runtime, 1)["pid"]
        os.kill(pid1, signal.SIGSTOP)
        try:
            with c.client(0, timeout=60) as cl:
                t = time.monotonic()
                with pytest.raises(OSError) as e:
                    cl.open_fd(remote[1][1]["id"], ds_id)
                took = time.monotonic() - t
                assert e.value.errno == 5, e.value
                assert took < 15, took
                assert cl.ping() == 0, "rank 0 still serves"
                st = cl.status()
                assert int(st["remote_failed"]) >= 1
        finally:
            os.kill(pid1, signal.SIGCONT)
        with c.client(0) as cl:
            for p, n in remote[1:4]:
                assert cl.read(n["id"], ds_id) == (source / p).read_bytes()
    finally:
        c.stop()


def test_a_hung_holder_fails_over_after_a_receive_into_a_spare(bins, pack, source, tmp_path):
    """With --cache-mem 0 a remote payload stored uncompressed is received
    straight into a free spare copy file's pages. When the first holder
    hangs (SIGSTOP), that receive stays posted and keeps its spare: the
    read fails over to the second holder, whose bytes go into a new file,
    and the late answer, once the first holder runs again, lands in the
    kept spare, never in a file a program reads."""
    ds = pack("none")
    ds_id, files = files_of(ds)
    c = start_cluster(bins, ds, tmp_path, nranks=3,
                      extra_args=["--replication", "2", "--cache-mem", "0", "--replicate-on-read", "off",
                                  "--copy-spares", "64M", "--remote-timeout", "2"])

    def holders(n):  # fanstore-daemon/src/placement.rs: 2 copies on 3 ranks
        spread = (((n["id"] * 0x9E3779B1) & 0xFFFFFFFF) >> 16) ^ n["id"]
        return [(n["partition"] % 3 + (spread % 2 + i) % 2) % 3 for i in range(2)]

    try:
        # Files both of whose holders are remote for rank 0, rank 1 asked first.
        first_1 = [(p, n) for p, n in files.items() if n["size"] > 0 and holders(n) == [1, 2]]
        others = [(p, n) for p, n in files.items() if n["size"] > 0 and 0 not in holders(n)]
        assert len(first_1) >= 2, "too few files held by ranks 1 and 2 alone"
        with c.client(0) as cl:
            for p, n in others * 2:  # spares, free again once read
                assert cl.read(n["id"], ds_id) == (source / p).read_bytes(), p
            in_place = int(cl.status()["remote_in_place"])
            assert in_place >= 1, "no payload was received into a spare"
        pid1 = node_state(c.runtime, 1)["pid"]
        os.kill(pid1, signal.SIGSTOP)
        try:
            with c.client(0, timeout=60) as cl:
                for p, n in first_1[:2]:
                    t = time.monotonic()
                    assert cl.read(n["id"], ds_id) == (source / p).read_bytes(), p
                    assert time.monotonic() - t < 15
                st = cl.status()
                assert int(st["remote_failed"]) >= 2, f"rank 1 was not asked first: {st}"
        finally:
            os.kill(pid1, signal.SIGCONT)
        time.sleep(0.5)  # the late answers arrive
        with c.client(0) as cl:
            for _ in range(3):
                for p, n in others:
                    assert cl.read(n["id"], ds_id) == (source / p).read_bytes(), p
            assert int(cl.status()["remote_in_place"]) > in_place
    finally:
        c.stop()


def test_pieces_and_small_cache(bins, pack, source, tmp_path):
    """Payloads crossing in many MPI messages (--mpi-piece 64K, hidden testing knob),
    and a cache smaller than the files (evictions, still correct). With
    --cache-disk 0 every copy is one of the memory cache's (by default the
    copies of 64 KiB or more go to the local disk, outside --cache-mem), and
    256 KiB is less than the copies each rank makes of the small files
    (278-409 KiB here): with 1 MiB, whether anything was evicted was a race
    (3 runs of 8 here read 0 evictions, and 3 of 12 with --cache-disk 0)."""
    ds = pack("zstd")
    c = start_cluster(bins, ds, tmp_path, nranks=2,
                      extra_args=["--mpi-piece", "64K", "--cache-mem", "256K", "--cache-disk", "0"])
    try:
        check_every_rank_serves_every_file(c, ds, source)
        ev, sts = 0, []
        for r in range(2):
            with c.client(r) as cl:
                sts.append(cl.status())
                ev += int(sts[-1]["cache_evictions"])
        assert ev > 0, [{k: st[k] for k in ("cache_hits", "cache_misses", "cache_evictions", "cache_bytes", "cache_entries", "cache_disk_bytes", "remote_sent", "opens", "extracted_ahead", "copies_reused")} for st in sts]
    finally:
        c.stop()


def test_cli_wait_times_out_without_daemons(bins, tmp_path):
    rt = tmp_path / "rt"
    rt.mkdir()
    r = subprocess.run([bins["cli"], "--runtime-dir", str(rt), "wait", "--timeout", "0.5"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "timed out" in r.stderr
    r = subprocess.run([bins["cli"], "--runtime-dir", str(rt), "status"], capture_output=True, text=True)
    assert r.returncode == 1


def test_concurrent_clients(bins, pack, source, tmp_path):
    """Eight clients at once on each rank, each reading every file in its own
    order: many remote reads in flight in both directions, one cached copy."""
    from concurrent.futures import ThreadPoolExecutor
    ds = pack("lz4")
    ds_id, files = files_of(ds)
    want = {p: (source / p).read_bytes() for p in files}
    c = start_cluster(bins, ds, tmp_path, nranks=2)
    try:
        def worker(k):
            rank = k % 2
            order = sorted(files, key=lambda p: hash((p, k)))
            with c.client(rank) as cl:
                for p in order:
                    assert cl.read(files[p]["id"], ds_id) == want[p], (rank, p)
            return k
        with ThreadPoolExecutor(16) as ex:
            assert sorted(ex.map(worker, range(16))) == list(range(16))
        for r in range(2):
            with c.client(r) as cl:
                st = cl.status()
            # every remote or compressed file was fetched/decoded once per node, then shared
            assert int(st["cache_misses"]) <= len(files), st
            assert int(st["errors"]) == 0 and int(st["remote_failed"]) == 0, st
    finally:
        c.stop()


def test_cli_output_into_a_closed_pipe_ends_quietly(bins, tmp_path):
    """`fanstore stop | head` prints no "Broken pipe" and no panic: like
    coreutils, the CLI is killed by SIGPIPE, silently."""
    rt = tmp_path / "rt"
    rt.mkdir()
    r, w = os.pipe()
    os.close(r)
    try:
        res = subprocess.run([bins["cli"], "--runtime-dir", str(rt), "stop"], stdout=w, stderr=subprocess.PIPE,
                             text=True, timeout=60)
    finally:
        os.close(w)
    assert (res.returncode, res.stderr) == (-13, ""), res


# The system call an idle communication thread sleeps in (ppoll), by machine.
PPOLL = {"x86_64": "271", "aarch64": "73"}


@pytest.mark.skipif(os.uname().machine not in PPOLL, reason="ppoll's system call number is known for x86_64 and aarch64 only")
def test_idle_communication_thread_sleeps_on_the_mpi_library_fds(bins, pack, source, tmp_path):
    """An idle rank's communication thread (the daemon's main thread) sleeps
    in ppoll on its doorbell and the MPI library's epoll fds, not in short
    naps on its channel (`--comm-sleep nap`: a futex wait), and a peer's
    request still wakes it: every file is served to every rank afterwards."""
    ds = pack("none")
    c = start_cluster(bins, ds, tmp_path, nranks=2)
    try:
        # (Logged as the communication thread starts, after the rank
        # published ready: `fanstore wait` may return before both lines.)
        deadline = time.monotonic() + 10
        while True:
            found = re.findall(r"rank (\d+): the communication thread sleeps on its doorbell and (\d+) MPI epoll fds", c.log())
            if sorted(r for r, _ in found) == ["0", "1"] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert sorted(r for r, _ in found) == ["0", "1"], c.log()
        assert all(int(n) >= 1 for _, n in found), f"no epoll fd of the MPI library found: {found}"
        # After a second of silence a sleep lasts up to 2 ms (the bound
        # kept for transports without fds): most samples find the thread in
        # ppoll (with the old naps: futex, from the channel's recv_timeout).
        time.sleep(1.5)
        for pid in c.pids():
            calls = []
            for _ in range(20):
                calls.append(Path(f"/proc/{pid}/syscall").read_text().split()[0])
                time.sleep(0.02)
            assert calls.count(PPOLL[os.uname().machine]) >= 10, f"daemon {pid}'s main thread was in system calls {calls}"
        check_every_rank_serves_every_file(c, ds, source)
    finally:
        c.stop()


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


def test_copies_past_the_cache_reuse_pages_only_once_nobody_holds_them(bins, pack, source, tmp_path):
    """With --cache-mem 0 no copy is kept: each remote OPEN gets an unnamed
    copy, and the next one is written into a spare whose reader is done
    (status copies_reused; the payload is received into its pages, status
    remote_in_place). A copy some program still holds (an fd, a dup
    in a forked child, a mapping without an fd) keeps its bytes, however
    many reads come after it."""
    import mmap
    c, ds_id, remote = remote_pair(bins, pack, tmp_path, "--copy-spares", "64M")
    try:
        assert len(remote) >= 3, "rank 1 holds too few files"
        with c.client(0) as cl:
            kept = [(p, cl.open_fd(n["id"], ds_id)) for p, n in remote[:3]]
            # One held only by a forked child, one only by a mapping.
            child_r, child_w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child keeps its copy of the fd until told to read it
                os.close(child_w)
                os.read(child_r, 1)
                ok = read_fd(kept[1][1]) == (source / kept[1][0]).read_bytes()
                os._exit(0 if ok else 1)
            os.close(child_r)
            os.close(kept[1][1])
            m = mmap.mmap(kept[2][1], 0, prot=mmap.PROT_READ)
            os.close(kept[2][1])
            reads = 0
            while reads < 60:
                for p, n in remote:
                    assert cl.read(n["id"], ds_id) == (source / p).read_bytes(), p
                    reads += 1
            st = cl.status()
        assert int(st["copies_reused"]) >= reads // 2, f"spares were not reused: {st}"
        # Stored uncompressed: the payload is received straight into a free spare's pages.
        assert int(st["remote_in_place"]) >= reads // 2, f"payloads were not received into spares: {st}"
        assert read_fd(kept[0][1]) == (source / kept[0][0]).read_bytes(), "a held copy was written again"
        os.close(kept[0][1])
        assert m[:] == (source / kept[2][0]).read_bytes(), "a mapped copy was written again"
        m.close()
        os.write(child_w, b"x")
        os.close(child_w)
        assert os.waitpid(pid, 0)[1] == 0, "the copy a forked child held was written again"
    finally:
        c.stop()


@pytest.mark.parametrize("cache_mem", ["0", "64M"])
def test_small_remote_opens_are_answered_by_the_communication_thread(bins, pack, source, tmp_path, cache_mem):
    """A remote file stored uncompressed, of 512 KiB or less, is answered by
    the communication thread itself once its payload is verified in the
    copy's file (received into a spare's pages, or written into a new copy
    file), status remote_direct; a larger one by the connection thread. A
    payload that fails its checksum is never answered from there: EIO, and
    the next reads are exact."""
    ds = pack("none", replicate=False)
    ds_id, files = files_of(ds)
    # (--read-ahead 0: these reads in order would otherwise be fetched by the
    # read-ahead threads, tests/test_read_ahead.py, not answered one by one.)
    c = start_cluster(bins, ds, tmp_path, nranks=2,
                      extra_args=["--cache-mem", cache_mem, "--replicate-on-read", "off", "--copy-spares", "64M",
                                  "--remote-timeout", "2", "--read-ahead", "0"])
    try:
        st1 = node_state(c.runtime, 1)
        held = set(st1["local"]) - set(node_state(c.runtime, 0)["local"])
        remote = sorted((p, n) for p, n in files.items() if n["partition"] in held and n["size"] > 0)
        small = [(p, n) for p, n in remote if n["size"] <= 512 << 10]
        large = [(p, n) for p, n in remote if n["size"] > 512 << 10]
        assert len(small) >= 3 and large, "rank 1 holds too few files"
        victim, small = small[0], small[1:]
        rounds = 3 if cache_mem == "0" else 1  # with a node cache, later reads are copies
        with c.client(0) as cl:
            for _ in range(rounds):
                for p, n in small + large:
                    assert cl.read(n["id"], ds_id) == (source / p).read_bytes(), p
            st = cl.status()
            assert int(st["remote_sent"]) == rounds * len(small + large), st
            assert int(st["remote_direct"]) == rounds * len(small), st
            # The holder's copy of one payload goes bad after its load.
            part = Path(st1["local_dir"]) / "parts" / f"part-{victim[1]['partition']:06d}.fsp"
            os.chmod(part, 0o600)
            with open(part, "r+b") as f:
                f.seek(victim[1]["payload_offset"] + victim[1]["stored_len"] // 2)
                b = f.read(1)
                f.seek(-1, os.SEEK_CUR)
                f.write(bytes([b[0] ^ 0xFF]))
            with pytest.raises(OSError) as e:
                cl.read(victim[1]["id"], ds_id)
            assert e.value.errno == 5, e.value
            st2 = cl.status()
            assert int(st2["remote_direct"]) == int(st["remote_direct"]), "a bad payload was answered"
            assert int(st2["remote_failed"]) >= 1, st2
            for p, n in small:
                assert cl.read(n["id"], ds_id) == (source / p).read_bytes(), p
    finally:
        c.stop()


@pytest.mark.parametrize("fetch_post", ["server", "comm"])
def test_remote_reads_are_posted_by_the_thread_that_needs_them(bins, pack, source, tmp_path, fetch_post):
    """Where MPI granted MPI_THREAD_MULTIPLE, the server thread of a remote
    OPEN posts the fetch's receives and request itself, and the
    communication thread adopts the posted fetch (status remote_posted);
    with `--fetch-post comm` the communication thread posts every fetch.
    Either way every byte is exact, payloads in several pieces too (a
    64 KiB `--mpi-pipeline`), and a stop with fetches in flight ends
    cleanly."""
    ds = pack("none", replicate=False)
    ds_id, files = files_of(ds)
    c = start_cluster(bins, ds, tmp_path, nranks=2,
                      extra_args=["--cache-mem", "0", "--replicate-on-read", "off", "--mpi-pipeline", "64K",
                                  "--fetch-post", fetch_post])
    wrong, done, threads = [], threading.Event(), []
    try:
        held = set(node_state(c.runtime, 1)["local"]) - set(node_state(c.runtime, 0)["local"])
        remote = sorted((p, n) for p, n in files.items() if n["partition"] in held and n["size"] > 0)
        assert any(n["size"] >= 128 << 10 for _, n in remote), "no file crosses in several pieces"
        with c.client(0) as cl:
            for _ in range(2):
                for p, n in remote:
                    assert cl.read(n["id"], ds_id) == (source / p).read_bytes(), p
            st = cl.status()
        assert int(st["remote_sent"]) == 2 * len(remote), st
        posts = int(st["remote_posted"])
        if fetch_post == "comm" or st["mpi_threading"] != "multiple":
            assert posts == 0, st
        else:
            assert posts == int(st["remote_sent"]), st
        # Readers in a loop while the job stops: fetches posted but not yet
        # adopted or answered are cancelled, and every rank exits cleanly.
        def read_until_stopped(k):
            try:
                with c.client(0) as cl:
                    while not done.is_set():
                        for p, n in remote[k::3]:
                            if cl.read(n["id"], ds_id) != (source / p).read_bytes():
                                wrong.append(p)
            except OSError:
                pass  # the daemon went away mid-read: EIO or a closed socket

        threads += [threading.Thread(target=read_until_stopped, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.5)
    finally:
        c.stop()
        done.set()
    for t in threads:
        t.join(timeout=30)
    assert not wrong, wrong


def test_a_request_that_wakes_the_holder_is_served_by_that_wake_up(bins, pack, source, tmp_path):
    """A peer's request wakes the holder's sleeping communication thread
    through the MPI library's fds, and the round of progress after that
    wake-up finds it. MPI_Iprobe drives progress only after it found
    nothing, so the probe that reads a request off the socket reports no
    message; a thread that slept again then waited for its sleep's timeout
    (up to 2 ms) with the request sitting in the library, for every request
    (status counters: idle fd wake-ups, and timeouts that found work)."""
    # No polling after activity: every request arrives while the holder sleeps.
    c, ds_id, remote = remote_pair(bins, pack, tmp_path, "--comm-spin-us", "0")
    try:
        assert remote, "rank 1 holds no file"
        with c.client(0) as cl:
            reads = 0
            while reads < 150:
                for p, n in remote:
                    assert cl.read(n["id"], ds_id) == (source / p).read_bytes(), p
                    reads += 1
        with c.client(1) as cl:
            st = cl.status()
        served = int(st["remote_served"])
        assert served >= 150, st
        woken, idle, missed = (int(st[k]) for k in ("comm_woken_by_fd", "comm_fd_wakes_idle", "comm_missed_wakes"))
        assert woken >= served // 2, f"requests did not wake the holder through the fds: {st}"
        assert idle <= served // 10, f"{idle} of {woken} fd wake-ups found nothing to do ({served} requests served)"
        assert missed <= served // 10, f"{missed} sleeps' timeouts found work no fd announced ({served} requests served)"
    finally:
        c.stop()


def _remote_reads_then_status(c, remote, source, reads):
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


def test_the_communication_thread_polls_between_requests_while_a_cpu_is_free(bins, pack, source, tmp_path):
    """After a message the communication thread polls MPI for
    --comm-spin-us (default 200 µs) before it sleeps, while no runnable
    thread waits for a CPU: a reader's next request then finds the holder
    polling instead of waking it through the fds (a wake-up costs ~40 µs
    on a VM whose idle vCPUs halt). With --comm-spin-us 0 every request
    wakes the holder (the test above). The polling threads count
    themselves on the host's board in /dev/shm, which the stop removes."""
    c, ds_id, remote = remote_pair(bins, pack, tmp_path)
    board = Path(str(c.index_path(0)).rsplit("-r", 1)[0] + ".polling")
    try:
        assert remote, "rank 1 holds no file"
        assert board.exists(), f"no polling board at {board}"
        # With --comm-spin-us 0 every request wakes it: 154-163 wake-ups for 150
        # requests in runs here; polling, 38-125: a moment when more threads are
        # runnable than CPUs (the reader, its daemon's threads at work, a kernel
        # thread, another program on this machine) stops a polling period. So
        # up to 3 batches: one of them must show the polling.
        batches, before = [], (0, 0)
        for _ in range(3):
            _, st = _remote_reads_then_status(c, remote, source, 100)
            now = (int(st["remote_served"]), int(st["comm_woken_by_fd"]) + int(st["comm_woken_by_timeout"]))
            served, woken = now[0] - before[0], now[1] - before[1]
            before = now
            assert served >= 100, st
            batches.append((woken, served))
            if woken < served * 9 // 10:
                break
        else:
            pytest.fail(f"(wake-ups of the holder, requests) per batch {batches}: it did not poll between them: {st}")
    finally:
        c.stop()
    assert not board.exists(), f"the stop left {board}"


def _comm_thread_sleeps(pid):
    """Times the communication thread (the daemon's main thread) blocked so far."""
    status = Path(f"/proc/{pid}/task/{pid}/status").read_text()
    return int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M)[1])


def test_the_communication_thread_polls_through_a_large_transfer_while_a_cpu_is_free(bins, pack, source, tmp_path):
    """While a fetch of more than 256 KiB that someone waits for is in
    flight, the requester's communication thread polls MPI (while no thread
    waits for a CPU), however long the transfer: a reply of megabytes
    crosses the socket in many rounds, and a thread asleep between them is
    woken for each, on a CPU that may have halted. With --comm-spin-us 0 it
    sleeps through them."""
    per_file = {}
    for spin in ("200", "0"):
        c, ds_id, remote = remote_pair(bins, pack, tmp_path / f"spin{spin}", "--comm-spin-us", spin)
        try:
            large = [(p, n) for p, n in remote if n["size"] >= 1 << 20]
            assert large, "rank 1 holds no file of 1 MiB or more"
            order = (large * (24 // len(large) + 1))[:24]
            pid = c.pids()[0]
            out = c.local.parent / f"cat-{spin}.out"
            batches = []
            # A moment when more threads are runnable than CPUs stops the
            # polling: up to 3 batches, one of which must show it.
            for _ in range(3):
                before = _comm_thread_sleeps(pid)
                with open(out, "wb") as f:
                    subprocess.run(["cat", *(f"{c.mount}/{p}" for p, _ in order)], env=c.env(0), stdout=f, check=True)
                batches.append((_comm_thread_sleeps(pid) - before) / len(order))
                assert out.read_bytes() == b"".join((source / p).read_bytes() for p, _ in order), "cat read other bytes"
                # (about one sleep per file is the reader's own time between its files)
                if spin == "0" or batches[-1] < 2.5:
                    break
            per_file[spin] = min(batches)
        finally:
            c.stop()
    print(f"sleeps of rank 0's communication thread per remote file of 1-5 MiB: {per_file}")
    # Here: 1.7-1.9 polling (one sleep in the reader's own time between its
    # files, one until the reply's first bytes), 3.9-8.8 with --comm-spin-us 0;
    # 3.3-5.4 when it slept through payloads over 256 KiB.
    assert per_file["200"] < 2.5 and per_file["200"] < per_file["0"], per_file


def _thread_cpus(pid):
    """{thread id: the CPUs it may run on} of every thread of process `pid`."""
    out = {}
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(t.name)] = frozenset(os.sched_getaffinity(int(t.name)))
        except OSError:  # the thread ended meanwhile
            pass
    return out


def _cpu_list(text):
    """The CPUs of a list as `taskset -c` takes it ("0-2,5")."""
    out = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(out)


def test_daemons_sharing_a_host_keep_to_their_own_shares_of_its_cpus(bins, pack, source, tmp_path):
    """Two daemons of one job on this host (as on one node): each keeps every
    thread, MPI's and those it starts later (a connection's, after reads),
    on its own share of the CPUs, the shares disjoint and together all of
    them, as two nodes would be (a launcher that binds ranks, OpenMPI with
    2 ranks, has made such shares already, and the daemons keep them), and
    STATUS `cpus` names that share (a node's programs can be started there).
    With --share-cpus off under a launcher that does not bind (MPICH), every
    thread may run on every CPU."""
    cpus = frozenset(os.sched_getaffinity(0))
    assert len(cpus) >= 2, f"this test needs 2 CPUs or more, it has {sorted(cpus)}"
    for extra in ((), ("--share-cpus", "off")):
        c, ds_id, remote = remote_pair(bins, pack, tmp_path / ("-".join(extra) or "auto"), *extra)
        try:
            statuses = _remote_reads_then_status(c, remote, source, 20)
            shares = []
            for rank, pid in enumerate(c.pids()):
                per_thread = _thread_cpus(pid)
                assert len(per_thread) >= 3, f"rank {rank}: threads {per_thread}"
                kinds = set(per_thread.values())
                assert len(kinds) == 1, f"rank {rank}: its threads may run on different CPUs: {per_thread}"
                shares.append(kinds.pop())
                assert _cpu_list(statuses[rank]["cpus"]) == shares[-1], f"rank {rank}: STATUS {statuses[rank]['cpus']}, threads on {shares[-1]}"
            log = c.log()
        finally:
            c.stop()
        if extra and fs_cluster.MPI == "mpich":
            assert shares == [cpus, cpus], f"--share-cpus off: {shares}, not every CPU {sorted(cpus)}\n{log}"
            assert "keeps its threads" not in log, log
            continue
        assert not shares[0] & shares[1], f"the daemons' CPUs overlap: {shares}\n{log}"
        assert shares[0] | shares[1] == cpus, f"the shares {shares} are not all of {sorted(cpus)}\n{log}"
        if fs_cluster.MPI == "mpich":
            assert "keeps its threads" in log, log


def test_four_daemons_on_one_host_spread_over_its_cpus(bins, pack, tmp_path):
    """Four daemons of one job on this host: each keeps every thread on the
    share of the CPUs fanstore_daemon::cpu_share gives daemon i of 4 (with
    fewer CPUs than daemons, one CPU each, consecutive ranks together, as
    evenly as can be: 2 and 2 on 2 CPUs), unless the launcher bound the
    ranks itself, which the daemon then says and keeps."""
    cpus = sorted(os.sched_getaffinity(0))
    n, k = len(cpus), 4

    def expected(i):
        return frozenset(cpus[i * n // k:(i + 1) * n // k] if n >= k else [cpus[i * n // k]])

    c = start_cluster(bins, pack("none"), tmp_path, nranks=k)
    try:
        with c.client(0) as cl:
            cl.ping()
        log = c.log()
        for rank, pid in enumerate(c.pids()):
            kinds = set(_thread_cpus(pid).values())
            assert len(kinds) == 1, f"rank {rank}: its threads may run on different CPUs: {kinds}"
            if re.search(rf"rank {rank}: .*the launcher bound this one already", log):
                continue
            assert kinds.pop() == expected(rank), f"rank {rank} of {k} on CPUs {cpus}: not on {sorted(expected(rank))}\n{log}"
    finally:
        c.stop()


def test_the_communication_thread_stops_polling_when_threads_wait_for_a_cpu(bins, pack, source, tmp_path):
    """Threads that want every CPU (here busy loops, one more than the CPUs
    the daemons may use, and the reader): the communication threads stop
    polling after a message and sleep, so that they take no CPU from
    them (STATUS comm_spins_stopped), and requests wake the holder through
    the fds again. With polling regardless of the CPUs
    (--comm-spin-while always) no polling would stop."""
    c, ds_id, remote = remote_pair(bins, pack, tmp_path)
    hogs = []
    try:
        assert remote, "rank 1 holds no file"
        busy = "import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end: pass\n"
        hogs = [subprocess.Popen([sys.executable, "-c", busy]) for _ in range(len(os.sched_getaffinity(0)) + 1)]
        st0, st1 = _remote_reads_then_status(c, remote, source, 60)
        for rank, st in ((0, st0), (1, st1)):
            assert int(st["comm_spins_stopped"]) > 0, f"rank {rank} polled on while threads waited for a CPU: {st}"
        served = int(st1["remote_served"])
        assert int(st1["comm_woken_by_fd"]) >= served // 2, f"requests did not wake the holder through the fds: {st1}"
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        c.stop()
