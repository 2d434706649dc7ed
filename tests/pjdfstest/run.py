#!/usr/bin/env python3
"""pjdfstest, the POSIX file-system conformance suite, on a FanStore cluster (issue 55).

    python3 tests/pjdfstest/run.py                 # the whole suite, compared with expected-failures.txt
    python3 tests/pjdfstest/run.py --update        # ... then rewrite expected-failures.txt from this run
    python3 tests/pjdfstest/run.py --only chmod/ --only open/0   # only the .t files whose path starts so
    python3 tests/pjdfstest/run.py --user pjdtest  # as an unprivileged user (made if missing, removed after)

What it does:

1. builds pjdfstest from FANSTORE_PJDFSTEST_TARBALL, else the third-party
   tarball beside the project (CI), else upstream's archive of the pinned
   commit downloaded once into the cache (on a machine with neither and no
   network the pytest skips, and fails under CI=true) once into a cache directory keyed by the
   tarball's name (/var/tmp/fanstore-pjdfstest/<name>/, or
   FANSTORE_PJDFSTEST_CACHE): autoreconf -ifs && ./configure && make;
2. starts a 4-rank cluster of the release daemons (tests/fs_cluster.py,
   packed_cluster), makes /fanstore/pjdfstest, and runs
   `prove -r -j JOBS --exec 'sh wrap.sh' <build>/tests` in it with
   LD_PRELOAD (and FANSTORE_RUNTIME_DIR) set for prove and every child;
   wrap.sh runs each .t under `timeout` on rank (its number % 4) and keeps
   its TAP (stdout and stderr in order) in the log directory;
3. parses every file's TAP: each subtest passes ("ok N", or "not ok N # TODO",
   a failure pjdfstest itself expects on Linux), fails ("not ok N"), or
   crashes (a "not ok N" just after the shell reported a call killed by a
   signal: "Segmentation fault", ...); a file ends abnormally ("file-crash")
   when it timed out, died of a signal, exited non-zero or ran fewer
   subtests than its plan;
4. compares with the expected-failures file: every failing subtest must be
   listed (with the same outcome, fail or crash) and every listed one must
   still fail, so the list can only shrink. Exit 0 when they agree, 1 when
   not (2: the run could not be made).

The expected-failures file (tests/pjdfstest/expected-failures.txt) groups
entries by reason:

    ## <reason: the cause, e.g. "chown to another uid: EPERM, ownership not implemented (issue 55)">
    # free comment lines (kept by --update)
    chown/00.t 5-12,15          subtests 5 to 12 and 15 of tests/chown/00.t fail
    open/21.t 3 crash           subtest 3's pjdfstest call dies of a signal
    mkfifo/03.t file-crash      the file itself ends abnormally (timeout, signal, bad plan)

Ranges are exact: "5-12" is the subtests 5, 6, ..., 12 and nothing else.
--update keeps the reason of each entry still failing and puts the new ones
under "## REASON?" for a human to fill in.
"""
import argparse
import fcntl
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))

EXPECTED = HERE / "expected-failures.txt"
EXPECTED_USER = HERE / "expected-failures-user.txt"
WRAP = HERE / "wrap.sh"
NEW_REASON = "REASON?"
FILE_CRASH = "file-crash"

# What dash prints when a command it waited for died of a signal.
SIGNAL_MSG = re.compile(r"^(?:.*: )?(Segmentation fault|Aborted|Bus error|Illegal instruction|"
                        r"Floating point exception|Killed|Trace/breakpoint trap|Bad system call|"
                        r"Memory fault|Terminated|User defined signal [12]|Quit)(?: \(core dumped\))?\s*$")
TAP = re.compile(r"^(not )?ok (\d+)\b(.*)$")
PLAN = re.compile(r"^1\.\.(\d+)")


class HarnessError(Exception):
    """The run could not be made (no tarball, a tool missing, a build failure)."""


# --------------------------------------------------------------------------
# building pjdfstest
# --------------------------------------------------------------------------

# The pinned upstream commit (the tarball beside the project is this commit).
PJDFSTEST_COMMIT = "85a8aea9e685999ef0540392fd80535f873d7ff7"
PJDFSTEST_URL = f"https://github.com/pjd/pjdfstest/archive/{PJDFSTEST_COMMIT}.tar.gz"


class TarballMissing(HarnessError):
    """No pjdfstest source here and none could be downloaded (an offline machine)."""


def find_tarball(cache_root: Path, log=print) -> Path:
    """The pinned pjdfstest source: FANSTORE_PJDFSTEST_TARBALL, else the
    tarball in the third-party directory beside the project (CI, this
    project's machines), else one downloaded once into `cache_root` from
    upstream at the pinned commit (a user's clone)."""
    import third_party
    dirs = third_party.DIRS
    try:
        found = third_party.find_tarball("pjdfstest", "FANSTORE_PJDFSTEST_TARBALL")
    except FileNotFoundError as e:
        raise HarnessError(str(e)) from e
    if found is not None:
        return found
    cached = cache_root / f"pjdfstest-{PJDFSTEST_COMMIT[:12]}.tar.gz"
    if cached.is_file():
        return cached
    log(f"downloading pjdfstest {PJDFSTEST_COMMIT[:12]} from {PJDFSTEST_URL}")
    try:
        import urllib.request
        cache_root.mkdir(parents=True, exist_ok=True)
        part = cached.with_suffix(".part")
        with urllib.request.urlopen(PJDFSTEST_URL, timeout=60) as r, open(part, "wb") as f:
            shutil.copyfileobj(r, f)
        part.rename(cached)
        return cached
    except OSError as e:
        raise TarballMissing(f"no pjdfstest source: none in {', '.join(map(str, dirs))}, FANSTORE_PJDFSTEST_TARBALL "
                             f"unset, and {PJDFSTEST_URL} could not be fetched ({e})") from e


def check_tools():
    need = {"autoreconf": "autoconf", "automake": "automake", "make": "make", "cc": "gcc", "prove": "perl",
            "openssl": "openssl (pjdfstest's namegen)", "timeout": "coreutils", "setpriv": "util-linux"}
    missing = [f"{t} ({pkg})" for t, pkg in need.items() if not shutil.which(t)]
    if missing:
        raise HarnessError("missing: " + ", ".join(missing) + ": run `bash scripts/setup.sh`")


def build(tarball: Path, cache_root: Path, log=print) -> Path:
    """The built pjdfstest tree (its `pjdfstest` binary and `tests/`), built once per tarball name."""
    stem = tarball.name[:-len(".tar.gz")] if tarball.name.endswith(".tar.gz") else tarball.stem
    dest = cache_root / stem
    if (dest / ".built").exists():
        return dest
    cache_root.mkdir(parents=True, exist_ok=True)
    os.chmod(cache_root, 0o755)
    with open(cache_root / f".{stem}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (dest / ".built").exists():
            return dest
        t0 = time.monotonic()
        log(f"building {tarball.name} into {dest} (once)")
        scratch = Path(tempfile.mkdtemp(prefix=f".{stem}-", dir=cache_root))
        try:
            subprocess.run(["tar", "xf", str(tarball), "-C", str(scratch)], check=True)
            (src,) = [p for p in scratch.iterdir() if p.is_dir()]
            for cmd in (["autoreconf", "-ifs"], ["./configure"], ["make"]):
                r = subprocess.run(cmd, cwd=src, capture_output=True, text=True)
                if r.returncode != 0:
                    raise HarnessError(f"pjdfstest build: {' '.join(cmd)} exited {r.returncode}\n"
                                       f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
            (src / ".built").write_text(f"{tarball}\n")
            shutil.rmtree(dest, ignore_errors=True)
            os.chmod(src, 0o755)
            os.rename(src, dest)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        log(f"built in {time.monotonic() - t0:.0f} s")
    return dest


# --------------------------------------------------------------------------
# ranges and the expected-failures file
# --------------------------------------------------------------------------

def parse_spec(spec: str) -> list:
    out = []
    for part in spec.split(","):
        a, _, b = part.partition("-")
        lo, hi = int(a), int(b or a)
        if hi < lo:
            raise ValueError(f"bad range {part}")
        out.extend(range(lo, hi + 1))
    return out


def format_spec(nums) -> str:
    nums = sorted(set(nums))
    parts, i = [], 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        parts.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ",".join(parts)


class Expected:
    """The expected-failures file: {(file, n): (outcome, reason)}, {file: reason} of file crashes,
    the order of reasons, the header and each reason's comment lines (kept by --update)."""

    def __init__(self):
        self.subtests = {}
        self.files = {}
        self.reasons = []
        self.header = []
        self.comments = defaultdict(list)

    @classmethod
    def load(cls, path: Path) -> "Expected":
        e = cls()
        if not path.exists():
            return e
        reason = None
        for lineno, raw in enumerate(path.read_text().splitlines(), 1):
            line = raw.strip()
            where = f"{path}:{lineno}"
            if line.startswith("##"):
                reason = line[2:].strip()
                if not reason:
                    raise ValueError(f"{where}: empty reason")
                if reason in e.reasons:
                    raise ValueError(f"{where}: reason {reason!r} given twice")
                e.reasons.append(reason)
                continue
            if not line or line.startswith("#"):
                (e.comments[reason] if reason is not None else e.header).append(raw)
                continue
            if reason is None:
                raise ValueError(f"{where}: an entry before the first '## reason' line")
            words = line.split()
            if len(words) == 2 and words[1] == FILE_CRASH:
                if words[0] in e.files:
                    raise ValueError(f"{where}: {words[0]} {FILE_CRASH} listed twice")
                e.files[words[0]] = reason
                continue
            if len(words) not in (2, 3) or (len(words) == 3 and words[2] != "crash"):
                raise ValueError(f"{where}: expected 'FILE SUBTESTS [crash]' or 'FILE {FILE_CRASH}', got {line!r}")
            outcome = "crash" if len(words) == 3 else "fail"
            try:
                nums = parse_spec(words[1])
            except ValueError as ex:
                raise ValueError(f"{where}: {ex}") from None
            for n in nums:
                if (words[0], n) in e.subtests:
                    raise ValueError(f"{where}: {words[0]} subtest {n} listed twice")
                e.subtests[(words[0], n)] = (outcome, reason)
        return e

    def render(self) -> str:
        by_reason = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
        for (f, n), (outcome, reason) in self.subtests.items():
            by_reason[reason][f][outcome].append(n)
        file_crashes = defaultdict(list)
        for f, reason in self.files.items():
            file_crashes[reason].append(f)
        out = list(self.header)
        while out and not out[-1].strip():
            out.pop()
        for reason in self.reasons:
            if reason not in by_reason and reason not in file_crashes:
                continue
            out += ["", f"## {reason}"]
            out += [c for c in self.comments.get(reason, []) if c.strip()]
            for f in sorted(file_crashes.get(reason, [])):
                out.append(f"{f} {FILE_CRASH}")
            for f in sorted(by_reason.get(reason, {})):
                for outcome in ("fail", "crash"):
                    nums = by_reason[reason][f].get(outcome)
                    if nums:
                        out.append(f"{f} {format_spec(nums)}" + (" crash" if outcome == "crash" else ""))
        return "\n".join(out).lstrip("\n") + "\n"


# --------------------------------------------------------------------------
# one file's TAP
# --------------------------------------------------------------------------

class FileResult:
    def __init__(self, name):
        self.name = name
        self.plan = None
        self.outcomes = {}       # n -> "pass" | "fail" | "crash"
        self.lines = {}          # n -> its TAP line (for a failure)
        self.signals = {}        # n -> the signal message before it
        self.todo = 0
        self.exit = None
        self.ms = None
        self.crash = None        # why the file ended abnormally, or None

    @property
    def missing(self) -> int:
        return max(0, (self.plan or 0) - len([n for n in self.outcomes if n <= (self.plan or 0)]))


def parse_log(name: str, text: str, timeout: int) -> FileResult:
    r = FileResult(name)
    pending_signal = None
    for line in text.splitlines():
        m = TAP.match(line)
        if m:
            n = int(m.group(2))
            rest = m.group(3)
            todo = bool(re.match(r"\s*#\s*TODO\b", rest, re.I))
            if m.group(1) and not todo:
                r.outcomes[n] = "crash" if pending_signal else "fail"
                r.lines[n] = line
                if pending_signal:
                    r.signals[n] = pending_signal
            else:
                r.outcomes[n] = "pass"
                r.todo += todo
            pending_signal = None
            continue
        m = PLAN.match(line)
        if m and r.plan is None:
            r.plan = int(m.group(1))
            continue
        if line.startswith("# pjd-exit "):
            r.exit = int(line.split()[2])
            continue
        if line.startswith("# pjd-ms "):
            r.ms = int(line.split()[2])
            continue
        m = SIGNAL_MSG.match(line)
        if m:
            pending_signal = m.group(1)
    if r.exit is None:
        r.crash = "no exit status (the wrapper was killed)"
    elif r.exit in (124, 137) and r.ms is not None and r.ms >= timeout * 1000:
        r.crash = f"timeout after {timeout} s"
    elif r.exit > 128:
        r.crash = f"killed by signal {r.exit - 128}"
    elif r.exit != 0:
        r.crash = f"exit status {r.exit}"
    elif r.plan is None:
        r.crash = "no plan"
    elif r.missing:
        r.crash = f"ran {r.plan - r.missing} of {r.plan} subtests"
    return r


# --------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------

def test_files(tree: Path, only) -> list:
    files = sorted(str(p.relative_to(tree / "tests")) for p in (tree / "tests").rglob("*.t"))
    if only:
        files = [f for f in files if any(f.startswith(o) for o in only)]
    return files


def ensure_user(name: str, log=print):
    """(uid, gid, made): the user, made with useradd when missing (removed after the run)."""
    try:
        pw = pwd.getpwnam(name)
        return pw.pw_uid, pw.pw_gid, False
    except KeyError:
        pass
    subprocess.run(["useradd", "--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", name],
                   check=True)
    log(f"made the throwaway user {name} (removed after the run)")
    pw = pwd.getpwnam(name)
    return pw.pw_uid, pw.pw_gid, True


def escapes(local: Path) -> list:
    """What the tests made in the real stand-in directories of virtual cwds
    (<local>/rank-R/.client/cwd/*, empty and read-only, but root writes there
    anyway): (path, is a socket) of each, relative to `local`. A socket is
    bind(2) of a relative path, which the library does not intercept."""
    out = []
    for standin in sorted(local.glob("rank-*/.client/cwd/*")):
        for dirpath, dirs, names in os.walk(standin):
            for name in dirs + names:
                p = Path(dirpath) / name
                out.append((str(p.relative_to(local)), stat.S_ISSOCK(p.lstat().st_mode)))
    return out


NATIVE_REASON = "fails natively too: the same subtest run by this user in a directory of the local disk"


def run_native(tree: Path, files: list, logs: Path, jobs: int, timeout: int, user: str, log=print) -> dict:
    """The baseline of a `--user` run: prove over `files` run by `user` in a
    native directory of the local disk (no library): {file: FileResult}.
    pjdfstest is written for root, so many of its subtests fail for any other
    user on any file system; those are what FanStore must match."""
    uid, gid, _ = ensure_user(user, log)
    logs.mkdir(parents=True, exist_ok=True)
    os.chmod(logs, 0o777)
    index = logs / "files.txt"
    index.write_text("".join(f + "\n" for f in files))
    work = Path(tempfile.mkdtemp(prefix="pjdfstest-native-", dir="/var/tmp"))
    os.chmod(work, 0o777)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FANSTORE_") and k != "LD_PRELOAD"}
        env.update(PJD_TESTS=str(tree / "tests"), PJD_LOGS=str(logs), PJD_INDEX=str(index),
                   PJD_TIMEOUT=str(timeout), PJD_DIR=str(work))
        env.pop("PJD_NODES", None)
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--init-groups", "prove", "-j", str(jobs),
               "--exec", f"sh {WRAP}", *[str(tree / "tests" / f) for f in files]]
        p = subprocess.run(cmd, env=env, cwd=logs, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           errors="replace", timeout=max(1800, timeout * len(files) // max(jobs, 1) + 600))
        (logs / "prove.log").write_text(p.stdout)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {f: parse_log(f, (logs / (f.replace("/", "_") + ".log")).read_text(errors="replace")
                         if (logs / (f.replace("/", "_") + ".log")).exists() else "", timeout) for f in files}


def with_native(expected: "Expected", native: dict) -> "Expected":
    """`expected` (FanStore's own differences) plus every subtest that
    failed in the native run, under NATIVE_REASON."""
    for f, r in native.items():
        for n, outcome in r.outcomes.items():
            if outcome != "pass" and (f, n) not in expected.subtests:
                expected.subtests[(f, n)] = (outcome, NATIVE_REASON)
        if r.crash and f not in expected.files:
            expected.files[f] = NATIVE_REASON
    if NATIVE_REASON not in expected.reasons:
        expected.reasons.append(NATIVE_REASON)
    return expected


def run_suite(tree: Path, files: list, logs: Path, jobs: int, timeout: int, nranks: int, user=None,
              log=print) -> tuple:
    """Starts the cluster, runs prove over `files` in /fanstore/pjdfstest, returns ({file: FileResult}, seconds, prove's output)."""
    from fs_cluster import packed_cluster, release_bins
    bins = release_bins()
    for k, p in bins.items():
        if not Path(p).exists():
            raise HarnessError(f"{p} missing: build with `cargo build --release --workspace` (scripts/test.sh does)")
    logs.mkdir(parents=True, exist_ok=True)
    index = logs / "files.txt"
    index.write_text("".join(f + "\n" for f in files))
    uid = gid = None
    made_user = False
    if user:
        uid, gid, made_user = ensure_user(user, log)
        os.chmod(logs, 0o777)
    work = Path(tempfile.mkdtemp(prefix="pjdfstest-cluster-", dir="/var/tmp"))
    # Every uid's processes reach the ranks' local directories (their O_EXCL
    # markers, lock files, cwd stand-ins), as under a root daemon's --local.
    os.chmod(work, 0o755)
    try:
        with packed_cluster(bins, work, n_files=4, nranks=nranks) as (c, _src):
            out = f"{c.mount}/pjdfstest"
            env = c.env(0)
            r = subprocess.run(["mkdir", out], env=env, capture_output=True, text=True)
            if r.returncode != 0:
                raise HarnessError(f"mkdir {out} through the preload library: {r.stderr}")
            setpriv = []
            if user:
                # The other user must reach the daemons' sockets and write the directory under test.
                os.chmod(c.runtime, 0o755)
                for sock in c.runtime.glob("*.sock"):
                    os.chmod(sock, 0o777)
                r = subprocess.run(["chmod", "0777", out], env=env, capture_output=True, text=True)
                if r.returncode != 0:
                    raise HarnessError(f"chmod 0777 {out}: {r.stderr}")
                setpriv = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--init-groups"]
            env.update(PJD_TESTS=str(tree / "tests"), PJD_LOGS=str(logs), PJD_INDEX=str(index),
                       PJD_TIMEOUT=str(timeout), PJD_NODES=str(c.nranks), PJD_DIR=out)
            cmd = [*setpriv, "prove", "-j", str(jobs), "--exec", f"sh {WRAP}",
                   *[str(tree / "tests" / f) for f in files]]
            t0 = time.monotonic()
            p = subprocess.run(cmd, env=env, cwd=logs, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               errors="replace", timeout=max(1800, timeout * len(files) // max(jobs, 1) + 600))
            secs = time.monotonic() - t0
            (logs / "prove.log").write_text(p.stdout)
            escaped = escapes(c.local)
            (logs / "outside-the-mount.txt").write_text("".join(f"{'socket' if sock else 'other'} {p}\n"
                                                                for p, sock in escaped))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if made_user:
            subprocess.run(["userdel", user], capture_output=True)
    results = {}
    for f in files:
        lp = logs / (f.replace("/", "_") + ".log")
        text = lp.read_text(errors="replace") if lp.exists() else ""
        results[f] = parse_log(f, text, timeout)
    return results, secs, escaped


# --------------------------------------------------------------------------
# comparing and reporting
# --------------------------------------------------------------------------

class Comparison:
    def __init__(self, results: dict, expected: Expected, escaped=()):
        self.results = results
        self.sockets = [p for p, sock in escaped if sock]
        self.escaped = [p for p, sock in escaped if not sock]
        self.expected = expected
        self.total = self.passed = self.todo = self.not_run = 0
        self.expected_fail = []     # (file, n, outcome)
        self.new_fail = []          # (file, n, outcome, was: None | outcome)
        self.newly_passing = []     # (file, n, was outcome)
        self.file_crash_expected = []
        self.file_crash_new = []
        self.file_crash_gone = []
        ran = set(results)
        for f, r in sorted(results.items()):
            self.total += r.plan or len(r.outcomes)
            self.not_run += r.missing
            self.todo += r.todo
            for n, outcome in sorted(r.outcomes.items()):
                want = expected.subtests.get((f, n))
                if outcome == "pass":
                    self.passed += 1
                    if want:
                        self.newly_passing.append((f, n, want[0]))
                elif want and want[0] == outcome:
                    self.expected_fail.append((f, n, outcome))
                else:
                    self.new_fail.append((f, n, outcome, want[0] if want else None))
            if r.crash:
                (self.file_crash_expected if f in expected.files else self.file_crash_new).append(f)
            elif f in expected.files:
                self.file_crash_gone.append(f)
        # Listed subtests of a file that ran, but that the file never reached (it ended early).
        self.listed_not_reached = [(f, n) for (f, n) in expected.subtests
                                   if f in ran and n not in results[f].outcomes]

    @property
    def ok(self) -> bool:
        return not (self.new_fail or self.newly_passing or self.file_crash_new or self.file_crash_gone
                    or self.escaped)

    def crashes(self):
        return [(f, n) for f, r in self.results.items() for n, o in r.outcomes.items() if o == "crash"]

    def updated(self) -> Expected:
        """The expected file this run says: reasons kept, new entries under REASON?."""
        old = self.expected
        e = Expected()
        e.header = old.header or default_header()
        e.comments = old.comments
        e.reasons = list(old.reasons)
        for f, r in self.results.items():
            for n, outcome in r.outcomes.items():
                if outcome != "pass":
                    was = old.subtests.get((f, n))
                    e.subtests[(f, n)] = (outcome, was[1] if was else NEW_REASON)
            if r.crash:
                e.files[f] = old.files.get(f, NEW_REASON)
        # Files this run did not cover (--only) keep their entries.
        for (f, n), v in old.subtests.items():
            if f not in self.results:
                e.subtests[(f, n)] = v
        for f, v in old.files.items():
            if f not in self.results:
                e.files[f] = v
        if NEW_REASON not in e.reasons and (NEW_REASON in {v[1] for v in e.subtests.values()}
                                            or NEW_REASON in e.files.values()):
            e.reasons.append(NEW_REASON)
        return e

    def report(self, secs: float, who: str, jobs: int, nranks: int, details=40) -> str:
        res = self.results
        nfail = len(self.expected_fail) + len(self.new_fail)
        L = [f"pjdfstest: {len(res)} files, {self.total} subtests, on a {nranks}-rank FanStore cluster, as {who}, "
             f"in {secs:.0f} s (prove -j {jobs})",
             f"  passed             {self.passed}" + (f" (of which {self.todo} TODO: failures pjdfstest expects on Linux)" if self.todo else ""),
             f"  failed             {nfail}",
             f"    as expected      {len(self.expected_fail)}",
             f"    new failures     {len(self.new_fail)}",
             f"  newly passing      {len(self.newly_passing)}  (listed as failing, now pass: remove them, --update)",
             f"  not run            {self.not_run}  (their file ended early)",
             f"  crashes            {len(self.crashes())} subtests whose pjdfstest call died of a signal "
             f"({', '.join(f'{k}: {v}' for k, v in Counter(res[f].signals[n] for f, n in self.crashes()).most_common()) or 'none'}), "
             f"{len(self.file_crash_expected) + len(self.file_crash_new)} files ending abnormally "
             f"({len(self.file_crash_new)} not expected, {len(self.file_crash_gone)} expected and now fine)"]
        L.append(f"  outside the mount  {len(self.sockets)} unix sockets bound in the real stand-in directory of the "
                 f"virtual cwd (bind(2) of a relative path is not intercepted), {len(self.escaped)} other files")
        by_reason = Counter(self.expected.subtests[(f, n)][1] for f, n, _ in self.expected_fail)
        if by_reason:
            L.append("expected failures by reason:")
            L += [f"  {v:6d}  {k}" for k, v in sorted(by_reason.items(), key=lambda kv: -kv[1])]
        rows = []
        nf = Counter(f for f, *_ in self.new_fail)
        npass = Counter(f for f, *_ in self.newly_passing)
        ef = Counter(f for f, *_ in self.expected_fail)
        for f, r in sorted(res.items()):
            fails = sum(1 for o in r.outcomes.values() if o != "pass")
            crashes = sum(1 for o in r.outcomes.values() if o == "crash")
            if fails or r.crash or npass[f]:
                rows.append(f"  {f:18s} {r.plan or 0:5d} {sum(1 for o in r.outcomes.values() if o == 'pass'):5d} "
                            f"{ef[f]:6d} {nf[f]:5d} {npass[f]:6d} {crashes:6d} {(r.ms or 0) / 1000:6.1f}"
                            + (f"  {r.crash}" if r.crash else ""))
        if rows:
            L.append(f"per file (files with failures): {'file':18s} {'plan':>5s} {'pass':>5s} {'expfl':>6s} "
                     f"{'new':>5s} {'nowok':>6s} {'crash':>6s} {'secs':>6s}")
            L += rows
        slow = sorted(res.values(), key=lambda r: -(r.ms or 0))[:5]
        L.append("slowest files: " + ", ".join(f"{r.name} {(r.ms or 0) / 1000:.1f} s" for r in slow))
        if self.new_fail:
            L.append(f"NEW FAILURES ({len(self.new_fail)}; first {min(details, len(self.new_fail))}):")
            for f, n, outcome, was in self.new_fail[:details]:
                sig = res[f].signals.get(n)
                L.append(f"  {f} {n}: {res[f].lines.get(n, '')}" + (f"  [{sig}]" if sig else "")
                         + (f"  (listed as {was})" if was else ""))
        if self.newly_passing:
            L.append(f"NEWLY PASSING ({len(self.newly_passing)}; first {min(details, len(self.newly_passing))}):")
            for f, n, was in self.newly_passing[:details]:
                L.append(f"  {f} {n} (listed as {was}: {self.expected.subtests[(f, n)][1]})")
        for f in self.file_crash_new:
            L.append(f"FILE ENDED ABNORMALLY, not expected: {f}: {res[f].crash}")
        if self.escaped:
            L.append(f"ESCAPED THE MOUNT ({len(self.escaped)}): made in the real stand-in directory of the virtual "
                     f"cwd, not under the mount: " + ", ".join(self.escaped[:20]))
        for f in self.file_crash_gone:
            L.append(f"FILE LISTED AS {FILE_CRASH}, now ends normally: {f}")
        L.append("RESULT: " + ("as expected" if self.ok else
                               "DIFFERS from the expected-failures file (fix it, or `python3 tests/pjdfstest/run.py "
                               "--update` and fill in the reasons)"))
        return "\n".join(L)


def default_header() -> list:
    return ["# pjdfstest subtests that fail on FanStore, by reason (tests/pjdfstest/run.py compares every run",
            "# with this file: a failure not listed, or a listed subtest that passes, fails the run).",
            "# 'FILE N-M,K' fail; 'FILE N crash': the pjdfstest call died of a signal; 'FILE file-crash':",
            "# the file ended abnormally. Regenerate with `python3 tests/pjdfstest/run.py --update`."]


def main(argv=None, log=print) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--update", action="store_true", help="rewrite the expected-failures file from this run")
    ap.add_argument("--expected", type=Path, help="the expected-failures file (default: expected-failures.txt, "
                                                  "expected-failures-user.txt with --user)")
    ap.add_argument("--only", action="append", default=[], help="only the .t files (relative to tests/) starting so")
    ap.add_argument("--user", help="run prove as this user (made with useradd if missing, removed after)")
    ap.add_argument("--jobs", "-j", type=int, default=int(os.environ.get("FANSTORE_PJDFSTEST_JOBS", "8")),
                    help="test files run at once (prove -j; default 8: the suite mostly sleeps)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per .t file before it is killed")
    ap.add_argument("--nranks", type=int, default=4)
    ap.add_argument("--logs", type=Path, help="where each file's TAP goes (default: a new /tmp/pjdfstest-logs-*)")
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("FANSTORE_PJDFSTEST_CACHE",
                                                                      "/var/tmp/fanstore-pjdfstest")))
    args = ap.parse_args(argv)
    expected_path = args.expected or (EXPECTED_USER if args.user else EXPECTED)
    try:
        expected = Expected.load(expected_path)
    except ValueError as e:
        log(f"error: {e}")
        return 2
    try:
        check_tools()
        tree = build(find_tarball(args.cache, log), args.cache, log)
        files = test_files(tree, args.only)
        if not files:
            raise HarnessError(f"no .t file matches {args.only}")
        unknown = sorted(({f for f, _ in expected.subtests} | set(expected.files)) - set(test_files(tree, [])))
        if unknown:
            raise HarnessError(f"{expected_path} lists files the suite does not have: {', '.join(unknown)}")
        logs = args.logs or Path(tempfile.mkdtemp(prefix="pjdfstest-logs-", dir="/tmp"))
        if args.user:
            # Compared with what the same user gets natively, run first.
            logs.mkdir(parents=True, exist_ok=True)
            os.chmod(logs, 0o777)
            native = run_native(tree, files, logs / "native", args.jobs, args.timeout, args.user, log)
            fails = sum(1 for r in native.values() for o in r.outcomes.values() if o != "pass")
            log(f"natively, as user {args.user}: {fails} failing subtests (the baseline)")
            expected = with_native(expected, native)
        results, secs, escaped = run_suite(tree, files, logs, args.jobs, args.timeout, args.nranks, args.user, log)
    except TarballMissing as e:
        log(f"error: {e}")
        return 3
    except HarnessError as e:
        log(f"error: {e}")
        return 2
    cmp = Comparison(results, expected, escaped)
    if args.user:
        # Passing where the native run failed: the suite's own flow differs
        # after an earlier failure (a name left behind natively); reported,
        # not a difference to list.
        better = [x for x in cmp.newly_passing if expected.subtests.get((x[0], x[1]), (None, None))[1] == NATIVE_REASON]
        cmp.newly_passing = [x for x in cmp.newly_passing if x not in better]
        log(f"passing here where the native run failed: {len(better)} subtests "
            f"({', '.join(sorted({f for f, _, _ in better})) or 'none'})")
    log(cmp.report(secs, f"user {args.user}" if args.user else "root", args.jobs, args.nranks))
    log(f"logs: {logs} (one <dir>_<n>.t.log per file, prove.log)")
    if args.update:
        new = cmp.updated()
        # The native baseline is measured each run, never written down.
        new.subtests = {k: v for k, v in new.subtests.items() if v[1] != NATIVE_REASON}
        new.files = {k: v for k, v in new.files.items() if v != NATIVE_REASON}
        new.reasons = [r for r in new.reasons if r != NATIVE_REASON]
        expected_path.write_text(new.render())
        fresh = sum(1 for v in new.subtests.values() if v[1] == NEW_REASON) + \
            sum(1 for v in new.files.values() if v == NEW_REASON)
        log(f"wrote {expected_path}: {len(new.subtests)} subtests, {len(new.files)} file crashes"
            + (f"; {fresh} new entries under '## {NEW_REASON}': fill in their reasons" if fresh else ""))
        return 0
    return 0 if cmp.ok else 1


if __name__ == "__main__":
    sys.exit(main())
