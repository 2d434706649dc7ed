#!/usr/bin/env bash
# Runs benchmark pieces side by side for two builds: another checkout (BASE,
# e.g. the commit before a refactor, built with `cargo build --release` in
# its own target/) and this one, alternating BASE, HEAD, BASE, HEAD... so
# the machine's drift falls on both. Each run is that tree's own bench
# script with its own binaries; bench/ab_report.py puts the goal rows of
# every run side by side in bench/out/ab/report.md.
#   bash bench/ab.sh BASE_DIR [--rounds N] [--only read,remote,write] [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
BASE="${1:?usage: bash bench/ab.sh BASE_DIR [--rounds N] [--only PIECES] [--quick]}"; shift
ROUNDS=2; ONLY="read,remote,write"; QUICK=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS="$2"; shift ;;
    --only) ONLY="$2"; shift ;;
    --quick) QUICK="--quick" ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
BASE="$(cd "$BASE" && pwd)"; HEAD="$(pwd)"
for t in "$BASE" "$HEAD"; do
  [ -x "$t/target/release/fanstore-daemon" ] || { echo "$t: no target/release/fanstore-daemon; build it first" >&2; exit 2; }
done
fs_use_venv
declare -A SCRIPT=([read]="python3 bench/read_bench.py" [remote]="bash bench/remote_read.sh"
                   [write]="python3 bench/write_bench.py" [ckpt]="python3 bench/ckpt_bench.py")
declare -A OUTS=([read]="read.md read.json" [remote]="remote_read.md remote.json"
                 [write]="write.md write.json" [ckpt]="ckpt.md ckpt.json")
AB="$HEAD/bench/out/ab"; rm -rf "$AB"; mkdir -p "$AB"
echo "base $(git -C "$BASE" rev-parse --short HEAD), head $(git rev-parse --short HEAD)${QUICK:+, quick}" > "$AB/runs.txt"
for r in $(seq 1 "$ROUNDS"); do
  for side in base head; do
    tree=$HEAD; [ $side = base ] && tree=$BASE
    for p in ${ONLY//,/ }; do
      [ -n "${SCRIPT[$p]:-}" ] || { echo "unknown piece $p" >&2; exit 2; }
      dst="$AB/$r-$side"; mkdir -p "$dst" "$tree/bench/out"
      for f in ${OUTS[$p]}; do rm -f "$tree/bench/out/$f"; done   # a failed run leaves no stale result
      t0=$(date +%s); rc=0
      (cd "$tree" && ${SCRIPT[$p]} $QUICK) > "$dst/$p.log" 2>&1 || rc=$?
      for f in ${OUTS[$p]}; do [ -f "$tree/bench/out/$f" ] && cp "$tree/bench/out/$f" "$dst/"; done
      echo "round $r $side $p: exit $rc, $(( $(date +%s) - t0 )) s" | tee -a "$AB/runs.txt"
    done
  done
done
python3 bench/ab_report.py "$AB"
