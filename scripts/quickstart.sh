#!/usr/bin/env bash
# Quickstart: the main job end to end on a small generated dataset.
# Installs what is missing, builds in release mode, then:
#   generate -> pack -> verify -> start 4 daemons under mpiexec (4 simulated
#   nodes on this host) -> a training-shaped Python reader with forked
#   workers reads the dataset through /fanstore, writing a checkpoint per
#   epoch (half of its tensors frozen after the first) -> the checkpoints,
#   stored deduplicated at tensor level, read from another node, listed with
#   their lineage -> stop.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
fs_trap_errors quickstart
T0=$SECONDS
bash scripts/setup.sh --quickstart
fs_find_cargo; fs_use_venv; fs_pick_mpi       # python3 is the venv's; MPICC, MPIEXEC
mapfile -t MPIEXEC_ARGS < <(fs_mpiexec_args)
echo "== set-up: $((SECONDS - T0)) s"
T1=$SECONDS
cargo build --release --workspace
echo "== build: $((SECONDS - T1)) s"
T1=$SECONDS
BIN=$PWD/target/release
WORK=${QUICKSTART_DIR:-$(mktemp -d /tmp/fanstore-quickstart.XXXXXX)}
echo "== working in $WORK"
rm -rf "$WORK/src" "$WORK/dataset.fs" "$WORK/extracted"

echo "== 1. generate a small image-like dataset"
python3 scripts/gen_dataset.py "$WORK/src" --classes 8 --per-class 40

echo "== 2. pack it into 4 partitions (lz4), the validation split replicated on every node"
"$BIN/fanstore-prep" pack --input "$WORK/src" --output "$WORK/dataset.fs" \
    --partitions 4 --compress lz4 --replicate-dir val

echo "== 3. verify every checksum"
"$BIN/fanstore-prep" verify "$WORK/dataset.fs"

echo "== 4. list it"
"$BIN/fanstore-prep" ls "$WORK/dataset.fs" train/class000 | head -5

echo "== 5. start one daemon per simulated node: $MPIEXEC -n 4 (over TCP sockets, as between nodes)"
export FANSTORE_RUNTIME_DIR=$WORK/runtime UCX_TLS=tcp
"$MPIEXEC" "${MPIEXEC_ARGS[@]}" -n 4 "$BIN/fanstore-daemon" --data "$WORK/dataset.fs" --local "$WORK/local" > "$WORK/daemons.log" 2>&1 &
DAEMONS=$!
trap '"$BIN/fanstore" stop >/dev/null 2>&1 || kill $DAEMONS 2>/dev/null || true' EXIT
"$BIN/fanstore" wait --timeout 120
"$BIN/fanstore" status

echo "== 6. train: the same reader on the original tree, then through /fanstore from node 0 and node 2"
python3 scripts/train_reader.py "$WORK/src/train" --epochs 3 | tee "$WORK/native.txt"
for node in 0 2; do
  FANSTORE_NODE=$node LD_PRELOAD=$BIN/libfanstore_preload.so \
    python3 scripts/train_reader.py /fanstore/train --epochs 3 --ckpt-dir /fanstore/ckpt/node$node | tee "$WORK/fanstore-$node.txt"
  [ "$(grep -o 'digest.*' "$WORK/native.txt")" = "$(grep -o 'digest.*' "$WORK/fanstore-$node.txt")" ] \
    || { echo "quickstart: bytes read through /fanstore differ from the original" >&2; exit 1; }
done
"$BIN/fanstore" status

echo "== 7. the checkpoints written on node 0 (one per epoch), seen from node 3"
FANSTORE_NODE=3 LD_PRELOAD=$BIN/libfanstore_preload.so ls -l /fanstore/ckpt/node0
FANSTORE_NODE=3 LD_PRELOAD=$BIN/libfanstore_preload.so python3 -c '
import numpy as np
z = np.load("/fanstore/ckpt/node0/epoch-2.npz")
print("node 3 loaded epoch-2.npz:", len(z.files), "tensors,", sum(z[k].nbytes for k in z.files), "bytes")'

echo "== 8. the checkpoints are stored deduplicated at tensor level: new bytes per epoch, lineage, space"
"$BIN/fanstore" ckpt ls /fanstore/ckpt/node0
"$BIN/fanstore" ckpt log /fanstore/ckpt/node0/epoch-2.npz
"$BIN/fanstore" ckpt du

echo "== 9. stop"
"$BIN/fanstore" stop
wait $DAEMONS
trap - EXIT
echo "== the job (steps 1-9): $((SECONDS - T1)) s; the quickstart in all: $((SECONDS - T0)) s"
echo "quickstart: OK (every byte read through /fanstore on nodes 0 and 2 matches the original tree; checkpoints written on node 0 read on node 3 and listed with their lineage)"
