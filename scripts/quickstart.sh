#!/usr/bin/env bash
# Quickstart: the main job end to end on a small generated dataset.
# Installs what is missing, builds in release mode, then:
#   generate -> pack -> verify -> extract and compare.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --workspace
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

echo "== 5. extract and compare with the original"
"$BIN/fanstore-prep" extract "$WORK/dataset.fs" --to "$WORK/extracted"
diff -r "$WORK/src" "$WORK/extracted"
echo "quickstart: OK (extracted tree identical to the source)"
