#!/usr/bin/env bash
# Installs what FanStore needs on a fresh Debian 12 machine (idempotent):
# MPICH, libclang (bindgen for the mpi crate), and the Python test clients.
set -euo pipefail
need_apt=()
command -v mpiexec >/dev/null 2>&1 || need_apt+=(mpich libmpich-dev)
[ -e /usr/include/x86_64-linux-gnu/mpich/mpi.h ] || [ -e /usr/include/mpich/mpi.h ] || need_apt+=(libmpich-dev)
ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/llvm-*/lib/libclang-[0-9]*.so* >/dev/null 2>&1 || need_apt+=(libclang-dev clang)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${need_apt[@]}" >/dev/null
fi
if ! python3 -c 'import numpy, PIL, h5py, safetensors, pytest' >/dev/null 2>&1; then
  python3 -m pip install -q --disable-pip-version-check numpy pillow h5py safetensors pytest
fi
# The ML frameworks of the raw-syscall tests (tests/test_sud_frameworks.py)
# live in a venv OUTSIDE the repository that later runs reuse: torch (the
# default PyPI wheel, ~2.5 min to install), transformers, accelerate,
# safetensors. Installed only when missing; a failure here (no network) does
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
   ! "$FANSTORE_VENV/bin/python" -c 'import torch, transformers, accelerate, safetensors, numpy, pytest' >/dev/null 2>&1; then
  t0=$(date +%s)
  "$FANSTORE_VENV/bin/python" -m pip install -q --disable-pip-version-check \
      torch transformers accelerate safetensors numpy pytest \
    && echo "setup: frameworks installed into $FANSTORE_VENV in $(( $(date +%s) - t0 )) s" >&2 \
    || echo "setup: installing the frameworks into $FANSTORE_VENV failed" >&2
fi
