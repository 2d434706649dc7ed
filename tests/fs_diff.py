"""Helpers of the differential tests: one Python script runs against a native
directory and through /fanstore, and the two are compared call by call.

A script starts with [`ATTEMPT`] (prepended by `script`): `attempt(key, f)`
records `["OK", f()]` or the errno's name under `key` in `out`, which the
script prints as JSON at its end.
"""
import sys
import textwrap

from fs_cluster import run_json

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
    """fs_cluster.run_json (`code` with `args` on `node` of cluster `c`, or
    natively when `c` is None; a non-zero exit fails the test) with the
    differential scripts' timeout."""
    return run_json(c, node, code, *args, timeout=timeout, python=python)


def differences(ours: dict, native: dict) -> dict:
    """Keys whose result differs: key -> (ours, native)."""
    return {k: (ours.get(k), native[k]) for k in native if ours.get(k) != native[k]}
