#!/bin/sh
# prove --exec 'sh wrap.sh' runs each pjdfstest .t file through this
# (tests/pjdfstest/run.py): in the directory under test PJD_DIR (/fanstore/...),
# under `timeout` (PJD_TIMEOUT seconds, then SIGKILL 5 s later, the whole
# process group), on the rank of the file's number in the run
# (FANSTORE_NODE = PJD_INDEX line of the file % PJD_NODES). The `cd` is made
# by a shell started with that FANSTORE_NODE: a virtual cwd is handed to an
# exec'd program through a stand-in directory in its rank's local directory,
# so a program started on another rank than its parent's cwd would not find
# it again (it would work in the real stand-in directory instead).
# its stdout and stderr merged in order into PJD_LOGS/<dir>_<n>.log (so a
# shell's "Segmentation fault" line comes just before the "not ok N" of the
# subtest it broke), followed by "# pjd-exit STATUS" and "# pjd-ms MILLISECONDS".
# prove reads the same stream (non-TAP lines are ignored).
t=$1
rel=${t#"$PJD_TESTS"/}
log="$PJD_LOGS/$(printf '%s' "$rel" | tr / _).log"
if [ -n "${PJD_NODES:-}" ]; then
  i=$(grep -nxF "$rel" "$PJD_INDEX" | cut -d: -f1)
  FANSTORE_NODE=$(( (${i:-1} - 1) % PJD_NODES ))
  export FANSTORE_NODE
fi
start=$(date +%s%N)
{
  timeout -k 5 "$PJD_TIMEOUT" sh -c 'cd "$1" && exec sh "$2"' sh "$PJD_DIR" "$t" 2>&1
  rc=$?
  end=$(date +%s%N)
  echo "# pjd-exit $rc"
  echo "# pjd-ms $(( (end - start) / 1000000 ))"
  echo "$rc" > "$log.rc"
} | tee "$log"
rc=$(cat "$log.rc" 2>/dev/null || echo 1)
rm -f "$log.rc"
exit "$rc"
