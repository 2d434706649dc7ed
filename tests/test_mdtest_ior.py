"""mdtest and IOR (the IO500 tools) through /fanstore on 4 nodes (issue 53).

4 daemons (4 simulated nodes), 4 mdtest/IOR ranks, rank i a client of node
i (tests/fs_rank.sh picks FANSTORE_NODE from the MPI rank). Each run must exit
0 with no error line; IOR's -W/-R data checks (with -C: a rank checks the
file another rank, on another node, wrote) must find 0 wrong bytes, and
every file IOR kept (-k) must have its exact size through the preload
library, from every node. Small sizes (~1 minute on 2 cores, most of it
daemon starts); the speed is bench/mdtest_bench.py's, no timing here.

IOR and mdtest are built once from the pinned tarball (tests/ior_build.py:
FANSTORE_IOR_TARBALL, else ../shared/third_party/ior-*.tar.gz) into
/var/tmp/fanstore-ior; with no tarball the test skips, unless CI is set.

IOR's shared-file mode (every rank writing its block of one file) is an
expected failure: an output is one writer's file until its close (each
open(O_CREAT) writes its own unnamed file, the last close wins:
docs/posix.md), so three ranks' blocks are lost. strict: the day it passes,
this test says so.
"""
import os
import re
import subprocess
from pathlib import Path

import pytest

import ior_build
from fs_cluster import packed_dataset, run_json

ROOT = Path(__file__).resolve().parent.parent
FS_RANK = ROOT / "tests" / "fs_rank.sh"
MPIEXEC = "/usr/bin/mpiexec.mpich"
NODES = 4
XFER = 47008               # IO500's "hard" transfer size
BLOCK = XFER * 8           # per rank
ERROR_RE = re.compile(r"(?i)\b(error|fail|abort|incorrect|cannot|bad termination)")


@pytest.fixture(scope="module")
def tools():
    try:
        return ior_build.build(ior_build.find_tarball())
    except ior_build.TarballMissing as e:
        if os.environ.get("CI"):
            pytest.fail(f"{e} (CI=true: a missing tool is a failure)")
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def cluster(bins, tmp_path_factory):
    import fs_cluster
    tmp = tmp_path_factory.mktemp("mdtest")
    _src, data = packed_dataset(bins, tmp, n_files=4)
    c = fs_cluster.start_cluster(bins, data, tmp / "cl", nranks=NODES)
    try:
        fs_cluster.run_python(c, 0, "import os; os.makedirs('/fanstore/io500', exist_ok=True)")
        yield c
    except BaseException:
        c.kill()
        raise
    else:
        c.stop()


def mpirun(c, bins, tool, *args, timeout=300):
    """`mpiexec -n 4 fs_rank.sh TOOL args` with rank i on node i: the output (stdout + stderr)."""
    env = c.env(0, preload=False)
    # Their MPI only synchronises the ranks: no UCX_TLS=tcp (MPICH 4.0.2 can hang
    # in MPI_Finalize over it, scripts/mpi_finalize_check.c).
    env.pop("UCX_TLS", None)
    env.update(FS_PRELOAD=bins["preload"], FS_RANKS_PER_NODE="1")
    cmd = [MPIEXEC, "-n", str(NODES), str(FS_RANK), tool, *map(str, args)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    out = r.stdout + r.stderr
    errors = [line for line in out.splitlines() if ERROR_RE.search(line) and not line.lstrip().startswith("Command line")]
    assert r.returncode == 0 and not errors, (
        f"{' '.join(cmd)}: exit {r.returncode}, error lines {errors}\n{out[-6000:]}\n--- daemons ---\n{c.log()[-4000:]}")
    return out


@pytest.mark.parametrize("unique", [True, False], ids=["unique-dirs", "shared-dir"])
def test_mdtest_hard_size(cluster, bins, tools, unique):
    """mdtest -F -n 50 -w 3901 -e 3901 (every file written, stated, read back, removed), with -u and without."""
    d = f"/fanstore/io500/md-{'u' if unique else 's'}"
    out = mpirun(cluster, bins, tools["mdtest"], "-F", "-n", 50, "-w", 3901, "-e", 3901, *(["-u"] if unique else []),
                 "-d", d)
    rates = {m.group(1): float(m.group(2)) for m in
             re.finditer(r"^\s*File (creation|stat|read|removal)\s+[\d.]+\s+[\d.]+\s+([\d.]+)", out, re.M)}
    assert set(rates) == {"creation", "stat", "read", "removal"} and all(v > 0 for v in rates.values()), out[-3000:]
    # mdtest removed what it made: nothing is left under its directory.
    left = run_json(cluster, 1, f"import json, os; print(json.dumps([f for _, _, fs in os.walk({d!r}) for f in fs]))")
    assert left == []


@pytest.mark.parametrize("mode", [
    "file-per-process",
    pytest.param("shared-file", marks=pytest.mark.xfail(
        strict=True, reason="an output has one writer until its close: N ranks writing one file keep the last "
                            "closer's block only (docs/posix.md, issue 53)")),
])
def test_ior_data_checks_and_sizes(cluster, bins, tools, mode):
    """IOR -w -r -C -W -R -k, -t 47008: 0 data errors, and every file's exact size on every node."""
    fpp = mode == "file-per-process"
    base = f"/fanstore/io500/ior-{mode}"
    out = mpirun(cluster, bins, tools["ior"], "-a", "POSIX", *(["-F"] if fpp else []), "-w", "-r", "-C", "-W", "-R",
                 "-k", "-O", "numTasksOnNode0=1", "-t", XFER, "-b", BLOCK, "-o", base)
    assert "Incorrect data" not in out, out[-4000:]
    assert re.search(r"^write\s+[\d.]+", out, re.M) and re.search(r"^read\s+[\d.]+", out, re.M), out[-4000:]
    want = {f"{base}.{r:08d}": BLOCK for r in range(NODES)} if fpp else {base: BLOCK * NODES}
    for node in range(NODES):
        sizes = run_json(cluster, node, "import json, os, sys; "
                         "print(json.dumps({p: os.stat(p).st_size for p in sys.argv[1:]}))", *want)
        assert sizes == want, f"node {node}"
