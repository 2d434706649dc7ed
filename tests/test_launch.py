"""The README's launch lines for the training step, run for real.

Daemons under the MPI of FANSTORE_TEST_MPI (tests/fs_cluster.py); the
training tasks (tests/slurm_train.py, not MPI programs) are started by
MPICH's `mpiexec -genv LD_PRELOAD ...` and by OpenMPI's
`mpiexec -x LD_PRELOAD=...`, exactly as the README shows them. Each task
reads the whole dataset through /fanstore; task 0 writes a checkpoint that
the other task reads. The Slurm line (`srun --export=ALL,LD_PRELOAD=...`) is
run by tests/test_slurm.py through scripts/fanstore-job.sbatch.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from fs_cluster import MPIS, packed_cluster

sys.path.insert(0, str(Path(__file__).parent))
import slurm_train  # noqa: E402

TRAIN = Path(__file__).parent / "slurm_train.py"
# launcher: (README text, command with {so} for the preload library)
LINES = {
    "mpich": ("mpiexec -n 4 -genv LD_PRELOAD $FS/libfanstore_preload.so python train.py",
              ["/usr/bin/mpiexec.mpich", "-n", "2", "-genv", "LD_PRELOAD", "{so}"]),
    "openmpi": ("mpiexec -n 4 -x LD_PRELOAD=$FS/libfanstore_preload.so python train.py",
                ["/usr/bin/mpiexec.openmpi", "--oversubscribe", "-n", "2", "-x", "LD_PRELOAD={so}"]),
}


@pytest.fixture(scope="module")
def cl(bins, tmp_path_factory):
    with packed_cluster(bins, tmp_path_factory.mktemp("launch"), "images", n_files=30, seed=21, nranks=2) as (c, src):
        yield c, slurm_train.dataset_digest(str(src))


def test_readme_shows_each_line():
    readme = (ROOT / "README.md").read_text()
    for name, (line, _cmd) in LINES.items():
        assert line in readme, f"README lost the {name} launch line: {line}"
    assert "srun --export=ALL,LD_PRELOAD=$FS/libfanstore_preload.so python train.py" in readme
    job = (ROOT / "scripts" / "fanstore-job.sbatch").read_text()
    assert re.search(r"^srun --export=ALL,LD_PRELOAD=\"\$FANSTORE_BIN/libfanstore_preload.so\"", job, re.M), \
        "the job script's training step is not the README's srun line"


@pytest.mark.parametrize("launcher", list(LINES))
def test_launch_line(cl, bins, launcher):
    c, (nfiles, digest) = cl
    _line, cmd = LINES[launcher]
    if not os.access(cmd[0], os.X_OK):
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: {cmd[0]} missing (scripts/setup.sh installs it)")
        pytest.skip(f"{cmd[0]} missing: run scripts/setup.sh")
    env = c.env(0, preload=False)
    env.update(MPIS[launcher][2])  # OpenMPI as root in a test box, over TCP
    env["FANSTORE_TEST_JOB"] = f"launch-{launcher}"
    argv = [a.format(so=bins["preload"]) for a in cmd] + [sys.executable, str(TRAIN), c.mount]
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"{argv} exited {r.returncode}\n{out}\n--- daemons ---\n{c.log()[-3000:]}"
    tasks = re.findall(r"task (\d+) node \S+ files (\d+) digest ([0-9a-f]{64})", out)
    assert sorted(int(t[0]) for t in tasks) == [0, 1], out
    assert all((int(t[1]), t[2]) == (nfiles, digest) for t in tasks), out
    assert "task 1 read checkpoint ok" in out, out
