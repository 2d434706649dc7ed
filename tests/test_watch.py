"""Namespace events pushed to watchers: `fanstore watch` (issue 16).

Real daemons under `mpiexec -n 4` (UCX_TLS=tcp); the changes are made by
programs with the preload library on nodes 0-3; the watcher runs on node 3.
No timed assertion: a watcher is read until it printed what the script
must produce (a hang guard only ends a broken run).
"""
import json
import os
import signal
import subprocess
import sys
import threading
from collections import defaultdict

from fs_cluster import base_env, cluster_fixture

MOUNT = "/fanstore"
PY = sys.executable
GUARD = 120  # seconds: only ends a hung run


cl = cluster_fixture("watch", seed=16)


class Watch:
    """`fanstore watch ARGS` on `node`, started and ready (its watches are registered)."""

    def __init__(self, c, node, *args):
        env = base_env()
        env["FANSTORE_NODE"] = str(node)
        self.p = subprocess.Popen([c.bins["cli"], "--runtime-dir", str(c.runtime), "watch", *args], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines = []
        ready = self.p.stderr.readline()
        assert "watching" in ready, f"watcher did not start: {ready}{self.p.stderr.read() if self.p.poll() is not None else ''}"

    def take(self, n):
        """The next n lines (a guard timer kills a watcher that never prints them)."""
        t = threading.Timer(GUARD, self.p.kill)
        t.start()
        try:
            got = [self.p.stdout.readline() for _ in range(n)]
        finally:
            t.cancel()
        assert all(got), f"the watcher ended early: {got}\n{self.p.stderr.read()}"
        return got


def test_watch_json_scripted_sequence_from_four_nodes(cl):
    c = cl
    c.run_python(0, f"import os; os.makedirs('{MOUNT}/w', exist_ok=True)")
    w = Watch(c, 3, f"{MOUNT}/w", "--recursive", "--json")
    # (node, code, expected events as (event, path, from or None, size or None, dir))
    big = 200_000
    script = [
        (0, "os.mkdir(f'{M}/w/a')", [("mkdir", "w/a", None, None, True)]),
        (1, "open(f'{M}/w/a/x.tmp','wb').write(b'1'*1000)", [("close", "w/a/x.tmp", None, 1000, False)]),
        (1, "os.rename(f'{M}/w/a/x.tmp', f'{M}/w/a/x')", [("rename", "w/a/x", "w/a/x.tmp", 1000, False)]),
        (2, f"open(f'{{M}}/w/b.txt','wb').write(b'2'*{big})", [("close", "w/b.txt", None, big, False)]),
        (2, "os.replace(f'{M}/w/b.txt', f'{M}/w/a/y')", [("rename", "w/a/y", "w/b.txt", big, False)]),
        (3, "os.unlink(f'{M}/w/a/y')", [("delete", "w/a/y", None, big, False)]),
        (3, "os.mkdir(f'{M}/w/c'); os.rename(f'{M}/w/c', f'{M}/w/d'); os.rmdir(f'{M}/w/d')",
         [("mkdir", "w/c", None, None, True), ("rename", "w/d", "w/c", None, True), ("rmdir", "w/d", None, None, True)]),
        (0, "open(f'{M}/w/a/x','wb').write(b'3'*10)", [("close", "w/a/x", None, 10, False)]),
        (1, "open(f'{M}/outside.txt','wb').write(b'no')", []),  # not under the watched path
    ]
    expected = []
    for node, code, evs in script:
        c.run_python(node, f"import os\nM = '{MOUNT}'\n{code}")
        expected += [(node, *e) for e in evs]
    got = [json.loads(line) for line in w.take(len(expected))]
    # Per directory, the events come in the order the owner applied them.
    def key_dir(e):
        return os.path.dirname(e["path"])

    by_dir_got, by_dir_want = defaultdict(list), defaultdict(list)
    for g in got:
        by_dir_got[key_dir(g)].append(g)
    for node, ev, path, frm, size, isdir in expected:
        by_dir_want[os.path.dirname(f"{MOUNT}/{path}")].append((node, ev, path, frm, size, isdir))
    assert sorted(by_dir_got) == sorted(by_dir_want), got
    for d, want in by_dir_want.items():
        have = by_dir_got[d]
        assert [(h["event"], h["path"]) for h in have] == [(e[1], f"{MOUNT}/{e[2]}") for e in want], (d, have)
        for h, (node, ev, path, frm, size, isdir) in zip(have, want):
            assert h["node"] == node, h
            assert h["dir"] == isdir, h
            if size is not None:
                assert h["size"] == size, h
            if frm is not None:
                assert h["from"] == f"{MOUNT}/{frm}", h
            assert h["time"] > 0
    seqs = [g["seq"] for g in by_dir_got[f"{MOUNT}/w/a"]]
    assert seqs == sorted(seqs), "numbered by the directory's owner in order"
    # Nothing else arrives: the next event is the one made now.
    c.run_python(2, f"open('{MOUNT}/w/last','wb').write(b'z')")
    last = json.loads(w.take(1)[0])
    assert (last["event"], last["path"], last["node"]) == ("close", f"{MOUNT}/w/last", 2), last
    w.p.kill()
    w.p.wait()


def test_events_filter_and_plain_lines(cl):
    c = cl
    c.run_python(1, f"import os; os.makedirs('{MOUNT}/f', exist_ok=True)")
    w = Watch(c, 2, f"{MOUNT}/f", "--events", "rename")
    c.run_python(0, f"""
        import os
        open('{MOUNT}/f/ck.tmp', 'wb').write(b'abc')
        os.rename('{MOUNT}/f/ck.tmp', '{MOUNT}/f/ck')
        os.mkdir('{MOUNT}/f/sub')
        open('{MOUNT}/f/sub/deep', 'wb').write(b'not recursive')
        os.rename('{MOUNT}/f/ck', '{MOUNT}/f/ck2')
    """)
    lines = w.take(2)
    assert lines[0].split()[1:] == ["node=0", "rename", f"{MOUNT}/f/ck.tmp", "->", f"{MOUNT}/f/ck", "size=3"], lines
    assert lines[1].split()[2:5] == ["rename", f"{MOUNT}/f/ck", "->"], lines
    w.p.kill()
    w.p.wait()


def test_bad_paths(cl):
    c = cl
    r = c.cli("watch", f"{MOUNT}/no/such/dir", check=False)
    assert r.returncode == 1 and "No such file or directory" in r.stderr, r.stderr
    r = c.cli("watch", f"{MOUNT}/w", "--events", "open", check=False)
    assert r.returncode != 0 and "unknown event" in r.stderr, r.stderr


def test_killed_watcher_leaves_no_state_and_stop_ends_watchers(cl):
    c = cl
    c.run_python(0, f"import os; os.makedirs('{MOUNT}/k', exist_ok=True)")
    before = [c.watch_info(r) for r in range(4)]
    w = Watch(c, 1, f"{MOUNT}/k", "--recursive")
    during = [c.watch_info(r) for r in range(4)]
    assert during[1]["sessions"] == before[1]["sessions"] + 1
    assert all(d["interests"] == b["interests"] + 1 for d, b in zip(during, before)), (before, during)
    w.p.send_signal(signal.SIGKILL)
    w.p.wait()
    # The session ends when its thread sees the closed connection; wait for
    # that (a bounded wait, not a timed assertion).
    import time
    deadline = time.monotonic() + GUARD
    while [c.watch_info(r) for r in range(4)] != before and time.monotonic() < deadline:
        time.sleep(0.05)
    after = [c.watch_info(r) for r in range(4)]
    assert after == before, (before, after)
    # A change nobody watches now reaches nobody, and `fanstore stop` ends a watcher.
    w2 = Watch(c, 0, f"{MOUNT}/k")
    c.stop()
    out, err = w2.p.communicate(timeout=GUARD)
    assert w2.p.returncode == 0 and "stopped" in err, (w2.p.returncode, out, err)
