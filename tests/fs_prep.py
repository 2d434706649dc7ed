"""Helpers for tests that need input trees and packed FanStore datasets.

Stable API (the daemon and preload tests import these; keep signatures):

    make_tree(root, kind="mixed" | "images", n_files=60, seed=0) -> Path
        Builds a deterministic input tree under `root` (created if missing).
    pack(bins, src, out, *extra_args, check=True, timeout=300) -> CompletedProcess
        Runs `fanstore-prep pack --input src --output out *extra_args`.
    verify(bins, out, check=True) -> CompletedProcess
    extract(bins, out, dest, check=True) -> CompletedProcess
    ls(bins, out, path=None, check=True) -> CompletedProcess
    assert_trees_equal(a, b, *, compare_root=True)
        Same names (as bytes), kinds, permission bits, mtimes (ns), sizes,
        file bytes and symlink targets; fails the test naming the first
        differences.
    tree_listing(root) -> dict[bytes, Node]
        Every entry below `root` by relative byte path (b"" is the root).

`bins` is the conftest fixture (a dict with a "prep" key) or just the path
of the fanstore-prep binary.

What make_tree(kind="mixed") contains (relative byte paths are exported as
constants so that tests can look them up in /fanstore):
- nested directories (a/b/c, d/e), empty directories (EMPTY_DIR, a/b/empty),
  empty files (EMPTY_FILE), files of many sizes (0 B .. 1 MB), random and
  compressible, various modes (0600, 0644, 0755, 0444) and ns mtimes;
- NON_UTF8_NAME (a name that is not UTF-8), LONG_NAME_PATH (a 255-byte
  name), DEEP_FILE (a path of 4080 bytes, whose absolute path may
  exceed PATH_MAX: open it with dir_fd chains, see `open_rel`);
- symlinks inside the tree: SYMLINKS maps link path -> target.
kind="images" makes train/<class>/ and val/<class>/ with small PNG files
(pillow) and .npy/.npz arrays (numpy).

All paths are bytes internally (os.fsencode); files whose absolute path is
longer than PATH_MAX are reached through directory file descriptors.
"""
from __future__ import annotations

import io
import os
import random
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Union

import pytest

from conftest import run

# Relative byte paths of the notable entries of make_tree(kind="mixed").
EMPTY_FILE = b"empty.txt"
EMPTY_DIR = b"empty_dir"
NON_UTF8_NAME = b"caf\xe9-\xff\xfe-latin1.bin"
LONG_NAME_PATH = b"a/" + b"n" * 251 + b".bin"  # the name is 255 bytes
DEEP_DIR_NAME = b"deep-" + b"x" * 195  # 200 bytes per level
# 4080 bytes: below FanStore's 4096 limit, but the absolute path of any tree
# outside "/" exceeds the kernel's PATH_MAX, so tools must use *at calls.
DEEP_FILE = b"/".join([DEEP_DIR_NAME] * 20) + b"/" + b"f" * 56 + b".dat"
COMPRESSIBLE_FILE = b"a/b/c/compressible.txt"
MARKER_FILE = b"d/marker.bin"
MARKER = b"FANSTORE-TEST-MARKER-0123456789"
SYMLINKS = {
    b"a/link_to_file": b"b/c/compressible.txt",
    b"link_to_dir": b"a/b",
    b"d/e/up_link": b"../../a/b/c/compressible.txt",
    b"a/b/c/link_to_marker": b"../../../d/marker.bin",
}

_SIZES = [0, 1, 17, 100, 511, 4096, 4097, 65536, 65537, 150_000, 300_000, 1_000_000]
_BASE_NS = 1_600_000_000 * 10**9


def _open_dir(root: Union[Path, bytes, str], rel: bytes = b"") -> int:
    """An O_DIRECTORY fd for `rel` below `root`, walking one component at a time."""
    fd = os.open(os.fsencode(root), os.O_RDONLY | os.O_DIRECTORY)
    for comp in [c for c in rel.split(b"/") if c]:
        try:
            nfd = os.open(comp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        finally:
            os.close(fd)
        fd = nfd
    return fd


def open_rel(root: Union[Path, bytes, str], rel: bytes, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """os.open of `rel` below `root` that works whatever the path length."""
    parent, _, name = rel.rpartition(b"/")
    dfd = _open_dir(root, parent)
    try:
        return os.open(name, flags | os.O_NOFOLLOW, mode, dir_fd=dfd)
    finally:
        os.close(dfd)


def _mkdirs(root: Path, rel: bytes, mode: int = 0o755) -> None:
    fd = os.open(os.fsencode(root), os.O_RDONLY | os.O_DIRECTORY)
    try:
        for comp in [c for c in rel.split(b"/") if c]:
            try:
                os.mkdir(comp, mode, dir_fd=fd)
            except FileExistsError:
                pass
            nfd = os.open(comp, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
    finally:
        os.close(fd)


def _write(root: Path, rel: bytes, data: bytes, mode: int = 0o644) -> None:
    fd = open_rel(root, rel, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _set_times(root: Path, rel: bytes, ns: int) -> None:
    parent, _, name = rel.rpartition(b"/")
    dfd = _open_dir(root, parent)
    try:
        if name:
            os.utime(name, ns=(ns - 7_000_000_011, ns), dir_fd=dfd, follow_symlinks=False)
        else:
            os.utime(dfd, ns=(ns - 7_000_000_011, ns))
    finally:
        os.close(dfd)


def _content(rng: random.Random, size: int, compressible: bool) -> bytes:
    if size == 0:
        return b""
    if compressible:
        line = b"the quick brown fox %d jumps over the lazy dog\n"
        out = io.BytesIO()
        i = 0
        while out.tell() < size:
            out.write(line % (i % 97))
            i += 1
        return out.getvalue()[:size]
    return rng.randbytes(size)


def make_tree(root: Union[Path, str], kind: str = "mixed", n_files: int = 60, seed: int = 0) -> Path:
    """Creates a deterministic input tree under `root` and returns `root` as a Path."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    if kind == "images":
        _make_images(root, n_files, rng)
    elif kind == "mixed":
        _make_mixed(root, n_files, rng)
    else:
        raise ValueError(f"unknown tree kind {kind!r}")
    _settle_times(root, rng)
    return root


def _make_mixed(root: Path, n_files: int, rng: random.Random) -> None:
    dirs = [b"a", b"a/b", b"a/b/c", b"d", b"d/e", b"g"]
    for d in dirs + [EMPTY_DIR, b"a/b/empty"]:
        _mkdirs(root, d)
    modes = [0o644, 0o600, 0o755, 0o444, 0o640]
    for i in range(n_files):
        d = dirs[i % len(dirs)]
        size = _SIZES[rng.randrange(len(_SIZES))]
        _write(root, d + b"/file%03d.bin" % i, _content(rng, size, compressible=i % 3 == 0), modes[i % len(modes)])
    _write(root, EMPTY_FILE, b"")
    _write(root, NON_UTF8_NAME, b"not utf-8 name\n" * 10)
    _write(root, LONG_NAME_PATH, b"long name\n")
    _write(root, COMPRESSIBLE_FILE, _content(rng, 200_000, compressible=True))
    _write(root, MARKER_FILE, MARKER * 64 + rng.randbytes(1000))
    deep_dir = DEEP_FILE.rpartition(b"/")[0]
    _mkdirs(root, deep_dir)
    _write(root, DEEP_FILE, b"deep file\n" * 100, 0o600)
    for link, target in SYMLINKS.items():
        parent, _, name = link.rpartition(b"/")
        dfd = _open_dir(root, parent)
        try:
            os.symlink(target, name, dir_fd=dfd)
        finally:
            os.close(dfd)
    os.chmod(root / "d", 0o750)


def _make_images(root: Path, n_files: int, rng: random.Random) -> None:
    import numpy as np
    from PIL import Image

    classes = max(2, min(10, n_files // 6))
    nprng = np.random.default_rng(rng.randrange(2**32))
    for i in range(n_files):
        split = "val" if i % 5 == 4 else "train"
        d = root / split / f"class{i % classes:02d}"
        d.mkdir(parents=True, exist_ok=True)
        k = i % 3
        if k == 0:
            img = nprng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
            Image.fromarray(img).save(d / f"img{i:05d}.png")
        elif k == 1:
            np.save(d / f"arr{i:05d}.npy", nprng.standard_normal((16, 16)).astype(np.float32))
        else:
            np.savez(d / f"arrs{i:05d}.npz", x=nprng.standard_normal(64), y=np.arange(10))


def _settle_times(root: Path, rng: random.Random) -> None:
    """Gives every entry a deterministic ns mtime, directories last and deepest first."""
    listing = tree_listing(root)
    for rel in sorted(listing, key=lambda p: (-p.count(b"/"), p)):
        node = listing[rel]
        if node.kind != "dir":
            _set_times(root, rel, _BASE_NS + rng.randrange(10**15))
    for rel in sorted((p for p in listing if listing[p].kind == "dir"), key=lambda p: (-(p.count(b"/") + (p != b"")), p)):
        _set_times(root, rel, _BASE_NS + rng.randrange(10**15))


@dataclass
class Node:
    kind: str  # "dir", "file", "symlink", "other"
    perm: int
    mtime_ns: int
    size: int
    target: Optional[bytes] = None


def tree_listing(root: Union[Path, str]) -> Dict[bytes, Node]:
    """Every entry below `root` by relative byte path (b"" is the root itself)."""
    out: Dict[bytes, Node] = {}
    fd = os.open(os.fsencode(root), os.O_RDONLY | os.O_DIRECTORY)
    try:
        st = os.fstat(fd)
        out[b""] = Node("dir", stat.S_IMODE(st.st_mode), st.st_mtime_ns, 0)
        _list_into(fd, b"", out)
    finally:
        os.close(fd)
    return out


def _list_into(dfd: int, prefix: bytes, out: Dict[bytes, Node]) -> None:
    for name in sorted(os.fsencode(n) for n in os.listdir(dfd)):
        rel = prefix + b"/" + name if prefix else name
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        perm, mt = stat.S_IMODE(st.st_mode), st.st_mtime_ns
        if stat.S_ISDIR(st.st_mode):
            out[rel] = Node("dir", perm, mt, 0)
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
            try:
                _list_into(sub, rel, out)
            finally:
                os.close(sub)
        elif stat.S_ISREG(st.st_mode):
            out[rel] = Node("file", perm, mt, st.st_size)
        elif stat.S_ISLNK(st.st_mode):
            out[rel] = Node("symlink", perm, mt, st.st_size, os.readlink(name, dir_fd=dfd))
        else:
            out[rel] = Node("other", perm, mt, st.st_size)


def _data_extents(fd: int, size: int):
    """(start, end) ranges that may hold data; the rest are holes (zeros)."""
    ext, off = [], 0
    try:
        while off < size:
            try:
                start = os.lseek(fd, off, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole remains
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            ext.append((start, end))
            off = end
    except (AttributeError, OSError):
        return [(0, size)]
    return ext


def _files_equal(a_fd: int, b_fd: int, size: int) -> Optional[int]:
    """None if equal, else the offset of the first difference (sparse-aware)."""
    ranges = sorted(_data_extents(a_fd, size) + _data_extents(b_fd, size))
    merged = []
    for s, e in ranges:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    chunk = 1 << 20
    for s, e in merged:
        off = s
        while off < min(e, size):
            n = min(chunk, min(e, size) - off)
            x, y = os.pread(a_fd, n, off), os.pread(b_fd, n, off)
            if x != y:
                for i in range(min(len(x), len(y))):
                    if x[i] != y[i]:
                        return off + i
                return off + min(len(x), len(y))
            off += n
    return None


def assert_trees_equal(a: Union[Path, str], b: Union[Path, str], *, compare_root: bool = True) -> None:
    """Fails unless trees `a` and `b` have the same names, kinds, modes, mtimes, sizes, bytes and link targets."""
    la, lb = tree_listing(a), tree_listing(b)
    problems = []
    only_a, only_b = sorted(set(la) - set(lb)), sorted(set(lb) - set(la))
    if only_a:
        problems.append(f"only in {a}: {only_a[:10]}")
    if only_b:
        problems.append(f"only in {b}: {only_b[:10]}")
    for rel in sorted(set(la) & set(lb)):
        x, y = la[rel], lb[rel]
        if rel == b"" and not compare_root:
            continue
        if x.kind != y.kind:
            problems.append(f"{rel!r}: kind {x.kind} vs {y.kind}")
            continue
        if x.kind != "symlink" and x.perm != y.perm:
            problems.append(f"{rel!r}: mode {oct(x.perm)} vs {oct(y.perm)}")
        if x.mtime_ns != y.mtime_ns:
            problems.append(f"{rel!r}: mtime_ns {x.mtime_ns} vs {y.mtime_ns}")
        if x.size != y.size:
            problems.append(f"{rel!r}: size {x.size} vs {y.size}")
        elif x.kind == "symlink" and x.target != y.target:
            problems.append(f"{rel!r}: symlink target {x.target!r} vs {y.target!r}")
        elif x.kind == "file":
            fa, fb = open_rel(a, rel), open_rel(b, rel)
            try:
                diff = _files_equal(fa, fb, x.size)
            finally:
                os.close(fa)
                os.close(fb)
            if diff is not None:
                problems.append(f"{rel!r}: bytes differ at offset {diff}")
    if problems:
        pytest.fail(f"trees {a} and {b} differ:\n  " + "\n  ".join(problems[:30]))


def _prep(bins) -> str:
    return bins["prep"] if isinstance(bins, dict) else str(bins)


def pack(bins, src, out, *extra_args, check: bool = True, timeout: int = 300) -> subprocess.CompletedProcess:
    """Runs `fanstore-prep pack --input src --output out *extra_args`."""
    cmd = [_prep(bins), "pack", "--input", str(src), "--output", str(out), *map(str, extra_args)]
    return run(cmd, check=check, timeout=timeout)


def verify(bins, out, check: bool = True) -> subprocess.CompletedProcess:
    return run([_prep(bins), "verify", str(out)], check=check)


def extract(bins, out, dest, check: bool = True) -> subprocess.CompletedProcess:
    return run([_prep(bins), "extract", str(out), "--to", str(dest)], check=check)


def ls(bins, out, path: Optional[str] = None, check: bool = True) -> subprocess.CompletedProcess:
    # Names are raw bytes: undecodable ones come back as surrogate escapes (os.fsencode restores them).
    return run([_prep(bins), "ls", str(out)] + ([path] if path is not None else []), check=check, errors="surrogateescape")
