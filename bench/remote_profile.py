"""Where the time and the CPU of one remote 128 KiB OPEN go (issue 13).

    python3 bench/remote_profile.py [--quick]      (prints a markdown section)

2 daemons under `mpiexec -n 2` (UCX_TLS=tcp, --cache-mem 0 --replicate-on-read off: every OPEN
crosses MPI), a client on rank 0 OPENs files that only rank 1 holds and reads
every byte (fanstore-bench-read), with the communication thread's
`--comm-spin-us` at 200 (the default: how long it keeps polling after activity
before it sleeps, while no thread waits for a CPU), at 0, and at 200 polling
whether or not threads wait (`--comm-spin-while always`), and at the default with `--comm-sleep nap` (the
idle thread naps on its channel, as before it slept on MPI's epoll fds). Per setting: OPEN and OPEN+read medians, the CPU
each daemon used per remote file (all its threads: the daemon's own getrusage
from STATUS, µs precise; and the share
of its communication thread, the daemon's main thread), and the CPU of the
idle daemons over 3 s (from 11 s after the last read: a rank idle for 10 s naps 20 ms at a time).
The reader runs as a program of node 0 would: on the CPUs rank 0's daemon keeps
to (STATUS `cpus`; the two daemons share this host, each on its own share of
its CPUs, as on two nodes), except in the row where it is left to the scheduler.
Then the default setting with the daemons and the client pinned to CPUs by
hand (where the wake-ups between threads cost), against the daemons' own
placement (`--share-cpus auto`: each keeps to its share of the CPUs) and the
scheduler's (`--share-cpus off`). Against, in the same run: the raw MPI ping-pong of the
same message pattern (fanstore-mpi-pingpong, 2 ranks, no daemon running) and
the same into a fresh memfd per reply (the memory a remote file must land in).
"""
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import fs_cluster  # noqa: E402

B = Path(__file__).resolve().parent.parent / "target" / "release"
QUICK = "--quick" in sys.argv
SIZE = 128 << 10
ROUNDS, ITERS = (2, 100) if QUICK else (3, 200)
DEFAULT_SPIN = "200"
DEFAULT_FD_BOUND = "2000"
# Seconds the daemons idle before the reads of the second row.
IDLE_BEFORE = 3
env = dict(os.environ, UCX_TLS=os.environ.get("UCX_TLS", "tcp"), RUST_LOG="warn")


def sh(cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout


def start(work, ds, tag, n, extra, local=None, log_path=None, env_extra=None, **kw):
    """`mpiexec -n n` daemons over `ds` with `extra` arguments, through the tests'
    cluster helper (tests/fs_cluster.py): runtime directory work/rt<tag>, local
    directory work/l<tag> (or `local`), log work/log<tag> (or `log_path`), the
    module's env (plus `env_extra`); its RUST_LOG=warn hides the info lines the
    MPI library check reads. ``kw``: fs_cluster.launch's ``wrapper``, ``log_mode``."""
    return fs_cluster.start_cluster(fs_cluster.release_bins(), ds, work, nranks=n, extra_args=extra, timeout=120,
                                    runtime=work / f"rt{tag}", local=local or work / f"l{tag}",
                                    log_path=log_path or work / f"log{tag}", env=dict(env, **(env_extra or {})),
                                    check_mpi=False, **kw)


def daemon_cpu_us(rt, n=2):
    """CPU time of every daemon of the job, all threads, in µs: each rank's own
    getrusage (`cpu_user_us` + `cpu_sys_us` of STATUS), µs precise where /proc's
    ticks are 10 ms coarse."""
    total = 0
    for r in range(n):
        st = fs_cluster.Client(rt / f"node-{r}.sock").status()
        total += int(st["cpu_user_us"]) + int(st["cpu_sys_us"])
    return total


def daemon_sleeps(rt, n=2):
    """Voluntary context switches of each daemon of the job (every thread,
    STATUS `ctx_voluntary`): each is a thread that blocked, then was woken."""
    return [int(fs_cluster.Client(rt / f"node-{r}.sock").status()["ctx_voluntary"]) for r in range(n)]


def main_thread_cpu_us(pids):
    """CPU time of each daemon's main thread (the communication thread), in µs
    (/proc schedstat: nanoseconds on a CPU)."""
    return sum(int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0]) for pid in pids) / 1000


def node_cpus(rt, rank):
    """The CPUs daemon `rank` keeps to (STATUS `cpus`, as `taskset -c` takes them)."""
    return fs_cluster.Client(rt / f"node-{rank}.sock").status()["cpus"]


def daemon_pids(rt):
    out = subprocess.run(["pgrep", "-f", f"fanstore-daemon .*--runtime-dir {rt}"], capture_output=True, text=True).stdout
    return [int(x) for x in out.split() if Path(f"/proc/{x}/exe").exists() and os.readlink(f"/proc/{x}/exe").endswith("fanstore-daemon")]


def main():
    work = Path(tempfile.mkdtemp(prefix="fsprofile-"))
    rng = random.Random(1)
    src = work / "src"
    src.mkdir()
    for i in range(32):
        (src / f"f{i:02d}").write_bytes(rng.randbytes(SIZE))
    ds = work / "ds"
    sh([str(B / "fanstore-prep"), "pack", "--input", str(src), "--output", str(ds), "--partitions", "8", "--compress", "none"])
    ds_id, nodes = fs_cluster.read_index(ds / "manifest.fsm")
    ids = [n["id"] for n in nodes.values() if n["kind"] == 2 and n["partition"] % 2 == 1]
    rows = []
    # (row label, daemon arguments): the fd bound "0" is the sleeps before they trusted MPI's fds (a 10-50 µs
    # nap each); `--fetch-post comm` the communication thread posting every fetch, woken for it; spin 0 the
    # default before polling after a message watched the CPUs; `always` polling whether or not threads wait.
    d = f"{DEFAULT_SPIN} (default)"
    # `--share-cpus off`: both daemons' threads left to the scheduler (the default keeps each daemon on its
    # own share of the CPUs, fanstore-daemon/src/cpu_share.rs).
    idle = f", the reads {IDLE_BEFORE} s after ready"
    free = ", the reader left to the scheduler"
    settings = [(d, []), (d + free, []), (d + idle, []), (f"{d}, `--share-cpus off`", ["--share-cpus", "off"]),
                (f"{d}, `--share-cpus off`{idle}", ["--share-cpus", "off"]),
                (f"{d}, `--fetch-post comm`", ["--fetch-post", "comm"]), ("0", ["--comm-spin-us", "0"]),
                (f"{DEFAULT_SPIN}, `--comm-spin-while always`", ["--comm-spin-while", "always"]),
                (f"{d}, `--comm-fd-bound-us 0`", ["--comm-fd-bound-us", "0"]), (f"{d}, `--comm-sleep nap`", ["--comm-sleep", "nap"])]
    # A fresh job per setting and round, the settings in turn (reversed every other round), so that a
    # noisy stretch of this shared machine falls on every setting alike; the idle CPU once per setting.
    got = {k: [] for k in range(len(settings))}
    idles = {}
    for rnd in range(ROUNDS):
        order = list(enumerate(settings))
        for k, (_, extra) in (order if rnd % 2 == 0 else order[::-1]):
            c = start(work, ds, f"{k}-{rnd}", 2, ["--cache-mem", "0", "--replicate-on-read", "off", *extra])
            rt = c.runtime
            try:
                pids = daemon_pids(rt)
                if settings[k][0].endswith(idle):
                    time.sleep(IDLE_BEFORE)  # the daemons idle first, as before a job's first reads
                # The reader runs as node 0's programs would: on the CPUs rank 0's daemon keeps to.
                place = [] if settings[k][0].endswith(free) else ["taskset", "-c", node_cpus(rt, 0)]
                t0, m0, v0 = daemon_cpu_us(rt), main_thread_cpu_us(pids), daemon_sleeps(rt)
                out = sh(place + [str(B / "fanstore-bench-read"), "--socket", str(rt / "node-0.sock"), "--dataset", str(ds_id),
                          "--iters", str(ITERS), f"{SIZE}=" + ",".join(map(str, ids))])
                m = re.search(r"open_us=([\d.]+) total_us=([\d.]+)", out)
                files = ITERS + 5  # fanstore-bench-read's 5 warm-up reads count too
                got[k].append((float(m[1]), float(m[2]), (daemon_cpu_us(rt) - t0) / files, (main_thread_cpu_us(pids) - m0) / files,
                               [(b - a) / files for a, b in zip(v0, daemon_sleeps(rt))]))
                if rnd == ROUNDS - 1:
                    time.sleep(11)  # idle: the naps have grown to their cap
                    i0 = daemon_cpu_us(rt)
                    time.sleep(3)
                    idles[k] = (daemon_cpu_us(rt) - i0) / 1e6 / 3 / 2 * 100
            finally:
                c.stop(timeout=60, check=False)
    for k, (label, _) in enumerate(settings):
        g = got[k]
        med = lambda i: statistics.median(x[i] for x in g)  # noqa: E731
        sleeps = [statistics.median(x[4][r] for x in g) for r in range(2)]
        rows.append((label, med(0), med(1), med(2), med(3), sleeps, idles[k]))
    raw, fresh, nb = [], [], []
    for _ in range(ROUNDS):
        raw.append(float(re.search(r"median_us=([\d.]+)", sh(["mpiexec", "-n", "2", str(B / "fanstore-mpi-pingpong"), "--iters", str(ITERS), str(SIZE)]))[1]))
        fresh.append(float(re.search(r"median_us=([\d.]+)", sh(["mpiexec", "-n", "2", str(B / "fanstore-mpi-pingpong"), "--fresh-memfd", "--iters", str(ITERS), str(SIZE)]))[1]))
        nb.append(float(re.search(r"median_us=([\d.]+)", sh(["mpiexec", "-n", "2", str(B / "fanstore-mpi-pingpong"), "--nonblocking", "--iters", str(ITERS), str(SIZE)]))[1]))
    r, f, n = statistics.median(raw), statistics.median(fresh), statistics.median(nb)
    stages = stage_breakdown(work, ds, ds_id, ids)
    L = ["## Where the time goes: one remote 128 KiB OPEN (bench/remote_profile.py)", "",
         f"{ROUNDS} rounds x {ITERS} reads, a fresh job per row and round, the rows in turn, medians; raw MPI ping-pong (no daemon running) **{r:.0f} µs**, the same into a "
         f"fresh memfd per reply **{f:.0f} µs** (landing 128 KiB in new pages costs {f - r:.0f} µs here), the same with the "
         f"communication thread's nonblocking calls polled without pause (Irecv + Isend / Iprobe + Recv + Isend, Testsome) "
         f"**{n:.0f} µs**. Goal: OPEN+read "
         f"<= 2 x raw + 20 µs = {2 * r + 20:.0f} µs; daemon CPU per remote file <= 150 µs; idle daemons <= 1% of a core each.", "",
         "| `--comm-spin-us` | OPEN µs | OPEN+read µs | vs goal | daemon CPU per remote file, both ranks µs | of which the communication threads µs | threads blocked per remote file, rank 0 / rank 1 | idle CPU per daemon |",
         "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, o, t, cpu, comm, sleeps, idle in rows:
        L.append(f"| {name} | {o:.0f} | {t:.0f} | {t / (2 * r + 20):.2f}x | {cpu:.0f} | {comm:.0f} | "
                 f"{sleeps[0]:.2f} / {sleeps[1]:.2f} | {idle:.2f}% |")
    L += ["", "Reading the rows: the communication thread of each rank runs the MPI progress loop. It polls for "
          "`--comm-spin-us` after the last message while no runnable thread of the node waits for a CPU (the "
          "kernel's runnable count in /proc/loadavg, less the polling threads of the host's daemons, which yield: "
          "fanstore-daemon/src/comm/spin.rs; `always`: whether or not threads wait), and on those terms for as long as "
          "a payload over 256 KiB crosses (these rows have none), then sleeps in ppoll on its doorbell and MPI's epoll fds (a "
          "peer's message or the next bytes of a transfer wake it); while those fds announce every message, a sleep "
          f"lasts up to `--comm-fd-bound-us` ({DEFAULT_FD_BOUND} µs), its timer a guard only. "
          "`--comm-fd-bound-us 0` is the sleeps before: each one a 10-50 µs nap during a burst, whose timer fires "
          "(a fired timer costs ~35 µs of CPU and ~160 µs of wall time on this VM, an fd wake-up ~4 µs). "
          "`--comm-sleep nap` is the behaviour before the fds were used at all: naps on the command channel, and "
          "polling without pause while a transfer is in flight. `threads blocked per remote file`: the daemon's voluntary "
          "context switches (STATUS `ctx_voluntary`, every thread) over the reads: each is a thread that went to sleep "
          "and had to be woken, the hand-offs a remote OPEN pays for on the requester (rank 0) and the holder (rank 1). "
          f"`the reads {IDLE_BEFORE} s after ready`: the same job idles first, as a training job's daemons do while the "
          "program starts. Where the two daemons' threads were left to the scheduler, the slow reads after idle "
          "were a placement: sampled during the reads, both communication threads sat on one vCPU while the other, "
          "with the server thread and the reader, halted whenever they slept, and a wake-up on a halted vCPU costs "
          "40-60 µs against ~5 µs on one that a yielding thread keeps busy (a pipe wake-up measured both ways). "
          "Each daemon keeping to its own share of the CPUs (`--share-cpus auto`, the default; "
          "fanstore-daemon/src/cpu_share.rs), fresh jobs alternating (10 each): right after ready 90 against 124 µs "
          "with `--share-cpus off`, 3 s after ready 90 against 182 µs. The reader runs on rank 0's CPUs (STATUS "
          "`cpus`) in every row but `the reader left to the scheduler`: left alone, the scheduler may put it beside "
          "rank 1's daemon, where a program of node 0 could not be on two nodes, and where it reads ~130-160 µs "
          "against ~65-90 µs beside its own (the placement table below). A server thread that polled for its fetch and its socket, with `--fetch-post comm`, "
          "read 66-121 µs after idle (median 75 against 110) before the daemons kept to their shares, but 4 daemons "
          "and 4 readers of 128 KiB files read 1353 and 1319 MB/s against 1339 and 1452 with it, at 4-25 µs more "
          "daemon CPU per file (not kept)."]
    if stages:
        L += ["", f"Stages of one remote OPEN at the default spin (the daemons' debug log, {stages['n']} fetches, medians; "
              "the logging itself adds a few µs):", "",
              "| stage | µs |", "|---|---:|",
              f"| client OPEN, fd in hand (whole round trip) | {stages['open']:.0f} |",
              f"| requester: receives and request posted by the server thread, queued for the communication thread, + the copy's pages allocated (fallocate, overlaps the transfer) | {stages['send']:.0f} |",
              f"| requester: waiting for the verified payload | {stages['wait']:.0f} |",
              f"| of which the communication thread's fetch (request posted -> last byte in, hashed) | {stages['comm']:.0f} |",
              f"| holder: payload ready to send (a slice of the mapped partition copy) | {stages['ready']:.2f} |",
              f"| requester: bytes written into the copy (pwrite) | {stages['fill']:.0f} |",
              f"| the rest: client request and reply, the copy's creation and link, the fd's reopen on both sides | "
              f"{stages['open'] - stages['send'] - stages['wait'] - stages['fill']:.0f} |", "",
              "Against the raw ping-pong, the fetch itself costs the MPI transfer plus hashing; the other stages are "
              "hand-offs between threads (the reply wakes the communication thread, which wakes the client and the "
              "server thread, each a wake-up that waits for a free core when two communication threads, a server "
              "thread and the client share 2 cores), and the copy's creation. The server thread posts the fetch "
              "itself and queues it without waking the communication thread (README, MPI); `--fetch-post comm` "
              "above is the hand-off before, the communication thread woken to post it. A 128 KiB file stored uncompressed is answered by the "
              "communication thread itself once verified (README, the daemon's direct answer): the client has its fd "
              "while the server thread still wakes from its wait, so the waiting row holds a wake-up the client no "
              "longer waits for, and `the rest` (the round trip less the other rows) is smaller by as much."]
    counts = syscall_counts(work, ds, ds_id, ids)
    if counts:
        files, per_rank = counts
        L += ["", f"System calls per remote file at the default settings (`strace -f -c` attached to both daemons, every "
              f"thread, over {files} reads; the tracing slows the reads, the counts are what they are): the requester "
              "(rank 0) and the holder (rank 1).", "",
              "| rank | all | the most frequent, per remote file |", "|---|---:|---|"]
        for rank, (total, top) in enumerate(per_rank):
            L.append(f"| {rank} | {total:.1f} | " + ", ".join(f"{name} {n:.1f}" for name, n in top) + " |")
        L += ["", "`epoll_wait` is MPI's progress (UCX over TCP): one non-blocking wait per network device UCX opened, on "
              "every progress call (here `lo` and `eth0`: with `UCX_NET_DEVICES=lo` the count halves). Each wake-up of a "
              "communication thread makes a round of progress calls: until two probes in a row find nothing, then the "
              "test of the requests in flight."]
    place = placement(work, ds, ds_id, ids)
    L += ["", "Where the wake-ups cost: the same reads at the default settings with the processes placed by hand "
          "(`taskset`; each daemon's threads together), a fresh job per row and round, medians. `node 0 on CPU 0, node 1 on CPU 1`: "
          "rank 0's daemon and the client on CPU 0, rank 1's daemon on CPU 1, as if each node's work stayed on one "
          "core; `all on CPU 0`: everything on one CPU, so every hand-off is a wake-up on the same CPU; "
          "`the client away from its daemon`: rank 0's daemon on CPU 1 with rank 1's, the client on CPU 0. "
          "The first two rows place nothing by hand: `free` leaves every thread to the scheduler, `the default` "
          "lets each daemon keep its threads on its own share of the CPUs (fanstore-daemon/src/cpu_share.rs; a "
          "daemon placed by `taskset`, as by a launcher that binds, keeps that placement).", "",
          "| placement | OPEN+read µs | vs free | daemon CPU per remote file, both ranks µs |", "|---|---:|---:|---:|"]
    free = place[0][1]
    for name, t, cpu in place:
        L.append(f"| {name} | {t:.0f} | {t / free:.2f}x | {cpu:.0f} |")
    L += ["", "A hand-off to a thread whose CPU is idle costs this VM ~44 µs (bench/halt_poll.py: half a pipe round "
          "trip across CPUs), one on the same CPU ~2 µs. A small remote OPEN hands off four times (client -> server "
          "thread -> holder -> communication thread -> client; the server thread posts the fetch itself): kept on "
          "one CPU per node, only the two crossings between the nodes remain; kept on one CPU, none."]
    print("\n".join(L))


def syscall_counts(work, ds, ds_id, ids):
    """(files read, [(system calls per file, [(name, per file)] of the most
    frequent)] per rank) of one 2-rank job at the default settings, from
    `strace -f -c` attached to both daemons; None without strace."""
    if shutil.which("strace") is None:
        return None
    c = start(work, ds, "-strace", 2, ["--cache-mem", "0", "--replicate-on-read", "off"])
    rt = c.runtime
    try:
        pids = daemon_pids(rt)
        ranks = {int(fs_cluster.Client(rt / f"node-{r}.sock").status()["pid"]): r for r in range(2)}
        tracers = [(ranks.get(pid), work / f"strace-{pid}", subprocess.Popen(
            ["strace", "-f", "-c", "-o", str(work / f"strace-{pid}"), "-p", str(pid)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)) for pid in pids]
        time.sleep(1)  # attached to every thread
        sh([str(B / "fanstore-bench-read"), "--socket", str(rt / "node-0.sock"), "--dataset", str(ds_id),
            "--iters", str(ITERS), f"{SIZE}=" + ",".join(map(str, ids))])
        for _, _, t in tracers:
            t.send_signal(signal.SIGINT)
            t.wait(timeout=30)
    finally:
        c.stop(timeout=60, check=False)
    files = ITERS + 5
    per_rank = [None, None]
    for rank, path, _ in tracers:
        calls = {}
        for line in path.read_text(errors="replace").splitlines():
            f = line.split()
            # % time, seconds, usecs/call, calls, [errors], syscall
            if len(f) >= 5 and f[3].isdigit() and f[-1] != "total" and not line.startswith("%"):
                calls[f[-1]] = int(f[3])
        if rank is None or not calls:
            return None
        top = sorted(calls.items(), key=lambda kv: -kv[1])[:8]
        per_rank[rank] = (sum(calls.values()) / files, [(n, c / files) for n, c in top])
    return (files, per_rank) if all(per_rank) else None


def placement(work, ds, ds_id, ids):
    """OPEN+read and daemon CPU per remote file with the two daemons and the
    client pinned to CPUs by hand: [(name, µs, CPU µs per file)], free first."""
    configs = [("free (the scheduler's choice, `--share-cpus off`)", None, None, None, ["--share-cpus", "off"]),
               ("the default: each daemon on its own share (`--share-cpus auto`), the client free", None, None, None, []),
               ("node 0 on CPU 0, node 1 on CPU 1", "0", "1", "0", []),
               ("all on CPU 0", "0", "0", "0", []), ("the client away from its daemon", "1", "1", "0", [])]
    got = {c[0]: ([], []) for c in configs}
    for rnd in range(ROUNDS):
        for k, (name, c0, c1, cc, extra) in enumerate(configs):
            cpus = f"{c0 or '0-1'} {c1 or '0-1'}"
            pin = f'set -- {cpus} "$@"; eval c=\\${{$((PMI_RANK + 1))}}; shift 2; exec taskset -c "$c" "$@"'
            job = start(work, ds, f"-place-{rnd}-{k}", 2, ["--cache-mem", "0", "--replicate-on-read", "off", *extra],
                        log_path=work / "log-place", log_mode="ab", wrapper=["sh", "-c", pin, "pin"])
            rt = job.runtime
            try:
                t0 = daemon_cpu_us(rt)
                out = sh((["taskset", "-c", cc] if cc else []) + [
                    str(B / "fanstore-bench-read"), "--socket", str(rt / "node-0.sock"), "--dataset", str(ds_id),
                    "--iters", str(ITERS), f"{SIZE}=" + ",".join(map(str, ids))])
                got[name][0].append(float(re.search(r"total_us=([\d.]+)", out)[1]))
                got[name][1].append((daemon_cpu_us(rt) - t0) / (ITERS + 5))
            finally:
                job.stop(timeout=60, check=False)
    return [(c[0], statistics.median(got[c[0]][0]), statistics.median(got[c[0]][1])) for c in configs]


def stage_breakdown(work, ds, ds_id, ids):
    """One more 2-rank run at the default spin with the daemons' debug log,
    parsed into the stages of a remote OPEN (medians, µs)."""
    def us(v, unit):
        return float(v) * {"ns": 0.001, "µs": 1.0, "ms": 1000.0, "s": 1e6}[unit]
    log = work / "log-stages"
    c = start(work, ds, "-stages", 2, ["--cache-mem", "0", "--replicate-on-read", "off"],
              env_extra={"RUST_LOG": "fanstore_daemon=debug"})
    rt = c.runtime
    opens = []
    try:
        for _ in range(ROUNDS):
            out = sh([str(B / "fanstore-bench-read"), "--socket", str(rt / "node-0.sock"), "--dataset", str(ds_id),
                      "--iters", str(ITERS), f"{SIZE}=" + ",".join(map(str, ids))])
            opens.append(float(re.search(r"open_us=([\d.]+)", out)[1]))
    finally:
        c.stop(timeout=60, check=False)
    text = log.read_text(errors="replace")
    u = r"([\d.]+)(ns|µs|ms|s)"
    fetch = re.findall(rf"send\+fallocate {u}, wait {u}, fill {u}", text)
    comm = re.findall(rf"B from rank \d+ in {u}", text)
    ready = re.findall(rf"ready in {u}", text)
    if not fetch or not comm or not ready:
        return None
    return dict(n=len(fetch), open=statistics.median(opens),
                send=statistics.median(us(a, b) for a, b, *_ in fetch),
                wait=statistics.median(us(x[2], x[3]) for x in fetch),
                fill=statistics.median(us(x[4], x[5]) for x in fetch),
                comm=statistics.median(us(a, b) for a, b in comm),
                ready=statistics.median(us(a, b) for a, b in ready))


if __name__ == "__main__":
    main()
