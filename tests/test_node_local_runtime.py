"""A job whose nodes each keep their own runtime directory (the default
`$TMPDIR/fanstore-<uid>-<job>` is node-local on most clusters): `fanstore wait`
on one node returns once the job is ready, although it sees only its own
rank, and `fanstore stop` there stops every rank (the stop travels over MPI)."""
import subprocess
import tempfile
from pathlib import Path

from fs_cluster import MPIEXEC, base_env, packed_dataset


def test_wait_and_stop_from_one_node_with_node_local_runtime_dirs(bins, tmp_path):
    packed_dataset(bins, tmp_path, n_files=8, seed=6, partitions=2)
    rts = [Path(tempfile.mkdtemp(prefix=f"fsrt{r}-", dir="/tmp")) for r in range(2)]
    cmd = [MPIEXEC]
    for r, rt in enumerate(rts):  # MPMD: each rank its own --runtime-dir
        if r:
            cmd.append(":")
        cmd += ["-n", "1", bins["daemon"], "--data", str(tmp_path / "data"), "--local", str(tmp_path / "local"),
                "--runtime-dir", str(rt)]
    log = open(tmp_path / "daemons.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=base_env(), start_new_session=True)
    try:
        r = subprocess.run([bins["cli"], "--runtime-dir", str(rts[1]), "wait", "--timeout", "60"],
                           capture_output=True, text=True, timeout=90, env=base_env())
        assert r.returncode == 0, r.stderr + (tmp_path / "daemons.log").read_text()
        assert "2 rank(s) ready" in r.stdout
        assert len(list(rts[1].glob("node-*.state"))) == 1, "this node sees only its own rank"
        r = subprocess.run([bins["cli"], "--runtime-dir", str(rts[1]), "stop", "--timeout", "60"],
                           capture_output=True, text=True, timeout=90, env=base_env())
        assert r.returncode == 0, r.stderr
        assert proc.wait(timeout=60) == 0, (tmp_path / "daemons.log").read_text()
        assert not any(rt.exists() for rt in rts), "both ranks removed their runtime directories"
    finally:
        if proc.poll() is None:
            proc.kill()
