"""Shared fixtures for FanStore's end-to-end tests.

The suite runs the release binaries that `scripts/test.sh` builds. Each area
keeps its helpers in its own module under tests/ (fs_prep.py, fs_daemon.py,
...); only cross-cutting fixtures live here.
"""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "target" / "release"


# FANSTORE_TEST_MPI=openmpi (tests/fs_cluster.py): the daemon built against
# OpenMPI, in its own target directory (the MPI a build links is decided
# once, when mpi-sys is built). The CLI (crate fanstore-cli) links no MPI:
# the one in target/release serves both.
OMPI_BIN = Path(os.environ.get("FANSTORE_OMPI_BIN", ROOT / "target-ompi" / "release"))


def binary(name: str, where: Path = BIN) -> str:
    p = where / name
    if not p.exists():
        how = ("`MPICC=mpicc.openmpi CARGO_TARGET_DIR=target-ompi cargo build --release -p fanstore-daemon`"
               if where == OMPI_BIN else "`cargo build --release`")
        pytest.fail(f"{p} missing: run {how} (scripts/test.sh does)")
    return str(p)


@pytest.fixture(scope="session")
def bins():
    """Paths to the release binaries and the preload library."""
    mpi_bin = OMPI_BIN if os.environ.get("FANSTORE_TEST_MPI") == "openmpi" else BIN
    return {
        "prep": binary("fanstore-prep"),
        "daemon": binary("fanstore-daemon", mpi_bin),
        "cli": binary("fanstore"),
        "preload": str(BIN / "libfanstore_preload.so"),
    }


def run(cmd, check=True, timeout=300, **kw):
    """Runs a command, capturing text output; fails the test with both streams on error."""
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and r.returncode != 0:
        pytest.fail(f"{cmd} exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
    return r


@pytest.fixture(scope="session")
def framework_python():
    """The python of the ML-framework venv that scripts/setup.sh fills
    (${FANSTORE_VENV:-/opt/fanstore-venv}: torch, transformers, accelerate,
    safetensors, ..., datasets, lmdb). Missing or broken: a failure under CI=true (CI must not
    pass without these tests), a skip with the reason elsewhere."""
    venv = Path(os.environ.get("FANSTORE_VENV", "/opt/fanstore-venv"))
    py = venv / "bin" / "python"
    why = None
    if not py.exists():
        why = f"{py} missing: run scripts/setup.sh (it creates the venv and installs the frameworks)"
    else:
        r = subprocess.run([str(py), "-c", "import torch, transformers, accelerate, safetensors, numpy, lightning, jax, orbax.checkpoint, tensorflow, filelock, datasets, pyarrow, lmdb"],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            why = f"{py} cannot import the frameworks (scripts/setup.sh installs them):\n{r.stderr[-2000:]}"
    if why:
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail(why)
        pytest.skip(why)
    return str(py)
