"""Where the time goes: per-file cost breakdowns computed from the numbers the
pieces saved (bench/out/read.json, bench/out/remote.json). Writes
bench/out/notes.md; bench/run.sh appends it to RESULTS.md.
perf counters are not available in this VM (`perf stat -e instructions`
reports <not supported>), so the breakdown uses side-by-side differences,
strace -c syscall counts (in the single-node section) and the daemons'
counters (`fanstore status`)."""
import json
import statistics
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"
med = statistics.median
L = ["## Where the time goes (computed from this run's medians)", ""]


def us_per_file(entries):
    return 1e6 / med(x[1] for x in entries)


def fsz(s):
    return f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB"


computed = False  # from measured data (a piece's json seeded from RESULTS.md holds goal rows only)
rj = OUT / "read.json"
r = json.loads(rj.read_text()) if rj.exists() else {}
if r.get("read") and r.get("comp"):
    computed = True
    read, comp = r.get("read", {}), r.get("comp", {})
    sizes = sorted({int(k.split("|")[0]) for k in read})
    procs = sorted({int(k.split("|")[1]) for k in read})
    L.append("Per-file wall time of one reader process (1 / files/s; with N readers the machine's 2 cores are "
             "shared, so the 1-reader column is the cleanest cost):")
    L.append("")
    hdr = ["file size", "native µs/file", "FanStore µs/file", "FanStore extra µs/file", "squashfuse µs/file",
           "FanStore none (compressible set)", "lz4 µs/file", "zstd µs/file", "lz4 cached µs/file",
           "lz4 extra µs/file", "lz4 decompressed MB/s"]
    L += ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for s in sizes:
        k = f"{s}|1|"
        n, f = us_per_file(read[k + "native"]), us_per_file(read[k + "FanStore"])
        q = us_per_file(read[k + "squashfuse"]) if k + "squashfuse" in read else float("nan")
        cn = us_per_file(comp[k + "FanStore none"])
        cl, cz = us_per_file(comp[k + "FanStore lz4"]), us_per_file(comp[k + "FanStore zstd"])
        cc = us_per_file(comp[k + "FanStore lz4 cached"]) if k + "FanStore lz4 cached" in comp else float("nan")
        L.append(f"| {fsz(s)} | {n:.0f} | {f:.0f} | {f - n:+.0f} | {q:.0f} | {cn:.0f} | {cl:.0f} | {cz:.0f} | "
                 f"{cc:.0f} | {cl - cn:+.0f} | {s / cl:.0f} |")
    L.append("")
    L.append("- **Local uncompressed reads** (FanStore vs native): the strace above shows the same system calls per "
             "file on both sides (openat, read until EOF, close; no message to the daemon): an open of a local "
             "file resolves the path in the shared-memory index and opens the extracted file. The extra µs/file "
             "column is therefore the preload's user-space work plus noise; where it is negative, FanStore was "
             "faster (the extracted files sit in fewer, flatter directories than the source tree).")
    L.append("- **Compressed reads** (lz4/zstd vs none, `--cache-mem 0`): the client decodes a compressed file of a "
             "local partition itself, from its mapping of the partition copy, into a memfd (no message to the "
             "daemon): the pages of a memfd the reader closed when nothing else holds it (pwrite + ftruncate + "
             "the reopen per file, two fcntl calls for the lease), else a new one (memfd_create: the strace above "
             "was taken with the reuse, so it shows the few of those). The `lz4 extra µs/file` is decompression "
             "plus that copy, the reopen and the close (compare the `lz4 fresh pages` column of the compression "
             "table, which pays new pages per file). `lz4 cached` shows what the node's copies buy on a later "
             "epoch.")
    walk = r.get("walk", {})
    if walk:
        for p in (1, 4):
            if f"{p}|native" in walk:
                n, f = med(walk[f"{p}|native"]), med(walk[f"{p}|FanStore"])
                L.append(f"- **Metadata** ({p} walker{'s' if p > 1 else ''}): native {n:.2f} s, FanStore {f:.2f} s. "
                         "FanStore answers stat/readdir from the shared-memory index without system calls; what "
                         "remains is the Python interpreter's own os.walk/os.stat work, which is the same on both "
                         "sides and bounds the speed-up.")
    L.append("")

mj = OUT / "remote.json"
m = json.loads(mj.read_text()) if mj.exists() else {}
if m.get("daemon2"):
    computed = True
    raw2, d2, multi = m.get("raw2", {}), m.get("daemon2", {}), m.get("multi", {})
    L.append("Remote read, per file (2 ranks, µs; `raw` = ping-pong with no daemon running):")
    L.append("")
    L.append("| size | raw µs | daemon OPEN µs | OPEN+read µs | OPEN - raw | read of the memfd µs | "
             "4-node aggregate MB/s | per-node remote MB/s (3/4 of bytes) |")
    L.append("|---|---|---|---|---|---|---|---|")
    for s in sorted(int(x) for x in d2):
        raw = s / med(x[0] for x in multi[f"{s}|raw"]) if f"{s}|raw" in multi else med(raw2[str(s)])
        o = med(x[0] for x in d2[str(s)])
        t = med(x[1] for x in d2[str(s)])
        agg = med(x[0] for x in multi.get(f"{s}|FanStore", [[float("nan")]]))
        L.append(f"| {fsz(s)} | {raw:.0f} | {o:.0f} | {t:.0f} | {o - raw:+.0f} | {t - o:.0f} | {agg:.0f} | "
                 f"{agg * 0.75 / 4:.0f} |")
    L.append("")
    L.append("- The raw ping-pong receives into one reused, already-faulted buffer. A remote file must land in new "
             "memory the client keeps (a memfd): the `raw MPI, fresh memfd` column of the remote table is that "
             "same ping-pong receiving into a new memfd, and the daemon's OPEN is close to it. So most of the gap "
             "to raw is page faults and zeroing of fresh pages (plus the verify checksum and the unix-socket hop), "
             "not the MPI path; `read of the memfd` is the client's own copy out of it.")
    L.append("- In the 4-node run, 4 daemons (each with an MPI communication thread) and 4 readers share 2 cores, "
             "and every remote byte is copied by the owner, by TCP over loopback, into the requester's memfd and "
             "by the reader: the aggregate is CPU-bound on this VM; on a cluster each node has its own cores and "
             "NIC.")
    L.append("")
if computed or not (OUT / "notes.md").exists():
    (OUT / "notes.md").write_text("\n".join(L) + "\n")
print("\n".join(L))
