"""Shared helpers for FanStore benchmarks: building the C helpers, starting a
daemon, medians, markdown tables. Benchmarks print ratios measured side by
side in one run; nothing here asserts a time."""
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import fs_cluster  # noqa: E402  (the tests' cluster helper starts every benchmark's daemons)

BIN = ROOT / "target" / "release"
OUT = ROOT / "bench" / "out"
PRELOAD = BIN / "libfanstore_preload.so"
# The python of the frameworks' venv (scripts/setup.sh: torch, transformers, ...).
FRAMEWORK_PY = Path(os.environ.get("FANSTORE_VENV", "/opt/fanstore-venv")) / "bin" / "python"


def cc(src: str, out_dir: Path) -> str:
    exe = out_dir / Path(src).stem
    subprocess.run(["cc", "-O2", "-o", str(exe), str(ROOT / "bench" / src)], check=True)
    return str(exe)


def outside_files(work: Path, count: int = 8) -> list:
    """`count` files of 1000 bytes under `work` (outside the mount): the
    paths the preload library's outside-prefix overhead is timed on."""
    paths = []
    for i in range(count):
        p = work / f"tmpfile{i}"
        p.write_bytes(b"y" * 1000)
        paths.append(str(p))
    return paths


def write_random_files(root: Path, size: int, count: int, seed: int = 1, per_dir: int = 100):
    """`count` files of `size` incompressible bytes, `per_dir` per directory."""
    rnd = __import__("random").Random(seed)
    block = bytes(rnd.getrandbits(8) for _ in range(1 << 16))
    paths = []
    for i in range(count):
        d = root / f"d{i // per_dir:04d}"
        d.mkdir(parents=True, exist_ok=True)
        p = d / f"f{i:06d}.bin"
        with open(p, "wb") as f:
            left, k = size, i
            while left:
                n = min(left, len(block))
                off = (k * 7919) % (len(block) - n + 1)
                f.write(block[off : off + n])
                left -= n
                k += 1
        paths.append(p)
    return paths


class Daemon:
    """A single-node daemon (MPI singleton, no launcher) serving `data`, started
    by the tests' cluster helper (tests/fs_cluster.py); its log is work/daemon.log."""

    def __init__(self, data: Path, work: Path, mount="/fanstore", extra=()):
        self.runtime = work / "rt"
        self.local = work / "local"
        self.mount = mount
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.runtime, ignore_errors=True)
        shutil.rmtree(self.local, ignore_errors=True)
        t = time.perf_counter()
        self.cluster = fs_cluster.start_cluster(
            fs_cluster.release_bins(), data, work, nranks=0, mount=mount, extra_args=extra, timeout=600,
            runtime=self.runtime, local=self.local, log_path=work / "daemon.log",
            env={"FANSTORE_RUNTIME_DIR": str(self.runtime)})
        self.load_seconds = time.perf_counter() - t
        self.proc = self.cluster.proc
        # After ready the daemon extracts its large local files in the background
        # (--extract-ahead; none when the local dir is on tmpfs): measure once it is
        # done, not while it writes.
        tmpfs = subprocess.run(["stat", "-f", "-c", "%T", str(self.local)], capture_output=True, text=True).stdout.strip()
        if "--extract-ahead" not in extra and tmpfs != "tmpfs" and "--extract-ahead" in daemon_flags():
            if not self.wait_log("ahead of their first open", timeout=600):
                print(f"warning: {mount}: the extraction ahead is not done after 600 s", file=sys.stderr)

    def wait_log(self, text: str, timeout: float = 300) -> bool:
        """Waits until the daemon's log has a line containing `text`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in (self.work / "daemon.log").read_text(errors="replace"):
                return True
            time.sleep(0.2)
        return False

    def env(self):
        return dict(os.environ, FANSTORE_RUNTIME_DIR=str(self.runtime), FANSTORE_NODE="0",
                    FANSTORE_MOUNT=self.mount, LD_PRELOAD=str(PRELOAD))

    def stop(self):
        self.cluster.stop(timeout=120, check=False)


def daemon_flags() -> str:
    """`fanstore-daemon --help` (which flags this build has)."""
    r = subprocess.run([str(BIN / "fanstore-daemon"), "--help"], capture_output=True, text=True)
    return r.stdout


def du(p: Path) -> int:
    """Bytes allocated on disk under p (du -s -B1)."""
    if not p.exists():
        return 0
    r = subprocess.run(["du", "-s", "-B1", str(p)], capture_output=True, text=True)
    return int(r.stdout.split()[0]) if r.returncode == 0 and r.stdout else 0


def tiny_dataset(work: Path) -> Path:
    """A one-file dataset packed at work/ds: the daemon of a benchmark that
    only writes outputs still needs something to load."""
    src = work / "src"
    src.mkdir()
    (src / "x").write_bytes(b"x")
    subprocess.run([str(BIN / "fanstore-prep"), "pack", "--input", str(src), "--output", str(work / "ds"),
                    "--partitions", "1"], check=True, stdout=subprocess.DEVNULL)
    return work / "ds"


def median(xs):
    return statistics.median(xs)


def machine() -> str:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    mpich = subprocess.run(["mpichversion"], capture_output=True, text=True).stdout.split("\n")[0:1]
    return (f"{os.cpu_count()} cores, {mem:.0f} GiB RAM, Linux {platform.release()}, "
            f"{' '.join(mpich).strip() or 'MPICH ?'}, {time.strftime('%Y-%m-%d')}")


def table(headers, rows) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def fmt_size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def pyplot(path):
    """matplotlib.pyplot with the file backend, or None (and a line saying
    `path` is not drawn) when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib missing: {path} not drawn (python3 -m pip install matplotlib)")
        return None
    return plt


def plot_lines(path, title, xlabels, ylabel, series, log=False):
    """Like the FanStore paper's figures: one line per system; when series are
    named "SYSTEM xN" (N readers), one panel per N. Never raises: a plot is
    not worth losing the measurements for."""
    try:
        _plot_lines(path, title, xlabels, ylabel, series, log)
    except Exception as e:  # noqa: BLE001
        print(f"plot {path} failed: {e}")


def _plot_lines(path, title, xlabels, ylabel, series, log):
    plt = pyplot(path)
    if plt is None:
        return
    panels = {}
    for name, ys in series.items():
        system, _, n = name.rpartition(" x")
        if not system or not n.isdigit():
            system, n = name, ""
        panels.setdefault(n, {})[system] = ys
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels) + 0.6, 4.2), dpi=110, squeeze=False,
                             sharey=True)
    colors = {}
    for ax, (n, lines) in zip(axes[0], panels.items()):
        for system, ys in lines.items():
            c = colors.setdefault(system, f"C{len(colors)}")
            ax.plot(xlabels, ys, "-", color=c, marker="o", label=system)
        ax.set_xlabel("file size")
        ax.set_title(f"{n} reader{'s' if n != '1' else ''}" if n else "", fontsize=10)
        if log:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
