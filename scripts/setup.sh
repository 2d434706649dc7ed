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
