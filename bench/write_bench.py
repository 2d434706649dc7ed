"""Write benchmark (issue 5 and the "write path" leftovers): write + close until
visible, and drain to --persist, FanStore vs native.

Side by side in one run, medians of REPS interleaved runs (schemes in a
rotating order each run):
  1. write: files of 1 MiB (32 per run), 64 MiB (2 per run) and 1 GiB (1 per
     run; 256 MiB with --quick), every file distinct incompressible bytes
     (a random pool XORed with a per-file, per-64-MiB-segment key, so no
     dedup, chunking or content addressing can skip any of them), prepared in
     memory before the clock starts:
       - fanstore: open(O_CREAT|O_TRUNC) under the mount, write 1 MiB at a
         time, close (the close returns once the daemon stored the bytes on
         its local dir, fsynced only with `--fsync-outputs`, and the metadata
         owner registered the file: visible to every node). With a daemon that
         has `--dedup`: the default (`--dedup on`: outputs >= 64 KiB go to the
         checkpoint store, content-defined chunks for non-checkpoint files),
         `--dedup off`, and `--dedup off --fsync-outputs` when it has that flag
         (the durability of native+fsync);
       - native+fsync: the same into a plain directory on the same disk, then
         fsync, then close (the durability of FanStore's local copy);
       - native: the same without fsync (page cache only).
     The writer times its write calls, fsync and close separately: that is
     the "where the time goes" table. `sync` runs (untimed) before each run
     of each scheme, so no scheme is throttled by another's dirty pages.
  2. drain: DRAIN_FILES x 16 MiB + 1 x DRAIN_BIG written through the mount of a
     daemon started with `--persist DIR`, then `fanstore sync` (copies every
     output into DIR/data, content-addressed, fsync per file; or the
     checkpoint store into DIR/ckpt) timed, vs `cp -r` of a native copy of the
     same bytes into another directory of the same file system + `sync`.
     Each run writes new bytes (so the content-addressed drain cannot skip
     them) and removes them afterwards; `sync` is run before each timing so
     neither side pays for the other's dirty pages.
  3. many small outputs (as a job writing one prediction or log file per
     sample): SMALL_FILES files of ~100 B, each opened, written and closed by
     Python, through the mount vs a native directory on the same disk,
     interleaved, µs per file; then
     SMALL_DRAIN such outputs drained by `fanstore sync` vs `cp -r` + `sync`
     of the same files written natively.
One daemon (MPI singleton) per configuration, local dir next to the native dirs.
Writes bench/out/write.md and bench/out/write.json (goals).
Usage: python3 bench/write_bench.py [--quick]
Environment: BENCH_REPS [3/3], BENCH_DRAIN_REPS [3/3], BENCH_DRAIN_FILES [64/16],
  BENCH_DRAIN_BIG_MB [1024/128], BENCH_SMALL_FILES [5000/1000], BENCH_SMALL_DRAIN [20000/4000], BENCH_DIR [/tmp]
"""
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import BIN, OUT, Daemon, daemon_flags, du, machine, tiny_dataset, median, table  # noqa: E402

QUICK = "--quick" in sys.argv
E = os.environ.get
REPS = int(E("BENCH_REPS", "3"))
SIZES = [(1 << 20, 32), (64 << 20, 2), ((256 if QUICK else 1024) << 20, 1)]
DRAIN_REPS = int(E("BENCH_DRAIN_REPS", "3"))
DRAIN_FILES = int(E("BENCH_DRAIN_FILES", "16" if QUICK else "64"))
DRAIN_BIG = int(E("BENCH_DRAIN_BIG_MB", "128" if QUICK else "1024")) << 20
SMALL_FILES = int(E("BENCH_SMALL_FILES", "1000" if QUICK else "5000"))
SMALL_DRAIN = int(E("BENCH_SMALL_DRAIN", "4000" if QUICK else "20000"))

# Creates `n` files of ~100 B in directory argv[1] (made if missing), one
# open/write/close each, as a job writing per-sample outputs; prints JSON {total}.
SMALL_WRITER = r"""
import json, os, sys, time
d, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(d, exist_ok=True)
t = time.perf_counter()
for i in range(n):
    with open('%s/p%06d.txt' % (d, i), 'w') as f:
        f.write('%d prediction %d %s\n' % (seed, i, 'x' * 80))
print(json.dumps({"total": time.perf_counter() - t}))
"""


def small(env, d, n, seed):
    r = subprocess.run([sys.executable, "-c", SMALL_WRITER, d, str(n), str(seed)], env=env, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"small-file writer into {d} failed (exit {r.returncode}): {r.stderr.strip()[-800:]}")
    return json.loads(r.stdout)["total"]

# Writes `count` files of `size` distinct bytes into directory argv[1] (made
# if missing); prints JSON {total, write, fsync, close} seconds (sums).
WRITER = r"""
import json, os, sys, time
import numpy as np
d, size, count, sync, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", int(sys.argv[5])
SEG = 64 << 20
pool = np.frombuffer(os.urandom(min(size, SEG)), dtype=np.uint64)
files = []
for i in range(count):
    a = np.empty(size // 8, dtype=np.uint64)
    for s, off in enumerate(range(0, size // 8, SEG // 8)):
        n = min(SEG // 8, size // 8 - off)
        key = np.uint64((((seed * 1000003 + i) * 65537 + s + 1) * 0x9E3779B97F4A7C15) % 2**64 | 1)
        np.bitwise_xor(pool[:n], key, out=a[off:off + n])
    files.append(memoryview(a).cast("B"))
os.makedirs(d, exist_ok=True)
tw = tf = tc = 0.0
t = time.perf_counter()
for i, b in enumerate(files):
    t0 = time.perf_counter()
    fd = os.open(f"{d}/f{i}.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    off = 0
    while off < size:
        off += os.write(fd, b[off: off + (1 << 20)])
    t1 = time.perf_counter()
    if sync:
        os.fsync(fd)
    t2 = time.perf_counter()
    os.close(fd)
    t3 = time.perf_counter()
    tw, tf, tc = tw + t1 - t0, tf + t2 - t1, tc + t3 - t2
print(json.dumps({"total": time.perf_counter() - t, "write": tw, "fsync": tf, "close": tc}))
"""


def write(env, d, size, count, sync, seed):
    r = subprocess.run([sys.executable, "-c", WRITER, d, str(size), str(count), "1" if sync else "0", str(seed)],
                       env=env, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"writer into {d} failed (exit {r.returncode}): {r.stderr.strip()[-800:]}")
    return json.loads(r.stdout)


def rm(path, env=None):
    subprocess.run(["rm", "-rf", str(path)], env=env, check=False)


def timed(cmd, env=None):
    t = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    secs = time.perf_counter() - t
    if r.returncode:
        raise RuntimeError(f"`{' '.join(map(str, cmd))}` failed (exit {r.returncode}): "
                           f"{(r.stdout + r.stderr).strip()[-800:]}")
    return secs, (r.stdout + r.stderr).strip()


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fs-bench-write-", dir=E("BENCH_DIR", "/tmp")))
    tiny_dataset(work)
    flags = daemon_flags()
    dedup, fsync_flag = "--dedup" in flags, "--fsync-outputs" in flags
    # (label, daemon extra flags); the first is the default configuration
    off = ("--dedup", "off") if dedup else ()
    cfgs = [("fanstore", ())] + ([("fanstore --dedup off", off)] if dedup else [])
    if fsync_flag:
        cfgs.append((" ".join(("fanstore",) + off + ("--fsync-outputs",)), off + ("--fsync-outputs",)))
    dcfgs = [c for c in cfgs if "--fsync-outputs" not in c[0]]  # drained: fsync at commit does not matter
    daemons = {}
    native = work / "native"
    native.mkdir()
    rows, goals, js = [], [], {"dedup_flag": dedup}
    odd = []
    try:
        for i, (label, extra) in enumerate(cfgs):
            daemons[label] = Daemon(work / "ds", work / f"d{i}", f"/fanstore-w{i}",
                                    extra=("--persist", str(work / f"persist{i}"), *extra))
        schemes = [(label, daemons[label].env(), None, False) for label, _ in cfgs]
        schemes += [("native+fsync", None, native, True), ("native", None, native, False)]
        names = [s[0] for s in schemes]
        # ---------------- 1. write + close
        res = {}
        seed = 1
        for size, count in SIZES:
            for rep in range(REPS):
                rot = rep % len(schemes)
                for name, env, root, sync in schemes[rot:] + schemes[:rot]:
                    sub = f"w{size >> 20}m-{rep}"
                    d = f"{daemons[name].mount}/{sub}" if root is None else str(root / sub)
                    seed += 1
                    os.sync()
                    res.setdefault((size, name), []).append(write(env, d, size, count, sync, seed))
                    rm(d, env)
            row = [f"{size >> 20} MiB x {count}"]
            mb = size * count / 2**20
            m = {n: median([x["total"] for x in res[(size, n)]]) for n in names}
            row += [f"{mb / m[n]:.0f}" for n in names]
            for label, _ in cfgs:
                row += [f"**{m['native+fsync'] / m[label]:.2f}x**", f"{m['native'] / m[label]:.2f}x"]
            js.setdefault("write", {})[str(size)] = {n: res[(size, n)] for n in names}
            print(row, flush=True)
            rows.append(row)
        hdr = ["files"] + [f"{n} MB/s" for n in names]
        for label, _ in cfgs:
            hdr += [f"{label} / native+fsync", f"{label} / native (no fsync)"]
        big = SIZES[-1][0]
        mbig = {n: median([x["total"] for x in res[(big, n)]]) for n in names}
        goals.append(("write + close until visible", f"no goal set: FanStore vs native write ({big >> 20} MiB "
                      "file; vs write+fsync / vs write without fsync)",
                      "; ".join(f"{label}: {mbig['native+fsync'] / mbig[label]:.2f}x / "
                                f"{mbig['native'] / mbig[label]:.2f}x" for label, _ in cfgs), None))
        # where the time goes: per-file ms of each phase (medians)
        phases = []
        for size, count in SIZES:
            for n in names:
                xs = res[(size, n)]
                phases.append([f"{size >> 20} MiB", n] + [
                    f"{median([x[k] for x in xs]) / count * 1e3:.1f}" for k in ("write", "fsync", "close", "total")])
        # ---------------- 2. drain to --persist
        drain_set = [(16 << 20, DRAIN_FILES), (DRAIN_BIG, 1)]
        drain_mb = sum(s * c for s, c in drain_set) / 2**20
        nsrc = work / "drain-src"
        for j, (size, count) in enumerate(drain_set):
            write(None, str(nsrc / f"s{j}"), size, count, True, 10_000 + j)
        drains = {}
        for rep in range(DRAIN_REPS):
            order = dcfgs + [("cp -r + sync", None)]
            rot = rep % len(order)
            for label, _ in order[rot:] + order[:rot]:
                if label == "cp -r + sync":
                    dst = work / f"cp-{rep}"
                    os.sync()
                    t = time.perf_counter()
                    secs_cp, _ = timed(["cp", "-r", str(nsrc), str(dst)])
                    secs_sync, _ = timed(["sync"])
                    drains.setdefault(label, []).append({"total": time.perf_counter() - t, "cp": secs_cp,
                                                         "sync": secs_sync, "disk": du(dst)})
                    rm(dst)
                    continue
                dm = daemons[label]
                pdir = work / f"persist{[c[0] for c in cfgs].index(label)}"
                for j, (size, count) in enumerate(drain_set):
                    write(dm.env(), f"{dm.mount}/drain-{rep}/s{j}", size, count, False, 1000 * (rep + 1) + j)
                os.sync()
                secs, out = timed([str(BIN / "fanstore"), "--runtime-dir", str(dm.runtime), "sync"],
                                  env=dict(os.environ, FANSTORE_RUNTIME_DIR=str(dm.runtime)))
                nfiles = sum(1 for f in pdir.rglob("*") if f.is_file()) if pdir.exists() else 0
                drains.setdefault(label, []).append({"total": secs, "disk": du(pdir), "files": nfiles, "out": out})
                rm(f"{dm.mount}/drain-{rep}", dm.env())
                # the next run drains into an empty DIR again (no record refers to these bytes any more)
                # (its lease stays: the daemon holds DIR/meta/lease until it stops,
                # and refuses to drain into a DIR whose lease is gone)
                for p in pdir.iterdir() if pdir.exists() else ():
                    for q in (p.iterdir() if p.name == "meta" else [p]):
                        if q.name != "lease":
                            rm(q)
        js["drain"] = drains
        cp_t = median([x["total"] for x in drains["cp -r + sync"]])
        drows = []
        for label, _ in dcfgs:
            t = median([x["total"] for x in drains[label]])
            disk = median([x["disk"] for x in drains[label]]) / 2**20
            nf = median([x["files"] for x in drains[label]])
            drows.append([label + " `fanstore sync`", f"{t:.2f}", f"{drain_mb / t:.0f}", f"{disk:.0f}", f"{nf:.0f}",
                          f"**{cp_t / t:.2f}x**"])
        cpx = drains["cp -r + sync"]
        drows.append(["`cp -r` + `sync`", f"{cp_t:.2f} (cp {median([x['cp'] for x in cpx]):.2f} + sync "
                      f"{median([x['sync'] for x in cpx]):.2f})", f"{drain_mb / cp_t:.0f}",
                      f"{median([x['disk'] for x in cpx]) / 2**20:.0f}", f"{DRAIN_FILES + 1}", "1.00x"])
        goals.append(("drain to --persist", "no goal set: `fanstore sync` vs `cp -r` + `sync` of the same bytes",
                      "; ".join(f"{label}: {cp_t / median([x['total'] for x in drains[label]]):.2f}x "
                                f"({drain_mb / median([x['total'] for x in drains[label]]):.0f} vs "
                                f"{drain_mb / cp_t:.0f} MB/s)" for label, _ in dcfgs), None))
        sync_out = "; ".join(f"{label}: `{drains[label][-1]['out']}`" for label, _ in dcfgs)
        # ---------------- 3. many small outputs
        sschemes = [("fanstore", daemons["fanstore"].env(), daemons["fanstore"].mount), ("native", None, str(native))]
        sres = {}
        for rep in range(REPS):
            rot = rep % len(sschemes)
            for name, env, root in sschemes[rot:] + sschemes[:rot]:
                d = f"{root}/small-{rep}"
                os.sync()
                sres.setdefault(name, []).append(small(env, d, SMALL_FILES, rep))
                rm(d, env)
        su = {n: median(sres[n]) / SMALL_FILES * 1e6 for n in sres}
        srows = [[n, f"{su[n]:.0f}", f"{su['native'] / su[n]:.2f}x"] for n, _, _ in sschemes]
        js["small"] = sres
        goals.append(("many small outputs", f"no goal set: Python creating {SMALL_FILES} files of ~100 B, µs per "
                      "file (FanStore / native speed)", f"fanstore {su['fanstore']:.0f} vs native {su['native']:.0f} µs "
                      f"({su['native'] / su['fanstore']:.2f}x)", None))
        dm, pdir = daemons["fanstore"], work / "persist0"
        sdrain = {}
        for rep in range(DRAIN_REPS):
            small(dm.env(), f"{dm.mount}/small-drain-{rep}", SMALL_DRAIN, 100 + rep)
            nat = work / f"small-src-{rep}"
            small(None, str(nat), SMALL_DRAIN, 100 + rep)
            for label in (["fanstore", "cp"] if rep % 2 == 0 else ["cp", "fanstore"]):
                os.sync()
                if label == "cp":
                    t = time.perf_counter()
                    timed(["cp", "-r", str(nat), str(work / f"small-cp-{rep}")])
                    timed(["sync"])
                    sdrain.setdefault(label, []).append(time.perf_counter() - t)
                else:
                    secs, _ = timed([str(BIN / "fanstore"), "--runtime-dir", str(dm.runtime), "sync"],
                                    env=dict(os.environ, FANSTORE_RUNTIME_DIR=str(dm.runtime)))
                    sdrain.setdefault(label, []).append(secs)
            rm(f"{dm.mount}/small-drain-{rep}", dm.env())
            rm(nat)
            rm(work / f"small-cp-{rep}")
            for p in pdir.iterdir() if pdir.exists() else ():
                rm(p)
        js["small_drain"] = sdrain
        fs_d, cp_d = median(sdrain["fanstore"]), median(sdrain["cp"])
        goals.append(("drain of many small outputs", f"no goal set: `fanstore sync` of {SMALL_DRAIN} files of "
                      "~100 B vs `cp -r` + `sync`", f"{cp_d / fs_d:.2f}x ({SMALL_DRAIN / fs_d:.0f} vs "
                      f"{SMALL_DRAIN / cp_d:.0f} files/s)", None))
    finally:
        for label, d in daemons.items():
            try:
                d.stop()
            except Exception as e:  # noqa: BLE001  keep what was measured
                odd.append(f"stop of the {label} daemon failed: {e}")
                print("stop failed:", e, file=sys.stderr)
        logs = {label: (work / f"d{i}" / "daemon.log") for i, (label, _) in enumerate(cfgs)}
        for label, p in logs.items():
            if p.exists():
                bad = [ln for ln in p.read_text(errors="replace").splitlines()
                       if " ERROR " in ln or " WARN " in ln or "panick" in ln]
                if bad:
                    odd.append(f"{label} daemon log: " + " | ".join(bad[:5]))
        rm(work)
    md = ["## Write + close until visible: FanStore vs native (issue 5)", "",
          machine() + ". " + f"Medians of {REPS} interleaved runs (schemes in a rotating order). MB/s = MiB written "
          "/ seconds from the first open to the last close, every file distinct random bytes prepared in memory "
          "before the clock starts; `sync` (untimed) before each run of each scheme. `native+fsync` is the "
          "durability of FanStore's `--fsync-outputs` (the bytes fsynced on the node's local disk), `native` is "
          "page cache only, like FanStore's default close (the local copy survives a killed daemon or program, "
          "not a crash of the node's kernel). Daemon: MPI singleton, local dir on the same disk."
          + (" `fanstore` is the default configuration (`--dedup on`: every output >= 64 KiB is committed "
             "to the node's checkpoint store; these files are not checkpoints, so they are cut into "
             "content-defined chunks), `--dedup off` stores plain files." if dedup else
             " (This daemon build has no `--dedup` flag: outputs are plain files.)"), "",
          table(hdr, rows), "",
          "Where the time goes: per-file milliseconds of each phase as the writer timed it (medians). FanStore's "
          "`write` is the copy into the client's output file (an unnamed O_TMPFILE file on the local disk: page "
          "cache, like native); its `close` is the commit: the fd handed to the daemon (SCM_RIGHTS), the file "
          "linked into its local dir with no copy (fsynced with `--fsync-outputs`; with dedup: cut into chunks, "
          "hashed, stored in the checkpoint store), the record registered at the metadata owner. Native "
          "`fsync` is the disk write; without fsync the bytes stay in the page cache.", "",
          table(["size", "scheme", "write ms", "fsync ms", "close ms", "total ms"], phases), "",
          f"## Drain to `--persist`: `fanstore sync` vs `cp -r` + `sync` ({DRAIN_FILES} x 16 MiB + 1 x "
          f"{DRAIN_BIG >> 20} MiB = {drain_mb:.0f} MiB)", "",
          f"Medians of {DRAIN_REPS} interleaved runs. Each run writes new outputs through the mount of a daemon "
          "started with `--persist DIR` (same file system), runs `sync`, then times `fanstore sync` (every held "
          "output read once for its xxh3, copied into DIR/data under its content name, fsynced, renamed; then the "
          "checksummed per-rank index; with dedup the checkpoint store's new units and recipes, each fsynced, "
          "then its catalog). Baseline: `cp -r` of a native copy of the same sizes into a new directory of the "
          "same file system, then `sync`. DIR is emptied after each run (the outputs are removed first), so every "
          "drain starts from an empty DIR; `disk MiB` = DIR (or the copy) on disk after the drain (du).", "",
          table(["drain", "seconds", "MB/s", "disk MiB", "files", "vs cp -r + sync"], drows), "",
          f"Output of the last `fanstore sync`: {sync_out}.", ""]
    md += ["- " + x for x in where_writes(res, names, cfgs, dcfgs, drains, drain_mb)] + [""]
    md += [f"## Many small outputs: {SMALL_FILES} files of ~100 B created by Python, and their drain", "",
           f"Medians of {REPS} interleaved runs: one Python process opens, writes (~100 B) and closes each file "
           "(`with open(p, 'w')`), through the mount or into a native directory on the same disk; µs per file "
           "from the first open to the last close. Each FanStore file costs two calls to the daemon: the open "
           "(does the name exist, can its directory hold it) and the commit at close; each call wakes the "
           "daemon's server thread and then the program, on this VM ~35 µs of CPU per wake-up across CPUs; the "
           "daemon's commit also links the file and writes its record sidecar (two more file creations on the "
           "local disk).", "",
           table(["scheme", "µs per file", "vs native"], srows), "",
           f"Drain: {SMALL_DRAIN} such outputs, `fanstore sync` (each copied into DIR/data under its content "
           "name, files under 1 MiB flushed together by one syncfs per 64 MiB and before the index) against "
           "`cp -r` + `sync` of the same files written natively, alternating, medians of "
           f"{DRAIN_REPS}: {fs_d:.2f} s ({SMALL_DRAIN / fs_d:.0f} files/s) against {cp_d:.2f} s "
           f"({SMALL_DRAIN / cp_d:.0f} files/s): **{cp_d / fs_d:.2f}x**.", ""]
    if odd:
        md += ["Odd things seen in this run:", ""] + ["- " + x for x in odd] + [""]
    js["goals"] = goals
    (OUT / "write.json").write_text(json.dumps(js))
    (OUT / "write.md").write_text("\n".join(md))
    print("\n".join(md))


def where_writes(res, names, cfgs, dcfgs, drains, drain_mb):
    """Notes computed from the medians: what each scheme's time is made of."""
    notes = []
    size, count = SIZES[-1]
    ph = {n: {k: median([x[k] for x in res[(size, n)]]) for k in ("write", "fsync", "close", "total")}
          for n in names}
    n, nf = ph["native"], ph["native+fsync"]
    notes.append(f"{size >> 20} MiB file, native: {n['total']:.2f} s into the page cache; native+fsync "
                 f"{nf['write']:.2f} s into the page cache + {nf['fsync']:.2f} s fsync.")
    for label, _ in cfgs:
        f = ph[label]
        what = ("cutting the bytes into content-defined chunks, hashing each (blake3) and appending it to the "
                "node's pack file" if label == "fanstore" and "--dedup off" in " ".join(c[0] for c in cfgs) else
                "linking the client's unnamed file into the local dir" + (" and fsyncing it" if "--fsync-outputs" in label else ""))
        notes.append(f"{label}: {f['total']:.2f} s = {f['write']:.2f} s writing into the client's output file + "
                     f"{f['close']:.2f} s commit at close ({what}, then registering the record).")
    notes.append("The client's write goes into the page cache of the local disk, as native's does; the commit "
                 "adds a socket round trip, a link, an xxh3 pass over the bytes and the metadata registration.")
    cp = drains["cp -r + sync"]
    for label, _ in dcfgs:
        d0 = median([x["total"] for x in drains[label]])
        notes.append(f"drain, {label}: `fanstore sync` {d0:.2f} s for {drain_mb:.0f} MiB vs cp "
                     f"{median([x['cp'] for x in cp]):.2f} s + sync {median([x['sync'] for x in cp]):.2f} s. "
                     + (f"The checkpoint store drains its pack files (FastCDC chunks of 16-256 KiB appended to "
                        f"them; a pack drained before only has its new tail copied), then the recipes and the catalog "
                        f"({median([x['files'] for x in drains[label]]):.0f} files in DIR after the drain)."
                        if label == "fanstore" and len(dcfgs) > 1 else
                        "`fanstore sync` reads each output twice (xxh3, then `std::fs::copy`) and fsyncs every "
                        "file before renaming it; `cp` copies once and one `sync` flushes everything."))
    return notes


if __name__ == "__main__":
    main()
