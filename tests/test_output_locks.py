"""Advisory locks on outputs: flock, fcntl record locks and lockf exclude the
processes of one node (a lock file per path in the node's client directory);
processes on different nodes do not exclude each other (documented in the
README). Checked with raw calls, with a read-modify-write counter that
loses updates without the lock, and with the `filelock` package (what HF
hub, datasets and torch's caches use)."""
import json
import subprocess
import sys
import textwrap

import pytest

from fs_cluster import cluster_fixture, run_json

MOUNT = "/fanstore"

# Holder: takes the lock named by argv (flock / fcntl range / lockf), says
# "held", then waits for a line on stdin before releasing it.
HOLDER = r"""
import fcntl, os, sys
path, how = sys.argv[1], sys.argv[2]
os.makedirs(os.path.dirname(path), exist_ok=True)
if how == "dir":
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
else:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
if how in ("flock", "dir"):
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
elif how == "dupflock":
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    fd2 = os.dup(fd)
    os.close(fd)          # the dup still holds the same lock
    fd = fd2
elif how == "range":
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0)    # bytes 0..9
print("held", flush=True)
sys.stdin.readline()
os.close(fd)
print("released", flush=True)
"""

PROBE = r"""
import errno, fcntl, json, os, sys
path, how = sys.argv[1], sys.argv[2]
out = {}
def attempt(key, f):
    try:
        f(); out[key] = "OK"
    except OSError as e:
        out[key] = errno.errorcode[e.errno]
if how == "dir":
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    attempt("flock", lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB))
    other = os.open(sys.argv[3], os.O_RDONLY | os.O_DIRECTORY)
    attempt("other dir", lambda: fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB))
else:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    attempt("flock", lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB))
    attempt("shared", lambda: fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB))
    attempt("range 10..19", lambda: fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 10))
    attempt("range 5..14", lambda: fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 5))
    attempt("range 0..9", lambda: fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0))
print(json.dumps(out, sort_keys=True))
"""

COUNTER = r"""
import fcntl, os, sys
root, n = sys.argv[1], int(sys.argv[2])
lock = os.path.join(root, "counter.lock")
for _ in range(n):
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    p = os.path.join(root, "counter")
    v = int(open(p).read()) if os.path.exists(p) else 0
    with open(p, "w") as f:
        f.write(str(v + 1))
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
"""

FILELOCK = r"""
import os, sys, time
from filelock import FileLock, Timeout
root, who, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
log = os.path.join(root, "log")
for i in range(n):
    with FileLock(os.path.join(root, "log.lock"), timeout=60):
        old = open(log).read() if os.path.exists(log) else ""
        time.sleep(0.002)
        with open(log, "w") as f:
            f.write(old + f"{who}:{i}\n")
"""


cl = cluster_fixture("locks", seed=4, n_files=6, mount=MOUNT)


def probe(env, *args):
    """PROBE's answers, run with `env` added to the test's environment."""
    return run_json(None, 0, PROBE, *args, env=env, timeout=60)


def held(env, path, how):
    """A holder process that has the lock (its stdin releases it)."""
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(HOLDER), path, how], env=env, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = p.stdout.readline().strip()
    assert line == "held", p.stderr.read()
    return p


def release(p):
    p.stdin.write("\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == "released"
    p.wait(timeout=30)


@pytest.mark.parametrize("how", ["flock", "dupflock", "range"])
def test_locks_exclude_processes_of_a_node_as_natively(cl, tmp_path, how):
    """The same holder and probe natively and on one node of /fanstore."""
    answers = []
    for root, env in ((str(tmp_path / "native"), None), (f"{MOUNT}/locks-{how}", cl.env(1))):
        h = held(env, f"{root}/f.lock", how)
        try:
            answers.append(probe(env, f"{root}/f.lock", "file"))
        finally:
            release(h)
        answers.append(probe(env, f"{root}/f.lock", "file"))  # after release: all free
    native_held, native_free, ours_held, ours_free = answers
    assert native_held["flock"] == ("OK" if how == "range" else "EAGAIN"), native_held
    assert native_free == {k: "OK" for k in native_free}
    assert ours_held == native_held and ours_free == native_free


def test_directory_locks_are_per_directory(cl, tmp_path):
    answers = []
    for root, env in ((tmp_path / "native", None), (f"{MOUNT}/dlocks", cl.env(2))):
        if env is None:
            (root / "a").mkdir(parents=True)
            (root / "b").mkdir()
        else:
            subprocess.run([sys.executable, "-c", f"import os; os.makedirs('{root}/a'); os.makedirs('{root}/b')"],
                           env=env, check=True, timeout=60)
        h = held(env, f"{root}/a", "dir")
        try:
            answers.append(probe(env, f"{root}/a", "dir", f"{root}/b"))
        finally:
            release(h)
    assert answers[0] == {"flock": "EAGAIN", "other dir": "OK"}
    assert answers[1] == answers[0]


def test_other_nodes_do_not_see_a_nodes_locks(cl):
    """Documented: locks are node-local (each node has its own lock files)."""
    h = held(cl.env(0), f"{MOUNT}/xnode/f.lock", "flock")
    try:
        same = probe(cl.env(0), f"{MOUNT}/xnode/f.lock", "file")
        other = probe(cl.env(3), f"{MOUNT}/xnode/f.lock", "file")
    finally:
        release(h)
    assert same["flock"] == "EAGAIN" and other["flock"] == "OK"


def test_a_locked_read_modify_write_loses_no_update(cl):
    root = f"{MOUNT}/counter"
    subprocess.run([sys.executable, "-c", f"import os; os.makedirs('{root}')"], env=cl.env(0), check=True, timeout=60)
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(COUNTER), root, "25"], env=cl.env(0),
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()
    r = subprocess.run(["cat", f"{root}/counter"], env=cl.env(2), capture_output=True, text=True, timeout=60)
    assert r.stdout == "100", (r.stdout, r.stderr)


def test_filelock_package_serialises_writers_of_a_node(cl, framework_python):
    root = f"{MOUNT}/filelock"
    subprocess.run([sys.executable, "-c", f"import os; os.makedirs('{root}')"], env=cl.env(1), check=True, timeout=60)
    procs = [subprocess.Popen([framework_python, "-c", textwrap.dedent(FILELOCK), root, str(w), "15"], env=cl.env(1),
                              stderr=subprocess.PIPE, text=True) for w in range(3)]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()
    r = subprocess.run(["cat", f"{root}/log"], env=cl.env(1), capture_output=True, text=True, timeout=60)
    lines = r.stdout.split()
    assert sorted(lines) == sorted(f"{w}:{i}" for w in range(3) for i in range(15)), r.stdout


EXCL = r"""
import errno, json, os, signal, subprocess, sys, time
root = sys.argv[1]
os.makedirs(root, exist_ok=True)
p = os.path.join(root, "pid.lock")
out = {}
def excl(path):
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        return "OK"
    except OSError as e:
        return errno.errorcode[e.errno]
# another process holds an exclusive create open (not yet closed)
holder = subprocess.Popen([sys.executable, "-c", "import os, sys; fd = os.open(sys.argv[1], os.O_CREAT | os.O_EXCL | os.O_WRONLY); "
                           "print('open', flush=True); sys.stdin.readline(); os.close(fd)", p],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
assert holder.stdout.readline().strip() == "open"
out["second excl while open"] = excl(p)
holder.stdin.write("\n"); holder.stdin.flush(); holder.wait()
out["excl after close"] = excl(p)
# a creator killed before its close leaves nothing that blocks the name
q = os.path.join(root, "killed.lock")
k = subprocess.Popen([sys.executable, "-c", "import os, sys, time; os.open(sys.argv[1], os.O_CREAT | os.O_EXCL | os.O_WRONLY); "
                      "print('open', flush=True); time.sleep(60)", q], stdout=subprocess.PIPE, text=True)
assert k.stdout.readline().strip() == "open"
k.send_signal(signal.SIGKILL); k.wait()
out["excl after a killed creator"] = excl(q)
print(json.dumps(out, sort_keys=True))
"""


def test_exclusive_create_is_decided_at_open_among_a_nodes_processes(cl, tmp_path):
    native = subprocess.run([sys.executable, "-c", textwrap.dedent(EXCL), str(tmp_path / "n")], capture_output=True,
                            text=True, timeout=120)
    assert native.returncode == 0, native.stderr
    ours = subprocess.run([sys.executable, "-c", textwrap.dedent(EXCL), f"{MOUNT}/excl"], env=cl.env(2),
                          capture_output=True, text=True, timeout=120)
    assert ours.returncode == 0, ours.stderr
    # Natively a killed creator leaves its file; through FanStore a process killed before its
    # close commits nothing (README), so the name stays free: its marker must not block it.
    native, ours = json.loads(native.stdout), json.loads(ours.stdout)
    assert native == {"excl after a killed creator": "EEXIST", "excl after close": "EEXIST", "second excl while open": "EEXIST"}
    assert ours == dict(native, **{"excl after a killed creator": "OK"})
