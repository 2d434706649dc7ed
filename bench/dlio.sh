#!/usr/bin/env bash
# The DLIO benchmark (dlio-benchmark from PyPI) natively and through FanStore
# (bench/dlio_run.py), into bench/out/dlio.md.
#   bash bench/dlio.sh [--quick]
#
# DLIO's wheel declares nvidia-dali-cuda110 (a stub that downloads the real
# wheel from pypi.nvidia.com, not reachable here), torchvision and torchaudio,
# which only its DALI readers and none of the workloads run here import. So
# the venv (bench/out/dlio-venv, kept for later runs) takes torch and
# tensorflow from the frameworks' venv of scripts/setup.sh through a .pth
# file, DLIO itself with --no-deps, and the rest of what it imports: hydra,
# omegaconf, pyyaml, psutil, pydftracer (its profiler, without which this
# release does not start) and mpi4py, built against the MPICH in use (its
# binary wheel wants libmpi.so.12, which Debian's MPICH does not name so;
# ~3 min once). DLIO's TFRecord generator calls DALI's `tfrecord2idx`; the
# venv gets a stand-in that writes the same index (one "offset length"
# line per record). Install time-boxed: DLIO_TIMEOUT seconds (default 900).
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/out
QUICK=""; [ "${1:-}" = "--quick" ] && QUICK="--quick"
VENV=bench/out/dlio-venv
LOG=bench/out/dlio-install.log
T=${DLIO_TIMEOUT:-900}
FW=${FANSTORE_VENV:-/opt/fanstore-venv}
not_run() {
  { echo "## DLIO benchmark"; echo; echo "**Not run.** $1"; echo; } > bench/out/dlio.md
  cat bench/out/dlio.md
  exit 0
}
[ -x "$FW/bin/python" ] || not_run "The frameworks' venv $FW (torch, tensorflow) is missing: scripts/setup.sh makes it."
FWSITE=$("$FW/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ ! -x $VENV/bin/python ]; then
  python3 -m venv --system-site-packages $VENV || not_run "python3 -m venv $VENV failed."
fi
SITE=$($VENV/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$FWSITE" > "$SITE/fanstore-frameworks.pth"
cat > $VENV/bin/tfrecord2idx <<'EOF'
#!/usr/bin/env python3
"""tfrecord2idx SRC DST: one "offset length" line per record of the TFRecord
file SRC, the index DALI's tool of this name writes (DLIO's generator calls it)."""
import struct
import sys

src, dst = sys.argv[1:3]
with open(src, "rb") as f, open(dst, "w") as out:
    off = 0
    while True:
        head = f.read(12)  # u64 length, u32 masked crc of the length
        if len(head) < 12:
            break
        (n,) = struct.unpack("<Q", head[:8])
        f.seek(n + 4, 1)  # the record and its crc
        out.write(f"{off} {12 + n + 4}\n")
        off += 12 + n + 4
EOF
chmod +x $VENV/bin/tfrecord2idx
if ! $VENV/bin/python -c 'import dlio_benchmark, hydra, omegaconf, yaml, psutil, dftracer.logger, torch, tensorflow; from mpi4py import MPI' >/dev/null 2>&1; then
  t0=$(date +%s)
  MPICC=${MPICC:-$(command -v mpicc.mpich || command -v mpicc)}
  export MPICC
  {
    timeout "$T" $VENV/bin/python -m pip install --disable-pip-version-check --no-deps "dlio-benchmark==2.0.0" &&
    timeout "$T" $VENV/bin/python -m pip install --disable-pip-version-check hydra-core omegaconf pyyaml psutil "pydftracer==1.0.2" &&
    timeout "$T" $VENV/bin/python -m pip install --disable-pip-version-check --no-binary mpi4py mpi4py
  } > $LOG 2>&1
  rc=$?
  [ $rc = 0 ] || not_run "Installing DLIO into $VENV failed after $(( $(date +%s) - t0 )) s (exit $rc): $(tail -3 $LOG | tr '\n' ' ' | cut -c1-600)"
fi
PATH="$PWD/$VENV/bin:$PATH" $VENV/bin/python bench/dlio_run.py $QUICK > bench/out/dlio.md.new 2> bench/out/dlio-run.log
rc=$?
if [ $rc = 0 ]; then
  mv bench/out/dlio.md.new bench/out/dlio.md
else
  not_run "bench/dlio_run.py failed (exit $rc): $(tail -8 bench/out/dlio-run.log | tr '\n' ' ' | cut -c1-1200)"
fi
cat bench/out/dlio.md
