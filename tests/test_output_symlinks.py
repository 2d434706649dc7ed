"""Symlinks among outputs: created on one node, followed in every path call on
every node, checked call by call against a native directory (the same script
runs on both; paths are reported relative to the root). Then they survive a
directory rename, `fanstore stop` + a new job on the same `--persist`, and
`fanstore export` writes them as symlinks."""
import json
import os
import subprocess

import pytest

from fs_diff import differences, run_script as run, script
from fs_cluster import packed_cluster

MOUNT = "/fanstore"

SCRIPT = script(r"""
import errno, json, os, shutil, stat, sys
root, outside = sys.argv[1], sys.argv[2]
J = lambda *p: os.path.join(root, *p)
rel = lambda p: os.path.relpath(p, root)
os.makedirs(J("run", "ck-9", "sub"))
with open(J("run", "ck-9", "model.pt"), "wb") as f:
    f.write(b"weights" * 100)
attempt("symlink dir", lambda: os.symlink("ck-9", J("run", "latest")))
attempt("readlink", lambda: os.readlink(J("run", "latest")))
attempt("lstat is link", lambda: stat.S_ISLNK(os.lstat(J("run", "latest")).st_mode))
attempt("lstat size", lambda: os.lstat(J("run", "latest")).st_size)
attempt("stat follows", lambda: stat.S_ISDIR(os.stat(J("run", "latest")).st_mode))
attempt("islink isdir", lambda: (os.path.islink(J("run", "latest")), os.path.isdir(J("run", "latest"))))
attempt("read through", lambda: len(open(J("run", "latest", "model.pt"), "rb").read()))
attempt("stat through", lambda: os.stat(J("run", "latest", "model.pt")).st_size)
attempt("listdir through", lambda: sorted(os.listdir(J("run", "latest"))))
attempt("scandir types", lambda: sorted((e.name, e.is_symlink(), e.is_dir(), e.is_file()) for e in os.scandir(J("run"))))
def write_through():
    with open(J("run", "latest", "new.txt"), "w") as f:
        f.write("via link")
    return open(J("run", "ck-9", "new.txt")).read()
attempt("write through", write_through)
attempt("mkdir through", lambda: (os.mkdir(J("run", "latest", "made")), os.path.isdir(J("run", "ck-9", "made")))[1])
attempt("dotdot of link dir", lambda: sorted(os.listdir(J("run", "latest", ".."))))
def cd():
    here = os.getcwd()
    os.chdir(J("run", "latest"))
    try:
        return (rel(os.getcwd()), open("model.pt", "rb").read(3).decode(), sorted(os.listdir(".."))[:3])
    finally:
        os.chdir(here)
attempt("chdir through", cd)
attempt("file link", lambda: os.symlink("ck-9/model.pt", J("run", "model-link")))
attempt("file link read", lambda: open(J("run", "model-link"), "rb").read(7).decode())
attempt("file link stat", lambda: os.stat(J("run", "model-link")).st_size)
def append_through():
    with open(J("run", "model-link"), "ab") as f:
        f.write(b"+")
    return (os.path.islink(J("run", "model-link")), os.stat(J("run", "ck-9", "model.pt")).st_size)
attempt("append through file link", append_through)
attempt("chmod through", lambda: (os.chmod(J("run", "model-link"), 0o600), oct(os.stat(J("run", "ck-9", "model.pt")).st_mode))[1])
attempt("dotdot target", lambda: os.symlink("../run/ck-9/sub", J("run", "ck-9", "up")))
attempt("dotdot target stat", lambda: stat.S_ISDIR(os.stat(J("run", "ck-9", "up")).st_mode))
attempt("absolute inside", lambda: os.symlink(J("run", "ck-9"), J("run", "abs")))
attempt("absolute inside read", lambda: open(J("run", "abs", "model.pt"), "rb").read(3).decode())
attempt("absolute outside", lambda: os.symlink(outside, J("run", "ext")))
attempt("absolute outside read", lambda: open(J("run", "ext")).read())
attempt("absolute outside stat", lambda: os.stat(J("run", "ext")).st_size)
attempt("chain", lambda: (os.symlink("latest", J("run", "l2")), os.symlink("l2", J("run", "l3")), open(J("run", "l3", "model.pt"), "rb").read(2))[2].decode())
attempt("loop", lambda: (os.symlink("loop-b", J("run", "loop-a")), os.symlink("loop-a", J("run", "loop-b")), os.stat(J("run", "loop-a")))[2])
attempt("dangling", lambda: os.symlink("nothing-yet", J("run", "dangling")))
attempt("dangling lstat stat exists", lambda: (stat.S_ISLNK(os.lstat(J("run", "dangling")).st_mode), os.path.exists(J("run", "dangling")), os.path.lexists(J("run", "dangling"))))
attempt("dangling stat", lambda: os.stat(J("run", "dangling")))
def create_through_dangling():
    with open(J("run", "dangling"), "w") as f:
        f.write("made")
    return (os.path.islink(J("run", "dangling")), open(J("run", "nothing-yet")).read())
attempt("create through dangling", create_through_dangling)
attempt("symlink over file", lambda: os.symlink("x", J("run", "ck-9", "model.pt")))
attempt("symlink over link", lambda: os.symlink("x", J("run", "latest")))
attempt("symlink under file", lambda: os.symlink("x", J("run", "ck-9", "model.pt", "l")))
attempt("symlink in missing dir", lambda: os.symlink("x", J("run", "nodir", "l")))
attempt("readlink of file", lambda: os.readlink(J("run", "ck-9", "model.pt")))
attempt("readlink missing", lambda: os.readlink(J("run", "nope")))
attempt("rmdir link", lambda: os.rmdir(J("run", "latest")))
attempt("mkdir over link", lambda: os.mkdir(J("run", "latest")))
attempt("lexists after", lambda: os.path.lexists(J("run", "latest")))
attempt("rename link", lambda: (os.rename(J("run", "l3"), J("run", "l4")), os.readlink(J("run", "l4")), os.path.lexists(J("run", "l3")))[1:])
def rename_over_link():
    os.symlink("ck-9", J("run", "latest.tmp"))
    os.replace(J("run", "latest.tmp"), J("run", "l4"))
    return os.readlink(J("run", "l4"))
attempt("replace link", rename_over_link)
def file_over_link():
    with open(J("run", "f.tmp"), "w") as f:
        f.write("file now")
    os.replace(J("run", "f.tmp"), J("run", "l2"))
    return (os.path.islink(J("run", "l2")), open(J("run", "l2")).read(), os.path.isdir(J("run", "ck-9")))
attempt("replace link with file", file_over_link)
attempt("unlink link keeps target", lambda: (os.unlink(J("run", "model-link")), os.path.exists(J("run", "ck-9", "model.pt")))[1])
def rotate():
    # HF Trainer: checkpoint-N dirs, a "latest" link moved to the newest, the oldest rmtree'd
    for n in (1, 2, 3):
        d = J("run", f"checkpoint-{n}")
        os.makedirs(d)
        with open(os.path.join(d, "w.bin"), "wb") as f:
            f.write(bytes([n]) * 10)
        os.symlink(f"checkpoint-{n}", J("run", "newest.tmp"))
        os.replace(J("run", "newest.tmp"), J("run", "newest"))
        os.symlink("../ck-9", os.path.join(d, "base"))
        if n == 3:
            shutil.rmtree(J("run", "checkpoint-1"))
    return (os.readlink(J("run", "newest")), open(J("run", "newest", "w.bin"), "rb").read(1)[0],
            sorted(p for p in os.listdir(J("run")) if p.startswith("checkpoint")), os.path.exists(J("run", "ck-9", "model.pt")))
attempt("rotation", rotate)
def move_dir_with_links():
    os.rename(J("run", "checkpoint-3"), J("run", "moved-3"))
    return (os.readlink(J("run", "moved-3", "base")), os.path.isdir(J("run", "moved-3", "base")), os.path.exists(J("run", "newest")))
attempt("dir rename keeps links", move_dir_with_links)
print(json.dumps(out, sort_keys=True))
""")

READBACK = r"""
import json, os, stat, sys
root = sys.argv[1]
J = lambda *p: os.path.join(root, *p)
out = {}
for name in sorted(os.listdir(J("run"))):
    p = J("run", name)
    st = os.lstat(p)
    target = os.readlink(p) if stat.S_ISLNK(st.st_mode) else None
    if target and target.startswith(root + "/"):
        target = "ROOT/" + os.path.relpath(target, root)
    out[name] = [stat.S_IFMT(st.st_mode), target,
                 sorted(os.listdir(p)) if os.path.isdir(p) else None]
out["through"] = open(J("run", "abs", "model.pt"), "rb").read(7).decode()
print(json.dumps(out, sort_keys=True))
"""


@pytest.fixture(scope="module")
def cl(bins, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("links")
    with packed_cluster(bins, tmp, seed=5, n_files=10, mount=MOUNT, extra_args=("--persist", tmp / "persist")) as (c, _):
        c.persist = tmp / "persist"
        yield c


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    p = tmp_path_factory.mktemp("outside") / "target.txt"
    p.write_text("outside the mount")
    return str(p)


def test_symlinks_behave_as_in_a_native_directory(cl, tmp_path, outside):
    native = run(None, 0, SCRIPT, str(tmp_path / "native"), outside)
    ours = run(cl, 1, SCRIPT, f"{MOUNT}/links", outside)
    # The native run is what the script expects (so a broken script cannot pass).
    assert native["readlink"] == ["OK", "ck-9"] and native["loop"] == "ELOOP"
    assert native["create through dangling"] == ["OK", [True, "made"]]
    diffs = differences(ours, native)
    assert not diffs, "fanstore differs from a native directory (fanstore, native): " + json.dumps(diffs)
    # Every other node sees the same tree: link kinds, targets, listings through them.
    want = run(None, 0, READBACK, str(tmp_path / "native"))
    for node in (0, 2, 3):
        assert run(cl, node, READBACK, f"{MOUNT}/links") == want, f"node {node}"


def test_symlinks_survive_a_new_job_kill_and_export(bins, tmp_path):
    """--persist: stop, a new job with another rank count reads the links; then
    `fanstore export` writes them as symlinks. --local: a kill -9 leaves the
    holder's sidecars, and the restarted job registers the links again."""
    from fs_cluster import packed_dataset, start_cluster
    packed_dataset(bins, tmp_path, n_files=6, seed=9, partitions=2)
    persist = tmp_path / "persist"
    make = r"""
    import os, sys
    r = sys.argv[1]
    os.makedirs(os.path.join(r, "ck"))
    open(os.path.join(r, "ck", "w"), "w").write("w1")
    os.symlink("ck", os.path.join(r, "latest"))
    os.symlink("/nowhere/at/all", os.path.join(r, "dangling"))
    print("{}")
    """
    check = r"""
    import json, os, sys
    r = sys.argv[1]
    print(json.dumps([os.readlink(os.path.join(r, "latest")), open(os.path.join(r, "latest", "w")).read(),
                      os.readlink(os.path.join(r, "dangling")), os.path.lexists(os.path.join(r, "dangling"))]))
    """
    want = ["ck", "w1", "/nowhere/at/all", True]
    c = start_cluster(bins, tmp_path / "data", tmp_path / "c1", nranks=4, mount=MOUNT, extra_args=["--persist", persist])
    try:
        run(c, 1, make, f"{MOUNT}/keep")
    finally:
        c.stop()
    c2 = start_cluster(bins, tmp_path / "data", tmp_path / "c2", nranks=3, mount=MOUNT, extra_args=["--persist", persist])
    try:
        assert run(c2, 2, check, f"{MOUNT}/keep") == want
    finally:
        c2.stop()
    dest = tmp_path / "exported"
    subprocess.run([bins["cli"], "export", str(persist), "--to", str(dest)], check=True, capture_output=True, timeout=120)
    assert os.readlink(dest / "keep" / "latest") == "ck"
    assert (dest / "keep" / "latest" / "w").read_text() == "w1"
    assert os.readlink(dest / "keep" / "dangling") == "/nowhere/at/all"
    # kill -9 and a restart on the same --local (no --persist): the links come back.
    c3 = start_cluster(bins, tmp_path / "data", tmp_path / "c3", nranks=2, mount=MOUNT)
    try:
        run(c3, 0, make, f"{MOUNT}/k9")
    finally:
        c3.local = tmp_path / "not-removed"
        c3.kill()  # kill -9: the symlink calls had returned, the local dir survives
    c4 = start_cluster(bins, tmp_path / "data", tmp_path / "c3", nranks=2, mount=MOUNT)
    try:
        assert run(c4, 1, check, f"{MOUNT}/k9") == want
    finally:
        c4.stop()
