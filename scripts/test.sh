#!/usr/bin/env bash
# The test entry point (README, .ci/run): set-up, release build, unit tests,
# then the end-to-end suite (real binaries, real MPI, real clients):
#   1. everything under MPICH: target/ is built with MPICC=mpicc.mpich and
#      the tests launch /usr/bin/mpiexec.mpich, whatever plain mpicc/mpiexec
#      mean on this machine;
#   2. the daemon built against OpenMPI (target-ompi/, MPICC=mpicc.openmpi;
#      only the daemon: the CLI, crate fanstore-cli, links no MPI and the
#      tests use target/release/fanstore with either daemon) and the daemon,
#      remote-read, write-path and launch tests again under
#      /usr/bin/mpiexec.openmpi (FANSTORE_TEST_MPI=openmpi). Skipped when
#      pytest arguments are given (`scripts/test.sh tests/test_prep.py`).
# tests/test_slurm.py runs the Slurm job script on a one-machine Slurm
# cluster (as root) with both builds. tests/test_pjdfstest.py runs the
# pjdfstest POSIX suite on a 4-rank cluster (as root, ~3 min) against
# tests/pjdfstest/expected-failures.txt (tests/pjdfstest/run.py).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
fs_trap_errors test.sh
t0=$SECONDS
step() { echo "== test.sh: $1 (at $((SECONDS - t0)) s)"; }
step "set-up"
bash scripts/setup.sh
fs_find_cargo; fs_use_venv     # python3 (and pytest) are the venv's from here on
step "build (MPICH)"
MPICC=/usr/bin/mpicc.mpich cargo build --release --workspace
step "build the daemon against OpenMPI (target-ompi)"
MPICC=/usr/bin/mpicc.openmpi CARGO_TARGET_DIR=target-ompi cargo build --release -p fanstore-daemon
step "unit tests"
MPICC=/usr/bin/mpicc.mpich cargo test --release --workspace
step "end-to-end tests (MPICH)"
python3 -m pytest -q tests "$@"
if [ $# -eq 0 ]; then
  step "end-to-end tests under OpenMPI"
  FANSTORE_TEST_MPI=openmpi python3 -m pytest -q tests/test_daemon_*.py tests/test_fd_limit.py tests/test_write.py \
    tests/test_launch.py tests/test_prefetch.py tests/test_read_ahead.py
fi
step "done"
