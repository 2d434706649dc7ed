"""Shared fixtures and helpers for the client matrix (tests/test_clients_*.py).

One source tree is built per pytest session (lazily, cached in this module):
an image-like + mixed dataset from ``fs_prep.make_tree`` plus our own files
covering every client format (.npy/.npz/.png/.jpg/.h5/.safetensors, text for
stdio, 1-4 MiB files, empty files, page-boundary sizes, odd names, an empty
directory). It is packed once per codec (``lz4`` gives a mix of lz4 and raw
payloads: random bytes, PNG/JPEG and compressed npz do not shrink; the workers
module uses zstd, the failures module no compression), and every test module
starts ONE ``mpiexec -n 4`` cluster over it (``UCX_TLS=tcp``).

Every comparison is against the original source tree: either values computed
here from the source files, or the output of the same program run natively on
the source directory (no LD_PRELOAD), with the root path replaced by ``<ROOT>``.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import stat as st
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import run

HERE = Path(__file__).resolve().parent
CLIENTS_DIR = HERE / "clients"

# MPICH over TCP sockets, as between nodes (DESIGN.md, Testing).
os.environ.setdefault("UCX_TLS", "tcp")

NRANKS = 4
CMD_TIMEOUT = 90
# Stable, comparable output from coreutils on both sides.
LOCALE = {"LC_ALL": "C.UTF-8", "LANG": "C.UTF-8", "TZ": "UTC"}

_cache: dict = {}


# --------------------------------------------------------------------------
# the source tree
# --------------------------------------------------------------------------

@dataclass
class SourceTree:
    """The original tree: every comparison is made against these bytes."""

    root: Path
    files: list = field(default_factory=list)   # sorted relative paths of regular files
    dirs: list = field(default_factory=list)    # sorted relative paths of directories (root excluded)
    links: list = field(default_factory=list)   # sorted relative paths of symlinks
    link_files: list = field(default_factory=list)  # symlinks whose target is not a directory

    @classmethod
    def scan(cls, root: Path) -> "SourceTree":
        t = cls(Path(root))
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = os.path.relpath(dirpath, root)
            for d in dirnames:
                rel = os.path.normpath(os.path.join(rel_dir, d))
                (t.links if os.path.islink(os.path.join(dirpath, d)) else t.dirs).append(rel)
            for f in filenames:
                rel = os.path.normpath(os.path.join(rel_dir, f))
                p = os.path.join(dirpath, f)
                if os.path.islink(p):
                    t.links.append(rel)
                elif st.S_ISREG(os.lstat(p).st_mode):
                    t.files.append(rel)
        t.files.sort()
        t.dirs.sort()
        t.links.sort()
        t.link_files = [l for l in t.links if not os.path.isdir(root / l)]
        return t

    def path(self, rel: str) -> Path:
        return self.root / rel

    def bytes(self, rel: str) -> bytes:
        return (self.root / rel).read_bytes()

    def md5(self, rel: str) -> str:
        key = ("md5", str(self.root), rel)
        if key not in _cache:
            _cache[key] = hashlib.md5(self.bytes(rel)).hexdigest()
        return _cache[key]

    def size(self, rel: str) -> int:
        return os.lstat(self.root / rel).st_size

    def with_suffix(self, *suffixes: str) -> list:
        return [f for f in self.files if f.endswith(suffixes)]

    def total_file_bytes(self) -> int:
        return sum(self.size(f) for f in self.files)


def _write(p: Path, data: bytes, mode: int | None = None):
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    if mode is not None:
        os.chmod(p, mode)


def build_own_files(root: Path):
    """Our own files under root/own: every client format and the edge cases."""
    import numpy as np
    from PIL import Image
    import h5py
    from safetensors.numpy import save_file

    rng = np.random.default_rng(20240611)
    own = root / "own"

    # text for fgets/getline/fscanf/ifstream: long lines cross 256-byte buffers.
    for i in range(12):
        lines = []
        for j in range(40 + 17 * i):
            n = int(rng.integers(0, 400 if j % 7 == 0 else 80))
            lines.append("".join(chr(int(c)) for c in rng.integers(32, 127, n)))
        text = "\n".join(lines) + ("\n" if i % 2 == 0 else "")  # half without a final newline
        _write(own / "text" / f"lines_{i:02d}.txt", text.encode())
    for i in range(6):
        nums = rng.integers(-10**9, 10**9, 500 + 100 * i)
        _write(own / "text" / f"n_{i}.nums", (" ".join(str(int(x)) for x in nums) + "\n").encode())

    # edge cases
    edge = own / "edge"
    _write(edge / "empty", b"")
    _write(edge / "one", b"x")
    _write(edge / "with space.txt", b"a file name with a space\n")
    _write(edge / ".hidden", b"hidden file\n")
    _write(edge / "donn\u00e9es_\u00e9t\u00e9.txt", "utf-8 name \u00e9\n".encode())
    _write(edge / "exec.sh", b"#!/bin/sh\necho hi\n", 0o755)
    _write(edge / "readonly.txt", b"read only mode 0444\n", 0o444)
    _write(edge / "private.bin", rng.bytes(777), 0o600)
    for n in (4095, 4096, 4097, 65536, 65537):
        _write(edge / f"page_{n}.bin", rng.bytes(n))
    _write(edge / "deep" / "a" / "b" / "c" / "d" / "e" / "leaf.txt", b"deep leaf\n")
    (edge / "emptydir").mkdir(parents=True, exist_ok=True)

    # a couple of 1-4 MiB files: incompressible (raw), compressible (lz4), zeros
    big = own / "big"
    _write(big / "random_2m.bin", rng.bytes(2 * 1024 * 1024 + 123))
    words = [b"alpha", b"beta", b"gamma", b"delta", b"epsilon", b"zeta", b"eta", b"theta"]
    idx = rng.integers(0, len(words), 3 * 1024 * 1024 // 6)
    text = b" ".join(words[int(k)] for k in idx)
    text = b"\n".join(text[i:i + 100] for i in range(0, len(text), 100))
    _write(big / "text_3m.txt", text)
    _write(big / "zeros_1m.bin", bytes(1024 * 1024 + 1))

    # numpy
    arr = own / "arrays"
    arr.mkdir(parents=True, exist_ok=True)
    np.save(arr / "f32_2d.npy", rng.standard_normal((64, 64), dtype=np.float32))
    np.save(arr / "i64_1d.npy", rng.integers(-2**40, 2**40, 1000))
    np.save(arr / "u8_chw.npy", rng.integers(0, 256, (3, 32, 32), dtype=np.uint8))
    np.save(arr / "f64_fortran.npy", np.asfortranarray(rng.standard_normal((33, 17))))
    np.save(arr / "bool.npy", rng.integers(0, 2, 999).astype(bool))
    np.save(arr / "c64.npy", (rng.standard_normal(100) + 1j * rng.standard_normal(100)).astype(np.complex64))
    np.save(arr / "ramp_u16.npy", np.arange(200000, dtype=np.uint16))  # compressible, ~400 KiB
    np.savez(arr / "pair.npz", x=rng.standard_normal((10, 10)), y=np.arange(50, dtype=np.int32))
    np.savez_compressed(arr / "pair_c.npz", a=rng.integers(0, 9, (100, 100)), b=np.linspace(0, 1, 77))
    rng.standard_normal(12345).astype(np.float32).tofile(arr / "raw_f32.bin")
    np.arange(100000, dtype=np.int32).tofile(arr / "raw_i32.bin")

    # pillow: PNG (RGB, L, RGBA, P) and JPEG
    pics = own / "pics"
    pics.mkdir(parents=True, exist_ok=True)
    yy, xx = np.mgrid[0:48, 0:64]
    for i in range(6):
        rgb = np.stack([(xx * 4 + i * 10) % 256, (yy * 5) % 256, (xx + yy + i) % 256], -1).astype(np.uint8)
        rgb = (rgb ^ rng.integers(0, 32, rgb.shape, dtype=np.uint8)).astype(np.uint8)
        Image.fromarray(rgb, "RGB").save(pics / f"rgb_{i}.png")
        Image.fromarray(rgb, "RGB").save(pics / f"photo_{i}.jpg", quality=90)
    Image.fromarray(rng.integers(0, 256, (40, 30), dtype=np.uint8), "L").save(pics / "gray.png")
    Image.fromarray(rng.integers(0, 256, (20, 20, 4), dtype=np.uint8), "RGBA").save(pics / "alpha.png")
    Image.fromarray(rng.integers(0, 256, (50, 50, 3), dtype=np.uint8), "RGB").convert("P").save(pics / "palette.png")
    Image.fromarray(rng.integers(0, 256, (600, 800, 3), dtype=np.uint8), "RGB").save(pics / "large.png")  # ~1.4 MiB
    Image.fromarray(rng.integers(0, 256, (60, 80), dtype=np.uint8), "L").save(pics / "gray.jpg", quality=75)

    # h5py (bundled HDF5 uses the __xstat64 family)
    (own / "h5").mkdir(parents=True, exist_ok=True)
    with h5py.File(own / "h5" / "data.h5", "w") as h:
        h.create_dataset("x", data=rng.standard_normal((200, 50)).astype(np.float32))
        g = h.create_group("grp")
        g.create_dataset("y", data=rng.integers(-1000, 1000, 5000).astype(np.int16), chunks=(512,), compression="gzip")
        g.create_dataset("z", data=rng.integers(0, 256, (64, 64, 3), dtype=np.uint8), chunks=(16, 16, 3))
        g.attrs["label"] = "fanstore"
        h.attrs["version"] = 3

    # safetensors
    (own / "st").mkdir(parents=True, exist_ok=True)
    save_file({
        "w1": rng.standard_normal((128, 64)).astype(np.float32),
        "b1": rng.standard_normal(64).astype(np.float32),
        "idx": rng.integers(0, 10**6, 100),
        "half": rng.standard_normal((3, 3)).astype(np.float16),
        "bytes": rng.integers(0, 256, 1000, dtype=np.uint8),
    }, str(own / "st" / "model.safetensors"), metadata={"format": "np", "note": "client matrix"})
    save_file({"only": np.arange(10, dtype=np.float64)}, str(own / "st" / "small.safetensors"))

    # many small files in class-like directories: half random, half repetitive
    for d in range(8):
        for f in range(20):
            n = int(rng.integers(0, 3000))
            data = rng.bytes(n) if (d + f) % 2 else (b"%d-%d " % (d, f)) * (n // 5 + 1)
            _write(own / "many" / f"d{d}" / f"f{f:02d}.dat", data)


def short_tmpdir() -> Path:
    """A new directory directly under /tmp (13 bytes: "/tmp/XXXXXXXX"), removed at exit.

    fs_prep.make_tree(kind="mixed") has a 4080-byte relative path (DEEP_FILE):
    under /fanstore it is 4090 bytes, so the source tree and every copy must
    live at a path this short for native tools to reach it by absolute path
    (PATH_MAX is 4096 with the NUL) and for both sides to behave alike.
    """
    d = Path(tempfile.mkdtemp(prefix="", dir="/tmp"))
    assert len(str(d)) <= 13, d
    atexit.register(shutil.rmtree, d, True)
    return d


@pytest.fixture
def short_tmp():
    d = short_tmpdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def source_tree(tmp_path_factory) -> SourceTree:
    """The session's source tree (built once): fs_prep's mixed tree at the root
    (deep paths, a non-UTF-8 name, a 255-byte name, symlinks, modes, ns mtimes),
    its image tree under images/, and our own files under own/."""
    if "src" not in _cache:
        import fs_prep
        root = short_tmpdir()
        fs_prep.make_tree(root, kind="mixed")
        fs_prep.make_tree(root / "images", kind="images")
        build_own_files(root)
        _cache["src"] = SourceTree.scan(root)
    return _cache["src"]


def packed(bins, tmp_path_factory, src: SourceTree, codec: str | None) -> Path:
    """The source tree packed with fanstore-prep (once per codec)."""
    key = ("packed", codec)
    if key not in _cache:
        import fs_prep
        out = tmp_path_factory.mktemp(f"clients-ds-{codec or 'raw'}".replace(":", "")) / "dataset.fs"
        args = ["--partitions", "8"]
        if codec:
            args += ["--compress", codec]
        fs_prep.pack(bins, src.root, out, *args)
        _cache[key] = out
    return _cache[key]


# --------------------------------------------------------------------------
# the cluster seen by the clients
# --------------------------------------------------------------------------

class FS:
    """A running cluster + its source tree, with helpers to run clients on both."""

    def __init__(self, cluster, src: SourceTree, workdir: Path, dataset: Path | None = None):
        self.cluster = cluster
        self.dataset = dataset
        self.src = src
        self.mount = str(getattr(cluster, "mount", "/fanstore"))
        self.workdir = workdir
        self.nranks = getattr(cluster, "nranks", NRANKS)

    # paths
    def coverage(self, node: int = 0) -> dict:
        """How the files of the dataset reach `node`: {(local|remote, codec id): [paths]}."""
        import fs_cluster
        _, nodes = fs_cluster.read_index(Path(self.dataset) / "manifest.fsm")
        local = set(node_state(self.cluster.runtime, node)["local"])
        out: dict = {}
        for p, n in nodes.items():
            if n["kind"] == fs_cluster.KIND_FILE:
                where = "local" if n["partition"] in local else "remote"
                out.setdefault((where, n["codec"]), []).append(p)
        return out

    def vpath(self, rel: str = "") -> str:
        return self.mount if rel in ("", ".") else f"{self.mount}/{rel}"

    # environments
    def env(self, node: int = 0, preload: bool = True) -> dict:
        e = dict(os.environ)
        e.update(self.cluster.env(node=node, preload=preload))
        e.pop("RUST_LOG", None)  # fs_cluster's base_env sets it for the daemons, not for clients
        e.update(LOCALE)
        return e

    def native_env(self) -> dict:
        e = dict(os.environ)
        e.pop("LD_PRELOAD", None)
        e.update(LOCALE)
        return e

    # running
    def run(self, cmd, node: int = 0, check=True, timeout=CMD_TIMEOUT, **kw):
        """Runs cmd with the preload library and the cluster env of `node`."""
        kw.setdefault("errors", "surrogateescape")  # a non-UTF-8 file name is in the tree
        return run(cmd, check=check, timeout=timeout, env=self.env(node), **kw)

    def run_native(self, cmd, check=True, timeout=CMD_TIMEOUT, **kw):
        kw.setdefault("errors", "surrogateescape")
        return run(cmd, check=check, timeout=timeout, env=self.native_env(), **kw)

    def run_bytes(self, cmd, node: int = 0, timeout=CMD_TIMEOUT, **kw) -> bytes:
        """Runs cmd under preload and returns raw stdout; fails the test on error."""
        r = subprocess.run(cmd, capture_output=True, timeout=timeout, env=self.env(node), **kw)
        if r.returncode != 0:
            pytest.fail(f"{cmd} exited {r.returncode}\nstderr:\n{r.stderr.decode(errors='replace')}")
        return r.stdout

    def normalize(self, text: str) -> str:
        """Replaces both roots by <ROOT> so native and virtual outputs compare."""
        return text.replace(str(self.src.root), "<ROOT>").replace(self.mount, "<ROOT>")

    def both(self, cmd_for_root, node: int = 0, timeout=CMD_TIMEOUT, cwd=None):
        """Runs cmd_for_root(root) natively on the source and under preload on the
        mount; returns (native_stdout, virtual_stdout), both normalised."""
        nat = self.run_native(cmd_for_root(str(self.src.root)), timeout=timeout, cwd=cwd)
        vir = self.run(cmd_for_root(self.mount), node=node, timeout=timeout, cwd=cwd)
        return self.normalize(nat.stdout), self.normalize(vir.stdout)

    def script(self, name: str, code: str) -> str:
        p = self.workdir / name
        p.write_text(code)
        return str(p)

    def py_both(self, code: str, *args, node: int = 0, name: str | None = None, timeout=CMD_TIMEOUT):
        """Runs a Python script `code` with argv[1] = root (+ args) natively and
        under preload; returns (native_stdout, virtual_stdout) normalised."""
        name = name or f"s_{hashlib.md5(code.encode()).hexdigest()[:10]}.py"
        path = self.script(name, code)
        return self.both(lambda root: [sys.executable, path, root, *map(str, args)], node=node, timeout=timeout)

    def py(self, code: str, *args, node: int = 0, preload=True, timeout=CMD_TIMEOUT, check=True, name=None):
        """Runs a Python script under preload (argv[1] = mount) and returns the CompletedProcess."""
        name = name or f"s_{hashlib.md5(code.encode()).hexdigest()[:10]}.py"
        path = self.script(name, code)
        env = self.env(node) if preload else self.native_env()
        return run([sys.executable, path, self.mount, *map(str, args)], check=check, timeout=timeout, env=env,
                   errors="surrogateescape")

    def py_json(self, code: str, *args, node: int = 0, timeout=CMD_TIMEOUT):
        return json.loads(self.py(code, *args, node=node, timeout=timeout).stdout)

    def file_list(self, files=None) -> str:
        """Writes a list of relative file paths (one a line) and returns its path."""
        files = self.src.files if files is None else files
        p = self.workdir / f"list_{hashlib.md5(os.fsencode(chr(0).join(files))).hexdigest()[:10]}.txt"
        p.write_bytes(b"".join(os.fsencode(f) + b"\n" for f in files))
        return str(p)


def launch_fs(bins, tmp_path_factory, name: str, codec: str | None = "lz4", extra_args=()) -> FS:
    """Packs (cached per codec) and starts ONE cluster of NRANKS daemons; returns an FS."""
    src = source_tree(tmp_path_factory)
    ds = packed(bins, tmp_path_factory, src, codec)
    import fs_cluster
    cdir = tmp_path_factory.mktemp(f"clients-cluster-{name}")
    cluster = fs_cluster.start_cluster(bins, ds, cdir, nranks=NRANKS, mount="/fanstore", extra_args=tuple(extra_args))
    return FS(cluster, src, tmp_path_factory.mktemp(f"clients-work-{name}"), ds)


def start_fs(bins, tmp_path_factory, name: str, codec: str | None = "lz4"):
    """Generator body for a module-scoped fixture: launch, yield the FS, stop the cluster."""
    fs = launch_fs(bins, tmp_path_factory, name, codec)
    try:
        yield fs
    finally:
        try:
            fs.cluster.stop()
        except Exception:
            fs.cluster.kill()
            raise
        finally:
            # `fanstore stop` leaves the runtime dir behind (with the preload's `empty/` in it)
            shutil.rmtree(fs.cluster.runtime, ignore_errors=True)


# --------------------------------------------------------------------------
# C / C++ clients
# --------------------------------------------------------------------------

def compile_client(tmp_dir: Path, source: str) -> str:
    """Compiles tests/clients/<source> into tmp_dir (cc for .c, g++ -std=c++17 for .cpp)."""
    src = CLIENTS_DIR / source
    out = Path(tmp_dir) / Path(source).stem
    if source.endswith(".cpp"):
        cmd = ["g++", "-std=c++17", "-O1", "-Wall", "-o", str(out), str(src)]
    else:
        cmd = ["cc", "-std=gnu11", "-O1", "-Wall", "-D_GNU_SOURCE", "-o", str(out), str(src)]
    run(cmd, timeout=180)
    return str(out)


def expect_errno(result: dict, key: str, name: str):
    """Asserts a {'ok': ..} / {'errno': 'EROFS'} style JSON result names errno `name`."""
    got = result.get(key)
    assert got == name, f"{key}: expected {name}, got {got}"


def wait_until(pred, timeout=10.0, step=0.1):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


def node_state(runtime, rank: int) -> dict:
    """Parses `node-<rank>.state` (fanstore-core/src/runtime.rs, documented layout; checksum not checked)."""
    import struct
    b = (Path(runtime) / f"node-{rank}.state").read_bytes()
    assert b[:8] == b"FANSTND\0", f"node-{rank}.state: bad magic"
    version, r, nranks, status = struct.unpack_from("<IIII", b, 8)
    nparts, flags = struct.unpack_from("<II", b, 40)
    lens = struct.unpack_from("<IIII", b, 48)
    off = 64 + sum(lens)
    bits = b[off:off + (nparts + 7) // 8]
    return {"version": version, "rank": r, "nranks": nranks, "status": status, "flags": flags,
            "partitions": nparts,
            "local": [p for p in range(nparts) if bits[p // 8] & (1 << (p % 8))]}
