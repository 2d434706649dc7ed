"""Command-line tools writing outputs, each compared with the same tool on a
native directory: sed -i and git (mkstemp, chmod of a lock file still open),
libc's remove (a file, a directory), outputs left open by programs that
end with _exit (dash, Python's os._exit),
cp and cp -p (fstat of the source against its stat), cp -a (an access ACL
refused as on a file system without one), install -m, perl -pi, patch,
gzip, tar, sort -o, split, mv, touch -r, truncate, dd conv=notrunc, and
redirections of programs that bash or Python's subprocess exec (the output
opened before the exec, written by the program after it; with Popen's
`stdout=open(...)` the parent's close comes first, and the child's writes
after it still reach the file).

The shell that runs them has the library too (as a job script's shell does
when LD_PRELOAD is exported before it starts), so its own redirections
create outputs as well."""
import difflib
import subprocess

from fs_cluster import cluster_fixture

STEPS = r'''
set -u
R=$1; mkdir -p "$R"; cd "$R"
step() { local n=$1; shift; ( "$@" ) >/dev/null 2>"$R.err.$n"; echo "$n rc=$?"; }
printf 'a\nb\nc\n' > orig.txt
step cp cp orig.txt new.txt
echo d >> new.txt
step perl_pi perl -pi -e 's/b/B/' orig.txt
step sed_i sed -i 's/a/A/' orig.txt
step sed_i_mode sh -c 'printf "x\n" > m.txt && chmod 640 m.txt && sed -i s/x/y/ m.txt'
step gzip gzip -kn new.txt
step gunzip sh -c 'gzip -dc new.txt.gz > back.txt'
step sort_o sort -r -o sorted.txt new.txt
step split split -l 2 new.txt part.
step cp_p cp -p m.txt cpp.txt
step mkdir_u mkdir u
step cp_into cp new.txt orig.txt u/
step cp_a cp -a u ua
step install install -m 600 new.txt inst.txt
step tar_c tar cf t.tar u new.txt
step tar_x sh -c 'mkdir tx && tar xf t.tar -C tx'
step diff_u sh -c 'diff -u --label a --label b new.txt sorted.txt > p.diff; test $? = 1'
step patch patch -s new.txt p.diff
step ln_s ln -s new.txt link.txt
step mv mv cpp.txt moved.txt
step truncate truncate -s 2 moved.txt
step touch_r touch -r m.txt moved.txt
step same_mtime sh -c 'test "$(stat -c %Y.%y moved.txt)" = "$(stat -c %Y.%y m.txt)"'
step dd sh -c 'dd if=/dev/zero of=dd.bin bs=4k count=4 status=none && dd if=orig.txt of=dd.bin conv=notrunc seek=1 status=none'
step bash_redirect bash -c 'ls -1 u > ls.txt; wc -l < new.txt > wc.txt 2>&1'
step subshell_redirect bash -c '(printf x; ls u) > sub.txt'
step stderr_redirect bash -c 'ls missing-file 2> err.txt; test -s err.txt'
step python_subprocess python3 -c 'import subprocess; f = open("py.txt", "w"); subprocess.run(["ls", "u"], stdout=f, check=True); f.close(); subprocess.run("ls u > py2.txt", shell=True, check=True)'
step dash_exit bash -c 'sh -c "ls u >&2" 2> dash.txt; test -s dash.txt'
step os_exit python3 -c 'import os; f = open("osexit.txt", "w"); f.write("kept"); f.flush(); os._exit(0)'
step popen_late python3 -c 'import subprocess; p = subprocess.Popen(["sh", "-c", "sleep 0.5; ls u"], stdout=open("late.txt", "w")); p.wait()'
step c_remove sh -c 'echo x > gone.txt && mkdir gone.d && python3 -c "import ctypes; libc = ctypes.CDLL(None); assert libc.remove(b\"gone.txt\") == 0 and libc.remove(b\"gone.d\") == 0" && test ! -e gone.txt && test ! -e gone.d'
step git_init git init -q repo
step git_commit sh -c 'cd repo && cp ../new.txt a.txt && git add a.txt && git -c user.email=a@b -c user.name=x commit -qm one'
step git_commit2 sh -c 'cd repo && echo e >> a.txt && git -c user.email=a@b -c user.name=x commit -qam two'
step git_log sh -c 'cd repo && test "$(git log --format=%s | tr "\n" " ")" = "two one "'
step git_fsck sh -c 'cd repo && git fsck --no-progress'
'''

# What the steps left, without git's own object names and times.
LISTING = r'''
cd "$1"
find . -path ./repo/.git -prune -o -printf '%P %y %m\n' | sort
find . -path ./repo/.git -prune -o -type f ! -name t.tar -print | sort | xargs md5sum
readlink link.txt
'''


cl = cluster_fixture("tools", seed=23, n_files=4, nranks=2)


def bash(script, *args, env=None):
    return subprocess.run(["bash", "-c", script, "bash", *args], env=env, capture_output=True, text=True, timeout=300)


def test_command_line_tools_write_outputs_as_on_a_native_directory(cl, tmp_path):
    native = bash(STEPS, str(tmp_path / "native"))
    ours = bash(STEPS, "/fanstore/tools", env=cl.env(0))
    assert native.returncode == 0, native.stderr
    steps = dict(line.split(" rc=") for line in native.stdout.split("\n") if " rc=" in line)
    assert len(steps) >= 25 and all(rc == "0" for rc in steps.values()), f"a step fails natively: {native.stdout}"
    got = dict(line.split(" rc=") for line in ours.stdout.split("\n") if " rc=" in line)
    failed = {k: (got.get(k), bash("cat /fanstore/tools.err." + k + " 2>&1", env=cl.env(0)).stdout) for k in steps if got.get(k) != "0"}
    assert not failed, f"steps that fail on outputs: {failed}\n{ours.stderr}\n{cl.log()[-3000:]}"
    want = bash(LISTING, str(tmp_path / "native")).stdout.replace(str(tmp_path / "native"), "R")
    for node in (0, 1):
        seen = bash(LISTING, "/fanstore/tools", env=cl.env(node))
        assert seen.returncode == 0, seen.stderr
        got = seen.stdout.replace("/fanstore/tools", "R")
        assert got == want, f"node {node}:\n" + "\n".join(difflib.unified_diff(want.splitlines(), got.splitlines(), "native", "fanstore", lineterm=""))
