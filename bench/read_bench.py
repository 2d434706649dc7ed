"""Single-node read and metadata benchmark (issue 4; paper Fig. 3 and §3.3).

Side by side in one run, page cache warm, medians of REPS runs:
  1. whole-file reads of 128 KiB .. 8 MiB files, 1/2/4 reader processes:
     /fanstore (one daemon, all local) vs the native directory;
  2. os.walk + stat of every file of a many-small-files tree: /fanstore vs native;
  3. what the preload costs paths outside the prefix: a stat/open/read/close
     loop on /tmp with and without LD_PRELOAD.
Writes bench/out/read.md.   Usage: python3 bench/read_bench.py [--quick]
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import BIN, OUT, Daemon, cc, machine, median, table, write_random_files  # noqa: E402

QUICK = "--quick" in sys.argv
REPS = 3 if QUICK else 5
SET_BYTES = (64 if QUICK else 768) << 20
SIZES = [128 << 10, 512 << 10, 2 << 20, 8 << 20]
WALK_FILES, WALK_DIRS = (20_000, 200) if QUICK else (200_000, 2_000)
PROCS = [1, 2, 4]


def run_reader(reader, paths_file, procs, env=None):
    with open(paths_file) as f:
        r = subprocess.run([reader, str(procs)], stdin=f, capture_output=True, text=True, env=env, check=True)
    files, nbytes, secs = r.stdout.split()
    return int(files), int(nbytes), float(secs)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fs-bench-read-", dir=os.environ.get("BENCH_DIR", "/tmp")))
    reader = cc("readfiles.c", work)
    statloop = cc("statloop.c", work)
    src = work / "src"
    for s in SIZES:
        write_random_files(src / f"s{s >> 10}k", s, max(8, SET_BYTES // s))
    # metadata tree: many empty-ish files
    meta = src / "meta"
    per = WALK_FILES // WALK_DIRS
    for d in range(WALK_DIRS):
        dd = meta / f"d{d:05d}"
        dd.mkdir(parents=True)
        for i in range(per):
            (dd / f"f{i:04d}").write_bytes(b"x")
    subprocess.run([str(BIN / "fanstore-prep"), "pack", "--input", str(src), "--output", str(work / "ds"),
                    "--partitions", "1"], check=True, stdout=subprocess.DEVNULL)
    d = Daemon(work / "ds", work)
    rows, notes = [], []
    try:
        for s in SIZES:
            sub = f"s{s >> 10}k"
            native = sorted(str(p) for p in (src / sub).rglob("*.bin"))
            for name, lst in (("native", native), ("fanstore", [p.replace(str(src), d.mount, 1) for p in native])):
                (work / f"{sub}.{name}").write_text("\n".join(lst) + "\n")
            run_reader(reader, work / f"{sub}.native", 2)  # warm the page cache
            run_reader(reader, work / f"{sub}.fanstore", 2, d.env())
            for procs in PROCS:
                res = {"native": [], "fanstore": []}
                for _ in range(REPS):
                    for name, env in (("native", None), ("fanstore", d.env())):
                        files, nbytes, secs = run_reader(reader, work / f"{sub}.{name}", procs, env)
                        res[name].append((nbytes / secs / 2**20, files / secs))
                mn, mf = (median([r[0] for r in res[k]]) for k in ("native", "fanstore"))
                fn, ff = (median([r[1] for r in res[k]]) for k in ("native", "fanstore"))
                lo = min(r[0] for r in res["fanstore"]) / mn
                hi = max(r[0] for r in res["fanstore"]) / mn
                rows.append([f"{s >> 10} KiB", procs, f"{mn:.0f}", f"{mf:.0f}", f"{fn:.0f}", f"{ff:.0f}",
                             f"**{mf / mn:.2f}x** ({lo:.2f}-{hi:.2f})"])
        # metadata traversal
        walk_rows = []
        for procs in (1, 4):
            res = {"native": [], "fanstore": []}
            for _ in range(REPS):
                for name, root, env in (("native", str(meta), None), ("fanstore", d.mount + "/meta", d.env())):
                    ps = [subprocess.Popen([sys.executable, str(Path(__file__).parent / "walkstat.py"), root],
                                           stdout=subprocess.PIPE, text=True, env=env) for _ in range(procs)]
                    outs = [p.communicate()[0].split() for p in ps]
                    assert all(int(o[0]) == WALK_FILES for o in outs), outs
                    res[name].append(max(float(o[1]) for o in outs))
            n, f = median(res["native"]), median(res["fanstore"])
            walk_rows.append([f"{WALK_FILES} files / {WALK_DIRS} dirs", procs, f"{n:.3f}", f"{f:.3f}",
                              f"**{n / f:.2f}x** faster"])
        # outside-prefix overhead
        tmpfiles = []
        for i in range(8):
            p = work / f"tmpfile{i}"
            p.write_bytes(b"y" * 1000)
            tmpfiles.append(str(p))
        iters = "5000" if QUICK else "20000"
        plain, pre = [], []
        for _ in range(REPS * 2):
            plain.append(float(subprocess.run([statloop, iters, *tmpfiles], capture_output=True, text=True,
                                              check=True).stdout))
            pre.append(float(subprocess.run([statloop, iters, *tmpfiles], capture_output=True, text=True,
                                            check=True, env=d.env()).stdout))
        ov = median(pre) / median(plain) - 1
        load = d.load_seconds
    finally:
        d.stop()
    md = [f"## Single-node read (issue 4) — {machine()}", "",
          f"Set size {SET_BYTES >> 20} MiB per file size, random (incompressible) bytes, page cache warm, "
          f"median of {REPS} runs; daemon load {load:.1f} s.", "",
          table(["file size", "readers", "native MB/s", "FanStore MB/s", "native files/s", "FanStore files/s",
                 "FanStore/native (min-max)"], rows), "",
          "## Metadata: os.walk + stat of every file (seconds, slowest of the concurrent walkers)", "",
          table(["tree", "walkers", "native s", "FanStore s", "FanStore vs native"], walk_rows), "",
          "## Preload cost outside the prefix", "",
          f"stat/open/read/close of 8 files in /tmp x {iters}: without preload {median(plain):.3f} s, "
          f"with preload {median(pre):.3f} s: **{ov * 100:+.1f}%** (median of {REPS * 2})", ""]
    (OUT / "read.md").write_text("\n".join(md))
    print("\n".join(md))
    subprocess.run(["rm", "-rf", str(work)])


if __name__ == "__main__":
    main()
