"""What waking a sleeping thread costs here, and what that costs a remote read (issue 13).

    python3 bench/halt_poll.py [--quick]          (prints a markdown section)
    FANSTORE_BENCH_HALT_POLL_NS=200000 python3 bench/halt_poll.py

One small remote OPEN through sleeping threads is a chain of four wake-ups:
the client's request wakes a server thread, which posts the fetch; its MPI
request wakes the holder's communication thread, whose reply wakes the
requester's communication thread, whose answer wakes the client. A raw MPI
ping-pong busy-polls on both ends and pays none. Always measured: the wake-up cost itself (bench/wakeup.c,
two processes bouncing a byte over pipes, pinned to different CPUs or to one).

On a virtual machine whose kernel runs cpuidle-haltpoll, an idle vCPU halts
at once when `guest_halt_poll_ns` is 0 (the platform's setting here), and
waking it costs an exit to the host. With FANSTORE_BENCH_HALT_POLL_NS=N (root
only; the knob is /sys/module/haltpoll/parameters/guest_halt_poll_ns) this
script alternates rounds with the machine's setting and with N (an idle vCPU
polls up to N ns before it halts), measuring side by side: the wake-up cost,
one remote 128 KiB OPEN+read on 2 ranks with the daemons' CPU per remote
file (as bench/remote_profile.py), the raw MPI ping-pong at 128 KiB and 2 MiB
(no daemon running), and 4 daemons with 4 readers each reading every file
(3/4 remote, --cache-mem 0) at 128 KiB and 2 MiB (as bench/remote_read.sh).
The setting is restored when the script ends, failed or not.
"""
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import remote_profile as rp  # noqa: E402  (sh, daemon_cpu_us, fs_cluster)

B = rp.B
QUICK = "--quick" in sys.argv
ROUNDS = 2 if QUICK else 3
ITERS = 300 if QUICK else 1000
SET_MB = 24 if QUICK else 64
KNOB = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
SIZES = (128 << 10, 2 << 20)


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def wakeups(probe):
    """(across CPUs, on one CPU) µs per pipe round trip (two wake-ups)."""
    ncpu = os.cpu_count() or 1
    cross = float(rp.sh([str(probe), "20000", "0", str(min(1, ncpu - 1))]))
    same = float(rp.sh([str(probe), "20000", "0", "0"]))
    return cross, same


def pingpong():
    out = rp.sh(["mpiexec", "-n", "2", str(B / "fanstore-mpi-pingpong"), "--iters", str(ITERS), *map(str, SIZES)])
    return {int(m[1]): float(m[2]) for m in re.finditer(r"size=(\d+) .*median_us=([\d.]+)", out)}


def start(work, ds, name, n, local=None):
    """(cluster, its runtime directory): `mpiexec -n n` daemons, every OPEN remote."""
    c = rp.start(work, ds, name, n, ["--cache-mem", "0", "--replicate-on-read", "off"], local=local,
                 log_path=work / f"{name}.log")
    return c, c.runtime


def stop(c, rt):
    c.stop(timeout=90, check=False)


def remote_open(work, ds, ds_id, ids, name):
    """(OPEN+read µs, daemon CPU µs per remote file) of one 2-rank job."""
    p, rt = start(work, ds, name, 2)
    try:
        t0 = rp.daemon_cpu_us(rt)
        # The reader on rank 0's CPUs, as node 0's programs (bench/remote_profile.py).
        out = rp.sh(["taskset", "-c", rp.node_cpus(rt, 0), str(B / "fanstore-bench-read"), "--socket", str(rt / "node-0.sock"), "--dataset", str(ds_id),
                     "--iters", str(ITERS), f"{128 << 10}=" + ",".join(map(str, ids))])
        cpu = (rp.daemon_cpu_us(rt) - t0) / (ITERS + 5)  # fanstore-bench-read's 5 warm-up reads count too
        return float(re.search(r"total_us=([\d.]+)", out)[1]), cpu
    finally:
        stop(p, rt)


def readers4(reader, lst, rt):
    ps = [subprocess.Popen([str(reader), "1"], stdin=open(lst), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=dict(rp.env, FANSTORE_RUNTIME_DIR=str(rt), FANSTORE_NODE=str(k),
                                    LD_PRELOAD=str(B.resolve() / "libfanstore_preload.so")))
          for k in range(4)]
    outs = [q.communicate() for q in ps]
    for q, (o, e) in zip(ps, outs):
        if q.returncode != 0 or len(o.split()) != 3:
            raise RuntimeError(f"reader failed ({q.returncode}): {e.strip()[:300]}")
    nbytes = sum(int(o.split()[1]) for o, _ in outs)
    return nbytes / max(float(o.split()[2]) for o, _ in outs) / 1e6


def aggregate(work, mds, lists, reader, name):
    """MB/s of 4 readers on 4 daemons, per size."""
    p, rt = start(work, mds, name, 4, local=Path(f"/dev/shm/{work.name}-{name}"))
    try:
        res = {}
        for s in SIZES:
            readers4(reader, lists[s], rt)  # warm-up: connections, page tables
            res[s] = readers4(reader, lists[s], rt)
        return res
    finally:
        stop(p, rt)
        subprocess.run(["rm", "-rf", f"/dev/shm/{work.name}-{name}"])


def main():
    work = Path(tempfile.mkdtemp(prefix="fshaltpoll-"))
    probe = work / "wakeup"
    subprocess.run(["cc", "-O2", "-o", str(probe), str(Path(__file__).resolve().parent / "wakeup.c")], check=True)
    want = os.environ.get("FANSTORE_BENCH_HALT_POLL_NS")
    L = ["## Waking a sleeping thread: what it costs here, and what it costs a remote read (bench/halt_poll.py)", ""]
    cross, same = wakeups(probe)
    L.append(f"Pipe round trip between two sleeping processes (two wake-ups, median of 5 x 20000): across CPUs "
             f"**{cross:.1f} µs**, on one CPU **{same:.1f} µs**. A small remote OPEN through sleeping threads wakes four "
             f"(client -> server thread -> holder -> communication thread -> client; the server thread posts the "
             f"fetch, the communication thread answers the client once the payload is verified): at half a round "
             f"trip each, **{2 * cross:.0f} µs** of wake-ups when every hand-off crosses CPUs, before any work.")
    if not want:
        L.append("")
        L.append("(No side-by-side run with the guest's halt polling: set FANSTORE_BENCH_HALT_POLL_NS, as root, on a "
                 "guest whose kernel runs cpuidle-haltpoll.)")
        print("\n".join(L))
        return
    if not os.access(KNOB, os.W_OK):
        raise SystemExit(f"{KNOB}: not writable here (needs root and a guest kernel with cpuidle-haltpoll)")
    base = KNOB.read_text().strip()
    rng = random.Random(1)
    src = work / "src"
    src.mkdir()
    for i in range(32):
        (src / f"f{i:02d}").write_bytes(rng.randbytes(128 << 10))
    ds = work / "ds"
    rp.sh([str(B / "fanstore-prep"), "pack", "--input", str(src), "--output", str(ds), "--partitions", "8", "--compress", "none"])
    ds_id, nodes = rp.fs_cluster.read_index(ds / "manifest.fsm")
    ids = [n["id"] for n in nodes.values() if n["kind"] == 2 and n["partition"] % 2 == 1]
    msrc = work / "msrc"
    lists = {}
    for s in SIZES:
        names = []
        for i in range((SET_MB << 20) // s):
            d = msrc / f"s{s >> 10}k" / f"d{i // 64:03d}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"f{i:05d}.bin").write_bytes(rng.randbytes(s))
            names.append(f"s{s >> 10}k/d{i // 64:03d}/f{i:05d}.bin")
        lists[s] = work / f"list{s}"
        lists[s].write_text("".join(f"/fanstore/{n}\n" for n in names))
    mds = work / "mds"
    rp.sh([str(B / "fanstore-prep"), "pack", "--input", str(msrc), "--output", str(mds), "--partitions", "16", "--compress", "none"])
    reader = work / "readfiles"
    subprocess.run(["cc", "-O2", "-o", str(reader), str(Path(__file__).resolve().parent / "readfiles.c")], check=True)
    runs = {base: [], want: []}
    try:
        for r in range(ROUNDS):
            for setting in (base, want) if r % 2 == 0 else (want, base):
                KNOB.write_text(setting)
                time.sleep(0.2)
                row = dict(wake=wakeups(probe)[0], raw=pingpong())
                row["open"], row["cpu"] = remote_open(work, ds, ds_id, ids, f"o{r}-{setting}")
                row["agg"] = aggregate(work, mds, lists, reader, f"a{r}-{setting}")
                runs[setting].append(row)
                print(f"round {r} guest_halt_poll_ns={setting}: {row}", file=sys.stderr)
    finally:
        KNOB.write_text(base)
    L += ["", f"Side by side, {ROUNDS} alternating rounds, medians: `guest_halt_poll_ns` {base} (this machine's setting: an "
          f"idle vCPU halts at once) against {want} (it polls up to {int(want) / 1000:.0f} µs first), restored after. "
          f"Remote OPEN+read: 2 ranks, {ITERS} reads of 128 KiB that only rank 1 holds, `--cache-mem 0 "
          f"--replicate-on-read off`, the reader on rank 0's CPUs (STATUS `cpus`); daemon CPU per remote file from each rank's getrusage (both ranks, every thread). Aggregate: "
          f"4 daemons (`mpiexec -n 4`, UCX_TLS=tcp, `--cache-mem 0 --replicate-on-read off`), 4 readers "
          f"(bench/readfiles.c, FANSTORE_NODE=0..3) each reading all {SET_MB} MiB of a size, 3/4 remote; raw: "
          f"fanstore-mpi-pingpong, no daemon running.", "",
          "| `guest_halt_poll_ns` | wake-up round trip across CPUs µs | remote 128 KiB OPEN+read µs | goal (2 x raw + 20) µs | vs goal | daemon CPU per remote file µs | raw MPI 128 KiB µs | 4 daemons 128 KiB MB/s | vs raw 128 KiB | 4 daemons 2 MiB MB/s | vs raw 2 MiB |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for setting in (base, want):
        rows = runs[setting]
        raw = {s: med([x["raw"][s] for x in rows if s in x["raw"]]) for s in SIZES}
        rawbw = {s: s / raw[s] for s in SIZES}  # MB/s (bytes per µs)
        agg = {s: med([x["agg"][s] for x in rows]) for s in SIZES}
        op = med([x["open"] for x in rows])
        goal = 2 * raw[128 << 10] + 20
        L.append(f"| {setting}{' (this machine)' if setting == base else ''} | {med([x['wake'] for x in rows]):.1f} | "
                 f"{op:.0f} | {goal:.0f} | {op / goal:.2f}x | {med([x['cpu'] for x in rows]):.0f} | {raw[128 << 10]:.0f} | "
                 f"{agg[128 << 10]:.0f} | {agg[128 << 10] / rawbw[128 << 10]:.2f}x | {agg[2 << 20]:.0f} | "
                 f"{agg[2 << 20] / rawbw[2 << 20]:.2f}x |")
    L += ["", "The platform's idle policy, not FanStore, sets the price of every hand-off between sleeping threads: "
          "the rows differ only in it. Bare-metal cluster nodes usually wake a thread in a few µs (the `on one CPU` "
          "figure above is the order of it); on a cloud VM with halting idle vCPUs, a daemon pays the first row."]
    print("\n".join(L))


if __name__ == "__main__":
    main()
