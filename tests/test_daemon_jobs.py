"""A job that meets another job's directories: a second job started on a
running job's --local or runtime directory is refused by the rank lock
files and takes nothing; copy directories that killed ranks left in
/dev/shm are swept by a later job."""
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import fs_cluster
from fs_cluster import node_state, start_cluster, launch
from fs_daemon import files_of
from fs_daemon import pack, source  # noqa: F401 (fixtures)


def test_a_second_job_on_a_running_jobs_directories_is_refused_and_takes_nothing(bins, pack, source, tmp_path):
    """A second job started with a running job's --local directory (or its
    runtime directory) must not take the running job's rank directories for
    a killed run's (remove them under its readers, set its outputs aside):
    each of its ranks refuses to start, naming the lock file and the pid that
    holds it, and the first job reads and writes on as before."""
    ds = pack("none")
    _, files = files_of(ds)
    paths = sorted(p for p, n in files.items() if n["size"] > 0)
    # (No background replication or extraction: the first job's own work
    # would change its local directory while the test compares it.)
    c = start_cluster(bins, ds, tmp_path / "a", nranks=2,
                      extra_args=["--replicate-on-read", "off", "--extract-ahead", "0"])
    try:
        def read_every_file():
            for node in (0, 1):
                out = tmp_path / f"cat{node}.out"
                with open(out, "wb") as f:
                    subprocess.run(["cat", *(f"{c.mount}/{p}" for p in paths)], env=c.env(node), stdout=f, check=True)
                assert out.read_bytes() == b"".join((source / p).read_bytes() for p in paths), f"node {node} read other bytes"
        subprocess.run(["sh", "-c", f"echo kept > {c.mount}/out.txt"], env=c.env(1), check=True)
        read_every_file()
        pids = c.pids()
        held = {r: sorted(q.relative_to(c.local) for q in (c.local / f"rank-{r}").rglob("*")) for r in (0, 1)}
        # The same --local, a runtime directory of its own; then the first
        # job's runtime directory, a --local of its own.
        for name, kw, lock in (("same-local", dict(local=c.local), lambda r: c.local / f"rank-{r}.lock"),
                               ("same-runtime", dict(runtime=c.runtime), lambda r: c.runtime / f"node-{r}.lock")):
            proc, runtime, _, log_path = launch(bins, ds, tmp_path / name, nranks=2, **kw)
            try:
                rc = proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                pytest.fail(f"{name}: the second job kept running")
            log = log_path.read_text()
            assert rc != 0, log
            for r in (0, 1):
                assert f"{lock(r)}: rank {r} of a running FanStore job (pid {pids[r]})" in log, log
            assert "removing stale" not in log and "killed run" not in log, log
            for r in (0, 1):
                st = node_state(c.runtime, r)
                assert st["status"] == 1 and st["pid"] == pids[r], f"{name}: rank {r}'s state is no longer the first job's"
                # Nothing of it went (a file being fetched, *.fetch, becomes its final name).
                gone = [q for q in held[r] if not (c.local / q).exists() and q.suffix != ".fetch"]
                assert not gone, f"{name}: rank {r}'s local directory lost {gone}"
            assert not list(c.local.glob("recovered-rank-*")), f"{name}: the first job's outputs were set aside"
            read_every_file()
            r = subprocess.run(["cat", f"{c.mount}/out.txt"], env=c.env(0), capture_output=True, text=True, check=True)
            assert r.stdout == "kept\n"
            if name == "same-local":
                # Its own runtime directory says it failed (no lock file left
                # there), and `fanstore stop` clears it.
                assert not list(runtime.glob("*.lock")), list(runtime.iterdir())
                w = subprocess.run([bins["cli"], "--runtime-dir", str(runtime), "wait", "--timeout", "5"],
                                   capture_output=True, text=True)
                assert w.returncode == 1 and "failed" in w.stderr, w.stderr
                fs_cluster.wait_ranks_gone(runtime, 2)  # (OpenMPI's launcher may exit first)
                subprocess.run([bins["cli"], "--runtime-dir", str(runtime), "stop"], check=True, capture_output=True)
                assert not runtime.exists(), list(runtime.iterdir())
    finally:
        c.stop()
    # The first job's stop leaves no lock file behind.
    assert not list(c.local.glob("*.lock")) and not c.runtime.exists()


def test_copy_directories_left_by_killed_ranks_are_swept_at_start(bins, pack, tmp_path):
    """A rank killed while removing its copy directory (renamed
    `*.copies.removing` in /dev/shm) leaves it in memory, under a name no
    later job with another runtime directory meets: a starting daemon
    removes this user's tombs untouched for a minute, and nothing else."""
    uid = os.getuid()
    old = time.time() - 600
    tombs = {}
    for name, age in ((f"fanstore-{uid}-testjob-0badc0de-r0.copies.removing", old),
                      (f"fanstore-{uid}-testjob-0badc0de-r1.copies.removing", None)):
        p = Path("/dev/shm") / name
        p.mkdir()
        (p / "7").write_bytes(b"x" * 4096)
        if age:
            os.utime(p, (age, age))
        tombs[name] = p
    c = start_cluster(bins, pack("none"), tmp_path, nranks=2)
    try:
        old_tomb, fresh_tomb = tombs.values()
        assert not old_tomb.exists(), "an abandoned tomb was left"
        assert fresh_tomb.exists(), "a tomb still being removed (touched within the minute) was swept"
        assert "copy directories in /dev/shm that ranks of earlier jobs were killed while removing" in c.log()
    finally:
        c.stop()
        for p in tombs.values():
            subprocess.run(["rm", "-rf", str(p)])
