"""inotify on /fanstore through the preload library (issue 16): real
programs (inotify_simple, watchdog's InotifyObserver, GNU tail -F) on node 3
see what writers on other nodes publish, under `mpiexec -n 4` daemons.

No timed assertion: consumers are read until they print what the script
must produce; a guard timer only ends a hung run.
"""
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from fs_cluster import packed_cluster

MOUNT = "/fanstore"
PY = sys.executable
GUARD = 120
N_CKPT = 12


@pytest.fixture(scope="module")
def cl(bins, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("winotify")
    with packed_cluster(bins, tmp, seed=61) as (c, _src):
        c.native = tmp / "native"
        c.native.mkdir()
        yield c


class Consumer:
    """A python program on `node` (with the preload library); prints 'ready' once its watches are in place."""

    def __init__(self, c, node, code):
        self.p = subprocess.Popen([PY, "-c", textwrap.dedent(code)], env=c.env(node), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        first = self.p.stdout.readline()
        assert first.strip() == "ready", f"consumer did not start: {first!r} {self.p.stderr.read()}"

    def finish(self):
        t = threading.Timer(GUARD, self.p.kill)
        t.start()
        try:
            out, err = self.p.communicate()
        finally:
            t.cancel()
        assert self.p.returncode == 0, f"consumer exit {self.p.returncode}\n{out}\n{err}"
        return out


def ckpt_bytes(k):
    return (b"checkpoint %d " % k) * (1000 + 37 * k)


PRODUCER = """
    import os
    d = '{M}/{dir}'
    for k in range({n}):
        data = (b'checkpoint %d ' % k) * (1000 + 37 * k)
        with open(f'{{d}}/step-{{k}}.tmp', 'wb') as f:
            f.write(data)
        os.rename(f'{{d}}/step-{{k}}.tmp', f'{{d}}/step-{{k}}.ckpt')
"""


def check_consumed(out, n):
    got = [line.split() for line in out.splitlines() if line.startswith("ckpt ")]
    assert [g[1] for g in got] == [f"step-{k}.ckpt" for k in range(n)], out
    for k, g in enumerate(got):
        assert g[2] == "ok", f"step-{k}: read {g[2:]} when its event arrived"


def test_inotify_simple_sees_every_checkpoint_in_order_readable(cl):
    c = cl
    c.run_python(0, f"import os; os.makedirs('{MOUNT}/ck1', exist_ok=True)")
    cons = Consumer(c, 3, f"""
        import hashlib, os, select, sys
        from inotify_simple import INotify, flags
        ino = INotify()
        wd = ino.add_watch('{MOUNT}/ck1', flags.MOVED_TO | flags.CLOSE_WRITE | flags.MOVED_FROM)
        assert wd >= 1 << 30, wd
        nwd = ino.add_watch('{c.native}', flags.CREATE)      # a native path on the same fd
        assert nwd < 1 << 30, nwd
        ep = select.epoll(); ep.register(ino.fileno(), select.EPOLLIN)
        print('ready', flush=True)
        seen, cookies, done = 0, {{}}, False
        while not done:
            ep.poll()                                         # blocks: no timeout
            for e in ino.read(timeout=0):
                if e.wd == nwd:
                    assert e.name == 'done', e
                    done = True
                    continue
                assert e.wd == wd, e
                if e.mask & flags.MOVED_FROM:
                    cookies[e.cookie] = e.name
                if e.mask & flags.MOVED_TO:
                    assert cookies.pop(e.cookie) == e.name.replace('.ckpt', '.tmp'), (e, cookies)
                    k = int(e.name.split('-')[1].split('.')[0])
                    want = (b'checkpoint %d ' % k) * (1000 + 37 * k)
                    got = open('{MOUNT}/ck1/' + e.name, 'rb').read()
                    print('ckpt', e.name, 'ok' if got == want else f'bad {{len(got)}}', flush=True)
        ino.close()
    """)
    with c.client(3) as cli:
        before = cli.status()
    c.run_python(0, PRODUCER.format(M=MOUNT, dir="ck1", n=N_CKPT))
    (c.native / "done").write_bytes(b"")
    check_consumed(cons.finish(), N_CKPT)
    with c.client(3) as cli:
        after = cli.status()
    d = {k: int(after[k]) - int(before[k]) for k in ("cache_hits", "cache_misses", "remote_sent")}
    # Node 3 fetched each checkpoint once (when its first event arrived, or
    # at the consumer's open), and the other access found that copy.
    assert d["remote_sent"] == N_CKPT and d["cache_misses"] == N_CKPT and d["cache_hits"] >= N_CKPT, d


def test_watchdog_inotify_observer(cl):
    c = cl
    c.run_python(1, f"import os; os.makedirs('{MOUNT}/ck2', exist_ok=True)")
    cons = Consumer(c, 3, f"""
        import os, queue, sys
        from watchdog.observers.inotify import InotifyObserver
        from watchdog.events import FileSystemEventHandler
        q = queue.Queue()

        class H(FileSystemEventHandler):
            def on_moved(self, ev):
                name = os.path.basename(ev.dest_path)
                k = int(name.split('-')[1].split('.')[0])
                want = (b'checkpoint %d ' % k) * (1000 + 37 * k)
                got = open(ev.dest_path, 'rb').read()     # in the callback: at the event
                q.put(('ckpt', name, 'ok' if got == want else f'bad {{len(got)}}'))

            def on_created(self, ev):
                if ev.src_path.endswith('/done-watchdog'):
                    q.put(None)

        obs = InotifyObserver()
        obs.schedule(H(), '{MOUNT}/ck2', recursive=False)
        obs.schedule(H(), '{c.native}', recursive=False)
        obs.start()
        print('ready', flush=True)
        # Every checkpoint, and the native file (its own emitter: any order).
        ckpts, native = 0, False
        while ckpts < {N_CKPT} or not native:
            item = q.get()
            if item is None:
                native = True
            else:
                ckpts += 1
                print(*item, flush=True)
        print('native seen', flush=True)
        obs.stop(); obs.join()
    """)
    c.run_python(0, PRODUCER.format(M=MOUNT, dir="ck2", n=N_CKPT))
    (c.native / "done-watchdog").write_bytes(b"")
    out = cons.finish()
    check_consumed(out, N_CKPT)
    assert "native seen" in out


def test_tail_follows_a_log_rewritten_on_another_node(cl):
    c = cl
    c.run_python(1, f"""
        import os
        os.makedirs('{MOUNT}/logs', exist_ok=True)
        open('{MOUNT}/logs/train.log', 'w').write('epoch 1\\n')
    """)
    before = c.watch_info(3)["sessions"]
    p = subprocess.Popen(["tail", "-F", "-n", "+1", f"{MOUNT}/logs/train.log"], env=c.env(3),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    guard = threading.Timer(GUARD, p.kill)
    guard.start()
    try:
        assert p.stdout.readline() == "epoch 1\n"
        # tail's watches are registered before it first reads the file
        assert c.watch_info(3)["sessions"] == before + 1, "tail -F does not use inotify through FanStore"
        c.run_python(2, f"open('{MOUNT}/logs/train.log', 'w').write('epoch 1\\nepoch 2\\n')")       # a new version
        lines = [p.stdout.readline() for _ in range(2)]
        assert lines == ["epoch 1\n", "epoch 2\n"], lines
        c.run_python(0, f"""
            import os
            open('{MOUNT}/logs/train.log.tmp', 'w').write('epoch 1\\nepoch 2\\nepoch 3\\n')
            os.replace('{MOUNT}/logs/train.log.tmp', '{MOUNT}/logs/train.log')
        """)
        lines = [p.stdout.readline() for _ in range(3)]
        assert lines == ["epoch 1\n", "epoch 2\n", "epoch 3\n"], lines
    finally:
        guard.cancel()
        p.kill()
        p.wait()


def test_inotify_semantics(cl):
    c = cl
    c.run_python(0, f"import os; os.makedirs('{MOUNT}/sem/sub', exist_ok=True)")
    input_file = next(l for l in c.run_python(0, f"""
        import os
        for d, _, fs in os.walk('{MOUNT}'):
            for f in fs:
                if (d + f).isascii() and "'" not in d + f:
                    print(os.path.join(d, f))
    """).stdout.splitlines() if not any(f"{MOUNT}/{d}/" in l for d in ("ck1", "ck2", "logs", "sem")))
    cons = Consumer(c, 3, f"""
        import errno, os, select
        from inotify_simple import INotify, flags
        ALL = 0xfff
        a, b = INotify(inheritable=True), INotify()
        assert os.get_inheritable(a.fileno()) and not os.get_inheritable(b.fileno()), 'IN_CLOEXEC'
        a.close(); b.close()
        ino = INotify(nonblocking=True)
        try:
            ino.read(timeout=0)
        except BlockingIOError:
            pass
        try:
            os.read(ino.fileno(), 4096); raise SystemExit('read of an empty nonblocking instance')
        except BlockingIOError:
            pass
        for bad, want in (('{MOUNT}/nope', errno.ENOENT), ('{MOUNT}/sem/nope/x', errno.ENOENT)):
            try:
                ino.add_watch(bad, flags.CREATE); raise SystemExit('watch on a missing path')
            except OSError as e:
                assert e.errno == want, (bad, e)
        try:
            ino.add_watch('{input_file}', flags.CREATE | flags.ONLYDIR); raise SystemExit('ONLYDIR on a file')
        except OSError as e:
            assert e.errno == errno.ENOTDIR, e
        try:
            ino.add_watch('{MOUNT}/sem', 0); raise SystemExit('empty mask')
        except OSError as e:
            assert e.errno == errno.EINVAL, e
        inp = ino.add_watch('{input_file}', ALL)      # an input: allowed, never fires
        sem = ino.add_watch('{MOUNT}/sem', flags.CREATE)
        assert ino.add_watch('{MOUNT}/sem', flags.DELETE, ) == sem    # same path, same wd (mask replaced)
        assert ino.add_watch('{MOUNT}/sem', flags.CREATE | flags.MASK_ADD) == sem
        try:
            ino.add_watch('{MOUNT}/sem', flags.CREATE | 0x10000000); raise SystemExit('MASK_CREATE')
        except OSError as e:
            assert e.errno == errno.EEXIST, e
        sub = ino.add_watch('{MOUNT}/sem/sub', ALL | flags.ONLYDIR)
        gone = ino.add_watch('{MOUNT}/sem/sub', ALL)
        assert gone == sub
        nat = ino.add_watch('{c.native}', flags.CREATE)
        print('ready', flush=True)
        evs = []
        # Until the last record of the script (the removed directory's
        # IN_IGNORED) and the native file's creation are both in.
        while not (any(e.wd == nat for e in evs) and any(e.wd == sub and e.mask & flags.IGNORED for e in evs)):
            select.select([ino.fileno()], [], [])
            evs += ino.read(timeout=0)
        for e in evs:
            print(e.wd == inp, e.wd == sem, e.wd == sub, e.wd == nat, e.mask, e.cookie, e.name, flush=True)
        ino.rm_watch(sem)
        select.select([ino.fileno()], [], [])
        evs = ino.read(timeout=0)
        print('rm', [(e.wd == sem, e.mask) for e in evs], flush=True)
    """)
    c.run_python(1, f"""
        import os
        open('{MOUNT}/sem/f', 'wb').write(b'x')
        os.unlink('{MOUNT}/sem/f')
        open('{MOUNT}/sem/sub/g', 'wb').write(b'y')
        os.unlink('{MOUNT}/sem/sub/g')
        os.rmdir('{MOUNT}/sem/sub')
    """)
    (c.native / "sem-done").write_bytes(b"")
    out = cons.finish().splitlines()
    I = {f.name: f.value for f in __import__("inotify_simple").flags}
    rows = [l.split() for l in out if not l.startswith("rm ")]
    sem_masks = [int(r[4]) for r in rows if r[1] == "True"]
    sub_masks = [int(r[4]) for r in rows if r[2] == "True"]
    assert not any(r[0] == "True" for r in rows), f"an input watch fired: {out}"
    assert sem_masks == [I["CREATE"], I["DELETE"], I["DELETE"] | I["ISDIR"]], out
    assert sub_masks == [I["CREATE"], I["MODIFY"], I["CLOSE_WRITE"], I["DELETE"], I["DELETE_SELF"] | I["ISDIR"], I["IGNORED"]], out
    assert out[-1] == f"rm [(True, {I['IGNORED']})]", out



def test_a_watcher_sees_changes_in_the_order_they_were_made(bins, tmp_path):
    """The unlink of d/f, then the rmdir of d, made on node 1: a watcher of
    d on node 3 gets IN_DELETE f before IN_DELETE_SELF and IN_IGNORED, as
    from the kernel, though the two events are numbered by different
    daemons (the owners of d and of its parent) for most of these
    directories: an event's publisher returns only once every watching
    node has it. Before that, once in a CI run, the rmdir's records came
    first and the unlink's never did (its watch was gone). A cluster of
    its own: the first messages between two daemons also set up their
    connection, which delays them most."""
    with packed_cluster(bins, tmp_path, seed=62) as (c, _src):
        check_changes_seen_in_order(c, 60)


def check_changes_seen_in_order(c, n):
    c.run_python(0, f"import os\nfor i in range({n}): os.makedirs(f'{MOUNT}/order/d{{i}}', exist_ok=True)")
    cons = Consumer(c, 3, f"""
        import select
        from inotify_simple import INotify, flags
        ino = INotify()
        wds = {{ino.add_watch(f'{MOUNT}/order/d{{i}}', flags.CREATE | flags.DELETE | flags.DELETE_SELF): i for i in range({n})}}
        print('ready', flush=True)
        seen, ignored = [], 0
        while ignored < {n}:
            select.select([ino.fileno()], [], [])
            for e in ino.read(timeout=0):
                seen.append((wds[e.wd], e.mask))
                ignored += bool(e.mask & flags.IGNORED)
        for i, mask in seen:
            print(i, mask)
    """)
    c.run_python(1, f"""
        import os
        for i in range({n}):
            d = f'{MOUNT}/order/d{{i}}'
            open(f'{{d}}/f', 'wb').write(b'x')
            os.unlink(f'{{d}}/f')
            os.rmdir(d)
    """)
    out = cons.finish()
    I = {f.name: f.value for f in __import__("inotify_simple").flags}
    want = [I["CREATE"], I["DELETE"], I["DELETE_SELF"] | I["ISDIR"], I["IGNORED"]]
    per_dir = {}
    for line in out.splitlines():
        i, mask = map(int, line.split())
        per_dir.setdefault(i, []).append(mask)
    wrong = {i: m for i, m in per_dir.items() if m != want}
    assert len(per_dir) == n and not wrong, f"{len(wrong)} of {n} directories' events not in the order made: {wrong}"

RAW_WATCHER = r"""
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/syscall.h>
#include <unistd.h>
static long raw4(long nr, long a, long b, long c, long d) {
    long r; register long r10 __asm__("r10") = d;
    __asm__ volatile("syscall" : "=a"(r) : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10) : "rcx", "r11", "memory");
    return r;
}
/* Raw inotify system calls (as Go's fsnotify makes them); read(2) through libc. */
int main(int argc, char **argv) {
    long fd = raw4(SYS_inotify_init1, IN_CLOEXEC, 0, 0, 0);
    if (fd < 0) return 10;
    long wd = raw4(SYS_inotify_add_watch, fd, (long)argv[1], IN_MOVED_TO, 0);
    if (wd < 0) { printf("add_watch %ld\n", wd); return 11; }
    long bad = raw4(SYS_inotify_add_watch, fd, (long)argv[2], IN_CREATE, 0);
    printf("ready %ld %ld\n", wd, bad);
    fflush(stdout);
    char buf[4096] __attribute__((aligned(8)));
    ssize_t n = read((int)fd, buf, sizeof buf);
    if (n < (ssize_t)sizeof(struct inotify_event)) return 12;
    struct inotify_event *e = (struct inotify_event *)buf;
    printf("event %d %x %s\n", e->wd == wd, e->mask, e->name);
    printf("rm %ld\n", raw4(SYS_inotify_rm_watch, fd, wd, 0, 0));
    return 0;
}
"""


def test_raw_inotify_syscalls(cl, tmp_path):
    """inotify made with inline `syscall` instructions (Go's fsnotify does):
    caught by syscall user dispatch and served like the libc calls."""
    c = cl
    c.run_python(0, f"import os; os.makedirs('{MOUNT}/raw', exist_ok=True)")
    (tmp_path / "w.c").write_text(RAW_WATCHER)
    subprocess.run(["cc", "-O1", "-o", str(tmp_path / "w"), str(tmp_path / "w.c")], check=True, timeout=120)
    p = subprocess.Popen([str(tmp_path / "w"), f"{MOUNT}/raw", f"{MOUNT}/raw/missing"], env=c.env(3),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    guard = threading.Timer(GUARD, p.kill)
    guard.start()
    try:
        ready = p.stdout.readline().split()
        assert ready[:1] == ["ready"] and int(ready[1]) >= 1 << 30, (ready, p.stderr.read())
        assert int(ready[2]) == -2, "ENOENT for a missing path"
        c.run_python(1, f"import os; open('{MOUNT}/raw/a.tmp', 'wb').write(b'x'); os.rename('{MOUNT}/raw/a.tmp', '{MOUNT}/raw/a')")
        out, err = p.communicate()
    finally:
        guard.cancel()
    assert p.returncode == 0, (p.returncode, out, err)
    assert out.split("\n")[:2] == ["event 1 80 a", "rm 0"], out


def test_killed_inotify_watcher_leaves_no_state(cl):
    c = cl
    c.run_python(0, f"import os; os.makedirs('{MOUNT}/kill', exist_ok=True)")
    before = [c.watch_info(r) for r in range(4)]
    cons = Consumer(c, 2, f"""
        from inotify_simple import INotify, flags
        ino = INotify()
        ino.add_watch('{MOUNT}/kill', flags.CREATE)
        ino.add_watch('{MOUNT}', flags.CREATE)
        print('ready', flush=True)
        ino.read()
    """)
    during = [c.watch_info(r) for r in range(4)]
    assert during[2]["sessions"] == before[2]["sessions"] + 1 and during[2]["watches"] == before[2]["watches"] + 2, str((before, during))
    assert all(d["interests"] == b["interests"] + 2 for d, b in zip(during, before)), (before, during)
    cons.p.kill()
    cons.p.wait()
    # The session ends when its thread sees the closed pipe and connection,
    # then withdraws its interests rank by rank: wait for that (bounded).
    deadline = time.monotonic() + GUARD
    while [c.watch_info(r) for r in range(4)] != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [c.watch_info(r) for r in range(4)] == before


def test_a_reader_that_falls_behind_gets_in_q_overflow(bins, tmp_path, monkeypatch):
    # A small queue (FANSTORE_WATCH_QUEUE in the daemons' environment) so a
    # few hundred events overflow it; the socket itself holds a few hundred more.
    monkeypatch.setenv("FANSTORE_WATCH_QUEUE", "64")
    with packed_cluster(bins, tmp_path, seed=62, n_files=2) as (c, _src):
        c.run_python(0, f"import os; os.makedirs('{MOUNT}/ovf')")
        p = subprocess.Popen([PY, "-c", textwrap.dedent(f"""
            import sys
            from inotify_simple import INotify, flags
            ino = INotify()
            ino.add_watch('{MOUNT}/ovf', flags.CREATE | flags.MODIFY | flags.CLOSE_WRITE)
            print('ready', flush=True)
            sys.stdin.readline()                  # not reading events meanwhile
            names, over = [], False
            while not over:
                for e in ino.read():
                    if e.mask & flags.Q_OVERFLOW:
                        assert e.wd == -1, e
                        over = True
                    else:
                        names.append(e.name)
            print('overflowed', len(names), flush=True)
            while 'after' not in [e.name for e in ino.read()]:
                pass
            nums = [int(n[1:]) for n in names]
            assert nums == sorted(nums), 'records before the overflow are in order'
            print('after', flush=True)
        """)], env=c.env(1), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        guard = threading.Timer(GUARD, p.kill)
        guard.start()
        try:
            assert p.stdout.readline() == "ready\n", p.stderr.read()
            c.run_python(0, f"""
                for i in range(400):
                    open('{MOUNT}/ovf/f%04d' % i, 'wb').write(b'x')
            """)
            p.stdin.write("go\n")
            p.stdin.flush()
            line = p.stdout.readline().split()
            assert line[:1] == ["overflowed"], (line, p.stderr.read())
            assert 0 < int(line[1]) < 1200, line  # some records, not all 3 x 400
            c.run_python(0, f"open('{MOUNT}/ovf/after', 'wb').write(b'y')")
            assert p.stdout.readline() == "after\n", p.stderr.read()
        finally:
            guard.cancel()
            p.kill()
            p.wait()
