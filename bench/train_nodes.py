"""Training-shaped reader on 4 nodes vs 1 node (issue 13 goal: >= 0.8x).

    python3 bench/train_nodes.py [--quick]      (prints a markdown section)

scripts/train_reader.py (4 forked workers, random order, 2 epochs, PNG
decode with pillow, np.load of .npz) reads a scripts/gen_dataset.py tree
through /fanstore from node 0, once with 1 daemon holding every partition,
once with 4 daemons (`mpiexec -n 4`, UCX_TLS=tcp) so that 3/4 of the files
are remote on the first epoch (the node cache of copies serves the second,
as in training), once with 4 daemons whose communication threads sleep
10-50 µs naps during a burst (`--comm-fd-bound-us 0`, the behaviour before
a sleep trusted MPI's epoll fds to announce every message), and once more with 4 daemons started with
`--prefetch-remote all`: each daemon fetches the remote partitions whole in
the background while the first epoch runs (the reader starts right after
`fanstore wait`, as a job script does). Default --cache-mem. A fresh job for
every run (the first epoch is cold); runs alternate; medians. The digests of
every byte read must be equal.

A second table runs the same reader for 3 epochs with `--cache-mem 0`, as
when the dataset is larger than the node cache (every epoch's remote files
cross again unless their partition is replicated): 1 daemon, and 4 daemons
with `--replicate-on-read off`, `auto` (the default: a partition is fetched
whole once the node's remote reads of its files took as long as its fetch
would) and `all` (on the first read).
"""
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import fs_cluster  # noqa: E402  (starts the daemons)

B = ROOT / "target" / "release"
QUICK = "--quick" in sys.argv
ROUNDS = 2 if QUICK else 3
CLASSES, PER_CLASS, SIZE = (8, 60, 96) if QUICK else (16, 100, 128)
env = dict(os.environ, UCX_TLS=os.environ.get("UCX_TLS", "tcp"), RUST_LOG="warn")


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def main():
    work = Path(tempfile.mkdtemp(prefix="fstrain-"))
    src = work / "src"
    sh([sys.executable, str(ROOT / "scripts" / "gen_dataset.py"), str(src), "--classes", str(CLASSES), "--per-class",
        str(PER_CLASS), "--size", str(SIZE)])
    ds = work / "ds"
    sh([str(B / "fanstore-prep"), "pack", "--input", str(src), "--output", str(ds), "--partitions", "8"], env=env)
    # configuration -> (daemons, extra daemon arguments)
    configs = {1: (1, []), 4: (4, []), "4b": (4, ["--comm-fd-bound-us", "0"]), "4p": (4, ["--prefetch-remote", "all"]),
               "4r": (4, ["--replicate-on-read", "all"]), "4s": (4, ["--comm-spin-us", "0"]),
               # the dataset larger than the node cache, 3 epochs
               "c1": (1, ["--cache-mem", "0"]), "c4off": (4, ["--cache-mem", "0", "--replicate-on-read", "off"]),
               "c4offs": (4, ["--cache-mem", "0", "--replicate-on-read", "off", "--comm-spin-us", "0"]),
               "c4auto": (4, ["--cache-mem", "0"]), "c4all": (4, ["--cache-mem", "0", "--replicate-on-read", "all"])}
    epochs = {k: "3" if str(k).startswith("c") else "2" for k in configs}
    res = {k: [] for k in configs}
    cpu = {k: [] for k in configs}

    def start(k, r):
        """`mpiexec -n N` daemons of configuration `k` (the tests' cluster helper;
        RUST_LOG=warn hides the info lines of its MPI library check)."""
        n, extra = configs[k]
        return fs_cluster.start_cluster(fs_cluster.release_bins(), ds, work, nranks=n, mount=f"/fstrain{n}",
                                        extra_args=extra, timeout=120, runtime=work / f"rt{k}-{r}",
                                        local=work / f"local{k}-{r}", log_path=work / f"log{k}-{r}", env=env,
                                        check_mpi=False)

    for r in range(ROUNDS):
        order = list(configs)
        for n in (order if r % 2 == 0 else order[::-1]):
            job = start(n, r)  # a fresh job each run: the first epoch is cold, as in a new training job
            rt = job.runtime
            try:
                e = dict(env, FANSTORE_RUNTIME_DIR=str(rt), FANSTORE_NODE="0", LD_PRELOAD=str(B / "libfanstore_preload.so"))
                out = sh([sys.executable, str(ROOT / "scripts" / "train_reader.py"), f"/fstrain{configs[n][0]}/train", "--workers", "4",
                          "--epochs", epochs[n], "--seed", str(r)], env=e).split()
                res[n].append((float(out[out.index("files/s,") - 1]), out[-1]))
                cpu[n].append(daemon_cpu(rt))
            finally:
                job.stop(timeout=60, check=False)
    nfiles = sum(1 for f in (src / "train").rglob("*") if f.is_file())
    same = all(len({d for k in configs if epochs[k] == e for _, d in res[k]}) == 1 for e in set(epochs.values()))
    one, four, naps, pre, onread, nospin = (statistics.median(x for x, _ in res[k]) for k in (1, 4, "4b", "4p", "4r", "4s"))
    c = {k: statistics.median(v) for k, v in cpu.items()}
    big = statistics.median(x for x, _ in res["c1"])
    print("\n".join([
        "## Training-shaped reader: 4 nodes vs 1 node (bench/train_nodes.py)", "",
        f"scripts/train_reader.py on node 0 (4 forked workers, 2 epochs, {nfiles} files of gen_dataset.py "
        f"--classes {CLASSES} --per-class {PER_CLASS} --size {SIZE}), {ROUNDS} alternating runs, medians; "
        f"digests {'identical' if same else 'DIFFER'} (between runs of as many epochs).", "",
        "`daemon CPU s`: user + system seconds of every daemon process of the job from start to the end of the "
        "reader (/proc), median of the runs. `--comm-fd-bound-us 0`: every sleep of the communication thread is "
        "a 10-50 µs nap during a burst (its timer fires), as before a sleep trusted MPI's epoll fds to announce "
        "every message (the default: a sleep lasts up to 2 ms unless a message, a command or the next bytes of a "
        "transfer end it). `--comm-spin-us 0`: the communication thread sleeps as soon as it has nothing in hand "
        "(the default polls 200 µs after a message while no thread of the node waits for a CPU).", "",
        "| daemons | files/s | runs | vs 1 node | daemon CPU s |", "|---:|---:|---|---:|---:|",
        f"| 1 (every partition local) | {one:.0f} | {', '.join(f'{x:.0f}' for x, _ in res[1])} | 1.00x | {c[1]:.2f} |",
        f"| 4, default (3/4 remote on the first epoch) | {four:.0f} | {', '.join(f'{x:.0f}' for x, _ in res[4])} | **{four / one:.2f}x** | {c[4]:.2f} |",
        f"| 4, `--comm-spin-us 0` | {nospin:.0f} | {', '.join(f'{x:.0f}' for x, _ in res['4s'])} | **{nospin / one:.2f}x** | {c['4s']:.2f} |",
        f"| 4, `--comm-fd-bound-us 0` | {naps:.0f} | {', '.join(f'{x:.0f}' for x, _ in res['4b'])} | **{naps / one:.2f}x** | {c['4b']:.2f} |",
        f"| 4, `--prefetch-remote all` | {pre:.0f} | {', '.join(f'{x:.0f}' for x, _ in res['4p'])} | **{pre / one:.2f}x** | {c['4p']:.2f} |",
        f"| 4, `--replicate-on-read all` | {onread:.0f} | {', '.join(f'{x:.0f}' for x, _ in res['4r'])} | **{onread / one:.2f}x** | {c['4r']:.2f} |",
        "",
        "The dataset larger than the node cache: the same reader for 3 epochs, every daemon with `--cache-mem 0` "
        "(a fresh job per run, 3/4 of the files remote on 4 daemons).", "",
        "| daemons | files/s | runs | vs 1 node | daemon CPU s |", "|---:|---:|---|---:|---:|",
        *(f"| {label} | {m:.0f} | {', '.join(f'{x:.0f}' for x, _ in res[k])} | **{m / big:.2f}x** | {c[k]:.2f} |"
          for k, label, m in ((k, label, statistics.median(x for x, _ in res[k])) for k, label in (
              ("c1", "1, `--cache-mem 0`"), ("c4off", "4, `--replicate-on-read off`"),
              ("c4offs", "4, `--replicate-on-read off --comm-spin-us 0`"),
              ("c4auto", "4, `--replicate-on-read auto` (default)"), ("c4all", "4, `--replicate-on-read all`")))),
    ]))


def daemon_cpu(rt):
    """CPU seconds (user + system) of the daemon processes started with runtime dir `rt`."""
    hz = os.sysconf("SC_CLK_TCK")
    total = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
            if not cmd or not cmd[0].endswith(b"fanstore-daemon") or str(rt).encode() not in cmd:
                continue
            f = (d / "stat").read_text().rsplit(")", 1)[1].split()
            total += int(f[11]) + int(f[12])
        except OSError:
            continue
    return total / hz


if __name__ == "__main__":
    main()
