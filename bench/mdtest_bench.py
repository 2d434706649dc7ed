"""mdtest and IOR (the IO500 tools) through /fanstore against native ext4 (issue 53).

Builds mdtest and IOR once from the pinned source tarball into a scratch
directory (tests/ior_build.py: ../shared/third_party/ior-*.tar.gz or
FANSTORE_IOR_TARBALL, built into /var/tmp/fanstore-ior), then, in ROUNDS
interleaved rounds (FanStore, native, raw MPI, one after the other in each
round; the table shows medians):

  mdtest -F -w 3901 -e 3901 (IO500's "hard" size) and -F -w 100 -e 100,
  each with -u (a directory per rank) and without (every rank in one
  directory), FILES files per rank, at
    1 node x 1 process    one daemon, one mdtest rank
    1 node x 4 processes  one daemon, four mdtest ranks on it
    4 nodes x 4 ranks     four daemons (start_cluster(nranks=4)); mdtest rank i
                          is a client of node i (tests/fs_rank.sh picks its
                          FANSTORE_NODE from PMI_RANK)
  IOR -a POSIX -w -r -C -W -R (the read and the write check read another
  rank's file: -O numTasksOnNode0=1 makes IOR shift by one rank, which in the
  4-node row is another node), file per process (-F, "easy") and one shared
  file, -t 1m (IOR_BLOCK_MB MiB per rank) and -t 47008 (IOR_HARD_XFERS
  transfers per rank), at 1 node x 4 processes and 4 nodes x 4 ranks.
  The read rows include IOR's -R comparison of every byte read, on both sides.
  For the 4-node rows, bench/mpi_rr.c: the raw MPI request/reply loop of the
  same pattern with no daemon (each rank asks a random other rank, one
  request outstanding, and answers the others'), over TCP (UCX_TLS=tcp) with
  the daemon's eager threshold (UCX_RNDV_THRESH=262145): a 64-byte reply
  for create/stat/remove, the file size for mdtest's read, the transfer size
  for IOR's read.

The native side runs in a directory on the same disk as the daemons' local
directories (BENCH_DIR). mdtest and IOR run under MPICH's mpiexec without
UCX_TLS=tcp (their own MPI only synchronises them; MPICH 4.0.2 over UCX/TCP
can hang in MPI_Finalize, scripts/mpi_finalize_check.c).

Then the profile (bench/out/mdtest_profile.md, `--profile-only` for just
that): the 1x1 -w 100 -e 100 phases one at a time (mdtest -C, -T, -E, -r),
counting per operation the daemon's STATUS counters (every rank), the
client's system calls (strace -c -f, the difference between PROFILE_FILES
and 2 x PROFILE_FILES files, so start-up cancels out) and the daemon's
system calls (strace -c -f -p); the same STATUS counts for 4 nodes x 4 ranks.

Writes bench/out/mdtest.md, bench/out/mdtest.json (goals), bench/out/mdtest_profile.md.
Usage: python3 bench/mdtest_bench.py [--quick] [--profile-only] [--no-profile] [--report-only]
  (--report-only: mdtest.md again from mdtest.json, no measurement)
Environment (default / --quick): MDTEST_FILES [2000/200] files per rank,
  MDTEST_ROUNDS [3/1], IOR_BLOCK_MB [64/8], IOR_HARD_XFERS [700/100],
  RR_ITERS [4000/1000] raw requests per rank (IOR-sized: a tenth),
  PROFILE_FILES [500/100], BENCH_DIR [/var/tmp] (native dir and daemons' local dirs).
"""
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import OUT, PRELOAD, ROOT, machine, table, tiny_dataset  # noqa: E402
import fs_cluster  # noqa: E402  (benchlib put tests/ on the path)
import ior_build  # noqa: E402

QUICK = "--quick" in sys.argv
PROFILE_ONLY = "--profile-only" in sys.argv
NO_PROFILE = "--no-profile" in sys.argv
E = os.environ.get
FILES = int(E("MDTEST_FILES", "200" if QUICK else "2000"))
ROUNDS = int(E("MDTEST_ROUNDS", "1" if QUICK else "3"))
IOR_BLOCK_MB = int(E("IOR_BLOCK_MB", "8" if QUICK else "64"))
IOR_HARD_XFERS = int(E("IOR_HARD_XFERS", "100" if QUICK else "700"))
RR_ITERS = int(E("RR_ITERS", "1000" if QUICK else "4000"))
PROFILE_FILES = int(E("PROFILE_FILES", "100" if QUICK else "500"))
BENCH_DIR = Path(E("BENCH_DIR", "/var/tmp"))
MPIEXEC = "/usr/bin/mpiexec.mpich"
FS_RANK = ROOT / "tests" / "fs_rank.sh"
RR_ENV = {"UCX_TLS": "tcp", "UCX_RNDV_THRESH": "262145"}
TIMEOUT = 900

MD_PHASES = [("3901", True), ("3901", False), ("100", True), ("100", False)]  # (-w/-e bytes, -u)
MD_OPS = ["create", "stat", "read", "remove"]
MD_NAMES = {"File creation": "create", "File stat": "stat", "File read": "read", "File removal": "remove"}
CONFIGS = [("1x1", 1, 1), ("1x4", 1, 4), ("4x4", 4, 4)]  # (name, daemons, mdtest ranks)


def client_env(cluster, nodes, ranks, preload=True) -> dict:
    """The environment of an mdtest/IOR job: each rank a client of node rank // (ranks / nodes)."""
    env = cluster.env(0, preload=False) if cluster else dict(os.environ)
    env.pop("UCX_TLS", None)
    env.pop("LD_PRELOAD", None)
    env["FS_RANKS_PER_NODE"] = str(max(1, ranks // nodes))
    if preload and cluster:
        env["FS_PRELOAD"] = str(PRELOAD)
    else:
        env.pop("FS_PRELOAD", None)
    return env


def mpirun(tool, nranks, args, env, log: Path, extra_env=None):
    """mpiexec -n nranks fs_rank.sh TOOL args: (exit code, output text, seconds)."""
    env = dict(env, **(extra_env or {}))
    cmd = [MPIEXEC, "-n", str(nranks), str(FS_RANK), tool, *map(str, args)]
    t = time.perf_counter()
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        try:
            rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=TIMEOUT,
                                start_new_session=True).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return rc, log.read_text(errors="replace"), time.perf_counter() - t


ERROR_RE = re.compile(r"(?i)\b(error|fail|abort|incorrect|cannot|bad termination)")


def error_lines(text: str) -> list:
    return [line for line in text.splitlines()[1:] if ERROR_RE.search(line)
            and not line.lstrip().startswith(("Command line", "WARNING: The file system"))]


def parse_mdtest(text: str) -> dict:
    """{op: mean ops/s} of mdtest's SUMMARY rate table."""
    out = {}
    in_rate = False
    for line in text.splitlines():
        if line.startswith("SUMMARY rate"):
            in_rate = True
        elif line.startswith("SUMMARY time"):
            in_rate = False
        if in_rate:
            for name, op in MD_NAMES.items():
                if line.strip().startswith(name):
                    nums = line.split(":")[-1].split() if ":" in line else line[len(name) + 3:].split()
                    out[op] = float(nums[2])  # Max Min Mean Std
    return out


def parse_ior(text: str) -> dict:
    """{"write"/"read": MiB/s, "errors": data errors reported by -W/-R}."""
    out = {"errors": 0}
    for line in text.splitlines():
        m = re.match(r"^(write|read)\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+\d", line)
        if m:
            out[m.group(1)] = float(m.group(2))
        m = re.search(r"Incorrect data on (write|read) \((\d+) errors found\)", line)
        if m:
            out["errors"] += int(m.group(2))
    return out


class Runner:
    def __init__(self, work: Path):
        self.work = work
        self.logs = work / "logs"
        self.logs.mkdir(parents=True)
        self.native = BENCH_DIR / f"fanstore-mdtest-native-{os.getpid()}"
        self.native.mkdir(parents=True)
        self.seq = 0
        self.failures = []  # (what, command log tail)

    def log(self, name):
        self.seq += 1
        return self.logs / f"{self.seq:04d}-{name}.log"

    def record_failure(self, what, rc, text):
        errs = error_lines(text)
        self.failures.append((what, rc, errs[:8] or text.strip().splitlines()[-8:]))
        print(f"FAILED {what}: exit {rc}\n  " + "\n  ".join(errs[:8]), file=sys.stderr)


def mkdir_through(cluster, path):
    subprocess.run([sys.executable, "-c", f"import os; os.makedirs({str(path)!r}, exist_ok=True)"],
                   env=cluster.env(0), check=True)


def mdtest_args(size, unique, files, d):
    return ["-F", "-w", str(size), "-e", str(size), "-n", str(files), *(["-u"] if unique else []), "-d", str(d)]


BINS = None  # snapshot_bins()


def snapshot_bins(work: Path) -> dict:
    """Copies of target/release's binaries for this run: a rebuild of target/ during the run
    (another engineer's cargo build) must not swap the daemon or the preload library under it."""
    global BINS, PRELOAD
    d = work / "bin"
    d.mkdir()
    BINS = {}
    for k, p in fs_cluster.release_bins().items():
        shutil.copy2(p, d / Path(p).name)
        BINS[k] = str(d / Path(p).name)
    PRELOAD = Path(BINS["preload"])
    return BINS


def start(data, work, nodes):
    c = fs_cluster.start_cluster(BINS, data, work, nranks=nodes, timeout=120,
                                 log_path=work / "daemons.log", env={"RUST_LOG": "warn"}, check_mpi=False)
    return c


def run_bench(tools, rr_exe, data, work, R: Runner):
    """Interleaved rounds: {(config, phase, op): {"fs": [...], "native": [...], "raw": [...]}}."""
    res = {}
    ior_errors = {}

    def add(key, side, v):
        res.setdefault(key, {}).setdefault(side, []).append(v)

    clusters = {}
    try:
        for nodes in sorted({n for _, n, _ in CONFIGS}):
            clusters[nodes] = start(data, work / f"cl{nodes}", nodes)
            mkdir_through(clusters[nodes], "/fanstore/bench")
        for rnd in range(ROUNDS):
            for cname, nodes, ranks in CONFIGS:
                c = clusters[nodes]
                for size, unique in MD_PHASES:
                    phase = f"mdtest -w {size}{' -u' if unique else ''}"
                    for side in ("fs", "native"):
                        base = "/fanstore/bench" if side == "fs" else str(R.native)
                        d = f"{base}/md-{cname}-{size}{'u' if unique else 's'}-{rnd}"
                        env = client_env(c if side == "fs" else None, nodes, ranks)
                        rc, text, _ = mpirun(tools["mdtest"], ranks, mdtest_args(size, unique, FILES, d), env,
                                             R.log(f"md-{side}-{cname}-{size}{'u' if unique else 's'}"))
                        rates = parse_mdtest(text)
                        errs = error_lines(text)
                        if rc != 0 or errs or len(rates) != 4:
                            R.record_failure(f"{side} {cname} {phase}: mdtest {' '.join(mdtest_args(size, unique, FILES, d))}",
                                             rc, text)
                        for op, v in rates.items():
                            add((cname, phase, op), side, v)
                        print(f"round {rnd} {cname} {phase} {side}: {rates}", flush=True)
                if nodes > 1:
                    for size in ("64", "3901", "100"):
                        rc, text, _ = mpirun(rr_exe, nodes, [RR_ITERS, size, 64, rnd + 1], dict(os.environ, **RR_ENV),
                                             R.log(f"rr-{size}"))
                        m = re.search(r"\{.*\}", text)
                        if not m:
                            R.record_failure(f"raw MPI loop {size} B", rc, text)
                            continue
                        v = json.loads(m.group(0))["ops_per_s"]
                        for unique in (True, False):
                            for s in ("3901", "100"):
                                phase = f"mdtest -w {s}{' -u' if unique else ''}"
                                if size == "64":
                                    for op in ("create", "stat", "remove"):
                                        add((cname, phase, op), "raw", v)
                                elif size == s:
                                    add((cname, phase, "read"), "raw", v)
                # IOR
                if ranks < 4:
                    continue
                for xfer, block in (("1m", IOR_BLOCK_MB << 20), ("47008", 47008 * IOR_HARD_XFERS)):
                    for fpp in (True, False):
                        phase = f"IOR {'easy -F' if fpp else 'shared file'} -t {xfer}"
                        for side in ("fs", "native"):
                            base = "/fanstore/bench" if side == "fs" else str(R.native)
                            f = f"{base}/ior-{cname}-{xfer}-{'F' if fpp else 'S'}-{rnd}"
                            args = ["-a", "POSIX", *(["-F"] if fpp else []), "-w", "-r", "-C", "-W", "-R",
                                    "-O", "numTasksOnNode0=1", "-t", "1048576" if xfer == "1m" else xfer,
                                    "-b", block, "-o", f]
                            env = client_env(clusters[nodes] if side == "fs" else None, nodes, ranks)
                            rc, text, _ = mpirun(tools["ior"], ranks, args, env, R.log(f"ior-{side}-{cname}-{xfer}"))
                            r = parse_ior(text)
                            if rc != 0 or r["errors"] or "write" not in r or "read" not in r:
                                R.record_failure(f"{side} {cname} {phase}: ior {' '.join(map(str, args))}", rc, text)
                            ior_errors[(cname, phase, side)] = ior_errors.get((cname, phase, side), 0) + r["errors"]
                            for op in ("write", "read"):
                                if op in r:
                                    add((cname, phase, op), side, r[op])
                            print(f"round {rnd} {cname} {phase} {side}: {r}", flush=True)
                        if nodes > 1:
                            rc, text, _ = mpirun(rr_exe, nodes, [max(50, RR_ITERS // 10),
                                                                 1 << 20 if xfer == "1m" else xfer, 64, rnd + 1],
                                                 dict(os.environ, **RR_ENV), R.log(f"rr-{xfer}"))
                            m = re.search(r"\{.*\}", text)
                            if m:
                                add((cname, phase, "read"), "raw", json.loads(m.group(0))["reply_mib_per_s"])
                            else:
                                R.record_failure(f"raw MPI loop {xfer}", rc, text)
    finally:
        for c in clusters.values():
            c.stop(timeout=120, check=False)
    return res, ior_errors


def fmt(v, unit=""):
    if v is None:
        return "-"
    return f"{v:,.0f}{unit}" if v >= 100 else f"{v:,.1f}{unit}"


def ior_errors_of(failures) -> dict:
    """{(config, phase, side): IOR data errors} summed over rounds, from the failures' lines."""
    out = {}
    for what, _rc, lines in failures:
        head = what.split(":")[0].split(" ", 2)  # side, config, phase
        if len(head) == 3 and head[2].startswith("IOR"):
            n = sum(int(m.group(1)) for x in lines for m in [re.search(r"Incorrect data on (?:write|read) \((\d+) errors", x)] if m)
            key = (head[1], head[2], head[0])
            out[key] = out.get(key, 0) + n
    return out


def report_again():
    """--report-only: bench/out/mdtest.md again from bench/out/mdtest.json (its medians, failures)."""
    js = json.loads((OUT / "mdtest.json").read_text())
    res = {tuple(k.split("|")): {s: [v] for s, v in d.items()} for k, d in js["median"].items()}
    R = Runner.__new__(Runner)
    R.failures = [tuple(f) for f in js.get("failures", [])]
    report(res, ior_errors_of(R.failures), R, js.get("seconds", 0))


def report(res, ior_errors, R: Runner, secs):
    med = {k: {s: statistics.median(v) for s, v in d.items() if v} for k, d in res.items()}
    rows, goals = [], []
    for key in sorted(med, key=lambda k: ([c for c, _, _ in CONFIGS].index(k[0]), k[1].startswith("IOR"), k[1],
                                            (MD_OPS + ["write", "read"]).index(k[2]))):
        cname, phase, op = key
        m = med[key]
        fs, nat, raw = m.get("fs"), m.get("native"), m.get("raw")
        ratio = fs / nat if fs and nat else None
        rraw = fs / raw if fs and raw else None
        goal, met = "", None
        if phase.startswith("mdtest -w 100") and cname in ("1x1", "1x4"):
            want = 1.0 if op == "create" else 0.5
            goal, met = f">= {want}x native", ratio is not None and ratio >= want
        elif phase.startswith("mdtest") and cname == "4x4":
            goal, met = ">= 0.5x raw MPI", rraw is not None and rraw >= 0.5
            if not phase.endswith("-u"):
                uk = (cname, phase + " -u", op)
                u = med.get(uk, {}).get("fs")
                if u and fs:
                    goal += f"; shared dir >= 0.7x unique ({fs / u:.2f}x)"
                    met = met and fs / u >= 0.7
        elif phase.startswith("IOR easy") and op == "write":
            goal, met = ">= 0.95x native", ratio is not None and ratio >= 0.95
        elif phase.startswith("IOR") and op == "read" and cname == "4x4":
            goal, met = ">= 0.8x raw MPI bandwidth", rraw is not None and rraw >= 0.8
        unit = " MiB/s" if phase.startswith("IOR") else ""
        errs = ior_errors.get((cname, phase, "fs")) if phase.startswith("IOR") else None
        if errs and met:
            met = False  # fast and wrong is not met
        rows.append([cname, phase, op + (f" ({errs} data errors)" if errs else ""), fmt(fs, unit), fmt(nat, unit),
                     f"{ratio:.2f}x" if ratio else "-", fmt(raw, unit), f"{rraw:.2f}x" if rraw else "-",
                     goal or "-", "-" if met is None else ("**yes**" if met else "**NO**")])
        if goal:
            goals.append((f"mdtest/IOR {cname} {phase} {op}", goal,
                          f"FanStore {fmt(fs, unit)} vs native {fmt(nat, unit)}"
                          + (f", raw MPI {fmt(raw, unit)}" if raw else "")
                          + (f", {errs} IOR data errors" if errs else ""), met))
    md = [f"## mdtest and IOR through /fanstore vs native ext4 (issue 53)\n",
          f"`python3 bench/mdtest_bench.py{' --quick' if QUICK else ''}` ({secs:.0f} s): {machine()}. "
          f"mdtest `-F` with {FILES} files per rank, IOR {IOR_BLOCK_MB} MiB per rank at `-t 1m` and "
          f"{IOR_HARD_XFERS} x 47008 B per rank at `-t 47008`, `-a POSIX -w -r -C -W -R`; medians of {ROUNDS} "
          f"interleaved round(s) (FanStore, native ext4 in {BENCH_DIR} on the daemons' disk, raw MPI). "
          "1x1: 1 daemon, 1 mdtest rank; 1x4: 1 daemon, 4 ranks; 4x4: 4 daemons (simulated nodes on this host), "
          "rank i on node i. mdtest rates are ops/s (its SUMMARY mean), IOR rates MiB/s (the read includes IOR's "
          "-R comparison). Raw MPI: bench/mpi_rr.c, each of 4 ranks asking random peers over TCP with no daemon "
          "(64 B replies for create/stat/remove, the file's bytes for read, the transfer for IOR).\n",
          table(["config", "phase", "op", "FanStore", "native", "FanStore/native", "raw MPI", "FanStore/raw",
                 "goal", "met"], rows), ""]
    if R.failures:
        md.append("**Failures** (logs of each run in the work directory of the run):\n")
        for what, rc, lines in R.failures:
            md.append(f"- `{what}`: exit {rc}: " + " / ".join(f"`{x.strip()[:160]}`" for x in lines[:4]))
        md.append("")
    (OUT / "mdtest.md").write_text("\n".join(md) + "\n")
    (OUT / "mdtest.json").write_text(json.dumps({"goals": goals, "median": {"|".join(k): v for k, v in med.items()},
                                                 "failures": R.failures, "seconds": secs}, default=str))
    print("\n".join(md))


# --------------------------------------------------------------------------
# profile
# --------------------------------------------------------------------------

STATUS_KEYS = ["names_asked", "opens", "remote_sent", "remote_served", "comm_woken_by_command", "comm_woken_by_fd",
               "ctx_voluntary", "cpu_user_us", "cpu_sys_us", "errors", "client_requests", "meta_sent", "meta_local"]
PHASE_FLAGS = [("create", "-C"), ("stat", "-T"), ("read", "-E"), ("remove", "-r")]


def status_all(c) -> dict:
    tot = {k: 0 for k in STATUS_KEYS}
    for r in range(c.nranks):
        with c.client(r) as cl:
            s = cl.status()
        for k in STATUS_KEYS:
            tot[k] += int(s.get(k, 0))
    return tot


def parse_strace_c(path: Path) -> dict:
    """{syscall: calls} of `strace -c` output files (one per process: -ff not used, -o one file)."""
    out = {}
    for p in path.parent.glob(path.name + "*"):
        for line in p.read_text(errors="replace").splitlines():
            f = line.split()
            if len(f) >= 5 and f[0].replace(".", "").isdigit() and f[-1] != "total":
                try:
                    calls = int(f[3])
                except ValueError:
                    continue
                out[f[-1]] = out.get(f[-1], 0) + calls
    return out


def strace_daemon(c, out_prefix: Path):
    procs = []
    for r in range(c.nranks):
        pid = fs_cluster.node_state(c.runtime, r)["pid"]
        procs.append(subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o", f"{out_prefix}.r{r}"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(1.0)  # attached to every thread
    return procs


def stop_strace(procs):
    for p in procs:
        p.send_signal(signal.SIGINT)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


def profile_phases(tools, c, nodes, ranks, side, files, R: Runner, strace: bool, tag: str) -> dict:
    """One mdtest -w 100 -e 100 -u run phase by phase: {op: {"status": deltas, "client": {sys: n}, "daemon": {..}}}."""
    base = "/fanstore/bench" if side == "fs" else str(R.native)
    d = f"{base}/prof-{tag}-{files}"
    env = client_env(c if side == "fs" else None, nodes, ranks)
    out = {}
    for op, flag in PHASE_FLAGS:
        pref = R.work / "strace" / f"{tag}-{side}-{files}-{op}"
        pref.parent.mkdir(exist_ok=True)
        extra = {"FS_STRACE": str(pref) + ".client"} if strace else {}
        before = status_all(c) if side == "fs" else None
        dprocs = strace_daemon(c, Path(str(pref) + ".daemon")) if strace and side == "fs" else []
        rc, text, secs = mpirun(tools["mdtest"], ranks, [flag, *mdtest_args("100", True, files, d)], env,
                                R.log(f"prof-{tag}-{side}-{op}"), extra)
        stop_strace(dprocs)
        if rc != 0 or error_lines(text):
            R.record_failure(f"profile {tag} {side} mdtest {flag} {' '.join(mdtest_args('100', True, files, d))}", rc, text)
        entry = {"rate": parse_mdtest(text).get(op)}
        if side == "fs":
            after = status_all(c)
            entry["status"] = {k: after[k] - before[k] for k in STATUS_KEYS}
        if strace:
            entry["client"] = parse_strace_c(Path(str(pref) + ".client"))
            if side == "fs":
                entry["daemon"] = parse_strace_c(Path(str(pref) + ".daemon"))
        out[op] = entry
    return out


def per_op(a: dict, b: dict, n: int) -> dict:
    """(b - a) / n for every key (b measured with n more operations than a)."""
    keys = set(a) | set(b)
    return {k: (b.get(k, 0) - a.get(k, 0)) / n for k in keys}


def top(d: dict, k=8, min_v=0.05) -> str:
    items = sorted(((v, s) for s, v in d.items() if v >= min_v), reverse=True)[:k]
    return ", ".join(f"{s} {v:.1f}" for v, s in items) or "-"


SOCK_CALLS = ("sendmsg", "sendto", "recvmsg", "recvfrom", "sendmmsg", "recvmmsg")


def mdtest_read_open_flags(tools, work) -> str:
    """The open flags of mdtest's read phase (-E) on a native directory, from strace."""
    d = work / "flags"
    args = ["-F", "-n", "1", "-w", "100", "-e", "100", "-d", str(d)]
    subprocess.run([tools["mdtest"], "-C", *args], capture_output=True)
    tr = work / "flags.strace"
    subprocess.run(["strace", "-f", "-e", "trace=openat,open", "-o", str(tr), tools["mdtest"], "-E", *args],
                   capture_output=True)
    shutil.rmtree(d, ignore_errors=True)
    for line in tr.read_text(errors="replace").splitlines():
        m = re.search(r'file\.mdtest[^"]*", ([A-Z_|]+)', line)
        if m:
            return m.group(1)
    return "not seen"


def run_profile(tools, data, work, R: Runner):
    if not shutil.which("strace"):
        print("strace missing: installing it (apt-get install strace)", file=sys.stderr)
        subprocess.run(["apt-get", "install", "-y", "-qq", "strace"], stdout=subprocess.DEVNULL)
    have_strace = bool(shutil.which("strace"))
    n1, n2 = PROFILE_FILES, 2 * PROFILE_FILES
    prof = {}
    c = start(data, work / "prof1", 1)
    try:
        mkdir_through(c, "/fanstore/bench")
        for side in ("fs", "native"):
            a = profile_phases(tools, c, 1, 1, side, n1, R, have_strace, "1x1")
            b = profile_phases(tools, c, 1, 1, side, n2, R, have_strace, "1x1")
            prof[("1x1", side)] = (a, b)
    finally:
        c.stop(timeout=120, check=False)
    c = start(data, work / "prof4", 4)
    try:
        mkdir_through(c, "/fanstore/bench")
        for files in (n1,):
            prof[("4x4", "fs")] = (None, profile_phases(tools, c, 4, 4, "fs", files, R, False, "4x4"))
    finally:
        c.stop(timeout=120, check=False)

    read_flags = mdtest_read_open_flags(tools, work) if have_strace else "not checked (no strace)"
    md = ["## Where the time goes: mdtest -F -w 100 -e 100 -u, phase by phase (issue 53)\n",
          f"`python3 bench/mdtest_bench.py --profile-only`: {machine()}. Each phase is run alone "
          f"(mdtest -C, -T, -E, -r on the same directory). Per operation (per file): the daemons' STATUS counters "
          f"(summed over ranks) and the daemon's system calls (`strace -c -f -p`, every thread) over the {n2} operations "
          f"of a run of {n2} files (they include the daemon's idle wake-ups during the run, and its CPU and context switches are inflated by strace attached to it; the 4-node table has none), and the client's system "
          f"calls (`strace -c -f` of the mdtest rank) as the difference between a run of {n2} and one of {n1} files "
          f"divided by {n2 - n1}, so the start-up of mdtest, MPI and the preload library cancels out. "
          f"Rates (ops/s) are of the {n2}-file run under strace (slowed by it; see bench/out/mdtest.md for rates)."
          + ("" if have_strace else " **strace missing: no system call counts.**") + "\n"]
    rows = []
    a_fs, b_fs = prof[("1x1", "fs")]
    a_nat, b_nat = prof[("1x1", "native")]
    for op, _ in PHASE_FLAGS:
        # The daemon's counts run with the clock (its idle wake-ups, strace's attach): those of the
        # larger run over its operations, not a difference of two noisy totals.
        st = {k: v / n2 for k, v in b_fs[op]["status"].items()}
        dm = {k: v / n2 for k, v in b_fs[op].get("daemon", {}).items()}
        cl = per_op(a_fs[op].get("client", {}), b_fs[op].get("client", {}), n2 - n1)
        nat = per_op(a_nat[op].get("client", {}), b_nat[op].get("client", {}), n2 - n1)
        sends = sum(v for k, v in cl.items() if k.startswith("send"))
        rows.append([op, f"{sum(cl.values()):.1f}", f"{sum(nat.values()):.1f}", f"{sends:.2f}",
                     f"{st['client_requests']:.2f}", f"{st['names_asked']:.2f}", f"{st['opens']:.2f}", f"{st['comm_woken_by_command']:.2f}",
                     f"{st['ctx_voluntary']:.1f}", f"{(st['cpu_user_us'] + st['cpu_sys_us']):.0f}",
                     f"{sum(dm.values()):.1f}"])
        prof[("1x1", "detail", op)] = (cl, nat, dm)
    summ = "; ".join(f"{r[0]} {r[3]} request(s) and {r[1]} system calls (native {r[2]})" for r in rows)
    md.append(f"**Summary, 1 node x 1 process, per operation:** {summ}. One daemon: no MPI message; every request is "
              "a client->daemon round trip over the unix socket.\n")
    md.append("### 1 node x 1 process (one daemon: no MPI message)\n")
    md.append(table(["phase", "client syscalls/op (FanStore)", "client syscalls/op (native)",
                     "client->daemon requests/op (send* calls)", "STATUS client_requests/op", "STATUS names_asked/op", "STATUS opens/op",
                     "STATUS comm_woken_by_command/op", "daemon voluntary ctx switches/op", "daemon CPU µs/op",
                     "daemon syscalls/op"], rows))
    md.append("")
    md.append("Which system calls (per op, top 8):\n")
    drows = []
    for op, _ in PHASE_FLAGS:
        cl, nat, dm = prof[("1x1", "detail", op)]
        drows.append([op, top(cl), top(nat), top(dm)])
    md.append(table(["phase", "client, FanStore", "client, native", "daemon"], drows))
    md.append("")
    rates = [[op, fmt(b_fs[op].get("rate")), fmt(b_nat[op].get("rate"))] for op, _ in PHASE_FLAGS]
    md.append("Rates of the strace'd runs (ops/s; strace slows both):\n")
    md.append(table(["phase", "FanStore", "native"], rates))
    md.append("")
    _, b4 = prof[("4x4", "fs")]
    rows4 = []
    for op, _ in PHASE_FLAGS:
        st = {k: v / (4 * n1) for k, v in b4[op]["status"].items()}
        rows4.append([op, f"{st['client_requests']:.2f}", f"{st['meta_sent']:.2f}", f"{st['meta_local']:.2f}",
                      f"{st['names_asked']:.2f}", f"{st['opens']:.2f}", f"{st['remote_sent']:.2f}",
                      f"{st['comm_woken_by_command']:.2f}", f"{st['comm_woken_by_fd']:.2f}",
                      f"{st['ctx_voluntary']:.1f}", f"{(st['cpu_user_us'] + st['cpu_sys_us']):.0f}",
                      fmt(b4[op].get("rate"))])
    md.append(f"### 4 nodes x 4 ranks, -u, {n1} files per rank: STATUS counters per op (summed over the 4 daemons)\n")
    md.append(table(["phase", "client requests", "MPI metadata round trips (meta_sent)",
                     "lookups answered by their own owner (meta_local)", "names_asked", "opens", "remote_sent",
                     "comm_woken_by_command", "comm_woken_by_fd",
                     "ctx_voluntary", "daemon CPU µs", "ops/s (no strace)"], rows4))
    md.append("")
    md.append(f"mdtest's read phase opens each file with `{read_flags}` (seen natively with `strace -e trace=openat`): "
              "mdtest.c passes O_RDONLY (0) to the backend's open, which takes IOR_RDONLY, so aiori-POSIX opens "
              "O_RDWR. On FanStore an O_RDWR open of a closed output is a private copy of its bytes (a memfd up "
              "to 1 MiB), committed as a new version at its close only if something changed it (docs/posix.md); "
              "a node that owns the name and holds the bytes makes the copy from its own file with no request "
              "(the record table, docs/architecture.md) (ior commit 5fcf0ba995fd, mdtest.c's mdtest_read).\n")
    md.append("STATUS counts client requests (`client_requests`, any kind) but not MPI messages: `comm_woken_by_command` "
              "counts the communication thread's wake-ups by a command of a server thread (about one per MPI "
              "request a rank sends while its comm thread sleeps), `comm_woken_by_fd` its wake-ups by MPI traffic; "
              "neither is an exact message count. The client->daemon requests are the client's send* system "
              "calls on the daemon's socket (each a request with its reply).\n")
    (OUT / "mdtest_profile.md").write_text("\n".join(md) + "\n")
    (OUT / "mdtest_profile.json").write_text(json.dumps({"|".join(map(str, k)): v for k, v in prof.items()},
                                                        default=str))
    print("\n".join(md))


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    if "--report-only" in sys.argv:
        report_again()
        return
    t0 = time.perf_counter()
    tools = ior_build.build(ior_build.find_tarball())
    work = Path(tempfile.mkdtemp(prefix="fanstore-mdtest-", dir=BENCH_DIR))
    rr_exe = str(work / "mpi_rr")
    subprocess.run(["/usr/bin/mpicc.mpich", "-O2", "-o", rr_exe, str(ROOT / "bench" / "mpi_rr.c")], check=True)
    data = tiny_dataset(work)
    snapshot_bins(work)
    R = Runner(work)
    ok = True
    try:
        if not PROFILE_ONLY:
            res, ior_errors = run_bench(tools, rr_exe, data, work, R)
            report(res, ior_errors, R, time.perf_counter() - t0)
        if not NO_PROFILE:
            run_profile(tools, data, work, R)
        ok = not R.failures
    finally:
        shutil.rmtree(R.native, ignore_errors=True)
        shutil.rmtree(work / "bin", ignore_errors=True)
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"logs kept in {work}/logs", file=sys.stderr)
    print(f"done in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
