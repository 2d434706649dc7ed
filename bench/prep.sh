#!/usr/bin/env bash
# Prep benchmark: `fanstore-prep pack` (none, lz4, zstd; lz4 with 1 and 2
# threads) against `tar -cf` of the same generated tree to the same disk,
# side by side in one run, REPS repetitions each, medians reported.
#
# Usage: bench/prep.sh [--quick]
#   --quick                 2,000 files in 20 directories (a smoke run)
# Environment (defaults in brackets):
#   PREP_BENCH_FILES [20000]  PREP_BENCH_DIRS [100]
#   PREP_BENCH_MIN [4096]     PREP_BENCH_MAX [1048576]  file sizes, log-uniform
#   PREP_BENCH_REPS [3]       PREP_BENCH_WORK [bench/out/prep-work]
#   PREP_BENCH_KEEP [0]       1 keeps the generated tree for the next run
#
# The tree: half the files are random bytes (like JPEGs), half compress
# about 3x (like text or arrays). Page cache cannot be dropped reliably
# here, so the tree is read once before timing and every method runs warm.
# tar's archive is fsynced (`sync FILE`) because fanstore-prep fsyncs its
# partitions and manifest. Output: a markdown table on stdout and in
# bench/out/prep.md.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
[ "${1:-}" = "--quick" ] && quick=1
if [ $quick = 1 ]; then
  FILES=${PREP_BENCH_FILES:-2000}; DIRS=${PREP_BENCH_DIRS:-20}
else
  FILES=${PREP_BENCH_FILES:-20000}; DIRS=${PREP_BENCH_DIRS:-100}
fi
MIN=${PREP_BENCH_MIN:-4096}
MAX=${PREP_BENCH_MAX:-1048576}
REPS=${PREP_BENCH_REPS:-3}
WORK=${PREP_BENCH_WORK:-bench/out/prep-work}
KEEP=${PREP_BENCH_KEEP:-0}
PREP=target/release/fanstore-prep

cargo build --release -q -p fanstore-prep
mkdir -p "$WORK" bench/out
SRC="$WORK/src"
STAMP="$FILES-$DIRS-$MIN-$MAX-v1"

if [ "$(cat "$WORK/stamp" 2>/dev/null)" != "$STAMP" ]; then
  echo "generating $FILES files of $MIN..$MAX bytes in $DIRS directories under $SRC" >&2
  rm -rf "$SRC" "$WORK/stamp"
  python3 - "$SRC" "$FILES" "$DIRS" "$MIN" "$MAX" <<'EOF'
import math, os, random, sys
src, files, dirs, lo, hi = sys.argv[1], *map(int, sys.argv[2:])
rng = random.Random(42)
pattern = bytes(rng.randrange(256) for _ in range(4096))
for d in range(dirs):
    os.makedirs(os.path.join(src, f"class{d:04d}"), exist_ok=True)
for i in range(files):
    size = int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    if i % 2 == 0:
        data = os.urandom(size)
    else:  # ~3x compressible: random runs interleaved with a repeated block
        parts, n = [], 0
        while n < size:
            parts.append(os.urandom(1024) if rng.random() < 0.3 else pattern[: rng.randrange(512, 4096)])
            n += len(parts[-1])
        data = b"".join(parts)[:size]
    with open(os.path.join(src, f"class{i % dirs:04d}", f"sample{i:06d}.bin"), "wb") as f:
        f.write(data)
EOF
  echo "$STAMP" > "$WORK/stamp"
fi

BYTES=$(du -sb --apparent-size "$SRC" | cut -f1)
NFILES=$(find "$SRC" -type f | wc -l)
echo "tree: $NFILES files, $((BYTES / 1000000)) MB; warm-up read" >&2
find "$SRC" -type f -print0 | xargs -0 cat > /dev/null

TIMES="$WORK/times.txt"
: > "$TIMES"
now() { date +%s.%N; }

# name | threads | command (output path substituted for OUT)
run_case() {
  local name=$1 threads=$2; shift 2
  local out="$WORK/out"
  rm -rf "$out" "$out.tar"
  local t0 t1 size
  t0=$(now)
  if [ "$name" = "tar -cf" ]; then
    tar -cf "$out.tar" -C "$SRC" . && sync "$out.tar"
    size=$(stat -c %s "$out.tar")
  else
    "$PREP" pack --input "$SRC" --output "$out" --progress off "$@" > /dev/null
    size=$(du -sb --apparent-size "$out" | cut -f1)
  fi
  t1=$(now)
  echo "$name|$threads|$(echo "$t1 - $t0" | bc -l)|$size" >> "$TIMES"
  rm -rf "$out" "$out.tar"
}

CORES=$(nproc)
for rep in $(seq 1 "$REPS"); do
  echo "repetition $rep/$REPS" >&2
  run_case "tar -cf" 1
  run_case "pack none" "$CORES" --compress none
  run_case "pack lz4" 1 --compress lz4 --threads 1
  run_case "pack lz4" "$CORES" --compress lz4 --threads "$CORES"
  run_case "pack zstd:3" "$CORES" --compress zstd:3 --threads "$CORES"
done

# One untimed pack + verify, so the numbers are of a dataset that checks out.
"$PREP" pack --input "$SRC" --output "$WORK/check" --compress lz4 --progress off > /dev/null
"$PREP" verify "$WORK/check" >&2
rm -rf "$WORK/check"

python3 - "$TIMES" "$BYTES" "$NFILES" "$REPS" "$quick" > bench/out/prep.md <<'EOF'
import statistics, sys
path, nbytes, nfiles, reps, quick = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5] == "1"
rows = {}
for line in open(path):
    name, threads, secs, size = line.strip().split("|")
    rows.setdefault((name, int(threads)), []).append((float(secs), int(size)))
tar = statistics.median(s for s, _ in rows[("tar -cf", 1)])
print(f"## fanstore-prep pack vs tar ({'quick' if quick else 'default'}: {nfiles} files, {nbytes / 1e6:.0f} MB, median of {reps})\n")
print("| method | threads | median s | MB/s | throughput vs tar | output MB | compression ratio |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for (name, threads), v in rows.items():
    secs = statistics.median(s for s, _ in v)
    size = statistics.median(z for _, z in v)
    print(f"| {name} | {threads} | {secs:.2f} | {nbytes / 1e6 / secs:.0f} | {tar / secs:.2f}x | {size / 1e6:.0f} | {nbytes / size:.2f} |")
EOF
cat bench/out/prep.md
[ "$KEEP" = 1 ] || rm -rf "$SRC" "$WORK/stamp"
