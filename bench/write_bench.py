"""Write benchmark (issue 5): write + close until visible, FanStore vs native.

Side by side in one run, medians of REPS runs, for files of 1 MiB, 64 MiB
and 1 GiB (1 MiB files are written 32 per run):
  - fanstore: open(O_CREAT|O_TRUNC) under /fanstore, write, close (the close
    returns once the daemon stored the bytes on its local dir, fsynced, and
    the metadata owner registered the file: visible to every node);
  - native:   the same into a plain directory on the same disk, then fsync,
    then close (the same durability as FanStore's local copy).
One daemon (MPI singleton) with its local dir next to the native dir.
Writes bench/out/write.md.   Usage: python3 bench/write_bench.py [--quick]
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import OUT, Daemon, machine, median, table  # noqa: E402

QUICK = "--quick" in sys.argv
REPS = 3 if QUICK else 5
SIZES = [(1 << 20, 32), (64 << 20, 2), ((256 if QUICK else 1024) << 20, 1)]

WRITER = r"""
import os, sys, time
d, size, count, sync = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
buf = os.urandom(1 << 20)
t = time.perf_counter()
for i in range(count):
    fd = os.open(f"{d}/f{i}.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    left = size
    while left:
        left -= os.write(fd, buf[: min(left, len(buf))])
    if sync:
        os.fsync(fd)
    os.close(fd)
print(time.perf_counter() - t)
"""


def run(env, d, size, count, sync):
    r = subprocess.run([sys.executable, "-c", WRITER, d, str(size), str(count), "1" if sync else "0"],
                       env=env, capture_output=True, text=True, check=True)
    return float(r.stdout)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fs-bench-write-", dir=os.environ.get("BENCH_DIR", "/tmp")))
    src = work / "src"
    src.mkdir()
    (src / "x").write_bytes(b"x")
    subprocess.run([str(Path(__file__).resolve().parent.parent / "target/release/fanstore-prep"), "pack",
                    "--input", str(src), "--output", str(work / "ds"), "--partitions", "1"],
                   check=True, stdout=subprocess.DEVNULL)
    d = Daemon(work / "ds", work)
    native = work / "native"
    native.mkdir()
    rows = []
    try:
        for size, count in SIZES:
            fs_t, nat_t = [], []
            for rep in range(REPS):
                sub = f"w{size >> 20}m-{rep}"
                subprocess.run(["mkdir", f"{d.mount}/{sub}"], env=d.env(), check=True)
                fs_t.append(run(d.env(), f"{d.mount}/{sub}", size, count, False))
                (native / sub).mkdir()
                nat_t.append(run(None, str(native / sub), size, count, True))
                subprocess.run(["rm", "-rf", str(native / sub)], check=True)
                subprocess.run(["rm", "-rf", f"{d.mount}/{sub}"], env=d.env(), check=False)
            mb = size * count / 2**20
            f, n = median(fs_t), median(nat_t)
            rows.append([f"{size >> 20} MiB x {count}", f"{mb / f:.0f}", f"{mb / n:.0f}", f"{n / f:.2f}x"])
            print(rows[-1], flush=True)
    finally:
        d.stop()
        subprocess.run(["rm", "-rf", str(work)])
    text = "# Write + close until visible: FanStore vs native (fsync)\n\n" + machine() + "\n\n"
    text += f"Medians of {REPS} runs. MB/s = MiB written / seconds from the first open to the last close.\n\n"
    text += table(["files", "fanstore MB/s", "native+fsync MB/s", "fanstore / native"], rows) + "\n"
    (OUT / "write.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
