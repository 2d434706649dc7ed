"""The write path: outputs under /fanstore, visible on every node on close.

Real programs run with LD_PRELOAD against `mpiexec -n 4` daemons
(UCX_TLS=tcp); a file written through node A is read back through node B.
"""
import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from fs_cluster import node_state, packed_cluster, packed_dataset, start_cluster, tmpfs_local_dir
from fs_prep import pack

MOUNT = "/fanstore"
TIMEOUT = 120
PY = sys.executable


@pytest.fixture(scope="module")
def cl(bins, tmp_path_factory):
    with packed_cluster(bins, tmp_path_factory.mktemp("write"), n_files=20, seed=5, mount=MOUNT) as (c, src):
        yield c, src


def first_input_file(src: Path) -> str:
    for d, _, fs in sorted(os.walk(src)):
        for f in sorted(fs):
            p = Path(d) / f
            rel = str(p.relative_to(src))
            if p.is_file() and not p.is_symlink() and rel.isascii() and "'" not in rel:
                return rel
    raise AssertionError("no input file")


def test_python_write_read_other_node(cl):
    c, _ = cl
    blob = os.urandom(3 << 20)
    data = Path(c.local.parent / "blob.bin")
    data.write_bytes(blob)
    c.run_python(0, f"""
        import os
        os.makedirs('{MOUNT}/pyw', exist_ok=True)
        with open('{MOUNT}/pyw/a.bin', 'wb') as f:
            f.write(open('{data}', 'rb').read())
        with open('{MOUNT}/pyw/small.txt', 'w') as f:
            f.write('hello\\n')
        open('{MOUNT}/pyw/empty', 'wb').close()
    """)
    for node in (1, 2, 3):
        r = subprocess.run([PY, "-c", textwrap.dedent(f"""
            import os, sys
            st = os.stat('{MOUNT}/pyw/a.bin')
            got = open('{MOUNT}/pyw/a.bin', 'rb').read()
            assert st.st_size == len(got), (st.st_size, len(got))
            assert open('{MOUNT}/pyw/small.txt').read() == 'hello\\n'
            assert open('{MOUNT}/pyw/empty', 'rb').read() == b''
            sys.stdout.buffer.write(got)
        """)], env=c.env(node), capture_output=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr.decode()
        assert r.stdout == blob, f"node {node}: bytes differ"
        c.run_python(node, f"import os; assert sorted(os.listdir('{MOUNT}/pyw')) == ['a.bin', 'empty', 'small.txt'], os.listdir('{MOUNT}/pyw')")


def names_asked(c, rank):
    with c.client(rank) as k:
        st = k.status()
    return int(st["names_asked"]), int(st["dirs_with_outputs"])


def test_outputs_in_input_dirs_are_seen_everywhere_and_clean_dirs_cost_no_message(cl):
    """A walk of input directories that hold no output, and lookups of names absent from them, ask the
    daemon nothing (the tier map says no output was ever listed there). The first output written into
    an input directory, on any node, is listed and found on every node as soon as its close returns:
    a file (node 0 into g), a directory (node 1 into d/e), a file renamed in from an output directory
    (node 2 into a/b/c), each checked on all 4 nodes."""
    c, src = cl
    walk = f"""
        import os
        for d in ('g', 'd/e', 'a/b/c'):
            names = sorted(os.listdir('{MOUNT}/' + d))
            assert names == sorted(os.listdir('{src}/' + d)), (d, names)
            assert not os.path.exists('{MOUNT}/' + d + '/absent.txt')
            try:
                open('{MOUNT}/' + d + '/absent.txt', 'rb')
                raise SystemExit('opened a name that does not exist')
            except FileNotFoundError:
                pass
        print(sum(len(fs) for _, _, fs in os.walk('{MOUNT}/g')))
    """
    before = [names_asked(c, r) for r in range(4)]
    for node in range(4):
        c.run_python(node, walk)
    after = [names_asked(c, r) for r in range(4)]
    assert [a[0] for a in after] == [b[0] for b in before], \
        f"clean input directories were asked of the daemons: {before} -> {after}"
    c.run_python(0, f"open('{MOUNT}/g/new-in-input.txt', 'w').write('written on node 0')")
    c.run_python(1, f"import os; os.mkdir('{MOUNT}/d/e/made-on-1')")
    c.run_python(2, f"""
        import os
        os.makedirs('{MOUNT}/staging2', exist_ok=True)
        open('{MOUNT}/staging2/moved.bin', 'wb').write(b'x' * 1000)
        os.rename('{MOUNT}/staging2/moved.bin', '{MOUNT}/a/b/c/moved.bin')
    """)
    for node in range(4):
        c.run_python(node, f"""
            import os
            assert 'new-in-input.txt' in os.listdir('{MOUNT}/g'), os.listdir('{MOUNT}/g')
            assert open('{MOUNT}/g/new-in-input.txt').read() == 'written on node 0'
            assert 'made-on-1' in os.listdir('{MOUNT}/d/e') and os.path.isdir('{MOUNT}/d/e/made-on-1')
            assert 'moved.bin' in os.listdir('{MOUNT}/a/b/c')
            assert os.stat('{MOUNT}/a/b/c/moved.bin').st_size == 1000
            assert not os.path.exists('{MOUNT}/g/absent.txt')
            seen = sum(len(fs) for _, _, fs in os.walk('{MOUNT}/g'))
            assert seen == sum(len(fs) for _, _, fs in os.walk('{src}/g')) + 1, seen
        """)
    assert all(names_asked(c, r)[1] >= 3 for r in range(4)), [names_asked(c, r) for r in range(4)]
    c.run_python(3, f"""
        import os, shutil
        os.unlink('{MOUNT}/g/new-in-input.txt')
        os.rmdir('{MOUNT}/d/e/made-on-1')
        os.unlink('{MOUNT}/a/b/c/moved.bin')
        shutil.rmtree('{MOUNT}/staging2')
    """)
    for node in range(4):
        c.run_python(node, f"""
            import os
            for d in ('g', 'd/e', 'a/b/c'):
                assert sorted(os.listdir('{MOUNT}/' + d)) == sorted(os.listdir('{src}/' + d)), d
        """)


def meta_counts(c):
    """Per rank: (metadata round trips sent over MPI, requests answered by
    their own owner, requests its clients sent to it)."""
    out = []
    for r in range(4):
        with c.client(r) as k:
            st = k.status()
        out.append((int(st["meta_sent"]), int(st["meta_local"]), int(st["client_requests"])))
    return out


def counted(c, node, code):
    """Runs `code` on `node`: (MPI round trips, lookups answered by their
    own owner, requests sent to `node`'s daemon) it cost, over all ranks."""
    before = meta_counts(c)
    c.run_python(node, code)
    after = meta_counts(c)
    sent = sum(a[0] - b[0] for a, b in zip(after, before))
    local = sum(a[1] - b[1] for a, b in zip(after, before))
    return sent, local, after[node][2] - before[node][2]


def test_a_stat_of_an_output_costs_one_round_trip_and_none_at_its_owner(cl):
    """STATUS counts the namespace's metadata requests (meta_sent: MPI round
    trips; meta_local: answered by the asking rank, which owns the name) and
    the requests clients send their daemon. A stat of an existing output is
    answered from the record table in shared memory, with no request at
    all, on the node that owns the name, and costs exactly one round trip
    from each other node. Fails if a round trip or a request is added, or
    if the owner's clients stop reading the table."""
    c, _src = cl
    c.run_python(0, f"import os; os.makedirs('{MOUNT}/rt', exist_ok=True); [open('{MOUNT}/rt/f%d' % i, 'w').close() for i in range(8)]")
    for i in range(8):
        costs = [counted(c, node, f"import os; os.stat('{MOUNT}/rt/f{i}')") for node in range(4)]
        assert sorted(costs) == [(0, 0, 0), (1, 0, 1), (1, 0, 1), (1, 0, 1)], (i, costs)



def test_a_rename_within_a_directory_costs_five_metadata_requests(cl):
    """A rename of an output written on this node costs, counted over all
    ranks: the directory's lookup, the record's, its PUT at the new name's
    owner, the listing's change and the DEL at the old name's owner. Within
    one directory (a temporary name renamed to its final one) the directory
    is looked up once and its listing changes in one request (RELINK); to
    another directory both are looked up and the listing of each changes.
    Fails if a request is added to either."""
    c, _src = cl
    c.run_python(0, f"import os; os.makedirs('{MOUNT}/rn/a', exist_ok=True); os.makedirs('{MOUNT}/rn/b', exist_ok=True)")
    for i in range(6):
        c.run_python(0, f"open('{MOUNT}/rn/a/f{i}.tmp', 'w').write('x')")
        within = counted(c, 0, f"import os; os.rename('{MOUNT}/rn/a/f{i}.tmp', '{MOUNT}/rn/a/f{i}')")
        across = counted(c, 0, f"import os; os.rename('{MOUNT}/rn/a/f{i}', '{MOUNT}/rn/b/f{i}')")
        assert (within[0] + within[1], within[2]) == (5, 1), (i, within)
        assert (across[0] + across[1], across[2]) == (7, 1), (i, across)
    listed = c.run_python(1, f"import os; print(sorted(os.listdir('{MOUNT}/rn/a')), len(os.listdir('{MOUNT}/rn/b')))").stdout.split("]")
    assert listed[0] == "[" and listed[1].strip() == "6", listed

def test_new_outputs_are_written_into_files_made_ahead(cl):
    """The lookup before a creation brings a file the daemon made ahead
    (STATUS files_ahead), the output is written into it and committed
    like any other (its bytes exact, read back with no request on the
    node that owns its name). Fails if creations go back to making their
    own files, or if a file made ahead loses or mixes bytes."""
    c, _src = cl
    def ahead():
        with c.client(3) as k:
            return int(k.status()["files_ahead"])
    before = ahead()
    c.run_python(3, f"""
        import os
        os.makedirs('{MOUNT}/ahead', exist_ok=True)
        for i in range(12):
            with open('{MOUNT}/ahead/f%d' % i, 'wb') as f:
                f.write(bytes([i]) * (1000 + i))
        for i in range(12):
            assert open('{MOUNT}/ahead/f%d' % i, 'rb').read() == bytes([i]) * (1000 + i), i
    """)
    assert ahead() - before == 12
    c.run_python(0, f"""
        for i in range(12):
            assert open('{MOUNT}/ahead/f%d' % i, 'rb').read() == bytes([i]) * (1000 + i), i
    """)


def test_a_node_reads_its_own_output_with_no_message(cl):
    """An output whose record and bytes are on the node that reads it (the
    node wrote it and owns its name) is opened, read, even O_RDWR as
    mdtest does, and stat'ed with no request to the daemon: the record
    comes from the record table, the bytes from its file in the local
    directory. Fails if any of it goes back through the daemon."""
    c, _src = cl
    c.run_python(2, f"""
        import os
        os.makedirs('{MOUNT}/own', exist_ok=True)
        for i in range(16):
            with open('{MOUNT}/own/f%d' % i, 'wb') as f:
                f.write(b'%d' % i * 100)
    """)
    mine = [i for i in range(16) if counted(c, 2, f"import os; os.stat('{MOUNT}/own/f{i}')") == (0, 0, 0)]
    assert mine, "node 2 owns none of 16 names"
    for i in mine:
        code = f"""
            import os
            want = b'%d' % {i} * 100
            with open('{MOUNT}/own/f{i}', 'rb') as f:
                assert f.read() == want
            fd = os.open('{MOUNT}/own/f{i}', os.O_RDWR)
            assert os.read(fd, 1000) == want and os.fstat(fd).st_size == len(want)
            os.close(fd)
        """
        assert counted(c, 2, code) == (0, 0, 0), i
    # Another node reads them through its daemon, exactly.
    c.run_python(1, f"""
        for i in {mine}:
            assert open('{MOUNT}/own/f%d' % i, 'rb').read() == b'%d' % i * 100
    """)


def test_inputs_stay_read_only(cl):
    c, src = cl
    name = first_input_file(src)
    c.run_python(1, f"""
        import errno, os
        p = '{MOUNT}/{name}'
        for flags in (os.O_WRONLY, os.O_RDWR | os.O_TRUNC, os.O_WRONLY | os.O_CREAT | os.O_TRUNC):
            try:
                os.open(p, flags, 0o644)
                raise SystemExit('write open of an input succeeded')
            except OSError as e:
                assert e.errno == errno.EROFS, (flags, e)
        try:
            os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            raise SystemExit('O_EXCL on an input succeeded')
        except OSError as e:
            assert e.errno == errno.EEXIST, e
        try:
            os.unlink(p)
            raise SystemExit('unlink of an input succeeded')
        except OSError as e:
            assert e.errno == errno.EROFS, e
        try:
            open('{MOUNT}/no/such/dir/x', 'wb')
            raise SystemExit('create in a missing dir succeeded')
        except OSError as e:
            assert e.errno == errno.ENOENT, e
    """)


def test_numpy_h5py_safetensors_pillow(cl):
    c, _ = cl
    c.run_python(2, f"""
        import os
        import numpy as np
        os.makedirs('{MOUNT}/libs', exist_ok=True)
        a = np.arange(100000, dtype=np.float32).reshape(100, 1000)
        np.save('{MOUNT}/libs/a.npy', a)
        np.savez('{MOUNT}/libs/b.npz', x=a, y=a[:3])
        import h5py
        with h5py.File('{MOUNT}/libs/c.h5', 'w') as f:
            f['d'] = a
        # safetensors.numpy.save_file (0.8) renames its temp file with a raw
        # syscall (rustix), which no LD_PRELOAD library sees: see
        # test_safetensors_save_file_raw_rename. The bytes path works.
        from safetensors.numpy import save
        open('{MOUNT}/libs/d.safetensors', 'wb').write(save({{'t': a}}))
        from PIL import Image
        Image.fromarray((np.arange(64 * 64 * 3) % 256).astype(np.uint8).reshape(64, 64, 3)).save('{MOUNT}/libs/e.png')
    """)
    c.run_python(3, f"""
        import numpy as np
        a = np.arange(100000, dtype=np.float32).reshape(100, 1000)
        assert (np.load('{MOUNT}/libs/a.npy') == a).all()
        z = np.load('{MOUNT}/libs/b.npz')
        assert (z['x'] == a).all() and (z['y'] == a[:3]).all()
        import h5py
        with h5py.File('{MOUNT}/libs/c.h5', 'r') as f:
            assert (f['d'][...] == a).all()
        from safetensors.numpy import load_file
        assert (load_file('{MOUNT}/libs/d.safetensors')['t'] == a).all()
        from PIL import Image
        im = np.asarray(Image.open('{MOUNT}/libs/e.png'))
        assert (im.reshape(-1) == (np.arange(64 * 64 * 3) % 256)).all()
    """)


def test_safetensors_save_file_raw_rename(cl):
    """safetensors 0.8 save_file persists its temp file with a raw renameat2
    syscall (rustix linux_raw): caught by syscall user dispatch."""
    c, _ = cl
    c.run_python(1, f"""
        import os
        import numpy as np
        from safetensors.numpy import save_file, load_file
        save_file({{'t': np.arange(10)}}, '{MOUNT}/st_direct.safetensors')
        assert (load_file('{MOUNT}/st_direct.safetensors')['t'] == np.arange(10)).all()
        assert [n for n in os.listdir('{MOUNT}') if n.startswith('.tmp')] == []
    """)
    c.run_python(3, f"""
        import numpy as np
        from safetensors.numpy import load_file
        assert (load_file('{MOUNT}/st_direct.safetensors')['t'] == np.arange(10)).all()
    """)


def test_replace_makedirs_listdir_rmtree(cl):
    c, _ = cl
    c.run_python(0, f"""
        import os
        os.makedirs('{MOUNT}/ck/sub/deep', exist_ok=True)
        for i in range(3):
            with open('{MOUNT}/ck/last.tmp', 'wb') as f:
                f.write(b'v%d' % i * 1000)
            os.replace('{MOUNT}/ck/last.tmp', '{MOUNT}/ck/last.ckpt')
            assert not os.path.exists('{MOUNT}/ck/last.tmp')
        for i in range(5):
            open('{MOUNT}/ck/sub/f%d' % i, 'w').write(str(i))
    """)
    for node in range(4):
        c.run_python(node, f"""
            import os
            assert open('{MOUNT}/ck/last.ckpt', 'rb').read() == b'v2' * 1000
            assert sorted(os.listdir('{MOUNT}/ck')) == ['last.ckpt', 'sub'], os.listdir('{MOUNT}/ck')
            assert sorted(os.listdir('{MOUNT}/ck/sub')) == ['deep'] + ['f%d' % i for i in range(5)]
            assert os.path.isdir('{MOUNT}/ck/sub/deep')
        """)
    c.run_python(1, f"""
        import errno, os, shutil
        try:
            os.rmdir('{MOUNT}/ck/sub')
            raise SystemExit('rmdir of a non-empty dir succeeded')
        except OSError as e:
            assert e.errno == errno.ENOTEMPTY, e
        shutil.rmtree('{MOUNT}/ck')
        assert not os.path.exists('{MOUNT}/ck')
    """)
    c.run_python(3, f"""
        import os
        assert not os.path.exists('{MOUNT}/ck/last.ckpt')
    """)


def test_makedirs_race_8_processes(cl):
    c, _ = cl
    code = textwrap.dedent(f"""
        import os
        os.makedirs('{MOUNT}/race/a/b/c', exist_ok=True)
        open('{MOUNT}/race/a/b/c/' + str(os.getpid()), 'w').write('x')
    """)
    procs = [subprocess.Popen([PY, "-c", code], env=c.env(i % 4), stderr=subprocess.PIPE) for i in range(8)]
    for p in procs:
        _, err = p.communicate(timeout=TIMEOUT)
        assert p.returncode == 0, err.decode()
    c.run_python(2, f"""
        import os
        assert len(os.listdir('{MOUNT}/race/a/b/c')) == 8
    """)


def test_o_excl_across_nodes(cl):
    c, _ = cl
    code = textwrap.dedent(f"""
        import os, sys
        try:
            fd = os.open('{MOUNT}/excl.lock', os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            print('won')
        except FileExistsError:
            print('lost')
    """)
    procs = [subprocess.Popen([PY, "-c", code], env=c.env(i % 4), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for i in range(8)]
    outs = []
    for p in procs:
        o, e = p.communicate(timeout=TIMEOUT)
        assert p.returncode == 0, e.decode()
        outs.append(o.decode().strip())
    assert outs.count("won") == 1, outs


C_PROG = r"""
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
int main(int argc, char **argv) {
    const char *m = argv[1], *dir = argv[2];
    char p[4096];
    if (!strcmp(m, "stdio")) {
        snprintf(p, sizeof p, "%s/c_stdio.txt", dir);
        FILE *f = fopen(p, "w");
        if (!f) { perror("fopen"); return 1; }
        for (int i = 0; i < 1000; i++) fprintf(f, "line %d\n", i);
        return fclose(f) != 0;
    }
    if (!strcmp(m, "pwrite")) {
        snprintf(p, sizeof p, "%s/c_pwrite.bin", dir);
        int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) { perror("open"); return 1; }
        if (pwrite(fd, "WORLD", 5, 5) != 5 || pwrite(fd, "HELLO", 5, 0) != 5) return 1;
        if (fsync(fd) != 0) return 1;
        int d = dup(fd);
        if (close(fd) != 0) return 1;
        if (lseek(d, 0, SEEK_END) != 10 || write(d, "!", 1) != 1) return 1;
        return close(d) != 0;
    }
    if (!strcmp(m, "mmap")) {
        snprintf(p, sizeof p, "%s/c_mmap.bin", dir);
        int fd = open(p, O_RDWR | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || ftruncate(fd, 8192) != 0) return 1;
        char *x = mmap(0, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (x == MAP_FAILED) return 1;
        for (int i = 0; i < 8192; i++) x[i] = 'a' + i % 26;
        munmap(x, 8192);
        return close(fd) != 0;
    }
    if (!strcmp(m, "noclose")) {
        snprintf(p, sizeof p, "%s/c_noclose.txt", dir);
        int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) return 1;
        if (write(fd, "committed at exit\n", 18) != 18) return 1;
        FILE *f = fopen(argv[3], "w");
        fputs("buffered by stdio\n", f);
        exit(0);
    }
    if (!strcmp(m, "killed")) {
        snprintf(p, sizeof p, "%s/c_killed.bin", dir);
        int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) return 1;
        if (write(fd, "partial", 7) != 7) return 1;
        kill(getpid(), SIGKILL);
    }
    return 2;
}
"""


@pytest.fixture(scope="module")
def cprog(tmp_path_factory):
    d = tmp_path_factory.mktemp("cprog")
    (d / "w.c").write_text(C_PROG)
    subprocess.run(["cc", "-O1", "-o", str(d / "w"), str(d / "w.c")], check=True)
    return str(d / "w")


def test_c_programs(cl, cprog):
    c, _ = cl
    c.run_python(0, f"import os; os.makedirs('{MOUNT}/cw', exist_ok=True)")
    for mode in ("stdio", "pwrite", "mmap"):
        r = subprocess.run([cprog, mode, f"{MOUNT}/cw"], env=c.env(1), capture_output=True, timeout=TIMEOUT)
        assert r.returncode == 0, (mode, r.stderr.decode())
    r = subprocess.run([cprog, "noclose", f"{MOUNT}/cw", f"{MOUNT}/cw/c_stdio_exit.txt"], env=c.env(1),
                       capture_output=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr.decode()
    r = subprocess.run([cprog, "killed", f"{MOUNT}/cw"], env=c.env(1), capture_output=True, timeout=TIMEOUT)
    assert r.returncode == -signal.SIGKILL
    c.run_python(3, f"""
        import os
        d = '{MOUNT}/cw/'
        assert open(d + 'c_stdio.txt').read() == ''.join('line %d\\n' % i for i in range(1000))
        assert open(d + 'c_pwrite.bin', 'rb').read() == b'HELLOWORLD!'
        assert open(d + 'c_mmap.bin', 'rb').read() == bytes(ord('a') + i % 26 for i in range(8192))
        assert open(d + 'c_noclose.txt').read() == 'committed at exit\\n'
        assert open(d + 'c_stdio_exit.txt').read() == 'buffered by stdio\\n'
        assert not os.path.exists(d + 'c_killed.bin')
        assert 'c_killed.bin' not in os.listdir(d)
    """)


VIS_WRITER = """
import os, sys
d = sys.argv[1]
for line in sys.stdin:
    i = int(line)
    data = (b'%08d' % i) * (1000 + i * 37)
    with open(f'{d}/v{i}.bin', 'wb') as f:
        f.write(data)
    print(i, flush=True)
"""

VIS_READER = """
import os, sys
d = sys.argv[1]
for line in sys.stdin:
    i = int(line)
    want = (b'%08d' % i) * (1000 + i * 37)
    st = os.stat(f'{d}/v{i}.bin')
    got = open(f'{d}/v{i}.bin', 'rb').read()
    print('ok' if st.st_size == len(want) and got == want else f'bad {i} {st.st_size} {len(got)}', flush=True)
"""


def test_visibility_on_close_200_rounds(cl):
    c, _ = cl
    c.run_python(0, f"import os; os.makedirs('{MOUNT}/vis', exist_ok=True)")
    w = subprocess.Popen([PY, "-c", VIS_WRITER, f"{MOUNT}/vis"], env=c.env(0), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    r = subprocess.Popen([PY, "-c", VIS_READER, f"{MOUNT}/vis"], env=c.env(3), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        for i in range(200):
            w.stdin.write(f"{i}\n")
            w.stdin.flush()
            assert w.stdout.readline().strip() == str(i)
            r.stdin.write(f"{i}\n")
            r.stdin.flush()
            assert r.stdout.readline().strip() == "ok", i
    finally:
        for p in (w, r):
            p.stdin.close()
            p.wait(timeout=TIMEOUT)


def test_a_persist_directory_serves_one_running_job_at_a_time(bins, tmp_path):
    """Two jobs running at once on one --persist directory would drain over
    each other (the later drain drops the earlier's index and prunes its
    checkpoint units): the second job refuses to start, naming the lease and
    the job that holds it; a job started after the first stopped sees its
    outputs, and so does export, with its own. A lease left by a killed job
    (its pid gone on this host) is taken over."""
    import fs_cluster
    _, data = packed_dataset(bins, tmp_path, n_files=6, seed=4, partitions=2)
    persist = tmp_path / "persist"
    lease = persist / "meta" / "lease"
    c = start_cluster(bins, data, tmp_path / "a", nranks=2, mount=MOUNT, extra_args=["--persist", persist])
    try:
        c.run_python(1, f"""
            import os
            os.makedirs('{MOUNT}/res', exist_ok=True)
            open('{MOUNT}/res/a.bin', 'wb').write(b'a' * 300000)
        """)
        holder = lease.read_text().split()
        assert int(holder[1]) == c.pids()[0], (holder, c.pids())
        proc, runtime, _, log_path = fs_cluster.launch(bins, data, tmp_path / "b", nranks=0, mount=MOUNT,
                                                       extra_args=["--persist", persist])
        rc = proc.wait(timeout=90)
        log = log_path.read_text()
        assert rc != 0, log
        assert f"{lease}: --persist directory in use by a running FanStore job (host {holder[0]}, pid {holder[1]}," in log, log
        fs_cluster.wait_ranks_gone(runtime, 1)
        subprocess.run([bins["cli"], "--runtime-dir", str(runtime), "stop"], check=True, capture_output=True)
        assert lease.read_text().split() == holder, "the refused job touched the lease"
        r = c.run_python(0, f"print(len(open('{MOUNT}/res/a.bin', 'rb').read()))")
        assert r.stdout.strip() == "300000"
    finally:
        c.stop()
    assert not lease.exists(), "the first job's stop left its lease"
    # A killed job's lease (this host, a pid that is gone) does not block the next.
    lease.write_text(f"{holder[0]} 999999999 killed\n")
    c2 = start_cluster(bins, data, tmp_path / "c", nranks=2, mount=MOUNT, extra_args=["--persist", persist])
    try:
        assert "taking over the lease of a job that is gone" in c2.log()
        c2.run_python(0, f"""
            assert open('{MOUNT}/res/a.bin', 'rb').read() == b'a' * 300000
            open('{MOUNT}/res/c.bin', 'wb').write(b'c' * 200000)
        """)
    finally:
        c2.stop()
    out = tmp_path / "exported"
    r = subprocess.run([bins["cli"], "export", str(persist), "--to", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (out / "res/a.bin").read_bytes() == b"a" * 300000 and (out / "res/c.bin").read_bytes() == b"c" * 200000


def test_persist_stop_restart_export(bins, tmp_path):
    _, data = packed_dataset(bins, tmp_path, n_files=8, seed=9, partitions=4)
    persist = tmp_path / "persist"
    c = start_cluster(bins, data, tmp_path / "c1", nranks=4, mount=MOUNT, extra_args=["--persist", persist])
    try:
        c.run_python(1, f"""
            import os
            os.makedirs('{MOUNT}/run/ckpt', exist_ok=True)
            for e in range(3):
                with open('{MOUNT}/run/ckpt/tmp', 'wb') as f:
                    f.write(bytes([e]) * (100000 + e))
                os.replace('{MOUNT}/run/ckpt/tmp', '{MOUNT}/run/ckpt/epoch%d.pt' % e)
            open('{MOUNT}/run/log.txt', 'w').write('done\\n')
            open('{MOUNT}/top.bin', 'wb').write(os.urandom(1 << 20))
        """)
        top = c.run_python(2, f"import hashlib; print(hashlib.md5(open('{MOUNT}/top.bin', 'rb').read()).hexdigest())").stdout.strip()
        # sync drains without stopping: export sees the outputs while the job runs
        r = c.cli("sync")
        assert "synced" in r.stdout, r.stdout
        early = tmp_path / "early"
        r = subprocess.run([bins["cli"], "export", str(persist), "--to", str(early)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert (early / "run/ckpt/epoch2.pt").read_bytes() == bytes([2]) * 100002
        assert (early / "run/log.txt").read_text() == "done\n"
        c.run_python(0, f"open('{MOUNT}/run/after_sync.txt', 'w').write('late')")
    finally:
        c.stop()
    # a later job, with another number of ranks, sees them again
    c2 = start_cluster(bins, data, tmp_path / "c2", nranks=2, mount=MOUNT, extra_args=["--persist", persist])
    try:
        c2.run_python(1, f"""
            import os
            for e in range(3):
                assert open('{MOUNT}/run/ckpt/epoch%d.pt' % e, 'rb').read() == bytes([e]) * (100000 + e)
            assert sorted(os.listdir('{MOUNT}/run/ckpt')) == ['epoch0.pt', 'epoch1.pt', 'epoch2.pt']
            assert sorted(os.listdir('{MOUNT}/run')) == ['after_sync.txt', 'ckpt', 'log.txt']
            assert open('{MOUNT}/run/log.txt').read() == 'done\\n'
            import hashlib
            assert hashlib.md5(open('{MOUNT}/top.bin', 'rb').read()).hexdigest() == '{top}'
            open('{MOUNT}/run/ckpt/epoch3.pt', 'wb').write(b'three')
        """)
    finally:
        c2.stop()
    plain = tmp_path / "plain"
    r = subprocess.run([bins["cli"], "export", str(persist), "--to", str(plain)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (plain / "run/ckpt/epoch3.pt").read_bytes() == b"three"
    assert (plain / "run/ckpt/epoch1.pt").read_bytes() == bytes([1]) * 100001
    assert (plain / "run/log.txt").read_text() == "done\n"
    assert hashlib.md5((plain / "top.bin").read_bytes()).hexdigest() == top
    assert sorted(p.name for p in (plain / "run/ckpt").iterdir()) == ["epoch0.pt", "epoch1.pt", "epoch2.pt", "epoch3.pt"]


def test_outputs_closed_just_before_a_stop_drain_with_their_sums(bins, tmp_path):
    """A checkpoint-sized output closed by its only writer is hashed by the
    store's commit worker after the close, and its sum then goes to the
    record's owner, which is another rank for most names. Outputs written in
    a burst and followed at once by a stop: every sum must reach its record
    before the owner drains it (at a stop the ranks end by no longer
    answering each other), else the next job cannot find their bytes. Also
    renamed, as checkpoint writers do, to names another rank owns."""
    _, data = packed_dataset(bins, tmp_path, n_files=4, seed=12, partitions=2)
    persist = tmp_path / "persist"
    n = 24
    c = start_cluster(bins, data, tmp_path / "c1", nranks=4, mount=MOUNT, extra_args=["--persist", persist])
    try:
        c.run_python(1, f"""
            import os, random
            os.makedirs('{MOUNT}/burst', exist_ok=True)
            blobs = [random.Random(i).randbytes(4 << 20) for i in range({n})]
            for i in range({n}):
                name = '{MOUNT}/burst/f%03d.bin' % i
                with open(name + '.tmp' if i % 2 else name, 'wb') as f:
                    f.write(blobs[i])
                if i % 2:
                    os.replace(name + '.tmp', name)
        """)
    finally:
        c.stop()
    log = c.log_path.read_text(errors="replace")
    c2 = start_cluster(bins, data, tmp_path / "c2", nranks=3, mount=MOUNT, extra_args=["--persist", persist])
    try:
        r = c2.run_python(2, f"""
            import random
            bad = []
            for i in range({n}):
                try:
                    b = open('{MOUNT}/burst/f%03d.bin' % i, 'rb').read()
                except OSError as e:
                    bad.append((i, repr(e)))
                    continue
                if b != random.Random(i).randbytes(4 << 20):
                    bad.append((i, len(b)))
            print(bad)
        """)
        assert r.stdout.strip() == "[]", r.stdout
    finally:
        c2.stop()
    # A sum that did not arrive leaves the record unchecked (SUM_PENDING),
    # and held that rank's drain until the other rank's answer timed out.
    assert "setting the sum of output" not in log, log


def test_stop_waits_for_a_rank_still_draining(bins, tmp_path):
    """At stop, a rank whose drain to --persist outlasts the other ranks' stop by more than their
    MPI_Finalize watchdog (10 s, for MPICH 4.0's finalize hang) must still finish it. Rank 0's daemon
    is stopped (SIGSTOP, as a stalled shared file system would hold it) for 15 s in the middle of
    draining 3,000 outputs; every one must reach --persist and read back in the next job. (Before,
    rank 1's watchdog ended it after 10 s in MPI_Finalize, and the launcher then killed rank 0
    mid-drain: its outputs were lost.)"""
    _, data = packed_dataset(bins, tmp_path, n_files=4, seed=11, partitions=2)
    persist = tmp_path / "persist"
    c = start_cluster(bins, data, tmp_path / "c1", nranks=2, mount=MOUNT,
                      extra_args=["--persist", persist, "--dedup", "off"])
    n = 3000
    c.run_python(0, f"""
        import os
        os.makedirs('{MOUNT}/preds')
        for i in range({n}):
            with open('{MOUNT}/preds/p%05d.txt' % i, 'w') as f:
                f.write('prediction %d\\n' % i * 3)
    """)
    pid0 = node_state(c.runtime, 0)["pid"]
    failure = []

    def stop():
        try:
            c.stop(timeout=150)
        except BaseException as e:  # noqa: BLE001 (reported below)
            failure.append(e)

    stopper = threading.Thread(target=stop)
    stopper.start()
    deadline = time.monotonic() + 60
    while not (persist / "data").is_dir() or not any((persist / "data").iterdir()):
        assert time.monotonic() < deadline, "rank 0 never began its drain"
        time.sleep(0.001)
    os.kill(pid0, signal.SIGSTOP)
    try:
        done_at_stop = [p for p in (persist / "data").iterdir() if not p.name.startswith("drain.tmp")]
        assert len(done_at_stop) < n, "the drain was over before rank 0 could be held in it"
        time.sleep(15)
    finally:
        with contextlib.suppress(ProcessLookupError):  # gone if its launcher killed it
            os.kill(pid0, signal.SIGCONT)
    stopper.join(200)
    assert not stopper.is_alive() and not failure, (failure, c.log()[-4000:])
    assert f"rank 0: drained {n} output files" in c.log(), c.log()[-4000:]
    c2 = start_cluster(bins, data, tmp_path / "c2", nranks=2, mount=MOUNT, extra_args=["--persist", persist])
    try:
        r = c2.run_python(1, f"""
            bad = sum(open('{MOUNT}/preds/p%05d.txt' % i).read() != 'prediction %d\\n' % i * 3 for i in range({n}))
            print('bad', bad)
        """)
    finally:
        c2.stop()
    assert r.stdout.split() == ["bad", "0"], r.stdout


# Outputs are unnamed files on the local disk (with and without dedup): the
# write itself may fail, and the commit must fail too.
@pytest.mark.parametrize("extra", [(), ("--dedup", "off")], ids=["dedup", "plain"])
def test_local_ssd_full_close_fails_nothing_visible(bins, tmp_path, extra):
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "a.txt").write_text("input\n")
    data = tmp_path / "data"
    pack(bins, src, data, "--partitions", "2")
    with tmpfs_local_dir(tmp_path / "c", "2m", "a small local SSD"):
        c = start_cluster(bins, data, tmp_path / "c", nranks=2, mount=MOUNT, extra_args=extra)
        try:
            c.run_python(0, f"""
                import errno, os
                # The output is written into the local disk: the write itself
                # may fail (as natively), and then close must fail too.
                f = open('{MOUNT}/big.bin', 'wb')
                errs = []
                for step in (lambda: f.write(os.urandom(3 << 20)), f.close):  # random: dedup cannot make it fit
                    try:
                        step()
                    except OSError as e:
                        errs.append(e.errno)
                assert errs and errs[-1] in (errno.ENOSPC, errno.EIO), errs
                assert f.closed
                assert not os.path.exists('{MOUNT}/big.bin')
                open('{MOUNT}/small.txt', 'w').write('still working\\n')
            """)
            c.run_python(1, f"""
                import os
                assert not os.path.exists('{MOUNT}/big.bin')
                assert open('{MOUNT}/small.txt').read() == 'still working\\n'
                assert sorted(os.listdir('{MOUNT}')) == ['d', 'small.txt'], os.listdir('{MOUNT}')
            """)
        finally:
            c.stop()


def test_a_write_after_the_last_close_does_not_reach_readers(cl):
    """A file something still holds open for writing at its last close (a
    second fd opened outside the mount, as a forked child's inherited fd
    would be) is committed as it was then: a later write through that fd
    reaches no reader, on the writer's node or another."""
    c, _ = cl
    c.run_python(1, f"""
        import os
        fd = os.open('{MOUNT}/left-open.txt', os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, b'committed\\n' * 100)
        other = os.open('/proc/self/fd/%d' % fd, os.O_WRONLY)
        os.close(fd)                                   # the commit
        os.pwrite(other, b'WRITTEN AFTER THE CLOSE', 0)
        os.close(other)
        assert open('{MOUNT}/left-open.txt', 'rb').read() == b'committed\\n' * 100
    """)
    c.run_python(2, f"assert open('{MOUNT}/left-open.txt', 'rb').read() == b'committed\\n' * 100")


def test_forked_child_never_commits_parents_output(cl):
    c, _ = cl
    c.run_python(0, f"""
        import os, subprocess, sys
        f = open('{MOUNT}/forked.bin', 'wb')
        f.write(b'a' * 1000)
        f.flush()
        subprocess.run(['true'], check=True)          # close_range in the child, then exec
        pid = os.fork()
        if pid == 0:
            os.close(f.fileno())                       # the child's copy of the last fd
            sys.exit(0)                                # atexit handlers run in the child
        os.waitpid(pid, 0)
        r = subprocess.run([sys.executable, '-c', "import os; print(os.path.exists('{MOUNT}/forked.bin'))"],
                           env=dict(os.environ, FANSTORE_NODE='2'), capture_output=True, text=True)
        assert r.stdout.strip() == 'False', ('visible before the parent closed', r.stdout, r.stderr)
        f.write(b'b' * 1000)
        f.close()
    """)
    c.run_python(2, f"assert open('{MOUNT}/forked.bin', 'rb').read() == b'a' * 1000 + b'b' * 1000")


def test_killed_daemons_recover_outputs_from_local_dir(bins, tmp_path):
    _, data = packed_dataset(bins, tmp_path, n_files=6, seed=3, partitions=2)
    c = start_cluster(bins, data, tmp_path / "c", nranks=2, mount=MOUNT)
    try:
        for node in (0, 1):
            c.run_python(node, f"""
                import os
                os.makedirs('{MOUNT}/kept', exist_ok=True)
                open('{MOUNT}/kept/tmp{node}', 'wb').write(b'%d' % {node} * 5000)
                os.replace('{MOUNT}/kept/tmp{node}', '{MOUNT}/kept/n{node}.bin')
            """)
    finally:
        local, c.local = c.local, tmp_path / "not-removed"
        c.kill()  # kill -9: closes had returned, the local dir survives
    assert (local / "rank-0" / "out").is_dir() or (local / "rank-1" / "out").is_dir()
    c2 = start_cluster(bins, data, tmp_path / "c", nranks=2, mount=MOUNT)
    try:
        c2.run_python(1, f"""
            import os, time
            deadline = time.time() + 20
            while not all(os.path.exists('{MOUNT}/kept/n%d.bin' % n) for n in (0, 1)) and time.time() < deadline:
                time.sleep(0.1)
            for n in (0, 1):
                assert open('{MOUNT}/kept/n%d.bin' % n, 'rb').read() == b'%d' % n * 5000
                assert not os.path.exists('{MOUNT}/kept/tmp%d' % n)
            assert sorted(os.listdir('{MOUNT}/kept')) == ['n0.bin', 'n1.bin']
        """)
    finally:
        c2.stop()


def test_append_and_rdwr_on_existing_output(cl):
    c, _ = cl
    c.run_python(0, f"""
        open('{MOUNT}/app.txt', 'w').write('one\\n')
        open('{MOUNT}/app.txt', 'a').write('two\\n')
    """)
    c.run_python(3, f"""
        with open('{MOUNT}/app.txt', 'a') as f:
            f.write('three\\n')
        assert open('{MOUNT}/app.txt').read() == 'one\\ntwo\\nthree\\n'
        with open('{MOUNT}/app.txt', 'r+') as f:
            f.write('ONE')
    """)
    c.run_python(1, f"assert open('{MOUNT}/app.txt').read() == 'ONE\\ntwo\\nthree\\n'")


def test_coreutils_metadata_of_outputs(cl):
    """ls -l, realpath, stat -f and xattr lookups (ls checks ACLs) on an output
    directory and file, from another node: no error, the right names and sizes."""
    c, _ = cl
    c.run_python(1, """
        import os
        os.makedirs('/fanstore/meta_out/sub', exist_ok=True)
        with open('/fanstore/meta_out/a.bin', 'wb') as f:
            f.write(b'x' * 1234)
    """)
    env = c.env(3)
    r = subprocess.run(["ls", "-l", "/fanstore/meta_out"], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    lines = [ln.split() for ln in r.stdout.splitlines()[1:]]
    assert {(ln[-1], ln[0][0]) for ln in lines} == {("a.bin", "-"), ("sub", "d")}, r.stdout
    assert [ln[4] for ln in lines if ln[-1] == "a.bin"] == ["1234"], r.stdout
    r = subprocess.run(["realpath", "/fanstore/meta_out/../meta_out/a.bin"], env=env, capture_output=True,
                       text=True, timeout=TIMEOUT)
    assert (r.returncode, r.stdout.strip(), r.stderr) == (0, "/fanstore/meta_out/a.bin", ""), r
    r = subprocess.run(["stat", "-f", "-c", "%b", "/fanstore/meta_out/a.bin"], env=env, capture_output=True,
                       text=True, timeout=TIMEOUT)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    out = c.run_python(2, """
        import errno, os
        res = []
        for p in ('/fanstore/meta_out', '/fanstore/meta_out/a.bin', '/fanstore/meta_out/nope'):
            try:
                res.append(len(os.listxattr(p)))
            except OSError as e:
                res.append(errno.errorcode[e.errno])
            try:
                os.getxattr(p, 'user.x')
                res.append('has')
            except OSError as e:
                res.append(errno.errorcode[e.errno])
        print(res)
    """).stdout.strip()
    assert out == "[0, 'ENODATA', 0, 'ENODATA', 'ENOENT', 'ENOENT']", out
