"""Tensor-level checkpoint dedup, end to end.

Real daemons under `mpiexec -n 4` (UCX_TLS=tcp), real Python clients with
LD_PRELOAD writing checkpoints under /fanstore (safetensors bytes, np.save,
np.savez, a torch.save-layout zip from tests/ckpt_gen.py, unknown formats),
read back on another node, and the `fanstore ckpt ...` queries checked
against what the clients wrote and against the store directory on disk
(`<local>/rank-<r>/out/ckpt/`, fanstore-ckpt/src/lib.rs).

The module shares one 4-rank cluster; tests run in file order and the later
ones build on the fine-tuning series written by the earlier ones. Where each
test writes:
    node 1: fmt/ (formats)         node 0: run/ (the series), corrupt/
    node 2: diff/                  node 3: bad/ (malformed)
"""
import hashlib
import json
import re
import os
import struct
import sys
import textwrap
import time
from pathlib import Path

import pytest

import ckpt_gen as gen
from fs_cluster import packed_cluster, packed_dataset, run_json, start_cluster, tmpfs_local_dir

MOUNT = "/fanstore"
TESTS = Path(__file__).resolve().parent
TIMEOUT = 300
PY = sys.executable
UNIT_HEADER = 128           # fanstore-ckpt/src/unit.rs HEADER_LEN (unit format version 2)
PACK_HEADER = 40            # fanstore-ckpt/src/pack.rs HEADER_LEN (pack format version 1)
DEDUP_MIN = 64 << 10        # the daemon's default --dedup-min
OPAQUE = "opaque"           # Format::name of the content-defined-chunking fallback

# The fine-tuning series: SERIES_N checkpoints of SERIES_TENSORS float32
# tensors of SERIES_ELEMS each (40 x 5 MiB = 200 MiB), the first FROZEN
# tensors frozen after checkpoint 1.
SERIES_N = 10
SERIES_TENSORS = gen.SERIES_TENSORS
SERIES_ELEMS = gen.SERIES_ELEMS
FROZEN = SERIES_TENSORS // 2
TENSOR_BYTES = SERIES_ELEMS * 4


def series_path(k: int) -> str:
    return f"run/ckpt-{k:02d}.safetensors"


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

PRELUDE = f"import sys; sys.path.insert(0, {str(TESTS)!r})\n"


def py(c, node, code, *args, check=True):
    """python3 -c code args... as a client of `node` (ckpt_gen importable); the completed process."""
    return c.run_python(node, PRELUDE + textwrap.dedent(code), *args, check=check, timeout=TIMEOUT, python=PY)


def py_json(c, node, code, *args):
    """py(), and the JSON object its last stdout line prints."""
    return run_json(c, node, PRELUDE + textwrap.dedent(code), *args, timeout=TIMEOUT, python=PY)


READ_HASHES = """
    import errno, hashlib, json, os, sys
    out = {}
    for p in sys.argv[1:]:
        try:
            h = hashlib.sha256()
            n = 0
            with open(p, 'rb') as f:
                while True:
                    b = f.read(8 << 20)
                    if not b:
                        break
                    h.update(b)
                    n += len(b)
            out[p] = {'sha256': h.hexdigest(), 'len': n, 'st_size': os.stat(p).st_size}
        except OSError as e:
            out[p] = {'errno': e.errno, 'error': str(e)}
    print(json.dumps(out))
"""


def read_hashes(c, node, rels):
    """{rel: {'sha256', 'len', 'st_size'} or {'errno', 'error'}} read through /fanstore on `node`."""
    got = py_json(c, node, READ_HASHES, *[f"{MOUNT}/{r}" for r in rels])
    return {r: got[f"{MOUNT}/{r}"] for r in rels}


def assert_read_back(c, node, expected: dict):
    """expected: {rel: {'sha256', 'len'}}; every file reads back byte-exact on `node`."""
    got = read_hashes(c, node, list(expected))
    bad = {r: (got[r], expected[r]["len"]) for r in expected
           if got[r].get("sha256") != expected[r]["sha256"] or got[r].get("len") != expected[r]["len"]
           or got[r].get("st_size") != expected[r]["len"]}
    assert not bad, f"node {node}: read back differs from what was written: {bad}\n{c.log()[-3000:]}"


def ckpt(c, *args, check=True):
    """`fanstore ckpt ARGS --json` -> (exit status, parsed JSON or None, completed process)."""
    r = c.cli("ckpt", *args, "--json", check=check)
    try:
        doc = json.loads(r.stdout)
    except ValueError:
        doc = None
    if check:
        assert doc is not None, f"fanstore ckpt {' '.join(args)} --json printed no JSON:\n{r.stdout}\n{r.stderr}"
    return r.returncode, doc, r


def ckpt_json(c, *args):
    return ckpt(c, *args)[1]


def ls_rows(c, d="") -> dict:
    rows = ckpt_json(c, "ls", *([d] if d else []))
    assert isinstance(rows, list), rows
    return {row["path"]: row for row in rows}


def store_dir(c, rank) -> Path:
    return c.local / f"rank-{rank}" / "out" / "ckpt"


def wait_stored(c):
    """Returns once every rank has stored the checkpoints closed so far (their
    commits run behind the close; a query answers after them)."""
    c.cli("ckpt", "du", "--json", check=False)


def unit_records(c, rank) -> dict:
    """blake3 hex -> (pack file, offset, header) of every record in the packs of
    `rank`'s store (fanstore-ckpt/src/pack.rs), the latest one of each unit.
    Records of freed units stay in their pack (dead bytes) until it is compacted."""
    wait_stored(c)
    out = {}
    d = store_dir(c, rank) / "units"
    for p in sorted(d.glob("*.fsk")) if d.is_dir() else []:
        size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(PACK_HEADER)
            assert head[:8] == b"FANSTPK\0" and struct.unpack_from("<I", head, 8)[0] == 1, (p, head)
            off = PACK_HEADER
            while off + UNIT_HEADER <= size:
                f.seek(off)
                h = unit_header(f.read(UNIT_HEADER))
                out[h["blake3"]] = (p, off, h)
                off += UNIT_HEADER + h["body_len"]
            assert off == size, f"{p}: records end at {off}, the file at {size}"
    return out


def unit_record(c, rank, hexhash) -> bytes:
    """The bytes of unit `hexhash`'s record (header and body) in `rank`'s packs."""
    p, off, h = unit_records(c, rank)[hexhash]
    with open(p, "rb") as f:
        f.seek(off)
        return f.read(UNIT_HEADER + h["body_len"])


def disk_usage(c, rank) -> dict:
    """Bytes of the store directory of `rank` on disk, as DuReport counts them."""
    wait_stored(c)
    d = store_dir(c, rank)
    packs = sorted((d / "units").glob("*.fsk")) if (d / "units").is_dir() else []
    recipes = sorted((d / "recipes").glob("*.fsr")) if (d / "recipes").is_dir() else []
    cat = d / "catalog.fsc"
    other = []
    if d.is_dir():
        known = set(packs) | set(recipes) | {cat}
        other = [(str(p.relative_to(d)), p.stat().st_size) for p in d.rglob("*")
                 if p.is_file() and p not in known and p.stat().st_size > 0]
    u = sum(p.stat().st_size for p in packs)
    rc = sum(p.stat().st_size for p in recipes)
    cb = cat.stat().st_size if cat.exists() else 0
    return dict(packs=len(packs), pack_bytes=u, recipes=len(recipes), recipe_bytes=rc, catalog_bytes=cb,
                physical_bytes=u + rc + cb, other_nonempty=other)


def unit_header(b: bytes) -> dict:
    """The fields of a version 2 unit file header (fanstore-ckpt/src/unit.rs)."""
    assert b[:8] == b"FANSTUN\0" and struct.unpack_from("<I", b, 8)[0] == 2, b[:16]
    return dict(encoding=b[12], width=b[13], depth=b[14], len=struct.unpack_from("<Q", b, 16)[0],
                blake3=b[24:56].hex(), base=b[64:96].hex() if b[12] == 2 else None,
                body_len=struct.unpack_from("<Q", b, 96)[0])


def needed_bases(c, rank, hexhashes) -> set:
    """Units the given units' delta chains need (their bases, transitively)."""
    out, todo = set(), list(hexhashes)
    records = unit_records(c, rank)
    while todo:
        h = records[todo.pop()][2]
        if h["base"] and h["base"] not in out:
            out.add(h["base"])
            todo.append(h["base"])
    return out


def wait_until(cond, timeout=10.0):
    """Polls cond() until true; the seconds it took, or None on timeout."""
    t0 = time.time()
    while True:
        if cond():
            return time.time() - t0
        if time.time() - t0 > timeout:
            return None
        time.sleep(0.1)


def rank_du(du, rank) -> dict:
    rows = [r for r in du["ranks"] if r["rank"] == rank]
    assert len(rows) == 1, du
    return rows[0]


@pytest.fixture(scope="module")
def cl(bins, tmp_path_factory):
    # --ckpt-hot 2: the store serves the last two commits of a node from the
    # files written (the default keeps all that 16G hold); the tests below
    # read older ones rebuilt from their units.
    with packed_cluster(bins, tmp_path_factory.mktemp("ckpt"), n_files=8, seed=11, mount=MOUNT, extra_args=["--ckpt-hot", "2"]) as (c, _):
        yield c


# --------------------------------------------------------------------------
# 1. formats: byte-exact round trips on another node, ls
# --------------------------------------------------------------------------

WRITE_FORMATS = """
    import io, json, os, time, zipfile
    import numpy as np
    from safetensors.numpy import save
    import ckpt_gen as gen
    # np.savez stamps each zip member with the current time: fix it so that
    # the file np.savez writes under /fanstore is reproducible in memory.
    time.time = lambda: 1700000000.0
    d = '/fanstore/fmt'
    os.makedirs(d, exist_ok=True)
    st, arrs, single = gen.format_samples()
    out = {}
    def put(rel, b):
        out[rel] = gen.digest(b)
    b = save(st, metadata={'epoch': '3'})
    with open(d + '/model.safetensors', 'wb') as f:
        f.write(b)
    put('fmt/model.safetensors', b)
    # numpy's own writers, to the path (zipfile seeks back to rewrite headers)
    np.savez(d + '/arrays.npz', **arrs)
    m = io.BytesIO(); np.savez(m, **arrs); put('fmt/arrays.npz', m.getvalue())
    np.save(d + '/single.npy', single)
    m = io.BytesIO(); np.save(m, single); put('fmt/single.npy', m.getvalue())
    # torch.save's layout, holding the same tensors as model.safetensors
    b = gen.torch_zip(st)
    with open(d + '/model.pt', 'wb') as f:
        f.write(b)
    put('fmt/model.pt', b)
    b = gen.opaque_blob()
    with open(d + '/blob.bin', 'wb') as f:
        f.write(b)
    put('fmt/blob.bin', b)
    # under --dedup-min: plain outputs
    b = gen.small_safetensors_bytes()
    open(d + '/small.safetensors', 'wb').write(b)
    put('fmt/small.safetensors', b)
    np.save(d + '/small.npy', np.arange(2000, dtype=np.float64))
    m = io.BytesIO(); np.save(m, np.arange(2000, dtype=np.float64)); put('fmt/small.npy', m.getvalue())
    b = b'x' * (DEDUP_MIN - 1)
    open(d + '/just_under.bin', 'wb').write(b)
    put('fmt/just_under.bin', b)
    b = np.random.default_rng(3).integers(0, 256, DEDUP_MIN, dtype=np.uint8).tobytes()
    open(d + '/at_min.bin', 'wb').write(b)
    put('fmt/at_min.bin', b)
    open(d + '/log.txt', 'w').write('epoch 3 done\\n')
    put('fmt/log.txt', b'epoch 3 done\\n')
    print(json.dumps(out))
""".replace("DEDUP_MIN", str(DEDUP_MIN))

FMT_BIG = {"fmt/model.safetensors": "safetensors", "fmt/arrays.npz": "npz", "fmt/single.npy": "npy",
           "fmt/model.pt": "torch-zip", "fmt/blob.bin": OPAQUE, "fmt/at_min.bin": OPAQUE}
FMT_SMALL = ["fmt/small.safetensors", "fmt/small.npy", "fmt/just_under.bin", "fmt/log.txt"]


@pytest.fixture(scope="module")
def formats(cl):
    """fmt/ written through node 1: {rel: {'sha256', 'len'}}."""
    written = py_json(cl, 1, WRITE_FORMATS)
    assert sorted(written) == sorted(list(FMT_BIG) + FMT_SMALL)
    return written


def test_formats_round_trip_on_other_nodes(cl, formats):
    assert_read_back(cl, 3, formats)       # remote: rank 1 holds them
    assert_read_back(cl, 1, formats)       # the writer's own node
    # the libraries load them too (through the preload, on node 2)
    py(cl, 2, """
        import numpy as np
        from safetensors.numpy import load_file
        import ckpt_gen as gen
        st, arrs, single = gen.format_samples()
        got = load_file('/fanstore/fmt/model.safetensors')
        assert sorted(got) == sorted(st) and all((got[k] == st[k]).all() for k in st)
        z = np.load('/fanstore/fmt/arrays.npz')
        assert sorted(z.files) == sorted(arrs) and all((z[k] == arrs[k]).all() for k in arrs)
        assert (np.load('/fanstore/fmt/single.npy') == single).all()
        import zipfile
        zf = zipfile.ZipFile('/fanstore/fmt/model.pt')
        assert zf.testzip() is None
        for i, k in enumerate(st):
            assert zf.read('archive/data/%d' % i) == st[k].tobytes(), k
    """)


def test_formats_listed_with_their_format(cl, formats):
    rows = ls_rows(cl, "fmt")
    assert sorted(rows) == sorted(FMT_BIG), f"ckpt ls fmt lists {sorted(rows)}; small files must not be there"
    assert ls_rows(cl, f"{MOUNT}/fmt") == rows, "`ckpt ls /fanstore/fmt` and `ckpt ls fmt` differ"
    assert ls_rows(cl, "fmt/") == rows
    everything = ls_rows(cl)
    for p in FMT_SMALL:
        assert p not in everything, f"{p} is under --dedup-min but `ckpt ls` lists it"
    for p, fmt in FMT_BIG.items():
        row = rows[p]
        assert not row["path"].startswith("/"), row
        assert row["format"] == fmt, (p, row)
        assert row["logical_bytes"] == formats[p]["len"], (p, row, formats[p])
        assert isinstance(row["id"], int) and row["id"] > 0, row
        assert 0 <= row["stored_new_bytes"] <= row["logical_bytes"], row
    st, arrs, single = gen.format_samples()
    assert rows["fmt/model.safetensors"]["units"] == len(st)
    assert rows["fmt/arrays.npz"]["units"] == len(arrs)
    assert rows["fmt/single.npy"]["units"] == 1
    assert rows["fmt/model.pt"]["units"] == len(st)
    blob = rows["fmt/blob.bin"]
    assert blob["units"] > 4, blob
    # each random block is written 4 times: chunking stores it about once
    assert blob["stored_new_bytes"] < 0.45 * blob["logical_bytes"], \
        f"opaque blob with 4x repeated content: stored {blob['stored_new_bytes']} of {blob['logical_bytes']}"
    assert blob["dedup_ratio"] > 2.2, blob
    # the tables for people
    table = cl.cli("ckpt", "ls", "fmt").stdout
    for p, fmt in FMT_BIG.items():
        line = [ln.split() for ln in table.splitlines() if len(ln.split()) > 2 and ln.split()[1] == p]
        assert len(line) == 1 and line[0][2] == fmt, f"{p} ({fmt}) not in the ls table:\n{table}"
    assert "physical" in cl.cli("ckpt", "du").stdout
    # a path that is not a checkpoint: verify says so with exit status 1
    code, _doc, r = ckpt(cl, "verify", "fmt/small.safetensors", check=False)
    assert code == 1, f"ckpt verify of a plain output exited {code}\n{r.stdout}\n{r.stderr}"


def test_formats_units_in_the_writers_store(cl, formats):
    """The safetensors tensors are unit files named by blake3 in rank 1's store
    (the writer's), each a version 2 unit of the tensor's length and hash (raw:
    the tensor bytes after the header; else a byte-grouped body that decodes to them);
    big outputs are not also kept as plain files, small ones are."""
    st, _arrs, _single = gen.format_samples()
    own = ckpt_json(cl, "owners", "fmt/model.safetensors")
    assert own["checkpoint"]["path"] == "fmt/model.safetensors", own
    assert own["checkpoint"]["live"] is True
    by_name = {t["name"]: t for t in own["tensors"]}
    assert sorted(by_name) == sorted(st), own
    want_dtype = {"float32": "F32", "int64": "I64"}
    for k, arr in st.items():
        t = by_name[k]
        assert t["bytes"] == arr.nbytes and t["shape"] == list(arr.shape), t
        assert t["dtype"] == want_dtype[str(arr.dtype)], t
        assert t["owner"]["path"] == "fmt/model.safetensors", t
        records = unit_records(cl, 1)
        assert t["blake3"] in records, f"unit of {k} not in rank 1's packs: {sorted(os.listdir(store_dir(cl, 1) / 'units'))}"
        b = unit_record(cl, 1, t["blake3"])
        h = unit_header(b)
        assert h["len"] == arr.nbytes and h["blake3"] == t["blake3"], (k, h)
        assert len(b) == UNIT_HEADER + h["body_len"], (k, len(b), h)
        assert h["encoding"] in (0, 1) and h["depth"] == 0, (k, h)  # no lineage parent: not a delta
        if h["encoding"] == 0:
            assert b[UNIT_HEADER:] == arr.tobytes(), f"unit record of {k} does not hold its bytes"
        else:
            assert h["width"] == arr.dtype.itemsize and h["body_len"] < arr.nbytes, (k, h)
    # plain outputs of rank 1 (outside the store)
    out = cl.local / "rank-1" / "out"
    plain = [p for p in out.rglob("*") if p.is_file() and store_dir(cl, 1) not in p.parents]
    sizes = {p.stat().st_size for p in plain}
    for p in FMT_BIG:
        assert formats[p]["len"] not in sizes, f"{p} is also kept as a plain file under {out}"
    want = gen.small_safetensors_bytes()
    assert any(q.stat().st_size == len(want) and q.read_bytes() == want for q in plain), \
        f"fmt/small.safetensors is not a plain file under {out}: {[(str(q), q.stat().st_size) for q in plain]}"


def test_same_tensors_dedup_across_formats(cl, formats):
    """model.pt (torch zip) holds the same tensors as model.safetensors: only
    its glue is new, and its tensors are owned by the safetensors file."""
    st, _arrs, _single = gen.format_samples()
    rows = ls_rows(cl, "fmt")
    pt = rows["fmt/model.pt"]
    tensor_bytes = sum(a.nbytes for a in st.values())
    assert pt["stored_new_bytes"] < 8192, f"model.pt stored {pt['stored_new_bytes']} new bytes; its {tensor_bytes} tensor bytes are already in model.safetensors"
    assert pt["parent"] is not None and pt["parent"]["path"] == "fmt/model.safetensors", pt
    own = ckpt_json(cl, "owners", f"{MOUNT}/fmt/model.pt")
    assert own["checkpoint"]["path"] == "fmt/model.pt", own
    names = {t["name"]: t for t in own["tensors"]}
    # torch storages are named after the state_dict keys data.pkl gives them
    assert sorted(names) == sorted(st), f"torch-zip unit names {sorted(names)}, state_dict keys {sorted(st)}"
    for k, arr in st.items():
        t = names[k]
        assert t["dtype"] == gen.storage_dtype(arr) and t["shape"] == list(arr.shape) and t["bytes"] == arr.nbytes, t
        assert t["owner"]["path"] == "fmt/model.safetensors", t


# --------------------------------------------------------------------------
# 2. the fine-tuning series
# --------------------------------------------------------------------------

WRITE_SERIES = """
    import hashlib, json, os, sys, time
    import numpy as np
    from safetensors.numpy import save
    import ckpt_gen as gen
    n, frozen, ntensors, elems = map(int, sys.argv[1:5])
    base = gen.series_base(ntensors, elems)
    os.makedirs('/fanstore/run', exist_ok=True)
    out = {}
    for k in range(1, n + 1):
        b = save(gen.series_state(base, k, frozen))
        final = '/fanstore/run/ckpt-%02d.safetensors' % k
        t = time.time()
        with open(final + '.tmp', 'wb') as f:
            f.write(b)
        t_close = time.time() - t
        os.replace(final + '.tmp', final)
        out['run/ckpt-%02d.safetensors' % k] = {'sha256': hashlib.sha256(b).hexdigest(), 'len': len(b),
                                                 'write_close_s': round(t_close, 3)}
    print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def series(cl):
    """The series written by one process on node 0: {rel: {'sha256', 'len', 'write_close_s'}}."""
    t = time.time()
    out = py_json(cl, 0, WRITE_SERIES, SERIES_N, FROZEN, SERIES_TENSORS, SERIES_ELEMS)
    took = time.time() - t
    print(f"\nseries: {SERIES_N} x {SERIES_TENSORS * TENSOR_BYTES / 2**20:.0f} MiB written in {took:.1f} s; "
          f"write+close per checkpoint: {[v['write_close_s'] for v in out.values()]}")
    return out


def test_series_dedup_ratio(cl, series):
    du = ckpt_json(cl, "du")
    r0 = rank_du(du, 0)
    model = series[series_path(1)]["len"]
    assert r0["checkpoints"] == SERIES_N, r0
    ratio = r0["physical_bytes"] / model
    expect = 1 + (SERIES_N - 1) * (SERIES_TENSORS - FROZEN) / SERIES_TENSORS
    print(f"\nseries: physical {r0['physical_bytes']} B / model {model} B = {ratio:.3f} (expected ~{expect}); "
          f"logical {r0['logical_bytes']} B, dedup ratio {r0['dedup_ratio']:.3f}")
    # exact dedup stores each distinct tensor once; deltas and compression then shrink them
    assert r0["referenced_unit_bytes"] == (SERIES_TENSORS + (SERIES_N - 1) * (SERIES_TENSORS - FROZEN)) * TENSOR_BYTES, r0
    assert r0["saved_by_dedup_bytes"] >= (SERIES_N - 1) * FROZEN * TENSOR_BYTES, r0
    assert ratio <= 5.8, f"physical/model = {ratio:.3f}, at most {expect} with exact dedup alone: {r0}"
    assert r0["logical_bytes"] == sum(v["len"] for v in series.values()), r0
    assert r0["units"] == SERIES_TENSORS + (SERIES_N - 1) * (SERIES_TENSORS - FROZEN), r0
    rows = ls_rows(cl, "run")
    assert sorted(rows) == [series_path(k) for k in range(1, SERIES_N + 1)], \
        f"ckpt ls run: {sorted(rows)} (the .tmp names must be gone after os.replace)"
    changed = (SERIES_TENSORS - FROZEN) * TENSOR_BYTES
    for k in range(1, SERIES_N + 1):
        row = rows[series_path(k)]
        assert row["format"] == "safetensors" and row["units"] == SERIES_TENSORS, row
        assert row["logical_bytes"] == series[series_path(k)]["len"], row
        if k == 1:
            assert 0 < row["stored_new_bytes"] <= SERIES_TENSORS * TENSOR_BYTES + 64 * 1024, row
        else:
            # at most the changed half plus the header (glue); less when encoded
            assert 0 < row["stored_new_bytes"] <= changed + 64 * 1024, row
            assert row["parent"] is not None and row["parent"]["path"] == series_path(k - 1), row


def test_series_read_back_on_other_node(cl, series):
    exp = {series_path(k): series[series_path(k)] for k in (1, SERIES_N)}
    assert_read_back(cl, 2, exp)


FD_TARGETS = """
    import json, os, sys
    out = {}
    for p in sys.argv[1:]:
        fd = os.open(p, os.O_RDONLY)
        out[p] = os.readlink('/proc/self/fd/%d' % fd)
        os.close(fd)
    print(json.dumps(out))
"""


def test_series_last_checkpoints_read_without_rebuild(cl, series):
    """On the writer's node the last checkpoints are served from the files
    they were committed from (the store's hot copies), older ones are
    rebuilt from their units into a memfd; both read back exactly."""
    last, first = series_path(SERIES_N), series_path(1)
    got = py_json(cl, 0, FD_TARGETS, f"{MOUNT}/{last}", f"{MOUNT}/{first}")
    assert "fanstore:ckpt" not in got[f"{MOUNT}/{last}"], got   # the client's own (sealed) output file
    assert got[f"{MOUNT}/{first}"].startswith("/memfd:fanstore:ckpt"), got
    assert_read_back(cl, 0, {p: series[p] for p in (last, first)})


def test_series_owners_of_last_checkpoint(cl, series):
    own = ckpt_json(cl, "owners", series_path(SERIES_N))
    first = ls_rows(cl, "run")[series_path(1)]
    assert own["checkpoint"]["path"] == series_path(SERIES_N), own
    names = [t["name"] for t in own["tensors"]]
    assert sorted(names) == sorted(f"layer{i:02d}.weight" for i in range(SERIES_TENSORS)), names
    own1 = {t["name"]: t["blake3"] for t in ckpt_json(cl, "owners", f"{MOUNT}/{series_path(1)}")["tensors"]}
    for t in own["tensors"]:
        i = int(t["name"][5:7])
        assert t["bytes"] == TENSOR_BYTES and t["dtype"] == "F32" and t["shape"] == [SERIES_ELEMS], t
        if i < FROZEN:
            assert t["owner"]["path"] == series_path(1) and t["owner"]["id"] == first["id"], \
                f"frozen tensor {t['name']} of checkpoint {SERIES_N} owned by {t['owner']}, expected checkpoint 1"
            assert t["blake3"] == own1[t["name"]], t
        else:
            assert t["owner"]["path"] == series_path(SERIES_N), t
            assert t["blake3"] != own1[t["name"]], t


def test_series_log_of_last_checkpoint(cl, series):
    log = ckpt_json(cl, "log", series_path(SERIES_N))
    assert log["checkpoint"]["path"] == series_path(SERIES_N) and log["checkpoint"]["live"] is True, log
    paths = [a["path"] for a in log["ancestors"]]
    assert paths == [series_path(k) for k in range(SERIES_N - 1, 0, -1)], paths
    assert all(a["live"] for a in log["ancestors"]), log
    rows = ls_rows(cl, "run")
    assert [a["id"] for a in log["ancestors"]] == [rows[p]["id"] for p in paths]
    assert [a["logical_bytes"] for a in log["ancestors"]] == [series[p]["len"] for p in paths]
    assert log == ckpt_json(cl, "log", f"{MOUNT}/{series_path(SERIES_N)}")


# --------------------------------------------------------------------------
# 7. diff
# --------------------------------------------------------------------------

def test_diff_series_checkpoints(cl, series):
    d = ckpt_json(cl, "diff", series_path(2), series_path(3))
    assert d["a"]["path"] == series_path(2) and d["b"]["path"] == series_path(3), d
    tot = d["totals"]
    moving = SERIES_TENSORS - FROZEN
    assert tot["changed"] == {"tensors": moving, "bytes": moving * TENSOR_BYTES}, tot
    assert tot["unchanged"] == {"tensors": FROZEN, "bytes": FROZEN * TENSOR_BYTES}, tot
    assert tot["added"]["tensors"] == 0 and tot["removed"]["tensors"] == 0, tot
    st = {t["name"]: t["status"] for t in d["tensors"]}
    assert st == {f"layer{i:02d}.weight": ("unchanged" if i < FROZEN else "changed") for i in range(SERIES_TENSORS)}, st
    d2 = ckpt_json(cl, "diff", f"{MOUNT}/{series_path(1)}", f"{MOUNT}/{series_path(SERIES_N)}")
    assert d2["totals"]["changed"]["tensors"] == moving and d2["totals"]["unchanged"]["tensors"] == FROZEN, d2["totals"]
    same = ckpt_json(cl, "diff", series_path(4), series_path(4))
    assert same["totals"]["unchanged"]["tensors"] == SERIES_TENSORS and same["totals"]["changed"]["tensors"] == 0


WRITE_DIFF = """
    import json
    import numpy as np
    from safetensors.numpy import save
    import ckpt_gen as gen
    rng = np.random.default_rng(5)
    a = {'w%d' % i: rng.random(8192, dtype=np.float32) for i in range(6)}     # 6 x 32 KiB
    b = dict(a)
    b['w1'] = a['w1'] + np.float32(1)          # changed
    del b['w2']                                # removed
    b['w6'] = rng.random(4096, dtype=np.float32)   # added
    b['w7'] = rng.random(100, dtype=np.float64)    # added
    b['w4'] = a['w4'].reshape(64, 128)         # same bytes, new shape: unchanged content
    print(json.dumps(gen.write_files('diff', {'a.safetensors': save(a), 'b.safetensors': save(b)})))
"""


def test_diff_added_removed_changed(cl):
    written = py_json(cl, 2, WRITE_DIFF)
    assert_read_back(cl, 0, written)
    d = ckpt_json(cl, "diff", "diff/a.safetensors", "diff/b.safetensors")
    status = {t["name"]: t["status"] for t in d["tensors"]}
    assert status == {"w0": "unchanged", "w1": "changed", "w2": "removed", "w3": "unchanged", "w4": "unchanged",
                      "w5": "unchanged", "w6": "added", "w7": "added"}, status
    tot = d["totals"]
    assert {k: v["tensors"] for k, v in tot.items()} == {"added": 2, "removed": 1, "changed": 1, "unchanged": 4}, tot
    assert tot["added"]["bytes"] == 4096 * 4 + 100 * 8 and tot["removed"]["bytes"] == 8192 * 4, tot
    by = {t["name"]: t for t in d["tensors"]}
    assert by["w2"]["bytes_b"] is None and by["w2"]["bytes_a"] == 8192 * 4, by["w2"]
    assert by["w6"]["bytes_a"] is None and by["w6"]["bytes_b"] == 4096 * 4, by["w6"]
    back = ckpt_json(cl, "diff", "diff/b.safetensors", "diff/a.safetensors")
    assert {k: v["tensors"] for k, v in back["totals"].items()} == {"added": 1, "removed": 2, "changed": 1, "unchanged": 4}
    # b shares 4 tensors with a: only w1, w6, w7 and the header are new
    row = ls_rows(cl, "diff")["diff/b.safetensors"]
    assert row["stored_new_bytes"] < 8192 * 4 + 4096 * 4 + 800 + 4096, row
    assert row["parent"]["path"] == "diff/a.safetensors", row


# --------------------------------------------------------------------------
# 3. deleting checkpoints 1..5
# --------------------------------------------------------------------------

def test_delete_first_half_of_series(cl, series):
    half = SERIES_N // 2
    owners = {k: ckpt_json(cl, "owners", series_path(k)) for k in range(1, SERIES_N + 1)}
    ids = {k: owners[k]["checkpoint"]["id"] for k in owners}
    units = {k: {t["blake3"] for t in owners[k]["tensors"]} for k in owners}
    kept_units = set().union(*(units[k] for k in range(half + 1, SERIES_N + 1)))
    gone_units = set().union(*(units[k] for k in range(1, half + 1))) - kept_units
    assert len(gone_units) == half * (SERIES_TENSORS - FROZEN), len(gone_units)
    # deltas of the kept checkpoints keep their bases (maybe units of 1..5) alive
    bases = needed_bases(cl, 0, kept_units)
    kept_units |= bases
    gone_units -= bases
    records = unit_records(cl, 0)
    for h in gone_units | kept_units:
        assert h in records, f"unit {h} missing from rank 0's store before any delete"
    gone_record_bytes = sum(UNIT_HEADER + records[h][2]["body_len"] for h in gone_units)
    du0 = ckpt_json(cl, "du")
    # unlink through /fanstore, from the writer's node and from others
    for k, node in zip(range(1, half + 1), (0, 2, 3, 1, 2)):
        py(cl, node, """
            import os, sys
            os.unlink(sys.argv[1])
            assert not os.path.exists(sys.argv[1])
        """, f"{MOUNT}/{series_path(k)}")
    py(cl, 3, """
        import os, sys
        half, n = int(sys.argv[1]), int(sys.argv[2])
        names = sorted(os.listdir('/fanstore/run'))
        assert names == ['ckpt-%02d.safetensors' % k for k in range(half + 1, n + 1)], names
    """, half, SERIES_N)

    # every byte of the rest still reads back, on another node and on the holder
    rest = {series_path(k): series[series_path(k)] for k in range(half + 1, SERIES_N + 1)}
    assert_read_back(cl, 1, rest)
    assert_read_back(cl, 0, {series_path(SERIES_N): series[series_path(SERIES_N)]})

    rows = ls_rows(cl, "run")
    assert sorted(rows) == sorted(rest), sorted(rows)

    # the units only 1..5 had are released (their records are dead bytes of
    # their pack until it is compacted); the others are all there
    took = wait_until(lambda: rank_du(ckpt_json(cl, "du"), 0)["units"] == len(kept_units))
    if took and took > 0.2:
        print(f"\nunits of deleted checkpoints were released {took:.1f} s after the unlinks returned")
    r0 = rank_du(ckpt_json(cl, "du"), 0)
    assert r0["units"] == len(kept_units), f"rank 0 holds {r0['units']} units, the live checkpoints need {len(kept_units)}"
    records = unit_records(cl, 0)
    missing = sorted(h for h in kept_units if h not in records)
    assert not missing, f"units of live checkpoints deleted: {missing}"
    still_bytes = sum(UNIT_HEADER + records[h][2]["body_len"] for h in gone_units if h in records)
    assert r0["pack_dead_bytes"] >= still_bytes, f"released records still in a pack ({still_bytes} B) are dead bytes: {r0}"
    if still_bytes < gone_record_bytes:
        print(f"\ncompaction gave back {gone_record_bytes - still_bytes} of {gone_record_bytes} B of released units")

    # du agrees with the disk, per rank and in total
    du = ckpt_json(cl, "du")
    assert du["deleted"] - du0["deleted"] == half, (du0, du)
    assert du0["checkpoints"] - du["checkpoints"] == half, (du0, du)
    total = 0
    for r in range(cl.nranks):
        disk = disk_usage(cl, r)
        rd = rank_du(du, r)
        total += disk["physical_bytes"]
        assert rd["physical_bytes"] == disk["physical_bytes"], f"rank {r}: du says {rd}, disk has {disk}"
        assert rd["unit_file_bytes"] + rd["pack_dead_bytes"] == disk["pack_bytes"] and rd["packs"] == disk["packs"], (r, rd, disk)
        assert rd["recipe_bytes"] == disk["recipe_bytes"] and rd["catalog_bytes"] == disk["catalog_bytes"], (r, rd, disk)
        assert not disk["other_nonempty"], f"rank {r}: files left in the store dir: {disk['other_nonempty']}"
    assert du["physical_bytes"] == total, (du, total)
    r0 = rank_du(du, 0)
    model = series[series_path(1)]["len"]
    # 5 live checkpoints: the frozen half once, the moving half 5 times (before deltas and compression)
    expect = (FROZEN + half * (SERIES_TENSORS - FROZEN)) * TENSOR_BYTES
    assert r0["referenced_unit_bytes"] == expect, (r0, expect)
    assert r0["units"] == len(kept_units), (r0, len(kept_units))
    live_physical = r0["physical_bytes"] - r0["pack_dead_bytes"]
    assert live_physical <= expect + len(kept_units) * (TENSOR_BYTES + UNIT_HEADER) - len(kept_units) * TENSOR_BYTES + 2 * model // SERIES_TENSORS, (r0, expect)
    print(f"\nafter deleting 1..{half}: rank 0 physical {r0['physical_bytes']} B = {r0['physical_bytes'] / model:.3f} x model")

    # lineage survives through the tombstones; owners still name checkpoint 1
    log = ckpt_json(cl, "log", series_path(SERIES_N))
    assert [a["path"] for a in log["ancestors"]] == [series_path(k) for k in range(SERIES_N - 1, 0, -1)], log
    assert [a["live"] for a in log["ancestors"]] == [True] * (SERIES_N - 1 - half) + [False] * half, log
    own = ckpt_json(cl, "owners", series_path(SERIES_N))
    frozen_owner = {t["owner"]["id"] for t in own["tensors"] if int(t["name"][5:7]) < FROZEN}
    assert frozen_owner == {ids[1]}, own["tensors"][:2]
    assert all(t["owner"]["live"] is False and t["owner"]["path"] == series_path(1)
               for t in own["tensors"] if int(t["name"][5:7]) < FROZEN), own["tensors"][:2]
    code, v, r = ckpt(cl, "verify", check=False)
    assert code == 0 and v["ok"] is True, f"verify after the deletes exited {code}: {r.stdout}"


# --------------------------------------------------------------------------
# 5. malformed checkpoints
# --------------------------------------------------------------------------

WRITE_BAD = """
    import json
    import ckpt_gen as gen
    print(json.dumps(gen.write_files('bad', gen.malformed())))
"""


def test_malformed_checkpoints_stored_as_chunks(cl, formats):
    written = py_json(cl, 3, WRITE_BAD)
    assert len(written) == len(gen.malformed())
    assert_read_back(cl, 1, written)
    assert_read_back(cl, 3, written)
    st = cl.cli("status")
    assert st.returncode == 0, st
    for r in range(cl.nranks):
        with cl.client(r) as c:
            c.ping()
    rows = ls_rows(cl, "bad")
    assert sorted(rows) == sorted(written), f"ckpt ls bad: {sorted(rows)}"
    for p, row in rows.items():
        assert row["format"] == OPAQUE, f"{p}: malformed input recognised as {row['format']}"
        assert row["logical_bytes"] == written[p]["len"] and row["units"] >= 1, row
    code, v, r = ckpt(cl, "verify", "bad/overlap.safetensors", check=False)
    assert code == 0 and v["ok"], r.stdout
    # and the daemons keep serving everyone
    assert_read_back(cl, 2, {"fmt/model.safetensors": formats["fmt/model.safetensors"]})


# --------------------------------------------------------------------------
# 4. a damaged unit
# --------------------------------------------------------------------------

WRITE_CORRUPT = """
    import json
    import numpy as np
    from safetensors.numpy import save
    import ckpt_gen as gen
    rng = np.random.default_rng(77)
    shared = rng.random(65536, dtype=np.float32)
    # d and e come last so that the store's hot copies (the last two commits,
    # served without decoding) are theirs, not those of a, b or c
    files = {'a': {'shared': shared, 'only_a': rng.random(65536, dtype=np.float32)},
             'b': {'shared': shared, 'only_b': rng.random(65536, dtype=np.float32)},
             'c': {'only_c': rng.random(65536, dtype=np.float32)},
             'd': {'only_d': rng.random(65536, dtype=np.float32)},
             'e': {'only_e': rng.random(65536, dtype=np.float32)}}
    print(json.dumps(gen.write_files('corrupt', {n + '.safetensors': save(d) for n, d in files.items()})))
"""


def test_corrupted_unit_detected_and_eio(cl):
    written = py_json(cl, 0, WRITE_CORRUPT)
    a, b, c_ = "corrupt/a.safetensors", "corrupt/b.safetensors", "corrupt/c.safetensors"
    code, v, r = ckpt(cl, "verify", check=False)
    assert code == 0 and v["ok"], f"store damaged before the test damaged it: {r.stdout}"
    own = {t["name"]: t for t in ckpt_json(cl, "owners", a)["tensors"]}
    h = own["shared"]["blake3"]
    f, off, head = unit_records(cl, 0)[h]
    assert head["len"] == 65536 * 4 and head["body_len"] > 12346, head
    with open(f, "r+b") as fh:
        fh.seek(off + UNIT_HEADER + 12345)
        x = fh.read(1)
        fh.seek(off + UNIT_HEADER + 12345)
        fh.write(bytes([x[0] ^ 0x20]))

    code, v, r = ckpt(cl, "verify", check=False)
    assert code == 1, f"ckpt verify exited {code} with a damaged unit\n{r.stdout}\n{r.stderr}"
    assert v is not None and v["ok"] is False, r.stdout
    probs = {(p["checkpoint"]["path"], p["tensor"], p["unit"]) for p in v["problems"]}
    assert probs == {(a, "shared", h), (b, "shared", h)}, f"verify problems: {v['problems']}"
    assert all(p["problem"] for p in v["problems"]), v["problems"]
    code, v, r = ckpt(cl, "verify", f"{MOUNT}/{a}", check=False)
    assert code == 1 and v["checkpoints"] == 1 and [p["tensor"] for p in v["problems"]] == ["shared"], r.stdout
    code, v, r = ckpt(cl, "verify", c_, check=False)
    assert code == 0 and v["ok"] and v["checkpoints"] == 1, r.stdout

    # reading an affected checkpoint: EIO, never wrong bytes, on any node
    for node, p in ((2, a), (0, a), (3, b), (0, b)):
        got = read_hashes(cl, node, [p])[p]
        if "errno" not in got:
            what = "the original bytes (served from a cache?)" if got["sha256"] == written[p]["sha256"] else "WRONG bytes"
            pytest.fail(f"node {node}: reading {p} with a damaged unit succeeded and returned {what}: {got}")
        assert got["errno"] == 5, f"node {node}: reading {p} failed with errno {got['errno']} ({got['error']}), expected EIO"
    # an unaffected checkpoint still reads fine
    assert_read_back(cl, 3, {c_: written[c_]})
    assert_read_back(cl, 0, {c_: written[c_]})
    st = cl.cli("status")
    assert st.returncode == 0

    # deleting both affected checkpoints frees the damaged unit; the store verifies again
    py(cl, 1, f"import os; os.unlink('{MOUNT}/{a}'); os.unlink('{MOUNT}/{b}')")
    wait_until(lambda: ckpt(cl, "verify", check=False)[0] == 0)
    code, v, r = ckpt(cl, "verify", check=False)
    assert code == 0 and v["ok"], f"verify after deleting the damaged checkpoints: exit {code}\n{r.stdout}"
    # its record is dead bytes of its pack (or gone with it, compacted)
    r0 = rank_du(ckpt_json(cl, "du"), 0)
    if h in unit_records(cl, 0):
        assert r0["pack_dead_bytes"] >= UNIT_HEADER + head["body_len"], (r0, head)


WRITE_HEADS = """
    import json, os, sys
    import numpy as np
    from safetensors.numpy import save
    rng = np.random.default_rng(5)
    body = [rng.standard_normal(16384).astype(np.float32) for _ in range(8)]
    def model(layers, classes, seed):
        d = {'body.%d.weight' % i: t for i, t in enumerate(layers)}
        d['head.weight'] = np.random.default_rng(seed).standard_normal((classes, 256)).astype(np.float32)
        return save(d)
    tuned = body[:6] + [t + np.float32(0.01) for t in body[6:]]
    other = [rng.standard_normal(16384).astype(np.float32)] + body[1:]     # layer 0 differs
    os.makedirs('/fanstore/heads', exist_ok=True)
    for name, b in (('pretrained', model(body, 10, 1)), ('tuned', model(tuned, 10, 2)),
                    ('other', model(other, 10, 3))):
        open('/fanstore/heads/%s.safetensors' % name, 'wb').write(b)
    # the new architecture: the pretrained body, a head of 5 classes; a plain local file
    open(sys.argv[1], 'wb').write(model(body, 5, 4))
    print(json.dumps({}))
"""


def test_match_ranks_by_prefix_on_a_changed_head(cl, tmp_path):
    """`ckpt match FILE` ranks stored checkpoints by the longest prefix of the
    file's tensors they hold equal, then by shared tensors; `ckpt match PATH`
    does the same for a stored checkpoint and leaves it out."""
    new = tmp_path / "new-head.safetensors"
    py_json(cl, 2, WRITE_HEADS, new)
    m = ckpt_json(cl, "match", str(new))
    got = [(x["path"], x["prefix"], x["shared"]) for x in m["matches"]]
    assert m["query_tensors"] == 9, m
    assert got == [("heads/pretrained.safetensors", 8, 8), ("heads/tuned.safetensors", 6, 6),
                   ("heads/other.safetensors", 0, 7)], m
    assert all(x["rank"] == 2 for x in m["matches"]), m
    assert m["matches"][0]["shared_bytes"] == 8 * 16384 * 4, m
    m = ckpt_json(cl, "match", f"{MOUNT}/heads/tuned.safetensors")
    got = [(x["path"], x["prefix"], x["shared"]) for x in m["matches"]]
    assert got == [("heads/pretrained.safetensors", 6, 6), ("heads/other.safetensors", 0, 5)], m
    table = cl.cli("ckpt", "match", str(new)).stdout
    first = [ln for ln in table.splitlines() if "heads/" in ln][0]
    assert "heads/pretrained.safetensors" in first and "8/9" in first, table
    r = cl.cli("ckpt", "match", "heads/none.safetensors", check=False)
    assert r.returncode != 0 and "no checkpoint" in (r.stdout + r.stderr), (r.stdout, r.stderr)


# --------------------------------------------------------------------------
# 6. persistence across jobs
# --------------------------------------------------------------------------

WRITE_PERSIST = """
    import hashlib, json, os, sys
    import numpy as np
    from safetensors.numpy import save
    ks = [int(k) for k in sys.argv[1].split(',')]
    rng = np.random.default_rng(31)
    base = [rng.random(131072, dtype=np.float32) for _ in range(8)]       # 8 x 512 KiB
    def state(k):
        # checkpoint k changes tensors 2(k-2) and 2(k-2)+1 (k >= 2); checkpoint 4 changes tensor 4 only
        d = {}
        for i, t in enumerate(base):
            step = 0
            for j in range(2, k + 1):
                if (j <= 3 and i in (2 * (j - 2), 2 * (j - 2) + 1)) or (j == 4 and i == 4):
                    step = j
            d['p%d' % i] = t + np.float32(step)
        return d
    os.makedirs('/fanstore/keep', exist_ok=True)
    out = {}
    for k in ks:
        b = save(state(k))
        p = '/fanstore/keep/step-%d.safetensors' % k
        open(p + '.tmp', 'wb').write(b)
        os.replace(p + '.tmp', p)
        out['keep/step-%d.safetensors' % k] = {'sha256': hashlib.sha256(b).hexdigest(), 'len': len(b)}
    print(json.dumps(out))
"""


def test_persist_and_dedup_across_jobs(bins, tmp_path):
    _, data = packed_dataset(bins, tmp_path, n_files=4, seed=12, partitions=2)
    persist = tmp_path / "persist"
    c1 = start_cluster(bins, data, tmp_path / "c1", nranks=2, mount=MOUNT, extra_args=["--persist", persist])
    try:
        w1 = py_json(c1, 1, WRITE_PERSIST, "1,2,3")
        rows1 = ls_rows(c1, "keep")
        assert sorted(rows1) == sorted(w1), rows1
    finally:
        c1.stop()
    drained = persist / "ckpt" / "rank-1"
    assert (drained / "catalog.fsc").is_file(), f"no drained store at {drained}: {sorted(p for p in persist.rglob('*'))[:50]}"
    assert {p.suffix for p in (drained / "units").iterdir()} == {".fsk"}, sorted((drained / "units").iterdir())
    drained_records = 0
    for p in (drained / "units").glob("*.fsk"):
        size, off = p.stat().st_size, PACK_HEADER
        with open(p, "rb") as f:
            while off < size:
                f.seek(off)
                off += UNIT_HEADER + unit_header(f.read(UNIT_HEADER))["body_len"]
                drained_records += 1
        assert off == size, p
    assert drained_records == 8 + 2 + 2, drained_records
    assert len(list((drained / "recipes").glob("*.fsr"))) == 3

    c2 = start_cluster(bins, data, tmp_path / "c2", nranks=3, mount=MOUNT, extra_args=["--persist", persist])
    try:
        assert_read_back(c2, 2, w1)
        assert_read_back(c2, 1, w1)
        rows2 = ls_rows(c2, "keep")
        assert rows2 == rows1, f"ls after restart:\n{rows2}\nbefore:\n{rows1}"
        log = ckpt_json(c2, "log", "keep/step-3.safetensors")
        assert [x["path"] for x in log["ancestors"]] == ["keep/step-2.safetensors", "keep/step-1.safetensors"], log
        w2 = py_json(c2, 1, WRITE_PERSIST, "4")
        assert_read_back(c2, 0, w2)
        rows = ls_rows(c2, "keep")
        r4 = rows["keep/step-4.safetensors"]
        print(f"\nstep-4 after restart: stored {r4['stored_new_bytes']} new of {r4['logical_bytes']} bytes")
        assert r4["stored_new_bytes"] <= 131072 * 4 + 4096, r4
        assert r4["stored_new_bytes"] < r4["logical_bytes"] / 4, r4
        assert r4["parent"] is not None and r4["parent"]["path"] == "keep/step-3.safetensors", r4
        assert r4["parent"]["id"] == rows1["keep/step-3.safetensors"]["id"], (r4, rows1)
        assert r4["id"] not in {r["id"] for r in rows1.values()}, "checkpoint ids restarted after the restart"
        own = {t["name"]: t["owner"]["path"] for t in ckpt_json(c2, "owners", "keep/step-4.safetensors")["tensors"]}
        assert own == {"p0": "keep/step-2.safetensors", "p1": "keep/step-2.safetensors",
                       "p2": "keep/step-3.safetensors", "p3": "keep/step-3.safetensors",
                       "p4": "keep/step-4.safetensors", "p5": "keep/step-1.safetensors",
                       "p6": "keep/step-1.safetensors", "p7": "keep/step-1.safetensors"}, own
        code, v, r = ckpt(c2, "verify", check=False)
        assert code == 0 and v["ok"] and v["checkpoints"] == 4, r.stdout
    finally:
        c2.stop()


WRITE_FRESH = """
    import hashlib, json, os, sys
    import numpy as np
    from safetensors.numpy import save
    os.makedirs('/fanstore/fresh', exist_ok=True)
    out = {}
    def put(name, tensors):
        b = save(tensors)
        with open('/fanstore/fresh/' + name, 'wb') as f:
            f.write(b)
        out['fresh/' + name] = {'sha256': hashlib.sha256(b).hexdigest(), 'len': len(b)}
    rng = np.random.default_rng(77)
    first = {'t%d' % i: rng.integers(0, 256, 2 << 20, dtype=np.uint8) for i in range(8)}   # 16 MiB of noise
    put('r-0.safetensors', first)
    for k in (1, 2):
        put('r-%d.safetensors' % k, {'t%d' % i: rng.integers(0, 256, 2 << 20, dtype=np.uint8) for i in range(8)})
    # Half of r-0's tensors: too little new to adopt, copied into a pack.
    put('half.safetensors', {**{'t%d' % i: first['t%d' % i] for i in range(4)},
                              **{'u%d' % i: rng.integers(0, 256, 2 << 20, dtype=np.uint8) for i in range(4)}})
    print(json.dumps(out))
"""


def extent_files(d: Path) -> list:
    """The extent files (fanstore-ckpt/src/extent.rs) of the store directory `d`."""
    return sorted((d / "units").glob("*.fsx")) if (d / "units").is_dir() else []


def test_fresh_incompressible_checkpoints_are_adopted_not_copied_across_drain_and_restart(bins, tmp_path):
    """A checkpoint of new random tensors is linked into the store as an extent
    (its units' payloads are not copied into a pack); it reads back on every node,
    an unlink frees its extent, a drain copies extents, the next job reads them."""
    _, data = packed_dataset(bins, tmp_path, n_files=4, seed=13, partitions=2)
    persist = tmp_path / "persist"
    c1 = start_cluster(bins, data, tmp_path / "c1", nranks=2, mount=MOUNT, extra_args=["--persist", persist])
    try:
        w = py_json(c1, 1, WRITE_FRESH)
        wait_stored(c1)
        d = store_dir(c1, 1)
        xs = extent_files(d)
        sizes = sorted(x.stat().st_size for x in xs)
        lens = sorted(w[f"fresh/r-{k}.safetensors"]["len"] for k in range(3))
        assert sizes == lens, f"one extent per fresh checkpoint, the file itself: {xs} {sizes} vs {lens}"
        packs = sum(p.stat().st_size for p in (d / "units").glob("*.fsk"))
        assert 4 * (2 << 20) <= packs < 4 * (2 << 20) + (1 << 20), f"only half.safetensors' new tensors copied: {packs} B"
        rows = ls_rows(c1, "fresh")
        assert rows["fresh/r-0.safetensors"]["stored_new_bytes"] >= 16 << 20, rows["fresh/r-0.safetensors"]
        assert_read_back(c1, 1, w)
        assert_read_back(c1, 0, w)
        py(c1, 1, "import os; os.unlink('/fanstore/fresh/r-1.safetensors')")
        del w["fresh/r-1.safetensors"]
        wait_stored(c1)
        left = sorted(x.name for x in extent_files(d))
        assert len(left) == 2, left
        code, v, r = ckpt(c1, "verify", check=False)
        assert code == 0 and v["ok"], r.stdout
    finally:
        c1.stop()
    drained = persist / "ckpt" / "rank-1"
    assert sorted(x.name for x in extent_files(drained)) == left, sorted((drained / "units").iterdir())
    c2 = start_cluster(bins, data, tmp_path / "c2", nranks=2, mount=MOUNT, extra_args=["--persist", persist])
    try:
        assert_read_back(c2, 0, w)
        assert_read_back(c2, 1, w)
        code, v, r = ckpt(c2, "verify", check=False)
        assert code == 0 and v["ok"] and v["checkpoints"] == 3, r.stdout
    finally:
        c2.stop()


# --------------------------------------------------------------------------
# --dedup off, --dedup-min
# --------------------------------------------------------------------------

WRITE_PLAIN = """
    import json
    import numpy as np
    from safetensors.numpy import save
    import ckpt_gen as gen
    rng = np.random.default_rng(8)
    files = {'one.safetensors': save({'a': rng.random(300000, dtype=np.float32)}),      # 1.2 MB
             'half.safetensors': save({'a': rng.random(100000, dtype=np.float32)}),     # 400 KB
             'model.pt': gen.torch_zip(gen.format_samples()[0]),
             'mib.bin': rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes(),
             'mib_minus_1.bin': rng.integers(0, 256, (1 << 20) - 1, dtype=np.uint8).tobytes()}
    print(json.dumps(gen.write_files('o', files)))
"""


@pytest.mark.parametrize("args,in_store", [
    (["--dedup", "off"], []),
    (["--dedup-min", "1M"], ["o/mib.bin", "o/one.safetensors"]),
])
def test_dedup_flags(bins, tmp_path, args, in_store):
    _, data = packed_dataset(bins, tmp_path, n_files=4, seed=13, partitions=2)
    c = start_cluster(bins, data, tmp_path / "c", nranks=2, mount=MOUNT, extra_args=args)
    try:
        written = py_json(c, 1, WRITE_PLAIN)
        assert_read_back(c, 0, written)
        if "off" in args:
            # no store at all: the queries say so (exit 1), naming the flag
            for q in (["ls"], ["du"], ["verify"]):
                code, _doc, r = ckpt(c, *q, check=False)
                assert code == 1 and "--dedup off" in r.stderr, (q, code, r.stdout, r.stderr)
        else:
            rows = ls_rows(c)
            assert sorted(rows) == sorted(in_store), f"with {args}: ckpt ls lists {sorted(rows)}"
            du = ckpt_json(c, "du")
            assert du["checkpoints"] == len(in_store), du
            assert du["logical_bytes"] == sum(written[p]["len"] for p in in_store), du
        # the rest are plain files on the writer's local directory, byte for byte
        out = c.local / "rank-1" / "out"
        plain = [q for q in out.rglob("*") if q.is_file() and store_dir(c, 1) not in q.parents]
        for p, w in written.items():
            same = [q for q in plain if q.stat().st_size == w["len"]]
            if p in in_store:
                assert not same, f"with {args}: {p} is in the store and also a plain file {same}"
            else:
                assert any(hashlib.sha256(q.read_bytes()).hexdigest() == w["sha256"] for q in same), \
                    f"with {args}: {p} is not a plain file under {out}"
        units = unit_records(c, 1)
        assert bool(units) == bool(in_store), (args, sorted(units))
    finally:
        c.stop()


HOT_COPIES = """
    import json, os
    out = {'targets': {}, 'ok': {}}
    os.makedirs('/fanstore/hot', exist_ok=True)
    def target(p):
        fd = os.open(p, os.O_RDONLY)
        try:
            return os.readlink('/proc/self/fd/%d' % fd), os.pread(fd, 1 << 22, 0)
        finally:
            os.close(fd)
    files = {}
    for k in range(4):
        p = '/fanstore/hot/c%d.bin' % k
        files[p] = os.urandom(300_000 + k)
        with open(p, 'wb') as f:
            f.write(files[p])
    # A writer that keeps a second fd (not through the mount) past its close.
    p = '/fanstore/hot/left-open.bin'
    files[p] = os.urandom(200_000)
    fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, files[p])
    other = os.open('/proc/self/fd/%d' % fd, os.O_WRONLY)
    os.close(fd)                                   # the commit
    for p, b in files.items():
        t, got = target(p)
        out['targets'][p] = t
        out['ok'][p] = got == b
    os.pwrite(other, b'written after the close', 0)
    os.close(other)
    t, got = target(p)
    out['after'] = {'target': t, 'ok': got == files[p]}
    print(json.dumps(out))
"""


def test_hot_copies_are_the_files_written_unless_still_writable(bins, tmp_path):
    """Default flags: every checkpoint committed on a node is served from
    the unnamed local file its program wrote (within --ckpt-hot-size), not
    rebuilt; one that something still had open for writing at its last
    close (here a second fd opened outside the mount) is read from the
    store, and a later write through that fd changes nothing a reader sees."""
    _, data = packed_dataset(bins, tmp_path, n_files=4, seed=17, partitions=1)
    c = start_cluster(bins, data, tmp_path / "c", nranks=0, mount=MOUNT)
    try:
        got = py_json(c, 0, HOT_COPIES)
        assert all(got["ok"].values()), got
        for k in range(4):
            # The file written: its plain link out/<id> while its commit runs
            # behind the close, then the unnamed hot copy (out/<id> deleted).
            t = got["targets"][f"/fanstore/hot/c{k}.bin"]
            assert str(c.local) in t and ("(deleted)" in t or "/out/" in t) and "memfd" not in t, (k, t)
        t = got["targets"]["/fanstore/hot/left-open.bin"]
        assert t.startswith("/memfd:fanstore:ckpt"), t
        assert got["after"]["ok"] and got["after"]["target"].startswith("/memfd:fanstore:ckpt"), got["after"]
        assert ckpt_json(c, "du")["checkpoints"] == 5

        # The files it keeps are page cache, not the daemon's memory: its
        # resident file pages do not grow by the checkpoints it commits.
        def rss_file_kib():
            (pid,) = c.pids()
            st = Path(f"/proc/{pid}/status").read_text()
            return int(next(ln for ln in st.splitlines() if ln.startswith("RssFile:")).split()[1])
        before = rss_file_kib()
        py(c, 0, """
            import os
            for k in range(4):
                with open('/fanstore/hot/big%d.bin' % k, 'wb') as f:
                    f.write(os.urandom(16 << 20))
            for k in range(4):
                assert len(open('/fanstore/hot/big%d.bin' % k, 'rb').read()) == 16 << 20
        """)
        wait_stored(c)  # once stored, as while queued behind their closes
        grown = rss_file_kib() - before
        assert grown < 16 << 10, f"daemon RssFile grew by {grown} KiB after committing 4 x 16 MiB"
        t = py_json(c, 0, FD_TARGETS, "/fanstore/hot/big0.bin")["/fanstore/hot/big0.bin"]
        assert "memfd" not in t, t

        # Many small outputs: at most --ckpt-hot (default 64) hot copies, each
        # an fd and a mapping in the daemon, whatever --ckpt-hot-size holds.
        py(c, 0, """
            import os
            for k in range(80):
                with open('/fanstore/hot/small%02d.bin' % k, 'wb') as f:
                    f.write(os.urandom(70 << 10))
        """)
        assert ckpt_json(c, "du")["hot_copy_bytes"] == 64 * (70 << 10)
    finally:
        c.stop()


def test_local_dir_in_memory_keeps_one_hot_copy_and_no_disk_copies(bins, tmp_path):
    """A local dir on tmpfs (a diskless node) is RAM the program needs: the
    store keeps only its newest commit as a hot copy, and no node copies go
    there (--cache-disk is ignored)."""
    _, data = packed_dataset(bins, tmp_path, n_files=4, seed=19, partitions=1)
    with tmpfs_local_dir(tmp_path / "c", "256m", "the local dir"):
        c = start_cluster(bins, data, tmp_path / "c", nranks=0, mount=MOUNT)
        try:
            py(c, 0, """
                import os
                os.makedirs('/fanstore/mem', exist_ok=True)
                for k in range(3):
                    with open('/fanstore/mem/c%d.bin' % k, 'wb') as f:
                        f.write(os.urandom((1 << 20) + k))
            """)
            du = ckpt_json(c, "du")
            assert du["checkpoints"] == 3, du
            assert du["hot_copy_bytes"] == (1 << 20) + 2, du
            log = c.log()
            assert "is in memory (tmpfs): the checkpoint store keeps only its newest commit" in log, log[-3000:]
            assert "is in memory (tmpfs): no node copies on it" in log, log[-3000:]
            written = read_hashes(c, 0, [f"mem/c{k}.bin" for k in range(3)])
            assert all("errno" not in v for v in written.values()), written
        finally:
            c.stop()


BEHIND_THE_CLOSE = """
    import hashlib, json, os, sys
    d = '/fanstore/bg'
    os.makedirs(d, exist_ok=True)
    out = {}
    for k in range(4):
        p = '%s/c%d.bin' % (d, k)
        b = os.urandom(48 << 20)
        with open(p, 'wb') as f:
            f.write(b)
        # Right after the close: visible, whole and exact (the commit into the
        # store runs behind it).
        with open(p, 'rb') as f:
            got = f.read()
        out[p] = {'ok': got == b and os.stat(p).st_size == len(b), 'sha256': hashlib.sha256(b).hexdigest()}
        if k == 1:
            os.unlink(p)  # before its commit (most likely): the commit is cancelled
            out.pop(p)
    print(json.dumps(out))
"""


def test_commits_run_behind_the_close_and_a_kill_loses_none(bins, tmp_path):
    """A checkpoint's close returns before the store has split it: it reads
    back exact at once, an unlink right after its close leaves nothing in
    the store, and `fanstore ckpt ls` answers once the queued commits are
    stored (their plain links out/<id> then gone). Then a second batch and a
    kill -9 right after its closes: the restart with the same --local serves
    every closed file exact and stores those the kill left plain outputs."""
    _, data = packed_dataset(bins, tmp_path, n_files=4, seed=19, partitions=1)
    c = start_cluster(bins, data, tmp_path / "c", nranks=0, mount=MOUNT)
    try:
        got = py_json(c, 0, BEHIND_THE_CLOSE)
        assert sorted(got) == [f"/fanstore/bg/c{k}.bin" for k in (0, 2, 3)], got
        assert all(v["ok"] for v in got.values()), got
        rows = ls_rows(c, "bg")
        assert sorted(rows) == ["bg/c0.bin", "bg/c2.bin", "bg/c3.bin"], rows
        out = c.local / "rank-0" / "out"
        plain = [p.name for p in out.iterdir() if p.is_file() and p.name.isdigit()]
        assert plain == [], f"plain links left after the commits: {plain}"
        assert "stays a plain output" not in c.log(), c.log()[-3000:]
        assert ckpt_json(c, "du")["checkpoints"] == 3
        # 48 MiB of noise each: adopted whole as extents, not copied into packs.
        assert len(extent_files(store_dir(c, 0))) == 3, sorted((store_dir(c, 0) / "units").iterdir())
        assert_read_back(c, 0, {p.removeprefix("/fanstore/"): {"sha256": v["sha256"], "len": 48 << 20}
                                for p, v in got.items()})
        second = py_json(c, 0, BEHIND_THE_CLOSE.replace("/fanstore/bg", "/fanstore/bg2"))
    finally:
        local, c.local = c.local, tmp_path / "not-removed"
        c.kill()
    c2 = start_cluster(bins, data, tmp_path / "c", nranks=0, mount=MOUNT)
    try:
        want = {p.removeprefix("/fanstore/"): {"sha256": v["sha256"], "len": 48 << 20}
                for p, v in {**got, **second}.items()}
        # The restart registers them again in the background.
        assert wait_until(lambda: re.search(r"rank 0: recovered \d+ outputs of a killed run", c2.log()),
                          timeout=60) is not None, c2.log()[-3000:]
        assert_read_back(c2, 0, want)
        assert sorted(ls_rows(c2, "bg")) == ["bg/c0.bin", "bg/c2.bin", "bg/c3.bin"]
        # The second batch, closed but maybe not stored at the kill: the
        # restart stores what was left a plain output.
        names = ["bg2/c0.bin", "bg2/c2.bin", "bg2/c3.bin"]
        assert wait_until(lambda: sorted(ls_rows(c2, "bg2")) == names, timeout=60) is not None, ls_rows(c2, "bg2")
        out = c2.local / "rank-0" / "out"
        plain = [p.name for p in out.iterdir() if p.is_file() and p.name.isdigit()]
        assert plain == [], f"plain links left after the recovered commits: {plain}"
        # One extent per stored file: none left behind by commits the kill cut short.
        assert len(extent_files(store_dir(c2, 0))) == 6, sorted((store_dir(c2, 0) / "units").iterdir())
        assert_read_back(c2, 0, want)
    finally:
        c2.stop()
    del local
