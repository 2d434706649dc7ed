"""Client matrix, DataLoader-shaped readers: forked worker pools and threads.

The parent lists /fanstore, holds a virtual file open, then a multiprocessing
Pool (start method 'fork', 4 workers; 'spawn' and 'forkserver' below) opens, reads and decodes random files
(PNG with pillow, .npy with numpy, raw bytes) for 3 epochs. Every byte is
checked against md5s of the SOURCE tree computed here, outside the cluster.
"""
import hashlib
import json

import numpy as np
import pytest
from PIL import Image

from fs_clients import start_fs


@pytest.fixture(scope="module")
def fs(bins, tmp_path_factory):
    yield from start_fs(bins, tmp_path_factory, "workers", codec="zstd:3")  # zstd here, lz4 elsewhere, raw in failures


LOADER = r'''
import hashlib, json, multiprocessing as mp, os, random, sys, time
import numpy as np
from PIL import Image
root, expected_path, held_rel = sys.argv[1], sys.argv[2], sys.argv[3]
expected = json.load(open(expected_path))

def decode(rel):
    p = os.path.join(root, rel)
    with open(p, "rb") as f:
        data = f.read()
    r = {"md5": hashlib.md5(data).hexdigest(), "pid": os.getpid()}
    if rel.endswith(".png"):
        with Image.open(p) as im:
            im.load()
            r["px"] = hashlib.md5(np.asarray(im).tobytes()).hexdigest()
    elif rel.endswith(".npy"):
        r["px"] = hashlib.md5(np.ascontiguousarray(np.load(p)).tobytes()).hexdigest()
    return rel, r

# the parent lists the dataset (virtual readdir + stat) before forking
listed = []
for d, _, fl in os.walk(root):
    listed += [os.path.relpath(os.path.join(d, f), root) for f in fl]
listed.sort()
# and holds a virtual file open across the forks
held = open(os.path.join(root, held_rel), "rb")
held_md5 = hashlib.md5()
held_md5.update(held.read(1000))

ctx = mp.get_context("fork")
rng = random.Random(7)
samples = sorted(k for k in expected if k.endswith((".png", ".npy")))
others = sorted(k for k in expected if not k.endswith((".png", ".npy")))
errors, seen, pids = [], 0, set()
with ctx.Pool(4) as pool:
    for epoch in range(3):
        order = samples + rng.sample(others, min(60, len(others)))
        rng.shuffle(order)
        for rel, r in pool.imap_unordered(decode, order, chunksize=4):
            seen += 1
            pids.add(r["pid"])
            want = expected[rel]
            if r["md5"] != want["md5"] or r.get("px") != want.get("px"):
                errors.append([epoch, rel, r, want])
        chunk = held.read(100000)       # the parent keeps reading its own open file between epochs
        held_md5.update(chunk)
held_md5.update(held.read())
held.close()
# a fresh pool after the first one: children fork from a parent with a live connection
with ctx.Pool(2) as pool:
    for rel, r in pool.map(decode, samples[:10]):
        if r["md5"] != expected[rel]["md5"]:
            errors.append(["second pool", rel, r])
print(json.dumps({"listed": listed, "errors": errors[:10], "nerrors": len(errors), "seen": seen,
                  "workers": len(pids - {os.getpid()}), "held": held_md5.hexdigest()}))
'''


def expected_digests(fs):
    exp = {}
    for f in fs.src.files:
        e = {"md5": fs.src.md5(f)}
        if f.endswith(".png"):
            with Image.open(fs.src.path(f)) as im:
                im.load()
                e["px"] = hashlib.md5(np.asarray(im).tobytes()).hexdigest()
        elif f.endswith(".npy"):
            e["px"] = hashlib.md5(np.ascontiguousarray(np.load(fs.src.path(f))).tobytes()).hexdigest()
        exp[f] = e
    return exp


@pytest.mark.parametrize("node", [0, 2])
def test_forked_pool_three_epochs(fs, node):
    exp_path = fs.workdir / "expected.json"
    if not exp_path.exists():
        exp_path.write_text(json.dumps(expected_digests(fs)))
    held = "own/big/text_3m.txt"
    r = fs.py(LOADER, str(exp_path), held, node=node, timeout=240)
    out = json.loads(r.stdout)
    assert out["listed"] == sorted(fs.src.files + fs.src.link_files), "parent's os.walk listing differs from the source tree"
    assert out["nerrors"] == 0, f"{out['nerrors']} mismatching reads in workers, e.g. {out['errors']}"
    n_samples = len([f for f in fs.src.files if f.endswith((".png", ".npy"))])
    assert out["seen"] >= 3 * n_samples > 0
    assert out["workers"] >= 2, "the pool did not use several forked workers"
    assert out["held"] == fs.src.md5(held), "the parent's open file read wrong bytes across forks"


START_METHODS = r'''
import hashlib, json, multiprocessing as mp, os, sys

def md5(path):
    with open(path, "rb") as f:
        return path, hashlib.md5(f.read()).hexdigest(), os.getpid()

if __name__ == "__main__":
    root, listfile = sys.argv[1], sys.argv[2]
    files = open(listfile, encoding="utf-8", errors="surrogateescape").read().splitlines()
    out = {}
    for method in ("spawn", "forkserver"):
        with mp.get_context(method).Pool(2) as pool:
            res = pool.map(md5, [os.path.join(root, f) for f in files], chunksize=8)
        out[method] = {"digests": {os.path.relpath(p, root): h for p, h, _ in res},
                       "workers": len({pid for _, _, pid in res} - {os.getpid()})}
    print(json.dumps(out))
'''


def test_spawn_and_forkserver_pools_read_through_the_preload(fs):
    """Workers started by exec (spawn), or forked by a forkserver process that
    was itself started by exec: the start methods of torch DataLoaders with
    multiprocessing_context= set, and Python 3.14's default on Linux. Each
    worker inherits LD_PRELOAD from the environment, not from a forked parent."""
    files = sorted(fs.src.files)[:120]
    out = fs.py_json(START_METHODS, fs.file_list(files), node=3, timeout=240)
    for method in ("spawn", "forkserver"):
        got = out[method]
        bad = [f for f in files if got["digests"].get(f) != fs.src.md5(f)]
        assert not bad, f"{method}: {len(bad)} wrong or missing reads, e.g. {bad[:5]}"
        assert got["workers"] >= 1, f"{method}: the reads did not run in the pool's workers"


THREADS = r'''
import hashlib, json, os, sys
from concurrent.futures import ThreadPoolExecutor
root, listfile = sys.argv[1], sys.argv[2]
files = open(listfile, encoding='utf-8', errors='surrogateescape').read().splitlines()
def md5(rel):
    with open(os.path.join(root, rel), "rb") as f:
        return rel, hashlib.md5(f.read()).hexdigest(), os.stat(os.path.join(root, rel)).st_size
with ThreadPoolExecutor(8) as ex:
    res = list(ex.map(md5, files * 2))
print(json.dumps(res))
'''


def test_threads_read_concurrently(fs):
    res = json.loads(fs.py(THREADS, fs.file_list(), node=1).stdout)
    assert len(res) == 2 * len(fs.src.files)
    bad = [r for r in res if (r[1], r[2]) != (fs.src.md5(r[0]), fs.src.size(r[0]))]
    assert not bad, f"{len(bad)} wrong reads from 8 threads, e.g. {bad[:5]}"


FORK_EXEC = r'''
import hashlib, os, subprocess, sys
root, rel = sys.argv[1], sys.argv[2]
p = os.path.join(root, rel)
f = open(p, "rb", buffering=0)   # unbuffered: the kernel offset is what is shared
head = f.read(10)
pid = os.fork()
if pid == 0:
    # child: the inherited fd keeps its shared offset; a fresh open works too
    rest = f.readall()
    fresh = open(p, "rb").read()
    ok = hashlib.md5(head + rest).hexdigest() == hashlib.md5(fresh).hexdigest()
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
# after the child consumed the shared offset, the parent is at EOF
left = f.readall()
out = subprocess.run(["md5sum", p], capture_output=True, text=True).stdout.split()[0]
print(os.waitstatus_to_exitcode(status), len(left), out, hashlib.md5(open(p, "rb").read()).hexdigest())
'''


def test_fork_shares_offset_and_subprocess(fs):
    rel = "own/big/random_2m.bin"
    code, left, child_md5, md5 = fs.py(FORK_EXEC, rel, node=3).stdout.split()
    assert code == "0", "forked child read wrong bytes"
    assert left == "0", "fork: parent and child must share the file offset (real kernel fd)"
    assert child_md5 == md5 == fs.src.md5(rel)


ALL_NODES = r"""
import hashlib, json, os, sys
root, listfile = sys.argv[1], sys.argv[2]
files = open(listfile, encoding="utf-8", errors="surrogateescape").read().splitlines()
node = int(os.environ["FANSTORE_NODE"])
order = files[node::1] + files[:node]          # each node starts at a different place
res = {}
for rep in range(2):
    for rel in order:
        with open(os.path.join(root, rel), "rb") as f:
            h = hashlib.md5(f.read()).hexdigest()
        if res.setdefault(rel, h) != h:
            res[rel] = "unstable"
print(json.dumps(res))
"""


def test_all_nodes_read_concurrently(fs):
    """One reader per node at the same time: remote requests cross in every direction."""
    import subprocess
    import sys
    path = fs.script("all_nodes.py", ALL_NODES)
    lst = fs.file_list()
    procs = [subprocess.Popen([sys.executable, path, fs.mount, lst], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=fs.env(node)) for node in range(fs.nranks)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=180)
            assert p.returncode == 0, f"reader exited {p.returncode}: {err.decode(errors='replace')[-2000:]}"
            outs.append(json.loads(out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    want = {f: fs.src.md5(f) for f in fs.src.files}
    for node, res in enumerate(outs):
        bad = {f: res.get(f) for f in want if res.get(f) != want[f]}
        assert not bad, f"node {node}: {len(bad)} wrong files, e.g. {dict(list(bad.items())[:5])}"


FORK_STORM = r"""
import hashlib, json, os, sys, threading
root, listfile = sys.argv[1], sys.argv[2]
files = open(listfile, encoding="utf-8", errors="surrogateescape").read().splitlines()
stop = False
errors = []
def reader(k):
    i = k
    while not stop:
        rel = files[i % len(files)]
        i += 7
        try:
            with open(os.path.join(root, rel), "rb") as f:
                f.read()
            os.stat(os.path.join(root, rel))
            os.listdir(os.path.dirname(os.path.join(root, rel)))
        except OSError as e:
            errors.append([rel, e.errno])
threads = [threading.Thread(target=reader, args=(k,), daemon=True) for k in range(3)]
for t in threads:
    t.start()
codes = []
for n in range(40):                       # fork while other threads are inside the library
    pid = os.fork()
    if pid == 0:
        rel = files[(n * 13) % len(files)]
        try:
            data = open(os.path.join(root, rel), "rb").read()
            os.write(1, (rel + " " + hashlib.md5(data).hexdigest() + "\n").encode("utf-8", "surrogateescape"))
            os._exit(0)
        except BaseException:
            os._exit(5)
    codes.append(os.waitpid(pid, 0)[1])
stop = True
for t in threads:
    t.join()
print("codes", json.dumps(codes), "errors", json.dumps(errors[:5]), flush=True)
"""


def test_fork_while_threads_read(fs):
    """fork() while three threads are opening/reading/listing virtual files: the
    pthread_atfork handlers must leave the child with usable locks (no hang)."""
    files = [f for f in fs.src.files if fs.src.size(f) < 300_000]
    r = fs.py(FORK_STORM, fs.file_list(files), node=3, timeout=120)
    lines = r.stdout.splitlines()
    summary = lines[-1]
    codes = json.loads(summary.split("codes ", 1)[1].split(" errors ", 1)[0])
    errors = json.loads(summary.split(" errors ", 1)[1])
    assert codes == [0] * 40, f"forked children failed: {codes}"
    assert errors == [], f"reader threads got errors: {errors}"
    got = dict(l.rsplit(" ", 1) for l in lines[:-1])
    assert len(got) > 10
    for rel, md5 in got.items():
        assert md5 == fs.src.md5(rel), f"child read {rel} wrong"
