"""scripts/fanstore-job.sbatch under a real one-machine Slurm cluster.

Two emulated nodes (multiple slurmd), 2 tasks each; the job script is
submitted unchanged with `sbatch --wait`, its settings given in the
environment. The daemons are an MPI job of their own: srun with Slurm's PMI
(`--mpi=pmi2` for the MPICH build, `--mpi=pmix` for the OpenMPI build) or
MPICH's mpiexec inside the allocation. Checked: every task read the dataset
exactly, a checkpoint written by task 0 is read by the other tasks (other
node included) and is in --persist after the job, nothing is left (no
daemon, nothing of the job in /dev/shm, no runtime directory). A job
cancelled with scancel while training: no daemon left, nothing in /dev/shm,
and the output closed before the cancel is in --persist.
"""
import glob
import hashlib
import io
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import BIN, OMPI_BIN, ROOT
from fs_prep import make_tree, pack
from fs_slurm import SlurmCluster, require_slurm

sys.path.insert(0, str(Path(__file__).parent))
import slurm_train  # noqa: E402

SCRIPT = ROOT / "scripts" / "fanstore-job.sbatch"
NODES, TASKS_PER_NODE = 2, 2
MOUNT = "/fanstore"

# launch mode -> (job script settings, MPI library the daemons must log)
MODES = {
    "srun-pmi2-mpich": ({"FANSTORE_LAUNCH": "srun", "FANSTORE_SRUN_MPI": "pmi2"}, "MPICH"),
    "mpiexec-mpich": ({"FANSTORE_LAUNCH": "mpiexec", "FANSTORE_MPIEXEC": "/usr/bin/mpiexec.mpich"}, "MPICH"),
    "srun-pmix-openmpi": ({"FANSTORE_LAUNCH": "srun", "FANSTORE_SRUN_MPI": "pmix",
                           "OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "tcp,self",
                 # Open MPI 5.0.7 (Debian 13) finds no TCP interface pairing on a
                 # dual-stack host (open-mpi/ompi#14079): IPv4 only, as between nodes.
                 "OMPI_MCA_btl_tcp_disable_family": "6"}, "Open MPI"),
    # OpenMPI's mpiexec refuses root unless told (test box only, never in the script).
    "mpiexec-openmpi": ({"FANSTORE_LAUNCH": "mpiexec", "FANSTORE_MPIEXEC": "/usr/bin/mpiexec.openmpi",
                         "FANSTORE_MPIEXEC_ARGS": "--map-by ppr:1:node",
                         "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                         "OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "tcp,self",
                 # Open MPI 5.0.7 (Debian 13) finds no TCP interface pairing on a
                 # dual-stack host (open-mpi/ompi#14079): IPv4 only, as between nodes.
                 "OMPI_MCA_btl_tcp_disable_family": "6"}, "Open MPI"),
}


@pytest.fixture(scope="module")
def slurm():
    require_slurm()
    root = Path(tempfile.mkdtemp(prefix="fsslurm-", dir="/tmp"))
    with SlurmCluster(root, nodes=NODES, cpus=4, kill_wait=30) as sl:
        yield sl
    import shutil
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def dataset(bins, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("slurmdata")
    src = make_tree(tmp / "src", "images", n_files=40, seed=15)
    data = tmp / "data.fs"
    pack(bins, src, data, "--partitions", "4", "--compress", "lz4")
    n, digest = native_digest(src)
    return data, n, digest


def native_digest(src: Path):
    """slurm_train.dataset_digest of the original tree (symlinks left out, as there)."""
    return slurm_train.dataset_digest(str(src))


def model_bytes() -> bytes:
    b = io.BytesIO()
    np.save(b, slurm_train.expected_array())
    return b.getvalue()


def bin_dir(tmp: Path, mode: str) -> Path:
    """FANSTORE_BIN for a mode: the MPICH build, or the OpenMPI daemon with the CLI and the preload
    library of target/release (neither links MPI)."""
    if "openmpi" not in mode:
        return BIN
    d = tmp / "bin-ompi"
    d.mkdir(exist_ok=True)
    for name, where in [("fanstore-daemon", OMPI_BIN), ("fanstore", BIN), ("libfanstore_preload.so", BIN)]:
        if not (where / name).exists():
            pytest.fail(f"{where / name} missing: scripts/test.sh builds it")
        link = d / name
        if not link.exists():
            link.symlink_to(where / name)
    return d


def submit(sl, tmp: Path, mode: str, data: Path, hold=False, wait=True, fail=False):
    """sbatch of the job script; returns (job id, output path, sbatch result, settings)."""
    settings, _lib = MODES[mode]
    runtime = Path(tempfile.mkdtemp(prefix="fsrt-", dir="/tmp"))
    runtime.rmdir()  # the daemons make it (0700)
    env = sl.env(
        FANSTORE_BIN=bin_dir(tmp, mode), FANSTORE_DATA=data, FANSTORE_PERSIST=tmp / "persist",
        FANSTORE_LOCAL=tmp / "local", FANSTORE_RUNTIME_DIR=runtime, FANSTORE_MOUNT=MOUNT,
        UCX_TLS="tcp", RUST_LOG="info", **settings)
    out = tmp / "job-%j.out"
    cmd = ["sbatch", "--parsable", f"--nodes={NODES}", f"--ntasks-per-node={TASKS_PER_NODE}", f"--output={out}",
           f"--chdir={tmp}"]
    if wait:
        cmd.append("--wait")
    cmd += [SCRIPT, sys.executable, Path(__file__).parent / "slurm_train.py", MOUNT]
    if hold:
        cmd.append("--hold")
    if fail:
        cmd.append("--fail")
    r = sl.run(cmd, check=False, timeout=600, env=env)
    m = re.match(r"(\d+)", r.stdout.strip())
    assert m, f"sbatch printed no job id (exit {r.returncode})\n{r.stdout}\n{r.stderr}\n{sl.logs()}"
    job = m.group(1)
    return job, Path(str(out).replace("%j", job)), r, runtime


def read(p: Path) -> str:
    try:
        return p.read_text(errors="replace")
    except OSError:
        return "(no output file)"


def daemons_of(tmp: Path) -> list:
    """Live fanstore-daemon processes whose command line names this test's --local."""
    left = []
    for d in glob.glob("/proc/[0-9]*"):
        try:
            cmd = Path(d, "cmdline").read_bytes().split(b"\0")
            state = Path(d, "stat").read_text().split(") ", 1)[1][0]
        except (OSError, IndexError):
            continue
        if state != "Z" and cmd and cmd[0].endswith(b"fanstore-daemon") and str(tmp / "local").encode() in cmd:
            left.append(int(d[6:]))
    return left


def shm_of(job: str) -> list:
    return glob.glob(f"/dev/shm/fanstore-{os.getuid()}-{job}-*")


def export(tmp: Path, mode: str, to: Path):
    r = subprocess.run([str(bin_dir(tmp, mode) / "fanstore"), "export", str(tmp / "persist"), "--to", str(to)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"fanstore export: {r.stdout}\n{r.stderr}"


def check_daemon_mpi(text: str, mode: str):
    _settings, lib = MODES[mode]
    # Ranks' lines can interleave (OpenMPI forwards output in pieces): match their starts only.
    seen = {(int(r), int(n), got.startswith(lib)) for r, n, got in re.findall(r"rank (\d+)/(\d+): (.{0,12})", text)}
    assert seen == {(r, NODES, True) for r in range(NODES)}, \
        f"expected ranks 0..{NODES - 1} of {NODES} on {lib}, got (rank, size, right library) {sorted(seen)}\n{text}"


@pytest.mark.parametrize("mode", list(MODES))
def test_job_script(slurm, dataset, tmp_path, mode):
    data, nfiles, digest = dataset
    job, out, r, runtime = submit(slurm, tmp_path, mode, data)
    text = read(out)
    assert r.returncode == 0, (f"sbatch --wait exited {r.returncode}\n{r.stderr}\n--- job output ---\n{text}\n"
                               f"{slurm.logs(tail=1500)}")
    check_daemon_mpi(text, mode)
    tasks = re.findall(r"task (\d+) node (\S+) files (\d+) digest ([0-9a-f]{64})", text)
    assert sorted(int(t[0]) for t in tasks) == list(range(NODES * TASKS_PER_NODE)), text
    assert {t[1] for t in tasks} == {str(i) for i in range(NODES)}, f"tasks on nodes: {tasks}"
    for t in tasks:
        assert (int(t[2]), t[3]) == (nfiles, digest), f"task {t[0]} read other bytes than the original tree\n{text}"
    assert len(re.findall(r"task \d+ read checkpoint ok", text)) == NODES * TASKS_PER_NODE - 1, text
    assert "daemons exited 0, job exits 0" in text, text
    # Outputs drained, nothing left.
    plain = tmp_path / "exported"
    export(tmp_path, mode, plain)
    got = (plain / "ckpt" / slurm_train.MODEL.format(job=job)).read_bytes()
    assert hashlib.sha256(got).digest() == hashlib.sha256(model_bytes()).digest()
    assert daemons_of(tmp_path) == []
    assert shm_of(job) == []
    assert not runtime.exists(), sorted(os.listdir(runtime))


def test_scancel_drains_and_cleans(slurm, dataset, tmp_path):
    mode = "srun-pmi2-mpich"
    data, _n, _d = dataset
    job, out, r, runtime = submit(slurm, tmp_path, mode, data, hold=True, wait=False)
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 180
    while "task 0 holding" not in read(out):
        state = slurm.job_state(job)
        assert time.monotonic() < deadline and state in ("PENDING", "RUNNING", "CONFIGURING"), \
            f"job {job} is {state!r} before the checkpoint was closed\n{read(out)}\n{slurm.logs()}"
        time.sleep(0.5)
    # The other tasks have read it too: the job is mid-run, outputs closed.
    while len(re.findall(r"read checkpoint ok", read(out))) < NODES * TASKS_PER_NODE - 1:
        assert time.monotonic() < deadline, read(out)
        time.sleep(0.5)
    assert shm_of(job), "the running job has no index in /dev/shm"
    slurm.run(["scancel", job])
    deadline = time.monotonic() + 120
    while slurm.job_state(job):
        assert time.monotonic() < deadline, f"job {job} still {slurm.job_state(job)} after scancel"
        time.sleep(0.5)
    # slurmstepd may still be reaping for a moment after the job left the queue.
    deadline = time.monotonic() + 30
    while daemons_of(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.5)
    text = read(out)
    assert daemons_of(tmp_path) == [], f"daemons left after scancel\n{text}"
    assert shm_of(job) == [], f"left in /dev/shm: {shm_of(job)}\n{text}"
    assert re.search(r"rank \d+: drained \d+ output files", text), f"no rank drained its outputs\n{text}"
    plain = tmp_path / "exported"
    export(tmp_path, mode, plain)
    got = (plain / "ckpt" / slurm_train.MODEL.format(job=job)).read_bytes()
    assert got == model_bytes(), "the checkpoint closed before scancel is not in --persist"
    assert not runtime.exists(), sorted(os.listdir(runtime))


def test_failed_training_still_drains(slurm, dataset, tmp_path):
    """Task 0 exits 3 after closing its checkpoint: the job fails with 3, the trap
    stops the daemons, the checkpoint is in --persist, nothing is left."""
    mode = "srun-pmi2-mpich"
    data, _n, _d = dataset
    job, out, r, runtime = submit(slurm, tmp_path, mode, data, fail=True)
    text = read(out)
    assert r.returncode == 3, f"sbatch --wait exited {r.returncode}, expected the training step's 3\n{text}"
    assert "daemons exited 0, job exits 3" in text, text
    plain = tmp_path / "exported"
    export(tmp_path, mode, plain)
    assert (plain / "ckpt" / slurm_train.MODEL.format(job=job)).read_bytes() == model_bytes()
    assert daemons_of(tmp_path) == []
    assert shm_of(job) == []
    assert not runtime.exists()
