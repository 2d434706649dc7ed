"""Read-ahead of remote files read in order (`--read-ahead`,
fanstore-daemon/src/read_ahead.rs): once a node's remote opens follow the
manifest's order, its daemon fetches the next remote files into the copy
directory ahead of the reader (runs of files of one partition in one
message), and the reader opens them as node copies with no message.
Readers out of order start nothing; `--read-ahead 0` and `--cache-mem 0`
turn it off.
"""
import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

from fs_cluster import cluster_factory, node_state, read_index  # noqa: F401 (fixture)
from fs_prep import pack

DIGESTS = ("import hashlib, sys, time\n"
           "pause = float(sys.argv[1])\n"
           "for p in sys.argv[2:]:\n"
           "    print(hashlib.sha256(open(p, 'rb').read()).hexdigest(), p)\n"
           "    time.sleep(pause)\n")


def make(tmp_path, bins):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(96):
        (src / f"f{i:03d}.bin").write_bytes(random.Random(i).randbytes(100_000 + i))
    ds = tmp_path / "ds"
    pack(bins, src, ds, "--partitions", "4", "--compress", "none")
    return src, ds


def status(c, rank):
    with c.client(rank) as cl:
        return {k: int(v) for k, v in cl.status().items() if v.lstrip("-").isdigit()}


def read_in(c, src, node, names, pause=0.0):
    """Reads `names` in this order in one process on `node`, `pause` seconds
    between two files; checks every byte."""
    r = subprocess.run([sys.executable, "-c", DIGESTS, str(pause), *[f"{c.mount}/{n}" for n in names]],
                       env=c.env(node=node), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    want = "".join(f"{hashlib.sha256((src / n).read_bytes()).hexdigest()} {c.mount}/{n}\n" for n in names)
    assert r.stdout == want


def remote_names(c, ds, node):
    _, nodes = read_index(ds / "manifest.fsm")
    local = node_state(c.runtime, node)["local"]
    names = sorted(n for n, v in nodes.items() if v.get("kind") == 2 and v["partition"] not in local)
    return nodes, names


ARGS = ["--replicate-on-read", "off", "--prefill-mem", "0", "--extract-ahead", "0"]


def test_files_read_in_order_are_fetched_ahead_and_opened_as_copies(cluster_factory, bins, tmp_path):
    src, ds = make(tmp_path, bins)
    c = cluster_factory(ds, nranks=2, extra_args=ARGS)
    nodes, remote = remote_names(c, ds, 0)
    assert len(remote) >= 40
    before = status(c, 0)
    # A reader that works 20 ms on each file, as training does: the
    # read-ahead keeps ahead of it even on a loaded machine. (A reader with
    # no work at all catches up with runs in flight on 2 busy CPUs, and its
    # OPENs then wait for them: 13 of 45 once under OpenMPI in CI.)
    read_in(c, src, 0, remote, pause=0.02)
    after = status(c, 0)
    ahead = after["read_ahead"] - before["read_ahead"]
    opened = after["opens"] - before["opens"]
    stored = sum(nodes[n]["stored_len"] for n in remote)
    got = after["remote_bytes_in"] - before["remote_bytes_in"]
    assert stored <= got < stored + 4096 * len(remote), f"every remote file crossed MPI once ({got} B for {stored})"
    # (One message per file without read-ahead; with it, a miss at the end
    # of each window of 2, 4, 8 .. files and runs of up to 1 MiB: 12 or 13
    # here, as the reader catches up with the read-ahead or not.)
    assert after["remote_sent"] - before["remote_sent"] <= len(remote) // 2, \
        "files read ahead cross in runs, several in one message"
    assert ahead >= len(remote) // 2, after
    assert opened <= len(remote) - ahead + 8, \
        f"the files fetched ahead were opened as copies, with no OPEN ({opened} OPENs, {ahead} read ahead)"
    tiers = Path(node_state(c.runtime, 0)["index_path"][:-len(".index")] + ".tiers").read_bytes()
    assert all(tiers[64 + nodes[n]["id"]] == 2 for n in remote), "each one is a node copy now (tier 2)"
    # Nothing was read ahead on the node that read nothing.
    assert status(c, 1)["read_ahead"] == 0
    # `fanstore status` shows the count (right-aligned under its header).
    lines = c.cli("status").stdout.splitlines()
    end = lines[0].index("read ahead") + len("read ahead")
    assert [ln[:end].split()[-1] for ln in lines[1:3]] == [str(after["read_ahead"]), "0"], lines


def test_reads_out_of_order_fetch_nothing_ahead(cluster_factory, bins, tmp_path):
    src, ds = make(tmp_path, bins)
    c = cluster_factory(ds, nranks=2, extra_args=ARGS)
    _, remote = remote_names(c, ds, 0)
    # Backwards: no open follows the one before it.
    read_in(c, src, 0, remote[::-1][:len(remote) // 2])
    st = status(c, 0)
    assert st["read_ahead"] == 0, st
    assert st["opens"] == st["remote_sent"] == len(remote) // 2, st


def test_read_ahead_0_and_cache_mem_0_turn_it_off(cluster_factory, bins, tmp_path):
    src, ds = make(tmp_path, bins)
    for i, extra in enumerate((["--read-ahead", "0"], ["--cache-mem", "0"])):
        c = cluster_factory(ds, nranks=2, subdir=f"off{i}", extra_args=ARGS + extra)
        _, remote = remote_names(c, ds, 0)
        read_in(c, src, 0, remote)
        st = status(c, 0)
        assert st["read_ahead"] == 0, (extra, st)
        assert st["opens"] == st["remote_sent"] == len(remote), (extra, st)
        c.stop()


READ_EACH = ("import sys\n"
             "for p, n in zip(sys.argv[1::2], sys.argv[2::2]):\n"
             "    try:\n"
             "        ok = open(p, 'rb').read() == open(n, 'rb').read()\n"
             "        print('same' if ok else 'DIFFERENT', p)\n"
             "    except OSError as e:\n"
             "        print(f'errno {e.errno}', p)\n")


def test_a_payload_damaged_on_the_holder_is_eio_and_the_rest_of_its_run_is_exact(cluster_factory, bins, tmp_path):
    """A run of files crosses in one message: each file is still checked
    against its own checksum before it becomes a copy. The damaged one is not
    kept: its own OPEN fetches it again and gets EIO; every other byte is right."""
    src, ds = make(tmp_path, bins)
    c = cluster_factory(ds, nranks=2, extra_args=ARGS)
    nodes, remote = remote_names(c, ds, 0)
    victim = remote[len(remote) // 3]
    v = nodes[victim]
    holder = node_state(c.runtime, 1)
    part = Path(holder["local_dir"]) / "parts" / f"part-{v['partition']:06d}.fsp"
    os.chmod(part, 0o600)
    with open(part, "r+b") as f:
        f.seek(v["payload_offset"] + v["stored_len"] // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))
    args = [a for n in remote for a in (f"{c.mount}/{n}", str(src / n))]
    r = subprocess.run([sys.executable, "-c", READ_EACH, *args], env=c.env(node=0), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    want = "".join(f"{'errno 5' if n == victim else 'same'} {c.mount}/{n}\n" for n in remote)
    assert r.stdout == want
    assert status(c, 0)["read_ahead"] >= len(remote) // 2
    assert "fails its checksum" in c.log()


def test_cp_r_of_the_dataset_reads_ahead_and_copies_every_byte(cluster_factory, bins, tmp_path):
    """coreutils `cp -r` walks each directory in name order: the manifest's order."""
    src = tmp_path / "src"
    for d in range(3):
        (src / f"d{d}").mkdir(parents=True)
        for i in range(40):
            (src / f"d{d}" / f"f{i:03d}.bin").write_bytes(random.Random(d * 100 + i).randbytes(70_000 + i))
    ds = tmp_path / "ds"
    pack(bins, src, ds, "--partitions", "4", "--compress", "none")
    c = cluster_factory(ds, nranks=2, extra_args=ARGS)
    out = tmp_path / "out"
    r = subprocess.run(["cp", "-r", f"{c.mount}/.", str(out)], env=c.env(node=0), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["diff", "-r", str(src), str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:]
    _, remote = remote_names(c, ds, 0)
    st = status(c, 0)
    assert st["read_ahead"] >= len(remote) // 2, st


def test_a_hung_holder_gives_eio_and_pauses_read_ahead(cluster_factory, bins, tmp_path):
    """A run or a file that no holder gives pauses read-ahead until a remote
    read succeeds again: the reader's own opens fail alone (EIO), none waits
    for a read-ahead of its file first, and read-ahead asks the hung holder
    at most once, not per open."""
    import signal
    import time
    src, ds = make(tmp_path, bins)
    c = cluster_factory(ds, nranks=2, extra_args=ARGS + ["--read-ahead", "300000", "--remote-timeout", "1"])
    _, remote = remote_names(c, ds, 0)
    read_in(c, src, 0, remote[:2])
    holder = int(node_state(c.runtime, 1)["pid"])
    os.kill(holder, signal.SIGSTOP)
    try:
        args = [a for n in remote[8:14] for a in (f"{c.mount}/{n}", str(src / n))]
        r = subprocess.run([sys.executable, "-c", READ_EACH, *args], env=c.env(node=0), capture_output=True, text=True, timeout=120)
    finally:
        os.kill(holder, signal.SIGCONT)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "".join(f"errno 5 {c.mount}/{n}\n" for n in remote[8:14])
    assert c.log().count("read-ahead of partition") <= 1, c.log()[-3000:]
    # Once the holder answers again (and the pause is over), the same files read right.
    time.sleep(1.5)
    read_in(c, src, 0, remote[8:20])


EVAL_PASS = r'''
import hashlib, os, sys
import torch
from torch.utils.data import DataLoader, Dataset
root = sys.argv[1]
names = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fl in os.walk(root) for f in fl)

class Files(Dataset):
    def __len__(self):
        return len(names)
    def __getitem__(self, i):
        with open(os.path.join(root, names[i]), "rb") as f:
            return names[i], hashlib.sha256(f.read()).hexdigest()

for batch in DataLoader(Files(), batch_size=16, shuffle=False, num_workers=2, collate_fn=lambda b: b):
    for name, digest in batch:
        print(digest, name)
'''


def test_an_unshuffled_torch_dataloader_pass_reads_ahead(cluster_factory, bins, tmp_path, framework_python):
    """An evaluation pass: a torch DataLoader with shuffle=False and 2
    workers, each reading whole batches in order; both streams are followed."""
    src, ds = make(tmp_path, bins)
    c = cluster_factory(ds, nranks=2, extra_args=ARGS)
    r = subprocess.run([framework_python, "-c", EVAL_PASS, c.mount], env=c.env(node=0), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    names = sorted(p.name for p in src.iterdir())
    assert r.stdout == "".join(f"{hashlib.sha256((src / n).read_bytes()).hexdigest()} {n}\n" for n in names)
    _, remote = remote_names(c, ds, 0)
    st = status(c, 0)
    assert st["read_ahead"] >= len(remote) // 2, st
