"""Renaming a directory of outputs (what Orbax and many trainers do to publish a
checkpoint: write `step.tmp/`, then rename it to `step/`), on 4 nodes: the
results and errnos of a native directory, and a reader on another node that
never sees half a tree."""
import json
import subprocess
import sys
import textwrap

from fs_diff import differences, script
from fs_cluster import cluster_fixture, packed_dataset, run_python, start_cluster

MOUNT = "/fanstore"
TIMEOUT = 180

SEMANTICS = script(r"""
import errno, json, os, sys
root = sys.argv[1]
J = lambda *p: os.path.join(root, *p)
def tree(p):
    res = []
    for d, dirs, files in os.walk(p):
        dirs.sort()
        for f in sorted(files):
            with open(os.path.join(d, f), "rb") as fh:
                res.append([os.path.relpath(os.path.join(d, f), p), len(fh.read())])
    return res
os.makedirs(J("step.tmp", "sub", "deeper"))
for i in range(30):
    d = J("step.tmp", "sub", "deeper") if i % 5 == 0 else J("step.tmp", "sub") if i % 3 else J("step.tmp")
    with open(os.path.join(d, f"t{i}.bin"), "wb") as f:
        f.write(bytes([i]) * (i * 100 + 1))
os.makedirs(J("empty"))
os.makedirs(J("full", "x"))
with open(J("afile"), "wb") as f:
    f.write(b"1")
attempt("rename to new name", lambda: os.rename(J("step.tmp"), J("step")))
attempt("old gone", lambda: os.stat(J("step.tmp")))
attempt("tree", lambda: tree(J("step")))
attempt("root listing", lambda: sorted(os.listdir(root)))
attempt("onto empty dir", lambda: os.rename(J("step"), J("empty")))
attempt("tree after replace", lambda: len(tree(J("empty"))))
attempt("onto non-empty", lambda: os.rename(J("empty"), J("full")))
attempt("into itself", lambda: os.rename(J("empty"), J("empty", "sub", "inner")))
attempt("dir onto file", lambda: os.rename(J("empty"), J("afile")))
attempt("missing", lambda: os.rename(J("nope"), J("nope2")))
attempt("into missing parent", lambda: os.rename(J("empty"), J("no", "where")))
attempt("deep move", lambda: os.rename(J("empty", "sub"), J("full", "x", "moved")))
attempt("deep tree", lambda: tree(J("full")))
attempt("write in moved dir", lambda: open(J("full", "x", "moved", "new.bin"), "wb").write(b"abc"))
attempt("rmtree moved", lambda: __import__("shutil").rmtree(J("full")))
attempt("final listing", lambda: sorted(os.listdir(root)))
def open_across_rename():
    # This process keeps a file open (being written) and its cwd inside a
    # directory it renames: the file is committed under the new name.
    os.makedirs(J("ck.tmp", "in"))
    f = open(J("ck.tmp", "in", "open.bin"), "wb")
    f.write(b"before ")
    here = os.getcwd()
    os.chdir(J("ck.tmp", "in"))
    os.rename(J("ck.tmp"), J("ck"))
    cwd = os.path.relpath(os.getcwd(), root)
    f.write(b"after")
    f.close()
    os.chdir(here)
    return [cwd, open(J("ck", "in", "open.bin"), "rb").read().decode(), os.path.exists(J("ck.tmp"))]
attempt("open file and cwd across a rename", open_across_rename)
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def renameat2(a, b, flags):
    if libc.renameat2(-100, a.encode(), -100, b.encode(), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
os.makedirs(J("nr", "d1"))
os.makedirs(J("nr", "d2", "x"))
for n in ("f1", "f2"):
    with open(J("nr", n), "w") as f:
        f.write(n)
attempt("noreplace onto a file", lambda: renameat2(J("nr", "f1"), J("nr", "f2"), 1))
attempt("noreplace onto a dir", lambda: renameat2(J("nr", "d1"), J("nr", "d2"), 1))
attempt("noreplace onto itself", lambda: renameat2(J("nr", "f1"), J("nr", "f1"), 1))
attempt("noreplace to a new name", lambda: (renameat2(J("nr", "f1"), J("nr", "f3"), 1), sorted(os.listdir(J("nr"))), open(J("nr", "f3")).read())[1:])
attempt("noreplace dir to a new name", lambda: (renameat2(J("nr", "d2"), J("nr", "d3"), 1), sorted(os.listdir(J("nr", "d3"))))[1])
print(json.dumps(out, sort_keys=True))
""")


cl = cluster_fixture("dirrename", seed=2, n_files=10, mount=MOUNT)


def test_directory_rename_matches_a_native_directory(cl, tmp_path):
    n = run_python(None, 0, SEMANTICS, str(tmp_path / "native"), timeout=TIMEOUT)
    v = cl.run_python(0, SEMANTICS, f"{MOUNT}/sem", timeout=TIMEOUT)
    native, ours = json.loads(n.stdout), json.loads(v.stdout)
    assert native["rename to new name"] == ["OK", None] and native["onto non-empty"] == "ENOTEMPTY"
    diffs = differences(ours, native)
    assert not diffs, "fanstore differs from a native directory (fanstore, native): " + json.dumps(diffs)


WRITER = r"""
import os, sys
root = sys.argv[1]
os.makedirs(os.path.join(root, "ck.tmp"))
for i in range(120):
    with open(os.path.join(root, "ck.tmp", f"shard{i:03d}"), "wb") as f:
        f.write(bytes([i % 251]) * 4096)
open(os.path.join(root, "written"), "w").close()
sys.stdin.readline()
os.rename(os.path.join(root, "ck.tmp"), os.path.join(root, "ck"))
print("renamed", flush=True)
"""

WATCHER = r"""
import os, sys, time
root = sys.argv[1]
seen_partial = []
states = set()
t = time.time()
while time.time() - t < 60:
    try:
        names = os.listdir(os.path.join(root, "ck"))
    except FileNotFoundError:
        states.add("absent")
        # Old name gone means the new one must be complete.
        if not os.path.exists(os.path.join(root, "ck.tmp")):
            try:
                n2 = os.listdir(os.path.join(root, "ck"))
            except FileNotFoundError:
                seen_partial.append("neither name")
                break
            if len(n2) != 120:
                seen_partial.append(len(n2))
        continue
    states.add("present")
    if len(names) != 120:
        seen_partial.append(len(names))
    for k in (0, 57, 119):
        with open(os.path.join(root, "ck", f"shard{k:03d}"), "rb") as f:
            if f.read() != bytes([k % 251]) * 4096:
                seen_partial.append(f"bytes {k}")
    if os.path.exists(os.path.join(root, "ck.tmp")):
        seen_partial.append("both names")
    break
print(sorted(states), seen_partial)
"""


def test_another_node_never_sees_half_a_tree(cl):
    root = f"{MOUNT}/atomic"
    w = subprocess.Popen([sys.executable, "-c", textwrap.dedent(WRITER), root], env=cl.env(0),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if cl.run_python(1, "import os,sys; print(os.path.exists(sys.argv[1]))", f"{root}/written", check=False,
                             timeout=TIMEOUT).stdout.strip() == "True":
                break
            __import__("time").sleep(0.1)
        watch = subprocess.Popen([sys.executable, "-c", textwrap.dedent(WATCHER), root], env=cl.env(3),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        __import__("time").sleep(0.3)
        w.stdin.write("go\n")
        w.stdin.flush()
        assert w.stdout.readline().strip() == "renamed", w.stderr.read()
        out, err = watch.communicate(timeout=120)
    finally:
        w.kill()
    assert watch.returncode == 0, err
    assert out.strip() == "['absent', 'present'] []", out


def test_renamed_trees_and_attributes_persist_and_export(bins, tmp_path):
    """A renamed directory, chmod and utime survive `fanstore stop` + a new job with the
    same --persist (another rank count), and `fanstore export`."""
    packed_dataset(bins, tmp_path, n_files=6, seed=4, partitions=4)
    persist = tmp_path / "persist"
    c = start_cluster(bins, tmp_path / "data", tmp_path / "c1", nranks=4, mount=MOUNT,
                      extra_args=["--persist", persist])
    try:
        c.run_python(1, f"""
            import os
            os.makedirs('{MOUNT}/run/step1.tmp/shards')
            for i in range(12):
                open('{MOUNT}/run/step1.tmp/shards/s%d' % i, 'wb').write(bytes([i]) * (70000 + i))
            open('{MOUNT}/run/step1.tmp/meta.json', 'w').write('{{"step": 1}}')
            os.rename('{MOUNT}/run/step1.tmp', '{MOUNT}/run/step1')
            os.chmod('{MOUNT}/run/step1/meta.json', 0o600)
            os.utime('{MOUNT}/run/step1/meta.json', ns=(1_500_000_000_000_000_000, 1_500_000_000_000_000_000))
        """, timeout=TIMEOUT)
    finally:
        c.stop()
    c2 = start_cluster(bins, tmp_path / "data", tmp_path / "c2", nranks=2, mount=MOUNT,
                       extra_args=["--persist", persist])
    try:
        c2.run_python(1, f"""
            import os
            assert sorted(os.listdir('{MOUNT}/run')) == ['step1'], os.listdir('{MOUNT}/run')
            assert sorted(os.listdir('{MOUNT}/run/step1/shards')) == sorted('s%d' % i for i in range(12))
            for i in range(12):
                assert open('{MOUNT}/run/step1/shards/s%d' % i, 'rb').read() == bytes([i]) * (70000 + i)
            st = os.stat('{MOUNT}/run/step1/meta.json')
            assert (oct(st.st_mode), st.st_mtime_ns) == ('0o100600', 1_500_000_000_000_000_000), (oct(st.st_mode), st.st_mtime_ns)
        """, timeout=TIMEOUT)
    finally:
        c2.stop()
    plain = tmp_path / "plain"
    r = subprocess.run([bins["cli"], "export", str(persist), "--to", str(plain)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (plain / "run/step1/shards").iterdir()) == sorted(f"s{i}" for i in range(12))
    assert (plain / "run/step1/meta.json").read_text() == '{"step": 1}'
    assert not (plain / "run/step1.tmp").exists()


def test_renames_from_another_node_survive_a_kill(bins, tmp_path):
    """Outputs held on node 0, renamed from node 1 (a file, then their directory), then every
    daemon killed with -9: a restart with the same --local registers them under the new names."""
    packed_dataset(bins, tmp_path, n_files=6, seed=3, partitions=2)
    c = start_cluster(bins, tmp_path / "data", tmp_path / "c", nranks=2, mount=MOUNT)
    try:
        c.run_python(0, f"""
            import os
            os.makedirs('{MOUNT}/run/ck.tmp')
            for i in range(6):
                open('{MOUNT}/run/ck.tmp/s%d' % i, 'wb').write(bytes([i]) * 5000)
        """, timeout=TIMEOUT)
        c.run_python(1, f"""
            import os
            os.rename('{MOUNT}/run/ck.tmp/s0', '{MOUNT}/run/ck.tmp/first')
            os.rename('{MOUNT}/run/ck.tmp', '{MOUNT}/run/ck')
        """, timeout=TIMEOUT)
        # The holders record the new names in their held journals
        # asynchronously: wait until the six files are named under run/ck/.
        import time
        deadline = time.monotonic() + 20

        def renamed():
            journals = [c.local / f"rank-{r}" / "out" / "journal.held" for r in (0, 1)]
            return sum(j.read_bytes().count(b"run/ck/") for j in journals if j.exists())
        while time.monotonic() < deadline and renamed() < 6:
            time.sleep(0.1)
    finally:
        local, c.local = c.local, tmp_path / "not-removed"
        c.kill()
    assert any((local / f"rank-{r}" / "out").is_dir() for r in (0, 1))
    c2 = start_cluster(bins, tmp_path / "data", tmp_path / "c", nranks=2, mount=MOUNT)
    try:
        c2.run_python(1, f"""
            import os, time
            deadline = time.time() + 20
            while not os.path.exists('{MOUNT}/run/ck/first') and time.time() < deadline:
                time.sleep(0.1)
            assert sorted(os.listdir('{MOUNT}/run/ck')) == ['first', 's1', 's2', 's3', 's4', 's5'], os.listdir('{MOUNT}/run/ck')
            assert open('{MOUNT}/run/ck/first', 'rb').read() == bytes([0]) * 5000
            assert not os.path.exists('{MOUNT}/run/ck.tmp')
        """, timeout=TIMEOUT)
    finally:
        c2.stop()


def test_rename_exchange_is_einval(cl):
    """Documented: renameat2(RENAME_EXCHANGE) on outputs is EINVAL (the issue allows it)."""
    r = cl.run_python(1, r"""
    import ctypes, os, sys
    root = sys.argv[1]
    os.makedirs(root)
    for n in ("a", "b"):
        open(os.path.join(root, n), "w").write(n)
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.renameat2(-100, os.path.join(root, "a").encode(), -100, os.path.join(root, "b").encode(), 2)
    print(rc, ctypes.get_errno(), open(os.path.join(root, "a")).read())
    """, f"{MOUNT}/exch", timeout=TIMEOUT)
    import errno as E
    assert r.stdout.split() == ["-1", str(E.EINVAL), "a"]


def test_a_file_open_on_one_node_follows_a_rename_of_its_directory_on_another(cl):
    """Writer on node 0 keeps step.tmp/w.bin open; node 2 renames step.tmp to
    step; the writer's close commits step/w.bin, as a native rename leaves
    an open file in the moved directory; node 3 reads it whole."""
    root = f"{MOUNT}/openmv"
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(r"""
        import os, sys
        root = sys.argv[1]
        os.makedirs(os.path.join(root, "step.tmp"))
        f = open(os.path.join(root, "step.tmp", "w.bin"), "wb")
        f.write(b"a" * 5000)
        print("open", flush=True)
        sys.stdin.readline()
        f.write(b"b" * 5000)
        f.close()
        print("closed", flush=True)
        """), root], env=cl.env(0), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert writer.stdout.readline().strip() == "open", writer.stderr.read()
    cl.run_python(2, f"import os; os.rename('{root}/step.tmp', '{root}/step')", timeout=TIMEOUT)
    writer.stdin.write("\n")
    writer.stdin.flush()
    assert writer.stdout.readline().strip() == "closed", writer.stderr.read()
    assert writer.wait(timeout=60) == 0
    r = cl.run_python(3, f"""
        import json, os
        print(json.dumps([sorted(os.listdir('{root}')), os.listdir('{root}/step'),
                          open('{root}/step/w.bin', 'rb').read() == b'a' * 5000 + b'b' * 5000]))
        """, timeout=TIMEOUT)
    assert json.loads(r.stdout) == [["step"], ["w.bin"], True]
