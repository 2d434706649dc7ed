"""Client matrix, coreutils: unmodified GNU tools read /fanstore exactly as the source tree.

Every expected value comes from the source tree (bytes, md5, os.lstat) or from
the same tool run natively on the source directory.
"""
import hashlib
import os
import shlex
import stat as st

import pytest

from conftest import run
from fs_clients import short_tmp, start_fs  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def fs(bins, tmp_path_factory):
    yield from start_fs(bins, tmp_path_factory, "coreutils", codec="lz4")


def first_mismatch(fs, files, node=0):
    """Returns the first file whose `cat` differs from the source (for a precise failure)."""
    for f in files:
        got = fs.run_bytes(["cat", fs.vpath(f)], node=node)
        if got != fs.src.bytes(f):
            return f"{f}: {len(got)} bytes read, {fs.src.size(f)} expected"
    return None


@pytest.mark.parametrize("node", [0, 1])
def test_cat_every_file(fs, node):
    files = fs.src.files
    got = fs.run_bytes(["cat", *[fs.vpath(f) for f in files]], node=node)
    want = b"".join(fs.src.bytes(f) for f in files)
    if got != want:
        pytest.fail(f"cat of {len(files)} files differs ({len(got)} vs {len(want)} bytes); "
                    f"first bad file: {first_mismatch(fs, files, node)}")


@pytest.mark.parametrize("node", [0, 3])
def test_dataset_covers_every_read_path(fs, node):
    """The matrix must exercise all four ways a file reaches a node: local raw (the
    extracted file), local lz4 (local decompression), remote raw, remote lz4."""
    cov = fs.coverage(node)
    for where in ("local", "remote"):
        for codec in (0, 1):
            assert cov.get((where, codec)), f"node {node}: no {where} file with codec {codec}: {sorted((k, len(v)) for k, v in cov.items())}"
    assert sum(len(v) for v in cov.values()) == len(fs.src.files)


@pytest.mark.parametrize("node", [0, 1, 2, 3])
def test_md5sum_every_file(fs, node):
    files = fs.src.files
    out = fs.run(["md5sum", *[fs.vpath(f) for f in files]], node=node).stdout
    got = {}
    for line in out.splitlines():
        digest, path = line.split("  ", 1)
        got[path] = digest
    want = {fs.vpath(f): fs.src.md5(f) for f in files}
    bad = sorted(p for p in want if got.get(p) != want[p])
    assert not bad, f"{len(bad)} of {len(files)} files with a wrong md5 on node {node}, e.g. {bad[:5]}"
    assert len(got) == len(files)


def test_head_c(fs):
    picks = ["own/big/random_2m.bin", "own/big/text_3m.txt", "own/pics/large.png",
             "own/text/lines_03.txt", "own/edge/page_4097.bin", "own/edge/one", "own/edge/empty"]
    for f in picks:
        data = fs.src.bytes(f)
        for n in (0, 1, 100, 4096, 4097, 1_000_000, 5_000_000):
            got = fs.run_bytes(["head", "-c", str(n), fs.vpath(f)], node=2)
            assert got == data[:n], f"head -c {n} {f}: {len(got)} bytes, first diff at {diff_at(got, data[:n])}"
        got = fs.run_bytes(["head", "-c", "-10", fs.vpath(f)], node=2)  # all but the last 10 bytes: seeks to the end
        assert got == data[:max(0, len(data) - 10)], f"head -c -10 {f}"
        got = fs.run_bytes(["tail", "-c", "777", fs.vpath(f)], node=2)
        assert got == data[-777:] if data else got == b"", f"tail -c 777 {f}"


def diff_at(a: bytes, b: bytes):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def test_wc_c_every_file(fs):
    files = fs.src.files
    out = fs.run(["wc", "-c", *[fs.vpath(f) for f in files]], node=1).stdout
    got = {}
    for line in out.splitlines():
        n, path = line.strip().split(" ", 1)
        got[path] = int(n)
    for f in files:
        assert got.get(fs.vpath(f)) == fs.src.size(f), f"wc -c {f}: {got.get(fs.vpath(f))} != {fs.src.size(f)}"
    assert got["total"] == fs.src.total_file_bytes()
    # wc -l counts newlines: reads the bytes, not st_size
    for f in fs.src.with_suffix(".txt", ".nums"):
        out = fs.run(["wc", "-l", fs.vpath(f)], node=1).stdout
        assert int(out.split()[0]) == fs.src.bytes(f).count(b"\n"), f"wc -l {f}"


def parse_ls_l(text: str):
    """Parses `ls -l --time-style=+%s` lines into {name: (mode_string, size, mtime)}."""
    rows = {}
    for line in text.splitlines():
        if not line or line.startswith("total "):
            continue
        parts = line.split(None, 6)  # mode nlink owner group size mtime name
        assert len(parts) == 7, f"unparsable ls -l line: {line!r}"
        mode, _nlink, _owner, _group, size, mtime, name = parts
        rows[name] = (mode, int(size), int(mtime))
    return rows


def ls_dirs(fs):
    return [""] + [d for d in fs.src.dirs if d.count("/") <= 2]


def test_ls_l(fs):
    checked = 0
    for d in ls_dirs(fs):
        cmd = lambda root: ["ls", "-l", "-A", "-N", "--time-style=+%s", os.path.join(root, d) if d else root]
        nat, vir = fs.both(cmd, node=3)
        want, got = parse_ls_l(nat), parse_ls_l(vir)
        assert sorted(got) == sorted(want), f"ls -l {d or '/'}: names differ: {sorted(set(got) ^ set(want))}"
        for name, (mode, size, mtime) in want.items():
            gmode, gsize, gmtime = got[name]
            assert gmode == mode, f"ls -l {d}/{name}: mode {gmode} != {mode}"
            if mode.startswith("-"):  # directory sizes are the file system's business
                assert (gsize, gmtime) == (size, mtime), f"ls -l {d}/{name}: size/mtime {(gsize, gmtime)} != {(size, mtime)}"
            checked += 1
    assert checked >= len(ls_dirs(fs))


def test_ls_R(fs):
    nat, vir = fs.both(lambda root: ["ls", "-R", "-A", "-N", root], node=0)
    assert vir == nat
    assert len(nat.splitlines()) > len(fs.src.files)


def test_ls_single_file_and_dir_flags(fs):
    f = "own/edge/with space.txt"
    nat, vir = fs.both(lambda root: ["ls", "-l", "-N", "--time-style=+%s", os.path.join(root, f)], node=1)
    assert parse_ls_l(vir.replace("<ROOT>/", "")) == parse_ls_l(nat.replace("<ROOT>/", ""))
    # ls -d on a directory, ls on the empty directory, ls -1 sorted by size
    nat, vir = fs.both(lambda root: ["ls", "-1", "-S", os.path.join(root, "own/edge")], node=1)
    assert vir == nat
    nat, vir = fs.both(lambda root: ["ls", "-A", os.path.join(root, "own/edge/emptydir")], node=1)
    assert vir == nat == ""


def test_find(fs):
    nat, vir = fs.both(lambda root: ["bash", "-c", f"find {shlex.quote(root)} -type f | LC_ALL=C sort"], node=2)
    assert vir == nat
    assert vir.splitlines() == sorted(f"<ROOT>/{f}" for f in fs.src.files)
    nat, vir = fs.both(lambda root: ["bash", "-c", f"find {shlex.quote(root)} -type d | LC_ALL=C sort"], node=2)
    assert vir == nat
    assert len(vir.splitlines()) == len(fs.src.dirs) + 1
    # fts with stat fields: size and mode of every entry, names, depth
    nat, vir = fs.both(lambda root: ["bash", "-c", f"find {shlex.quote(root)} -type f -printf '%P %s %m %d %T@\\n' | LC_ALL=C sort"], node=2)
    assert vir == nat
    for args in (["-name", "*.png"], ["-size", "+1M"], ["-empty"], ["-perm", "-u+x", "-type", "f"], ["-mindepth", "3", "-maxdepth", "3"]):
        nat, vir = fs.both(lambda root: ["bash", "-c", f"find {shlex.quote(root)} {' '.join(shlex.quote(a) for a in args)} | LC_ALL=C sort"], node=2)
        assert vir == nat, f"find {args}"
        assert nat, f"find {args} matched nothing in the source (bad test)"


def test_du_sb(fs):
    src, m = str(fs.src.root), fs.mount
    # per-file apparent sizes: identical
    nat, vir = fs.both(lambda root: ["bash", "-c", f"du -ab {shlex.quote(root)} | LC_ALL=C sort -k2"], node=3)
    files = {f"<ROOT>/{f}" for f in fs.src.files}
    pick = lambda text: sorted(l for l in text.splitlines() if l.split("\t", 1)[1] in files)
    assert pick(vir) == pick(nat)
    assert len(pick(vir)) == len(fs.src.files)
    # total apparent size: the files' bytes plus the directories' st_size as each file system reports it
    total_src = int(fs.run_native(["du", "-sb", src]).stdout.split()[0])
    total_fan = int(fs.run(["du", "-sb", m], node=3).stdout.split()[0])
    dir_sizes_src = sum(os.lstat(fs.src.path(d)).st_size for d in ["", *fs.src.dirs])
    dir_sizes_fan = sum(int(x) for x in fs.run(["find", m, "-type", "d", "-printf", "%s\\n"], node=3).stdout.split())
    files_and_links = fs.src.total_file_bytes() + sum(os.lstat(fs.src.path(l)).st_size for l in fs.src.links)
    # coreutils 9.1 (Debian 12) adds each directory's st_size to the total;
    # 9.7 (Debian 13) counts a directory's apparent size as 0. Whichever
    # this du does natively, it must do the same through the mount.
    dirs_counted = {files_and_links + dir_sizes_src: True, files_and_links: False}.get(total_src)
    assert dirs_counted is not None, f"native du -sb {total_src}: neither {files_and_links} nor + {dir_sizes_src}"
    assert total_fan == files_and_links + (dir_sizes_fan if dirs_counted else 0)


def test_stat(fs):
    files = fs.src.files
    out = fs.run(["stat", "-c", "%n|%s|%a|%F|%Y|%h", *[fs.vpath(f) for f in files]], node=0).stdout.splitlines()
    assert len(out) == len(files)
    for f, line in zip(files, out):
        s = os.lstat(fs.src.path(f))
        want = f"{fs.vpath(f)}|{s.st_size}|{st.S_IMODE(s.st_mode):o}|regular {'empty ' if s.st_size == 0 else ''}file|{int(s.st_mtime)}|1"
        assert line == want, f"stat {f}"
    dirs = fs.src.dirs
    out = fs.run(["stat", "-c", "%n|%a|%F", *[fs.vpath(d) for d in dirs]], node=0).stdout.splitlines()
    for d, line in zip(dirs, out):
        s = os.lstat(fs.src.path(d))
        assert line == f"{fs.vpath(d)}|{st.S_IMODE(s.st_mode):o}|directory", f"stat {d}"
    # stat of a missing path and through a file: same message as natively
    for bad in ("does/not/exist", "own/edge/one/x"):
        nat = fs.run_native(["stat", os.path.join(str(fs.src.root), bad)], check=False, errors="surrogateescape")
        vir = fs.run(["stat", fs.vpath(bad)], node=0, check=False)
        assert vir.returncode == nat.returncode != 0
        assert fs.normalize(vir.stderr) == fs.normalize(nat.stderr)


@pytest.mark.parametrize("sub", ["own", "."])
def test_cp_r_then_diff(fs, short_tmp, sub):
    dest = short_tmp if sub == "." else short_tmp / "x"   # the deep file needs a short destination
    fs.run(["cp", "-r", fs.vpath(sub) + ("/." if sub == "." else ""), str(dest)], node=3)
    r = run(["diff", "-r", str(dest), str(fs.src.path(sub))], check=False, errors="surrogateescape")
    assert r.returncode == 0, f"diff -r after cp -r {sub}:\n{r.stdout[:3000]}{r.stderr[:2000]}"


def test_cp_a_preserves_modes_and_mtimes(fs, tmp_path):
    dest = tmp_path / "edge"
    fs.run(["cp", "-a", fs.vpath("own/edge"), str(dest)], node=1)
    r = run(["diff", "-r", str(dest), str(fs.src.path("own/edge"))], check=False, errors="surrogateescape")
    assert r.returncode == 0, r.stdout + r.stderr
    for f in [f for f in fs.src.files if f.startswith("own/edge/")]:
        a, b = os.lstat(dest / f[len("own/edge/"):]), os.lstat(fs.src.path(f))
        assert (a.st_mode, a.st_size, a.st_mtime_ns) == (b.st_mode, b.st_size, b.st_mtime_ns), f"cp -a {f}"


def test_diff_r_virtual_against_source(fs):
    """diff itself walks both trees: one virtual (fts + openat), one real."""
    r = fs.run(["diff", "-r", fs.mount, str(fs.src.root)], node=2, check=False)
    assert r.returncode == 0, f"diff -r /fanstore src:\n{r.stdout[:3000]}{r.stderr[:2000]}"
    r = fs.run(["cmp", fs.vpath("own/big/text_3m.txt"), str(fs.src.path("own/big/text_3m.txt"))], node=2, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def test_tar_roundtrip(fs, short_tmp):
    out = short_tmp
    r = fs.run(["bash", "-c", f"set -o pipefail; tar -cf - -C {fs.mount} . | tar -xf - -C {shlex.quote(str(out))}"],
               node=2, check=False)
    assert r.returncode == 0, f"tar exited {r.returncode}: {r.stderr[:2000]}"  # tar warns when stat and read disagree
    assert "changed as we read it" not in r.stderr and "shrank" not in r.stderr, r.stderr
    r = run(["diff", "-r", str(out), str(fs.src.root)], check=False, errors="surrogateescape")
    assert r.returncode == 0, f"diff -r after tar:\n{r.stdout[:3000]}"
    for f in fs.src.files:
        a, b = os.lstat(out / f), os.lstat(fs.src.path(f))
        assert (st.S_IMODE(a.st_mode), int(a.st_mtime)) == (st.S_IMODE(b.st_mode), int(b.st_mtime)), f"tar kept {f}"
    # the listing itself
    nat, vir = fs.both(lambda root: ["bash", "-c", f"tar -cf - -C {shlex.quote(root)} own | tar -tvf - | awk '{{print $1, $3, $6}}' | LC_ALL=C sort"], node=2)
    assert vir == nat


def test_bash_redirects_and_pipes(fs):
    for f in ["own/text/lines_01.txt", "own/big/random_2m.bin", "own/pics/rgb_2.png", "own/edge/empty", fs.src.files[len(fs.src.files) // 2]]:
        q = shlex.quote(fs.vpath(f))
        got = fs.run_bytes(["bash", "-c", f"cat < {q}"], node=1)
        assert got == fs.src.bytes(f), f"cat < {f}"
        got = fs.run(["bash", "-c", f"wc -c < {q}; cat {q} | md5sum; exec 3< {q}; head -c 10 <&3 | od -An -tx1 | tr -d ' \\n'"], node=1).stdout.split("\n")
        data = fs.src.bytes(f)
        assert int(got[0]) == len(data), f"wc -c < {f}"
        assert got[1].split()[0] == hashlib.md5(data).hexdigest(), f"cat | md5sum {f}"
        assert got[2] == data[:10].hex(), f"exec 3< {f}"


def test_child_of_sh_inherits_preload(fs):
    f = "own/arrays/f32_2d.npy"
    out = fs.run(["/bin/sh", "-c", f"sh -c 'md5sum {fs.vpath(f)}'"], node=3).stdout.split()
    assert out[0] == fs.src.md5(f)
    # xargs -0 forks md5sum for batches of files found by find
    out = fs.run(["bash", "-c", f"find {fs.vpath('own/many')} -type f -print0 | xargs -0 -n 7 md5sum | LC_ALL=C sort -k2"], node=3).stdout
    got = dict(reversed(l.split("  ", 1)) for l in out.splitlines())
    want = {fs.vpath(f): fs.src.md5(f) for f in fs.src.files if f.startswith("own/many/")}
    assert got == want


def test_dd_grep_sort(fs):
    """dd with skip/count (lseek + read at offsets), grep -r (fts + openat), sort of a virtual file."""
    f = "own/big/text_3m.txt"
    data = fs.src.bytes(f)
    for bs, skip, count in [(4096, 3, 5), (1, 12345, 100), (65536, 40, 100), (1000000, 2, 2)]:
        got = fs.run_bytes(["dd", f"if={fs.vpath(f)}", f"bs={bs}", f"skip={skip}", f"count={count}", "status=none"], node=1)
        assert got == data[bs * skip:bs * (skip + count)], f"dd bs={bs} skip={skip} count={count}"
    nat, vir = fs.both(lambda root: ["bash", "-c", f"grep -rc -a -e alpha -e zzz {shlex.quote(root)}/own | LC_ALL=C sort"], node=1)
    assert vir == nat and "text_3m.txt:" in nat
    nat, vir = fs.both(lambda root: ["bash", "-c", f"grep -rl --include='*.txt' quick {shlex.quote(root)} | LC_ALL=C sort"], node=1)
    assert vir == nat
    nat, vir = fs.both(lambda root: ["bash", "-c", f"LC_ALL=C sort {shlex.quote(root)}/own/text/lines_04.txt | md5sum"], node=1)
    assert vir == nat


def test_shell_builtins_tests_and_globs(fs):
    """bash's own test builtins (stat, faccessat/eaccess) and glob expansion (opendir/readdir)."""
    script = r"""
r=$1
for p in own/edge/one own/edge/empty own/edge/exec.sh own/edge/readonly.txt own/edge own/edge/emptydir missing \
         a/link_to_file link_to_dir own/edge/one/x; do
  printf '%s:' "$p"
  for t in -e -f -d -r -x -s -L -h; do if [ $t "$r/$p" ]; then printf ' %s' "$t"; fi; done
  echo
done
[ "$r/own/edge/one" -nt "$r/own/edge/empty" ] && echo newer || echo not-newer
[ "$r/own/edge/one" -ef "$r/own/edge/../edge/one" ] && echo same-file || echo other-file
echo "$r"/own/pics/*.png
echo "$r"/own/many/d[12]/f0?.dat
echo "$r"/own/edge/.h*
echo "$r"/nomatch/*
shopt -s globstar; n=0; for f in "$r"/own/**; do n=$((n+1)); done; echo "globstar $n"
"""
    path = fs.script("shell_tests.sh", script)
    nat, vir = fs.both(lambda root: ["bash", path, root], node=2)
    assert "own/edge/exec.sh: -e -f -r -x -s" in nat and "<ROOT>/own/pics/alpha.png" in nat
    assert vir == nat
    # -w: an input is never writable on /fanstore
    out = fs.run(["bash", "-c", f"[ -w {fs.vpath('own/edge/one')} ] && echo writable || echo read-only"], node=2).stdout
    assert out.strip() == "read-only"


def test_realpath_readlink_commands(fs):
    paths = ["own/./edge//one", "link_to_dir/c", "a/link_to_file", "d/e/up_link", "own/edge/deep/a/../a/b"]
    for cmd in (["realpath"], ["readlink", "-f"], ["stat", "-L", "-c", "%s %F"], ["stat", "-c", "%s %F %N"]):
        nat, vir = fs.both(lambda root: [*cmd, *[os.path.join(root, p) for p in paths]], node=0)
        assert vir == nat, f"{cmd}"


def test_bash_cd_into_mount_then_children(fs):
    """`cd /fanstore/...` in a shell, then programs started there use relative names
    (a training script launched from inside the dataset). The children's kernel cwd
    cannot be a virtual directory: the preload must carry the virtual cwd across exec."""
    cmd = lambda root: ["bash", "-c", f"cd {shlex.quote(root)}/own/edge && pwd && cat one && ls && md5sum page_4097.bin "
                        f"&& cd deep/a && pwd && ls -R . && /bin/pwd"]
    nat, vir = fs.both(cmd, node=1)
    assert vir == nat
