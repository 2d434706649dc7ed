"""This node's FanStore daemon, from Python: where it is and one request.

The daemons of a job publish themselves in a runtime directory
(`FANSTORE_RUNTIME_DIR`, else `$TMPDIR/fanstore-<uid>-<job id>`): per rank
`node-<rank>.sock` (a SOCK_SEQPACKET unix socket) and `node-<rank>.state`
(fanstore-core/src/runtime.rs). A program uses rank `FANSTORE_NODE`, else
the lowest rank on its host, as the preload library does. Requests and
replies are fanstore-core/src/wire.rs's: a 40-byte header, a payload, at
most one fd attached (SCM_RIGHTS).
"""
import errno as _errno
import os
import socket
import struct
import threading

REQ = struct.Struct("<4sHHQQQII")    # magic, version, op, id, arg0, arg1, payload len, reserved
REP = struct.Struct("<4sHHQiIQII")   # magic, version, op, id, errno, flags, value, payload len, reserved
OP_COMMIT = 5
OP_CKPT = 14
OP_CKPT_PUT = 46
COMMIT_EXCL = 1
FLAG_FD = 1
MAX_MESSAGE = 64 * 1024
STATE_MAGIC = b"FANSTND\0"
STATUS_READY = 1
FLAG_DEDUP = 1 << 1
TIMEOUT = float(os.environ.get("FANSTORE_TIMEOUT_MS", "600000")) / 1000.0


def job_id() -> str:
    for var in ("FANSTORE_JOB_ID", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "COBALT_JOBID"):
        v = os.environ.get(var)
        if v:
            clean = "".join(c if c.isascii() and (c.isalnum() or c in "-_") else "_" for c in v)
            if clean:
                return clean
    return "local"


def runtime_dir() -> str:
    d = os.environ.get("FANSTORE_RUNTIME_DIR")
    if d:
        return d
    return os.path.join(os.environ.get("TMPDIR", "/tmp"), f"fanstore-{os.getuid()}-{job_id()}")


def read_state(path: str):
    """A node state file as a dict, or None if it is not a whole, valid one."""
    try:
        with open(path, "rb") as f:
            b = f.read()
    except OSError:
        return None
    if len(b) < 72 or b[:8] != STATE_MAGIC:
        return None
    _v, rank, nranks, status, _dataset, pid, _nparts, flags = struct.unpack_from("<IIIIQQII", b, 8)
    lens = struct.unpack_from("<IIII", b, 48)
    off, strs = 64, []
    for n in lens:
        strs.append(b[off:off + n])
        off += n
    return dict(rank=rank, nranks=nranks, status=status, pid=pid, flags=flags,
                hostname=strs[2].decode("utf-8", "surrogateescape"), mount=strs[3].decode("utf-8", "surrogateescape"))


class Daemon:
    """The daemon this process uses: its rank, pid, mount, socket."""

    def __init__(self, rundir: str, state: dict):
        self.rundir = rundir
        self.rank = state["rank"]
        self.pid = state["pid"]
        self.dedup = bool(state["flags"] & FLAG_DEDUP)
        self.mount = os.environ.get("FANSTORE_MOUNT") or state["mount"] or "/fanstore"
        self.socket_path = os.path.join(rundir, f"node-{self.rank}.sock")

    @property
    def identity(self):
        """What a cache of this daemon's store is valid for (a restarted
        daemon may have another store)."""
        return (self.socket_path, self.pid)

    def relative(self, path: str):
        """`path` (absolute or relative to the cwd) relative to the mount,
        as the daemon takes paths; None if it is outside the mount."""
        p = os.path.normpath(os.path.abspath(os.fspath(path)))
        m = os.path.normpath(self.mount)
        if p == m:
            return ""
        if not p.startswith(m.rstrip("/") + "/"):
            return None
        return p[len(m.rstrip("/")) + 1:]


def find() -> "Daemon | None":
    """The daemon of this process's node, if a job's daemons are running and ready."""
    rundir = runtime_dir()
    if not os.path.isdir(rundir):
        return None
    want = os.environ.get("FANSTORE_NODE")
    states = []
    for name in os.listdir(rundir):
        if name.startswith("node-") and name.endswith(".state"):
            s = read_state(os.path.join(rundir, name))
            if s is not None:
                states.append(s)
    states.sort(key=lambda s: s["rank"])
    if want is not None and want.strip().isdigit():
        pick = [s for s in states if s["rank"] == int(want)]
    else:
        host = socket.gethostname()
        pick = [s for s in states if s["hostname"] == host] or states[:1]
    if not pick or pick[0]["status"] != STATUS_READY:
        return None
    return Daemon(rundir, pick[0])


class Connection:
    """One connection to a daemon (a lock makes it safe to share between threads)."""

    def __init__(self, daemon: Daemon):
        self.daemon = daemon
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self.sock.settimeout(TIMEOUT)
        self.sock.connect(daemon.socket_path)
        self.next_id = 1
        self.lock = threading.Lock()
        self.pid = os.getpid()

    def close(self):
        self.sock.close()

    def call(self, op: int, arg0=0, arg1=0, payload=b"", fd=None):
        """(errno, value, payload, fd or None) of one request."""
        with self.lock:
            rid = self.next_id
            self.next_id += 1
            msg = REQ.pack(b"FSRQ", 1, op, rid, arg0, arg1, len(payload), 0) + payload
            if fd is None:
                self.sock.send(msg)
            else:
                socket.send_fds(self.sock, [msg], [fd])
            data, fds, _f, _a = socket.recv_fds(self.sock, MAX_MESSAGE, 4)
        if not data:
            raise ConnectionAbortedError(_errno.ECONNABORTED, "the FanStore daemon closed the connection")
        magic, version, _op, got, err, flags, value, plen, _ = REP.unpack_from(data)
        for extra in fds[1:]:
            os.close(extra)
        if magic != b"FSRP" or version != 1 or got != rid:
            for f in fds[:1]:
                os.close(f)
            raise ConnectionError("a malformed reply from the FanStore daemon")
        return err, value, data[REP.size:REP.size + plen], (fds[0] if fds and flags & FLAG_FD else None)
