"""The `fanstore` CLI without daemons: `wait` times out, `status` fails, and
output into a closed pipe ends quietly (SIGPIPE, as coreutils)."""
import os
import subprocess


def test_cli_wait_times_out_without_daemons(bins, tmp_path):
    rt = tmp_path / "rt"
    rt.mkdir()
    r = subprocess.run([bins["cli"], "--runtime-dir", str(rt), "wait", "--timeout", "0.5"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "timed out" in r.stderr
    r = subprocess.run([bins["cli"], "--runtime-dir", str(rt), "status"], capture_output=True, text=True)
    assert r.returncode == 1


def test_cli_output_into_a_closed_pipe_ends_quietly(bins, tmp_path):
    """`fanstore stop | head` prints no "Broken pipe" and no panic: like
    coreutils, the CLI is killed by SIGPIPE, silently."""
    rt = tmp_path / "rt"
    rt.mkdir()
    r, w = os.pipe()
    os.close(r)
    try:
        res = subprocess.run([bins["cli"], "--runtime-dir", str(rt), "stop"], stdout=w, stderr=subprocess.PIPE,
                             text=True, timeout=60)
    finally:
        os.close(w)
    assert (res.returncode, res.stderr) == (-13, ""), res
