#!/usr/bin/env bash
# The test entry point (README, .ci/run): set-up, release build, unit tests,
# then the end-to-end suite (real binaries, real MPICH, real clients).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release --workspace
cargo test --release --workspace
python3 -m pytest -q tests "$@"
