#!/usr/bin/env bash
# Runs every FanStore benchmark side by side with its baseline and writes
# bench/RESULTS.md and the PNG plots next to it (regenerated, never edited by hand).
#   bash bench/run.sh [--quick]        (default ~ 20 min on 2 cores, --quick ~ 5 min)
#   bash bench/run.sh --report-only    re-assemble RESULTS.md from bench/out (no measurement)
#   bash bench/run.sh [--quick] --only write,ckpt [--no-build]
#                                      run only these pieces (prep, read, remote, dlio, write, ckpt, pyckpt, pydcp, sud, watch, scale, mdtest);
#                                      the others keep their earlier output in bench/out
#                                      (seeded from the committed RESULTS.md by bench/seed_out.py
#                                      when this machine has none).
#                                      --no-build uses target/release as it is (no cargo build).
# Pieces (each runnable alone, each writes bench/out/*.md):
#   bench/read_bench.py   single-node read vs native vs squashfuse, compression,
#                         metadata walk, training-shaped reader, preload overhead
#   bench/remote_read.sh  remote read vs raw MPI ping-pong, load vs cat, 4-node read, then
#                         bench/remote_profile.py (where one remote OPEN's time and CPU go, per
#                         comm-thread spin), bench/train_nodes.py (training reader, 4 vs 1 node)
#                         and bench/halt_poll.py (the cost of a wake-up; as root on a VM guest,
#                         FANSTORE_BENCH_HALT_POLL_NS=N adds remote reads side by side with the
#                         guest's idle vCPUs polling N ns before they halt, restored after)
#   bench/prep.sh         fanstore-prep pack none/lz4/zstd vs tar
#   bench/dlio.sh         the DLIO benchmark's unet3d and resnet50 workloads natively, through one daemon
#                         and through 4 (bench/dlio_run.py; installs DLIO into bench/out/dlio-venv once)
#   bench/write_bench.py  write + close until visible vs native write (with and without fsync),
#                         drain to --persist (`fanstore sync`) vs cp -r + sync
#   bench/ckpt_bench.py   checkpoint series (small-update fine-tuning at 0%/75% frozen, random tensors,
#                         fresh values) and a 1 GiB unknown file: dedup vs --dedup off vs native
#                         (write, storage and its split, read-back new/old), plots bench/ckpt.png, bench/ckpt_storage.png
#   bench/ckpt_python.py  fanstore.torch.save (python/) vs native torch.save: 200 MB fp32 state dict,
#                         75% and 0% frozen, 10 saves (save time, storage, bytes checked)
#   bench/sud_bench.py    raw syscalls caught (syscall user dispatch): statloop overhead with it
#                         on and off, cost of one trapped raw syscall
#   bench/watch_bench.py  checkpoints pushed to a consumer on another node: inotify and
#                         `fanstore watch` vs polling os.listdir (event and read latency), idle CPU
#   bench/scale_bench.py  100k, 400k, 1.28M files of 100 B (--quick: 100k): pack vs tar -cf, load,
#                         tar -xf, random reads vs native, index and RSS per file, stop,
#                         reads under ulimit -n 1024; plot bench/scale.png (the full run takes ~30 min)
#   bench/mdtest_bench.py mdtest and IOR (IO500's tools, built from ../shared/third_party into /var/tmp)
#                         at 1x1, 1x4 and 4 nodes x 4 ranks vs native ext4 and a raw MPI request/reply
#                         loop, then round trips and syscalls per op of each mdtest phase (mdtest_profile.md)
# Sizes are environment variables of each piece (see their headers), so a
# cluster run can scale them.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
QUICK=""; REPORT_ONLY=0; ONLY=""; BUILD=1
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK="--quick" ;;
    --report-only) REPORT_ONLY=1 ;;
    --only) ONLY="${2:?--only needs a list: prep,read,remote,dlio,write,ckpt,pyckpt,pydcp,sud,watch,scale,mdtest}"; shift ;;
    --only=*) ONLY="${1#--only=}" ;;
    --no-build) BUILD=0 ;;
    *) echo "usage: bash bench/run.sh [--quick] [--only PIECES] [--no-build] | --report-only" >&2; exit 2 ;;
  esac
  shift
done
want() { [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]; }
T0=$(date +%s)
if [ $REPORT_ONLY = 0 ]; then
bash scripts/setup.sh
fs_find_cargo; fs_use_venv   # python3 (and pip) are the venv's from here on
# squashfuse (the FUSE baseline) and matplotlib (the plots), installed when missing
if want read && { ! command -v squashfuse >/dev/null || ! command -v mksquashfs >/dev/null || ! command -v fusermount3 >/dev/null; }; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq squashfuse squashfs-tools fuse3 >/dev/null; } \
    || echo "warning: could not install squashfuse squashfs-tools fuse3; the FUSE baseline will be reported as missing" >&2
fi
python3 -c 'import matplotlib' 2>/dev/null || python3 -m pip install -q --disable-pip-version-check matplotlib \
  || echo "warning: matplotlib not installed; no plots" >&2
[ $BUILD = 0 ] || cargo build --release --workspace
mkdir -p bench/out
if [ -z "$ONLY" ]; then
  rm -f bench/out/*.md bench/out/*.json bench/out/header.txt
else  # keep the other pieces' output; forget only the selected pieces' earlier results and failures
  # A machine that never ran the whole suite has no bench/out: start from the committed RESULTS.md.
  [ -f bench/out/header.txt ] || python3 bench/seed_out.py
  declare -A FILES=([prep]="prep.md" [read]="read.md read.json" [remote]="remote_read.md remote.json"
                    [dlio]="dlio.md" [write]="write.md write.json" [ckpt]="ckpt.md ckpt.json" [pyckpt]="pyckpt.md pyckpt.json" [pydcp]="pydcp.md pydcp.json"
                    [sud]="sud.md sud.json" [watch]="watch.md watch.json" [scale]="scale.md scale.json"
                    [mdtest]="mdtest.md mdtest_profile.md mdtest.json mdtest_profile.json")
  declare -A SCRIPT=([prep]="prep.sh" [read]="read_bench.py" [remote]="remote_read.sh" [dlio]="dlio.sh"
                     [write]="write_bench.py" [ckpt]="ckpt_bench.py" [pyckpt]="ckpt_python.py" [pydcp]="dcp_writer_bench.py" [sud]="sud_bench.py" [watch]="watch_bench.py" [scale]="scale_bench.py"
                     [mdtest]="mdtest_bench.py")
  for p in ${ONLY//,/ }; do
    [ -n "${FILES[$p]:-}" ] || { echo "unknown piece '$p' (prep, read, remote, dlio, write, ckpt, pyckpt, pydcp, sud, watch, scale, mdtest)" >&2; exit 2; }
    for f in ${FILES[$p]}; do rm -f "bench/out/$f"; done
    if [ -f bench/out/failures.md ]; then
      grep -v -F "bench/${SCRIPT[$p]}" bench/out/failures.md > bench/out/failures.tmp || true
      mv bench/out/failures.tmp bench/out/failures.md
    fi
  done
fi
declare -A SECS
step() {  # a failing piece is reported in RESULTS.md, the others still run
  local t=$(date +%s) rc=0
  "$@" || rc=$?
  SECS[$1 $2]=$(( $(date +%s) - t ))
  [ $rc = 0 ] || printf '**`%s` failed (exit %s)**; see its output in the run log. Its section is missing or partial.\n\n' "$*" $rc >> bench/out/failures.md
}
[ -n "$QUICK" ] && export PREP_BENCH_FILES=${PREP_BENCH_FILES:-1000} PREP_BENCH_DIRS=${PREP_BENCH_DIRS:-10}
if want prep; then step bash bench/prep.sh $QUICK; fi
if want read; then step python3 bench/read_bench.py $QUICK; fi
if want remote; then step bash bench/remote_read.sh $QUICK; fi
if want dlio; then
  step bash bench/dlio.sh $QUICK
fi
if want write; then step python3 bench/write_bench.py $QUICK; fi
if want ckpt; then step python3 bench/ckpt_bench.py $QUICK; fi
if want pyckpt; then step python3 bench/ckpt_python.py $QUICK; fi
if want pydcp; then step python3 bench/dcp_writer_bench.py $QUICK; fi
if want sud; then step python3 bench/sud_bench.py $QUICK; fi
if want watch; then step python3 bench/watch_bench.py $QUICK; fi
if want scale; then step python3 bench/scale_bench.py $QUICK; fi
if want mdtest; then step python3 bench/mdtest_bench.py $QUICK; fi
TOTAL=$(( $(date +%s) - T0 ))
ARGS="$QUICK${ONLY:+ --only $ONLY}"
LINE="Generated by \`bash bench/run.sh $ARGS\` on $(date -u '+%Y-%m-%d %H:%M UTC') in ${TOTAL} s"
LINE="$LINE ($(for k in "${!SECS[@]}"; do printf '%s %ss; ' "$k" "${SECS[$k]}"; done | sed 's/; $//'))."
if [ -n "$ONLY" ] && [ -f bench/out/header.txt ]; then
  # Earlier partial runs stay named unless every piece they name was re-run now.
  ONLY="$ONLY" LINE="$LINE" python3 - <<'PY'
import os, re
only = set(os.environ["ONLY"].split(","))
scripts = {"read_bench.py": "read", "remote_read.sh": "remote", "prep.sh": "prep", "dlio.sh": "dlio",
           "write_bench.py": "write", "ckpt_bench.py": "ckpt", "ckpt_python.py": "pyckpt", "dcp_writer_bench.py": "pydcp", "sud_bench.py": "sud", "watch_bench.py": "watch",
           "scale_bench.py": "scale", "mdtest_bench.py": "mdtest"}
keep = []
for line in open("bench/out/header.txt").read().splitlines():
    m = re.search(r"--only ([a-z,]+)", line)
    pieces = set(m.group(1).split(",")) if m else {p for s, p in scripts.items() if f"bench/{s}`" in line}
    if line.startswith("Then:") and pieces and pieces <= only:
        continue
    keep.append(line)
keep.append("Then: " + os.environ["LINE"])
open("bench/out/header.txt", "w").write("\n".join(keep) + "\n")
PY
else
  echo "$LINE" > bench/out/header.txt
fi
fi
[ $REPORT_ONLY = 0 ] || fs_use_venv 2>/dev/null || true   # the plots need the venv's matplotlib
python3 bench/notes.py > /dev/null
{
  echo "# FanStore benchmark results"
  echo
  cat bench/out/header.txt
  echo
  echo "Machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')),"
  echo "$(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM, Linux $(uname -r),"
  echo "MPICH $(mpichversion 2>/dev/null | sed -n 's/^MPICH Version:[[:space:]]*//p'), $(python3 --version),"
  echo "squashfuse $(dpkg-query -W -f='${Version}' squashfuse 2>/dev/null || echo missing), git $(git rev-parse --short HEAD)."
  echo "Every number is a median of interleaved runs measured side by side in this run; the"
  echo "machine is shared with other engineers compiling, so compare ratios, not absolute rates across runs."
  echo
  echo "Commands: \`bash bench/run.sh [--quick]\` runs \`bench/prep.sh\`, \`bench/read_bench.py\`,"
  echo "\`bench/remote_read.sh\`, \`bench/write_bench.py\`, \`bench/ckpt_bench.py\`, \`bench/ckpt_python.py\`, \`bench/dcp_writer_bench.py\`, \`bench/sud_bench.py\`, \`bench/watch_bench.py\`, \`bench/scale_bench.py\`, \`bench/mdtest_bench.py\` (each with the same flag) and"
  echo "\`bench/dlio.sh\`; sizes are environment variables listed at the top of each script."
  echo "\`bench/notes.py\` computes the per-file read breakdowns at the end."
  echo
  python3 - <<'EOF'
import json
from pathlib import Path
goals = []
for f in ("bench/out/read.json", "bench/out/remote.json", "bench/out/write.json", "bench/out/ckpt.json", "bench/out/pyckpt.json", "bench/out/pydcp.json",
          "bench/out/sud.json", "bench/out/watch.json", "bench/out/scale.json", "bench/out/mdtest.json"):
    p = Path(f)
    if p.exists():
        goals += json.loads(p.read_text())["goals"]
print("## Goals\n")
print("| experiment | goal | measured | met |")
print("|---|---|---|---|")
for exp, goal, measured, met in goals:
    print(f"| {exp} | {goal} | {measured} | {'**yes**' if met else ('n/a' if met is None else '**NO**')} |")
print()
EOF
  for f in bench/out/failures.md bench/out/read.md bench/out/remote_read.md bench/out/write.md bench/out/ckpt.md bench/out/pyckpt.md bench/out/pydcp.md \
           bench/out/sud.md bench/out/watch.md bench/out/scale.md bench/out/mdtest.md bench/out/mdtest_profile.md \
           bench/out/prep.md bench/out/dlio.md bench/out/notes.md; do
    [ -f "$f" ] && { cat "$f"; echo; }
  done
} > bench/RESULTS.md
echo "wrote bench/RESULTS.md"
