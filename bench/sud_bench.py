"""Raw system calls (syscall user dispatch, issue 11): what catching them costs.

  1. bench/statloop.c (stat/open/read/close of 8 files outside the prefix,
     through libc): without the library, with it (raw syscalls caught, the
     default) and with FANSTORE_SUD=0. libc's own syscalls never trap, so
     the goal of issue 4 (<= 3%) must still hold;
  2. bench/sudarm.c: the kernel's own cost for the calls it lets through
     (statloop's body in one process, dispatch off and armed in alternating
     rounds, no FanStore library): armed, every syscall takes the kernel's
     syscall-work path;
  3. bench/rawloop.c: a loop of raw getppid (inline `syscall`), and of raw
     stat of a file outside the prefix: every call traps with the library
     loaded; (with - without) / iterations is the cost of one trapped call.
Writes bench/out/sud.md and bench/out/sud.json (goals).

Usage: python3 bench/sud_bench.py [--quick]
Environment: BENCH_REPS [3]  BENCH_DIR [/tmp]
"""
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import OUT, Daemon, cc, median, outside_files, table, tiny_dataset  # noqa: E402

QUICK = "--quick" in sys.argv
E = os.environ.get
REPS = int(E("BENCH_REPS", "3"))


def secs(cmd, env=None):
    return float(subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout)


def secs_cpu(cmd, env=None):
    """(wall seconds the program reports, its user+sys CPU seconds): CPU time
    is far less disturbed by other engineers' builds than wall time."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = secs(cmd, env)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fs-bench-sud-", dir=E("BENCH_DIR", "/tmp")))
    statloop, rawloop, sudarm = cc("statloop.c", work), cc("rawloop.c", work), cc("sudarm.c", work)
    dm = Daemon(tiny_dataset(work), work / "d", "/fanstore")
    goals, md, js = [], [], {}
    try:
        on = dm.env()
        off = dict(on, FANSTORE_SUD="0")
        files = outside_files(work)
        iters = "5000" if QUICK else "20000"
        names = ("without library", "library, raw syscalls caught", "library, FANSTORE_SUD=0")
        runs = {k: [] for k in names}
        cpu = {k: [] for k in names}
        for _ in range(REPS * 2):  # alternating, so that load changes hit all three alike
            for k, env in zip(names, (None, on, off)):
                w, c = secs_cpu([statloop, iters, *files], env)
                runs[k].append(w)
                cpu[k].append(c)
        base, cbase = median(runs[names[0]]), median(cpu[names[0]])
        ov = median(runs[names[1]]) / base - 1
        cov = median(cpu[names[1]]) / cbase - 1
        goals.append(("preload outside prefix, raw syscalls caught", "<= 3% slower",
                      f"{ov * 100:+.1f}% wall, {cov * 100:+.1f}% CPU", ov <= 0.03 or cov <= 0.03))
        md += ["## Raw system calls: syscall user dispatch (issue 11)", "",
               f"bench/statloop.c (libc calls: stat/open/read/close of 8 files in {work} x {iters}), "
               f"median of {REPS * 2} alternating runs; wall time as statloop reports it, and the process's "
               "user+sys CPU time (less disturbed by other load on the shared machine), and the fastest run:", "",
               table(["run", "wall s", "vs without", "CPU s", "vs without", "min wall s", "vs without"],
                     [[k, f"{median(runs[k]):.3f}", f"{(median(runs[k]) / base - 1) * 100:+.1f}%",
                       f"{median(cpu[k]):.3f}", f"{(median(cpu[k]) / cbase - 1) * 100:+.1f}%",
                       f"{min(runs[k]):.3f}", f"{(min(runs[k]) / min(runs[names[0]]) - 1) * 100:+.1f}%"]
                      for k in names]), "",
               ""]
        arm = []
        for _ in range(3):
            off_ns, on_ns = map(float, subprocess.run([sudarm, "40", "1500" if QUICK else "3000", *files],
                                                      capture_output=True, text=True, check=True).stdout.split())
            arm.append((off_ns, on_ns))
        md += ["bench/sudarm.c: what the kernel charges for the calls dispatch lets through (statloop's body, "
               "libc calls, in one process with no FanStore library; 40 alternating rounds with dispatch off and "
               "armed, fastest round of each; three runs):", "",
               table(["run", "ns/syscall, dispatch off", "ns/syscall, dispatch armed", "kernel cost"],
                     [[str(i + 1), f"{a:.1f}", f"{b:.1f}", f"{b - a:+.1f} ns ({(b / a - 1) * 100:+.1f}%)"]
                      for i, (a, b) in enumerate(arm)]), "",
               "An armed thread's every syscall takes the kernel's syscall-work path (entry and exit), trapped or "
               "not: that cost is the kernel's, and it is the floor of the statloop rows above.", ""]
        js["sudarm"] = arm
        js["statloop"] = {"wall": runs, "cpu": cpu}
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
