"""Dataset formats read and written by their own libraries through /fanstore
on 4 nodes: Hugging Face `datasets` (Arrow files of save_to_disk, memory-
mapped by load_from_disk; map() writing its cache file next to the input
shards; save_to_disk into an output directory), Parquet (pyarrow's reader
and writer, and datasets.load_dataset("parquet")) and LMDB (a read-only
environment opened with its default locking, whose lock file is an input;
a write into an input environment; a new environment written as an output
and read on another node). Each dataset is made natively by the same
library first, packed, and every value read through /fanstore is compared
with the native read. The libraries come from the venv of scripts/setup.sh
(fixture framework_python)."""

import pytest

from fs_cluster import run_json
from fs_prep import pack

MOUNT = "/fanstore"

MAKE = r"""
import os, sys, numpy as np, datasets, lmdb, pyarrow as pa, pyarrow.parquet as pq
datasets.disable_progress_bars()
root = sys.argv[1]
rng = np.random.default_rng(5)
ds = datasets.Dataset.from_dict({"x": np.arange(6000), "t": [f"row {i} " * (i % 7) for i in range(6000)],
                                 "v": rng.random((6000, 4)).tolist()})
ds.save_to_disk(f"{root}/hf", num_shards=3)
datasets.DatasetDict({"train": ds.select(range(5000)), "test": ds.select(range(5000, 6000))}).save_to_disk(f"{root}/hfdict")
pq.write_table(pa.table({"a": np.arange(50000), "b": rng.random(50000)}), f"{root}/t.parquet", row_group_size=5000)
env = lmdb.open(f"{root}/lmdb", map_size=1 << 26)
with env.begin(write=True) as t:
    for i in range(3000):
        t.put(b"k%05d" % i, rng.bytes(64) + b"%d" % i)
env.close()
print("{}")
"""

# argv: root (native source or /fanstore), step, out dir (native tmp or /fanstore/out/...)
USE = r"""
import hashlib, json, os, sys, datasets, lmdb, pyarrow.parquet as pq
datasets.disable_progress_bars()
root, step, out = sys.argv[1:4]
h = lambda *xs: hashlib.sha256(json.dumps(xs).encode()).hexdigest()[:16]
res = {}
if step == "read":
    d = datasets.load_from_disk(f"{root}/hf")
    res["hf"] = h(d[:]["x"], d[:]["t"], d[:]["v"])
    dd = datasets.load_from_disk(f"{root}/hfdict")
    res["hfdict"] = {k: h(v[:]["x"]) for k, v in sorted(dd.items())}
    # map() writes its cache file beside the input shards (an output in an input directory).
    m = d.map(lambda r: {"y": r["x"] * 3 + len(r["t"])}, num_proc=2)
    res["map"] = h(m[:]["y"])
    res["map_cache_beside_input"] = all(os.path.dirname(f["filename"]) == f"{root}/hf" for f in m.cache_files)
    m.save_to_disk(f"{out}/hf_mapped", num_shards=2)
    t = pq.read_table(f"{root}/t.parquet")
    res["parquet"] = h(t.column("a").to_pylist(), t.column("b").to_pylist())
    pq.write_table(t.slice(100, 1000), f"{out}/slice.parquet")
    p = datasets.load_dataset("parquet", data_files=f"{root}/t.parquet", split="train")
    res["load_dataset"] = h(p[:]["a"][:500])
    env = lmdb.open(f"{root}/lmdb", readonly=True)
    with env.begin() as txn:
        res["lmdb"] = h([[k.hex(), v.hex()] for k, v in txn.cursor()])
    env.close()
    w = lmdb.open(f"{out}/lmdb_new", map_size=1 << 24)
    with w.begin(write=True) as txn:
        for i in range(500):
            txn.put(b"n%04d" % i, b"%d" % (i * i))
    w.close()
elif step == "back":
    m = datasets.load_from_disk(f"{out}/hf_mapped")
    res["mapped"] = h(m[:]["y"])
    res["slice"] = h(pq.read_table(f"{out}/slice.parquet").column("a").to_pylist())
    env = lmdb.open(f"{out}/lmdb_new", readonly=True)
    with env.begin() as txn:
        res["lmdb_new"] = h([[k.hex(), v.hex()] for k, v in txn.cursor()])
elif step == "write_input":
    try:
        env = lmdb.open(f"{root}/lmdb", map_size=1 << 26)
        with env.begin(write=True) as txn:
            txn.put(b"x", b"y")
        res["error"] = None
    except lmdb.Error as e:
        res["error"] = str(e)
print(json.dumps(res))
"""


def run(py, c, node, code, *args, env=None):
    """`code` under the frameworks' python `py` on `node` of `c` (natively when
    `c` is None), `env` added to its environment: the JSON of its last line."""
    return run_json(c, node, code, *args, python=py, env=env, timeout=600)


@pytest.fixture(scope="module")
def formats(bins, framework_python, tmp_path_factory):
    """The native source tree of every format, and a 4-node cluster over it packed."""
    tmp = tmp_path_factory.mktemp("formats")
    src = tmp / "src"
    src.mkdir()
    run(framework_python, None, 0, MAKE, src)
    pack(bins, src, tmp / "data", "--partitions", "4")
    from fs_cluster import start_cluster
    c = start_cluster(bins, tmp / "data", tmp / "cl", nranks=4, mount=MOUNT)
    yield src, c
    c.stop()


def node_env(c, node):
    """What the programs of `node` add to its environment."""
    return dict(OMP_NUM_THREADS="2", HF_HOME=str(c.runtime.parent / f"hf-home-{node}"))


def test_datasets_parquet_and_lmdb_read_write_and_read_back_on_other_nodes(framework_python, formats, tmp_path):
    src, c = formats
    native_out = tmp_path / "native-out"
    native_out.mkdir()
    native_env = dict(HF_HOME=str(tmp_path / "hf-home"))
    native = run(framework_python, None, 0, USE, src, "read", native_out, env=native_env)
    assert native["map_cache_beside_input"] is True and len(native["hfdict"]) == 2, native
    # Node 1 reads every format from the dataset and writes outputs ...
    got = run(framework_python, c, 1, USE, MOUNT, "read", f"{MOUNT}/out/fmt", env=node_env(c, 1))
    assert got == native
    # ... which nodes 3 and 0 read back, as native reads of the native outputs.
    native_back = run(framework_python, None, 0, USE, src, "back", native_out, env=native_env)
    for node in (3, 0):
        assert run(framework_python, c, node, USE, MOUNT, "back", f"{MOUNT}/out/fmt", env=node_env(c, node)) == native_back


def test_lmdb_write_into_an_input_environment_is_a_read_only_error(framework_python, formats):
    _, c = formats
    got = run(framework_python, c, 2, USE, MOUNT, "write_input", "-", env=node_env(c, 2))
    assert got["error"] is not None and "Read-only file system" in got["error"] and f"{MOUNT}/lmdb" in got["error"], got
