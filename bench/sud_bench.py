"""Raw system calls (syscall user dispatch, issue 11): what catching them costs.

  1. bench/statloop.c (stat/open/read/close of 8 files outside the prefix,
     through libc): without the library, with it (raw syscalls caught, the
     default) and with FANSTORE_SUD=0. libc's own syscalls never trap, so
     the goal of issue 4 (<= 3%) must still hold;
  2. bench/rawloop.c: a loop of raw getppid (inline `syscall`), and of raw
     stat of a file outside the prefix: every call traps with the library
     loaded; (with - without) / iterations is the cost of one trapped call.
Writes bench/out/sud.md and bench/out/sud.json (goals).

Usage: python3 bench/sud_bench.py [--quick]
Environment: BENCH_REPS [3]  BENCH_DIR [/tmp]
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import OUT, Daemon, cc, median, table, tiny_dataset  # noqa: E402

QUICK = "--quick" in sys.argv
E = os.environ.get
REPS = int(E("BENCH_REPS", "3"))


def secs(cmd, env=None):
    return float(subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fs-bench-sud-", dir=E("BENCH_DIR", "/tmp")))
    statloop, rawloop = cc("statloop.c", work), cc("rawloop.c", work)
    dm = Daemon(tiny_dataset(work), work / "d", "/fanstore")
    goals, md, js = [], [], {}
    try:
        on = dm.env()
        off = dict(on, FANSTORE_SUD="0")
        files = []
        for i in range(8):
            p = work / f"tmpfile{i}"
            p.write_bytes(b"y" * 1000)
            files.append(str(p))
        iters = "5000" if QUICK else "20000"
        runs = {"without library": [], "library, raw syscalls caught": [], "library, FANSTORE_SUD=0": []}
        for _ in range(REPS * 2):  # alternating, so that load changes hit all three alike
            runs["without library"].append(secs([statloop, iters, *files]))
            runs["library, raw syscalls caught"].append(secs([statloop, iters, *files], on))
            runs["library, FANSTORE_SUD=0"].append(secs([statloop, iters, *files], off))
        base = median(runs["without library"])
        ov = median(runs["library, raw syscalls caught"]) / base - 1
        goals.append(("preload outside prefix, raw syscalls caught", "<= 3% slower", f"{ov * 100:+.1f}%", ov <= 0.03))
        md += ["## Raw system calls: syscall user dispatch (issue 11)", "",
               f"bench/statloop.c (libc calls: stat/open/read/close of 8 files in {work} x {iters}), "
               f"median of {REPS * 2} alternating runs:", "",
               table(["run", "seconds", "vs without"],
                     [[k, f"{median(v):.3f}", f"{(median(v) / base - 1) * 100:+.1f}%"] for k, v in runs.items()]), ""]
        js["statloop"] = runs
        n = 20000 if QUICK else 200000
        rows = []
        for what, args in (("raw getppid", ["getppid", str(n)]), ("raw stat outside the prefix", ["stat", str(n), files[0]])):
            plain, pre = [], []
            for _ in range(REPS * 2):
                plain.append(secs([rawloop, *args]))
                pre.append(secs([rawloop, *args], on))
            us_plain, us_pre = median(plain) / n * 1e6, median(pre) / n * 1e6
            rows.append([what, f"{us_plain:.3f}", f"{us_pre:.3f}", f"**{us_pre - us_plain:.2f}**"])
            js[what] = {"plain": plain, "preload": pre, "iters": n}
        goals.append(("cost of one trapped raw syscall (getppid)", "measured (no goal set)", f"{rows[0][3].strip('*')} us", None))
        md += [f"bench/rawloop.c: {n} raw syscalls (inline `syscall`) per run, median of {REPS * 2} alternating runs; "
               "with the library every one traps (SIGSYS, handler, sigreturn):", "",
               table(["loop", "µs/call without library", "µs/call with library", "µs per trap"], rows), ""]
    finally:
        dm.stop()
    (OUT / "sud.md").write_text("\n".join(md) + "\n")
    (OUT / "sud.json").write_text(json.dumps({"goals": goals, "data": js}, indent=1))
    print("\n".join(md))


if __name__ == "__main__":
    main()
