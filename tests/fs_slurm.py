"""A real one-machine Slurm cluster for tests (Debian's slurm-wlm 22.05 + munge).

    with SlurmCluster(tmp_dir, nodes=2, cpus=4) as sl:    # munged, slurmctld, one slurmd per node
        r = sl.run(["sbatch", "--wait", script])          # SLURM_CONF set

Everything runs as root from a private directory: its own munge key and
socket, slurm.conf, state, spool and logs, free TCP ports. Several nodes are
emulated on this host with Slurm's multiple-slurmd mode (one `slurmd -N nX`
per node, each on its own port; `NodeHostname` is this host). Process
tracking is proctrack/linuxproc (no cgroups needed), so `scancel` signals and
then kills every process of a step. At exit every daemon started here is
stopped by its pid.
"""
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

TOOLS = ["munged", "slurmctld", "slurmd", "sbatch", "srun", "scancel", "squeue", "sinfo", "scontrol"]


def require_slurm():
    """Skips outside CI when Slurm is not installed or not root; fails in CI (CI=true)."""
    missing = [t for t in TOOLS if not shutil.which(t, path=os.environ.get("PATH", "") + ":/usr/sbin")]
    why = None
    if missing:
        why = f"Slurm/munge missing ({', '.join(missing)}): run scripts/setup.sh"
    elif os.geteuid() != 0:
        why = "the one-machine Slurm cluster runs slurmd as root"
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: {why}")
        pytest.skip(why)


def free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def tool(name):
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin") or name


class SlurmCluster:
    def __init__(self, root: Path, nodes=2, cpus=4, kill_wait=30):
        self.root = Path(root)
        if nodes < 2:
            raise ValueError("nodes >= 2 (n[1-N] in slurm.conf)")
        self.nodes = [f"n{i + 1}" for i in range(nodes)]
        self.cpus = cpus
        self.kill_wait = kill_wait
        self.procs = []
        self.conf = self.root / "slurm.conf"

    # --- set-up --------------------------------------------------------------
    def __enter__(self):
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _start(self):
        r = self.root
        for d in ["state", *(f"spool/{n}" for n in self.nodes), *(f"tmp-{n}" for n in self.nodes)]:
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r, 0o755)  # munge checks the socket directory's permissions
        key = r / "munge.key"
        key.write_bytes(os.urandom(128))
        os.chmod(key, 0o400)
        self.munge_sock = r / "munge.sock"
        self._spawn("munged", [tool("munged"), "--foreground", "--force", f"--socket={self.munge_sock}",
                               f"--key-file={key}", f"--log-file={r}/munged.log", f"--pid-file={r}/munged.pid",
                               f"--seed-file={r}/munged.seed"])
        self._until(lambda: self.munge_sock.exists(), 30, "munged did not create its socket")
        ctld, slurmd = free_ports(2)
        # One port per emulated node (multiple-slurmd): a contiguous range.
        base = self._free_range(len(self.nodes))
        host = socket.gethostname()
        hi = base + len(self.nodes) - 1
        self.conf.write_text(f"""\
ClusterName=fanstoretest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld}
SlurmdPort={slurmd}
AuthType=auth/munge
AuthInfo=socket={self.munge_sock}
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd-%n.log
TmpFS={r}/tmp-%n
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait={self.kill_wait}
InactiveLimit=0
NodeName=n[1-{len(self.nodes)}] NodeHostname={host} NodeAddr=127.0.0.1 Port={base}-{hi} CPUs={self.cpus} State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        self._spawn("slurmctld", [tool("slurmctld"), "-D", "-f", str(self.conf)])
        for n in self.nodes:
            self._spawn(f"slurmd-{n}", [tool("slurmd"), "-D", "-f", str(self.conf), "-N", n])

        def idle():
            r = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
            states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
            return all(states.get(n) == "idle" for n in self.nodes)
        self._until(idle, 60, "the Slurm nodes did not become idle")

    def _free_range(self, n):
        for _ in range(50):
            base = free_ports(1)[0]
            if base + n >= 65535:
                continue
            try:
                socks = []
                for p in range(base, base + n):
                    s = socket.socket()
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind(("0.0.0.0", p))
                    socks.append(s)
            except OSError:
                continue
            finally:
                for s in socks:
                    s.close()
            return base
        raise RuntimeError("no free port range")

    def _spawn(self, name, cmd):
        log = open(self.root / f"{name}.stderr", "wb")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        log.close()
        self.procs.append((name, p))

    def _until(self, cond, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs:
                if p.poll() is not None:
                    raise AssertionError(f"{name} exited {p.returncode}\n{self.logs()}")
            if cond():
                return
            time.sleep(0.3)
        raise AssertionError(f"{what} within {timeout} s\n{self.logs()}")

    # --- use -----------------------------------------------------------------
    def env(self, **extra) -> dict:
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        for k in [k for k in env if k.startswith("SLURM_") and k != "SLURM_CONF"]:
            del env[k]
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def run(self, cmd, check=True, timeout=120, env=None, **kw):
        r = subprocess.run([tool(cmd[0]), *map(str, cmd[1:])], capture_output=True, text=True, timeout=timeout,
                           env=env or self.env(), **kw)
        if check and r.returncode != 0:
            raise AssertionError(f"{cmd} exited {r.returncode}\n{r.stdout}\n{r.stderr}\n{self.logs()}")
        return r

    def job_state(self, job_id) -> str:
        """The job's state from squeue ('' once it left the queue)."""
        r = self.run(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False)
        return r.stdout.strip() if r.returncode == 0 else ""

    def logs(self, tail=4000) -> str:
        out = []
        for f in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.stderr")):
            try:
                out.append(f"--- {f.name} ---\n{f.read_text(errors='replace')[-tail:]}")
            except OSError:
                pass
        return "\n".join(out)

    # --- teardown --------------------------------------------------------------
    def close(self):
        """Cancels what is still queued or running, stops slurmd, slurmctld, then
        munged (which they need until they are gone), and kills by pid any process
        of this cluster still left (a slurmstepd whose job outlived its slurmd)."""
        if any(name == "slurmctld" and p.poll() is None for name, p in self.procs):
            deadline = time.monotonic() + self.kill_wait + 30
            while time.monotonic() < deadline:
                r = self.run(["squeue", "-h", "-o", "%i"], check=False)
                jobs = r.stdout.split()
                if r.returncode != 0 or not jobs:
                    break
                self.run(["scancel", *jobs], check=False)
                time.sleep(0.5)
        for _name, p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        self.procs = []
        mark = f"SLURM_CONF={self.conf}".encode()
        for d in Path("/proc").glob("[0-9]*"):
            try:
                if mark in d.joinpath("environ").read_bytes().split(b"\0"):
                    os.kill(int(d.name), signal.SIGKILL)
            except (OSError, ValueError):
                pass
