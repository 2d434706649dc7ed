#!/usr/bin/env bash
# Tries the DLIO benchmark (`dlio-benchmark` from PyPI) in a venv under
# bench/out, time-boxed (DLIO_TIMEOUT seconds, default 180). If it installs,
# `dlio_benchmark` is imported to show it runs; if not, the reason (pip's own
# error and the package's declared dependencies) goes to bench/out/dlio.md.
#   bash bench/dlio.sh
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/out
VENV=bench/out/dlio-venv
LOG=bench/out/dlio-install.log
T=${DLIO_TIMEOUT:-180}
[ -x $VENV/bin/python ] || python3 -m venv --system-site-packages $VENV
t0=$(date +%s)
timeout "$T" $VENV/bin/python -m pip install --disable-pip-version-check dlio-benchmark > $LOG 2>&1
rc=$?
secs=$(( $(date +%s) - t0 ))
deps=$(rm -rf bench/out/dlio-whl && timeout 60 python3 -m pip download -q --no-deps -d bench/out/dlio-whl dlio-benchmark >/dev/null 2>&1 \
  && unzip -p bench/out/dlio-whl/*.whl '*.dist-info/METADATA' | sed -n 's/^Requires-Dist: \([^;]*\)$/\1/p' | tr -d ' ' | paste -sd, -)
{
  echo "## DLIO benchmark"
  echo
  if [ $rc = 0 ] && $VENV/bin/python -c 'import dlio_benchmark' 2>/dev/null; then
    echo "\`pip install dlio-benchmark\` succeeded in ${secs} s; running it through FanStore is not scripted yet."
  else
    why=$(grep -m1 -B2 -A8 'special placeholder package' $LOG | sed 's/^ *//' | tr '\n' ' ' | cut -c1-600)
    [ -n "$why" ] || why=$(tail -5 $LOG | tr '\n' ' ' | cut -c1-600)
    [ $rc = 124 ] && why="timed out after ${T} s. $why"
    echo "**Not run.** \`python3 -m pip install dlio-benchmark\` (in $VENV) failed after ${secs} s (exit $rc): $why"
    echo
    echo "DLIO's declared dependencies (its wheel's METADATA): \`${deps:-unknown}\`. Besides the"
    echo "\`nvidia-dali-cuda110\` stub, which only downloads the real wheel from https://pypi.nvidia.com"
    echo "(not reachable from this machine), it requires tensorflow, torch, torchaudio and torchvision"
    echo "unconditionally: several GiB of CUDA wheels and an MPI build of mpi4py, not a reasonable offline install"
    echo "on this 2-core VM. The training-shaped reader above (scripts/train_reader.py) stands in for it."
  fi
  echo
} > bench/out/dlio.md
cat bench/out/dlio.md
