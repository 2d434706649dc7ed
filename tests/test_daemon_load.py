"""fanstore-daemon loads a dataset and serves it: real MPI (`mpiexec -n 4`,
or a singleton), real unix sockets, no preload library. A wire-protocol
client (fs_cluster.Client) asks every rank's daemon for every file of a
generated dataset and compares the bytes with the source tree; the stat
fields are checked in the index the daemons publish. A corrupt or missing
partition ends the job, naming it."""
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import fs_cluster
from fs_cluster import read_fd, node_state, start_cluster, launch
from fs_daemon import NRANKS, check_every_rank_serves_every_file, files_of, shm_files_of
from fs_daemon import pack, source  # noqa: F401 (fixtures)


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
