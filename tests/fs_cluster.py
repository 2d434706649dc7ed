"""Starting and talking to FanStore daemons in tests (real MPICH or OpenMPI, no mocks).

    cluster = start_cluster(bins, dataset, tmp_path, nranks=4)   # mpiexec -n 4
    cluster = start_cluster(bins, dataset, tmp_path, nranks=0)   # singleton, no launcher
    env = cluster.env(node=2)          # FANSTORE_* (+ LD_PRELOAD) for a client of rank 2
    with cluster.client(2) as c:       # the wire protocol, straight to rank 2's socket
        data = c.read(node_id)
    cluster.stop()                     # `fanstore stop`, asserts a clean exit (idempotent; MPICH's
                                       # finalize hang after a clean teardown is a warning, see mpich_finalize_hang)
    cluster.kill()                     # kill -9 every daemon (failure tests)

    from fs_cluster import cluster_factory   # pytest fixture: start(dataset, nranks=4, ...) -> Cluster,
                                             # every cluster stopped (or killed) at teardown

    with packed_cluster(bins, tmp, seed=3, n_files=10) as (c, src):   # make_tree + pack + start, always stopped
        ...
    cl = cluster_fixture("attrs", seed=3, n_files=10)   # a module's fixture: that cluster (module scope)

    r = c.run_python(2, code, *args)   # python -c code on node 2 (preload); check=False: no failing;
    run_python(None, 0, code)          # ... natively; run_json(c, node, code): its last line's JSON

bench/ starts its daemons here too: start_cluster(release_bins(), ...) with its own
runtime=, local=, log_path=, env= (and wrapper=, nofile=), then c.stop(check=False).

Every rank gets its own local directory (``<tmp>/local/rank-<r>``, made by the
daemon). The runtime directory is a short path under /tmp (unix socket paths
are limited to 107 bytes), removed by the daemons at stop. MPI runs over TCP
sockets (``UCX_TLS=tcp``), as between nodes.

The MPI is pinned, never whatever plain ``mpiexec`` means (Debian's
update-alternatives switches it when OpenMPI is installed next to MPICH):
``FANSTORE_TEST_MPI=mpich`` (default) runs ``/usr/bin/mpiexec.mpich`` with the
daemon of ``target/release``; ``FANSTORE_TEST_MPI=openmpi`` runs
``/usr/bin/mpiexec.openmpi`` with the daemon of ``target-ompi/release``
(``FANSTORE_OMPI_BIN`` overrides; scripts/test.sh builds it with
``MPICC=mpicc.openmpi``; the CLI links no MPI and is always
``target/release/fanstore``), over TCP (``btl=tcp,self``), and allows what OpenMPI
refuses by default in a test box (running as root, more ranks than cores).
Each cluster checks in its log that the daemons run the MPI library asked for.
"""
import contextlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

try:
    import pytest
except ImportError:  # bench/ starts its daemons here too, maybe under a python without pytest
    pytest = None

ROOT = Path(__file__).resolve().parent.parent

MPIS = {
    # name: (launcher, its extra arguments, environment, what the daemon logs as its library)
    "mpich": ("/usr/bin/mpiexec.mpich", [], {"UCX_TLS": "tcp"}, "MPICH"),
    # Unbound, as the README tells users to start the daemons: OpenMPI's
    # mpiexec binds each of 2 ranks to a core of its own by default, which
    # confines every thread of a daemon to that core (a comm thread that
    # polls only while a CPU is free then seldom may: a test of it failed
    # 1 run in 2 CIs).
    "openmpi": ("/usr/bin/mpiexec.openmpi", ["--oversubscribe", "--bind-to", "none"],
                {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                 "OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "tcp,self",
                 # Open MPI 5.0.7 (Debian 13) finds no TCP interface pairing on a
                 # dual-stack host (open-mpi/ompi#14079): IPv4 only, as between nodes.
                 "OMPI_MCA_btl_tcp_disable_family": "6"}, "Open MPI"),
}
MPI = os.environ.get("FANSTORE_TEST_MPI", "mpich")
if MPI not in MPIS:
    raise RuntimeError(f"FANSTORE_TEST_MPI={MPI!r}: expected one of {', '.join(MPIS)}")
MPIEXEC, MPIEXEC_ARGS, MPI_ENV, MPI_LIBRARY = MPIS[MPI]

# --------------------------------------------------------------------------
# wire protocol (fanstore-core/src/wire.rs)
# --------------------------------------------------------------------------

REQ = struct.Struct("<4sHHQQQII")    # magic, version, op, id, arg0, arg1, payload len, reserved
REP = struct.Struct("<4sHHQiIQII")   # magic, version, op, id, errno, flags, value, payload len, reserved
OP_PING, OP_OPEN, OP_STATUS, OP_STOP = 1, 2, 3, 4
OP_WATCH_INFO = 45
FLAG_FD = 1
MAX_MESSAGE = 64 * 1024


class WireError(OSError):
    pass


class Client:
    """One SOCK_SEQPACKET connection to a daemon rank."""

    def __init__(self, sock_path, timeout=30.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(timeout)
        self.sock.connect(str(sock_path))
        self.next_id = 1

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, op, arg0=0, arg1=0, payload=b""):
        rid = self.next_id
        self.next_id += 1
        self.sock.send(REQ.pack(b"FSRQ", 1, op, rid, arg0, arg1, len(payload), 0) + payload)
        return rid

    def recv(self):
        """Returns (errno, flags, value, payload, fd or None)."""
        msg, fds, _flags, _addr = socket.recv_fds(self.sock, MAX_MESSAGE, 4)
        if not msg:
            raise WireError("daemon closed the connection")
        magic, version, _op, _rid, errno, flags, value, plen, _ = REP.unpack_from(msg)
        assert magic == b"FSRP" and version == 1, msg[:8]
        for extra in fds[1:]:
            os.close(extra)
        return errno, flags, value, msg[REP.size:REP.size + plen], (fds[0] if fds else None)

    def call(self, op, arg0=0, arg1=0):
        self.send(op, arg0, arg1)
        return self.recv()

    def ping(self):
        errno, _f, value, _p, _fd = self.call(OP_PING)
        assert errno == 0
        return value

    def status(self) -> dict:
        errno, _f, _v, payload, _fd = self.call(OP_STATUS)
        assert errno == 0
        return dict(line.split("=", 1) for line in payload.decode().splitlines() if "=" in line)

    def watch_info(self) -> dict:
        """WATCH_INFO: {'sessions': n, 'watches': n, 'interests': n} of this rank's watch registry."""
        errno, _f, _v, payload, _fd = self.call(OP_WATCH_INFO)
        assert errno == 0
        return {k: int(v) for k, v in (kv.split("=") for kv in payload.decode().split())}

    def open_fd(self, node_id, dataset_id):
        """The fd of OPEN, or raises OSError(errno)."""
        errno, flags, _v, _p, fd = self.call(OP_OPEN, node_id, dataset_id)
        if errno:
            if fd is not None:
                os.close(fd)
            raise OSError(errno, os.strerror(errno))
        assert flags & FLAG_FD and fd is not None, "OPEN succeeded without an fd"
        return fd

    def read(self, node_id, dataset_id) -> bytes:
        fd = self.open_fd(node_id, dataset_id)
        try:
            return read_fd(fd)
        finally:
            os.close(fd)


def read_fd(fd) -> bytes:
    """Every byte of fd from offset 0 (pread: shared memfds share their offset)."""
    size = os.fstat(fd).st_size
    out = bytearray()
    while len(out) < size:
        chunk = os.pread(fd, min(size - len(out), 8 << 20), len(out))
        if not chunk:
            break
        out += chunk
    assert not os.pread(fd, 1, len(out)), "fd holds more bytes than its size"
    return bytes(out)


# --------------------------------------------------------------------------
# the index (fanstore-core/src/manifest.rs)
# --------------------------------------------------------------------------

KIND_DIR, KIND_FILE, KIND_SYMLINK = 1, 2, 3
NODE = struct.Struct("<BBBBIIIQIIQQQQqqqII")  # 96 bytes


def read_index(path) -> tuple:
    """(dataset id, {path: node dict}) of a manifest or shared-memory index."""
    b = Path(path).read_bytes()
    assert b[:8] == b"FANSTMF\0", f"{path}: not a manifest"
    dataset_id, nnodes = struct.unpack_from("<QQ", b, 16)
    secs = [struct.unpack_from("<QQQ", b, 56 + 24 * i) for i in range(5)]
    noff = secs[0][0]
    soff = secs[4][0]
    nodes = {}
    for i in range(nnodes):
        (kind, codec, flags, _r, mode, parent, name_len, path_off, path_len, aux32, size, loc, stored,
         checksum, mtime, atime, ctime, nlink, _r2) = NODE.unpack_from(b, noff + i * NODE.size)
        p = b[soff + path_off:soff + path_off + path_len].decode("utf-8", "surrogateescape")
        nodes[p] = dict(id=i, kind=kind, codec=codec, flags=flags, mode=mode, size=size, partition=aux32,
                        payload_offset=loc, stored_len=stored, mtime_ns=mtime, nlink=nlink)
    return dataset_id, nodes


# --------------------------------------------------------------------------
# clusters
# --------------------------------------------------------------------------

def base_env() -> dict:
    env = dict(os.environ)
    for k, v in MPI_ENV.items():
        env.setdefault(k, v)
    env.setdefault("RUST_LOG", "info")
    return env


class Cluster:
    """Started daemons. ``nranks`` counts ranks (a singleton is 1)."""

    def __init__(self, bins, proc, runtime: Path, local: Path, nranks: int, mount: str, log_path: Path):
        self.bins = bins
        self.proc = proc
        self.runtime = runtime
        self.local = local
        self.nranks = nranks
        self.mount = mount
        self.log_path = log_path
        self._done = False

    # --- clients -----------------------------------------------------------
    def env(self, node: int = 0, preload: bool = True) -> dict:
        env = base_env()
        env["FANSTORE_RUNTIME_DIR"] = str(self.runtime)
        env["FANSTORE_NODE"] = str(node)
        env["FANSTORE_MOUNT"] = self.mount
        if preload:
            env["LD_PRELOAD"] = str(self.bins.get("preload", ROOT / "target/release/libfanstore_preload.so"))
        else:
            env.pop("LD_PRELOAD", None)
        return env

    def socket(self, rank: int) -> Path:
        return self.runtime / f"node-{rank}.sock"

    def client(self, rank: int = 0, timeout=30.0) -> Client:
        return Client(self.socket(rank), timeout)

    def run_python(self, node: int, code: str, *args, **kw) -> subprocess.CompletedProcess:
        """fs_cluster.run_python on this cluster's `node`."""
        return run_python(self, node, code, *args, **kw)

    def watch_info(self, rank: int) -> dict:
        """Client.watch_info of `rank`."""
        with self.client(rank) as c:
            return c.watch_info()

    def index_path(self, rank: int = 0) -> Path:
        return Path(node_state(self.runtime, rank)["index_path"])

    def cli(self, *args, timeout=120, check=True):
        r = subprocess.run([self.bins["cli"], "--runtime-dir", str(self.runtime), *args],
                           capture_output=True, text=True, timeout=timeout, env=base_env())
        if check and r.returncode != 0:
            raise AssertionError(f"fanstore {' '.join(args)} exited {r.returncode}\n{r.stdout}\n{r.stderr}\n"
                                 f"--- daemon log ---\n{self.log()}")
        return r

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-20000:]
        except OSError:
            return ""

    def pids(self) -> list:
        out = []
        for r in range(self.nranks):
            with contextlib.suppress(Exception):
                out.append(node_state(self.runtime, r)["pid"])
        return out

    # --- ending ------------------------------------------------------------
    def stop(self, timeout=60, check=True):
        """`fanstore stop`, waits for every daemon, asserts exit code 0. Idempotent.
        ``check=False`` (bench/): asserts nothing, kills a job still running after
        ``timeout``; returns the launcher's exit code (None when killed or stopped before)."""
        if self._done:
            return None
        self._done = True
        if not check:
            self.cli("stop", "--timeout", str(timeout), timeout=timeout + 30, check=False)
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._kill_all()
                return None
        try:
            self.cli("stop", "--timeout", str(timeout), timeout=timeout + 30)
            rc = self.proc.wait(timeout=timeout)
        except BaseException:
            self._kill_all()
            raise
        if rc != 0 and mpich_finalize_hang(self.log_path, self.nranks):
            import warnings
            warnings.warn(f"mpiexec exited {rc} after the MPICH 4.0 finalize hang (README, Known issue; "
                          f"pmodels/mpich#6596): every rank stopped cleanly, then one never left MPI_Finalize "
                          f"and its watchdog ended it ({self.log_path})")
            return rc
        assert rc == 0, f"daemons exited {rc}\n{self.log()}"
        return rc

    def kill(self, keep_local=False) -> None:
        """kill -9 every daemon (and the launcher), then remove what they left behind
        (but the local directory with ``keep_local``)."""
        if self._done:
            return
        self._done = True
        self._kill_all(keep_local)

    def _kill_all(self, keep_local=False):
        shm = []
        for r in range(self.nranks):
            with contextlib.suppress(Exception):
                st = node_state(self.runtime, r)
                shm.append(st["index_path"])
                os.kill(st["pid"], signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=30)
        for p in shm:
            if p.startswith("/dev/shm/") and p.endswith(".index"):
                stem = p[:-len(".index")]
                # The host's polling board (fanstore-daemon/src/comm/spin.rs) has no rank.
                for leftover in (p, stem + ".tiers", stem.rsplit("-r", 1)[0] + ".polling"):
                    with contextlib.suppress(OSError):
                        os.unlink(leftover)
                shutil.rmtree(stem + ".copies", ignore_errors=True)
        shutil.rmtree(self.runtime, ignore_errors=True)
        if not keep_local:
            shutil.rmtree(self.local, ignore_errors=True)


def node_state(runtime, rank: int) -> dict:
    """Decodes `node-<rank>.state` (fanstore-core/src/runtime.rs)."""
    b = (Path(runtime) / f"node-{rank}.state").read_bytes()
    assert b[:8] == b"FANSTND\0", "bad magic"
    _v, r, nranks, status, dataset, pid, nparts, flags = struct.unpack_from("<IIIIQQII", b, 8)
    lens = struct.unpack_from("<IIII", b, 48)
    off = 64
    strs = []
    for n in lens:
        strs.append(b[off:off + n].decode("utf-8", "surrogateescape"))
        off += n
    bits = b[off:off + (nparts + 7) // 8]
    return dict(rank=r, nranks=nranks, status=status, dataset_id=dataset, pid=pid, flags=flags,
                local_dir=strs[0], index_path=strs[1], hostname=strs[2], mount=strs[3],
                local=[p for p in range(nparts) if bits[p // 8] & (1 << (p % 8))])


def wait_ranks_gone(runtime, nranks: int, timeout=30) -> None:
    """Waits until no rank's process (from its state file) exists. OpenMPI's
    mpiexec can exit after a failed rank while the others are still exiting
    (MPICH's waits for all of them), and they then linger as zombies until
    init reaps them."""
    deadline = time.monotonic() + timeout
    for r in range(nranks):
        try:
            pid = node_state(runtime, r)["pid"]
        except Exception:
            continue
        while time.monotonic() < deadline:
            # Gone, not a zombie: `fanstore stop` tells a live rank with kill(pid, 0).
            if not os.path.exists(f"/proc/{pid}"):
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"rank {r} (pid {pid}) still running {timeout} s after its launcher exited")


def limit_fds(n):
    """A preexec_fn that sets RLIMIT_NOFILE in the child: ``n`` for soft and hard (as
    `ulimit -n n`), or a (soft, hard) pair."""
    import resource
    soft, hard = n if isinstance(n, tuple) else (n, n)

    def set_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return set_limit


@contextlib.contextmanager
def tmpfs_local_dir(tmp_path: Path, size: str, why: str):
    """Mounts a tmpfs of `size` at tmp_path/local, the local dir that
    start_cluster(.., tmp_path) gives its daemons (skips the test when it
    cannot be mounted: `why` names what it stands for); unmounts after."""
    local = tmp_path / "local"
    local.mkdir(parents=True)
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(local)], capture_output=True, text=True)
    if m.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs as {why}: {m.stderr.strip()}")
    try:
        yield local
    finally:
        subprocess.run(["umount", "-l", str(local)], capture_output=True)


def launch(bins, dataset: Path, tmp_path: Path, nranks=4, mount="/fanstore", extra_args=(), nofile=None,
           runtime=None, local=None, env=None, wrapper=(), log_path=None, log_mode="wb"):
    """Starts the daemons without waiting: returns (proc, runtime, local, log path).
    ``nofile``: the launcher and the daemons run under `ulimit -n nofile`.
    ``runtime``, ``local``: the directories (default: a new runtime directory
    under /tmp, ``tmp_path/local``). ``env``: variables added to the daemons'
    environment (base_env). ``wrapper``: a command each rank runs the daemon
    through (its arguments follow), e.g. a `taskset` per rank. ``log_path``:
    where the launcher's output goes (default: tmp_path/daemons-<runtime>.log),
    opened with ``log_mode`` ("ab" appends)."""
    tmp_path = Path(tmp_path)
    tmp_path.mkdir(parents=True, exist_ok=True)
    runtime = Path(runtime) if runtime else Path(tempfile.mkdtemp(prefix="fsrt-", dir="/tmp"))
    local = Path(local) if local else tmp_path / "local"
    log_path = Path(log_path) if log_path else tmp_path / f"daemons-{runtime.name}.log"
    cmd = [*map(str, wrapper), bins["daemon"], "--data", str(dataset), "--local", str(local),
           "--runtime-dir", str(runtime), "--mount", mount, *map(str, extra_args)]
    if nranks:
        if not os.access(MPIEXEC, os.X_OK):
            _fail(f"{MPIEXEC} missing (FANSTORE_TEST_MPI={MPI}): run scripts/setup.sh")
        cmd = [MPIEXEC, *MPIEXEC_ARGS, "-n", str(nranks), *cmd]
    with open(log_path, log_mode) as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=dict(base_env(), **(env or {})), start_new_session=True,
                                preexec_fn=limit_fds(nofile) if nofile else None)
    return proc, runtime, local, log_path


def _fail(msg):
    """Fails the test (pytest.fail), or raises RuntimeError outside pytest (bench/)."""
    if pytest is not None:
        pytest.fail(msg)
    raise RuntimeError(msg)


def start_cluster(bins, dataset: Path, tmp_path: Path, nranks=4, mount="/fanstore", extra_args=(),
                  timeout=60, nofile=None, check_mpi=True, **launch_kw) -> Cluster:
    """`mpiexec -n nranks fanstore-daemon ...` (nranks == 0: a singleton with no launcher),
    then `fanstore wait`. Fails with the daemons' log if they do not get ready.
    ``check_mpi``: check_mpi_library (it reads the daemons' info lines: off for
    daemons whose RUST_LOG hides them). ``launch_kw``: launch's ``runtime``,
    ``local``, ``env``, ``wrapper``, ``log_path``, ``log_mode``."""
    proc, runtime, local, log_path = launch(bins, dataset, tmp_path, nranks, mount, extra_args, nofile, **launch_kw)
    c = Cluster(bins, proc, runtime, local, max(nranks, 1), mount, log_path)
    r = subprocess.run([bins["cli"], "--runtime-dir", str(runtime), "wait", "--timeout", str(timeout)],
                       capture_output=True, text=True, timeout=timeout + 30, env=base_env())
    if r.returncode != 0:
        c.kill()
        raise AssertionError(f"daemons did not get ready: {r.stderr.strip()}\n--- log ---\n{c.log()}")
    if check_mpi:
        check_mpi_library(c)
    return c


def release_bins() -> dict:
    """The binaries as the tests' `bins` fixture (tests/conftest.py) names them,
    not checked (for bench/): target/release, and under FANSTORE_TEST_MPI=openmpi
    the daemon of target-ompi/release (FANSTORE_OMPI_BIN)."""
    rel = ROOT / "target" / "release"
    ompi = Path(os.environ.get("FANSTORE_OMPI_BIN", ROOT / "target-ompi" / "release"))
    return {"prep": str(rel / "fanstore-prep"), "daemon": str((ompi if MPI == "openmpi" else rel) / "fanstore-daemon"),
            "cli": str(rel / "fanstore"), "preload": str(rel / "libfanstore_preload.so")}


def mpich_finalize_hang(log_path: Path, nranks: int) -> bool:
    """Whether a job's non-zero exit is MPICH 4.0.2's hang in MPI_Finalize over
    UCX/TCP and nothing of ours: under MPICH, every rank logged the end of its
    clean teardown (the line written just before MPI_Finalize), no daemon logged
    an error, and a rank's finalize watchdog fired. scripts/mpi_finalize_check.sh
    shows the same hang with a 5-line MPI program; it is fixed upstream."""
    if MPI != "mpich":
        return False
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return False
    return ("MPI_Finalize did not return within" in text
            and all(f"rank {r}: served " in text for r in range(nranks))
            and " ERROR " not in text)


def check_mpi_library(c: Cluster) -> None:
    """Every rank logged the MPI library FANSTORE_TEST_MPI asked for, in a world of
    ``nranks`` (a daemon built against the other MPI runs as N singletons, or not at
    all). Ranks' lines may interleave in the log (OpenMPI forwards output in pieces)."""
    import re
    with open(c.log_path, "rb") as f:
        head = f.read(1 << 20).decode(errors="replace")  # the version lines come first
    seen = {(int(r), int(n), lib.startswith(MPI_LIBRARY))
            for r, n, lib in re.findall(r"rank (\d+)/(\d+): (.{0,12})", head)}
    want = {(r, c.nranks, True) for r in range(c.nranks)}
    if seen != want:
        c.kill()
        raise AssertionError(f"FANSTORE_TEST_MPI={MPI}: expected ranks 0..{c.nranks - 1} of {c.nranks} on "
                             f"{MPI_LIBRARY}, the daemons logged (rank, size, right library): {sorted(seen)} "
                             f"(the check reads their info lines: RUST_LOG={base_env()['RUST_LOG']})\n"
                             f"--- log ---\n{c.log()}")


def run_python(c, node, code, *args, check=True, timeout=120, python=sys.executable, env=None,
               **kw) -> subprocess.CompletedProcess:
    """Runs `python -c code args...` (`code` dedented; `args` as str) on `node` of
    cluster `c` with the preload library, or natively (the test's own
    environment) when `c` is None. ``env``: variables added to that
    environment. ``kw``: more of subprocess.run (``input``, ``cwd``, ...).
    With ``check`` a non-zero exit fails the test with both streams and the
    daemons' log. Returns the CompletedProcess (text)."""
    run_env = c.env(node) if c is not None else None
    if env:
        run_env = dict(run_env if run_env is not None else os.environ, **env)
    r = subprocess.run([python, "-c", textwrap.dedent(code), *map(str, args)], env=run_env, capture_output=True,
                       text=True, timeout=timeout, **kw)
    if check and r.returncode != 0:
        _fail(f"node {node}: exit {r.returncode}\nstdout:\n{r.stdout[-5000:]}\nstderr:\n{r.stderr[-5000:]}"
                    + (f"\n--- daemon log tail ---\n{c.log()[-4000:]}" if c is not None else " (natively)"))
    return r


def run_json(c, node, code, *args, **kw):
    """run_python, and the JSON value its last stdout line prints."""
    import json
    return json.loads(run_python(c, node, code, *args, **kw).stdout.strip().splitlines()[-1])


def run_ranks(c, nodes, code, *args, python=sys.executable, rank_args=None, timeout=600) -> list:
    """`python -c code rank world port args... [rank_args[rank]...]` as ranks
    0..len(nodes)-1 of one torch.distributed job (gloo over loopback, the
    port in argv[3]), rank i on node nodes[i] of cluster `c` (natively when
    `c` is None). The JSON value of each rank's last stdout line; a rank
    that fails fails the test with its output and the daemons' log."""
    import json
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = []
    for rank, node in enumerate(nodes):
        env = c.env(node) if c else dict(os.environ)
        env.update(OMP_NUM_THREADS="1")
        extra = [str(a) for a in rank_args[rank]] if rank_args else []
        procs.append(subprocess.Popen([python, "-c", textwrap.dedent(code), str(rank), str(len(nodes)), port,
                                       *map(str, args), *extra],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    for rank, p in enumerate(procs):
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, (f"rank {rank} on node {nodes[rank]} exited {p.returncode}; its last output: "
                                   f"{out.strip()[-300:]!r}\n{err[-4000:]}\n" + (c.log()[-2000:] if c else ""))
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


def packed_dataset(bins, tmp: Path, kind="mixed", n_files=8, seed=0, partitions=4, prep_args=()) -> tuple:
    """(src, data): fs_prep.make_tree(tmp/src, kind, n_files, seed) packed into
    tmp/data in `partitions` partitions (plus `prep_args` for `fanstore-prep pack`)."""
    from fs_prep import make_tree, pack
    tmp = Path(tmp)
    src = make_tree(tmp / "src", kind, n_files=n_files, seed=seed)
    pack(bins, src, tmp / "data", "--partitions", str(partitions), *map(str, prep_args))
    return src, tmp / "data"


@contextlib.contextmanager
def packed_cluster(bins, tmp: Path, kind="mixed", n_files=8, seed=0, partitions=4, nranks=4, mount="/fanstore",
                   extra_args=(), prep_args=()):
    """A dataset packed (packed_dataset) and a cluster of `nranks` daemons
    started over it (start_cluster in tmp/cl): yields (cluster, src), and
    stops the cluster at the end, whatever happened."""
    src, data = packed_dataset(bins, tmp, kind, n_files, seed, partitions, prep_args)
    c = start_cluster(bins, data, Path(tmp) / "cl", nranks=nranks, mount=mount, extra_args=extra_args)
    try:
        yield c, src
    finally:
        c.stop()


def cluster_fixture(name: str, scope="module", **kw):
    """A pytest fixture of the Cluster of packed_cluster(bins, <a new temporary
    directory `name`>, **kw), for a module to assign to its fixture's name:
    ``cl = cluster_fixture("attrs", seed=3, n_files=10, mount=MOUNT)``."""
    @pytest.fixture(scope=scope)
    def fixture(bins, tmp_path_factory):
        with packed_cluster(bins, tmp_path_factory.mktemp(name), **kw) as (c, _src):
            yield c
    return fixture


if pytest is not None:  # (bench/ imports this module without pytest)
    @pytest.fixture
    def cluster_factory(bins, tmp_path):
        """start(dataset, nranks=4, ...) -> Cluster; every cluster is stopped (or killed) at teardown."""
        started = []

        def start(dataset, nranks=4, mount="/fanstore", extra_args=(), timeout=60, subdir=None, nofile=None):
            c = start_cluster(bins, dataset, tmp_path / (subdir or f"c{len(started)}"), nranks, mount, extra_args,
                              timeout, nofile)
            started.append(c)
            return c

        yield start
        for c in started:
            try:
                c.stop()
            except Exception:
                c.kill()
                raise
