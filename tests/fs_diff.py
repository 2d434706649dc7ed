"""Helpers of the differential tests: one Python script runs against a native
directory and through /fanstore, and the two are compared call by call.

A script starts with [`ATTEMPT`] (prepended by `script`): `attempt(key, f)`
records `["OK", f()]` or the errno's name under `key` in `out`, which the
script prints as JSON at its end.
"""
import json
import subprocess
import sys
import textwrap

ATTEMPT = r'''
import errno, json, os, sys
out = {}
def attempt(key, f):
    try:
        out[key] = ["OK", f()]
    except OSError as e:
        out[key] = errno.errorcode[e.errno]
'''


def script(body: str) -> str:
    """`body` (dedented) after the `attempt` prelude."""
    return ATTEMPT + textwrap.dedent(body)


def run_script(c, node, code, *args, timeout=180, python=sys.executable):
    """Runs `code` with `args` on `node` of cluster `c` (with the preload
    library), or natively when `c` is None; fails the test with its stderr
    (and the daemons' log) on a non-zero exit; returns the JSON of its last
    stdout line."""
    env = c.env(node) if c else None
    r = subprocess.run([python, "-c", textwrap.dedent(code), *args], env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr + (c.log()[-3000:] if c else "")
    return json.loads(r.stdout.strip().splitlines()[-1])


def differences(ours: dict, native: dict) -> dict:
    """Keys whose result differs: key -> (ours, native)."""
    return {k: (ours.get(k), native[k]) for k in native if ours.get(k) != native[k]}
