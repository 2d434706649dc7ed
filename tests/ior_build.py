"""IOR and mdtest (the IO500 tools, github.com/hpc/ior), built once from the
pinned source tarball into a scratch directory, never into the repository
(issue 53). Used by tests/test_mdtest_ior.py and bench/mdtest_bench.py.

    from ior_build import find_tarball, build, TarballMissing
    tools = build(find_tarball())     # {"ior": path, "mdtest": path, "dir": build dir}

The tarball: FANSTORE_IOR_TARBALL, else ior-*.tar.gz in the third-party
directory beside the project (../shared/third_party, as for pjdfstest), else
TarballMissing (the test skips unless CI is set). The build, keyed by the
tarball's name, goes to /var/tmp/fanstore-ior/<name>/ (FANSTORE_IOR_CACHE):
./bootstrap && ./configure CC=mpicc.mpich && make, under a lock so that
parallel runs build it once. IOR links the MPI it is launched with: MPICH
(FANSTORE_IOR_MPICC overrides the compiler).
"""
import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("FANSTORE_IOR_CACHE", "/var/tmp/fanstore-ior"))
MPICC = os.environ.get("FANSTORE_IOR_MPICC", "/usr/bin/mpicc.mpich")


class BuildError(RuntimeError):
    """The tools could not be built (a tool missing, a build failure)."""


class TarballMissing(BuildError):
    """No IOR source on this machine."""


def find_tarball() -> Path:
    import third_party
    try:
        found = third_party.find_tarball("ior", "FANSTORE_IOR_TARBALL")
    except FileNotFoundError as e:
        raise BuildError(str(e)) from e
    if found is None:
        raise TarballMissing(f"no IOR source: no ior-*.tar.gz in {', '.join(map(str, third_party.DIRS))} "
                             f"and FANSTORE_IOR_TARBALL unset")
    return found


def check_tools():
    need = {"autoreconf": "autoconf", "automake": "automake", "make": "make", MPICC: "mpich (mpicc.mpich)"}
    missing = [f"{t} ({pkg})" for t, pkg in need.items() if not shutil.which(t)]
    if missing:
        raise BuildError("missing: " + ", ".join(missing) + ": run `bash scripts/setup.sh`")


def build(tarball: Path, cache_root: Path = CACHE, log=print) -> dict:
    """{"ior", "mdtest", "dir"} of the build of `tarball` (built once per tarball name)."""
    stem = tarball.name[:-len(".tar.gz")] if tarball.name.endswith(".tar.gz") else tarball.stem
    dest = cache_root / stem
    tools = {"ior": str(dest / "inst" / "bin" / "ior"), "mdtest": str(dest / "inst" / "bin" / "mdtest"),
             "dir": str(dest)}
    if (dest / ".built").exists():
        return tools
    check_tools()
    cache_root.mkdir(parents=True, exist_ok=True)
    with open(cache_root / f".{stem}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (dest / ".built").exists():
            return tools
        t0 = time.monotonic()
        log(f"building {tarball.name} into {dest} (once)")
        scratch = Path(tempfile.mkdtemp(prefix=f".{stem}-", dir=cache_root))
        try:
            subprocess.run(["tar", "xf", str(tarball), "-C", str(scratch)], check=True)
            (src,) = [p for p in scratch.iterdir() if p.is_dir()]
            # configure bakes its --prefix in: build where the tree will stay.
            shutil.rmtree(dest, ignore_errors=True)
            os.rename(src, dest)
            env = dict(os.environ, CC=MPICC, MPICC=MPICC)
            jobs = str(min(2, os.cpu_count() or 1))
            for cmd in (["./bootstrap"], ["./configure", f"--prefix={dest}/inst"],
                        ["nice", "-n", "19", "make", "-j", jobs], ["make", "install"]):
                r = subprocess.run(cmd, cwd=dest, capture_output=True, text=True, env=env)
                if r.returncode != 0:
                    raise BuildError(f"IOR build: {' '.join(cmd)} exited {r.returncode}\n"
                                     f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
            for t in ("ior", "mdtest"):
                if not os.access(tools[t], os.X_OK):
                    raise BuildError(f"IOR build: {tools[t]} missing after make install")
            (dest / ".built").write_text(f"{tarball}\n")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        log(f"built in {time.monotonic() - t0:.0f} s")
    return tools


if __name__ == "__main__":
    print(build(find_tarball()))
