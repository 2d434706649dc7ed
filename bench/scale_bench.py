"""Scale benchmark (issue 18, "ImageNet scale, 1.28M files"): how pack, load,
reads and stop grow with the file count, side by side with tar.

For each N (100k, 400k, 1.28M; `--quick`: 100k only; FANSTORE_SCALE_NS="100000,400000"
overrides) a tree of N files of 100 bytes in 1000 directories (even files
random bytes, odd files a repeated text line that lz4 shrinks; written by
bench/gensmall.c and kept under the cache directory for the next run):
  1. `tar -cf` of the tree vs `fanstore-prep pack --compress lz4 --threads 2
     --partitions 8`, interleaved, REPS runs each, medians (page cache warm:
     one untimed tar first; `sync` before each run, so that pack's fsyncs do
     not wait for tar's dirty archive). Pack's time per file at N vs at the
     smallest N is the linearity ratio;
  2. time to ready: `mpiexec -n 1 fanstore-daemon --data DS --local L` started
     in the background, from launch until `fanstore wait` returns;
  3. `tar -xf` of the archive into a fresh directory (same disk);
  4. random reads: 2 processes each open+read+close 20k random files
     (bench/scale_readers.c), through /fanstore with LD_PRELOAD vs the same
     readers on the native tree (page cache warm: one untimed pass each
     first), READ_REPS passes, medians; files/s and the ratio; then, once the
     daemon's copy count (`fanstore status` cache_entries) stood still for
     1 s, the same reads again: the rate of later epochs;
  5. shm index bytes per file (size of the daemon's new /dev/shm/*.index / N)
     and daemon VmRSS per file (after load and after the reads);
  6. `fanstore stop`: time until it returns and mpiexec has exited;
  7. the readers again against a daemon launched from a shell with
     `ulimit -n 1024`: errors (EIO and others) counted, not hidden;
  8. at the largest N, a torch DataLoader (bench/loader_reader.py, the
     frameworks' venv) on node 0 of `mpiexec -n 4` daemons, per
     `--replicate-on-read` rule (off, auto), against the native tree:
     the dataset scan, then 100k random files read twice.
Only the command-line interface of the daemon is used (no internals): the
index file is the one that appears in /dev/shm while it runs, its pid the
process whose command line holds this run's --local directory.

Writes bench/out/scale.md, bench/out/scale.json (rows and goals) and the
log-log plot bench/scale.png. Nothing here asserts a time.
Usage: python3 bench/scale_bench.py [--quick]
Environment: FANSTORE_SCALE_NS [100000,400000,1280000], FANSTORE_SCALE_REPS [5],
  FANSTORE_SCALE_READ_REPS [3], FANSTORE_SCALE_READS [20000] (per reader),
  FANSTORE_SCALE_CACHE [/tmp/fanstore-scale-cache] (generated trees),
  FANSTORE_SCALE_WORK [/tmp/fanstore-scale-work] (archives, datasets, daemons),
  FANSTORE_SCALE_ULIMIT [1] (0 skips step 7; a number above 1 runs it only for N up to that),
  FANSTORE_SCALE_LOADER_ROUNDS [3] (0 skips step 8), FANSTORE_SCALE_LOADER_READS [100000],
  FANSTORE_VENV [/opt/fanstore-venv]
"""
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from benchlib import BIN, FRAMEWORK_PY, OUT, PRELOAD, ROOT, cc, machine, median, pyplot, table  # noqa: E402
import fs_cluster  # noqa: E402  (the daemons' STATUS counters, over their sockets)

QUICK = "--quick" in sys.argv
E = os.environ.get
NS = [int(x) for x in E("FANSTORE_SCALE_NS", "100000" if QUICK else "100000,400000,1280000").split(",") if x.strip()]
REPS = int(E("FANSTORE_SCALE_REPS", "5"))
READ_REPS = int(E("FANSTORE_SCALE_READ_REPS", "3"))
READS = int(E("FANSTORE_SCALE_READS", "20000"))
READERS = 2
CACHE = Path(E("FANSTORE_SCALE_CACHE", "/tmp/fanstore-scale-cache"))
WORK = Path(E("FANSTORE_SCALE_WORK", "/tmp/fanstore-scale-work"))
# 1: step 7 at every N; 0: never; a larger number: only at N up to it.
ULIMIT = int(E("FANSTORE_SCALE_ULIMIT", "1"))
DIRS, SIZE, GEN_VERSION = 1000, 100, "v2"
# Step 8: a torch DataLoader on 4 nodes (the frameworks' venv of scripts/setup.sh).
LOADER_PY = FRAMEWORK_PY
LOADER_READS = int(E("FANSTORE_SCALE_LOADER_READS", "100000"))
LOADER_ROUNDS = int(E("FANSTORE_SCALE_LOADER_ROUNDS", "3"))
LOADER_RULES = ("off", "auto")
LOADER_RANKS, LOADER_PARTS = 4, 16
PREP, DAEMON, CLI = str(BIN / "fanstore-prep"), str(BIN / "fanstore-daemon"), str(BIN / "fanstore")


def log(msg):
    print(f"scale: {msg}", file=sys.stderr, flush=True)


def timed(cmd, **kw) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, **kw)
    return time.perf_counter() - t


def timed_cpu(cmd, **kw) -> tuple:
    """(wall seconds, CPU seconds: user + system of the command and its threads)."""
    before = os.times()
    wall = timed(cmd, **kw)
    after = os.times()
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def rm(p: Path):
    if p.is_dir() and not p.is_symlink():
        subprocess.run(["rm", "-rf", "--", str(p)], check=True)  # shutil.rmtree is minutes slower at 1.28M files
    elif p.exists() or p.is_symlink():
        p.unlink()


def tree(n: int, gen: str) -> Path:
    """The generated tree of n files, reused when its stamp matches."""
    src, stamp = CACHE / f"src-{n}", CACHE / f"src-{n}.done"
    want = f"{n} {DIRS} {SIZE} {GEN_VERSION}"
    if stamp.exists() and stamp.read_text().strip() == want:
        return src
    log(f"generating {n} files of {SIZE} B in {DIRS} directories under {src}")
    rm(stamp)
    rm(src)
    t = timed([gen, str(src), str(n), str(DIRS), str(SIZE)])
    stamp.write_text(want + "\n")
    log(f"generated in {t:.0f} s")
    return src


def file_path(i: int) -> str:
    return f"d{i % DIRS:04d}/f{i:07d}.bin"


JOB_ID = f"scale{os.getpid()}"


def daemon_env(rt: Path) -> dict:
    # A job id of our own: the daemon's /dev/shm index carries it in its name.
    env = dict(os.environ, FANSTORE_RUNTIME_DIR=str(rt), FANSTORE_JOB_ID=JOB_ID)
    env.setdefault("UCX_TLS", "tcp")
    env.pop("LD_PRELOAD", None)
    return env


def shm_indexes() -> set:
    return set(Path("/dev/shm").glob(f"fanstore-*-{JOB_ID}-*.index"))


def daemon_pid(local: Path):
    """The pid of the fanstore-daemon process whose command line holds `local`."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"fanstore-daemon") and str(local).encode() in argv:
            return int(d.name)
    return None


def vm_rss(pid) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, TypeError):
        pass
    return 0


class Job:
    """`mpiexec -n NRANKS fanstore-daemon` (1 by default) started by the tests'
    cluster helper (optionally under `ulimit -n`), timed until `fanstore wait`
    returns."""

    def __init__(self, data: Path, work: Path, nofile=None, nranks=1, extra=()):
        self.rt = work / "rt"
        self.local = work / "local"
        rm(self.rt)
        rm(self.local)
        self.rt.mkdir(parents=True)
        self.env = daemon_env(self.rt)
        before = shm_indexes()
        self.nranks = nranks
        self.log_path = work / f"daemon{'-nofile' if nofile else ''}.log"
        t = time.perf_counter()
        try:
            # The tests' cluster helper (tests/fs_cluster.py): `mpiexec -n nranks`, under `ulimit -n nofile`.
            self.cluster = fs_cluster.start_cluster(
                fs_cluster.release_bins(), data, work, nranks=nranks, extra_args=extra, timeout=7200, nofile=nofile,
                runtime=self.rt, local=self.local, log_path=self.log_path, env=self.env)
        except AssertionError as e:
            raise RuntimeError(f"daemon did not get ready: {e}") from None
        self.ready_seconds = time.perf_counter() - t
        self.proc = self.cluster.proc
        new = sorted(shm_indexes() - before)
        self.index = new[0] if len(new) == 1 else None
        self.index_bytes = self.index.stat().st_size if self.index else 0
        self.pid = daemon_pid(self.local)
        self.rss_ready = vm_rss(self.pid)

    def client_env(self) -> dict:
        return dict(self.env, FANSTORE_NODE="0", FANSTORE_MOUNT="/fanstore", LD_PRELOAD=str(PRELOAD))

    def status(self, rank=0) -> dict:
        """Rank `rank`'s STATUS counters (key -> value)."""
        return fs_cluster.Client(self.rt / f"node-{rank}.sock").status()

    def cache_entries(self) -> int:
        return sum(int(self.status(r)["cache_entries"]) for r in range(self.nranks))

    def wait_copies(self, timeout=600.0) -> float:
        """Seconds until the node's copy count stayed the same for 1 s."""
        t = time.perf_counter()
        last = self.cache_entries()
        while time.perf_counter() - t < timeout:
            time.sleep(1)
            now = self.cache_entries()
            if now == last:
                break
            last = now
        return time.perf_counter() - t

    def stop(self) -> float:
        t = time.perf_counter()
        rc = self.cluster.stop(timeout=3600, check=False)
        secs = time.perf_counter() - t
        if rc != 0:
            log(f"daemon exited {rc}; see {self.log_path}")
        return secs

    def kill(self):
        self.cluster.kill(keep_local=True)  # (and the shm index; the local dir below: rm -rf is faster)
        if self.index and self.index.exists():
            self.index.unlink()
        rm(self.rt)
        rm(self.local)


def read_pass(reader: str, listing: Path, env=None) -> dict:
    with open(listing) as f:
        r = subprocess.run([reader, str(READERS)], stdin=f, capture_output=True, text=True, env=env, timeout=3600)
    try:
        files, nbytes, secs, errors, eio, emfile = r.stdout.split()
    except ValueError:
        raise RuntimeError(f"reader failed (exit {r.returncode}): {r.stdout} {r.stderr[-2000:]}")
    for line in r.stderr.strip().splitlines():  # at most 2 per reader
        log(line)
    return dict(files=int(files), bytes=int(nbytes), seconds=float(secs), errors=int(errors), eio=int(eio),
                emfile=int(emfile))


def reads(reader: str, listing: Path, env=None) -> dict:
    """One untimed warm-up pass, then READ_REPS timed passes: the median rate, and every error."""
    passes = [read_pass(reader, listing, env) for _ in range(1 + READ_REPS)]
    timed_passes = passes[1:]
    return dict(rate=median([p["files"] / p["seconds"] for p in timed_passes]),
                errors=sum(p["errors"] for p in passes), eio=sum(p["eio"] for p in passes),
                emfile=sum(p["emfile"] for p in passes), attempts=len(passes) * READS * READERS)


def measure(n: int, gen: str, reader: str) -> dict:
    src = tree(n, gen)
    work = WORK / f"n{n}"
    rm(work)
    work.mkdir(parents=True)
    tar, ds = work / "t.tar", work / "ds"
    log(f"N={n}: warm-up tar")
    timed(["tar", "-cf", str(tar), "-C", str(src), "."])
    tars, packs = [], []
    for rep in range(REPS):
        # `sync` (untimed) before each: pack fsyncs its partitions and
        # manifest, and on ext4 that can wait for the previous tar's dirty
        # 1.3 GB archive (one pack at 1.28M took 31 s instead of 10 s).
        rm(tar)
        subprocess.run(["sync"], check=True)
        tars.append(timed_cpu(["tar", "-cf", str(tar), "-C", str(src), "."]))
        rm(ds)
        subprocess.run(["sync"], check=True)
        packs.append(timed_cpu([PREP, "pack", "--input", str(src), "--output", str(ds), "--compress", "lz4",
                                "--threads", "2", "--partitions", "8", "--progress", "off"], stdout=subprocess.DEVNULL))
        log(f"N={n} rep {rep + 1}/{REPS}: tar -cf {tars[-1][0]:.2f} s (CPU {tars[-1][1]:.2f} s), "
            f"pack {packs[-1][0]:.2f} s (CPU {packs[-1][1]:.2f} s)")
    # The ratio is the median of the ratios of back-to-back pairs: on a
    # shared machine a neighbour's compile slows a pair, not one side.
    row = dict(n=n, tar_c=median([t[0] for t in tars]), pack=median([p[0] for p in packs]),
               ratio=median([p[0] / t[0] for p, t in zip(packs, tars)]),
               tar_c_cpu=median([t[1] for t in tars]), pack_cpu=median([p[1] for p in packs]),
               tar_c_all=tars, pack_all=packs)

    untar = work / "untar"
    rm(untar)
    untar.mkdir()
    subprocess.run(["sync"], check=True)
    row["tar_x"] = timed(["tar", "-xf", str(tar), "-C", str(untar)])
    log(f"N={n}: tar -xf {row['tar_x']:.2f} s")
    rm(untar)

    rnd = random.Random(n)
    picks = [rnd.randrange(n) for _ in range(READS * READERS)]
    native_list, fs_list = work / "native.list", work / "fanstore.list"
    native_list.write_text("".join(f"{src}/{file_path(i)}\n" for i in picks))
    fs_list.write_text("".join(f"/fanstore/{file_path(i)}\n" for i in picks))
    row["native"] = reads(reader, native_list)

    job = Job(ds, work)
    try:
        row["ready"] = job.ready_seconds
        log(f"N={n}: ready in {row['ready']:.2f} s")
        row["index_bytes"], row["rss_ready"] = job.index_bytes, job.rss_ready
        row["fanstore"] = reads(reader, fs_list, job.client_env())
        row["rss_after_reads"] = vm_rss(job.pid)
        # Those passes ran while the daemon made node copies of the files
        # the warm-up read (what the epoch after the first one meets). The
        # same reads again once no copy is being made: later epochs.
        row["copies_wait"] = job.wait_copies()
        row["fanstore_copied"] = reads(reader, fs_list, job.client_env())
        row["stop"] = job.stop()
    except BaseException:
        job.kill()
        raise
    log(f"N={n}: reads {row['fanstore']['rate']:.0f} files/s vs native {row['native']['rate']:.0f}, "
        f"stop {row['stop']:.2f} s")
    if ULIMIT == 1 or n <= ULIMIT:
        job = Job(ds, work, nofile=1024)
        try:
            row["nofile_ready"] = job.ready_seconds
            row["nofile"] = reads(reader, fs_list, job.client_env())
            job.stop()
        except BaseException:
            job.kill()
            raise
        log(f"N={n}: with ulimit -n 1024: {row['nofile']['errors']} errors ({row['nofile']['eio']} EIO) "
            f"of {row['nofile']['attempts']} reads")
    rm(tar)
    rm(ds)
    return row


def loader_run(root: str, env=None) -> dict:
    """bench/loader_reader.py under `ulimit -n 1024`: its JSON line."""
    cmd = f"ulimit -n 1024 && exec {LOADER_PY} {ROOT / 'bench' / 'loader_reader.py'} {root} {LOADER_READS}"
    r = subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"loader_reader.py failed (exit {r.returncode}): {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def loader_nodes(n: int, gen: str) -> dict:
    """Step 8: the DataLoader of bench/loader_reader.py on node 0 of 4
    daemons (`mpiexec -n 4`, each under `ulimit -n 1024`, 16 partitions: 3/4
    of the files remote), per `--replicate-on-read` rule, a fresh job each
    run, against the same reader on the native tree; LOADER_ROUNDS rounds in
    a rotating order."""
    src = tree(n, gen)
    work = WORK / f"loader{n}"
    rm(work)
    work.mkdir(parents=True)
    ds = work / "ds"
    subprocess.run([PREP, "pack", "--input", str(src), "--output", str(ds), "--partitions", str(LOADER_PARTS), "--compress", "lz4",
                    "--threads", "2"], check=True, stdout=subprocess.DEVNULL)
    kinds = ["native", *LOADER_RULES]
    runs = {k: [] for k in kinds}
    for rnd in range(LOADER_ROUNDS):
        for k in kinds[rnd % len(kinds):] + kinds[:rnd % len(kinds)]:
            if k == "native":
                runs[k].append(loader_run(str(src)))
                log(f"loader N={n} native: {runs[k][-1]}")
                continue
            job = Job(ds, work / k, nofile=1024, nranks=LOADER_RANKS, extra=("--replicate-on-read", k))
            try:
                res = loader_run("/fanstore", job.client_env())
                st = job.status(0)
                res.update(remote_sent=int(st["remote_sent"]), replicated_parts=int(st["replicated_parts"]),
                           remote_p50_us=int(st["remote_p50_us"]),
                           errors=sum(int(job.status(r)["errors"]) for r in range(job.nranks)))
            finally:
                job.stop()
            runs[k].append(res)
            log(f"loader N={n} {k}: {res}")
    return dict(n=n, reads=LOADER_READS, runs=runs)


def loader_md(lo: dict) -> list:
    nat = lo["runs"]["native"]
    med = lambda k, f: median([r[f] for r in lo["runs"][k]])  # noqa: E731
    rows = []
    for k in ["native", *LOADER_RULES]:
        label = "native tree" if k == "native" else f"FanStore, 4 nodes, `--replicate-on-read {k}`" + (" (default)" if k == "auto" else "")
        fs = lo["runs"][k]
        rows.append([label, f"{med(k, 'scan'):.2f}", f"{med(k, 'pass1'):.2f}",
                     f"{lo['reads'] / med(k, 'pass1'):,.0f}", f"{med(k, 'pass2'):.2f}",
                     f"{med('native', 'pass1') / med(k, 'pass1'):.2f}x",
                     "" if k == "native" else f"{median([r['remote_sent'] for r in fs]):,.0f}",
                     "" if k == "native" else f"{median([r['replicated_parts'] for r in fs]):.0f} of {LOADER_PARTS - LOADER_PARTS // LOADER_RANKS}",
                     "" if k == "native" else str(sum(r["errors"] for r in fs))])
    return ["### A torch DataLoader on 4 nodes at this scale", "",
            f"bench/loader_reader.py with the frameworks' venv ({LOADER_PY}): the dataset scan of torchvision's "
            f"DatasetFolder (os.scandir, os.walk, os.path.isfile of every file) over all {lo['n']:,} files, then a "
            f"DataLoader (4 workers, batches of 256) reading {lo['reads']:,} random files whole, twice (`pass 2`: the "
            "same files again), the reader and each daemon under `ulimit -n 1024`. FanStore: `mpiexec -n 4` daemons "
            "on this host (UCX_TLS=tcp), 16 partitions (lz4), the reader on node 0 (3/4 of the files remote), a "
            f"fresh job per run; medians of {LOADER_ROUNDS} rounds in a rotating order. Remote reads and partitions "
            "fetched whole are rank 0's counters after the run; errors: every rank's error counter.", "",
            table(["reader", "scan s", "pass 1 s", "pass 1 files/s", "pass 2 s", "pass 1 vs native", "remote reads",
                   "partitions fetched whole", "errors"], rows), ""]


def plot(rows, path: Path):
    plt = pyplot(path)
    if plt is None:
        return
    ns = [r["n"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.6), dpi=110)
    for key, label, style in (("pack", "fanstore-prep pack (lz4, 2 threads)", "o-"), ("tar_c", "tar -cf", "o--"),
                              ("ready", "load (time to ready)", "s-"), ("tar_x", "tar -xf", "s--"),
                              ("stop", "fanstore stop", "^-")):
        pts = [(r["n"], r[key]) for r in rows if r.get(key)]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
    if len(ns) > 1:  # a guide: slope 1 through pack's first point
        ax.plot([ns[0], ns[-1]], [rows[0]["pack"], rows[0]["pack"] * ns[-1] / ns[0]], ":", color="grey",
                label="linear (through pack's first point)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("files (100 B each, 1000 directories)")
    ax.set_ylabel("seconds")
    ax.set_title("FanStore at scale: time vs file count")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main():
    for p in (PREP, DAEMON, CLI, str(PRELOAD)):
        if not Path(p).exists():
            sys.exit(f"{p} missing: cargo build --release -p fanstore-prep -p fanstore-daemon -p fanstore-cli -p fanstore-preload")
    CACHE.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    OUT.mkdir(parents=True, exist_ok=True)
    gen = cc("gensmall.c", CACHE)
    reader = cc("scale_readers.c", WORK)
    rows = []
    for n in NS:
        rows.append(measure(n, gen, reader))
        (OUT / "scale.json").write_text(json.dumps({"rows": rows, "goals": []}, indent=1))  # partial results survive
    loader = None
    if LOADER_PY.exists() and LOADER_ROUNDS > 0:
        loader = loader_nodes(NS[-1], gen)
        (OUT / "scale.json").write_text(json.dumps({"rows": rows, "loader": loader, "goals": []}, indent=1))
    base = rows[0]
    per_file = lambda r: r["pack"] / r["n"] * 1e6  # noqa: E731
    hdr = ["files", "tar -cf s", "pack s", "pack / tar", "CPU s tar, pack", "pack µs/file", "load (ready) s",
           "tar -xf s", "stop s",
           "native reads/s", "FanStore reads/s", "FanStore / native", "FanStore reads/s, copies made",
           "copies made / native", "index B/file", "RSS B/file (ready, after reads)",
           "errors with ulimit -n 1024"]
    out = []
    for r in rows:
        nofile = r.get("nofile")
        out.append([
            f"{r['n']:,}", f"{r['tar_c']:.2f}", f"{r['pack']:.2f}", f"{r['ratio']:.2f}x",
            f"{r['tar_c_cpu']:.2f}, {r['pack_cpu']:.2f}", f"{per_file(r):.1f}", f"{r['ready']:.2f}", f"{r['tar_x']:.2f}", f"{r['stop']:.2f}",
            f"{r['native']['rate']:,.0f}", f"{r['fanstore']['rate']:,.0f}",
            f"{r['fanstore']['rate'] / r['native']['rate']:.2f}",
            f"{r['fanstore_copied']['rate']:,.0f}" if "fanstore_copied" in r else "not run",
            f"{r['fanstore_copied']['rate'] / r['native']['rate']:.2f}" if "fanstore_copied" in r else "",
            f"{r['index_bytes'] / r['n']:.0f}",
            f"{r['rss_ready'] / r['n']:.0f}, {r['rss_after_reads'] / r['n']:.0f}",
            (f"{nofile['errors']} of {nofile['attempts']} ({nofile['eio']} EIO, {nofile['emfile']} EMFILE)"
             if nofile else "not run")
            + (f"; {r['fanstore']['errors']} without" if r["fanstore"]["errors"] else ""),
        ])
    goals = []
    for r in rows:
        goals.append((f"pack {r['n']:,} files of 100 B (lz4, 2 threads)", "<= 1.0x `tar -cf` of the same tree",
                      f"{r['ratio']:.2f}x (medians {r['pack']:.2f} s vs {r['tar_c']:.2f} s)", r["ratio"] <= 1.0))
    if len(rows) > 1:
        lin = per_file(rows[-1]) / per_file(base)
        goals.append((f"pack linear in N ({base['n']:,} -> {rows[-1]['n']:,})",
                      "time per file at the largest N within 1.3x of the smallest",
                      f"{lin:.2f}x ({per_file(base):.1f} -> {per_file(rows[-1]):.1f} µs/file)", lin <= 1.3))
    for r in rows:
        if r.get("nofile"):
            goals.append((f"reads with the daemon under `ulimit -n 1024`, {r['n']:,} files", "no errors",
                          f"{r['nofile']['errors']} errors ({r['nofile']['eio']} EIO, {r['nofile']['emfile']} EMFILE) "
                          f"of {r['nofile']['attempts']}",
                          r["nofile"]["errors"] == 0))
    md = ["## Scale: pack, load, reads and stop vs file count (bench/scale_bench.py)", "",
          f"{machine()}. N files of {SIZE} B in {DIRS} directories (even files random, odd files lz4-compressible "
          f"text), generated by bench/gensmall.c. Medians of {REPS} interleaved runs for `tar -cf` vs "
          "`fanstore-prep pack --compress lz4 --threads 2 --partitions 8` (page cache warm); pack / tar is the "
          "median of the ratios of back-to-back pairs; CPU is user + system time; one run each of "
          "load (from `mpiexec -n 1 fanstore-daemon` until `fanstore wait` returns), `tar -xf` into a fresh "
          f"directory and `fanstore stop`. Reads: {READERS} processes x {READS:,} random files each "
          "(open, read, close; bench/scale_readers.c), warm, median of "
          f"{READ_REPS} passes, through /fanstore with LD_PRELOAD vs the native tree: right after one warm-up "
          "pass, while the daemon makes node copies of the files it read (an epoch after the first), and "
          "`copies made`: the same passes again once the daemon's copy count stood still for 1 s (later "
          "epochs: every open is a copy's file). Index: the daemon's "
          "/dev/shm index file size / N; RSS: the daemon's VmRSS / N. Errors: the same readers against a "
          "daemon launched under `ulimit -n 1024` (all passes counted). Plot: bench/scale.png.", "",
          table(hdr, out), ""]
    md += loader_md(loader) if loader else [f"(No DataLoader run: {LOADER_PY} missing; `bash scripts/setup.sh` makes it.)", ""]
    md += ["| experiment | goal | measured | met |", "|---|---|---|---|"]
    md += [f"| {a} | {b} | {c} | {'**yes**' if d else '**NO**'} |" for a, b, c, d in goals]
    md.append("")
    (OUT / "scale.md").write_text("\n".join(md))
    (OUT / "scale.json").write_text(json.dumps({"rows": rows, "loader": loader, "goals": goals}, indent=1))
    plot(rows, ROOT / "bench" / "scale.png")
    print("\n".join(md))


if __name__ == "__main__":
    main()
