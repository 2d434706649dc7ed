"""Checkpoint queries from Python, over the `fanstore` CLI.

`match(model_or_state_dict)`: the stored checkpoints ranked by the longest
prefix of tensors they hold equal (by name, shape and content) to the given
model's, then by the tensors they share (EvoStore's LCP query, for warm
starts): `fanstore ckpt match FILE --json` on a `torch.save` of the state
dict to a temporary local file. The CLI is `$FANSTORE_CLI`, else
`fanstore` on PATH; the job's runtime directory is found as the daemons
publish it (`FANSTORE_RUNTIME_DIR`, ...).
"""
import json
import os
import shutil
import subprocess
import tempfile

from . import _daemon


def _cli() -> str:
    cli = os.environ.get("FANSTORE_CLI") or shutil.which("fanstore")
    if not cli:
        raise FileNotFoundError("the fanstore CLI: set FANSTORE_CLI or put target/release on PATH")
    return cli


def match(model_or_state_dict, exclude=None) -> list:
    """Rows, best first: dicts with `path` (relative to the mount), `file`
    (under the mount), `prefix` (leading tensors equal), `shared`,
    `shared_bytes`, `tensors`, `id`. `exclude`: a checkpoint path (under the
    mount or relative to it) left out of the ranking."""
    import torch
    sd = model_or_state_dict.state_dict() if hasattr(model_or_state_dict, "state_dict") else model_or_state_dict
    daemon = _daemon.find()
    mount = daemon.mount if daemon is not None else os.environ.get("FANSTORE_MOUNT", "/fanstore")
    with tempfile.TemporaryDirectory(prefix="fanstore-match-") as d:
        q = os.path.join(d, "query.pt")
        torch.save(sd, q)
        args = [_cli(), "--runtime-dir", _daemon.runtime_dir(), "ckpt", "match", q, "--json"]
        r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"fanstore ckpt match exited {r.returncode}: {r.stderr.strip()}")
    rows = json.loads(r.stdout).get("matches", [])
    skip = None
    if exclude is not None:
        skip = daemon.relative(exclude) if daemon is not None and os.fspath(exclude).startswith("/") else os.fspath(exclude)
    out = []
    for row in rows:
        if skip is not None and row.get("path") == skip:
            continue
        row["file"] = mount.rstrip("/") + "/" + row["path"]
        out.append(row)
    return out


def best(model_or_state_dict, exclude=None):
    """The file of the best match sharing at least one tensor, or None."""
    for row in match(model_or_state_dict, exclude):
        if row.get("prefix", 0) > 0 or row.get("shared", 0) > 0:
            return row["file"]
    return None
