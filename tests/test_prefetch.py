"""Background replication of remote partitions (`--prefetch-remote`,
fanstore-daemon/src/replicate.rs): after ready, each daemon fetches the
partitions other ranks hold, verifies them like a loaded partition, and from
then on serves their files as local ones; clients decode small files of a
replicated partition themselves (tier map byte 3), with no message.
"""
import hashlib
import random
import subprocess
import sys
import time
from pathlib import Path

from fs_cluster import cluster_factory, node_state, read_index, start_cluster, tmpfs_local_dir  # noqa: F401 (fixture)
from fs_prep import pack

DIGESTS = ("import hashlib, sys\n"
           "for p in sys.argv[1:]:\n"
           "    print(hashlib.sha256(open(p, 'rb').read()).hexdigest(), p)\n")


def make(tmp_path, bins, parts=8):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(60):
        (src / f"s{i}.txt").write_bytes((f"small {i} " * 40).encode())              # lz4, < 64 KiB
        (src / f"r{i}.bin").write_bytes(random.Random(i).randbytes(83_000))  # incompressible: stored raw
        (src / f"c{i}.txt").write_bytes((f"compressible {i} " * 6000).encode())  # lz4, 100 KB
    ds = tmp_path / "ds"
    pack(bins, src, ds, "--partitions", str(parts), "--compress", "lz4")
    return src, ds


def expected_replica(ds, p, nodes):
    """Partition p as a replica holds it: the dataset's bytes, with holes
    (zeros) where its large uncompressed files' payloads were (those go
    straight to their own extracted files)."""
    b = bytearray((ds / f"part-{p:06d}.fsp").read_bytes())
    for v in nodes.values():
        if v.get("kind") == 2 and v["partition"] == p and v["codec"] == 0 and v["size"] >= 65536:
            b[v["payload_offset"]:v["payload_offset"] + v["stored_len"]] = bytes(v["stored_len"])
    return bytes(b)


def extracted(local, nodes, src, p):
    """The large uncompressed files of partition p, each in its own file
    under local/in/, byte for byte; returns how many."""
    large = [n for n, v in nodes.items() if v.get("kind") == 2 and v["partition"] == p and v["codec"] == 0 and v["size"] >= 65536]
    for n in large:
        i = nodes[n]["id"]
        assert (local / "in" / f"{i & 0xff:02x}" / str(i)).read_bytes() == (src / n).read_bytes(), n
    return len(large)


def status(c, rank):
    with c.client(rank) as cl:
        return cl.status()


def wait_replicated(c, rank, want, timeout=60):
    deadline = time.monotonic() + timeout
    st = status(c, rank)
    while int(st["replicated_parts"]) < want and time.monotonic() < deadline:
        time.sleep(0.1)
        st = status(c, rank)
    assert int(st["replicated_parts"]) == want, f"{st}\n--- log ---\n{c.log()[-4000:]}"
    return st


def digests(c, node, paths):
    r = subprocess.run([sys.executable, "-c", DIGESTS, *paths], env=c.env(node=node),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def expected_digests(src, mount, names):
    """What `digests` prints for `names` when every byte is right."""
    return "".join(f"{hashlib.sha256((src / n).read_bytes()).hexdigest()} {mount}/{n}\n" for n in names)


def remote_files(c, ds, node):
    """Rank `node`'s state, the manifest's nodes, and the files of each
    partition the rank does not hold (partition -> sorted paths)."""
    st = node_state(c.runtime, node)
    _, nodes = read_index(ds / "manifest.fsm")
    remote = [p for p in range(8) if p not in st["local"]]
    return st, nodes, {p: sorted(n for n, v in nodes.items() if v["partition"] == p) for p in remote}


def test_every_remote_partition_is_replicated_and_read_without_remote_fetches(cluster_factory, bins, tmp_path):
    src, ds = make(tmp_path, bins)
    # (--extract-ahead 0: the large raw files of the node's own partitions are
    # extracted by their first OPEN, unlike those of the replicas.)
    c = cluster_factory(ds, nranks=4, extra_args=["--prefetch-remote", "all", "--prefill-mem", "0", "--extract-ahead", "0"])
    node = 2
    st, nodes, by_part = remote_files(c, ds, node)
    remote = list(by_part)
    assert len(remote) == 6
    s = wait_replicated(c, node, len(remote))
    part_bytes = sum((ds / f"part-{p:06d}.fsp").stat().st_size for p in remote)
    assert int(s["replicated_bytes"]) == part_bytes, s
    table = c.cli("status").stdout
    assert "prefetched" in table.splitlines()[0], table
    # Each replica is the dataset's partition, its large raw files written
    # once, to their own (extracted) files instead.
    local = Path(st["local_dir"])
    for p in remote:
        assert (local / "parts" / f"part-{p:06d}.fsp").read_bytes() == expected_replica(ds, p, nodes)
    assert sum(extracted(local, nodes, src, p) for p in remote) > 0
    assert not list((local / "parts").glob("*.fetch")) and not list((local / "in").rglob("*.fetch")), "no partial fetch is left"
    # Small files of replicated partitions are marked for the client (tier byte 3).
    tiers = Path(st["index_path"][:-len(".index")] + ".tiers").read_bytes()
    small_remote = [n for n, v in nodes.items() if v["partition"] in remote and v["size"] < 65536]
    assert small_remote and all(tiers[64 + nodes[n]["id"]] == 3 for n in small_remote)
    before = status(c, node)
    names = sorted(p.name for p in src.iterdir())
    got = digests(c, node, [f"{c.mount}/{n}" for n in names])
    want = expected_digests(src, c.mount, names)
    assert got == want
    after = status(c, node)
    assert int(after["remote_sent"]) == int(before["remote_sent"]), "no file crossed MPI on its own"
    large_raw = [n for n in names if nodes[n]["size"] >= 65536 and nodes[n]["codec"] == 0]
    assert large_raw and any(nodes[n]["codec"] != 0 and nodes[n]["size"] >= 65536 for n in names)
    local_large = [n for n in large_raw if nodes[n]["partition"] in st["local"]]
    assert local_large and len(local_large) < len(large_raw)
    assert int(after["opens"]) - int(before["opens"]) == len(local_large), \
        "small and compressed files are decoded by the client, and the fetch wrote the large raw files of " \
        "replicated partitions to their own files: only those of the node's own partitions (extracted once) ask the daemon"
    # The other nodes read the same bytes.
    assert digests(c, 0, [f"{c.mount}/{n}" for n in names]).replace(f"{c.mount}", "") == want.replace(f"{c.mount}", "")


def test_the_budget_bounds_what_is_replicated(cluster_factory, bins, tmp_path):
    src, ds = make(tmp_path, bins)
    sizes = sorted((ds / f"part-{p:06d}.fsp").stat().st_size for p in range(8))
    budget = sizes[-1]  # room for any one remote partition, never for all four
    c = cluster_factory(ds, nranks=2, extra_args=["--prefetch-remote", str(budget)])
    # Each rank prefetches on its own: wait for both to say they are done
    # (waiting for the first one's line only let rank 1 be checked while it
    # still fetched: 0 replicated, in one CI run).
    deadline = time.monotonic() + 60
    while not all(f"rank {r}: prefetched" in c.log() for r in (0, 1)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for r in (0, 1):
        s = status(c, r)
        assert 1 <= int(s["replicated_parts"]) < 4 and int(s["replicated_bytes"]) <= budget, s
    # Files of partitions not replicated are still read (remotely), with the right bytes.
    names = sorted(p.name for p in src.iterdir())
    got = digests(c, 0, [f"{c.mount}/{n}" for n in names])
    assert got == expected_digests(src, c.mount, names)


def test_prefetch_off_by_default_and_stop_during_prefetch(cluster_factory, bins, tmp_path):
    src, ds = make(tmp_path, bins)
    c = cluster_factory(ds, nranks=2)
    assert int(status(c, 0)["replicated_parts"]) == 0
    c.stop()
    c2 = cluster_factory(ds, nranks=2, extra_args=["--prefetch-remote", "all"], subdir="again")
    c2.stop()  # at once, perhaps mid-fetch: a clean stop, nothing left behind
    assert not c2.local.exists() or not any(c2.local.rglob("*.fetch"))


def test_replicate_on_read_fetches_the_partitions_read_and_no_other(cluster_factory, bins, tmp_path):
    """`--replicate-on-read`: the first remote read of a file asks for its
    whole partition; from then on the partition's files are local (no file
    crosses MPI alone), while partitions nothing read stay remote."""
    src, ds = make(tmp_path, bins)
    c = cluster_factory(ds, nranks=2, extra_args=["--replicate-on-read", "all", "--prefill-mem", "0"])
    node = 0
    st, nodes, by_part = remote_files(c, ds, node)
    remote = list(by_part)
    first, second = remote[0], remote[3]
    assert int(status(c, node)["replicated_parts"]) == 0, "nothing is fetched before a read"
    one = by_part[first][0]
    assert digests(c, node, [f"{c.mount}/{one}"]) == f"{hashlib.sha256((src / one).read_bytes()).hexdigest()} {c.mount}/{one}\n"
    s = wait_replicated(c, node, 1)
    local = Path(st["local_dir"])
    assert (local / "parts" / f"part-{first:06d}.fsp").read_bytes() == expected_replica(ds, first, nodes)
    extracted(local, nodes, src, first)
    assert int(s["replicated_bytes"]) == (ds / f"part-{first:06d}.fsp").stat().st_size, s
    before = status(c, node)
    got = digests(c, node, [f"{c.mount}/{n}" for n in by_part[first]])
    assert got == expected_digests(src, c.mount, by_part[first])
    assert int(status(c, node)["remote_sent"]) == int(before["remote_sent"]), "the replicated partition's files are local"
    # A read of another partition replicates that one too; the rest stay remote.
    digests(c, node, [f"{c.mount}/{by_part[second][0]}"])
    wait_replicated(c, node, 2)
    time.sleep(0.5)
    assert int(status(c, node)["replicated_parts"]) == 2
    assert sorted(q.name for q in (local / "parts").glob("part-*")) == \
        sorted([f"part-{p:06d}.fsp" for p in st["local"]] + [f"part-{first:06d}.fsp", f"part-{second:06d}.fsp"])
    # The rank nothing was read on fetched nothing.
    assert int(status(c, 1)["replicated_parts"]) == 0


def test_by_default_a_partition_is_replicated_once_its_remote_reads_cost_as_much_as_its_fetch(cluster_factory, bins, tmp_path):
    """The default, `--replicate-on-read auto` (ski rental in time): a node
    fetches a remote partition whole once its remote reads of the partition's
    files have taken as long as the fetch would, each read counted as the
    bytes the bulk transfer moves in its round trip (at least its own). A read
    of a small file is nearly all round trip: a few hundred of them, whose own
    bytes are a small part of the partition, fetch a partition of 8 MiB.
    Counting bytes alone, they never would. One read does not."""
    src = tmp_path / "src"
    (src / "big").mkdir(parents=True)
    (src / "small").mkdir()
    for i in range(4):
        (src / "big" / f"b{i}.bin").write_bytes(random.Random(i).randbytes(4 << 20))
    for i in range(2000):
        (src / "small" / f"s{i:04d}.txt").write_bytes(random.Random(1000 + i).randbytes(200))
    ds = tmp_path / "ds"
    pack(bins, src, ds, "--partitions", "2")
    c = cluster_factory(ds, nranks=2, extra_args=["--cache-mem", "0", "--prefill-mem", "0"])
    node = 0
    st = node_state(c.runtime, node)
    _, nodes = read_index(ds / "manifest.fsm")
    (far,) = [p for p in range(2) if p not in st["local"]]
    small = sorted(n for n, v in nodes.items() if v.get("kind") == 2 and v["partition"] == far and v["size"] == 200)
    size = (ds / f"part-{far:06d}.fsp").stat().st_size
    assert len(small) >= 400 and size >= 4 << 20, (len(small), size)
    assert 400 * 200 < size / 50, "their own bytes are a small part of the partition"

    one = digests(c, node, [f"{c.mount}/{small[0]}"])
    assert one == expected_digests(src, c.mount, small[:1])
    time.sleep(0.5)
    assert int(status(c, node)["replicated_parts"]) == 0, "one remote read does not fetch the partition"

    before = status(c, node)
    paths = [f"{c.mount}/{n}" for n in small[1:400]]
    assert digests(c, node, paths) == expected_digests(src, c.mount, small[1:400])
    s = wait_replicated(c, node, 1)
    assert int(s["replicated_bytes"]) == size, s
    assert int(s["remote_sent"]) - int(before["remote_sent"]) < 399, "the partition arrived before the pass ended"
    assert f"partition {far} ({size} B) asked for whole" in c.log(), c.log()[-3000:]
    nodes_big = [n for n, v in nodes.items() if v.get("kind") == 2 and v["partition"] == far and v["size"] > 200]
    before = status(c, node)
    rest = small[400:] + sorted(nodes_big)
    assert digests(c, node, [f"{c.mount}/{n}" for n in rest]) == expected_digests(src, c.mount, rest)
    assert int(status(c, node)["remote_sent"]) == int(before["remote_sent"]), "the rest of the partition is local"
    assert int(status(c, 1)["replicated_parts"]) == 0, "the rank nothing was read on fetched nothing"


def test_replicate_on_read_within_its_budget_and_beside_prefetch(cluster_factory, bins, tmp_path):
    """A budget of the smallest partition replicates one, however many are read; with
    --prefetch-remote as well, no partition is fetched twice (both threads
    claim a partition before fetching it) and every byte reads back right."""
    src, ds = make(tmp_path, bins)
    smallest = min((ds / f"part-{p:06d}.fsp").stat().st_size for p in range(1, 8, 2))  # rank 1's: remote on rank 0
    c = cluster_factory(ds, nranks=2, extra_args=["--replicate-on-read", str(smallest), "--prefill-mem", "0"])
    names = sorted(p.name for p in src.iterdir())
    want = expected_digests(src, c.mount, names)
    assert digests(c, 0, [f"{c.mount}/{n}" for n in names]) == want
    wait_replicated(c, 0, 1)
    time.sleep(1.0)
    s = status(c, 0)
    assert int(s["replicated_parts"]) == 1 and int(s["replicated_bytes"]) == smallest, s
    c.stop()
    # Partitions large enough (16 MiB each) that reads right after ready
    # meet the prefetch thread mid-fetch, so both threads want the same ones.
    big_src = tmp_path / "big"
    big_src.mkdir()
    for i in range(16):
        (big_src / f"b{i:02d}.bin").write_bytes(random.Random(100 + i).randbytes(8 << 20))
        (big_src / f"t{i:02d}.txt").write_bytes((f"tiny {i} " * 50).encode())
    big = tmp_path / "bigds"
    pack(bins, big_src, big, "--partitions", "8", "--compress", "lz4")
    c2 = cluster_factory(big, nranks=2, extra_args=["--replicate-on-read", "all", "--prefetch-remote", "all"], subdir="both")
    names = sorted(p.name for p in big_src.iterdir())
    want = "".join(f"{hashlib.sha256((big_src / n).read_bytes()).hexdigest()} {c2.mount}/{n}\n" for n in names)
    assert digests(c2, 0, [f"{c2.mount}/{n}" for n in names]) == want
    wait_replicated(c2, 0, 4)
    time.sleep(0.5)
    assert int(status(c2, 0)["replicated_parts"]) == 4, "each partition fetched once"
    assert "replication of partition" not in c2.log(), c2.log()[-3000:]


def test_a_damaged_large_file_on_the_holder_is_refused_not_replicated(cluster_factory, bins, tmp_path):
    """A byte flipped inside a large uncompressed payload of the holder's
    copy: that payload goes straight to its own file, so the partition's own
    check skips it; the fetch must check it against the manifest itself,
    refuse the whole partition, and leave nothing behind."""
    src, ds = make(tmp_path, bins, parts=2)
    info, nodes = read_index(ds / "manifest.fsm")
    c = cluster_factory(ds, nranks=2, extra_args=["--replicate-on-read", "all", "--prefill-mem", "0"])
    holder_local = Path(node_state(c.runtime, 1)["local_dir"])
    victim = next(n for n, v in sorted(nodes.items()) if v.get("kind") == 2 and v["partition"] == 1
                  and v["codec"] == 0 and v["size"] >= 65536)
    part = holder_local / "parts" / "part-000001.fsp"
    b = bytearray(part.read_bytes())
    b[nodes[victim]["payload_offset"] + 1000] ^= 0x40
    part.chmod(0o600)
    with open(part, "r+b") as f:  # in place: the holder's mapping sees it
        f.seek(nodes[victim]["payload_offset"] + 1000)
        f.write(bytes([b[nodes[victim]["payload_offset"] + 1000]]))
    other = next(n for n, v in sorted(nodes.items()) if v.get("kind") == 2 and v["partition"] == 1 and n != victim)
    assert digests(c, 0, [f"{c.mount}/{other}"]) == f"{hashlib.sha256((src / other).read_bytes()).hexdigest()} {c.mount}/{other}\n"
    deadline = time.monotonic() + 20
    while "replication of partition 1" not in c.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    log = c.log()
    assert "replication of partition 1" in log and "checksum" in log and str(nodes[victim]["id"]) in log, log[-3000:]
    assert int(status(c, 0)["replicated_parts"]) == 0
    local = Path(node_state(c.runtime, 0)["local_dir"])
    assert not list(local.rglob("*.fetch")) and not (local / "parts" / "part-000001.fsp").exists()
    # The damaged file is never served wrong: EIO (the holder's copy fails its checksum).
    r = subprocess.run(["cat", f"{c.mount}/{victim}"], env=c.env(node=0), capture_output=True)
    assert r.returncode != 0 and r.stdout != (src / victim).read_bytes()


def test_a_full_local_directory_serves_large_files_from_copies(bins, tmp_path):
    """Replicas (or anything else) may leave the local directory full: a
    large file whose extraction then fails with ENOSPC is served from a copy
    in the copy directory instead, never EIO."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(24):
        (src / f"big{i:02d}.bin").write_bytes(random.Random(i).randbytes(1 << 20))
    ds = tmp_path / "ds"
    pack(bins, src, ds, "--partitions", "1")
    with tmpfs_local_dir(tmp_path / "c", "30m", "a small local disk"):
        c = start_cluster(bins, ds, tmp_path / "c", nranks=1, extra_args=["--prefill-mem", "0"])
        try:
            names = sorted(p.name for p in src.iterdir())
            want = expected_digests(src, c.mount, names)
            assert digests(c, 0, [f"{c.mount}/{n}" for n in names]) == want
            log = c.log()
            assert "the local directory is full" in log, log[-3000:]
            assert log.count("the local directory is full") == 1, "said once"
            assert int(status(c, 0)["errors"]) == 0
        finally:
            c.stop()
