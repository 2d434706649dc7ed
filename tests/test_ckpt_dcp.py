"""`fanstore.dcp.Writer` and `Reader` (issue 54) with torch.distributed.checkpoint:
4 ranks (gloo over loopback) on 4 daemons standing for 4 nodes save a
series of checkpoints with `dcp.save` and `dcp.async_save`. Each rank's
shard must be byte for byte the shard DCP's own FileSystemWriter writes
for the same state (written natively beside it), sent as parts with only
the changed tensors as bytes; other ranks on other nodes load them back
with the Reader and with DCP's default reader, and after `fanstore export`
DCP's FileSystemReader loads the exported copy."""
import json
import subprocess
import textwrap
from pathlib import Path

import pytest

import fs_cluster
from fs_cluster import cluster_fixture

MOUNT = "/fanstore"
ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 600

pytest.importorskip("torch")

cl = cluster_fixture("pydcp", seed=9, n_files=4, nranks=4, mount=MOUNT)

PRELUDE = f"""
import sys; sys.path.insert(0, {str(ROOT / 'python')!r})
import json, os, warnings
warnings.filterwarnings("ignore")
import torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter, FileSystemReader
import fanstore.dcp, fanstore.torch as ft
rank, world, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
args = sys.argv[4:]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=rank, world_size=world)
def state(step):
    # Each rank's own share: 6 frozen layers, a head that changes every
    # step, a step counter (a byte item) and a view of a larger storage.
    g = torch.Generator().manual_seed(100 + rank)
    sd = {{f"r{{rank}}.layer{{i}}": torch.randn(128, 256, generator=g) for i in range(6)}}
    sd[f"r{{rank}}.head"] = torch.randn(16, 256, generator=g) + step
    sd[f"r{{rank}}.half"] = torch.randn(64, 64, generator=g).to(torch.bfloat16)
    sd[f"r{{rank}}.rows"] = sd[f"r{{rank}}.layer0"][:4]
    sd["step"] = step
    return sd
def shard(d):
    return open(os.path.join(d, f"__{{rank}}_0.distcp"), "rb").read()
"""

SAVE = """
root, local = args
out = {"exact": [], "sent": [], "referenced": [], "shards_sent": 0}
for step in range(3):
    sd = state(step)
    if step == 2:
        sd[f"r{rank}.layer5"].data.mul_(2.0)   # a change the version counter does not see
    w = fanstore.dcp.Writer(os.path.join(root, f"step{step}"))
    before = ft.stats()
    dcp.save(sd, storage_writer=w)
    after = ft.stats()
    dcp.save(sd, storage_writer=FileSystemWriter(os.path.join(local, f"step{step}")))
    out["exact"].append(shard(os.path.join(root, f"step{step}")) == shard(os.path.join(local, f"step{step}")))
    out["sent"].append(after["sent"] - before["sent"])
    out["referenced"].append(after["referenced"] - before["referenced"])
    out["shards_sent"] += w.shards_sent
# async_save: DCP stages a CPU copy (new storages) and writes it on a thread.
sd = state(3)
w = fanstore.dcp.Writer(os.path.join(root, "async"))
before = ft.stats()
dcp.async_save(sd, storage_writer=w).result()
after = ft.stats()
dcp.save(sd, storage_writer=FileSystemWriter(os.path.join(local, "async")))
out["async_exact"] = shard(os.path.join(root, "async")) == shard(os.path.join(local, "async"))
out["async_referenced"] = after["referenced"] - before["referenced"]
out["shards_sent"] += w.shards_sent
# Saved twice at one path: the second `.metadata` (written in place under
# the mount) replaces the first, and the checkpoint loads as the new state.
dcp.save(state(1), storage_writer=fanstore.dcp.Writer(os.path.join(root, "again")))
sd = state(3)
dcp.save(sd, storage_writer=fanstore.dcp.Writer(os.path.join(root, "again")))
got = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0 for k, v in sd.items()}
dcp.load(got, storage_reader=fanstore.dcp.Reader(os.path.join(root, "again")))
out["resaved"] = all(torch.equal(got[k], sd[k]) if isinstance(sd[k], torch.Tensor) else got[k] == sd[k] for k in sd)
dist.barrier()
out["files"] = sorted(os.listdir(os.path.join(root, "step2")))
out["files_again"] = sorted(os.listdir(os.path.join(root, "again")))
print(json.dumps(out))
"""

LOAD = """
root, owner = args[0], int(args[1])
def want(step):
    # The state rank `owner` saved at `step` (state() is seeded per rank).
    global rank
    me, rank = rank, owner
    try:
        sd = state(step)
        if step == 2:
            sd[f"r{rank}.layer5"].data.mul_(2.0)
        return sd
    finally:
        rank = me
out = {}
for name, step, reader in (("step2", 2, fanstore.dcp.Reader), ("async", 3, FileSystemReader), ("step1", 1, None)):
    w = want(step)
    got = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0 for k, v in w.items()}
    path = os.path.join(root, name)
    if reader is None:
        dcp.load(got, checkpoint_id=path)
    else:
        dcp.load(got, storage_reader=reader(path))
    out[name] = all(torch.equal(got[k], w[k]) if isinstance(w[k], torch.Tensor) else got[k] == w[k] for k in w)
dist.barrier()
print(json.dumps(out))
"""


def run_ranks(c, nodes, code, *args, owners=None):
    """`code` (after PRELUDE) as ranks 0..len(nodes)-1 of one gloo job, rank i
    on node nodes[i] of `c` (natively when `c` is None); `owners`: the rank
    whose state each rank loads (LOAD's argv)."""
    return fs_cluster.run_ranks(c, nodes, PRELUDE + textwrap.dedent(code), *args, timeout=TIMEOUT,
                                rank_args=[[o] for o in owners] if owners else None)


def test_dcp_writer_shards_are_filesystemwriters_with_only_changes_sent(cl, tmp_path):
    saved = run_ranks(cl, [0, 1, 2, 3], SAVE, f"{MOUNT}/dcpw", tmp_path / "native")
    for rank, r in enumerate(saved):
        assert r["exact"] == [True, True, True] and r["async_exact"], (rank, r)
        # Every shard went as parts, none through POSIX.
        assert r["shards_sent"] == 4, (rank, r)
        # 9 storages per shard (the view is saved as its own copy): all new
        # at first; then the head only; then the head and the layer changed
        # behind the version counter.
        assert r["sent"][0] == 9 and r["referenced"][0] == 0, (rank, r)
        assert r["sent"][1] == 1 and r["referenced"][1] == 8, (rank, r)
        assert r["sent"][2] == 2 and r["referenced"][2] == 7, (rank, r)
        # The staged copy is in new storages: known by its bytes.
        assert r["async_referenced"] >= 7, (rank, r)
        assert r["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"], r
        assert r["files_again"] == r["files"] and r["resaved"], (rank, r)
    rows = {row["path"]: row for row in json.loads(cl.cli("ckpt", "ls", "--json").stdout)}
    for rank in range(4):
        first, second = rows[f"dcpw/step0/__{rank}_0.distcp"], rows[f"dcpw/step1/__{rank}_0.distcp"]
        assert first["format"] == second["format"] == "torch-dcp", (first, second)
        # The later shard stores anew the head (16 x 256 floats, 16 KiB) and
        # the glue of its 10 archives (about 1.2 KiB each), not the 6 layers
        # (768 KiB).
        assert second["stored_new_bytes"] < 40_000 < 500_000 < first["stored_new_bytes"], (first, second)
    verify = cl.cli("ckpt", "verify", "dcpw/step2/__1_0.distcp", check=False)
    assert verify.returncode == 0, verify.stdout + verify.stderr

    # Other ranks on other nodes load each rank's share back (rank i on node
    # (i+1) % 4 loads what rank (i+1) % 4 saved: its keys).
    back = run_ranks(cl, [1, 2, 3, 0], LOAD, f"{MOUNT}/dcpw", owners=[1, 2, 3, 0])
    assert back == [{"step2": True, "async": True, "step1": True}] * 4, back


def test_an_exported_dcp_checkpoint_loads_with_filesystemreader(bins, tmp_path):
    from fs_cluster import packed_dataset, start_cluster
    _src, data = packed_dataset(bins, tmp_path / "ds", n_files=4, seed=23)
    persist = tmp_path / "persist"
    c = start_cluster(bins, data, tmp_path / "c", nranks=2, mount=MOUNT, extra_args=["--persist", str(persist)])
    try:
        run_ranks(c, [0, 1], SAVE, f"{MOUNT}/exp", tmp_path / "native")
    finally:
        c.stop()
    plain = tmp_path / "plain"
    subprocess.run([bins["cli"], "export", str(persist), "--to", str(plain)], check=True, capture_output=True,
                   timeout=120)
    for rank in range(2):
        for step in ("step0", "step2", "async"):
            assert (plain / "exp" / step / f"__{rank}_0.distcp").read_bytes() == \
                (tmp_path / "native" / step / f"__{rank}_0.distcp").read_bytes(), (rank, step)
    back = run_ranks(None, [0, 1], LOAD.replace("fanstore.dcp.Reader", "FileSystemReader"), plain / "exp",
                     owners=[0, 1])
    assert back == [{"step2": True, "async": True, "step1": True}] * 2, back
