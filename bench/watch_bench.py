"""New checkpoints pushed to consumers (issue 16): how soon a consumer on
node 3 has a checkpoint that a writer on node 0 publishes (write tmp, close,
rename), with 4 daemons under mpiexec (UCX_TLS=tcp).

Per checkpoint: t0 = rename() returned on node 0 (the event can reach node 3
before: the publisher's call returns once every watching node has the
event; how long rename() took is reported beside); "event" = the consumer on
node 3 has the event (or saw the name) in hand; "read" = it has read every
byte (checked). Consumers, each run alone, one checkpoint at a time (the
writer waits for the consumer's acknowledgement through a FIFO before the
next one, so no event waits behind another):
  - inotify (inotify_simple through the preload library, blocking read),
  - `fanstore watch --json` (the CLI on node 3, its lines read by the consumer),
  - polling os.listdir every 100 ms and every 1 s (the writer starts each
    checkpoint at a random phase of the consumer's poll).
Then: CPU of an idle watcher over BENCH_IDLE seconds (the watcher process,
and the node-3 daemon), and a second process on node 3 reading checkpoints
the first consumer already read (the node's shared copy) vs a first read on
node 2 (an MPI transfer from node 0).
Writes bench/out/watch.md and bench/out/watch.json (goals).

Usage: python3 bench/watch_bench.py [--quick]
Environment: BENCH_EVENTS [1000] (--quick 200)  BENCH_POLL_EVENTS [60 at 100 ms, 20 at 1 s]
             BENCH_CKPT_KIB [256]  BENCH_IDLE [10]  BENCH_DIR [/tmp]
"""
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from benchlib import BIN, OUT, table  # noqa: E402

QUICK = "--quick" in sys.argv
E = os.environ.get
N = int(E("BENCH_EVENTS", "200" if QUICK else "1000"))
NPOLL = {0.1: int(E("BENCH_POLL_EVENTS", "30" if QUICK else "60")), 1.0: int(E("BENCH_POLL_EVENTS_1S", "8" if QUICK else "20"))}
KIB = int(E("BENCH_CKPT_KIB", "256"))
IDLE = float(E("BENCH_IDLE", "5" if QUICK else "10"))
PY = sys.executable
M = "/fanstore"

PRODUCER = r"""
import os, random, sys, time
d, n, kib, ack = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
out = []
rnd = random.Random(7)
acks = os.fdopen(os.open(ack, os.O_RDWR), 'r')  # O_RDWR: never blocks on the FIFO
for k in range(n):
    data = (b'%08d' % k) * (kib * 128)
    if '--jitter' in sys.argv:
        time.sleep(rnd.random() * float(sys.argv[sys.argv.index('--jitter') + 1]))
    with open(f'{d}/step-{k}.tmp', 'wb') as f:
        f.write(data)
    t0 = time.monotonic_ns()
    os.rename(f'{d}/step-{k}.tmp', f'{d}/step-{k}.ckpt')
    out.append(f'{t0}:{time.monotonic_ns()}')
    if acks.readline().strip() != str(k):
        sys.exit('consumer out of step')
print(' '.join(map(str, out)))
"""

CONSUMER = r"""
import json, os, subprocess, sys, time
mode, d, n, kib, ack = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
acks = None  # opened at the first acknowledgement (the writer holds the FIFO by then)
ev_t, rd_t = [], []

def consume(k, t_ev):
    want = (b'%08d' % k) * (kib * 128)
    with open(f'{d}/step-{k}.ckpt', 'rb') as f:
        got = f.read()
    t_rd = time.monotonic_ns()
    if got != want:
        sys.exit(f'step {k}: {len(got)} bytes, not the checkpoint')
    ev_t.append(t_ev); rd_t.append(t_rd)
    global acks
    if acks is None:
        acks = open(ack, 'w', buffering=1)
    acks.write(f'{k}\n')

if mode == 'inotify':
    from inotify_simple import INotify, flags
    ino = INotify()
    ino.add_watch(d, flags.MOVED_TO)
    print('ready', flush=True)
    k = 0
    while k < n:
        for e in ino.read():
            t = time.monotonic_ns()
            if e.name == f'step-{k}.ckpt':
                consume(k, t); k += 1
elif mode == 'cli':
    env = dict(os.environ); env.pop('LD_PRELOAD', None)
    p = subprocess.Popen([sys.argv[6], 'watch', d, '--json', '--events', 'rename'], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    p.stderr.readline()
    print('ready', flush=True)
    k = 0
    while k < n:
        line = p.stdout.readline()
        t = time.monotonic_ns()
        if json.loads(line)['path'].endswith(f'/step-{k}.ckpt'):
            consume(k, t); k += 1
    p.kill()
else:
    period = float(mode)
    print('ready', flush=True)
    k = 0
    while k < n:
        if f'step-{k}.ckpt' in os.listdir(d):
            consume(k, time.monotonic_ns()); k += 1
            continue
        time.sleep(period)
print(json.dumps([ev_t, rd_t]))
"""


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def run_mode(c, work, mode, n, jitter=None, native=None):
    """Latencies (event, read) in µs from the rename() returning, and the calls' own durations. native: (directory, consumer with the preload library?) for a
    watch outside the mount (the kernel's events, merged or not)."""
    if native:
        d, merged = native
        os.makedirs(d, exist_ok=True)
        penv, cenv = c.env(0, preload=False), c.env(3, preload=merged)
    else:
        d = f"{M}/wb-{mode.replace('.', '_')}"
        subprocess.run([PY, "-c", f"import os; os.makedirs('{d}', exist_ok=True)"], env=c.env(0), check=True)
        penv, cenv = c.env(0), c.env(3)
    fifo = work / f"ack-{mode}-{bool(native and native[1])}"
    if fifo.exists():
        fifo.unlink()
    os.mkfifo(fifo)
    cons = subprocess.Popen([PY, "-c", CONSUMER, mode, d, str(n), str(KIB), str(fifo), str(BIN / "fanstore")],
                            env=cenv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert cons.stdout.readline().strip() == "ready", cons.stderr.read()
    args = [PY, "-c", PRODUCER, d, str(n), str(KIB), str(fifo)] + (["--jitter", str(jitter)] if jitter else [])
    prod = subprocess.run(args, env=penv, capture_output=True, text=True, timeout=3600)
    if prod.returncode != 0:
        cons.kill()
        raise RuntimeError(f"producer: {prod.stderr}\nconsumer: {cons.stderr.read()}")
    out, err = cons.communicate(timeout=600)
    if cons.returncode != 0:
        raise RuntimeError(f"consumer {mode}: {err}")
    calls = [tuple(map(int, x.split(":"))) for x in prod.stdout.split()]
    t0 = [e for _, e in calls]
    ev, rd = json.loads(out.strip().splitlines()[-1])
    lat_ev = [(e - s) / 1e3 for s, e in zip(t0, ev)]
    lat_rd = [(e - s) / 1e3 for s, e in zip(t0, rd)]
    return lat_ev, lat_rd, [(e - s) / 1e3 for s, e in calls]


def cpu_of(pid):
    """CPU seconds a process has run, all its threads (schedstat: ns, not clock ticks)."""
    total = 0
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((t / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that just ended
    return total / 1e9


def idle_cpu(c, mode):
    """CPU seconds a watcher of `mode` uses over IDLE seconds of no event, and
    what the node-3 daemon uses meanwhile."""
    d = f"{M}/wb-idle"
    subprocess.run([PY, "-c", f"import os; os.makedirs('{d}', exist_ok=True)"], env=c.env(0), check=True)
    if mode == "inotify":
        code = f"from inotify_simple import INotify, flags\ni = INotify(); i.add_watch('{d}', flags.MOVED_TO)\nprint('ready', flush=True)\ni.read()"
        p = subprocess.Popen([PY, "-c", code], env=c.env(3), stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"
    elif mode == "cli":
        p = subprocess.Popen([str(BIN / "fanstore"), "--runtime-dir", str(c.runtime), "watch", d],
                             env=dict(c.env(3, preload=False)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        p.stderr.readline()
    else:
        code = f"import os, time\nprint('ready', flush=True)\nwhile True:\n    os.listdir('{d}'); time.sleep({mode})"
        p = subprocess.Popen([PY, "-c", code], env=c.env(3), stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"
    time.sleep(0.5)  # past start-up
    dpid = int(__import__("fs_cluster").node_state(c.runtime, 3)["pid"])
    a, da = cpu_of(p.pid), cpu_of(dpid)
    time.sleep(IDLE)
    b, db = cpu_of(p.pid), cpu_of(dpid)
    p.kill()
    p.wait()
    return b - a, db - da


def shared_copy(c):
    """Reading the inotify run's checkpoints again: a second process on node 3
    (the node's shared copy) vs a first read on node 2 (MPI from node 0)."""
    code = textwrap.dedent(f"""
        import time, sys
        ts = []
        for k in range(int(sys.argv[1]), int(sys.argv[2])):
            t = time.monotonic_ns()
            with open('{M}/wb-inotify/step-%d.ckpt' % k, 'rb') as f:
                b = f.read()
            ts.append((time.monotonic_ns() - t) / 1e3)
            assert len(b) == {KIB} * 1024
        print(' '.join(map(str, ts)))
    """)
    first = max(0, N - 100)  # the newest: still in node 3's cache
    out = {}
    for label, node in (("second process, same node (shared copy)", 3), ("first read on another node (MPI)", 2)):
        with c.client(node) as cli:
            a = cli.status()
        r = subprocess.run([PY, "-c", code, str(first), str(N)], env=c.env(node), capture_output=True, text=True, check=True)
        with c.client(node) as cli:
            b = cli.status()
        d = {k: int(b[k]) - int(a[k]) for k in ("cache_hits", "cache_misses", "remote_sent")}
        out[label] = ([float(x) for x in r.stdout.split()], d)
    return out


def main():
    from fs_cluster import release_bins, start_cluster
    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fs-bench-watch-", dir=E("BENCH_DIR", "/tmp")))
    src = work / "src"
    src.mkdir()
    (src / "x").write_bytes(b"x")
    subprocess.run([str(BIN / "fanstore-prep"), "pack", "--input", str(src), "--output", str(work / "ds"),
                    "--partitions", "1"], check=True, stdout=subprocess.DEVNULL)
    c = start_cluster(release_bins(), work / "ds", work / "cl", nranks=4)
    rows, js, goals = [], {}, []
    try:
        results = {}
        for mode, n, jitter, label in (("inotify", N, None, "inotify (inotify_simple, preload)"),
                                        ("cli", N, None, "`fanstore watch --json`"),
                                        ("0.1", NPOLL[0.1], 0.1, "poll os.listdir every 100 ms"),
                                        ("1.0", NPOLL[1.0], 1.0, "poll os.listdir every 1 s")):
            ev, rd, ren = run_mode(c, work, mode, n, jitter)
            results[mode] = (ev, rd)
            if mode == "inotify":
                sc = shared_copy(c)  # now: the next runs' checkpoints would evict these from the node's cache
            rows.append([label, n, f"{pct(ren, 0.5):.0f}", f"{pct(ev, 0.5):.0f}", f"{pct(ev, 0.99):.0f}",
                         f"{pct(rd, 0.5):.0f}", f"{pct(rd, 0.99):.0f}"])
            js[mode] = {"events": n, "rename_us_p50": pct(ren, 0.5), "event_us_p50": pct(ev, 0.5), "event_us_p99": pct(ev, 0.99),
                        "read_us_p50": pct(rd, 0.5), "read_us_p99": pct(rd, 0.99)}
        nat_rows = []
        for merged, label in ((False, "kernel inotify (no preload library)"), (True, "merged instance (preload library, through the daemon)")):
            ev, _, ren = run_mode(c, work, "inotify", N // 2, native=(str(work / f"native-{merged}"), merged))
            nat_rows.append([label, N // 2, f"{pct(ren, 0.5):.0f}", f"{pct(ev, 0.5):.0f}", f"{pct(ev, 0.99):.0f}"])
            js[f"native_merged_{merged}"] = {"event_us_p50": pct(ev, 0.5), "event_us_p99": pct(ev, 0.99)}
        idle_rows = []
        for mode, label in (("inotify", "inotify (inotify_simple)"), ("cli", "`fanstore watch`"),
                            ("0.1", "poll every 100 ms"), ("1.0", "poll every 1 s")):
            w, d = idle_cpu(c, mode)
            idle_rows.append([label, f"{w * 1000:.2f}", f"{w / IDLE * 100:.3f}%", f"{d * 1000:.0f}"])
            js[f"idle_{mode}"] = {"watcher_cpu_s": w, "daemon_cpu_s": d, "seconds": IDLE}
        ino_ev = pct(results["inotify"][0], 0.5)
        poll_ev = pct(results["0.1"][0], 0.5)
        goals.append(("push vs poll (node 0 -> node 3)", "event p50 < 1 ms; 10x sooner than 100 ms polling",
                      f"{ino_ev / 1000:.2f} ms vs {poll_ev / 1000:.1f} ms "
                      + ("(in hand before rename() returned)" if ino_ev <= 0 else f"({poll_ev / ino_ev:.0f}x)"),
                      ino_ev < 1000 and (ino_ev <= 0 or poll_ev / ino_ev >= 10)))
        goals.append(("idle watcher", "0 CPU while nothing happens",
                      f"{js['idle_inotify']['watcher_cpu_s'] * 1000:.2f} ms over {IDLE:.0f} s",
                      js["idle_inotify"]["watcher_cpu_s"] <= 0.001))
        md = ["## Checkpoints pushed to consumers: inotify and `fanstore watch` vs polling (issue 16)", "",
              f"4 daemons (mpiexec, UCX_TLS=tcp, one machine); a writer on node 0 publishes {KIB} KiB checkpoints "
              "(write `step-k.tmp`, close, rename to `step-k.ckpt`); a consumer on node 3 waits for each, reads it "
              "whole and checks it, then acknowledges (FIFO) before the writer publishes the next one. "
              "µs from rename() returning on node 0 to the event (or the name, for polling) in hand on node 3, and to "
              "every byte read there; polling runs start each checkpoint at a random phase of the poll. "
              "A negative time: the event was in hand before rename() returned. The daemon answers the writer once "
              "the rename is done everywhere and every node watching it has taken the event (so a change made after "
              "it reaches every watcher after it); the rename() column is how long the call took on node 0.", "",
              table(["consumer", "checkpoints", "rename() p50 µs", "event p50 µs", "event p99 µs", "bytes read p50 µs",
                     "bytes read p99 µs"], rows), "",
              "The same consumer (inotify_simple) watching a directory outside the mount, written on the same "
              "machine without the library: the kernel's own instance vs the merged instance, whose kernel events the "
              "daemon reads and forwards into the program's pipe (µs from rename() returning to the event in hand):", "",
              table(["instance", "checkpoints", "rename() p50 µs", "event p50 µs", "event p99 µs"], nat_rows), "",
              f"Idle watcher: CPU used over {IDLE:.0f} s with no event (the watcher process; and the node-3 daemon, "
              "whose MPI thread naps whatever the watchers do):", "",
              table(["watcher", "watcher CPU ms", "of one core", "node-3 daemon CPU ms"], idle_rows), "",
              "Memory-first transfer: the consumer's first open of a just-announced checkpoint on node 3 fetches "
              "it from node 0 over MPI (node 0 sends it from its page cache / checkpoint store, which the write just "
              "filled) into one memfd of node 3's daemon; another process on node 3 gets a new description of that "
              f"memfd (no transfer). Open + read of {KIB} KiB (the {len(next(iter(sc.values()))[0])} newest checkpoints), "
              "and what the reading node's daemon counted meanwhile (every open also asks the path's metadata "
              "owner over MPI: most of either time is that round trip and the MPI threads' naps):", "",
              table(["reader", "p50 µs", "p99 µs", "node cache hits", "misses", "MPI fetches"],
                    [[k, f"{pct(v, 0.5):.0f}", f"{pct(v, 0.99):.0f}", d["cache_hits"], d["cache_misses"], d["remote_sent"]]
                     for k, (v, d) in sc.items()]), ""]
        js["shared_copy"] = {k: {"p50_us": pct(v, 0.5), "p99_us": pct(v, 0.99), **d} for k, (v, d) in sc.items()}
        (OUT / "watch.md").write_text("\n".join(md) + "\n")
        (OUT / "watch.json").write_text(json.dumps({"goals": goals, "results": js}, indent=1))
        print("\n".join(md))
    finally:
        try:
            c.stop()
        except AssertionError as e:  # a stop that fails is reported, not a lost measurement
            print(f"warning: the daemons did not stop cleanly: {str(e).splitlines()[0]}", file=sys.stderr)
        __import__("shutil").rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
