#!/usr/bin/env bash
# Installs what FanStore needs on a fresh Debian 12 machine (idempotent: only
# what is missing): MPICH (the default build), OpenMPI (the daemon is also
# built and tested against it), Slurm + munge (tests/test_slurm.py runs a
# one-machine Slurm cluster), libclang (bindgen for the mpi crate), and the
# Python test clients.
#
# Installing OpenMPI next to MPICH makes Debian's update-alternatives point
# plain `mpicc`/`mpiexec` at OpenMPI (higher priority). This script puts them
# back to what they were (MPICH on a fresh machine), so installing OpenMPI
# never silently switches the MPICH build, the quickstart or the tests.
set -euo pipefail
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
need_apt=()
[ -x /usr/bin/mpiexec.mpich ] || need_apt+=(mpich)
[ -e /usr/include/x86_64-linux-gnu/mpich/mpi.h ] || [ -e /usr/include/mpich/mpi.h ] || need_apt+=(libmpich-dev)
[ -x /usr/bin/mpiexec.openmpi ] || need_apt+=(openmpi-bin)
[ -e /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h ] || need_apt+=(libopenmpi-dev)
for b in slurmctld slurmd; do [ -x /usr/sbin/$b ] || need_apt+=($b); done
command -v sbatch >/dev/null 2>&1 || need_apt+=(slurm-client)
[ -x /usr/sbin/munged ] || need_apt+=(munge)
ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/llvm-*/lib/libclang-[0-9]*.so* >/dev/null 2>&1 || need_apt+=(libclang-dev clang)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
# Command-line tools the output tests run (tests/test_output_tools.py).
for t in git patch; do command -v $t >/dev/null 2>&1 || need_apt+=($t); done

# The current choice of each MPI alternative (empty when unset).
alt() { update-alternatives --query "$1" 2>/dev/null | awk '/^Value:/ {print $2}'; }
before_mpi=$(alt mpi); before_run=$(alt mpirun); before_inc=$(alt mpi-x86_64-linux-gnu)

if [ ${#need_apt[@]} -gt 0 ]; then
  $SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
    "${need_apt[@]}" >/dev/null
fi

# Keep plain mpicc/mpiexec/libmpi.so on MPICH unless OpenMPI was the choice before.
keep() {  # group, value before, MPICH target
  local now; now=$(alt "$1")
  case "$2" in *openmpi*) return ;; esac
  if [ "$now" != "$3" ] && [ -e "$3" ]; then
    $SUDO update-alternatives --set "$1" "$3" >/dev/null
    echo "setup: plain $1 stays MPICH ($3); 'update-alternatives --config $1' to change" >&2
  fi
}
keep mpi "$before_mpi" /usr/bin/mpicc.mpich
keep mpirun "$before_run" /usr/bin/mpirun.mpich
keep mpi-x86_64-linux-gnu "$before_inc" /usr/include/x86_64-linux-gnu/mpich

if ! python3 -c 'import numpy, PIL, h5py, safetensors, pytest, watchdog, inotify_simple' >/dev/null 2>&1; then
  python3 -m pip install -q --disable-pip-version-check numpy pillow h5py safetensors pytest watchdog inotify_simple
fi
# The ML frameworks of the raw-syscall tests (tests/test_sud_frameworks.py)
# live in a venv OUTSIDE the repository that later runs reuse: torch (the
# default PyPI wheel, ~2.5 min to install), transformers, accelerate,
# safetensors, lightning, jax[cpu], orbax-checkpoint, tensorflow-cpu (33 s
# more here), filelock, and the dataset formats' libraries of
# tests/test_data_formats.py: datasets (with pyarrow), lmdb. Installed only when missing; a failure here (no network) does
# not stop the set-up: those tests then fail loudly under CI=true.
FANSTORE_VENV="${FANSTORE_VENV:-/opt/fanstore-venv}"
if [ ! -x "$FANSTORE_VENV/bin/python" ]; then
  if ! python3 -m venv --system-site-packages "$FANSTORE_VENV"; then
    # Debian's own python3 needs python3-venv for ensurepip.
    rm -rf "$FANSTORE_VENV"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq python3-venv >/dev/null \
      && python3 -m venv --system-site-packages "$FANSTORE_VENV" \
      || echo "setup: cannot create the venv $FANSTORE_VENV" >&2
  fi
fi
if [ -x "$FANSTORE_VENV/bin/python" ] && \
   ! "$FANSTORE_VENV/bin/python" -c 'import torch, transformers, accelerate, safetensors, numpy, pytest, lightning, jax, orbax.checkpoint, tensorflow, filelock, datasets, pyarrow, lmdb, tensorboard' >/dev/null 2>&1; then
  t0=$(date +%s)
  "$FANSTORE_VENV/bin/python" -m pip install -q --disable-pip-version-check \
      torch transformers accelerate safetensors numpy pytest lightning "jax[cpu]" orbax-checkpoint tensorflow-cpu filelock datasets lmdb tensorboard \
    && echo "setup: frameworks installed into $FANSTORE_VENV in $(( $(date +%s) - t0 )) s" >&2 \
    || echo "setup: installing the frameworks into $FANSTORE_VENV failed" >&2
fi
