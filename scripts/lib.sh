# Sourced by scripts/setup.sh, scripts/quickstart.sh, scripts/test.sh and
# bench/run.sh: where the Python venv lives, which MPI the build uses, and a
# trap that names the command that failed (no script dies without a word).

# Prints "<script>: <message>" on stderr.
say() { echo "${FS_SCRIPT:-fanstore}: $*" >&2; }

# Any command that fails under `set -e` and is not handled says what it was.
fs_trap_errors() {
  FS_SCRIPT=$1
  trap 'rc=$?; say "line $LINENO: \`$BASH_COMMAND\` failed (exit $rc)"; exit $rc' ERR
}

# The venv that holds every Python package the quickstart, the tests and the
# benchmarks use (never the system Python: Debian 12/13 refuse system-wide pip
# installs, PEP 668). FANSTORE_VENV wins; otherwise /opt/fanstore-venv for
# root and ~/.local/share/fanstore-venv for everyone else.
fs_venv_dir() {
  if [ -n "${FANSTORE_VENV:-}" ]; then echo "$FANSTORE_VENV"
  elif [ "$(id -u)" = 0 ]; then echo /opt/fanstore-venv
  else echo "${XDG_DATA_HOME:-$HOME/.local/share}/fanstore-venv"
  fi
}

# Puts the venv's python first on PATH (so every `python3`, including those
# that tests and mpiexec start, is the venv's) and exports FANSTORE_VENV.
fs_use_venv() {
  FANSTORE_VENV=$(fs_venv_dir); export FANSTORE_VENV
  if [ ! -x "$FANSTORE_VENV/bin/python3" ]; then
    say "no Python venv at $FANSTORE_VENV: run bash scripts/setup.sh"
    return 1
  fi
  export PATH="$FANSTORE_VENV/bin:$PATH"
}

# Picks the MPI the build and the launch lines use; sets MPICC and MPIEXEC.
#   MPICC set by the user (a site MPI: `MPICC=$(which mpicc)`): that one, with
#     the mpiexec next to it (or MPIEXEC, or the one on PATH);
#   Debian's MPICH (/usr/bin/mpicc.mpich): that one, whatever plain mpicc means;
#   otherwise the mpicc on PATH (`module load mpich` / `module load openmpi`).
# Returns 1 when there is none.
fs_pick_mpi() {
  if [ -n "${MPICC:-}" ]; then
    [ -x "$MPICC" ] || MPICC=$(command -v "$MPICC" 2>/dev/null) || return 1
    if [ -z "${MPIEXEC:-}" ]; then
      if [ -x "$(dirname "$MPICC")/mpiexec" ]; then MPIEXEC="$(dirname "$MPICC")/mpiexec"
      else MPIEXEC=$(command -v mpiexec 2>/dev/null) || return 1
      fi
    fi
  elif [ -x /usr/bin/mpicc.mpich ] && [ -x /usr/bin/mpiexec.mpich ]; then
    MPICC=/usr/bin/mpicc.mpich; MPIEXEC=/usr/bin/mpiexec.mpich
  elif command -v mpicc >/dev/null 2>&1 && command -v mpiexec >/dev/null 2>&1; then
    MPICC=$(command -v mpicc); MPIEXEC=$(command -v mpiexec)
  else
    return 1
  fi
  export MPICC MPIEXEC
}

# The extra mpiexec arguments an MPI needs to run 4 ranks on a 2-core machine
# (OpenMPI refuses more ranks than cores, and refuses root, unless told).
fs_mpiexec_args() {
  if "$MPIEXEC" --version 2>&1 | grep -qi 'open mpi\|open-mpi\|openrte'; then
    printf '%s\n' --oversubscribe
    [ "$(id -u)" = 0 ] && printf '%s\n' --allow-run-as-root
  fi
  return 0
}

# cargo on PATH, or where rustup puts it.
fs_find_cargo() {
  command -v cargo >/dev/null 2>&1 && return 0
  [ -x "$HOME/.cargo/bin/cargo" ] && { export PATH="$HOME/.cargo/bin:$PATH"; return 0; }
  return 1
}
