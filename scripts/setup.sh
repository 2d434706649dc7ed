#!/usr/bin/env bash
# Installs what FanStore needs, only what is missing, on any machine state.
#
#   bash scripts/setup.sh               everything the tests need (default)
#   bash scripts/setup.sh --quickstart  only what the quickstart needs
#
# System packages (Debian 12 and 13, with apt-get as root or through sudo):
#   quickstart: an MPI (MPICH), libclang (bindgen for the mpi crate),
#               pkg-config, a C compiler, python3-venv;
#   tests:      also OpenMPI (the daemon is built and tested against it too),
#               Slurm + munge (tests/test_slurm.py), g++, git and patch.
# Nothing is installed that is already there: with MPI from `module load`
# (or MPICC=/path/to/mpicc), libclang present and Rust installed, the
# quickstart's set-up runs with no root, no apt and no sudo.
#
# Python packages go into one venv outside the repository, never into the
# system Python (PEP 668): ${FANSTORE_VENV:-/opt/fanstore-venv} for root,
# ~/.local/share/fanstore-venv for other users. It is made only when missing.
#   clients (both modes): numpy pillow h5py safetensors pytest watchdog inotify_simple
#   frameworks (tests, optional): torch transformers accelerate lightning
#     jax[cpu] orbax-checkpoint tensorflow-cpu filelock datasets lmdb tensorboard
#     (~3 min the first time; when they cannot be installed the set-up says so
#     and goes on: the framework tests then fail under CI=true, skip otherwise).
#
# Installing OpenMPI next to MPICH makes Debian's update-alternatives point
# plain `mpicc`/`mpiexec` at OpenMPI (higher priority). This script puts them
# back to MPICH when it installed OpenMPI itself, so the quickstart and a
# user's own launch lines keep the MPI they had.
#
# Every step that fails says what failed and what to do, and exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
fs_trap_errors setup

MODE=tests
case "${1:-}" in
  ""|--tests) ;;
  --quickstart) MODE=quickstart ;;
  *) echo "usage: bash scripts/setup.sh [--quickstart]" >&2; exit 2 ;;
esac

fail() { say "$1"; shift; for line in "$@"; do echo "  $line" >&2; done; exit 1; }

# --- who may install system packages --------------------------------------
SUDO=()
if [ "$(id -u)" = 0 ]; then CAN_APT=1
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then CAN_APT=1; SUDO=(sudo)
else CAN_APT=0
fi
command -v apt-get >/dev/null 2>&1 || CAN_APT=0

# --- what is missing -------------------------------------------------------
need=()      # Debian packages to install
missing=()   # the same, said for a user who cannot install them
add() { need+=("${@:2}"); missing+=("$1"); }

if ! fs_find_cargo; then
  fail "no Rust toolchain (cargo) on PATH or in ~/.cargo/bin." \
       "Install it as your own user with rustup (no root needed), then open a new shell: see README, Install."
fi
# An MPI to build the daemon against. A user-chosen MPICC is never replaced.
if [ -n "${MPICC:-}" ]; then
  fs_pick_mpi || fail "MPICC=$MPICC: no such mpicc, or no mpiexec next to it or on PATH." \
                      "Set MPICC to your MPI's mpicc (and MPIEXEC to its mpiexec), or load the MPI module first."
else
  { [ -x /usr/bin/mpiexec.mpich ] || command -v mpiexec >/dev/null 2>&1; } || add "an MPI launcher (mpiexec)" mpich
  { [ -x /usr/bin/mpicc.mpich ] || command -v mpicc >/dev/null 2>&1; } || add "an MPI compiler wrapper (mpicc)" libmpich-dev
fi
# libclang: bindgen (inside the mpi crate's build) loads it.
if [ -z "${LIBCLANG_PATH:-}" ] && \
   ! ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/llvm-*/lib/libclang-[0-9]*.so* >/dev/null 2>&1 && \
   ! { ldconfig -p 2>/dev/null | grep -q 'libclang[-.0-9]*\.so'; }; then
  add "libclang (for bindgen; or set LIBCLANG_PATH to the directory holding libclang.so)" libclang-dev
fi
command -v pkg-config >/dev/null 2>&1 || add "pkg-config" pkg-config
command -v cc >/dev/null 2>&1 || add "a C compiler (cc)" gcc libc6-dev
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || add "python3 with venv and ensurepip" python3-venv
if [ $MODE = tests ]; then
  # The tests pin Debian's MPICH and OpenMPI by path (tests/fs_cluster.py).
  [ -x /usr/bin/mpiexec.mpich ] || add "MPICH (the tests run /usr/bin/mpiexec.mpich)" mpich
  [ -x /usr/bin/mpicc.mpich ] || add "MPICH's headers and mpicc.mpich" libmpich-dev
  [ -x /usr/bin/mpiexec.openmpi ] || add "OpenMPI (the daemon is tested against it too)" openmpi-bin
  [ -e /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h ] || add "OpenMPI's headers" libopenmpi-dev
  for b in slurmctld slurmd; do [ -x /usr/sbin/$b ] || add "Slurm's $b (tests/test_slurm.py)" $b; done
  command -v sbatch >/dev/null 2>&1 || add "Slurm's client commands" slurm-client
  [ -x /usr/sbin/munged ] || add "munge (Slurm's authentication)" munge
  command -v g++ >/dev/null 2>&1 || add "g++ (C++ stream clients)" g++
  for t in git patch; do command -v $t >/dev/null 2>&1 || add "$t (tests/test_output_tools.py)" $t; done
  # pjdfstest (tests/test_pjdfstest.py): built from its tarball at test time, run with prove.
  for t in autoconf automake make openssl; do command -v $t >/dev/null 2>&1 || add "$t (tests/test_pjdfstest.py)" $t; done
  command -v prove >/dev/null 2>&1 || add "perl's prove (tests/test_pjdfstest.py)" perl
fi

# --- install them ----------------------------------------------------------
# The current choice of an MPI alternative (empty when there is none: the
# query exits 2 before any MPI is installed).
alt() { { update-alternatives --query "$1" 2>/dev/null || true; } | awk '/^Value:/ {print $2}'; }
ompi_now=0; [[ " ${need[*]-} " == *" openmpi-bin "* ]] && ompi_now=1
if [ ${#need[@]} -gt 0 ]; then
  if [ $CAN_APT = 0 ]; then
    fail "missing, and no root or sudo to install them:" "${missing[@]}" "" \
      "On a cluster: load the site's modules first (e.g. 'module load mpich llvm'), or set MPICC=/path/to/mpicc" \
      "and LIBCLANG_PATH=/path/to/llvm/lib; see README, 'On a cluster (no root)'." \
      "On your own Debian machine: sudo apt-get install ${need[*]}"
  fi
  before_mpi=$(alt mpi); before_run=$(alt mpirun); before_inc=$(alt mpi-x86_64-linux-gnu)
  say "installing with apt-get: ${need[*]}"
  "${SUDO[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq \
    || fail "apt-get update failed (see above): check the network and /etc/apt/sources.list*"
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
      --no-install-recommends "${need[@]}" >/dev/null \
    || fail "apt-get install ${need[*]} failed (see above)."
  # Keep plain mpicc/mpiexec/libmpi.so on MPICH unless OpenMPI was the choice before.
  keep() {  # group, value before, MPICH target
    local now; now=$(alt "$1")
    case "$2" in *openmpi*) return 0 ;; esac
    if [ "$now" != "$3" ] && [ -e "$3" ]; then
      "${SUDO[@]}" update-alternatives --set "$1" "$3" >/dev/null \
        || fail "update-alternatives --set $1 $3 failed"
      say "plain $1 stays MPICH ($3); 'update-alternatives --config $1' to change"
    fi
  }
  if [ $ompi_now = 1 ]; then
    keep mpi "$before_mpi" /usr/bin/mpicc.mpich
    keep mpirun "$before_run" /usr/bin/mpirun.mpich
    keep mpi-x86_64-linux-gnu "$before_inc" /usr/include/x86_64-linux-gnu/mpich
  fi
fi
fs_pick_mpi || fail "no MPI found after the set-up (no mpicc.mpich, no mpicc and mpiexec on PATH)." \
                    "Load your MPI module or set MPICC=/path/to/mpicc."

# --- the Python venv -------------------------------------------------------
VENV=$(fs_venv_dir)
if [ ! -x "$VENV/bin/python3" ]; then
  mkdir -p "$(dirname "$VENV")" 2>/dev/null || true
  python3 -m venv "$VENV" \
    || fail "python3 -m venv $VENV failed (see above)." \
            "Set FANSTORE_VENV to a directory you can write, or install python3-venv."
  say "made the venv $VENV"
fi
PY="$VENV/bin/python3"
pip_install() { "$PY" -m pip install -q --disable-pip-version-check "$@"; }

CLIENTS=(numpy pillow h5py safetensors pytest watchdog inotify_simple)
if ! "$PY" -c 'import numpy, PIL, h5py, safetensors, pytest, watchdog, inotify_simple' >/dev/null 2>&1; then
  t0=$SECONDS
  pip_install "${CLIENTS[@]}" \
    || fail "pip install ${CLIENTS[*]} into $VENV failed (see above): check the network or your pip index settings."
  say "Python clients installed into $VENV in $((SECONDS - t0)) s"
fi

# The repository's own package (python/: fanstore.torch.save), pure Python;
# installed again whenever its sources are newer than the installed copy.
STAMP="$VENV/.fanstore-python-installed"
if [ ! -e "$STAMP" ] || [ -n "$(find python -newer "$STAMP" -print -quit)" ]; then
  pip_install ./python \
    || fail "pip install ./python into $VENV failed (see above): check the network (pip fetches setuptools to build it)."
  touch "$STAMP"
  say "the fanstore Python package installed into $VENV"
fi

if [ $MODE = tests ]; then
  FRAMEWORKS=(torch transformers accelerate safetensors numpy pytest lightning "jax[cpu]" orbax-checkpoint
              tensorflow-cpu filelock datasets lmdb tensorboard)
  if "$PY" -c 'import torch, transformers, accelerate, safetensors, numpy, pytest, lightning, jax, orbax.checkpoint, tensorflow, filelock, datasets, pyarrow, lmdb, tensorboard' >/dev/null 2>&1; then
    :
  else
    t0=$SECONDS
    if pip_install "${FRAMEWORKS[@]}"; then
      say "frameworks installed into $VENV in $((SECONDS - t0)) s"
    else
      say "SKIPPED the frameworks: pip install ${FRAMEWORKS[*]} into $VENV failed (see above)."
      say "  tests/test_sud_frameworks.py, test_frameworks_outputs.py and test_data_formats.py will fail under CI=true and skip otherwise."
    fi
  fi
fi
say "ready ($MODE): MPI $MPICC, venv $VENV"
