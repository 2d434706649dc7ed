"""End-to-end tests of fanstore-prep: round trips, determinism, every bad
input of issue 2, and verify catching corruption. Runs the release binary."""
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from conftest import BIN, run
from fs_prep import (
    DEEP_FILE,
    EMPTY_DIR,
    EMPTY_FILE,
    LONG_NAME_PATH,
    MARKER,
    NON_UTF8_NAME,
    SYMLINKS,
    assert_trees_equal,
    extract,
    ls,
    make_tree,
    open_rel,
    pack,
    tree_listing,
    verify,
)

NOBODY = 65534


@pytest.fixture(scope="module")
def prep():
    """Only fanstore-prep is needed here (not the daemon or preload library)."""
    p = BIN / "fanstore-prep"
    if not p.exists():
        pytest.fail(f"{p} missing: run `cargo build --release -p fanstore-prep`")
    return {"prep": str(p)}


@pytest.fixture(scope="module")
def mixed_tree(tmp_path_factory):
    return make_tree(tmp_path_factory.mktemp("mixed") / "src", kind="mixed", n_files=60, seed=1)


def dataset_files(out: Path):
    return sorted(p.name for p in out.iterdir())


def assert_nothing_left(out: Path):
    """A failed pack leaves no dataset: no manifest, no partitions, and verify refuses it."""
    if out.exists():
        left = [n for n in dataset_files(out) if n == "manifest.fsm" or n.endswith(".fsp") or n.startswith(".manifest")]
        assert left == [], f"failed pack left {left} in {out}"


def diff_r(base: Path, a: str, b: str):
    # Relative names from `base` keep every path below PATH_MAX for diff.
    r = subprocess.run(["diff", "-r", "--no-dereference", a, b], cwd=base, capture_output=True)
    assert r.returncode == 0, r.stdout.decode(errors="replace")[:2000] + r.stderr.decode(errors="replace")[:2000]


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("codec", ["none", "lz4", "zstd"])
def test_round_trip_is_exact(prep, mixed_tree, tmp_path, codec):
    # Extract next to the source so that diff can use short relative names.
    out, back = tmp_path / "ds", mixed_tree.parent / f"back-{codec}"
    r = pack(prep, mixed_tree, out, "--compress", codec, "--partitions", "3", "--replicate-dir", "d")
    assert "packed" in r.stdout and "ratio" in r.stdout and "files/s" in r.stdout
    names = dataset_files(out)
    n_replicated = int(r.stdout.split(" replicated)")[0].rsplit("(", 1)[1])
    assert n_replicated >= 1 and names == ["manifest.fsm"] + [f"part-{i:06d}.fsp" for i in range(3 + n_replicated)]
    v = verify(prep, out)
    assert v.stdout.startswith("OK ")
    extract(prep, out, back)
    diff_r(mixed_tree.parent, "src", back.name)
    assert_trees_equal(mixed_tree, back)
    listing = tree_listing(back)
    assert listing[EMPTY_FILE].size == 0 and listing[EMPTY_DIR].kind == "dir"
    assert listing[NON_UTF8_NAME].kind == "file"
    assert len(LONG_NAME_PATH.rsplit(b"/", 1)[1]) == 255 and listing[LONG_NAME_PATH].kind == "file"
    assert listing[DEEP_FILE].size == 1000 and len(DEEP_FILE) == 4080
    for link, target in SYMLINKS.items():
        assert listing[link].kind == "symlink" and listing[link].target == target
    if codec != "none":
        assert "ratio 1.00" not in r.stdout


def test_round_trip_of_image_tree(prep, tmp_path):
    src = make_tree(tmp_path / "src", kind="images", n_files=40, seed=3)
    out, back = tmp_path / "ds", tmp_path / "back"
    pack(prep, src, out, "--compress", "zstd:5", "--replicate-dir", "val")
    verify(prep, out)
    extract(prep, out, back)
    assert_trees_equal(src, back)
    import numpy as np
    from PIL import Image

    png = next((back / "train").rglob("*.png"))
    assert Image.open(png).size == (32, 32)
    npy = next((back / "train").rglob("*.npy"))
    assert np.load(npy).shape == (16, 16)


def test_sparse_file_over_4gib_round_trips_quickly(prep, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    big = src / "sparse.img"
    size = (4 << 30) + (64 << 20) + 12345
    with open(big, "wb") as f:
        f.truncate(size)
        for off, data in [(0, b"head"), (1 << 30, b"one GiB"), ((4 << 30) + 7, b"past 4 GiB"), (size - 3, b"end")]:
            f.seek(off)
            f.write(data)
    (src / "small.txt").write_bytes(b"small\n")
    os.utime(big, ns=(1_500_000_000_123_456_789, 1_600_000_000_987_654_321))
    out, back = tmp_path / "ds", tmp_path / "back"
    t0 = time.monotonic()
    r = pack(prep, src, out, "--compress", "lz4", "--progress", "plain")
    verify(prep, out)
    extract(prep, out, back)
    elapsed = time.monotonic() - t0  # pack + verify + extract: holes are never paged in
    st = os.stat(back / "sparse.img")
    assert st.st_size == size
    assert st.st_blocks * 512 < (16 << 20), "extracted file is not sparse"
    assert st.st_mtime_ns == 1_600_000_000_987_654_321
    assert sum(p.stat().st_size for p in out.iterdir()) < (64 << 20), "zeros were not compressed"
    assert elapsed < 15, f"sparse pack + verify + extract took {elapsed:.1f} s"
    assert_trees_equal(src, back)
    diff_r(tmp_path, "src", "back")  # reads 2 x 4 GiB of zeros: most of this test's time


# ---------------------------------------------------------------- determinism


def test_output_is_byte_identical_whatever_the_thread_count(prep, mixed_tree, tmp_path):
    outs = []
    for threads in ["1", "4"]:
        out = tmp_path / f"t{threads}"
        pack(prep, mixed_tree, out, "--compress", "lz4", "--partitions", "4", "--threads", threads)
        outs.append(out)
    names = dataset_files(outs[0])
    assert names == dataset_files(outs[1]) and len(names) == 5
    for n in names:
        assert (outs[0] / n).read_bytes() == (outs[1] / n).read_bytes(), f"{n} differs between 1 and 4 threads"


def test_partitions_are_balanced_by_bytes(prep, tmp_path):
    src = tmp_path / "src"
    (src / "small").mkdir(parents=True)
    (src / "big").mkdir()
    for i in range(400):
        (src / "small" / f"{i:04d}").write_bytes(os.urandom(1000))
    for i in range(8):
        (src / "big" / f"{i}").write_bytes(os.urandom(100_000))
    out = tmp_path / "ds"
    pack(prep, src, out, "--partitions", "4")
    sizes = [(out / f"part-{i:06d}.fsp").stat().st_size for i in range(4)]
    assert max(sizes) - min(sizes) < 110_000, sizes  # within one big file; equal counts would be ~3x off


def test_partition_size_sets_the_count(prep, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(10):
        (src / f"f{i}").write_bytes(os.urandom(100_000))
    out = tmp_path / "ds"
    pack(prep, src, out, "--partition-size", "250K")
    assert len([n for n in dataset_files(out) if n.endswith(".fsp")]) == 4  # ceil(1,000,000 / 256,000)


def test_plain_progress_lines_and_summary(prep, tmp_path):
    src = tmp_path / "src"
    for d in range(5):
        (src / f"d{d}").mkdir(parents=True)
        for i in range(100):
            (src / f"d{d}" / f"{i}").write_bytes(os.urandom(20_000))
    r = pack(prep, src, tmp_path / "ds", "--progress", "plain", "--progress-interval", "0.001", "--threads", "1")
    lines = [l for l in r.stderr.splitlines() if l.startswith("fanstore-prep: packing: ")]
    assert lines and "/500 files" in lines[-1] and "MB/s" in lines[-1], r.stderr
    for field in ["packed 500 files", "5 directories", "MB in", "MB stored", "ratio 1.00", " s, ", "MB/s", "files/s"]:
        assert field in r.stdout, (field, r.stdout)


# ---------------------------------------------------------------- ls


def test_ls_lists_like_ls_l(prep, mixed_tree, tmp_path):
    out = tmp_path / "ds"
    pack(prep, mixed_tree, out)
    root = ls(prep, out).stdout.splitlines()
    assert any(line.startswith("drwxr-x--- ") and line.endswith(" d") for line in root), root
    assert any(line.endswith(" link_to_dir -> a/b") and line.startswith("lrwxrwxrwx") for line in root), root
    assert any(line.startswith("-rw-r--r-- ") and line.endswith(" empty.txt") for line in root), root
    one = ls(prep, out, "a/b/c/compressible.txt").stdout.split()
    assert one[0] == "-rw-r--r--" and one[2] == "200000" and one[-1] == "a/b/c/compressible.txt"
    missing = ls(prep, out, "nope", check=False)
    assert missing.returncode != 0 and "nope" in missing.stderr


def run_into_closed_pipe(cmd) -> subprocess.CompletedProcess:
    """Runs cmd with its stdout a pipe whose reader is already gone, as after
    `cmd | head` once head has exited: every write meets EPIPE."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run(cmd, stdout=w, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(w)


def test_output_into_a_closed_pipe_ends_quietly_like_coreutils(prep, tmp_path):
    """`fanstore-prep ls DS | head -1` prints no "Broken pipe": like coreutils'
    ls, the process is killed by SIGPIPE (bash reports 141), silently."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3000):  # a listing of ~500 KB: far more than a pipe holds
        (src / f"{'n' * 120}{i:05d}").write_bytes(b"")
    out = tmp_path / "ds"
    pack(prep, src, out)
    r = subprocess.run(["bash", "-c", 'set +o pipefail; "$0" ls "$1" | head -1; echo "ls-status=${PIPESTATUS[0]}" >&2',
                        prep["prep"], str(out)], capture_output=True, text=True, timeout=120)
    assert r.stdout.count("\n") == 1 and "n" * 120 in r.stdout, r.stdout[:300]
    assert r.stderr == "ls-status=141\n", r.stderr
    r = run_into_closed_pipe([prep["prep"], "ls", str(out)])
    assert (r.returncode, r.stderr) == (-13, ""), r
    # pack, verify and extract print one summary line: quiet too, and the
    # dataset is complete (the summary is printed after the manifest).
    out2 = tmp_path / "ds2"
    r = run_into_closed_pipe([prep["prep"], "pack", "--input", str(src), "--output", str(out2), "--progress", "off"])
    assert (r.returncode, r.stderr) == (-13, ""), r
    for cmd in (["verify", str(out2)], ["extract", str(out2), "--to", str(tmp_path / "x")]):
        r = run_into_closed_pipe([prep["prep"], *cmd])
        assert (r.returncode, r.stderr) == (-13, ""), (cmd, r)
    assert len(os.listdir(tmp_path / "x")) == 3000


# ---------------------------------------------------------------- bad input


@pytest.fixture
def nobody_dir():
    """A directory that user nobody owns and can reach (pytest's tmp is 0700 root)."""
    d = Path(tempfile.mkdtemp(prefix="fanstore-prep-nobody-"))
    os.chmod(d, 0o755)
    yield d
    for p in d.rglob("*"):
        if p.is_dir() and not p.is_symlink():
            os.chmod(p, 0o755)
    shutil.rmtree(d)


def as_nobody(prep_copy: Path, *args):
    cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", str(prep_copy), *map(str, args)]
    return run(cmd, check=False)


def nobody_setup(prep, d: Path):
    """An input tree and a prep binary owned by nobody; root bypasses chmod 000, nobody does not."""
    src = d / "src"
    (src / "x").mkdir(parents=True)
    (src / "x" / "ok.txt").write_bytes(b"fine\n")
    (src / "x" / "secret.bin").write_bytes(b"top secret\n")
    (src / "y").mkdir()
    (src / "y" / "inner.txt").write_bytes(b"inner\n")
    binary = d / "fanstore-prep"
    shutil.copy2(prep["prep"], binary)
    for p in [d, *d.rglob("*")]:
        os.chown(p, NOBODY, NOBODY, follow_symlinks=False)
    return src, binary


def test_unreadable_file_is_refused_or_skipped(prep, nobody_dir):
    src, binary = nobody_setup(prep, nobody_dir)
    os.chmod(src / "x" / "secret.bin", 0)
    out = nobody_dir / "out"
    r = as_nobody(binary, "pack", "--input", src, "--output", out)
    assert r.returncode != 0
    assert "x/secret.bin" in r.stderr and "unreadable" in r.stderr and "Permission denied" in r.stderr, r.stderr
    assert_nothing_left(out)
    assert verify(prep, out, check=False).returncode != 0
    r = as_nobody(binary, "pack", "--input", src, "--output", out, "--skip-unreadable")
    assert r.returncode == 0, r.stderr
    assert "warn" in r.stderr and "x/secret.bin" in r.stderr
    verify(prep, out)
    names = ls(prep, out, "x").stdout
    assert "ok.txt" in names and "secret.bin" not in names


def test_unreadable_directory_is_refused_or_skipped(prep, nobody_dir):
    src, binary = nobody_setup(prep, nobody_dir)
    os.chmod(src / "y", 0)
    out = nobody_dir / "out"
    r = as_nobody(binary, "pack", "--input", src, "--output", out)
    assert r.returncode != 0 and "unreadable directory" in r.stderr and str(src / "y") in r.stderr, r.stderr
    assert_nothing_left(out)
    r = as_nobody(binary, "pack", "--input", src, "--output", out, "--skip-unreadable")
    assert r.returncode == 0, r.stderr
    assert "skipping unreadable directory" in r.stderr
    assert " y\n" not in ls(prep, out).stdout + "\n"
    verify(prep, out)


def test_file_that_grows_while_packing_is_refused(prep, tmp_path):
    src = tmp_path / "src"
    (src / "aaa").mkdir(parents=True)
    for i in range(1500):
        (src / "aaa" / f"{i:05d}").write_bytes(os.urandom(16_000))
    growing = src / "zzz-growing.log"
    growing.write_bytes(b"start\n")
    stop = threading.Event()

    def append():
        with open(growing, "ab", buffering=0) as f:
            while not stop.is_set():
                f.write(b"x" * 64)
                time.sleep(0.0002)

    failures = []
    for attempt in range(3):  # the race is wide (all of aaa/ is read first), but is a race
        out = tmp_path / f"out{attempt}"
        stop.clear()
        t = threading.Thread(target=append)
        t.start()
        try:
            r = pack(prep, src, out, "--threads", "1", check=False)
        finally:
            stop.set()
            t.join()
        if r.returncode != 0:
            failures.append(r)
            break
    assert failures, "the growing file was never caught"
    err = failures[0].stderr
    assert "zzz-growing.log" in err and "changed size while being packed" in err, err
    assert_nothing_left(out)
    assert verify(prep, out, check=False).returncode != 0


@pytest.mark.parametrize("kind", ["fifo", "socket", "device"])
def test_special_files_are_refused_or_skipped(prep, tmp_path, kind):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "regular.txt").write_bytes(b"ok\n")
    special = src / "sub" / "special"
    sock = None
    if kind == "fifo":
        os.mkfifo(special)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(special))
    else:
        os.mknod(special, 0o600 | 0o020000, os.makedev(1, 3))  # like /dev/null
    try:
        out = tmp_path / "out"
        r = pack(prep, src, out, check=False)
        expected = {"fifo": "fifo", "socket": "socket", "device": "character device"}[kind]
        assert r.returncode != 0 and "sub/special" in r.stderr and f"special file ({expected})" in r.stderr, r.stderr
        assert_nothing_left(out)
        r = pack(prep, src, out, "--skip-special")
        assert "skipping special file" in r.stderr and "sub/special" in r.stderr
        assert "regular.txt" in ls(prep, out, "sub").stdout and "special" not in ls(prep, out, "sub").stdout
        verify(prep, out)
    finally:
        if sock:
            sock.close()


@pytest.mark.parametrize("target", ["../../outside", "/etc/passwd", "../x/../../src-evil/f"])
def test_symlink_outside_the_tree_is_refused(prep, tmp_path, target):
    src = tmp_path / "src"
    (src / "x").mkdir(parents=True)
    (src / "x" / "f").write_bytes(b"f\n")
    os.symlink(target, src / "x" / "bad_link")
    out = tmp_path / "out"
    r = pack(prep, src, out, check=False)
    assert r.returncode != 0 and "x/bad_link" in r.stderr and "outside the input tree" in r.stderr and target in r.stderr, r.stderr
    assert_nothing_left(out)


def test_absolute_symlink_inside_the_tree_becomes_relative(prep, tmp_path):
    src = tmp_path / "src"
    (src / "x" / "y").mkdir(parents=True)
    (src / "x" / "f").write_bytes(b"f\n")
    os.symlink(str(src / "x" / "f"), src / "x" / "y" / "abs_link")
    out, back = tmp_path / "out", tmp_path / "back"
    pack(prep, src, out)
    extract(prep, out, back)
    assert os.readlink(back / "x" / "y" / "abs_link") == "../f"
    assert (back / "x" / "y" / "abs_link").read_bytes() == b"f\n"


def test_output_that_holds_a_dataset_is_refused(prep, mixed_tree, tmp_path):
    out = tmp_path / "ds"
    pack(prep, mixed_tree, out)
    before = {n: (out / n).read_bytes() for n in dataset_files(out)}
    r = pack(prep, mixed_tree, out, check=False)
    assert r.returncode != 0 and "already holds a dataset" in r.stderr and "manifest.fsm" in r.stderr and str(out) in r.stderr
    assert before == {n: (out / n).read_bytes() for n in dataset_files(out)}, "refused pack touched the dataset"
    verify(prep, out)
    # Partitions alone (an interrupted pack) are refused too.
    stale = tmp_path / "stale"
    stale.mkdir()
    (stale / "part-000000.fsp").write_bytes(b"junk")
    r = pack(prep, mixed_tree, stale, check=False)
    assert r.returncode != 0 and "part-000000.fsp" in r.stderr and "unfinished" in r.stderr
    assert (stale / "part-000000.fsp").read_bytes() == b"junk"


def test_bad_options_are_refused(prep, mixed_tree, tmp_path):
    cases = [
        (["--replicate-dir", "nope"], "no such directory"),
        (["--replicate-dir", "empty.txt"], "not a directory"),
        (["--replicate-dir", "../x"], "'..'"),
        (["--partitions", "0"], "at least 1"),
        (["--compress", "gzip"], "unknown compression"),
        (["--partition-size", "12Q"], "suffix"),
        (["--partitions", "2", "--partition-size", "1M"], "cannot be used with"),
    ]
    for args, message in cases:
        out = tmp_path / "out"
        r = pack(prep, mixed_tree, out, *args, check=False)
        assert r.returncode != 0 and message in r.stderr, (args, r.stderr)
        assert not out.exists(), f"{args}: output left behind"
    r = pack(prep, mixed_tree, mixed_tree / "a" / "inside", check=False)
    assert r.returncode != 0 and "inside the input tree" in r.stderr
    assert not (mixed_tree / "a" / "inside").exists()


# ---------------------------------------------------------------- verify


@pytest.fixture
def small_dataset(prep, mixed_tree, tmp_path):
    out = tmp_path / "ds"
    pack(prep, mixed_tree, out, "--partitions", "2")
    return out


def flip(path: Path, offset: int):
    b = bytearray(path.read_bytes())
    b[offset] ^= 0x20
    path.write_bytes(bytes(b))


def failing_verify(prep, out):
    r = verify(prep, out, check=False)
    assert r.returncode == 1, f"verify accepted a corrupt dataset:\n{r.stdout}{r.stderr}"
    return r.stderr


def test_verify_names_a_flipped_partition_header_byte(prep, small_dataset):
    flip(small_dataset / "part-000001.fsp", 20)
    err = failing_verify(prep, small_dataset)
    assert "part-000001.fsp" in err and "checksum mismatch in partition header at offset 0" in err, err


def test_verify_names_a_flipped_payload_byte(prep, small_dataset):
    part = next(p for p in sorted(small_dataset.glob("part-*")) if MARKER in p.read_bytes())
    at = part.read_bytes().index(MARKER) + 5
    flip(part, at)
    err = failing_verify(prep, small_dataset)
    assert part.name in err and "checksum mismatch in payload of entry" in err, err
    # The fault names the payload's offset, which is at or before the flipped byte.
    offset = int(err.split("payload of entry")[1].split("at offset ")[1].split()[0])
    assert offset <= at < offset + 10_000


def test_verify_names_a_flipped_entry_header_byte(prep, small_dataset):
    part = next(p for p in sorted(small_dataset.glob("part-*")) if MARKER in p.read_bytes())
    payload = part.read_bytes().index(MARKER)
    flip(part, payload - 40)  # inside the 48-byte entry header
    err = failing_verify(prep, small_dataset)
    assert f"entry header at offset {payload - 48}" in err and "checksum" in err, err


def test_verify_names_a_flipped_manifest_byte(prep, small_dataset):
    m = small_dataset / "manifest.fsm"
    for offset in [30, m.stat().st_size // 2, m.stat().st_size - 3]:
        flip(m, offset)
        err = failing_verify(prep, small_dataset)
        assert "manifest.fsm" in err and "checksum mismatch in" in err, err
        flip(m, offset)
    verify(prep, small_dataset)


def test_verify_refuses_a_dataset_without_manifest(prep, small_dataset):
    (small_dataset / "manifest.fsm").unlink()
    err = failing_verify(prep, small_dataset)
    assert "manifest.fsm: missing" in err, err


def test_verify_catches_partitions_of_another_pack_and_truncation(prep, mixed_tree, small_dataset, tmp_path):
    other = tmp_path / "other"
    pack(prep, mixed_tree, other, "--partitions", "2", "--compress", "lz4")
    shutil.copy(other / "part-000000.fsp", small_dataset / "part-000000.fsp")
    err = failing_verify(prep, small_dataset)
    assert "part-000000.fsp" in err and "dataset id" in err, err
    part = other / "part-000001.fsp"
    with open(part, "r+b") as f:
        f.truncate(part.stat().st_size - 1)
    err = failing_verify(prep, other)
    assert "part-000001.fsp" in err and "header says" in err, err
    (small_dataset / "part-000007.fsp").write_bytes(b"")
    assert "part-000007.fsp: partition file not listed" in failing_verify(prep, small_dataset)


def test_extract_refuses_corrupt_payload_and_nonempty_destination(prep, small_dataset, tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "x").write_bytes(b"")
    r = extract(prep, small_dataset, dest, check=False)
    assert r.returncode != 0 and "not an empty directory" in r.stderr
    part = next(p for p in sorted(small_dataset.glob("part-*")) if MARKER in p.read_bytes())
    flip(part, part.read_bytes().index(MARKER) + 1)
    r = extract(prep, small_dataset, tmp_path / "dest2", check=False)
    assert r.returncode != 0 and "checksum mismatch" in r.stderr and "d/marker.bin" in r.stderr, r.stderr


def test_deep_path_is_readable_in_the_extracted_tree(prep, mixed_tree, tmp_path):
    out, back = tmp_path / "ds", tmp_path / "back"
    pack(prep, mixed_tree, out, "--compress", "zstd")
    extract(prep, out, back)
    fd = open_rel(back, DEEP_FILE)
    try:
        assert os.read(fd, 100) == (b"deep file\n" * 10)
    finally:
        os.close(fd)
    assert len(os.fsencode(back)) + 1 + len(DEEP_FILE) > 4096, "the deep path should exceed PATH_MAX when absolute"
