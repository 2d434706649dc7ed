"""Where a dataset file's bytes come from on a node (fanstore-core/src/tiers.rs):
small local files are decoded by the client from the mapped partition copy, other
files become named files (extracted or copied) that later opens use directly.
"""
import os
import time
import subprocess
import sys
from pathlib import Path

from fs_cluster import cluster_factory, node_state, read_index  # noqa: F401 (fixture)
from fs_prep import pack

READ = "import sys\nfor p in sys.argv[1:]:\n    open(p, 'rb').read()\n"


def read_all(c, node, paths):
    return subprocess.run([sys.executable, "-c", READ, *paths], env=c.env(node=node),
                          capture_output=True, text=True, timeout=120)


SAME_BYTES = "import sys\nfor p, n in zip(sys.argv[1::2], sys.argv[2::2]):\n" \
             "    assert open(p, 'rb').read() == open(n, 'rb').read(), p\n"


def check_bytes(c, node, src, names):
    """A process on `node` reads each of `names` through the mount and compares it with its file in `src`."""
    args = [a for n in names for a in (f"{c.mount}/{n}", str(src / n))]
    r = subprocess.run([sys.executable, "-c", SAME_BYTES, *args], env=c.env(node=node), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def random_dataset(tmp_path, bins, count, seed, partitions):
    """`count` files of ~3 KB of random bytes (uncompressed, small: decoded by the client), packed."""
    import random
    rng = random.Random(seed)
    src = tmp_path / "src"
    src.mkdir()
    for i in range(count):
        (src / f"r{i:02d}.bin").write_bytes(rng.randbytes(3000 + i))
    ds = tmp_path / "ds"
    pack(bins, src, ds, "--partitions", str(partitions), "--compress", "none")
    return src, ds

def make(tmp_path, bins):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(40):
        (src / f"s{i}.txt").write_bytes((f"small {i} " * 30).encode())       # lz4, small
        (src / f"b{i}.txt").write_bytes((f"compressible {i} " * 9000).encode())  # lz4, 150 KB
    ds = tmp_path / "ds"
    pack(bins, src, ds, "--partitions", "4", "--compress", "lz4")
    return src, ds


def opens(c, rank):
    with c.client(rank) as cl:
        return int(cl.status()["opens"])


def test_warm_opens_need_no_message(cluster_factory, bins, tmp_path):
    """Every file read once on node 0 (remote or large compressed: the daemon makes a copy;
    small local: decoded in the client); a second process then reads them all with no OPEN."""
    src, ds = make(tmp_path, bins)
    # Remote files stay remote here (each read asks the daemon): with the default
    # `--replicate-on-read auto` a few remote reads of these small files would
    # fetch their partition whole (tests/test_prefetch.py), and these reads in
    # order would be fetched ahead (tests/test_read_ahead.py).
    c = cluster_factory(ds, nranks=2, extra_args=["--replicate-on-read", "off", "--read-ahead", "0"])
    _, nodes = read_index(ds / "manifest.fsm")
    node = next(r for r in (0, 1) if nodes["s0.txt"]["partition"] in node_state(c.runtime, r)["local"])
    local = node_state(c.runtime, node)["local"]
    names = sorted(p.name for p in src.iterdir())
    # Small or compressed files of a local partition: decoded by the client.
    decoded = [n for n in names if (nodes[n]["size"] < 65536 or nodes[n]["codec"] != 0) and nodes[n]["partition"] in local]
    assert decoded and len(decoded) < len(names)
    paths = [f"{c.mount}/{n}" for n in names]
    r = read_all(c, node, paths)
    assert r.returncode == 0, r.stderr
    assert opens(c, node) == len(names) - len(decoded), "small and compressed local files are decoded by the client"
    r = read_all(c, node, paths)
    assert r.returncode == 0, r.stderr
    assert opens(c, node) == len(names) - len(decoded), "warm files are opened directly"
    # The prefill copies small and compressed local files in the background: then even their first open is
    # direct. Large ones (64 KiB or more) go to the local disk (tier 1, the extracted path), small ones to the
    # copy directory in memory (tier 2).
    want = {n: 1 if nodes[n]["size"] >= 65536 else 2 for n in decoded}
    assert set(want.values()) == {1, 2}
    tiers = Path(node_state(c.runtime, node)["index_path"][:-len(".index")] + ".tiers").read_bytes()
    deadline = time.monotonic() + 20
    while any(tiers[64 + nodes[n]["id"]] != want[n] for n in decoded) and time.monotonic() < deadline:
        time.sleep(0.1)
        tiers = Path(node_state(c.runtime, node)["index_path"][:-len(".index")] + ".tiers").read_bytes()
    assert all(tiers[64 + nodes[n]["id"]] == want[n] for n in decoded), c.log()
    with c.client(node) as cl:
        st = cl.status()
    assert int(st["remote_sent"]) > 0 and 0 < int(st["remote_p50_us"]) <= int(st["remote_p99_us"]), st
    assert float(st["remote_mbps"]) > 0, st
    table = c.cli("status").stdout
    assert "remote p50 us" in table and "remote MB/s" in table, table
    # And the bytes are the files' own.
    check_bytes(c, node, src, names)


def test_a_damaged_partition_copy_is_eio_not_wrong_bytes(cluster_factory, bins, tmp_path):
    src, ds = make(tmp_path, bins)
    c = cluster_factory(ds, nranks=1, extra_args=["--prefill-mem", "0"])  # nothing copied before the damage
    _, nodes = read_index(ds / "manifest.fsm")
    victim = nodes["s7.txt"]
    copy = Path(node_state(c.runtime, 0)["local_dir"]) / "parts" / f"part-{victim['partition']:06d}.fsp"
    os.chmod(copy, 0o600)
    with open(copy, "r+b") as f:
        f.seek(victim["payload_offset"] + 2)
        b = f.read(1)
        f.seek(victim["payload_offset"] + 2)
        f.write(bytes([b[0] ^ 0x40]))
    probe = "import errno, sys\ntry:\n    open(sys.argv[1], 'rb').read()\n    print('read')\n" \
            "except OSError as e:\n    print(errno.errorcode[e.errno])\n"
    r = subprocess.run([sys.executable, "-c", probe, f"{c.mount}/s7.txt"], env=c.env(node=0),
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "EIO", (r.stdout, r.stderr)
    r = subprocess.run([sys.executable, "-c", probe, f"{c.mount}/s8.txt"], env=c.env(node=0),
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "read", (r.stdout, r.stderr)
    # A large compressed file is decoded by the client too: the same rule.
    big = nodes["b7.txt"]
    assert big["codec"] != 0 and big["size"] >= 65536
    copy = Path(node_state(c.runtime, 0)["local_dir"]) / "parts" / f"part-{big['partition']:06d}.fsp"
    os.chmod(copy, 0o600)
    with open(copy, "r+b") as f:
        f.seek(big["payload_offset"] + big["stored_len"] // 2)
        b = f.read(1)
        f.seek(big["payload_offset"] + big["stored_len"] // 2)
        f.write(bytes([b[0] ^ 0x01]))
    r = subprocess.run([sys.executable, "-c", probe, f"{c.mount}/b7.txt"], env=c.env(node=0),
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "EIO", (r.stdout, r.stderr)


def copies_after_one_read(c, src, nodes, big, small):
    """Reads big + small once on node 0 (decoded by the client), waits for the WARM copies, checks that
    later reads open them with no message and get the files' bytes; returns the tier of each file."""
    tiers_path = Path(node_state(c.runtime, 0)["index_path"][:-len(".index")] + ".tiers")
    tier = lambda n: tiers_path.read_bytes()[64 + nodes[n]["id"]]  # noqa: E731
    assert all(tier(n) == 0 for n in big + small)
    r = read_all(c, 0, [f"{c.mount}/{n}" for n in big + small])
    assert r.returncode == 0, r.stderr
    assert opens(c, 0) == 0, "decoded by the client"
    deadline = time.monotonic() + 20
    while any(tier(n) == 0 for n in big + small) and time.monotonic() < deadline:
        time.sleep(0.05)
    tiers = {n: tier(n) for n in big + small}
    assert all(tiers.values()), (tiers, c.log()[-3000:])
    # Later reads: the copies, with the files' own bytes, still no message.
    check_bytes(c, 0, src, big + small)
    assert opens(c, 0) == 0
    return tiers


def test_a_compressed_file_decoded_by_a_client_gets_a_node_copy(cluster_factory, bins, tmp_path):
    """The first read of a compressed local file is decoded by the client (no OPEN); its WARM hint
    makes the daemon copy it in the background (prefill off here), so later reads open the copy:
    on the local disk at the file's extraction path when of 64 KiB or more (it reads back faster
    from the local file system's page cache), in the copy directory in memory when smaller."""
    src, ds = make(tmp_path, bins)
    c = cluster_factory(ds, nranks=1, extra_args=["--prefill-mem", "0"])
    _, nodes = read_index(ds / "manifest.fsm")
    big = [n for n in sorted(nodes) if n.startswith("b") and nodes[n]["codec"] != 0][:5]
    small = [n for n in sorted(nodes) if n.startswith("s") and nodes[n]["codec"] != 0][:5]
    assert len(big) == 5 and len(small) == 5
    tiers = copies_after_one_read(c, src, nodes, big, small)
    assert [tiers[n] for n in big] == [1] * 5 and [tiers[n] for n in small] == [2] * 5, tiers
    local = Path(node_state(c.runtime, 0)["local_dir"])
    for n in big:
        i = nodes[n]["id"]
        assert (local / "in" / f"{i & 0xff:02x}" / str(i)).read_bytes() == (src / n).read_bytes()
    with c.client(0) as cl:
        st = cl.status()
    assert int(st["cache_disk_bytes"]) >= sum(nodes[n]["size"] for n in big), st


def test_cache_disk_0_keeps_every_copy_in_memory(cluster_factory, bins, tmp_path):
    src, ds = make(tmp_path, bins)
    c = cluster_factory(ds, nranks=1, extra_args=["--prefill-mem", "0", "--cache-disk", "0"])
    _, nodes = read_index(ds / "manifest.fsm")
    big = [n for n in sorted(nodes) if n.startswith("b") and nodes[n]["codec"] != 0][:3]
    tiers = copies_after_one_read(c, src, nodes, big, [])
    assert [tiers[n] for n in big] == [2] * 3, tiers
    with c.client(0) as cl:
        assert int(cl.status()["cache_disk_bytes"]) == 0


def test_small_files_get_copies_in_the_free_room_and_the_others_are_declined(cluster_factory, bins, tmp_path):
    """Small uncompressed local files decoded by the client get node copies too (a later open is a plain
    open, not a memfd filled per open), but only in the copy directory's free room: with room for 8 copies
    (32 KiB, 4 KiB each), 8 of 30 files get one and the other 22 are marked declined (tier 5) without
    evicting anything (a training epoch would hit as many copies either way, and pay a copy per miss).
    Later reads of every file send no hint and no OPEN, and give the files' bytes. The reader ends with
    os._exit: the hints still queued in the process are sent then, once (a fork child sends none)."""
    src, ds = random_dataset(tmp_path, bins, 30, seed=5, partitions=1)
    c = cluster_factory(ds, nranks=1, extra_args=["--prefill-mem", "0", "--cache-mem", "32K"])
    _, nodes = read_index(ds / "manifest.fsm")
    names = sorted(p.name for p in src.iterdir())
    tiers_path = Path(node_state(c.runtime, 0)["index_path"][:-len(".index")] + ".tiers")
    tiers = lambda: [tiers_path.read_bytes()[64 + nodes[n]["id"]] for n in names]  # noqa: E731
    assert set(tiers()) == {0}
    # The hints go in batches; the last one when the process ends, here by os._exit (as a DataLoader
    # worker does), and a fork child sends none of its parent's.
    read_exit = "import os, sys\nfor p in sys.argv[1:]:\n    open(p, 'rb').read()\n" \
                "pid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\nos._exit(0)\n"
    r = subprocess.run([sys.executable, "-c", read_exit, *[f"{c.mount}/{n}" for n in names]], env=c.env(node=0),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert opens(c, 0) == 0, "decoded by the client"
    deadline = time.monotonic() + 20
    while 0 in tiers() and time.monotonic() < deadline:
        time.sleep(0.05)
    got = tiers()
    assert sorted(got) == [2] * 8 + [5] * 22, (got, c.log()[-3000:])
    with c.client(0) as cl:
        st = cl.status()
    assert (st["warm_hints"], st["copies_declined"], st["cache_evictions"]) == ("30", "22", "0"), st
    for _ in range(2):
        check_bytes(c, 0, src, names)
    with c.client(0) as cl:
        st = cl.status()
    assert (st["warm_hints"], st["opens"], st["cache_evictions"]) == ("30", "0", "0"), st
    assert tiers() == got

def test_copies_of_files_of_replicated_partitions_are_declined_too(cluster_factory, bins, tmp_path):
    """Small files of a partition replicated here after start (tier 3) are decoded by the client too; their
    copies take only the copy directory's free room, and the others are marked declined with the partition
    still known to be here (tier 6): later reads decode them with no OPEN, no remote fetch, and no hint.
    A copy evicted later (by the daemon's own copies of other files) gives its file back its tier 3, so
    clients go on decoding it themselves rather than asking the daemon."""
    src, ds = random_dataset(tmp_path, bins, 40, seed=6, partitions=2)
    c = cluster_factory(ds, nranks=2, extra_args=["--prefetch-remote", "all", "--prefill-mem", "0", "--cache-mem", "32K"])
    ds_id, nodes = read_index(ds / "manifest.fsm")
    local = node_state(c.runtime, 0)["local"]
    remote = sorted(n for n, v in nodes.items() if v["kind"] == 2 and v["partition"] not in local)
    assert len(remote) > 8
    tiers_path = Path(node_state(c.runtime, 0)["index_path"][:-len(".index")] + ".tiers")
    tiers = lambda: [tiers_path.read_bytes()[64 + nodes[n]["id"]] for n in remote]  # noqa: E731
    deadline = time.monotonic() + 60
    while set(tiers()) != {3} and time.monotonic() < deadline:
        time.sleep(0.1)
    assert set(tiers()) == {3}, c.log()[-3000:]
    r = read_all(c, 0, [f"{c.mount}/{n}" for n in remote])
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 20
    while 3 in tiers() and time.monotonic() < deadline:
        time.sleep(0.05)
    got = tiers()
    assert sorted(got) == [2] * 8 + [6] * (len(remote) - 8), (got, c.log()[-3000:])
    with c.client(0) as cl:
        st = cl.status()
    assert (int(st["warm_hints"]), int(st["copies_declined"]), st["cache_evictions"]) == \
        (len(remote), len(remote) - 8, "0"), st
    check_bytes(c, 0, src, remote)
    with c.client(0) as cl:
        after = cl.status()
    assert (after["warm_hints"], after["opens"], after["remote_sent"]) == (st["warm_hints"], "0", st["remote_sent"]), after
    # Ten OPENs of node 0's own files: the daemon's copies of them evict the eight.
    own = sorted(n for n, v in nodes.items() if v["kind"] == 2 and v["partition"] in local)[:10]
    with c.client(0) as cl:
        for n in own:
            assert cl.read(nodes[n]["id"], ds_id) == (src / n).read_bytes(), n
        evicted = int(cl.status()["cache_evictions"])
    assert evicted >= 8, evicted
    assert sorted(tiers()) == [3] * 8 + [6] * (len(remote) - 8), tiers()
    check_bytes(c, 0, src, remote)
    with c.client(0) as cl:
        last = cl.status()
    assert (last["opens"], last["remote_sent"]) == (str(len(own)), st["remote_sent"]), last

def test_large_local_files_are_extracted_ahead_of_their_first_open(cluster_factory, bins, tmp_path):
    """After ready the daemon extracts the large uncompressed files of its own partitions in the
    background (--extract-ahead, default: up to half the local file system's free space), so a
    first epoch opens plain files with no OPEN message and no extraction in its path; a byte
    budget stops it early, and 0 turns it off (each first open then extracts, one OPEN each)."""
    import random
    rng = random.Random(3)
    src = tmp_path / "src"
    src.mkdir()
    for i in range(12):
        (src / f"big{i:02d}.bin").write_bytes(rng.randbytes(200_000 + i))  # raw, >= 64 KiB: extracted
    for i in range(5):
        (src / f"small{i}.bin").write_bytes(rng.randbytes(1000))  # decoded by the client, never extracted
    ds = tmp_path / "ds"
    pack(bins, src, ds, "--partitions", "2", "--compress", "none")
    _, nodes = read_index(ds / "manifest.fsm")
    big = sorted(n for n in nodes if n.startswith("big"))
    paths = [f"/{n}" for n in big]

    def extraction_done(c):
        deadline = time.monotonic() + 60
        while "ahead of their first open" not in c.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "ahead of their first open" in c.log(), c.log()[-3000:]
        with c.client(0) as cl:
            return int(cl.status()["extracted_ahead"])

    def tiers(c):
        t = Path(node_state(c.runtime, 0)["index_path"][:-len(".index")] + ".tiers").read_bytes()
        return [t[64 + nodes[n]["id"]] for n in big]

    c = cluster_factory(ds, nranks=1, subdir="auto")
    assert extraction_done(c) == len(big)
    assert tiers(c) == [1] * len(big), "every large file extracted (tier 1) before any open"
    check_bytes(c, 0, src, big)
    assert opens(c, 0) == 0, "the first epoch opened the extracted files directly"
    c.stop()

    # A budget of two and a half files: the two first of partition order, then it stops.
    c = cluster_factory(ds, nranks=1, subdir="budget", extra_args=["--extract-ahead", "500000"])
    assert extraction_done(c) == 2
    assert sorted(tiers(c)) == [0] * (len(big) - 2) + [1, 1]
    r = read_all(c, 0, [c.mount + p for p in paths])
    assert r.returncode == 0, r.stderr
    assert opens(c, 0) == len(big) - 2, "the files not extracted ahead are extracted by their OPEN"
    c.stop()

    c = cluster_factory(ds, nranks=1, subdir="off", extra_args=["--extract-ahead", "0"])
    time.sleep(1)
    with c.client(0) as cl:
        assert int(cl.status()["extracted_ahead"]) == 0
    assert tiers(c) == [0] * len(big)
    r = read_all(c, 0, [c.mount + p for p in paths])
    assert r.returncode == 0, r.stderr
    assert opens(c, 0) == len(big)
    assert tiers(c) == [1] * len(big)
