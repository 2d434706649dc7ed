#!/bin/sh
# Runs "$@" as a client of the FanStore node of this MPI rank (tests/test_mdtest_ior.py,
# bench/mdtest_bench.py): FANSTORE_NODE = rank / FS_RANKS_PER_NODE (MPICH's
# PMI_RANK, OpenMPI's OMPI_COMM_WORLD_RANK), LD_PRELOAD = FS_PRELOAD (none when
# unset: a native run), set in the ranks only, never in mpiexec itself.
# FS_STRACE=PREFIX: under `strace -c -f -o PREFIX.<rank>` (the preload library
# in the traced program only, not in strace).
rank=${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-0}}
FANSTORE_NODE=$(( rank / ${FS_RANKS_PER_NODE:-1} ))
export FANSTORE_NODE
if [ -n "${FS_STRACE:-}" ]; then
  if [ -n "${FS_PRELOAD:-}" ]; then
    exec strace -c -f -o "$FS_STRACE.$rank" -E LD_PRELOAD="$FS_PRELOAD" "$@"
  fi
  exec strace -c -f -o "$FS_STRACE.$rank" "$@"
fi
[ -z "${FS_PRELOAD:-}" ] || export LD_PRELOAD="$FS_PRELOAD"
exec "$@"
