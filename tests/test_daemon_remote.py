"""Files between ranks: replication (--replication, --replicate-dir), remote
reads through dead clients, hung and failing holders, the copies a remote
read makes and reuses, and which thread posts and answers a remote OPEN."""
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from fs_cluster import read_fd, node_state, start_cluster
from fs_daemon import NRANKS, check_every_rank_serves_every_file, files_of, remote_pair
from fs_daemon import pack, source  # noqa: F401 (fixtures)


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
